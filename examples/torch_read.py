#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two workers, one PyTorch tensor: `expose` puts a tensor in sidecar memory and offers it as a
READABLE; `read` (another process, usually beside another sidecar) pulls it into a tensor of its own.
Written on the rdma_sidecar package (asyncio API, the concepts of Dynamo's nixl_connect).

    python3 examples/torch_read.py expose --sidecar unix:/tmp/a/sidecar.sock &
    python3 examples/torch_read.py read   --sidecar unix:/tmp/b/sidecar.sock

The metadata travels over NATS through the sidecars (--subject; they need --nats-url and a shared
--key-file), or through a file with --metadata-file PATH (no NATS needed). Both sides build the same
tensor from --seed, so the reader checks every byte it received. --device cuda:N keeps the tensor in
GPU memory (registered with the sidecar by its CUDA IPC handle); it needs torch with CUDA.
"""
import argparse
import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))  # a source checkout; pip install also works

import torch  # noqa: E402

import rdma_sidecar as rs  # noqa: E402


def expected(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16)


async def expose(a):
    async with rs.Connector(a.sidecar) as c:
        print("expose: sidecar %s at %s" % ((await c.info()).sidecar_id, c.address), flush=True)
        t = await c.empty(a.shape, torch.bfloat16, device=a.device)
        t.copy_(expected(a.shape, a.seed))
        async with await c.create_readable(rs.Descriptor(t), timeout=a.timeout) as op:
            print("expose: %s of %s on %s, %d bytes, readable %s" % (tuple(t.shape), t.dtype, t.device,
                                                                     op.bytes_total, op.id), flush=True)
            if a.metadata_file:
                tmp = a.metadata_file + ".tmp"
                with open(tmp, "w") as f:
                    f.write(op.metadata)
                os.replace(tmp, a.metadata_file)
            # Plain NATS reaches only present subscribers: publish again until a reader starts.
            while op.status == rs.OperationStatus.INITIALIZED and not a.metadata_file:
                await c.publish(a.subject, op)
                try:
                    await op.wait_for_completion(timeout=1.0)
                except rs.DeadlineExceededError:
                    continue
            await op.wait_for_completion(a.timeout)
            print("expose: read by %s (%s)" % (op.proto.peer or "?", op.backend.name.lower()), flush=True)


async def read(a):
    async with rs.Connector(a.sidecar) as c:
        print("read: sidecar %s at %s" % ((await c.info()).sidecar_id, c.address), flush=True)
        if a.metadata_file:
            deadline = time.monotonic() + a.timeout
            while not os.path.exists(a.metadata_file):
                if time.monotonic() > deadline:
                    sys.exit("read: no metadata in %s within %ss" % (a.metadata_file, a.timeout))
                await asyncio.sleep(0.05)
            metadata, nbytes = open(a.metadata_file).read(), None
        else:
            async with c.subscribe(a.subject) as sub:
                event = await sub.next(a.timeout)
            metadata, nbytes = event, event.descriptor_lengths[0]
            print("read: readable from %s, %d bytes" % (event.issuer, nbytes), flush=True)
        t = await c.zeros(a.shape, torch.bfloat16, device=a.device)
        if nbytes is not None and nbytes != t.numel() * t.element_size():
            sys.exit("read: the readable has %d bytes, --shape %s needs %d" % (nbytes, a.shape, t.numel() * 2))
        t0 = time.perf_counter()
        async with await c.begin_read(metadata, rs.Descriptor(t), timeout=a.timeout) as op:
            await op.wait_for_completion(a.timeout)
            secs = time.perf_counter() - t0
            print("read: %d bytes over %s in %.3fs" % (op.bytes_done, op.backend.name.lower(), secs), flush=True)
        ok = torch.equal(t.cpu().view(torch.int16), expected(a.shape, a.seed).view(torch.int16))
        print("read: tensor %s" % ("matches, byte for byte" if ok else "DIFFERS"), flush=True)
        return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=["expose", "read"])
    p.add_argument("--sidecar", default=None, help="this worker's sidecar (default: $RDMA_SIDECAR_ADDR, "
                                                   "else unix:/tmp/rdma-sidecar/sidecar.sock)")
    p.add_argument("--subject", default="example.tensor", help="NATS subject (default: %(default)s)")
    p.add_argument("--metadata-file", metavar="PATH", help="exchange the metadata through this file instead of NATS")
    p.add_argument("--shape", default="1024,4096", help="tensor shape (default: %(default)s, bfloat16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for each step (default: %(default)s)")
    a = p.parse_args()
    a.shape = tuple(int(x) for x in a.shape.split(","))
    try:
        return asyncio.run(expose(a) if a.role == "expose" else read(a)) or 0
    except rs.SidecarError as e:
        sys.exit("%s: %s: %s" % (a.role, e.code.name, e.message))


if __name__ == "__main__":
    sys.exit(main())
