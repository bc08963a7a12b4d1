//! Chaos: sandboxes are created, used and deleted by several clients while
//! a chaos thread kills, with -9 and at random moments, a supervisor, a
//! sandbox's agent (its PID 1, seen from the host) or the daemon itself
//! (then starts it again on the same data directory). At the end the daemon
//! is restarted once more, reconciles, every sandbox is deleted through the
//! API, and nothing of this daemon may be left: no supervisor, agent or
//! egress worker, no mount, cgroup, network namespace or veth of its
//! sandboxes, no socket, deadline or ending file, no slot record,
//! `airlock_leaked_resources` 0, and no store row in a live state.
//!
//! Seeded: the seed is printed, and `AIRLOCK_CHAOS_SEED=N` replays it (the
//! same choices; the timing of a loaded machine differs). The chaos lasts
//! `AIRLOCK_CHAOS_SECONDS` (default 45 s); the whole test stays within
//! about 90 s on the default.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{agent, try_call, Answer, TestDaemon};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// Client threads creating, using and deleting sandboxes.
const CLIENTS: usize = 3;
/// Default length of the chaos, in seconds.
const DEFAULT_SECONDS: u64 = 45;
/// The cgroup v1 controllers and the v2 root a sandbox may have a
/// directory in (see `airlock_jail::cgroup`).
const CGROUP_PARENTS: &[&str] = &[
    "/sys/fs/cgroup/memory/airlock",
    "/sys/fs/cgroup/cpu/airlock",
    "/sys/fs/cgroup/cpuacct/airlock",
    "/sys/fs/cgroup/pids/airlock",
    "/sys/fs/cgroup/unified/airlock",
    "/sys/fs/cgroup/airlock",
];
const SLOTS: &str = "/run/airlock/slots";
const SOCKETS: &str = "/run/airlock/sockets";

/// xorshift64*: small, seedable, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Never zero (xorshift's fixed point).
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

fn seed() -> u64 {
    match std::env::var("AIRLOCK_CHAOS_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("AIRLOCK_CHAOS_SEED={text:?} is not a number: {e}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

fn chaos_seconds() -> u64 {
    match std::env::var("AIRLOCK_CHAOS_SECONDS") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("AIRLOCK_CHAOS_SECONDS={text:?} is not a number: {e}")),
        Err(_) => DEFAULT_SECONDS,
    }
}

/// One host process, as /proc shows it.
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    ppid: u32,
    /// Start time in clock ticks since boot: with the pid, who it is.
    start: u64,
    args: Vec<String>,
    cgroup: String,
}

impl Proc {
    fn read(pid: u32) -> Option<Proc> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name, which may hold spaces and ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ppid = fields.get(1)?.parse().ok()?;
        let start = fields.get(19)?.parse().ok()?;
        let args = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        Some(Proc {
            pid,
            ppid,
            start,
            args,
            cgroup,
        })
    }

    /// The value after `flag` on its command line.
    fn arg(&self, flag: &str) -> Option<&str> {
        self.args
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].as_str())
    }

    /// Whether it is an `airlock supervise` of the daemon tagged `tag`.
    fn is_supervisor_of(&self, tag: &str) -> bool {
        self.args.iter().any(|a| a == "supervise") && self.arg("--owner") == Some(tag)
    }

    /// The sandbox whose cgroup it is in, if any.
    fn sandbox(&self) -> Option<&str> {
        self.cgroup
            .lines()
            .find_map(|l| l.rsplit_once("/airlock/").map(|(_, id)| id))
            .filter(|id| id.starts_with("sbx-"))
    }

    /// Whether the same process still runs (not a recycled pid).
    fn alive(&self) -> bool {
        Proc::read(self.pid).is_some_and(|p| p.start == self.start)
    }

    fn describe(&self) -> String {
        format!("pid {} ({})", self.pid, self.args.join(" "))
    }
}

fn processes() -> Vec<Proc> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(Proc::read)
        .collect()
}

/// `kill -9` of `target`, through a pidfd opened before its identity is
/// checked again, so a recycled pid is never hit. Whether it was sent.
fn kill9(target: &Proc) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(target.pid as i32) else {
        return false;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    target.alive()
        && rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).is_ok()
}

/// The daemon the clients talk to now (its port changes on each start).
struct Endpoint {
    url: RwLock<String>,
    key: String,
}

impl Endpoint {
    fn call(
        &self,
        agent: &ureq::Agent,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let url = self.url.read().unwrap().clone();
        try_call(agent, &url, &self.key, method, path, body)
    }
}

