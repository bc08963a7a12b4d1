#!/usr/bin/env python3
"""Benchmark of `airlock serve` through its REST API, in one run.

Starts a private daemon (fresh data directory, 127.0.0.1 on a free port) and
measures, with keep-alive HTTP/1.1 connections (TCP_NODELAY, one per client
thread):

 1. sequential create + exec("true") + delete cycles: p50/p90/p99 of the
    cycle and of each step;
 2. the same cycle with many concurrent clients: p50/p99 and cycles/s;
 3. the sustained create+delete rate of thread pools, in pairs/s;
 4. the round trip of exec("true") on one live sandbox;
 5. host memory per idle sandbox with many idle sandboxes: PSS and RSS of
    the supervisors and of the agents (each sandbox's PID 1), the daemon's
    growth, the drop of MemAvailable, and the memory cgroup usage of each
    sandbox (memory charged to the sandbox itself, not host overhead);
 6. for context, bwrap running `true` under the policy bench/startup.py uses.

Targets (from the issue): sequential cycle p50 <= 15 ms and p99 <= 40 ms,
>= 300 create+destroy/s, <= 3 MiB host overhead per idle sandbox. A miss is
reported as a miss; the exit code is 0 unless something failed (a request
error, a daemon that does not start, a sandbox left behind).

Every sandbox created is deleted at the end, also on Ctrl-C or an error:
sandboxes outlive the daemon by design, so the daemon is stopped only after.
"""
import argparse
import http.client
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from startup import bwrap_argv  # noqa: E402  (the same peer as the start-up benchmark)

MIB = 1024 * 1024
TARGET_P50_MS = 15.0
TARGET_P99_MS = 40.0
TARGET_RATE = 300.0
TARGET_IDLE_MIB = 3.0
HTTP_TIMEOUT = 60.0


class BenchError(Exception):
    pass


class Interrupted(BaseException):
    """SIGTERM, handled like Ctrl-C: stop, clean up, exit."""


# ---------------------------------------------------------------- HTTP client

class Conn(http.client.HTTPConnection):
    """A keep-alive connection with Nagle off."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ApiError(BenchError):
    def __init__(self, what, status, body):
        super().__init__(f"{what}: HTTP {status}: {body[:300]!r}")
        self.status = status


class Client:
    """One client thread's connection to the daemon."""

    def __init__(self, bench):
        self.bench = bench
        self.conn = None

    def _request(self, method, path, body=None):
        headers = {"X-API-Key": self.bench.key}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            reused = self.conn is not None
            if self.conn is None:
                self.conn = Conn(self.bench.host, self.bench.port, timeout=HTTP_TIMEOUT)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                payload = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, payload
            except socket.timeout as e:
                self.close()
                raise BenchError(f"{method} {path}: timed out after {HTTP_TIMEOUT:.0f} s") from e
            except (ConnectionError, http.client.HTTPException) as e:
                # A keep-alive connection the server had closed: retry once on
                # a new one. (Should a create have reached the daemon anyway,
                # the final sweep deletes what it made.)
                self.close()
                if attempt or not reused:
                    raise BenchError(f"{method} {path}: {e!r}") from e
        raise AssertionError("unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def create(self, body=None):
        status, payload = self._request("POST", "/v1/sandboxes", body if body is not None else {})
        if status != 201:
            raise ApiError("create", status, payload)
        sid = json.loads(payload)["id"]
        self.bench.track(sid)
        return sid

    def exec_true(self, sid):
        status, payload = self._request("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"})
        if status != 200:
            raise ApiError("exec", status, payload)
        lines = [ln for ln in payload.split(b"\n") if ln.strip()]
        last = json.loads(lines[-1]) if lines else {}
        if last.get("type") != "exited" or last.get("exit_code") != 0:
            raise BenchError(f"exec true: unexpected end of stream: {payload[-300:]!r}")

    def delete(self, sid):
        status, payload = self._request("DELETE", f"/v1/sandboxes/{sid}")
        if status not in (204, 404):
            raise ApiError("delete", status, payload)
        self.bench.untrack(sid)

    def get(self, path):
        status, payload = self._request("GET", path)
        if status != 200:
            raise ApiError(f"GET {path}", status, payload)
        return payload


