//! The daemon's layer store as the template tests look at it: imports by
//! the CLI, the layers and staging entries on disk, and the metric of
//! entries nothing owns.

use super::daemon::TestDaemon;
use std::path::Path;
use std::process::Output;

/// `airlock template import FILE --name NAME` against `daemon`.
pub fn import(daemon: &TestDaemon, file: &Path, name: &str) -> Output {
    let file = file.to_string_lossy();
    daemon.cli(&["template", "import", &file, "--name", name])
}

/// [`import`], which must succeed.
pub fn import_ok(daemon: &TestDaemon, file: &Path, name: &str) {
    let out = import(daemon, file, name);
    assert!(
        out.status.success(),
        "import {name}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The layers on disk, by `diff_id`, sorted.
pub fn layer_dirs(daemon: &TestDaemon) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(daemon.data_dir().join("layers/sha256"))
        .map(|d| {
            d.map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Entries of the store's staging area.
pub fn staging_entries(daemon: &TestDaemon) -> usize {
    std::fs::read_dir(daemon.data_dir().join("layers/tmp")).map_or(0, Iterator::count)
}

/// The `airlock_layer_store_unowned_entries` line of the daemon's metrics.
pub fn unowned(daemon: &TestDaemon) -> String {
    let metrics = daemon.call("GET", "/metrics", None).text();
    metrics
        .lines()
        .find(|l| l.starts_with("airlock_layer_store_unowned_entries"))
        .unwrap_or_else(|| panic!("no unowned-entries metric in:\n{metrics}"))
        .to_owned()
}
