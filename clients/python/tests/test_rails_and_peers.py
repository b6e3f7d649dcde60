# SPDX-License-Identifier: Apache-2.0
"""The data plane's layout and peer warm-up from Python, blocking and asyncio, against real
sidecars: info()'s rails, topology and topology_source (a sidecar on the dgx8 hwloc fixture, whose
8 NICs are no rails here and show as "absent"; the session's sidecars on this host's sysfs),
Operation.rails after a transfer, and connect_peer() from metadata as text, a passive operation or
a MetadataEvent-like value: the issuer's id, a ready TCP path, the metadata not used up; bad
metadata and bad arguments raise."""
import asyncio
import os

import numpy as np
import pytest

import rdma_sidecar as rs
from conftest import SLOW, SOURCE, addr

DGX8 = os.path.join(SOURCE, "tests", "unit", "topology", "dgx8.xml")


@pytest.fixture(scope="module")
def topo(cluster):
    """A third sidecar that reads its topology from the dgx8 fixture (stopped with the session)."""
    return cluster.sidecar("topo", env={"RDMA_SIDECAR_TOPOLOGY_XML": DGX8})


def test_info_rails_and_topology_from_a_fixture(topo):
    with rs.sync.Connector(addr(topo)) as c:
        info = c.info()
    assert info.topology_source.endswith("dgx8.xml"), info.topology_source
    absent = [(r.name, r.backend, r.pci_address, r.numa_node) for r in info.rails if r.state == "absent"]
    assert absent == [("mlx5_%d" % i, rs.Backend.IBVERBS, pci, 0 if i < 4 else 1) for i, pci in enumerate(
        ["0000:15:00.0", "0000:16:00.0", "0000:35:00.0", "0000:36:00.0",
         "0000:95:00.0", "0000:96:00.0", "0000:b5:00.0", "0000:b6:00.0"])]
    rows = {t.memory: t for t in info.topology}
    assert list(rows["numa 0"].chosen) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert list(rows["numa 1"].chosen) == ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
    assert rows["numa 0"].gpu_index == -1 and rows["numa 0"].numa_node == 0
    ranked = {d.rail: d.distance for d in rows["numa 0"].rails}
    assert {"mlx5_%d" % i for i in range(8)} <= set(ranked), ranked
    assert all(ranked[r] for r in rows["numa 0"].chosen)


def test_info_topology_of_this_host(cluster, ca):
    info = ca.info()
    assert info.topology_source == "sysfs"
    assert any(t.memory.startswith("numa ") for t in info.topology), info.topology
    for r in info.rails:  # whatever this host has: every rail names its backend and state
        assert r.name and r.state and r.backend in (rs.Backend.TCP, rs.Backend.IBVERBS), r


def test_connect_peer_then_read(ca, cb):
    src = ca.empty(70001, np.uint8)
    src[:] = np.frombuffer(os.urandom(src.size), np.uint8)
    dst = cb.zeros(70001, np.uint8)
    with ca.create_readable(rs.Descriptor(src), timeout=30) as readable:
        got = cb.connect_peer(readable.metadata, timeout_ms=10000)
        assert got.peer == "a"
        tcp = [p for p in got.paths if p.backend == rs.Backend.TCP]
        assert len(tcp) == 1 and tcp[0].ready, got
        assert "connection(s) to a at " in tcp[0].detail
        again = cb.connect_peer(readable)  # a passive operation works as well; warm now
        assert again.peer == "a" and any(p.ready for p in again.paths)
        assert "(0 were open already)" not in [p for p in again.paths if p.backend == rs.Backend.TCP][0].detail
        # Not used up: the read that follows moves the bytes, and reports the rails it used.
        assert readable.refresh() == rs.OperationStatus.INITIALIZED and readable.proto.uses_left == 1
        with cb.begin_read(readable, rs.Descriptor(dst)) as op:
            assert op.wait_for_completion(30 * SLOW) == rs.OperationStatus.COMPLETE
            op.refresh()
            assert isinstance(op.rails, list)
            assert all(u.rail for u in op.rails)
            if op.rails:  # TCP names its rails once the sidecar reports them
                assert sum(u.bytes for u in op.rails) == src.nbytes
    assert dst.tobytes() == src.tobytes()
    ca.free(src)
    cb.free(dst)


def test_connect_peer_errors(ca, cb):
    with pytest.raises(rs.InvalidArgumentError) as e:
        cb.connect_peer("rsm1.garbage")
    assert "metadata is not valid base64url" in e.value.message
    with pytest.raises(rs.InvalidArgumentError) as e:
        cb.connect_peer("")
    assert "metadata is empty" in e.value.message
    with pytest.raises(TypeError):
        cb.connect_peer(12345)
    with pytest.raises(ValueError):
        cb.connect_peer("rsm1.x", timeout_ms=-1)


def test_connect_peer_asyncio(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            src = await a.empty(4096, np.uint8)
            async with await a.create_readable(rs.Descriptor(src), timeout=30) as readable:
                got = await b.connect_peer(readable, timeout_ms=5000)
                assert got.peer == "a"
                assert [(p.backend, p.ready) for p in got.paths] == [(rs.Backend.TCP, True)], got
                got = await b.connect_peer(readable.metadata)
                assert got.peer == "a"
                with pytest.raises(rs.InvalidArgumentError):
                    await b.connect_peer("rsm1.garbage")
            info = await b.info()
            assert info.topology_source == "sysfs" and len(info.topology) >= 1
    asyncio.run(asyncio.wait_for(body(), 60 * SLOW))
