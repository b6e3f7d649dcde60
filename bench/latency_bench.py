# SPDX-License-Identifier: Apache-2.0
"""Latency and rate of the sidecar as a worker sees it, beside its baselines, in one run.

Starts two real sidecars (TCP: passive on one, active on the other; LOCAL: both ends on one) and
drives them with sc-bench (bench/c_bench.c, on librdma-sidecar-client): READ and WRITE, sizes 4 KiB
to 1 GiB by powers of 4, 1 and 16 concurrent clients (16 up to --multi-max-size), each transfer
timed from the begin call to COMPLETE seen by the caller (BeginX + WaitOperation). Reports GB/s,
transfers/s, t_min/p50/p99/p99.9, and the sidecars' RSS idle and under load (peak VmRSS sampled
every 20 ms). Baselines in the same run, where installed: iperf3 with one stream and with as many
streams as the sidecar uses (--tcp-streams), and `UCX_TLS=tcp ucx_perftest` ucp_get, ucp_put_bw
and tag_lat at 4 KiB. Each sidecar figure is printed beside its baseline with the ratio.

Usage: /usr/bin/python3 bench/latency_bench.py [--quick] [--build build] [--json FILE] [--plot PNG] [--sizes 4096,65536]
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from baselines import free_port, iperf3, ucx  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def human(n):
    for unit, v in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= v and n % v == 0:
            return "%d %s" % (n // v, unit)
    return "%d B" % n


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssPeak:
    """Samples the peak VmRSS of some pids while a block runs."""

    def __init__(self, pids):
        self.pids, self.peak, self._stop = pids, {p: 0 for p in pids}, threading.Event()

    def __enter__(self):
        def loop():
            while not self._stop.is_set():
                for p in self.pids:
                    self.peak[p] = max(self.peak[p], rss_kib(p))
                self._stop.wait(0.02)
        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_tool(what, cmd):
    """Runs a bench program (up to 600 s) and returns its stdout; exits naming it when it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("%s failed (%s):\n%s%s" % (what, " ".join(cmd), out.stdout, out.stderr))
    return out.stdout


def sc_bench(exe, passive, active, direction, size, clients, iters, seconds):
    cmd = [exe, "--passive", "unix:" + passive.sock, "--active", "unix:" + active.sock, "--direction", direction,
           "--size", str(size), "--clients", str(clients), "--iters", str(iters), "--seconds", str(seconds)]
    return json.loads(run_tool("sc-bench", cmd))


def pct(v, p):
    """As the C benches' pct(): v sorted, nearest rank."""
    i = int(p / 100.0 * (len(v) - 1) + 0.5)
    return v[min(i, len(v) - 1)]


def python_read(H, a, b, iters):
    """4 KiB READs over TCP from Python with the raw gRPC stubs, both ways a worker can ask: one call
    (BeginRead with wait=true: the answer is the final state) and two (BeginRead + WaitOperation),
    interleaved so both see the same machine; the metadata is made ahead (max_uses 64) as in sc-bench."""
    pb = H.pb
    ra, rb = a.create_region(4096), b.create_region(4096)
    lat = {"one_call": [], "two_calls": []}
    ro, left = None, 0
    for i in range(2 * iters + 2):
        if left == 0:
            ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[H.desc(ra, 0, 4096)], max_uses=64,
                                                               timeout_ms=600000), timeout=30)
            left = 64
        one = i % 2 == 0
        t0 = time.perf_counter()
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[H.desc(rb, 0, 4096)],
                                                      wait=one), timeout=30)
        if one:
            status, message = op.status, op.error.message
        else:
            w = b.stub.WaitOperation(pb.WaitOperationRequest(operation_id=op.operation_id, timeout_ms=30000),
                                     timeout=60)
            status, message = w.status, w.error.message
        dt = time.perf_counter() - t0
        left -= 1
        if status != pb.OPERATION_STATUS_COMPLETE:
            raise SystemExit("python READ failed: %s" % message)
        if i >= 2:
            lat["one_call" if one else "two_calls"].append(dt)
    a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=ra.region_id, force=True), timeout=30)
    b.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=rb.region_id, force=True), timeout=30)

    def summary(v):
        v.sort()
        return {"ops": len(v), "t_min_us": v[0] * 1e6, "p50_us": pct(v, 50) * 1e6, "p99_us": pct(v, 99) * 1e6,
                "p999_us": pct(v, 99.9) * 1e6}
    out = summary(lat["one_call"])
    out["two_calls"] = summary(lat["two_calls"])
    return out


