# SPDX-License-Identifier: Apache-2.0
"""Sidecar ibverbs READ/WRITE throughput against perftest on the same RDMA device, same run.

Meant for the Soft-RoCE VM (bench/run-vm-bench.sh boots it and runs bench/guest-bench.sh, which
runs this), but works on any host with an RDMA device and an address on it. Starts two sidecars
on the device (ibverbs only), then for each size and direction:

  perftest  ib_<op>_bw -d DEV -x GID -s SIZE -n ITERS (via bench/vm-perftest.sh), one QP;
  sidecar   ITERS operations one after another: CreateReadable/CreateWritable on the passive
            sidecar (not timed), then one BeginRead/BeginWrite call with `wait` set on the
            active one (--two-calls: BeginX, then WaitOperation), timed by the client
            (perf_counter around the call(s)) and by the operation (completed_unix_ms -
            created_unix_ms, millisecond resolution); then, untimed, the passive operation is
            awaited (it must be COMPLETE) and both are released;
  sidecar/qD the same with D operations in flight (D client threads, own regions each), for
            sizes up to --depth-max-size.
  sc-bench  (and sc-bench/qD) the same transfers driven by the C client (bench/c_bench.c, one
            rsc_read/rsc_write call per transfer, the passive metadata made ahead with max_uses
            64), when $SC_BUILD_DIR/client/sc-bench exists (--no-c-bench: skip): what a C
            worker sees, without the Python client's CPU (which, on 2 emulated vCPUs, is taken
            from Soft-RoCE itself).

Throughput is bytes / wall time (serial: the sum of client latencies, so gRPC round trips count);
GB/s = 1e9 bytes/s as vm-perftest.sh prints; ratio = sidecar GB/s / perftest GB/s of the same size
and direction in this run. The bytes of each size and direction are compared once (a benchmark
that moves wrong bytes is meaningless). Prints a table; --json writes every figure.

Many blocks (issue 16): --blocks 1024,4096 [--block-size 4K] times CreateReadable for N scattered
descriptors and moves N blocks as one READ and one WRITE beside one contiguous descriptor of the
same bytes (ratio), every block compared; the table replaces the perftest one.

Usage: ib_bench.py [--sizes 1M:64,64M:5] [--ops read,write] [--depth 4] [--depth-max-size 8M]
                   [--rounds N] [--dev rxe0] [--gid 1] [--ip 10.99.0.1] [--backends ibverbs]
                   [--no-perftest] [--two-calls] [--log-level info] [--log-dir DIR]
                   [--json FILE]
Environment: SC_BINARY, SC_PYTHON_STUBS (as for the integration tests), SC_SOURCE_DIR.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SC_SOURCE_DIR", os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

from harness import Sidecar, desc, pb, write_key_file  # noqa: E402


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def human(n):
    for unit, v in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= v and n % v == 0:
            return "%d%s" % (n // v, unit)
    return str(n)


def pct(xs, p):
    """Nearest-rank percentile (p99 of 20 samples is the largest)."""
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def log(msg):
    print("ib_bench: %s" % msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="ibbench-", dir="/tmp")
        keys = write_key_file(os.path.join(self.dir, "keys"))
        flags = ["--key-file", keys, "--ib-device", args.dev, "--ib-gid-index", str(args.gid),
                 "--data-listen", args.ip + ":0", "--advertise", args.ip, "--backends", args.backends,
                 "--log-level", args.log_level]
        # passive (issues metadata, owns the exposed memory) and active (BeginRead/BeginWrite)
        self.p = Sidecar(self.dir, "passive", extra=flags, tcp=False)
        self.a = Sidecar(self.dir, "active", extra=flags, tcp=False)
        for s in (self.p, self.a):
            ib = [b for b in s.info().backends if b.backend == pb.BACKEND_IBVERBS][0]
            log("%s: ibverbs available=%s (%s)" % (s.name, ib.available, ib.detail))
            if not ib.available and "ibverbs" in args.backends.split(","):
                raise SystemExit("ib_bench: ibverbs is not available on sidecar %s: %s" % (s.name, ib.detail))

    def close(self):
        for s in (self.a, self.p):
            try:
                s.stop()
            except Exception as e:  # noqa: BLE001
                log("stopping %s: %s" % (s.name, e))
            if self.args.log_dir:
                os.makedirs(self.args.log_dir, exist_ok=True)
                shutil.copy(s.log_path, os.path.join(self.args.log_dir, "sidecar-%s.log" % s.name))
        shutil.rmtree(self.p.shm, ignore_errors=True)
        shutil.rmtree(self.a.shm, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def regions(self, size):
        rp, ra = self.p.create_region(size), self.a.create_region(size)
        block = os.urandom(min(size, 1048573))
        data = (block * (size // len(block) + 1))[:size]
        # the sender holds the data; the receiver starts with other bytes
        self.p.fill(rp, 0, data)
        self.a.fill(ra, 0, data[::-1])
        return rp, ra

    def one(self, op, size, rp, ra, wait_passive=True):
        """One timed operation; returns (client seconds, operation ms)."""
        create = self.p.stub.CreateReadable if op == "read" else self.p.stub.CreateWritable
        begin = self.a.stub.BeginRead if op == "read" else self.a.stub.BeginWrite
        po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, 0, size)], timeout_ms=600000), timeout=60)
        one_call = not self.args.two_calls
        t0 = time.perf_counter()
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(ra, 0, size)],
                                           timeout_ms=600000, wait=one_call), timeout=620)
        done = ao if one_call else self.a.stub.WaitOperation(
            pb.WaitOperationRequest(operation_id=ao.operation_id, timeout_ms=600000), timeout=620)
        t1 = time.perf_counter()
        if done.status != pb.OPERATION_STATUS_COMPLETE:
            raise SystemExit("ib_bench: %s of %d bytes ended %s: %s" % (
                op, size, pb.OperationStatus.Name(done.status), done.error.message))
        if done.backend != self.expect_backend():
            raise SystemExit("ib_bench: %s used %s, not %s: %s" % (
                op, pb.Backend.Name(done.backend), pb.Backend.Name(self.expect_backend()), done.backend_reason))
        # The passive side completes from the active side's completion notice (or DONE): wait for
        # it (untimed) before releasing, so a release never cancels a transfer still finishing.
        # Not in the pipelined run, whose wall time counts every call (as it did before).
        pdone = self.p.stub.WaitOperation(pb.WaitOperationRequest(operation_id=po.operation_id, timeout_ms=60000),
                                          timeout=70) if wait_passive else None
        if pdone and pdone.status != pb.OPERATION_STATUS_COMPLETE:
            raise SystemExit("ib_bench: passive side of the %s of %d bytes ended %s: %s" % (
                op, size, pb.OperationStatus.Name(pdone.status), pdone.error.message))
        for s, oid in ((self.a, ao.operation_id), (self.p, po.operation_id)):
            s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=oid), timeout=60)
        return t1 - t0, done.completed_unix_ms - done.created_unix_ms

    def expect_backend(self):
        return pb.BACKEND_IBVERBS if "ibverbs" in self.args.backends.split(",") else pb.BACKEND_TCP

    def verify(self, op, size, rp, ra):
        want = self.p.peek(rp, 0, size) if op == "read" else self.a.peek(ra, 0, size)
        got = self.a.peek(ra, 0, size) if op == "read" else self.p.peek(rp, 0, size)
        if got != want:
            raise SystemExit("ib_bench: %s of %d bytes: the receiver's bytes differ from the sender's" % (op, size))

    BREAKDOWN = re.compile(r"(\d+) bytes; setup\+OPEN (\d+) us, to first post (\d+) us, "
                           r"data (\d+) us, DONE (\d+) us")

    def breakdown(self, since):
        """Medians (ms) of the backend's per-transfer timings that its debug log gives, if any."""
        with open(self.a.log_path, "rb") as f:
            f.seek(since)
            rows = [tuple(int(x) for x in m.groups()[1:])
                    for m in self.BREAKDOWN.finditer(f.read().decode(errors="replace"))]
        if not rows:
            return None
        return {k: statistics.median(r[i] for r in rows) / 1e3
                for i, k in enumerate(("setup_open_ms", "first_post_ms", "data_ms", "done_ms"))}

    def serial(self, op, size, iters):
        rp, ra = self.regions(size)
        self.one(op, size, rp, ra)  # warm-up: queue pairs, registration caches, page faults
        self.verify(op, size, rp, ra)
        client, opms = [], []
        since = os.path.getsize(self.a.log_path)
        for _ in range(iters):
            c, o = self.one(op, size, rp, ra)
            client.append(c)
            opms.append(o)
        self.drop(rp, ra)
        wall = sum(client)
        bd = self.breakdown(since)
        return {"breakdown": bd, "tool": "sidecar", "op": op, "size": size, "iters": iters, "depth": 1,
                "gbps": size * iters / wall / 1e9, "msg_rate": iters / wall,
                "p50_ms": pct(client, 50) * 1e3, "p99_ms": pct(client, 99) * 1e3,
                "op_p50_ms": pct(opms, 50), "op_p99_ms": pct(opms, 99),
                "op_gbps": size / (max(statistics.median(opms), 1) / 1e3) / 1e9}

    def pipelined(self, op, size, iters, depth):
        pairs = [self.regions(size) for _ in range(depth)]
        for rp, ra in pairs:
            self.one(op, size, rp, ra)
        client, errors = [], []
        counter = iter(range(iters))
        lock = threading.Lock()

        def worker(rp, ra):
            try:
                while True:
                    with lock:
                        if next(counter, None) is None:
                            return
                    c, _ = self.one(op, size, rp, ra, wait_passive=False)
                    with lock:
                        client.append(c)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=worker, args=pr) for pr in pairs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        for rp, ra in pairs:
            self.drop(rp, ra)
        return {"tool": "sidecar/q%d" % depth, "op": op, "size": size, "iters": iters, "depth": depth,
                "gbps": size * iters / wall / 1e9, "msg_rate": iters / wall,
                "p50_ms": pct(client, 50) * 1e3, "p99_ms": pct(client, 99) * 1e3}

    def c_bench(self, op, size, iters, clients):
        """sc-bench between the two sidecars; None when it is not built."""
        exe = self.args.c_bench
        if not exe or not os.access(exe, os.X_OK):
            return None
        cmd = [exe, "--passive", "unix:" + self.p.sock, "--active", "unix:" + self.a.sock, "--direction", op,
               "--size", str(size), "--clients", str(clients), "--iters", str(max(1, iters // clients))]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit("ib_bench: sc-bench failed (%s):\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
        r = json.loads(out.stdout)
        if r["backend"] != ("ibverbs" if self.expect_backend() == pb.BACKEND_IBVERBS else "tcp"):
            raise SystemExit("ib_bench: sc-bench used %s" % r["backend"])
        return {"tool": "sc-bench" if clients == 1 else "sc-bench/q%d" % clients, "op": op, "size": size,
                "iters": r["ops"], "depth": clients, "gbps": r["gb_per_s"], "msg_rate": r["ops_per_s"],
                "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3}

    def drop(self, rp, ra):
        self.p.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=rp.region_id, force=True), timeout=60)
        self.a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=ra.region_id, force=True), timeout=60)


