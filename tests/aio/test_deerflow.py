"""DeerFlow's AIO sandbox provider against airlock, call for call.

The provisioner: provider start (list), acquire (get, create, readiness
wait), destroy (delete), with its API key; its validation of thread ids,
user ids and extra mounts. The sandbox, through agent-sandbox as DeerFlow's
AioSandbox calls it: the bash tool (the implicit shell session), explicit
sessions and their recreation on 404, the env tool (one-shot bash), files
(read, write, append, base64 update, download, list, find, grep, upload,
glob, the str_replace editor), shell view, wait and write. And the
host side of a thread: its user data under the base directory, the public
skills read-only, extra mounts. Each test creates its own sandboxes.
"""

import base64
import concurrent.futures
import os
import time
import urllib.parse
import uuid

import pytest
import requests

from conftest import (
    BASE,
    KEY,
    OTHER_KEY,
    PUBLIC_SKILL_TEXT,
    URL,
    Provisioner,
    api_error,
    client,
    create_body,
    deerflow_glob_dirs,
    download,
    probe,
    tag,
    thread_sandbox_id,
    user_data,
    wait_ready,
)

# The three directories of a thread's /mnt/user-data.
USER_DATA = "/mnt/user-data"
UPLOADS = f"{USER_DATA}/uploads"
WORKSPACE = f"{USER_DATA}/workspace"
OUTPUTS = f"{USER_DATA}/outputs"

# DeerFlow's allowlist of extra mount targets.
ALLOWED_TARGETS = [
    "/mnt/acp-workspace",
    "/mnt/skills/custom",
    "/mnt/skills/integrations",
    "/mnt/integrations/lark-cli/config",
    "/mnt/integrations/lark-cli/config/locks",
    "/mnt/integrations/lark-cli/data",
    "/mnt/integrations/lark-cli/runtime",
]

# What the AIO server answers for a shell session it does not have, and
# what DeerFlow keys on to recreate one.
SESSION_NOT_FOUND = {"success": False, "message": "Session not found", "data": None}


def assert_session_not_found(error):
    """The error is the structured 404 DeerFlow recreates a session on."""
    assert error.status_code == 404, error
    assert isinstance(error.body, dict), error
    assert {name: error.body.get(name) for name in SESSION_NOT_FOUND} == SESSION_NOT_FOUND, error


def refused(provisioner, body, status):
    """Asserts that creating `body` answers `status` and creates nothing."""
    answer = provisioner.create(body)
    assert answer.status_code == status, (body, answer.status_code, answer.text)
    assert provisioner.get(body["sandbox_id"]).status_code == 404, body


def url_parts(sandbox_url):
    """(scheme and host, airlock sandbox id, secret) of a sandbox URL, which
    is http://<host>/aio/<id>/<secret>."""
    parsed = urllib.parse.urlsplit(sandbox_url)
    parts = parsed.path.strip("/").split("/")
    assert parsed.scheme == "http" and len(parts) == 3 and parts[0] == "aio", sandbox_url
    return f"{parsed.scheme}://{parsed.netloc}", parts[1], parts[2]


def deerflow_env_output(result):
    """What DeerFlow's env tool hands the model from a bash.exec result."""
    stdout, stderr = result.stdout or "", result.stderr or ""
    if stdout and stderr:
        return f"{stdout}\nStd Error:\n{stderr}"
    return stdout or stderr


# The fields of a provisioner's sandbox entry.
ENTRY = ("sandbox_id", "sandbox_url", "status")


def entry(body):
    return {name: body.get(name) for name in ENTRY}


def visible(matches):
    """Grep matches outside hidden directories and files (whether a search
    looks into those is left to the server)."""
    return {m for m in matches if "/." not in m[0]}


def deerflow_grep(sbx, path, pattern, case_sensitive=True, literal=False, limit=100, **extra):
    """DeerFlow's grep tool's call: (the matches as (file, line, text), truncated)."""
    kwargs = dict(
        path=path,
        pattern=pattern,
        case_insensitive=not case_sensitive,
        fixed_strings=literal,
        max_results=max(4 * limit, limit + 50),
        max_file_size="1M",
        recursive=True,
    )
    kwargs.update(extra)
    data = sbx.file.grep_files(**kwargs).data
    matches = set()
    for match in data.matches or []:
        assert match.file.startswith(path + "/"), match.file
        matches.add((match.file, match.line_number, match.line_content.rstrip("\r\n")))
    return matches, data.truncated


def make_tree(thread, root):
    """A small source tree under `root` in the sandbox, written as a model
    would (shell commands)."""
    out = thread.sh(
        f"mkdir -p {root}/sub/deep {root}/.hidden && cd {root} && "
        "printf 'import os\\nneedle = 1\\nprint(needle)\\n' > a.py && "
        "printf 'nothing\\nNEEDLE upper\\n' > sub/b.txt && "
        "printf 'a.b literal\\naxb not literal\\n' > sub/c.md && "
        "printf 'x = 2\\n' > sub/deep/d.py && "
        "printf 'needle hidden\\n' > .hidden/e.py && "
        "printf 'dot\\n' > .f.txt && echo made"
    )
    assert out.exit_code == 0 and "made" in out.output, out


# --- The provisioner ----------------------------------------------------


def test_health_needs_no_key():
    answer = requests.get(f"{URL}/health", timeout=10, proxies={"http": None})
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_api_needs_a_key(provisioner, thread):
    """Every /api/ call without a key, or with a wrong one, is a 401 and does
    nothing."""
    for key in (None, "e2b_" + "0" * 64, KEY + "x"):
        stranger = Provisioner(key=key)
        assert stranger.list().status_code == 401, key
        assert stranger.get(thread.sandbox_id).status_code == 401, key
        assert stranger.delete(thread.sandbox_id).status_code == 401, key
        sandbox_id = uuid.uuid4().hex[:8]
        assert stranger.create(create_body(sandbox_id)).status_code == 401, key
        assert provisioner.get(sandbox_id).status_code == 404, key
    # The sandbox was not deleted.
    assert provisioner.get(thread.sandbox_id).json()["status"] == "Running"
    assert thread.out("echo alive") == "alive"


def test_acquire_replays_deerflow(provisioner):
    """DeerFlow's acquire of a new thread: is_alive and discover miss (404),
    create, wait for readiness, then drive the sandbox at the URL."""
    user_id, thread_id = f"user-{tag()}", f"thread-{tag()}"
    sandbox_id = thread_sandbox_id(user_id, thread_id)
    assert provisioner.get(sandbox_id).status_code == 404
    try:
        answer = provisioner.create(create_body(sandbox_id, thread_id, user_id))
        assert answer.status_code == 200, answer.text
        created = answer.json()
        assert created["sandbox_id"] == sandbox_id
        assert created["status"] == "Running"
        url_parts(created["sandbox_url"])
        # The sandbox answers at once.
        assert wait_ready(created["sandbox_url"]) < 5
        # is_alive: alive iff the status is exactly "Running".
        got = provisioner.get(sandbox_id)
        assert got.status_code == 200, got.text
        assert entry(got.json()) == entry(created)
        sbx = client(created["sandbox_url"])
        result = sbx.shell.exec_command(command="echo ready", no_change_timeout=600).data
        assert result.output.strip() == "ready"
    finally:
        provisioner.delete(sandbox_id)


def test_provider_start_adopts_listed_sandboxes(provisioner, make_thread):
    """At start DeerFlow lists the sandboxes and adopts each by its URL."""
    first, second = make_thread(), make_thread()
    listed = provisioner.listed()
    for thread in (first, second):
        assert entry(listed[thread.sandbox_id]) == {
            "sandbox_id": thread.sandbox_id,
            "sandbox_url": thread.url,
            "status": "Running",
        }
        assert probe(thread.url) == 200
    provisioner.delete(first.sandbox_id)
    listed = provisioner.listed()
    assert first.sandbox_id not in listed
    assert second.sandbox_id in listed


