//! `airlock volume create|ls|show|rm`: named volumes, which outlive
//! sandboxes (`airlock create --volume NAME:/path` mounts one).

use super::format::{format_size, percent_encode, Table};
use super::http::Connection;
use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;

/// `airlock volume ...`.
#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Make a volume.
    Create(CreateArgs),
    /// List the key's volumes.
    Ls(LsArgs),
    /// Show one volume.
    Show(ShowArgs),
    /// Delete volumes and their files (refused while a sandbox mounts one).
    Rm(RmArgs),
}

/// Options of `airlock volume create`.
#[derive(Args)]
pub struct CreateArgs {
    /// Its name: letters, digits, `_` and `-`.
    name: String,
    /// Most it may hold, e.g. `10G` (default: the daemon's).
    #[arg(long, value_name = "SIZE", value_parser = super::format::parse_size_arg)]
    quota: Option<String>,
    /// Print the daemon's volume view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock volume ls`.
#[derive(Args)]
pub struct LsArgs {
    /// Print the daemon's volume views as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock volume show`.
#[derive(Args)]
pub struct ShowArgs {
    /// Its id or name.
    volume: String,
    /// Print the daemon's volume view as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Options of `airlock volume rm`.
#[derive(Args)]
pub struct RmArgs {
    /// Their ids or names.
    #[arg(required = true)]
    volumes: Vec<String>,
    #[command(flatten)]
    conn: Connection,
}

/// Runs `airlock volume ...`.
pub fn main(command: &VolumeCommand) -> Result<ExitCode> {
    match command {
        VolumeCommand::Create(args) => create(args),
        VolumeCommand::Ls(args) => ls(args),
        VolumeCommand::Show(args) => show(args),
        VolumeCommand::Rm(args) => rm(args),
    }
}

fn volume_path(volume: &str) -> String {
    format!("/v1/volumes/{}", percent_encode(volume))
}

const HEADER: [&str; 5] = ["ID", "NAME", "QUOTA", "CREATED", "MOUNTED BY"];

fn row(v: &Value) -> Vec<String> {
    vec![
        v["id"].as_str().unwrap_or_default().to_owned(),
        v["name"].as_str().unwrap_or_default().to_owned(),
        format_size(v["quota_bytes"].as_u64().unwrap_or(0)),
        v["created_at"].as_str().unwrap_or_default().to_owned(),
        v["mounted_by"].as_str().unwrap_or("-").to_owned(),
    ]
}

fn print(items: &[Value], as_json: bool, one: bool) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if as_json {
        let value = if one {
            items.first().cloned().unwrap_or(Value::Null)
        } else {
            Value::Array(items.to_vec())
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&HEADER);
    for v in items {
        table.push(row(v));
    }
    write!(out, "{}", table.render())?;
    Ok(ExitCode::SUCCESS)
}

fn create(args: &CreateArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let mut body = json!({"name": args.name});
    if let Some(quota) = &args.quota {
        body["quota"] = json!(quota);
    }
    let view = api.post_json("/v1/volumes", &body)?;
    print(&[view], args.json, true)
}

fn ls(args: &LsArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let answer = api.get_json("/v1/volumes", &[])?;
    let items = answer["items"].as_array().cloned().unwrap_or_default();
    print(&items, args.json, false)
}

fn show(args: &ShowArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    let view = api.get_json(&volume_path(&args.volume), &[])?;
    print(&[view], args.json, true)
}

fn rm(args: &RmArgs) -> Result<ExitCode> {
    let api = args.conn.api()?;
    super::delete_each(
        &api,
        &args.volumes,
        volume_path,
        &mut std::io::stdout().lock(),
    )
}
