#!/usr/bin/env python3
"""Benchmark of templates (issue 12), in one run against one daemon:

- create + exec `true` + destroy from an imported template (a static
  busybox image, three layers) against the same from `host`, interleaved
  so both see the same machine (target: template/host <= 1.1x at p50);
- the disk 50 live sandboxes of that template take: the store's copy of
  its layers plus their writable layers, against one copy of the layers
  (target: one copy plus what the sandboxes wrote).

Needs root, busybox-static and btrfs-progs (./scripts/deps). Usage:
    python3 bench/templates.py [--airlock PATH] [-n 100] [--json]
"""

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Client, default_airlock, summary, verdict  # noqa: E402

TARGET_RATIO = 1.1
LIVE = 50


def layer_tar(entries):
    """entries: (name, kind, data_or_target, mode, uid) → an uncompressed layer."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, data, mode, uid in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, 1_700_000_000
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def image_archive():
    with open("/bin/busybox", "rb") as f:
        busybox = f.read()
    base = [("bin", "dir", None, 0o755, 0), ("bin/busybox", "file", busybox, 0o755, 0)]
    base += [(f"bin/{t}", "link", "busybox", 0o777, 0) for t in ("sh", "true", "ls", "cat", "echo")]
    etc = [("etc", "dir", None, 0o755, 0),
           ("etc/passwd", "file", b"root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n", 0o644, 0),
           ("etc/group", "file", b"root:x:0:\nuser:x:1000:\n", 0o644, 0)]
    data = [("opt", "dir", None, 0o755, 0),
            ("opt/data.bin", "file", os.urandom(8 << 20), 0o644, 0)]
    layers = [layer_tar(base), layer_tar(etc), layer_tar(data)]
    diff_ids = ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        def add(name, blob):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        add("config.json", config)
        names = []
        for i, l in enumerate(layers):
            names.append(f"l{i}/layer.tar")
            add(names[-1], l)
        add("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["bb:1"],
                                          "Layers": names}]).encode())
    return out.getvalue(), sum(len(l) for l in layers)


class Daemon:
    def __init__(self, airlock, extra=()):
        self.tmp = tempfile.mkdtemp(prefix="airlock-bench-templates-")
        self.data = os.path.join(self.tmp, "data")
        self.log = open(os.path.join(self.tmp, "daemon.log"), "wb")
        self.proc = subprocess.Popen(
            [airlock, "serve", "--listen", "127.0.0.1:0", "--data-dir", self.data, *extra],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
            env=dict(os.environ, AIRLOCK_LOG="warn"), start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            with open(self.log.name, "rb") as f:
                m = re.search(rb"serving on http://([0-9.]+):(\d+)", f.read())
            if m:
                self.host, self.port = m.group(1).decode(), int(m.group(2))
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"the daemon did not start; see {self.log.name}")
            time.sleep(0.05)
        with open(os.path.join(self.data, "admin.key")) as f:
            self.key = f.read().strip()
        self.live = set()

    # what daemon.Client needs of a bench
    def track(self, sid):
        self.live.add(sid)

    def untrack(self, sid):
        self.live.discard(sid)

    def stop(self):
        client = Client(self)
        for sid in list(self.live):
            try:
                client.delete(sid)
            except Exception:  # noqa: BLE001 (best effort at the end)
                pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["umount", "-l", os.path.join(self.data, "disk")],
                       stderr=subprocess.DEVNULL, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


def import_busybox(daemon, airlock, name="bb"):
    """Imports image_archive() into `daemon` as template `name`."""
    archive, _ = image_archive()
    path = os.path.join(daemon.tmp, f"{name}.tar")
    with open(path, "wb") as f:
        f.write(archive)
    subprocess.run([airlock, "template", "import", path, "--name", name,
                    "--url", f"http://{daemon.host}:{daemon.port}", "--api-key", daemon.key],
                   check=True, capture_output=True)


def du_bytes(path):
    out = subprocess.run(["du", "-sxb", path], capture_output=True, text=True, check=False)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=100, help="cycles per template")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--writable-layers", choices=("disk", "memory"), default="disk",
                        help="where the daemon keeps writable layers (to tell their cost apart)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/templates.py needs root (sandboxes, the disk store)")
    daemon = Daemon(args.airlock, ["--writable-layers", args.writable_layers])
    try:
        archive, layer_bytes = image_archive()
        path = os.path.join(daemon.tmp, "bb.tar")
        with open(path, "wb") as f:
            f.write(archive)
        t0 = time.monotonic()
        subprocess.run([args.airlock, "template", "import", path, "--name", "bb",
                        "--url", f"http://{daemon.host}:{daemon.port}", "--api-key", daemon.key],
                       check=True, capture_output=True)
        import_s = time.monotonic() - t0
        client = Client(daemon)
        times = {"host": [], "bb": []}
        for _ in range(5):  # warm-up
            for t in times:
                sid = client.create({"template": t})
                client.exec_true(sid)
                client.delete(sid)
        for _ in range(args.n):
            for t in times:
                t0 = time.monotonic()
                sid = client.create({"template": t})
                client.exec_true(sid)
                client.delete(sid)
                times[t].append(time.monotonic() - t0)
        stats = {t: summary(v) for t, v in times.items()}
        ratio = stats["bb"]["p50_ms"] / stats["host"]["p50_ms"]

        layers_dir = os.path.join(daemon.data, "layers", "sha256")
        one_copy = du_bytes(layers_dir)
        sids = [client.create({"template": "bb"}) for _ in range(LIVE)]
        for sid in sids:
            client._request("POST", f"/v1/sandboxes/{sid}/exec",
                            {"cmd": "/bin/sh", "args": ["-c", "echo hi > /home/user/x"]})
        uppers = du_bytes(os.path.join(daemon.data, "disk", "sandboxes"))
        with_live = du_bytes(layers_dir) + uppers
        for sid in sids:
            client.delete(sid)
        res = {"n": args.n, "import_s": import_s, "layer_bytes": layer_bytes, "stats": stats,
               "ratio": ratio, "one_copy_bytes": one_copy, "live": LIVE,
               "uppers_bytes": uppers, "with_live_bytes": with_live}
    finally:
        daemon.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"airlock templates benchmark: {args.airlock} ({os.cpu_count()} cores, n={args.n})")
    print(f"import of a 3-layer image ({res['layer_bytes'] / 2**20:.1f} MiB of layers): "
          f"{res['import_s']:.2f} s")
    for t, label in (("host", "host"), ("bb", "template (3 layers)")):
        s = res["stats"][t]
        print(f"  create+exec+destroy from {label:<20} p50 {s['p50_ms']:7.2f} ms  "
              f"p99 {s['p99_ms']:7.2f} ms")
    ok = res["ratio"] <= TARGET_RATIO
    print(f"template / host p50: {res['ratio']:.2f}x (target <= {TARGET_RATIO}x) {verdict(ok)}")
    print(f"disk: one copy of the layers {res['one_copy_bytes'] / 2**20:.1f} MiB; with {LIVE} live "
          f"sandboxes {res['with_live_bytes'] / 2**20:.1f} MiB (their writable layers "
          f"{res['uppers_bytes'] / 2**10:.0f} KiB)")


if __name__ == "__main__":
    main()
