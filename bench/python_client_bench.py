#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the rdma_sidecar Python package costs over raw gRPC stubs, measured in the same run.

Two real sidecars on this machine (a shared key, the TCP data plane on loopback; --local: one
sidecar, the LOCAL backend). For each size (default 4 KiB and 64 MiB) a worker reads a readable of
sidecar A into memory of sidecar B, driven three ways, interleaved one transfer at a time (the order
rotating) so that all three see the same machine load:
  raw    the generated stubs (grpc, blocking): CreateReadable, BeginRead, WaitOperation, 2 x Release
  sync   rdma_sidecar.sync: create_readable, begin_read, wait_for_completion, release
  async  rdma_sidecar (grpc.aio): the same calls awaited
Memory is region memory in every case (NumPy arrays from Connector.empty for the package, the same
regions' files mapped for raw). Two spans are timed: "transfer" from BeginRead to COMPLETE, and
"cycle", the whole create-read-wait-release sequence. Prints medians and the package's overhead.

Usage: /usr/bin/python3 bench/python_client_bench.py [--sizes 4K:400,64M:12] [--rounds 4] [--local] [--json FILE]
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))

import harness  # noqa: E402  (real sidecars; build/python stubs for "raw")
import numpy as np  # noqa: E402

import rdma_sidecar as rs  # noqa: E402
import rdma_sidecar.sync  # noqa: E402

pb = harness.pb


def parse_sizes(text):
    out = []
    for part in text.split(","):
        size, reps = part.split(":")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
        out.append((int(size[:-1] if mult > 1 else size) * mult, int(reps)))
    return out


def raw_once(sa, sb, src_region, dst_region, n):
    t0 = time.perf_counter()
    r = sa.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[harness.desc(src_region, 0, n)]), timeout=30)
    t1 = time.perf_counter()
    op = sb.stub.BeginRead(pb.BeginTransferRequest(metadata=r.metadata, descriptors=[harness.desc(dst_region, 0, n)]),
                           timeout=30)
    w = sb.stub.WaitOperation(pb.WaitOperationRequest(operation_id=op.operation_id, timeout_ms=60000), timeout=90)
    t2 = time.perf_counter()
    assert w.status == pb.OPERATION_STATUS_COMPLETE, w
    sb.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=30)
    sa.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=r.operation_id), timeout=30)
    return t2 - t1, time.perf_counter() - t0


def sync_once(ca, cb, src, dst):
    t0 = time.perf_counter()
    r = ca.create_readable(rs.Descriptor(src))
    t1 = time.perf_counter()
    op = cb.begin_read(r, rs.Descriptor(dst))
    op.wait_for_completion(60)
    t2 = time.perf_counter()
    op.release()
    r.release()
    return t2 - t1, time.perf_counter() - t0


async def async_once(ca, cb, src, dst):
    t0 = time.perf_counter()
    r = await ca.create_readable(rs.Descriptor(src))
    t1 = time.perf_counter()
    op = await cb.begin_read(r, rs.Descriptor(dst))
    await op.wait_for_completion(60)
    t2 = time.perf_counter()
    await op.release()
    await r.release()
    return t2 - t1, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4K:400,64M:12", help="SIZE:REPS per round, comma-separated (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=4, help="repeat the REPS this many times (default: %(default)s)")
    p.add_argument("--local", action="store_true", help="one sidecar: the LOCAL backend instead of TCP")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="scpyb-", dir="/tmp")
    keys = harness.write_key_file(os.path.join(work, "keys"))
    sidecars = [harness.Sidecar(work, "a", key_file=keys, extra=["--log-level", "warn"])]
    sidecars.append(sidecars[0] if a.local else harness.Sidecar(work, "b", key_file=keys,
                                                                extra=["--log-level", "warn"]))
    sa, sb = sidecars
    ca, cb = rs.sync.Connector("unix:" + sa.sock), rs.sync.Connector("unix:" + sb.sock)
    loop = asyncio.new_event_loop()
    aa, ab = rs.Connector("unix:" + sa.sock), rs.Connector("unix:" + sb.sock)
    results = []
    try:
        for size, reps in parse_sizes(a.sizes):
            src, dst = ca.empty(size, np.uint8), cb.zeros(size, np.uint8)
            src[:] = np.frombuffer(os.urandom(min(size, 1 << 20)) * max(1, size >> 20), np.uint8)[:size]
            asrc, adst = loop.run_until_complete(aa.empty(size, np.uint8)), loop.run_until_complete(ab.zeros(size, np.uint8))
            asrc[:] = src
            src_region, dst_region = ca.region_of(src).proto, cb.region_of(dst).proto
            samples = {"raw": [], "sync": [], "async": []}
            for _ in range(max(1, reps // 10)):  # warm up all three
                raw_once(sa, sb, src_region, dst_region, size)
                sync_once(ca, cb, src, dst)
                loop.run_until_complete(async_once(aa, ab, asrc, adst))
            for rnd in range(a.rounds * reps):  # one of each in turn, the order rotating
                runs = [("raw", lambda: raw_once(sa, sb, src_region, dst_region, size)),
                        ("sync", lambda: sync_once(ca, cb, src, dst)),
                        ("async", lambda: loop.run_until_complete(async_once(aa, ab, asrc, adst)))]
                for k, fn in runs[rnd % 3:] + runs[:rnd % 3]:
                    samples[k].append(fn())
            assert dst.tobytes() == src.tobytes() and adst.tobytes() == asrc.tobytes()
            row = {"size": size, "samples": len(samples["raw"]), "backend": "local" if a.local else "tcp"}
            for k, v in samples.items():
                row[k + "_transfer_us"] = statistics.median(x[0] for x in v) * 1e6
                row[k + "_cycle_us"] = statistics.median(x[1] for x in v) * 1e6
            results.append(row)
            ca.free(src)
            cb.free(dst)
            loop.run_until_complete(aa.free(asrc))
            loop.run_until_complete(ab.free(adst))
    finally:
        ca.close()
        cb.close()
        loop.run_until_complete(aa.close())
        loop.run_until_complete(ab.close())
        loop.close()
        for s in {id(s): s for s in sidecars}.values():
            s.stop()
    print("rdma_sidecar package vs raw stubs, %s backend, medians (same run, interleaved)" % results[0]["backend"])
    print("%-8s %6s %-9s %12s %12s %12s %16s %16s" % ("size", "n", "span", "raw us", "sync us", "async us",
                                                 "sync overhead", "async overhead"))
    for r in results:
        label = "%dK" % (r["size"] >> 10) if r["size"] < 1 << 20 else "%dM" % (r["size"] >> 20)
        for span in ("transfer", "cycle"):
            raw, sy, asy = (r["%s_%s_us" % (k, span)] for k in ("raw", "sync", "async"))
            print("%-8s %6d %-9s %12.1f %12.1f %12.1f %8.1f us %4.0f%% %8.1f us %4.0f%%"
                  % (label, r["samples"], span, raw, sy, asy, sy - raw, (sy - raw) / raw * 100, asy - raw, (asy - raw) / raw * 100))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
