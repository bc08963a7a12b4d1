#!/usr/bin/env python3
"""Benchmark of snapshots and forks (issue 14), in one run against one
daemon, per tier, on a busybox template (bench/templates.py's image):

- a snapshot of a sandbox that wrote 32 MiB of mixed files (half zeros,
  half random): its changes' tar (raw) against its zstd archive, and the
  time to take it; the time to create a sandbox from it and run its first
  exec, against the same from the template (the raw peer);
- a fork of a parent holding 200 MiB of RAM (a process's buffer) into
  N = 1 and 10 children: the
  latency per child, and the host memory each child adds (the PSS of
  its supervisor and every process in its cgroup), against the parent's.
  No tier here forks memory: children start fresh processes on the
  parent's files, so a child costs an idle sandbox, not the parent's RAM.

Needs root, busybox-static, runsc and runc (./scripts/deps). Usage:
    python3 bench/snapshots.py [--airlock PATH] [-n 10] [--json]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import ApiError, Client, cgroup_memory, default_airlock, mem_kib, summary  # noqa: E402
from templates import Daemon, import_busybox  # noqa: E402

TIERS = ("process", "oci", "gvisor")
WRITE = ("mkdir -p /home/user && busybox head -c 16777216 /dev/zero > /home/user/zeros && "
         "busybox head -c 16777216 /dev/urandom > /home/user/random")
# dd fills a 200 MiB buffer, then blocks writing it to a pipe nobody reads.
HOLD = "busybox dd if=/dev/zero bs=209715200 count=1 2>/dev/null | busybox sleep 3600"


def post(client, path, body, want=(200, 201)):
    status, payload = client._request("POST", path, body)
    if status not in want:
        raise ApiError(path, status, payload)
    return json.loads(payload) if payload else {}


def sh(client, sid, script):
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec",
                                      {"cmd": "/bin/sh", "args": ["-c", script]})
    if status != 200 or b'"exit_code":0' not in payload:
        raise ApiError(f"exec {script}", status, payload)


def supervisor_of(sid):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"supervise" in args and sid.encode() in args:
            return int(pid)
    return None


def host_kib(sid):
    """PSS in KiB of the sandbox's supervisor and every process of its cgroup."""
    pids = set(cgroup_memory(sid)[2]) if cgroup_memory(sid) else set()
    sup = supervisor_of(sid)
    if sup:
        pids.add(sup)
    return sum((mem_kib(p)[1] or 0) for p in pids)


def first_exec(client, template, tier):
    t0 = time.monotonic()
    sid = client.create({"template": template, "tier": tier})
    client.exec_true(sid)
    took = time.monotonic() - t0
    client.delete(sid)
    return took


def per_tier(client, tier, n):
    parent = client.create({"template": "bb", "tier": tier, "limits": {"memory": "1G"}})
    sh(client, parent, WRITE)
    takes, sizes = [], None
    for i in range(n):
        t0 = time.monotonic()
        snap = post(client, f"/v1/sandboxes/{parent}/snapshots", {"name": f"s-{tier}"})
        takes.append(time.monotonic() - t0)
        sizes = (snap["tar_bytes"], snap["archive_bytes"], snap["took_ms"])
    restore = [first_exec(client, f"s-{tier}", tier) for _ in range(n)]
    cold = [first_exec(client, "bb", tier) for _ in range(n)]
    status, payload = client._request("POST", f"/v1/sandboxes/{parent}/exec", {
        "cmd": "/bin/sh", "args": ["-c", HOLD], "background": True})
    if status != 201:
        raise ApiError("exec", status, payload)
    deadline = time.monotonic() + 30
    while host_kib(parent) < 200 * 1024 and time.monotonic() < deadline:
        time.sleep(0.1)
    parent_kib = host_kib(parent)
    forks = {}
    for count in (1, 10):
        t0 = time.monotonic()
        answer = post(client, f"/v1/sandboxes/{parent}/fork", {"count": count})
        took = time.monotonic() - t0
        ids = [item["sandbox"]["id"] for item in answer["items"] if "sandbox" in item]
        if len(ids) != count:
            raise SystemExit(f"fork of {count} on {tier}: {answer}")
        for sid in ids:
            client.bench.track(sid)
            client.exec_true(sid)
        kib = [host_kib(sid) for sid in ids]
        forks[count] = {"per_child_ms": took * 1e3 / count, "child_kib": sum(kib) / count}
        for sid in ids:
            client.delete(sid)
    client.delete(parent)
    client._request("DELETE", f"/v1/snapshots/s-{tier}")
    return {"snapshot": summary(takes), "tar_bytes": sizes[0], "archive_bytes": sizes[1],
            "took_ms": sizes[2], "restore": summary(restore), "cold": summary(cold),
            "parent_kib": parent_kib, "forks": forks}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=10, help="snapshots and restores per tier")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/snapshots.py needs root (sandboxes, cgroups)")
    daemon = Daemon(args.airlock)
    try:
        import_busybox(daemon, args.airlock)
        client = Client(daemon)
        res = {"n": args.n, "tiers": {t: per_tier(client, t, args.n) for t in TIERS}}
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock snapshot and fork benchmark: {args.airlock} ({os.cpu_count()} cores,"
          f" n={args.n})")
    for tier, r in res["tiers"].items():
        ratio = r["archive_bytes"] / max(r["tar_bytes"], 1)
        print(f"  {tier:<8} snapshot of 32 MiB written: tar {r['tar_bytes'] / 2**20:6.1f} MiB,"
              f" zstd {r['archive_bytes'] / 2**20:6.1f} MiB ({ratio * 100:.0f}%),"
              f" taken in p50 {r['snapshot']['p50_ms']:6.1f} ms through the API"
              f" ({r['took_ms']} ms frozen)")
        print(f"  {tier:<8} create+first exec from it p50 {r['restore']['p50_ms']:6.1f} ms,"
              f" from the template {r['cold']['p50_ms']:6.1f} ms"
              f" (x{r['restore']['p50_ms'] / max(r['cold']['p50_ms'], 1e-6):.2f})")
        for count, f in r["forks"].items():
            print(f"  {tier:<8} fork of a 200 MiB parent into {count:>2}: {f['per_child_ms']:6.1f}"
                  f" ms per child, {f['child_kib'] / 1024:6.1f} MiB host memory per child"
                  f" (parent {r['parent_kib'] / 1024:6.1f} MiB;"
                  f" x{f['child_kib'] / max(r['parent_kib'], 1):.3f})")


if __name__ == "__main__":
    main()
