#!/usr/bin/env python3
"""Soak run: many create/destroy cycles against one private daemon, looking
for anything that leaks.

    sudo python3 bench/soak.py [--airlock PATH] [--cycles 10000] [--every 1000] [--clients 4]

Not part of CI or bench/run (10,000 cycles take a few minutes). Starts a
private daemon (release binary, fresh data directory), runs --cycles
create + delete cycles from --clients threads, half of the sandboxes with
network `none` and half with an `allow` policy (their own network
namespace, veth pair and egress listeners), and after a warm-up, every
--every cycles and at the end, with no request in flight and the
daemon's spare supervisors back, records:

 - the daemon's open descriptors (/proc/PID/fd) and the egress worker's;
 - mounts: lines of the host's /proc/self/mountinfo mentioning airlock;
 - cgroups: directories under the airlock parent of each controller the
   jail uses (crates/jail/src/cgroup.rs), those of this run's sandboxes
   and all of them (other daemons on the machine have theirs);
 - network namespaces held by this daemon's processes (the daemon, its
   egress worker, its supervisors and what runs under them) other than the
   host's, and veth interfaces on the host;
 - supervisors alive (`airlock supervise --owner <this daemon>`), their
   agent sockets (/run/airlock/sockets/<owner>) and slot records
   (/run/airlock/slots) of this run's sandboxes;
 - the daemon's RSS (and the egress worker's), and the size of its data
   directory (the store keeps dead sandboxes' records, by design).

At the end it prints the growth of each from the first sample (target:
0 for every count; RSS flat, i.e. no more than max(4 MiB, 5%) of growth
over the second half of the run, where a leak shows and warm-up does not)
with PASS/MISS. Exit code 0 unless something failed; every sandbox is
deleted and the daemon stopped at the end, also on Ctrl-C.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import BenchError, Client, Interrupted, default_airlock, mem_kib, run_and_clean_up, verdict  # noqa: E402
from flood import Daemon, cgroup_roots, egress_worker  # noqa: E402 (the same private daemon)

ALLOW = {"mode": "allow", "rules": ["site.test"]}
RUNTIME = "/run/airlock"


def proc_table():
    """{pid: ppid} of every process on the host."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                table[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return table


def descendants(roots, table):
    kids = {}
    for pid, ppid in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += kids.get(pid, [])
    return seen


def netns_of(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def count_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def host_veths():
    n = 0
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/uevent") as f:
                if "DEVTYPE=veth" in f.read():
                    n += 1
        except OSError:
            pass
    return n


def sample(daemon, cycles):
    pid = daemon.pid
    worker = egress_worker(pid)
    table = proc_table()
    supervisors = daemon.supervisors()
    ours = descendants([pid, *supervisors], table)
    host_ns = netns_of(1)
    netns = {ns for ns in (netns_of(p) for p in ours) if ns and ns != host_ns}
    with open("/proc/self/mountinfo") as f:
        mounts = sum("airlock" in line for line in f)
    cg_ours = cg_all = 0
    for root in cgroup_roots():
        try:
            names = [n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n))]
        except OSError:
            continue
        cg_all += len(names)
        cg_ours += sum(n in daemon.all_ids for n in names)
    try:
        sockets = len(os.listdir(os.path.join(RUNTIME, "sockets", daemon.owner)))
    except OSError:
        sockets = 0
    slots = 0
    try:
        for name in os.listdir(os.path.join(RUNTIME, "slots")):
            try:
                with open(os.path.join(RUNTIME, "slots", name)) as f:
                    text = f.read()
                if text and json.loads(text).get("id") in daemon.all_ids:
                    slots += 1
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    rss, _ = mem_kib(pid)
    wrss = mem_kib(worker)[0] if worker else None
    data = 0
    for dirpath, _, files in os.walk(daemon.data):
        for name in files:
            try:
                data += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return {"cycles": cycles, "daemon_fds": count_fds(pid),
            "worker_fds": count_fds(worker) if worker else 0, "mounts": mounts,
            "cgroups": cg_ours, "cgroups_all": cg_all, "netns": len(netns),
            "veths_host": host_veths(), "supervisors": len(supervisors), "sockets": sockets,
            "slots": slots, "rss_mib": (rss or 0) / 1024,
            "worker_rss_mib": (wrss or 0) / 1024, "data_mib": data / 2**20}


COLUMNS = [("cycles", "cycles", "d"), ("daemon_fds", "fds", "d"), ("worker_fds", "wfds", "d"),
           ("mounts", "mounts", "d"), ("cgroups", "cgroups", "d"), ("cgroups_all", "(all)", "d"),
           ("netns", "netns", "d"), ("veths_host", "veths", "d"),
           ("supervisors", "supvs", "d"), ("sockets", "socks", "d"), ("slots", "slots", "d"),
           ("rss_mib", "RSS MiB", ".1f"), ("worker_rss_mib", "wRSS", ".1f"),
           ("data_mib", "data MiB", ".1f")]
COUNTS = ["daemon_fds", "worker_fds", "mounts", "cgroups", "netns", "veths_host",
          "supervisors", "sockets", "slots"]


def row(s):
    return "".join(f"{format(s[k], fmt):>{max(len(h) + 2, 8)}}" for k, h, fmt in COLUMNS)


def header():
    return "".join(f"{h:>{max(len(h) + 2, 8)}}" for _, h, _ in COLUMNS)


