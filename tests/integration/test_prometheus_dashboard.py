# SPDX-License-Identifier: Apache-2.0
"""The operator's view (issue 36 part 3) against a real Prometheus (Debian's `prometheus`):

- A real Prometheus scrapes two real sidecars (peer TLS, NATS, the fast path on) every 0.5 s while
  they move random bytes between them (TCP READs and WRITEs of odd sizes, LOCAL reads, fast-path
  runs, every byte compared) and refuse some (tampered metadata, an unknown operation). Then every
  expression of every panel of deploy/monitoring/grafana-dashboard.json, with its template
  variables substituted ($job, $instance: the "All" value; $__rate_interval), is evaluated through
  Prometheus' HTTP API (/api/v1/query) and must return data, with a finite value wherever the
  panel is about what the test did; the template variables' own queries must list both sidecars.
  The alert rules load into that Prometheus and evaluate without error.
- deploy/monitoring/alerts.yaml passes `promtool check rules`, its unit tests
  (alerts.test.yaml: every alert fires and stays quiet as it should) pass `promtool test rules`,
  and prometheusrule.yaml holds the same groups (and renders as a kustomize component beside the
  base, when kubectl is installed).
- Every metric family a sidecar exposes is documented in docs/reference/metrics.md.
Skipped (with the reason) when prometheus/promtool are not installed."""
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import grpc
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
sys.path.insert(0, os.path.join(SRC, "clients", "python"))
from harness import SLOW, SidecarTest, desc, free_port, main, pb, wait_until  # noqa: E402
from tlsutil import CA  # noqa: E402

import rdma_sidecar as rs  # noqa: E402
import rdma_sidecar.sync  # noqa: E402,F401

MON = os.path.join(SRC, "deploy", "monitoring")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
KUBECTL = shutil.which("kubectl")
RATE_INTERVAL = "30s"
# Panels that must show a finite number (not only series at NaN or absent): what this test did.
MUST_BE_FINITE = {
    "Throughput by backend", "Throughput by rail", "Transfer latency p50 / p99 by backend",
    "Mean transfer size by backend", "Operations finished by status", "Live operations by kind",
    "gRPC errors by method and code", "gRPC calls by method", "gRPC handling time p99 by method",
    "Fast-path runs by result", "Fast-path run latency p50 / p99", "NATS connection state",
    "Certificate expiry", "CPU", "Memory", "Open file descriptors", "Metadata refused by reason",
}


def http_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout * SLOW) as r:
        return json.loads(r.read().decode())


