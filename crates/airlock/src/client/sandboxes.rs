//! `airlock create | ls | status | kill | logs | network`: sandboxes, their
//! audit events and their network policy.

use anyhow::Result;
use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use super::format::{
    cell, format_age, format_size, format_utc, now_millis, pairs, parse_cpus_arg, parse_kv,
    parse_size_arg, parse_timeout_secs, percent_encode, relative, time_field, Table,
};
use super::http::{sandbox_path, Connection};
use airlock::net_args::NetArgs;

/// Options of `airlock create`. Unset options take the daemon's defaults.
#[derive(Args)]
pub struct CreateArgs {
    /// Root filesystem template, by the daemon's name for it.
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// Isolation tier: process, oci or gvisor (`airlock tiers` lists what
    /// the daemon can run); by default the template's, else the daemon's.
    #[arg(long, value_name = "TIER")]
    tier: Option<String>,
    /// Memory limit, e.g. `512M`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    memory: Option<String>,
    /// CPU quota in CPUs, e.g. `1.5`.
    #[arg(long, value_name = "N", value_parser = parse_cpus_arg)]
    cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// Size of the sandbox's writable layer, e.g. `1G`: a quota on the
    /// daemon's disk store (or, on a daemon serving `--writable-layers
    /// memory`, at most three quarters of the memory limit).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    disk: Option<String>,
    /// Lifetime: the sandbox is deleted this long after creation (`300s`,
    /// `5m`, `1h`).
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_secs)]
    timeout: Option<u64>,
    /// Environment variable of every process in the sandbox (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Metadata to tag the sandbox with (repeatable); `ls --meta` filters on it.
    #[arg(long = "meta", value_name = "K=V", value_parser = parse_kv)]
    meta: Vec<(String, String)>,
    /// Mount a named volume (`airlock volume create`): `NAME:/path`, or
    /// `NAME:/path:ro` read-only (repeatable).
    #[arg(long = "volume", short = 'v', value_name = "NAME:PATH[:ro]", value_parser = parse_volume)]
    volumes: Vec<(String, String, bool)>,
    #[command(flatten)]
    net: NetArgs,
    /// Print the daemon's whole answer as JSON, including the sandbox's
    /// access token (which is shown only once).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock ls`.
