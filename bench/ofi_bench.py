#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The libfabric backend against the provider's own raw RMA, same provider, same run (not CI).

Starts two sidecars with the libfabric backend (default tcp;ofi_rxm on lo; --provider/--domain for
efa, verbs, ...), and builds bench/ofi_rma_baseline.c (raw fi_read / fi_write between two endpoints
of that provider: fabtests' fi_rma_bw is not in Debian). For each size (4 KiB .. 64 MiB) and
direction:

  sidecar   ITERS operations one after another: CreateReadable/CreateWritable on the passive
            sidecar (not timed), then one BeginRead/BeginWrite with `wait` on the active one,
            timed around the call (gRPC, OPEN, RMA, DONE: everything a worker waits for);
  baseline  ITERS raw operations of the same size, each timed post to completion.

GB/s = 1e9 bytes/s over the sum of the operations' times; p50/p99 of the per-operation times;
ratio = sidecar GB/s / baseline GB/s. The bytes of each size and direction are compared once.

The KV shape (--kv 16384x32K): one READ and one WRITE of N scattered blocks (a block list over 4
layer regions, ids in random order) against one contiguous descriptor of the same bytes, every
block compared; ratio = scattered GB/s / contiguous GB/s.

    SC_BINARY=build/rdma-sidecar SC_PYTHON_STUBS=build/python /usr/bin/python3 bench/ofi_bench.py \\
        [--provider "tcp;ofi_rxm"] [--domain lo] [--sizes 4K,64K,1M,4M,16M,64M] [--iters 20]
        [--kv 16384x32K] [--kv-iters 2] [--json FILE]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SC_SOURCE_DIR", os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

from harness import Sidecar, desc, pb, write_key_file  # noqa: E402


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def fmt_size(n):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, unit)
    return "%d B" % n


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * q))]


def build_baseline(wd):
    out = os.path.join(wd, "ofi-rma-baseline")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libfabric"], capture_output=True,
                           text=True, check=True).stdout.split()
    subprocess.run(["cc", "-O2", "-o", out, os.path.join(HERE, "ofi_rma_baseline.c")] + flags +
                   ["-lpthread"], check=True)
    return out