# ---------------------------------------------------------------- statistics

def pct(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def summary(values_s):
    ms = [v * 1e3 for v in values_s]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99),
            "mean_ms": statistics.fmean(ms), "max_ms": max(ms)}


# ---------------------------------------------------------------- /proc helpers

def children(pid):
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return kids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def run_and_clean_up(run, cleanup, log_tail, errors, on_stop=lambda: None):
    """Runs `run()` and always `cleanup()` after it (with SIGINT and SIGTERM
    held off, since the sandboxes outlive the daemon): an interrupt is
    status 130, one of `errors` status 1 with the daemon's log tail; the
    problems `cleanup()` reports are printed. Returns (status, result,
    problems)."""
    status, res = 0, None
    try:
        res = run()
    except (KeyboardInterrupt, Interrupted):
        on_stop()
        print("interrupted; deleting the sandboxes", file=sys.stderr)
        status = 130
    except errors as e:
        on_stop()
        print(f"error: {e}", file=sys.stderr)
        tail = log_tail()
        if tail:
            print(f"daemon log (tail):\n{tail}", file=sys.stderr)
        status = 1
    finally:
        def still(signum, frame):
            print("still deleting the sandboxes; they outlive the daemon", file=sys.stderr)
        signal.signal(signal.SIGINT, still)
        signal.signal(signal.SIGTERM, still)
        problems = cleanup()
    for problem in problems:
        print(f"cleanup: {problem}", file=sys.stderr)
    return status, res, problems


def mem_kib(pid):
    """(RSS, PSS or None) of a process, in KiB."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except OSError:
        return None, None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def client_cpu_s():
    """CPU seconds this benchmark process (every client thread) has used."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cgroup_memory(sid):
    """Bytes charged to the sandbox's memory cgroup (usage, kmem or None),
    and the pids in it; None when there is no such cgroup."""
    v1 = f"/sys/fs/cgroup/memory/airlock/{sid}"
    v2 = f"/sys/fs/cgroup/airlock/{sid}"
    try:
        if os.path.isdir(v1):
            with open(f"{v1}/memory.usage_in_bytes") as f:
                usage = int(f.read())
            kmem = None
            try:
                with open(f"{v1}/memory.kmem.usage_in_bytes") as f:
                    kmem = int(f.read())
            except OSError:
                pass
            with open(f"{v1}/cgroup.procs") as f:
                procs = [int(p) for p in f.read().split()]
            return usage, kmem, procs
        if os.path.isdir(v2):
            with open(f"{v2}/memory.current") as f:
                usage = int(f.read())
            kmem = None
            try:
                with open(f"{v2}/memory.stat") as f:
                    stat = dict(line.split() for line in f if line.strip())
                kmem = sum(int(stat.get(k, 0)) for k in ("kernel", "kernel_stack", "slab",
                                                          "pagetables", "sock")
                           if k in stat) if "kernel" not in stat else int(stat["kernel"])
            except (OSError, ValueError):
                pass
            with open(f"{v2}/cgroup.procs") as f:
                procs = [int(p) for p in f.read().split()]
            return usage, kmem, procs
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------- the bench

