//! The CLI commands that drive a running daemon (`airlock serve`) through its
//! native API (`docs/api.md`): `create`, `ls`, `status`, `exec`, `cp`,
//! `files`, `kill`, `pause`, `resume`, `snapshot`, `fork`, `pool`, `logs`, `network`,
//! `template` and `gc`.
//!
//! Layout:
//! - `mod.rs`: the [`ClientCommand`] enum (flattened into the binary's
//!   top-level commands), dispatch, and error reporting and exit codes.
//! - `http.rs`: [`http::Connection`] (the `--url`/`--api-key` options every
//!   command takes), [`http::Api`] (a blocking ureq client with one method per
//!   kind of call) and [`http::ClientError`] (API error bodies, an unreachable
//!   daemon, undecodable answers).
//! - `sandboxes.rs`: `create`, `ls`, `status`, `kill`, `logs`.
//! - `exec.rs`: `exec`: the NDJSON event stream, stdin and signal forwarding,
//!   exit codes as `airlock run` has them.
//! - `files.rs`: `cp` and `files`.
//! - `templates.rs`: `template import|ls|inspect|rm` and `gc`.
//! - `snapshots.rs`: `snapshot create|ls|show|rm` and `fork`.
//! - `pools.rs`: `pool set|ls|show|rm`.
//! - `format.rs`: pure helpers: tables, ages, sizes, RFC 3339 times, `K=V`.
//!
//! Everything is synchronous: one connection at a time, plus a thread each
//! for stdin and signals in `exec`. Output for people is an aligned table or
//! `key: value` lines; `--json` prints the API's objects (`ls` an array,
//! streams one object a line). Exit codes: 0 on success, 1 when the daemon
//! refused or could not be reached, 2 for bad input; `exec` exits with the
//! process's code, and with 125 when airlock itself failed, as `airlock run`.

mod exec;
mod files;
mod format;
mod http;
mod pools;
mod sandboxes;
mod snapshots;
pub(crate) mod templates;
#[cfg(test)]
mod testing;
mod volumes;

use clap::Subcommand;
use std::process::ExitCode;

pub use http::ClientError;

/// Exit code when the daemon refused a request or could not be reached.
const EXIT_FAILED: u8 = 1;

/// The commands that talk to the daemon.
#[derive(Subcommand)]
pub enum ClientCommand {
    /// Create a sandbox on the daemon; print its id.
    Create(sandboxes::CreateArgs),
    /// List sandboxes.
    Ls(sandboxes::LsArgs),
    /// Show one sandbox.
    Status(sandboxes::StatusArgs),
    /// Run a command in a sandbox, streaming its output; exit with its code.
    Exec(Box<exec::ExecArgs>),
    /// Copy a file into or out of a sandbox: `cp FILE ID:/path`,
    /// `cp ID:/path FILE` (`-` is stdin or stdout).
    Cp(files::CpArgs),
    /// List, inspect, change and watch files in a sandbox.
    Files(files::FilesArgs),
    /// Delete sandboxes and everything they hold.
    Kill(sandboxes::KillArgs),
    /// Pause a sandbox: no CPU until resumed (its tier keeps its memory,
    /// or with --mode filesystem only its files).
    Pause(sandboxes::PauseArgs),
    /// Resume a paused sandbox (with --reboot, on fresh processes).
    Resume(sandboxes::ResumeArgs),
    /// Freeze sandboxes' files into snapshots; list, show and remove them.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCommand),
    /// Start copies of a sandbox on its files, copy-on-write; print their
    /// ids.
    Fork(snapshots::ForkArgs),
    /// Keep sandboxes of a template started ahead (warm pools, admin).
    #[command(subcommand)]
    Pool(pools::PoolCommand),
    /// Make, list and remove named volumes, which outlive sandboxes.
    #[command(subcommand)]
    Volume(volumes::VolumeCommand),
    /// Show a sandbox's audit events.
    Logs(sandboxes::LogsArgs),
    /// Show a sandbox's network policy, or replace it while it runs
    /// (`--net open`, `--allow RULE`...; new connections follow at once).
    Network(sandboxes::NetworkArgs),
    /// Build, import, pull, list, inspect and remove templates.
    #[command(subcommand)]
    Template(templates::TemplateCommand),
    /// Remove the layers no template, live sandbox or build cache entry
    /// uses, and what half-done imports left.
    Gc(templates::GcArgs),
    /// List the isolation tiers, available or not and why not.
    Tiers(sandboxes::TiersArgs),
}

