# SPDX-License-Identifier: Apache-2.0
"""Cost of peer TLS (--peer-tls-*) on the TCP data plane: 256 MiB READ and WRITE between two
sidecars on loopback, plain TCP and TLS 1.3 side by side in the same run (the runs alternate, so
both see the same machine load), and the ratio TLS/plain. The TLS pair's GetInfo says whether
the kernel (kTLS) or OpenSSL in userspace encrypts. Certificates are made by the openssl CLI.

Every figure is end to end as a worker sees it: BeginRead/BeginWrite to WaitOperation COMPLETE,
p50 over the iterations (the first, which opens the pooled connections, is not counted).

Usage: /usr/bin/python3 bench/tls_bench.py [--build build] [--iters N] [--size MiB] [--streams N]
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


def one(a, b, ra, rb, size, direction):
    from harness import desc, pb
    create = a.stub.CreateReadable if direction == "READ" else a.stub.CreateWritable
    ro = create(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, size)]), timeout=30)
    begin = b.stub.BeginRead if direction == "READ" else b.stub.BeginWrite
    t0 = time.perf_counter()
    op = begin(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(rb, 0, size)]), timeout=30)
    w = b.stub.WaitOperation(pb.WaitOperationRequest(operation_id=op.operation_id, timeout_ms=120000),
                             timeout=150)
    dt = time.perf_counter() - t0
    if w.status != pb.OPERATION_STATUS_COMPLETE:
        raise SystemExit("transfer failed: %s" % w.error.message)
    b.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=10)
    a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=ro.operation_id), timeout=10)
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--size", type=int, default=256, help="MiB per transfer (default 256)")
    ap.add_argument("--streams", type=int, default=2, help="--tcp-streams (default 2)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    from harness import pb
    from tlsutil import CA
    H.BINARY = os.path.join(build, "rdma-sidecar")
    size = args.size << 20
    wd = tempfile.mkdtemp(prefix="sc-tlsbench-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    ca = CA(wd, "bench")
    extra = ["--log-level", "warn", "--tcp-streams", str(args.streams)]
    procs = []
    try:
        pairs = {}
        for mode in ("plain", "tls"):
            ea = extra + (ca.peer_flags(mode + "-a") if mode == "tls" else [])
            eb = extra + (ca.peer_flags(mode + "-b") if mode == "tls" else [])
            a = H.Sidecar(wd, mode + "-a", key_file=keys, extra=ea)
            procs.append(a)
            b = H.Sidecar(wd, mode + "-b", key_file=keys, extra=eb)
            procs.append(b)
            ra, rb = a.create_region(size), b.create_region(size)
            a.fill(ra, 0, os.urandom(size))
            b.fill(rb, 0, os.urandom(size))
            pairs[mode] = (a, b, ra, rb)
        times = {(m, d): [] for m in pairs for d in ("READ", "WRITE")}
        for i in range(args.iters + 1):
            for direction in ("READ", "WRITE"):
                for mode in ("plain", "tls"):
                    a, b, ra, rb = pairs[mode]
                    dt = one(a, b, ra, rb, size, direction)
                    if i:
                        times[(mode, direction)].append(dt)
        for mode, (a, b, ra, rb) in pairs.items():
            if a.peek(ra, 0, 1 << 20) != b.peek(rb, 0, 1 << 20):
                raise SystemExit("bytes differ after the %s transfers" % mode)
        detail = [r.detail for r in pairs["tls"][1].info().backends if r.backend == pb.BACKEND_TCP][0]
        print("peer channel of the TLS pair: %s" % detail.split("; peer TLS: ", 1)[-1])
        print("%d MiB per transfer, --tcp-streams %d, %d timed iterations (p50)" % (args.size, args.streams,
                                                                                   args.iters))
        print("%-6s %12s %12s %8s" % ("op", "plain GB/s", "TLS GB/s", "TLS/plain"))
        for direction in ("READ", "WRITE"):
            p = size / statistics.median(times[("plain", direction)]) / 1e9
            t = size / statistics.median(times[("tls", direction)]) / 1e9
            print("%-6s %12.3f %12.3f %8.2f" % (direction, p, t, t / p))
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
