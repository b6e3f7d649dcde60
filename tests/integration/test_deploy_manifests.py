# SPDX-License-Identifier: Apache-2.0
"""deploy/: `kubectl kustomize` renders every kustomization (base, examples, overlays/*), and every
rendered object validates against the Kubernetes API schemas of a current release
(tests/k8s/validate.mjs: @kubernetes/client-node's OpenAPI types, strict about unknown fields and
types, plus kubernetes-models' JSON schemas and the Prometheus Operator's PodMonitor schema).
Deliberately broken copies prove the check fails: an unknown field, a wrong type, in rendered
objects and in a copy of the deploy tree itself. The gpu-rdma overlay carries what it promises, and
so does the peer-identity component (a csi.cert-manager.io certificate naming the pod, mounted
read-only, peer TLS and required identity on, --id from the pod name), alone and with the others.
Skipped (with the reason) without kubectl or the npm tools."""
import os
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
KUBECTL = shutil.which("kubectl")


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
        if not KUBECTL:
            raise unittest.SkipTest("kubectl not installed (scripts/install-deps.sh installs it where apt has it)")
        r = subprocess.run(["bash", os.path.join(SRC, "tests", "node", "install.sh"), NPM_DIR],
                           capture_output=True, text=True, timeout=400)
        if r.returncode in (2, 3):
            raise unittest.SkipTest("npm tools: " + (r.stdout + r.stderr).strip())
        assert r.returncode == 0, r.stdout + r.stderr
        cls.tmp = tempfile.mkdtemp(prefix="sc-deploy-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "tmp", ""), ignore_errors=True)

    def render(self, path):
        r = subprocess.run([KUBECTL, "kustomize", path], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, "kubectl kustomize %s: %s" % (path, r.stderr))
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
                     os.path.join("overlays", "peer-identity")):
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
        c = {x["name"]: x for x in stage["spec"]["template"]["spec"]["containers"]}
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
        c = {x["name"]: x for x in spec["containers"]}
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
        self.assertEqual(rules["data"], {"podSelector": {"matchLabels": {"rdma-sidecar.io/pipeline": "demo"}}})
        self.assertIn("ipBlock", rules["health"])
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
        c = {x["name"]: x for x in spec["containers"]}
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
            return next(c for c in spec["containers"] if c["name"] == "rdma-sidecar")

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