def baseline(exe, provider, domain, op, size, iters):
    r = subprocess.run([exe, provider, domain, op, str(size), str(iters)], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        return None
    kv = dict(x.split("=") for x in r.stdout.split())
    return float(kv["gbps"]), float(kv["p50_us"]) / 1e3, float(kv["p99_us"]) / 1e3


def one(a, b, op, ra, oa, rb, ob, size, pa_sets=(), pb_sets=()):
    """One timed transfer; a passive, b active. Returns seconds."""
    create = a.stub.CreateReadable if op == "read" else a.stub.CreateWritable
    pa = [desc(ra, oa, size)] if ra is not None else []
    pbd = [desc(rb, ob, size)] if rb is not None else []
    po = create(pb.CreatePassiveRequest(descriptors=pa, descriptor_sets=list(pa_sets),
                                        timeout_ms=600000), timeout=120)
    begin = b.stub.BeginRead if op == "read" else b.stub.BeginWrite
    t0 = time.perf_counter()
    done = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=pbd,
                                         descriptor_sets=list(pb_sets), timeout_ms=600000,
                                         wait=True, backend=pb.BACKEND_LIBFABRIC), timeout=900)
    t = time.perf_counter() - t0
    if done.status != pb.OPERATION_STATUS_COMPLETE:
        raise SystemExit("%s failed: %s" % (op, done.error.message))
    a.wait(po.operation_id, 60000)
    for s, oid in ((a, po.operation_id), (b, done.operation_id)):
        s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=oid), timeout=30)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--domain", default="lo")
    ap.add_argument("--sizes", default="4K,64K,1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=20, help="operations per size (64 MiB: a quarter)")
    ap.add_argument("--kv", default="16384x32K", help="BLOCKSxSIZE, or 'off'")
    ap.add_argument("--kv-iters", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    wd = tempfile.mkdtemp(prefix="sc-ofi-bench-", dir="/tmp")
    exe = build_baseline(wd)
    keys = write_key_file(os.path.join(wd, "keys"))
    extra = ["--backends", "tcp,libfabric", "--ofi-provider", args.provider, "--ofi-domains",
             args.domain, "--log-level", "warn", "--max-operations", "1000000"]
    a = Sidecar(wd, "a", key_file=keys, extra=extra)
    b = Sidecar(wd, "b", key_file=keys, extra=extra)
    rows, figures = [], {}
    try:
        be = next(x for x in a.info().backends if x.backend == pb.BACKEND_LIBFABRIC)
        if not be.available:
            raise SystemExit("libfabric backend unavailable: " + be.detail)
        print("# %s" % be.detail)
        big = max(sizes)
        ra, rb = a.create_region(big + 4096), b.create_region(big + 4096)
        for size in sizes:
            iters = max(3, args.iters // 4) if size >= 64 << 20 else args.iters
            for op in ("read", "write"):
                data = os.urandom(size)
                (a.fill(ra, 0, data) if op == "read" else b.fill(rb, 0, data))
                one(a, b, op, ra, 0, rb, 0, size)  # warm-up, and the bytes compared
                got = b.peek(rb, 0, size) if op == "read" else a.peek(ra, 0, size)
                if got != data:
                    raise SystemExit("%s of %d bytes moved wrong bytes" % (op, size))
                ts = [one(a, b, op, ra, 0, rb, 0, size) for _ in range(iters)]
                sc = (size * iters / sum(ts) / 1e9, pct(ts, 0.5) * 1e3, pct(ts, 0.99) * 1e3)
                bl = baseline(exe, args.provider, args.domain, op, size, iters)
                rows.append((fmt_size(size), op.upper(), iters, sc, bl))
                figures["%s-%d" % (op, size)] = {"sidecar": sc, "baseline": bl}
        print()
        print("%-8s %-5s %5s | %8s %9s %9s | %8s %9s %9s | %5s" % (
            "size", "op", "iters", "GB/s", "p50 ms", "p99 ms", "base GB/s", "p50 ms", "p99 ms",
            "ratio"))
        for size, op, iters, sc, bl in rows:
            b3 = bl or (0, 0, 0)
            print("%-8s %-5s %5d | %8.3f %9.2f %9.2f | %8.3f %9.2f %9.2f | %5.2f" % (
                size, op, iters, sc[0], sc[1], sc[2], b3[0], b3[1], b3[2],
                sc[0] / b3[0] if b3[0] else 0))
        if args.kv != "off":
            n, bs = args.kv.lower().split("x")
            n, bs = int(n), parse_size(bs.upper())
            layers = 4
            per = n // layers
            stride = bs + 512
            rnd = random.Random(7)
            ids = rnd.sample(range(per), per)
            lregs = [a.create_region(per * stride) for _ in range(layers)]
            rk = b.create_region(n * bs)
            rc = a.create_region(n * bs)
            bl = pb.BlockList(region_ids=[r.region_id for r in lregs], block_length=bs,
                              block_ids=ids, block_stride=stride, base_offset=0)
            sr = pb.StridedRun(region_id=rk.region_id, offset=0, stride=bs, count=n, length=bs)
            print()
            print("KV shape: %d blocks x %s (%d layers, ids in random order), %s in all" % (
                n, fmt_size(bs), layers, fmt_size(n * bs)))
            for op in ("read", "write"):
                imgs = [os.urandom(per * stride) for _ in lregs]
                for r, img in zip(lregs, imgs):
                    a.fill(r, 0, img)
                src = os.urandom(n * bs)
                b.fill(rk, 0, src)
                kv_t = [one(a, b, op, None, 0, None, 0, n * bs,
                            pa_sets=[pb.DescriptorSet(block_list=bl)],
                            pb_sets=[pb.DescriptorSet(strided_run=sr)]) for _ in range(args.kv_iters)]
                # every block compared (the last transfer's)
                k = 0
                for li in range(layers):
                    got_l = a.peek(lregs[li], 0, per * stride)
                    for bid in ids:
                        want = src[k * bs:(k + 1) * bs]
                        if op == "read":
                            want_b = imgs[li][bid * stride:bid * stride + bs]
                            if b.peek(rk, k * bs, bs) != want_b:
                                raise SystemExit("KV read: block %d differs" % k)
                        elif got_l[bid * stride:bid * stride + bs] != want:
                            raise SystemExit("KV write: block %d differs" % k)
                        k += 1
                cont_t = [one(a, b, op, rc, 0, rk, 0, n * bs) for _ in range(args.kv_iters)]
                kv_g = n * bs * len(kv_t) / sum(kv_t) / 1e9
                ct_g = n * bs * len(cont_t) / sum(cont_t) / 1e9
                print("%-5s scattered %.3f GB/s (%.0f ms), contiguous %.3f GB/s (%.0f ms): "
                      "ratio %.2f" % (op.upper(), kv_g, statistics.median(kv_t) * 1e3, ct_g,
                                      statistics.median(cont_t) * 1e3, kv_g / ct_g))
                figures["kv-" + op] = {"scattered_gbps": kv_g, "contiguous_gbps": ct_g}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
    finally:
        a.stop()
        b.stop()
        shutil.rmtree(wd, ignore_errors=True)
        for s in (a, b):
            shutil.rmtree(s.shm, ignore_errors=True)


if __name__ == "__main__":
    main()
