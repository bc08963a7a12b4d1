#!/usr/bin/env python3
"""Benchmark of pause and resume (issue 14), in one run against one daemon:

- per tier, `POST /v1/sandboxes/{id}/pause` and `/resume` through the API
  on a sandbox running a busy process, and the first exec after a resume,
  p50/p99;
- the raw peer: the same cgroup v1 freezer written by hand (FROZEN, wait,
  THAWED) around a shell of the same busy loop in a cgroup of its own;
- gvisor's pause that saves the sandbox's memory to disk (`runsc
  checkpoint`, the daemon's default there: a paused sandbox holds no RAM)
  and the resume that restores it, with a python3 process holding 64 MiB,
  p50/p99, against a cold create + first exec on the same tier, and the
  host memory (PSS) the sandbox holds running and paused;
- per tier, a pause keeping only the files (`mode: filesystem`) of a
  sandbox of a busybox template that wrote 1 MiB before the first
  (warm-up) cycle (later cycles freeze only what changed since their
  resume), and the resume that boots it again with its first exec,
  against a cold create + first exec of the same template (the raw peer
  of a boot).

Target: resume <= 20 ms at p50 on every tier, from the freezer (the tier
rows run a daemon serving `--gvisor-pause freeze`). Needs root, runsc and runc
(./scripts/deps). Usage:
    python3 bench/pause.py [--airlock PATH] [-n 30] [--json]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import ApiError, Client, default_airlock, summary, verdict  # noqa: E402
from templates import Daemon, import_busybox  # noqa: E402

TARGET_RESUME_MS = 20.0
FREEZER = "/sys/fs/cgroup/freezer"
BUSY = "while :; do :; done"


def call(client, path, body=None):
    status, payload = client._request("POST", path, body)
    if status != 200:
        raise ApiError(path, status, payload)


def tier_cycles(client, tier, n):
    sid = client.create({"tier": tier})
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec", {
        "cmd": "/bin/sh", "args": ["-c", BUSY], "background": True})
    if status != 201:
        raise ApiError("exec", status, payload)
    pause, resume, first = [], [], []
    for i in range(n + 2):
        t0 = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/pause")
        t1 = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/resume")
        t2 = time.monotonic()
        client.exec_true(sid)
        t3 = time.monotonic()
        if i >= 2:  # warm-up
            pause.append(t1 - t0)
            resume.append(t2 - t1)
            first.append(t3 - t2)
    client.delete(sid)
    return {"pause": summary(pause), "resume": summary(resume), "first_exec": summary(first)}


def cold_start(client, body):
    """Seconds of a cold create + first exec (the sandbox is deleted after)."""
    t0 = time.monotonic()
    other = client.create(body)
    client.exec_true(other)
    took = time.monotonic() - t0
    client.delete(other)
    return took


def files_only_cycles(client, tier, n):
    """Files-only pause, then resume + first exec, against cold create +
    first exec of the same template."""
    sid = client.create({"template": "bb", "tier": tier})
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec", {
        "cmd": "/bin/sh", "args": ["-c", "busybox head -c 1048576 /dev/urandom > /tmp/data"]})
    if status != 200:
        raise ApiError("exec", status, payload)
    pause, boot, cold = [], [], []
    for i in range(n + 2):
        t0 = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/pause", {"mode": "filesystem"})
        t1 = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/resume")
        client.exec_true(sid)
        t2 = time.monotonic()
        t3 = t2 + cold_start(client, {"template": "bb", "tier": tier})
        if i >= 2:
            pause.append(t1 - t0)
            boot.append(t2 - t1)
            cold.append(t3 - t2)
    client.delete(sid)
    return {"pause": summary(pause), "resume_first_exec": summary(boot),
            "cold_first_exec": summary(cold)}


HOLD = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(3600)"


def pss_of_cgroup(sid):
    """PSS in bytes of every process in the sandbox's cgroup (0 when none)."""
    total = 0
    procs = os.path.join(FREEZER, "airlock", sid, "cgroup.procs")
    try:
        with open(procs) as f:
            pids = [p.strip() for p in f if p.strip()]
    except OSError:
        return 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def checkpoint_cycles(client, n):
    """gvisor: pause saving memory to disk, resume restoring it, first exec;
    against a cold create + first exec."""
    sid = client.create({"tier": "gvisor"})
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec", {
        "cmd": "python3", "args": ["-c", HOLD], "background": True})
    if status != 201:
        raise ApiError("exec", status, payload)
    time.sleep(2)
    running_pss = pss_of_cgroup(sid)
    pause, resume, first, cold, paused_pss = [], [], [], [], []
    for i in range(n + 2):
        t0 = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/pause")
        t1 = time.monotonic()
        paused_pss.append(pss_of_cgroup(sid))
        t1b = time.monotonic()
        call(client, f"/v1/sandboxes/{sid}/resume")
        t2 = time.monotonic()
        client.exec_true(sid)
        t3 = time.monotonic()
        t4 = t3 + cold_start(client, {"tier": "gvisor"})
        if i >= 2:
            pause.append(t1 - t0)
            resume.append(t2 - t1b)
            first.append(t3 - t2)
            cold.append(t4 - t3)
    client.delete(sid)
    return {"pause": summary(pause), "resume": summary(resume), "first_exec": summary(first),
            "cold_first_exec": summary(cold), "running_pss_bytes": running_pss,
            "paused_pss_bytes": max(paused_pss)}