def test_list_shows_only_the_calling_keys(provisioner, thread):
    other = Provisioner(key=OTHER_KEY)
    assert thread.sandbox_id not in other.listed()
    assert other.get(thread.sandbox_id).status_code == 404
    # The other key's delete does not reach it.
    other.delete(thread.sandbox_id)
    assert provisioner.get(thread.sandbox_id).json()["status"] == "Running"
    assert thread.out("echo still") == "still"
    # The other key's own sandbox is its own.
    sandbox_id = uuid.uuid4().hex[:8]
    try:
        answer = other.create(create_body(sandbox_id, f"thread-{tag()}", f"user-{tag()}"))
        assert answer.status_code == 200, answer.text
        assert sandbox_id in other.listed()
    finally:
        other.delete(sandbox_id)


def test_create_is_idempotent(provisioner, thread):
    """A second create of the same id returns the same sandbox, untouched."""
    assert thread.out("echo kept > /tmp/marker && cat /tmp/marker") == "kept"
    again = provisioner.create(create_body(thread.sandbox_id, thread.thread_id, thread.user_id))
    assert again.status_code == 200, again.text
    assert again.json()["sandbox_url"] == thread.url
    assert again.json()["sandbox_id"] == thread.sandbox_id
    assert thread.out("cat /tmp/marker") == "kept"
    listed = provisioner.list().json()["sandboxes"]
    assert [e["sandbox_id"] for e in listed].count(thread.sandbox_id) == 1


def test_create_without_thread_or_user(provisioner):
    """A sandbox of no thread (DeerFlow names it by 8 characters of a uuid):
    its thread is its id, its user "default"."""
    sandbox_id = uuid.uuid4().hex[:8]
    try:
        answer = provisioner.create({"sandbox_id": sandbox_id})
        assert answer.status_code == 200, answer.text
        sbx = client(answer.json()["sandbox_url"])
        sbx.file.write_file(file=f"{OUTPUTS}/no-thread.txt", content="mine")
        host = user_data("default", sandbox_id)
        assert (host / "outputs" / "no-thread.txt").read_text() == "mine"
    finally:
        provisioner.delete(sandbox_id)


@pytest.mark.parametrize(
    "thread_id",
    ["", "a/b", "../etc", "x" * 65, "a b", "a.b", "thread\n", "é"],
)
def test_bad_thread_id_is_422(provisioner, thread_id):
    refused(provisioner, create_body(uuid.uuid4().hex[:8], thread_id), 422)


@pytest.mark.parametrize("user_id", ["", "../etc", "a/b", "a b", ".."])
def test_bad_user_id_is_422(provisioner, user_id):
    # The user id names a host directory: nothing but DeerFlow's pattern.
    refused(provisioner, create_body(uuid.uuid4().hex[:8], f"thread-{tag()}", user_id), 422)


def test_longest_thread_id_is_fine(make_thread):
    thread = make_thread(thread_id="x" * 64)
    assert thread.out("echo ok") == "ok"


def test_extra_mounts_validation(provisioner):
    user_id = f"user-{tag()}"
    inside = BASE / "users" / user_id / "skills_view" / "custom"
    inside.mkdir(parents=True)

    def body(*mounts):
        return create_body(uuid.uuid4().hex[:8], f"thread-{tag()}", user_id, list(mounts))

    def mount(host, target, read_only=True):
        return {"host_path": str(host), "container_path": target, "read_only": read_only}

    # More than 10.
    refused(provisioner, body(*[mount(inside, "/mnt/skills/custom")] * 11), 400)
    # Targets outside the allowlist (also after normalising).
    for target in [
        "/etc",
        "/",
        "/mnt/user-data/workspace",
        "/mnt/skills/public",
        "/mnt/skills",
        "/mnt/skills/custom/../../../etc",
        "mnt/skills/custom",
        "/home/user",
    ]:
        refused(provisioner, body(mount(inside, target)), 400)
    # Sources outside the base directory (also after normalising).
    for host in [
        "/etc",
        "/",
        BASE.parent,
        f"{BASE}/../",
        f"{BASE}/users/../../etc",
        "users",
        f"{BASE}x",
    ]:
        refused(provisioner, body(mount(host, "/mnt/skills/custom")), 400)


def test_extra_mount_is_mounted(make_thread):
    """DeerFlow mounts a user's custom skills read-only."""
    user_id = f"user-{tag()}"
    custom = BASE / "users" / user_id / "skills_view" / "custom"
    (custom / "my-skill").mkdir(parents=True)
    (custom / "my-skill" / "SKILL.md").write_text("custom skill\n")
    thread = make_thread(
        user_id=user_id,
        extra_mounts=[
            {"host_path": str(custom), "container_path": "/mnt/skills/custom", "read_only": True}
        ],
    )
    sbx = thread.client
    path = "/mnt/skills/custom/my-skill/SKILL.md"
    assert sbx.file.read_file(file=path).data.content == "custom skill\n"
    api_error(sbx.file.write_file, file=path, content="changed")
    api_error(sbx.file.write_file, file="/mnt/skills/custom/new.md", content="new")
    assert (custom / "my-skill" / "SKILL.md").read_text() == "custom skill\n"
    assert not (custom / "new.md").exists()


def test_every_allowed_target_is_mounted(make_thread):
    """Every target of the allowlist at once, from where DeerFlow keeps each
    and read-only or not as it mounts them: the lark-cli locks, writable,
    are a directory of the read-only config."""
    user_id, thread_id = f"user-{tag()}", f"thread-{tag()}"
    user = BASE / "users" / user_id
    lark = user / "integrations" / "lark-cli"
    sources = {
        "/mnt/acp-workspace": (user / "threads" / thread_id / "acp-workspace", True),
        "/mnt/skills/custom": (user / "skills_view" / "custom", True),
        "/mnt/skills/integrations": (user / "skills_view" / "integrations", True),
        "/mnt/integrations/lark-cli/config": (lark / "config", True),
        "/mnt/integrations/lark-cli/config/locks": (lark / "config" / "locks", False),
        "/mnt/integrations/lark-cli/data": (lark / "data", False),
        "/mnt/integrations/lark-cli/runtime": (
            BASE / "integrations" / "lark-cli" / "sandbox-cli",
            True,
        ),
    }
    assert sorted(sources) == sorted(ALLOWED_TARGETS)
    mounts = []
    for target in ALLOWED_TARGETS:
        host, read_only = sources[target]
        host.mkdir(parents=True, exist_ok=True)
        (host / "here.txt").write_text(target)
        mounts.append({"host_path": str(host), "container_path": target, "read_only": read_only})
    thread = make_thread(thread_id=thread_id, user_id=user_id, extra_mounts=mounts)
    for target in ALLOWED_TARGETS:
        content = thread.client.file.read_file(file=f"{target}/here.txt").data.content
        assert content == target


def test_delete_is_repeatable_and_ends_everything(provisioner, thread):
    sbx = thread.client
    sbx.file.write_file(file=f"{WORKSPACE}/x.txt", content="x")
    for _ in range(2):
        answer = provisioner.delete(thread.sandbox_id)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"ok": True, "sandbox_id": thread.sandbox_id}
    assert provisioner.get(thread.sandbox_id).status_code == 404
    assert thread.sandbox_id not in provisioner.listed()
    # Every AIO call under its URL is a 404.
    assert probe(thread.url) == 404
    calls = [
        lambda: sbx.sandbox.get_context(),
        lambda: sbx.shell.exec_command(command="echo hi", no_change_timeout=600),
        lambda: sbx.shell.create_session(id="s1"),
        lambda: sbx.bash.exec(command="echo hi", env={"A": "1"}, hard_timeout=600.0),
        lambda: sbx.file.read_file(file=f"{WORKSPACE}/x.txt"),
        lambda: sbx.file.write_file(file=f"{WORKSPACE}/y.txt", content="y"),
        lambda: sbx.file.list_path(path=WORKSPACE, recursive=True, show_hidden=False),
        lambda: sbx.file.find_files(path=WORKSPACE, glob="**/*"),
        lambda: sbx.file.grep_files(path=WORKSPACE, pattern="x"),
        lambda: download(sbx, f"{WORKSPACE}/x.txt"),
    ]
    for call in calls:
        assert api_error(call).status_code == 404


