# SPDX-License-Identifier: Apache-2.0
"""The blocking API (rdma_sidecar.sync) against two real sidecars: bytes compared for NumPy arrays
and torch tensors of several dtypes and odd shapes, slices at offsets, reads and writes across
sidecars (TCP) and inside one (LOCAL), errors, cancellation, timeouts, scheduling, disposal."""
import os
import time

import grpc
import numpy as np
import pytest

import rdma_sidecar as rs
from conftest import SLOW, addr, leftovers

torch = pytest.importorskip("torch", reason="python3-torch is not installed (apt-get install python3-torch)")

RNG = np.random.default_rng(7)


def rand_fill(a):
    raw = a.view(np.uint8) if isinstance(a, np.ndarray) else a.view(torch.uint8).numpy()
    raw[...] = RNG.integers(0, 256, raw.shape, dtype=np.uint8)


def host_bytes(a):
    """The raw bytes (NaNs compare equal, bfloat16 works)."""
    return (a.contiguous().view(torch.uint8).numpy() if isinstance(a, torch.Tensor) else a).tobytes()


def test_info_health_and_default_address(cluster, ca, monkeypatch):
    info = ca.info()
    assert info.sidecar_id == "a" and info.signing_enabled and info.nats_state == "connected"
    assert ca.health() == "SERVING"
    monkeypatch.setenv("RDMA_SIDECAR_ADDR", addr(cluster.b))
    with rs.sync.Connector() as c:
        assert c.address == addr(cluster.b) and c.info().sidecar_id == "b"
    monkeypatch.delenv("RDMA_SIDECAR_ADDR")
    assert rs.Connector().address == "unix:/tmp/rdma-sidecar/sidecar.sock"


@pytest.mark.parametrize("dtype,shape", [(np.uint8, (4099,)), (np.int16, (3, 5, 7)), (np.float32, (17, 33)),
                                         (np.float64, (5, 1, 9)), (np.complex64, (11,))])
def test_numpy_read_across_sidecars(ca, cb, dtype, shape):
    src = ca.empty(shape, dtype)
    rand_fill(src)
    # The destination is bigger than the source: the read lands at an offset, the rest is a canary.
    dst = cb.empty((int(np.prod(shape)) + 13,), dtype)
    rand_fill(dst)
    before = dst.tobytes()
    n = src.size
    with ca.create_readable(rs.Descriptor(src), timeout=30) as readable:
        assert readable.status == rs.OperationStatus.INITIALIZED and readable.metadata.startswith("rsm1.")
        with cb.begin_read(readable.metadata, rs.Descriptor(dst[5:5 + n])) as op:
            assert op.wait_for_completion(30 * SLOW) == rs.OperationStatus.COMPLETE
            assert op.bytes_done == op.bytes_total == src.nbytes and op.backend == rs.Backend.TCP
        assert readable.refresh() == rs.OperationStatus.COMPLETE
    assert dst[5:5 + n].tobytes() == src.tobytes()
    isz = np.dtype(dtype).itemsize
    assert dst.tobytes()[:5 * isz] == before[:5 * isz] and dst.tobytes()[(5 + n) * isz:] == before[(5 + n) * isz:]
    ca.free(src)
    cb.free(dst)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int64", "bool", "uint8"])
def test_torch_tensor_slices(ca, cb, dtype):
    dt = getattr(torch, dtype)
    src = ca.empty((7, 13, 3), dt)
    rand_fill(src)
    if dt == torch.bool:
        src.view(torch.uint8).clamp_(0, 1)
    dst = cb.zeros((9, 13, 3), dt)
    piece = src[2:6]  # contiguous, at an offset into the storage
    assert piece.storage_offset() > 0
    with ca.create_readable(piece) as readable, cb.begin_read(readable, dst[4:8]) as op:
        op.wait_for_completion(30 * SLOW)
    assert host_bytes(dst[4:8]) == host_bytes(piece)
    assert not dst[:4].view(torch.uint8).any() and not dst[8:].view(torch.uint8).any()


