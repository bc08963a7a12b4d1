//! The tiers beyond `process` through the daemon: a gvisor sandbox runs
//! gVisor's kernel, survives a daemon killed with -9, leaves nothing when
//! its runtime is killed, and reaches the network only through its guest
//! link; an oci sandbox runs under runc. The hostile
//! suite runs on every tier too (scripts/test, `AIRLOCK_TEST_TIER`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::*;
use common::images::{busybox_layer, config, docker_save};
use serde_json::json;
use std::time::Duration;

/// The pids in sandbox `id`'s cgroup (the runtime's and the sandbox's).
fn cgroup_pids(id: &str) -> Vec<u32> {
    std::fs::read_to_string(format!("/sys/fs/cgroup/pids/airlock/{id}/cgroup.procs"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/airlock/{id}/cgroup.procs")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// Nothing of `id` is left, and no bundle or runtime state either.
fn assert_gone_with_its_bundle(id: &str) {
    assert_sandbox_gone(id);
    let dir = std::path::Path::new("/run/airlock/containers").join(id);
    assert!(!dir.exists(), "{} survived its sandbox", dir.display());
}

#[test]
fn a_gvisor_sandbox_runs_gvisors_kernel_and_goes_whole() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({"tier": "gvisor"}));
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["tier"], "gvisor", "{created}");
    // gVisor's kernel answers, under its own fixed name (its boot log is
    // the syslog(2) the seccomp filter denies), not the host's.
    let (release, code) = daemon.sh_out(&id, "uname -rv");
    assert_eq!(code, 0, "{release}");
    assert_eq!(release, "4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!release.contains(host.trim()), "{release}");
    // Files go through the same agent calls as on every tier.
    let put = daemon.call_as(
        Some(&daemon.key),
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path=/home/user/in.txt"),
        Some(b"through gVisor"),
        Some("application/octet-stream"),
        &[],
    );
    assert!(put.status < 300, "{}", put.text());
    assert_eq!(
        daemon.sh_out(&id, "cat /home/user/in.txt; echo; ls -l /home/user | wc -l"),
        ("through gVisor\n2\n".into(), 0)
    );
    // A syscall the host's kernel (and the seccomp filter) allows but
    // gVisor does not implement fails cleanly, and the sandbox goes on.
    let (out, code) = daemon.sh_out(
        &id,
        "python3 -c 'import ctypes, os; l = ctypes.CDLL(None, use_errno=True); r = l.syscall(122, -1); print(r, ctypes.get_errno())'; echo alive",
    );
    assert_eq!((out.as_str(), code), ("-1 38\nalive\n", 0));
    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(deleted.status < 300, "{}", deleted.text());
    assert_gone_with_its_bundle(&id);
}

#[test]
fn a_gvisor_sandbox_whose_runtime_is_killed_leaves_nothing() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({"tier": "gvisor"}));
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(daemon.sh_out(&id, "echo up"), ("up\n".into(), 0));
    // gVisor's sandbox process (its kernel, the sentry), killed -9.
    let sentry = cgroup_pids(&id)
        .into_iter()
        .find(|pid| cmdline(*pid).contains("runsc-sandbox") || cmdline(*pid).contains(" boot "))
        .unwrap_or_else(|| panic!("no runsc sandbox process among {:?}", cgroup_pids(&id)));
    // SAFETY: kill(2) of a process we found by its command line.
    unsafe {
        libc::kill(sentry as i32, libc::SIGKILL);
    }
    assert!(
        TestDaemon::wait_for(Duration::from_secs(20), || {
            daemon
                .call("GET", &format!("/v1/sandboxes/{id}"), None)
                .json()["state"]
                == "dead"
        }),
        "the sandbox never ended: {}",
        daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .text()
    );
    assert!(
        TestDaemon::wait_for(Duration::from_secs(20), || supervisors(&id).is_empty()),
        "its supervisor lives on"
    );
    assert_gone_with_its_bundle(&id);
    let metrics = daemon.call("GET", "/metrics", None).text();
    assert!(metrics.contains("airlock_leaked_resources 0"), "{metrics}");
}