/// What the clients did, and what they got that the chaos does not explain.
#[derive(Default)]
struct Tally {
    created: AtomicU64,
    execs_ok: AtomicU64,
    deleted: AtomicU64,
    /// Connection errors, 5xx, 409 and 429: what a daemon, supervisor or
    /// agent killed under a request (or a full admission queue) gives.
    tolerated: AtomicU64,
    unexpected: Mutex<Vec<String>>,
}

impl Tally {
    /// Counts an answer that is neither `ok` nor explained by the chaos.
    fn judge(&self, what: &str, result: &Result<Answer, String>, ok: u16) -> bool {
        match result {
            Ok(a) if a.status == ok => true,
            Ok(a) if a.status >= 500 || a.status == 409 || a.status == 429 => {
                self.tolerated.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(_) => {
                self.tolerated.fetch_add(1, Ordering::Relaxed);
                false
            }
            Ok(a) => {
                self.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("{what}: {} {}", a.status, a.text()));
                false
            }
        }
    }
}

/// Everything the test saw of this daemon's sandboxes.
#[derive(Default)]
struct Seen {
    /// Sandbox ids: created through the API or found on a supervisor's
    /// command line.
    ids: Mutex<HashSet<String>>,
    /// Egress workers of daemons that were killed or stopped.
    workers: Mutex<Vec<Proc>>,
}

impl Seen {
    fn id(&self, id: &str) {
        self.ids.lock().unwrap().insert(id.to_owned());
    }
}

/// One client: creates a sandbox (network none or an allowlist, some with
/// a short timeout), runs a command or two in it and usually deletes it,
/// until told to stop.
fn client(endpoint: &Endpoint, tally: &Tally, seen: &Seen, stop: &AtomicBool, seed: u64) {
    let agent = agent();
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let network = if rng.chance(40) {
            json!({"mode": "allow", "rules": ["example.test", "*.example.test:443"]})
        } else {
            json!({"mode": "none"})
        };
        // Some expire during the chaos (at the daemon's reaper, or at their
        // supervisor's own deadline while the daemon is down).
        let timeout_s = if rng.chance(30) {
            2 + rng.below(4)
        } else {
            120
        };
        let body = json!({"timeout_s": timeout_s, "network": network,
                          "limits": {"memory": "256M"}});
        let created = endpoint.call(&agent, "POST", "/v1/sandboxes", Some(&body));
        if !tally.judge("create", &created, 201) {
            std::thread::sleep(rng.millis(50, 300));
            continue;
        }
        let view = created.unwrap().json();
        let id = view["id"].as_str().unwrap().to_owned();
        seen.id(&id);
        tally.created.fetch_add(1, Ordering::Relaxed);
        for n in 0..rng.below(3) + 1 {
            let word = format!("chaos-{n}");
            let exec = json!({"cmd": "/bin/sh", "args": ["-c", format!("echo {word}")]});
            let path = format!("/v1/sandboxes/{id}/exec");
            let answer = endpoint.call(&agent, "POST", &path, Some(&exec));
            if tally.judge("exec", &answer, 200) {
                let text = answer.unwrap().text();
                // A stream cut by a kill ends without `exited`: not a success,
                // not a failure either.
                if text.contains(&word) && text.contains("\"exited\"") {
                    tally.execs_ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.tolerated.fetch_add(1, Ordering::Relaxed);
                }
            }
            std::thread::sleep(rng.millis(0, 200));
        }
        // A quarter are left behind, for their deadline or the end.
        if rng.chance(75) {
            let answer = endpoint.call(&agent, "DELETE", &format!("/v1/sandboxes/{id}"), None);
            if tally.judge("delete", &answer, 204) {
                tally.deleted.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(rng.millis(0, 150));
    }
}

/// The supervisors of the daemon tagged `tag`, and their sandboxes' agents.
fn supervisors_and_agents(tag: &str) -> (Vec<Proc>, Vec<Proc>) {
    let all = processes();
    let supervisors: Vec<Proc> = all
        .iter()
        .filter(|p| p.is_supervisor_of(tag))
        .cloned()
        .collect();
    // An agent is the sandbox init the supervisor cloned, inside the
    // sandbox's cgroup.
    let agents = all
        .iter()
        .filter(|p| {
            supervisors
                .iter()
                .any(|s| s.pid == p.ppid && s.arg("--id").is_some() && p.sandbox() == s.arg("--id"))
        })
        .cloned()
        .collect();
    (supervisors, agents)
}

/// The egress workers the daemon `daemon` started (its children).
fn egress_workers(daemon: u32) -> Vec<Proc> {
    processes()
        .into_iter()
        .filter(|p| p.ppid == daemon && p.args.iter().any(|a| a == "egress-worker"))
        .collect()
}

/// The chaos: at random moments, kill -9 a supervisor, an agent or the
/// daemon (started again after a random pause), until `until`.
fn chaos(
    daemon: &mut TestDaemon,
    endpoint: &Endpoint,
    seen: &Seen,
    tag: &str,
    until: Instant,
    rng: &mut Rng,
) -> [u64; 3] {
    let mut kills = [0u64; 3];
    while Instant::now() < until {
        std::thread::sleep(rng.millis(300, 2500));
        let (supervisors, agents) = supervisors_and_agents(tag);
        for s in &supervisors {
            if let Some(id) = s.arg("--id") {
                seen.id(id);
            }
        }
        match rng.below(100) {
            0..=39 => {
                if supervisors.is_empty() {
                    continue;
                }
                let victim = &supervisors[rng.below(supervisors.len() as u64) as usize];
                if kill9(victim) {
                    kills[0] += 1;
                }
            }
            40..=74 => {
                if agents.is_empty() {
                    continue;
                }
                let victim = &agents[rng.below(agents.len() as u64) as usize];
                if kill9(victim) {
                    kills[1] += 1;
                }
            }
            _ => {
                seen.workers
                    .lock()
                    .unwrap()
                    .extend(egress_workers(daemon.pid()));
                daemon.kill9();
                kills[2] += 1;
                std::thread::sleep(rng.millis(0, 1500));
                daemon.restart();
                *endpoint.url.write().unwrap() = daemon.url.clone();
            }
        }
    }
    kills
}

/// Sets `flag` when dropped: a chaos thread that panics still stops the
/// clients.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Stops, when dropped, every supervisor of the daemon tagged with its tag
/// (SIGTERM: each tears its sandbox down), so a failed run leaves nothing
/// for the next one. Declared before the daemon, it runs after its drop.
struct Cleanup(Mutex<Option<String>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(tag) = self.0.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        for p in processes().iter().filter(|p| p.is_supervisor_of(&tag)) {
            if let Some(pid) = rustix::process::Pid::from_raw(p.pid as i32) {
                if let Ok(pidfd) =
                    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
                {
                    if p.alive() {
                        let _ = rustix::process::pidfd_send_signal(
                            &pidfd,
                            rustix::process::Signal::TERM,
                        );
                    }
                }
            }
        }
    }
}

