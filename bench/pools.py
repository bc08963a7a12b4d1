#!/usr/bin/env python3
"""Benchmark of warm pools (issue 14), in one run against one daemon:

- per tier, create + first exec("true") through the API, p50/p99, with a
  ready pool member claimed each time (the pool refilled between cycles),
  against the same create + exec of a cold sandbox (no pool) in the same
  run: the claim's ratio to a cold start;
- the sustained create + exec("true") + delete rate of C client threads
  for a few seconds, with a pool and without, and the share of creates the
  pool served (the rest found it empty: a pool serves bursts; under a
  sustained flood every claimed member must be replaced by a start, so the
  tier's start rate bounds both).

Target: claim -> first exec p50 <= 5 ms; >= 300 create+exec+destroy/s with
a pool on two cores. Needs root, runsc and runc (./scripts/deps). Usage:
    python3 bench/pools.py [--airlock PATH] [-n 30] [--seconds 5] [--json]
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import ApiError, Client, default_airlock, summary, verdict  # noqa: E402
from templates import Daemon  # noqa: E402

TARGET_CLAIM_MS = 5.0
TARGET_RATE = 300.0
TIERS = ("process", "oci", "gvisor")


def put_pool(client, name, body):
    status, payload = client._request("PUT", f"/v1/pools/{name}", body)
    if status != 200:
        raise ApiError(f"PUT pool {name}", status, payload)


def pool(client, name):
    return json.loads(client.get(f"/v1/pools/{name}"))


def drop_pool(client, name):
    client._request("DELETE", f"/v1/pools/{name}")


def wait_ready(client, name, ready, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        view = pool(client, name)
        if view["ready"] >= ready:
            return view
        time.sleep(0.01)
    raise SystemExit(f"pool {name} never had {ready} ready: {view}")


def cycles(client, tier, n, name=None):
    """n sequential create + first exec, deleted after; with `name`, each
    create claims a member of that pool (waited for)."""
    create, first, total = [], [], []
    for i in range(n + 2):
        if name:
            wait_ready(client, name, 1)
        t0 = time.monotonic()
        sid = client.create({"tier": tier})
        t1 = time.monotonic()
        client.exec_true(sid)
        t2 = time.monotonic()
        client.delete(sid)
        if i >= 2:  # warm-up
            create.append(t1 - t0)
            first.append(t2 - t1)
            total.append(t2 - t0)
    return {"create": summary(create), "first_exec": summary(first), "total": summary(total)}


def sustained(daemon, tier, threads, seconds):
    """create + exec + delete by `threads` clients for `seconds`: per second."""
    done = [0] * threads
    errors = []
    stop = time.monotonic() + seconds

    def work(i):
        client = Client(daemon)
        try:
            while time.monotonic() < stop:
                sid = client.create({"tier": tier})
                client.exec_true(sid)
                client.delete(sid)
                done[i] += 1
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))
        finally:
            client.close()

    t0 = time.monotonic()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise SystemExit(f"sustained {tier}: {errors[0]}")
    return sum(done) / (time.monotonic() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=30, help="cycles per tier and mode")
    parser.add_argument("--seconds", type=float, default=5.0, help="of each sustained run")
    parser.add_argument("--threads", type=int, default=8, help="clients of a sustained run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/pools.py needs root (sandboxes, cgroups)")
    daemon = Daemon(args.airlock)
    res = {"n": args.n, "threads": args.threads, "seconds": args.seconds, "tiers": {}}
    try:
        client = Client(daemon)
        for tier in TIERS:
            cold = cycles(client, tier, args.n)
            name = f"bench-{tier}"
            put_pool(client, name, {"template": "host", "tier": tier,
                                    "min_ready": 4, "max": 16, "refill": 4})
            wait_ready(client, name, 4)
            warm = cycles(client, tier, args.n, name)
            drop_pool(client, name)
            rate_cold = sustained(daemon, tier, args.threads, args.seconds)
            put_pool(client, name, {"template": "host", "tier": tier,
                                    "min_ready": 16, "max": 16, "refill": 4})
            wait_ready(client, name, 16)
            before = pool(client, name)
            rate_pool = sustained(daemon, tier, args.threads, args.seconds)
            after = pool(client, name)
            claims = after["claims"] - before["claims"]
            misses = after["misses"] - before["misses"]
            drop_pool(client, name)
            res["tiers"][tier] = {
                "cold": cold, "warm": warm,
                "rate_cold": rate_cold, "rate_pool": rate_pool,
                "served": claims / max(claims + misses, 1),
            }
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock warm pool benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n},"
          f" {args.threads} clients for {args.seconds:.0f} s)")
    for tier, r in res["tiers"].items():
        warm, cold = r["warm"]["total"]["p50_ms"], r["cold"]["total"]["p50_ms"]
        print(f"  {tier:<8} create+first exec p50: claimed {warm:6.2f} ms"
              f" (create {r['warm']['create']['p50_ms']:5.2f} + exec"
              f" {r['warm']['first_exec']['p50_ms']:5.2f}; p99 {r['warm']['total']['p99_ms']:6.2f})"
              f"  cold {cold:7.2f} ms  claimed/cold x{warm / max(cold, 1e-6):.2f}"
              f"  (target <= {TARGET_CLAIM_MS:.0f} ms) {verdict(warm <= TARGET_CLAIM_MS)}")
        print(f"  {tier:<8} sustained create+exec+delete: with pool {r['rate_pool']:6.1f}/s"
              f" ({r['served'] * 100:.0f}% claimed)  without {r['rate_cold']:6.1f}/s"
              f"  x{r['rate_pool'] / max(r['rate_cold'], 1e-6):.2f}"
              f"  (target >= {TARGET_RATE:.0f}/s) {verdict(r['rate_pool'] >= TARGET_RATE)}")


if __name__ == "__main__":
    main()