def test_thread_data_outlives_its_sandbox(provisioner, make_thread):
    """DeerFlow destroys an idle sandbox and later creates the thread's again
    (the same id): the thread's files are still there."""
    thread = make_thread()
    thread.client.file.write_file(file=f"{OUTPUTS}/report.md", content="# Report\n")
    assert provisioner.delete(thread.sandbox_id).status_code == 200
    assert (thread.host / "outputs" / "report.md").read_text() == "# Report\n"
    again = make_thread(thread_id=thread.thread_id, user_id=thread.user_id)
    assert again.sandbox_id == thread.sandbox_id
    content = again.client.file.read_file(file=f"{OUTPUTS}/report.md").data.content
    assert content == "# Report\n"


def test_wrong_secret_is_404(make_thread):
    first, second = make_thread(), make_thread()
    host, first_id, first_secret = url_parts(first.url)
    _, second_id, second_secret = url_parts(second.url)
    flipped = first_secret[:-1] + ("0" if first_secret[-1] != "0" else "1")
    for url in [
        f"{host}/aio/{first_id}/{flipped}",
        f"{host}/aio/{first_id}/{second_secret}",
        f"{host}/aio/{second_id}/{first_secret}",
        f"{host}/aio/{first_id}/",
        f"{host}/aio/{first_id}",
        f"{host}/aio/sbx-0123456789abcdef/{first_secret}",
    ]:
        assert probe(url) == 404, url
        sbx = client(url)
        assert api_error(sbx.shell.exec_command, command="echo hi").status_code == 404, url
    # The right URLs still work.
    assert probe(first.url) == 200 and probe(second.url) == 200


# --- The AIO API: context and the bash tool -----------------------------


def test_context(thread):
    context = thread.client.sandbox.get_context()
    assert context.home_dir == "/home/user"
    assert isinstance(context.version, str) and context.version
    # The client's base URL may end in a slash.
    assert client(thread.url + "/").sandbox.get_context().home_dir == "/home/user"


def test_bash_tool(thread):
    """DeerFlow's bash tool: exec in the implicit session; it reads output."""
    result = thread.sh("echo out; echo err >&2")
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.session_id
    # stdout and stderr, together, as on a terminal.
    assert "out" in result.output and "err" in result.output
    failed = thread.sh("echo partial; (exit 3)")
    assert failed.status == "completed"
    assert failed.exit_code == 3
    assert "partial" in failed.output
    # No output: DeerFlow shows "(no output)".
    assert (thread.sh("true").output or "").strip() == ""
    # The sandbox's user data is there.
    assert set(thread.out(f"ls {USER_DATA}").split()) >= {"uploads", "workspace", "outputs"}


def test_implicit_session_keeps_cwd_and_env(thread):
    thread.sh("cd /tmp && mkdir -p here && cd here")
    assert thread.out("pwd") == "/tmp/here"
    thread.sh("export DEERFLOW_TEST=kept")
    assert thread.out("echo $DEERFLOW_TEST") == "kept"
    assert thread.out("pwd") == "/tmp/here"


@pytest.mark.deadline(60)
def test_hard_timeout_kills_the_command(thread):
    thread.sh("mkdir -p /tmp/stays && cd /tmp/stays")
    started = time.monotonic()
    result = thread.sh("sleep 37", hard_timeout=2)
    assert result.status == "hard_timeout"
    assert time.monotonic() - started < 20
    # The command is gone and the session goes on.
    deadline = time.monotonic() + 10
    while thread.out("pgrep -f 'slee[p] 37' || echo gone") != "gone":
        assert time.monotonic() < deadline, "sleep 37 survived its hard timeout"
        time.sleep(0.5)
    assert thread.out("echo after") == "after"
    # The fresh shell starts where the last finished command left.
    assert thread.out("pwd") == "/tmp/stays"


@pytest.mark.deadline(60)
def test_no_change_timeout(thread):
    sbx = thread.client
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    started = time.monotonic()
    result = sbx.shell.exec_command(id=session, command="sleep 23", no_change_timeout=2).data
    assert result.status == "no_change_timeout"
    assert time.monotonic() - started < 15
    # Output that keeps changing is no timeout.
    ticking = thread.sh(
        "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.5; done", no_change_timeout=3
    )
    assert ticking.status == "completed"
    assert "tick 6" in ticking.output


def test_explicit_sessions(thread):
    """A session of its own (DeerFlow's subagents, and its marker retry):
    create, exec with its id, clean up; its cwd is apart from the implicit
    session's."""
    sbx = thread.client
    session = f"s-{uuid.uuid4()}"
    created = sbx.shell.create_session(id=session).data
    assert created.session_id == session
    thread.sh("cd /")
    sbx.shell.exec_command(id=session, command="cd /tmp", no_change_timeout=600)
    result = sbx.shell.exec_command(id=session, command="pwd", no_change_timeout=600).data
    assert result.output.strip() == "/tmp"
    assert result.session_id == session
    assert thread.out("pwd") == "/"
    sbx.shell.cleanup_session(session)
    error = api_error(sbx.shell.exec_command, id=session, command="pwd", no_change_timeout=600)
    assert_session_not_found(error)


def test_session_recreated_on_404(thread):
    """DeerFlow recreates a scoped session once, on the structured 404."""
    sbx = thread.client
    session = f"subagent-{tag()}"
    error = api_error(sbx.shell.exec_command, id=session, command="echo hi", no_change_timeout=600)
    assert_session_not_found(error)
    assert sbx.shell.create_session(id=session).data.session_id == session
    result = sbx.shell.exec_command(id=session, command="echo hi", no_change_timeout=600).data
    assert result.status == "completed" and result.output.strip() == "hi"
    sbx.shell.cleanup_session(session)


@pytest.mark.deadline(60)
@pytest.mark.parametrize("explicit", [False, True], ids=["implicit", "explicit"])
def test_concurrent_calls_on_one_session_are_serialized(thread, explicit):
    """Calls on one shell session at once run one after the other: each sees
    its own variable, none another's."""
    sbx = thread.client
    extra = {}
    if explicit:
        extra["id"] = f"s-{tag()}"
        sbx.shell.create_session(id=extra["id"])
    calls = 6

    def call(i):
        return sbx.shell.exec_command(
            command=f"X={i}; sleep 0.3; echo got-$X", no_change_timeout=600, **extra
        ).data

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        results = list(pool.map(call, range(calls)))
    elapsed = time.monotonic() - started
    for i, result in enumerate(results):
        assert result.status == "completed", result
        assert result.output.strip() == f"got-{i}", result
    assert elapsed >= calls * 0.3 * 0.9, f"{calls} calls in {elapsed:.2f}s: not one at a time"


# --- The env tool (one-shot bash) -----------------------------------------


def test_env_tool(thread):
    """Skills with secrets: bash.exec with env, stdout and stderr apart."""
    sbx = thread.client
    result = sbx.bash.exec(
        command='echo "$API_TOKEN"; echo warn >&2',
        env={"API_TOKEN": "tok-123"},
        hard_timeout=600.0,
    ).data
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.stdout.strip() == "tok-123"
    assert result.stderr.strip() == "warn"
    assert deerflow_env_output(result).split() == ["tok-123", "Std", "Error:", "warn"]
    failed = sbx.bash.exec(command="echo partial; exit 4", env={"A": "1"}, hard_timeout=600.0).data
    assert failed.status == "completed"
    assert failed.exit_code == 4
    assert failed.stdout.strip() == "partial"
    # The secret stays with its call.
    assert thread.out("echo ${API_TOKEN:-unset}") == "unset"
    again = sbx.bash.exec(
        command="echo ${API_TOKEN:-unset}", env={"B": "2"}, hard_timeout=600.0
    ).data
    assert again.stdout.strip() == "unset"


@pytest.mark.deadline(60)
def test_env_tool_hard_timeout(thread):
    started = time.monotonic()
    result = thread.client.bash.exec(command="sleep 29", env={"A": "1"}, hard_timeout=2.0).data
    assert result.status == "timed_out"
    assert time.monotonic() - started < 20


# --- Bash sessions (/v1/bash/*) ---------------------------------------------


