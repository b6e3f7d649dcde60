# SPDX-License-Identifier: Apache-2.0
"""Clients started before their sidecar (a worker container that starts first): rdma-sidecar-ctl
--wait (librdma-sidecar-client's rsc_client_wait_ready) and the Python Connector's wait_for_ready
(blocking and asyncio) wait for it, bounded. Ordered by construction: each client is started first,
the sidecar only once the client has said it is waiting; the sidecar then serves them. When the
bound passes: exit 3 / UnavailableError, the message naming the address and how long it waited.
Bad values of --wait and RDMA_SIDECAR_WAIT_FOR_READY are refused."""
import asyncio
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
from harness import SLOW, SidecarTest, main  # noqa: E402

import rdma_sidecar as rs  # noqa: E402  (harness put build/python on sys.path)
import rdma_sidecar.sync  # noqa: E402,F401

BUILD = os.path.dirname(os.path.abspath(os.environ.get("SC_BINARY", "build/rdma-sidecar")))
CTL = os.path.join(BUILD, "client", "rdma-sidecar-ctl")
PY_PATH = os.pathsep.join([os.path.join(HERE, "..", "..", "clients", "python"),
                           os.path.abspath(os.environ.get("SC_PYTHON_STUBS", os.path.join(BUILD, "python")))])

# A worker: waits for its sidecar (wait_for_ready from the environment), then prints its id.
WORKER = r"""
import asyncio, sys
import rdma_sidecar as rs, rdma_sidecar.sync
if sys.argv[1] == "sync":
    with rs.sync.Connector(sys.argv[2]) as c:
        print("id", c.info().sidecar_id, flush=True)
else:
    async def go():
        async with rs.Connector(sys.argv[2]) as c:
            print("id", (await c.info()).sidecar_id, flush=True)
    asyncio.run(go())
"""


class Client:
    """A client process whose stderr lines are collected by a thread (to see it say it waits)."""

    def __init__(self, args, env=None):
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def line_with(self, needle, timeout):
        end = time.monotonic() + timeout * SLOW
        while time.monotonic() < end:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError("no line with %r from the client within %.0f s (exit %s): %r"
                             % (needle, timeout, self.proc.poll(), self.lines))

    def finish(self, timeout):
        self.proc.wait(timeout * SLOW)
        out = self.proc.stdout.read()
        self.reader.join(10)
        return self.proc.returncode, out, "\n".join(self.lines)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        self.proc.stdout.close()
        self.proc.stderr.close()


class ClientWaitTest(SidecarTest):
    def sock(self, name):
        return os.path.join(self.workdir, name, "s.sock")

    def test_clients_wait_for_a_sidecar_started_after_them(self):
        """ctl --wait, a blocking and an asyncio Connector (RDMA_SIDECAR_WAIT_FOR_READY) all started
        first; the sidecar once all three said they wait; each then gets its answer."""
        addr = "unix:" + self.sock("late")
        env = dict(os.environ, PYTHONPATH=PY_PATH, RDMA_SIDECAR_WAIT_FOR_READY="60")
        ctl = Client([CTL, "--sidecar", addr, "--wait", "60", "--json", "info"])
        workers = [Client([sys.executable, "-c", WORKER, kind, addr], env=env) for kind in ("sync", "aio")]
        try:
            line = ctl.line_with("waiting", 20)
            self.assertEqual(line, "rdma-sidecar-ctl: waiting up to 60.0 s for the sidecar at %s" % addr)
            for w in workers:
                line = w.line_with("waiting", 30)
                self.assertIn("waiting up to 60.0 s for the sidecar at %s" % addr, line)
            for c in [ctl] + workers:
                self.assertIsNone(c.proc.poll(), "a client gave up before the sidecar started")
            self.sidecar("late")
            rc, out, err = ctl.finish(30)
            self.assertEqual(rc, 0, err)
            self.assertIn('"sidecar_id":"late"', out)
            for w in workers:
                rc, out, err = w.finish(30)
                self.assertEqual(rc, 0, err)
                self.assertEqual(out.strip(), "id late")
        finally:
            for c in [ctl] + workers:
                c.kill()

    def test_the_wait_is_bounded(self):
        """No sidecar: each client gives up after its bound with UNAVAILABLE naming the address and
        the time waited; bad values are refused."""
        addr = "unix:" + self.sock("never")
        t0 = time.monotonic()
        r = subprocess.run([CTL, "--sidecar", addr, "--wait", "0.7", "info"], capture_output=True,
                           text=True, timeout=30 * SLOW)
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertRegex(r.stderr, r"the sidecar at %s was not ready after waiting 0\.[6-9] s" % addr)
        self.assertIn("RDMA_SIDECAR_WAIT_FOR_READY", r.stderr)
        self.assertGreaterEqual(took, 0.6)
        r = subprocess.run([CTL, "--sidecar", addr, "info"], capture_output=True, text=True,
                           env=dict(os.environ, RDMA_SIDECAR_WAIT_FOR_READY="0.5"), timeout=30 * SLOW)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("was not ready after waiting 0.", r.stderr)
        r = subprocess.run([CTL, "--sidecar", addr, "--wait", "soon", "info"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad value soon for --wait", r.stderr)
        r = subprocess.run([CTL, "--sidecar", addr, "info"], capture_output=True, text=True,
                           env=dict(os.environ, RDMA_SIDECAR_WAIT_FOR_READY="-1"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad value -1 for RDMA_SIDECAR_WAIT_FOR_READY", r.stderr)

        t0 = time.monotonic()
        with self.assertRaises(rs.UnavailableError) as cm:
            with rs.sync.Connector(addr, wait_for_ready=0.6) as c:
                c.info()
        self.assertGreaterEqual(time.monotonic() - t0, 0.55)
        self.assertRegex(cm.exception.message, r"the sidecar at %s was not ready after waiting 0\.[5-9] s" % addr)
        self.assertIn("wait_for_ready", cm.exception.message)

        async def aio():
            async with rs.Connector(addr, wait_for_ready=0.6) as c:
                await c.info()
        with self.assertRaises(rs.UnavailableError) as cm:
            asyncio.run(aio())
        self.assertRegex(cm.exception.message, r"the sidecar at %s was not ready after waiting 0\.[5-9] s" % addr)
        # Without waiting, a missing sidecar fails the call at once (no wait message).
        with self.assertRaises(rs.UnavailableError) as cm:
            with rs.sync.Connector(addr, rpc_timeout=5) as c:
                c.info()
        self.assertNotIn("was not ready after waiting", cm.exception.message)
        for bad in ("-1", "soon"):
            os.environ["RDMA_SIDECAR_WAIT_FOR_READY"] = bad
            try:
                with self.assertRaises(ValueError) as cm:
                    rs.sync.Connector(addr)
                self.assertIn("RDMA_SIDECAR_WAIT_FOR_READY", str(cm.exception))
            finally:
                del os.environ["RDMA_SIDECAR_WAIT_FOR_READY"]


if __name__ == "__main__":
    main()
