//! Template builds: `airlock template build` (and `POST
//! /v1/templates/{name}/build`) of Dockerfiles on an imported busybox image
//! and on `base`: every step runs in a sandbox of the build and becomes a
//! layer that sandboxes of the template see, an unchanged step comes from
//! the cache without running, a failing RUN names its step and shows its
//! output, bad Dockerfiles and escaping COPY sources are refused before
//! anything runs, build steps are held to the build network policy, and
//! the collector keeps cached layers until the cache lets them go. Needs
//! root and busybox-static.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::TestDaemon;
use common::images::{busybox_layer, config, docker_save};
use common::store::{import_ok, layer_dirs, staging_entries, unowned};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

/// A daemon holding the busybox image as template `bb`.
fn daemon_with_busybox() -> (TestDaemon, tempfile::TempDir) {
    let daemon = TestDaemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![busybox_layer()];
    let archive = dir.path().join("bb.tar");
    std::fs::write(
        &archive,
        docker_save(
            &layers,
            &config(&layers, &["PATH=/bin:/usr/bin"], "/"),
            "bb:1",
        ),
    )
    .unwrap();
    import_ok(&daemon, &archive, "bb");
    (daemon, dir)
}

/// `airlock template build --json ARGS` against `daemon`.
fn build(daemon: &TestDaemon, args: &[&str]) -> Output {
    Command::new(common::binary())
        .args(["template", "build", "--json"])
        .args(args)
        .args(["--url", &daemon.url, "--api-key", &daemon.key])
        .output()
        .unwrap()
}

