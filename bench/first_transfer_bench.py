# SPDX-License-Identifier: Apache-2.0
"""The first transfer to a new peer, cold and warmed up with ConnectPeer (issue 24), in one run.

Each round starts a fresh pair of real sidecars (a reads from b over TCP on loopback), has b
create a readable of SIZE random bytes, and times a's BeginRead with `wait` from the call to its
COMPLETE answer: "cold" pays for dialling and the authenticated hello inside the transfer, "warm"
calls ConnectPeer with the same metadata first (not timed) and then reads. Cold and warm rounds
alternate, so both see the same machine. Bytes are compared. Prints a perftest-style table of
p50/p99 and the ratio. Over ibverbs (the VM: --ib) the warm-up also sets up the queue pair.

Usage: /usr/bin/python3 bench/first_transfer_bench.py [--build build] [--rounds 20]
       [--sizes 4096,67108864] [--ib DEV:GID_INDEX:IP]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="build directory")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per size and mode (default 20)")
    ap.add_argument("--sizes", default="4096,67108864", help="bytes per transfer, comma separated")
    ap.add_argument("--ib", default="", help="DEV:GID_INDEX:IP: use ibverbs on that device (the VM)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ["SC_BINARY"] = os.path.join(build, "rdma-sidecar")
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    from harness import desc, pb
    extra = ["--log-level", "warn"]
    if args.ib:
        dev, gid, ip = args.ib.split(":")
        extra += ["--backends", "ibverbs,tcp", "--ib-device", dev, "--ib-gid-index", gid,
                  "--data-listen", ip + ":0", "--advertise", ip]
    sizes = [int(s) for s in args.sizes.split(",")]
    wd = tempfile.mkdtemp(prefix="sc-first-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    res = {(s, m): [] for s in sizes for m in ("cold", "warm")}
    backend = {}
    n = 0
    for rnd in range(args.rounds):
        for size in sizes:
            for mode in (("cold", "warm") if rnd % 2 == 0 else ("warm", "cold")):
                n += 1
                a = H.Sidecar(wd, "a%d" % n, key_file=keys, extra=extra)
                b = H.Sidecar(wd, "b%d" % n, key_file=keys, extra=extra)
                try:
                    rb, ra = b.create_region(size), a.create_region(size)
                    data = os.urandom(size)
                    b.fill(rb, 0, data)
                    op = b.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rb, 0, size)]), timeout=30)
                    if mode == "warm":
                        a.stub.ConnectPeer(pb.ConnectPeerRequest(metadata=op.metadata), timeout=30)
                    t = time.perf_counter()
                    done = a.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(ra, 0, size)],
                                                                    wait=True, timeout_ms=60000), timeout=90)
                    us = (time.perf_counter() - t) * 1e6
                    if done.status != pb.OPERATION_STATUS_COMPLETE:
                        raise SystemExit("transfer failed: %s" % done.error.message)
                    if a.peek(ra, 0, size) != data:
                        raise SystemExit("bytes differ")
                    res[(size, mode)].append(us)
                    backend[size] = pb.Backend.Name(done.backend)
                finally:
                    a.stop()
                    b.stop()
    print("first transfer to a new peer: BeginRead(wait) from the call to COMPLETE, %d rounds each, "
          "cold and warm alternating\n" % args.rounds)
    print("| size | backend | cold p50 us | cold p99 us | warm p50 us | warm p99 us | cold / warm (p50) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for size in sizes:
        c, w = res[(size, "cold")], res[(size, "warm")]
        print("| %d | %s | %.0f | %.0f | %.0f | %.0f | %.2fx |" % (
            size, backend[size], statistics.median(c), pct(c, 99), statistics.median(w), pct(w, 99),
            statistics.median(c) / statistics.median(w)))


if __name__ == "__main__":
    main()
