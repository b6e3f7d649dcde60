# SPDX-License-Identifier: Apache-2.0
"""Compact descriptor lists for KV-cache transfers (BlockList and StridedRun in sidecar.proto).

A serving engine keeps one tensor per layer (K and V), each cut into blocks along its first
dimension, and a request's cache is a list of block ids shared by every layer. Instead of one
Descriptor per (layer, block), say it once:

    kv = rs.KVBlocks(layer_tensors, block_ids)          # vLLM's layout: same ids in every layer
    op = await c.create_readable(kv)                     # 64 layers x 256 blocks: one small request
    ...
    await c.begin_read(meta, rs.KVBlocks(my_layers, my_ids))

The list expands, in order, to every block of the first tensor, then every block of the second...
(each block `block_bytes` long at `block_id * block_stride` from the tensor's start). The other side
may describe its memory any way (plain descriptors, another KVBlocks, StridedRun): only the expanded
count and lengths must match. Forms can be mixed in one list with plain Descriptors; order is kept.

    rs.StridedRun(obj_or_region, offset, stride, count, length)   # count ranges, stride apart
    rs.KVBlocks.of_tensor(t, block_ids)                          # one tensor + block ids

Tensors: host arrays/tensors in this connector's regions (Connector.empty/zeros), or CUDA tensors
(registered with the sidecar on first use, as Descriptor does). A tensor's first dimension indexes
blocks; each block t[i] must be contiguous (a view such as kv_cache[0] of vLLM's (2, num_blocks,
...) layer tensor is fine)."""
from typing import Any, List, Optional, Sequence

from ._pb import pb
from .memory import Descriptor, Region, is_numpy_array, is_torch_tensor


def _block_geometry(t: Any) -> tuple:
    """(bytes per block, bytes between blocks, number of blocks) of a tensor/array."""
    if is_torch_tensor(t):
        if t.dim() < 1 or t.shape[0] == 0:
            raise ValueError("a KV tensor needs a first (block) dimension with at least one block")
        if not t[0].is_contiguous():
            raise ValueError("each block t[i] of a KV tensor must be contiguous")
        return t[0].numel() * t.element_size(), t.stride(0) * t.element_size(), t.shape[0]
    if is_numpy_array(t):
        if t.ndim < 1 or t.shape[0] == 0:
            raise ValueError("a KV array needs a first (block) dimension with at least one block")
        if not (t[0].flags.c_contiguous):
            raise ValueError("each block a[i] of a KV array must be contiguous")
        return t[0].nbytes, t.strides[0], t.shape[0]
    raise TypeError("KVBlocks takes NumPy arrays or PyTorch tensors, not %s" % type(t).__name__)


def _data_ptr(t: Any) -> int:
    return t.data_ptr() if is_torch_tensor(t) else t.__array_interface__["data"][0]


def _host_region(conn: Any, t: Any) -> Region:
    """The connector's region holding the start of host array/tensor t (strided views allowed: the
    sidecar checks every expanded range against the region's bounds)."""
    addr = _data_ptr(t)
    for r in conn._regions.values():
        if r.contains(addr, 1):
            return r
    return conn.region_of(t)  # raises NotInRegionError with the usual advice


