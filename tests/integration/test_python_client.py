# SPDX-License-Identifier: Apache-2.0
"""The Python client package (clients/python, package rdma_sidecar).

1. The build's generated modules (build/python/rdma_sidecar/, never clients/python/) match a fresh
   protoc run on proto/ as it is now, and no build has written generated files into the source tree.
2. `pip install` works from a clean tree (the tracked files only, as a fresh clone or a `git archive`
   copy has them) and from an sdist made from it without proto/; it writes nothing into that tree;
   what it ships matches protoc and imports from a neutral directory in a fresh interpreter.
3. Its pytest suite (clients/python/tests) against real sidecars and a real nats-server, with
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
ROOT = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
PKG = os.path.join(ROOT, "clients", "python")
PROTO = os.path.join(ROOT, "proto")
STUBS = os.path.abspath(os.environ.get("SC_PYTHON_STUBS", os.path.join(ROOT, "build", "python")))
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


def tracked_files(*paths):
    """The files of the working tree that git tracks under paths (what a fresh clone has), or None
    outside a git checkout."""
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--"] + list(paths), capture_output=True)
    if r.returncode != 0 or not r.stdout:
        return None
    return [f for f in r.stdout.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def clean_copy(dst):
    """clients/python and proto/ as a fresh clone has them: the tracked files only (nothing a build
    or an earlier install left behind, ignored or not)."""
    files = tracked_files("clients/python", "proto")
    if files is None:  # not a git checkout: everything but what is ignored by name
        for d in ("clients/python", "proto"):
            shutil.copytree(os.path.join(ROOT, d), os.path.join(dst, d),
                            ignore=shutil.ignore_patterns("v1", "_health", "build", "*.egg-info", "__pycache__"))
        return
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dst, f))


def listing(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)


class PythonClient(unittest.TestCase):
    def pip_install(self, what, target, env=None):
        r = subprocess.run([PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                            "--quiet", "--target", target, what], capture_output=True, text=True,
                           timeout=300 * SLOW, env=env, cwd=os.path.dirname(target))
        self.assertEqual(r.returncode, 0, "pip install %s failed:\n%s%s" % (what, r.stdout, r.stderr))

    def assert_ships_protoc_output(self, ref, target):
        for rel in GENERATED:
            self.assertTrue(filecmp.cmp(os.path.join(ref, rel), os.path.join(target, rel), shallow=False),
                            "the installed %s differs from protoc's output for proto/" % rel)
        r = subprocess.run([PY, "-c", "import rdma_sidecar, rdma_sidecar.sync, rdma_sidecar._pb as p; "
                            "print(rdma_sidecar.__file__, p.pb.OperationStatus.Name(6))"],
                           capture_output=True, text=True, cwd=os.path.dirname(target), timeout=60 * SLOW,
                           env=dict(os.environ, PYTHONPATH=target))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [os.path.join(target, "rdma_sidecar", "__init__.py"),
                                            "OPERATION_STATUS_SCHEDULED"])

    def test_build_generates_under_build_dir_only(self):
        with tempfile.TemporaryDirectory() as tmp:
            fresh_protoc(tmp)
            for rel in GENERATED:
                built = os.path.join(STUBS, rel)
                self.assertTrue(os.path.exists(built), "%s is missing: build the python_stubs target" % built)
                self.assertTrue(filecmp.cmp(os.path.join(tmp, rel), built, shallow=False),
                                "%s differs from protoc's output for proto/ now: rebuild (cmake --build build); "
                                "never edit it by hand" % built)
        # Nothing generated in the source tree, ignored or not: a fresh clone has none of it, and a
        # test that found it there would hide what a new user meets.
        for rel in ("rdma_sidecar/v1", "rdma_sidecar/_health", "build"):
            self.assertFalse(os.path.exists(os.path.join(PKG, rel)),
                             "clients/python/%s exists: a build or install wrote into the source tree" % rel)
        self.assertEqual([d for d in os.listdir(PKG) if d.endswith(".egg-info")], [],
                         "an egg-info directory in clients/python: setuptools wrote into the source tree")

    def test_pip_install_from_clean_tree_and_sdist(self):
        with tempfile.TemporaryDirectory() as tmp:
            ref = os.path.join(tmp, "ref")
            os.makedirs(ref)
            fresh_protoc(ref)
            src = os.path.join(tmp, "clone")
            clean_copy(src)
            pkg = os.path.join(src, "clients", "python")
            before = listing(src)
            # 1. From the clean tree, as the README says (offline, the system setuptools).
            target = os.path.join(tmp, "site")
            self.pip_install(pkg, target)
            self.assertEqual(listing(src), before, "pip install wrote into the source tree")
            self.assert_ships_protoc_output(ref, target)
            # 2. An sdist made from it carries the generated modules: it installs with no proto/.
            dist = os.path.join(tmp, "dist")
            r = subprocess.run([PY, "setup.py", "-q", "sdist", "-d", dist], cwd=pkg, capture_output=True,
                               text=True, timeout=120 * SLOW)
            self.assertEqual(r.returncode, 0, "sdist failed:\n%s%s" % (r.stdout, r.stderr))
            self.assertEqual(listing(src), before, "sdist wrote into the source tree")
            sdists = os.listdir(dist)
            self.assertEqual(len(sdists), 1, sdists)
            shutil.rmtree(os.path.join(src, "proto"))
            target = os.path.join(tmp, "site-sdist")
            self.pip_install(os.path.join(dist, sdists[0]), target,
                             env=dict(os.environ, RDMA_SIDECAR_PROTO_DIR=os.path.join(tmp, "no-such-proto")))
            self.assert_ships_protoc_output(ref, target)

    def test_pytest_suite(self):
        env = dict(os.environ, SC_SOURCE_DIR=ROOT, PYTHONPATH=PKG + os.pathsep + STUBS, PYTHONDONTWRITEBYTECODE="1")
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
