#!/usr/bin/env python3
"""Startup benchmark of the process tier against bubblewrap, in one run.

For each workload, runs `airlock run -- CMD` and `bwrap <equivalent policy>
CMD` in N adjacent pairs and prints the median wall time of each and the
ratio: the median of the pairs' ratios.
The bwrap policy matches airlock's namespaces (user, pid, net, ipc, uts,
mount) with a read-only /usr, a fresh /proc, a minimal /dev and a tmpfs /tmp.
Also prints the host-side peak RSS (VmHWM) of the `airlock run` process and of
the agent, the sandbox's PID 1. Target: airlock <= 1.5x bwrap.
"""
import argparse
import json
import os
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


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def peak_rss(airlock):
    """VmHWM of the CLI and of the agent (the sandbox's PID 1, its child),
    read while the command runs."""
    proc = subprocess.Popen([airlock, "run", "--", "sleep", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = None
    deadline = time.time() + 5
    while agent is None and time.time() < deadline:
        time.sleep(0.05)
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                kids = f.read().split()
            agent = int(kids[0]) if kids else None
        except OSError:
            break
    time.sleep(0.3)
    cli = vm_hwm_kib(proc.pid)
    agent_kib = vm_hwm_kib(agent) if agent else 0
    proc.wait()
    return cli, agent_kib


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
        # Runs come in adjacent pairs, their order alternating (what one
        # run leaves the kernel to finish, like a dying network namespace,
        # lands on the next), and the ratio is the median of the pairs'
        # ratios: this machine's speed drifts by a third over minutes, which
        # moves a ratio of two medians taken minutes apart but not a pair's.
        a, b, pairs = [], [], []
        for i in range(args.n):
            if i % 2:
                y, x = timed(peer), timed(ours)
            else:
                x, y = timed(ours), timed(peer)
            a.append(x)
            b.append(y)
            pairs.append(x / y)
        am, bm = statistics.median(a), statistics.median(b)
        results[name] = {"airlock_ms": am * 1e3, "bwrap_ms": bm * 1e3,
                         "ratio": statistics.median(pairs),
                         "ratio_of_medians": am / bm,
                         "airlock_p90_ms": sorted(a)[int(len(a) * 0.9)] * 1e3}

    cli_hwm, agent_hwm = peak_rss(args.airlock)

    if args.json:
        print(json.dumps({"runs": args.n, "workloads": results,
                          "cli_peak_rss_kib": cli_hwm, "agent_peak_rss_kib": agent_hwm}))
        return
    print(f"{'workload':<18}{'airlock p50':>13}{'bwrap p50':>12}{'ratio':>8}{'airlock p90':>13}")
    for name, r in results.items():
        verdict = "ok" if r["ratio"] <= 1.5 else "OVER TARGET"
        print(f"{name:<18}{r['airlock_ms']:>10.2f} ms{r['bwrap_ms']:>9.2f} ms{r['ratio']:>7.2f}x"
              f"{r['airlock_p90_ms']:>10.2f} ms  {verdict} (target <= 1.5x)")
    print(f"host-side peak RSS (VmHWM) during `airlock run -- sleep`: CLI {cli_hwm / 1024:.1f} MiB, "
          f"agent {agent_hwm / 1024:.1f} MiB ({args.n} runs each)")


if __name__ == "__main__":
    main()