def bash_read(sbx, session_id, command_id=None, limit=30):
    """Reads a command's output as a client polls it: /v1/bash/output with
    the offsets of the last answer, long-polling, until the command is no
    longer running. (stdout, stderr, the last answer's data)."""
    out, err, offset, stderr_offset = "", "", 0, 0
    deadline = time.monotonic() + limit
    while True:
        data = sbx.bash.output(
            session_id=session_id,
            command_id=command_id,
            offset=offset,
            stderr_offset=stderr_offset,
            wait=True,
            wait_timeout=5,
        ).data
        assert data.session_id == session_id, data
        # Offsets count bytes, and move by what the answer carried.
        assert data.offset == offset + len(data.stdout.encode()), data
        assert data.stderr_offset == stderr_offset + len(data.stderr.encode()), data
        out, err = out + data.stdout, err + data.stderr
        offset, stderr_offset = data.offset, data.stderr_offset
        if data.command.status not in ("pending", "running"):
            return out, err, data
        assert time.monotonic() < deadline, f"still {data.command.status} after {limit}s"


def bash_session(sbx, **kwargs):
    """A new bash session's id."""
    session_id = f"b-{tag()}"
    info = sbx.bash.create_session(session_id=session_id, **kwargs).data
    assert info.session_id == session_id, info
    return session_id


def test_bash_session_keeps_cwd_and_exports(thread):
    """Within one session cd and export carry over; a call's env is its
    own; exec_dir moves the session; other sessions see none of it."""
    sbx = thread.client
    session = bash_session(sbx)
    first = sbx.bash.exec(
        session_id=session, command="mkdir -p /tmp/bs/d && cd /tmp/bs/d; export GREETING=hi"
    ).data
    assert first.status == "completed" and first.exit_code == 0, first
    assert first.session_id == session and first.command_id, first
    again = sbx.bash.exec(session_id=session, command='pwd; echo "$GREETING"').data
    assert again.stdout.split() == ["/tmp/bs/d", "hi"], again
    assert again.command_id != first.command_id
    # A call's env is over the session's, and for that call only.
    call = sbx.bash.exec(
        session_id=session, command='echo "$GREETING $SECRET"', env={"GREETING": "call", "SECRET": "s3"}
    ).data
    assert call.stdout.strip() == "call s3", call
    after = sbx.bash.exec(session_id=session, command='echo "$GREETING ${SECRET:-none}"').data
    assert after.stdout.strip() == "hi none", after
    # An exit still saves what the command changed; unset is kept too.
    sbx.bash.exec(session_id=session, command="cd /tmp; export N=1; unset GREETING; exit 3")
    state = sbx.bash.exec(session_id=session, command='pwd; echo "${GREETING:-gone} $N"').data
    assert state.stdout.split() == ["/tmp", "gone", "1"], state
    # exec_dir takes the command (and the session's next ones) there.
    moved = sbx.bash.exec(session_id=session, command="pwd", exec_dir=WORKSPACE).data
    assert moved.stdout.strip() == WORKSPACE, moved
    assert sbx.bash.exec(session_id=session, command="pwd").data.stdout.strip() == WORKSPACE
    # A session made in a directory starts there.
    other = bash_session(sbx, exec_dir=OUTPUTS)
    fresh = sbx.bash.exec(session_id=other, command='pwd; echo "${N:-unset}"').data
    assert fresh.stdout.split() == [OUTPUTS, "unset"], fresh
    # A call without a session runs in a fresh one, returned for reuse.
    lone = sbx.bash.exec(command='echo "${N:-unset}"; cd /tmp; export M=2').data
    assert lone.stdout.strip() == "unset" and lone.session_id not in (session, other), lone
    reused = sbx.bash.exec(session_id=lone.session_id, command='pwd; echo "$M"').data
    assert reused.stdout.split() == ["/tmp", "2"], reused


def test_bash_without_bash_runs_in_sh(thread):
    """Where the sandbox has no bash (here: none on the call's PATH) the
    command runs in sh, with the session's state kept all the same."""
    sbx = thread.client
    session = bash_session(sbx)
    nowhere = {"PATH": "/nowhere"}
    sbx.bash.exec(session_id=session, command="cd /tmp; export KEPT=yes", env=nowhere)
    result = sbx.bash.exec(
        session_id=session,
        command='echo "${BASH_VERSION:-sh}" "$KEPT"; pwd',
        env=nowhere,
    ).data
    assert result.status == "completed" and result.exit_code == 0, result
    assert result.stdout.split() == ["sh", "yes", "/tmp"], result
    other = bash_session(sbx)
    with_bash = sbx.bash.exec(session_id=other, command='echo "${BASH_VERSION:+bash}"').data
    assert with_bash.stdout.strip() == "bash", with_bash


def test_bash_stdout_and_stderr_apart(thread):
    sbx = thread.client
    session = bash_session(sbx)
    result = sbx.bash.exec(session_id=session, command="echo out; echo err >&2; echo €; exit 5").data
    assert result.status == "completed" and result.exit_code == 5, result
    assert result.stdout == "out\n€\n" and result.stderr == "err\n", result
    assert result.offset == len("out\n€\n".encode()) and result.stderr_offset == 4, result
    # The same output read back from offset 0, and from the answer's offsets.
    read = sbx.bash.output(session_id=session).data
    assert (read.stdout, read.stderr) == (result.stdout, result.stderr), read
    assert read.command.command_id == result.command_id and read.command.exit_code == 5
    rest = sbx.bash.output(session_id=session, offset=result.offset, stderr_offset=4).data
    assert (rest.stdout, rest.stderr, rest.offset) == ("", "", result.offset), rest
    # max_output_length cuts the middle of a long output.
    long = sbx.bash.exec(
        session_id=session, command="head -c 100000 /dev/zero | tr '\\0' a", max_output_length=1000
    ).data
    assert len(long.stdout) < 1200 and "truncated" in long.stdout, len(long.stdout)
    assert long.offset == 100000, long.offset


@pytest.mark.deadline(60)
def test_bash_async_exec_polled_with_offsets(thread):
    sbx = thread.client
    session = bash_session(sbx)
    started = time.monotonic()
    accepted = sbx.bash.exec(
        session_id=session,
        command="for i in 1 2 3; do echo out-$i; echo err-$i >&2; sleep 1; done; exit 2",
        async_mode=True,
    ).data
    assert time.monotonic() - started < 2.0, "async exec waited"
    assert accepted.status == "running", accepted
    assert (accepted.offset, accepted.stderr_offset) == (0, 0), accepted
    out, err, last = bash_read(sbx, session, accepted.command_id)
    assert out == "out-1\nout-2\nout-3\n" and err == "err-1\nerr-2\nerr-3\n", (out, err)
    assert last.command.status == "completed" and last.command.exit_code == 2, last
    assert last.command.command_id == accepted.command_id
    # While it runs it is the session's current command.
    sbx.bash.exec(session_id=session, command="sleep 30", async_mode=True)
    listed = {s.session_id: s for s in sbx.bash.sessions().data}
    assert listed[session].current_command == "sleep 30", listed[session]
    sbx.bash.kill(session_id=session, signal="SIGKILL")


@pytest.mark.deadline(60)
def test_bash_output_long_polls(thread):
    sbx = thread.client
    session = bash_session(sbx)
    command = sbx.bash.exec(session_id=session, command="sleep 1.5; echo late; sleep 30", async_mode=True).data
    started = time.monotonic()
    got = sbx.bash.output(session_id=session, wait=True, wait_timeout=20).data
    elapsed = time.monotonic() - started
    assert got.stdout == "late\n" and got.command.status == "running", got
    assert 0.8 < elapsed < 10, elapsed
    # Nothing new: the wait ends at wait_timeout with nothing.
    started = time.monotonic()
    idle = sbx.bash.output(session_id=session, offset=got.offset, wait=True, wait_timeout=1).data
    assert idle.stdout == "" and idle.offset == got.offset, idle
    assert 0.8 < time.monotonic() - started < 5
    killed = sbx.bash.kill(session_id=session).data
    assert killed["command_id"] == command.command_id, killed
    assert bash_ended(sbx, session, command.command_id).command.status == "killed"


@pytest.mark.deadline(60)
def test_bash_write_feeds_a_read(thread):
    sbx = thread.client
    session = bash_session(sbx)
    command = sbx.bash.exec(
        session_id=session, command='read -r name; echo "hello $name"; read -r more; echo "$more"', async_mode=True
    ).data
    sbx.bash.write(session_id=session, input="airlock\n")
    sbx.bash.write(session_id=session, command_id=command.command_id, input="and more\n")
    out, err, last = bash_read(sbx, session)
    assert out == "hello airlock\nand more\n" and err == "", (out, err)
    assert last.command.status == "completed" and last.command.exit_code == 0, last
    # Nothing runs now: a write is refused.
    assert api_error(sbx.bash.write, session_id=session, input="x\n").status_code == 409


