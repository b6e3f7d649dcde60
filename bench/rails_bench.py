# SPDX-License-Identifier: Apache-2.0
"""One ibverbs rail against two (issue 24), in the Soft-RoCE VM, same run, perftest-style table.

bench/guest-rails-bench.sh builds the rails (rxe0/rxe1 over v0/v1, rxe2/rxe3 over v2/v3, policy
routing so that RoCE crosses the veth pairs; tests/integration/vm_ibverbs.py second_rail) and runs
this. For every rate case (netem rate on each rail's two veth ends: equal, then unequal) and every
shape (one 64 MiB descriptor; the KV shape, 16,384 x 32 KiB descriptors in compact lists) and
direction, it moves the same bytes --iters times between two sidecars with one rail each
(--ib-devices rxe0 / rxe1) and between two with two rails each (rxe0,rxe2 / rxe1,rxe3) (the KV shape at a higher rate: 512 MiB), timed by
the operation (completed_unix_ms - created_unix_ms), the bytes compared once per case. MB/s =
1e6 bytes/s; ratio = two rails / one rail, same case, same run.

Usage: rails_bench.py [--rates 40mbit:40mbit,40mbit:20mbit] [--kv-rates 200mbit:200mbit]
                      [--shapes 64M,kv] [--ops read,write] [--iters 2] [--kv-iters 1]
                      [--json FILE] [--log-dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SC_SOURCE_DIR", os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

from harness import Sidecar, desc, pb, write_key_file  # noqa: E402

IP, IP2 = "10.99.0.1", "10.99.0.2"
KV_BLOCKS, KV_BLOCK = 16384, 32768


def log(msg):
    print("rails_bench: %s" % msg, file=sys.stderr, flush=True)


def shape(rates):
    """rates = (rail 0's, rail 1's): netem rate on v0/v1 and on v2/v3."""
    for devs, rate in ((("v0", "v1"), rates[0]), (("v2", "v3"), rates[1])):
        for dev in devs:
            subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", "netem", "rate", rate,
                            "limit", "100000"], check=True, timeout=30)


class Pair:
    def __init__(self, d, keys, a_devs, b_devs, name):
        common = ["--key-file", keys, "--backends", "ibverbs", "--log-level", "info"]
        self.a = Sidecar(d, "a" + name, tcp=False, extra=common + [
            "--ib-devices", a_devs, "--data-listen", IP + ":0", "--advertise", IP])
        self.b = Sidecar(d, "b" + name, tcp=False, extra=common + [
            "--ib-devices", b_devs, "--data-listen", IP2 + ":0", "--advertise", IP2])
        for s in (self.a, self.b):
            ib = [x for x in s.info().backends if x.backend == pb.BACKEND_IBVERBS][0]
            log("%s: %s" % (s.name, ib.detail))
            if not ib.available:
                raise SystemExit("rails_bench: ibverbs unavailable on %s: %s" % (s.name, ib.detail))

    def stop(self, log_dir):
        for s in (self.a, self.b):
            s.stop()
            if log_dir:
                os.makedirs(log_dir, exist_ok=True)
                shutil.copy(s.log_path, os.path.join(log_dir, "sidecar-%s.log" % s.name))
            shutil.rmtree(s.shm, ignore_errors=True)


def layout(kind):
    if kind == "kv":
        return [KV_BLOCK] * KV_BLOCKS
    return [64 << 20]


class Regions:
    """The shape's regions on one pair, filled: b holds the data for READs, a for WRITEs."""

    def __init__(self, pair, lengths):
        self.pair, self.lengths = pair, lengths
        self.size = sum(lengths)
        self.rb, self.ra = pair.b.create_region(self.size), pair.a.create_region(self.size)
        off = 0
        self.bd, self.ad = [], []
        for n in lengths:
            self.bd.append(desc(self.rb, off, n))
            self.ad.append(desc(self.ra, off, n))
            off += n
        block = os.urandom(1048573)
        self.data = (block * (self.size // len(block) + 1))[:self.size]

    def drop(self):
        for s, r in ((self.pair.a, self.ra), (self.pair.b, self.rb)):
            s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id, force=True), timeout=60)