/// Every row of the store, through the listing's pages (`states`, if
/// given, filters them).
fn rows(daemon: &TestDaemon, states: Option<&str>) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = String::from("/v1/sandboxes?limit=1000");
        if let Some(states) = states {
            path.push_str(&format!("&state={states}"));
        }
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let answer = daemon.call("GET", &path, None);
        assert_eq!(answer.status, 200, "list {path}: {}", answer.text());
        let page = answer.json();
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return items,
        }
    }
}

const LIVE_STATES: &str = "creating,running,paused,stopping";

/// The value of the gauge `airlock_leaked_resources`.
fn leaked_metric(daemon: &TestDaemon) -> Option<i64> {
    let metrics = daemon.call("GET", "/metrics", None).text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("airlock_leaked_resources "))
        .and_then(|v| v.trim().parse().ok())
}

/// Inode of the network namespace the test (and the daemon) runs in.
fn host_netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

/// Network namespaces other than the host's that process `pid` holds
/// through its descriptors: a namespace descriptor itself, or a socket
/// made in another namespace (an egress listener keeps its sandbox's
/// namespace alive after every process of it is gone). Each as a line
/// saying which descriptor.
fn foreign_netns_held_by(pid: u32, what: &str) -> Vec<String> {
    let host = host_netns();
    let mut held = Vec::new();
    let Some(target) = rustix::process::Pid::from_raw(pid as i32) else {
        return held;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty())
    else {
        return held;
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return held;
    };
    for entry in entries.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let link = link.to_string_lossy().into_owned();
        if let Some(inode) = link
            .strip_prefix("net:[")
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|n| n.parse::<u64>().ok())
        {
            if inode != host {
                held.push(format!(
                    "{what} (pid {pid}) holds network namespace {inode} as descriptor {fd}"
                ));
            }
            continue;
        }
        if !link.starts_with("socket:") {
            continue;
        }
        let Ok(copy) =
            rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())
        else {
            continue;
        };
        if let Some(inode) = socket_netns(&copy) {
            if inode != host {
                held.push(format!(
                    "{what} (pid {pid}) holds a socket ({link}, descriptor {fd}) of network namespace {inode}"
                ));
            }
        }
    }
    held
}

