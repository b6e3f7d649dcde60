# SPDX-License-Identifier: Apache-2.0
"""rdma_sidecar.fast without a sidecar: the messages it packs match fast_ring.h's layout, and its
ring handling (HELLO and its descriptors, tails and heads that wrap, doorbells, RESULT tokens, a
full submission ring, a session the other side ends, NEED_WAKEUP) against a stand-in written here
from the header, in a thread of this process, with datagram doorbells (fast_ring.h) and with the
eventfds of older sidecars. The real server is tests/integration/test_fast_path.py's."""
import fcntl
import mmap
import os
import socket
import struct
import tempfile
import threading

import pytest

from rdma_sidecar import fast
from rdma_sidecar import errors, OperationKind, OperationStatus

SQ, CQ = 8, 8
SQ_OFF, CQ_OFF = 512, 512 + 64 * SQ
SIZE = 4096


def test_sizes_match_the_header():
    assert (fast.HELLO.size, fast.PREPARE.size, fast.DESC.size, fast.RESULT.size, fast.SQE.size, fast.CQE.size) == \
        (192, 40, 56, 544, 64, 128)


def test_prepare_layout():
    m = fast.pack_prepare(9, OperationKind.WRITE, "rsm1.xyz", [("r1", 1, 2), ("a" * 40, 3, 4)], 250, 1)
    # header 40 + 8 bytes of metadata = 48 (already a multiple of 8) + 2 descriptors
    assert len(m) == 48 + 2 * 56
    assert struct.unpack_from("<IIQIIQII", m) == (2, len(m), 9, 4, 1, 250, 8, 2)
    assert m[40:48] == b"rsm1.xyz"
    assert struct.unpack_from("<40sQQ", m, 48) == (b"r1".ljust(40, b"\0"), 1, 2)
    assert struct.unpack_from("<40sQQ", m, 104) == (b"a" * 40, 3, 4)
    odd = fast.pack_prepare(1, OperationKind.READ, "rsm1.x", [("r", 0, 1)])
    assert len(odd) == 48 + 56 and odd[46:48] == b"\0\0"  # padded to the next multiple of 8
    with pytest.raises(ValueError):
        fast.pack_prepare(1, OperationKind.READ, "rsm1.x", [("a" * 41, 0, 1)])


def test_sqe_cqe_result_unprepare():
    assert fast.pack_sqe(5, fast.OP_CANCEL, 0, 0, 77) == struct.pack("<QIIQQ", 5, 2, 0, 0, 77) + bytes(32)
    assert fast.pack_unprepare(3, 12) == struct.pack("<IIQII", 3, 24, 3, 12, 0)
    cqe = struct.pack("<QiIQII96s", 42, 4, 5, 100, 1, 0, b"deadline passed")
    c = fast.unpack_cqe(cqe)
    assert (c.user_data, c.code, c.status, c.bytes, c.backend, c.message) == (42, 4, 5, 100, 1, "deadline passed")
    assert c.status == OperationStatus.ERRORED and not c.ok
    with pytest.raises(errors.DeadlineExceededError):
        c.raise_for_code()
    res = struct.pack("<IIQiIQ512s", 4, 544, 8, 3, 0, 0, b"bad kind")
    assert fast.unpack_result(res) == (8, 3, 0, 0, "bad kind")


class StandIn:
    """A fast-path server from fast_ring.h, enough for the client: PREPARE answers handle 7 (or
    INVALID_ARGUMENT for kind 4), a RUN completes with bytes = 1000 + handle, code 5 for an
    unknown handle; CANCEL answers NOT_FOUND. `hold` keeps submissions unserved."""

    def __init__(self, path, bells="socket"):
        self.bells = bells
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.srv.bind(path)
        self.srv.listen(1)
        self.hold = threading.Event()
        self.held = threading.Event()  # the server saw hold: it takes nothing until hold clears
        self.stop = False
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self):
        conn, _ = self.srv.accept()
        self.conn = conn
        memfd = os.memfd_create("ring", os.MFD_ALLOW_SEALING)
        os.ftruncate(memfd, SIZE)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        if self.bells == "eventfd":
            sq_efd, cq_efd = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
            self.sq_mine, cq_mine = sq_efd, cq_efd
        else:  # the worker gets one end of each socketpair, the server keeps the other
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
            for a, b in pairs:
                a.setblocking(False)
                b.setblocking(False)
            self.sq_mine, sq_efd = pairs[0][0].detach(), pairs[0][1].detach()
            cq_mine, cq_efd = pairs[1][0].detach(), pairs[1][1].detach()
        self.mm = mm = mmap.mmap(memfd, SIZE)
        struct.pack_into("<IIII", mm, 0, fast.MAGIC, 1, SQ, CQ)
        hello = struct.pack("<IIQIIIIQQQII128s", 1, 192, 0, fast.MAGIC, 1, SQ, CQ, SIZE, SQ_OFF, CQ_OFF, 16, 0,
                            b"standin")
        socket.send_fds(conn, [hello], [memfd, sq_efd, cq_efd])
        if self.bells == "socket":
            os.close(sq_efd)
            os.close(cq_efd)
        head = tail = 0
        conn.settimeout(0.01)
        while not self.stop:
            try:
                msg = conn.recv(65536)
                if not msg:
                    break
                typ, ln, token = struct.unpack_from("<IIQ", msg)
                kind = struct.unpack_from("<I", msg, 16)[0]
                code, handle, msg_ = (3, 0, b"kind 4 refused") if typ == 2 and kind == 4 else (0, 7, b"")
                conn.send(struct.pack("<IIQiIQ512s", 4, 544, token + 1000, 0, 0, 0, b""))  # another token first
                conn.send(struct.pack("<IIQiIQ512s", 4, 544, token, code, handle, 99, msg_))
            except socket.timeout:
                pass
            except ConnectionResetError:
                break
            if self.hold.is_set():
                self.held.set()
                continue
            while head != struct.unpack_from("<I", mm, 128)[0]:
                ud, op, h, _tmo, target, _r = struct.unpack_from("<QIIQQ32s", mm, SQ_OFF + (head % SQ) * 64)
                head = (head + 1) & 0xFFFFFFFF
                struct.pack_into("<I", mm, 64, head)
                if op == 1:
                    cqe = (ud, 0, 3, 1000 + h, 3, 0, b"") if h == 7 else (ud, 5, 0, 0, 0, 0, b"no handle")
                else:
                    cqe = (ud, 5, 0, 0, 0, 0, b"no run %d" % target)
                struct.pack_into("<QiIQII96s", mm, CQ_OFF + (tail % CQ) * 128, *cqe)
                tail = (tail + 1) & 0xFFFFFFFF
                struct.pack_into("<I", mm, 256, tail)
                try:
                    os.write(cq_mine, (1).to_bytes(8, "little"))
                except BlockingIOError:
                    pass  # rings pending already
        conn.close()