def run_case(rg, op, iters):
    """a is active (READ from b / WRITE to b). Returns (median op seconds, rails used)."""
    pair = rg.pair
    sender, srg, recv, rrg = (pair.b, rg.rb, pair.a, rg.ra) if op == "read" else (pair.a, rg.ra, pair.b, rg.rb)
    sender.fill(srg, 0, rg.data)
    recv.fill(rrg, 0, b"\0" * rg.size)
    secs, rails = [], {}
    for it in range(iters):
        create = pair.b.stub.CreateReadable if op == "read" else pair.b.stub.CreateWritable
        begin = pair.a.stub.BeginRead if op == "read" else pair.a.stub.BeginWrite
        po = create(pb.CreatePassiveRequest(descriptors=rg.bd, timeout_ms=900000), timeout=120)
        done = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=rg.ad, timeout_ms=900000,
                                             wait=True), timeout=920)
        if done.status != pb.OPERATION_STATUS_COMPLETE:
            raise SystemExit("rails_bench: %s ended %s: %s" % (op, pb.OperationStatus.Name(done.status),
                                                                done.error.message))
        pair.b.stub.WaitOperation(pb.WaitOperationRequest(operation_id=po.operation_id, timeout_ms=60000),
                                  timeout=70)
        secs.append((done.completed_unix_ms - done.created_unix_ms) / 1000.0)
        rails = {u.rail: u.bytes for u in done.rails}
        if it == 0 and recv.peek(rrg, 0, rg.size) != rg.data:
            raise SystemExit("rails_bench: %s: the receiver's bytes differ from the sender's" % op)
        for s, oid in ((pair.a, done.operation_id), (pair.b, po.operation_id)):
            s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=oid), timeout=60)
    return statistics.median(secs), rails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="40mbit:40mbit,40mbit:20mbit")
    ap.add_argument("--kv-rates", default="200mbit:200mbit")
    ap.add_argument("--shapes", default="64M,kv")
    ap.add_argument("--ops", default="read,write")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--kv-iters", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--log-dir")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="railbench-", dir="/tmp")
    keys = write_key_file(os.path.join(d, "keys"))
    one = Pair(d, keys, "rxe0", "rxe1", "1")
    two = Pair(d, keys, "rxe0,rxe2", "rxe1,rxe3", "2")
    rows, got = [], {}
    try:
        # per shape and pair: regions once (the KV shape is 512 MiB a side), every rate and op
        for kind in args.shapes.split(","):
            rates = [tuple(rc.split(":")) for rc in (args.kv_rates if kind == "kv" else args.rates).split(",")]
            iters = args.kv_iters if kind == "kv" else args.iters
            for pname, pair in (("one", one), ("two", two)):
                rg = Regions(pair, layout(kind))
                for r in rates:
                    shape(r)
                    for op in args.ops.split(","):
                        t, used = run_case(rg, op, iters)
                        got[(kind, r, op, pname)] = (t, used, rg.size)
                        log("%s %s/%s %s %s rail(s): %.1f s (%s)" % (kind, r[0], r[1], op, pname, t, used))
                rg.drop()
                del rg
            for r in rates:
                for op in args.ops.split(","):
                    t1, _, total = got[(kind, r, op, "one")]
                    t2, used, _ = got[(kind, r, op, "two")]
                    rows.append({"shape": "64 MiB x 1" if kind != "kv" else "32 KiB x 16384",
                                 "rates": "%s/%s" % r, "op": op, "bytes": total, "one_s": t1, "two_s": t2,
                                 "one_mbs": total / t1 / 1e6, "two_mbs": total / t2 / 1e6, "ratio": t1 / t2,
                                 "rails": used})
    finally:
        one.stop(args.log_dir)
        two.stop(args.log_dir)
        shutil.rmtree(d, ignore_errors=True)
    print("%-16s %-17s %-5s %10s %10s %10s %7s  %s" % ("shape", "netem rate/rail", "op", "bytes", "1 rail MB/s",
                                                       "2 rails MB/s", "ratio", "bytes per rail (2 rails)"))
    for r in rows:
        print("%-16s %-17s %-5s %10d %11.2f %12.2f %6.2fx  %s" % (
            r["shape"], r["rates"], r["op"], r["bytes"], r["one_mbs"], r["two_mbs"], r["ratio"],
            ", ".join("%s %d MiB" % (k, v >> 20) for k, v in sorted(r["rails"].items()))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
