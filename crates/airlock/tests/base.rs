//! The `base` template: a Debian system built from the host's apt sources
//! (mmdebstrap), with what agents expect of e2b's `base` (Python with pip
//! and venv, Node.js with npm, git, curl, ps, the user `user` in its
//! home, a login shell), root's files root's inside, the sandbox's own
//! resolver, e2b's `base` and code-interpreter ids mapped onto it once it
//! exists, an SBOM of its packages, and the daemon's own bootstrap. Needs
//! root and mmdebstrap; the fixture is built once per machine (see
//! common::base).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{e2b, TestDaemon};
use serde_json::json;

fn import_base(daemon: &TestDaemon) {
    common::store::import_ok(daemon, &common::base::base_archive(), "base");
}

#[test]
fn the_base_template_has_what_agents_expect() {
    let daemon = TestDaemon::start(&[]);
    import_base(&daemon);
    let created = daemon.create(json!({"template": "base"}));
    let id = created["id"].as_str().unwrap();
    let (out, code) = daemon.sh_out(
        id,
        "set -e; id -un; pwd; python3 -c 'import sys; print(sys.version_info[0])'; \
         python3 -m venv /tmp/venv && /tmp/venv/bin/pip --version >/dev/null && echo venv-pip; \
         node -e 'console.log(1+1)'; npm --version >/dev/null && echo npm; \
         git --version >/dev/null && echo git; curl --version >/dev/null && echo curl; \
         ps -o comm= -p $$ >/dev/null && echo ps; stat -c %U /usr/bin/apt-get /home/user; \
         bash -lc 'echo login-$HOME'; cat /etc/resolv.conf",
    );
    assert_eq!(code, 0, "{out}");
    // (Not /usr/bin/sudo: the agent's shim is bound over it from the host,
    // so its owner is the host's root, unmapped here.)
    assert_eq!(
        out,
        "user\n/home/user\n3\nvenv-pip\n2\nnpm\ngit\ncurl\nps\nroot\nuser\nlogin-/home/user\n\
         nameserver 127.0.0.1\noptions edns0\n",
        "what base gives an agent"
    );
    // The template's SBOM lists its Debian packages.
    let sbom = daemon.call("GET", "/v1/templates/base/sbom", None);
    assert_eq!(sbom.status, 200, "{}", sbom.text());
    let purls: Vec<String> = sbom.json()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["purl"].as_str().unwrap().to_owned())
        .collect();
    for package in ["python3", "nodejs", "git", "curl", "sudo"] {
        assert!(
            purls
                .iter()
                .any(|p| p.starts_with(&format!("pkg:deb/debian/{package}@"))),
            "no {package} in the SBOM: {purls:?}"
        );
    }
    daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
}

#[test]
fn e2b_base_and_code_interpreter_ids_map_onto_base_once_it_exists() {
    let daemon = TestDaemon::start(&[]);
    // base's own sudo rule marks its /etc; the host template has none.
    let on_base = |template: &str| -> bool {
        let answer = e2b(
            &daemon,
            "POST",
            "/sandboxes",
            Some(json!({"templateID": template, "timeout": 60})),
        );
        assert_eq!(answer.status, 201, "{template}: {}", answer.text());
        let id = answer.json()["sandboxID"].as_str().unwrap().to_owned();
        let (out, _) = daemon.sh_out(&id, "test -e /etc/sudoers.d/user && echo base || echo host");
        daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
        out == "base\n"
    };
    assert!(
        !on_base("base"),
        "base before it is built is the host's system"
    );
    import_base(&daemon);
    for template in ["base", "code-interpreter-v1", "code-interpreter"] {
        assert!(on_base(template), "{template} runs on base once it exists");
    }
    assert!(!on_base("host"), "host stays the host's system");
}

#[test]
fn the_daemon_bootstraps_a_template_and_refuses_bad_recipes() {
    let daemon = TestDaemon::start(&[]);
    let bad = daemon.call(
        "POST",
        "/v1/templates/mini/bootstrap",
        Some(json!({"packages": ["bash", "--allow-unauthenticated"]})),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(bad.code(), "bad_request");
    let unknown = daemon.call(
        "POST",
        "/v1/templates/mini/bootstrap",
        Some(json!({"packages": ["bash"], "suite": "x"})),
    );
    assert_eq!(unknown.status, 400, "{}", unknown.text());

    // The smallest recipe: Debian's essential packages and bash.
    let built = daemon.call(
        "POST",
        "/v1/templates/mini/bootstrap",
        Some(json!({"packages": ["bash"]})),
    );
    assert_eq!(built.status, 200, "{}", built.text());
    let events = built.lines();
    assert!(
        events.iter().any(|e| e["type"] == "step"),
        "no progress: {events:?}"
    );
    let done = events.last().unwrap();
    assert_eq!(done["type"], "done", "{events:?}");
    assert!(
        done["template"]["source"]
            .as_str()
            .unwrap()
            .starts_with("bootstrap debian "),
        "{done}"
    );
    let created = daemon.create(json!({"template": "mini"}));
    let id = created["id"].as_str().unwrap();
    let (out, code) = daemon.sh_out(id, "id -un; test -e /usr/bin/python3 || echo no-python");
    assert_eq!((out.as_str(), code), ("user\nno-python\n", 0));
}

/// `sudo` works for `user` on base, on every tier, as e2b's templates'
/// does: passwordless, root by default or `-u user`, stdin and exit codes
/// passed through, sudo's environment reset, `-i`, signals relayed (a
/// `timeout` around `sudo sleep` ends the sleep), sudo's own messages.
#[test]
fn sudo_works_for_user_on_every_tier() {
    let daemon = TestDaemon::start(&[]);
    import_base(&daemon);
    let script = "id -un; sudo whoami; sudo -u user whoami; \
         echo piped | sudo tee /root/f >/dev/null; sudo cat /root/f; stat -c %U /root/f 2>&1 | tail -c 18; \
         sudo sh -c 'exit 3'; echo code=$?; \
         FOO=1 sudo printenv FOO || echo reset; sudo FOO=2 printenv FOO; sudo -E true && echo kept; \
         sudo printenv HOME SUDO_USER; sudo -i pwd; cd /tmp && sudo pwd; sudo -n true && echo nopasswd; \
         timeout -s INT 1 sudo sleep 30; echo timeout=$?; sleep 0.3; pgrep -x sleep || echo no-sleep; \
         sudo no-such-command 2>&1; sudo -u nobody true 2>&1 | cut -c1-5";
    for tier in ["process", "oci", "gvisor"] {
        let created = daemon.create(json!({"template": "base", "tier": tier}));
        let id = created["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{tier}: {created}"));
        let (out, code) = daemon.sh_out(id, script);
        assert_eq!(code, 0, "{tier}: {out}");
        assert_eq!(
            out,
            "user\nroot\nuser\npiped\nPermission denied\ncode=3\nreset\n2\nkept\n/root\nuser\n\
             /root\n/tmp\nnopasswd\ntimeout=124\nno-sleep\nsudo: no-such-command: command not found\nsudo:\n",
            "{tier}"
        );
        daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    }
}
