# SPDX-License-Identifier: Apache-2.0
"""GPU memory benchmark: the sidecar's GPU data paths beside the driver's own copies, same run.

Runs, one after another on a machine with a CUDA GPU:
  cuMemcpyDtoH / cuMemcpyHtoD   pinned host memory (cuMemHostAlloc), the PCIe limit of staging
  cuMemcpyDtoD                  on one GPU, the limit of a LOCAL device-to-device transfer
  host TCP READ                 two sidecars on loopback moving host regions (the TCP limit here)
  staged GPU READ / WRITE       two sidecars on loopback, GPU memory on both sides, staged through
                                pinned buffers, pipelined with the socket
  LOCAL GPU READ                one sidecar, device to device through the CUDA driver
  KV-cache shaped staged READ / WRITE   4,096 x 32 KiB and 4,096 x 4 KiB blocks at random slots
                                in ONE operation against the same bytes contiguous: the ratio
                                and the cost per piece (pieces packed into the pinned buffers)
and prints a table with the ratios the targets are stated in:
  staged / min(host TCP, pinned DtoH) >= 0.8       LOCAL / cuMemcpyDtoD >= 0.9
Every sidecar figure is end to end as a worker sees it: BeginRead/BeginWrite to WaitOperation
COMPLETE (metadata creation is not timed). The worker's buffers are its own cuMemAlloc memory,
registered by CUDA IPC handle. Bytes are checked once per path (random data, SHA-256).

Usage: /usr/bin/python3 bench/gpu_bench.py [--size 256MiB] [--iters 5] [--json FILE]
       [--stand-in]  (the test suite's stand-in driver: checks the script, figures mean nothing)
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def parse_size(t):
    t = t.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def driver_copies(cu, size, iters):
    """GB/s (median) of pinned DtoH, pinned HtoD and DtoD on device 0."""
    import ctypes
    host = ctypes.c_void_p()
    cu.check("cuMemHostAlloc", ctypes.byref(host), size, 0)
    a, b = cu.alloc(size), cu.alloc(size)
    out = {}
    try:
        for name, call in (("cuMemcpyDtoH (pinned)", lambda: cu.check("cuMemcpyDtoH", host, a, size)),
                           ("cuMemcpyHtoD (pinned)", lambda: cu.check("cuMemcpyHtoD", a, host, size)),
                           ("cuMemcpyDtoD", lambda: (cu.check("cuMemcpyDtoD", b, a, size),
                                                     cu.check("cuCtxSynchronize")))):
            call()  # warm up
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            out[name] = gbps(size, statistics.median(times))
    finally:
        cu.free(a)
        cu.free(b)
        cu.check("cuMemFreeHost", host)
    return out


class Mem:
    """A worker buffer: GPU memory of this process registered by IPC, or a host region."""

    def __init__(self, cu, pb, sc, size, gpu):
        self.cu, self.sc, self.size, self.gpu = cu, sc, size, gpu
        if gpu:
            self.ptr = cu.alloc(size)
            self.region = sc.stub.RegisterRegion(pb.RegisterRegionRequest(
                cuda_ipc=pb.CudaIpcSource(device_index=0, handle=cu.ipc_handle(self.ptr), size=size)), timeout=60)
        else:
            self.region = sc.create_region(size)

    def write(self, data):
        if self.gpu:
            self.cu.htod(self.ptr, data)
        else:
            self.sc.fill(self.region, 0, data)

    def digest(self):
        h = hashlib.sha256()
        step = 32 << 20
        for off in range(0, self.size, step):
            n = min(step, self.size - off)
            h.update(self.cu.dtoh(self.ptr + off, n) if self.gpu else self.sc.peek(self.region, off, n))
        return h.hexdigest()


def sidecar_path(pb, src_sc, dst_sc, src, dst, direction, iters):
    """Median GB/s of `iters` transfers src -> dst (READ: dst pulls; WRITE: src side pushes)."""
    holder = src
    payload = os.urandom(holder.size)
    holder.write(payload)
    want = hashlib.sha256(payload).hexdigest()
    times = []
    for i in range(iters + 1):
        passive_sc, passive_mem = (src_sc, src) if direction == "read" else (dst_sc, dst)
        active_sc, active_mem = (dst_sc, dst) if direction == "read" else (src_sc, src)
        create = passive_sc.stub.CreateReadable if direction == "read" else passive_sc.stub.CreateWritable
        op = create(pb.CreatePassiveRequest(descriptors=[pb.Descriptor(region_id=passive_mem.region.region_id,
                                                                       offset=0, length=passive_mem.size)],
                                            timeout_ms=120000), timeout=60)
        begin = active_sc.stub.BeginRead if direction == "read" else active_sc.stub.BeginWrite
        t = time.perf_counter()
        a = begin(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[
            pb.Descriptor(region_id=active_mem.region.region_id, offset=0, length=active_mem.size)],
            timeout_ms=120000), timeout=60)
        done = active_sc.wait(a.operation_id, 120000)
        elapsed = time.perf_counter() - t
        if done.status != pb.OPERATION_STATUS_COMPLETE:
            raise SystemExit("transfer failed: %s" % done.error.message)
        if i == 0:
            if dst.digest() != want:
                raise SystemExit("bytes differ after %s" % direction)
            reason = done.backend_reason
        else:
            times.append(elapsed)
    return gbps(holder.size, statistics.median(times)), reason


def kv_path(pb, sa, sb, ga, gb, blk, n, direction, iters, rnd):
    """KV-cache shaped staged TCP transfer between GPU buffers: n blocks of blk bytes at random
    block slots of ga (a BlockList on the passive side, sa) against one StridedRun at the start of
    gb (sb), ONE operation; then the same bytes as one contiguous descriptor each side. Returns
    (scattered GB/s, contiguous GB/s, per-piece cost in us), medians; the first scattered
    transfer is compared block by block."""
    slots = ga.size // blk
    ids = rnd.sample(range(slots), n)
    total = n * blk
    payload = os.urandom(total)
    if direction == "read":
        for k, i in enumerate(ids):
            ga.cu.htod(ga.ptr + i * blk, payload[k * blk:(k + 1) * blk])
    else:
        gb.write(payload + bytes(gb.size - total))
    res = {}
    for layout in ("scattered", "contiguous", "scattered"):
        times = []
        for i in range(iters + 1):
            if layout == "scattered":
                p_req = pb.CreatePassiveRequest(descriptor_sets=[pb.DescriptorSet(block_list=pb.BlockList(
                    region_ids=[ga.region.region_id], block_length=blk, block_ids=ids))], timeout_ms=120000)
                a_sets = [pb.DescriptorSet(strided_run=pb.StridedRun(region_id=gb.region.region_id, offset=0,
                                                                      stride=blk, count=n, length=blk))]
                a_descs = []
            else:
                p_req = pb.CreatePassiveRequest(descriptors=[pb.Descriptor(region_id=ga.region.region_id,
                                                                           offset=0, length=total)],
                                                timeout_ms=120000)
                a_sets, a_descs = [], [pb.Descriptor(region_id=gb.region.region_id, offset=0, length=total)]
            create = sa.stub.CreateReadable if direction == "read" else sa.stub.CreateWritable
            op = create(p_req, timeout=60)
            begin = sb.stub.BeginRead if direction == "read" else sb.stub.BeginWrite
            t = time.perf_counter()
            act = begin(pb.BeginTransferRequest(metadata=op.metadata, descriptors=a_descs, descriptor_sets=a_sets,
                                                timeout_ms=120000), timeout=60)
            done = sb.wait(act.operation_id, 120000)
            elapsed = time.perf_counter() - t
            if done.status != pb.OPERATION_STATUS_COMPLETE:
                raise SystemExit("KV %s failed: %s" % (direction, done.error.message))
            for sc, oid in ((sa, op.operation_id), (sb, act.operation_id)):
                sc.wait(oid, 60000)
                sc.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=oid), timeout=30)
            if i == 0 and layout == "scattered" and "scattered" not in res:
                src_blocks = ga.cu.dtoh(ga.ptr, ga.size)
                dst = gb.cu.dtoh(gb.ptr, total)
                for k, sl in enumerate(ids):
                    if src_blocks[sl * blk:(sl + 1) * blk] != dst[k * blk:(k + 1) * blk]:
                        raise SystemExit("KV %s: block %d differs" % (direction, k))
            elif i > 0:
                times.append(elapsed)
        res.setdefault(layout, []).extend(times)
    ts, tc = statistics.median(res["scattered"]), statistics.median(res["contiguous"])
    return gbps(total, ts), gbps(total, tc), (ts - tc) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"), help="build dir (default: build)")
    ap.add_argument("--size", default="256MiB", help="bytes per transfer (default: 256MiB)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per figure (median; default 5)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--stand-in", action="store_true",
                    help="use the test suite's stand-in CUDA driver (no GPU; figures are meaningless)")
    a = ap.parse_args()
    size = parse_size(a.size)
    build = os.path.abspath(a.build)
    os.environ.setdefault("SC_BINARY", os.path.join(build, "rdma-sidecar"))
    os.environ.setdefault("SC_PYTHON_STUBS", os.path.join(build, "python"))
    env = {}
    if a.stand_in:
        env["SC_TEST_CUDA_DRIVER"] = os.environ["SC_TEST_CUDA_DRIVER"] = os.path.join(build, "tests",
                                                                                       "libsc_fake_cuda.so")
    import harness  # noqa: E402 (after SC_BINARY; puts examples/ on sys.path)
    import cudadrv as cu  # noqa: E402
    from harness import pb  # noqa: E402
    try:
        cu.init(0)
    except Exception as e:  # noqa: BLE001
        raise SystemExit("gpu_bench: no usable GPU: %s" % e)
    name = cu.device_name(0)
    print("GPU 0: %s%s; %s per transfer, median of %d" % (name, " (STAND-IN driver)" if a.stand_in else "",
                                                          a.size, a.iters), flush=True)
    results = {"gpu": name, "size": size, "stand_in": a.stand_in}
    rows = []
    base = driver_copies(cu, size, a.iters)
    for k, v in base.items():
        rows.append((k, v, ""))

    workdir = tempfile.mkdtemp(prefix="sc-gpubench-", dir="/tmp")
    keys = harness.write_key_file(os.path.join(workdir, "keys"))
    sidecars = []
    try:
        for n in ("a", "b"):
            sidecars.append(harness.Sidecar(workdir, n, key_file=keys, env=env,
                                            extra=["--log-level", "info", "--max-region-size", str(2 * size + (1 << 30))]))
        sa, sb = sidecars
        host_tcp, _ = sidecar_path(pb, sa, sb, Mem(cu, pb, sa, size, False), Mem(cu, pb, sb, size, False),
                                   "read", a.iters)
        rows.append(("sidecar host TCP READ", host_tcp, ""))
        ga, gb = Mem(cu, pb, sa, size, True), Mem(cu, pb, sb, size, True)
        staged_r, why = sidecar_path(pb, sa, sb, ga, gb, "read", a.iters)
        staged_w, _ = sidecar_path(pb, sa, sb, ga, gb, "write", a.iters)
        limit = min(host_tcp, base["cuMemcpyDtoH (pinned)"])
        rows.append(("sidecar GPU->GPU READ (staged TCP)", staged_r, "%.2fx of min(host TCP, pinned DtoH); target 0.8" % (staged_r / limit)))
        rows.append(("sidecar GPU->GPU WRITE (staged TCP)", staged_w, "%.2fx of min(host TCP, pinned DtoH); target 0.8" % (staged_w / limit)))
        la, lb = Mem(cu, pb, sa, size, True), Mem(cu, pb, sa, size, True)
        local_r, lwhy = sidecar_path(pb, sa, sa, la, lb, "read", a.iters)
        rows.append(("sidecar GPU->GPU READ (LOCAL)", local_r, "%.2fx of cuMemcpyDtoD; target 0.9" % (local_r / base["cuMemcpyDtoD"])))
        results["why"] = {"staged": why, "local": lwhy}
        # KV-cache shaped: many pieces in one operation, packed into the pinned buffers
        import random
        rnd = random.Random(7)
        kv = []
        for blk in (32768, 4096):
            n = min(4096, size // blk)
            ka, kb = Mem(cu, pb, sa, int(n * blk * 1.25), True), Mem(cu, pb, sb, n * blk, True)
            for d in ("read", "write"):
                sg, cg, per = kv_path(pb, sa, sb, ka, kb, blk, n, d, a.iters, rnd)
                kv.append((blk, n, d, sg, cg, per))
                results["kv %d x %d %s" % (n, blk, d)] = {"scattered": sg, "contiguous": cg, "per_piece_us": per}
    finally:
        for s in sidecars:
            s.stop()
    width = max(len(r[0]) for r in rows)
    print("\n%-*s  %8s  %s" % (width, "path", "GB/s", "ratio"))
    print("%s  %s  %s" % ("-" * width, "-" * 8, "-" * 5))
    for label, v, ratio in rows:
        print("%-*s  %8.2f  %s" % (width, label, v, ratio))
        results[label] = v
    print("\nKV-cache shaped, staged TCP, GPU on both sides, ONE operation each (random block slots on the")
    print("passive side, one strided run on the active side) against the same bytes contiguous:")
    print("| blocks | block | dir | contiguous GB/s | scattered GB/s | scattered / contiguous | cost per piece us |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for blk, n, d, sg, cg, per in kv:
        print("| %d | %d KiB | %s | %.2f | %.2f | %.2f | %.2f |" % (n, blk >> 10, d.upper(), cg, sg, sg / cg, per))
    print("\nstaged path: %s\nlocal path: %s" % (results["why"]["staged"], results["why"]["local"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
