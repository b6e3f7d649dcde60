# SPDX-License-Identifier: Apache-2.0
"""setuptools hooks that add the generated modules (rdma_sidecar/v1, rdma_sidecar/_health) to the
package without ever writing them into the source tree:

- build_py generates them from the repository's proto/ (generate.py: protoc + grpc_python_plugin)
  straight into the build directory (build_lib), after copying the hand-written modules;
- sdist generates them into the release tree, so an sdist installs without proto/ or protoc;
- the package list is found on disk (the generated packages exist only in an sdist), so pip's
  metadata step works on a clean checkout, a `git archive` copy and an sdist alike.

Where proto/ is: RDMA_SIDECAR_PROTO_DIR, else ../../proto (a checkout). setuptools' own build
directory and egg-info go to a temporary directory, not beside this file.
"""
import atexit
import os
import shutil
import sys
import tempfile

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402

GENERATED_PACKAGES = ["rdma_sidecar.v1", "rdma_sidecar._health"]


def proto_dir():
    return os.environ.get("RDMA_SIDECAR_PROTO_DIR", generate.DEFAULT_PROTO)


def shipped(base):
    """True when base/ already holds the generated modules (an unpacked sdist)."""
    return all(os.path.exists(os.path.join(base, rel)) for rel in generate.OUTPUTS)


def generate_into(base):
    """Generates the modules under base/rdma_sidecar/ from proto/, or exits saying what is missing."""
    proto = proto_dir()
    if not os.path.isdir(proto):
        sys.exit("rdma-sidecar: the generated modules are not in this tree and proto/ is not at %s: "
                 "install from a checkout of the repository (clients/python) or an sdist, or set "
                 "RDMA_SIDECAR_PROTO_DIR to the repository's proto/ directory" % proto)
    generate.generate(proto, base)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        if not self.dry_run and not shipped(HERE):
            generate_into(self.build_lib)

    def get_outputs(self, include_bytecode=1):
        # The generated modules are outputs too (bdist_wheel and --record list them from here).
        outs = super().get_outputs(include_bytecode)
        extra = [os.path.join(self.build_lib, rel) for rel in generate.OUTPUTS]
        extra += [os.path.join(self.build_lib, p.replace(".", os.sep), "__init__.py") for p in GENERATED_PACKAGES]
        return outs + [p for p in extra if p not in outs]


class SdistWithStubs(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if not shipped(base_dir):
            generate_into(base_dir)


_tmp = tempfile.mkdtemp(prefix="rdma-sidecar-setup-")
atexit.register(shutil.rmtree, _tmp, True)
setup(packages=find_packages(HERE, include=["rdma_sidecar", "rdma_sidecar.*"]) or ["rdma_sidecar"],
      cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithStubs},
      options={"build": {"build_base": os.path.join(_tmp, "build")},
               "egg_info": {"egg_base": _tmp}})
