# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for PyTorch CUDA tensors on the stand-in CUDA driver (tests/fake_cuda): Debian's torch
has no CUDA. Used by test_gpu_torch.py (and its worker child processes); never a real GPU."""
import torch

import cudadrv as cu


class _StandInStorage:
    def __init__(self, t):
        self.t = t

    def _share_cuda_(self):
        # As PyTorch >= 2.5: pins the storage until a PyTorch receiver lets go (here: never),
        # and hands out (device, 66-byte handle, storage bytes, offset in block, ...).
        StandInCudaTensor.pinned += 1
        return (self.t.index, bytes([2]) + b"c" + cu.ipc_handle(self.t.block), self.t.nbytes,
                self.t.offset, None, None, None, None)


class StandInCudaTensor(torch.Tensor):
    """STAND-IN for a contiguous uint8 PyTorch CUDA tensor (Debian's torch has no CUDA): a real
    torch.Tensor subclass on device cuda:N with no storage of its own, whose bytes are `nbytes`
    at `offset` of the stand-in cuMemAlloc block `block`. Any torch operation on it raises."""
    pinned = 0

    @staticmethod
    def __new__(cls, block, offset, nbytes, index=0, blocks=None):
        """blocks=(n, stride): an (n, nbytes) tensor whose row i (a KV block, contiguous) starts
        i * stride bytes after offset, as a vLLM layer tensor's blocks; t[i] is row i."""
        if blocks:
            n, stride = blocks
            t = torch.Tensor._make_wrapper_subclass(cls, (n, nbytes), strides=(stride, 1), dtype=torch.uint8,
                                                    device="cuda:%d" % index)
        else:
            t = torch.Tensor._make_wrapper_subclass(cls, (nbytes,), dtype=torch.uint8, device="cuda:%d" % index)
        t.block, t.offset, t.nbytes, t.index, t.rows = block, offset, nbytes, index, blocks
        return t

    def __getitem__(self, i):
        # t[i] of a block tensor: row i, a 1-D stand-in tensor (the only indexing there is)
        if not self.rows or not isinstance(i, int):
            raise RuntimeError("stand-in CUDA tensor: only t[i] of a block tensor is available")
        n, stride = self.rows
        if not -n <= i < n:
            raise IndexError("index %d is out of range for %d blocks" % (i, n))
        return StandInCudaTensor(self.block, self.offset + (i % n) * stride, self.nbytes, self.index)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("stand-in CUDA tensor: %s is not available" % func)

    def data_ptr(self):
        return self.block + self.offset

    def untyped_storage(self):
        return _StandInStorage(self)

    storage = untyped_storage