@pytest.mark.deadline(60)
def test_bash_kill(thread):
    sbx = thread.client
    session = bash_session(sbx)
    sbx.bash.exec(session_id=session, command="export KEPT=yes")
    command = sbx.bash.exec(session_id=session, command="echo started; sleep 60", async_mode=True).data
    bash_wait_for(sbx, session, "started")
    killed = sbx.bash.kill(session_id=session).data
    assert killed["command_id"] == command.command_id, killed
    read = bash_ended(sbx, session, command.command_id)
    if read.command.status == "running" and os.environ.get("AIRLOCK_TEST_TIER") == "gvisor":
        # An open bug, flaky and only on gVisor (the closing note of
        # 2026-12-04 has what is known): the group SIGTERM is sent and
        # accepted, yet `bash` and its `sleep` are still there. SIGKILL
        # must end it there.
        sbx.bash.kill(session_id=session, signal="SIGKILL")
        read = bash_ended(sbx, session, command.command_id)
    if read.command.status != "killed":
        other = bash_session(sbx)
        ps = sbx.bash.exec(session_id=other, command="ps -eo pid,pgid,stat,args").data.stdout
        raise AssertionError(f"{read}; killed answer {killed}; processes:\n{ps}")
    assert read.command.status == "killed" and read.stdout == "started\n", read
    # One that ignores SIGTERM is ended by SIGKILL.
    stubborn = sbx.bash.exec(
        session_id=session, command="trap '' TERM; echo ready; sleep 60", async_mode=True
    ).data
    bash_wait_for(sbx, session, "ready")
    sbx.bash.kill(session_id=session, signal="SIGKILL")
    assert bash_ended(sbx, session, stubborn.command_id).command.status == "killed"
    # Nothing runs: a kill is refused; a bad signal is refused; the session
    # goes on with what it had.
    assert api_error(sbx.bash.kill, session_id=session).status_code == 409
    assert api_error(sbx.bash.kill, session_id=session, signal="SIGNOPE").status_code == 400
    alive = sbx.bash.exec(session_id=session, command='echo "alive $KEPT"').data
    assert alive.stdout.strip() == "alive yes" and alive.status == "completed", alive


def bash_ended(sbx, session, command_id, limit=30):
    """The command's output once it is no longer running. A kill's answer
    waits a little for the end; a loaded machine (gVisor under CI) may take
    longer, so the end is waited for here, not timed."""
    deadline = time.monotonic() + limit
    while True:
        read = sbx.bash.output(session_id=session, command_id=command_id).data
        if read.command.status != "running" or time.monotonic() > deadline:
            return read
        time.sleep(0.1)


def bash_wait_for(sbx, session, text, limit=20):
    """Waits until the session's current command has printed `text`."""
    deadline = time.monotonic() + limit
    while text not in sbx.bash.output(session_id=session, wait=True, wait_timeout=2).data.stdout:
        assert time.monotonic() < deadline, f"no {text!r} after {limit}s"


@pytest.mark.deadline(60)
def test_bash_hard_timeout(thread):
    sbx = thread.client
    session = bash_session(sbx)
    started = time.monotonic()
    result = sbx.bash.exec(session_id=session, command="echo before; sleep 30", hard_timeout=1.0).data
    assert result.status == "timed_out" and result.stdout == "before\n", result
    assert time.monotonic() - started < 10
    # An async one too, seen through output; the session goes on.
    late = sbx.bash.exec(session_id=session, command="sleep 30", hard_timeout=1.0, async_mode=True).data
    _, _, last = bash_read(sbx, session, late.command_id)
    assert last.command.status == "timed_out", last
    assert sbx.bash.exec(session_id=session, command="echo ok").data.stdout == "ok\n"


@pytest.mark.deadline(60)
def test_bash_timeout_returns_running_then_completes(thread):
    sbx = thread.client
    session = bash_session(sbx)
    started = time.monotonic()
    result = sbx.bash.exec(session_id=session, command="echo begun; sleep 2; echo done", timeout=0.5).data
    assert time.monotonic() - started < 2
    assert result.status == "running" and result.exit_code is None, result
    assert "begun\n".startswith(result.stdout), result
    assert result.offset == len(result.stdout), result
    # The rest comes from the offset the answer gave.
    rest, offset = "", result.offset
    while True:
        read = sbx.bash.output(session_id=session, offset=offset, wait=True, wait_timeout=10).data
        rest, offset = rest + read.stdout, read.offset
        if read.command.status != "running":
            break
    assert result.stdout + rest == "begun\ndone\n", rest
    assert read.command.status == "completed" and read.command.exit_code == 0, read


@pytest.mark.deadline(60)
def test_bash_commands_of_a_session_run_one_at_a_time(thread):
    """A command sent while another runs waits for it (pending), then runs;
    concurrent calls on one session all complete, in turn."""
    sbx = thread.client
    session = bash_session(sbx)
    first = sbx.bash.exec(session_id=session, command="sleep 1; echo first > /tmp/order", async_mode=True).data
    second = sbx.bash.exec(session_id=session, command="cat /tmp/order", async_mode=True).data
    queued = sbx.bash.output(session_id=session, command_id=second.command_id).data
    assert queued.command.status == "pending", queued
    out, _, last = bash_read(sbx, session, second.command_id)
    assert out == "first\n" and last.command.status == "completed", (out, last)
    calls = 4
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        results = list(
            pool.map(
                lambda i: sbx.bash.exec(session_id=session, command=f"sleep 0.3; echo got-{i}").data,
                range(calls),
            )
        )
    for i, result in enumerate(results):
        assert result.status == "completed" and result.stdout == f"got-{i}\n", result
    assert first.command_id != second.command_id


def test_bash_unknown_session_is_404(thread):
    sbx = thread.client
    calls = [
        lambda: sbx.bash.exec(session_id="nope", command="echo hi"),
        lambda: sbx.bash.output(session_id="nope"),
        lambda: sbx.bash.write(session_id="nope", input="x"),
        lambda: sbx.bash.kill(session_id="nope"),
        lambda: sbx.bash.close_session("nope"),
    ]
    for call in calls:
        assert_session_not_found(api_error(call))


@pytest.mark.deadline(60)
def test_bash_closed_session_is_gone(thread):
    sbx = thread.client
    session = bash_session(sbx)
    beat = f"/tmp/beat-{session}"
    command = sbx.bash.exec(
        session_id=session,
        command=f"date +%s%N > {beat}; echo up; while :; do sleep 0.1; date +%s%N > {beat}; done",
        async_mode=True,
    ).data
    bash_wait_for(sbx, session, "up")
    closed = sbx.bash.close_session(session).data
    assert closed == {"session_id": session, "status": "closed"}, closed
    assert session not in {s.session_id for s in sbx.bash.sessions().data}
    assert_session_not_found(api_error(sbx.bash.exec, session_id=session, command="echo hi"))
    assert_session_not_found(api_error(sbx.bash.output, session_id=session, command_id=command.command_id))
    assert_session_not_found(api_error(sbx.bash.close_session, session))
    # Its command was ended with it: the beat stopped.
    beats = [sbx.file.read_file(file=beat).data.content]
    time.sleep(0.5)
    beats.append(sbx.file.read_file(file=beat).data.content)
    assert beats[0] == beats[1], beats


def test_bash_sessions_are_listed(thread):
    sbx = thread.client
    assert_bad = api_error(sbx.bash.create_session, session_id="a/b")
    assert assert_bad.status_code == 400, assert_bad
    plain = bash_session(sbx)
    placed = bash_session(sbx, exec_dir=WORKSPACE)
    # Creating an existing session answers it as it is.
    assert sbx.bash.create_session(session_id=placed).data.working_dir == WORKSPACE
    sbx.bash.exec(session_id=plain, command="cd /tmp")
    listed = {s.session_id: s for s in sbx.bash.sessions().data}
    assert {plain, placed} <= set(listed), listed
    assert listed[plain].status == "ready" and listed[plain].working_dir == "/tmp", listed[plain]
    assert listed[plain].command_count == 1 and listed[plain].current_command is None
    assert listed[placed].working_dir == WORKSPACE and listed[placed].command_count == 0
    assert listed[plain].created_at <= listed[plain].last_used_at
    auto = sbx.bash.create_session().data
    assert auto.session_id and auto.status == "ready", auto