def blocks_bench(bench, n, block, iters, ops):
    """Issue 16's shape: n descriptors of `block` bytes, scattered on both sides (random gaps of
    up to one block), as ONE operation. Times CreateReadable (median of iters, each cancelled),
    the metadata's size, then one READ and one WRITE of all n blocks, beside one contiguous
    descriptor of the same bytes in the same run; every byte of the receiving ranges compared."""
    import random
    rnd = random.Random(n)
    p, a = bench.p, bench.a

    def lay():
        offs, cur = [], 0
        for _ in range(n):
            offs.append(cur)
            cur += block + rnd.randrange(0, block + 1)
        return offs, cur
    po_offs, psize = lay()
    pa_offs, asize = lay()
    rp, ra = p.create_region(psize), a.create_region(asize)
    pd = [desc(rp, o, block) for o in po_offs]
    ad = [desc(ra, o, block) for o in pa_offs]
    out = []
    times = []
    md_bytes = 0
    for _ in range(iters):
        t0 = time.perf_counter()
        po = p.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=pd, timeout_ms=60000), timeout=120)
        times.append(time.perf_counter() - t0)
        md_bytes = len(po.metadata)
        p.stub.CancelOperation(pb.CancelOperationRequest(operation_id=po.operation_id), timeout=60)
    # the ibverbs share of it, from the passive sidecar's debug log (absent: tcp only, or older)
    exp = [int(m) for m in re.findall(r"exposed %d descriptor\(s\) in \d+ region\(s\) with [A-Za-z ]+ in (\d+) us" % n,
                                      p.read_log())][-iters:]
    out.append({"what": "create", "n": n, "block": block, "ms_p50": statistics.median(times) * 1e3,
                "ms_min": min(times) * 1e3, "us_per_desc": statistics.median(times) * 1e6 / n,
                "metadata_bytes": md_bytes, "expose_ms_p50": statistics.median(exp) / 1e3 if exp else None})
    log("%s" % out[-1])
    pdata = os.urandom(psize)
    adata = os.urandom(asize)
    for op in ops:
        # the sender's region holds pdata/adata, the receiver's other noise, refreshed per op
        send, srg, sdata, sdescs, recv, rrg, rdescs = (
            (p, rp, pdata, pd, a, ra, ad) if op == "read" else (a, ra, adata, ad, p, rp, pd))
        send.fill(srg, 0, sdata)
        recv.fill(rrg, 0, os.urandom(rrg.size))
        for shape in ("scattered", "contiguous"):
            total = n * block
            if shape == "scattered":
                cd, cs = pd, ad
            else:
                cd, cs = [desc(rp, 0, total)], [desc(ra, 0, total)]
            create = p.stub.CreateReadable if op == "read" else p.stub.CreateWritable
            begin = a.stub.BeginRead if op == "read" else a.stub.BeginWrite
            po = create(pb.CreatePassiveRequest(descriptors=cd, timeout_ms=600000), timeout=120)
            t0 = time.perf_counter()
            ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=cs, timeout_ms=600000,
                                               wait=True), timeout=600)
            secs = time.perf_counter() - t0
            if ao.status != pb.OPERATION_STATUS_COMPLETE:
                raise SystemExit("ib_bench: %s %s of %d x %d: %s %s" % (shape, op, n, block,
                                 pb.OperationStatus.Name(ao.status), ao.error.message))
            want = pb.BACKEND_TCP if bench.args.backends == "tcp" else pb.BACKEND_IBVERBS
            if ao.backend != want:
                raise SystemExit("ib_bench: %s used %s: %s" % (op, pb.Backend.Name(ao.backend), ao.backend_reason))
            p.wait(po.operation_id, 60000)
            if shape == "scattered":
                got = recv.peek(rrg, 0, rrg.size)
                for s_, r_ in zip(sdescs, rdescs):
                    if got[r_.offset:r_.offset + block] != sdata[s_.offset:s_.offset + block]:
                        raise SystemExit("ib_bench: %s of %d x %d: block at %d differs" % (op, n, block, r_.offset))
                del got
            out.append({"what": op, "shape": shape, "n": n if shape == "scattered" else 1, "block": block,
                        "bytes": total, "s": secs, "GBps": total / secs / 1e9})
            log("%s" % out[-1])
    bench.drop(rp, ra)
    return out