#[test]
fn a_daemon_killed_with_live_gvisor_sandboxes_adopts_them() {
    let _serial = serial();
    let cleanup = SupervisorCleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({"tier": "gvisor"}));
    let id = created["id"].as_str().unwrap().to_owned();
    cleanup.add(&id);
    assert_eq!(
        daemon.sh_out(&id, "echo before > /tmp/kept; echo ok"),
        ("ok\n".into(), 0)
    );
    daemon.kill9();
    daemon.restart();
    // The same sandbox, its kernel and files as they were.
    let seen = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(seen.json()["state"], "running", "{}", seen.text());
    assert_eq!(seen.json()["tier"], "gvisor", "{}", seen.text());
    assert_eq!(daemon.sh_out(&id, "cat /tmp/kept"), ("before\n".into(), 0));
    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(deleted.status < 300, "{}", deleted.text());
    assert_gone_with_its_bundle(&id);
}

#[test]
fn an_oci_sandbox_runs_under_runc_with_the_agent_as_init() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    // Through the CLI, which names the tier.
    let out = daemon.cli(&["create", "--tier", "oci", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["tier"], "oci", "{created}");
    let (out, code) = daemon.sh_out(
        &id,
        "tr '\\0' ' ' < /proc/1/cmdline; cat /proc/self/cgroup | grep -c sbx-",
    );
    assert_eq!(
        (out.as_str(), code),
        (
            "/dev/.airlock-agent --fd 3 --seccomp /dev/.airlock-seccomp 0\n",
            1
        ),
        "{out}"
    );
    // runc runs it from the supervisor, outside the sandbox's cgroup.
    let runc = supervisors(&id)
        .iter()
        .any(|s| cmdline(*s).contains("--tier oci"));
    assert!(runc, "no oci supervisor for {id}");
    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(deleted.status < 300, "{}", deleted.text());
    assert_gone_with_its_bundle(&id);
}

/// The host's first global IPv4 address.
fn host_address() -> String {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
        .expect("the host has a global IPv4 address")
}

#[test]
fn a_gvisor_sandbox_reaches_the_network_only_through_its_guest_link() {
    let _serial = serial();
    // A listener on every host address: the sandbox must not reach it.
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let address = host_address();
    let daemon = TestDaemon::start(&[]);
    let created = daemon.create(json!({"tier": "gvisor", "network": {"mode": "open"}}));
    let id = created["id"].as_str().unwrap().to_owned();
    // gVisor's stack holds the link's far end and nothing else; its
    // resolver and its proxy are at the link's near end.
    let (out, code) = daemon.sh_out(
        &id,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '; echo; \
         grep nameserver /etc/resolv.conf; echo $HTTP_PROXY",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "g0 lo \nnameserver 10.255.254.1\nhttp://10.255.254.1:15001\n",
        "{out}"
    );
    // The host's own address is refused, transparently and through the
    // proxy, and the refusal is a security event; the listener saw nothing.
    for curl in ["curl --noproxy '*' -sf -m 5", "curl -sf -m 5"] {
        let (out, code) = daemon.sh_out(&id, &format!("{curl} http://{address}:{port}/"));
        assert!(code != 0, "{curl}: {code} {out}");
    }
    assert!(
        matches!(host.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a gvisor sandbox reached a listener of the host"
    );
    // The link's near end answers nothing but the proxy and the resolver.
    let (out, _) = daemon.sh_out(
        &id,
        "python3 -c \"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(b'x', ('10.255.254.1', 9999))
try:
    s.recvfrom(100); print('answered')
except OSError:
    print('silent')
\"",
    );
    assert_eq!(out, "silent\n");
    let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(deleted.status < 300, "{}", deleted.text());
    assert_gone_with_its_bundle(&id);
}

#[test]
fn a_create_naming_no_tier_gets_its_templates_or_the_daemons() {
    let _serial = serial();
    let daemon = TestDaemon::start(&["--template-tier", "host=oci"]);
    let tier_of = |id: &str| {
        let seen = daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .json();
        seen["tier"].as_str().unwrap().to_owned()
    };
    // Native: the template's tier unless the request names one.
    let by_template = daemon.create(json!({}));
    assert_eq!(by_template["tier"], "oci", "{by_template}");
    let named = daemon.create(json!({"tier": "process"}));
    assert_eq!(named["tier"], "process", "{named}");
    // e2b: a metadata entry names the tier; without it, the template's.
    let e2b_create = |metadata: serde_json::Value| {
        e2b(
            &daemon,
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "host", "metadata": metadata, "timeout": 60})),
        )
    };
    let gvisor = e2b_create(json!({"airlock.tier": "gvisor"}));
    assert_eq!(gvisor.status, 201, "{}", gvisor.text());
    let gvisor = gvisor.json()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(tier_of(&gvisor), "gvisor");
    let plain = e2b_create(json!({}));
    assert_eq!(plain.status, 201, "{}", plain.text());
    let plain = plain.json()["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(tier_of(&plain), "oci");
    let bad = e2b_create(json!({"airlock.tier": "vm9"}));
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("is not a tier"), "{}", bad.text());
    daemon.delete_all();
    for id in [&gvisor, &plain] {
        assert_gone_with_its_bundle(id);
    }
}

