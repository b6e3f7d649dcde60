# SPDX-License-Identifier: Apache-2.0
"""KV-cache shaped transfers with compact descriptor lists (BlockList, StridedRun): two real
sidecars over the TCP data plane, random data at odd block sizes, block ids in random order, every
byte of every region compared (targets hold the payload, everything else its noise). The forms on
the two sides differ (block list against plain descriptors or strided runs): only the expanded
count and lengths must match. 16,384 descriptors move in ONE operation each way. Bad compact forms
are refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED and a message naming the set."""
import os
import random

import grpc
from harness import SidecarTest, desc, main, pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def block_list(regions, block_length, block_ids=None, offsets=None, stride=0, base=0):
    bl = pb.BlockList(region_ids=[r.region_id for r in regions], block_length=block_length)
    if block_ids is not None:
        bl.block_ids.extend(block_ids)
        bl.block_stride = stride
        bl.base_offset = base
    if offsets is not None:
        bl.offsets.extend(offsets)
    return pb.DescriptorSet(block_list=bl)


def strided(region, offset, stride, count, length):
    return pb.DescriptorSet(strided_run=pb.StridedRun(region_id=region.region_id, offset=offset,
                                                      stride=stride, count=count, length=length))


class Side:
    """One sidecar's regions with noise, and the expanded (region, offset, length) list."""

    def __init__(self, sc, n_regions, size):
        self.sc = sc
        self.regions = [sc.create_region(size) for _ in range(n_regions)]
        self.images = []
        for r in self.regions:
            img = bytearray(os.urandom(size))
            sc.fill(r, 0, bytes(img))
            self.images.append(img)
        self.expanded = []  # (region index, offset, length)

    def place(self, payload):
        """Write the payload into the expanded ranges (the holder's side)."""
        pos = 0
        for ri, off, ln in self.expanded:
            self.images[ri][off:off + ln] = payload[pos:pos + ln]
            pos += ln
        for r, img in zip(self.regions, self.images):
            self.sc.fill(r, 0, bytes(img))

    def expect(self, payload):
        pos = 0
        for ri, off, ln in self.expanded:
            self.images[ri][off:off + ln] = payload[pos:pos + ln]
            pos += ln

    def check(self, test, what):
        for i, (r, img) in enumerate(zip(self.regions, self.images)):
            got = self.sc.peek(r, 0, r.size)
            if got != bytes(img):
                bad = next(k for k in range(len(img)) if got[k] != img[k])
                test.fail("%s: region %d differs first at byte %d" % (what, i, bad))


class KvTransferTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
        keys = self.key_file()
        self.a = self.sidecar("a", key_file=keys)
        self.b = self.sidecar("b", key_file=keys)

    def run_pair(self, direction, passive, p_req, active, a_req, total):
        holder = passive if direction == "read" else active
        payload = os.urandom(total)
        holder.place(payload)
        (active if direction == "read" else passive).expect(payload)
        create = passive.sc.stub.CreateReadable if direction == "read" else passive.sc.stub.CreateWritable
        p_req.timeout_ms = 120000
        pop = create(p_req, timeout=60)
        self.assertEqual(pop.status, pb.OPERATION_STATUS_INITIALIZED)
        self.assertEqual(pop.bytes_total, total)
        begin = active.sc.stub.BeginRead if direction == "read" else active.sc.stub.BeginWrite
        a_req.metadata = pop.metadata
        a_req.timeout_ms = 120000
        a_req.wait = True
        done = begin(a_req, timeout=180)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, pb.BACKEND_TCP, done.backend_reason)
        self.assertEqual(done.bytes_done, total)
        p = passive.sc.wait(pop.operation_id, 60000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        passive.check(self, "%s passive side" % direction)
        active.check(self, "%s active side" % direction)
        return pop, done

    def test_block_list_against_plain_and_strided(self):
        """4 layer tensors x 37 shared block ids (odd block size, ids in random order) on the
        passive side; the active side uses plain descriptors for READ and strided runs for WRITE."""
        blk, stride, nblocks, layers = 1021, 1536, 64, 4
        ids = self.rnd.sample(range(nblocks), 37)
        for direction in ("read", "write"):
            p = Side(self.a, layers, nblocks * stride + 5)
            p.expanded = [(li, 3 + i * stride, blk) for li in range(layers) for i in ids]
            p_req = pb.CreatePassiveRequest(descriptor_sets=[
                block_list(p.regions, blk, block_ids=ids, stride=stride, base=3)])
            q = Side(self.b, 2, len(p.expanded) * 1100 + 4096)
            if direction == "read":
                q.expanded = [(i % 2, 7 + (i // 2) * 1100, blk) for i in range(len(p.expanded))]
                a_req = pb.BeginTransferRequest(descriptors=[
                    desc(q.regions[ri], off, ln) for ri, off, ln in q.expanded])
            else:
                # two strided runs in region 0 then a plain descriptor tail in region 1
                n = len(p.expanded)
                q.expanded = [(0, 11 + k * 1100, blk) for k in range(n - 1)] + [(1, 333, blk)]
                a_req = pb.BeginTransferRequest(descriptor_sets=[
                    strided(q.regions[0], 11, 1100, 100, blk),
                    strided(q.regions[0], 11 + 100 * 1100, 1100, n - 101, blk),
                    pb.DescriptorSet(descriptor=desc(q.regions[1], 333, blk))])
            pop, done = self.run_pair(direction, p, p_req, q, a_req, blk * len(p.expanded))
            # created from compact lists: the count, not the expanded list, in every reply
            self.assertEqual(pop.descriptor_count, len(p.expanded))
            self.assertEqual(len(pop.descriptors), 0)
            if direction == "read":  # plain on the active side: echoed as given
                self.assertEqual([(d.region_id, d.offset, d.length) for d in done.descriptors],
                                 [(q.regions[ri].region_id, off, ln) for ri, off, ln in q.expanded])
            self.assertEqual(done.descriptor_count, len(q.expanded))

    def test_offsets_and_plain_prefix(self):
        """Plain descriptors come first, then the sets in order; a block list with byte offsets."""
        p = Side(self.a, 2, 1 << 16)
        offs = self.rnd.sample(range(1000, (1 << 16) - 999, 1000), 20)  # clear of [5, 82)
        p.expanded = [(0, 5, 77)] + [(ri, o, 999) for ri in (1, 0) for o in offs]
        p_req = pb.CreatePassiveRequest(descriptors=[desc(p.regions[0], 5, 77)], descriptor_sets=[
            block_list([p.regions[1], p.regions[0]], 999, offsets=offs)])
        q = Side(self.b, 1, 1 << 16)
        q.expanded = [(0, 1, 77)] + [(0, 100 + i * 1003, 999) for i in range(40)]
        a_req = pb.BeginTransferRequest(descriptors=[desc(q.regions[0], 1, 77)], descriptor_sets=[
            strided(q.regions[0], 100, 1003, 40, 999)])
        self.run_pair("read", p, p_req, q, a_req, 77 + 40 * 999)

    def test_16384_blocks_one_operation(self):
        """16,384 descriptors in ONE READ and ONE WRITE: compact on one side, plain on the other,
        then the reverse. (bench/kv_bench.py moves 16,384 x 32 KiB; here 1,031-byte blocks keep
        the test to 17 MiB.)"""
        blk, stride, layers, per = 1031, 1040, 64, 256
        ids = self.rnd.sample(range(400), per)
        n = layers * per
        for direction, compact_passive in (("read", True), ("write", False)):
            p = Side(self.a, layers, 400 * stride)
            p.expanded = [(li, i * stride, blk) for li in range(layers) for i in ids]
            q = Side(self.b, 1, n * blk + 64)
            q.expanded = [(0, k * blk, blk) for k in range(n)]
            if compact_passive:
                p_req = pb.CreatePassiveRequest(descriptor_sets=[
                    block_list(p.regions, blk, block_ids=ids, stride=stride)])
                a_req = pb.BeginTransferRequest(descriptors=[
                    desc(q.regions[0], off, ln) for _, off, ln in q.expanded])
            else:
                p_req = pb.CreatePassiveRequest(descriptors=[
                    desc(p.regions[ri], off, ln) for ri, off, ln in p.expanded])
                a_req = pb.BeginTransferRequest(descriptor_sets=[strided(q.regions[0], 0, blk, n, blk)])
            pop, done = self.run_pair(direction, p, p_req, q, a_req, n * blk)
            self.assertEqual((pop.descriptor_count, done.descriptor_count), (n, n))
            # the plain side echoes its list, the compact side only the count
            self.assertEqual(len(done.descriptors), n if compact_passive else 0)
            self.assertEqual(len(pop.descriptors), 0 if compact_passive else n)
            if compact_passive:
                # 64 x 256 descriptors over TCP: the signed metadata stays small
                self.assertLess(len(pop.metadata), 1024, len(pop.metadata))

    def test_list_pages_end_before_too_many_descriptors(self):
        """ListOperations pages stop at 131,072 listed descriptors (never empty); compact
        operations list none, so they do not count."""
        r = self.a.create_region(65536)
        plain = [desc(r, i, 1) for i in range(65536)]
        ids = [self.a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=plain), timeout=60).operation_id
               for _ in range(3)]
        ids += [self.a.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptor_sets=[strided(r, 0, 1, 65536, 1)]), timeout=60).operation_id for _ in range(2)]
        seen, token, pages = [], "", []
        while True:
            resp = self.a.stub.ListOperations(pb.ListOperationsRequest(page_token=token), timeout=60)
            pages.append([(len(o.descriptors), o.descriptor_count) for o in resp.operations])
            seen += [o.operation_id for o in resp.operations]
            token = resp.next_page_token
            if not token:
                break
        self.assertEqual(sorted(seen), sorted(ids))
        for page in pages:
            self.assertGreater(len(page), 0)
            self.assertLessEqual(sum(n for n, _ in page), 131072)
        self.assertGreaterEqual(len(pages), 2)
        self.assertEqual(sorted(c for page in pages for _, c in page), [65536] * 5)

    def test_bad_compact_forms(self):
        r = self.a.create_region(1 << 20)
        rid = r.region_id
        create = self.a.stub.CreateReadable

        def bad(code, contains, *sets, plain=()):
            self.assertRpcError(code, create, pb.CreatePassiveRequest(descriptors=list(plain),
                                                                        descriptor_sets=list(sets)),
                                timeout=10, contains=contains)

        BL, SR = pb.BlockList, pb.StridedRun
        bad(INVALID, "descriptor_sets[0] is empty", pb.DescriptorSet())
        bad(INVALID, "descriptor_sets[1]: block_list names no region_ids",
            strided(r, 0, 8, 2, 8), pb.DescriptorSet(block_list=BL(block_length=8, block_ids=[1])))
        bad(INVALID, "descriptor_sets[0]: block_list.block_length is 0",
            pb.DescriptorSet(block_list=BL(region_ids=[rid], block_ids=[1])))
        bad(INVALID, "exactly one of offsets and block_ids (it has neither)",
            pb.DescriptorSet(block_list=BL(region_ids=[rid], block_length=8)))
        bad(INVALID, "exactly one of offsets and block_ids (it has both)",
            pb.DescriptorSet(block_list=BL(region_ids=[rid], block_length=8, offsets=[0], block_ids=[0])))
        bad(INVALID, "block_stride and base_offset go with block_ids",
            pb.DescriptorSet(block_list=BL(region_ids=[rid], block_length=8, offsets=[0], block_stride=4)))
        bad(INVALID, "block_ids[1] = 9223372036854775808 times block_stride 2 overflows 64 bits",
            pb.DescriptorSet(block_list=BL(region_ids=[rid], block_length=8, block_ids=[0, 1 << 63],
                                           block_stride=2)))
        bad(INVALID, "descriptor_sets[0]: block_list.region_ids[] must be 1..",
            pb.DescriptorSet(block_list=BL(region_ids=[rid, ""], block_length=8, block_ids=[1])))
        bad(INVALID, "strided_run.count is 0", pb.DescriptorSet(strided_run=SR(region_id=rid, length=8)))
        bad(INVALID, "strided_run.length is 0", pb.DescriptorSet(strided_run=SR(region_id=rid, count=2, stride=8)))
        bad(INVALID, "strided_run.stride is 0 with count 2",
            pb.DescriptorSet(strided_run=SR(region_id=rid, count=2, length=8)))
        bad(INVALID, "strided_run offsets overflow 64 bits", strided(r, 1 << 63, 1 << 62, 3, 8))
        bad(INVALID, "strided_run.region_id must be 1..", pb.DescriptorSet(strided_run=SR(count=1, length=8)))
        # out of bounds and unknown regions: the engine's checks, with the expanded index
        bad(INVALID, "descriptor 4: descriptor [1048576, +8) is outside region",
            strided(r, 1 << 18, 1 << 18, 4, 8), plain=[desc(r, 0, 8)])
        bad(grpc.StatusCode.NOT_FOUND, 'no region "nope"',
            pb.DescriptorSet(block_list=BL(region_ids=[rid, "nope"], block_length=8, block_ids=[3])))
        # more than --max-descriptors (65,536 by default): refused before expanding
        bad(EXHAUSTED, "16777216 descriptors: at most 65536 per operation (--max-descriptors)",
            pb.DescriptorSet(block_list=BL(region_ids=[rid] * 4096, block_length=8,
                                           block_ids=list(range(4096)))))
        self.assertEqual(len(self.a.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations), 0)
        # the two sides' expanded lists must agree in count and lengths
        pop = create(pb.CreatePassiveRequest(descriptor_sets=[strided(r, 0, 64, 10, 64)]), timeout=10)
        q = self.b.create_region(1 << 16)
        self.assertRpcError(INVALID, self.b.stub.BeginRead, pb.BeginTransferRequest(
            metadata=pop.metadata, descriptor_sets=[strided(q, 0, 64, 9, 64)]), timeout=10,
            contains="descriptor count mismatch: metadata has 10, request has 9")
        self.assertRpcError(INVALID, self.b.stub.BeginRead, pb.BeginTransferRequest(
            metadata=pop.metadata, descriptor_sets=[strided(q, 0, 64, 9, 64), strided(q, 9000, 1, 1, 63)]),
            timeout=10, contains="descriptor 9 length mismatch: metadata has 64, request has 63")


if __name__ == "__main__":
    main()
