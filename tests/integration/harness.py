# SPDX-License-Identifier: Apache-2.0
"""Integration test harness: real rdma-sidecar processes, a real nats-server, real gRPC clients.

Every test module imports this, subclasses SidecarTest and calls main(). Paths come from the
environment that ctest sets (SC_BINARY, SC_PYTHON_STUBS, SC_TEST_TMP); run by hand with
`ctest --test-dir build -R integration` or set them yourself. Every wait has a deadline.
"""
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

STUBS = os.environ.get("SC_PYTHON_STUBS", os.path.join(os.path.dirname(__file__), "../../build/python"))
sys.path.insert(0, os.path.abspath(STUBS))
# examples/ holds cudadrv.py, the ctypes wrapper over the CUDA driver that GPU workers use.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import grpc  # noqa: E402
from rdma_sidecar.v1 import sidecar_pb2 as pb  # noqa: E402
from rdma_sidecar.v1 import sidecar_pb2_grpc as rpc  # noqa: E402
from sc_health import health_pb2, health_pb2_grpc  # noqa: E402

BINARY = os.environ.get("SC_BINARY", os.path.join(os.path.dirname(__file__), "../../build/rdma-sidecar"))
NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
TMP_ROOT = os.environ.get("SC_TEST_TMP", "/tmp")