/// The JSON lines a `build --json` printed.
fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A build that must succeed: its lines.
fn build_ok(daemon: &TestDaemon, args: &[&str]) -> Vec<Value> {
    let out = build(daemon, args);
    assert!(
        out.status.success(),
        "build {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&out)
}

/// The `step` lines of steps that make files: (instruction, cached).
fn steps(lines: &[Value]) -> Vec<(String, bool)> {
    lines
        .iter()
        .filter(|l| l["type"] == "step")
        .filter(|l| {
            let instruction = l["instruction"].as_str().unwrap_or_default();
            !instruction.starts_with("ENV ") && !instruction.starts_with("USER ")
        })
        .map(|l| {
            (
                l["instruction"].as_str().unwrap().to_owned(),
                l["cached"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// How many sandboxes the daemon has ever recorded.
fn sandboxes_made(daemon: &TestDaemon) -> usize {
    let answer = daemon.call("GET", "/v1/sandboxes?limit=1000", None);
    answer.json()["items"].as_array().map_or(0, Vec::len)
}

fn exec(daemon: &TestDaemon, id: &str, script: &str) -> (String, i64) {
    daemon.sh_out(id, script)
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Nothing of a build is left: no sandbox running, no staged layer or
/// context, no store entry without an owner.
fn assert_nothing_left(daemon: &TestDaemon) {
    let answer = daemon.call("GET", "/v1/sandboxes?limit=1000", None);
    for item in answer.json()["items"].as_array().unwrap() {
        assert_eq!(item["state"], "dead", "a build sandbox is left: {item}");
    }
    assert!(
        TestDaemon::wait_for(std::time::Duration::from_secs(10), || staging_entries(
            daemon
        ) == 0),
        "staged entries are left"
    );
    assert_eq!(
        unowned(daemon),
        "airlock_layer_store_unowned_entries 0",
        "the layer store holds entries nothing owns"
    );
}

#[test]
fn a_dockerfile_builds_a_template_whose_sandboxes_see_its_files_env_and_workdir() {
    let (daemon, dir) = daemon_with_busybox();
    let context = dir.path().join("context");
    write(&context, "app/greeting.txt", "hello from the context\n");
    write(&context, "app/sub/deep.txt", "deep\n");
    write(&context, "notes.txt", "left out by .dockerignore\n");
    write(&context, ".dockerignore", "notes.txt\n");
    write(
        &context,
        "Dockerfile",
        "FROM bb\n\
         ARG FLAVOUR=plain\n\
         ENV GREETING=hi APP=/opt/app PATH=/opt/app/bin:$PATH\n\
         WORKDIR /home\n\
         WORKDIR $APP\n\
         COPY app/ ./\n\
         COPY --chown=1000:1000 app/greeting.txt /home/user/mine.txt\n\
         RUN echo \"built $FLAVOUR\" > built.txt && rm /bin/wc && id -u > /ran-as\n\
         USER user\n\
         RUN echo \"$GREETING from $(id -u)\" > /home/user/step.txt\n\
         CMD [\"/bin/sh\"]\n",
    );
    // The Dockerfile from outside the context, as `-f` may name it.
    std::fs::rename(
        context.join("Dockerfile"),
        dir.path().join("app.Dockerfile"),
    )
    .unwrap();
    let out = build_ok(
        &daemon,
        &[
            "-t",
            "app",
            "-f",
            dir.path().join("app.Dockerfile").to_str().unwrap(),
            "--build-arg",
            "FLAVOUR=spicy",
            context.to_str().unwrap(),
        ],
    );
    let done = out.last().unwrap();
    assert_eq!(done["type"], "done", "{out:?}");
    let template = &done["template"];
    // bb, WORKDIR $APP (WORKDIR /home, there already, changes nothing),
    // two COPYs and two RUNs.
    assert_eq!(
        template["layers"].as_array().unwrap().len(),
        6,
        "{template}"
    );
    assert_eq!(template["source"], "dockerfile");
    assert_eq!(template["config"]["workdir"], "/opt/app");
    assert_eq!(template["config"]["user"], "user");
    assert_eq!(template["config"]["cmd"], json!(["/bin/sh"]));
    assert!(out.iter().any(|l| l["type"] == "layer"));

    let created = daemon.create(json!({"template": "app", "user": "root"}));
    let id = created["id"].as_str().unwrap();
    let (seen, code) = exec(
        &daemon,
        id,
        "pwd; echo $GREETING $APP; echo $PATH; cat built.txt greeting.txt sub/deep.txt /ran-as; \
         test -e notes.txt && echo notes; test -e /bin/wc && echo wc; \
         test -e .airlock-dockerfile && echo sent; \
         stat -c '%u:%g %n' /opt/app/greeting.txt /home/user/mine.txt /home/user/step.txt; \
         cat /home/user/step.txt; cat /etc/hostname",
    );
    assert_eq!(code, 0, "{seen}");
    let expected = format!(
        "/opt/app\nhi /opt/app\n/opt/app/bin:/bin:/usr/bin\nbuilt spicy\nhello from the context\ndeep\n0\n\
         0:0 /opt/app/greeting.txt\n1000:1000 /home/user/mine.txt\n1000:1000 /home/user/step.txt\n\
         hi from 1000\n{id}\n"
    );
    assert_eq!(seen, expected, "what a sandbox of the build sees");
    daemon.delete_all();
    assert_nothing_left(&daemon);
}

#[test]
fn an_unchanged_build_comes_from_the_cache_and_a_changed_step_reruns_from_there() {
    let (daemon, dir) = daemon_with_busybox();
    let context = dir.path().join("context");
    write(&context, "a.txt", "one\n");
    write(
        &context,
        "Dockerfile",
        "FROM bb\nUSER root\nRUN echo first > /first\nCOPY a.txt /a.txt\nRUN cat /a.txt > /copied\n",
    );
    let path = context.to_str().unwrap();
    let first = build_ok(&daemon, &["-t", "cached", path]);
    assert!(steps(&first).iter().all(|(_, cached)| !cached), "{first:?}");
    let made = sandboxes_made(&daemon);
    let digest = first.last().unwrap()["template"]["digest"].clone();

    let again = build_ok(&daemon, &["-t", "cached", path]);
    assert!(
        steps(&again).iter().all(|(_, cached)| *cached),
        "every step is cached: {again:?}"
    );
    assert_eq!(sandboxes_made(&daemon), made, "a cached build runs nothing");
    assert_eq!(again.last().unwrap()["template"]["digest"], digest);

    // A change to what COPY copies reruns it and every step after it.
    write(&context, "a.txt", "two\n");
    let changed = build_ok(&daemon, &["-t", "cached", path]);
    let cached: Vec<bool> = steps(&changed).iter().map(|(_, c)| *c).collect();
    assert_eq!(cached, [true, false, false], "{changed:?}");
    let created = daemon.create(json!({"template": "cached"}));
    // Its sandboxes run as the Dockerfile's USER unless the create says.
    let (seen, _) = exec(
        &daemon,
        created["id"].as_str().unwrap(),
        "cat /first /copied; id -u",
    );
    assert_eq!(seen, "first\ntwo\n0\n");

    // --no-cache runs it all again.
    let fresh = build_ok(&daemon, &["-t", "cached", "--no-cache", path]);
    assert!(steps(&fresh).iter().all(|(_, cached)| !cached), "{fresh:?}");
    daemon.delete_all();
    assert_nothing_left(&daemon);
}

#[test]
fn a_failing_run_names_its_step_shows_its_output_and_records_nothing() {
    let (daemon, dir) = daemon_with_busybox();
    let context = dir.path().join("context");
    write(
        &context,
        "Dockerfile",
        "FROM bb\nRUN echo fine > /fine\nRUN echo about to fail; ls /nowhere; exit 3\n",
    );
    let out = build(&daemon, &["-t", "broken", context.to_str().unwrap()]);
    assert!(!out.status.success());
    let lines = lines(&out);
    let error = lines.last().unwrap();
    assert_eq!(error["type"], "error", "{lines:?}");
    assert_eq!(error["code"], "build_step_failed", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("step 2 (RUN echo about to fail; ls /nowhere; exit 3)")
            && message.contains("exited with code 3")
            && message.contains("about to fail")
            && message.contains("/nowhere"),
        "the error names the step and shows its output: {message}"
    );
    assert!(lines
        .iter()
        .any(|l| l["type"] == "output" && l["text"].as_str().unwrap().contains("about to fail")));
    assert_eq!(
        daemon.call("GET", "/v1/templates/broken", None).status,
        404,
        "a failed build records no template"
    );
    assert_nothing_left(&daemon);
}

#[test]
fn bad_dockerfiles_and_escaping_sources_are_refused_before_anything_runs() {
    let (daemon, dir) = daemon_with_busybox();
    let context = dir.path().join("context");
    std::fs::create_dir_all(&context).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", context.join("leak")).unwrap();
    std::os::unix::fs::symlink("/etc", context.join("etcdir")).unwrap();
    let cases = [
        ("FROM bb\nRUN true\nVOLUME /data\n", "line 3", "bad_request"),
        ("FROM bb\nCOPY ../outside /x\n", "..", "bad_request"),
        (
            "FROM bb\nCOPY leak /x\n",
            "points out of the build context",
            "bad_request",
        ),
        ("FROM bb\nCOPY etcdir/shadow /x\n", "symlink", "bad_request"),
        (
            "FROM nothing-here\nRUN true\n",
            "no template named",
            "not_found",
        ),
        ("FROM host\nRUN true\n", "not made of layers", "bad_request"),
        (
            "FROM scratch\nCOPY Dockerfile /\n",
            "scratch",
            "bad_request",
        ),
        ("FROM bb\nUSER nobody\nRUN true\n", "nobody", "bad_request"),
    ];
    let made = sandboxes_made(&daemon);
    for (dockerfile, says, code) in cases {
        write(&context, "Dockerfile", dockerfile);
        let out = build(&daemon, &["-t", "refused", context.to_str().unwrap()]);
        assert!(!out.status.success(), "{dockerfile}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = lines(&out).last().cloned().unwrap_or(Value::Null);
        let message = last["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| stderr.to_string());
        assert!(message.contains(says), "{dockerfile:?} → {message}");
        if last["type"] == "error" {
            assert_eq!(last["code"], code, "{dockerfile:?} → {last}");
        } else {
            assert!(stderr.contains(code), "{dockerfile:?} → {stderr}");
        }
    }
    assert_eq!(sandboxes_made(&daemon), made, "no refused build ran a step");
    // Through the API: a context that is no tar, a Dockerfile that is not
    // there, a Dockerfile path that climbs out.
    let key = daemon.key.clone();
    let post = |path: &str, body: &[u8]| {
        daemon.call_as(
            Some(&key),
            "POST",
            path,
            Some(body),
            Some("application/x-tar"),
            &[],
        )
    };
    let not_tar = post("/v1/templates/x/build", b"this is not a tar archive at all");
    assert_eq!(not_tar.status, 400, "{}", not_tar.text());
    let empty_tar = vec![0u8; 1024];
    let missing = post("/v1/templates/x/build", &empty_tar);
    assert_eq!(missing.status, 400, "{}", missing.text());
    assert!(
        missing.text().contains("no such file"),
        "{}",
        missing.text()
    );
    let climbing = post(
        "/v1/templates/x/build?dockerfile=../../etc/passwd",
        &empty_tar,
    );
    assert_eq!(climbing.status, 400, "{}", climbing.text());
    let bad_name = post("/v1/templates/host/build", &empty_tar);
    assert_eq!(bad_name.status, 400, "{}", bad_name.text());
    assert_eq!(
        daemon
            .call_as(
                None,
                "POST",
                "/v1/templates/x/build",
                Some(&empty_tar),
                None,
                &[]
            )
            .status,
        401
    );
    assert_nothing_left(&daemon);
}

/// A web server in the far namespace of `net` on `203.0.113.2:PORT`.
fn mirror(net: &common::net::FarNet, site: &Path, port: &str) -> std::process::Child {
    let server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.netns,
            "python3",
            "-m",
            "http.server",
            port,
        ])
        .args(["--bind", "203.0.113.2"])
        .current_dir(site)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://203.0.113.2:{port}/");
    let up = TestDaemon::wait_for(std::time::Duration::from_secs(10), || {
        Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &url])
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(up, "the test mirror on {url} did not start");
    server
}

#[test]
fn build_steps_reach_only_what_the_build_network_policy_allows() {
    common::require_root();
    let net = common::net::FarNet::new("bd", "203.0.113.1", "203.0.113.2");
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), "from the mirror\n").unwrap();
    let mut servers = [
        mirror(&net, site.path(), "8000"),
        mirror(&net, site.path(), "8001"),
    ];
    let daemon = TestDaemon::start(&["--build-allow", "203.0.113.2:8000"]);
    import_ok(&daemon, &common::base::base_archive(), "base");
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path().join("context");
    let fetch = |port: &str| {
        format!(
            "FROM base\nRUN curl -sf -m 5 -o /tmp/got http://203.0.113.2:{port}/index.html || (echo refused; exit 7)\n"
        )
    };
    // Not what the operator allows: refused.
    write(&context, "Dockerfile", &fetch("8001"));
    let out = build(&daemon, &["-t", "net", context.to_str().unwrap()]);
    let refused = lines(&out);
    let last = refused.last().unwrap();
    assert_eq!(last["type"], "error", "{refused:?}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 7"),
        "{last}"
    );
    // Allowed: fetched, and what it fetched is in the template.
    write(&context, "Dockerfile", &fetch("8000"));
    build_ok(&daemon, &["-t", "net", context.to_str().unwrap()]);
    let created = daemon.create(json!({"template": "net"}));
    let id = created["id"].as_str().unwrap();
    let (seen, _) = exec(&daemon, id, "cat /tmp/got");
    assert_eq!(seen, "from the mirror\n");
    // Sandboxes of the template do not inherit the build's policy.
    let (_, code) = exec(
        &daemon,
        id,
        "curl -sf -m 3 http://203.0.113.2:8000/index.html",
    );
    assert_ne!(code, 0, "a sandbox of the template reached the mirror");
    daemon.delete_all();
    assert_nothing_left(&daemon);
    for server in &mut servers {
        let _ = server.kill();
        let _ = server.wait();
    }
}

#[test]
fn the_collector_keeps_cached_layers_until_the_cache_lets_them_go() {
    let (daemon, dir) = daemon_with_busybox();
    let context = dir.path().join("context");
    write(&context, "Dockerfile", "FROM bb\nRUN echo made > /made\n");
    let out = build_ok(&daemon, &["-t", "gc-me", context.to_str().unwrap()]);
    let made = out.last().unwrap()["template"]["layers"][1]["diff_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        daemon.call("DELETE", "/v1/templates/gc-me", None).status,
        204
    );
    let collected = daemon.call("POST", "/v1/gc", None).json();
    assert_eq!(collected["layers"], json!([]), "{collected}");
    assert!(
        layer_dirs(&daemon).contains(&made),
        "the cache holds the step's layer"
    );
    // Rebuilt from the cache: the layer is there to take.
    let again = build_ok(&daemon, &["-t", "gc-me", context.to_str().unwrap()]);
    assert!(steps(&again).iter().all(|(_, cached)| *cached));
    assert_eq!(
        daemon.call("DELETE", "/v1/templates/gc-me", None).status,
        204
    );
    let emptied = daemon.call("POST", "/v1/gc?build_cache=true", None).json();
    assert_eq!(emptied["layers"], json!([made]), "{emptied}");
    assert_eq!(emptied["build_steps"], 1, "{emptied}");
    assert!(!layer_dirs(&daemon).contains(&made));
    assert_nothing_left(&daemon);
}

#[test]
fn a_dockerfile_on_base_installs_and_runs_python_code() {
    let daemon = TestDaemon::start(&[]);
    import_ok(&daemon, &common::base::base_archive(), "base");
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path();
    write(
        context,
        "main.py",
        "import json, venv\nprint(json.dumps({'ok': True}))\n",
    );
    write(
        context,
        "Dockerfile",
        "FROM base\n\
         COPY --chown=user:user main.py /home/user/app/main.py\n\
         RUN python3 -m venv /home/user/venv && /home/user/venv/bin/python -c 'print(42)'\n",
    );
    build_ok(&daemon, &["-t", "py", context.to_str().unwrap()]);
    let created = daemon.create(json!({"template": "py"}));
    let id = created["id"].as_str().unwrap();
    let (seen, code) = exec(
        &daemon,
        id,
        "cd ~/app && ~/venv/bin/python main.py && stat -c '%U %a' main.py /usr/bin/python3",
    );
    assert_eq!(code, 0, "{seen}");
    let mut seen = seen.lines();
    assert_eq!(seen.next(), Some("{\"ok\": true}"));
    assert_eq!(seen.next(), Some("user 644"));
    assert!(
        seen.next().unwrap().starts_with("root "),
        "the image's root-owned files stay root's"
    );
    daemon.delete_all();
    assert_nothing_left(&daemon);
}
