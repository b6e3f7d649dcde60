# SPDX-License-Identifier: Apache-2.0
"""The Prometheus endpoint of --metrics-listen: exposition format (counters, gauges and histograms;
test_metrics_promtool.py runs promtool and checks the histograms and rejection counters), exact
counters after a LOCAL
transfer and a cancelled operation, gauges while a transfer hangs during a drain, /healthz, 404 and
405, IPv6, and a port in use as a start-up error (exit 2); the standard process_* and grpc_server_*
families (calls counted by method and code, exactly, an unknown method and a stream the client
left included), NATS state and reconnects (a nats-server stopped and started again), and histogram
bounds as plain decimals (le="10", never "1e+01")."""
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc

from harness import BINARY, SLOW, SidecarTest, desc, free_port, main, pb, wait_until

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def get(port, path="/metrics", method="GET", host="127.0.0.1"):
    """(status, content type, body) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request("http://%s:%d%s" % (host, port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=10 * SLOW) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def key(name, **labels):
    return (name, tuple(sorted(labels.items())))


class MetricsTest(SidecarTest):
    def scrape(self, port, host="127.0.0.1"):
        """Parse the exposition text strictly: every sample belongs to a family announced by
        HELP and TYPE lines before it, appears once, and has a numeric value."""
        status, ctype, text = get(port, host=host)
        self.assertEqual(status, 200, text)
        self.assertTrue(ctype.startswith("text/plain; version=0.0.4"), ctype)
        self.assertTrue(text.endswith("\n"))
        helped, typed, samples = set(), {}, {}
        for line in text.splitlines():
            if line.startswith("# HELP "):
                helped.add(line.split(" ")[2])
                continue
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                self.assertIn(kind, ("counter", "gauge", "histogram"), line)
                self.assertIn(name, helped, "TYPE before HELP: " + line)
                self.assertNotIn(name, typed, "family announced twice: " + line)
                typed[name] = kind
                if kind == "histogram":  # its samples are NAME_bucket, NAME_sum and NAME_count
                    for suffix in ("_bucket", "_sum", "_count"):
                        typed[name + suffix] = "histogram"
                continue
            m = SAMPLE.match(line)
            self.assertTrue(m, "not a sample line: %r" % line)
            name, labels, value = m.groups()
            # The sidecar's own families, and the standard ones operators' dashboards expect.
            self.assertTrue(name.startswith(("rdma_sidecar_", "process_", "grpc_server_")), line)
            self.assertIn(name, typed, "sample without HELP/TYPE: " + line)
            if typed[name] == "counter":
                self.assertTrue(name.endswith("_total"), line)
            pairs = LABEL.findall(labels or "")
            self.assertEqual("".join('%s="%s",' % p for p in pairs).rstrip(","), labels or "", line)
            for lname, lval in pairs:
                if lname == "le":  # Prometheus' own form: a plain decimal or +Inf, no exponent
                    self.assertRegex(lval, r"^(\+Inf|[0-9]+(\.[0-9]+)?)$", line)
            k = (name, tuple(sorted(pairs)))
            self.assertNotIn(k, samples, "duplicate sample: " + line)
            samples[k] = float(value)
        return samples

    def metrics_sidecar(self, name, listen=None, **kw):
        port = free_port()
        extra = ["--metrics-listen", listen or "127.0.0.1:%d" % port] + list(kw.pop("extra", []))
        s = self.sidecar(name, extra=extra, **kw)
        return s, port

    def test_local_read_counted_exactly(self):
        s, port = self.metrics_sidecar("solo")
        m = self.scrape(port)
        info = s.info()
        self.assertEqual(m[key("rdma_sidecar_build_info", version=info.version, sidecar_id="solo")], 1)
        self.assertEqual(m[key("rdma_sidecar_backend_available", backend="local")], 1)
        self.assertEqual(m[key("rdma_sidecar_backend_available", backend="tcp")], 1)
        ib = [b for b in info.backends if b.backend == pb.BACKEND_IBVERBS][0]
        self.assertEqual(m[key("rdma_sidecar_backend_available", backend="ibverbs")], int(ib.available))
        self.assertEqual(m[key("rdma_sidecar_draining")], 0)
        for kind in ("readable", "writable", "read", "write"):
            self.assertEqual(m[key("rdma_sidecar_operations_created_total", kind=kind)], 0)
            self.assertEqual(m[key("rdma_sidecar_live_operations", kind=kind)], 0)
            for status in ("complete", "cancelled", "errored"):
                for backend in ("tcp", "ibverbs", "local"):
                    self.assertEqual(m[key("rdma_sidecar_operations_total", kind=kind, status=status,
                                           backend=backend)], 0)
        for direction in ("read", "write"):
            for backend in ("tcp", "ibverbs", "local"):
                self.assertEqual(m[key("rdma_sidecar_bytes_total", direction=direction, backend=backend)], 0)
        self.assertEqual(m[key("rdma_sidecar_regions")], 0)
        self.assertEqual(m[key("rdma_sidecar_region_bytes")], 0)

        size = 3 * 4096 + 5
        src, dst = s.create_region(size, name="src"), s.create_region(2 * size + 1, name="dst")
        m = self.scrape(port)
        self.assertEqual(m[key("rdma_sidecar_regions")], 2)
        self.assertEqual(m[key("rdma_sidecar_region_bytes")], src.size + dst.size)

        data = os.urandom(size)
        s.fill(src, 0, data)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(src, 0, size)]), timeout=10 * SLOW)
        m = self.scrape(port)
        self.assertEqual(m[key("rdma_sidecar_operations_created_total", kind="readable")], 1)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="readable")], 1)
        op = s.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(dst, 7, size)]),
                              timeout=10 * SLOW)
        done = s.wait(op.operation_id)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, pb.BACKEND_LOCAL)
        self.assertEqual(s.wait(ro.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(s.peek(dst, 7, size), data)

        m = self.scrape(port)
        self.assertEqual(m[key("rdma_sidecar_operations_created_total", kind="read")], 1)
        self.assertEqual(m[key("rdma_sidecar_operations_created_total", kind="readable")], 1)
        self.assertEqual(m[key("rdma_sidecar_operations_total", kind="read", status="complete", backend="local")], 1)
        self.assertEqual(m[key("rdma_sidecar_operations_total", kind="readable", status="complete",
                               backend="local")], 1)
        self.assertEqual(m[key("rdma_sidecar_bytes_total", direction="read", backend="local")], size)
        # Only the active side counts bytes: the readable's copy of the same bytes is not added.
        self.assertEqual(m[key("rdma_sidecar_bytes_total", direction="write", backend="local")], 0)
        self.assertEqual(m[key("rdma_sidecar_bytes_total", direction="read", backend="tcp")], 0)
        finished = sum(v for (n, _), v in m.items() if n == "rdma_sidecar_operations_total")
        self.assertEqual(finished, 2)
        for kind in ("readable", "writable", "read", "write"):
            self.assertEqual(m[key("rdma_sidecar_live_operations", kind=kind)], 0)
        self.assertEqual(m[key("rdma_sidecar_active_transfers")], 0)
        self.assertEqual(m[key("rdma_sidecar_inflight_bytes")], 0)
        self.assertEqual(m[key("rdma_sidecar_scheduler_queued_operations")], 0)
        self.assertEqual(m[key("rdma_sidecar_scheduler_waiting_progress_operations")], 0)
        self.assertIn("metrics on http://127.0.0.1:%d/metrics" % port, s.read_log())

    def test_cancelled_and_gated_operations(self):
        s, port = self.metrics_sidecar("solo")
        r = s.create_region(8192)
        wo = s.stub.CreateWritable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 4096)]), timeout=10 * SLOW)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 100)]), timeout=10 * SLOW)
        # A read gated on worker progress that never comes: SCHEDULED, waiting.
        gated = s.stub.BeginRead(pb.BeginTransferRequest(
            metadata=ro.metadata, descriptors=[desc(r, 4096, 100)],
            requirement=pb.TransferRequirement(request_id="req-1", iteration=3)), timeout=10 * SLOW)
        self.assertEqual(gated.status, pb.OPERATION_STATUS_SCHEDULED)
        m = self.scrape(port)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="writable")], 1)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="readable")], 1)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="read")], 1)
        self.assertEqual(m[key("rdma_sidecar_scheduler_waiting_progress_operations")], 1)
        self.assertEqual(m[key("rdma_sidecar_active_transfers")], 0)
        # No peer used the writable: its backend is "none", a row that appears once non-zero.
        self.assertNotIn(key("rdma_sidecar_operations_total", kind="writable", status="cancelled",
                             backend="none"), m)
        s.stub.CancelOperation(pb.CancelOperationRequest(operation_id=wo.operation_id), timeout=10 * SLOW)
        s.stub.CancelOperation(pb.CancelOperationRequest(operation_id=gated.operation_id), timeout=10 * SLOW)
        m = self.scrape(port)
        self.assertEqual(m[key("rdma_sidecar_operations_total", kind="writable", status="cancelled",
                               backend="none")], 1)
        self.assertEqual(m[key("rdma_sidecar_operations_total", kind="read", status="cancelled",
                               backend="local")], 1)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="writable")], 0)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="read")], 0)
        self.assertEqual(m[key("rdma_sidecar_live_operations", kind="readable")], 1)
        self.assertEqual(m[key("rdma_sidecar_scheduler_waiting_progress_operations")], 0)
        self.assertEqual(m[key("rdma_sidecar_bytes_total", direction="read", backend="local")], 0)
        created = sum(v for (n, _), v in m.items() if n == "rdma_sidecar_operations_created_total")
        finished = sum(v for (n, _), v in m.items() if n == "rdma_sidecar_operations_total")
        live = sum(v for (n, _), v in m.items() if n == "rdma_sidecar_live_operations")
        self.assertEqual((created, finished, live), (3, 2, 1))

    def test_process_grpc_and_nats_families(self):
        before = time.time()
        s, port = self.metrics_sidecar("fam")
        t0 = time.time()
        m = self.scrape(port)
        # process_*: this very process (btime has whole seconds: 2 s of slack).
        self.assertGreater(m[key("process_start_time_seconds")], before - 2)
        self.assertLess(m[key("process_start_time_seconds")], t0 + 2)
        self.assertGreater(m[key("process_resident_memory_bytes")], 1 << 20)
        self.assertGreaterEqual(m[key("process_virtual_memory_bytes")], m[key("process_resident_memory_bytes")])
        fds = len(os.listdir("/proc/%d/fd" % s.proc.pid))
        self.assertLess(abs(m[key("process_open_fds")] - fds), 8)
        with open("/proc/%d/limits" % s.proc.pid) as f:
            soft = int(re.search(r"Max open files\s+(\d+)", f.read()).group(1))
        self.assertEqual(m[key("process_max_fds")], soft)
        self.assertGreaterEqual(m[key("process_cpu_seconds_total")], 0)
        self.assertGreater(m[key("process_threads")], 2)
        self.assertEqual(m[key("rdma_sidecar_nats_connection_state", state="disabled")], 1)
        self.assertEqual(m[key("rdma_sidecar_nats_connection_state", state="connected")], 0)
        for op in ("setup", "store", "read"):
            self.assertEqual(m[key("rdma_sidecar_nats_jetstream_errors_total", op=op)], 0)

        def labels(method, svc="rdma_sidecar.v1.Sidecar", kind="unary"):
            return dict(grpc_service=svc, grpc_method=method, grpc_type=kind)
        # Every method listed from the start; GetInfo and Health/Check were called at start-up.
        self.assertEqual(m[key("grpc_server_started_total", **labels("BeginWrite"))], 0)
        self.assertEqual(m[key("grpc_server_started_total", **labels("WatchOperation", kind="server_stream"))], 0)
        self.assertEqual(m[key("grpc_server_started_total", **labels("WriteRegion", kind="client_stream"))], 0)
        # A call is counted handled when its last reference goes, which can be just after the
        # client has its answer: wait until the start-up calls are all counted.
        def settled(extra=0, getop=0):
            m = self.scrape(port)
            started = m.get(key("grpc_server_started_total", **labels("GetInfo")), 0)
            handled = m.get(key("grpc_server_handled_total", grpc_code="OK", **labels("GetInfo")), 0)
            nf = m.get(key("grpc_server_handled_total", grpc_code="NOT_FOUND", **labels("GetOperation")), 0)
            return started > extra and handled == started and nf == getop
        wait_until(settled, 10 * SLOW, "the start-up GetInfo calls to be counted handled")
        m = self.scrape(port)
        info0 = m[key("grpc_server_handled_total", grpc_code="OK", **labels("GetInfo"))]
        for _ in range(3):
            s.info()
        for _ in range(2):
            self.assertRpcError(grpc.StatusCode.NOT_FOUND, s.stub.GetOperation,
                                pb.GetOperationRequest(operation_id="no-such-op"), timeout=10 * SLOW)
        unknown = s.channel.unary_unary("/rdma_sidecar.v1.Sidecar/NoSuchMethod")
        self.assertRpcError(grpc.StatusCode.UNIMPLEMENTED, unknown, b"", timeout=10 * SLOW)
        # A server stream the client leaves: counted CANCELLED once the call is over.
        r = s.create_region(4096)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 4096)]), timeout=10 * SLOW)
        stream = s.stub.WatchOperation(pb.WatchOperationRequest(operation_id=ro.operation_id), timeout=30 * SLOW)
        next(stream)
        stream.cancel()
        def watch_done():
            return self.scrape(port).get(key("grpc_server_handled_total", grpc_code="CANCELLED",
                                             **labels("WatchOperation", kind="server_stream")), 0) == 1
        wait_until(watch_done, 10 * SLOW, "the cancelled WatchOperation to be counted")
        wait_until(lambda: settled(info0 + 2, 2), 10 * SLOW, "the GetInfo and GetOperation calls to be counted")
        m = self.scrape(port)
        self.assertEqual(m[key("grpc_server_handled_total", grpc_code="OK", **labels("GetInfo"))], info0 + 3)
        self.assertEqual(m[key("grpc_server_started_total", **labels("GetInfo"))], info0 + 3)
        self.assertEqual(m[key("grpc_server_started_total", **labels("GetOperation"))], 2)
        self.assertEqual(m[key("grpc_server_handled_total", grpc_code="NOT_FOUND", **labels("GetOperation"))], 2)
        self.assertNotIn(key("grpc_server_handled_total", grpc_code="OK", **labels("GetOperation")), m)
        unk = dict(grpc_service="unknown", grpc_method="unknown", grpc_type="unknown")
        self.assertEqual(m[key("grpc_server_started_total", **unk)], 1)
        self.assertEqual(m[key("grpc_server_handled_total", grpc_code="UNIMPLEMENTED", **unk)], 1)
        # The handling-time histogram of GetOperation: two calls, each under the time the test took.
        self.assertEqual(m[key("grpc_server_handling_seconds_count", **labels("GetOperation"))], 2)
        self.assertEqual(m[key("grpc_server_handling_seconds_bucket", le="+Inf", **labels("GetOperation"))], 2)
        self.assertEqual(m[key("grpc_server_handling_seconds_bucket", le="300", **labels("GetOperation"))], 2)
        self.assertLess(m[key("grpc_server_handling_seconds_sum", **labels("GetOperation"))], time.time() - t0)
        self.assertIn(key("grpc_server_handling_seconds_bucket", le="0.005", **labels("GetOperation")), m)
        # The fast-path histogram exists (at zero) without a run.
        self.assertEqual(m[key("rdma_sidecar_fast_path_run_duration_seconds_count")], 0)
        self.assertEqual(m[key("rdma_sidecar_fast_path_run_duration_seconds_bucket", le="0.000005")], 0)

    def test_nats_state_and_reconnects(self):
        nats = self.nats()
        s, port = self.metrics_sidecar("natsy", nats_url=nats.url)

        def state():
            m = self.scrape(port)
            on = [k[1][0][1] for k, v in m.items() if k[0] == "rdma_sidecar_nats_connection_state" and v == 1]
            self.assertEqual(len(on), 1, on)
            return on[0], m
        wait_until(lambda: state()[0] == "connected", 10 * SLOW, "NATS connected")
        st, m = state()
        self.assertEqual(m[key("rdma_sidecar_nats_reconnects_total")], 0)
        out0 = m[key("rdma_sidecar_nats_messages_total", direction="out")]
        nats.stop()
        wait_until(lambda: state()[0] == "reconnecting", 10 * SLOW, "NATS reconnecting")
        again = self.nats(port=nats.port)  # the same address: the sidecar finds it again
        wait_until(lambda: state()[0] == "connected", 20 * SLOW, "NATS connected again")
        st, m = state()
        self.assertEqual(m[key("rdma_sidecar_nats_reconnects_total")], 1)
        self.assertGreaterEqual(m[key("rdma_sidecar_nats_messages_total", direction="out")], out0)
        again.stop()

    def test_http_paths_and_methods(self):
        s, port = self.metrics_sidecar("solo")
        self.assertEqual(get(port, "/healthz")[0::2], (200, "ok\n"))
        self.assertEqual(get(port, "/nope")[0], 404)
        self.assertEqual(get(port, "/")[0], 404)
        self.assertEqual(get(port, "/metrics/extra")[0], 404)
        self.assertEqual(get(port, "/metrics", method="POST")[0], 405)
        self.assertEqual(get(port, "/healthz", method="DELETE")[0], 405)
        status, _, body = get(port, "/metrics", method="HEAD")
        self.assertEqual((status, body), (200, ""))
        # The query string is not part of the path.
        self.assertEqual(get(port, "/metrics?x=1")[0], 200)

    def test_draining_healthz_and_gauges_while_a_transfer_hangs(self):
        keys = self.key_file()
        a, port = self.metrics_sidecar("a", key_file=keys, extra=["--grace-period", "120s"])
        b = self.sidecar("b", key_file=keys)
        rb, ra = b.create_region(4096), a.create_region(4096)
        # Warm the pooled connection a -> b, so the next OPEN goes over a socket that b's kernel
        # keeps accepting while b itself is stopped: the transfer then hangs until b resumes.
        ro = b.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rb, 0, 4096)]), timeout=10 * SLOW)
        op = a.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(ra, 0, 4096)]),
                              timeout=10 * SLOW)
        self.assertEqual(a.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        ro = b.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rb, 0, 4096)]), timeout=10 * SLOW)
        try:
            b.pause()
            op = a.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(ra, 0, 4096)],
                                                          timeout_ms=300000), timeout=10 * SLOW)
            m = self.scrape(port)
            self.assertEqual(m[key("rdma_sidecar_active_transfers")], 1)
            self.assertEqual(m[key("rdma_sidecar_inflight_bytes")], 4096)
            self.assertEqual(m[key("rdma_sidecar_live_operations", kind="read")], 1)
            self.assertEqual(get(port, "/healthz")[0::2], (200, "ok\n"))
            a.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: get(port, "/healthz")[0] == 503, 10, "/healthz to say draining")
            self.assertEqual(get(port, "/healthz")[2], "draining\n")
            m = self.scrape(port)
            self.assertEqual(m[key("rdma_sidecar_draining")], 1)
            self.assertEqual(m[key("rdma_sidecar_active_transfers")], 1)
        finally:
            b.proc.send_signal(signal.SIGCONT)
        self.assertEqual(a.proc.wait(timeout=60 * SLOW), 0, a.read_log()[-3000:])
        self.assertIn("COMPLETE: 4096 bytes via tcp", a.read_log())

    def test_ipv6(self):
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback")
        port = free_port()
        s, _ = self.metrics_sidecar("six", listen="[::1]:%d" % port)
        m = self.scrape(port, host="[::1]")
        self.assertEqual(m[key("rdma_sidecar_regions")], 0)
        self.assertIn("metrics on http://[::1]:%d/metrics" % port, s.read_log())

    def test_port_in_use_exits_2(self):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            port = busy.getsockname()[1]
            shm = tempfile.mkdtemp(prefix="sc-busy-", dir=self.workdir)
            args = [BINARY, "--id", "busy", "--grpc-listen", "unix:" + os.path.join(self.workdir, "busy.sock"),
                    "--shm-dir", shm, "--data-listen", "127.0.0.1:0",
                    "--metrics-listen", "127.0.0.1:%d" % port]
            wrapper = os.environ.get("SC_WRAPPER")
            if wrapper:
                args = wrapper.split() + args
            p = subprocess.run(args, capture_output=True, text=True, timeout=30 * SLOW)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--metrics-listen 127.0.0.1:%d" % port, p.stderr)
        self.assertIn("Address already in use", p.stderr)


if __name__ == "__main__":
    main()