def test_write_across_sidecars_and_local(ca, cb):
    src = ca.empty((1000, 3), np.float32)
    rand_fill(src)
    dst = cb.zeros((1000, 3), np.float32)
    with cb.create_writable(rs.Descriptor(dst), uses=1) as writable:
        with ca.begin_write(writable.metadata, rs.Descriptor(src)) as op:
            op.wait_for_completion(30 * SLOW)
        assert writable.wait_for_completion(10) == rs.OperationStatus.COMPLETE
    assert dst.tobytes() == src.tobytes()
    # LOCAL: both ends on sidecar a, two descriptors each.
    out = ca.zeros((2000, 3), np.float32)
    with ca.create_writable([out[:500], out[1000:1500]]) as w, ca.begin_write(w, [src[:500], src[500:]]) as op:
        op.wait_for_completion(30 * SLOW)
        assert op.backend == rs.Backend.LOCAL
    assert out[:500].tobytes() == src[:500].tobytes() and out[1000:1500].tobytes() == src[500:].tobytes()
    assert not out[500:1000].any() and not out[1500:].any()


def test_traceparent_ties_both_sides(ca, cb):
    # The caller's W3C traceparent (sent as gRPC metadata) names the transfer's trace on both
    # sidecars; without one the sidecar starts a trace of its own, which the reader's side takes.
    tid = os.urandom(16).hex()
    tp = "00-%s-%s-01" % (tid, os.urandom(8).hex())
    src = ca.empty((333,), np.uint8)
    rand_fill(src)
    dst = cb.zeros((333,), np.uint8)
    with ca.create_readable(rs.Descriptor(src), traceparent=tp) as readable:
        with cb.begin_read(readable.metadata, rs.Descriptor(dst), traceparent=tp) as op:
            op.wait_for_completion(30 * SLOW)
            assert op.trace_id == tid
        assert readable.wait_for_completion(10) == rs.OperationStatus.COMPLETE
        assert readable.trace_id == tid
    assert dst.tobytes() == src.tobytes()
    with ca.create_readable(rs.Descriptor(src)) as readable:
        with cb.begin_read(readable.metadata, rs.Descriptor(dst)) as op:
            op.wait_for_completion(30 * SLOW)
            assert len(op.trace_id) == 32 and op.trace_id != tid
        readable.wait_for_completion(10)
        assert readable.trace_id == op.trace_id


def test_memoryview_and_explicit_ranges(ca, cb):
    region = ca.create_region(10000, "raw")
    mv = region.memoryview()
    mv[:] = os.urandom(10000)
    dst = cb.create_region(5000)
    with ca.create_readable([rs.Descriptor(mv[100:1100]), (region, 5000, 777), (region.region_id, 9000, 1000)]) as r:
        with cb.begin_read(r, [(dst, 0, 1000), dst.memoryview()[2000:2777], (dst.region_id, 4000, 1000)]) as op:
            op.wait_for_completion(30 * SLOW)
    got = dst.memoryview()
    assert got[:1000] == mv[100:1100] and got[2000:2777] == mv[5000:5777] and got[4000:5000] == mv[9000:10000]
    assert bytes(got[1000:2000]) == bytes(1000)
    del mv, got


def test_host_memory_outside_regions_must_be_copied(ca):
    plain = np.arange(100, dtype=np.int32)
    with pytest.raises(rs.NotInRegionError, match="copy_into_region"):
        ca.create_readable(rs.Descriptor(plain))
    assert ca.list_operations() == []
    copy = ca.copy_into_region(plain)
    assert ca.region_of(copy) and copy.tobytes() == plain.tobytes()
    t = ca.copy_into_region(torch.arange(10, dtype=torch.int16))
    assert torch.equal(t, torch.arange(10, dtype=torch.int16))
    mv = ca.copy_into_region(b"hello sidecar")
    assert bytes(mv) == b"hello sidecar"
    with ca.create_readable([copy, t, mv]) as op:
        assert op.bytes_total == 400 + 20 + 13
    with pytest.raises(ValueError, match="non-contiguous"):
        rs.Descriptor(copy[::2])


