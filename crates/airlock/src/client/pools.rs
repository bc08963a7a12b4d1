//! `airlock pool set|ls|show|rm`: warm pools (an admin key's).

use super::format::{percent_encode, Table};
use super::http::Connection;
use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;

/// `airlock pool ...`.
#[derive(Subcommand)]
pub enum PoolCommand {
    /// Keep sandboxes of a template started, so creates of it are handed
    /// one (replaces a pool of the same name).
    Set(SetArgs),
    /// List the pools and how full they are.
    Ls(LsArgs),
    /// Show one pool.
    Show(ShowArgs),
    /// Remove pools (their ready members are torn down).
    Rm(RmArgs),
}

/// Options of `airlock pool set`.
#[derive(Args)]
pub struct SetArgs {
    /// The pool's name.
    name: String,
    /// The template its members run.
    #[arg(long)]
    template: String,
    /// The tier they run on (default: the template's).
    #[arg(long)]
    tier: Option<String>,
    /// Members get an egress path, to serve creates with a network policy
    /// other than `none`.
    #[arg(long)]
    networked: bool,
    /// Members kept ready.
    #[arg(long)]
    min_ready: u32,
    /// Most members at once (default: --min-ready); misses raise the
    /// number kept ready up to it.
    #[arg(long)]
    max: Option<u32>,
    /// Most members starting at once (default 2).
    #[arg(long)]
    refill: Option<u32>,
    /// Print the daemon's pool view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock pool ls`.
#[derive(Args)]
pub struct LsArgs {
    /// Print the daemon's pool views as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock pool show`.
#[derive(Args)]
pub struct ShowArgs {
    /// The pool's name.
    name: String,
    /// Print the daemon's pool view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock pool rm`.
#[derive(Args)]
pub struct RmArgs {
    /// The pools' names.
    #[arg(required = true)]
    names: Vec<String>,
    #[command(flatten)]
    conn: Connection,
}

/// Runs `airlock pool ...`.
pub fn main(command: &PoolCommand) -> Result<ExitCode> {
    match command {
        PoolCommand::Set(args) => set(args),
        PoolCommand::Ls(args) => ls(args),
        PoolCommand::Show(args) => show(args),
        PoolCommand::Rm(args) => rm(args),
    }
}

fn pool_path(name: &str) -> String {
    format!("/v1/pools/{}", percent_encode(name))
}

fn set(args: &SetArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let mut body = json!({
        "template": args.template,
        "networked": args.networked,
        "min_ready": args.min_ready,
    });
    for (field, value) in [
        ("tier", args.tier.as_ref().map(|t| json!(t))),
        ("max", args.max.map(|m| json!(m))),
        ("refill", args.refill.map(|r| json!(r))),
    ] {
        if let Some(value) = value {
            body[field] = value;
        }
    }
    let view = api.put_json(&pool_path(&args.name), &body)?;
    print_one(&view, args.json)
}

fn row(p: &Value) -> Vec<String> {
    let n = |field: &str| p[field].as_u64().unwrap_or(0).to_string();
    vec![
        p["name"].as_str().unwrap_or_default().to_owned(),
        p["template"].as_str().unwrap_or_default().to_owned(),
        p["tier"].as_str().unwrap_or("-").to_owned(),
        if p["networked"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "no"
        }
        .to_owned(),
        format!("{}/{}", n("ready"), n("target")),
        n("starting"),
        format!("{}..{}", n("min_ready"), n("max")),
        n("claims"),
        n("misses"),
        n("failed"),
    ]
}

const HEADER: [&str; 10] = [
    "NAME", "TEMPLATE", "TIER", "NETWORK", "READY", "STARTING", "SIZE", "CLAIMS", "MISSES",
    "FAILED",
];

fn ls(args: &LsArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let answer = api.get_json("/v1/pools", &[])?;
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
    let mut table = Table::new(&HEADER);
    for p in &items {
        table.push(row(p));
    }
    write!(out, "{}", table.render())?;
    Ok(ExitCode::SUCCESS)
}

fn print_one(view: &Value, as_json: bool) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if as_json {
        writeln!(out, "{view}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&HEADER);
    table.push(row(view));
    write!(out, "{}", table.render())?;
    if let Some(error) = view["last_error"].as_str() {
        writeln!(out, "last error: {error}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show(args: &ShowArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let view = api.get_json(&pool_path(&args.name), &[])?;
    print_one(&view, args.json)
}

fn rm(args: &RmArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    super::delete_each(&api, &args.names, pool_path, &mut std::io::stdout().lock())
}