def git_commit():
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine():
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    return "%d cpus (%s), %s" % (os.cpu_count() or 0, cpu, os.uname().release)


def run_info(quick):
    """The head of a run's JSON: when, which commit, which machine."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": git_commit(),
            "machine": machine(), "quick": quick}


def print_run_info(res):
    print()
    print("date %s, commit %s, machine %s%s" % (res["date"], res["commit"], res["machine"],
                                                 ", --quick" if res["quick"] else ""))


def open_build(build, exe_name):
    """The test harness pointed at BUILD's sidecar, and the path of BUILD's client/EXE_NAME; exits
    when either is missing."""
    build = os.path.abspath(build)
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    H.BINARY = os.path.join(build, "rdma-sidecar")
    exe = os.path.join(build, "client", exe_name)
    for p in (H.BINARY, exe):
        if not os.path.exists(p):
            raise SystemExit("%s is missing: build first (cmake --build %s)" % (p, build))
    return H, exe


@contextlib.contextmanager
def sidecar_pair(H, tmp_prefix, name, extra):
    """Two sidecars, NAME-a and NAME-b, sharing a key file in a fresh directory under /tmp; stopped
    and the directory removed after the block, then exits if either sidecar had failed."""
    wd = tempfile.mkdtemp(prefix=tmp_prefix, dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    a = H.Sidecar(wd, name + "-a", key_file=keys, extra=extra)
    b = H.Sidecar(wd, name + "-b", key_file=keys, extra=extra)
    try:
        yield a, b
    finally:
        ca, cb = a.stop(), b.stop()
        shutil.rmtree(wd, ignore_errors=True)
    if ca or cb:
        raise SystemExit("a sidecar exited with %s / %s" % (ca, cb))


def write_json(path, res):
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer and smaller sizes, shorter runs (under 2 minutes)")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="the build directory")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    ap.add_argument("--plot", metavar="PNG", default="latency_bench.png",
                    help="also plot throughput and latency against size beside the baselines (PNG; "
                         "default %(default)s in the current directory; '' for none)")
    ap.add_argument("--tcp-streams", type=int, default=2, help="the sidecars' --tcp-streams (default 2)")
    ap.add_argument("--multi", type=int, default=16, help="concurrent clients of the multi-client rows")
    ap.add_argument("--multi-max-size", type=int, default=MiB, help="largest size run with --multi clients")
    ap.add_argument("--modes", default="tcp,local", help="tcp,local")
    ap.add_argument("--sizes", help="comma-separated transfer sizes in bytes, instead of the default list")
    args = ap.parse_args()
    H, exe = open_build(args.build, "sc-bench")

    q = args.quick
    sizes = [4 * KiB, 64 * KiB, MiB, 16 * MiB] if q else [4 * KiB << (2 * i) for i in range(10)]  # 4 KiB..1 GiB
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    seconds = 1.0 if q else 3.0

    def iters_for(size):
        return max(5, min(20000, int((256 * MiB if q else 2 * GiB) / size)))

    t_begin = time.monotonic()
    result = dict(run_info(q), tcp_streams=args.tcp_streams, rows=[], baselines={}, rss_kib={})
    # ---- baselines ----
    bl = result["baselines"]
    bl["iperf3_1"] = iperf3(2 if q else 5, 1)
    bl["iperf3_n"] = iperf3(2 if q else 5, args.tcp_streams)
    n_ucx = 2000 if q else 20000
    bl["ucp_get_4k"] = ucx("ucp_get", 4096, n_ucx)
    bl["ucp_put_bw_4k"] = ucx("ucp_put_bw", 4096, n_ucx)
    bl["tag_lat_4k"] = ucx("tag_lat", 4096, n_ucx)

    # ---- the sidecar ----
    # A short retention and a high --max-operations: at 10k+ transfers/s the default quota (16384
    # live and retained operations) would refuse transfers within 2 s; a real high-rate worker
    # releases its operations (ReleaseOperation) instead.
    extra = ["--log-level", "warn", "--tcp-streams", str(args.tcp_streams), "--retention", "2s",
             "--max-operations", "1000000"]
    with sidecar_pair(H, "sc-lbench-", "bench", extra) as (a, b):
        time.sleep(0.5)
        result["rss_kib"]["idle"] = {"a": rss_kib(a.proc.pid), "b": rss_kib(b.proc.pid)}
        peaks = {}
        # The floor of any call: one GetOperation round trip from the C client (unix socket).
        r = sc_bench(exe, b, b, "rtt", 4096, 1, 20000, seconds)
        r["mode"] = "grpc"
        result["rows"].append(r)
        print("grpc  rtt   GetOperation round trip: p50 %.1f us  p99 %.1f us" % (r["p50_us"], r["p99_us"]))
        result["python_read_4k"] = python_read(H, a, b, 300 if q else 2000)
        py = result["python_read_4k"]
        print("python raw stubs: 4 KiB READ, one call (wait=true) p50 %.1f us  p99 %.1f us; "
              "BeginRead + WaitOperation p50 %.1f us  p99 %.1f us"
              % (py["p50_us"], py["p99_us"], py["two_calls"]["p50_us"], py["two_calls"]["p99_us"]))
        for mode in [m for m in args.modes.split(",") if m]:
            passive, active = (a, b) if mode == "tcp" else (a, a)
            with RssPeak([a.proc.pid, b.proc.pid]) as rp:
                for size in sizes:
                    for direction in ("read", "write"):
                        for clients in ([1, args.multi] if size <= args.multi_max_size else [1]):
                            r = sc_bench(exe, passive, active, direction, size, clients, iters_for(size), seconds)
                            r["mode"] = mode
                            result["rows"].append(r)
                            print("%-5s %-5s %8s %2d clients: %8.3f GB/s %9.0f ops/s  p50 %9.1f us  p99 %9.1f us"
                                  % (mode, direction, human(size), clients, r["gb_per_s"], r["ops_per_s"],
                                     r["p50_us"], r["p99_us"]), flush=True)
            peaks[mode] = {"a": rp.peak[a.proc.pid], "b": rp.peak[b.proc.pid]}
        result["rss_kib"]["load"] = peaks
        time.sleep(2.5)  # retention 2s: terminal operations forgotten
        result["rss_kib"]["after"] = {"a": rss_kib(a.proc.pid), "b": rss_kib(b.proc.pid)}
    result["seconds"] = round(time.monotonic() - t_begin, 1)
    report(result)
    write_json(args.json, result)
    if args.plot:
        import plot
        series, levels = plot.latency_series(result)
        if plot.sweep(args.plot, "rdma-sidecar (C client, two sidecars) beside iperf3 and ucx_perftest, one run", series, levels, plot.run_note(result)):
            print("plot: %s" % os.path.abspath(args.plot))


def report(res):
    bl = res["baselines"]
    print_run_info(res)
    print()
    print("| mode | dir | size | clients | GB/s | transfers/s | t_min us | p50 us | p99 us | p99.9 us |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in res["rows"]:
        print("| %s | %s | %s | %d | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f |"
              % (r["mode"], r["direction"].upper(), human(r["size"]), r["clients"], r["gb_per_s"], r["ops_per_s"],
                 r["t_min_us"], r["p50_us"], r["p99_us"], r["p999_us"]))

    def row(mode, direction, size, clients):
        for r in res["rows"]:
            if (r["mode"], r["direction"], r["size"], r["clients"]) == (mode, direction, size, clients):
                return r
        return None

    print()
    print("| sidecar figure | value | baseline (same run) | value | ratio sidecar/baseline |")
    print("| --- | ---: | --- | ---: | ---: |")

    def line(what, v, unit, bname, b, fmt="%.2f"):
        if v is None:
            return
        if b is None:
            print("| %s | %s %s | %s | n/a (not installed) | |" % (what, fmt % v, unit, bname))
        else:
            print("| %s | %s %s | %s | %s %s | %.2f |" % (what, fmt % v, unit, bname, fmt % b, unit, v / b))

    ucp_get, tag_lat, put_bw = bl.get("ucp_get_4k"), bl.get("tag_lat_4k"), bl.get("ucp_put_bw_4k")
    rtt = row("grpc", "rtt", 4096, 1)
    if rtt:
        line("gRPC round trip (GetOperation) p50, C client", rtt["p50_us"], "us", "tag_lat 4 KiB typical latency",
             tag_lat["lat_us"] if tag_lat else None, "%.1f")
    py = res.get("python_read_4k")
    if py:
        line("TCP READ 4 KiB p50 latency, Python raw stubs, one call (wait=true)", py["p50_us"], "us",
             "ucp_get 4 KiB typical latency", ucp_get["lat_us"] if ucp_get else None, "%.1f")
        if "two_calls" in py:
            line("TCP READ 4 KiB p50 latency, Python raw stubs, BeginRead + WaitOperation", py["two_calls"]["p50_us"],
                 "us", "ucp_get 4 KiB typical latency", ucp_get["lat_us"] if ucp_get else None, "%.1f")
    for direction in ("read", "write"):
        r = row("tcp", direction, 4096, 1)
        if r:
            base = ucp_get if direction == "read" else tag_lat
            bname = "ucp_get 4 KiB typical latency" if direction == "read" else "tag_lat 4 KiB typical latency"
            line("TCP %s 4 KiB p50 latency, 1 client" % direction.upper(), r["p50_us"], "us", bname,
                 base["lat_us"] if base else None, "%.1f")
            line("TCP %s 4 KiB transfers/s, 1 client" % direction.upper(), r["ops_per_s"], "/s",
                 "ucp_get 4 KiB msg/s" if direction == "read" else "ucp_put_bw 4 KiB msg/s",
                 (ucp_get if direction == "read" else put_bw or {}).get("rate") if (ucp_get if direction == "read"
                                                                                  else put_bw) else None, "%.0f")
        r = row("tcp", direction, 4096, 16)
        if r:
            line("TCP %s 4 KiB transfers/s, 16 clients" % direction.upper(), r["ops_per_s"], "/s",
                 "ucp_get 4 KiB msg/s" if direction == "read" else "ucp_put_bw 4 KiB msg/s",
                 (ucp_get if direction == "read" else put_bw or {}).get("rate") if (ucp_get if direction == "read"
                                                                                  else put_bw) else None, "%.0f")
    big = sorted({r["size"] for r in res["rows"] if r["size"] >= MiB})
    for size in big:
        for direction in ("read", "write"):
            r = row("tcp", direction, size, 1)
            if r:
                line("TCP %s %s GB/s" % (direction.upper(), human(size)), r["gb_per_s"], "GB/s",
                     "iperf3 -P %d" % res["tcp_streams"], bl.get("iperf3_n"))
    line("iperf3 -P %d vs one stream" % res["tcp_streams"], bl.get("iperf3_n"), "GB/s", "iperf3 -P 1",
         bl.get("iperf3_1"))
    rss = res["rss_kib"]
    print()
    print("sidecar RSS (KiB): idle a=%d b=%d; peak under load %s; 2.5 s after the load a=%d b=%d"
          % (rss["idle"]["a"], rss["idle"]["b"],
             ", ".join("%s a=%d b=%d" % (m, v["a"], v["b"]) for m, v in rss.get("load", {}).items()),
             rss.get("after", {}).get("a", 0), rss.get("after", {}).get("b", 0)))
    print("total bench time %.1f s" % res["seconds"])


if __name__ == "__main__":
    main()
