#!/usr/bin/env python3
"""Benchmark of the daemon under floods, in one run.

    sudo python3 bench/flood.py [--airlock PATH] [--duration 10] [--json]

Starts a private daemon (release binary, fresh data directory, 127.0.0.1 on
a free port, default limits) and a second, non-admin API key (another
tenant, made with `airlock keys create` while the daemon runs). Two probes
run in every measured window, each on its own keep-alive connection:
GET /healthz (admin key) every 10 ms, and the other tenant's create +
delete of a sandbox, back to back. Their p99 during each flood is compared
with the same figure in a window with no flood, measured in the same run
(target: at most 2x):

 (a) a DNS flood: one sandbox with an allowlist policy sends queries of
     random names under a denied domain from 3 threads, without waiting for
     answers (as crates/airlock/tests/daemon_flood.rs does);
 (b) an output flood: one sandbox runs `yes` in exec after exec (each
     stops at the daemon's per-stream output cap, 16M), every answer read
     as fast as it can by a client in a process of its own;
 (c) 20,000 idle TCP connections, held by 3 child processes (this process
     may be limited to 20,000 descriptors), each from a source address of
     its own (127.0.1.1-3), so the daemon's global cap is reached, not only
     its per-peer cap;
 (d) 200 slowloris clients: each sends a partial request head, then one
     more byte of it every 250 ms, and connects again when closed.

During (a) and (b) it also measures what the flooding sandbox makes the
daemon write: each flood first runs once for the window's length with
nothing else going on, and the growth of <data-dir>/audit/* plus the SQLite
database and its WAL from its start until its events are written (for
(a), until the 10 s aggregation interval it ended in has been summed up)
is divided by the flood's length (target <= 10 KB/s, 1 KB = 1000 bytes).
For a cross-check it also prints the bytes the daemon caused to be written
to storage over the same time (/proc/PID/io write_bytes): SQLite writes a
WAL again from its start after each checkpoint, which file sizes do not
show. The daemon's RSS (and the egress worker's) is sampled every 100 ms:
before, peak and after each phase.

A miss is reported as a miss; the exit code is 0 unless something failed
(a daemon that does not start, a probe request that failed, a sandbox left
behind). Every sandbox is deleted and every helper process stopped at the
end, also on Ctrl-C.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import (  # noqa: E402 (the same HTTP client and statistics as bench/daemon.py)
    ApiError, BenchError, Client, Interrupted, cmdline, default_airlock, loadavg, mem_kib,
    run_and_clean_up, summary, verdict)

TARGET_RATIO = 2.0
TARGET_AUDIT_BPS = 10_000
IDLE_CONNECTIONS = 20_000
SLOWLORIS = 200
FLOOD_NAME = "site.test"  # the one name the flooding sandbox may resolve

# Three threads sending queries of random names under a denied domain to
# the sandbox's resolver for argv[1] seconds, as fast as they can, without
# waiting for answers; prints how many were sent.
DNS_FLOOD = r"""
import os, socket, sys, threading, time
seconds = float(sys.argv[1])
sent = [0, 0, 0]
def flood(k):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    end = time.time() + seconds
    while time.time() < end:
        label = os.urandom(12).hex().encode()
        q = (os.urandom(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + bytes([len(label)])
             + label + b"\x04evil\x04test\x00\x00\x01\x00\x01")
        try:
            s.sendto(q, ("127.0.0.1", 53)); sent[k] += 1
        except PermissionError:
            sent[k] += 1  # sent, and dropped by the namespace's flood rule
        except BlockingIOError:
            time.sleep(0.0005)
        try:
            while True: s.recv(512)
        except BlockingIOError:
            pass
threads = [threading.Thread(target=flood, args=(k,)) for k in range(3)]
[t.start() for t in threads]; [t.join() for t in threads]
print(sum(sent))
"""

# A client process running argv[6] (`yes`) in sandbox argv[4] through exec
# after exec for argv[5] seconds or argv[7] execs, whichever comes first,
# reading each answer whole; prints the bytes of output read, the execs run
# and the seconds taken. (Its own process, so the probes' latency is not
# this reader's.)
OUTPUT_READER = r"""
import http.client, json, sys, time
host, port, key, sid, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
cmd, most = sys.argv[6], int(sys.argv[7])
body = json.dumps({"cmd": cmd, "timeout_s": max(1, int(seconds))})
conn = http.client.HTTPConnection(host, port, timeout=120)
total = execs = 0
t0 = time.monotonic()
while time.monotonic() - t0 < seconds and execs < most:
    conn.request("POST", f"/v1/sandboxes/{sid}/exec", body=body,
                 headers={"X-API-Key": key, "Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"exec: HTTP {resp.status}: {resp.read()[:200]!r}")
    last = b""
    while True:
        chunk = resp.read1(1 << 20)
        if not chunk:
            break
        total += len(chunk)
        last = (last + chunk)[-4096:]
    if b'"exited"' not in last:
        sys.exit(f"the exec stream ended without its exit: {last[-300:]!r}")
    execs += 1
print(total, execs, time.monotonic() - t0)
"""

# A process holding argv[4] connections from source address argv[1] to
# argv[2]:argv[3] until it is killed; prints how many it opened and how
# many connects failed.
HOLDER = r"""
import socket, sys, time
src, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held, failed = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.bind((src, 0)); s.connect((host, port)); held.append(s)
    except OSError:
        failed += 1; s.close()
print(len(held), failed, flush=True)
time.sleep(3600)
"""


# ---------------------------------------------------------------- a private daemon

class KeyView:
    """What bench/daemon.py's Client needs: where the daemon is, the key to
    send, and where to record what it creates."""

    def __init__(self, daemon, key):
        self.daemon, self.key = daemon, key
        self.host, self.port = daemon.host, daemon.port

    def track(self, sid):
        self.daemon.track(sid, self.key)

    def untrack(self, sid):
        self.daemon.untrack(sid)


class Daemon:
    """A private `airlock serve`: fresh data directory, 127.0.0.1 on a free
    port. bench/soak.py uses it too."""

    def __init__(self, airlock, extra=(), prefix="airlock-flood-"):
        self.airlock, self.extra, self.prefix = airlock, list(extra), prefix
        self.lock = threading.Lock()
        self.live = {}  # sandbox id -> the key that created it
        self.all_ids = set()
        self.host, self.port, self.key, self.proc = "127.0.0.1", None, None, None
        self.tmp = self.data = self.owner = None

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix=self.prefix)
        self.data = os.path.join(self.tmp, "data")
        log_path = os.path.join(self.tmp, "daemon.log")
        argv = [self.airlock, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data,
                *self.extra]
        self.log = open(log_path, "wb")
        env = dict(os.environ, AIRLOCK_LOG=os.environ.get("AIRLOCK_LOG", "warn"))
        # Own session: a Ctrl-C must not stop the daemon before the
        # sandboxes are deleted.
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, env=env, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            with open(log_path, "rb") as f:
                text = f.read()
            m = re.search(rb"serving on http://([0-9.]+):(\d+)", text)
            if m:
                self.port = int(m.group(2))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {self.proc.returncode}" if self.proc.returncode is not None
                       else "did not report its address within 20 s")
                raise BenchError(f"the daemon {why}: {' '.join(argv)}\n"
                                 f"{text.decode(errors='replace')[-2000:]}")
            time.sleep(0.02)
        with open(os.path.join(self.data, "admin.key")) as f:
            self.key = f.read().strip()
        # Supervisors carry `--owner <instance>`; their sockets live under
        # /run/airlock/sockets/<instance>.
        with open(os.path.join(self.data, "instance")) as f:
            self.owner = f.read().strip()

    @property
    def pid(self):
        return self.proc.pid

    def admin(self):
        return KeyView(self, self.key)

    def add_key(self, name):
        """A new non-admin key, made the way an operator makes one."""
        out = subprocess.run([self.airlock, "keys", "create", name, "--data-dir", self.data],
                             capture_output=True, text=True)
        keys = [w for w in out.stdout.split() if w.startswith(("e2b_", "al_"))]
        if out.returncode != 0 or not keys:
            raise BenchError(f"airlock keys create failed ({out.returncode}): {out.stderr}")
        return KeyView(self, keys[0])

    def track(self, sid, key):
        with self.lock:
            self.live[sid] = key
            self.all_ids.add(sid)

    def untrack(self, sid):
        with self.lock:
            self.live.pop(sid, None)

    def supervisors(self):
        """Pids of the supervisors this daemon started (spares included)
        that are alive, wherever they were reparented."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                args = cmdline(int(entry))
                if "supervise" in args and "--owner" in args:
                    i = args.index("--owner")
                    if i + 1 < len(args) and args[i + 1] == self.owner:
                        found.append(int(entry))
        return found

    def log_tail(self):
        try:
            with open(os.path.join(self.tmp, "daemon.log"), "rb") as f:
                return f.read().decode(errors="replace")[-2000:]
        except (OSError, TypeError):
            return ""

    def cleanup(self):
        """Deletes every sandbox this run created (with the key that created
        it), then stops the daemon. Returns a list of problems."""
        problems = []
        if self.proc is not None and self.proc.poll() is None and self.key:
            admin = Client(self.admin())
            with self.lock:
                pending = dict(self.live)
            try:
                cursor = None
                while True:
                    path = "/v1/sandboxes?state=creating,running,paused,stopping&limit=100"
                    if cursor:
                        path += f"&cursor={cursor}"
                    page = json.loads(admin.get(path))
                    for item in page.get("items", []):
                        pending.setdefault(item["id"], self.key)
                    cursor = page.get("next_cursor")
                    if not cursor:
                        break
            except (BenchError, OSError, ValueError) as e:
                problems.append(f"could not list sandboxes: {e}")
            for sid, key in sorted(pending.items()):
                c = Client(KeyView(self, key))
                try:
                    c.delete(sid)
                except (BenchError, OSError) as e:
                    problems.append(f"could not delete {sid}: {e}")
                c.close()
            admin.close()
        elif self.live:
            problems.append(f"the daemon is gone; {len(self.live)} sandboxes may be left")
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.log.close()
        # Spare supervisors end with their daemon; give them a moment.
        deadline = time.monotonic() + 5
        while self.owner and self.supervisors() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.owner and self.supervisors():
            problems.append(f"supervisors left running: pids {self.supervisors()}")
        left = [sid for sid in self.all_ids if cgroup_dirs_of(sid)]
        if left:
            problems.append(f"{len(left)} sandbox cgroups left, e.g. airlock/{left[0]}")
        if self.tmp:
            if problems:
                problems.append(f"kept {self.tmp} (data directory and daemon.log)")
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return problems


def cgroup_roots():
    """The airlock parent cgroup of each controller the jail uses (memory,
    cpu, cpuacct, pids on cgroup v1; the unified tree on v2), read from the
    mount table as crates/jail/src/cgroup.rs does."""
    v1, v2 = {}, None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, sep, right = line.partition(" - ")
            if not sep:
                continue
            point = left.split(" ")[4].replace("\\040", " ")
            fields = right.split(" ")
            if fields[0] == "cgroup":
                for c in fields[2].strip().split(","):
                    v1.setdefault(c, point)
            elif fields[0] == "cgroup2" and v2 is None:
                v2 = point
    if all(c in v1 for c in ("memory", "cpu", "cpuacct", "pids")):
        roots = [v1[c] for c in ("memory", "cpu", "cpuacct", "pids")]
    else:
        roots = [v2] if v2 else []
    return [os.path.join(r, "airlock") for r in dict.fromkeys(roots)]


def cgroup_dirs_of(sid):
    return [d for d in (os.path.join(r, sid) for r in cgroup_roots()) if os.path.isdir(d)]


def rss_mib(pid):
    rss, _ = mem_kib(pid)
    return None if rss is None else rss / 1024


def egress_worker(daemon_pid):
    """The pid of the daemon's egress worker, if one runs."""
    try:
        with open(f"/proc/{daemon_pid}/task/{daemon_pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return None
    for kid in kids:
        if "egress-worker" in cmdline(kid):
            return kid
    return None


# ---------------------------------------------------------------- measuring

def trail_bytes(data):
    """(audit streams, SQLite database + WAL) sizes in bytes. The WAL is
    checkpointed into the database first (from this process: SQLite lets
    any connection do it), or its size, which grows in steps and never
    shrinks on its own, would measure when it last grew, not what was
    written."""
    try:
        db_conn = sqlite3.connect(os.path.join(data, "airlock.db"), timeout=5)
        try:
            db_conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            db_conn.close()
    except sqlite3.Error:
        pass
    audit = 0
    adir = os.path.join(data, "audit")
    for name in os.listdir(adir):
        try:
            audit += os.path.getsize(os.path.join(adir, name))
        except OSError:
            pass
    db = 0
    for name in ("airlock.db", "airlock.db-wal"):
        try:
            db += os.path.getsize(os.path.join(data, name))
        except OSError:
            pass
    return audit, db


def io_write_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class RssSampler:
    """Samples the RSS of the daemon and of its egress worker every 100 ms."""

    def __init__(self, pid):
        self.pid = pid
        self.stop = threading.Event()
        self.peak = {"daemon": 0.0, "worker": 0.0}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        now = {"daemon": rss_mib(self.pid) or 0.0}
        worker = egress_worker(self.pid)
        now["worker"] = (rss_mib(worker) or 0.0) if worker else 0.0
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)
        return now

    def run(self):
        while not self.stop.wait(0.1):
            self.sample()

    def __enter__(self):
        self.before = self.sample()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.after = self.sample()

    def result(self):
        return {k: {"before": self.before[k], "peak": self.peak[k], "after": self.after[k]}
                for k in self.peak}


class Probes:
    """The two measured clients: /healthz every 10 ms with the admin key,
    and another tenant's create + delete back to back."""

    def __init__(self, daemon, tenant):
        self.daemon, self.tenant = daemon, tenant
        self.health = Client(daemon.admin())
        self.other = Client(tenant)

    def run(self, seconds):
        stop = threading.Event()
        health, pairs, creates, errors = [], [], [], []

        def healthz():
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    self.health.get("/healthz")
                    health.append(time.perf_counter() - t0)
                except (BenchError, OSError) as e:
                    errors.append(f"healthz: {e}")
                stop.wait(0.01)

        def tenant():
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    sid = self.other.create({})
                    t1 = time.perf_counter()
                    self.other.delete(sid)
                    pairs.append(time.perf_counter() - t0)
                    creates.append(t1 - t0)
                except (BenchError, OSError) as e:
                    errors.append(f"tenant create+delete: {e}")
                    stop.wait(0.1)

        threads = [threading.Thread(target=f, daemon=True) for f in (healthz, tenant)]
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(120)
        return {"healthz": summary(health), "pair": summary(pairs), "create": summary(creates),
                "errors": errors}

    def close(self):
        self.health.close()
        self.other.close()


def trail_mark(daemon):
    audit, db = trail_bytes(daemon.data)
    return audit, db, io_write_bytes(daemon.pid), time.monotonic()


def trail_since(daemon, mark, flood_s):
    """What the daemon wrote since `mark`, in which nothing but one flood of
    `flood_s` seconds ran, per second of flood: bytes/s of the audit
    streams, of the database + WAL, and the daemon's storage writes."""
    a0, d0, w0, t0 = mark
    a1, d1 = trail_bytes(daemon.data)
    w1 = io_write_bytes(daemon.pid)
    return {"seconds": time.monotonic() - t0, "flood_s": flood_s,
            "audit_bps": (a1 - a0) / flood_s, "db_bps": (d1 - d0) / flood_s,
            "files_bps": (a1 + d1 - a0 - d0) / flood_s,
            "io_write_bps": None if w0 is None or w1 is None else (w1 - w0) / flood_s}


def exec_body(script_argv, timeout_s):
    return {"cmd": script_argv[0], "args": script_argv[1:], "timeout_s": timeout_s}


def stdout_of(payload):
    text = ""
    for line in payload.split(b"\n"):
        if line.strip():
            event = json.loads(line)
            if event.get("type") == "stdout":
                text += event.get("data", "")
    return text


class Bench:
    def __init__(self, args):
        self.args = args
        self.daemon = Daemon(args.airlock, ["--egress-host", f"{FLOOD_NAME}=203.0.113.9"])
        self.helpers = []  # child processes to stop at the end

    def phase(self, name, seconds, during=None):
        """Probes for `seconds` with the daemon's RSS sampled throughout."""
        with RssSampler(self.daemon.pid) as rss:
            got = self.probes.run(seconds)
        got["rss"] = rss.result()
        got["name"] = name
        if during:
            got.update(during)
        return got

    def until_the_interval_rolled(self, end):
        """Sleeps until the audit aggregation interval that `end` (a time.time())
        falls in has ended and been written (10 s intervals on the wall clock,
        ended by the writer's 1 s tick)."""
        rolled = (int(end // AUDIT_INTERVAL_S) + 1) * AUDIT_INTERVAL_S + 2.0
        time.sleep(max(0.0, rolled - time.time()))

    def dns_flood(self, d):
        """(a): the flood runs twice for d seconds: once alone, for what it
        makes the daemon write (measured until the aggregation interval it
        ended in has been summed up, divided by d), then with the probes."""
        admin = Client(self.daemon.admin())
        sid = admin.create({"network": {"mode": "allow", "rules": [FLOOD_NAME]}})
        result = {"sent": 0}

        def flood():
            try:
                status, payload = admin._request(
                    "POST", f"/v1/sandboxes/{sid}/exec",
                    exec_body(["python3", "-c", DNS_FLOOD, str(d)], int(d + 30)))
                if status != 200:
                    result["error"] = f"exec: HTTP {status}: {payload[:200]!r}"
                else:
                    result["sent"] += int(stdout_of(payload).strip() or 0)
            except (BenchError, OSError, ValueError) as e:
                result["error"] = f"the flood's exec: {e}"

        with RssSampler(self.daemon.pid) as rss:
            before = trail_mark(self.daemon)
            flood()
            self.until_the_interval_rolled(time.time())
            trail = trail_since(self.daemon, before, d)
            thread = threading.Thread(target=flood, daemon=True)
            thread.start()
            time.sleep(0.3)  # the exec has started
            got = self.probes.run(d)
            thread.join(d + 60)
        got["rss"] = rss.result()
        admin.delete(sid)
        admin.close()
        if "error" in result:
            got["errors"].append(result["error"])
        got.update({"name": "dns flood", "trail": trail, "flood_s": 2 * d,
                    "queries": result["sent"],
                    "suppressed": metric(self.daemon, "airlock_audit_suppressed_events")})
        return got

    def output_flood(self, d):
        """(b): execs of `yes` one after another for d seconds, each read
        whole by a client process (an exec's output stops at the daemon's
        per-stream cap, --output-limit, 16M by default), twice: alone (what
        it makes the daemon write), then with the probes.

        Every exec is a call of the client's, and its access and runtime
        events are written whatever the sandbox does: a client looping
        `true` writes them faster. So the alone run is followed by as many
        execs of `true` (the control), and what the sandbox's output made
        the daemon write is the difference."""
        admin = Client(self.daemon.admin())
        sid = admin.create({})
        reads, errors = [], []

        def start(cmd="yes", most=10**9):
            reader = subprocess.Popen(
                [sys.executable, "-c", OUTPUT_READER, self.daemon.host, str(self.daemon.port),
                 self.daemon.key, sid, str(d), cmd, str(most)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.helpers.append(reader)
            return reader

        def finish(reader, into=reads):
            out, err = reader.communicate(timeout=d + 120)
            fields = out.split()
            if reader.returncode != 0 or len(fields) != 3:
                errors.append(f"the output flood's reader: exit {reader.returncode} {out} {err}")
            else:
                into.append((int(fields[0]), int(fields[1]), float(fields[2])))

        with RssSampler(self.daemon.pid) as rss:
            before = trail_mark(self.daemon)
            finish(start())
            time.sleep(2.0)  # events of its end written
            trail = trail_since(self.daemon, before, d)
            control = []
            if reads:
                before = trail_mark(self.daemon)
                finish(start("true", reads[0][1]), into=control)
                time.sleep(2.0)
                client = trail_since(self.daemon, before, d)
                trail["client_bps"] = client["files_bps"]
                trail["sandbox_bps"] = trail["files_bps"] - client["files_bps"]
                trail["per_exec"] = client["files_bps"] * d / max(1, reads[0][1])
            reader = start()
            time.sleep(0.3)
            got = self.probes.run(d)
            finish(reader)
        got["rss"] = rss.result()
        admin.delete(sid)
        admin.close()
        got["errors"] += errors
        read = sum(r[0] for r in reads)
        took = sum(r[2] for r in reads)
        got.update({"name": "output flood", "trail": trail, "flood_s": took,
                    "read_bytes": read, "execs": sum(r[1] for r in reads),
                    "read_mib_s": read / took / 2**20 if took else 0.0})
        return got

    def idle_connections(self, d):
        """(c): 20,000 idle connections from 3 processes and 3 addresses."""
        per = [IDLE_CONNECTIONS // 3 + (1 if i < IDLE_CONNECTIONS % 3 else 0) for i in range(3)]
        evicted0 = metric(self.daemon, "airlock_http_connections_evicted_total")
        t0 = time.monotonic()
        holders = []
        for i, n in enumerate(per):
            p = subprocess.Popen([sys.executable, "-c", HOLDER, f"127.0.1.{i + 1}",
                                  self.daemon.host, str(self.daemon.port), str(n)],
                                 stdout=subprocess.PIPE, text=True)
            holders.append(p)
            self.helpers.append(p)
        opened = failed = 0
        for p in holders:
            line = p.stdout.readline().split()
            if len(line) != 2:
                raise BenchError("a connection holder died before opening its connections")
            opened += int(line[0])
            failed += int(line[1])
        open_s = time.monotonic() - t0
        during = {"opened": opened, "connect_failed": failed, "open_s": open_s}
        got = self.phase("20,000 idle connections", d, during)
        got["daemon_connections"] = metric(self.daemon, "airlock_http_connections")
        got["evicted"] = metric(self.daemon, "airlock_http_connections_evicted_total") - evicted0
        for p in holders:
            p.kill()
            p.wait()
        return got

    def slowloris(self, d):
        """(d): 200 clients sending their head a byte at a time."""
        stop = threading.Event()
        counts = {"closed": 0, "connects": 0}
        target = (self.daemon.host, self.daemon.port)

        def connect():
            s = socket.create_connection(target, timeout=10)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            counts["connects"] += 1
            return s

        def run():
            socks = [connect() for _ in range(SLOWLORIS)]
            while not stop.wait(0.25):
                for i, s in enumerate(socks):
                    closed = False
                    try:
                        s.send(b"a")
                        if s.recv(1024) is not None:
                            closed = True  # an answer (408) or EOF
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed = True
                    if closed:
                        s.close()
                        counts["closed"] += 1
                        try:
                            socks[i] = connect()
                        except OSError:
                            socks[i] = connect_later()
            for s in socks:
                s.close()

        def connect_later():
            # A socket that reads as closed, so the next round tries again.
            a, b = socket.socketpair()
            b.close()
            a.setblocking(False)
            return a

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        time.sleep(1.0)  # all 200 connected and trickling
        got = self.phase("200 slowloris clients", d)
        stop.set()
        thread.join(30)
        got.update(counts)
        return got

    def run(self):
        d = self.args.duration
        res = {"airlock": self.args.airlock, "cores": os.cpu_count(), "duration_s": d,
               "load_before": loadavg()}
        self.daemon.start()
        tenant = self.daemon.add_key("bench-flood-tenant")
        self.probes = Probes(self.daemon, tenant)
        self.probes.run(2.0)  # warm-up: spare supervisors, page cache
        phases = [self.phase("no flood", d)]
        phases.append(self.dns_flood(d))
        phases.append(self.output_flood(d))
        phases.append(self.idle_connections(d))
        phases.append(self.slowloris(d))
        phases.append(self.phase("no flood, again", d))
        self.probes.close()
        res["phases"] = phases
        res["daemon_hwm_mib"] = vm_hwm_mib(self.daemon.pid)
        res["load_after"] = loadavg()
        return res

    def cleanup(self):
        for p in self.helpers:
            if p.poll() is None:
                p.kill()
                p.wait()
        return self.daemon.cleanup()


AUDIT_INTERVAL_S = 10  # crates/daemon/src/audit.rs, AuditLimits::default


def metric(daemon, name):
    c = Client(daemon.admin())
    try:
        text = c.get("/metrics").decode()
    finally:
        c.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise BenchError(f"no metric {name}")


def vm_hwm_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- report

def verdicts(res):
    phases = res["phases"]
    base = phases[0]
    rows = []
    for ph in phases:
        for probe, label in (("healthz", "/healthz p99"), ("pair", "tenant create+delete p99")):
            s = ph[probe]
            if not s["n"]:
                rows.append((f"{label}, {ph['name']}", "no samples", "", False))
                continue
            if ph is base or ph["name"].startswith("no flood"):
                rows.append((f"{label}, {ph['name']}", f"{s['p99_ms']:.1f} ms", "(baseline)", None))
                continue
            ratio = s["p99_ms"] / base[probe]["p99_ms"]
            rows.append((f"{label}, {ph['name']}", f"{s['p99_ms']:.1f} ms {ratio:.2f}x",
                         f"<= {TARGET_RATIO:g}x", ratio <= TARGET_RATIO))
        if ph["errors"]:
            rows.append((f"failed requests, {ph['name']}", str(len(ph["errors"])), "0", False))
    for ph in phases:
        if "trail" in ph:
            bps = ph["trail"]["files_bps"]
            if "sandbox_bps" in ph["trail"]:
                # The output flood: the target is on what the sandbox's
                # output added; the client's own calls are reported.
                rows.append((f"audit trail growth, {ph['name']}, all", f"{bps / 1000:.2f} KB/s",
                             "(reported)", None))
                rows.append(("  of it the client's execs (control: `true`)",
                             f"{ph['trail']['client_bps'] / 1000:.2f} KB/s", "(reported)", None))
                bps = ph["trail"]["sandbox_bps"]
                rows.append(("  of it the sandbox's output", f"{bps / 1000:.2f} KB/s",
                             f"<= {TARGET_AUDIT_BPS / 1000:g} KB/s", bps <= TARGET_AUDIT_BPS))
            else:
                rows.append((f"audit trail growth, {ph['name']}", f"{bps / 1000:.2f} KB/s",
                             f"<= {TARGET_AUDIT_BPS / 1000:g} KB/s", bps <= TARGET_AUDIT_BPS))
            io = ph["trail"]["io_write_bps"]
            if io is not None:
                rows.append((f"  daemon storage writes, {ph['name']}", f"{io / 1000:.2f} KB/s",
                             "(cross-check)", None))
    peak = max(ph["rss"]["daemon"]["peak"] for ph in phases)
    rows.append(("daemon RSS peak, any phase", f"{peak:.1f} MiB", "(reported)", None))
    return rows


def report(res):
    out = []
    p = out.append
    p(f"airlock flood benchmark: {res['airlock']}  ({res['cores']} cores, {res['duration_s']:g} s "
      f"windows)")
    p(f"load average: before {' '.join(f'{x:.2f}' for x in res['load_before'])}, after "
      f"{' '.join(f'{x:.2f}' for x in res['load_after'])}")
    p("")
    p(f"{'phase':<26}{'healthz p50':>12}{'p99':>9}{'n':>6}{'tenant c+d p50':>16}{'p99':>9}{'n':>5}"
      f"{'daemon RSS before/peak/after MiB':>34}{'worker peak':>12}")
    for ph in res["phases"]:
        h, c, r = ph["healthz"], ph["pair"], ph["rss"]
        hs = f"{h['p50_ms']:>12.2f}{h['p99_ms']:>9.2f}{h['n']:>6}" if h["n"] else f"{'-':>27}"
        cs = f"{c['p50_ms']:>16.2f}{c['p99_ms']:>9.2f}{c['n']:>5}" if c["n"] else f"{'-':>30}"
        rs = f"{r['daemon']['before']:.1f} / {r['daemon']['peak']:.1f} / {r['daemon']['after']:.1f}"
        p(f"{ph['name']:<26}{hs}{cs}{rs:>34}{r['worker']['peak']:>12.1f}")
    p("")
    for ph in res["phases"]:
        if "trail" in ph:
            t = ph["trail"]
            io = "n/a" if t["io_write_bps"] is None else f"{t['io_write_bps'] / 1000:.2f}"
            extra = (f"{ph['queries']} queries in {ph['flood_s']:g} s "
                     f"({ph['queries'] / ph['flood_s']:.0f}/s), {ph['suppressed']:.0f} audit events "
                     f"suppressed" if ph["name"] == "dns flood" and ph.get("queries")
                     else f"{ph['read_bytes'] / 2**20:.0f} MiB of exec answers ({ph['execs']} "
                          f"execs of `yes`) read by the client in {ph['flood_s']:.1f} s "
                          f"({ph['read_mib_s']:.0f} MiB/s)"
                     if "read_bytes" in ph else "")
            p(f"{ph['name']}: {extra}")
            p(f"   written for a {t['flood_s']:g} s flood that was the only activity (measured over "
              f"{t['seconds']:.1f} s), per second of flood: audit streams "
              f"{t['audit_bps'] / 1000:.2f} KB/s, database + WAL {t['db_bps'] / 1000:.2f} KB/s; "
              f"daemon storage writes {io} KB/s")
            if "per_exec" in t:
                p(f"   the same number of execs of `true` wrote {t['client_bps'] / 1000:.2f} KB/s "
                  f"({t['per_exec']:.0f} bytes an exec: the client's calls)")
        if "opened" in ph:
            p(f"{ph['name']}: {ph['opened']} opened in {ph['open_s']:.1f} s "
              f"({ph['connect_failed']} connects failed); the daemon held "
              f"{ph['daemon_connections']:.0f} and evicted {ph['evicted']:.0f}")
        if "connects" in ph:
            p(f"{ph['name']}: {ph['connects']} connections made, {ph['closed']} closed by the "
              f"daemon during the run")
    if res.get("daemon_hwm_mib"):
        p(f"daemon VmHWM at the end (peak RSS of its whole life): {res['daemon_hwm_mib']:.1f} MiB")
    p("")
    p(f"{'metric':<52}{'value':>16}  {'target':<14}verdict")
    for name, value, target, ok in res["verdicts"]:
        p(f"{name:<52}{value:>16}  {target:<14}{'' if ok is None else verdict(ok)}")
    errors = [e for ph in res["phases"] for e in ph["errors"]]
    if errors:
        p("")
        p(f"ERRORS ({len(errors)}):")
        for e in errors[:20]:
            p(f"  {e}")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--airlock", default=default_airlock(), help="the airlock binary")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of each measured window (default 10)")
    parser.add_argument("-n", type=int, default=None,
                        help="not used (bench/run passes it to every benchmark)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the benchmark needs root, like the daemon")
    if not os.access(args.airlock, os.X_OK):
        sys.exit(f"no airlock binary at {args.airlock}: build it (cargo build --release -p airlock) "
                 "or pass --airlock PATH")

    def on_term(signum, frame):
        raise Interrupted()
    signal.signal(signal.SIGTERM, on_term)

    bench = Bench(args)
    status, res, problems = run_and_clean_up(
        bench.run, bench.cleanup, log_tail=bench.daemon.log_tail,
        errors=(BenchError, ApiError, OSError, subprocess.TimeoutExpired))
    if status or problems:
        return status or 1
    res["verdicts"] = verdicts(res)
    failed = any(ph["errors"] for ph in res["phases"])
    if args.json:
        res["verdicts"] = [{"metric": n, "value": v, "target": t,
                            "verdict": None if ok is None else verdict(ok)}
                           for n, v, t, ok in res["verdicts"]]
        print(json.dumps(res))
    else:
        print(report(res))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
