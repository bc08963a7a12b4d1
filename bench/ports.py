#!/usr/bin/env python3
"""Benchmark of sandbox ports reached from outside (issue 15), in one run
against one daemon, per tier:

- a small HTTP GET to a server inside the sandbox (tests/common/port_server.py)
  through the daemon (`/v1/sandboxes/ID/ports/PORT/`, one keep-alive
  connection to the daemon, the sandbox's access token), against the same
  request made from inside the sandbox on a fresh loopback connection each
  time (what the forwarder does inside): the added latency at p50, target
  <= 0.5 ms;
- throughput of a 64 MiB GET (the median of 5 each way), through the
  daemon against inside: target >= 0.8x.

Needs root. Usage:
    python3 bench/ports.py [--airlock PATH] [-n 300] [--tiers process,gvisor] [--json]
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import ApiError, BenchError, Client, default_airlock, summary, verdict  # noqa: E402
from templates import Daemon  # noqa: E402

TARGET_ADDED_MS = 0.5
TARGET_THROUGHPUT = 0.8
PORT = 8000
BIG = 64 << 20
# The big GET is timed this many times each way; the medians are compared.
BIG_ROUNDS = 5
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "common",
                      "port_server.py")

# Run inside the sandbox: N GETs on fresh loopback connections, then the big
# GET; prints the latencies and the big GET's time.
INSIDE = """
import http.client, json, sys, time
n, port, big = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200
    return body
lat = []
for i in range(n + 10):
    t0 = time.monotonic()
    get("/small")
    if i >= 10:
        lat.append(time.monotonic() - t0)
big_s = []
for _ in range(int(sys.argv[4])):
    t0 = time.monotonic()
    assert len(get(f"/bytes/{big}")) == big
    big_s.append(time.monotonic() - t0)
print(json.dumps({"lat": lat, "big_s": big_s}))
"""


def run_in(client, sid, args):
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec",
                                      {"cmd": "python3", "args": args, "timeout_s": 600})
    if status != 200:
        raise ApiError("exec", status, payload)
    out, code = "", None
    for line in payload.split(b"\n"):
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("type") == "stdout":
            out += event.get("data", "")
        elif event.get("type") == "exited":
            code = event.get("exit_code")
    if code != 0:
        raise BenchError(f"python3 {args}: exit {code}: {payload[-400:]!r}")
    return out


def put(client, sid, path, data):
    conn = http.client.HTTPConnection(client.bench.host, client.bench.port, timeout=60)
    conn.request("PUT", f"/v1/sandboxes/{sid}/files?path={path}", body=data,
                 headers={"X-API-Key": client.bench.key,
                          "Content-Type": "application/octet-stream"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    if resp.status >= 300:
        raise BenchError(f"upload {path}: {resp.status}")


def one_tier(daemon, tier, n):
    client = Client(daemon)
    status, payload = client._request("POST", "/v1/sandboxes", {"tier": tier, "timeout_s": 900})
    if status != 201:
        raise ApiError("create", status, payload)
    created = json.loads(payload)
    sid, token = created["id"], created["access_token"]
    daemon.track(sid)
    try:
        with open(SERVER, "rb") as f:
            put(client, sid, "/tmp/port_server.py", f.read())
        put(client, sid, "/tmp/inside.py", INSIDE.encode())
        status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec", {
            "cmd": "python3", "args": ["/tmp/port_server.py", str(PORT)], "background": True})
        if status != 201:
            raise ApiError("start the server", status, payload)
        conn = http.client.HTTPConnection(daemon.host, daemon.port, timeout=60)
        prefix = f"/v1/sandboxes/{sid}/ports/{PORT}"
        headers = {"X-Access-Token": token}

        def get(path):
            conn.request("GET", prefix + path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, body

        deadline = time.monotonic() + 30
        while get("/small")[0] != 200:
            if time.monotonic() > deadline:
                raise BenchError(f"{tier}: the server never answered through the daemon")
            time.sleep(0.05)
        inside = json.loads(run_in(client, sid, ["/tmp/inside.py", str(n), str(PORT), str(BIG),
                                                   str(BIG_ROUNDS)]))
        outside = []
        for i in range(n + 10):
            t0 = time.monotonic()
            status, _ = get("/small")
            if status != 200:
                raise BenchError(f"{tier}: GET through the daemon answered {status}")
            if i >= 10:
                outside.append(time.monotonic() - t0)
        big_s = []
        for _ in range(BIG_ROUNDS):
            t0 = time.monotonic()
            status, body = get(f"/bytes/{BIG}")
            big_s.append(time.monotonic() - t0)
            if status != 200 or len(body) != BIG:
                raise BenchError(f"{tier}: the big GET through the daemon failed ({status})")
        conn.close()
        return {"outside": summary(outside), "inside": summary(inside["lat"]),
                "outside_mib_s": BIG / statistics.median(big_s) / (1 << 20),
                "inside_mib_s": BIG / statistics.median(inside["big_s"]) / (1 << 20),
                "big_s": {"outside": big_s, "inside": inside["big_s"]}}
    finally:
        client.delete(sid)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=300, help="small GETs each way")
    parser.add_argument("--tiers", default="process,gvisor,oci")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/ports.py needs root (sandboxes, cgroups)")
    daemon = Daemon(args.airlock)
    try:
        res = {"n": args.n, "tiers": {t: one_tier(daemon, t, args.n)
                                      for t in args.tiers.split(",")}}
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock ports benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n})")
    for tier, r in res["tiers"].items():
        o, i = r["outside"], r["inside"]
        added = o["p50_ms"] - i["p50_ms"]
        ratio = r["outside_mib_s"] / max(r["inside_mib_s"], 1e-9)
        print(f"  {tier:8s} GET through the daemon p50 {o['p50_ms']:6.3f} ms p99 {o['p99_ms']:6.3f}"
              f"  inside p50 {i['p50_ms']:6.3f} ms p99 {i['p99_ms']:6.3f}"
              f"  added {added:+.3f} ms (target <= {TARGET_ADDED_MS} ms)"
              f" {verdict(added <= TARGET_ADDED_MS)}")
        print(f"  {tier:8s} 64 MiB GET through the daemon {r['outside_mib_s']:7.1f} MiB/s"
              f"  inside {r['inside_mib_s']:7.1f} MiB/s  ratio {ratio:.2f}x"
              f" (target >= {TARGET_THROUGHPUT}x) {verdict(ratio >= TARGET_THROUGHPUT)}")


if __name__ == "__main__":
    main()
