//! The unmodified e2b SDKs against a real `airlock serve`: the pytest suite
//! in `tests/e2b/` under each pinned Python SDK (latest 2.x, 2.45.1 which
//! checks the API key's shape, and the oldest 2.x that honours
//! `E2B_SANDBOX_URL`), and `tests/e2b-js/` under the pinned
//! JS SDK, with only `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY` set.
//!
//! Each pytest file under each venv, and each JS file, is a test of its
//! own (`e2b-latest::test_files.py`, `js::core.test.mjs`; filter them as
//! usual: `cargo test -p airlock --test e2b_sdk -- e2b-latest::`), run one
//! at a time against one daemon, which starts with the first and stops
//! after the last. The daemon names a small test internet of its own
//! (`--egress-host`, see [`Internet`]) for `test_network.py`.
//!
//! The SDKs are installed by `scripts/deps` (venvs in /opt/airlock/e2b-*,
//! the JS SDK in /opt/airlock/e2b-js). Without them these tests fail; they
//! never skip. A suite a venv cannot run is listed as ignored, with why.
//!
//! Enable or disable suites by editing the lists below; a venv is one more
//! entry in [`VENVS`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use common::net::FarNet;
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The pytest files of `tests/e2b/` that run, in every venv below (unless
/// the venv skips them).
const PYTHON_SUITES: &[&str] = &[
    "test_control.py",
    "test_commands.py",
    "test_files.py",
    "test_failures.py",
    "test_async.py",
    "test_code_interpreter.py",
    "test_pty.py",
    "test_network.py",
    "test_volumes.py",
    "test_ports.py",
];

/// The pytest files that build templates (the Template SDK): they run
/// against a daemon of their own, which has the `base` template imported
/// from the cached fixture (`common::base`, built once per machine), so
/// that the other suites keep running on what `base` is without one.
/// The snapshot suite runs there too: the host's system (what `base` is
/// without the template) cannot be snapshotted.
const TEMPLATE_SUITES: &[&str] = &["test_template_build.py", "test_snapshots.py"];

/// The `node --test` files of `tests/e2b-js/` that run.
const JS_SUITES: &[&str] = &["core.test.mjs"];

/// The `node --test` files that run on the template suites' daemon (a
/// filesystem pause needs `base` to be a real template).
const JS_TEMPLATE_SUITES: &[&str] = &["state.test.mjs"];

/// Arguments of every pytest run: stop at the first failure, quietly.
/// `AIRLOCK_E2B_PYTEST_ARGS` replaces them (e.g. `-q -rA` to run every test
/// of each file and list their outcomes).
const PYTEST_ARGS: &[&str] = &["-x", "-q"];

struct Venv {
    name: &'static str,
    path: &'static str,
    /// Suites of [`PYTHON_SUITES`] this venv cannot run, and why.
    skip: &'static [&'static str],
}

const VENVS: &[Venv] = &[
    Venv {
        name: "e2b 2.63.0 (latest 2.x) + e2b-code-interpreter 2.11.5",
        path: "/opt/airlock/e2b-latest",
        skip: &[],
    },
    Venv {
        name: "e2b 2.45.1 (newest 2.x that refuses keys not shaped e2b_<hex>)",
        path: "/opt/airlock/e2b-keycheck",
        // Run without E2B_VALIDATE_API_KEY (e2b_env removes it): the
        // daemon's key must pass the SDK's own check. The code interpreter,
        // network and template build cases run on the latest venv.
        skip: &[
            "test_code_interpreter.py",
            "test_network.py",
            "test_template_build.py",
        ],
    },
    Venv {
        name: "e2b 2.7.0 (oldest 2.x honouring E2B_SANDBOX_URL)",
        path: "/opt/airlock/e2b-oldest",
        // No e2b-code-interpreter release that works with e2b 2.7.0 honours
        // E2B_SANDBOX_URL (see scripts/deps); e2b 2.7.0 has no `network`
        // option and no `update_network`; its Template SDK is an older wire
        // (the latest venv builds templates); it has no snapshot or fork
        // methods, and no volumes.
        skip: &[
            "test_code_interpreter.py",
            "test_network.py",
            "test_template_build.py",
            "test_snapshots.py",
            "test_volumes.py",
        ],
    },
];

const JS_DIR: &str = "/opt/airlock/e2b-js";

fn python_dir() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/e2b")
}

fn js_dir() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/e2b-js")
}

