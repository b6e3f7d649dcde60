# SPDX-License-Identifier: Apache-2.0
"""The baselines every benchmark here runs beside the sidecar, in the same run: iperf3 and
ucx_perftest over TCP on loopback. Each returns None when its tool is missing or fails, so a
benchmark prints the sidecar's figures anyway and says the baseline is absent."""
import json
import os
import shutil
import socket
import subprocess
import time

MiB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iperf3(seconds, streams=1):
    """GB/s received by an iperf3 client with `streams` parallel streams (-P)."""
    if not shutil.which("iperf3"):
        return None
    port = free_port()
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-P", str(streams),
                              "-J"], capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8 / 1e9
    except (ValueError, KeyError, subprocess.TimeoutExpired):
        return None
    finally:
        srv.kill()
        srv.wait()


def ucx(test, size, iters, iov=0):
    """UCX_TLS=tcp ucx_perftest -t test: {'gb_per_s', 'lat_us' (typical), 'rate'}, or None.
    iov > 0: each message is a scatter-gather list of iov entries of `size` bytes on both sides
    (-D iov,iov), the layout that compares with the sidecar's many-piece transfers."""
    if not shutil.which("ucx_perftest"):
        return None
    port = free_port()
    env = dict(os.environ, UCX_TLS="tcp")
    srv = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        shape = ["-s", str(size)] if not iov else ["-D", "iov,iov", "-s", ",".join([str(size)] * iov)]
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test] + shape +
                             ["-n", str(iters)], env=env, capture_output=True, text=True, timeout=300)
        for line in out.stdout.splitlines():
            if line.startswith("Final:"):
                f = line.split()
                # Final: iters typical_lat avg_lat overall_lat bw_avg bw_overall(MiB/s) rate_avg rate_overall
                return {"gb_per_s": float(f[6]) * MiB / 1e9, "lat_us": float(f[2]), "rate": float(f[8])}
        return None
    except subprocess.TimeoutExpired:
        return None
    finally:
        srv.kill()
        srv.wait()