# --- Files ---------------------------------------------------------------


def test_uploads_and_outputs_are_the_hosts(make_thread):
    """The gateway writes uploads on the host; the sandbox sees them. What
    the sandbox writes under outputs and workspace is on the host."""
    thread = make_thread()
    for name in ("uploads", "workspace", "outputs"):
        assert (thread.host / name).is_dir(), thread.host / name
    (thread.host / "uploads" / "data.csv").write_text("a,b\n1,2\n")
    sbx = thread.client
    assert sbx.file.read_file(file=f"{UPLOADS}/data.csv").data.content == "a,b\n1,2\n"
    assert thread.out(f"cat {UPLOADS}/data.csv") == "a,b\n1,2"
    thread.sh(f"echo from-shell > {OUTPUTS}/shell.txt")
    sbx.file.write_file(file=f"{OUTPUTS}/tool.txt", content="from-tool")
    sbx.file.write_file(file=f"{WORKSPACE}/draft.md", content="draft")
    assert (thread.host / "outputs" / "shell.txt").read_text() == "from-shell\n"
    assert (thread.host / "outputs" / "tool.txt").read_text() == "from-tool"
    assert (thread.host / "workspace" / "draft.md").read_text() == "draft"
    # Another thread of the same user has user data of its own.
    other = make_thread(user_id=thread.user_id)
    assert other.out(f"test -e {UPLOADS}/data.csv && echo yes || echo no") == "no"
    assert not (other.host / "outputs" / "tool.txt").exists()


def test_public_skills_are_read_only(thread):
    sbx = thread.client
    path = "/mnt/skills/public/deep-research/SKILL.md"
    assert sbx.file.read_file(file=path).data.content == PUBLIC_SKILL_TEXT
    api_error(sbx.file.write_file, file=path, content="pwned")
    api_error(sbx.file.write_file, file="/mnt/skills/public/new.md", content="new")
    api_error(sbx.file.write_file, file=path, content="cHduZWQ=", encoding="base64")
    failed = thread.sh("echo x > /mnt/skills/public/shell.txt")
    assert failed.status == "completed" and failed.exit_code not in (0, None), failed
    public = BASE / "skills_view" / "public"
    assert (public / "deep-research" / "SKILL.md").read_text() == PUBLIC_SKILL_TEXT
    assert sorted(p.name for p in public.iterdir()) == ["deep-research"]


def test_read_file(thread):
    """DeerFlow's read_file: lines start..end (1-based, inclusive) are
    start_line=start-1, end_line=end (0-based, exclusive)."""
    (thread.host / "uploads" / "lines.txt").write_text("".join(f"line{i}\n" for i in range(1, 8)))
    sbx = thread.client
    path = f"{UPLOADS}/lines.txt"
    whole = sbx.file.read_file(file=path).data
    assert whole.content == "".join(f"line{i}\n" for i in range(1, 8))
    assert whole.file == path
    part = sbx.file.read_file(file=path, start_line=1, end_line=4).data.content
    assert part.splitlines() == ["line2", "line3", "line4"]
    head = sbx.file.read_file(file=path, start_line=0, end_line=1).data.content
    assert head.splitlines() == ["line1"]
    tail = sbx.file.read_file(file=path, start_line=5).data.content
    assert tail.splitlines() == ["line6", "line7"]
    # A missing file: DeerFlow turns the error into "Error: ...".
    api_error(sbx.file.read_file, file=f"{UPLOADS}/missing.txt")


def test_write_file(thread):
    sbx = thread.client
    path = f"{WORKSPACE}/notes.md"
    text = "héllo, 世界\n"
    written = sbx.file.write_file(file=path, content=text).data
    assert written.file == path
    assert written.bytes_written in (None, len(text.encode()))
    assert sbx.file.read_file(file=path).data.content == text
    assert (thread.host / "workspace" / "notes.md").read_bytes() == text.encode()
    # The server's append.
    sbx.file.write_file(file=path, content="more\n", append=True)
    assert sbx.file.read_file(file=path).data.content == text + "more\n"
    # DeerFlow's append: read, then write the whole.
    current = sbx.file.read_file(file=path).data.content
    sbx.file.write_file(file=path, content=current + "last\n")
    assert (thread.host / "workspace" / "notes.md").read_text() == text + "more\nlast\n"
    # Overwriting replaces.
    sbx.file.write_file(file=path, content="short")
    assert sbx.file.read_file(file=path).data.content == "short"


def test_replace_and_search_in_file(thread):
    """The AIO client's edit tools: replace every occurrence (the count
    returned, the file written back), and search by regex (matching lines,
    1-based numbers); a missing file and a bad regex are errors."""
    sbx = thread.client
    path = f"{WORKSPACE}/edit.py"
    sbx.file.write_file(file=path, content="x = 1\nprint(x)\ny = x + x\n")
    replaced = sbx.file.replace_in_file(file=path, old_str="x", new_str="value").data
    assert replaced.file == path
    assert replaced.replaced_count == 4
    assert (thread.host / "workspace" / "edit.py").read_text() == (
        "value = 1\nprint(value)\ny = value + value\n"
    )
    # Nothing to replace: nothing changes.
    none = sbx.file.replace_in_file(file=path, old_str="absent", new_str="z").data
    assert none.replaced_count == 0
    found = sbx.file.search_in_file(file=path, regex=r"value\b.*\+").data
    assert found.matches == ["y = value + value"]
    assert found.line_numbers == [3]
    found = sbx.file.search_in_file(file=path, regex="^(value|print)").data
    assert found.line_numbers == [1, 2]
    api_error(sbx.file.replace_in_file, file=f"{WORKSPACE}/missing.py", old_str="a", new_str="b")
    api_error(sbx.file.replace_in_file, file=path, old_str="", new_str="b")
    api_error(sbx.file.search_in_file, file=path, regex="(unclosed")
    # The read-only skills stay as they are.
    skill = "/mnt/skills/public/deep-research/SKILL.md"
    api_error(sbx.file.replace_in_file, file=skill, old_str=PUBLIC_SKILL_TEXT[:4], new_str="pwned")
    assert sbx.file.read_file(file=skill).data.content == PUBLIC_SKILL_TEXT


def test_update_file_base64(thread):
    """DeerFlow's update_file (uploads and artifacts in remote mode): the
    bytes as base64."""
    sbx = thread.client
    data = bytes(range(256)) * 64
    path = f"{UPLOADS}/blob.bin"
    sbx.file.write_file(file=path, content=base64.b64encode(data).decode(), encoding="base64")
    assert (thread.host / "uploads" / "blob.bin").read_bytes() == data
    assert download(sbx, path) == data
    assert thread.out(f"wc -c < {path}") == str(len(data))


def test_download_file(thread):
    sbx = thread.client
    sbx.file.write_file(file=f"{OUTPUTS}/my report.txt", content="with a space\n")
    assert download(sbx, f"{OUTPUTS}/my report.txt") == b"with a space\n"
    # Large and binary, written on the host, streamed.
    big = os.urandom(3 << 20)
    (thread.host / "outputs" / "big.bin").write_bytes(big)
    assert download(sbx, f"{OUTPUTS}/big.bin") == big
    assert api_error(download, sbx, f"{OUTPUTS}/missing.bin").status_code >= 400


def test_list_dir_with_find(thread):
    """DeerFlow's list_dir: find through the bash tool, one path a line."""
    root = f"{WORKSPACE}/src"
    make_tree(thread, root)
    output = thread.sh(
        f"find '{root}' -maxdepth 2 -type f -o -type d 2>/dev/null | head -500"
    ).output
    assert set(output.split()) == {
        root,
        f"{root}/a.py",
        f"{root}/.f.txt",
        f"{root}/.hidden",
        f"{root}/.hidden/e.py",
        f"{root}/sub",
        f"{root}/sub/b.txt",
        f"{root}/sub/c.md",
        f"{root}/sub/deep",
    }


