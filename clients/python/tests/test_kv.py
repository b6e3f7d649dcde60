# SPDX-License-Identifier: Apache-2.0
"""Compact KV-cache lists (rs.KVBlocks, rs.StridedRun) against two real sidecars: vLLM's layout
(per-layer tensors, K/V views of one (2, blocks, ...) tensor, the same block ids in every layer),
READ and WRITE, the other side in another form, every element compared."""
import asyncio
import random

import pytest

import rdma_sidecar as rs
from conftest import SLOW, addr

torch = pytest.importorskip("torch", reason="python3-torch is not installed (apt-get install python3-torch)")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120 * SLOW))


def test_kv_blocks_read_and_strided_write(cluster):
    rnd = random.Random()
    nb, ids = 40, None

    async def body():
        async with rs.Connector(addr(cluster.a)) as a, rs.Connector(addr(cluster.b)) as b:
            # a: 3 layer tensors of their own, then K and V of one (2, nb, 16, 7) layer tensor
            own = [await a.empty((nb, 16, 7), torch.float16) for _ in range(3)]
            kv = await a.empty((2, nb, 16, 7), torch.float16)
            layers = own + [kv[0], kv[1]]
            for t in layers:
                t.copy_(torch.randn(t.shape, dtype=torch.float16))
            ids = rnd.sample(range(nb), 13)
            src = rs.KVBlocks(layers, ids)
            assert len(src) == 5 * 13 and src.nbytes == 5 * 13 * 16 * 7 * 2
            # b: the same layout, other block ids
            dst_layers = [await b.zeros((nb, 16, 7), torch.float16) for _ in range(5)]
            dst_ids = rnd.sample(range(nb), 13)
            async with await a.create_readable(src, timeout=30) as readable:
                assert rs.metadata_descriptor_lengths(readable.metadata) == [16 * 7 * 2] * 65
                async with await b.begin_read(readable.metadata, rs.KVBlocks(dst_layers, dst_ids)) as op:
                    assert await op.wait_for_completion(30 * SLOW) == rs.OperationStatus.COMPLETE, op.error
                    assert op.bytes_done == src.nbytes
            untouched = [i for i in range(nb) if i not in dst_ids]
            for s, d in zip(layers, dst_layers):
                assert torch.equal(d[dst_ids], s[ids])
                assert not d[untouched].any()
            # WRITE: b pushes a contiguous buffer (one StridedRun of 65 blocks) into a's blocks
            buf = await b.empty((65, 16, 7), torch.float16)
            buf.copy_(torch.randn(buf.shape, dtype=torch.float16))
            wids = rnd.sample(range(nb), 13)
            async with await a.create_writable(rs.KVBlocks(layers, wids), timeout=30) as writable:
                async with await b.begin_write(writable.metadata,
                                               rs.StridedRun(buf, 0, 16 * 7 * 2, 65, 16 * 7 * 2)) as op:
                    assert await op.wait_for_completion(30 * SLOW) == rs.OperationStatus.COMPLETE, op.error
                assert await writable.wait_for_completion(10 * SLOW) == rs.OperationStatus.COMPLETE
            for li, t in enumerate(layers):
                assert torch.equal(t[wids], buf[li * 13:(li + 1) * 13])
    run(body())


def test_kv_blocks_mixed_with_plain_and_errors(cluster):
    async def body():
        async with rs.Connector(addr(cluster.a)) as a:
            t = await a.empty((8, 64), torch.uint8)
            extra = await a.empty((100,), torch.uint8)
            # a plain descriptor, then a block list: the order is kept
            op = await a.create_readable([rs.Descriptor(extra[3:50]), rs.KVBlocks.of_tensor(t, [5, 1])], timeout=30)
            assert op.proto.descriptor_count == 3 and op.bytes_total == 47 + 2 * 64
            await op.release()
            with pytest.raises(ValueError, match="outside the tensors' 8 blocks"):
                rs.KVBlocks([t], [8])
            with pytest.raises(ValueError, match="at least one block id"):
                rs.KVBlocks([t], [])
            with pytest.raises(rs.InvalidArgumentError, match="strided_run.stride is 0"):
                await a.create_readable(rs.StridedRun(t, 0, 0, 2, 8), timeout=30)
            with pytest.raises(rs.InvalidArgumentError, match="outside region"):
                await a.create_readable(rs.StridedRun(t, 0, 64, 9, 64), timeout=30)
    run(body())
