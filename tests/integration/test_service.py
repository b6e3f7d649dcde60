# SPDX-License-Identifier: Apache-2.0
"""The gRPC service itself: health on both listeners, GetInfo, unknown methods, cancelled streams,
bad flags, and SIGTERM while a stream is open. Real daemon, Python client generated from the proto."""
import os
import signal
import subprocess
import threading
import time

import grpc
from harness import BINARY, SLOW, SidecarTest, health_pb2, health_pb2_grpc, main, pb, rpc


class ServiceTest(SidecarTest):
    def test_health_on_unix_and_tcp(self):
        s = self.sidecar("h1")
        for target in ("unix:" + s.sock, "127.0.0.1:%d" % s.port):
            with grpc.insecure_channel(target) as ch:
                h = health_pb2_grpc.HealthStub(ch)
                r = h.Check(health_pb2.HealthCheckRequest(), timeout=5)
                self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, target)
                r = h.Check(health_pb2.HealthCheckRequest(service="rdma_sidecar.v1.Sidecar"), timeout=5)
                self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, target)
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, s.health.Check,
                            health_pb2.HealthCheckRequest(service="nope"), timeout=5,
                            contains="unknown service")

    def test_get_info(self):
        s = self.sidecar("info1")
        i = s.info()
        self.assertEqual(i.sidecar_id, "info1")
        self.assertRegex(i.version, r"^\d+\.\d+\.\d+")
        by = {b.backend: b for b in i.backends}
        self.assertTrue(by[pb.BACKEND_LOCAL].available)
        self.assertIn(pb.BACKEND_IBVERBS, by)
        self.assertIn(pb.BACKEND_TCP, by)
        if not by[pb.BACKEND_IBVERBS].available:
            self.assertTrue(by[pb.BACKEND_IBVERBS].detail, "unavailable ibverbs must say why")
        self.assertIn("unix:" + s.sock, list(i.grpc_listeners))
        self.assertIn("127.0.0.1:%d" % s.port, list(i.grpc_listeners))
        self.assertEqual(len(i.data_endpoints), 1)
        self.assertRegex(i.data_endpoints[0], r"^127\.0\.0\.1:\d+$")
        self.assertEqual(i.nats_state, "disabled")
        self.assertFalse(i.signing_enabled)
        self.assertTrue(i.cuda_detail)

    def test_get_info_signing(self):
        s = self.sidecar("info2", key_file=self.key_file(keys=[("prod-1", os.urandom(32))]))
        i = s.info()
        self.assertTrue(i.signing_enabled)
        self.assertEqual(i.signing_key_id, "prod-1")

    def test_unknown_method_is_unimplemented_at_once(self):
        s = self.sidecar("u1")
        for path in ("/rdma_sidecar.v1.Sidecar/NoSuchMethod", "/other.Service/Call"):
            t0 = time.monotonic()
            err = self.assertRpcError(grpc.StatusCode.UNIMPLEMENTED,
                                      s.channel.unary_unary(path), b"", timeout=30)
            self.assertLess(time.monotonic() - t0, 1.0 * SLOW, "UNIMPLEMENTED took too long")
            self.assertIn(path, err.details())

    def test_malformed_request_is_invalid_argument(self):
        s = self.sidecar("m1")
        err = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT,
                                  s.channel.unary_unary("/rdma_sidecar.v1.Sidecar/CreateRegion"),
                                  b"\xff\xff\xff\xff", timeout=5)
        self.assertIn("malformed", err.details())

    def test_oversized_message_is_refused(self):
        s = self.sidecar("big1", extra=["--max-message-size", "64KiB"])
        r = s.create_region(1 << 20)
        req = pb.WriteRegionRequest(region_id=r.region_id, offset=0, data=os.urandom(200 << 10))
        err = self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, s.stub.WriteRegion, iter([req]),
                                  timeout=10)
        self.assertIn("larger than max", err.details())
        # the sidecar still serves
        self.assertEqual(s.info().sidecar_id, "big1")

    def test_client_cancels_health_watch(self):
        s = self.sidecar("w1")
        call = s.health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
        first = next(call)
        self.assertEqual(first.status, health_pb2.HealthCheckResponse.SERVING)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as cm:
            next(call)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
        # several watch/cancel rounds leave the server healthy
        for _ in range(20):
            c = s.health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            next(c)
            c.cancel()
        self.assertEqual(s.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status,
                         health_pb2.HealthCheckResponse.SERVING)

    def test_sigterm_with_open_stream_exits_zero_and_tells_watchers(self):
        s = self.sidecar("t1")
        call = s.health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
        self.assertEqual(next(call).status, health_pb2.HealthCheckResponse.SERVING)
        seen = []

        def drain():
            try:
                for m in call:
                    seen.append(m.status)
            except grpc.RpcError as e:
                seen.append(e.code())
        t = threading.Thread(target=drain)
        t.start()
        t0 = time.monotonic()
        code = s.stop(signal.SIGTERM, timeout=15)
        elapsed = time.monotonic() - t0
        t.join(10)
        self.assertEqual(code, 0, s.read_log()[-3000:])
        self.assertLess(elapsed, 10 * SLOW)
        self.assertIn(health_pb2.HealthCheckResponse.NOT_SERVING, seen, seen)
        self.assertEqual(os.listdir(s.shm), [], "region files left behind")

    def test_sigint_exits_zero(self):
        s = self.sidecar("t2")
        self.assertEqual(s.stop(signal.SIGINT), 0)

    def test_region_files_removed_on_exit(self):
        s = self.sidecar("f1")
        r = s.create_region(12345)
        self.assertTrue(os.path.exists(r.path))
        self.assertEqual(oct(os.stat(r.path).st_mode & 0o777), "0o600")
        self.assertEqual(s.stop(), 0)
        self.assertFalse(os.path.exists(r.path))


