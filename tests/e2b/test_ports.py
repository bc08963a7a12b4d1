"""Ports from outside through the SDK (issue 15): `sbx.get_host(port)`
names `PORT-SANDBOXID.DOMAIN` under the daemon's `--sandbox-domain` (the
harness sets it), and the daemon's listener serves that host: HTTP and a
WebSocket to a server the sandbox runs, with the sandbox's traffic token,
refused without it and for another sandbox; `allow_public_traffic` opens
them to anyone. The harness has no wildcard DNS, so requests go to the
daemon's address with the host in `Host`, as a resolver would send them."""

import base64
import inspect
import json
import os
import pathlib
import socket
import time
import urllib.parse

import httpx
import pytest

from e2b import Sandbox

SERVER = (pathlib.Path(__file__).resolve().parent.parent / "common" / "port_server.py").read_text()
DAEMON = urllib.parse.urlsplit(os.environ["E2B_API_URL"])
# The domain the harness starts the daemon with.
DOMAIN = "sandboxes.airlock.test"


def credentials(sbx):
    """What opens the sandbox's ports: its traffic token where the SDK has
    it, else the API key."""
    token = getattr(sbx, "traffic_access_token", None)
    if token:
        return {"e2b-traffic-access-token": token}
    return {"X-API-Key": os.environ["E2B_API_KEY"]}


def start_server(sbx, port):
    sbx.files.write("/tmp/port_server.py", SERVER)
    sbx.commands.run(f"python3 /tmp/port_server.py {port}", background=True)
    host = sbx.get_host(port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = get(host, "/ready", credentials(sbx))
        if answer.status_code == 200:
            return host
        time.sleep(0.1)
    pytest.fail(f"the server on port {port} never answered: {answer.status_code} {answer.text}")


def get(host, path, headers):
    return httpx.get(
        f"{DAEMON.scheme}://{DAEMON.netloc}{path}", headers={"Host": host, **headers}, timeout=30
    )


def test_get_host_names_the_port_under_the_sandbox_domain(sandbox):
    assert sandbox.get_host(8000) == f"8000-{sandbox.sandbox_id}.{DOMAIN}"


def test_a_server_inside_answers_at_get_host(sandbox, make_sandbox):
    host = start_server(sandbox, 8000)
    answer = get(host, "/hello?x=1", {**credentials(sandbox), "X-App": "mine"})
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["path"] == "/hello?x=1"
    assert seen["headers"]["host"] == host
    assert seen["headers"]["x-app"] == "mine"
    # The token opened the port; the server never saw it.
    assert "e2b-traffic-access-token" not in seen["headers"]
    assert "x-api-key" not in seen["headers"]
    # A body, through the same host.
    body = os.urandom(100_000)
    posted = httpx.post(
        f"{DAEMON.scheme}://{DAEMON.netloc}/echo",
        headers={"Host": host, **credentials(sandbox)},
        content=body,
        timeout=30,
    )
    assert posted.status_code == 200 and posted.content == body

    # Without the token: refused, as e2b's proxy refuses a private sandbox.
    assert get(host, "/", {}).status_code == 401
    assert get(host, "/", {"e2b-traffic-access-token": "tt_wrong"}).status_code == 403
    # Another sandbox's token does not open it.
    other = make_sandbox(template="base")
    assert get(host, "/", credentials(other)).status_code == 403
    # A port nothing listens on.
    closed = get(sandbox.get_host(8001), "/", credentials(sandbox))
    assert closed.status_code == 502 and "port 8001" in closed.text


def test_a_websocket_inside_echoes_at_get_host(sandbox):
    host = start_server(sandbox, 8765)
    with socket.create_connection((DAEMON.hostname, DAEMON.port), timeout=30) as conn:
        key = base64.b64encode(os.urandom(16)).decode()
        auth = "".join(f"{k}: {v}\r\n" for k, v in credentials(sandbox).items())
        conn.sendall(
            (
                f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
            ).encode()
        )
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += conn.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        message = b"hello over the port"
        mask = os.urandom(4)
        conn.sendall(
            bytes([0x81, 0x80 | len(message)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(message))
        )
        header = conn.recv(2)
        payload = b""
        while len(payload) < header[1]:
            payload += conn.recv(header[1] - len(payload))
        assert payload == b"echo: " + message


@pytest.mark.skipif(
    "network" not in inspect.signature(Sandbox.create).parameters,
    reason="this SDK release has no network options",
)
def test_public_traffic_opens_the_ports_to_anyone(make_sandbox):
    sbx = make_sandbox(template="base", network={"allow_public_traffic": True})
    host = start_server(sbx, 8080)
    answer = get(host, "/open", {})
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.text)["path"] == "/open"


@pytest.mark.skipif(
    "network" not in inspect.signature(Sandbox.create).parameters,
    reason="this SDK release has no network options",
)
def test_mask_request_host_is_the_host_the_server_sees(make_sandbox):
    sbx = make_sandbox(template="base", network={"mask_request_host": "localhost:${PORT}"})
    host = start_server(sbx, 3000)
    seen = get(host, "/", credentials(sbx)).json()
    assert seen["headers"]["host"] == "localhost:3000"
