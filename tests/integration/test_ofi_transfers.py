# SPDX-License-Identifier: Apache-2.0
"""The libfabric backend moving bytes between two real sidecars over libfabric's tcp;ofi_rxm
provider on loopback (real libfabric, no mock): READ and WRITE of random data at odd sizes and
offsets, many descriptors, a KV compact list of 16,384 pieces in one operation each way, every byte
compared; GetInfo naming the provider, its rails and that it is TCP-emulating; the default refusing
a TCP-emulating provider with the reason. One pair of sidecars serves every check."""
import os
import random
import unittest

import grpc
from harness import SidecarTest, desc, main, pb

OFI = ["--backends", "tcp,libfabric", "--ofi-provider", "tcp;ofi_rxm", "--ofi-domains", "lo"]


def ofi_backend(info):
    return next(b for b in info.backends if b.backend == pb.BACKEND_LIBFABRIC)


class OfiTransferTest(SidecarTest):
    @classmethod
    def setUpClass(cls):
        cls.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))

    def setUp(self):
        super().setUp()
        keys = self.key_file()
        self.a = self.sidecar("a", key_file=keys, extra=OFI)
        self.b = self.sidecar("b", key_file=keys, extra=OFI)

    def transfer(self, direction, passive, p_descs, active, a_descs, p_sets=(), a_sets=()):
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        pop = create(pb.CreatePassiveRequest(descriptors=p_descs, descriptor_sets=list(p_sets),
                                             timeout_ms=60000), timeout=60)
        begin = active.stub.BeginRead if direction == "read" else active.stub.BeginWrite
        done = begin(pb.BeginTransferRequest(metadata=pop.metadata, descriptors=a_descs,
                                             descriptor_sets=list(a_sets), timeout_ms=60000,
                                             wait=True, backend=pb.BACKEND_LIBFABRIC),
                     timeout=90)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, pb.BACKEND_LIBFABRIC, done.backend_reason)
        self.assertIn("over tcp;ofi_rxm:lo", done.backend_reason)
        self.assertEqual(done.bytes_done, done.bytes_total)
        p = passive.wait(pop.operation_id, 30000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        self.assertEqual(p.backend, pb.BACKEND_LIBFABRIC)
        return pop, done

    def test_all(self):
        self.check_info()
        self.check_sizes_and_offsets()
        self.check_many_descriptors()
        self.check_kv_16384()
        self.check_default_refuses_tcp()

    def check_info(self):
        be = ofi_backend(self.a.info())
        self.assertTrue(be.available, be.detail)
        self.assertIn("provider tcp;ofi_rxm", be.detail)
        self.assertIn("TCP-emulating", be.detail)
        self.assertIn("tcp;ofi_rxm:lo", list(be.devices))

    def check_sizes_and_offsets(self):
        """READ and WRITE, sizes from 1 byte to 9 MiB + odd, at odd offsets on both sides."""
        a, b = self.a, self.b
        ra = a.create_region(24 << 20)
        rb = b.create_region(24 << 20)
        for size in (1, 7, 4093, 65537, 1 << 20, (9 << 20) + 13):
            for direction in ("read", "write"):
                oa = self.rnd.randrange(0, 4096) * 3 + 1
                ob = self.rnd.randrange(0, 4096) * 5 + 3
                data = os.urandom(size)
                noise_a = os.urandom(size + 64)
                noise_b = os.urandom(size + 64)
                a.fill(ra, oa - 1, noise_a)
                b.fill(rb, ob - 1, noise_b)
                # passive a holds the data for a read; active b holds it for a write
                if direction == "read":
                    a.fill(ra, oa, data)
                    self.transfer("read", a, [desc(ra, oa, size)], b, [desc(rb, ob, size)])
                    got = b.peek(rb, ob - 1, size + 2)
                else:
                    b.fill(rb, ob, data)
                    self.transfer("write", a, [desc(ra, oa, size)], b, [desc(rb, ob, size)])
                    got = a.peek(ra, oa - 1, size + 2)
                noise = noise_b if direction == "read" else noise_a
                self.assertEqual(got[0], noise[0], "%s %d: byte before the range" % (direction, size))
                self.assertEqual(got[1:-1], data, "%s of %d bytes differs" % (direction, size))
                self.assertEqual(got[-1], noise[size + 1], "%s %d: byte after" % (direction, size))

    def check_many_descriptors(self):
        """300 descriptors of random odd lengths, scattered differently on the two sides."""
        a, b = self.a, self.b
        n = 300
        lengths = [self.rnd.randrange(1, 20000) | 1 for _ in range(n)]
        total = sum(lengths)
        ra = a.create_region(total * 2 + 4096)
        rb = b.create_region(total * 2 + 4096)
        for direction in ("read", "write"):
            a.fill(ra, 0, os.urandom(total * 2 + 4096))
            b.fill(rb, 0, os.urandom(total * 2 + 4096))
            pa, pb_ = [], []
            oa = ob = 5
            for ln in lengths:
                pa.append((oa, ln))
                pb_.append((ob, ln))
                oa += ln + self.rnd.randrange(0, 7)
                ob += ln + self.rnd.randrange(0, 9)
            src, dst = (a, ra, pa), (b, rb, pb_)
            if direction == "write":
                src, dst = dst, src
            payload = [os.urandom(ln) for _, ln in src[2]]
            for (off, ln), d in zip(src[2], payload):
                src[0].fill(src[1], off, d)
            self.transfer(direction, a, [desc(ra, o, l) for o, l in pa],
                          b, [desc(rb, o, l) for o, l in pb_])
            for (off, ln), d in zip(dst[2], payload):
                self.assertEqual(dst[0].peek(dst[1], off, ln), d, "%s: piece differs" % direction)

    def check_kv_16384(self):
        """A KV compact block list of 16,384 pieces (4 layers x 4,096 blocks of 1,021 bytes, ids in
        random order) each way in one operation; the active side uses strided runs."""
        a, b = self.a, self.b
        blk, stride, nblocks, layers = 1021, 1536, 4096, 4
        ids = self.rnd.sample(range(nblocks), nblocks)
        regions = [a.create_region(nblocks * stride + 16) for _ in range(layers)]
        n = layers * nblocks
        rb = b.create_region(n * 1100 + 64)
        for direction in ("read", "write"):
            imgs = [bytearray(os.urandom(nblocks * stride + 16)) for _ in regions]
            for r, img in zip(regions, imgs):
                a.fill(r, 0, bytes(img))
            bimg = bytearray(os.urandom(n * 1100 + 64))
            b.fill(rb, 0, bytes(bimg))
            pieces = [(li, 3 + i * stride) for li in range(layers) for i in ids]
            if direction == "read":
                for k, (li, off) in enumerate(pieces):
                    bimg[7 + k * 1100:7 + k * 1100 + blk] = imgs[li][off:off + blk]
            else:
                for k, (li, off) in enumerate(pieces):
                    imgs[li][off:off + blk] = bimg[7 + k * 1100:7 + k * 1100 + blk]
            bl = pb.BlockList(region_ids=[r.region_id for r in regions], block_length=blk,
                              block_ids=ids, block_stride=stride, base_offset=3)
            sr = pb.StridedRun(region_id=rb.region_id, offset=7, stride=1100, count=n, length=blk)
            self.transfer(direction, a, [], b, [], p_sets=[pb.DescriptorSet(block_list=bl)],
                          a_sets=[pb.DescriptorSet(strided_run=sr)])
            self.assertEqual(b.peek(rb, 0, len(bimg)), bytes(bimg), "%s: active side" % direction)
            for li, (r, img) in enumerate(zip(regions, imgs)):
                self.assertEqual(a.peek(r, 0, len(img)), bytes(img),
                                 "%s: passive layer %d" % (direction, li))

    def check_default_refuses_tcp(self):
        """Without --ofi-provider a TCP-emulating provider is never chosen, and GetInfo says why."""
        c = self.sidecar("c", extra=["--backends", "tcp,libfabric"])
        be = ofi_backend(c.info())
        self.assertFalse(be.available)
        self.assertIn("only TCP-emulating, node-local or verbs", be.detail)
        self.assertIn("--ofi-provider", be.detail)


if __name__ == "__main__":
    main()
