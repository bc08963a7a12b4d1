//! `airlockd`: the daemon (`serve`: the REST API, its store, its dialects
//! and the sandboxes of this machine) and its key tool (`keys`). People
//! type `airlock serve` and `airlock keys`, which exec this binary with
//! the same arguments; each sandbox's supervisor and the egress worker are
//! the small `airlock` binary beside it.

use airlock::serve::{KeysCommand, ServeArgs};
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "The airlock daemon: sandboxes for untrusted, model-generated code"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: the REST API on --listen, sandboxes on this machine.
    Serve(Box<ServeArgs>),
    /// Manage the daemon's API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
}

fn main() -> ExitCode {
    let command = match airlock::parsed(Cli::try_parse()) {
        Ok(cli) => cli.command,
        Err(code) => return code,
    };
    match command {
        Command::Serve(args) => airlock::serve::main(*args),
        Command::Keys(command) => airlock::serve::keys(command),
    }
}