def test_list_path_recursive(thread):
    root = f"{WORKSPACE}/src"
    make_tree(thread, root)
    sbx = thread.client
    listed = sbx.file.list_path(path=root, recursive=True, show_hidden=False).data
    entries = {entry.path: entry for entry in listed.files}
    assert set(entries) == {
        f"{root}/a.py",
        f"{root}/sub",
        f"{root}/sub/b.txt",
        f"{root}/sub/c.md",
        f"{root}/sub/deep",
        f"{root}/sub/deep/d.py",
    }
    assert entries[f"{root}/sub"].is_directory
    assert entries[f"{root}/sub/deep"].is_directory
    assert not entries[f"{root}/a.py"].is_directory
    assert entries[f"{root}/a.py"].name == "a.py"
    hidden = sbx.file.list_path(path=root, recursive=True, show_hidden=True).data
    assert {f"{root}/.f.txt", f"{root}/.hidden", f"{root}/.hidden/e.py"} <= {
        entry.path for entry in hidden.files
    }
    # DeerFlow's glob with directories.
    assert deerflow_glob_dirs(sbx, root, "**/*.py") == [f"{root}/a.py", f"{root}/sub/deep/d.py"]
    assert deerflow_glob_dirs(sbx, root, "**/deep") == [f"{root}/sub/deep"]


def test_find_files(thread):
    """DeerFlow's glob of files: find_files, absolute paths."""
    root = f"{WORKSPACE}/src"
    make_tree(thread, root)
    sbx = thread.client
    found = sbx.file.find_files(path=root, glob="**/*.py").data.files
    assert {f"{root}/a.py", f"{root}/sub/deep/d.py"} <= set(found)
    for path in found:
        assert path.startswith(root + "/") and path.endswith(".py"), path
    assert sbx.file.find_files(path=root, glob="sub/*.txt").data.files == [f"{root}/sub/b.txt"]
    assert sbx.file.find_files(path=root, glob="**/*.none").data.files in (None, [])


def test_grep(thread):
    """DeerFlow's grep: absolute files, 1-based lines, the lines' text."""
    root = f"{WORKSPACE}/src"
    make_tree(thread, root)
    sbx = thread.client
    matches, truncated = deerflow_grep(sbx, root, "needle")
    assert visible(matches) == {
        (f"{root}/a.py", 2, "needle = 1"),
        (f"{root}/a.py", 3, "print(needle)"),
    }
    assert truncated is False
    matches, _ = deerflow_grep(sbx, root, "needle", case_sensitive=False)
    assert (f"{root}/sub/b.txt", 2, "NEEDLE upper") in matches
    # A regex, then the same as a literal.
    matches, _ = deerflow_grep(sbx, root, "a.b")
    assert visible(matches) == {
        (f"{root}/sub/c.md", 1, "a.b literal"),
        (f"{root}/sub/c.md", 2, "axb not literal"),
    }
    matches, _ = deerflow_grep(sbx, root, "a.b", literal=True)
    assert visible(matches) == {(f"{root}/sub/c.md", 1, "a.b literal")}
    # More matches than asked for: truncated.
    data = sbx.file.grep_files(
        path=root, pattern="needle", case_insensitive=True, max_results=1
    ).data
    assert len(data.matches) == 1
    assert data.truncated is True
    # Files over max_file_size are skipped.
    thread.sh(f"(head -c 2097152 /dev/zero | tr '\\0' 'x'; echo; echo bigneedle) > {root}/big.log")
    assert deerflow_grep(sbx, root, "bigneedle")[0] == set()
    matches, _ = deerflow_grep(sbx, root, "bigneedle", max_file_size="4M")
    assert {(m[0], m[2]) for m in matches} == {(f"{root}/big.log", "bigneedle")}


# --- Shell view, wait and write -------------------------------------------


def raw(thread, path, body):
    """A POST to the sandbox's AIO API as JSON, without the client: the
    response."""
    return requests.post(
        f"{thread.url}{path}", json=body, timeout=30, proxies={"http": None, "https": None}
    )


@pytest.mark.deadline(60)
def test_shell_write_answers_a_prompt(thread):
    """A command waiting at a prompt: exec returns on no_change_timeout,
    view shows it running with its prompt, write answers it, wait sees it
    complete with the output; then nothing runs and a write is refused."""
    sbx = thread.client
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    first = sbx.shell.exec_command(
        id=session,
        command='printf "name? "; read -r name; echo "hello, $name"',
        no_change_timeout=2,
    ).data
    assert first.status == "no_change_timeout", first
    assert "name?" in first.output
    viewed = sbx.shell.view(id=session).data
    assert viewed.status == "running", viewed
    assert viewed.session_id == session
    assert viewed.output.startswith("name?"), viewed
    assert "read -r name" in viewed.command
    written = sbx.shell.write_to_process(id=session, input="airlock", press_enter=True).data
    assert written.status == "running", written
    waited = sbx.shell.wait_for_process(id=session, seconds=20).data
    assert waited.status == "completed", waited
    assert "hello, airlock" in waited.output, waited
    assert waited.exit_code == 0, waited
    viewed = sbx.shell.view(id=session).data
    assert viewed.status == "completed" and viewed.exit_code == 0, viewed
    assert "__AIRLOCK" not in viewed.output
    assert viewed.console and viewed.console[0].output == viewed.output
    # Nothing runs now: input goes nowhere, and says so; the shell is fine.
    error = api_error(sbx.shell.write_to_process, id=session, input="echo leaked", press_enter=True)
    assert error.status_code == 409, error
    after = sbx.shell.exec_command(id=session, command="echo ok", no_change_timeout=600).data
    assert after.output.strip() == "ok", after
    assert "leaked" not in sbx.shell.view(id=session).data.output


@pytest.mark.deadline(60)
def test_shell_view_and_wait_of_a_running_command(thread):
    """view shows the output a running command has printed so far; wait
    returns "running" at its limit, "completed" once it ends, and the
    session then runs the next command."""
    sbx = thread.client
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    first = sbx.shell.exec_command(
        id=session, command="echo one; sleep 1; echo two; sleep 4; echo three", no_change_timeout=0.5
    ).data
    assert first.status == "no_change_timeout", first
    time.sleep(1.5)
    viewed = sbx.shell.view(id=session).data
    assert viewed.status == "running", viewed
    assert "one" in viewed.output and "two" in viewed.output, viewed
    assert "three" not in viewed.output, viewed
    started = time.monotonic()
    waited = sbx.shell.wait_for_process(id=session, seconds=1).data
    assert waited.status == "running", waited
    assert time.monotonic() - started >= 0.9
    waited = sbx.shell.wait_for_process(id=session, seconds=20, max_wait_seconds=30).data
    assert waited.status == "completed", waited
    assert waited.output.split() == ["one", "two", "three"], waited
    result = sbx.shell.exec_command(id=session, command="echo next", no_change_timeout=600).data
    assert result.status == "completed" and result.output.strip() == "next", result


@pytest.mark.deadline(60)
def test_shell_view_during_an_exec_does_not_disturb_it(thread):
    """A view while an exec call is under way on the session answers at
    once with the output so far; the exec still gets its whole output."""
    sbx = thread.client
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            sbx.shell.exec_command,
            id=session,
            command="echo start; sleep 2; echo end",
            no_change_timeout=600,
        )
        time.sleep(1)
        started = time.monotonic()
        viewed = sbx.shell.view(id=session).data
        assert time.monotonic() - started < 1, "view waited for the exec"
        assert viewed.status == "running", viewed
        assert viewed.output.strip() == "start", viewed
        result = running.result().data
    assert result.status == "completed", result
    assert result.output.split() == ["start", "end"], result


