"""Failures: a sandbox killed under a running command, calls on a killed
sandbox, a command whose sandbox times out. Each must end with an error,
quickly, never hang (calls run in a thread with a time limit)."""

import threading
import time

from conftest import gone_errors, within
from e2b import CommandExitException, NotFoundException, Sandbox


def test_kill_mid_command_ends_with_an_error(sandbox):
    killer = threading.Timer(1.0, Sandbox.kill, args=(sandbox.sandbox_id,))
    killer.start()
    started = time.monotonic()
    result, error = within(30, sandbox.commands.run, "sleep 600")
    killer.join()
    assert error is not None, f"the command 'succeeded' in a killed sandbox: {result}"
    assert time.monotonic() - started < 20
    # Not a clean exit: an error (a gone sandbox, a dropped stream, or the
    # command killed under it).
    if isinstance(error, CommandExitException):
        assert error.exit_code != 0


def test_kill_mid_background_command_ends_wait(sandbox):
    handle = sandbox.commands.run("sleep 600", background=True)
    time.sleep(0.3)
    Sandbox.kill(sandbox.sandbox_id)
    result, error = within(30, handle.wait)
    assert error is not None, f"wait() 'succeeded' in a killed sandbox: {result}"


def test_kill_mid_stream_output(sandbox):
    seen = []
    killer = threading.Timer(1.5, Sandbox.kill, args=(sandbox.sandbox_id,))
    killer.start()
    _, error = within(
        30,
        sandbox.commands.run,
        "while true; do echo tick; sleep 0.1; done",
        on_stdout=seen.append,
    )
    killer.join()
    assert error is not None
    assert seen, "no output streamed before the kill"


def test_calls_on_a_killed_sandbox_are_not_found(make_sandbox):
    sbx = make_sandbox()
    sbx.files.write("/home/user/x.txt", "x")
    sbx.kill()
    gone = gone_errors()
    for name, call in [
        ("commands.run", lambda: sbx.commands.run("echo hi")),
        ("files.read", lambda: sbx.files.read("/home/user/x.txt")),
        ("files.write", lambda: sbx.files.write("/home/user/y.txt", "y")),
        ("files.list", lambda: sbx.files.list("/home/user")),
        ("commands.list", lambda: sbx.commands.list()),
    ]:
        result, error = within(30, call)
        assert error is not None, f"{name} on a killed sandbox returned {result!r}"
        assert isinstance(error, gone), f"{name}: {type(error).__name__}: {error}"
    for name, call in [
        ("get_info", lambda: sbx.get_info()),
        ("set_timeout", lambda: sbx.set_timeout(60)),
        ("connect", lambda: Sandbox.connect(sbx.sandbox_id)),
    ]:
        result, error = within(30, call)
        assert isinstance(error, NotFoundException), f"{name}: {type(error).__name__}: {error}"


def test_sandbox_timeout_ends_a_running_command(make_sandbox):
    sbx = make_sandbox(timeout=3)
    started = time.monotonic()
    _, error = within(45, sbx.commands.run, "sleep 600")
    assert error is not None
    assert time.monotonic() - started < 40
    _, error = within(30, Sandbox.get_info, sbx.sandbox_id)
    assert isinstance(error, NotFoundException), f"{type(error).__name__}: {error}"