/// `airlock template ... --json ARGS` against `daemon` → its last JSON line.
fn template_cli(daemon: &TestDaemon, args: &[&str]) -> serde_json::Value {
    let out = daemon.cli(&[&["template"], args, &["--json"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "template {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|_| serde_json::from_str(&stdout).unwrap())
}

#[test]
fn a_template_records_its_own_tier_which_creates_naming_none_run_on() {
    let _serial = serial();
    let daemon = TestDaemon::start(&["--template-tier", "tiny=oci"]);
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![busybox_layer()];
    let archive = dir.path().join("tiny.tar");
    let image = docker_save(&layers, &config(&layers, &["PATH=/bin"], "/"), "tiny:1");
    std::fs::write(&archive, image).unwrap();
    // Made with a tier: its sandboxes run there, the request's own tier
    // still wins, and the operator's --template-tier yields to it.
    let made = template_cli(
        &daemon,
        &[
            "import",
            archive.to_str().unwrap(),
            "--name",
            "tiny",
            "--tier",
            "gvisor",
        ],
    );
    assert_eq!(made["template"]["tier"], "gvisor", "{made}");
    let tier_of = |body: serde_json::Value| {
        let sandbox = daemon.create(body);
        let id = sandbox["id"].as_str().unwrap().to_owned();
        let (out, code) = daemon.sh_out(&id, "uname -rv; echo ran");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("ran"), "{out}");
        (sandbox["tier"].as_str().unwrap().to_owned(), out)
    };
    let (tier, seen) = tier_of(json!({"template": "tiny"}));
    assert_eq!(tier, "gvisor");
    assert!(
        seen.starts_with("4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"),
        "a gvisor sandbox sees gVisor's kernel: {seen}"
    );
    assert_eq!(
        tier_of(json!({"template": "tiny", "tier": "process"})).0,
        "process"
    );
    // e2b: the template's tier applies too.
    let e2b_made = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "tiny", "timeout": 60})),
    );
    assert_eq!(e2b_made.status, 201, "{}", e2b_made.text());
    let e2b_id = e2b_made.json()["sandboxID"].as_str().unwrap().to_owned();
    let seen = daemon
        .call("GET", &format!("/v1/sandboxes/{e2b_id}"), None)
        .json();
    assert_eq!(seen["tier"], "gvisor", "{seen}");
    // A new import under the name keeps the name's tier; a pinned
    // reference resolves to the same one.
    let again = template_cli(
        &daemon,
        &["import", archive.to_str().unwrap(), "--name", "tiny"],
    );
    assert_eq!(again["template"]["tier"], "gvisor", "{again}");
    let digest = again["template"]["digest"].as_str().unwrap();
    assert_eq!(
        tier_of(json!({"template": format!("tiny@{digest}")})).0,
        "gvisor"
    );
    // Changed, then cleared: the operator's --template-tier applies again.
    let changed = template_cli(&daemon, &["tier", "tiny", "process"]);
    assert_eq!(changed["tier"], "process", "{changed}");
    assert_eq!(tier_of(json!({"template": "tiny"})).0, "process");
    let cleared = template_cli(&daemon, &["tier", "tiny", "--clear"]);
    assert!(cleared.get("tier").is_none(), "{cleared}");
    assert_eq!(tier_of(json!({"template": "tiny"})).0, "oci");
    // Bad input changes nothing: not a tier, an unknown field, a malformed
    // body, an unknown template, a key that is not an admin's.
    for (body, status) in [
        (&br#"{"tier": "vm9"}"#[..], 400),
        (br#"{"tier": 3}"#, 400),
        (br#"{"tier": "oci", "pool": 1}"#, 400),
        (br#"{"tier""#, 400),
    ] {
        let answer = daemon.call_as(
            Some(&daemon.key),
            "PATCH",
            "/v1/templates/tiny",
            Some(body),
            Some("application/json"),
            &[],
        );
        assert_eq!(answer.status, status, "{}", answer.text());
        assert_eq!(answer.code(), "bad_request", "{}", answer.text());
    }
    let missing = daemon.call("PATCH", "/v1/templates/nope", Some(json!({"tier": "oci"})));
    assert_eq!(missing.status, 404, "{}", missing.text());
    let tenant = daemon.new_key("tenant");
    let user_key = tenant["key"].as_str().unwrap();
    let refused = daemon.call_as(
        Some(user_key),
        "PATCH",
        "/v1/templates/tiny",
        Some(br#"{"tier": "gvisor"}"#),
        Some("application/json"),
        &[],
    );
    assert_eq!(refused.status, 403, "{}", refused.text());
    let listed = daemon.call("GET", "/v1/templates/tiny", None).json();
    assert!(listed.get("tier").is_none(), "{listed}");
    daemon.delete_all();
}

/// The host uid a process runs as (its real uid, from /proc).
fn host_uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .unwrap_or(0)
}

#[test]
fn an_oci_sandboxs_root_is_an_unprivileged_host_uid_owning_its_own_files() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![busybox_layer()];
    let archive = dir.path().join("tiny.tar");
    let image = docker_save(&layers, &config(&layers, &["PATH=/bin"], "/"), "tiny:1");
    std::fs::write(&archive, image).unwrap();
    template_cli(
        &daemon,
        &["import", archive.to_str().unwrap(), "--name", "tiny"],
    );
    for network in [json!({"mode": "none"}), json!({"mode": "open"})] {
        let created = daemon.create(json!({
            "tier": "oci", "template": "tiny", "user": "root", "network": network,
        }));
        let id = created["id"].as_str().unwrap().to_owned();
        // Root inside is the slot's first host uid, as on the process tier;
        // the image's files are its own (idmapped), and what the setup
        // made too: it may change /etc and /, and `user` its home.
        let (out, code) = daemon.sh_out(
            &id,
            "cat /proc/self/uid_map; stat -c '%u %g' /bin/busybox /etc/hosts /home/user /; \
             echo '10.0.0.1 x' >> /etc/hosts && touch /new && echo written; \
             su -s /bin/sh user -c 'touch /home/user/mine && echo home' 2>&1 || true; \
             ls /sys | wc -l",
        );
        assert_eq!(code, 0, "{out}");
        let mut lines = out.lines();
        let map: Vec<u64> = lines
            .next()
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(map[0], 0, "{out}");
        assert!(
            map[1] >= u64::from(common::UID_BASE),
            "root is host root: {out}"
        );
        assert_eq!(map[2], 65536, "{out}");
        assert_eq!(lines.next(), Some("0 0"), "the image's root files: {out}");
        assert_eq!(lines.next(), Some("0 0"), "/etc/hosts: {out}");
        assert_eq!(lines.next(), Some("1000 1000"), "/home/user: {out}");
        assert_eq!(lines.next(), Some("0 0"), "/: {out}");
        assert_eq!(lines.next(), Some("written"), "{out}");
        let sys_entries: u32 = out.lines().last().unwrap().trim().parse().unwrap();
        if network["mode"] == "open" {
            // Joined to the host's egress namespace: no sysfs of the host's.
            assert_eq!(sys_entries, 0, "{out}");
        } else {
            assert!(sys_entries > 0, "its own namespace keeps a sysfs: {out}");
        }
        // Seen from the host: every process of the sandbox is an
        // unprivileged uid.
        let pids = cgroup_pids(&id);
        assert!(!pids.is_empty());
        for pid in pids {
            if cmdline(pid).contains("airlock-agent") {
                assert!(host_uid(pid) >= common::UID_BASE, "{pid}: {}", cmdline(pid));
            }
        }
        daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        assert_gone_with_its_bundle(&id);
    }
}

/// Lines the counter of sandbox `id` wrote so far, and whether they count
/// 1, 2, 3... without a gap or a restart.
fn counted(daemon: &TestDaemon, id: &str) -> (usize, bool) {
    let (out, code) = daemon.sh_out(id, "cat /tmp/count");
    assert_eq!(code, 0, "{out}");
    let values: Vec<usize> = out.lines().filter_map(|l| l.parse().ok()).collect();
    let in_order = values.iter().enumerate().all(|(i, v)| *v == i + 1);
    (values.len(), in_order)
}

/// The memory image of checkpointed sandbox `id` on the daemon's disk
/// store (the data directory, or the loop mount in it), if there is one.
fn memory_image(daemon: &TestDaemon, id: &str) -> Option<std::path::PathBuf> {
    [daemon.data_dir().join("disk"), daemon.data_dir().to_owned()]
        .into_iter()
        .map(|store| store.join("checkpoints").join(id))
        .find(|dir| dir.exists())
}

#[test]
fn a_paused_sandbox_stops_where_it_is_and_resumes_there_on_every_tier() {
    let _serial = serial();
    let cleanup = SupervisorCleanup::default();
    let mut daemon = TestDaemon::start(&[]);
    for tier in ["process", "oci", "gvisor"] {
        let created = daemon.create(json!({"tier": tier}));
        let id = created["id"].as_str().unwrap().to_owned();
        cleanup.add(&id);
        daemon.start_counter(&id);
        std::thread::sleep(Duration::from_millis(300));
        let pause = daemon.call("POST", &format!("/v1/sandboxes/{id}/pause"), None);
        assert_eq!(pause.status, 200, "{tier}: {}", pause.text());
        assert_eq!(pause.json()["state"], "paused", "{}", pause.text());
        // Kept for the paused TTL (24 h by default), not its 300 s timeout
        // (RFC 3339 times of one format order as strings).
        let paused_until = pause.json()["expires_at"].as_str().unwrap().to_owned();
        assert!(
            paused_until.as_str() > created["expires_at"].as_str().unwrap(),
            "{paused_until} vs {created}"
        );
        let freezer = format!("/sys/fs/cgroup/freezer/airlock/{id}/freezer.state");
        let procs = format!("/sys/fs/cgroup/freezer/airlock/{id}/cgroup.procs");
        // Frozen in place; on gvisor its memory is saved to disk instead
        // and nothing of it runs (it holds no RAM).
        let assert_paused = |daemon: &TestDaemon, when: &str| {
            if tier == "gvisor" {
                let left = std::fs::read_to_string(&procs).unwrap();
                assert!(left.trim().is_empty(), "{when}: still running: {left}");
                let image = memory_image(daemon, &id);
                assert!(
                    image.is_some_and(|dir| std::fs::read_dir(dir).unwrap().count() > 0),
                    "{when}: no memory image on the disk store"
                );
            } else {
                let state = std::fs::read_to_string(&freezer).unwrap();
                assert_eq!(state.trim(), "FROZEN", "{when}");
            }
        };
        assert_paused(&daemon, "paused");
        // Paused: calls into it are refused, a second pause too, and it
        // survives a daemon killed with -9, still paused.
        let exec = daemon.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "true"})),
        );
        assert_eq!(exec.status, 409, "{}", exec.text());
        let again = daemon.call("POST", &format!("/v1/sandboxes/{id}/pause"), None);
        assert_eq!(again.status, 409, "{}", again.text());
        let e2b_again = e2b(&daemon, "POST", &format!("/sandboxes/{id}/pause"), None);
        assert_eq!(
            e2b_again.status,
            409,
            "already paused: {}",
            e2b_again.text()
        );
        let filesystem = daemon.call(
            "POST",
            &format!("/v1/sandboxes/{id}/pause"),
            Some(json!({"mode": "swap"})),
        );
        assert_eq!(filesystem.status, 400, "{}", filesystem.text());
        daemon.kill9();
        daemon.restart();
        let seen = daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .json();
        assert_eq!(seen["state"], "paused", "{tier} after a restart: {seen}");
        assert_paused(&daemon, "after a restart");
        std::thread::sleep(Duration::from_millis(1500));
        // Resumed through e2b's connect (201: it was paused): the counter
        // goes on from where it stopped; frozen, it did not count (1.5 s
        // would have been 30 lines).
        let resumed = e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        );
        assert_eq!(
            resumed.status,
            201,
            "{tier}: {}\n{}",
            resumed.text(),
            daemon.log.lock().unwrap()
        );
        let seen = daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .json();
        assert_eq!(seen["state"], "running", "{seen}");
        assert!(
            seen["expires_at"].as_str().unwrap() < paused_until.as_str(),
            "running again, it has its own timeout: {seen}"
        );
        let (right_after, in_order) = counted(&daemon, &id);
        assert!(in_order, "{tier}: the counter restarted or skipped");
        std::thread::sleep(Duration::from_millis(400));
        let (later, in_order) = counted(&daemon, &id);
        assert!(in_order, "{tier}: the counter restarted or skipped");
        assert!(
            later > right_after,
            "{tier}: it does not count after the resume"
        );
        assert!(
            right_after < 6 + 20,
            "{tier}: {right_after} lines: it counted while paused"
        );
        let connect = e2b(
            &daemon,
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        );
        assert_eq!(connect.status, 200, "running: {}", connect.text());
        let resume = daemon.call("POST", &format!("/v1/sandboxes/{id}/resume"), None);
        assert_eq!(resume.status, 409, "not paused: {}", resume.text());
        // The host template is no stack of layers: its files cannot be
        // kept apart from its memory (tests/snapshots.rs pauses sandboxes
        // of a layered template keeping only their files).
        let files_only = daemon.call(
            "POST",
            &format!("/v1/sandboxes/{id}/pause"),
            Some(json!({"mode": "filesystem"})),
        );
        assert_eq!(files_only.status, 501, "{}", files_only.text());
        assert!(
            files_only.json()["message"]
                .as_str()
                .unwrap()
                .contains("pause keeping its memory"),
            "{}",
            files_only.text()
        );
        // A paused sandbox deleted leaves nothing.
        let paused = daemon.call("POST", &format!("/v1/sandboxes/{id}/pause"), None);
        assert_eq!(paused.status, 200, "{}", paused.text());
        let out = daemon.cli(&["resume", &id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{id} running\n")
        );
        let out = daemon.cli(&["pause", &id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        assert!(deleted.status < 300, "{}", deleted.text());
        assert_gone_with_its_bundle(&id);
        assert!(!std::path::Path::new(&freezer).exists(), "{freezer} left");
        assert_eq!(
            memory_image(&daemon, &id),
            None,
            "{tier}: its memory image left"
        );
    }
    let missing = daemon.call("POST", "/v1/sandboxes/sbx-0000000000000000/pause", None);
    assert_eq!(missing.status, 404, "{}", missing.text());
}

#[test]
fn a_paused_sandbox_ends_at_its_paused_ttl_and_leaves_nothing() {
    let _serial = serial();
    let daemon = TestDaemon::start(&["--paused-ttl", "2s"]);
    let created = daemon.create(json!({"timeout_s": 3600}));
    let id = created["id"].as_str().unwrap().to_owned();
    let pause = daemon.call("POST", &format!("/v1/sandboxes/{id}/pause"), None);
    assert_eq!(pause.status, 200, "{}", pause.text());
    let ended = TestDaemon::wait_for(Duration::from_secs(20), || {
        daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .json()["state"]
            == "dead"
    });
    let seen = daemon
        .call("GET", &format!("/v1/sandboxes/{id}"), None)
        .json();
    assert!(ended, "still {seen}");
    assert_eq!(seen["reason"], "timeout", "{seen}");
    assert_gone_with_its_bundle(&id);
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/freezer/airlock/{id}")).exists());
}

#[test]
fn a_sandbox_that_pauses_at_its_timeout_is_paused_and_woken_by_its_own_traffic() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    // Native: paused at the timeout instead of killed; resumed by hand.
    let refused = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"lifecycle": {"on_timeout": "kill", "auto_resume": true}})),
    );
    assert_eq!(refused.status, 400, "{}", refused.text());
    let created = daemon.create(json!({"timeout_s": 1, "lifecycle": {"on_timeout": "pause"}}));
    let id = created["id"].as_str().unwrap().to_owned();
    daemon.sh(&id, "echo kept > /tmp/kept");
    let state = |id: &str| {
        daemon
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .json()["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || state(&id) == "paused"),
        "{}",
        state(&id)
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(state(&id), "paused", "still paused, not killed");
    let resume = daemon.call("POST", &format!("/v1/sandboxes/{id}/resume"), None);
    assert_eq!(resume.status, 200, "{}", resume.text());
    assert_eq!(daemon.sh_out(&id, "cat /tmp/kept"), ("kept\n".into(), 0));

    // e2b: autoPause with autoResume; a call with its token wakes it, one
    // without does not.
    let refused = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(
            json!({"templateID": "base", "timeout": 1, "autoPause": true,
                    "autoPauseMemory": false, "autoResume": {"enabled": true}}),
        ),
    );
    assert_eq!(refused.status, 400, "{}", refused.text());
    let made = e2b(
        &daemon,
        "POST",
        "/v2/sandboxes",
        Some(
            json!({"templateID": "base", "timeout": 1, "autoPause": true,
                    "autoResume": {"enabled": true}}),
        ),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let wire = made.json();
    let e2b_id = wire["sandboxID"].as_str().unwrap().to_owned();
    let token = wire["envdAccessToken"].as_str().unwrap().to_owned();
    assert!(
        TestDaemon::wait_for(Duration::from_secs(10), || state(&e2b_id) == "paused"),
        "{}",
        state(&e2b_id)
    );
    let read = |token: Option<&str>| {
        let mut headers = vec![("E2b-Sandbox-Id", e2b_id.as_str())];
        if let Some(token) = token {
            headers.push(("X-Access-Token", token));
        }
        daemon.call_as(
            None,
            "GET",
            "/files?path=/etc/hostname&username=user",
            None,
            None,
            &headers,
        )
    };
    let stranger = read(Some("not-its-token"));
    assert!(stranger.status >= 400, "{}", stranger.text());
    assert_eq!(state(&e2b_id), "paused", "a stranger woke it");
    let woken = read(Some(&token));
    assert_eq!(woken.status, 200, "{}", woken.text());
    assert_eq!(state(&e2b_id), "running");
    daemon.delete_all();
}

/// Whether any thread of process `pid` runs under `SCHED_IDLE`.
fn in_the_background(pid: u32) -> bool {
    let tasks =
        std::fs::read_dir(format!("/proc/{pid}/task")).unwrap_or_else(|e| panic!("{pid}: {e}"));
    tasks.flatten().any(|task| {
        let tid: i32 = task.file_name().to_string_lossy().parse().unwrap();
        // SAFETY: sched_getscheduler takes no pointers.
        unsafe { libc::sched_getscheduler(tid) == libc::SCHED_IDLE }
    })
}

/// A spare supervisor prepares in the background (`SCHED_IDLE`, so it
/// never slows the creates running meanwhile); the sandbox that claims it
/// runs in the foreground, its supervisor, runtime and every process.
#[test]
fn spares_prepare_in_the_background_and_their_sandboxes_run_in_the_foreground() {
    let _serial = serial();
    let daemon = TestDaemon::start(&[]);
    let delete = |id: &str| {
        let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        assert!(deleted.status < 300, "{}", deleted.text());
        assert_sandbox_gone(id);
    };
    for tier in ["process", "oci", "gvisor"] {
        // A first create starts that tier's spare for its kind of sandbox.
        let first = daemon.create(json!({"tier": tier}));
        delete(first["id"].as_str().unwrap());
        let is_spare_of = |pid: u32| {
            let line = cmdline(pid);
            match tier {
                "process" => !line.contains("--tier"),
                _ => line.contains(&format!("--tier {tier}")),
            }
        };
        let started = std::time::Instant::now();
        let spares = loop {
            let spares: Vec<u32> = supervisors("")
                .into_iter()
                .filter(|p| is_spare_of(*p))
                .collect();
            if !spares.is_empty() {
                break spares;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no {tier} spare"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        for spare in &spares {
            assert!(
                in_the_background(*spare),
                "{tier}: spare {spare} ({}) is not in the background",
                cmdline(*spare)
            );
        }
        let created = daemon.create(json!({"tier": tier}));
        let id = created["id"].as_str().unwrap().to_owned();
        let (out, code) = daemon.sh_out(&id, "echo up");
        assert_eq!((out.as_str(), code), ("up\n", 0), "{tier}");
        let supervisor = supervisors(&id);
        assert!(
            supervisor.len() == 1 && spares.contains(&supervisor[0]),
            "{tier}: the sandbox ({supervisor:?}) claimed none of the spares {spares:?}"
        );
        let pids: Vec<u32> = supervisor.into_iter().chain(cgroup_pids(&id)).collect();
        assert!(pids.len() > 1, "{tier}: {pids:?}");
        for pid in pids {
            assert!(
                !in_the_background(pid),
                "{tier}: {pid} ({}) of a claimed sandbox runs in the background",
                cmdline(pid)
            );
        }
        delete(&id);
    }
}

/// Who holds the host end of the connections to `port` in the network
/// namespace of `pid` (`ss`'s process column, one line per connection).
fn port_clients(pid: u32, port: u16) -> String {
    let out = std::process::Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "ss",
            "-tnpH",
            "state",
            "established",
        ])
        .arg(format!("( dport = :{port} )"))
        .output()
        .expect("nsenter and ss (util-linux, iproute2)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An HTTP/1.1 server (it keeps connections alive) on 127.0.0.1, port argv[1].
const KEPT_ALIVE_SERVER: &str = "import http.server as h, sys
h.SimpleHTTPRequestHandler.protocol_version = 'HTTP/1.1'
h.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), h.SimpleHTTPRequestHandler).serve_forever()";