/// `command` with the e2b environment pointing at `daemon` and nothing from
/// the host that could reroute or change the SDKs.
fn e2b_env(command: &mut Command, daemon: &TestDaemon) {
    command
        .env("E2B_API_URL", &daemon.url)
        .env("E2B_SANDBOX_URL", &daemon.url)
        // Volumes' content calls go here (they never read E2B_API_URL).
        .env("E2B_VOLUME_API_URL", &daemon.url)
        .env("E2B_API_KEY", &daemon.key);
    common::client_env(command);
    for name in [
        "E2B_DOMAIN",
        "E2B_DEBUG",
        "E2B_ACCESS_TOKEN",
        "E2B_HTTP_VERSION",
        "E2B_VALIDATE_API_KEY",
    ] {
        command.env_remove(name);
    }
}

/// Runs `command`; on failure, panics with its output and the daemon's log.
fn run(daemon: &TestDaemon, what: &str, mut command: Command) -> Result<(), String> {
    let started = Instant::now();
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({e}): run scripts/deps as root"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{what}: exit {:?} in {:.1?}\n{stdout}{stderr}",
        out.status.code(),
        started.elapsed()
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed (exit {:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon log\n{}",
            out.status.code(),
            daemon.log.lock().unwrap()
        ))
    }
}

/// The test internet of `test_network.py`: an HTTP server on
/// 203.0.113.2:8000 (TEST-NET-3) in a network namespace of its own, which
/// the daemon knows as each of [`SITE_NAMES`].
struct Internet {
    server: Child,
    /// Dropped after the server (fields drop after `Drop::drop`).
    _net: FarNet,
}

/// The names the daemon resolves to the test internet (tests/e2b/test_network.py
/// uses them, on port 8000).
const SITE_NAMES: &[&str] = &["site.test", "other.test", "not-allowed.test"];
const SITE_ADDRESS: &str = "203.0.113.2";

impl Internet {
    fn start() -> Internet {
        let net = FarNet::new("e2", "203.0.113.1", SITE_ADDRESS);
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("index.html"), "hello from the test internet\n").unwrap();
        let mut server = Command::new("ip")
            .args(["netns", "exec", &net.netns, "python3", "-m", "http.server"])
            .args(["8000", "--bind", SITE_ADDRESS])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let url = format!("http://{SITE_ADDRESS}:8000/");
        let up = TestDaemon::wait_for(Duration::from_secs(10), || {
            Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-m", "1", &url])
                .status()
                .is_ok_and(|s| s.success())
        });
        if !up {
            let _ = server.kill();
            let _ = server.wait();
            panic!("the test internet's server at {url} did not start");
        }
        Internet { server, _net: net }
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// What every suite runs against. Fields drop in order: the daemon first.
struct Setup {
    daemon: TestDaemon,
    _internet: Internet,
}

impl Setup {
    fn start() -> Setup {
        let internet = Internet::start();
        let mut flags = vec![
            "--default-timeout".to_owned(),
            "300s".to_owned(),
            // tests/e2b/test_ports.py's domain.
            "--sandbox-domain".to_owned(),
            "sandboxes.airlock.test".to_owned(),
        ];
        for name in SITE_NAMES {
            flags.push("--egress-host".into());
            flags.push(format!("{name}={SITE_ADDRESS}"));
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Setup {
            daemon: TestDaemon::start(&flags),
            _internet: internet,
        }
    }
}

/// The setup, started by the first suite that needs it (a failure to start
/// fails every suite with the same message).
#[derive(Default)]
struct Shared(OnceLock<Result<Setup, String>>);

impl Shared {
    fn get(&self) -> Result<&Setup, Failed> {
        self.0
            .get_or_init(|| {
                std::panic::catch_unwind(Setup::start).map_err(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "the setup panicked".to_owned())
                })
            })
            .as_ref()
            .map_err(|e| Failed::from(format!("cannot start the daemon: {e}")))
    }
}

/// The daemon of the template suites: `base` imported, started by the
/// first of them.
#[derive(Default)]
struct Builder(OnceLock<Result<TestDaemon, String>>);

impl Builder {
    fn get(&self) -> Result<&TestDaemon, Failed> {
        self.0
            .get_or_init(|| {
                std::panic::catch_unwind(|| {
                    let daemon = TestDaemon::start(&["--default-timeout", "300s"]);
                    common::store::import_ok(&daemon, &common::base::base_archive(), "base");
                    daemon
                })
                .map_err(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "the setup panicked".to_owned())
                })
            })
            .as_ref()
            .map_err(|e| Failed::from(format!("cannot start the build daemon: {e}")))
    }
}

