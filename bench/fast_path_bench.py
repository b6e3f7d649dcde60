# SPDX-License-Identifier: Apache-2.0
"""The sidecar's fast path (shared-memory rings, issue 26 part 2) against gRPC and the floors, in one run.

Starts two real sidecars on this host (passive on one, active on the other: the TCP data plane
between them) and drives sc-fast-bench (bench/fast_path_bench.c) for READ and WRITE of 4 KiB,
64 KiB and 1 MiB, with 1 and 16 client threads, through:
  tcp   raw TCP ping-pong of the same bytes over loopback (the floor; in sc-fast-bench)
  ucx   UCX_TLS=tcp ucx_perftest tag_lat (baselines.ucx; one client only: it has no client count;
        its typical latency doubled: a ping-pong of SIZE bytes each way)
  grpc  the sidecar over gRPC, rsc_read/rsc_write (one round trip each)
  fast  the sidecar's fast path, rsc_fast_run on a prepared handle (the library's default: poll the
        completion ring 50 us before sleeping on its doorbell where the client may run on 4 CPUs or
        more; with fewer, sleep at once, as fast-nospin)
  fast-nospin  the same, spin_us UINT32_MAX (sleep on the doorbell at once): on a host with fewer
        cores than busy threads, polling takes the CPU the sidecars need
and, 1 client only, the Python package (clients/python/rdma_sidecar) against the same two sidecars,
in a child process of this script (--py-worker):
  python-grpc  rdma_sidecar.sync: begin_read/begin_write, then wait_for_completion (two RPCs: the
        package has no BeginX-with-wait); the release after it is outside the clock (in the rate)
  python-fast  rdma_sidecar.fast.FastPath.run on a prepared handle, FastPath.open's default spin
        (50 us with 4 CPUs or more, else 0: sleep on the doorbell at once)
Each transfer is timed from the call to its end as the caller sees it; the passive side's metadata
is made (and prepared) before the clock starts. Prints p50/p99/p99.9 and transfers/s per path and
the ratios fast/raw-TCP and fast/gRPC (p50 latency; rate), and Python/C for the fast path and gRPC.
--py-profile FILE: the python-fast rows also run once more under cProfile (FILE.<dir>.<size>).

Usage: /usr/bin/python3 bench/fast_path_bench.py [--quick] [--build build] [--json FILE] [--plot PNG]
       [--sizes 4096,65536,1048576] [--clients 1,16] [--no-python] [--py-profile FILE]
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from baselines import ucx  # noqa: E402
from latency_bench import (human, open_build, pct, print_run_info, run_info, run_tool,  # noqa: E402
                           sidecar_pair, write_json)

KiB, MiB = 1 << 10, 1 << 20
PATHS = ("tcp", "ucx", "grpc", "fast", "fast-nospin", "python-fast", "python-grpc")


def sc_fast_bench(exe, path, a, b, direction, size, clients, iters, seconds):
    mode = "fast" if path.startswith("fast") else path
    cmd = [exe, "--mode", mode, "--direction", direction, "--size", str(size), "--clients", str(clients),
           "--iters", str(iters), "--seconds", str(seconds)]
    if mode != "tcp":
        cmd += ["--passive", "unix:" + a.sock, "--active", "unix:" + b.sock]
    if path == "fast-nospin":
        cmd += ["--spin-us", "none"]
    return json.loads(run_tool("sc-fast-bench", cmd))


def py_worker(args):
    """One Python row (--py-worker): prints sc-fast-bench's JSON for it."""
    sys.path[:0] = [os.path.join(HERE, "..", "clients", "python"), args.stubs]  # the package, its generated modules
    import numpy as np
    import rdma_sidecar as rs
    import rdma_sidecar.sync  # noqa: F401
    from rdma_sidecar.fast import FastPath
    size, write = args.size, args.direction == "write"
    ca, cb = rs.sync.Connector(args.passive), rs.sync.Connector(args.active)
    fp = None
    try:
        pmem, amem = ca.zeros(size, np.uint8), cb.zeros(size, np.uint8)
        holder, other = (amem, pmem) if write else (pmem, amem)
        holder[::4096] = (np.arange(len(holder[::4096])) * 31 + 1).astype(np.uint8)
        holder[-1] = 0x5A
        create = ca.create_writable if write else ca.create_readable
        passive = create(rs.Descriptor(pmem), timeout=3600, uses=1 << 20)
        kind = rs.OperationKind.WRITE if write else rs.OperationKind.READ
        if args.py_path == "fast":
            fp = FastPath.open(cb)
            h = fp.prepare(kind, passive, rs.Descriptor(amem), timeout_ms=600000)
            run = fp.run

            def once():
                t0 = time.perf_counter()
                c = run(h)
                dt = time.perf_counter() - t0
                if c.code:
                    c.raise_for_code()
                return dt, c.backend
        else:
            begin = cb.begin_write if write else cb.begin_read
            d = rs.Descriptor(amem)

            def once():
                t0 = time.perf_counter()
                op = begin(passive, d, timeout=600)
                st = op.wait_for_completion(600)
                dt = time.perf_counter() - t0
                if st != rs.OperationStatus.COMPLETE:
                    raise SystemExit("transfer %s: %s" % (st, op.error))
                backend = op.backend
                op.release()
                return dt, backend
        _, backend = once()  # the warm-up, not timed
        if bytes(holder) != bytes(other):
            raise SystemExit("bytes differ after the warm-up transfer")
        lat = []
        start = time.perf_counter()
        prof = None
        if args.py_profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        while len(lat) < args.iters and (time.perf_counter() - start <= args.seconds or len(lat) < 3):
            dt, backend = once()
            lat.append(dt)
        wall = time.perf_counter() - start
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.py_profile)
        lat.sort()
        print(json.dumps({
            "mode": "python-" + args.py_path, "fast_mode": fp.mode if fp else "", "direction": args.direction,
            "size": size, "clients": 1, "ops": len(lat), "backend": getattr(backend, "name", str(backend)).lower(),
            "seconds": wall, "gb_per_s": size * len(lat) / wall / 1e9, "ops_per_s": len(lat) / wall,
            "t_min_us": lat[0] * 1e6, "p50_us": pct(lat, 50) * 1e6, "p99_us": pct(lat, 99) * 1e6,
            "p999_us": pct(lat, 99.9) * 1e6, "mean_us": sum(lat) / len(lat) * 1e6, "ok": True}))
        if fp is not None:
            fp.close()
            fp = None
        passive.release()
        ca.free(pmem)
        cb.free(amem)
    finally:
        if fp is not None:
            fp.close()
        ca.close()
        cb.close()


