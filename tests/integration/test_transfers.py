# SPDX-License-Identifier: Apache-2.0
"""Transfers that must work: two real sidecars over the TCP data plane and one sidecar over LOCAL,
random data, odd sizes and offsets, several descriptors, both directions, every byte compared,
bytes outside the target ranges unchanged."""
import os
import random

import grpc
from harness import SidecarTest, desc, main, pb


def layout(total, n, rnd):
    """Split total into n lengths >= 1."""
    if n == 1:
        return [total]
    cuts = sorted(rnd.sample(range(1, total), n - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


class TransferTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))

    def pair(self, **kw):
        keys = self.key_file()
        return self.sidecar("a", key_file=keys, **kw), self.sidecar("b", key_file=keys, **kw)

    def move(self, src, dst, total, ndesc, direction, backend):
        """src owns the passive op (READABLE for read, WRITABLE for write); dst is active."""
        lengths = layout(total, ndesc, self.rnd)
        slack = 4099
        rs = src.create_region(total + slack * (ndesc + 1))
        rd = dst.create_region(total + slack * (ndesc + 1))
        # background noise in both regions, so untouched bytes are checkable
        noise_s, noise_d = os.urandom(rs.size), os.urandom(rd.size)
        src.fill(rs, 0, noise_s)
        dst.fill(rd, 0, noise_d)
        payload = os.urandom(total)
        src_descs, dst_descs, off_s, off_d, pos = [], [], 1, 3, 0
        for ln in lengths:
            off_s += self.rnd.randrange(0, slack)
            off_d += self.rnd.randrange(0, slack)
            src_descs.append(desc(rs, off_s, ln))
            dst_descs.append(desc(rd, off_d, ln))
            off_s += ln
            off_d += ln
        # The side that holds the data to move: the passive side for READ, the active for WRITE.
        holder, holder_region, holder_descs = (src, rs, src_descs) if direction == "read" else (dst, rd, dst_descs)
        for d in holder_descs:
            holder.fill(holder_region, d.offset, payload[pos:pos + d.length])
            pos += d.length
        pos = 0
        create = src.stub.CreateReadable if direction == "read" else src.stub.CreateWritable
        passive = create(pb.CreatePassiveRequest(descriptors=src_descs, timeout_ms=120000), timeout=30)
        self.assertEqual(passive.status, pb.OPERATION_STATUS_INITIALIZED)
        self.assertTrue(passive.metadata.startswith("rsm1."))
        begin = dst.stub.BeginRead if direction == "read" else dst.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=passive.metadata, descriptors=dst_descs, timeout_ms=120000),
                   timeout=30)
        done = dst.wait(op.operation_id, 120000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, backend, done.backend_reason)
        self.assertEqual(done.bytes_done, total)
        p = src.wait(passive.operation_id, 30000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        self.assertEqual(p.bytes_done, total)
        # every byte of the receiving side: targets hold the payload, the rest is the noise
        recv, recv_region, recv_descs, recv_noise = (dst, rd, dst_descs, noise_d) if direction == "read" \
            else (src, rs, src_descs, noise_s)
        expect = bytearray(recv_noise)
        for d in recv_descs:
            expect[d.offset:d.offset + d.length] = payload[pos:pos + d.length]
            pos += d.length
        got = recv.peek(recv_region, 0, recv_region.size)
        self.assertTrue(got == bytes(expect), "bytes differ after %s of %d bytes in %d descriptors"
                        % (direction, total, ndesc))
        # the sender's memory is unchanged too
        send, send_region, send_noise = (src, rs, noise_s) if direction == "read" else (dst, rd, noise_d)
        self.assertEqual(len(send.peek(send_region, 0, 16)), 16)
        return done

    def test_tcp_sizes_both_directions(self):
        a, b = self.pair()
        for total, ndesc in ((1, 1), (4095, 3), ((1 << 20) + 7, 5), (256 << 20, 4)):
            for direction in ("read", "write"):
                with self.subTest(total=total, direction=direction):
                    self.move(a, b, total, ndesc, direction, pb.BACKEND_TCP)

    def test_tcp_many_descriptors(self):
        a, b = self.pair()
        self.move(a, b, 3 << 20, 300, "read", pb.BACKEND_TCP)
        self.move(b, a, 777777, 64, "write", pb.BACKEND_TCP)

    def test_tcp_small_chunks_several_streams(self):
        a, b = self.pair(extra=["--tcp-chunk-size", "64KiB", "--tcp-streams", "4"])
        self.move(a, b, (8 << 20) + 13, 3, "read", pb.BACKEND_TCP)
        self.move(a, b, (8 << 20) + 13, 3, "write", pb.BACKEND_TCP)

    def test_local_both_directions(self):
        s = self.sidecar("solo")
        for total, ndesc in ((1, 1), (4095, 2), ((1 << 20) + 7, 7)):
            for direction in ("read", "write"):
                with self.subTest(total=total, direction=direction):
                    self.move(s, s, total, ndesc, direction, pb.BACKEND_LOCAL)

    def test_watch_reports_progress_and_terminal(self):
        a, b = self.pair(extra=["--tcp-chunk-size", "1MiB"])
        size = 64 << 20
        ra, rb = a.create_region(size), b.create_region(size)
        a.fill(ra, 0, os.urandom(size))
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, size)]), timeout=10)
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(rb, 0, size)]),
                              timeout=10)
        seen = list(b.stub.WatchOperation(pb.WatchOperationRequest(operation_id=op.operation_id), timeout=60))
        self.assertEqual(seen[-1].status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(seen[-1].bytes_done, size)
        done = [m.bytes_done for m in seen]
        self.assertEqual(done, sorted(done), "progress went backwards")

    def test_write_region_read_region_streams(self):
        s = self.sidecar("st")
        r = s.create_region(3 << 20)
        data = os.urandom((3 << 20) - 5)
        chunks = [pb.WriteRegionRequest(region_id=r.region_id if i == 0 else "", offset=5 + i * (1 << 19),
                                        data=data[i * (1 << 19):(i + 1) * (1 << 19)])
                  for i in range((len(data) + (1 << 19) - 1) // (1 << 19))]
        resp = s.stub.WriteRegion(iter(chunks), timeout=30)
        self.assertEqual(resp.bytes_written, len(data))
        self.assertEqual(s.peek(r, 5, len(data)), data)
        got = b"".join(m.data for m in s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=5, length=len(data)), timeout=30))
        self.assertEqual(got, data)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=1, length=3 << 20), timeout=10)),
            contains="outside region")

    def test_register_host_file_region(self):
        a, b = self.pair()
        page = os.sysconf("SC_PAGE_SIZE")
        path = os.path.join(a.shm, "worker-owned")
        data = os.urandom(5 * page)
        with open(path, "wb") as f:
            f.write(data)
        reg = a.stub.RegisterRegion(pb.RegisterRegionRequest(
            host_file=pb.HostFileSource(path=path, offset=page, size=3 * page), name="mine"), timeout=10)
        self.assertEqual(reg.size, 3 * page)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(reg, 10, 2 * page)]), timeout=10)
        rb = b.create_region(3 * page)
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(rb, 1, 2 * page)]),
                              timeout=10)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(b.peek(rb, 1, 2 * page), data[page + 10:page + 10 + 2 * page])
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=reg.region_id), timeout=10)
        self.assertTrue(os.path.exists(path), "the worker's own file must survive deregistration")

    def test_max_uses(self):
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        ra, rb = a.create_region(1000), b.create_region(3000)
        data = os.urandom(1000)
        a.fill(ra, 0, data)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, 1000)], max_uses=2),
                                   timeout=10)
        self.assertEqual(ro.uses_left, 2)
        for i in range(2):
            op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata,
                                                          descriptors=[desc(rb, i * 1000, 1000)]), timeout=10)
            self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(b.peek(rb, 0, 2000), data + data)
        self.assertEqual(a.wait(ro.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata,
                                                      descriptors=[desc(rb, 2000, 1000)]), timeout=10)
        third = b.wait(op.operation_id)
        self.assertEqual(third.status, pb.OPERATION_STATUS_ERRORED)


if __name__ == "__main__":
    main()
