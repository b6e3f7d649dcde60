# SPDX-License-Identifier: Apache-2.0
"""The source actor's process for test_ray_transport.py: what Ray's runtime does in an actor that
returns tensors with tensor_transport="RDMA_SIDECAR", driven over stdin/stdout (one JSON line per
command and per answer). Not a test itself.

  {"cmd": "extract", "obj": ID, "tensors": [[shape, dtype, in_region], ...], "seed": N}
      -> {"meta": base64(pickle(metadata)), "sha": [sha256 of each tensor's bytes]}
  {"cmd": "gc", "obj": ID}     -> {"regions": n, "operations": n} left on the sidecar afterwards
  {"cmd": "abort", "obj": ID}  -> {"seconds": s}
  {"cmd": "exit"}
Environment: RAY_SOURCE_SIDECAR (the sidecar's address), PYTHONPATH with the stand-in Ray first."""
import base64
import hashlib
import json
import os
import pickle
import sys
import time

import torch

import rdma_sidecar.ray as rsr
from ray import experimental

rsr.register(address=os.environ["RAY_SOURCE_SIDECAR"])
_, cls, _ = experimental.REGISTERED[rsr.NAME]
transport = cls()  # as Ray makes it, without arguments
keep = {}


def make(spec, seed):
    """Random tensors (every byte random, whatever the dtype); in_region: allocated in a sidecar
    region (used in place), else plain torch memory (the transport copies it into one)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype, in_region in spec:
        dt = getattr(torch, dtype)
        n = 1
        for d in shape:
            n *= d
        raw = torch.randint(0, 256, (n * torch.empty((), dtype=dt).element_size(),), dtype=torch.uint8, generator=g)
        t = raw.view(dt).reshape(shape)
        if in_region:
            r = transport.connector().empty(tuple(shape), dt)
            r.copy_(t)
            t = r
        out.append(t)
    return out


def sha(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


for line in sys.stdin:
    req = json.loads(line)
    if req["cmd"] == "exit":
        break
    if req["cmd"] == "extract":
        tensors = make(req["tensors"], req["seed"])
        keep[req["obj"]] = tensors
        meta = transport.extract_tensor_transport_metadata(req["obj"], tensors)
        ans = {"meta": base64.b64encode(pickle.dumps(meta)).decode(), "sha": [sha(t) for t in tensors]}
    elif req["cmd"] == "extract_cuda":
        # A STAND-IN CUDA tensor (tests/integration/standin_torch.py) in a larger stand-in block,
        # as PyTorch's caching allocator sub-allocates; its bytes written through the driver.
        import cudadrv as cu
        from standin_torch import StandInCudaTensor
        cu.init(0)
        n, off = req["nbytes"], 4096 + 512
        block = cu.alloc(n + 2 * 4096)
        data = os.urandom(n)
        cu.htod(block + off, data)
        t = StandInCudaTensor(block, off, n)
        keep[req["obj"]] = [t]
        meta = transport.extract_tensor_transport_metadata(req["obj"], [t])
        ans = {"meta": base64.b64encode(pickle.dumps(meta)).decode(), "sha": [hashlib.sha256(data).hexdigest()]}
    elif req["cmd"] == "gc":
        transport.garbage_collect(req["obj"], None, keep.pop(req["obj"], []))
        c = transport.connector()
        ans = {"regions": len(c.list_regions()), "operations": len(c.list_operations())}
    elif req["cmd"] == "abort":
        t0 = time.monotonic()
        transport.abort_transport(req["obj"], None)
        ans = {"seconds": time.monotonic() - t0}
    print(json.dumps(ans), flush=True)
transport.close()
