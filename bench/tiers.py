#!/usr/bin/env python3
"""Benchmark of the isolation tiers (issue 13), in one run against one daemon:

- per tier, create + exec `true` + destroy through the API (template
  `host`, a tier at a time), cold and with a warm pool's member claimed
  (the pool refilled between cycles), against the raw runtime (`runsc
  run`, `runc run`) running the same bundle with `true` as its init: the
  config.json airlock wrote for a live sandbox of that tier (namespaces,
  id maps, limits, mounts, masked and read-only paths, the runtime's
  flags), where only what lives in that sandbox's supervisor is replaced
  (the stage its binds come from, by empty directories; the root, by one
  holding the template's `true`, the program the API cycle runs, and
  what its loader maps, at the same paths). Each raw run follows its
  tier's cycle, so both meet the machine in the same state. Targets
  gvisor <= 1.1x raw runsc and oci <= 1.2x raw runc at p50. A minimal
  bundle (busybox, proc and dev, no user namespace, no limits) is timed
  too, for scale;
- the cost of gVisor's boundary on agent work, gvisor against process in
  one live sandbox each: `python3 -c 'import json, sqlite3'`, 1,000 files
  written and read back, `pip --version`;
- the memory (PSS) of an idle sandbox of each tier: every process in its
  cgroup (for gvisor: runsc, the sentry, the gofer).

Needs root, runsc, runc and busybox-static (./scripts/deps). Usage:
    python3 bench/tiers.py [--airlock PATH] [-n 30] [--json]
"""

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Client, default_airlock, summary, verdict  # noqa: E402
from pools import drop_pool, pool, put_pool  # noqa: E402
from templates import Daemon  # noqa: E402

TARGETS = {"gvisor": 1.1, "oci": 1.2}
WORK = {
    "python3 -c 'import json, sqlite3'": "python3 -c 'import json, sqlite3'",
    "1,000 files written and read": "python3 -c \"import os\n"
    "os.makedirs('/tmp/w', exist_ok=True)\n"
    "for i in range(1000):\n    open(f'/tmp/w/{i}', 'w').write('x' * 100)\n"
    "assert sum(len(open(f'/tmp/w/{i}').read()) for i in range(1000)) == 100000\"",
    "pip --version": "python3 -m pip --version",
}


def raw_bundle(tmp, kind):
    """A bundle whose root holds busybox and whose init is `true`."""
    root = os.path.join(tmp, f"raw-{kind}", "root")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
    os.symlink("busybox", os.path.join(root, "bin", "true"))
    config = {
        "ociVersion": "1.0.2",
        "root": {"path": root, "readonly": True},
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/true"],
                    "env": [], "cwd": "/", "noNewPrivileges": True},
        "hostname": "raw",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "mode=755"]}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
    }
    bundle = os.path.dirname(root)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f)
    return bundle