def test_errors_carry_code_and_message(cluster, ca, cb):
    src = ca.zeros(64, np.uint8)
    dst = cb.zeros(64, np.uint8)
    with pytest.raises(rs.InvalidArgumentError) as e:
        cb.begin_read("rsm1.!!!", rs.Descriptor(dst))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "base64url" in e.value.message
    with pytest.raises(rs.NotFoundError) as e:
        ca.create_readable(("r-nope", 0, 10))
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "r-nope" in e.value.message
    with ca.create_readable(rs.Descriptor(src), audience="someone-else") as r:
        with pytest.raises(rs.PermissionDeniedError) as e:
            cb.begin_read(r.metadata, rs.Descriptor(dst))
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED and "someone-else" in e.value.message
    with ca.create_readable(rs.Descriptor(src), uses=1) as r:
        with cb.begin_read(r.metadata, rs.Descriptor(dst)) as op:
            op.wait_for_completion(30 * SLOW)
        with pytest.raises(rs.SidecarError) as e:
            cb.begin_read(r.metadata, rs.Descriptor(dst)).wait_for_completion(30 * SLOW)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
        assert "already used" in e.value.message
    # Length mismatch: the sidecar says which lengths differ.
    with ca.create_readable(rs.Descriptor(src)) as r:
        with pytest.raises(rs.InvalidArgumentError) as e:
            cb.begin_read(r.metadata, rs.Descriptor(dst[:10])).wait_for_completion(30 * SLOW)
        assert "64" in e.value.message and "10" in e.value.message
    # The failed begin_reads are released by the connector's close (checked by nothing_left).


def test_timeouts(ca, cb):
    src = ca.zeros(100, np.uint8)
    with ca.create_readable(rs.Descriptor(src), timeout=60) as r:
        t = time.monotonic()
        with pytest.raises(rs.DeadlineExceededError) as e:
            r.wait_for_completion(timeout=0.3)
        assert 0.25 < time.monotonic() - t < 5 * SLOW
        assert "still INITIALIZED" in e.value.message and isinstance(e.value, TimeoutError)
        assert r.refresh() == rs.OperationStatus.INITIALIZED  # the operation goes on
    with ca.create_readable(rs.Descriptor(src), timeout=0.3) as r:
        with pytest.raises(rs.DeadlineExceededError) as e:
            r.wait_for_completion(timeout=10 * SLOW)
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and e.value.message and e.value.operation_id == r.id
        assert r.status == rs.OperationStatus.ERRORED


def test_cancel_and_scheduled(ca, cb):
    src = ca.empty(1 << 16, np.uint8)
    rand_fill(src)
    dst = cb.zeros(1 << 16, np.uint8)
    # Cancel a passive operation: waiting raises CancelledError; the metadata is dead.
    r = ca.create_readable(rs.Descriptor(src))
    assert r.cancel() == rs.OperationStatus.CANCELLED
    with pytest.raises(rs.CancelledError):
        r.wait_for_completion(5)
    with pytest.raises(rs.SidecarError):
        cb.begin_read(r.metadata, rs.Descriptor(dst)).wait_for_completion(30 * SLOW)
    r.release()
    # An active operation held SCHEDULED by a requirement, released by progress.
    req = rs.TransferRequirement("req-7", iteration=1, layer=2)
    with ca.create_readable(rs.Descriptor(src), request_id="req-7") as r:
        op = cb.begin_read(r, rs.Descriptor(dst), requirement=req)
        assert op.status == rs.OperationStatus.SCHEDULED
        assert cb.report_progress("req-7", 1, layer=1) == 0
        assert op.refresh() == rs.OperationStatus.SCHEDULED
        assert cb.report_progress("req-7", 1, layer=2) == 1
        op.wait_for_completion(30 * SLOW)
        op.release()
    assert dst.tobytes() == src.tobytes()
    # Cancel a scheduled read: the peer's readable ends too.
    dst[:] = 0
    with ca.create_readable(rs.Descriptor(src)) as r:
        op = cb.begin_read(r, rs.Descriptor(dst), requirement=rs.TransferRequirement("req-8", 3))
        assert op.cancel() == rs.OperationStatus.CANCELLED
        with pytest.raises(rs.CancelledError):
            op.wait_for_completion(5)
        op.release()
    assert not dst.any()


def test_watch_progress(ca, cb):
    n = 32 << 20
    src = ca.empty(n, np.uint8)
    rand_fill(src[:1 << 20])
    src[1 << 20:] = 0x5a
    dst = cb.zeros(n, np.uint8)
    with ca.create_readable(rs.Descriptor(src)) as r, cb.begin_read(r, rs.Descriptor(dst)) as op:
        states = list(op.watch())
    assert states[-1].status == rs.OperationStatus.COMPLETE and states[-1].bytes_done == n
    done = [s.bytes_done for s in states]
    assert done == sorted(done)
    assert op.bytes_done == n
    assert dst.tobytes() == src.tobytes()


