# SPDX-License-Identifier: Apache-2.0
"""Issue 8, finding 2: who can reach the worker API. Real sidecars, real gRPC clients.

- the health-only probe port (--health-listen) serves grpc.health.v1 and refuses the API;
- a TCP --grpc-listen serves the API only with authentication: mTLS (CA and certificates made
  with the openssl CLI here) and/or a bearer token file; unauthenticated non-loopback: exit 2;
- the unix socket gets its explicit mode whatever the umask, in a directory that is not group-
  or world-writable; --allowed-uids lets only listed uids call (SO_PEERCRED); a second daemon on a live socket exits 2 and the first keeps serving.
Refused calls are checked by status code and message, and by the bytes of a region that they
must neither read nor change."""
import os
import shutil
import signal
import subprocess
import time

import grpc
from harness import (BINARY, SLOW, SidecarTest, free_port, health_pb2, health_pb2_grpc, main, pb,
                     rpc, wait_until)

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
PROBE_MSG = "this is the health-only probe port (--health-listen)"


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", name + ".key", "-out", name + ".pem", "-days", "2", "-subj", "/CN=" + name,
            cwd=d)


def make_cert(d, name, ca, server):
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        if server:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        else:
            f.write("subjectAltName=DNS:%s\nextendedKeyUsage=clientAuth\n" % name)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", ext, cwd=d)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tcp_port(s, prefix):
    for a in s.info().grpc_listeners:
        if a.startswith(prefix):
            return int(a.rsplit(":", 1)[1])
    raise AssertionError("no %s listener in %s" % (prefix, list(s.info().grpc_listeners)))