class Soak:
    def __init__(self, args):
        self.args = args
        self.daemon = Daemon(args.airlock, ["--egress-host", "site.test=203.0.113.9"],
                             prefix="airlock-soak-")
        self.errors = []
        self.done = 0
        self.lock = threading.Lock()

    def batch(self, n, start):
        """n cycles from the client threads; cycle k (counted from the
        run's start) has network `none` when k is even, `allow` when odd."""
        todo = iter(range(start, start + n))
        stop = threading.Event()

        def client(_):
            c = Client(self.daemon.admin())
            try:
                while not stop.is_set():
                    with self.lock:
                        k = next(todo, None)
                    if k is None:
                        return
                    try:
                        sid = c.create({"network": {"mode": "none"} if k % 2 == 0 else ALLOW})
                        c.delete(sid)
                        with self.lock:
                            self.done += 1
                    except (BenchError, OSError) as e:
                        with self.lock:
                            self.errors.append(f"cycle {k}: {e}")
                            if len(self.errors) >= 20:
                                stop.set()
            finally:
                c.close()

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.errors and stop.is_set():
            raise BenchError(f"{len(self.errors)} cycles failed, e.g. {self.errors[0]}")

    def settle(self):
        """Waits until nothing of the cycles is still going away: the
        daemon's supervisors are back to its spares (at most one of each
        kind) and stay so, up to 10 s."""
        deadline = time.monotonic() + 10
        time.sleep(0.5)
        while time.monotonic() < deadline and len(self.daemon.supervisors()) > 2:
            time.sleep(0.1)
        time.sleep(0.5)

    def run(self):
        a = self.args
        self.daemon.start()
        self.batch(a.warmup, 0)
        self.settle()
        t0 = time.monotonic()
        samples = [sample(self.daemon, 0)]
        out = sys.stderr if a.json else sys.stdout
        print(header(), file=out, flush=True)
        print(row(samples[0]), file=out, flush=True)
        while self.done - a.warmup < a.cycles:
            n = min(a.every, a.cycles - (self.done - a.warmup))
            self.batch(n, self.done)
            self.settle()
            s = sample(self.daemon, self.done - a.warmup)
            samples.append(s)
            rate = (self.done - a.warmup) / (time.monotonic() - t0)
            print(row(s) + f"   ({rate:.0f} cycles/s)", file=out, flush=True)
        return {"airlock": a.airlock, "cycles": self.done - a.warmup, "warmup": a.warmup,
                "clients": a.clients, "elapsed_s": time.monotonic() - t0, "samples": samples,
                "errors": self.errors}


def verdicts(res):
    first, last = res["samples"][0], res["samples"][-1]
    mid = res["samples"][len(res["samples"]) // 2] if len(res["samples"]) > 2 else first
    rows = []
    for k in COUNTS:
        grown = last[k] - first[k]
        rows.append((f"growth of {k}", f"{grown:+d}", "0", grown <= 0))
    rows.append(("growth of cgroups of any daemon (context)",
                 f"{last['cgroups_all'] - first['cgroups_all']:+d}", "(shared)", None))
    total = last["rss_mib"] - first["rss_mib"]
    rows.append(("daemon RSS growth, whole run", f"{total:+.1f} MiB", "(report)", None))
    half = last["rss_mib"] - mid["rss_mib"]
    bound = max(4.0, 0.05 * mid["rss_mib"])
    rows.append((f"daemon RSS growth, cycles {mid['cycles']}-{last['cycles']}",
                 f"{half:+.1f} MiB", f"<= {bound:.1f} MiB", half <= bound))
    rows.append(("egress worker RSS growth, whole run",
                 f"{last['worker_rss_mib'] - first['worker_rss_mib']:+.1f} MiB", "(report)", None))
    rows.append(("data directory growth (dead sandboxes' records)",
                 f"{last['data_mib'] - first['data_mib']:+.1f} MiB", "(report)", None))
    if res["errors"]:
        rows.append(("failed cycles", str(len(res["errors"])), "0", False))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--airlock", default=default_airlock(), help="the airlock binary")
    parser.add_argument("--cycles", type=int, default=10_000, help="create/destroy cycles")
    parser.add_argument("--every", type=int, default=1000, help="cycles between samples")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--warmup", type=int, default=20,
                        help="cycles before the first sample (spares, egress worker, caches)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the soak run needs root, like the daemon")
    if not os.access(args.airlock, os.X_OK):
        sys.exit(f"no airlock binary at {args.airlock}: build it (cargo build --release -p airlock) "
                 "or pass --airlock PATH")

    def on_term(signum, frame):
        raise Interrupted()
    signal.signal(signal.SIGTERM, on_term)

    soak = Soak(args)
    status, res, problems = run_and_clean_up(
        soak.run, soak.daemon.cleanup, log_tail=soak.daemon.log_tail,
        errors=(BenchError, OSError))
    if status:
        return status
    res["verdicts"] = verdicts(res)
    if args.json:
        res["verdicts"] = [{"metric": n, "value": v, "target": t,
                            "verdict": None if ok is None else verdict(ok)}
                           for n, v, t, ok in res["verdicts"]]
        print(json.dumps(res))
    else:
        print("")
        print(f"{res['cycles']} cycles (after {res['warmup']} of warm-up) from {res['clients']} "
              f"clients in {res['elapsed_s']:.0f} s; counts are of this daemon's own unless "
              "marked")
        print(f"{'metric':<50}{'value':>12}  {'target':<14}verdict")
        for name, value, target, ok in res["verdicts"]:
            print(f"{name:<50}{value:>12}  {target:<14}{'' if ok is None else verdict(ok)}")
    return 1 if problems or res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