/// On the tiers whose loopback is in a network namespace of the host's
/// kernel (`process`, `oci`), the daemon dials a sandbox's ports there
/// itself, with network `none` and with network alike; on `gvisor`, whose
/// netstack holds its loopback, the agent does, inside.
#[test]
fn the_daemon_dials_ports_in_the_sandboxs_namespace_where_the_tier_allows() {
    let _serial = serial();
    let mut daemon = TestDaemon::start(&[]);
    let port = 8123;
    for tier in ["process", "oci", "gvisor"] {
        for network in [json!(null), json!({"mode": "open"})] {
            let created = daemon.create(json!({"tier": tier, "network": network}));
            let id = created["id"].as_str().unwrap().to_owned();
            let started = daemon.call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(
                    json!({"cmd": "python3", "args": ["-c", KEPT_ALIVE_SERVER, port.to_string()],
                            "cwd": "/tmp", "background": true}),
                ),
            );
            assert_eq!(started.status, 201, "{}", started.text());
            let path = format!("/v1/sandboxes/{id}/ports/{port}/");
            assert!(
                TestDaemon::wait_for(Duration::from_secs(30), || {
                    daemon.call("GET", &path, None).status == 200
                }),
                "{tier}: the server never answered"
            );
            // The pool keeps the connection it used: who holds its end?
            let inside = cgroup_pids(&id)
                .into_iter()
                .find(|p| cmdline(*p).contains("ThreadingHTTPServer"));
            let clients = match tier {
                "gvisor" => cgroup_pids(&id)[0],
                _ => inside.unwrap_or_else(|| panic!("{tier}: no server process")),
            };
            let held = port_clients(clients, port);
            let by_daemon = held.contains(&format!("pid={},", daemon.pid()));
            if tier == "gvisor" {
                assert!(!by_daemon, "{tier}: {held}");
            } else {
                assert!(
                    by_daemon,
                    "{tier} {network}: the daemon holds none of: {held:?}"
                );
                assert!(!held.contains("airlock-agent"), "{tier}: {held}");
            }
            if tier != "gvisor" && network.is_null() {
                // A daemon killed with -9 adopts the sandbox, and its next
                // connections are its own again.
                daemon.restart();
                let get = daemon.call("GET", &path, None);
                assert_eq!(get.status, 200, "{tier}: {}", get.text());
                let held = port_clients(clients, port);
                assert!(
                    held.contains(&format!("pid={},", daemon.pid())),
                    "{tier}, adopted: the daemon holds none of: {held:?}"
                );
            }
            let deleted = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
            assert!(deleted.status < 300, "{}", deleted.text());
        }
    }
}
