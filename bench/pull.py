#!/usr/bin/env python3
"""Benchmark of pulls (issue 12), in one run:

- `airlock template pull` of a ~200 MiB image (four gzip layers of
  text-like, compressible data plus busybox) from a local registry
  (Debian's docker-registry on loopback), the store emptied between runs,
  against `skopeo copy` of the same image into a directory (the raw
  peer: it fetches and checks the blobs but unpacks nothing), interleaved
  (target: airlock/skopeo <= 1.2x at the median);
- optionally (`--base`) the `base` template: `airlock template bootstrap`
  from the host's apt sources, first (cold) and then `airlock create
  --template base` once it exists (the cached path of a first use).

Needs root, docker-registry, skopeo and busybox-static (./scripts/deps).
Usage:
    python3 bench/pull.py [--airlock PATH] [-n 5] [--base] [--json]
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Client, default_airlock, verdict  # noqa: E402
from templates import Daemon, layer_tar  # noqa: E402

TARGET_RATIO = 1.2
LAYER_MIB = 48  # four of them: ~200 MiB uncompressed, ~90 MiB as gzip
LAYERS = 4


def text_like(size, seed):
    """Compressible bytes (words from a small vocabulary), like binaries
    and text in real images: gzip takes them to about a third."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(rng.randint(2, 12)))
             for _ in range(4096)]
    out = bytearray()
    while len(out) < size:
        out += b" ".join(rng.choices(words, k=512)) + b"\n"
    return bytes(out[:size])


def oci_layout(directory):
    """An OCI layout of the benchmark image in `directory`; its size."""
    with open("/bin/busybox", "rb") as f:
        busybox = f.read()
    layers = [layer_tar([("bin", "dir", None, 0o755, 0), ("bin/busybox", "file", busybox, 0o755, 0),
                         ("bin/sh", "link", "busybox", 0o777, 0)])]
    for i in range(LAYERS):
        files = [("data", "dir", None, 0o755, 0)]
        for j in range(8):
            files.append((f"data/l{i}-{j}.txt", "file", text_like((LAYER_MIB << 20) // 8, i * 100 + j),
                          0o644, 0))
        layers.append(layer_tar(files))
    blobs = os.path.join(directory, "blobs", "sha256")
    os.makedirs(blobs)

    def put(data):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return "sha256:" + digest, len(data)

    descriptors, total = [], 0
    for layer in layers:
        digest, size = put(gzip.compress(layer, compresslevel=6))
        descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": digest, "size": size})
        total += size
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + hashlib.sha256(l).hexdigest()
                                                 for l in layers]}}).encode()
    config_digest, config_size = put(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": config_digest, "size": config_size},
                           "layers": descriptors}).encode()
    manifest_digest, manifest_size = put(manifest)
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
            "size": manifest_size, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]}, f)
    with open(os.path.join(directory, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    return total


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, tmp):
        self.addr = f"127.0.0.1:{free_port()}"
        config = os.path.join(tmp, "registry.yml")
        with open(config, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                    f"storage:\n  filesystem:\n    rootdirectory: {tmp}/registry\n"
                    f"http:\n  addr: {self.addr}\n  secret: bench\n")
        self.proc = subprocess.Popen(["docker-registry", "serve", config], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(tuple(self.addr.rsplit(":", 1)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("docker-registry did not start")
                time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def timed(command):
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airlock", default=default_airlock())
    parser.add_argument("-n", type=int, default=5, help="pulls of each")
    parser.add_argument("--base", action="store_true", help="also time the base template's build")
    parser.add_argument("--json", action="store_true")
    args, _ = parser.parse_known_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/pull.py needs root (the daemon, the disk store)")
    for tool in ("docker-registry", "skopeo"):
        if not shutil.which(tool):
            raise SystemExit(f"bench/pull.py needs {tool} (./scripts/deps installs it)")
    tmp = tempfile.mkdtemp(prefix="airlock-bench-pull-")
    registry = Registry(tmp)
    daemon = None
    result = {"airlock": args.airlock, "cores": os.cpu_count(), "n": args.n}
    try:
        layout = os.path.join(tmp, "layout")
        result["image_bytes"] = oci_layout(layout)
        image = f"{registry.addr}/bench/big:v1"
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:v1",
                        f"docker://{image}"], check=True)
        daemon = Daemon(args.airlock, ["--insecure-registry", registry.addr])
        env = dict(os.environ, AIRLOCK_URL=f"http://{daemon.host}:{daemon.port}", AIRLOCK_API_KEY=daemon.key)
        airlock_s, skopeo_s = [], []
        for i in range(args.n):
            copy = os.path.join(tmp, f"copy-{i}")
            skopeo_s.append(timed(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                                   f"docker://{image}", f"dir:{copy}"]))
            shutil.rmtree(copy, ignore_errors=True)
            started = time.monotonic()
            subprocess.run([args.airlock, "template", "pull", image, "--name", "big", "--json"],
                           check=True, stdout=subprocess.DEVNULL, env=env)
            airlock_s.append(time.monotonic() - started)
            subprocess.run([args.airlock, "template", "rm", "big"], check=True, stdout=subprocess.DEVNULL,
                           env=env)
            subprocess.run([args.airlock, "gc"], check=True, stdout=subprocess.DEVNULL, env=env)
        result["pull"] = {"airlock_s": statistics.median(airlock_s), "skopeo_s": statistics.median(skopeo_s)}
        result["pull"]["ratio"] = result["pull"]["airlock_s"] / result["pull"]["skopeo_s"]
        if args.base:
            started = time.monotonic()
            subprocess.run([args.airlock, "template", "bootstrap", "base", "--json"], check=True,
                           stdout=subprocess.DEVNULL, env=env)
            first = time.monotonic() - started
            client = Client(daemon)
            started = time.monotonic()
            out = subprocess.run([args.airlock, "create", "--template", "base"], check=True,
                                 capture_output=True, text=True, env=env)
            cached = time.monotonic() - started
            client.delete(out.stdout.strip())
            result["base"] = {"first_s": first, "cached_create_s": cached}
    finally:
        if daemon:
            daemon.stop()
        registry.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    if args.json:
        print(json.dumps(result, indent=2))
        return
    p = result["pull"]
    print(f"airlock pull benchmark: {args.airlock} ({result['cores']} cores, n={args.n}, "
          f"image {result['image_bytes'] / 2**20:.0f} MiB compressed, {LAYERS + 1} layers)")
    print(f"  airlock template pull (fetch, check, unpack)  median {p['airlock_s']:.2f} s")
    print(f"  skopeo copy to a directory (fetch, check)     median {p['skopeo_s']:.2f} s")
    print(f"  airlock / skopeo {p['ratio']:.2f}x (target <= {TARGET_RATIO}x: {verdict(p['ratio'] <= TARGET_RATIO)})")
    if "base" in result:
        b = result["base"]
        print(f"  base template: first build {b['first_s']:.0f} s; create once it exists {b['cached_create_s'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