/// The network namespace a socket was made in (SIOCGSKNS).
fn socket_netns(socket: &OwnedFd) -> Option<u64> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor (or
    // -1); `socket` is a descriptor we own for the whole call.
    let ns = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGSKNS as _) };
    if ns < 0 {
        return None;
    }
    // SAFETY: the ioctl just returned `ns` as a new descriptor nobody else
    // owns; OwnedFd closes it once.
    let ns = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ns) };
    let file = std::fs::File::from(ns);
    file.metadata().ok().map(|m| m.ino())
}

/// Names in `dir`, if it exists.
fn names_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// What is left on the host of sandboxes `ids` and of the daemon tagged
/// `tag`, each as a line saying what and where. `spares_of` is the pid of
/// a running daemon whose spare supervisors (started ahead, no sandbox
/// launched: no slot record, no cgroup, no socket) are allowed.
fn host_leftovers(tag: &str, ids: &HashSet<String>, spares_of: Option<u32>) -> Vec<String> {
    let mut left = Vec::new();
    let slot_records: Vec<(PathBuf, Value)> = std::fs::read_dir(SLOTS)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let record: Value = serde_json::from_str(&text).ok()?;
            Some((e.path(), record))
        })
        .collect();
    let has_record = |id: &str| slot_records.iter().any(|(_, r)| r["id"] == id);

    // Processes: supervisors of this tag, and anything in the cgroup of one
    // of its sandboxes (the agents and what they ran).
    for p in processes() {
        if p.is_supervisor_of(tag) {
            let id = p.arg("--id").unwrap_or_default();
            let spare = spares_of == Some(p.ppid) && !ids.contains(id) && !has_record(id);
            if !spare {
                left.push(format!(
                    "supervisor {} of sandbox {id} still runs",
                    p.describe()
                ));
            }
        } else if let Some(id) = p.sandbox().filter(|id| ids.contains(*id)) {
            left.push(format!(
                "process {} of sandbox {id} still runs (cgroup {})",
                p.describe(),
                p.cgroup
                    .lines()
                    .find(|l| l.ends_with(&format!("/airlock/{id}")))
                    .unwrap_or_default()
            ));
        }
    }
    // Cgroups.
    for parent in CGROUP_PARENTS {
        for name in names_in(Path::new(parent)) {
            if ids.contains(&name) {
                left.push(format!("cgroup {parent}/{name} is left"));
            }
        }
    }
    // Slot records (whether their owner lives or not: a dead owner's
    // record is what the next sweep must clear).
    for (path, record) in &slot_records {
        if record["id"].as_str().is_some_and(|id| ids.contains(id)) {
            left.push(format!("slot record {} is left: {record}", path.display()));
        }
    }
    // Sockets, deadline and ending files.
    let sockets = Path::new(SOCKETS).join(tag);
    for name in names_in(&sockets) {
        left.push(format!("{}/{name} is left", sockets.display()));
    }
    // Mounts on the host: sandbox mounts live in the sandbox's own mount
    // namespace; none may show here, nor a namespace bound to a file under
    // the runtime directory.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let point = fields.get(4).copied().unwrap_or_default();
        let ours = ids.iter().any(|id| line.contains(id.as_str()))
            || line.contains(tag)
            || point.starts_with("/run/airlock");
        if ours {
            left.push(format!("mount on the host: {line}"));
        }
    }
    // The veth pair of a sandbox with network lives inside its namespace;
    // it must never appear in the host's.
    for link in ["e0", "e1"] {
        if Path::new("/sys/class/net").join(link).exists() {
            left.push(format!(
                "the host's network namespace has the sandbox veth end {link}"
            ));
        }
    }
    left
}

