//! `airlock`: the CLI and the daemon's per-sandbox helpers (supervisors,
//! the egress worker). `airlock serve` and `airlock keys` exec the daemon's
//! binary, `airlockd`, beside this one; the in-sandbox agent is a third,
//! `airlock-agent` (see the package's `lib.rs`).

mod client;
mod run;
mod sandbox;
mod supervise;

use airlock::{egress_worker, EXIT_INTERNAL};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

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
    /// Run the daemon: the REST API on --listen, sandboxes on this machine
    /// (`airlockd serve`; see `airlock serve --help`).
    #[command(disable_help_flag = true)]
    Serve(Forwarded),
    /// Manage the daemon's API keys (`airlockd keys`; see `airlock keys --help`).
    #[command(disable_help_flag = true)]
    Keys(Forwarded),
    /// Own one sandbox for the daemon: launch it, serve its agent channel on
    /// a unix socket, tear it down when it ends. Not for direct use.
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
    /// The confined process serving the sandboxes' egress paths, started by
    /// the daemon with its channel on stdin. Not for direct use.
    #[command(hide = true)]
    EgressWorker,
}

/// The arguments of a command `airlockd` runs. Only `airlock help` sees
/// this: [`main`] hands `serve` and `keys` to `airlockd` before parsing.
#[derive(Args)]
struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
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

/// `airlock serve|keys ...` as `airlockd serve|keys ...`, in this
/// process (so a service manager or a test that started `airlock serve`
/// still holds the daemon's pid). Returns only on failure.
fn exec_daemon() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let daemon = match airlock::sibling_binary("airlockd") {
        Ok(path) => path,
        Err(e) => {
            eprintln!("airlock: error: cannot find the airlockd binary: {e}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    let e = std::process::Command::new(&daemon)
        .arg0("airlock")
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "airlock: error: cannot run the daemon {} (it is installed beside airlock): {e}",
        daemon.display()
    );
    ExitCode::from(EXIT_INTERNAL)
}

fn main() -> ExitCode {
    if matches!(
        std::env::args_os()
            .nth(1)
            .as_deref()
            .and_then(|a| a.to_str()),
        Some("serve" | "keys")
    ) {
        return exec_daemon();
    }
    let command = match airlock::parsed(parse()) {
        Ok(command) => command,
        Err(code) => return code,
    };
    match command {
        Command::Run(args) => run::main(*args),
        Command::Client(cmd) => client::main(cmd),
        Command::Serve(_) | Command::Keys(_) => exec_daemon(),
        Command::Supervise(args) => supervise::main(args),
        Command::EgressWorker => egress_worker::main(),
    }
}
