"""Shared fixtures for the AIO suite: DeerFlow's calls against a real airlock daemon.

DeerFlow (bytedance/deer-flow) asks a *provisioner* for one sandbox per
thread, then drives the *AIO sandbox API* at the URL it got back through
the `agent-sandbox` client. DeerFlow itself cannot be installed here (not on
PyPI, Python >= 3.12), so this suite replays its calls: the provisioner's
with `requests`, as its RemoteSandboxBackend sends them, and the sandbox's
with the unmodified `agent-sandbox` 0.0.30, as its AioSandbox does.

The harness (crates/airlock/tests/aio.rs) starts the daemon with
`--deerflow-base-dir` and sets:

    AIRLOCK_URL             the daemon's URL (the provisioner is on its port)
    AIRLOCK_API_KEY         an airlock API key (the admin's)
    AIRLOCK_OTHER_API_KEY   a second key, not an admin's
    AIRLOCK_DEERFLOW_BASE   the daemon's --deerflow-base-dir

Every test is independent: the sandboxes it creates are deleted when it
ends, whatever happened. A test that runs longer than its deadline
(default 90 s, `@pytest.mark.deadline(S)` to change) fails instead of
hanging the run.
"""

import hashlib
import os
import pathlib
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "common"))
from deadlines import deadline_fixture  # noqa: E402
import requests
from agent_sandbox import Sandbox
from agent_sandbox.core.api_error import ApiError

for name in (
    "AIRLOCK_URL",
    "AIRLOCK_API_KEY",
    "AIRLOCK_OTHER_API_KEY",
    "AIRLOCK_DEERFLOW_BASE",
):
    if not os.environ.get(name):
        raise pytest.UsageError(
            f"{name} is not set: run this suite through "
            "`cargo test -p airlock --test aio`, which starts a daemon"
        )

URL = os.environ["AIRLOCK_URL"].rstrip("/")
KEY = os.environ["AIRLOCK_API_KEY"]
OTHER_KEY = os.environ["AIRLOCK_OTHER_API_KEY"]
BASE = Path(os.environ["AIRLOCK_DEERFLOW_BASE"])

DEFAULT_DEADLINE = 90

# DeerFlow's timeouts for each provisioner call (RemoteSandboxBackend).
LIST_TIMEOUT = 10
GET_TIMEOUT = 10
CREATE_TIMEOUT = 30
DELETE_TIMEOUT = 15

# The AIO client's timeout. DeerFlow uses 600 s; a test must not wait that
# long for a call that hangs.
CLIENT_TIMEOUT = 60

# What the operator's DeerFlow keeps under its base directory: the public
# skills, which every sandbox sees read-only at /mnt/skills/public.
PUBLIC_SKILL = BASE / "skills_view" / "public" / "deep-research" / "SKILL.md"
PUBLIC_SKILL_TEXT = "---\nname: deep-research\n---\nResearch deeply.\n"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "deadline(seconds): fail the test if it runs longer"
    )
    # Before any sandbox exists, as a DeerFlow install has them.
    PUBLIC_SKILL.parent.mkdir(parents=True, exist_ok=True)
    PUBLIC_SKILL.write_text(PUBLIC_SKILL_TEXT)


def pytest_report_header(config):
    return f"AIRLOCK_URL={URL}, AIRLOCK_DEERFLOW_BASE={BASE}"


deadline = deadline_fixture(DEFAULT_DEADLINE)


def tag():
    """A value unique to this call, valid as a DeerFlow thread or user id."""
    return uuid.uuid4().hex[:12]


def thread_sandbox_id(user_id, thread_id):
    """The id DeerFlow gives a thread's sandbox: the first 16 hex digits of
    sha256("{user_id}:{thread_id}")."""
    return hashlib.sha256(f"{user_id}:{thread_id}".encode()).hexdigest()[:16]


def user_data(user_id, thread_id):
    """The host directory DeerFlow's gateway keeps a thread's
    /mnt/user-data in: {base}/users/{user}/threads/{thread}/user-data."""
    return BASE / "users" / user_id / "threads" / thread_id / "user-data"


class Provisioner:
    """The provisioner as DeerFlow's RemoteSandboxBackend calls it: `requests`,
    JSON, `X-API-Key`, no proxy. Every method returns the response; none
    raises on a status."""

    def __init__(self, key=KEY):
        self.http = requests.Session()
        # DeerFlow does not use a proxy for localhost and private addresses.
        self.http.trust_env = False
        if key is not None:
            self.http.headers["X-API-Key"] = key

    def list(self):
        return self.http.get(f"{URL}/api/sandboxes", timeout=LIST_TIMEOUT)

    def get(self, sandbox_id):
        return self.http.get(f"{URL}/api/sandboxes/{sandbox_id}", timeout=GET_TIMEOUT)

    def create(self, body):
        return self.http.post(f"{URL}/api/sandboxes", json=body, timeout=CREATE_TIMEOUT)

    def delete(self, sandbox_id):
        return self.http.delete(
            f"{URL}/api/sandboxes/{sandbox_id}", timeout=DELETE_TIMEOUT
        )

    def listed(self):
        """The sandboxes DeerFlow would adopt at start: {sandbox_id: entry}
        for the entries whose id and url are non-empty strings."""
        answer = self.list()
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["count"] == len(body["sandboxes"]), body
        return {
            entry["sandbox_id"]: entry
            for entry in body["sandboxes"]
            if isinstance(entry.get("sandbox_id"), str)
            and entry["sandbox_id"]
            and isinstance(entry.get("sandbox_url"), str)
            and entry["sandbox_url"]
        }