class Bench:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.live = set()
        self.all_ids = set()
        self.stop = threading.Event()
        self.errors = []
        self.threads = []
        self.daemon = None
        self.tmp = None
        self.host = "127.0.0.1"
        self.port = None
        self.key = None

    # bookkeeping of what must be deleted
    def track(self, sid):
        with self.lock:
            self.live.add(sid)
            self.all_ids.add(sid)

    def untrack(self, sid):
        with self.lock:
            self.live.discard(sid)

    def error(self, phase, e):
        with self.lock:
            self.errors.append(f"{phase}: {e}")

    # daemon
    def start_daemon(self):
        self.tmp = tempfile.mkdtemp(prefix="airlock-bench-")
        data = os.path.join(self.tmp, "data")
        log_path = os.path.join(self.tmp, "daemon.log")
        argv = [self.args.airlock, "serve", "--listen", "127.0.0.1:0", "--data-dir", data,
                "--max-live", "400", "--max-live-per-key", "400",
                "--max-concurrent-creates", str(self.args.max_concurrent_creates),
                "--max-queue", "1000"]
        self.log = open(log_path, "wb")
        env = dict(os.environ, AIRLOCK_LOG=os.environ.get("AIRLOCK_LOG", "warn"))
        # Own session: a Ctrl-C in the terminal must not stop the daemon
        # before the sandboxes are deleted.
        self.daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                       stderr=self.log, env=env, start_new_session=True)
        deadline = time.monotonic() + 20
        pattern = re.compile(rb"serving on http://([0-9.]+):(\d+)")
        while True:
            with open(log_path, "rb") as f:
                text = f.read()
            m = pattern.search(text)
            if m:
                self.port = int(m.group(2))
                break
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {self.daemon.returncode}" if self.daemon.returncode is not None
                       else "did not report its address within 20 s")
                raise BenchError(f"the daemon {why}: {' '.join(argv)}\n"
                                 f"{text.decode(errors='replace')[-2000:]}")
            time.sleep(0.02)
        with open(os.path.join(data, "admin.key")) as f:
            self.key = f.read().strip()
        c = Client(self)
        c.get("/metrics")
        c.close()

    def daemon_log_tail(self):
        try:
            with open(os.path.join(self.tmp, "daemon.log"), "rb") as f:
                return f.read().decode(errors="replace")[-2000:]
        except (OSError, TypeError):
            return ""

    def cleanup(self):
        """Deletes every sandbox this run created, then stops the daemon.
        Returns a list of problems (empty when everything is gone)."""
        problems = []
        self.stop.set()
        # Client threads still in a request finish it (each deletes what it
        # created), and must be done before the sweep below.
        deadline = time.monotonic() + HTTP_TIMEOUT + 5
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        busy = sum(t.is_alive() for t in self.threads)
        if busy:
            problems.append(f"{busy} client threads still busy after {HTTP_TIMEOUT + 5:.0f} s")
        if self.daemon is not None and self.daemon.poll() is None and self.key:
            c = Client(self)
            with self.lock:
                pending = set(self.live)
            # Anything the daemon knows of and that is not dead (a create whose
            # answer was lost, for example): the data directory is ours alone.
            try:
                cursor = None
                while True:
                    path = "/v1/sandboxes?state=creating,running,paused,stopping&limit=100"
                    if cursor:
                        path += f"&cursor={cursor}"
                    page = json.loads(c.get(path))
                    pending |= {item["id"] for item in page.get("items", [])}
                    cursor = page.get("next_cursor")
                    if not cursor:
                        break
            except (BenchError, OSError, ValueError) as e:
                problems.append(f"could not list sandboxes: {e}")
            for sid in sorted(pending):
                try:
                    c.delete(sid)
                except (BenchError, OSError) as e:
                    problems.append(f"could not delete {sid}: {e}")
            c.close()
        elif self.live:
            problems.append(f"the daemon is gone; {len(self.live)} sandboxes may be left")
        if self.daemon is not None:
            if self.daemon.poll() is None:
                self.daemon.send_signal(signal.SIGTERM)
                try:
                    self.daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.daemon.kill()
                    self.daemon.wait()
            self.log.close()
        # Supervisors of our sandboxes still on the host?
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                args = cmdline(int(entry))
                if "supervise" in args and "--id" in args:
                    sid = args[args.index("--id") + 1] if args.index("--id") + 1 < len(args) else ""
                    if sid in self.all_ids:
                        left.append(f"{sid} (supervisor pid {entry})")
        if left:
            problems.append("sandboxes left running: " + ", ".join(left))
        cgroups = [sid for sid in self.all_ids if cgroup_memory(sid) is not None]
        if cgroups:
            problems.append(f"{len(cgroups)} sandbox cgroups left, e.g. airlock/{cgroups[0]}")
        if self.tmp:
            if problems:
                problems.append(f"kept the data directory {self.tmp}/data to adopt them: "
                                f"airlock serve --data-dir {self.tmp}/data")
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return problems

    # phases
    def cycle(self, c):
        t0 = time.perf_counter()
        sid = c.create()
        t1 = time.perf_counter()
        try:
            c.exec_true(sid)
        finally:
            t2 = time.perf_counter()
            c.delete(sid)
        t3 = time.perf_counter()
        return t3 - t0, t1 - t0, t2 - t1, t3 - t2

    def sequential(self, n):
        c = Client(self)
        for _ in range(self.args.warmup):
            self.cycle(c)
        rows = []
        for _ in range(n):
            if self.stop.is_set():
                raise KeyboardInterrupt
            rows.append(self.cycle(c))
        c.close()
        cols = list(zip(*rows))
        return {"cycle": summary(cols[0]), "create": summary(cols[1]),
                "exec": summary(cols[2]), "delete": summary(cols[3])}

    def run_threads(self, count, target, name):
        threads = [threading.Thread(target=target, args=(i,), name=f"{name}-{i}", daemon=True)
                   for i in range(count)]
        self.threads += threads
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)

    def concurrent(self, clients, per_client):
        rows = []
        start_gate = threading.Barrier(clients)

        def worker(_):
            c = Client(self)
            mine = []
            try:
                c.get("/healthz")
                start_gate.wait(timeout=60)
                for _ in range(per_client):
                    if self.stop.is_set():
                        break
                    mine.append(self.cycle(c))
            except (BenchError, OSError, threading.BrokenBarrierError) as e:
                self.error("concurrent", e)
            finally:
                c.close()
                with self.lock:
                    rows.extend(mine)

        t0, cpu0 = time.perf_counter(), client_cpu_s()
        self.run_threads(clients, worker, "conc")
        elapsed = time.perf_counter() - t0
        cpu = client_cpu_s() - cpu0
        if self.stop.is_set():
            raise KeyboardInterrupt
        cols = list(zip(*rows)) if rows else [[], [], [], []]
        return {"clients": clients, "per_client": per_client, "cycles": len(rows),
                "elapsed_s": elapsed, "cycles_per_s": len(rows) / elapsed if elapsed else 0,
                "client_cpu_s": cpu,
                "cycle": summary(cols[0]), "create": summary(cols[1]),
                "exec": summary(cols[2]), "delete": summary(cols[3])}

    def sustained(self, pool, duration):
        pairs = [0]
        lat = []
        deadline = time.perf_counter() + duration

        def worker(_):
            c = Client(self)
            n, mine = 0, []
            try:
                while time.perf_counter() < deadline and not self.stop.is_set():
                    t0 = time.perf_counter()
                    sid = c.create()
                    c.delete(sid)
                    mine.append(time.perf_counter() - t0)
                    n += 1
            except (BenchError, OSError) as e:
                self.error(f"sustained/{pool}", e)
            finally:
                c.close()
                with self.lock:
                    pairs[0] += n
                    lat.extend(mine)

        t0, cpu0 = time.perf_counter(), client_cpu_s()
        self.run_threads(pool, worker, "sust")
        elapsed = time.perf_counter() - t0  # includes the pairs in flight at the deadline
        cpu = client_cpu_s() - cpu0
        if self.stop.is_set():
            raise KeyboardInterrupt
        return {"threads": pool, "pairs": pairs[0], "elapsed_s": elapsed,
                "pairs_per_s": pairs[0] / elapsed, "client_cpu_s": cpu, "pair": summary(lat)}

    def exec_rtt(self, n):
        c = Client(self)
        sid = c.create()
        try:
            for _ in range(self.args.warmup):
                c.exec_true(sid)
            times = []
            for _ in range(n):
                if self.stop.is_set():
                    raise KeyboardInterrupt
                t0 = time.perf_counter()
                c.exec_true(sid)
                times.append(time.perf_counter() - t0)
        finally:
            c.delete(sid)
            c.close()
        return summary(times)

    def idle(self, count, settle):
        dpid = self.daemon.pid
        time.sleep(1)
        d_rss0, d_pss0 = mem_kib(dpid)
        avail0 = mem_available_kib()
        ids = []
        lock = threading.Lock()
        todo = list(range(count))

        def worker(_):
            c = Client(self)
            try:
                while not self.stop.is_set():
                    with lock:
                        if not todo:
                            return
                        todo.pop()
                    sid = c.create()
                    with lock:
                        ids.append(sid)
            except (BenchError, OSError) as e:
                self.error("idle", e)
            finally:
                c.close()

        t0 = time.perf_counter()
        self.run_threads(min(8, count), worker, "idle")
        create_s = time.perf_counter() - t0
        if self.stop.is_set():
            raise KeyboardInterrupt
        if len(ids) != count:
            raise BenchError(f"idle: created {len(ids)} of {count} sandboxes")
        time.sleep(settle)
        d_rss1, d_pss1 = mem_kib(dpid)
        avail1 = mem_available_kib()

        wanted = set(ids)
        sup = {"rss": 0, "pss": 0, "n": 0}
        agent = {"rss": 0, "pss": 0, "n": 0}
        pss_ok = True
        sup_pids, agent_pids = {}, {}
        for pid in children(dpid):
            args = cmdline(pid)
            if "supervise" not in args or "--id" not in args:
                continue
            sid = args[args.index("--id") + 1]
            if sid not in wanted:
                continue
            sup_pids[sid] = pid
            rss, pss = mem_kib(pid)
            sup["rss"] += rss or 0
            sup["pss"] += pss or 0
            sup["n"] += 1
            pss_ok &= pss is not None
            for kid in children(pid):
                agent_pids.setdefault(sid, []).append(kid)
                rss, pss = mem_kib(kid)
                agent["rss"] += rss or 0
                agent["pss"] += pss or 0
                agent["n"] += 1
                pss_ok &= pss is not None

        cg_usage, cg_kmem, cg_n, cg_procs_sup = 0, 0, 0, 0
        kmem_ok = True
        for sid in ids:
            got = cgroup_memory(sid)
            if got is None:
                continue
            usage, kmem, procs = got
            cg_usage += usage
            cg_n += 1
            if kmem is None:
                kmem_ok = False
            else:
                cg_kmem += kmem
            if sup_pids.get(sid) in procs:
                cg_procs_sup += 1

        d_rss_growth = d_rss1 - d_rss0
        d_pss_growth = (d_pss1 - d_pss0) if d_pss0 is not None and d_pss1 is not None else None
        per = lambda kib: kib / 1024 / count  # noqa: E731
        result = {
            "sandboxes": count, "create_s": create_s, "settle_s": settle,
            "supervisors": sup["n"], "agents": agent["n"],
            "supervisor_rss_mib_each": per(sup["rss"]),
            "agent_rss_mib_each": per(agent["rss"]),
            "daemon_rss_growth_mib_each": per(d_rss_growth),
            "daemon_rss_before_mib": d_rss0 / 1024, "daemon_rss_after_mib": d_rss1 / 1024,
            "total_rss_mib_each": per(sup["rss"] + agent["rss"] + d_rss_growth),
            "mem_available_drop_mib_each": per(avail0 - avail1),
        }
        if pss_ok and d_pss_growth is not None:
            result.update({
                "supervisor_pss_mib_each": per(sup["pss"]),
                "agent_pss_mib_each": per(agent["pss"]),
                "daemon_pss_growth_mib_each": per(d_pss_growth),
                "total_pss_mib_each": per(sup["pss"] + agent["pss"] + d_pss_growth),
            })
        if cg_n:
            result["cgroup"] = {
                "sandboxes": cg_n,
                "usage_mib_each": cg_usage / MIB / cg_n,
                "kmem_mib_each": (cg_kmem / MIB / cg_n) if kmem_ok else None,
                "supervisor_in_cgroup": cg_procs_sup,
            }

        # Delete them (not timed as a metric, but reported).
        t0 = time.perf_counter()
        todo_del = list(ids)

        def deleter(_):
            c = Client(self)
            try:
                while True:
                    with lock:
                        if not todo_del:
                            return
                        sid = todo_del.pop()
                    c.delete(sid)
            except (BenchError, OSError) as e:
                self.error("idle delete", e)
            finally:
                c.close()

        self.run_threads(min(8, count), deleter, "idle-del")
        result["delete_s"] = time.perf_counter() - t0
        return result