@pytest.fixture(params=["socket", "eventfd"])
def standin(request):
    d = tempfile.mkdtemp(prefix="scfast-", dir="/tmp")
    s = StandIn(os.path.join(d, "s.sock.fast"), request.param)
    yield s, "unix:" + os.path.join(d, "s.sock")
    s.stop = True
    s.t.join(5)
    s.srv.close()
    os.unlink(os.path.join(d, "s.sock.fast"))
    os.rmdir(d)


def test_ring_against_a_stand_in(standin):
    s, address = standin
    with fast.FastPath.open(address, spin_us=0, require_ring=True) as fp:
        assert fp.mode == "ring" and fp.sidecar_id == "standin" and (fp.sq_entries, fp.cq_entries) == (SQ, CQ)
        h = fp.prepare(OperationKind.READ, "rsm1.x", [("r1", 0, 99)])
        assert h == 7
        with pytest.raises(errors.InvalidArgumentError, match="kind 4 refused"):
            fp.prepare(OperationKind.WRITE, "rsm1.x", [("r1", 0, 99)])
        for i in range(3 * SQ):  # the indices wrap the rings several times
            c = fp.run(h)
            assert (c.code, c.status, c.bytes) == (0, OperationStatus.COMPLETE, 1007), c
        c = fp.run(8)
        assert c.code == 5 and c.status == 0 and c.message == "no handle"
        with pytest.raises(errors.NotFoundError):
            c.raise_for_code()
        for i in range(5):
            fp.submit(h, i)
        fp.cancel(99, 100)
        got = []
        while len(got) < 6:
            got += fp.reap(max=4, timeout_ms=5000)
        assert [c.user_data for c in got] == [0, 1, 2, 3, 4, 100]
        assert got[-1].code == 5
        assert fp.reap(timeout_ms=0) == []
        # a submission ring that is not taken: full after SQ entries
        s.hold.set()
        assert s.held.wait(5)  # not in the middle of taking entries any more
        for i in range(SQ):
            fp.submit(h, i)
        with pytest.raises(errors.ResourceExhaustedError):
            fp.submit(h, 99)
        s.held.clear()
        s.hold.clear()
        got = []
        while len(got) < SQ:
            got += fp.reap(timeout_ms=5000)
        assert len(got) == SQ
        # the memfd is sealed: neither shrunk nor grown
        with pytest.raises(PermissionError):
            os.ftruncate(fp._memfd, 0)
        # the other side ends the session: a wait sees it
        s.hold.set()
        assert s.held.wait(5)  # it will take nothing more: the submission stays unanswered
        fp.submit(h, 1)
        s.stop = True
        with pytest.raises(errors.UnavailableError):
            fp.reap(timeout_ms=5000)


def test_need_wakeup_rings_after_reading_completions(standin):
    """A sidecar that waits for room in the completion ring sets NEED_WAKEUP in cq_flags: the
    client rings the submission doorbell once it has read completions (and not when the flag is
    clear)."""
    s, address = standin
    with fast.FastPath.open(address, spin_us=0, require_ring=True) as fp:
        h = fp.prepare(OperationKind.READ, "rsm1.x", [("r1", 0, 99)])
        assert fp.run(h).code == 0
        s.hold.set()
        assert s.held.wait(5)

        def rings():
            n = 0
            while True:
                try:
                    os.read(s.sq_mine, 8)
                    n += 1
                except BlockingIOError:
                    return n
        u = fp._u32
        for flag, want in ((0, 0), (fast.CQ_NEED_WAKEUP, 1)):
            rings()
            tail = u[fast.CTL_CQ_TAIL]  # a completion, written here as the sidecar would
            struct.pack_into("<QiIQII96s", fp._mm, CQ_OFF + (tail % CQ) * 128, 500 + flag, 0, 3, 1, 3, 0, b"")
            u[fast.CTL_CQ_FLAGS] = flag
            u[fast.CTL_CQ_TAIL] = tail + 1
            got = fp.reap(timeout_ms=0)
            assert [c.user_data for c in got] == [500 + flag]
            assert rings() == want, "flag %d" % flag
