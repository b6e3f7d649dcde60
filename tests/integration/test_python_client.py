# SPDX-License-Identifier: Apache-2.0
"""The Python client package (clients/python, package rdma_sidecar).

1. Its generated modules match a fresh protoc run on proto/ as it is now: the ones in the tree
   (written by the CMake build) and the ones `pip install --no-build-isolation` ships (installed
   offline into a temporary directory, then imported from there in a fresh interpreter).
2. Its pytest suite (clients/python/tests) against real sidecars and a real nats-server, with
   Debian's python3-pytest; "no tests collected" (exit code 5) counts as a failure.
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
PKG = os.path.join(ROOT, "clients", "python")
PROTO = os.path.join(ROOT, "proto")
PY = "/usr/bin/python3"
SLOW = float(os.environ.get("SC_TEST_SLOW", "1"))
GENERATED = ["rdma_sidecar/v1/sidecar_pb2.py", "rdma_sidecar/v1/sidecar_pb2_grpc.py",
             "rdma_sidecar/_health/health_pb2.py", "rdma_sidecar/_health/health_pb2_grpc.py"]


def fresh_protoc(out):
    """protoc + grpc_python_plugin on proto/, written here independently of generate.py."""
    plugin = "--plugin=protoc-gen-grpc=" + shutil.which("grpc_python_plugin")
    subprocess.run(["protoc", "--proto_path=" + PROTO, "--python_out=" + out, "--grpc_out=" + out, plugin,
                    os.path.join(PROTO, "rdma_sidecar/v1/sidecar.proto")], check=True)
    hdir = os.path.join(out, "hsrc", "rdma_sidecar", "_health")
    os.makedirs(hdir)
    shutil.copyfile(os.path.join(PROTO, "grpc/health/v1/health.proto"), os.path.join(hdir, "health.proto"))
    subprocess.run(["protoc", "--proto_path=" + os.path.join(out, "hsrc"), "--python_out=" + out,
                    "--grpc_out=" + out, plugin, os.path.join(hdir, "health.proto")], check=True)


class PythonClient(unittest.TestCase):
    def test_generated_modules_match_proto(self):
        with tempfile.TemporaryDirectory() as tmp:
            ref = os.path.join(tmp, "ref")
            os.makedirs(ref)
            fresh_protoc(ref)
            for rel in GENERATED:
                self.assertTrue(filecmp.cmp(os.path.join(ref, rel), os.path.join(PKG, rel), shallow=False),
                                "%s differs from protoc's output for proto/ now: rebuild (cmake --build build) "
                                "or run clients/python/generate.py; never edit it by hand" % rel)
            # What pip ships, installed offline (no index, the system setuptools).
            target = os.path.join(tmp, "site")
            r = subprocess.run([PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                                "--quiet", "--target", target, PKG], capture_output=True, text=True,
                               timeout=300 * SLOW)
            self.assertEqual(r.returncode, 0, "pip install failed:\n%s%s" % (r.stdout, r.stderr))
            for rel in GENERATED:
                self.assertTrue(filecmp.cmp(os.path.join(ref, rel), os.path.join(target, rel), shallow=False),
                                "the installed %s differs from protoc's output for proto/" % rel)
            r = subprocess.run([PY, "-c", "import rdma_sidecar, rdma_sidecar.sync, rdma_sidecar._pb as p; "
                                "print(rdma_sidecar.__file__, p.pb.OperationStatus.Name(6))"],
                               capture_output=True, text=True, cwd=tmp, timeout=60 * SLOW,
                               env=dict(os.environ, PYTHONPATH=target))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), [os.path.join(target, "rdma_sidecar", "__init__.py"),
                                                "OPERATION_STATUS_SCHEDULED"])

    def test_pytest_suite(self):
        env = dict(os.environ, SC_SOURCE_DIR=ROOT, PYTHONPATH=PKG, PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run([PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", os.path.join(PKG, "tests")],
                           capture_output=True, text=True, timeout=500 * SLOW, env=env, cwd=PKG)
        print(r.stdout[-6000:], r.stderr[-3000:])
        if r.returncode == 5:
            self.fail("pytest collected no tests in clients/python/tests")
        self.assertNotIn("No module named pytest", r.stderr, "apt-get install python3-pytest (scripts/install-deps.sh)")
        self.assertEqual(r.returncode, 0, "the rdma_sidecar pytest suite failed (output above)")
        self.assertIn(" passed", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
