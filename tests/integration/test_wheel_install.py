# SPDX-License-Identifier: Apache-2.0
"""The Python wheel, as an ML team outside this repository gets it: `bash scripts/build-wheel.sh`
builds it; the wheel file alone is copied into an empty directory and pip-installed (no index, no
source tree, no protoc on PATH) into a fresh venv, imported from a neutral directory and used
against two real sidecars (bytes moved and compared). The supported grpcio/protobuf range is the
same in the wheel's metadata and in the import-time check, and an environment with a grpcio outside
it fails at import with a message naming the package, the version found and the range.

There is no package index here: the venv sees the system's grpcio and protobuf (Debian's
python3-grpcio 1.51 and python3-protobuf 4.21, --system-site-packages), which pip accepts as
satisfying the wheel's requirements."""
import glob
import os
import re
import shutil
import subprocess
import sys

from harness import SLOW, SidecarTest, main

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))

USE = r"""
import os, sys
import numpy as np
import rdma_sidecar as rs, rdma_sidecar.sync
assert os.environ["VENV"] in rs.__file__, rs.__file__
data = np.frombuffer(os.urandom(777777), dtype=np.uint8)
with rs.sync.Connector(os.environ["A"], wait_for_ready=10) as a, rs.sync.Connector(os.environ["B"]) as b:
    src = a.zeros(len(data) + 13, "uint8")
    src[13:] = data
    with a.create_readable(rs.Descriptor(src[13:]), timeout=30) as ro:
        dst = b.zeros(len(data), "uint8")
        with b.begin_read(ro.metadata, rs.Descriptor(dst)) as op:
            print(op.wait_for_completion(30).name, bytes(dst) == data.tobytes())
"""


class WheelTest(SidecarTest):
    def test_wheel_installs_alone_and_works(self):
        r = subprocess.run(["bash", os.path.join(SRC, "scripts", "build-wheel.sh")], capture_output=True,
                           text=True, timeout=300 * SLOW)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        wheels = glob.glob(os.path.join(SRC, "build", "wheel", "rdma_sidecar-*-py3-none-any.whl"))
        self.assertEqual(len(wheels), 1, wheels)
        alone = os.path.join(self.workdir, "dl")
        os.makedirs(alone)
        whl = shutil.copy(wheels[0], alone)
        venv = os.path.join(self.workdir, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True, timeout=120)
        # PATH without protoc, grpc_python_plugin or anything of the build; cwd away from the source.
        env = {"PATH": os.path.join(venv, "bin"), "HOME": self.workdir, "VENV": venv}
        r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--no-index", whl],
                           capture_output=True, text=True, cwd=alone, env=env, timeout=300 * SLOW)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", USE], capture_output=True, text=True,
                           cwd=alone, env=dict(env, A="unix:" + a.sock, B="unix:" + b.sock), timeout=120 * SLOW)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "COMPLETE True")
        r = subprocess.run([os.path.join(venv, "bin", "rdma-sidecar-py"), "--address", "unix:" + a.sock, "info"],
                           capture_output=True, text=True, cwd=alone, env=env, timeout=60 * SLOW)
        self.assertEqual(r.returncode, 0, r.stderr)

        # The range: the wheel's Requires-Dist and the import-time check say the same.
        meta = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                               "import importlib.metadata as m; print('\\n'.join(m.requires('rdma-sidecar')))"],
                              capture_output=True, text=True, cwd=alone, env=env, timeout=60).stdout
        checked = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                  "from rdma_sidecar._deps import SUPPORTED\n"
                                  "for n, _, lo, hi in SUPPORTED: print(n, '.'.join(map(str, lo)), '.'.join(map(str, hi)))"],
                                 capture_output=True, text=True, cwd=alone, env=env, timeout=60).stdout
        for line in checked.split("\n"):
            if line:
                name, lo, hi = line.split()
                self.assertRegex(meta, r"(?m)^%s ?\(?(<%s,>=%s|>=%s,<%s)\)?$" % (name, re.escape(hi), re.escape(lo),
                                                                             re.escape(lo), re.escape(hi)))

        # An environment with an older grpcio (a stand-in package shadowing the system one).
        old = os.path.join(self.workdir, "old")
        os.makedirs(os.path.join(old, "grpc"))
        with open(os.path.join(old, "grpc", "__init__.py"), "w") as f:
            f.write("__version__ = '1.40.0'\n")
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import rdma_sidecar"], capture_output=True,
                           text=True, cwd=alone, env=dict(env, PYTHONPATH=old), timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ImportError: rdma_sidecar needs grpcio>=1.51,<2 and protobuf>=3.20,<7; grpcio 1.40.0 is "
                      "installed. Install a supported version", r.stderr)


if __name__ == "__main__":
    main()
