"""Shared fixtures for the e2b SDK suite against a real airlock daemon.

The harness (crates/airlock/tests/e2b_sdk.rs) sets, and the SDK reads:

    E2B_API_URL      the daemon's URL (control plane)
    E2B_SANDBOX_URL  the same URL (envd and the code interpreter, told apart
                     by the E2b-Sandbox-Id / E2b-Sandbox-Port headers)
    E2B_API_KEY      an airlock key

Nothing else: that the unmodified SDK works with only these is the point.
Every test file runs alone (`pytest tests/e2b/test_files.py`). Every sandbox
a test creates is killed when it ends, whatever happened. A test that runs
longer than its deadline (default 90 s, `@pytest.mark.deadline(S)` to
change) fails instead of hanging the run.
"""

import importlib.metadata
import inspect
import os
import pathlib
import sys
import time
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "common"))
from deadlines import deadline_fixture  # noqa: E402
from packaging.version import Version

from e2b import AsyncSandbox, Sandbox

E2B_VERSION = Version(importlib.metadata.version("e2b"))

# A sandbox lives this long unless a test says otherwise: long enough for any
# test, short enough that a leak cleans itself up.
SANDBOX_TIMEOUT = 120
DEFAULT_DEADLINE = 90

for name in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
    if not os.environ.get(name):
        raise pytest.UsageError(
            f"{name} is not set: run this suite through "
            "`cargo test -p airlock --test e2b_sdk`, which starts a daemon"
        )
if os.environ.get("E2B_DEBUG", "").lower() == "true":
    # In debug mode the SDK skips kill and set_timeout without a request.
    raise pytest.UsageError("E2B_DEBUG must not be true for this suite")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "deadline(seconds): fail the test if it runs longer"
    )


def pytest_report_header(config):
    return (
        f"e2b {E2B_VERSION}, E2B_API_URL={os.environ['E2B_API_URL']}, "
        f"E2B_SANDBOX_URL={os.environ['E2B_SANDBOX_URL']}"
    )


deadline = deadline_fixture(DEFAULT_DEADLINE)


@pytest.fixture
def tag():
    """A value unique to this test, for metadata filters."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def make_sandbox():
    """Creates sandboxes (Sandbox.create(**kwargs)); kills them all at the end."""
    created = []

    def make(**kwargs):
        kwargs.setdefault("timeout", SANDBOX_TIMEOUT)
        sbx = Sandbox.create(**kwargs)
        created.append(sbx.sandbox_id)
        return sbx

    # Sandboxes made another way (e.g. beta_create) are killed too.
    make.created = created
    yield make
    for sandbox_id in created:
        try:
            Sandbox.kill(sandbox_id)
        except Exception:
            pass


@pytest.fixture
def sandbox(make_sandbox):
    """One sandbox of the `base` template, killed at the end."""
    return make_sandbox(template="base")


@pytest.fixture
def make_async_sandbox():
    """Like make_sandbox, for AsyncSandbox (the kill is synchronous)."""
    created = []

    async def make(**kwargs):
        kwargs.setdefault("timeout", SANDBOX_TIMEOUT)
        sbx = await AsyncSandbox.create(**kwargs)
        created.append(sbx.sandbox_id)
        return sbx

    yield make
    for sandbox_id in created:
        try:
            Sandbox.kill(sandbox_id)
        except Exception:
            pass


def gone_errors():
    """What the SDK raises for a call into a sandbox that no longer exists:
    its not-found error, and (for calls into the sandbox, answered like e2b's
    proxy with a 502) SandboxNotRunningException in newer SDKs, a
    TimeoutException ("the sandbox timed out") in older ones."""
    import e2b

    errors = [e2b.NotFoundException]
    errors.append(getattr(e2b, "SandboxNotRunningException", e2b.TimeoutException))
    return tuple(errors)


def within(seconds, fn, *args, **kwargs):
    """Runs fn in a thread; its result, or the exception it raised. Fails if
    it is still running after `seconds` (the call would hang)."""
    import threading

    outcome = {}

    def target():
        try:
            outcome["result"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still running after {seconds}s: a hang")
    return outcome.get("result"), outcome.get("error")


def pause(sbx):
    """`pause()` (newer SDKs) or `beta_pause()` (older ones)."""
    method = getattr(sbx, "pause", None) or getattr(sbx, "beta_pause")
    return method()


def list_all(query=None, limit=None):
    """Every sandbox Sandbox.list(query) returns, following x-next-token."""
    paginator = Sandbox.list(query=query, limit=limit)
    items = []
    pages = 0
    while paginator.has_next:
        items.extend(paginator.next_items())
        pages += 1
        assert pages < 1000, "pagination does not end"
    return items, pages


def has_lifecycle():
    return "lifecycle" in inspect.signature(Sandbox.create).parameters


def wait_state(sandbox_id, state, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        info = Sandbox.get_info(sandbox_id)
        if info.state == state:
            return info
        time.sleep(0.2)
    raise AssertionError(f"{sandbox_id} did not become {state}: {info.state}")