/// Waits up to `limit` for `check` to find nothing, and returns what it
/// found last.
fn settle(limit: Duration, mut check: impl FnMut() -> Vec<String>) -> Vec<String> {
    let deadline = Instant::now() + limit;
    loop {
        let found = check();
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn report(title: &str, found: &[String], seed: u64, log: &str) -> String {
    format!(
        "{title} (replay with AIRLOCK_CHAOS_SEED={seed}):\n  {}\ndaemon log (last 8 KiB):\n{}",
        found.join("\n  "),
        &log[log.len().saturating_sub(8192)..]
    )
}

/// The control: a live sandbox with network is seen by every probe (its
/// supervisor, agent, cgroups, slot record, socket and deadline file, and
/// its namespace through the daemon's or the egress worker's listeners),
/// so a probe that finds nothing at the end found nothing because nothing
/// is there. Then it is deleted.
fn probes_see_a_live_sandbox(daemon: &TestDaemon, tag: &str) {
    let created = daemon.create(json!({"network": {"mode": "allow", "rules": ["example.test"]}}));
    let id = created["id"].as_str().unwrap().to_owned();
    // A changed deadline is written beside the socket.
    let answer = daemon.call(
        "POST",
        &format!("/v1/sandboxes/{id}/timeout"),
        Some(json!({"timeout_s": 600})),
    );
    assert_eq!(answer.status, 200, "timeout of {id}: {}", answer.text());
    let ids = HashSet::from([id.clone()]);
    let found = host_leftovers(tag, &ids, Some(daemon.pid())).join("\n");
    let (_, agents) = supervisors_and_agents(tag);
    let mut held = foreign_netns_held_by(daemon.pid(), "the daemon");
    for worker in egress_workers(daemon.pid()) {
        held.extend(foreign_netns_held_by(worker.pid, "the egress worker"));
    }
    for (what, seen) in [
        ("its supervisor", found.contains("supervisor")),
        (
            "its agent",
            agents.iter().any(|a| a.sandbox() == Some(id.as_str())),
        ),
        ("a process of it", found.contains("process pid")),
        ("its cgroup", found.contains("cgroup /sys/fs/cgroup")),
        ("its slot record", found.contains("slot record")),
        ("its socket", found.contains(&format!("{id}.sock is left"))),
        (
            "its deadline file",
            found.contains(&format!("{id}.deadline is left")),
        ),
        ("its network namespace", !held.is_empty()),
    ] {
        assert!(
            seen,
            "the probes do not see {what} of the live sandbox {id}:\n{found}\n{}",
            held.join("\n")
        );
    }
    let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(answer.status, 204, "delete {id}: {}", answer.text());
}

#[test]
fn nothing_leaks_when_supervisors_agents_and_the_daemon_are_killed_at_random() {
    let seed = seed();
    let seconds = chaos_seconds();
    eprintln!("chaos seed {seed} for {seconds} s (AIRLOCK_CHAOS_SEED={seed} replays it)");
    let started = Instant::now();
    let cleanup = Cleanup(Mutex::new(None));
    let mut daemon = TestDaemon::start(&["--egress-host", "example.test=203.0.113.7"]);
    let tag = daemon.instance();
    *cleanup.0.lock().unwrap() = Some(tag.clone());
    probes_see_a_live_sandbox(&daemon, &tag);
    let endpoint = Endpoint {
        url: RwLock::new(daemon.url.clone()),
        key: daemon.key.clone(),
    };
    let tally = Tally::default();
    let seen = Seen::default();
    let stop = AtomicBool::new(false);
    let mut rng = Rng::new(seed);
    let client_seeds: Vec<u64> = (0..CLIENTS).map(|_| rng.next()).collect();
    let until = Instant::now() + Duration::from_secs(seconds);

    let kills = std::thread::scope(|scope| {
        for s in &client_seeds {
            let (endpoint, tally, seen, stop) = (&endpoint, &tally, &seen, &stop);
            scope.spawn(move || client(endpoint, tally, seen, stop, *s));
        }
        let _stop_clients = SetOnDrop(&stop);
        chaos(&mut daemon, &endpoint, &seen, &tag, until, &mut rng)
    });
    let created = tally.created.load(Ordering::Relaxed);
    let execs = tally.execs_ok.load(Ordering::Relaxed);
    eprintln!(
        "chaos: {created} created, {execs} execs answered, {} deleted, {} calls failed as the chaos explains; \
         killed {} supervisors, {} agents, {} daemons",
        tally.deleted.load(Ordering::Relaxed),
        tally.tolerated.load(Ordering::Relaxed),
        kills[0],
        kills[1],
        kills[2],
    );
    let unexpected = tally.unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "{}",
        report(
            "answers the chaos does not explain",
            &unexpected,
            seed,
            &daemon.log.lock().unwrap()
        )
    );
    // Not vacuous: the clients got work done between the kills.
    assert!(
        created >= 5 && execs >= 5,
        "the clients got too little done to test anything: {created} sandboxes created, {execs} execs answered"
    );

    // The end: one more restart, which reconciles before it serves.
    seen.workers
        .lock()
        .unwrap()
        .extend(egress_workers(daemon.pid()));
    daemon.restart();
    // Adoption retries run in the background: wait (bounded) until every
    // sandbox recorded running answers, so they are done or nearly.
    let adopted_by = Instant::now() + Duration::from_secs(15);
    loop {
        let running = rows(&daemon, Some("running"));
        let silent: Vec<&Value> = running
            .iter()
            .filter(|r| {
                let id = r["id"].as_str().unwrap_or_default();
                daemon
                    .call("GET", &format!("/v1/sandboxes/{id}/processes"), None)
                    .status
                    != 200
            })
            .collect();
        if silent.is_empty() || Instant::now() >= adopted_by {
            if !silent.is_empty() {
                eprintln!(
                    "still not answering after the restart: {}",
                    silent
                        .iter()
                        .map(|r| r["id"].to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    // Delete every sandbox through the API, until no row is live.
    let mut failed_deletes = Vec::new();
    let live = settle(Duration::from_secs(30), || {
        for row in rows(&daemon, None) {
            let id = row["id"].as_str().unwrap_or_default().to_owned();
            seen.id(&id);
            if row["state"] != "dead" {
                let answer = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
                if answer.status != 204 {
                    failed_deletes.push(format!(
                        "DELETE {id}: {} {}",
                        answer.status,
                        answer.text()
                    ));
                }
            }
        }
        rows(&daemon, Some(LIVE_STATES))
            .iter()
            .map(|r| format!("store row {} is {} after the deletes", r["id"], r["state"]))
            .collect()
    });
    let log = daemon.log.lock().unwrap().clone();
    assert!(
        live.is_empty() && failed_deletes.is_empty(),
        "{}",
        report(
            "sandboxes that could not be deleted",
            &[live, failed_deletes].concat(),
            seed,
            &log
        )
    );
    let ids = seen.ids.lock().unwrap().clone();
    eprintln!("{} sandboxes of this daemon to check", ids.len());

    // With the daemon running: nothing on the host but its spares, no
    // descriptor of the daemon or its egress worker in a sandbox's network
    // namespace, no egress worker of an earlier daemon, no leak counted.
    let pid = daemon.pid();
    let found = settle(Duration::from_secs(15), || {
        let mut found = host_leftovers(&tag, &ids, Some(pid));
        found.extend(foreign_netns_held_by(pid, "the daemon"));
        for worker in egress_workers(pid) {
            found.extend(foreign_netns_held_by(worker.pid, "the egress worker"));
        }
        for worker in seen.workers.lock().unwrap().iter() {
            if worker.alive() {
                found.push(format!(
                    "egress worker {} of a killed daemon still runs",
                    worker.describe()
                ));
            }
        }
        match leaked_metric(&daemon) {
            Some(0) => {}
            Some(n) => found.push(format!("/metrics says airlock_leaked_resources {n}")),
            None => found.push("/metrics has no airlock_leaked_resources".to_owned()),
        }
        found
    });
    assert!(
        found.is_empty(),
        "{}",
        report(
            "left behind with the daemon running",
            &found,
            seed,
            &daemon.log.lock().unwrap()
        )
    );

    // Stopped: not even a spare, a socket or a worker may be left, and the
    // store holds no live row.
    let workers = egress_workers(pid);
    daemon.stop();
    let found = settle(Duration::from_secs(15), || {
        let mut found = host_leftovers(&tag, &ids, None);
        for worker in &workers {
            if worker.alive() {
                found.push(format!(
                    "egress worker {} of the stopped daemon still runs",
                    worker.describe()
                ));
            }
        }
        found
    });
    let store = airlock_store::Store::open(&daemon.data_dir().join("airlock.db")).unwrap();
    let live: BTreeSet<String> = store
        .live_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| format!("store row {} is {:?}", r.id, r.state))
        .collect();
    let found = [found, live.into_iter().collect()].concat();
    assert!(
        found.is_empty(),
        "{}",
        report(
            "left behind after the daemon stopped",
            &found,
            seed,
            &daemon.log.lock().unwrap()
        )
    );
    eprintln!("chaos test took {:?}", started.elapsed());
}