class KVBlocks:
    """The same blocks (block_ids) of every tensor in `tensors`, in order: one BlockList per run of
    tensors that start at the same offset in their regions (a tensor per region: one BlockList)."""

    def __init__(self, tensors: Sequence[Any], block_ids: Sequence[int], block_bytes: Optional[int] = None,
                 block_stride: Optional[int] = None):
        self.tensors = list(tensors)
        self.block_ids = [int(b) for b in block_ids]
        if not self.tensors:
            raise ValueError("KVBlocks needs at least one tensor")
        if not self.block_ids:
            raise ValueError("KVBlocks needs at least one block id")
        geo = [_block_geometry(t) for t in self.tensors]
        if len({g[:2] for g in geo}) != 1:
            raise ValueError("every tensor of a KVBlocks must have the same block size and stride")
        self.block_bytes = int(block_bytes or geo[0][0])
        self.block_stride = int(block_stride or geo[0][1])
        n = min(g[2] for g in geo)
        bad = [b for b in self.block_ids if b < 0 or b >= n]
        if bad:
            raise ValueError("block id %d is outside the tensors' %d blocks" % (bad[0], n))

    @classmethod
    def of_tensor(cls, tensor: Any, block_ids: Sequence[int], **kw: Any) -> "KVBlocks":
        return cls([tensor], block_ids, **kw)

    def __len__(self) -> int:
        return len(self.tensors) * len(self.block_ids)

    @property
    def nbytes(self) -> int:
        return len(self) * self.block_bytes

    async def _sets(self, conn: Any) -> List[Any]:
        bases = []  # (region_id, offset of the tensor in it)
        settled = set()
        for t in self.tensors:
            if is_torch_tensor(t) and t.is_cuda:
                device = t.device.index or 0
                if device not in settled:
                    # As for plain descriptors: the worker's GPU work on this memory is finished
                    # before the sidecar touches it.
                    from . import _cuda
                    _cuda.synchronize(device)
                    settled.add(device)
                # The registration covers the tensor's blocks as laid out (rows may be padded or
                # strided: a layer tensor need not be contiguous as a whole), by the IPC handle of
                # its allocation.
                _, stride, n = _block_geometry(t)
                span = (n - 1) * stride + self.block_bytes
                r = await conn._register_cuda(Descriptor((t.data_ptr(), span, device)))
                bases.append((r.region_id, 0))
            else:
                r = _host_region(conn, t)
                bases.append((r.region_id, _data_ptr(t) - r.base))
        out, i = [], 0
        while i < len(bases):
            j = i
            while j + 1 < len(bases) and bases[j + 1][1] == bases[i][1]:
                j += 1
            out.append(pb.DescriptorSet(block_list=pb.BlockList(
                region_ids=[b[0] for b in bases[i:j + 1]], block_length=self.block_bytes, block_ids=self.block_ids,
                block_stride=self.block_stride, base_offset=bases[i][1])))
            i = j + 1
        return out


class StridedRun:
    """count ranges of `length` bytes, `stride` apart, from `offset` in a region (a Region, a region
    id, or an array/tensor in a region: offset is then from its start)."""

    def __init__(self, where: Any, offset: int, stride: int, count: int, length: int):
        self.where, self.offset, self.stride, self.count, self.length = where, int(offset), int(stride), \
            int(count), int(length)
        if self.count <= 0 or self.length <= 0:
            raise ValueError("StridedRun: count and length must be > 0")
        if self.offset < 0 or self.stride < 0:
            raise ValueError("StridedRun: offset and stride must be >= 0")

    def __len__(self) -> int:
        return self.count

    async def _sets(self, conn: Any) -> List[Any]:
        if isinstance(self.where, (Region, str)):
            rid = self.where.region_id if isinstance(self.where, Region) else self.where
            base = 0
        else:
            r = _host_region(conn, self.where)
            rid, base = r.region_id, _data_ptr(self.where) - r.base
        return [pb.DescriptorSet(strided_run=pb.StridedRun(region_id=rid, offset=base + self.offset,
                                                           stride=self.stride, count=self.count,
                                                           length=self.length))]


def is_compact(d: Any) -> bool:
    return isinstance(d, (KVBlocks, StridedRun))


def metadata_descriptor_lengths(text: str) -> List[int]:
    """The descriptor lengths a peer's "rsm1." metadata lists (unverified: for sizing the local
    side; the sidecar verifies). Reads metadata version 1 (descriptors) and 2 (runs)."""
    import base64
    if not text.startswith("rsm1."):
        raise ValueError("metadata must start with 'rsm1.'")
    body = text[5:]
    signed = pb.SignedMetadata.FromString(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    md = pb.RdmaMetadata.FromString(signed.payload)
    out = [d.length for d in md.descriptors]
    for run in md.runs:
        out.extend([run.length] * run.count)
    return out