def bwrap_peer(n):
    argv = bwrap_argv(["true"])
    times = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise BenchError(f"bwrap failed ({proc.returncode}): {argv}\n{proc.stderr.decode()}")
        if i >= 3:  # the first three warm the page cache
            times.append(elapsed)
    return {"argv": argv, **summary(times)}


def default_airlock():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    built = os.path.join(root, "target/x86_64-unknown-linux-gnu/release/airlock")
    if os.path.exists(built):
        return built
    return shutil.which("airlock") or built


# ---------------------------------------------------------------- report

def verdict(ok):
    return "PASS" if ok else "MISS"


def report(res):
    seq, conc, rtt, idle, peer = (res.get(k) for k in ("sequential", "concurrent", "exec_rtt",
                                                        "idle", "bwrap"))
    out = []
    p = out.append
    p(f"airlock daemon benchmark: {res['airlock']}  ({res['cores']} cores, max-concurrent-creates "
      f"{res['max_concurrent_creates']})")
    p(f"load average: before {fmt_load(res['load_before'])}, after {fmt_load(res['load_after'])}")
    p("")
    if seq:
        p(f"1. sequential create + exec(true) + delete, {seq['cycle']['n']} cycles (ms)")
        p(f"   {'step':<10}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'max':>9}")
        for step in ("cycle", "create", "exec", "delete"):
            s = seq[step]
            p(f"   {step:<10}{s['p50_ms']:>9.2f}{s['p90_ms']:>9.2f}{s['p99_ms']:>9.2f}"
              f"{s['mean_ms']:>9.2f}{s['max_ms']:>9.2f}")
    if conc:
        p(f"2. {conc['clients']} concurrent clients x {conc['per_client']} cycles: {conc['cycles']} "
          f"cycles in {conc['elapsed_s']:.2f} s = {conc['cycles_per_s']:.1f} cycles/s; the client"
          f" itself used {conc['client_cpu_s']:.2f} CPU-s (ms)")
        p(f"   {'step':<10}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'max':>9}")
        for step in ("cycle", "create", "exec", "delete"):
            s = conc[step]
            if s["n"]:
                p(f"   {step:<10}{s['p50_ms']:>9.2f}{s['p90_ms']:>9.2f}{s['p99_ms']:>9.2f}"
                  f"{s['mean_ms']:>9.2f}{s['max_ms']:>9.2f}")
    for s in res.get("sustained", []):
        pair = s["pair"]
        lat = (f", pair p50 {pair['p50_ms']:.1f} ms p99 {pair['p99_ms']:.1f} ms"
               if pair["n"] else "")
        p(f"3. sustained create+delete, {s['threads']:>2} threads: {s['pairs']} pairs in "
          f"{s['elapsed_s']:.2f} s = {s['pairs_per_s']:.1f} pairs/s{lat}; client CPU "
          f"{s['client_cpu_s']:.2f} s")
    if rtt:
        p(f"4. exec(true) round trip on one live sandbox, {rtt['n']} runs: p50 {rtt['p50_ms']:.2f} ms, "
          f"p90 {rtt['p90_ms']:.2f} ms, p99 {rtt['p99_ms']:.2f} ms")
    if idle:
        n = idle["sandboxes"]
        p(f"5. {n} idle sandboxes (created in {idle['create_s']:.2f} s, measured after "
          f"{idle['settle_s']:.0f} s, deleted in {idle['delete_s']:.2f} s); MiB per sandbox:")
        p(f"   {'part':<34}{'PSS':>8}{'RSS':>8}")
        has_pss = "total_pss_mib_each" in idle

        def row(name, key):
            pss = f"{idle[key + '_pss_mib_each' if key != 'daemon' else 'daemon_pss_growth_mib_each']:>8.2f}" \
                if has_pss else f"{'n/a':>8}"
            rss_key = key + "_rss_mib_each" if key != "daemon" else "daemon_rss_growth_mib_each"
            p(f"   {name:<34}{pss}{idle[rss_key]:>8.2f}")

        row(f"supervisors ({idle['supervisors']} found)", "supervisor")
        row(f"agents, sandbox PID 1 ({idle['agents']} found)", "agent")
        row("daemon growth", "daemon")
        row("host overhead (sum)", "total")
        if has_pss:
            p("   (PSS splits a shared page between the processes mapping it: the daemon's PSS falls as"
              " more processes share its binary, so only the sum is meaningful)")
        p(f"   daemon RSS {idle['daemon_rss_before_mib']:.1f} -> {idle['daemon_rss_after_mib']:.1f} MiB;"
          f" MemAvailable drop (cross-check, includes kernel memory and anything else running): "
          f"{idle['mem_available_drop_mib_each']:.2f} MiB per sandbox")
        cg = idle.get("cgroup")
        if cg:
            kmem = f", of which kernel (kmem) {cg['kmem_mib_each']:.2f}" if cg["kmem_mib_each"] is not None else ""
            where = ("the supervisor is inside it" if cg["supervisor_in_cgroup"] == cg["sandboxes"]
                     else "the supervisor is outside it" if cg["supervisor_in_cgroup"] == 0
                     else f"{cg['supervisor_in_cgroup']} supervisors inside it")
            p(f"   memory cgroup of each sandbox: {cg['usage_mib_each']:.2f} MiB{kmem} — memory charged "
              f"to the sandbox itself (its limit), not host overhead; {where}")
    if peer:
        p(f"6. raw peer, bwrap running `true` ({peer['n']} runs): p50 {peer['p50_ms']:.2f} ms, "
          f"p99 {peer['p99_ms']:.2f} ms")
        if seq:
            p(f"   airlock sequential cycle p50 / bwrap p50 = {seq['cycle']['p50_ms'] / peer['p50_ms']:.2f}x"
              f" (the cycle is three HTTP calls, a persistent sandbox and its teardown; bwrap is one"
              f" process)")
    p("")
    p(f"{'metric':<46}{'value':>14}  {'target':<14}verdict")
    for name, value, target, ok in res["verdicts"]:
        p(f"{name:<46}{value:>14}  {target:<14}{'' if ok is None else verdict(ok)}")
    if res["errors"]:
        p("")
        p(f"ERRORS ({len(res['errors'])}):")
        for e in res["errors"][:20]:
            p(f"  {e}")
    return "\n".join(out)