def test_nats_publish_subscribe_to_completed_read(ca, cb):
    src = ca.empty((3, 1000), np.int32)
    rand_fill(src)
    dst = cb.zeros((3, 1000), np.int32)
    with cb.subscribe("pyclient.sync.>", queue_group="readers") as sub:
        with ca.create_readable([src[0], src[1:]]) as r:
            ca.publish("pyclient.sync.kv", r)
            ev = sub.next(timeout=10 * SLOW)
            assert (ev.subject, ev.kind, ev.issuer, ev.descriptor_lengths) == \
                ("pyclient.sync.kv", rs.OperationKind.READABLE, "a", [4000, 8000])
            assert ev.metadata == r.metadata and ev.expires_unix_ms > time.time() * 1000
            with cb.begin_read(ev, [dst[0], dst[1:]]) as op:
                op.wait_for_completion(30 * SLOW)
            r.wait_for_completion(10 * SLOW)
        assert dst.tobytes() == src.tobytes()
        with pytest.raises(TimeoutError):  # nothing more: a timeout leaves the subscription in place
            sub.next(timeout=0.2)
        # Publishing raw metadata text works too (it is verified first).
        with ca.create_readable(rs.Descriptor(src)) as r:
            ca.publish("pyclient.sync.raw", r.metadata)
            assert sub.next(timeout=10 * SLOW).metadata == r.metadata
        with pytest.raises(rs.InvalidArgumentError):
            ca.publish("pyclient.sync.raw", "rsm1.AAAA")
    with pytest.raises(rs.InvalidArgumentError, match="subject is required"):
        cb.subscribe("")


def test_close_releases_everything(cluster):
    c = rs.sync.Connector(addr(cluster.a))
    src = c.empty(100, np.uint8)
    c.create_readable(rs.Descriptor(src))
    c.create_writable(rs.Descriptor(src[:50]))
    ops, regions = leftovers(cluster.a)
    assert len(ops) == 2 and len(regions) == 1 and regions[0].live_operations == 2
    c.close()
    assert leftovers(cluster.a) == ([], [])


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_no_fd_or_mapping_leak_after_1000_operations(cluster):
    with rs.sync.Connector(addr(cluster.a)) as c:
        src = c.empty(4096, np.uint8)
        rand_fill(src)
        dst = c.zeros(4096, np.uint8)

        def one():
            with c.create_readable(rs.Descriptor(src)) as r, c.begin_read(r, rs.Descriptor(dst)) as op:
                op.wait_for_completion(30 * SLOW)

        def alloc():
            a = c.zeros((8, 512), np.float32)
            c.free(a)
        for _ in range(20):  # warm up: gRPC threads, the loop, allocator arenas
            one()
            alloc()
        fds, maps = _fds(), _maps()
        for _ in range(1000):
            one()
        for _ in range(200):
            alloc()
        assert dst.tobytes() == src.tobytes()
        assert _fds() <= fds, "fds: %d before, %d after" % (fds, _fds())
        assert _maps() <= maps + 2, "mappings: %d before, %d after" % (maps, _maps())
        assert c.list_operations() == []


def test_wait_metadata_published_before_the_wait(ca, cb):
    src = ca.empty(5003, np.uint8)
    rand_fill(src)
    dst = cb.zeros(5003, np.uint8)
    with ca.create_readable(rs.Descriptor(src)) as r:
        ca.publish("pyclient.wait.first", r)  # before the reader asks: JetStream keeps it
        ev = cb.wait_metadata("pyclient.wait.first", timeout=10 * SLOW)
        assert (ev.subject, ev.metadata, ev.issuer, ev.descriptor_lengths) == \
            ("pyclient.wait.first", r.metadata, "a", [5003])
        with cb.begin_read(ev, rs.Descriptor(dst)) as op:
            op.wait_for_completion(30 * SLOW)
        r.wait_for_completion(10 * SLOW)
    assert dst.tobytes() == src.tobytes()
    with pytest.raises(rs.DeadlineExceededError, match="nothing is stored under this subject"):
        cb.wait_metadata("pyclient.wait.none", timeout=0.3)
