//! `airlock snapshot create|ls|show|rm` and `airlock fork`.

use super::format::{format_size, format_utc, parse_rfc3339, percent_encode, Table};
use super::http::{sandbox_path, Connection};
use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;

/// `airlock snapshot ...`.
#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Freeze a sandbox's files into a snapshot (the sandbox is paused
    /// meanwhile and runs on after); print its id. Create sandboxes from
    /// it with `airlock create --template ID|NAME`.
    Create(CreateArgs),
    /// List your snapshots.
    Ls(LsArgs),
    /// Show one snapshot.
    Show(ShowArgs),
    /// Delete snapshots (sandboxes made from them keep running).
    Rm(RmArgs),
}

/// Options of `airlock snapshot create`.
#[derive(Args)]
pub struct CreateArgs {
    /// The sandbox.
    id: String,
    /// A name unique among your snapshots; taking one again under the
    /// same name replaces it.
    #[arg(long)]
    name: Option<String>,
    /// Print the daemon's snapshot view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock snapshot ls`.
#[derive(Args)]
pub struct LsArgs {
    /// Only snapshots of this sandbox.
    #[arg(long, value_name = "ID")]
    sandbox: Option<String>,
    /// Print the daemon's snapshot views as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock snapshot show`.
#[derive(Args)]
pub struct ShowArgs {
    /// The snapshot's id or name.
    id: String,
    /// Print the daemon's snapshot view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock snapshot rm`.
#[derive(Args)]
pub struct RmArgs {
    /// The snapshots' ids or names.
    #[arg(required = true)]
    ids: Vec<String>,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock fork`.
#[derive(Args)]
pub struct ForkArgs {
    /// The sandbox to fork (it is paused while its files are frozen, and
    /// runs on after).
    id: String,
    /// How many children (1 to 100).
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u32,
    /// Each child's lifetime, seconds (default: the daemon's).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Print the daemon's answer as JSON (access tokens included).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Runs `airlock snapshot ...`.
pub fn main(command: &SnapshotCommand) -> Result<ExitCode> {
    match command {
        SnapshotCommand::Create(args) => create(args),
        SnapshotCommand::Ls(args) => ls(args),
        SnapshotCommand::Show(args) => show(args),
        SnapshotCommand::Rm(args) => rm(args),
    }
}

fn snapshot_path(id: &str) -> String {
    format!("/v1/snapshots/{}", percent_encode(id))
}

fn create(args: &CreateArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let body = match &args.name {
        Some(name) => json!({ "name": name }),
        None => json!({}),
    };
    let view = api.post_json(&sandbox_path(&args.id, "/snapshots"), &body)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{view}")?;
    } else {
        writeln!(out, "{}", view["id"].as_str().unwrap_or_default())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ratio` as a percentage of the tar, or `-`.
fn ratio(view: &Value) -> String {
    match view["ratio"].as_f64() {
        Some(r) if view["tar_bytes"].as_u64().unwrap_or(0) > 0 => format!("{:.0}%", r * 100.0),
        _ => "-".to_owned(),
    }
}

fn ls(args: &LsArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let query: Vec<(&str, &str)> = args
        .sandbox
        .as_deref()
        .map(|id| vec![("sandbox_id", id)])
        .unwrap_or_default();
    let answer = api.get_json("/v1/snapshots", &query)?;
    let items = answer["items"].as_array().cloned().unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&Value::Array(items))?
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&[
        "ID", "NAME", "SANDBOX", "TEMPLATE", "TIER", "CHANGES", "KEPT", "CREATED",
    ]);
    for s in &items {
        table.push(vec![
            s["id"].as_str().unwrap_or_default().to_owned(),
            s["name"].as_str().unwrap_or("-").to_owned(),
            s["sandbox_id"].as_str().unwrap_or_default().to_owned(),
            s["template"].as_str().unwrap_or_default().to_owned(),
            s["tier"].as_str().unwrap_or_default().to_owned(),
            format_size(s["bytes"].as_u64().unwrap_or(0)),
            format!(
                "{} ({})",
                format_size(s["archive_bytes"].as_u64().unwrap_or(0)),
                ratio(s)
            ),
            s["created_at"]
                .as_str()
                .and_then(parse_rfc3339)
                .map_or_else(String::new, format_utc),
        ]);
    }
    write!(out, "{}", table.render())?;
    Ok(ExitCode::SUCCESS)
}

fn show(args: &ShowArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let s = api.get_json(&snapshot_path(&args.id), &[])?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{s}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = |field: &str| s[field].as_str().unwrap_or("-").to_owned();
    let lines = [
        ("id", text("id")),
        ("name", text("name")),
        ("sandbox", text("sandbox_id")),
        ("template", text("template")),
        ("tier", text("tier")),
        ("layers", s["layers"].to_string()),
        (
            "changes",
            format!(
                "{} entries, {}",
                s["entries"],
                format_size(s["bytes"].as_u64().unwrap_or(0))
            ),
        ),
        (
            "archive",
            format!(
                "{} of a {} tar ({}, zstd level {}), {}",
                format_size(s["archive_bytes"].as_u64().unwrap_or(0)),
                format_size(s["tar_bytes"].as_u64().unwrap_or(0)),
                ratio(&s),
                s["zstd_level"],
                text("archive_digest")
            ),
        ),
        ("took", format!("{} ms", s["took_ms"])),
        (
            "created",
            s["created_at"]
                .as_str()
                .and_then(parse_rfc3339)
                .map_or_else(|| "-".to_owned(), |t| format!("{} UTC", format_utc(t))),
        ),
    ];
    for (key, value) in lines {
        writeln!(out, "{key:<9}{value}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn rm(args: &RmArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    super::delete_each(
        &api,
        &args.ids,
        snapshot_path,
        &mut std::io::stdout().lock(),
    )
}

/// `airlock fork ID [-n N]`: the children's ids, one a line (errors on
/// stderr); fails when no child started.
pub fn fork(args: &ForkArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let mut body = json!({ "count": args.count });
    if let Some(timeout) = args.timeout {
        body["timeout_s"] = json!(timeout);
    }
    let answer = api.post_json(&sandbox_path(&args.id, "/fork"), &body)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{answer}")?;
    }
    let items = answer["items"].as_array().cloned().unwrap_or_default();
    let mut started = 0;
    for item in &items {
        if let Some(id) = item["sandbox"]["id"].as_str() {
            started += 1;
            if !args.json {
                writeln!(out, "{id}")?;
            }
        } else {
            eprintln!(
                "airlock: error: a child did not start: {}",
                item["error"]["message"].as_str().unwrap_or("unknown")
            );
        }
    }
    Ok(if started == 0 {
        ExitCode::from(super::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
