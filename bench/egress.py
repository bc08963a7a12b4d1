#!/usr/bin/env python3
"""Benchmark of the egress path (network policy enforcement).

    sudo python3 bench/egress.py [--airlock PATH] [-n 30] [--mib 200]

Starts a test "internet" host in a network namespace of its own on this
machine (busybox httpd on 198.51.100.2, TEST-NET-2, joined to the host by a
veth pair), a private daemon that resolves `site.test` to it
(--egress-host), and measures against raw peers in the same run:

 1. a MiB-sized download (--mib, default 200) with curl from inside a
    sandbox whose policy allows site.test, through the transparent proxy,
    versus the same download with curl on the host: throughput ratio
    (target >= 0.8x). The sandbox gets the machine's CPUs (the default
    limit is one), as the host's curl has: the kernel's work for the
    proxy's loopback hop is charged to the sandbox's cgroup. Median of 5
    alternating runs; then the same with the test host's link shaped to
    1 Gbit/s (tc tbf), for the proxy's cost at a server's usual line rate;
 2. the time to open a connection and get a small answer, from inside the
    sandbox (through the proxy: redirect, SNI/Host read, host-side
    resolution, upstream connect) versus on the host: added p50 per
    connection (target <= 1 ms);
 3. sandbox create time with an `allow` policy versus `none`: p50
    difference (target <= +5 ms).

Prints PASS/MISS per target; exits 0 unless something failed. Everything
it starts is stopped at the end.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2b_sdk import start_daemon  # noqa: E402 (one way to start a private daemon)

NS = "al-bench-inet"
LINK = "al-bench-in"
PEER = "al-bench-ip"
HOST_IP = "198.51.100.2"


def sh(script, check=True):
    return subprocess.run(["sh", "-c", script], check=check, capture_output=True, text=True)


def start_internet(root, mib):
    sh(f"ip netns del {NS} 2>/dev/null; ip link del {LINK} 2>/dev/null", check=False)
    sh(f"""set -e
        ip netns add {NS}
        ip link add {LINK} type veth peer name {PEER}
        ip link set {PEER} netns {NS}
        ip addr add 198.51.100.1/24 dev {LINK}
        ip link set {LINK} up
        ip -n {NS} addr add {HOST_IP}/24 dev {PEER}
        ip -n {NS} link set {PEER} up
        ip -n {NS} link set lo up""")
    www = os.path.join(root, "www")
    os.makedirs(www)
    with open(os.path.join(www, "big.bin"), "wb") as f:
        f.truncate(mib << 20)
    with open(os.path.join(www, "small.txt"), "w") as f:
        f.write("ok\n")
    server = subprocess.Popen(
        ["ip", "netns", "exec", NS, "busybox", "httpd", "-f", "-p", f"{HOST_IP}:8000", "-h", www],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if sh(f"curl -s -o /dev/null -m 1 http://{HOST_IP}:8000/small.txt", check=False).returncode == 0:
            return server
        time.sleep(0.05)
    sys.exit("the test internet's server did not start")


def stop_internet(server):
    server.kill()
    server.wait()
    sh(f"ip link del {LINK} 2>/dev/null; ip netns del {NS} 2>/dev/null", check=False)


class Client:
    def __init__(self, url, key):
        self.url, self.key = url, key

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("X-API-Key", self.key)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.read()

    def create(self, network, cpus=None):
        body = {"network": network}
        if cpus is not None:
            body["limits"] = {"cpus": cpus}
        return json.loads(self.call("POST", "/v1/sandboxes", body))["id"]

    def delete(self, sid):
        self.call("DELETE", f"/v1/sandboxes/{sid}")

    def sh(self, sid, script):
        out = self.call("POST", f"/v1/sandboxes/{sid}/exec",
                        {"cmd": "/bin/sh", "args": ["-c", script], "timeout_s": 300})
        text, code = "", None
        for line in out.decode().splitlines():
            event = json.loads(line)
            if event.get("type") == "stdout":
                text += event["data"]
            elif event.get("type") == "exited":
                code = event["exit_code"]
        if code != 0:
            raise RuntimeError(f"{script!r} exited {code}: {text}")
        return text


def host_sh(script):
    return sh(script).stdout


DOWNLOAD = "curl -s -o /dev/null -w '%{{speed_download}}' http://{host}:8000/big.bin"
# n small requests, one connection each, timed by Python's clock.
CONNECTS = ("python3 -c \"\nimport socket, time\nts=[]\nfor _ in range({n}):\n"
            "    t=time.perf_counter(); s=socket.create_connection(('{host}', 8000))\n"
            "    s.sendall(b'GET /small.txt HTTP/1.0\\\\r\\\\nHost: site.test\\\\r\\\\n\\\\r\\\\n')\n"
            "    while s.recv(4096): pass\n"
            "    s.close(); ts.append((time.perf_counter()-t)*1000)\n"
            "ts.sort(); print(ts[len(ts)//2])\n\"")


def main():
    parser = argparse.ArgumentParser()
    default = "target/x86_64-unknown-linux-gnu/release/airlock"
    parser.add_argument("--airlock", default=default if os.path.exists(default) else "airlock")
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--mib", type=int, default=200)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="airlock-egress-bench-")
    server = start_internet(root, args.mib)
    daemon = None
    try:
        daemon, _, url, key = start_daemon(
            args.airlock, ["--egress-host", f"site.test={HOST_IP}"], root)
        client = Client(url, key)
        allow = {"mode": "allow", "rules": ["site.test"]}
        # The download's raw peer (curl on the host) runs under no CPU
        # quota, and the kernel's TCP work for the proxy's loopback hop is
        # charged to the sandbox: give it the machine's CPUs, as the peer
        # has, rather than the default limit of one.
        sid = client.create(allow, cpus=os.cpu_count())

        inside, outside = [], []
        for _ in range(5):
            inside.append(float(client.sh(sid, DOWNLOAD.format(host="site.test"))))
            outside.append(float(host_sh(DOWNLOAD.format(host=HOST_IP))))
        down_in, down_out = statistics.median(inside), statistics.median(outside)

        # The same at a server's usual link rate: the test host's sending
        # side shaped to 1 Gbit/s.
        sh(f"ip netns exec {NS} tc qdisc add dev {PEER} root tbf rate 1gbit burst 1mb latency 50ms")
        shaped_in, shaped_out = [], []
        for _ in range(3):
            shaped_in.append(float(client.sh(sid, DOWNLOAD.format(host="site.test"))))
            shaped_out.append(float(host_sh(DOWNLOAD.format(host=HOST_IP))))
        sh(f"ip netns exec {NS} tc qdisc del dev {PEER} root")
        shaped_in, shaped_out = statistics.median(shaped_in), statistics.median(shaped_out)

        lat_in = float(client.sh(sid, CONNECTS.format(n=args.n * 4, host="site.test")))
        lat_out = float(host_sh(CONNECTS.format(n=args.n * 4, host=HOST_IP)))
        client.delete(sid)

        creates = {"none": [], "allow": []}
        for i in range(args.n * 2):
            kind = "none" if i % 2 == 0 else "allow"
            t0 = time.perf_counter()
            new = client.create({"mode": "none"} if kind == "none" else allow)
            creates[kind].append((time.perf_counter() - t0) * 1000)
            client.delete(new)
        create_none = statistics.median(creates["none"])
        create_allow = statistics.median(creates["allow"])
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        stop_internet(server)
        shutil.rmtree(root, ignore_errors=True)

    mib = 1 << 20
    ratio = down_in / down_out
    print(f"egress benchmark against {args.airlock}")
    print(f"{args.mib} MiB download: through the proxy {down_in / mib:7.0f} MiB/s, "
          f"direct on the host {down_out / mib:7.0f} MiB/s, ratio {ratio:.2f}x  "
          f"{'PASS' if ratio >= 0.8 else 'MISS'} (target >= 0.8x)")
    print(f"  at a 1 Gbit/s link: through the proxy {shaped_in / mib:7.0f} MiB/s, "
          f"direct {shaped_out / mib:7.0f} MiB/s, ratio {shaped_in / shaped_out:.2f}x")
    added = lat_in - lat_out
    print(f"connect + small GET p50: through the proxy {lat_in:.2f} ms, direct {lat_out:.2f} ms, "
          f"added {added:.2f} ms  {'PASS' if added <= 1 else 'MISS'} (target <= 1 ms)")
    extra = create_allow - create_none
    print(f"create p50: allow {create_allow:.2f} ms, none {create_none:.2f} ms, "
          f"added {extra:.2f} ms  {'PASS' if extra <= 5 else 'MISS'} (target <= +5 ms)")


if __name__ == "__main__":
    main()
