# SPDX-License-Identifier: Apache-2.0
"""setuptools hook: generates rdma_sidecar/v1 and rdma_sidecar/_health from the repository's proto/
(generate.py: protoc + grpc_python_plugin) before the package is built, so the generated modules
ship inside it without ever being committed. RDMA_SIDECAR_PROTO_DIR overrides where proto/ is;
without proto/ (an sdist) the modules already in the tree are used."""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402


class BuildWithStubs(build_py):
    def run(self):
        proto = os.environ.get("RDMA_SIDECAR_PROTO_DIR", generate.DEFAULT_PROTO)
        if os.path.isdir(proto):
            generate.generate(proto, HERE)
        elif not os.path.exists(os.path.join(HERE, generate.OUTPUTS[0])):
            sys.exit("rdma-sidecar: neither proto/ (%s) nor generated modules found; set RDMA_SIDECAR_PROTO_DIR"
                     % proto)
        super().run()


setup(packages=["rdma_sidecar", "rdma_sidecar.v1", "rdma_sidecar._health"],
      cmdclass={"build_py": BuildWithStubs})
