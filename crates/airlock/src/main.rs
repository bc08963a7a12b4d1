//! `airlock`: the CLI, the daemon and its helpers (supervisors, the egress
//! worker). The in-sandbox agent is a binary of its own, `airlock-agent`.

mod client;
mod egress_worker;
mod net_args;
mod run;
mod sandbox;
mod serve;
mod supervise;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Exit code for bad input (flags, limits, paths), as clap uses for usage errors.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when airlock itself failed (as `docker run` uses 125).
pub const EXIT_INTERNAL: u8 = 125;

#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "Sandboxes for untrusted, model-generated code"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Run one command in a fresh, ephemeral sandbox and tear it down.
    Run(Box<run::RunArgs>),
    /// Run the daemon: the REST API on --listen, sandboxes on this machine.
    Serve(Box<serve::ServeArgs>),
    /// Manage the daemon's API keys.
    #[command(subcommand)]
    Keys(serve::KeysCommand),
    /// Own one sandbox for the daemon: launch it, serve its agent channel on
    /// a unix socket, tear it down when it ends. Not for direct use.
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
    /// The confined process serving the sandboxes' egress paths, started by
    /// the daemon with its channel on stdin. Not for direct use.
    #[command(hide = true)]
    EgressWorker,
}

/// `airlock run` alone: the same names and texts as [`Cli`]'s, without the
/// rest of the tree. `run` starts a sandbox per call and `supervise` one
/// per sandbox, where building every subcommand's arguments first costs a
/// third of a millisecond (clap builds the whole tree to parse any of it).
#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "Sandboxes for untrusted, model-generated code"
)]
struct FastCli {
    #[command(subcommand)]
    command: FastCommand,
}

#[derive(Subcommand)]
enum FastCommand {
    /// Run one command in a fresh, ephemeral sandbox and tear it down.
    Run(Box<run::RunArgs>),
    /// Own one sandbox for the daemon: launch it, serve its agent channel on
    /// a unix socket, tear it down when it ends. Not for direct use.
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
}

/// The command line, parsed against the narrow tree when it names one of
/// the commands that must start fast.
fn parse() -> Result<Command, clap::Error> {
    let first = std::env::args_os().nth(1);
    match first.as_ref().and_then(|a| a.to_str()) {
        Some("run" | "supervise") => FastCli::try_parse().map(|cli| match cli.command {
            FastCommand::Run(args) => Command::Run(args),
            FastCommand::Supervise(args) => Command::Supervise(args),
        }),
        _ => Cli::try_parse().map(|cli| cli.command),
    }
}

fn main() -> ExitCode {
    let command = match parse() {
        Ok(command) => command,
        Err(e) if e.use_stderr() => {
            eprintln!("airlock: error: {}", one_line(&e.render().to_string()));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match command {
        Command::Run(args) => run::main(*args),
        Command::Client(cmd) => client::main(cmd),
        Command::Serve(args) => serve::main(*args),
        Command::Keys(command) => serve::keys(command),
        Command::Supervise(args) => supervise::main(args),
        Command::EgressWorker => egress_worker::main(),
    }
}

/// clap's multi-line usage error as one line: the message without the tips
/// and the usage block.
fn one_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    for line in rendered.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line));
    }
    parts.join(" ") + " (see --help)"
}