def fmt_load(load):
    return " ".join(f"{x:.2f}" for x in load)


def verdicts(res):
    rows = []
    seq, conc, idle, peer = (res.get(k) for k in ("sequential", "concurrent", "idle", "bwrap"))
    if seq:
        c = seq["cycle"]
        rows.append(("sequential cycle p50", f"{c['p50_ms']:.2f} ms", f"<= {TARGET_P50_MS:g} ms",
                     c["p50_ms"] <= TARGET_P50_MS))
        rows.append(("sequential cycle p99", f"{c['p99_ms']:.2f} ms", f"<= {TARGET_P99_MS:g} ms",
                     c["p99_ms"] <= TARGET_P99_MS))
    if conc and conc["cycle"]["n"]:
        c = conc["cycle"]
        rows.append((f"cycle p50, {conc['clients']} clients", f"{c['p50_ms']:.2f} ms", "(none)", None))
        rows.append((f"cycle p99, {conc['clients']} clients", f"{c['p99_ms']:.2f} ms", "(none)", None))
        rows.append((f"cycles/s, {conc['clients']} clients", f"{conc['cycles_per_s']:.1f} /s",
                     "(none)", None))
    for s in res.get("sustained", []):
        rows.append((f"create+destroy rate, {s['threads']} threads", f"{s['pairs_per_s']:.1f} /s",
                     f">= {TARGET_RATE:g} /s", s["pairs_per_s"] >= TARGET_RATE))
    if res.get("exec_rtt"):
        rows.append(("exec(true) round trip p50", f"{res['exec_rtt']['p50_ms']:.2f} ms", "(none)", None))
    if idle:
        if "total_pss_mib_each" in idle:
            v = idle["total_pss_mib_each"]
            rows.append(("host overhead per idle sandbox (PSS)", f"{v:.2f} MiB",
                         f"<= {TARGET_IDLE_MIB:g} MiB", v <= TARGET_IDLE_MIB))
            v = idle["total_rss_mib_each"]
            rows.append(("  same by RSS (shared pages counted per proc)", f"{v:.2f} MiB",
                         "(upper bound)", None))
        else:
            v = idle["total_rss_mib_each"]
            rows.append(("host overhead per idle sandbox (RSS; no PSS)", f"{v:.2f} MiB",
                         f"<= {TARGET_IDLE_MIB:g} MiB", v <= TARGET_IDLE_MIB))
    if peer and seq:
        rows.append(("cycle p50 / bwrap true p50", f"{seq['cycle']['p50_ms'] / peer['p50_ms']:.2f}x",
                     "(context)", None))
    return rows