/// A venv's name in test names: the last part of its path (`e2b-latest`).
fn tag(venv: &Venv) -> &'static str {
    venv.path.rsplit('/').next().unwrap_or(venv.path)
}

/// One pytest file under one venv.
fn pytest(shared: &Shared, venv: &Venv, suite: &str) -> Result<(), Failed> {
    check_venv(venv)?;
    let setup = shared.get()?;
    pytest_against(&setup.daemon, venv, suite)
}

fn check_venv(venv: &Venv) -> Result<(), Failed> {
    if !Path::new(venv.path).join("bin/pytest").exists() {
        return Err(format!(
            "{} is not installed at {}: run scripts/deps as root",
            venv.name, venv.path
        )
        .into());
    }
    Ok(())
}

/// One template suite under one venv, on the build daemon; after it, the
/// layer store holds nothing no record or process owns.
fn pytest_builds(builder: &Builder, venv: &Venv, suite: &str) -> Result<(), Failed> {
    check_venv(venv)?;
    let daemon = builder.get()?;
    pytest_against(daemon, venv, suite)?;
    let unowned = common::store::unowned(daemon);
    if !unowned.ends_with(" 0") {
        return Err(
            format!("after {suite}, the layer store has unowned entries: {unowned}").into(),
        );
    }
    Ok(())
}

fn pytest_against(daemon: &TestDaemon, venv: &Venv, suite: &str) -> Result<(), Failed> {
    let pytest = Path::new(venv.path).join("bin/pytest");
    let mut command = Command::new(pytest);
    match std::env::var("AIRLOCK_E2B_PYTEST_ARGS") {
        Ok(args) if !args.trim().is_empty() => command.args(args.split_whitespace()),
        _ => command.args(PYTEST_ARGS),
    };
    command
        .args(["-p", "no:cacheprovider", "--color=no"])
        .arg(suite)
        .current_dir(python_dir());
    e2b_env(&mut command, daemon);
    let result = run(daemon, &format!("pytest {suite} [{}]", venv.name), command);
    daemon.delete_all();
    result.map_err(Failed::from)
}

/// One `node --test` file, against the daemon `daemon` gives.
fn node<'a>(
    daemon: impl FnOnce() -> Result<&'a TestDaemon, Failed>,
    suite: &str,
) -> Result<(), Failed> {
    if !Path::new(JS_DIR)
        .join("node_modules/e2b/package.json")
        .exists()
    {
        return Err(format!(
            "the e2b JS SDK is not installed at {JS_DIR}: run scripts/deps as root"
        )
        .into());
    }
    let daemon = daemon()?;
    let mut command = Command::new("node");
    command
        .args(["--test", "--test-reporter=spec"])
        .arg(suite)
        .env("E2B_JS_DIR", JS_DIR)
        .current_dir(js_dir());
    e2b_env(&mut command, daemon);
    let result = run(daemon, &format!("node --test {suite}"), command);
    daemon.delete_all();
    result.map_err(Failed::from)
}

fn main() {
    let mut args = Arguments::from_args();
    // One suite at a time: they share the daemon, whose sandboxes are
    // deleted after each.
    args.test_threads = Some(1);
    let shared = Arc::new(Shared::default());
    let builder = Arc::new(Builder::default());
    let mut trials = Vec::new();
    for venv in VENVS {
        for &suite in PYTHON_SUITES.iter().chain(TEMPLATE_SUITES) {
            let name = format!("{}::{suite}", tag(venv));
            let trial = if venv.skip.contains(&suite) {
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            } else if TEMPLATE_SUITES.contains(&suite) {
                let builder = Arc::clone(&builder);
                Trial::test(name, move || pytest_builds(&builder, venv, suite))
            } else {
                let shared = Arc::clone(&shared);
                Trial::test(name, move || pytest(&shared, venv, suite))
            };
            trials.push(trial);
        }
    }
    for &suite in JS_SUITES {
        let shared = Arc::clone(&shared);
        trials.push(Trial::test(format!("js::{suite}"), move || {
            node(|| Ok(&shared.get()?.daemon), suite)
        }));
    }
    for &suite in JS_TEMPLATE_SUITES {
        let builder = Arc::clone(&builder);
        trials.push(Trial::test(format!("js::{suite}"), move || {
            node(|| builder.get(), suite)
        }));
    }
    let conclusion = libtest_mimic::run(&args, trials);
    // The daemons (and the test internet) stop before the process exits.
    drop(shared);
    drop(builder);
    conclusion.exit();
}