def raw_cycles(n):
    """The freezer by hand around a busy shell in a cgroup of its own."""
    if not os.path.isdir(FREEZER):
        raise SystemExit(f"{FREEZER} is not mounted: the raw peer needs the cgroup v1 freezer")
    group = os.path.join(FREEZER, f"bench-pause-{os.getpid()}")
    os.mkdir(group)
    proc = subprocess.Popen(["/bin/sh", "-c", BUSY])
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        state = os.path.join(group, "freezer.state")
        freeze, thaw = [], []

        def write(value):
            with open(state, "w") as f:
                f.write(value)

        def read():
            with open(state) as f:
                return f.read().strip()

        for i in range(n + 2):
            t0 = time.monotonic()
            write("FROZEN")
            while read() != "FROZEN":
                write("FROZEN")
            t1 = time.monotonic()
            write("THAWED")
            t2 = time.monotonic()
            if i >= 2:
                freeze.append(t1 - t0)
                thaw.append(t2 - t1)
        return {"pause": summary(freeze), "resume": summary(thaw)}
    finally:
        try:
            with open(os.path.join(group, "freezer.state"), "w") as f:
                f.write("THAWED")
        except OSError:
            pass
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for _ in range(100):
            try:
                os.rmdir(group)
                break
            except OSError:
                time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=30, help="cycles per tier")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/pause.py needs root (sandboxes, cgroups)")
    daemon = Daemon(args.airlock, ["--gvisor-pause", "freeze"])
    try:
        import_busybox(daemon, args.airlock)
        client = Client(daemon)
        tiers = {t: tier_cycles(client, t, args.n) for t in ("process", "oci", "gvisor")}
        files_only = {t: files_only_cycles(client, t, args.n) for t in ("process", "oci", "gvisor")}
    finally:
        daemon.stop()
    daemon = Daemon(args.airlock)
    try:
        checkpoint = checkpoint_cycles(Client(daemon), max(args.n // 3, 5))
    finally:
        daemon.stop()
    raw = raw_cycles(args.n)
    res = {"n": args.n, "tiers": tiers, "raw": raw, "files_only": files_only,
           "gvisor_checkpoint": checkpoint}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock pause benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n})")
    r = res["raw"]
    print(f"  raw freezer by hand   freeze p50 {r['pause']['p50_ms']:7.2f} ms"
          f"   thaw p50 {r['resume']['p50_ms']:7.2f} ms")
    for t, s in res["tiers"].items():
        resume = s["resume"]["p50_ms"]
        print(f"  {t:<8} pause p50 {s['pause']['p50_ms']:7.2f} ms p99 {s['pause']['p99_ms']:7.2f}"
              f" (x{s['pause']['p50_ms'] / max(r['pause']['p50_ms'], 1e-6):.1f} raw)"
              f"  resume p50 {resume:7.2f} ms p99 {s['resume']['p99_ms']:7.2f}"
              f"  first exec after {s['first_exec']['p50_ms']:6.2f} ms"
              f"  (target resume <= {TARGET_RESUME_MS:.0f} ms) {verdict(resume <= TARGET_RESUME_MS)}")
    c = res["gvisor_checkpoint"]
    print("  gvisor, memory saved to disk (python3 holding 64 MiB):")
    print(f"  gvisor   pause p50 {c['pause']['p50_ms']:7.2f} ms p99 {c['pause']['p99_ms']:7.2f}"
          f"  resume p50 {c['resume']['p50_ms']:7.2f} ms p99 {c['resume']['p99_ms']:7.2f}"
          f"  first exec after {c['first_exec']['p50_ms']:6.2f} ms"
          f"  restore + first exec vs cold create + first exec"
          f" {(c['resume']['p50_ms'] + c['first_exec']['p50_ms']) / max(c['cold_first_exec']['p50_ms'], 1e-6):.2f}x"
          f"  host PSS running {c['running_pss_bytes'] / 2**20:.1f} MiB, paused {c['paused_pss_bytes'] / 2**20:.1f} MiB")
    print("  files only (busybox template, 1 MiB written): resume boots it again")
    for t, s in res["files_only"].items():
        boot = s["resume_first_exec"]["p50_ms"]
        cold = s["cold_first_exec"]["p50_ms"]
        print(f"  {t:<8} pause p50 {s['pause']['p50_ms']:7.2f} ms p99 {s['pause']['p99_ms']:7.2f}"
              f"  resume + first exec p50 {boot:7.2f} ms p99 {s['resume_first_exec']['p99_ms']:7.2f}"
              f"  cold create + first exec p50 {cold:7.2f} ms  ratio {boot / max(cold, 1e-6):.2f}x")


if __name__ == "__main__":
    main()
