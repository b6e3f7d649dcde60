# SPDX-License-Identifier: Apache-2.0
"""The asyncio API (rdma_sidecar.Connector on grpc.aio) against two real sidecars: transfers with
`async with` disposal, watch(), NATS subscribe/publish, errors, cancellation, timeouts, scheduling.
Each test runs its own event loop (asyncio.run): no pytest plugin needed."""
import asyncio
import time

import grpc
import numpy as np
import pytest

import rdma_sidecar as rs
from conftest import SLOW, addr, leftovers

torch = pytest.importorskip("torch", reason="python3-torch is not installed (apt-get install python3-torch)")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120 * SLOW))


def test_info_and_lists(cluster):
    async def body():
        async with rs.Connector(addr(cluster.b)) as c:
            info = await c.info()
            assert info.sidecar_id == "b" and await c.health() == "SERVING"
            r = await c.create_region(4096, "listed")
            regions = await c.list_regions()
            assert [x.region_id for x in regions] == [r.region_id] and regions[0].name == "listed"
            assert await c.list_operations() == []
    run(body())


def test_tensor_read_across_sidecars_with_disposal(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            src = await a.empty((5, 77), torch.float32)
            src.copy_(torch.randn(5, 77))
            dst = await b.zeros((5, 77), torch.float32)
            async with await a.create_readable(rs.Descriptor(src[1:4]), timeout=30) as readable:
                async with await b.begin_read(readable.metadata, rs.Descriptor(dst[1:4])) as op:
                    assert await op.wait_for_completion(30 * SLOW) == rs.OperationStatus.COMPLETE
                    assert op.bytes_done == 3 * 77 * 4
                assert await readable.wait_for_completion(10 * SLOW) == rs.OperationStatus.COMPLETE
                assert [o.operation_id for o in await a.list_operations()] == [readable.id]
            assert await a.list_operations() == [] and await b.list_operations() == []
            assert torch.equal(dst[1:4], src[1:4]) and not dst[0].any() and not dst[4].any()
    run(body())


def test_write_and_watch(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            n = 16 << 20
            src = await a.empty(n, np.uint8)
            src[:] = np.frombuffer(np.random.default_rng(1).bytes(n), np.uint8)
            dst = await b.zeros(n, np.uint8)
            async with await b.create_writable(rs.Descriptor(dst)) as w:
                async with await a.begin_write(w, rs.Descriptor(src)) as op:
                    states = [s async for s in op.watch()]
                    assert states[-1].status == rs.OperationStatus.COMPLETE and states[-1].bytes_done == n
                    assert op.bytes_done == n and op.status == rs.OperationStatus.COMPLETE
            assert dst.tobytes() == src.tobytes()
    run(body())


def test_nats_subscribe_publish_read(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            src = await a.empty((2, 300), np.float64)
            src[...] = np.random.default_rng(2).random((2, 300))
            dst = await b.zeros((2, 300), np.float64)
            sub = b.subscribe("pyclient.async.kv")
            await sub.ready()
            readable = await a.create_readable(rs.Descriptor(src))
            await a.publish("pyclient.async.kv", readable)
            async for event in sub:
                assert event.kind == rs.OperationKind.READABLE and event.descriptor_lengths == [4800]
                op = await b.begin_read(event, rs.Descriptor(dst))
                await op.wait_for_completion(30 * SLOW)
                break
            with pytest.raises(rs.DeadlineExceededError, match="no metadata on pyclient.async.kv"):
                await sub.next(timeout=0.2)
            await a.publish("pyclient.async.kv", readable.metadata)  # still subscribed after a timeout
            assert (await sub.next(timeout=10 * SLOW)).metadata == readable.metadata
            sub.close()
            await readable.wait_for_completion(10 * SLOW)
            assert dst.tobytes() == src.tobytes()
            await op.release()
            await readable.release()
            assert await a.list_operations() == [] and await b.list_operations() == []
            async with b.subscribe("") as bad:  # the sidecar refuses: its message comes through
                pass
    with pytest.raises(rs.InvalidArgumentError, match="subject is required"):
        run(body())


def test_wait_metadata_while_waiting(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            src = await a.empty(777, np.uint8)
            src[:] = np.frombuffer(np.random.default_rng(3).bytes(777), np.uint8)
            dst = await b.zeros(777, np.uint8)
            waiting = asyncio.ensure_future(b.wait_metadata("pyclient.async.wait", timeout=20 * SLOW))
            async with await a.create_readable(rs.Descriptor(src)) as readable:
                await a.publish("pyclient.async.wait", readable)
                event = await waiting
                assert event.metadata == readable.metadata and event.descriptor_lengths == [777]
                async with await b.begin_read(event, rs.Descriptor(dst)) as op:
                    await op.wait_for_completion(30 * SLOW)
            assert dst.tobytes() == src.tobytes()
    run(body())


def test_errors_cancel_timeout_scheduling(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            src = await a.empty(1000, np.uint8)
            src[:] = 7
            dst = await b.zeros(1000, np.uint8)
            with pytest.raises(rs.NotFoundError) as e:
                await a.create_writable([("r-missing", 0, 1)])
            assert e.value.code == grpc.StatusCode.NOT_FOUND and "r-missing" in e.value.message
            async with await a.create_readable(rs.Descriptor(src)) as r:
                t = time.monotonic()
                with pytest.raises(rs.DeadlineExceededError):
                    await r.wait_for_completion(timeout=0.2)
                assert time.monotonic() - t < 5 * SLOW
                op = await b.begin_read(r, rs.Descriptor(dst), requirement=rs.TransferRequirement("q", 2))
                assert op.status == rs.OperationStatus.SCHEDULED
                assert await b.report_progress("q", 2, iteration_complete=True) == 1
                await op.wait_for_completion(30 * SLOW)
                await op.release()
            assert dst.tobytes() == src.tobytes()
            r = await a.create_readable(rs.Descriptor(src))
            assert await r.cancel() == rs.OperationStatus.CANCELLED
            with pytest.raises(rs.CancelledError) as e:
                await r.wait_for_completion(5)
            assert e.value.code == grpc.StatusCode.CANCELLED
            # close() releases the cancelled operation and the regions.
        assert leftovers(cluster.a) == ([], []) and leftovers(cluster.b) == ([], [])
    run(body())


def test_unavailable_sidecar():
    async def body():
        async with rs.Connector("unix:/tmp/no-such-sidecar.sock", rpc_timeout=2) as c:
            await c.info()
    with pytest.raises(rs.UnavailableError) as e:
        run(body())
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and "no-such-sidecar" in e.value.message