def main():
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--airlock", default=default_airlock(), help="the airlock binary")
    parser.add_argument("-n", type=int, default=100, help="sequential cycles, exec runs, bwrap runs")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients")
    parser.add_argument("--per-client", type=int, default=10, help="cycles per concurrent client")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of each sustained create+delete run")
    parser.add_argument("--pools", default="8,32", help="thread pools of the sustained runs")
    parser.add_argument("--idle", type=int, default=200, help="idle sandboxes to measure")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before measuring idle")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured cycles first")
    parser.add_argument("--max-concurrent-creates", type=int, default=max(2, 2 * cores))
    parser.add_argument("--skip", default="", help="phases to skip: seq,conc,sust,exec,idle,bwrap")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    skip = {s for s in args.skip.split(",") if s}

    if os.geteuid() != 0:
        sys.exit("the benchmark needs root, like the daemon")
    if not os.access(args.airlock, os.X_OK):
        sys.exit(f"no airlock binary at {args.airlock}: build it (cargo build --release -p airlock) "
                 "or pass --airlock PATH")
    if "bwrap" not in skip and not shutil.which("bwrap"):
        sys.exit("bwrap is missing: apt-get install bubblewrap (scripts/deps does), or --skip bwrap")
    if args.idle > 400:
        sys.exit("--idle is at most 400 (the daemon's --max-live here)")

    def on_term(signum, frame):
        raise Interrupted()
    signal.signal(signal.SIGTERM, on_term)

    bench = Bench(args)
    res = {"airlock": args.airlock, "cores": cores,
           "max_concurrent_creates": args.max_concurrent_creates, "load_before": loadavg()}
    def measure():
        bench.start_daemon()
        if "seq" not in skip:
            res["sequential"] = bench.sequential(args.n)
        if "conc" not in skip:
            res["concurrent"] = bench.concurrent(args.clients, args.per_client)
        if "sust" not in skip:
            res["sustained"] = [bench.sustained(int(p), args.duration)
                                for p in args.pools.split(",") if p]
        if "exec" not in skip:
            res["exec_rtt"] = bench.exec_rtt(args.n)
        if "idle" not in skip and args.idle > 0:
            res["idle"] = bench.idle(args.idle, args.settle)

    status, _, problems = run_and_clean_up(
        measure, bench.cleanup,
        log_tail=lambda: bench.daemon_log_tail() if bench.port else "",
        errors=(BenchError, OSError), on_stop=bench.stop.set)
    if status or problems:
        return status or 1

    if "bwrap" not in skip:
        try:
            res["bwrap"] = bwrap_peer(args.n)
        except BenchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    res["load_after"] = loadavg()
    res["errors"] = bench.errors
    res["verdicts"] = verdicts(res)
    if args.json:
        res["verdicts"] = [{"metric": n, "value": v, "target": t,
                            "verdict": None if ok is None else verdict(ok)}
                           for n, v, t, ok in res["verdicts"]]
        print(json.dumps(res))
    else:
        print(report(res))
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
