# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the rdma_sidecar package tests: real rdma-sidecar processes and a real nats-server,
started with tests/integration/harness.py (paths from ctest's environment: SC_BINARY,
SC_PYTHON_STUBS, SC_TEST_TMP, SC_SOURCE_DIR; by hand the defaults point into build/).

Two sidecars "a" and "b" share a signing key and the nats-server for the whole session; every
test must leave them without operations or regions (checked after each test)."""
import os
import shutil
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, ".."))  # the package, ahead of build/python's stubs

import harness  # noqa: E402

import rdma_sidecar.sync  # noqa: E402

SLOW = harness.SLOW


class Cluster:
    def __init__(self):
        self.workdir = tempfile.mkdtemp(prefix="scpy-", dir="/tmp")
        self.procs = []
        self.nats = self._keep(harness.NatsServer(self.workdir))
        self.keys = harness.write_key_file(os.path.join(self.workdir, "keys"))

    def _keep(self, p):
        self.procs.append(p)
        return p

    def sidecar(self, name, **kw):
        kw.setdefault("key_file", self.keys)
        kw.setdefault("nats_url", self.nats.url)
        return self._keep(harness.Sidecar(self.workdir, name, **kw))

    def stop(self):
        codes = {}
        for p in reversed(self.procs):
            if isinstance(p, harness.Sidecar):
                codes[p.name] = p.stop()
                shutil.rmtree(p.shm, ignore_errors=True)
            else:
                p.stop()
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            logs = "\n".join("%s:\n%s" % (p.name, p.read_log()[-3000:]) for p in self.procs
                             if isinstance(p, harness.Sidecar) and p.name in bad)
            raise AssertionError("sidecars exited non-zero: %s\n%s" % (bad, logs))
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    c.a = c.sidecar("a")
    c.b = c.sidecar("b")
    yield c
    c.stop()


def addr(sidecar):
    return "unix:" + sidecar.sock


def leftovers(sidecar):
    s = sidecar.stub
    return (list(s.ListOperations(harness.pb.ListOperationsRequest(), timeout=10).operations),
            list(s.ListRegions(harness.pb.ListRegionsRequest(), timeout=10).regions))


@pytest.fixture(autouse=True)
def nothing_left(request):
    """After each test: no operation or region left in either sidecar (disposal works)."""
    yield
    if "cluster" in request.fixturenames:
        c = request.getfixturevalue("cluster")
        for s in (c.a, c.b):
            ops, regions = leftovers(s)
            assert not ops and not regions, "left in sidecar %s: %s %s" % (s.name, ops, regions)


@pytest.fixture
def ca(cluster):
    with rdma_sidecar.sync.Connector(addr(cluster.a)) as c:
        yield c


@pytest.fixture
def cb(cluster):
    with rdma_sidecar.sync.Connector(addr(cluster.b)) as c:
        yield c
