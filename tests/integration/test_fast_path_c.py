# SPDX-License-Identifier: Apache-2.0
"""The C client's fast path (rsc_fast_*, client/fast.c): runs sc-fast-path-test
(tests/client/fast_path_test.c) against two real sidecars, once over the shared-memory rings (the
sidecar's default fast-path socket, its gRPC socket's path + ".fast") and once against a sidecar
started with --fast-path-socket off, where the same calls fall back to rsc_read/rsc_write. The C
program compares every byte each READ and WRITE moved, reaps 16 runs submitted at once, and checks
the refusals (unknown or unprepared handle, cancel of nothing, a too long region id)."""
import os
import subprocess

from harness import SLOW, SidecarTest, main

BUILD = os.path.dirname(os.path.abspath(os.environ.get("SC_BINARY", "build/rdma-sidecar")))
EXE = os.path.join(BUILD, "client", "sc-fast-path-test")


class FastPathCTest(SidecarTest):
    def run_program(self, a, b, mode):
        r = subprocess.run([EXE, "unix:" + a.sock, "unix:" + b.sock, "--expect-mode", mode], capture_output=True,
                           text=True, timeout=120 * SLOW)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("mode " + mode, r.stdout)
        self.assertIn("all checks passed", r.stdout)

    def test_ring(self):
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)
        b = self.sidecar("b", key_file=keys)
        self.run_program(a, b, "ring")

    def test_grpc_fallback(self):
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, extra=["--fast-path-socket", "off"])
        b = self.sidecar("b", key_file=keys)
        self.run_program(a, b, "grpc")


if __name__ == "__main__":
    main()