class FlagsTest(SidecarTest):
    def run_bin(self, *args, env=None, timeout=10):
        return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout * SLOW,
                              env=dict(os.environ, **(env or {})))

    def test_help_documents_every_flag(self):
        r = self.run_bin("--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--id", "--grpc-listen", "--data-listen", "--advertise", "--shm-dir", "--nats-url",
                     "--key-file", "--backends", "--ib-device", "--ib-gid-index", "--log-level",
                     "--metrics-listen", "--default-timeout", "--max-concurrent-transfers",
                     "--max-inflight-bytes", "--grace-period", "RDMA_SIDECAR_"):
            self.assertIn(flag, r.stdout)

    def test_version(self):
        r = self.run_bin("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"rdma-sidecar \d+\.\d+\.\d+")

    def test_bad_flags_exit_2_with_message(self):
        cases = [
            (["--frobnicate"], "--frobnicate"),
            (["--data-listen", "nope"], "--data-listen"),
            (["--backends", "carrier-pigeon"], "carrier-pigeon"),
            (["--log-level", "loud"], "--log-level"),
            (["--default-timeout", "soon"], "--default-timeout"),
            (["--grpc-listen", "127.0.0.1:99999"], "--grpc-listen"),
        ]
        for args, needle in cases:
            r = self.run_bin(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(needle, r.stderr, args)

    def test_bad_env_exit_2(self):
        r = self.run_bin(env={"RDMA_SIDECAR_TCP_STREAMS": "99"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("RDMA_SIDECAR_TCP_STREAMS", r.stderr)

    def test_port_in_use_exit_2(self):
        s = self.sidecar("p1")
        d = os.path.join(self.workdir, "p2")
        os.makedirs(d)
        r = self.run_bin("--id", "p2", "--grpc-listen", "127.0.0.1:%d" % s.port, "--shm-dir", d,
                         "--grpc-listen", "unix:" + os.path.join(d, "s.sock"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("127.0.0.1:%d" % s.port, r.stderr)

    def test_unwritable_socket_dir_exit_2(self):
        r = self.run_bin("--grpc-listen", "unix:/proc/nope/s.sock", "--shm-dir", self.workdir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("/proc/nope", r.stderr)

    def test_bad_shm_dir_exit_2(self):
        r = self.run_bin("--shm-dir", "/nonexistent/dir", "--grpc-listen",
                         "unix:" + os.path.join(self.workdir, "x.sock"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--shm-dir", r.stderr)

    def test_missing_key_file_exit_2(self):
        r = self.run_bin("--key-file", "/nonexistent/keys", "--shm-dir", self.workdir,
                         "--grpc-listen", "unix:" + os.path.join(self.workdir, "x.sock"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--key-file", r.stderr)

    def test_env_twin_sets_id(self):
        s = self.sidecar("ignored", env={"RDMA_SIDECAR_ID": "from-env"}, extra=[])
        # the flag (--id ignored) wins over the environment
        self.assertEqual(s.info().sidecar_id, "ignored")


if __name__ == "__main__":
    main()