class SecurityListenTest(SidecarTest):
    def run_bin(self, *args, timeout=10):
        return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout * SLOW)

    def secret_region(self, s):
        """A region with random bytes, made over the unix socket: what a refused caller must
        neither read nor change."""
        r = s.create_region(1 << 16)
        data = os.urandom(1 << 16)
        s.fill(r, 0, data)
        return r, data

    def assert_untouched(self, s, r, data):
        self.assertEqual(s.peek(r, 0, len(data)), data, "a refused call changed region bytes")

    def try_read_write(self, stub, r, code, contains, **kw):
        """ReadRegion and WriteRegion both refused with code; no byte comes back."""
        got = []

        def rd():
            for m in stub.ReadRegion(pb.ReadRegionRequest(region_id=r.region_id, offset=0,
                                                          length=1 << 16), timeout=10 * SLOW, **kw):
                got.append(m.data)
        err = self.assertRpcError(code, rd)
        if contains:
            self.assertIn(contains, err.details())
        self.assertEqual(got, [], "a refused ReadRegion returned bytes")
        req = pb.WriteRegionRequest(region_id=r.region_id, offset=0, data=b"\0" * 4096)
        err = self.assertRpcError(code, stub.WriteRegion, iter([req]), timeout=10 * SLOW, **kw)
        if contains:
            self.assertIn(contains, err.details())

    # ---- the health-only probe port ----

    def test_probe_port_serves_health_only(self):
        port = free_port()
        s = self.sidecar("probe1", extra=["--health-listen", "127.0.0.1:%d" % port])
        r, data = self.secret_region(s)
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            h = health_pb2_grpc.HealthStub(ch)
            self.assertEqual(h.Check(health_pb2.HealthCheckRequest(), timeout=5 * SLOW).status,
                             health_pb2.HealthCheckResponse.SERVING)
            w = h.Watch(health_pb2.HealthCheckRequest(), timeout=10 * SLOW)
            self.assertEqual(next(w).status, health_pb2.HealthCheckResponse.SERVING)
            w.cancel()
            stub = rpc.SidecarStub(ch)
            for fn, req in ((stub.GetInfo, pb.GetInfoRequest()),
                            (stub.ListRegions, pb.ListRegionsRequest()),
                            (stub.CreateRegion, pb.CreateRegionRequest(size=4096)),
                            (stub.ListOperations, pb.ListOperationsRequest())):
                self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, fn, req, timeout=5 * SLOW,
                                    contains=PROBE_MSG)
            self.try_read_write(stub, r, grpc.StatusCode.PERMISSION_DENIED, PROBE_MSG)
            err = self.assertRpcError(grpc.StatusCode.UNIMPLEMENTED,
                                      ch.unary_unary("/grpc.reflection.v1alpha.ServerReflection/X"),
                                      b"", timeout=5 * SLOW)
            self.assertIn(PROBE_MSG, err.details())
        self.assertEqual(len(s.stub.ListRegions(pb.ListRegionsRequest(), timeout=5).regions), 1,
                         "the probe port created a region")
        self.assert_untouched(s, r, data)
        # the probe port is not an API listener
        self.assertNotIn("127.0.0.1:%d" % port, list(s.info().grpc_listeners))

    # ---- TCP without authentication ----

    def test_non_loopback_tcp_without_auth_exit_2(self):
        sock = os.path.join(self.workdir, "na", "s.sock")
        for addr in ("0.0.0.0:%d" % free_port(), "[::]:%d" % free_port()):
            r = self.run_bin("--grpc-listen", "unix:" + sock, "--grpc-listen", addr,
                             "--shm-dir", self.workdir)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--grpc-listen %s would serve the whole API" % addr, r.stderr)
            self.assertIn("--grpc-token-file", r.stderr)
            self.assertFalse(os.path.exists(sock), "nothing may be served")
        r = self.run_bin("--grpc-listen", "0.0.0.0:1", "--shm-dir", self.workdir,
                         "--grpc-tls-cert", "/nonexistent.pem")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--grpc-tls-cert and --grpc-tls-key go together", r.stderr)

    def test_loopback_tcp_without_auth_warns(self):
        s = self.sidecar("lo1")  # the harness listens on 127.0.0.1:0 too
        self.assertIn("SECURITY: --grpc-listen 127.0.0.1:0 serves the whole API WITHOUT "
                      "AUTHENTICATION", s.read_log())

    # ---- mTLS ----

    def make_pki(self):
        d = os.path.join(self.workdir, "pki")
        os.makedirs(d)
        make_ca(d, "ca")
        make_ca(d, "otherca")
        make_cert(d, "server", "ca", True)
        make_cert(d, "client", "ca", False)
        make_cert(d, "intruder", "otherca", False)
        return d

    def test_mtls(self):
        d = self.make_pki()
        p = lambda n: os.path.join(d, n)  # noqa: E731
        s = self.sidecar("tls1", tcp=False, extra=[
            "--grpc-listen", "0.0.0.0:0", "--grpc-tls-cert", p("server.pem"),
            "--grpc-tls-key", p("server.key"), "--grpc-tls-client-ca", p("ca.pem")])
        port = tcp_port(s, "0.0.0.0:")
        self.assertIn("mTLS", s.read_log())
        r, data = self.secret_region(s)
        target = "127.0.0.1:%d" % port
        opts = [("grpc.ssl_target_name_override", "localhost")]

        def creds(client=None):
            if client is None:
                return grpc.ssl_channel_credentials(root_certificates=read(p("ca.pem")))
            return grpc.ssl_channel_credentials(root_certificates=read(p("ca.pem")),
                                                private_key=read(p(client + ".key")),
                                                certificate_chain=read(p(client + ".pem")))
        # A client certificate from the cluster CA: the whole API.
        with grpc.secure_channel(target, creds("client"), options=opts) as ch:
            stub = rpc.SidecarStub(ch)
            self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), timeout=10 * SLOW).sidecar_id, "tls1")
            got = b"".join(m.data for m in stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=len(data)),
                timeout=10 * SLOW))
            self.assertEqual(got, data)
        # No client certificate, one from another CA, or no TLS at all: no call gets through.
        for name, ch in (("no client cert", grpc.secure_channel(target, creds(), options=opts)),
                         ("other CA", grpc.secure_channel(target, creds("intruder"), options=opts)),
                         ("plain TCP", grpc.insecure_channel(target))):
            with ch:
                stub = rpc.SidecarStub(ch)
                err = self.assertRpcError(grpc.StatusCode.UNAVAILABLE, stub.GetInfo,
                                          pb.GetInfoRequest(), timeout=5 * SLOW)
                self.assertNotIn("tls1", err.details() or "", name)
                self.try_read_write(stub, r, grpc.StatusCode.UNAVAILABLE, None)
        self.assert_untouched(s, r, data)
        # the unix socket still serves the worker
        self.assertEqual(s.info().sidecar_id, "tls1")

    # ---- bearer token ----

    def write_token(self, path, token):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(token + "\n")

    def test_bearer_token(self):
        tok_path = os.path.join(self.workdir, "token")
        token = os.urandom(24).hex()
        self.write_token(tok_path, token)
        s = self.sidecar("tok1", tcp=False, extra=["--grpc-listen", "0.0.0.0:0",
                                                   "--grpc-token-file", tok_path])
        port = tcp_port(s, "0.0.0.0:")
        r, data = self.secret_region(s)
        msg = "missing or wrong bearer token"
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            stub = rpc.SidecarStub(ch)
            # health needs no token (probes)
            self.assertEqual(health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=5 * SLOW).status,
                health_pb2.HealthCheckResponse.SERVING)
            for md in (None, [("authorization", "Bearer " + token[:-1] + "x")],
                       [("authorization", token)], [("authorization", "Bearer " + token + "x")],
                       [("authorization", "Basic " + token)]):
                kw = {"metadata": md} if md else {}
                self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, stub.GetInfo,
                                    pb.GetInfoRequest(), timeout=5 * SLOW, contains=msg, **kw)
                self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, stub.ListRegions,
                                    pb.ListRegionsRequest(), timeout=5 * SLOW, contains=msg, **kw)
                self.try_read_write(stub, r, grpc.StatusCode.UNAUTHENTICATED, msg, **kw)
            self.assert_untouched(s, r, data)
            good = [("authorization", "Bearer " + token)]
            self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), timeout=5 * SLOW,
                                          metadata=good).sidecar_id, "tok1")
            got = b"".join(m.data for m in stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=len(data)),
                timeout=10 * SLOW, metadata=good))
            self.assertEqual(got, data)
            # SIGHUP reloads the token: the new one works, the old one no longer.
            token2 = os.urandom(24).hex()
            self.write_token(tok_path, token2)
            s.proc.send_signal(signal.SIGHUP)
            new = [("authorization", "Bearer " + token2)]

            def rotated():
                try:
                    stub.GetInfo(pb.GetInfoRequest(), timeout=5 * SLOW, metadata=new)
                    return True
                except grpc.RpcError:
                    return False
            wait_until(rotated, 10, "the new token to be accepted after SIGHUP")
            self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, stub.GetInfo, pb.GetInfoRequest(),
                                timeout=5 * SLOW, metadata=good, contains=msg)
        # the unix socket needs no token
        self.assertEqual(s.info().sidecar_id, "tok1")

    def test_bad_token_file_exit_2(self):
        tok_path = os.path.join(self.workdir, "token")
        with open(tok_path, "w") as f:
            f.write("0123456789abcdef0123\n")
        os.chmod(tok_path, 0o644)
        r = self.run_bin("--grpc-listen", "unix:" + os.path.join(self.workdir, "s.sock"),
                         "--shm-dir", self.workdir, "--grpc-token-file", tok_path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("readable or writable by every user", r.stderr)

    # ---- the unix socket ----

    def start_raw(self, name, sock, umask, extra=()):
        """A sidecar on one unix socket only, started under umask; waits until it serves."""
        shm = os.path.join(self.workdir, name + "-shm")
        os.makedirs(shm, exist_ok=True)
        log = open(os.path.join(self.workdir, name + ".log"), "wb")
        proc = subprocess.Popen([BINARY, "--id", name, "--grpc-listen", "unix:" + sock,
                                 "--shm-dir", shm, "--data-listen", "127.0.0.1:0", *extra],
                                stdout=log, stderr=subprocess.STDOUT, umask=umask)
        self.addCleanup(self.stop_raw, proc, log)
        wait_until(lambda: proc.poll() is not None or os.path.exists(sock), 15, name + " socket")
        self.assertIsNone(proc.poll(), "sidecar %s exited %s" % (name, proc.returncode))
        with grpc.insecure_channel("unix:" + sock) as ch:
            h = health_pb2_grpc.HealthStub(ch)
            wait_until(lambda: self.serving(h), 15, name + " to serve")
        return proc

    def serving(self, h):
        try:
            return h.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def stop_raw(self, proc, log):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20 * SLOW)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        # a clean drain, and under the sanitizers no leak or error report
        self.assertEqual(proc.returncode, 0, "sidecar exited %s (see %s)" % (proc.returncode, log.name))

    def test_socket_mode_whatever_the_umask(self):
        for umask, extra, want in ((0o000, (), 0o660), (0o077, (), 0o660),
                                   (0o000, ("--unix-socket-mode", "0600"), 0o600)):
            d = os.path.join(self.workdir, "m%03o%d" % (umask, len(extra)), "run")
            sock = os.path.join(d, "s.sock")
            proc = self.start_raw("mode%03o" % umask, sock, umask, extra)
            self.assertEqual(os.stat(sock).st_mode & 0o777, want, "umask %03o" % umask)
            # the directory the sidecar made: 0750, whatever the umask
            self.assertEqual(os.stat(d).st_mode & 0o777, 0o750, "umask %03o" % umask)
            self.stop_raw(proc, open(os.devnull, "wb"))

    def test_socket_dir_group_writable_exit_2(self):
        for mode in (0o770, 0o777, 0o722):
            d = os.path.join(self.workdir, "gw%o" % mode)
            os.makedirs(d)
            os.chmod(d, mode)
            r = self.run_bin("--grpc-listen", "unix:" + os.path.join(d, "s.sock"),
                             "--shm-dir", self.workdir)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("directory %s is group- or world-writable (mode %04o)" % (d, mode),
                          r.stderr)
            self.assertEqual(os.listdir(d), [], "a socket was created")

    # ---- --allowed-uids (SO_PEERCRED) ----

    CLIENT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import grpc
