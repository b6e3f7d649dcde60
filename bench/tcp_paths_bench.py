# SPDX-License-Identifier: Apache-2.0
"""The TCP data plane on one path against two, in network namespaces, one run (not CI).

Two namespaces joined by two veth pairs (tests/integration/netns.Paths), every end shaped with tbf
at --rate. Sidecar "a" serves both paths (--data-listen 10.78.0.1:0,10.78.1.1:0), "a1" only the
first; "b" (two paths as well) is the active side. For each size and direction, interleaved, --reps
times: a READ or WRITE from b against a1's metadata (one path) and against a's (two paths), timed
from BeginRead/BeginWrite to WaitOperation's COMPLETE, bytes compared after each. Then, with
--rate2 on the second path (unequal paths), the two-path transfer again, with the bytes each rail
carried (the faster path should carry more: chunks are handed out as streams ask).

Prints a perftest-style table (size, direction, GB/s one path, GB/s two paths, ratio; medians).
Needs root, `ip netns` and tc. Usage:
  sudo /usr/bin/python3 bench/tcp_paths_bench.py [--rate 200mbit] [--rate2 100mbit]
       [--sizes 8M,64M,256M] [--reps 3] [--build build]
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


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="200mbit", help="tbf rate of each path")
    ap.add_argument("--rate2", default="100mbit", help="the second path's rate in the unequal run")
    ap.add_argument("--sizes", default="8M,64M,256M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    args = ap.parse_args()
    import harness as H
    from harness import desc, pb
    from netns import Paths, can_run
    why = can_run()
    if why:
        sys.exit("tcp_paths_bench: " + why)
    H.BINARY = os.path.join(os.path.abspath(args.build), "rdma-sidecar")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    net = Paths(2, args.rate)
    wd = tempfile.mkdtemp(prefix="sc-pbench-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    procs = []

    def start(name, ns, addrs):
        s = H.Sidecar(wd, name, key_file=keys, tcp=False,
                      data_listen=",".join(a + ":0" for a in addrs),
                      extra=["--advertise", ",".join(addrs), "--log-level", "warn"],
                      prefix=("ip", "netns", "exec", ns))
        procs.append(s)
        return s
    try:
        (a0, b0), (a1, b1) = net.addrs
        a = start("a", net.ns[0], [a0, a1])
        one = start("a1", net.ns[0], [a0])
        b = start("b", net.ns[1], [b0, b1])
        big = max(sizes)
        rb = b.create_region(big)
        regions = {id(a): a.create_region(big), id(one): one.create_region(big)}

        def run(passive, size, direction):
            region = regions[id(passive)]
            data = os.urandom(size)
            (passive.fill(region, 0, data) if direction == "read" else b.fill(rb, 0, data))
            create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
            po = create(pb.CreatePassiveRequest(descriptors=[desc(region, 0, size)], timeout_ms=600000),
                        timeout=30)
            begin = b.stub.BeginRead if direction == "read" else b.stub.BeginWrite
            t0 = time.perf_counter()
            ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(rb, 0, size)],
                                               timeout_ms=600000), timeout=30)
            op = b.wait(ao.operation_id, 600000)
            took = time.perf_counter() - t0
            assert op.status == pb.OPERATION_STATUS_COMPLETE, op.error.message
            p = passive.wait(po.operation_id, 30000)
            assert p.status == pb.OPERATION_STATUS_COMPLETE, p.error.message
            got = b.peek(rb, 0, size) if direction == "read" else passive.peek(region, 0, size)
            assert got == data, "bytes differ"
            return took, {u.rail: u.bytes for u in op.rails}

        print("TCP paths: 2 namespaces, 2 veth pairs, tbf %s per path, --tcp-streams default, "
              "medians of %d, bytes compared" % (args.rate, args.reps))
        print("%-10s %-6s %12s %12s %8s" % ("size", "dir", "1path GB/s", "2paths GB/s", "ratio"))
        for size in sizes:
            for direction in ("read", "write"):
                t1, t2 = [], []
                for _ in range(args.reps):
                    t1.append(run(one, size, direction)[0])
                    t2.append(run(a, size, direction)[0])
                g1, g2 = size / statistics.median(t1) / 1e9, size / statistics.median(t2) / 1e9
                print("%-10s %-6s %12.4f %12.4f %7.2fx" % ("%d MiB" % (size >> 20), direction.upper(),
                                                          g1, g2, g2 / g1))
        net.shape(1, args.rate2)
        print("\nunequal paths: path 0 %s, path 1 %s (two paths; bytes per rail)" % (args.rate, args.rate2))
        print("%-10s %-6s %12s  %s" % ("size", "dir", "2paths GB/s", "bytes per rail"))
        for size in sizes:
            for direction in ("read", "write"):
                took, used = run(a, size, direction)
                print("%-10s %-6s %12.4f  %s" % ("%d MiB" % (size >> 20), direction.upper(),
                                                 size / took / 1e9,
                                                 ", ".join("%s %d MiB" % (k, v >> 20)
                                                           for k, v in sorted(used.items()))))
    finally:
        for s in reversed(procs):
            s.stop()
            shutil.rmtree(s.shm, ignore_errors=True)
        shutil.rmtree(wd, ignore_errors=True)
        net.close()


if __name__ == "__main__":
    main()