#[derive(Args)]
pub struct LsArgs {
    /// Only sandboxes in these states (creating, running, paused, stopping,
    /// dead); comma-separated or repeated.
    #[arg(long, value_name = "STATE,...", value_delimiter = ',')]
    state: Vec<String>,
    /// Only sandboxes with this metadata (repeatable; all must match).
    #[arg(long = "meta", value_name = "K=V", value_parser = parse_kv)]
    meta: Vec<(String, String)>,
    /// Fetch every page, not just the first.
    #[arg(long)]
    all: bool,
    /// Print a JSON array of the daemon's sandbox views.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The sandbox.
    id: String,
    /// Print the daemon's sandbox view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock pause`.
#[derive(Args)]
pub struct PauseArgs {
    /// The sandbox.
    id: String,
    /// What is kept: `memory` (processes continue on resume) or
    /// `filesystem` (files only).
    #[arg(long, value_name = "memory|filesystem", default_value = "memory", value_parser = ["memory", "filesystem"])]
    mode: String,
    /// Print the daemon's sandbox view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock resume`.
#[derive(Args)]
pub struct ResumeArgs {
    /// The sandbox.
    id: String,
    /// Start fresh processes on its files, whatever its pause kept
    /// (otherwise one paused with its memory continues where it was).
    #[arg(long)]
    reboot: bool,
    /// Print the daemon's sandbox view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock network`.
#[derive(Args)]
pub struct NetworkArgs {
    /// The sandbox.
    id: String,
    /// The policy to put in place; none given shows the current one. A
    /// sandbox created without network cannot be given any.
    #[command(flatten)]
    net: NetArgs,
    /// Print the policy as the daemon's JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock kill`.
#[derive(Args)]
pub struct KillArgs {
    /// The sandboxes to delete.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// Options of `airlock logs`.
#[derive(Args)]
pub struct LogsArgs {
    /// The sandbox.
    id: String,
    /// Only events of this audit stream.
    #[arg(long, value_enum)]
    stream: Option<AuditStream>,
    /// Print the events as JSON, one object a line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) conn: Connection,
}

/// An audit stream.
#[derive(Clone, Copy, ValueEnum)]
enum AuditStream {
    Access,
    Security,
    Runtime,
}

impl AuditStream {
    fn as_str(self) -> &'static str {
        match self {
            AuditStream::Access => "access",
            AuditStream::Security => "security",
            AuditStream::Runtime => "runtime",
        }
    }
}

/// The `POST /v1/sandboxes` body of `create`'s options: only what was given.
fn create_body(args: &CreateArgs) -> Value {
    let mut body = Map::new();
    if let Some(template) = &args.template {
        body.insert("template".into(), json!(template));
    }
    if let Some(tier) = &args.tier {
        body.insert("tier".into(), json!(tier));
    }
    if let Some(timeout) = args.timeout {
        body.insert("timeout_s".into(), json!(timeout));
    }
    let mut limits = Map::new();
    if let Some(memory) = &args.memory {
        limits.insert("memory".into(), json!(memory));
    }
    if let Some(cpus) = args.cpus {
        limits.insert("cpus".into(), json!(cpus));
    }
    if let Some(pids) = args.pids {
        limits.insert("pids".into(), json!(pids));
    }
    if let Some(disk) = &args.disk {
        limits.insert("disk".into(), json!(disk));
    }
    if !limits.is_empty() {
        body.insert("limits".into(), Value::Object(limits));
    }
    if !args.env.is_empty() {
        body.insert("env".into(), object(&args.env));
    }
    if !args.meta.is_empty() {
        body.insert("metadata".into(), object(&args.meta));
    }
    if !args.volumes.is_empty() {
        let volumes = args
            .volumes
            .iter()
            .map(|(name, path, read_only)| json!({"name": name, "path": path, "read_only": read_only}))
            .collect();
        body.insert("volumes".into(), Value::Array(volumes));
    }
    if args.net.given() {
        // The policy's own serialization is the API's `network` shape.
        let network = args.net.policy();
        body.insert(
            "network".into(),
            serde_json::to_value(&network).unwrap_or(Value::Null),
        );
    }
    Value::Object(body)
}

/// `NAME:/path[:ro|:rw]`.
fn parse_volume(text: &str) -> Result<(String, String, bool), String> {
    let bad = || format!("{text:?} is not NAME:/path[:ro]");
    let mut parts = text.split(':');
    let name = parts.next().filter(|n| !n.is_empty()).ok_or_else(bad)?;
    let path = parts
        .next()
        .filter(|p| p.starts_with('/'))
        .ok_or_else(bad)?;
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(_) => return Err(bad()),
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((name.to_owned(), path.to_owned(), read_only))
}

fn object(pairs: &[(String, String)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// `airlock create`: the id alone when stdout is not a terminal (so
/// `id=$(airlock create)` works), a short table when it is, the whole answer
/// with `--json`.
pub fn create(args: &CreateArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    if args.template.as_deref() == Some("base") {
        super::templates::ensure_base(&api)?;
    }
    let view = api.post_json("/v1/sandboxes", &create_body(args))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{view}")?;
    } else if out.is_terminal() {
        let now = now_millis();
        let mut table = Table::new(&["ID", "STATE", "EXPIRES"]);
        table.push(vec![
            cell(view.get("id")),
            state_cell(&view),
            expires_cell(&view, now),
        ]);
        out.write_all(table.render().as_bytes())?;
    } else {
        writeln!(out, "{}", cell(view.get("id")))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `running`, or `dead (timeout)` when the view has a reason.
fn state_cell(view: &Value) -> String {
    let state = cell(view.get("state"));
    match view.get("reason") {
        Some(Value::String(reason)) => format!("{state} ({reason})"),
        _ => state,
    }
}

/// `in 4m` for a sandbox that is not dead yet, `-` otherwise.
fn expires_cell(view: &Value, now: i64) -> String {
    let dead = matches!(view.get("state").and_then(Value::as_str), Some("dead"));
    match time_field(view.get("expires_at")) {
        Some(at) if !dead => relative(at, now),
        _ => "-".to_owned(),
    }
}

/// The `metadata` query parameter: `k=v&k2=v2` with each side encoded, which
/// `.query()` then encodes again as one value.
fn metadata_query(meta: &[(String, String)]) -> String {
    meta.iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The cursor of the next page, if any (a string, or a number).
fn next_cursor(page: &Value) -> Option<String> {
    match page.get("next_cursor")? {
        Value::String(cursor) if !cursor.is_empty() => Some(cursor.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `items` of a page.
fn items(page: &Value) -> Vec<Value> {
    page.get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// `airlock ls`.
pub fn ls(args: &LsArgs) -> Result<ExitCode> {
    ls_to(args, &mut std::io::stdout().lock())
}

fn ls_to(args: &LsArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let state = args.state.join(",");
    let metadata = metadata_query(&args.meta);
    let mut sandboxes = Vec::new();
    let mut cursor: Option<String> = None;
    let more = loop {
        let mut query: Vec<(&str, &str)> = Vec::new();
        if !state.is_empty() {
            query.push(("state", &state));
        }
        if !metadata.is_empty() {
            query.push(("metadata", &metadata));
        }
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor));
        }
        let page = api.get_json("/v1/sandboxes", &query)?;
        sandboxes.extend(items(&page));
        let next = next_cursor(&page);
        if next.is_none() || next == cursor {
            break false;
        }
        if !args.all {
            break true;
        }
        cursor = next;
    };
    if args.json {
        writeln!(out, "{}", Value::Array(sandboxes))?;
    } else {
        out.write_all(ls_table(&sandboxes, now_millis()).render().as_bytes())?;
        if more {
            eprintln!("airlock: more sandboxes than shown; --all lists every page");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ls_table(sandboxes: &[Value], now: i64) -> Table {
    let mut table = Table::new(&["ID", "STATE", "TEMPLATE", "AGE", "EXPIRES", "METADATA"]);
    for view in sandboxes {
        let age = time_field(view.get("created_at"))
            .map(|at| format_age((now - at) / 1000))
            .unwrap_or_else(|| "-".to_owned());
        table.push(vec![
            cell(view.get("id")),
            state_cell(view),
            cell(view.get("template")),
            age,
            expires_cell(view, now),
            pairs(view.get("metadata"), ","),
        ]);
    }
    table
}

/// `airlock status ID`.
pub fn status(args: &StatusArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let view = api.get_json(&sandbox_path(&args.id, ""), &[])?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{view}")?;
    } else {
        out.write_all(status_text(&view, now_millis()).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `airlock pause ID`.
pub fn pause(args: &PauseArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let view = api.post_json(
        &sandbox_path(&args.id, "/pause"),
        &serde_json::json!({ "mode": args.mode }),
    )?;
    print_state(&view, args.json)
}

/// `airlock resume ID`.
pub fn resume(args: &ResumeArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let body = match args.reboot {
        true => serde_json::json!({"on_resume": "reboot"}),
        false => serde_json::json!({}),
    };
    let view = api.post_json(&sandbox_path(&args.id, "/resume"), &body)?;
    print_state(&view, args.json)
}

/// A sandbox's id and state, or its view as JSON.
fn print_state(view: &Value, json: bool) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{view}")?;
    } else {
        writeln!(
            out,
            "{} {}",
            view["id"].as_str().unwrap_or_default(),
            view["state"].as_str().unwrap_or_default()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A sandbox view as `key: value` lines.
fn status_text(view: &Value, now: i64) -> String {
    let time = |field: &str| match time_field(view.get(field)) {
        Some(at) => format!("{} UTC ({})", format_utc(at), relative(at, now)),
        None => "-".to_owned(),
    };
    let limits = view.get("limits");
    let limit = |field: &str| limits.and_then(|l| l.get(field)).and_then(Value::as_u64);
    let mut parts = Vec::new();
    if let Some(bytes) = limit("memory_bytes") {
        parts.push(format!("memory {}", format_size(bytes)));
    }
    if let Some(millis) = limit("cpu_millis") {
        parts.push(format!("cpus {}", millis as f64 / 1000.0));
    }
    if let Some(pids) = limit("pids") {
        parts.push(format!("pids {pids}"));
    }
    if let Some(bytes) = limit("disk_bytes") {
        parts.push(format!("disk {}", format_size(bytes)));
    }
    let mut lines = vec![
        ("id", cell(view.get("id"))),
        ("state", state_cell(view)),
        ("template", cell(view.get("template"))),
        ("tier", cell(view.get("tier"))),
        ("created", time("created_at")),
        ("expires", time("expires_at")),
    ];
    if !parts.is_empty() {
        lines.push(("limits", parts.join(", ")));
    }
    lines.push(("metadata", pairs(view.get("metadata"), ", ")));
    lines
        .iter()
        .map(|(key, value)| format!("{:<10}{value}\n", format!("{key}:")))
        .collect()
}

/// `airlock network ID [--net MODE | --allow RULE...]`.
pub fn network(args: &NetworkArgs) -> Result<ExitCode> {
    network_to(args, &mut std::io::stdout().lock())
}

fn network_to(args: &NetworkArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let path = sandbox_path(&args.id, "/network");
    let policy = if args.net.given() {
        let wanted = serde_json::to_value(args.net.policy())?;
        api.put_json(&path, &wanted)?
    } else {
        api.get_json(&path, &[])?
    };
    if args.json {
        writeln!(out, "{policy}")?;
    } else {
        out.write_all(network_text(&policy).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A policy as `mode:` and, in allow mode, one `allow:` line per rule.
fn network_text(policy: &Value) -> String {
    let mut text = format!("mode:  {}\n", cell(policy.get("mode")));
    for rule in policy
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        text.push_str(&format!("allow: {}\n", rule.as_str().unwrap_or("?")));
    }
    text
}

/// `airlock kill ID...`: deletes each; every id that failed is reported and
/// makes the exit code 1.
pub fn kill(args: &KillArgs) -> Result<ExitCode> {
    kill_to(args, &mut std::io::stdout().lock())
}

fn kill_to(args: &KillArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let api = args.conn.api()?;
    super::delete_each(&api, &args.ids, |id| sandbox_path(id, ""), out)
}

/// `airlock logs ID`: every event, following the pages.
pub fn logs(args: &LogsArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let path = sandbox_path(&args.id, "/events");
    let mut table = Table::new(&["AT", "STREAM", "KIND", "DETAIL"]);
    let mut out = std::io::stdout().lock();
    let mut after: Option<String> = None;
    loop {
        let mut query: Vec<(&str, &str)> = Vec::new();
        if let Some(stream) = args.stream {
            query.push(("stream", stream.as_str()));
        }
        if let Some(after) = &after {
            query.push(("after", after));
        }
        let page = api.get_json(&path, &query)?;
        let events = items(&page);
        for event in &events {
            if args.json {
                writeln!(out, "{event}")?;
            } else {
                table.push(event_row(event));
            }
        }
        let next = next_cursor(&page);
        if events.is_empty() || next.is_none() || next == after {
            break;
        }
        after = next;
    }
    if !args.json {
        out.write_all(table.render().as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn event_row(event: &Value) -> Vec<String> {
    let at = match time_field(event.get("at")) {
        Some(at) => format_utc(at),
        None => cell(event.get("at")),
    };
    let detail = match event.get("detail") {
        Some(Value::Object(map)) if map.is_empty() => String::new(),
        None | Some(Value::Null) => String::new(),
        detail => pairs(detail, " "),
    };
    vec![
        at,
        cell(event.get("stream")),
        cell(event.get("kind")),
        detail,
    ]
}

#[cfg(test)]
mod tests {
    use super::super::testing::{respond, FakeServer};
    use super::*;

    fn connection(url: &str) -> Connection {
        Connection {
            url: url.to_owned(),
            api_key: Some("al_test".to_owned()),
        }
    }

    #[test]
    fn create_sends_only_what_was_given() {
        let args = CreateArgs {
            template: None,
            tier: Some("gvisor".into()),
            memory: Some("256M".into()),
            cpus: Some(0.5),
            pids: None,
            disk: None,
            timeout: Some(600),
            env: vec![("A".into(), "1".into())],
            meta: vec![("owner".into(), "me".into())],
            volumes: vec![("data".into(), "/mnt/data".into(), true)],
            net: NetArgs::default(),
            json: false,
            conn: connection(super::super::http::DEFAULT_URL),
        };
        assert_eq!(
            create_body(&args),
            json!({"tier": "gvisor", "timeout_s": 600, "limits": {"memory": "256M", "cpus": 0.5},
                   "env": {"A": "1"}, "metadata": {"owner": "me"},
                   "volumes": [{"name": "data", "path": "/mnt/data", "read_only": true}]})
        );
        assert_eq!(
            parse_volume("v:/a").unwrap(),
            ("v".into(), "/a".into(), false)
        );
        for bad in ["v", ":/a", "v:a", "v:/a:x", "v:/a:ro:1"] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn create_sends_the_network_flags() {
        let with = |net: NetArgs| {
            create_body(&CreateArgs {
                template: None,
                tier: None,
                memory: None,
                cpus: None,
                pids: None,
                disk: None,
                timeout: None,
                env: vec![],
                meta: vec![],
                volumes: vec![],
                net,
                json: false,
                conn: connection(super::super::http::DEFAULT_URL),
            })
        };
        assert_eq!(
            with(NetArgs {
                net: Some(airlock::net_args::NetMode::Open),
                allow: vec![],
            }),
            json!({"network": {"mode": "open"}})
        );
        assert_eq!(
            with(NetArgs {
                net: None,
                allow: vec![
                    "pypi.org".parse().unwrap(),
                    "[2001:db8::1]:443".parse().unwrap()
                ],
            }),
            json!({"network": {"mode": "allow", "rules": ["pypi.org", "[2001:db8::1]:443"]}})
        );
    }

    #[test]
    fn metadata_filters_are_encoded_pairs() {
        let meta = vec![("owner".into(), "me".into()), ("k".into(), "a&b=c".into())];
        assert_eq!(metadata_query(&meta), "owner=me&k=a%26b%3Dc");
    }

    #[test]
    fn ls_table_shows_age_expiry_and_reasons() {
        let now = 1_000_000_000;
        let sandboxes = [
            json!({"id": "sbx-1", "state": "running", "reason": null, "template": "host",
                   "metadata": {"owner": "me", "a": "b"},
                   "created_at": format_rfc3339(now - 300_000),
                   "expires_at": format_rfc3339(now + 120_000)}),
            json!({"id": "sbx-22", "state": "dead", "reason": "timeout", "template": "host",
                   "metadata": {}, "created_at": format_rfc3339(now - 7_200_000),
                   "expires_at": format_rfc3339(now - 3_600_000)}),
        ];
        assert_eq!(
            ls_table(&sandboxes, now).render(),
            "ID      STATE           TEMPLATE  AGE  EXPIRES  METADATA\n\
             sbx-1   running         host      5m   in 2m    a=b,owner=me\n\
             sbx-22  dead (timeout)  host      2h   -        -\n"
        );
    }

    fn format_rfc3339(millis: i64) -> String {
        format_utc(millis).replace(' ', "T") + "Z"
    }

    #[test]
    fn status_lists_the_view() {
        let view = json!({"id": "sbx-1", "state": "running", "reason": null, "template": "host",
            "tier": "process", "metadata": {"owner": "me"},
            "limits": {"memory_bytes": 536870912, "cpu_millis": 1500, "pids": 256, "disk_bytes": 1073741824},
            "created_at": "1970-01-01T00:00:00Z", "expires_at": "1970-01-01T00:05:00Z"});
        assert_eq!(
            status_text(&view, 60_000),
            "id:       sbx-1\n\
             state:    running\n\
             template: host\n\
             tier:     process\n\
             created:  1970-01-01 00:00:00 UTC (1m ago)\n\
             expires:  1970-01-01 00:05:00 UTC (in 4m)\n\
             limits:   memory 512M, cpus 1.5, pids 256, disk 1G\n\
             metadata: owner=me\n"
        );
    }

    #[test]
    fn event_rows() {
        let event = json!({"seq": 3, "stream": "access", "kind": "exec.started", "at": 1000,
                           "request_id": "r1", "detail": {"pid": 12, "cmd": "ls"}});
        assert_eq!(
            event_row(&event),
            vec![
                "1970-01-01 00:00:01",
                "access",
                "exec.started",
                "cmd=ls pid=12"
            ]
        );
    }

    #[test]
    fn ls_follows_cursors_with_all() {
        let server = FakeServer::start(2, |request, stream| {
            let body = if request.target.contains("cursor=c1") {
                json!({"items": [{"id": "sbx-2"}], "next_cursor": null})
            } else {
                json!({"items": [{"id": "sbx-1"}], "next_cursor": "c1"})
            };
            respond(stream, 200, "application/json", body.to_string().as_bytes());
        });
        let args = LsArgs {
            state: vec!["running".into(), "paused".into()],
            meta: vec![("owner".into(), "me".into())],
            all: true,
            json: true,
            conn: connection(&server.url),
        };
        let mut out = Vec::new();
        ls_to(&args, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[{\"id\":\"sbx-1\"},{\"id\":\"sbx-2\"}]\n"
        );
        let requests = server.finish();
        assert_eq!(
            requests[0].target,
            "/v1/sandboxes?state=running%2Cpaused&metadata=owner%3Dme"
        );
        assert_eq!(
            requests[1].target,
            "/v1/sandboxes?state=running%2Cpaused&metadata=owner%3Dme&cursor=c1"
        );
    }

    #[test]
    fn network_shows_or_replaces_the_policy() {
        let server = FakeServer::start(2, |request, stream| {
            let body = if request.method == "PUT" {
                request.body.clone()
            } else {
                br#"{"mode":"allow","rules":["pypi.org","*.pythonhosted.org:443"]}"#.to_vec()
            };
            respond(stream, 200, "application/json", &body);
        });
        let conn = connection(&server.url);
        let api = conn.api().unwrap();
        let shown = api
            .get_json(&sandbox_path("sbx-1", "/network"), &[])
            .unwrap();
        assert_eq!(
            network_text(&shown),
            "mode:  allow\nallow: pypi.org\nallow: *.pythonhosted.org:443\n"
        );
        let args = NetworkArgs {
            id: "sbx-1".into(),
            net: NetArgs {
                net: Some(airlock::net_args::NetMode::Open),
                allow: vec![],
            },
            json: true,
            conn,
        };
        let mut out = Vec::new();
        assert_eq!(network_to(&args, &mut out).unwrap(), ExitCode::SUCCESS);
        assert_eq!(String::from_utf8(out).unwrap(), "{\"mode\":\"open\"}\n");
        let requests = server.finish();
        assert_eq!(requests[1].method, "PUT");
        assert_eq!(requests[1].target, "/v1/sandboxes/sbx-1/network");
        assert_eq!(requests[1].header("content-type"), Some("application/json"));
        assert_eq!(
            serde_json::from_slice::<Value>(&requests[1].body).unwrap(),
            json!({"mode": "open"})
        );
    }

    #[test]
    fn kill_reports_each_failure_and_goes_on() {
        let server = FakeServer::start(2, |request, stream| {
            if request.target.ends_with("sbx-gone") {
                respond(
                    stream,
                    404,
                    "application/json",
                    br#"{"code":"not_found","message":"no such sandbox"}"#,
                );
            } else {
                respond(stream, 204, "application/json", b"");
            }
        });
        let args = KillArgs {
            ids: vec!["sbx-gone".into(), "sbx-1".into()],
            conn: connection(&server.url),
        };
        let mut out = Vec::new();
        let code = kill_to(&args, &mut out).unwrap();
        assert_eq!(code, ExitCode::from(super::super::EXIT_FAILED));
        assert_eq!(String::from_utf8(out).unwrap(), "sbx-1\n");
        let requests = server.finish();
        assert_eq!(requests.len(), 2);
        assert!(requests.iter().all(|r| r.method == "DELETE"));
    }
}

/// Options of `airlock tiers`.
#[derive(Args)]
pub struct TiersArgs {
    /// Print the daemon's tier views as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// `airlock tiers`: each tier, available or not, and why not.
pub fn tiers(args: &TiersArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let answer = api.get_json("/v1/tiers", &[])?;
    let items = answer["items"].as_array().cloned().unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Array(items))?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["TIER", "AVAILABLE", "WHY NOT"]);
    for tier in &items {
        table.push(vec![
            tier["tier"].as_str().unwrap_or_default().to_owned(),
            if tier["available"].as_bool() == Some(true) {
                "yes".to_owned()
            } else {
                "no".to_owned()
            },
            tier["reason"].as_str().unwrap_or("-").to_owned(),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}
