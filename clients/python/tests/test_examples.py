# SPDX-License-Identifier: Apache-2.0
"""examples/torch_read.py: two worker processes, one tensor, over NATS and through a file."""
import os
import subprocess
import sys

import pytest

from conftest import SLOW, SOURCE, addr

EXAMPLE = os.path.join(SOURCE, "examples", "torch_read.py")
pytest.importorskip("torch", reason="python3-torch is not installed")


def run_pair(a_addr, b_addr, *extra):
    common = ["--shape", "257,1031", "--timeout", str(30 * SLOW), *extra]
    expose = subprocess.Popen([sys.executable, EXAMPLE, "expose", "--sidecar", a_addr, *common],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        reader = subprocess.run([sys.executable, EXAMPLE, "read", "--sidecar", b_addr, *common],
                                capture_output=True, text=True, timeout=90 * SLOW)
        out, _ = expose.communicate(timeout=60 * SLOW)
    finally:
        if expose.poll() is None:
            expose.kill()
            expose.wait()
    assert reader.returncode == 0, reader.stdout + reader.stderr
    assert expose.returncode == 0, out
    assert "matches, byte for byte" in reader.stdout and "read by" in out
    return reader.stdout, out


def test_torch_read_over_nats(cluster):
    reader, _ = run_pair(addr(cluster.a), addr(cluster.b), "--subject", "example.pytest")
    assert "%d bytes over tcp" % (257 * 1031 * 2) in reader


def test_torch_read_through_a_file(cluster, tmp_path):
    reader, _ = run_pair(addr(cluster.a), addr(cluster.a), "--metadata-file", str(tmp_path / "md"))
    assert "over local" in reader
