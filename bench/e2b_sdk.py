#!/usr/bin/env python3
"""Benchmark of the e2b dialect through the unmodified Python SDK.

Run it with the pinned SDK venv that scripts/deps installs:

    sudo /opt/airlock/e2b-latest/bin/python bench/e2b_sdk.py [--airlock PATH] [-n 50]

Starts a private daemon (fresh data directory, a free port), points the SDK
at it with E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, and measures:

 1. Sandbox.create() + commands.run("true") + kill(): p50/p99 (target
    <= 15 / 40 ms on the process tier);
 2. commands.run("true") on a live sandbox: p50/p99 (target p50 <= 3 ms);
 3. 100 MiB files.write and files.read, as bytes (multipart upload,
    buffered download) and streamed (file-object upload, format="stream"
    download): median MiB/s of --transfers runs each (target >= 500).

A miss is printed as a miss; the exit code is 0 unless something failed.
Every sandbox is killed and the daemon stopped at the end.
"""
import argparse
import io
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MIB = 1024 * 1024


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def start_daemon(airlock, extra=(), tmp=None):
    """A private daemon on a free port, its data and log under `tmp` (a new
    directory unless given), with `extra` serve options; (process, tmp,
    URL, admin key). bench/egress.py uses it too."""
    tmp = tmp or tempfile.mkdtemp(prefix="airlock-e2b-bench-")
    data = os.path.join(tmp, "data")
    log_path = os.path.join(tmp, "daemon.log")
    log = open(log_path, "wb")
    daemon = subprocess.Popen(
        [airlock, "serve", "--listen", "127.0.0.1:0", "--data-dir", data, *extra],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        env=dict(os.environ, AIRLOCK_LOG="warn"))
    deadline = time.monotonic() + 20
    while True:
        with open(log_path, "rb") as f:
            m = re.search(rb"serving on (http://[0-9.]+:\d+)", f.read())
        if m:
            break
        if daemon.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the daemon did not start; see {log_path}")
        time.sleep(0.02)
    with open(os.path.join(data, "admin.key")) as f:
        key = f.read().strip()
    return daemon, tmp, m.group(1).decode(), key


def raw_peers(n):
    """This machine's floor, measured in the same run: bwrap starting a
    sandbox that runs `true` (the start-up peer of bench/startup.py), and a
    bare `bash -c true` launch (what every commands.run pays inside the
    sandbox before anything of airlock's)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from startup import bwrap_argv  # the same peer as the start-up benchmark

    def p50(argv):
        times = []
        for i in range(n + 3):
            t0 = time.perf_counter()
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    return {
        "bwrap": p50(bwrap_argv(["true"])),
        "bash": p50(["env", "-i", "/bin/bash", "--noprofile", "--norc", "-c", "true"]),
    }


def main():
    parser = argparse.ArgumentParser()
    default = "target/x86_64-unknown-linux-gnu/release/airlock"
    parser.add_argument("--airlock", default=default if os.path.exists(default) else "airlock")
    parser.add_argument("-n", type=int, default=50, help="cycles and runs per measurement")
    parser.add_argument("--mib", type=int, default=100, help="size of the file transfer")
    parser.add_argument("--transfers", type=int, default=5, help="transfers of each kind")
    args = parser.parse_args()

    peers = raw_peers(args.n)
    daemon, tmp, url, key = start_daemon(args.airlock)
    live = []
    try:
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        for name in ("E2B_DEBUG", "E2B_DOMAIN", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                     "https_proxy"):
            os.environ.pop(name, None)
        from e2b import Sandbox  # after the environment is set

        cycles, creates, runs, kills = [], [], [], []
        for _ in range(args.n + 3):
            t0 = time.perf_counter()
            sbx = Sandbox.create()
            live.append(sbx)
            t1 = time.perf_counter()
            sbx.commands.run("true")
            t2 = time.perf_counter()
            sbx.kill()
            live.remove(sbx)
            t3 = time.perf_counter()
            cycles.append((t3 - t0) * 1000)
            creates.append((t1 - t0) * 1000)
            runs.append((t2 - t1) * 1000)
            kills.append((t3 - t2) * 1000)
        # The first cycles warm the SDK's connection pools: leave them out.
        cycles, creates, runs, kills = (x[3:] for x in (cycles, creates, runs, kills))

        sbx = Sandbox.create()
        live.append(sbx)
        sbx.commands.run("true")
        rtt = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            sbx.commands.run("true")
            rtt.append((time.perf_counter() - t0) * 1000)

        payload = os.urandom(MIB) * args.mib
        transfers = {}

        def timed(name, action):
            t0 = time.perf_counter()
            action()
            transfers.setdefault(name, []).append(args.mib / (time.perf_counter() - t0))

        def read_bytes():
            if bytes(sbx.files.read("/tmp/big.bin", format="bytes")) != payload:
                sys.exit("the downloaded file differs from the upload")

        def read_stream():
            size = sum(len(chunk) for chunk in sbx.files.read("/tmp/big.bin", format="stream"))
            if size != len(payload):
                sys.exit("the streamed download has the wrong size")

        # Transfers are noisy on a shared machine: the median of a few.
        for _ in range(args.transfers):
            # bytes go as multipart/form-data, a file object as octet-stream.
            timed("upload (files.write bytes)", lambda: sbx.files.write("/tmp/big.bin", payload))
            timed("upload (files.write file object)",
                  lambda: sbx.files.write("/tmp/big.bin", io.BytesIO(payload)))
            timed("download (files.read bytes)", read_bytes)
            timed("download (files.read stream)", read_stream)
    finally:
        for sbx in live:
            try:
                sbx.kill()
            except Exception:  # noqa: BLE001 - cleanup must go on
                pass
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

    def row(name, values, target=None, p50_target=None):
        p50, p99 = statistics.median(values), percentile(values, 99)
        verdict = ""
        if target:
            verdict = "PASS" if p50 <= target[0] and p99 <= target[1] else "MISS"
        if p50_target:
            verdict = "PASS" if p50 <= p50_target else "MISS"
        print(f"{name:<44} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  {verdict}")

    print(f"e2b SDK benchmark against {args.airlock} ({args.n} runs each)")
    row("create + run('true') + kill", cycles, target=(15, 40))
    row("  create", creates)
    row("  run('true')", runs)
    row("  kill", kills)
    row("commands.run('true') on a live sandbox", rtt, p50_target=3)
    print(f"raw peers this run: bwrap `true` p50 {peers['bwrap']:.2f} ms, "
          f"`bash -c true` p50 {peers['bash']:.2f} ms")
    print(f"  create + run + kill p50 / bwrap p50 = {statistics.median(cycles) / peers['bwrap']:.2f}x; "
          f"commands.run p50 / bash launch p50 = {statistics.median(rtt) / peers['bash']:.2f}x")
    for name, rates in transfers.items():
        rate = statistics.median(rates)
        print(f"{name:<44} {rate:7.0f} MiB/s (median of {len(rates)} x {args.mib} MiB)  "
              f"{'PASS' if rate >= 500 else 'MISS'}")


if __name__ == "__main__":
    main()
