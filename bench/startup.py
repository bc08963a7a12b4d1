#!/usr/bin/env python3
"""Startup benchmark of the process tier against bubblewrap, in one run.

For each workload, alternates `airlock run -- CMD` with `bwrap <equivalent
policy> CMD` N times and prints the median wall time of each and the ratio.
The bwrap policy matches airlock's namespaces (user, pid, net, ipc, uts,
mount) with a read-only /usr, a fresh /proc, a minimal /dev and a tmpfs /tmp.
Also prints the host-side peak RSS of `airlock run` (launcher plus the agent,
from wait4's rusage). Target: airlock <= 1.5x bwrap.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def bwrap_argv(cmd):
    argv = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp", "--"]
    return argv + cmd


def timed(argv):
    start = time.perf_counter()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed ({proc.returncode}): {argv}\n{proc.stderr.decode()}")
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--airlock", default="target/x86_64-unknown-linux-gnu/release/airlock")
    parser.add_argument("-n", type=int, default=50, help="runs per command")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the benchmark needs root, like airlock's process tier")
    if not shutil.which("bwrap"):
        sys.exit("bwrap is missing: apt-get install bubblewrap (scripts/deps does)")

    workloads = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}
    results = {}
    for name, cmd in workloads.items():
        ours = [args.airlock, "run", "--"] + cmd
        peer = bwrap_argv(cmd)
        for _ in range(3):  # warm the page cache for both
            timed(ours)
            timed(peer)
        a, b = [], []
        for _ in range(args.n):
            a.append(timed(ours))
            b.append(timed(peer))
        am, bm = statistics.median(a), statistics.median(b)
        results[name] = {"airlock_ms": am * 1e3, "bwrap_ms": bm * 1e3, "ratio": am / bm,
                         "airlock_p90_ms": sorted(a)[int(len(a) * 0.9)] * 1e3}

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execv(args.airlock, [args.airlock, "run", "--", "true"])
    _, _, usage = os.wait4(pid, 0)
    rss_kib = usage.ru_maxrss

    if args.json:
        print(json.dumps({"runs": args.n, "workloads": results, "host_peak_rss_kib": rss_kib}))
        return
    print(f"{'workload':<18}{'airlock p50':>13}{'bwrap p50':>12}{'ratio':>8}{'airlock p90':>13}")
    for name, r in results.items():
        verdict = "ok" if r["ratio"] <= 1.5 else "OVER TARGET"
        print(f"{name:<18}{r['airlock_ms']:>10.2f} ms{r['bwrap_ms']:>9.2f} ms{r['ratio']:>7.2f}x"
              f"{r['airlock_p90_ms']:>10.2f} ms  {verdict} (target <= 1.5x)")
    print(f"host-side peak RSS of `airlock run -- true`: {rss_kib / 1024:.1f} MiB ({args.n} runs each)")
    del before


if __name__ == "__main__":
    main()
