#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Small transfers, two builds side by side: before/after figures that a noisy machine cannot skew.

Starts a pair of sidecars from each build at once (TCP on loopback), then runs sc-bench (each build's
own C client) for 4 KiB READ and WRITE with 1 and 16 clients, alternating the builds within each
round and the order between rounds, and prints the medians of p50 latency and transfers/s with the
ratio after/before. Both pairs see the same machine at the same minutes.

    /usr/bin/python3 bench/ab_builds.py --before /tmp/build-old --after build [--rounds 4] [--seconds 2]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)
from latency_bench import sc_bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="build directory of the baseline")
    ap.add_argument("--after", default=os.path.join(HERE, "..", "build"), help="build directory to compare (default build/)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (default 4)")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default 2)")
    ap.add_argument("--size", type=int, default=4096, help="bytes per transfer (default 4096)")
    args = ap.parse_args()
    builds = {"old": os.path.abspath(args.before), "new": os.path.abspath(args.after)}
    for b in builds.values():
        for f in ("rdma-sidecar", "client/sc-bench"):
            if not os.path.exists(os.path.join(b, f)):
                raise SystemExit("%s is missing: build first" % os.path.join(b, f))
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(builds["new"], "python"))
    import harness as H
    wd = tempfile.mkdtemp(prefix="sc-ab-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    extra = ["--log-level", "warn", "--retention", "2s", "--max-operations", "1000000"]
    pairs = {}
    for k, b in builds.items():
        H.BINARY = os.path.join(b, "rdma-sidecar")
        pairs[k] = (H.Sidecar(wd, k + "a", key_file=keys, extra=extra), H.Sidecar(wd, k + "b", key_file=keys, extra=extra))
    res = {(k, d, c): [] for k in builds for d in ("read", "write") for c in (1, 16)}
    try:
        time.sleep(0.5)
        for rnd in range(args.rounds):
            for d in ("read", "write"):
                for c in (1, 16):
                    for k in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                        a, b = pairs[k]
                        exe = os.path.join(builds[k], "client", "sc-bench")
                        res[(k, d, c)].append(sc_bench(exe, a, b, d, args.size, c, 1000000, args.seconds))
        print("before: %s\nafter:  %s\n%d rounds of %.0f s, medians\n" % (builds["old"], builds["new"], args.rounds,
                                                                          args.seconds))
        print("| %d B | clients | before p50 us | before transfers/s | after p50 us | after transfers/s | "
              "transfers/s after/before |" % args.size)
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for d in ("read", "write"):
            for c in (1, 16):
                o, n = res[("old", d, c)], res[("new", d, c)]
                mo = statistics.median(x["p50_us"] for x in o)
                mn = statistics.median(x["p50_us"] for x in n)
                ro = statistics.median(x["ops_per_s"] for x in o)
                rn = statistics.median(x["ops_per_s"] for x in n)
                print("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.2f |" % (d.upper(), c, mo, ro, mn, rn, rn / ro))
    finally:
        for a, b in pairs.values():
            a.stop()
            b.stop()
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