# The PATH of a command run as the sandbox's user (the agent's default).
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def loaded_by(program):
    """The shared objects (the loader included) `program` maps, by path."""
    out = subprocess.run(["ldd", program], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        words = line.replace("=>", " ").split()
        paths += [w for w in words if w.startswith("/")][:1]
    return paths


def replicate(root, path):
    """Makes `path` resolve under `root` as it does on the host: its
    directories and symbolic links recreated, the file at its end copied."""
    path = os.path.normpath(path)
    if path == "/":
        return
    replicate(root, os.path.dirname(path))
    host = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    dest = root + host
    if os.path.lexists(dest):
        return
    if os.path.islink(host):
        link = os.readlink(host)
        os.symlink(link, dest)
        replicate(root, os.path.join(os.path.dirname(host), link))
    elif os.path.isdir(host):
        os.mkdir(dest)
    else:
        shutil.copy(host, dest)


def same_bundle(tmp, kind, sid):
    """The bundle airlock wrote for live sandbox `sid` of this tier, made
    runnable from outside it with `true` as its init (see the module doc)."""
    here = os.path.join("/run/airlock/containers", sid)
    with open(os.path.join(here, "config.json")) as f:
        config = json.load(f)
    bundle = os.path.join(tmp, f"same-{kind}")
    root = os.path.join(bundle, "root")
    os.makedirs(root)
    # The program the API cycle runs (the template's `true`, found in PATH
    # as the agent finds it) and what its loader maps, at the same paths.
    program = shutil.which("true", path=SANDBOX_PATH)
    for path in [program] + loaded_by(program):
        replicate(root, path)
    sources = os.path.join(bundle, "sources")
    os.makedirs(sources)
    for mount in config["mounts"]:
        dest = mount["destination"]
        if not dest.startswith("/dev/"):
            # The root is read-only to the sandbox's root: mount points first.
            os.makedirs(os.path.join(root, dest.lstrip("/")), exist_ok=True)
        source = mount.get("source", "")
        name = dest.strip("/").replace("/", "_")
        if source.startswith("/run/airlock/stage"):
            mount["source"] = os.path.join(sources, name)
            os.makedirs(mount["source"])
        elif source.startswith(here):
            mount["source"] = os.path.join(sources, name)
            shutil.copy(source, mount["source"])
    # The gvisor tier's root preloads its statx shim (a bind of the
    # bundle's): so does this one.
    shim = [m["destination"] for m in config["mounts"] if m["destination"].endswith(".so")]
    if shim:
        os.makedirs(os.path.join(root, "etc"), exist_ok=True)
        with open(os.path.join(root, "etc", "ld.so.preload"), "w") as f:
            f.write("".join(f"{path}\n" for path in shim))
    config["root"] = {"path": root, "readonly": True}
    config["process"].update({"args": [program], "env": [], "cwd": "/", "terminal": False})
    if config["linux"].get("cgroupsPath"):
        config["linux"]["cgroupsPath"] = "/airlock-bench-raw"
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f)
    # The sandbox's root (a mapped uid) walks the path to its root.
    for path in (tmp, bundle, root, sources):
        os.chmod(path, 0o755)
    return bundle


def raw_command(kind, bundle):
    state = os.path.join(bundle, "state")
    if kind == "gvisor":
        return ["runsc", "--root", state, "--platform", "ptrace", "--network", "none",
                "--ignore-cgroups", "run", "--bundle", bundle]
    return ["runc", "--root", state, "run", "--bundle", bundle]


RAW_RUNS = itertools.count()  # container names, unique per run