def blocks_table(rows):
    lines = ["| what | descriptors | block | CreateReadable p50 ms | us/descriptor | ibverbs expose p50 ms | metadata bytes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["what"] == "create":
            e = r.get("expose_ms_p50")
            lines.append("| create | %d | %d | %.1f | %.1f | %s | %d |" % (
                r["n"], r["block"], r["ms_p50"], r["us_per_desc"], "-" if e is None else "%.2f" % e,
                r["metadata_bytes"]))
    lines += ["", "| op | descriptors x block | scattered s | scattered GB/s | contiguous s | contiguous GB/s | ratio |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    sc = {(r["what"], r["block"], r["bytes"]): r for r in rows if r.get("shape") == "scattered"}
    for r in rows:
        if r.get("shape") == "contiguous":
            s_ = sc.get((r["what"], r["block"], r["bytes"]))
            if s_:
                lines.append("| %s | %d x %d | %.2f | %.4f | %.2f | %.4f | %.2f |" % (
                    r["what"], s_["n"], r["block"], s_["s"], s_["GBps"], r["s"], r["GBps"],
                    s_["GBps"] / r["GBps"]))
    return "\n".join(lines)


def perftest(args, op, size, iters):
    """One ib_<op>_bw pair through bench/vm-perftest.sh; None if it failed."""
    cmd = ["bash", os.path.join(HERE, "vm-perftest.sh"), "-d", args.dev, "-x", str(args.gid), "-a", args.ip,
           "-o", op, "%d:%d" % (size, iters)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120 + size * iters / (2 << 20))
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    if r.returncode != 0 or not rows:
        log("perftest %s %d failed (exit %d):\n%s" % (op, size, r.returncode, r.stderr[-2000:]))
        return None
    _, n, gbps, mpps = rows[0][:4]
    return {"tool": "ib_%s_bw" % op, "op": op, "size": size, "iters": int(n), "depth": 1,
            "gbps": float(gbps), "msg_rate": float(mpps) * 1e6}


def table(results):
    lines = ["%-5s %6s %10s %6s  %-14s %9s %8s %10s %9s %9s %8s %9s" % (
        "op", "round", "size", "iters", "tool", "GB/s", "MB/s", "msg/s", "p50_ms", "p99_ms", "op_p50", "ratio")]
    ref = {(r["round"], r["op"], r["size"]): r["gbps"] for r in results if r["tool"].startswith("ib_")}
    for r in results:
        base = ref.get((r["round"], r["op"], r["size"]))
        ratio = "%.2f" % (r["gbps"] / base) if base and not r["tool"].startswith("ib_") else "-"
        r["ratio"] = None if ratio == "-" else float(ratio)

        def ms(k):
            return "%.1f" % r[k] if k in r else "-"
        lines.append("%-5s %6d %10s %6d  %-14s %9.4f %8.1f %10.1f %9s %9s %8s %9s" % (
            r["op"], r["round"], human(r["size"]), r["iters"], r["tool"], r["gbps"], r["gbps"] * 1e3, r["msg_rate"],
            ms("p50_ms"), ms("p99_ms"), "%d" % r["op_p50_ms"] if "op_p50_ms" in r else "-", ratio))
    # median ratio per size, direction and tool over the rounds
    summary = {}
    for r in results:
        if r.get("ratio") is not None:
            summary.setdefault((r["size"], r["op"], r["tool"]), []).append(r["ratio"])
    bds = [r for r in results if r.get("breakdown")]
    if bds:
        lines.append("# sidecar backend timings, median ms per operation (active side's debug log):")
        for r in bds:
            b = r["breakdown"]
            lines.append("#   %-5s %6s round %d: setup+OPEN %.1f, to first post %.1f, data %.1f, DONE %.1f" % (
                r["op"], human(r["size"]), r["round"], b["setup_open_ms"], b["first_post_ms"], b["data_ms"],
                b["done_ms"]))
    if summary:
        lines.append("# ratio sidecar/perftest, median over rounds (min..max):")
        for (size, op, tool), xs in sorted(summary.items()):
            lines.append("#   %-5s %6s %-14s %.2f (%.2f..%.2f, %d rounds)" % (
                op, human(size), tool, statistics.median(xs), min(xs), max(xs), len(xs)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M:64,64M:5", help="SIZE:ITERS list (default 1M:64,64M:5)")
    ap.add_argument("--ops", default="read,write")
    ap.add_argument("--depth", type=int, default=4, help="operations in flight for the pipelined run (0: none)")
    ap.add_argument("--depth-max-size", default="8M", help="largest size run pipelined")
    ap.add_argument("--dev", default=os.environ.get("RXE_DEV", "rxe0"))
    ap.add_argument("--gid", default=os.environ.get("RXE_GID_INDEX", "1"))
    ap.add_argument("--ip", default=os.environ.get("RXE_IP", "10.99.0.1"))
    ap.add_argument("--backends", default="ibverbs", help="sidecar --backends (tcp: compare the TCP data plane)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat everything; the summary gives median ratios")
    ap.add_argument("--no-perftest", action="store_true")
    ap.add_argument("--two-calls", action="store_true",
                    help="BeginX then WaitOperation (the old way) instead of one BeginX with wait")
    build = os.environ.get("SC_BUILD_DIR", os.path.join(SRC, "build"))
    ap.add_argument("--c-bench", default=os.path.join(build, "client", "sc-bench"),
                    help="the sc-bench binary (default $SC_BUILD_DIR/client/sc-bench)")
    ap.add_argument("--no-c-bench", dest="c_bench", action="store_const", const=None)
    ap.add_argument("--log-level", default="info", help="the sidecars' --log-level (debug: per-transfer timings)")
    ap.add_argument("--log-dir", help="copy the sidecars' logs here at the end")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--blocks", help="N[,N...]: instead of --sizes, issue 16's many-block runs: CreateReadable "
                    "time for N scattered descriptors, then one READ and one WRITE of N blocks as one "
                    "operation beside one contiguous descriptor (e.g. 1024,4096)")
    ap.add_argument("--block-size", default="4K", help="bytes per block for --blocks (default 4K)")
    ap.add_argument("--block-iters", type=int, default=5, help="CreateReadable calls timed per N (median)")
    args = ap.parse_args()
    if args.blocks:
        if args.log_level == "info":
            args.log_level = "debug"  # the passive side logs what exposing each operation took
        t0 = time.monotonic()
        bench = Bench(args)
        rows = []
        try:
            for n in (int(x) for x in args.blocks.split(",")):
                rows += blocks_bench(bench, n, parse_size(args.block_size), args.block_iters, args.ops.split(","))
        finally:
            bench.close()
        print("# many blocks, one operation, --backends %s on %s, %s" % (args.backends, args.dev,
                                                                     time.strftime("%Y-%m-%d %H:%M:%S")))
        print(blocks_table(rows))
        print("# %.0fs" % (time.monotonic() - t0))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"dev": args.dev, "blocks": rows}, f, indent=1)
        return
    specs = []
    for spec in args.sizes.split(","):
        size, _, iters = spec.partition(":")
        specs.append((parse_size(size), int(iters or 10)))
    ops = args.ops.split(",")

    t0 = time.monotonic()
    bench = Bench(args)
    results = []
    try:
        # Interleaved per size and direction (perftest, then the sidecar), so both see the same
        # machine load; the ratio compares neighbours.
        for rnd in range(1, args.rounds + 1):
            for size, iters in specs:
                for op in ops:
                    row = []
                    if not args.no_perftest:
                        row.append(perftest(args, op, size, max(iters, 5)))
                    row.append(bench.serial(op, size, iters))
                    if args.depth > 1 and size <= parse_size(args.depth_max_size):
                        row.append(bench.pipelined(op, size, max(iters, args.depth), args.depth))
                    row.append(bench.c_bench(op, size, iters, 1))
                    if args.depth > 1 and size <= parse_size(args.depth_max_size):
                        row.append(bench.c_bench(op, size, max(iters, args.depth), args.depth))
                    for r in row:
                        if r:
                            r["round"] = rnd
                            results.append(r)
                            log("%s" % r)
    finally:
        bench.close()
    print("# sidecar (--backends %s) vs perftest on %s gid %s, %s; GB/s = 1e9 bytes/s; "
          "p50/p99: client BeginX call(s) until the answer; op_p50: operation created..completed (ms); "
          "ratio: sidecar / perftest, same size and direction" % (args.backends, args.dev, args.gid,
                                                                    time.strftime("%Y-%m-%d %H:%M:%S")))
    print(table(results))
    print("# %.0fs" % (time.monotonic() - t0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dev": args.dev, "gid": args.gid, "backends": args.backends, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