class Prometheus:
    """One prometheus process on a free port, scraping `targets` every 0.5 s."""

    def __init__(self, workdir, targets, rule_files=()):
        self.dir = os.path.join(workdir, "prometheus")
        os.makedirs(self.dir)
        cfg = {"global": {"scrape_interval": "500ms", "scrape_timeout": "400ms",
                          "evaluation_interval": "1s"},
               "rule_files": list(rule_files),
               "scrape_configs": [{"job_name": "rdma-sidecar",
                                   "static_configs": [{"targets": list(targets)}]}]}
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file", path, "--storage.tsdb.path", os.path.join(self.dir, "data"),
             "--web.listen-address", "127.0.0.1:%d" % self.port, "--log.level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("prometheus exited %s:\n%s" % (self.proc.returncode, self.read_log()))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, 30 * SLOW, "prometheus to be ready")

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def query(self, expr):
        r = http_json(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if r.get("status") != "success":
            raise AssertionError("query %r: %s" % (expr, r))
        return r["data"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def substitute(expr):
    """A panel's expression as Grafana sends it with every template variable at "All"."""
    for name, value in (("job", ".*"), ("instance", ".*"), ("__rate_interval", RATE_INTERVAL),
                        ("__interval", "1s"), ("__range", "5m")):
        expr = expr.replace("${%s}" % name, value).replace("$" + name, value)
    assert "$" not in expr, "unsubstituted variable in " + expr
    return expr


def finite_values(data):
    if data["resultType"] == "vector":
        vals = [float(s["value"][1]) for s in data["result"]]
    elif data["resultType"] == "scalar":
        vals = [float(data["result"][1])]
    else:
        vals = []
    return [v for v in vals if not math.isnan(v) and not math.isinf(v)]


class PrometheusDashboardTest(SidecarTest):
    maxDiff = None

    def setUp(self):
        super().setUp()
        if not PROMTOOL:
            self.skipTest("promtool not installed (Debian package prometheus; scripts/install-deps.sh)")

    # ---- the rule files -------------------------------------------------------------------------

    def test_alert_rules_check_and_unit_tests(self):
        p = subprocess.run([PROMTOOL, "check", "rules", os.path.join(MON, "alerts.yaml")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("SUCCESS: 6 rules found", p.stdout)
        p = subprocess.run([PROMTOOL, "test", "rules", "alerts.test.yaml"], cwd=MON,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("SUCCESS", p.stdout)
        # Every alert has a test where it fires and one where it stays quiet.
        with open(os.path.join(MON, "alerts.yaml")) as f:
            rules = yaml.safe_load(f)
        with open(os.path.join(MON, "alerts.test.yaml")) as f:
            tests = yaml.safe_load(f)
        alerts = [r["alert"] for g in rules["groups"] for r in g["rules"]]
        self.assertEqual(sorted(alerts), sorted([
            "RdmaSidecarTransfersStalled", "RdmaSidecarRailDown", "RdmaSidecarTcpFallback",
            "RdmaSidecarCertificateExpiresSoon", "RdmaSidecarNatsDisconnected",
            "RdmaSidecarRefusalsClimbing"]))
        fires, quiet = set(), set()
        for t in tests["tests"]:
            for a in t["alert_rule_test"]:
                (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
        for t in tests["tests"]:
            instances = set(re.findall(r'instance="([^"]+)"', " ".join(s["series"] for s in t["input_series"])))
            fired = {e["exp_labels"]["instance"] for a in t["alert_rule_test"] for e in a.get("exp_alerts") or []}
            if fired:  # a quiet sidecar beside the one it fires for, or a quiet time before
                self.assertTrue(instances - fired or any(not a.get("exp_alerts") for a in t["alert_rule_test"]),
                                "a firing case with nothing quiet in it: %s" % t)
        self.assertEqual(fires, set(alerts))
        self.assertEqual(quiet, set(alerts))
        # The PrometheusRule holds the same groups as the plain file.
        with open(os.path.join(MON, "prometheusrule.yaml")) as f:
            pr = yaml.safe_load(f)
        self.assertEqual((pr["apiVersion"], pr["kind"]), ("monitoring.coreos.com/v1", "PrometheusRule"))
        self.assertEqual(pr["spec"], rules)
        if KUBECTL:  # the component renders beside the base and the pod-monitor component
            d = tempfile.mkdtemp(prefix="sc-mon-", dir=self.workdir)
            rel = lambda p: os.path.relpath(os.path.join(SRC, "deploy", p), d)  # noqa: E731
            with open(os.path.join(d, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [rel("base")],
                                "components": [rel("components/pod-monitor"), rel("monitoring")]}, f)
            r = subprocess.run([KUBECTL, "kustomize", d], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            docs = [x for x in yaml.safe_load_all(r.stdout) if x]
            kinds = {x["kind"]: x for x in docs if x["kind"] in ("PrometheusRule", "ConfigMap")
                     and x["metadata"]["name"].startswith(("rdma-sidecar", "rdma-sidecar-grafana"))}
            self.assertEqual(kinds["PrometheusRule"]["spec"], rules)
            cms = [x for x in docs if x["kind"] == "ConfigMap"
                   and x["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
            self.assertEqual(len(cms), 1)
            with open(os.path.join(MON, "grafana-dashboard.json")) as f:
                self.assertEqual(json.loads(cms[0]["data"]["grafana-dashboard.json"]), json.load(f))

    # ---- a real Prometheus and the dashboard ------------------------------------------------------

    def test_dashboard_panels_return_data(self):
        if not PROMETHEUS:
            self.skipTest("prometheus not installed (Debian package prometheus; scripts/install-deps.sh)")
        rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
        nats = self.nats()
        ca = CA(self.workdir, "cluster")
        keys = self.key_file()
        ports = {n: free_port() for n in ("a", "b")}
        # b asks for ibverbs, which this host may not have: then its TCP transfers are fallbacks
        # (reason "unavailable"), as an operator who wanted RDMA should see.
        backends = {"a": [], "b": ["--backends", "tcp,ibverbs,local"]}
        sc = {n: self.sidecar(n, key_file=keys, nats_url=nats.url,
                              extra=ca.peer_flags(n) + ["--metrics-listen", "127.0.0.1:%d" % ports[n]]
                              + backends[n])
              for n in ("a", "b")}
        a, b = sc["a"], sc["b"]
        prom = Prometheus(self.workdir, ["127.0.0.1:%d" % ports[n] for n in ("a", "b")],
                          rule_files=[os.path.join(MON, "alerts.yaml")])
        self._procs.append(prom)
        # A first sample of every counter before the transfers, so that rate() sees them happen.
        wait_until(lambda: len(prom.query("up == 1")["result"]) == 2 and
                   len(prom.query("rdma_sidecar_build_info")["result"]) == 2, 20 * SLOW,
                   "prometheus to scrape both sidecars once")

        # Transfers: b reads from and writes into a over TCP, a reads from itself (LOCAL).
        def move(passive, active, size, kind):
            rp, ra = passive.create_region(size + 8192), active.create_region(size + 8192)
            po_, oa = rnd.randrange(1, 4096), rnd.randrange(1, 4096)
            src_s, src_r, src_o = (passive, rp, po_) if kind == "read" else (active, ra, oa)
            payload = os.urandom(size)
            src_s.fill(src_r, src_o, payload)
            create = passive.stub.CreateReadable if kind == "read" else passive.stub.CreateWritable
            po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, po_, size)], timeout_ms=60000),
                        timeout=10 * SLOW)
            begin = active.stub.BeginRead if kind == "read" else active.stub.BeginWrite
            op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(ra, oa, size)],
                                               timeout_ms=60000), timeout=10 * SLOW)
            done = active.wait(op.operation_id, 60000)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            dst_s, dst_r, dst_o = (active, ra, oa) if kind == "read" else (passive, rp, po_)
            self.assertTrue(dst_s.peek(dst_r, dst_o, size) == payload, "%s of %d bytes differ" % (kind, size))
            return done

        for size in (1, 4097, (1 << 20) + 3, (3 << 20) + 11):
            self.assertEqual(move(a, b, size, "read").backend, pb.BACKEND_TCP)
            self.assertEqual(move(a, b, size + 5, "write").backend, pb.BACKEND_TCP)
        self.assertEqual(move(a, a, 65537, "read").backend, pb.BACKEND_LOCAL)

        # The fast path: b runs a prepared READ from a several times.
        size = 70001
        rp, ra = a.create_region(size + 64), b.create_region(size + 64)
        po = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rp, 17, size)],
                                                           timeout_ms=60000, any_uses=True), timeout=10 * SLOW)
        fp = rs.FastPath.open("unix:" + b.sock, require_ring=True)
        try:
            h = fp.prepare(rs.OperationKind.READ, po.metadata, [(ra.region_id, 9, size)])
            for _ in range(5):
                payload = os.urandom(size)
                a.fill(rp, 17, payload)
                c = fp.run(h, 30000)
                self.assertEqual((c.code, c.bytes), (0, size), c)
                self.assertTrue(b.peek(ra, 9, size) == payload, "fast-path READ bytes differ")
            fp.unprepare(h)
        finally:
            fp.close()
        a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=po.operation_id), timeout=10 * SLOW)

        # Refusals: tampered metadata (bad signature) and an unknown operation.
        po = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rp, 0, 100)], timeout_ms=60000),
                                   timeout=10 * SLOW)
        text = po.metadata
        body = text[len("rsm1."):]
        i = len(body) // 2
        tampered = "rsm1." + body[:i] + ("A" if body[i] != "A" else "B") + body[i + 1:]
        e = self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED,
                                b.stub.BeginRead, pb.BeginTransferRequest(
                                    metadata=tampered, descriptors=[desc(ra, 0, 100)]), timeout=10 * SLOW)
        self.assertIn("signature", e.details())
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, b.stub.GetOperation,
                            pb.GetOperationRequest(operation_id="op-does-not-exist"), timeout=10 * SLOW)

        # GetInfo, which the harness called before the first scrape, once more on each: a
        # method whose histogram Prometheus saw before and after (so its rate is not 0/0 however
        # fast the calls above were, all between two scrapes).
        a.info()
        b.info()

        # Prometheus has scraped what the test did: the refusal, the fast-path runs, GetInfo.
        def scraped():
            d = prom.query('grpc_server_handled_total{grpc_method="BeginRead",grpc_code="UNAUTHENTICATED"}')
            f = prom.query('rdma_sidecar_fast_path_runs_total{result="complete"} >= 5')
            g = prom.query('increase(grpc_server_handled_total{grpc_method="GetInfo"}[1m]) > 0')
            return bool(d["result"]) and bool(f["result"]) and len(g["result"]) == 2
        wait_until(scraped, 20 * SLOW, "prometheus to scrape the sidecars after the transfers")
        time.sleep(1.5)  # a few more scrapes, so that rate() sees the change between two samples

        with open(os.path.join(MON, "grafana-dashboard.json")) as f:
            dash = json.load(f)
        # The template variables list both sidecars.
        for v in dash["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["definition"])
            self.assertTrue(m, v["definition"])
            sel, label = substitute(m.group(1)), m.group(2)
            got = {s["metric"][label] for s in prom.query("group by (%s) (%s)" % (label, sel))["result"]}
            want = {"rdma-sidecar"} if label == "job" else {"127.0.0.1:%d" % p for p in ports.values()}
            self.assertEqual(got, want, v["definition"])
        panels = [p for p in dash["panels"] if p["type"] != "row"]
        self.assertGreaterEqual(len(panels), 25)
        empty, not_finite = [], []
        for p in panels:
            finite = False
            for t in p["targets"]:
                expr = substitute(t["expr"])
                data = prom.query(expr)
                if not data["result"]:
                    empty.append("%s: %s" % (p["title"], expr))
                finite = finite or bool(finite_values(data))
            if p["title"] in MUST_BE_FINITE and not finite:
                not_finite.append(p["title"])
        self.assertEqual(empty, [], "panels without data")
        self.assertEqual(not_finite, [], "panels without a finite value")
        self.assertEqual(set(MUST_BE_FINITE) - {p["title"] for p in panels}, set())

        # Specific numbers behind the panels.
        tcp = prom.query('sum(increase(rdma_sidecar_bytes_total{backend="tcp",instance="127.0.0.1:%d"}[5m]))'
                         % ports["b"])
        self.assertGreater(finite_values(tcp)[0], 8 << 20)
        le = prom.query('rdma_sidecar_transfer_duration_seconds_bucket{le="10"}')
        self.assertTrue(le["result"], 'le="10" selects a bucket')
        le = prom.query('grpc_server_handling_seconds_bucket{le="0.005",grpc_method="BeginRead"}')
        self.assertTrue(le["result"], 'le="0.005" selects a bucket')
        rails = prom.query('rdma_sidecar_rail_up{backend="tcp"}')["result"]
        self.assertTrue(rails)
        for s in rails:  # stable: an interface or an address, never the ephemeral port
            self.assertNotRegex(s["metric"]["rail"], r":\d+$", s["metric"])
        state = prom.query('rdma_sidecar_nats_connection_state == 1')["result"]
        self.assertEqual(sorted(s["metric"]["state"] for s in state), ["connected", "connected"])
        ib = {x.backend: x for x in b.info().backends}[pb.BACKEND_IBVERBS]
        fb = prom.query('sum(increase(rdma_sidecar_backend_fallbacks_total{reason="unavailable",instance="127.0.0.1:%d"}[5m]))'
                        % ports["b"])
        if not ib.available:  # 8 TCP transfers b began, each a fallback from ibverbs
            self.assertGreater(finite_values(fb)[0], 4)
            wait_until(lambda: any(x["labels"]["alertname"] == "RdmaSidecarTcpFallback"
                                   and x["labels"]["instance"] == "127.0.0.1:%d" % ports["b"]
                                   and x["state"] == "firing"
                                   for x in http_json(prom.url + "/api/v1/alerts")["data"]["alerts"]),
                       10 * SLOW, "RdmaSidecarTcpFallback to fire for b")
        # The alert rules load and evaluate against the real series without error.
        rules = http_json(prom.url + "/api/v1/rules")["data"]["groups"]
        got = {r["name"]: r for g in rules for r in g["rules"]}
        self.assertEqual(len(got), 6)
        wait_until(lambda: all(r.get("lastEvaluation", "").startswith("20") and r["health"] == "ok"
                               for g in http_json(prom.url + "/api/v1/rules")["data"]["groups"]
                               for r in g["rules"]), 10 * SLOW, "the alert rules to evaluate")

        # A picture of the dashboard from this Prometheus, when asked for (docs/operations/img).
        if os.environ.get("SC_DASHBOARD_PNG"):
            r = subprocess.run([sys.executable, os.path.join(MON, "render-dashboard.py"), "--prometheus", prom.url,
                                "-o", os.environ["SC_DASHBOARD_PNG"], "--range", "60", "--rate-interval",
                                RATE_INTERVAL], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        # Every family the sidecars expose is in the metrics reference.
        with open(os.path.join(SRC, "docs", "reference", "metrics.md")) as f:
            doc = f.read()
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % ports["b"], timeout=10) as r:
            families = re.findall(r"^# TYPE (\S+) ", r.read().decode(), re.M)
        self.assertGreater(len(families), 40)
        self.assertEqual([f for f in families if "`%s`" % f not in doc], [],
                         "families missing from docs/reference/metrics.md")


if __name__ == "__main__":
    main()
