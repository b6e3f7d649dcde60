#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What one small transfer costs on the wire between two sidecars: TCP segments carrying data, each way.

Starts two real sidecars on loopback (the passive one's data port fixed), warms the peer connection
pool, then captures the data port with tcpdump while sc-bench (the C client) runs N transfers of SIZE
bytes, one at a time, and counts the segments with a payload in each direction (pure ACKs not
counted). A transfer that costs one round trip between the sidecars shows about 1.0 each way: the
active side's OPEN, data request and DONE leave together, the passive side's replies too.

    /usr/bin/python3 bench/wire_segments.py [--build build] [--size 4096] [--count 200] [--port 47111]

Needs root (tcpdump on lo) and tcpdump (Debian package `tcpdump`); exits 77 without them.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="the build directory (default build/)")
    ap.add_argument("--size", type=int, default=4096, help="bytes per transfer (default 4096)")
    ap.add_argument("--count", type=int, default=200, help="transfers per direction (default 200)")
    ap.add_argument("--port", type=int, default=47111, help="the passive sidecar's data port (default 47111)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("tcpdump"):
        print("wire_segments: needs root and tcpdump (apt-get install tcpdump)")
        return 77
    build = os.path.abspath(args.build)
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    H.BINARY = os.path.join(build, "rdma-sidecar")
    exe = os.path.join(build, "client", "sc-bench")
    wd = tempfile.mkdtemp(prefix="sc-wire-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    a = H.Sidecar(wd, "wire-a", key_file=keys, extra=["--log-level", "warn"], data_listen="127.0.0.1:%d" % args.port)
    b = H.Sidecar(wd, "wire-b", key_file=keys, extra=["--log-level", "warn"])
    pcap = os.path.join(wd, "cap.pcap")
    print("| direction | size | transfers | data segments to the passive side | each | back | each |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        for direction in ("read", "write"):
            cmd = [exe, "--passive", "unix:" + a.sock, "--active", "unix:" + b.sock, "--direction", direction,
                   "--size", str(args.size), "--clients", "1", "--iters", str(args.count), "--seconds", "60"]
            subprocess.run(cmd, capture_output=True, timeout=120)  # warms the connection pool
            cap = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-q", "-U", "-w", pcap, "tcp port %d" % args.port],
                                   stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            time.sleep(0.5)
            cap.terminate()
            cap.wait(timeout=10)
            if run.returncode != 0:
                raise SystemExit("sc-bench failed: %s%s" % (run.stdout, run.stderr))
            n = args.count + 1  # sc-bench adds one untimed warm-up transfer
            lines = subprocess.run(["tcpdump", "-n", "-r", pcap], capture_output=True, text=True).stdout.splitlines()
            data = [ln for ln in lines if "length 0" not in ln]
            to_a = sum(1 for ln in data if ".%d:" % args.port in ln)
            back = sum(1 for ln in data if ".%d >" % args.port in ln)
            print("| %s | %d B | %d | %d | %.2f | %d | %.2f |" % (direction.upper(), args.size, n, to_a, to_a / n,
                                                                back, back / n))
    finally:
        a.stop()
        b.stop()
        shutil.rmtree(wd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
