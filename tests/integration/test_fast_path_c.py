# SPDX-License-Identifier: Apache-2.0
"""The C client's fast path (rsc_fast_*, client/fast.c): runs sc-fast-path-test
(tests/client/fast_path_test.c) against two real sidecars, once over the shared-memory rings (the
sidecar's default fast-path socket, its gRPC socket's path + ".fast") and once against a sidecar
started with --fast-path-socket off, where the same calls fall back to rsc_read/rsc_write. The C
program compares every byte each READ and WRITE moved, reaps 16 runs submitted at once, and checks
the refusals (unknown or unprepared handle, cancel of nothing, a too long region id); and, with
the sidecar stopped under an open session, that the next calls say so at once."""
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

    def test_session_end(self):
        """The sidecar stops under an open session: the next run, reap and submit say
        UNAVAILABLE ("the sidecar closed the fast path session") instead of waiting."""
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)
        b = self.sidecar("b", key_file=keys)
        p = subprocess.Popen([EXE, "unix:" + a.sock, "unix:" + b.sock, "--session-end"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(p.stdout.readline().strip(), "mode ring")
            self.assertEqual(p.stdout.readline().strip(), "ready")
            a.stop()
            out, err = p.communicate("go\n", timeout=60 * SLOW)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn("all checks passed", out)


if __name__ == "__main__":
    main()
