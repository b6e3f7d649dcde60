#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Where a small transfer's time goes: the hand-off trace of N READs and N WRITEs between two sidecars.

Starts two real sidecars on loopback TCP with the hidden RDMA_SIDECAR_TRACE_HANDOFFS=1 (base/trace.h:
each hand-off of a transfer is recorded in memory with CLOCK_MONOTONIC microseconds and written to
the log when the sidecar drains), runs sc-bench (bench/c_bench.c: the C client, one BeginRead or
BeginWrite with wait per transfer) for N transfers of --size bytes, one direction per pair of
sidecars, stops them and lays both logs on one time line (both sidecars share the host's monotonic
clock, and the transfer id is the same on both ends). Prints, per direction, each stage with the
p50/p99 microseconds since the stage before it (stages in the order of their median time), the
sidecar it ran on (A: the passive side, the data's holder for READ; B: the active side, which the
client calls), and the client's own p50 (BeginX + wait, from sc-bench) beside a bare gRPC round trip.

--path fast drives the fast path instead (sc-fast-bench, bench/fast_path_bench.c: rsc_fast_run on
a handle prepared once, the library's default wait, one client). The sidecar then records the
engine's "call in" stage (B:grpc_in, shown as "B:call_in (ring entry taken)") when its session
thread takes the ring entry, B:fast_cqe_posted when it has written the completion, and every stage
the transfer itself passes on both sidecars in between; the client's p50 is rsc_fast_run's.

    /usr/bin/python3 bench/handoff_trace.py [--build build] [--count 2000] [--size 4096] [--path grpc|fast]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from latency_bench import sc_bench  # noqa: E402

LINE = re.compile(r"^handoff xfer=([0-9a-f]{16}) stage=(\S+) us=(\d+)$")


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100.0 * (len(v) - 1) + 0.5))]


def records(path, side):
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                out.setdefault(m.group(1), []).append((int(m.group(3)), side + ":" + m.group(2)))
    return out


