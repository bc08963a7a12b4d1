"""The e2b Template SDK builds airlock templates, unmodified.

`Template().from_template("base")...` and `Template.build` /
`build_in_background` + `get_build_status` against the daemon's e2b routes,
then `Sandbox.create(NAME)` on the result. The harness
(crates/airlock/tests/e2b_sdk.rs) runs this file against a daemon of its own
that has the `base` template imported from the cached fixture (never built
here).
"""

import os
import time
import uuid

import pytest

from e2b import BuildException, Sandbox, Template

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120


@pytest.fixture
def context(tmp_path):
    """A build context with one file in it."""
    (tmp_path / "hello.txt").write_text("hello from the build context\n")
    return tmp_path


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kill_all(ids):
    for sandbox_id in ids:
        try:
            Sandbox.kill(sandbox_id)
        except Exception:
            pass


@pytest.mark.deadline(600)
def test_build_from_base_then_create_sees_its_files_and_env(context):
    template = (
        Template(file_context_path=str(context))
        .from_template("base")
        .run_cmd("echo built > /tmp/built.txt")
        .copy("hello.txt", "/home/user/x")
        .set_envs({"GREETING": "hi there"})
        .run_cmd('echo "$GREETING" > /home/user/greeting.txt')
        .set_workdir("/home/user/work")
    )
    logs = []
    tpl = name("e2b-built")
    info = Template.build(template, tpl, on_build_logs=logs.append)
    assert info.name == tpl
    assert info.template_id and info.build_id
    assert logs, "the build sent no log entries"
    assert Template.exists(tpl)
    assert not Template.exists(name("never-built"))

    created = []
    try:
        for handle in (tpl, info.template_id, f"{tpl}:default"):
            sbx = Sandbox.create(handle, timeout=TIMEOUT)
            created.append(sbx.sandbox_id)
            r = sbx.commands.run(
                "cat /home/user/x /home/user/greeting.txt /tmp/built.txt; "
                'echo "env=$GREETING"; whoami; pwd'
            )
            lines = r.stdout.splitlines()
            assert lines[:3] == ["hello from the build context", "hi there", "built"], r.stdout
            assert "env=hi there" in lines, r.stdout
            assert lines[-2:] == ["user", "/home/user/work"], r.stdout
            assert sbx.files.read("/home/user/x") == "hello from the build context\n"
    finally:
        kill_all(created)

    # A rebuild of the name keeps its template id, with a new build.
    again = Template.build(template, tpl)
    assert again.template_id == info.template_id
    assert again.build_id != info.build_id


@pytest.mark.deadline(600)
def test_build_in_background_and_its_status(context):
    template = Template().from_template("base").run_cmd("echo in the background")
    tpl = name("e2b-bg")
    info = Template.build_in_background(template, tpl)
    offset = 0
    messages = []
    deadline = time.monotonic() + 540
    while True:
        status = Template.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        messages += [e.message for e in status.log_entries]
        if status.status.value in ("ready", "error"):
            break
        assert time.monotonic() < deadline, "the build did not finish"
        time.sleep(0.5)
    assert status.status.value == "ready", status.reason
    assert any("in the background" in m for m in messages), messages
    # Past the end: nothing more, and the same answer.
    assert Template.get_build_status(info, logs_offset=offset).log_entries == []


@pytest.mark.deadline(600)
def test_a_failing_run_cmd_raises_with_its_output():
    template = (
        Template()
        .from_template("base")
        .run_cmd("echo before the failure")
        .run_cmd("echo the command said this >&2; exit 3")
    )
    tpl = name("e2b-fails")
    with pytest.raises(BuildException) as raised:
        Template.build(template, tpl)
    assert "the command said this" in str(raised.value), str(raised.value)
    # The build made no template.
    assert not Template.exists(tpl)


@pytest.mark.deadline(600)
def test_start_and_ready_commands_run_at_each_create():
    template = (
        Template()
        .from_template("base")
        .set_start_cmd(
            "sleep 1; echo started > /tmp/started; sleep 1000",
            "[ -f /tmp/started ]",
        )
    )
    tpl = name("e2b-start")
    Template.build(template, tpl)
    sbx = Sandbox.create(tpl, timeout=TIMEOUT)
    try:
        # Ready only once the ready command succeeded: the file is there.
        assert sbx.files.read("/tmp/started") == "started\n"
    finally:
        kill_all([sbx.sandbox_id])

    never = Template().from_template("base").set_start_cmd("sleep 1000", "false")
    tpl = name("e2b-never")
    Template.build(never, tpl)
    with pytest.raises(Exception) as raised:
        Sandbox.create(tpl, timeout=5)
    assert "ready command" in str(raised.value), str(raised.value)


def test_bad_input_is_refused():
    with pytest.raises(BuildException):
        Template.build(Template().from_template("no-such-template-here"), name("e2b-bad"))


@pytest.mark.deadline(300)
def test_user_has_sudo_on_base_in_commands_and_in_a_terminal():
    """As the SDK's own examples use it: `sudo` for `user`, passwordless,
    in a command and on a terminal (where Ctrl-C reaches the command)."""
    from e2b import PtySize
    from test_pty import Terminal

    sbx = Sandbox.create("base", timeout=TIMEOUT)
    try:
        result = sbx.commands.run(
            "whoami; sudo whoami; sudo -u user whoami; "
            "echo hi | sudo tee /root/hi >/dev/null; sudo cat /root/hi"
        )
        assert result.stdout == "user\nroot\nuser\nhi\n", result
        term = Terminal(sbx, PtySize(rows=24, cols=80), timeout=120)
        term.type("sudo id -u; sudo stty size\n")
        term.wait_for("0\r\n24 80\r\n")
        # A typed Ctrl-C reaches the command through sudo's shim (on
        # gVisor, whose terminals send no signal, the agent sends it).
        term.type("sudo sleep 60\n")
        time.sleep(1)
        term.type("\x03")
        term.type("echo after-$?\n")
        term.wait_for("after-130")
        term.type("exit\n")
        term.join()
        assert term.error is None, repr(term.error)
    finally:
        sbx.kill()