def raw_once(command):
    """Seconds one raw run of the bundle took, as a fresh container."""
    t0 = time.monotonic()
    subprocess.run(command + [f"raw-{next(RAW_RUNS)}"], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def pss_kib(sid):
    for root in ("/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock"):
        procs = os.path.join(root, sid, "cgroup.procs")
        if os.path.exists(procs):
            break
    total = 0
    with open(procs) as f:
        pids = [p.strip() for p in f if p.strip()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def exec_ms(client, sid, script):
    t0 = time.monotonic()
    status, payload = client._request("POST", f"/v1/sandboxes/{sid}/exec",
                                      {"cmd": "/bin/sh", "args": ["-c", script]})
    elapsed = (time.monotonic() - t0) * 1000
    if isinstance(payload, (bytes, bytearray)):
        payload = payload.decode(errors="replace")
    elif not isinstance(payload, str):
        payload = json.dumps(payload)
    if status != 200 or '"exit_code":0' not in payload.replace(" ", ""):
        raise SystemExit(f"{script!r} failed in {sid}: {status} {payload[-300:]}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=30, help="cycles per tier")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/tiers.py needs root (sandboxes, runtimes)")
    tmp = tempfile.mkdtemp(prefix="airlock-bench-tiers-")
    daemon = Daemon(args.airlock)
    try:
        client = Client(daemon)
        tiers = ("process", "oci", "gvisor")
        for _ in range(3):  # warm-up (and each tier's first spare)
            for t in tiers:
                sid = client.create({"tier": t})
                client.exec_true(sid)
                client.delete(sid)
        same = {}
        for k in ("gvisor", "oci"):
            sid = client.create({"tier": k})
            same[k] = raw_command(k, same_bundle(tmp, k, sid))
            client.delete(sid)
        minimal = {k: raw_command(k, raw_bundle(tmp, k)) for k in ("gvisor", "oci")}
        for k in ("gvisor", "oci"):  # warm-up
            for _ in range(3):
                raw_once(same[k])
                raw_once(minimal[k])
        # A tier at a time (what one tier's teardown leaves running must
        # not land on another's cycles), each raw run right after its
        # tier's cycle through the API, so both see the same state of the
        # machine (its noise moves over seconds).
        times = {t: [] for t in tiers}
        raw = {k: [] for k in same}
        raw_minimal = {k: [] for k in same}
        for t in tiers:
            for _ in range(args.n):
                t0 = time.monotonic()
                sid = client.create({"tier": t})
                client.exec_true(sid)
                client.delete(sid)
                times[t].append(time.monotonic() - t0)
                if t in same:
                    raw[t].append(raw_once(same[t]))
                    raw_minimal[t].append(raw_once(minimal[t]))
        pooled = {t: [] for t in tiers}
        for t in tiers:
            put_pool(client, f"bench-{t}", {"template": "host", "tier": t,
                                             "min_ready": 2, "max": 2, "refill": 2})
        for _ in range(args.n):
            for t in tiers:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    view = pool(client, f"bench-{t}")
                    if view["ready"] >= 2 and view["starting"] == 0:
                        break
                    time.sleep(0.01)
                t0 = time.monotonic()
                sid = client.create({"tier": t})
                client.exec_true(sid)
                client.delete(sid)
                pooled[t].append(time.monotonic() - t0)
        for t in tiers:
            drop_pool(client, f"bench-{t}")
        raw = {k: summary(v) for k, v in raw.items()}
        minimal = {k: summary(v) for k, v in raw_minimal.items()}
        stats = {t: summary(v) for t, v in times.items()}
        pooled = {t: summary(v) for t, v in pooled.items()}
        work = {}
        live = {t: client.create({"tier": t}) for t in ("process", "gvisor")}
        for label, script in WORK.items():
            per = {}
            for t, sid in live.items():
                exec_ms(client, sid, script)  # warm the page cache
                per[t] = min(exec_ms(client, sid, script) for _ in range(3))
            work[label] = per
        time.sleep(1)
        idle = {t: pss_kib(sid) for t, sid in live.items()}
        sid = client.create({"tier": "oci"})
        time.sleep(1)
        idle["oci"] = pss_kib(sid)
        client.delete(sid)
        for sid in live.values():
            client.delete(sid)
        res = {"n": args.n, "stats": stats, "pooled": pooled, "raw": raw,
               "raw_minimal": minimal, "work": work,
               "idle_pss_kib": idle}
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock tiers benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n})")
    for t in ("process", "oci", "gvisor"):
        s = res["stats"][t]
        p = res["pooled"][t]
        print(f"  create+exec+destroy on {t:<8} p50 {s['p50_ms']:8.2f} ms  p99 {s['p99_ms']:8.2f} ms"
              f"   pooled p50 {p['p50_ms']:8.2f} ms  p99 {p['p99_ms']:8.2f} ms")
    for k, name in (("oci", "runc"), ("gvisor", "runsc")):
        r = res["raw"][k]
        ratio = res["stats"][k]["p50_ms"] / r["p50_ms"]
        warm = res["pooled"][k]["p50_ms"] / r["p50_ms"]
        m = res["raw_minimal"][k]
        print(f"  raw `{name} run` of `true`, same bundle p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms"
              f"  -> {k}/raw {ratio:.2f}x cold {verdict(ratio <= TARGETS[k])},"
              f" {warm:.2f}x pooled {verdict(warm <= TARGETS[k])} (target <= {TARGETS[k]}x)")
        print(f"  raw `{name} run` of `true`, minimal bundle p50 {m['p50_ms']:8.2f} ms"
              f"  -> {k}/minimal {res['stats'][k]['p50_ms'] / m['p50_ms']:.2f}x cold")
    print("  agent work, gvisor against process (best of 3):")
    for label, per in res["work"].items():
        print(f"    {label:<36} process {per['process']:8.1f} ms  gvisor {per['gvisor']:8.1f} ms"
              f"  -> {per['gvisor'] / per['process']:.2f}x")
    for t, kib in res["idle_pss_kib"].items():
        print(f"  idle sandbox PSS on {t:<8} {kib / 1024:7.1f} MiB")


if __name__ == "__main__":
    main()
