"""pty: terminals through sbx.pty (create, send_stdin, resize, kill) and
the output the handle's wait() hands to on_pty."""

import threading
import time

import pytest

from e2b import CommandExitException, PtySize


class Terminal:
    """A PTY whose output a thread collects through handle.wait(on_pty=...)."""

    def __init__(self, sandbox, size, **kwargs):
        self.sandbox = sandbox
        self.handle = sandbox.pty.create(size, **kwargs)
        self.pid = self.handle.pid
        self._lock = threading.Lock()
        self._output = b""
        self.result = None
        self.error = None
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _on_pty(self, chunk):
        assert isinstance(chunk, bytes), type(chunk)
        with self._lock:
            self._output += chunk

    def _wait(self):
        try:
            self.result = self.handle.wait(on_pty=self._on_pty)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    @property
    def output(self):
        with self._lock:
            return self._output.decode("utf-8", "replace")

    def type(self, text):
        self.sandbox.pty.send_stdin(self.pid, text.encode())

    def wait_for(self, needle, seconds=15):
        """Waits until the output shows `needle`; returns the output."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if needle in self.output:
                return self.output
            time.sleep(0.05)
        pytest.fail(f"the terminal never showed {needle!r}; it showed {self.output!r}")

    def join(self, seconds=15):
        self._thread.join(seconds)
        assert not self._thread.is_alive(), f"wait() still running; output {self.output!r}"


def test_pty_echo_resize_and_exit(sandbox):
    term = Terminal(sandbox, PtySize(rows=24, cols=80), timeout=60)
    assert term.pid > 0
    # A process on a terminal: the typed line echoes, the shell answers.
    term.type("echo hi-$((40+2))\n")
    term.wait_for("hi-42\r\n")
    term.type("stty size\n")
    term.wait_for("24 80\r\n")
    sandbox.pty.resize(term.pid, PtySize(rows=30, cols=100))
    term.type("stty size; tty\n")
    term.wait_for("30 100\r\n")
    term.wait_for("/dev/pts/")
    term.type("exit\n")
    term.join()
    assert term.error is None, repr(term.error)
    assert term.result.exit_code == 0
    # A terminal's output is not stdout or stderr.
    assert term.result.stdout == ""
    assert term.result.stderr == ""


def test_pty_cwd_envs_user_and_exit_code(sandbox):
    term = Terminal(
        sandbox,
        PtySize(rows=24, cols=80),
        cwd="/tmp",
        envs={"GREETING": "hello there"},
        user="root",
    )
    term.type('echo "[$GREETING|$(pwd)|$(id -u)|$TERM]"; exit 5\n')
    term.wait_for("[hello there|/tmp|0|xterm-256color]")
    term.join()
    assert isinstance(term.error, CommandExitException), repr(term.error)
    assert term.error.exit_code == 5


def test_pty_ctrl_c_ctrl_backslash_and_ctrl_z_signal_the_foreground_command(sandbox):
    term = Terminal(sandbox, PtySize(rows=24, cols=80), timeout=120)
    term.type("echo ready\n")
    term.wait_for("ready\r\n")
    # ^C: SIGINT ends the command, not the shell (bash exits 128+2).
    term.type("sleep 60\n")
    time.sleep(1)
    term.type("\x03")
    term.type("echo after-int-$?\n")
    term.wait_for("after-int-130", seconds=20)
    # ^\\: SIGQUIT (128+3).
    term.type("sleep 60\n")
    time.sleep(1)
    term.type("\x1c")
    term.type("echo after-quit-$?\n")
    term.wait_for("after-quit-131", seconds=20)
    # ^Z stops it (128+20); the shell's job control still has it.
    term.type("sleep 60\n")
    time.sleep(1)
    term.type("\x1a")
    term.type("echo after-stop-$?; kill -9 %1; wait; echo jobs-done\n")
    term.wait_for("after-stop-148", seconds=20)
    term.wait_for("jobs-done", seconds=20)
    # A ^C with no foreground command leaves the shell alive.
    term.type("\x03")
    term.type("echo still-$((6*7))\n")
    term.wait_for("still-42", seconds=20)
    # A program that turned ISIG off reads ^C as a byte.
    term.type("stty -isig -icanon min 1; head -c 1 | od -An -tx1; stty sane\n")
    time.sleep(1)
    term.type("\x03")
    term.wait_for(" 03", seconds=20)
    term.type("exit\n")
    term.join()
    assert term.error is None, repr(term.error)


def test_pty_kill(sandbox):
    term = Terminal(sandbox, PtySize(rows=24, cols=80))
    term.type("echo ready\n")
    term.wait_for("ready\r\n")
    assert sandbox.pty.kill(term.pid) is True
    term.join()
    assert isinstance(term.error, CommandExitException), repr(term.error)
    assert term.error.exit_code != 0
    # It is gone: a second kill finds nothing.
    assert sandbox.pty.kill(term.pid) is False