# Valgrind/ASan builds are slower: tests scale their deadlines by this factor.
SLOW = float(os.environ.get("SC_TEST_SLOW", "1"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what):
    end = time.monotonic() + timeout * SLOW
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out after %.1fs waiting for %s" % (timeout * SLOW, what))


def write_key_file(path, keys=None):
    """keys: list of (id, raw bytes); default one random 32-byte key. Mode 0600."""
    keys = keys or [("k1", os.urandom(32))]
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        for kid, raw in keys:
            f.write("%s:%s\n" % (kid, base64.b64encode(raw).decode()))
    return path


class Sidecar:
    """One rdma-sidecar process on a private unix socket, a free TCP port and a private shm dir."""

    def __init__(self, workdir, name, key_file=None, nats_url=None, extra=(), env=None, tcp=True,
                 data_listen="127.0.0.1:0", prefix=()):
        # prefix: a command the sidecar runs under, e.g. ("ip", "netns", "exec", "ns1").
        self.name = name
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        # Region files live on tmpfs, as in production (/dev/shm shared with the worker).
        shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else self.dir
        self.shm = tempfile.mkdtemp(prefix="sc-%s-" % name, dir=shm_root)
        self.sock = os.path.join(self.dir, "s.sock")
        self.port = None  # the TCP gRPC port, read back from GetInfo (we ask for port 0)
        self.log_path = os.path.join(self.dir, "sidecar.log")
        args = [BINARY, "--id", name, "--grpc-listen", "unix:" + self.sock,
                "--shm-dir", self.shm, "--data-listen", data_listen, "--log-level", "debug"]
        if tcp:
            args += ["--grpc-listen", "127.0.0.1:0"]
        if SLOW > 1:  # sanitizers, valgrind: backends stop slower, so CancelOperation may wait longer
            args += ["--cancel-wait", "%dms" % min(30000, 1000 * SLOW)]
        if key_file:
            args += ["--key-file", key_file]
        if nats_url:
            args += ["--nats-url", nats_url]
        args += list(extra)
        wrapper = os.environ.get("SC_WRAPPER")  # e.g. "valgrind --error-exitcode=99 ..."
        if wrapper:
            args = wrapper.split() + args
        args = list(prefix) + args
        self.args = args
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        # Create the channel only once the socket exists: a channel that failed to connect backs
        # off for seconds before it tries again.
        def listening():
            if self.proc.poll() is not None:
                raise AssertionError("sidecar %s exited with %s during start-up:\n%s"
                                     % (self.name, self.proc.returncode, self.read_log()))
            return os.path.exists(self.sock)
        wait_until(listening, 15, "sidecar %s to listen" % self.name)
        self.channel = grpc.insecure_channel("unix:" + self.sock)
        self.stub = rpc.SidecarStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._wait_ready()

    def _wait_ready(self):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("sidecar %s exited with %s during start-up:\n%s"
                                     % (self.name, self.proc.returncode, self.read_log()))
            try:
                r = self.health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return r.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False
        wait_until(ready, 15, "sidecar %s to serve" % self.name)
        for addr in self.info().grpc_listeners:
            if addr.startswith("127.0.0.1:"):
                self.port = int(addr.rsplit(":", 1)[1])

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def info(self):
        return self.stub.GetInfo(pb.GetInfoRequest(), timeout=5 * SLOW)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Stop and return the exit code (raises if it does not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("sidecar %s did not exit within %ss of %s"
                                     % (self.name, timeout * SLOW, sig))
        self.channel.close()
        self.log.close()
        return self.proc.returncode

    def stopped(self):
        """True once every thread of the sidecar is stopped (SIGSTOP reaches threads asynchronously:
        kill() returns while a thread already on a CPU may still serve a request)."""
        states = []
        for tid in os.listdir("/proc/%d/task" % self.proc.pid):
            with open("/proc/%d/task/%s/stat" % (self.proc.pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        return all(st in ("T", "t") for st in states)

    def pause(self):
        """SIGSTOP, and return once every thread has stopped: from then on it answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)
        wait_until(self.stopped, 10, "sidecar %s to stop" % self.name)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.channel.close()
        self.log.close()

    # ---- convenience wrappers a worker would write ----

    def create_region(self, size, name=""):
        return self.stub.CreateRegion(pb.CreateRegionRequest(size=size, name=name), timeout=30 * SLOW)

    def fill(self, region, offset, data, chunk=4 << 20):
        """Write bytes through the region's shared file, as a worker would (mmap or write)."""
        with open(region.path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def peek(self, region, offset, length):
        with open(region.path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def wait(self, op_id, timeout_ms=30000):
        return self.stub.WaitOperation(pb.WaitOperationRequest(operation_id=op_id, timeout_ms=timeout_ms),
                                       timeout=timeout_ms / 1000.0 * SLOW + 10)


class NatsServer:
    def __init__(self, workdir, port=None, jetstream=True, extra=()):
        # JetStream on (the sidecar's default --nats-handoff jetstream needs it), its store in the
        # work dir. A free port may be taken by someone else before nats-server binds it: retry.
        for attempt in range(5):
            self.port = port or free_port()
            self.url = "nats://127.0.0.1:%d" % self.port
            self.log = open(os.path.join(workdir, "nats-%d.log" % self.port), "wb")
            args = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)]
            if jetstream:
                args += ["-js", "-sd", os.path.join(workdir, "js-%d" % self.port)]
            self.proc = subprocess.Popen(args + list(extra), stdout=self.log, stderr=subprocess.STDOUT)

            def up():
                if self.proc.poll() is not None:
                    return "exited"
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                        return "up"
                except OSError:
                    return False
            if wait_until(up, 10, "nats-server") == "up":
                return
            self.log.close()
            if port:
                break
        raise AssertionError("nats-server did not start (port %s)" % self.port)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def desc(region, offset, length):
    return pb.Descriptor(region_id=region.region_id, offset=offset, length=length)


class SidecarTest(unittest.TestCase):
    """Creates a work dir per test and stops every sidecar/nats it started, even on failure."""

    def setUp(self):
        os.makedirs(TMP_ROOT, exist_ok=True)
        # unix socket paths must stay short: keep the work dir under /tmp
        self.workdir = tempfile.mkdtemp(prefix="sc-", dir="/tmp")
        self._procs = []
        self._shms = []

    def tearDown(self):
        result = getattr(getattr(self, "_outcome", None), "result", None)
        failed = bool(result) and any(t is self for t, _ in list(result.errors) + list(result.failures))
        for p in reversed(self._procs):
            try:
                if isinstance(p, Sidecar):
                    code = p.stop()
                    if code != 0 and not getattr(p, "expect_nonzero", False):
                        print("sidecar %s exited %s; log:\n%s" % (p.name, code, p.read_log()[-4000:]))
                        failed = True
                        self.fail("sidecar %s exited with %s" % (p.name, code))
                else:
                    p.stop()
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001
                print("teardown: %s" % e)
        # Every shm dir a sidecar of this test had, also of those a test stopped or killed and
        # dropped from _procs itself (region files of a SIGKILLed sidecar stay behind otherwise).
        for shm in set(self._shms) | {p.shm for p in self._procs if isinstance(p, Sidecar)}:
            shutil.rmtree(shm, ignore_errors=True)
        if not failed and os.environ.get("SC_KEEP_TMP") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print("kept work dir %s" % self.workdir)

    def sidecar(self, name, **kw):
        s = Sidecar(self.workdir, name, **kw)
        self._procs.append(s)
        self._shms.append(s.shm)
        return s

    def nats(self, port=None, jetstream=True, extra=()):
        n = NatsServer(self.workdir, port, jetstream=jetstream, extra=extra)
        self._procs.append(n)
        return n

    def key_file(self, name="keys", keys=None):
        return write_key_file(os.path.join(self.workdir, name), keys)

    def assertRpcError(self, code, fn, *args, contains=None, **kw):
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        if contains:
            self.assertIn(contains, cm.exception.details())
        return cm.exception


def main():
    unittest.main(verbosity=2)