@pytest.mark.deadline(60)
def test_input_left_unread_goes_nowhere(thread):
    """A command's stdin is its own: what it leaves unread is dropped with
    it, never run by the shell nor read by the next command."""
    sbx = thread.client
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    first = sbx.shell.exec_command(id=session, command="head -c 3; echo", no_change_timeout=1).data
    assert first.status == "no_change_timeout", first
    sbx.shell.write_to_process(id=session, input="abc; touch /tmp/ran", press_enter=True)
    waited = sbx.shell.wait_for_process(id=session, seconds=20).data
    assert waited.status == "completed" and waited.output.strip() == "abc", waited
    after = sbx.shell.exec_command(
        id=session, command='read -r -t 1 x; echo "[$x]"; ls /tmp/ran 2>&1 | tail -1', no_change_timeout=600
    ).data
    lines = after.output.strip().splitlines()
    assert lines[0] == "[]", after
    assert "No such file" in lines[1], after


def test_shell_view_wait_write_errors(thread):
    """Unknown sessions are the structured 404; bad bodies are 4xx."""
    sbx = thread.client
    for call, kwargs in (
        (sbx.shell.view, {}),
        (sbx.shell.wait_for_process, {"seconds": 1}),
        (sbx.shell.write_to_process, {"input": "x", "press_enter": False}),
    ):
        assert_session_not_found(api_error(call, id=f"nope-{tag()}", **kwargs))
    session = f"s-{tag()}"
    sbx.shell.create_session(id=session)
    fresh = sbx.shell.view(id=session).data
    assert fresh.status == "completed" and fresh.output == "" and fresh.command is None
    assert raw(thread, "/v1/shell/wait", {"id": session, "seconds": -1}).status_code == 400
    assert raw(thread, "/v1/shell/write", {"id": session, "input": "x"}).status_code == 422
    too_big = raw(thread, "/v1/shell/write", {"id": session, "input": "x" * (65 << 10), "press_enter": False})
    assert too_big.status_code == 413, too_big.text
    assert raw(thread, "/v1/shell/view", {}).status_code == 422


# --- Upload, glob and the editor ------------------------------------------


def test_upload_file(thread):
    """upload_file: multipart, the bytes where `path` says (parents made),
    or in the home directory under the file's name."""
    sbx = thread.client
    data = bytes(range(256)) * 40 + b"\r\n--not-a-boundary\r\n"
    result = sbx.file.upload_file(file=("blob.bin", data), path="/tmp/up/deep/blob.bin").data
    assert result.success and result.file_path == "/tmp/up/deep/blob.bin"
    assert result.file_size == len(data)
    assert download(sbx, "/tmp/up/deep/blob.bin") == data
    result = sbx.file.upload_file(file=("named.txt", b"hi\n")).data
    assert result.file_path == "/home/user/named.txt", result
    assert thread.out("cat /home/user/named.txt") == "hi"
    answer = requests.post(
        f"{thread.url}/v1/file/upload",
        files={"other": ("x", b"y")},
        data={"path": "/tmp/nothing"},
        timeout=30,
        proxies={"http": None, "https": None},
    )
    assert answer.status_code == 422, answer.text
    answer = raw(thread, "/v1/file/upload", {"path": "/tmp/nothing"})
    assert answer.status_code == 422, answer.text
    assert thread.out("ls /tmp/nothing 2>&1 || true").endswith("No such file or directory")


def test_glob_files(thread):
    """glob_files: shell glob semantics relative to `path`, hidden entries
    only when asked, exclusions, sorting, max_results with truncated."""
    sbx = thread.client
    root = f"/tmp/glob-{tag()}"
    thread.sh(
        f"mkdir -p {root}/src/pkg {root}/.hidden && cd {root} && "
        "printf a > top.py && printf abc > src/mid.py && printf abcdef > src/pkg/deep.py && "
        "printf x > src/notes.txt && printf h > .hidden/secret.py"
    )
    found = sbx.file.glob_files(path=root, pattern="**/*.py").data
    assert sorted(f.path for f in found.files) == [
        f"{root}/src/mid.py",
        f"{root}/src/pkg/deep.py",
        f"{root}/top.py",
    ], found
    assert found.total_count == 3 and not found.truncated
    assert all(f.size is not None and f.modified_time for f in found.files)
    top = sbx.file.glob_files(path=root, pattern="*.py").data
    assert [f.path for f in top.files] == [f"{root}/top.py"]
    hidden = sbx.file.glob_files(path=root, pattern="**/*.py", include_hidden=True).data
    assert f"{root}/.hidden/secret.py" in [f.path for f in hidden.files]
    excluded = sbx.file.glob_files(path=root, pattern="**/*.py", exclude=["src/pkg/**"]).data
    assert f"{root}/src/pkg/deep.py" not in [f.path for f in excluded.files]
    assert len(excluded.files) == 2
    biggest = sbx.file.glob_files(
        path=root, pattern="**/*.py", sort_by="size", sort_desc=True, max_results=1
    ).data
    assert [f.name for f in biggest.files] == ["deep.py"]
    assert biggest.total_count == 3 and biggest.truncated
    dirs = sbx.file.glob_files(path=root, pattern="src/*", files_only=False).data
    assert {(f.name, f.is_directory) for f in dirs.files} == {
        ("mid.py", False), ("pkg", True), ("notes.txt", False)
    }
    assert raw(thread, "/v1/file/glob", {"path": root, "pattern": "*", "max_results": 0}).status_code == 400
    assert raw(thread, "/v1/file/glob", {"path": root, "pattern": "*", "sort_by": "colour"}).status_code == 400
    assert api_error(sbx.file.glob_files, path=f"{root}/none", pattern="*").status_code == 404


def test_str_replace_editor(thread):
    """The editor: create (not over a file), view (numbered, ranges,
    directories), str_replace (unique, or a mode; absent and ambiguous
    strings are refused and change nothing), insert, undo_edit."""
    sbx = thread.client
    edit = sbx.file.str_replace_editor
    root = f"/tmp/edit-{tag()}"
    path = f"{root}/a.py"
    created = edit(command="create", path=path, file_text="one\ntwo\ntwo\nfour\n").data
    assert created.prev_exist is False and "created" in created.output
    assert thread.out(f"cat {path}") == "one\ntwo\ntwo\nfour"
    error = api_error(edit, command="create", path=path, file_text="clobbered")
    assert error.status_code == 400 and "already exists" in error.body["message"]
    viewed = edit(command="view", path=path, view_range=[2, 3]).data
    assert viewed.output.endswith("     2\ttwo\n     3\ttwo\n"), viewed.output
    assert edit(command="view", path=path, view_range=[4, -1]).data.output.endswith("     4\tfour\n     5\t\n")
    assert api_error(edit, command="view", path=path, view_range=[9, 10]).status_code == 400
    listing = edit(command="view", path=root).data.output
    assert path in listing
    before = download(sbx, path)
    error = api_error(edit, command="str_replace", path=path, old_str="three", new_str="3")
    assert error.status_code == 400 and "did not appear verbatim" in error.body["message"]
    error = api_error(edit, command="str_replace", path=path, old_str="two", new_str="2")
    assert error.status_code == 400 and "Multiple occurrences" in error.body["message"]
    assert "[2, 3]" in error.body["message"]
    assert download(sbx, path) == before
    done = edit(command="str_replace", path=path, old_str="one", new_str="1").data
    assert done.old_content == before.decode() and done.new_content == "1\ntwo\ntwo\nfour\n"
    assert "     1\t1" in done.output
    edit(command="str_replace", path=path, old_str="two", new_str="2", replace_mode="LAST")
    assert download(sbx, path) == b"1\ntwo\n2\nfour\n"
    inserted = edit(command="insert", path=path, insert_line=1, new_str="one and a half").data
    assert inserted.new_content == "1\none and a half\ntwo\n2\nfour\n"
    assert api_error(edit, command="insert", path=path, insert_line=99, new_str="x").status_code == 400
    assert edit(command="undo_edit", path=path).data.new_content == "1\ntwo\n2\nfour\n"
    edit(command="undo_edit", path=path)
    edit(command="undo_edit", path=path)
    assert download(sbx, path) == before
    error = api_error(edit, command="undo_edit", path=path)
    assert error.status_code == 400 and "No edit history" in error.body["message"]
    assert api_error(edit, command="view", path="relative.py").status_code == 400
    assert api_error(edit, command="str_replace", path=f"{root}/none.py", old_str="x").status_code == 404
    assert raw(thread, "/v1/file/str_replace_editor", {"command": "delete", "path": path}).status_code == 400
    assert download(sbx, path) == before
