"""commands: run (output, exit codes, envs, cwd, user), background runs,
timeouts, stdin, list, kill, connect."""

import time

import pytest

from e2b import CommandExitException, TimeoutException


def test_run_stdout_stderr_exit_code(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2")
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0


def test_run_callbacks(sandbox):
    out, err = [], []
    sandbox.commands.run(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "o1\no2\no3\n"
    assert "".join(err) == "e1\ne2\ne3\n"


def test_nonzero_exit_raises(sandbox):
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert raised.value.exit_code == 3
    assert raised.value.stdout == "partial\n"
    assert raised.value.stderr == "bad\n"


def test_command_not_found_raises(sandbox):
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("definitely-not-a-command-xyz")
    assert raised.value.exit_code == 127


def test_envs(sandbox):
    result = sandbox.commands.run(
        'echo "$A|$B"', envs={"A": "one", "B": "two words"}
    )
    assert result.stdout == "one|two words\n"


def test_cwd(sandbox):
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_user_root_and_user(sandbox):
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    assert sandbox.commands.run("whoami", user="user").stdout == "user\n"
    assert sandbox.commands.run("whoami").stdout == "user\n"
    # root may write where user may not.
    sandbox.commands.run("touch /tmp/root-only && chmod 600 /tmp/root-only", user="root")
    with pytest.raises(CommandExitException):
        sandbox.commands.run("cat /tmp/root-only && echo x > /tmp/root-only", user="user")


def test_background_wait(sandbox):
    handle = sandbox.commands.run("sleep 1; echo done", background=True)
    assert handle.pid > 0
    result = handle.wait()
    assert result.stdout == "done\n"
    assert result.exit_code == 0


def test_background_kill(sandbox):
    handle = sandbox.commands.run("sleep 600", background=True)
    time.sleep(0.2)
    assert handle.kill() is True
    with pytest.raises(CommandExitException):
        handle.wait()


def test_background_nonzero_exit(sandbox):
    handle = sandbox.commands.run("exit 5", background=True)
    with pytest.raises(CommandExitException) as raised:
        handle.wait()
    assert raised.value.exit_code == 5


@pytest.mark.deadline(30)
def test_timeout(sandbox):
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 60", timeout=2)
    assert time.monotonic() - started < 15
    # The sandbox is still usable.
    assert sandbox.commands.run("echo ok").stdout == "ok\n"


def test_send_stdin(sandbox):
    handle = sandbox.commands.run("head -n 2", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "first\n")
    sandbox.commands.send_stdin(handle.pid, "second\n")
    result = handle.wait()
    assert result.stdout == "first\nsecond\n"


def test_list(sandbox):
    handle = sandbox.commands.run("sleep 600", background=True)
    try:
        processes = sandbox.commands.list()
        mine = [p for p in processes if p.pid == handle.pid]
        assert len(mine) == 1, processes
        assert "sleep 600" in " ".join([mine[0].cmd] + list(mine[0].args))
    finally:
        handle.kill()


def test_kill_by_pid(sandbox):
    handle = sandbox.commands.run("sleep 600", background=True)
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert all(p.pid != handle.pid for p in sandbox.commands.list())
    # An unknown pid: False, not an error.
    assert sandbox.commands.kill(999999) is False


def test_connect_to_running_command(sandbox):
    handle = sandbox.commands.run(
        "sleep 1; echo from-background", background=True
    )
    other = sandbox.commands.connect(handle.pid)
    result = other.wait()
    assert "from-background" in result.stdout


def test_connect_streams_only_what_follows(sandbox):
    from e2b import NotFoundException

    handle = sandbox.commands.run(
        "echo before; read line; echo after-$line", background=True, stdin=True
    )
    # `before` is out before we connect.
    time.sleep(0.5)
    other = sandbox.commands.connect(handle.pid)
    sandbox.commands.send_stdin(handle.pid, "x\n")
    result = other.wait()
    assert result.stdout == "after-x\n"
    # An ended process is not there to connect to, as in envd.
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(handle.pid)
