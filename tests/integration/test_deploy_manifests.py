# SPDX-License-Identifier: Apache-2.0
"""deploy/: `kubectl kustomize` renders every kustomization (base, examples, overlays/*), and every
rendered object validates against the Kubernetes API schemas of a current release
(tests/k8s/validate.mjs: @kubernetes/client-node's OpenAPI types, strict about unknown fields and
types, plus kubernetes-models' JSON schemas, the Prometheus Operator's PodMonitor schema, and our own
schema for Multus' NetworkAttachmentDefinition in tests/k8s/schemas).
Deliberately broken copies prove the check fails: an unknown field, a wrong type, in rendered
objects and in a copy of the deploy tree itself.
In every rendered pod that holds the sidecar: it is a native sidecar (an initContainers entry with
restartPolicy: Always and a gRPC startupProbe on its health port), every other container's
RDMA_SIDECAR_ADDR (the variable the clients read) equals the sidecar's --grpc-listen and reaches the
same file through the same shared volume, and the socket is the same in every overlay and in the docs.
The gpu-rdma, dra, sriov, efa and job overlays carry what they promise, and so does the peer-identity
component (a csi.cert-manager.io certificate naming the pod, mounted read-only, peer TLS and required
identity on, --id from the pod name), alone and with the others.
Skipped (with the reason) without kubectl (or the standalone kustomize) or the npm tools."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
DEPLOY = os.path.join(SRC, "deploy")
BUILD = os.path.dirname(os.path.abspath(harness.BINARY))
NPM_DIR = os.path.join(BUILD, "npm")
VALIDATE = os.path.join(SRC, "tests", "k8s", "validate.mjs")
# `kubectl kustomize DIR`, or the standalone `kustomize build DIR` where only that is installed.
KUBECTL = shutil.which("kubectl")
RENDER = [KUBECTL, "kustomize"] if KUBECTL else [shutil.which("kustomize"), "build"] if shutil.which("kustomize") else None
# The one socket path: Dockerfile's default, every manifest, every doc.
SOCKET = "/run/rdma-sidecar/sock/sidecar.sock"
WORKLOADS = ("Deployment", "Job", "StatefulSet", "DaemonSet", "ReplicaSet")


def pod_specs(objs):
    """(object, pod spec) of every workload's pod template and every Pod."""
    for o in objs:
        if o["kind"] in WORKLOADS:
            yield o, o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o, o["spec"]


def sidecar_settings(side, objs):
    """The sidecar's effective flags as {env twin: value}: its envFrom ConfigMaps, then env (values
    only), then args (flags win), the way the sidecar reads them."""
    cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    out = {}
    for ref in side.get("envFrom", []):
        out.update(cms[ref["configMapRef"]["name"]])
    for e in side.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
    args = list(side.get("args", []))
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if not eq:
                i += 1
                value = args[i]
            out["RDMA_SIDECAR_" + name.upper().replace("-", "_")] = value
        i += 1
    return out


