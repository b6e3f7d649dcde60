# SPDX-License-Identifier: Apache-2.0
"""The public contract as clients in other languages meet it: both protos generate Go (Debian's
protoc-gen-go and protoc-gen-go-grpc), Java and C# code with no extra flags (no `M` mappings),
into the package names the protos declare; and the readiness header SubscribeMetadata documents
is really sent (checked with plain grpcio against a real sidecar and nats-server)."""
import os
import shutil
import subprocess
import tempfile
import unittest

import grpc
from harness import SLOW, SidecarTest, main, pb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
PROTO = os.path.join(ROOT, "proto")
FILES = ["rdma_sidecar/v1/sidecar.proto", "grpc/health/v1/health.proto"]


def protoc(*args, cwd=None):
    return subprocess.run(["protoc", "-I", PROTO] + list(args), capture_output=True, text=True,
                          timeout=60 * SLOW, cwd=cwd)


class ProtoContractTest(SidecarTest):
    def test_go_without_flags(self):
        if not (shutil.which("protoc-gen-go") and shutil.which("protoc-gen-go-grpc")):
            self.skipTest("protoc-gen-go / protoc-gen-go-grpc not installed (scripts/install-deps.sh)")
        with tempfile.TemporaryDirectory() as out:
            r = protoc("--go_out=" + out, "--go-grpc_out=" + out, *[os.path.join(PROTO, f) for f in FILES])
            self.assertEqual(r.returncode, 0, "protoc-gen-go refused the protos as they are:\n" + r.stderr)
            sidecar = os.path.join(out, "rdma-sidecar/api/go/rdma_sidecar/v1/sidecar.pb.go")
            grpc_go = os.path.join(out, "rdma-sidecar/api/go/rdma_sidecar/v1/sidecar_grpc.pb.go")
            health = os.path.join(out, "google.golang.org/grpc/health/grpc_health_v1/health.pb.go")
            for p in (sidecar, grpc_go, health):
                self.assertTrue(os.path.exists(p), "%s not generated: %s" % (p, sorted(os.listdir(out))))
            with open(sidecar) as f:
                self.assertIn("package sidecarv1", f.read())
            with open(grpc_go) as f:
                text = f.read()
            for method in ("BeginRead", "CancelOperation", "SubscribeMetadata", "ReportProgress"):
                self.assertIn("func (c *sidecarClient) %s(" % method, text)

    def test_java_and_csharp_without_flags(self):
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "java"))
            os.makedirs(os.path.join(out, "cs"))
            r = protoc("--java_out=" + os.path.join(out, "java"), "--csharp_out=" + os.path.join(out, "cs"),
                       *[os.path.join(PROTO, f) for f in FILES])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.exists(os.path.join(out, "java/io/rdmasidecar/v1/SidecarProto.java")))
            self.assertTrue(os.path.exists(os.path.join(out, "java/io/grpc/health/v1/HealthProto.java")))
            with open(os.path.join(out, "cs", "Sidecar.cs")) as f:
                self.assertIn("namespace RdmaSidecar.V1", f.read())

    def test_subscribe_sends_ready_header(self):
        nats = self.nats()
        s = self.sidecar("a", nats_url=nats.url)
        call = s.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="contract.x"), timeout=10 * SLOW)
        self.assertIn(("rdma-sidecar-ready", "1"), [(m.key, m.value) for m in call.initial_metadata()])
        call.cancel()
        # A refused subscription (a subject NATS does not accept) ends with its status, no header.
        bad = s.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="bad subject"), timeout=10 * SLOW)
        with self.assertRaises(grpc.RpcError) as e:
            for _ in bad:
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertNotIn("rdma-sidecar-ready", [m.key for m in (bad.initial_metadata() or ())])


if __name__ == "__main__":
    main()
