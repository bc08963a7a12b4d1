#!/usr/bin/env python3
"""Benchmark of the AIO dialect (issue 15), in one run against one daemon:

- DeerFlow's provisioner create (`POST /api/sandboxes`, which answers once
  the sandbox is `Running`) + its readiness probe (`GET {url}/v1/sandbox`)
  p50/p99, against the native API's create + first exec of `true` on the
  same daemon (the raw peer: the same sandbox without the dialect);
  target <= 20 ms on the process tier (DeerFlow users report 3.7 s for
  the AIO container's cold start);
- the AIO shell exec round trip (`POST {url}/v1/shell/exec` of `true` in
  the implicit session) p50/p99, against the native exec of `true`;
  target <= 3 ms.

Needs root. Usage:
    python3 bench/aio.py [--airlock PATH] [-n 50] [--json]
"""

import argparse
import json
import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import ApiError, Client, default_airlock, summary, verdict  # noqa: E402
from templates import Daemon  # noqa: E402

TARGET_CREATE_MS = 20.0
TARGET_EXEC_MS = 3.0


def provisioned(client, n):
    """Provisioner create + readiness, then shell exec round trips."""
    create, rtt, urls = [], [], []
    for i in range(n + 2):
        t0 = time.monotonic()
        status, payload = client._request("POST", "/api/sandboxes", {
            "sandbox_id": f"bench{os.getpid()}x{i}", "thread_id": f"t{i}"})
        if status != 200:
            raise ApiError("provisioner create", status, payload)
        url = urllib.parse.urlsplit(json.loads(payload)["sandbox_url"]).path
        status, payload = client._request("GET", f"{url}/v1/sandbox")
        if status != 200:
            raise ApiError("readiness", status, payload)
        t1 = time.monotonic()
        if i >= 2:
            create.append(t1 - t0)
        urls.append((f"bench{os.getpid()}x{i}", url))
    sid, url = urls[-1]
    for i in range(n + 5):
        t0 = time.monotonic()
        status, payload = client._request("POST", f"{url}/v1/shell/exec", {"command": "true"})
        t1 = time.monotonic()
        if status != 200 or json.loads(payload)["data"]["status"] != "completed":
            raise ApiError("shell exec", status, payload)
        if i >= 5:
            rtt.append(t1 - t0)
    for sid, _ in urls:
        client._request("DELETE", f"/api/sandboxes/{sid}")
    return {"create_ready": summary(create), "shell_exec": summary(rtt)}


def native(client, n):
    """The raw peer: native create + first exec, then exec round trips."""
    create, rtt = [], []
    for i in range(n + 2):
        t0 = time.monotonic()
        sid = client.create({})
        client.exec_true(sid)
        t1 = time.monotonic()
        if i >= 2:
            create.append(t1 - t0)
        if i < n + 1:
            client.delete(sid)
    for i in range(n + 5):
        t0 = time.monotonic()
        client.exec_true(sid)
        t1 = time.monotonic()
        if i >= 5:
            rtt.append(t1 - t0)
    client.delete(sid)
    return {"create_first_exec": summary(create), "exec": summary(rtt)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=50, help="creates and execs of each kind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/aio.py needs root (sandboxes, cgroups)")
    daemon = Daemon(args.airlock)
    try:
        client = Client(daemon)
        res = {"n": args.n, "aio": provisioned(client, args.n), "native": native(client, args.n)}
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    a, r = res["aio"], res["native"]
    create, peer = a["create_ready"]["p50_ms"], r["create_first_exec"]["p50_ms"]
    rtt, peer_rtt = a["shell_exec"]["p50_ms"], r["exec"]["p50_ms"]
    print(f"airlock AIO benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n}, process tier)")
    print(f"  provisioner create + readiness p50 {create:7.2f} ms p99 {a['create_ready']['p99_ms']:7.2f}"
          f"  native create + first exec p50 {peer:7.2f} ms  ratio {create / max(peer, 1e-6):.2f}x"
          f"  (target <= {TARGET_CREATE_MS:.0f} ms) {verdict(create <= TARGET_CREATE_MS)}")
    print(f"  shell exec round trip p50 {rtt:7.2f} ms p99 {a['shell_exec']['p99_ms']:7.2f}"
          f"  native exec p50 {peer_rtt:7.2f} ms  ratio {rtt / max(peer_rtt, 1e-6):.2f}x"
          f"  (target <= {TARGET_EXEC_MS:.0f} ms) {verdict(rtt <= TARGET_EXEC_MS)}")


if __name__ == "__main__":
    main()