def seconds(duration):
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert m, duration
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def volume_path(container, path):
    """(volume name, path inside it) by which container reaches path (the longest mount above it)."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path.startswith(mp + "/") and (best is None or len(mp) > len(best["mountPath"].rstrip("/"))):
            best = m
    assert best, "%s reaches %s through no volume" % (container["name"], path)
    return best["name"], os.path.relpath(path, best["mountPath"])


def kustomizations(root):
    """Every directory under root whose kustomization.yaml is a Kustomization (not a Component)."""
    out = []
    for d, _, files in os.walk(root):
        if "kustomization.yaml" in files:
            with open(os.path.join(d, "kustomization.yaml")) as f:
                if yaml.safe_load(f).get("kind") == "Kustomization":
                    out.append(d)
    return sorted(out)


class DeployManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not RENDER:
            raise unittest.SkipTest("neither kubectl nor kustomize installed (scripts/install-deps.sh installs kubectl "
                                    "where apt has it)")
        r = subprocess.run(["bash", os.path.join(SRC, "tests", "node", "install.sh"), NPM_DIR],
                           capture_output=True, text=True, timeout=400)
        if r.returncode in (2, 3):
            raise unittest.SkipTest("npm tools: " + (r.stdout + r.stderr).strip())
        assert r.returncode == 0, r.stdout + r.stderr
        cls.tmp = tempfile.mkdtemp(prefix="sc-deploy-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)

    rendered = {}

    def render(self, path):
        # The deploy tree does not change while the test runs: render each directory once.
        if path.startswith(DEPLOY) and path in self.rendered:
            return self.rendered[path]
        r = subprocess.run(RENDER + [path], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, "%s %s: %s" % (" ".join(RENDER), path, r.stderr))
        if path.startswith(DEPLOY):
            self.rendered[path] = r.stdout
        return r.stdout

    def validate(self, text, name):
        path = os.path.join(self.tmp, name + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run(["node", VALIDATE, path], capture_output=True, text=True, timeout=120, cwd=NPM_DIR)
        return r.returncode, r.stdout + r.stderr

    def objects(self, text):
        return [o for o in yaml.safe_load_all(text) if o]

    def test_every_kustomization_renders_and_validates(self):
        dirs = kustomizations(DEPLOY)
        rel = [os.path.relpath(d, DEPLOY) for d in dirs]
        for want in ("base", "examples", os.path.join("overlays", "gpu-rdma"), os.path.join("overlays", "gpu-rdma-rails"),
                     os.path.join("overlays", "peer-identity"), os.path.join("overlays", "job"),
                     os.path.join("overlays", "dra"), os.path.join("overlays", "sriov"), os.path.join("overlays", "efa"),
                     os.path.join("cluster", "dra")):
            self.assertIn(want, rel)
        for d, name in zip(dirs, rel):
            rc, out = self.validate(self.render(d), name.replace(os.sep, "_"))
            self.assertEqual(rc, 0, "%s: %s" % (name, out))
            self.assertIn("OK ", out)
            print("%s: %s" % (name, out.strip()))

    def test_gpu_rdma_rails_overlay_contents(self):
        """An 8-GPU / 8-NIC node: the worker takes eight GPUs, the sidecar one RDMA resource per
        rail (and not the single shared one), and uses every port it gets (--ib-devices auto)."""
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "gpu-rdma-rails")))
        stage = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")
        pod = stage["spec"]["template"]["spec"]
        c = {x["name"]: x for x in pod["initContainers"] + pod["containers"]}
        self.assertEqual(c["worker"]["resources"]["limits"]["nvidia.com/gpu"], "8")
        limits = c["rdma-sidecar"]["resources"]["limits"]
        self.assertEqual(sorted(k for k in limits if k.startswith("rdma/")), ["rdma/rail%d" % i for i in range(8)])
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("rdma-sidecar-config"))
        self.assertEqual(cm["data"]["RDMA_SIDECAR_IB_DEVICES"], "auto")
        self.assertEqual(cm["data"]["RDMA_SIDECAR_IB_DEVICE"], "")
        self.assertEqual(c["rdma-sidecar"]["envFrom"][0]["configMapRef"]["name"], cm["metadata"]["name"])

    def test_gpu_rdma_overlay_contents(self):
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "gpu-rdma")))
        by_kind = {}
        for o in objs:
            by_kind.setdefault(o["kind"], []).append(o)
            self.assertEqual(o["metadata"].get("namespace"), "rdma-demo", o["metadata"]["name"])
        stage = next(o for o in by_kind["Deployment"] if o["metadata"]["name"] == "pipeline-stage")
        spec = stage["spec"]["template"]["spec"]
        self.assertTrue(spec["shareProcessNamespace"])
        c = {x["name"]: x for x in spec["initContainers"] + spec["containers"]}
        self.assertEqual(c["worker"]["resources"]["limits"]["nvidia.com/gpu"], "1")
        side = c["rdma-sidecar"]
        env = {e["name"]: e for e in side["env"]}
        self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all")
        self.assertEqual(env["RDMA_SIDECAR_ADVERTISE"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertEqual(side["resources"]["limits"]["rdma/rdma_shared_device_a"], "1")
        self.assertIn("IPC_LOCK", side["securityContext"]["capabilities"]["add"])
        self.assertEqual({p["name"]: p["containerPort"] for p in side["ports"]},
                         {"data": 50052, "health": 50053, "metrics": 9464})
        cm = next(o for o in by_kind["ConfigMap"] if o["metadata"]["name"].startswith("rdma-sidecar-config"))
        self.assertEqual(cm["data"]["RDMA_SIDECAR_METRICS_LISTEN"], "0.0.0.0:9464")
        self.assertEqual(cm["data"]["RDMA_SIDECAR_IB_DEVICE"], "mlx5_0")
        self.assertEqual(cm["data"]["RDMA_SIDECAR_HEALTH_LISTEN"], "0.0.0.0:50053")
        # The pod's envFrom names the generated (hashed) ConfigMap.
        self.assertEqual(side["envFrom"][0]["configMapRef"]["name"], cm["metadata"]["name"])
        np = by_kind["NetworkPolicy"][0]["spec"]
        rules = {r["ports"][0]["port"]: r["from"][0] for r in np["ingress"]}
        self.assertEqual(rules[50052], {"podSelector": {"matchLabels": {"rdma-sidecar.io/pipeline": "demo"}}})
        self.assertIn("ipBlock", rules[50053])
        self.assertEqual(stage["spec"]["template"]["metadata"]["labels"]["rdma-sidecar.io/pipeline"], "demo")
        pm = by_kind["PodMonitor"][0]["spec"]
        self.assertEqual(pm["podMetricsEndpoints"][0]["port"], "metrics")

    def check_peer_identity(self, objs, namespace):
        """The peer-identity component's promises, in rendered objects."""
        by_kind = {}
        for o in objs:
            by_kind.setdefault(o["kind"], []).append(o)
        stage = next(o for o in by_kind["Deployment"] if o["metadata"]["name"] == "pipeline-stage")
        spec = stage["spec"]["template"]["spec"]
        c = {x["name"]: x for x in spec["initContainers"] + spec["containers"]}
        side = c["rdma-sidecar"]
        # --id is the pod's name (downward API), the name csi-driver puts into the URI SAN.
        env = {e["name"]: e for e in side["env"]}
        self.assertEqual(env["RDMA_SIDECAR_ID"], {"name": "RDMA_SIDECAR_ID",
                                                  "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        # The CSI volume: cert-manager's driver, read-only, a URI SAN naming the pod.
        vol = next(v for v in spec["volumes"] if v["name"] == "peer-tls")
        csi = vol["csi"]
        self.assertEqual(csi["driver"], "csi.cert-manager.io")
        self.assertTrue(csi["readOnly"])
        attrs = csi["volumeAttributes"]
        self.assertEqual(attrs["csi.cert-manager.io/uri-sans"],
                         "spiffe://cluster.local/ns/${POD_NAMESPACE}/pod/${POD_NAME}")
        self.assertEqual(attrs["csi.cert-manager.io/common-name"], "${POD_NAME}")
        self.assertEqual(attrs["csi.cert-manager.io/issuer-name"], "rdma-sidecar-peer-ca")
        self.assertEqual(attrs["csi.cert-manager.io/issuer-kind"], "Issuer")
        self.assertIn("client auth", attrs["csi.cert-manager.io/key-usages"])
        self.assertIn("server auth", attrs["csi.cert-manager.io/key-usages"])
        # The files are readable by the sidecar's group (its uid/gid from the pod's securityContext).
        self.assertEqual(spec["securityContext"]["runAsGroup"], 65532)
        self.assertNotIn("runAsGroup", side["securityContext"])
        self.assertEqual(attrs["csi.cert-manager.io/fs-group"], "65532")
        # Mounted read-only into the sidecar only; the worker never sees the key.
        mounts = {m["name"]: m for m in side["volumeMounts"]}
        self.assertTrue(mounts["peer-tls"]["readOnly"])
        path = mounts["peer-tls"]["mountPath"]
        self.assertNotIn("peer-tls", [m["name"] for m in c["worker"].get("volumeMounts", [])])
        # The flags (environment twins in the generated ConfigMap the sidecar's envFrom names).
        cm = next(o for o in by_kind["ConfigMap"] if o["metadata"]["name"] == side["envFrom"][0]["configMapRef"]["name"])
        d = cm["data"]
        self.assertEqual(d["RDMA_SIDECAR_PEER_TLS_CERT"], path + "/" + attrs["csi.cert-manager.io/certificate-file"])
        self.assertEqual(d["RDMA_SIDECAR_PEER_TLS_KEY"], path + "/" + attrs["csi.cert-manager.io/privatekey-file"])
        self.assertEqual(d["RDMA_SIDECAR_PEER_TLS_CA"], path + "/" + attrs["csi.cert-manager.io/ca-file"])
        self.assertEqual(d["RDMA_SIDECAR_PEER_IDENTITY"], "spiffe")
        self.assertEqual(d["RDMA_SIDECAR_PEER_IDENTITY_REQUIRED"], "true")
        self.assertEqual(d["RDMA_SIDECAR_TLS_RELOAD_INTERVAL"], "10s")
        for o in objs:
            self.assertEqual(o["metadata"].get("namespace"), namespace, o["metadata"]["name"])
        return by_kind, side, spec

    def test_peer_identity_overlay(self):
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "peer-identity")))
        by_kind, side, _ = self.check_peer_identity(objs, "rdma-demo")
        # The CA Issuer the volume names exists, signing with the CA Certificate's Secret.
        issuers = {o["metadata"]["name"]: o for o in by_kind["Issuer"]}
        ca = issuers["rdma-sidecar-peer-ca"]["spec"]["ca"]
        cert = next(o for o in by_kind["Certificate"] if o["spec"]["secretName"] == ca["secretName"])
        self.assertTrue(cert["spec"]["isCA"])
        self.assertIn("selfSigned", issuers[cert["spec"]["issuerRef"]["name"]]["spec"])
        # The base's settings stay (merge, not replace).
        cm = next(o for o in by_kind["ConfigMap"] if o["metadata"]["name"].startswith("rdma-sidecar-config"))
        self.assertEqual(cm["data"]["RDMA_SIDECAR_KEY_FILE"], "/etc/rdma-sidecar/secret/keys")
        self.assertEqual(cm["data"]["RDMA_SIDECAR_NATS_URL"], "nats://nats:4222")

    def test_peer_identity_component_composes(self):
        # The component on the bare base, and beside the gpu-rdma overlay's own components: it
        # renders, validates, and keeps its promises and theirs.
        for name, resource, namespace in (("base", "base", None), ("gpu-rdma", os.path.join("overlays", "gpu-rdma"), "rdma-demo")):
            d = os.path.join(self.tmp, "compose-" + name)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [os.path.relpath(os.path.join(DEPLOY, resource), d)],
                                "components": [os.path.relpath(os.path.join(DEPLOY, "components", "peer-identity"), d)]}, f)
            text = self.render(d)
            rc, out = self.validate(text, "compose-" + name)
            self.assertEqual(rc, 0, "%s: %s" % (name, out))
            _, side, spec = self.check_peer_identity(self.objects(text), namespace)
            if name == "gpu-rdma":
                env = {e["name"]: e for e in side["env"]}
                self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"]["value"], "all")
                self.assertEqual(env["RDMA_SIDECAR_ADVERTISE"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
                self.assertTrue(spec["shareProcessNamespace"])
                self.assertIn("metrics", [p["name"] for p in side["ports"]])

    def test_peer_identity_broken_copies_fail(self):
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "peer-identity")))

        def mutated(fn, name):
            copy = [yaml.safe_load(yaml.safe_dump(o)) for o in objs]
            fn({(o["kind"], o["metadata"]["name"]): o for o in copy})
            return self.validate(yaml.safe_dump_all(copy), name)

        def csi(o):
            spec = o[("Deployment", "pipeline-stage")]["spec"]["template"]["spec"]
            return next(v for v in spec["volumes"] if v["name"] == "peer-tls")["csi"]

        cases = [
            ("csi-readonly-text", lambda o: csi(o).__setitem__("readOnly", "true"), "readOnly: wrong type"),
            ("csi-unknown-field", lambda o: csi(o).__setitem__("volumeAttribute", {}), "volumeAttribute: unknown field"),
            ("csi-attr-number", lambda o: csi(o)["volumeAttributes"].__setitem__("csi.cert-manager.io/fs-group", 65532),
             "wrong type: number 65532, want string"),
            ("ca-cert-isca-text", lambda o: o[("Certificate", "rdma-sidecar-peer-ca")]["spec"].__setitem__("isCA", "yes"),
             "isCA must be boolean"),
            ("issuer-no-spec", lambda o: o[("Issuer", "rdma-sidecar-peer-ca")].pop("spec"),
             "Issuer/rdma-sidecar-peer-ca: data must have required property spec"),
        ]
        for name, mutate, needle in cases:
            rc, out = mutated(mutate, name)
            self.assertEqual(rc, 1, "%s: validated?! %s" % (name, out))
            self.assertIn(needle, out, name)

    def broken(self, mutate, name):
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "gpu-rdma")))
        mutate({(o["kind"], o["metadata"]["name"].split("-")[0]): o for o in objs})
        return self.validate(yaml.safe_dump_all(objs), name)

    def test_broken_copies_fail(self):
        def side(objs):
            spec = objs[("Deployment", "pipeline")]["spec"]["template"]["spec"]
            return next(c for c in spec["initContainers"] if c["name"] == "rdma-sidecar")

        cases = [
            ("unknown-container-field", lambda o: side(o).__setitem__("imagePullPolicyy", "Always"),
             "imagePullPolicyy: unknown field"),
            ("unknown-pod-field", lambda o: o[("Deployment", "pipeline")]["spec"]["template"]["spec"]
             .__setitem__("shareProcessNamespaces", True), "shareProcessNamespaces: unknown field"),
            ("port-as-text", lambda o: side(o)["ports"][0].__setitem__("containerPort", "50052"),
             "containerPort: wrong type: string \"50052\", want"),
            ("env-value-number", lambda o: side(o)["env"][0].__setitem__("value", 1),
             ".value: wrong type: number 1, want string"),
            ("netpol-unknown", lambda o: o[("NetworkPolicy", "pipeline")]["spec"].__setitem__("ingres", []),
             "spec.ingres: unknown field"),
            ("podmonitor-type", lambda o: o[("PodMonitor", "rdma")]["spec"].__setitem__("podMetricsEndpoints", "metrics"),
             "podMetricsEndpoints must be array"),
            ("replicas-text", lambda o: o[("Deployment", "pipeline")]["spec"].__setitem__("replicas", "two"),
             "spec.replicas: wrong type"),
        ]
        for name, mutate, needle in cases:
            rc, out = self.broken(mutate, name)
            self.assertEqual(rc, 1, "%s: validated?! %s" % (name, out))
            self.assertIn(needle, out, name)

    def test_broken_deploy_tree_copy_fails(self):
        # A typo in an overlay's own patch (the operator's likely mistake): kubectl kustomize
        # renders it without complaint, the validator refuses it.
        tree = os.path.join(self.tmp, "deploy")
        shutil.copytree(DEPLOY, tree)
        patch = os.path.join(tree, "overlays", "gpu-rdma", "gpu-rdma-patch.yaml")
        with open(patch) as f:
            text = f.read()
        self.assertIn("      shareProcessNamespace: true\n", text)
        with open(patch, "w") as f:
            f.write(text.replace("      shareProcessNamespace: true\n", "      shareProcessNamspace: true\n"))
        rc, out = self.validate(self.render(os.path.join(tree, "overlays", "gpu-rdma")), "tree-typo")
        self.assertEqual(rc, 1, out)
        self.assertIn("spec.template.spec.shareProcessNamspace: unknown field", out)


    def check_pod_shape(self, objs, where):
        """The native-sidecar shape and the one address, in every pod of objs that holds the
        sidecar; returns how many such pods there were."""
        n = 0
        for o, spec in pod_specs(objs):
            name = "%s: %s/%s" % (where, o["kind"], o["metadata"]["name"])
            inits = {c["name"]: c for c in spec.get("initContainers", [])}
            mains = {c["name"]: c for c in spec["containers"]}
            if "rdma-sidecar" not in inits and "rdma-sidecar" not in mains:
                continue
            n += 1
            # A native sidecar: an init container that keeps running, not one of the containers
            # (an overlay patching `containers:` by name would have added a second, bare one).
            self.assertNotIn("rdma-sidecar", mains, name + ": the sidecar is an ordinary container")
            side = inits["rdma-sidecar"]
            self.assertEqual(side.get("restartPolicy"), "Always", name)
            self.assertEqual(list(inits)[0], "rdma-sidecar", name + ": init containers before the sidecar delay it")
            flags = sidecar_settings(side, objs)
            health = flags["RDMA_SIDECAR_HEALTH_LISTEN"]
            self.assertTrue(health.startswith("0.0.0.0:"), name + ": " + health)
            port = int(health.rsplit(":", 1)[1])
            probe = side["startupProbe"]
            self.assertEqual(probe["grpc"]["port"], port, name + ": the startupProbe probes another port")
            self.assertGreaterEqual(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3), 30, name)
            for p in ("readinessProbe", "livenessProbe"):
                self.assertEqual(side[p]["grpc"]["port"], port, name + " " + p)
            # The API listener: the one socket; every other container dials it through the same
            # shared emptyDir.
            listen = flags["RDMA_SIDECAR_GRPC_LISTEN"]
            self.assertEqual(listen, "unix:" + SOCKET, name)
            vol = volume_path(side, SOCKET)
            volumes = {v["name"]: v for v in spec["volumes"]}
            self.assertIn("emptyDir", volumes[vol[0]], name)
            self.assertEqual(mains.keys() - {"worker"}, set(), name + ": containers other than the worker")
            for c in mains.values():
                env = {e["name"]: e for e in c.get("env", [])}
                self.assertIn("RDMA_SIDECAR_ADDR", env, "%s: %s has no RDMA_SIDECAR_ADDR" % (name, c["name"]))
                self.assertNotIn("SIDECAR_ADDR", env, name)
                addr = env["RDMA_SIDECAR_ADDR"]["value"]
                self.assertEqual(addr, listen, "%s: %s dials %s, the sidecar listens on %s" % (name, c["name"], addr, listen))
                self.assertEqual(volume_path(c, addr[len("unix:"):]), vol, name + ": not the sidecar's socket file")
                self.assertEqual(volume_path(c, "/dev/shm/x"), volume_path(side, "/dev/shm/x"), name + ": /dev/shm")
            # Termination: the worker first, then the sidecar drains within its grace period,
            # both inside the pod's one terminationGracePeriodSeconds.
            grace = seconds(flags["RDMA_SIDECAR_GRACE_PERIOD"])
            tgp = spec["terminationGracePeriodSeconds"]
            self.assertGreaterEqual(tgp, grace + 30, "%s: terminationGracePeriodSeconds %d < the sidecar's grace period "
                                    "%g s + 30 s for the worker" % (name, tgp, grace))
        return n

    def test_native_sidecar_and_one_address_everywhere(self):
        sockets = set()
        for d in kustomizations(DEPLOY):
            rel = os.path.relpath(d, DEPLOY)
            objs = self.objects(self.render(d))
            n = self.check_pod_shape(objs, rel)
            if not rel.startswith("cluster"):  # deploy/cluster: cluster-scoped objects, no pods
                self.assertGreaterEqual(n, 1, rel + ": no pod with the sidecar")
            print("%s: %d pod(s): native sidecar, RDMA_SIDECAR_ADDR = unix:%s" % (rel, n, SOCKET))
        # The Dockerfile's default and every socket path the docs, the deploy tree and the image
        # test name under /run/rdma-sidecar are that one path.
        paths = [os.path.join(SRC, "Dockerfile"), os.path.join(SRC, "README.md"),
                 os.path.join(SRC, "tests", "image", "test_image.py")]
        for root in (os.path.join(SRC, "docs"), DEPLOY):
            for dp, _, files in os.walk(root):
                paths += [os.path.join(dp, f) for f in files if f.endswith((".md", ".yaml", ".yml"))]
        for path in paths:
            with open(path) as f:
                for m in re.finditer(r"/run/rdma-sidecar/[\w./-]*\.sock\b", f.read()):
                    sockets.add((m.group(0), os.path.relpath(path, SRC)))
        self.assertEqual({s for s, _ in sockets}, {SOCKET}, sorted(sockets))
        with open(os.path.join(SRC, "Dockerfile")) as f:
            self.assertIn("RDMA_SIDECAR_GRPC_LISTEN=unix:" + SOCKET, f.read())

    def test_pod_shape_check_catches_mistakes(self):
        """check_pod_shape itself: each mistake the issue found, put back into a rendered copy,
        is caught with a message that says what."""
        text = self.render(os.path.join(DEPLOY, "overlays", "gpu-rdma"))

        def spec(objs):
            return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")["spec"]["template"]["spec"]

        def worker_env(objs):
            return {e["name"]: e for e in spec(objs)["containers"][0]["env"]}

        def old_sidecar(objs):
            sp = spec(objs)
            side = sp.pop("initContainers")[0]
            side.pop("restartPolicy")
            sp["containers"].append(side)

        def other_socket(objs):
            worker_env(objs)["RDMA_SIDECAR_ADDR"]["value"] = "unix:/run/rdma-sidecar/sidecar.sock"

        def other_volume(objs):
            sp = spec(objs)
            sp["volumes"].append({"name": "own", "emptyDir": {}})
            for m in sp["containers"][0]["volumeMounts"]:
                if m["mountPath"] == "/run/rdma-sidecar":
                    m["name"] = "own"

        def listener_arg(objs):
            spec(objs)["initContainers"][0]["args"] = ["--grpc-listen", "unix:/run/rdma-sidecar/sock/other.sock"]

        cases = [
            ("old-variable", lambda o: worker_env(o)["RDMA_SIDECAR_ADDR"].__setitem__("name", "SIDECAR_ADDR"),
             "worker has no RDMA_SIDECAR_ADDR"),
            ("ordinary-container", old_sidecar, "the sidecar is an ordinary container"),
            ("no-restart-policy", lambda o: spec(o)["initContainers"][0].pop("restartPolicy"), "None != 'Always'"),
            ("probe-port", lambda o: spec(o)["initContainers"][0]["startupProbe"]["grpc"].__setitem__("port", 50052),
             "the startupProbe probes another port"),
            ("other-socket", other_socket, "worker dials unix:/run/rdma-sidecar/sidecar.sock"),
            ("other-volume", other_volume, "not the sidecar's socket file"),
            ("listener-flag", listener_arg, "/run/rdma-sidecar/sock/other.sock"),
            ("short-grace", lambda o: spec(o).__setitem__("terminationGracePeriodSeconds", 30),
             "terminationGracePeriodSeconds 30 < the sidecar's grace period 20 s + 30 s for the worker"),
        ]
        self.check_pod_shape(self.objects(text), "gpu-rdma")
        for name, mutate, needle in cases:
            objs = self.objects(text)
            mutate(objs)
            with self.assertRaises(AssertionError, msg=name) as cm:
                self.check_pod_shape(objs, name)
            self.assertIn(needle, str(cm.exception), name)

    def test_job_overlay(self):
        """A Job whose pod is the base pod (copied, not rewritten) with a worker that ends: the
        sidecar does not keep it running (native sidecar), the pod never restarts."""
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "job")))
        self.assertEqual([o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage"], [])
        job = next(o for o in objs if o["kind"] == "Job")
        spec = job["spec"]["template"]["spec"]
        self.assertEqual(spec["restartPolicy"], "Never")
        self.assertEqual(self.check_pod_shape([job] + [o for o in objs if o["kind"] == "ConfigMap"], "job"), 1)
        base = self.objects(self.render(os.path.join(DEPLOY, "examples")))
        stage = next(o for o in base if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")
        bspec = stage["spec"]["template"]["spec"]
        for k in ("initContainers", "volumes", "securityContext", "terminationGracePeriodSeconds"):
            self.assertEqual(spec[k], bspec[k], k)
        worker = spec["containers"][0]
        bworker = bspec["containers"][0]
        self.assertEqual((worker["env"], worker["volumeMounts"]), (bworker["env"], bworker["volumeMounts"]))
        self.assertTrue(worker["command"])

    def test_dra_overlay(self):
        """DRA: a DeviceClass for dranet's RDMA NICs; per rail a template pairing a GPU
        (gpu.nvidia.com) with a NIC on its PCIe root; the worker holds every rail's GPU, the sidecar
        every rail's GPU (the same devices) and NIC; no device-plugin resources; if:net1 advertised."""
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "dra")))
        self.assertEqual([o for o in objs if o["kind"] == "DeviceClass"], [], "cluster-scoped: deploy/cluster/dra")
        dc = self.objects(self.render(os.path.join(DEPLOY, "cluster", "dra")))
        self.assertEqual([o["metadata"]["name"] for o in dc], ["rdma-nic"])
        self.assertEqual(dc[0]["apiVersion"], "resource.k8s.io/v1")
        self.assertNotIn("namespace", dc[0]["metadata"])  # cluster-scoped
        exprs = " && ".join(s["cel"]["expression"] for s in dc[0]["spec"]["selectors"])
        self.assertIn('device.driver == "dra.net"', exprs)
        self.assertIn('device.attributes["dra.net"].rdma', exprs)
        rails = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceClaimTemplate"}
        self.assertGreaterEqual(len(rails), 2)
        stage = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")
        spec = stage["spec"]["template"]["spec"]
        self.assertTrue(spec["shareProcessNamespace"])
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in spec["resourceClaims"]}
        self.assertEqual(set(claims.values()), set(rails))
        side = spec["initContainers"][0]
        worker = spec["containers"][0]
        sclaims = {(c["name"], c["request"]) for c in side["resources"]["claims"]}
        wclaims = {(c["name"], c["request"]) for c in worker["resources"]["claims"]}
        ifnames = set()
        for claim, tname in claims.items():
            t = rails[tname]["spec"]["spec"]["devices"]
            req = {r["name"]: r["exactly"]["deviceClassName"] for r in t["requests"]}
            self.assertEqual(req, {"gpu": "gpu.nvidia.com", "nic": "rdma-nic"}, tname)
            self.assertIn({"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}, t["constraints"])
            cfg = next(c for c in t["config"] if c["requests"] == ["nic"])["opaque"]
            self.assertEqual(cfg["driver"], "dra.net")
            ifnames.add(cfg["parameters"]["interface"]["name"])
            self.assertIn((claim, "gpu"), wclaims)
            self.assertNotIn((claim, "nic"), wclaims)
            self.assertIn((claim, "gpu"), sclaims)
            self.assertIn((claim, "nic"), sclaims)
        self.assertEqual(len(ifnames), len(rails))
        self.assertIn("net1", ifnames)
        for c in (side, worker):
            self.assertEqual([k for k in c["resources"].get("limits", {}) if "/" in k], [], c["name"])
        self.assertNotIn("NVIDIA_VISIBLE_DEVICES", {e["name"] for e in side.get("env", [])})
        flags = sidecar_settings(side, objs)
        self.assertEqual(flags["RDMA_SIDECAR_ADVERTISE"], "if:net1")
        self.assertEqual([e for e in side["env"] if e["name"] == "RDMA_SIDECAR_ADVERTISE"],
                         [{"name": "RDMA_SIDECAR_ADVERTISE", "value": "if:net1"}])
        self.assertEqual(flags["RDMA_SIDECAR_IB_DEVICES"], "auto")

    def test_sriov_overlay(self):
        """SR-IOV + Multus: the NetworkAttachmentDefinition (sriov, then the RDMA CNI) the pod
        annotation attaches as net1, the VF resource it names requested by the sidecar, and the
        sidecar advertising if:net1."""
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "sriov")))
        nads = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkAttachmentDefinition"}
        stage = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")
        nets = json.loads(stage["spec"]["template"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"])
        self.assertEqual(nets, [{"name": "rdma-rail0", "interface": "net1"}])
        nad = nads["rdma-rail0"]
        self.assertEqual(nad["metadata"]["namespace"], stage["metadata"]["namespace"])
        conf = json.loads(nad["spec"]["config"])
        self.assertEqual(conf["name"], "rdma-rail0")
        types = [p["type"] for p in conf["plugins"]]
        self.assertEqual(types[:2], ["sriov", "rdma"])
        resource = nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
        side = stage["spec"]["template"]["spec"]["initContainers"][0]
        limits = side["resources"]["limits"]
        self.assertEqual(limits[resource], "1")
        self.assertNotIn("rdma/rdma_shared_device_a", limits)
        flags = sidecar_settings(side, objs)
        self.assertEqual(flags["RDMA_SIDECAR_ADVERTISE"], "if:" + nets[0]["interface"])
        self.assertEqual(flags["RDMA_SIDECAR_IB_DEVICE"], "")
        self.assertNotIn("valueFrom", next(e for e in side["env"] if e["name"] == "RDMA_SIDECAR_ADVERTISE"))

    def test_efa_overlay(self):
        objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", "efa")))
        stage = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "pipeline-stage")
        side = stage["spec"]["template"]["spec"]["initContainers"][0]
        self.assertEqual(side["args"], ["--backends", "libfabric,tcp", "--ofi-provider", "efa"])
        flags = sidecar_settings(side, objs)
        self.assertEqual(flags["RDMA_SIDECAR_BACKENDS"], "libfabric,tcp")
        res = side["resources"]
        self.assertTrue(int(res["limits"]["vpc.amazonaws.com/efa"]) >= 1)
        self.assertEqual(res["requests"]["hugepages-2Mi"], res["limits"]["hugepages-2Mi"])
        self.assertEqual([k for k in res["limits"] if k.startswith("rdma/")], [])
        self.assertIn("IPC_LOCK", side["securityContext"]["capabilities"]["add"])

    def test_new_overlays_broken_copies_fail(self):
        def case(overlay, mutate, name):
            objs = self.objects(self.render(os.path.join(DEPLOY, "overlays", overlay)))
            if overlay == "dra":
                objs += self.objects(self.render(os.path.join(DEPLOY, "cluster", "dra")))
            mutate({(o["kind"], o["metadata"]["name"]): o for o in objs})
            return self.validate(yaml.safe_dump_all(objs), name)

        def side(o, name="pipeline-stage", kind="Deployment"):
            return o[(kind, name)]["spec"]["template"]["spec"]["initContainers"][0]

        def nad_config(text):
            return lambda o: o[("NetworkAttachmentDefinition", "rdma-rail0")]["spec"].__setitem__("config", text)

        cases = [
            ("dra", lambda o: o[("ResourceClaimTemplate", "rail0")]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
             .__setitem__("deviceClass", "gpu.nvidia.com"), "deviceClass: unknown field"),
            ("dra", lambda o: o[("DeviceClass", "rdma-nic")]["spec"]["selectors"][0].__setitem__("cel", "device.driver"),
             "cel: wrong type"),
            ("dra", lambda o: side(o)["resources"]["claims"][0].__setitem__("requests", "gpu"),
             "requests: unknown field"),
            ("job", lambda o: side(o, "pipeline-job", "Job").__setitem__("restartPolicy", True),
             "restartPolicy: wrong type"),
            ("sriov", nad_config('{"cniVersion": "0.4.0", "name": "x", "plugins": [{"typ": "sriov"}]}'),
             "(its JSON) /plugins/0 must have required property 'type'"),
            ("sriov", nad_config("not json"), "/spec/config is not JSON"),
            ("sriov", lambda o: o[("NetworkAttachmentDefinition", "rdma-rail0")]["spec"].__setitem__("confg", "{}"),
             '/spec must NOT have additional properties: "confg"'),
            ("sriov", lambda o: o[("NetworkAttachmentDefinition", "rdma-rail0")]["metadata"].__setitem__("labelz", {}),
             "metadata.labelz: unknown field"),
            ("efa", lambda o: side(o)["resources"]["limits"].__setitem__("vpc.amazonaws.com/efa", 4),
             "wrong type"),
        ]
        for overlay, mutate, needle in cases:
            rc, out = case(overlay, mutate, "broken-" + overlay)
            self.assertEqual(rc, 1, "%s %s: validated?! %s" % (overlay, needle, out))
            self.assertIn(needle, out, overlay)


if __name__ == "__main__":
    unittest.main(verbosity=2)
