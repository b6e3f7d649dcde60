#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""KV-cache shaped transfers on loopback TCP: scattered blocks against one contiguous buffer.

Two sidecars (a: the passive side, b: the active side). For each shape (layer tensors x blocks x
block bytes) both sides hold one region per layer tensor with room for more blocks than moved, and
the request's block ids are random (different on each side); the scattered transfer is ONE
operation with a compact BlockList on each side. The contiguous transfer moves the same bytes as
one descriptor between one region on each side. READ and WRITE, same run, alternating, medians
of --reps. The first transfer of each (shape, layout, direction) moves fresh random bytes and is
compared byte for byte. Also: CreateReadable time (compact list and the same list as plain
descriptors), the metadata's size, iperf3 (one stream) as the link's baseline, and ucx_perftest
over TCP with one message of 64 scattered blocks (-D iov,iov) against the same bytes contiguous.

    /usr/bin/python3 bench/kv_bench.py [--reps 5] [--shapes 8b,70b,1k] [--build build]
    bench/run-vm-bench.sh kv --shapes 1k,70b --reps 3    (ibverbs on Soft-RoCE in the VM)

Shapes: 8b = Llama-3.1-8B bf16, 16-token blocks: 64 tensors x 256 blocks x 32 KiB (512 MiB, a
4K-token prompt); 70b = 70B at TP8: 160 tensors x 256 blocks x 4 KiB (160 MiB, 40,960
descriptors); 1k = 64 tensors x 16 blocks x 32 KiB (1,024 descriptors, 32 MiB).
"""
import argparse
import mmap
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, HERE)

SHAPES = {
    "8b": ("8B: 64 x 256 x 32 KiB", 64, 256, 32768),
    "70b": ("70B-TP8: 160 x 256 x 4 KiB", 160, 256, 4096),
    "1k": ("1,024 x 32 KiB: 64 x 16", 64, 16, 32768),
}
SLACK = 1.25  # region room: blocks moved x SLACK


def fill_random(sc, region):
    step = 64 << 20
    with open(region.path, "r+b") as f:
        for off in range(0, region.size, step):
            f.write(os.urandom(min(step, region.size - off)))


def maps(regions):
    out = []
    for r in regions:
        with open(r.path, "r+b") as f:
            out.append(mmap.mmap(f.fileno(), r.size))
    return out


class Layout:
    def __init__(self, sc, layers, blocks, blk, scattered, rnd, pb):
        self.blk, self.layers = blk, layers
        if scattered:
            slots = int(blocks * SLACK)
            self.regions = [sc.create_region(slots * blk) for _ in range(layers)]
            self.ids = rnd.sample(range(slots), blocks)
            self.sets = [pb.DescriptorSet(block_list=pb.BlockList(
                region_ids=[r.region_id for r in self.regions], block_length=blk, block_ids=self.ids))]
            self.plain = [pb.Descriptor(region_id=r.region_id, offset=i * blk, length=blk)
                          for r in self.regions for i in self.ids]
            self.descs = []
        else:
            self.regions = [sc.create_region(layers * blocks * blk)]
            self.ids = None
            self.sets = []
            self.descs = [pb.Descriptor(region_id=self.regions[0].region_id, offset=0,
                                        length=layers * blocks * blk)]

    def pieces(self):
        """(map index, offset) of every block in list order."""
        if self.ids is None:
            n = self.regions[0].size // self.blk
            return [(0, k * self.blk) for k in range(n)]
        return [(li, i * self.blk) for li in range(self.layers) for i in self.ids]


def verify(src, dst):
    ms, md = maps(src.regions), maps(dst.regions)
    try:
        blk = src.blk
        for (si, so), (di, do) in zip(src.pieces(), dst.pieces()):
            if ms[si][so:so + blk] != md[di][do:do + blk]:
                raise SystemExit("bytes differ: source map %d offset %d -> destination map %d offset %d"
                                 % (si, so, di, do))
    finally:
        for m in ms + md:
            m.close()


def transfer(H, pb, a, b, pa, pb_side, direction, check):
    holder = pa if direction == "read" else pb_side
    if check:
        for r in holder.regions:
            fill_random(None, r)
    create = a.stub.CreateReadable if direction == "read" else a.stub.CreateWritable
    t0 = time.perf_counter()
    po = create(pb.CreatePassiveRequest(descriptors=pa.descs, descriptor_sets=pa.sets, timeout_ms=600000),
                timeout=120)
    t_create = time.perf_counter() - t0
    begin = b.stub.BeginRead if direction == "read" else b.stub.BeginWrite
    t0 = time.perf_counter()
    op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=pb_side.descs,
                                       descriptor_sets=pb_side.sets, timeout_ms=600000, wait=True), timeout=600)
    dt = time.perf_counter() - t0
    if op.status != pb.OPERATION_STATUS_COMPLETE:
        raise SystemExit("%s ended %s: %s" % (direction, pb.OperationStatus.Name(op.status), op.error.message))
    done = a.wait(po.operation_id, 60000)
    if done.status != pb.OPERATION_STATUS_COMPLETE:
        raise SystemExit("passive side ended %s: %s" % (pb.OperationStatus.Name(done.status), done.error.message))
    for sc, oid in ((a, po.operation_id), (b, op.operation_id)):
        sc.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=oid), timeout=30)
    if check:
        if direction == "read":
            verify(pa, pb_side)
        else:
            verify(pb_side, pa)
    return op.bytes_done / dt / 1e9, t_create, len(po.metadata)


def create_ms(pb, a, req, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        po = a.stub.CreateReadable(req, timeout=120)
        ts.append((time.perf_counter() - t0) * 1e3)
        a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=po.operation_id), timeout=30)
    return statistics.median(ts), len(po.metadata)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="transfers per (shape, layout, direction); medians")
    ap.add_argument("--shapes", default="8b,70b,1k", help="comma-separated: 8b, 70b, 1k")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="build directory")
    ap.add_argument("--seed", type=int, default=None, help="block ids (default: random)")
    ap.add_argument("--ib-dev", default=None,
                    help="move over ibverbs on this RDMA device (e.g. rxe0 in the Soft-RoCE VM: "
                         "bench/run-vm-bench.sh kv ...); default: loopback TCP")
    ap.add_argument("--ib-gid", type=int, default=1, help="GID index with --ib-dev (default 1)")
    ap.add_argument("--ip", default="127.0.0.1", help="the device's address with --ib-dev")
    ap.add_argument("--sidecar-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for both sidecars (repeatable), e.g. SC_TEST_IB_MW_UNBOUNDED=1 "
                         "to time the memory-window path on rxe (a test hook: never in production)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    import harness as H
    H.BINARY = os.path.join(build, "rdma-sidecar")
    pb = H.pb
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rnd = random.Random(seed)
    wd = tempfile.mkdtemp(prefix="sc-kv-", dir="/tmp")
    keys = H.write_key_file(os.path.join(wd, "keys"))
    extra = ["--log-level", "warn", "--max-descriptors", "1048576"]
    wire = "loopback TCP"
    if args.ib_dev:
        extra += ["--ib-device", args.ib_dev, "--ib-gid-index", str(args.ib_gid), "--data-listen",
                  args.ip + ":0", "--advertise", args.ip, "--backends", "ibverbs"]
        wire = "ibverbs on %s (%s)" % (args.ib_dev, args.ip)
    env = dict(kv.split("=", 1) for kv in args.sidecar_env)
    if env:
        wire += ", sidecar environment %s" % " ".join(args.sidecar_env)
    a = H.Sidecar(wd, "a", key_file=keys, extra=extra, tcp=not args.ib_dev, env=env)
    b = H.Sidecar(wd, "b", key_file=keys, extra=extra, tcp=not args.ib_dev, env=env)
    rows, creates = [], []
    try:
        from baselines import iperf3, ucx
        link = iperf3(3)
        # UCX over TCP with the same pieces: one message of 64 scattered blocks (-D iov,iov)
        # against one contiguous message of the same bytes, 32 KiB and 4 KiB blocks.
        ucx_rows = []
        for blk in (32768, 4096):
            c = ucx("tag_bw", 64 * blk, 300)
            v = ucx("tag_bw", blk, 300, iov=64)
            ucx_rows.append((blk, c, v))
        for key in args.shapes.split(","):
            name, layers, blocks, blk = SHAPES[key]
            n = layers * blocks
            lay = {"scattered": (Layout(a, layers, blocks, blk, True, rnd, pb),
                                 Layout(b, layers, blocks, blk, True, rnd, pb)),
                   "contiguous": (Layout(a, layers, blocks, blk, False, rnd, pb),
                                  Layout(b, layers, blocks, blk, False, rnd, pb))}
            res = {(l, d): [] for l in lay for d in ("read", "write")}
            meta = {}
            tcreate = {l: [] for l in lay}
            for rep in range(args.reps):
                for d in ("read", "write"):
                    order = ("scattered", "contiguous") if rep % 2 == 0 else ("contiguous", "scattered")
                    for l in order:
                        gbs, tc, mb = transfer(H, pb, a, b, lay[l][0], lay[l][1], d, check=rep == 0)
                        res[(l, d)].append(gbs)
                        tcreate[l].append(tc * 1e3)
                        meta[l] = mb
            med = {k: statistics.median(v) for k, v in res.items()}
            rows.append((name, n, blk, n * blk, med, meta))
            pa = lay["scattered"][0]
            c_ms, c_meta = create_ms(pb, a, pb.CreatePassiveRequest(descriptor_sets=pa.sets), 9)
            p_ms, p_meta = create_ms(pb, a, pb.CreatePassiveRequest(descriptors=pa.plain), 9)
            creates.append((name, n, c_ms, c_meta, p_ms, p_meta))
            for l in lay:
                for side, sc in ((0, a), (1, b)):
                    for r in lay[l][side].regions:
                        sc.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=60)
        print("kv_bench: %s, two sidecars, medians of %d transfers (each ONE operation), seed %d"
              % (wire, args.reps, seed))
        print("link baseline: iperf3 1 stream %s GB/s\n" % ("%.2f" % link if link else "n/a (no iperf3)"))
        print("| shape | descriptors | block | bytes | dir | contiguous GB/s | scattered GB/s | scattered / "
              "contiguous | target |")
        print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for name, n, blk, total, med, meta in rows:
            for d in ("read", "write"):
                c, s = med[("contiguous", d)], med[("scattered", d)]
                target = "0.8" if blk >= 32768 else "0.5"
                print("| %s | %d | %d KiB | %d MiB | %s | %.2f | %.2f | %.2f | %s |"
                      % (name, n, blk >> 10, total >> 20, d.upper(), c, s, s / c, target))
        print("\n| shape | descriptors | CreateReadable compact ms | metadata bytes | CreateReadable plain "
              "list ms | metadata bytes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, n, c_ms, c_meta, p_ms, p_meta in creates:
            print("| %s | %d | %.2f | %d | %.2f | %d |" % (name, n, c_ms, c_meta, p_ms, p_meta))
        print("\n| ucx_perftest tag_bw, UCX_TLS=tcp | contiguous GB/s | iov GB/s | iov / contiguous |")
        print("| --- | ---: | ---: | ---: |")
        for blk, c, v in ucx_rows:
            if c and v:
                print("| 64 x %d KiB per message | %.2f | %.2f | %.2f |"
                      % (blk >> 10, c["gb_per_s"], v["gb_per_s"], v["gb_per_s"] / c["gb_per_s"]))
            else:
                print("| 64 x %d KiB per message | n/a (no ucx_perftest, or it failed) | | |" % (blk >> 10))
        print("\n(CreateReadable: client-observed gRPC round trip over the unix socket, median of 9; "
              "every first transfer per row compared byte for byte)")
    finally:
        for s in (a, b):
            s.stop()
        import shutil
        for s in (a, b):
            shutil.rmtree(s.shm, ignore_errors=True)
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