def python_bench(path, a, b, direction, size, iters, seconds, profile=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--py-worker", path, "--stubs", os.environ["SC_PYTHON_STUBS"],
           "--direction", direction,
           "--size", str(size), "--iters", str(iters), "--seconds", str(seconds),
           "--passive", "unix:" + a.sock, "--active", "unix:" + b.sock]
    if profile:
        cmd += ["--py-profile", profile]
    return json.loads(run_tool("the Python bench", cmd).strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (about a minute)")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="the build directory")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    ap.add_argument("--plot", metavar="PNG", default="fast_path_bench.png",
                    help="also plot throughput and latency against size beside the baselines (PNG; "
                         "default %(default)s in the current directory; '' for none)")
    ap.add_argument("--sizes", default="4096,65536,1048576", help="comma-separated transfer sizes in bytes")
    ap.add_argument("--clients", default="1,16", help="comma-separated client counts")
    ap.add_argument("--seconds", type=float, help="time per row (default 2, --quick 0.5)")
    ap.add_argument("--no-python", action="store_true", help="leave out the Python package's rows")
    ap.add_argument("--py-profile", metavar="FILE", help="profile the python-fast rows (cProfile) into FILE.<dir>.<size>")
    # The child process of one Python row (internal).
    ap.add_argument("--py-worker", choices=("fast", "grpc"), dest="py_path", help=argparse.SUPPRESS)
    ap.add_argument("--direction", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--passive", help=argparse.SUPPRESS)
    ap.add_argument("--active", help=argparse.SUPPRESS)
    ap.add_argument("--stubs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.py_path:
        py_worker(args)
        return
    H, exe = open_build(args.build, "sc-fast-bench")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    clients = [int(c) for c in args.clients.split(",") if c]
    seconds = args.seconds or (0.5 if args.quick else 2.0)

    def iters_for(size):
        return max(50, min(200000, int((64 * MiB if args.quick else 512 * MiB) / size)))

    t_begin = time.monotonic()
    res = dict(run_info(args.quick), seconds_per_row=seconds, rows=[])
    # ucx_perftest first, alone on the host (it has no client count: 1-client rows only).
    for size in sizes:
        u = ucx("tag_lat", size, min(20000, iters_for(size)))
        for direction in ("read", "write"):
            if u:
                # tag_lat reports half a ping-pong: doubled here, a round trip as the other rows time.
                rtt = 2 * u["lat_us"]
                res["rows"].append({"path": "ucx", "direction": direction, "size": size, "clients": 1,
                                    "p50_us": rtt, "p99_us": None, "p999_us": None, "ops_per_s": 1e6 / rtt})
    # As latency_bench: a short retention and a high --max-operations for the gRPC rows' operations.
    extra = ["--log-level", "warn", "--retention", "2s", "--max-operations", "1000000"]

    def show(r):
        print("%-11s %-5s %8s %2d clients: p50 %8.1f us  p99 %8.1f us  p99.9 %8.1f us  %9.0f /s"
              % (r["path"], r["direction"], human(r["size"]), r["clients"], r["p50_us"], r["p99_us"], r["p999_us"],
                 r["ops_per_s"]), flush=True)

    with sidecar_pair(H, "sc-fbench-", "fbench", extra) as (a, b):
        for size in sizes:
            for direction in ("read", "write"):
                for n in clients:
                    for path in ("tcp", "grpc", "fast", "fast-nospin"):
                        r = sc_fast_bench(exe, path, a, b, direction, size, n, iters_for(size), seconds)
                        if r["mode"] == "fast" and r["fast_mode"] != "ring":
                            raise SystemExit("the fast path ran in %s mode, not ring" % r["fast_mode"])
                        r["path"] = path
                        res["rows"].append(r)
                        show(r)
                    if n != 1 or args.no_python:
                        continue
                    for path in ("fast", "grpc"):  # python-fast right after the C fast rows it is compared with
                        r = python_bench(path, a, b, direction, size, iters_for(size), seconds)
                        if path == "fast" and r["fast_mode"] != "ring":
                            raise SystemExit("the Python fast path ran in %s mode, not ring" % r["fast_mode"])
                        r["path"] = "python-" + path
                        res["rows"].append(r)
                        show(r)
                    if args.py_profile:
                        prof = "%s.%s.%d" % (args.py_profile, direction, size)
                        python_bench("fast", a, b, direction, size, iters_for(size), seconds, prof)
                        print("cProfile of python-fast: %s" % prof, flush=True)
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    report(res, sizes, clients)
    write_json(args.json, res)
    if args.plot:
        import plot
        series, levels = plot.fast_series(res)
        if plot.sweep(args.plot, "rdma-sidecar fast path and gRPC (READ, 1 client) beside raw TCP ping-pong and ucx tag_lat, one run", series, levels, plot.run_note(res)):
            print("plot: %s" % os.path.abspath(args.plot))


def report(res, sizes, clients):
    def row(path, direction, size, n):
        for r in res["rows"]:
            if (r["path"], r["direction"], r["size"], r["clients"]) == (path, direction, size, n):
                return r
        return None

    def us(v):
        return "%.1f" % v if v is not None else "-"

    print_run_info(res)
    print()
    print("| dir | size | clients | path | p50 us | p99 us | p99.9 us | transfers/s |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for size in sizes:
        for direction in ("read", "write"):
            for n in clients:
                for path in PATHS:
                    r = row(path, direction, size, n)
                    if r:
                        print("| %s | %s | %d | %s | %s | %s | %s | %.0f |"
                              % (direction.upper(), human(size), n, path, us(r["p50_us"]), us(r["p99_us"]),
                                 us(r["p999_us"]), r["ops_per_s"]))
    print()
    print("ucx: twice tag_lat's typical latency (ucx_perftest reports half a ping-pong of SIZE bytes each "
          "way), in the p50 column, and 1/that as the rate; no percentiles")
    print()
    print("| dir | size | clients | fast path | fast p50 / raw TCP p50 | fast p50 / gRPC p50 | fast p99 / gRPC p99 "
          "| fast rate / raw TCP rate | fast rate / gRPC rate |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for size in sizes:
        for direction in ("read", "write"):
            for n in clients:
                for fp in ("fast", "fast-nospin"):
                    f, t = row(fp, direction, size, n), row("tcp", direction, size, n)
                    g = row("grpc", direction, size, n)
                    if not (f and t and g):
                        continue
                    print("| %s | %s | %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f |"
                          % (direction.upper(), human(size), n, fp, f["p50_us"] / t["p50_us"],
                             f["p50_us"] / g["p50_us"], f["p99_us"] / g["p99_us"], f["ops_per_s"] / t["ops_per_s"],
                             f["ops_per_s"] / g["ops_per_s"]))
    py = [(size, direction) for size in sizes for direction in ("read", "write")
          if row("python-fast", direction, size, 1) or row("python-grpc", direction, size, 1)]
    if py:
        print()
        print("Python package / C client, 1 client (the issue's target for the fast path: p50 within 1.3x)")
        print()
        print("| dir | size | python fast / C fast p50 | p99 | p99.9 | python gRPC / C gRPC p50 | p99 "
              "| python fast p50 / python gRPC p50 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

        def ratio(x, y, k):
            return "%.2f" % (x[k] / y[k]) if x and y and x.get(k) and y.get(k) else "-"

        for size, direction in py:
            pf, cf = row("python-fast", direction, size, 1), row("fast", direction, size, 1)
            pg, cg = row("python-grpc", direction, size, 1), row("grpc", direction, size, 1)
            print("| %s | %s | %s | %s | %s | %s | %s | %s |"
                  % (direction.upper(), human(size), ratio(pf, cf, "p50_us"), ratio(pf, cf, "p99_us"),
                     ratio(pf, cf, "p999_us"), ratio(pg, cg, "p50_us"), ratio(pg, cg, "p99_us"),
                     ratio(pf, pg, "p50_us")))
    print()
    print("total bench time %.1f s" % res["seconds"])


if __name__ == "__main__":
    main()
