# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors through the rdma_sidecar package on the REAL driver and PyTorch (ctest label "gpu").

Runs tests/integration/test_gpu_torch.py with SC_GPU_REAL=1: real PyTorch CUDA tensors inside
caching-allocator blocks are read and written through two sidecars, and 10,000 operations (with
fresh tensors allocated and freed among them) must leave torch.cuda.memory_allocated() where it
started: nothing pinned by _share_cuda_(). Exits 77 (skipped) with the reason without PyTorch or a
CUDA device.
"""
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
os.environ["SC_GPU_REAL"] = "1"
runpy.run_path(os.path.join(here, "..", "integration", "test_gpu_torch.py"), run_name="__main__")