from rdma_sidecar.v1 import sidecar_pb2 as pb, sidecar_pb2_grpc as rpc
ch = grpc.insecure_channel("unix:" + sys.argv[2])
stub = rpc.SidecarStub(ch)
try:
    if sys.argv[3] == "info":
        print("OK", stub.GetInfo(pb.GetInfoRequest(), timeout=10).sidecar_id)
    else:
        got = b"".join(m.data for m in stub.ReadRegion(pb.ReadRegionRequest(
            region_id=sys.argv[3], offset=0, length=4096), timeout=10))
        print("OK", len(got))
except grpc.RpcError as e:
    print("ERR", e.code().name, e.details())
"""

    def call_as(self, uid, sock, what):
        from harness import STUBS
        r = subprocess.run(["/usr/bin/python3", "-c", self.CLIENT, os.path.abspath(STUBS), sock, what],
                           capture_output=True, text=True, timeout=30 * SLOW, user=uid, group=uid)
        return r.stdout.strip() + r.stderr.strip()[-500:]

    def test_allowed_uids(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to call as another uid")
        nobody = 65534
        d = os.path.join(self.workdir, "au")
        sock = os.path.join(d, "api", "s.sock")
        os.makedirs(d)
        os.chmod(self.workdir, 0o755)
        os.chmod(d, 0o755)
        # mode 0666: the file system lets everyone in; only the uid list decides
        proc = self.start_raw("au", sock, 0o022, ["--allowed-uids", "0,4242",
                                                  "--unix-socket-mode", "0666"])
        os.chmod(os.path.dirname(sock), 0o755)
        with grpc.insecure_channel("unix:" + sock) as ch:
            stub = rpc.SidecarStub(ch)
            self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), timeout=5 * SLOW).sidecar_id, "au")
            r = stub.CreateRegion(pb.CreateRegionRequest(size=4096), timeout=5 * SLOW)
        self.assertEqual(self.call_as(0, sock, "info"), "OK au")
        out = self.call_as(nobody, sock, "info")
        self.assertEqual(out, "ERR PERMISSION_DENIED uid %d may not call this sidecar: its unix socket "
                         "serves only the uids of --allowed-uids; ask the operator to add yours" % nobody)
        out = self.call_as(nobody, sock, r.region_id)
        self.assertTrue(out.startswith("ERR PERMISSION_DENIED uid %d may not call" % nobody), out)
        self.assertEqual(self.call_as(0, sock, r.region_id), "OK 4096")
        self.assertIsNone(proc.poll())
        # without the list, the same caller gets in (the mode alone allows it): the test is honest
        sock2 = os.path.join(d, "api2", "s.sock")
        self.start_raw("au2", sock2, 0o022, ["--unix-socket-mode", "0666"])
        os.chmod(os.path.dirname(sock2), 0o755)
        self.assertEqual(self.call_as(nobody, sock2, "info"), "OK au2")

    def test_second_daemon_on_live_socket_exit_2(self):
        s = self.sidecar("first")
        r, data = self.secret_region(s)
        ino = os.stat(s.sock).st_ino
        res = self.run_bin("--id", "second", "--grpc-listen", "unix:" + s.sock,
                           "--shm-dir", self.workdir, "--data-listen", "127.0.0.1:0")
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("unix:%s: another server (a running rdma-sidecar?) is answering" % s.sock,
                      res.stderr)
        # the first keeps its socket and serves
        self.assertEqual(os.stat(s.sock).st_ino, ino)
        self.assertEqual(s.info().sidecar_id, "first")
        self.assertEqual([x.region_id for x in s.stub.ListRegions(pb.ListRegionsRequest(),
                                                                   timeout=5).regions],
                         [r.region_id])
        self.assert_untouched(s, r, data)

    def test_stale_socket_is_replaced(self):
        s = self.sidecar("stale1")
        sock = s.sock
        s.expect_nonzero = True
        s.kill()  # SIGKILL: the socket file stays behind, nobody answers
        self.assertTrue(os.path.exists(sock))
        t0 = time.monotonic()
        proc = self.start_raw("stale2", sock, 0o022)
        self.assertLess(time.monotonic() - t0, 15 * SLOW)
        self.assertIsNone(proc.poll())


if __name__ == "__main__":
    main()