/// Deletes what each of `names` names (at `path(name)`), printing each
/// name deleted to `out` and each refusal to stderr; fails at once when
/// the daemon cannot be reached (the same for every name), and exits
/// [`EXIT_FAILED`] when any was refused.
fn delete_each(
    api: &http::Api,
    names: &[String],
    path: impl Fn(&str) -> String,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for name in names {
        match api.delete(&path(name), &[]) {
            Ok(()) => {
                writeln!(out, "{name}")?;
                out.flush()?;
            }
            Err(error @ ClientError::Unreachable { .. }) => return Err(error.into()),
            Err(error) => {
                eprintln!("airlock: error: {name}: {error}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs one client command; the exit code to leave with.
pub fn main(command: ClientCommand) -> ExitCode {
    let result = match command {
        ClientCommand::Create(args) => sandboxes::create(&args),
        ClientCommand::Ls(args) => sandboxes::ls(&args),
        ClientCommand::Status(args) => sandboxes::status(&args),
        ClientCommand::Exec(args) => return exec::main(&args),
        ClientCommand::Cp(args) => files::cp(&args),
        ClientCommand::Files(args) => files::files(&args),
        ClientCommand::Kill(args) => sandboxes::kill(&args),
        ClientCommand::Pause(args) => sandboxes::pause(&args),
        ClientCommand::Resume(args) => sandboxes::resume(&args),
        ClientCommand::Snapshot(command) => snapshots::main(&command),
        ClientCommand::Fork(args) => snapshots::fork(&args),
        ClientCommand::Pool(command) => pools::main(&command),
        ClientCommand::Volume(command) => volumes::main(&command),
        ClientCommand::Logs(args) => sandboxes::logs(&args),
        ClientCommand::Network(args) => sandboxes::network(&args),
        ClientCommand::Template(command) => templates::main(&command),
        ClientCommand::Gc(args) => templates::gc(&args),
        ClientCommand::Tiers(args) => sandboxes::tiers(&args),
    };
    match result {
        Ok(code) => code,
        Err(error) => fail(&error, EXIT_FAILED),
    }
}

/// Reports a failed command on stderr; its exit code: 2 for a usage error,
/// 0 when our stdout was closed under us (`airlock ls | head -1`), else
/// `code`.
fn fail(error: &anyhow::Error, code: u8) -> ExitCode {
    let broken_pipe = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    eprintln!("airlock: error: {error:#}");
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Usage(_)) => ExitCode::from(airlock::EXIT_BAD_INPUT),
        _ => ExitCode::from(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// The binary's top level as main.rs wires it: our commands flattened
    /// beside the others.
    #[derive(Parser)]
    #[command(name = "airlock")]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(clap::Subcommand)]
    enum Top {
        #[command(flatten)]
        Client(ClientCommand),
    }

    fn parse(args: &[&str]) -> Result<ClientCommand, clap::Error> {
        let argv = std::iter::once("airlock").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Top::Client(command) => command,
        })
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn connection_options_go_anywhere() {
        let Ok(ClientCommand::Files(args)) = parse(&[
            "files",
            "sbx-1",
            "ls",
            "/tmp",
            "--url",
            "http://h:1",
            "--api-key",
            "al_x",
        ]) else {
            panic!("files did not parse");
        };
        assert_eq!(args.conn.url, "http://h:1");
        assert_eq!(args.conn.api_key.as_deref(), Some("al_x"));
        let Ok(ClientCommand::Ls(args)) = parse(&["ls", "--url", "http://h:2"]) else {
            panic!("ls did not parse");
        };
        assert_eq!(args.conn.url, "http://h:2");
    }

    #[test]
    fn exec_takes_its_command_after_the_separator() {
        let Ok(ClientCommand::Exec(args)) = parse(&[
            "exec",
            "sbx-1",
            "-e",
            "A=1",
            "--cwd",
            "/tmp",
            "--timeout",
            "1m",
            "--",
            "sh",
            "-c",
            "echo hi",
        ]) else {
            panic!("exec did not parse");
        };
        assert_eq!(args.id, "sbx-1");
        assert_eq!(args.env, vec![("A".to_owned(), "1".to_owned())]);
        assert_eq!(args.timeout, Some(60));
        assert_eq!(args.command, vec!["sh", "-c", "echo hi"]);
        assert!(parse(&["exec", "sbx-1"]).is_err());
        assert!(parse(&["exec", "sbx-1", "-e", "novalue", "--", "true"]).is_err());
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for argv in [
            &["create", "--memory", "lots"][..],
            &["create", "--cpus", "-1"],
            &["create", "--timeout", "soon"],
            &["create", "--meta", "=x"],
            &["ls", "--meta", "x"],
            &["logs", "sbx-1", "--stream", "nope"],
            &["kill"],
        ] {
            assert!(parse(argv).is_err(), "{argv:?}");
        }
    }
}