def create_body(sandbox_id, thread_id=None, user_id=None, extra_mounts=None):
    """The body DeerFlow posts to create a thread's sandbox."""
    body = {
        "sandbox_id": sandbox_id,
        "include_legacy_skills": False,
        "provision_lark_cli_runtime": False,
        "provision_lark_cli_broker": False,
    }
    if thread_id is not None:
        body["thread_id"] = thread_id
    if user_id is not None:
        body["user_id"] = user_id
    if extra_mounts:
        body["extra_mounts"] = extra_mounts
    return body


def client(sandbox_url):
    """The AIO client as DeerFlow builds it, without proxies and with a
    timeout a test can afford."""
    return Sandbox(
        base_url=sandbox_url,
        timeout=CLIENT_TIMEOUT,
        httpx_client=httpx.Client(trust_env=False, timeout=CLIENT_TIMEOUT),
    )


def probe(sandbox_url):
    """One readiness probe, as DeerFlow sends it: its HTTP status."""
    return requests.get(
        f"{sandbox_url}/v1/sandbox", timeout=5, proxies={"http": None, "https": None}
    ).status_code


def wait_ready(sandbox_url, limit=60):
    """DeerFlow's readiness wait: GET {url}/v1/sandbox each second until 200,
    at most `limit` seconds. The seconds it took."""
    started = time.monotonic()
    while True:
        try:
            if probe(sandbox_url) == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        if time.monotonic() - started > limit:
            raise AssertionError(f"{sandbox_url} not ready after {limit}s")
        time.sleep(1)


class Thread:
    """A DeerFlow thread's sandbox: its ids, URL, client and host directories."""

    def __init__(self, sandbox_id, thread_id, user_id, created):
        self.sandbox_id = sandbox_id
        self.thread_id = thread_id
        self.user_id = user_id
        self.created = created
        self.url = created["sandbox_url"]
        self.client = client(self.url)

    @property
    def host(self):
        """The host's /mnt/user-data of this thread."""
        return user_data(self.user_id, self.thread_id)

    def sh(self, command, **kwargs):
        """DeerFlow's bash tool: the command in the implicit shell session.
        The result's data (output, status, exit_code)."""
        kwargs.setdefault("no_change_timeout", 600)
        return self.client.shell.exec_command(command=command, **kwargs).data

    def out(self, command, **kwargs):
        """What DeerFlow's bash tool hands the model: the output, stripped
        (a terminal's CR LF line ends read as LF)."""
        output = self.sh(command, **kwargs).output or ""
        return output.replace("\r\n", "\n").strip()


@pytest.fixture
def provisioner():
    return Provisioner()


# make_thread's user_id default: a user of the test's own.
FRESH = object()


@pytest.fixture
def make_thread(provisioner):
    """Creates thread sandboxes as DeerFlow does (create, then the readiness
    wait); deletes them all at the end. Arguments: thread_id (a fresh one by
    default), user_id (a fresh one by default; None sends none, which is
    "default"), extra_mounts."""
    created = []

    def make(thread_id=None, user_id=FRESH, extra_mounts=None):
        thread_id = thread_id or f"thread-{tag()}"
        if user_id is FRESH:
            user_id = f"user-{tag()}"
        sandbox_id = thread_sandbox_id(user_id or "default", thread_id)
        created.append(sandbox_id)
        answer = provisioner.create(
            create_body(sandbox_id, thread_id, user_id, extra_mounts)
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        wait_ready(body["sandbox_url"])
        return Thread(sandbox_id, thread_id, user_id or "default", body)

    make.created = created
    yield make
    for sandbox_id in created:
        try:
            provisioner.delete(sandbox_id)
        except Exception:
            pass


@pytest.fixture
def thread(make_thread):
    """One thread's sandbox, deleted at the end."""
    return make_thread()


def api_error(call, *args, **kwargs):
    """The ApiError `call` raises (failing the test if it returns)."""
    with pytest.raises(ApiError) as raised:
        result = call(*args, **kwargs)
        # A generator (download_file) raises on its first item.
        if hasattr(result, "__next__"):
            b"".join(result)
    return raised.value


def download(sbx, path):
    """DeerFlow's download_file: the streamed bytes of `path`."""
    return b"".join(sbx.file.download_file(path=path))


def deerflow_glob_dirs(sbx, path, pattern):
    """DeerFlow's glob with include_dirs: list_path(recursive, no hidden),
    each entry's path relative to `path` matched by PurePosixPath.match,
    with a leading "**/" dropped as a fallback. The matching paths."""
    listed = sbx.file.list_path(path=path, recursive=True, show_hidden=False).data
    found = []
    for entry in listed.files or []:
        assert entry.path.startswith(path.rstrip("/") + "/"), entry.path
        relative = pathlib.PurePosixPath(entry.path[len(path.rstrip("/")) + 1 :])
        if relative.match(pattern) or (
            pattern.startswith("**/") and relative.match(pattern[3:])
        ):
            found.append(entry.path)
    return sorted(found)
