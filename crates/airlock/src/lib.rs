//! What the `airlock` package's two host binaries share.
//!
//! - `airlock` (`src/main.rs`): the CLI people type (`run`, the client
//!   commands) and the per-sandbox helpers the daemon starts (`supervise`,
//!   `egress-worker`). Kept small, because it starts once per `airlock run`
//!   and once per sandbox: a static-pie binary applies every relocation of
//!   everything it links at each start.
//! - `airlockd` (`src/bin/airlockd.rs`): the daemon (`serve`) and its key
//!   tool (`keys`): the API server, its store and its dialects.
//!   `airlock serve` and `airlock keys` exec it.
//!
//! The third, `airlock-agent`, is the in-sandbox init and shares nothing
//! here.

pub mod egress_worker;
pub mod net_args;
pub mod serve;

use std::path::{Path, PathBuf};

/// Exit code for bad input (flags, limits, paths), as clap uses for usage errors.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when airlock itself failed (as `docker run` uses 125).
pub const EXIT_INTERNAL: u8 = 125;

/// An error and its sources as one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `binary` itself if it names a path, else the first file of that name in
/// PATH (or the name as given, for the tier's probe to report).
pub fn in_path(binary: &Path) -> PathBuf {
    if binary.components().count() > 1 {
        return binary.to_owned();
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(binary))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| binary.to_owned())
}

/// The package's binary `name` beside the running one: the daemon finds
/// `airlock` (its supervisors and egress worker) there, and `airlock`
/// finds `airlockd`, as the tiers find `airlock-agent`.
pub fn sibling_binary(name: &str) -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the running binary has no parent directory",
        )
    })?;
    Ok(dir.join(name))
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

/// A parsed command line, or the exit code after clap's answer is shown:
/// a usage error as one line on stderr (exit 2), `--help` and `--version`
/// as clap prints them (exit 0).
pub fn parsed<T>(result: Result<T, clap::Error>) -> Result<T, std::process::ExitCode> {
    match result {
        Ok(parsed) => Ok(parsed),
        Err(e) if e.use_stderr() => {
            eprintln!("airlock: error: {}", one_line(&e.render().to_string()));
            Err(std::process::ExitCode::from(EXIT_BAD_INPUT))
        }
        Err(e) => {
            let _ = e.print();
            Err(std::process::ExitCode::SUCCESS)
        }
    }
}
