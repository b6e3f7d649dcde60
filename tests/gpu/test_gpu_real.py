# SPDX-License-Identifier: Apache-2.0
"""The GPU region suite on the REAL CUDA driver (ctest label "gpu").

Runs tests/integration/test_gpu_regions.py with SC_GPU_REAL=1: the sidecars load libcuda.so.1,
and this process, the worker, allocates with the real driver (cuMemAlloc, cuMemCreate) and passes
CUDA IPC handles and pidfd-shared fds to them. Two sidecars move GPU to GPU, GPU to host and host
to GPU over TCP (staged through pinned buffers) and LOCAL (driver copies), with every byte
compared. Tests that need the stand-in's fault injection are skipped here. Exits 77 (skipped) with
the reason when cuInit finds no GPU.
"""
import os
import runpy
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
os.environ["SC_GPU_REAL"] = "1"
runpy.run_path(os.path.join(here, "..", "integration", "test_gpu_regions.py"), run_name="__main__")