def sc_fast_bench(exe, a, b, direction, size, count):
    cmd = [exe, "--mode", "fast", "--direction", direction, "--size", str(size), "--clients", "1",
           "--iters", str(count), "--seconds", "0", "--passive", "unix:" + a.sock, "--active", "unix:" + b.sock]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit("sc-fast-bench failed (%s):\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    r = json.loads(out.stdout)
    if r["fast_mode"] != "ring":
        raise SystemExit("the fast path ran in %s mode, not ring: no fast-path trace" % r["fast_mode"])
    return r


def run_direction(H, build, wd, keys, direction, count, size, path="grpc"):
    extra = ["--log-level", "warn", "--retention", "2s", "--max-operations", "1000000"]
    env = {"RDMA_SIDECAR_TRACE_HANDOFFS": "1"}
    a = H.Sidecar(wd, direction + "-a", key_file=keys, extra=extra, env=env)
    b = H.Sidecar(wd, direction + "-b", key_file=keys, extra=extra, env=env)
    exe = os.path.join(build, "client", "sc-bench")
    try:
        time.sleep(0.3)
        rtt = sc_bench(exe, b, b, "rtt", size, 1, count, 0)
        if path == "fast":
            r = sc_fast_bench(os.path.join(build, "client", "sc-fast-bench"), a, b, direction, size, count)
        else:
            r = sc_bench(exe, a, b, direction, size, 1, count, 0)
    finally:
        ca, cb = a.stop(), b.stop()
    if ca or cb:
        raise SystemExit("a sidecar exited with %s / %s" % (ca, cb))
    per = records(a.log_path, "A")
    for k, v in records(b.log_path, "B").items():
        per.setdefault(k, []).extend(v)
    # Transfers seen from the call's arrival on B (the gRPC call, or the fast path's ring entry
    # taken: the same trace point); the first ones (dial, warm-up) left out.
    xfers = sorted((min(t for t, _ in v), k) for k, v in per.items() if any(s == "B:grpc_in" for _, s in v))
    xfers = [k for _, k in xfers[10:]]
    return rtt, r, [sorted(per[k]) for k in xfers]


def label(s, path):
    return "B:call_in (ring entry taken)" if path == "fast" and s == "B:grpc_in" else s


def table(direction, rtt, r, timelines, path="grpc"):
    offs = {}
    for tl in timelines:
        t0 = tl[0][0]
        seen = set()
        for t, s in tl:
            if s not in seen:  # a stage recorded twice (a second chunk): its first time
                seen.add(s)
                offs.setdefault(s, []).append(t - t0)
    order = sorted(offs, key=lambda s: (pct(offs[s], 50), sum(offs[s]) / len(offs[s]), s))
    client = "sc-fast-bench, C, rsc_fast_run" if path == "fast" else "sc-bench, C"
    first = "call_in" if path == "fast" else "grpc_in"
    print("\n%s of %d B over %s, %d transfers traced; client (%s): p50 %.1f us, p99 %.1f us; bare gRPC "
          "round trip (GetOperation) p50 %.1f us\n" % (direction.upper(), r["size"],
                                                       "the fast path" if path == "fast" else "gRPC", len(timelines),
                                                       client, r["p50_us"], r["p99_us"], rtt["p50_us"]))
    print("| stage (A: passive sidecar, B: active sidecar) | since previous p50 us | p99 us | since %s p50 us |"
          % first)
    print("| --- | ---: | ---: | ---: |")
    negative = False
    for i, s in enumerate(order):
        if i == 0:
            d = [0]
        else:
            d = []
            for tl in timelines:
                ts = {}
                for t, st in tl:
                    ts.setdefault(st, t)
                if s in ts and order[i - 1] in ts:
                    d.append(ts[s] - ts[order[i - 1]])
            d = d or [0]
        negative = negative or pct(d, 50) < 0
        print("| %s | %d | %d | %d |" % (label(s, path), pct(d, 50), pct(d, 99), pct(offs[s], 50)))
    # Inside the sidecars: from the call's arrival to the stage where the caller's answer leaves
    # (the gRPC reply sent, the completion posted), not to the passive side's last bookkeeping.
    last = "B:fast_cqe_posted" if path == "fast" else "B:grpc_reply_sent"
    total = []
    for tl in timelines:
        end = [t for t, st in tl if st == last]
        total.append((end[0] if end else tl[-1][0]) - tl[0][0])
    print("| (inside the sidecars: %s to %s) | %d | %d | |" % (first, last[2:], pct(total, 50), pct(total, 99)))
    print("| (outside them: the client's p50 less the inside's p50: %s) | %d | | |"
          % ("the doorbell waking the session thread, the completion waking the client" if path == "fast"
             else "the gRPC call to the sidecar and its answer back", r["p50_us"] - pct(total, 50)))
    if negative:
        print("\nA negative p50 since the previous stage: the two ran at the same time on the two sidecars "
              "(the stages are in the order of their median time since %s; a transfer may pass them the "
              "other way round)." % first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="the build directory")
    ap.add_argument("--count", type=int, default=2000, help="transfers per direction (default 2000)")
    ap.add_argument("--size", type=int, default=4096, help="bytes per transfer (default 4096)")
    ap.add_argument("--directions", default="read,write", help="read,write")
    ap.add_argument("--path", choices=("grpc", "fast"), default="grpc",
                    help="grpc: BeginX with wait (sc-bench); fast: the fast path's rings (sc-fast-bench)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    H.BINARY = os.path.join(build, "rdma-sidecar")
    for p in (H.BINARY, os.path.join(build, "client", "sc-bench"), os.path.join(build, "client", "sc-fast-bench")):
        if not os.path.exists(p):
            raise SystemExit("%s is missing: build first (cmake --build %s)" % (p, build))
    wd = tempfile.mkdtemp(prefix="sc-htrace-", dir="/tmp")
    try:
        keys = H.write_key_file(os.path.join(wd, "keys"))
        for d in [x for x in args.directions.split(",") if x]:
            rtt, r, tls = run_direction(H, build, wd, keys, d, args.count, args.size, args.path)
            if not tls:
                raise SystemExit("no trace records: is this build's sidecar traced (sidecar/base/trace.h)?")
            table(d, rtt, r, tls, args.path)
    finally:
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
