# SPDX-License-Identifier: Apache-2.0
"""The fast path: a READ or WRITE prepared once and run many times through rings in memory shared
with the sidecar (include/rdma_sidecar/fast_ring.h is the format), beside gRPC.

    with connector.fast_path() as fp:                     # rdma_sidecar.sync.Connector
        h = fp.prepare(rs.OperationKind.READ, readable_metadata, rs.Descriptor(dst))
        for _ in range(1000):
            fp.run(h).raise_for_code()

FastPath.open() connects the sidecar's fast-path socket (SOCK_SEQPACKET; by default the gRPC unix
socket's path + ".fast"), takes the HELLO and its three descriptors (the sealed ring memory and the
two doorbells: datagram sockets, eventfds from older sidecars) and maps the rings itself: stdlib only. When the sidecar offers no
fast path (the socket is missing or refuses connections, or the address is not a unix socket) the
same object works in "grpc" mode: each run is one begin_read/begin_write, waited for and released,
with the same results. `.mode` says which. A FastPath is for one thread at a time, like the C
client's rsc_fast.

Ring indices are free-running 32-bit counters; each is written by one side only. On x86-64
(total store order) an aligned 4-byte load or store through a memoryview is atomic and ordered
with the entry bytes written before it, which is all the acquire/release pairs of the format ask.
The one pair that needs more, storing cq_head and then loading cq_flags (NEED_WAKEUP: the sidecar
waits for room in the completion ring), takes an uncontended lock in between: CPython takes it with
a locked instruction, a full fence on x86. Were a wake-up missed anyway, it would come from the
sidecar's own back-off instead (at most a second later).
"""
import dataclasses
import itertools
import mmap
import os
import select
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import grpc

from . import errors
from .connector import Backend, OperationKind, OperationStatus
from .memory import as_descriptors

# ---- the wire format (fast_ring.h) ----------------------------------------------------------------

MAGIC = 0x46435352  # "RSCF"
VERSION = 1
MSG_MAX = 65536
ID_MAX = 40
DESCS_MAX = 1024

MSG_HELLO, MSG_PREPARE, MSG_UNPREPARE, MSG_RESULT = 1, 2, 3, 4
OP_RUN, OP_CANCEL = 1, 2

HDR = struct.Struct("<IIQ")                       # type, len, token
HELLO = struct.Struct("<IIQIIIIQQQII128s")        # hdr, magic, version, sq/cq entries, map_size...
PREPARE = struct.Struct("<IIQIIQII")              # hdr, kind, backend, timeout_ms, metadata_len, n_descs
DESC = struct.Struct("<40sQQ")                    # region_id, offset, length
UNPREPARE = struct.Struct("<IIQII")               # hdr, handle, reserved
RESULT = struct.Struct("<IIQiIQ512s")             # hdr, code, handle, bytes, message
SQE = struct.Struct("<QIIQQ32s")                  # user_data, opcode, handle, timeout_ms, target, reserved
CQE = struct.Struct("<QiIQII96s")                 # user_data, code, status, bytes, backend, reserved, message
_CQE_HEAD = struct.Struct("<QiIQI")               # the CQE's fields before reserved (the hot path's unpack)
_CQE_MESSAGE = 32                                 # offset of the CQE's message
CTL_SIZE = 320
# uint32 indices into the control block (byte offset / 4)
CTL_MAGIC, CTL_VERSION, CTL_SQ_ENTRIES, CTL_CQ_ENTRIES = 0, 1, 2, 3
CTL_SQ_HEAD, CTL_SQ_TAIL, CTL_CQ_HEAD, CTL_CQ_TAIL = 64 // 4, 128 // 4, 192 // 4, 256 // 4
CTL_CQ_FLAGS = 196 // 4
CQ_NEED_WAKEUP = 1  # in cq_flags: ring the submission doorbell after reading completions

assert (HELLO.size, PREPARE.size, DESC.size, RESULT.size, SQE.size, CQE.size) == (192, 40, 56, 544, 64, 128)

_U32 = 0xFFFFFFFF
_ONE = (1).to_bytes(8, "little")


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


def pack_prepare(token: int, kind: int, metadata: str, descs: List[Tuple[str, int, int]], timeout_ms: int = 0,
                 backend: int = 0) -> bytes:
    """A PREPARE message: the header, the metadata text, then the descriptors at the next multiple of 8."""
    meta = metadata.encode()
    start = (PREPARE.size + len(meta) + 7) & ~7
    total = start + DESC.size * len(descs)
    out = bytearray(total)
    PREPARE.pack_into(out, 0, MSG_PREPARE, total, token, int(kind), int(backend), int(timeout_ms), len(meta),
                      len(descs))
    out[PREPARE.size:PREPARE.size + len(meta)] = meta
    for i, (rid, off, ln) in enumerate(descs):
        raw = rid.encode()
        if len(raw) > ID_MAX:
            raise ValueError("region id %r is longer than the fast path's %d bytes" % (rid, ID_MAX))
        DESC.pack_into(out, start + i * DESC.size, raw, int(off), int(ln))
    return bytes(out)


def pack_unprepare(token: int, handle: int) -> bytes:
    return UNPREPARE.pack(MSG_UNPREPARE, UNPREPARE.size, token, handle, 0)


def unpack_hello(msg: bytes) -> Dict[str, Any]:
    """The HELLO's fields as a dict; ValueError when it is not a HELLO of this version."""
    if len(msg) < HELLO.size:
        raise ValueError("HELLO of %d bytes, expected %d" % (len(msg), HELLO.size))
    (typ, ln, _tok, magic, version, sq_entries, cq_entries, map_size, sq_offset, cq_offset, max_handles, _r,
     sid) = HELLO.unpack_from(msg)
    if typ != MSG_HELLO or magic != MAGIC:
        raise ValueError("not a fast-path HELLO (type %d, magic 0x%08x)" % (typ, magic))
    if version != VERSION:
        raise ValueError("fast-path version %d, this client speaks %d" % (version, VERSION))
    for n in (sq_entries, cq_entries):
        if n == 0 or n & (n - 1):
            raise ValueError("ring of %d entries is not a power of two" % n)
    if sq_offset + sq_entries * SQE.size > map_size or cq_offset + cq_entries * CQE.size > map_size \
            or map_size < CTL_SIZE:
        raise ValueError("HELLO's rings lie outside its map size %d" % map_size)
    return dict(sq_entries=sq_entries, cq_entries=cq_entries, map_size=map_size, sq_offset=sq_offset,
                cq_offset=cq_offset, max_handles=max_handles, sidecar_id=_cstr(sid))


def unpack_result(msg: bytes) -> Tuple[int, int, int, int, str]:
    """(token, code, handle, bytes, message) of a RESULT."""
    if len(msg) < RESULT.size:
        raise ValueError("RESULT of %d bytes, expected %d" % (len(msg), RESULT.size))
    typ, _ln, token, code, handle, nbytes, message = RESULT.unpack_from(msg)
    if typ != MSG_RESULT:
        raise ValueError("expected a RESULT, got message type %d" % typ)
    return token, code, handle, nbytes, _cstr(message)


def pack_sqe(user_data: int, opcode: int, handle: int = 0, timeout_ms: int = 0, target: int = 0) -> bytes:
    return SQE.pack(user_data, opcode, handle, timeout_ms, target, b"")  # "32s" pads b"" with zeros


@dataclasses.dataclass
class FastCompletion:
    """The end of one run (or of a cancel request). code: gRPC status code, 0 when the run is
    COMPLETE (a cancel: delivered); status: the operation's end (COMPLETE, CANCELLED, ERRORED), 0
    when the entry was refused before a transfer began; bytes moved; backend that moved them."""
    user_data: int
    code: int
    status: int
    backend: int
    bytes: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return errors._BY_VALUE.get(self.code, grpc.StatusCode.UNKNOWN)

    def raise_for_code(self) -> "FastCompletion":
        """Raises the SidecarError subclass for code (CancelledError, DeadlineExceededError,
        NotFoundError...) when it is not 0; returns self otherwise."""
        if self.code:
            raise errors.error_for(self.grpc_code, self.message or "fast-path run failed")
        return self


_STATUS = {int(m): m for m in OperationStatus}
_BACKEND = {int(m): m for m in Backend}


def unpack_cqe(buf: Any, offset: int = 0) -> FastCompletion:
    # Hot path (every run): the fields without the 96-byte message, the enums from a dict, and the
    # message decoded only when it is not empty (a successful run's is).
    user_data, code, status, nbytes, backend = _CQE_HEAD.unpack_from(buf, offset)
    m = offset + _CQE_MESSAGE
    return FastCompletion(user_data, code, _STATUS.get(status, status), _BACKEND.get(backend, backend), nbytes,
                          _cstr(buf[m:m + CQE.size - _CQE_MESSAGE]) if buf[m] else "")


# ---- the client -----------------------------------------------------------------------------------

_INTERNAL = 1 << 63  # user_data of run()'s own submissions (submit() takes any other value)


def _default_socket(address: str) -> Optional[str]:
    return address[len("unix:"):] + ".fast" if address.startswith("unix:") else None


class FastPath:
    """One fast-path session with this worker's sidecar (or its gRPC stand-in); see the module
    docstring. Use FastPath.open() (or sync.Connector.fast_path()); close() or `with` ends it:
    runs in flight are cancelled and the handles go."""

    def __init__(self) -> None:
        self.mode = "grpc"
        self.sidecar_id = ""
        self.spin_us = 50
        self.rpc_timeout = 30.0
        self._sync: Any = None          # a sync.Connector: grpc mode, CUDA descriptors
        self._owns_sync = False
        self._lookup: Any = None        # what finds the region of a host buffer (region_of)
        self._sock: Optional[socket.socket] = None
        self._mm: Optional[mmap.mmap] = None
        self._u32: Optional[memoryview] = None
        self._memfd = self._sq_efd = self._cq_efd = -1
        self._tokens = itertools.count(1)
        self._internal = itertools.count(_INTERNAL)
        self._backlog: List[FastCompletion] = []
        self._handles: Dict[int, Any] = {}     # handle -> what keeps its memory alive (ring) / its request (grpc)
        self._pending: Dict[int, Any] = {}     # grpc mode: user_data -> operation in flight
        self._next_handle = itertools.count(1)
        self._in_flight = 0
        self._fence = threading.Lock()  # see the module docstring (NEED_WAKEUP)
        self.closed = False

    # ---- opening ----
    @classmethod
    def open(cls, connector_or_address: Any = None, socket_path: Optional[str] = None, spin_us: Optional[int] = None,
             require_ring: bool = False) -> "FastPath":
        """A session with the sidecar of `connector_or_address` (a sync or asyncio Connector, or a
        gRPC address; None: $RDMA_SIDECAR_ADDR or the default socket). socket_path: the fast-path
        socket (default: the unix address + ".fast"). spin_us: how long run()/reap() poll the
        completion ring before sleeping on its doorbell (None: 50 where this process may run on 4 CPUs
        or more, else 0: a poller with fewer takes the CPU the sidecar needs). When the sidecar offers no fast path, the
        session runs over gRPC (mode "grpc"), or with require_ring raises UnavailableError. A socket
        that refuses the session raises what the sidecar answers in place of HELLO
        (PermissionDeniedError for a uid outside --allowed-uids, ResourceExhaustedError when it
        holds --fast-path-max-sessions, or this uid's share of them), or UnavailableError when it closes without a word."""
        from . import connector as aio
        from . import sync
        self = cls()
        if spin_us is None:
            spin_us = 50 if len(os.sched_getaffinity(0)) >= 4 else 0
        self.spin_us = spin_us
        c = connector_or_address
        if isinstance(c, sync.Connector):
            self._sync, self._lookup = c, c
        elif isinstance(c, aio.Connector):
            self._lookup = c
            self._sync, self._owns_sync = sync.Connector(c.address, c.rpc_timeout), True
        else:
            self._sync, self._owns_sync = sync.Connector(c), True
            self._lookup = self._sync
        self.rpc_timeout = self._sync.aio.rpc_timeout
        path = socket_path or _default_socket(self._sync.address)
        try:
            if path is None:
                raise _NoRing("the sidecar's address %s is not a unix socket" % self._sync.address)
            self._connect(path)
        except _NoRing as e:
            if require_ring:
                self.close()
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                              "no fast path: %s (require_ring=True)" % e) from None
            self.mode = "grpc"
        except BaseException:
            self.close()
            raise
        return self

    def _connect(self, path: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.settimeout(self.rpc_timeout)
            try:
                s.connect(path)
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise _NoRing("%s: %s" % (path, e.strerror)) from None
            try:
                msg, fds, _flags, _addr = socket.recv_fds(s, MSG_MAX, 3)
            except socket.timeout:
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                              "no HELLO from the sidecar on %s within %ss" % (path, self.rpc_timeout)) from None
            except (ConnectionResetError, BrokenPipeError):
                msg, fds = b"", []
            if not msg:
                for fd in fds:
                    os.close(fd)
                raise errors.UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    "the sidecar closed the fast-path socket %s before its HELLO: this uid (%d) may not be in its "
                    "--allowed-uids, or it holds --fast-path-max-sessions already; its log says which"
                    % (path, os.geteuid()))
            if len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                if len(msg) >= HDR.size and HDR.unpack_from(msg)[0] == MSG_RESULT:
                    # A refusal in place of HELLO (a uid outside --allowed-uids, no session left).
                    _tok, code, _h, _n, message = unpack_result(msg)
                    raise errors.error_for(errors._BY_VALUE.get(code, grpc.StatusCode.UNKNOWN),
                                           "fast path %s refused: %s" % (path, message))
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                              "fast-path HELLO came with %d descriptors, not 3" % len(fds))
            self._memfd, self._sq_efd, self._cq_efd = fds
            try:
                h = unpack_hello(msg)
            except ValueError as e:
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE, "fast path %s: %s" % (path, e)) from None
            self._mm = mmap.mmap(self._memfd, h["map_size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._u32 = memoryview(self._mm)[:CTL_SIZE].cast("I")
            u = self._u32
            if (u[CTL_MAGIC], u[CTL_VERSION], u[CTL_SQ_ENTRIES], u[CTL_CQ_ENTRIES]) != \
                    (MAGIC, VERSION, h["sq_entries"], h["cq_entries"]):
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                              "fast path %s: the ring memory's control block disagrees with HELLO" % path)
            self.sq_entries, self.cq_entries = h["sq_entries"], h["cq_entries"]
            self.sq_offset, self.cq_offset = h["sq_offset"], h["cq_offset"]
            self.max_handles, self.map_size, self.sidecar_id = h["max_handles"], h["map_size"], h["sidecar_id"]
            self._sq_tail = u[CTL_SQ_TAIL]
            self._cq_head = u[CTL_CQ_HEAD]
            self._poll = select.poll()
            self._poll.register(self._cq_efd, select.POLLIN)
            self._poll.register(s.fileno(), select.POLLIN | select.POLLHUP)
            self._sock = s
            self.mode = "ring"
        except BaseException:
            if self._sock is None:
                s.close()
            raise

    # ---- lifetime ----
    def close(self) -> None:
        """Ends the session: the sidecar cancels runs in flight and forgets the handles. grpc mode:
        the runs in flight are cancelled and released here."""
        if self.closed:
            return
        self.closed = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._u32 is not None:
            self._u32.release()
            self._u32 = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        for fd in (self._memfd, self._sq_efd, self._cq_efd):
            if fd >= 0:
                os.close(fd)
        self._memfd = self._sq_efd = self._cq_efd = -1
        for op in self._pending.values():
            try:
                op.release()
            except errors.SidecarError:
                pass
        self._pending.clear()
        self._handles.clear()
        if self._owns_sync and self._sync is not None:
            self._sync.close()
        self._sync = None

    def __enter__(self) -> "FastPath":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the fast path is closed")

    # ---- preparing ----
    def _wire(self, descriptors: Any) -> Tuple[list, List[Tuple[str, int, int]]]:
        """Descriptors (the package's, or (region_id, offset, length) tuples) -> (what keeps the
        memory alive, [(region_id, offset, length)])."""
        ds = as_descriptors(descriptors)
        out = []
        for d in ds:
            if d.kind == "region":
                out.append((d.region_id, d.offset, d.length))
            elif d.kind == "host":
                r = self._lookup.region_of(d.obj)
                out.append((r.region_id, d.addr - r.base, d.length))
            else:  # CUDA: registered with the sidecar by IPC handle, as the gRPC calls do
                from .sync import _drive
                _, wire = _drive(self._sync.aio._wire([d]))
                out.append((wire[0].region_id, wire[0].offset, wire[0].length))
        return ds, out

    def prepare(self, kind: int, metadata: Any, descriptors: Any, timeout_ms: int = 0, backend: int = 0) -> int:
        """Hands the sidecar a READ or WRITE (kind) once: the peer's metadata (rsm1. text, a
        MetadataEvent or passive operation, whose passive side accepts many uses) and the local
        descriptors. Returns the handle to run. timeout_ms: each run's default deadline (0: the
        sidecar's --default-timeout); backend: 0 = the fastest both sides offer. Raises the
        SidecarError the sidecar answers with (InvalidArgumentError for descriptors that do not
        fit the metadata, ...)."""
        self._check_open()
        from .connector import _metadata_text
        from .sync import Operation as SyncOp
        kind = OperationKind(kind)
        if kind not in (OperationKind.READ, OperationKind.WRITE):
            raise ValueError("the fast path runs READ or WRITE, not %s" % kind.name)
        meta = _metadata_text(metadata.aio if isinstance(metadata, SyncOp) else metadata)
        keep, wire = self._wire(descriptors)
        if self.mode == "grpc":
            h = next(self._next_handle)
            self._handles[h] = (kind, meta, keep, wire, int(timeout_ms), int(backend))
            return h
        token, code, handle, _nbytes, message = self._request(
            pack_prepare(next(self._tokens), kind, meta, wire, timeout_ms, backend))
        if code:
            raise errors.error_for(errors._BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), message)
        self._handles[handle] = keep
        return handle

    def unprepare(self, handle: int) -> None:
        """Forgets a handle (runs of it in flight go on to their end)."""
        self._check_open()
        if self.mode == "grpc":
            if self._handles.pop(handle, None) is None:
                raise errors.NotFoundError(grpc.StatusCode.NOT_FOUND, "no fast-path handle %d" % handle)
            return
        _t, code, _h, _n, message = self._request(pack_unprepare(next(self._tokens), handle))
        if code:
            raise errors.error_for(errors._BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), message)
        self._handles.pop(handle, None)

    def _request(self, msg: bytes) -> Tuple[int, int, int, int, str]:
        """Sends one message on the socket and returns the RESULT that echoes its token."""
        token = HDR.unpack_from(msg)[2]
        assert self._sock is not None
        try:
            self._sock.sendall(msg)
            end = time.monotonic() + self.rpc_timeout
            while True:
                self._sock.settimeout(max(0.001, end - time.monotonic()))
                got = self._sock.recv(MSG_MAX)
                if not got:
                    raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE, "the sidecar ended the fast-path session")
                res = unpack_result(got)
                if res[0] == token:
                    return res
        except socket.timeout:
            raise errors.DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                               "no RESULT from the sidecar within %ss" % self.rpc_timeout) from None
        except (ConnectionResetError, BrokenPipeError) as e:
            raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                          "the sidecar ended the fast-path session (%s)" % e.strerror) from None

    # ---- running ----
    def submit(self, handle: int, user_data: int, timeout_ms: int = 0) -> None:
        """Queues one run of handle without waiting; its completion carries user_data (below 2^63).
        ResourceExhaustedError while the submission ring is full: reap() first."""
        self._check_open()
        if not 0 <= user_data < _INTERNAL:
            raise ValueError("user_data must be in [0, 2^63): the values above are run()'s own")
        self._submit(handle, user_data, timeout_ms)

    def _submit(self, handle: int, user_data: int, timeout_ms: int) -> None:
        if self.mode == "grpc":
            self._grpc_begin(handle, user_data, timeout_ms)
            return
        self._post(None, user_data, OP_RUN, handle, int(timeout_ms), 0)

    def cancel(self, user_data: int, cancel_user_data: int) -> None:
        """Asks the sidecar to cancel the run submitted with user_data; that run's completion says
        how it ended. The cancel's own completion (code 0, or 5 NOT_FOUND when no such run is in
        flight) carries cancel_user_data."""
        self._check_open()
        if self.mode == "grpc":
            op = self._pending.get(user_data)
            if op is None:
                self._backlog.append(FastCompletion(cancel_user_data, grpc.StatusCode.NOT_FOUND.value[0], 0, 0, 0,
                                                    "no run with user_data %d in flight" % user_data))
                return
            try:
                op.cancel()
            except errors.SidecarError:
                pass  # its own completion tells how it ends
            self._backlog.append(FastCompletion(cancel_user_data, 0, 0, 0, 0, ""))
            return
        self._post(None, cancel_user_data, OP_CANCEL, 0, 0, user_data)

    def _post(self, sqe: Optional[bytes], *fields: int) -> None:
        """Writes one entry at sq tail (the SQE bytes, or with sqe None its fields: user_data,
        opcode, handle, timeout_ms, target, packed in place), then publishes the tail, then rings
        the doorbell."""
        u = self._u32
        assert u is not None and self._mm is not None
        tail = self._sq_tail
        if (tail - u[CTL_SQ_HEAD]) & _U32 >= self.sq_entries:
            raise errors.ResourceExhaustedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the submission ring is full (%d entries not yet taken): reap completions first" % self.sq_entries)
        off = self.sq_offset + (tail & (self.sq_entries - 1)) * SQE.size
        if sqe is None:
            SQE.pack_into(self._mm, off, *fields, b"")
        else:
            self._mm[off:off + SQE.size] = sqe
        self._sq_tail = (tail + 1) & _U32
        u[CTL_SQ_TAIL] = self._sq_tail  # the entry's bytes are stored before the tail (TSO)
        self._ring()

    def _ring(self) -> None:
        """Rings the submission doorbell; never blocks (the doorbell ends the sidecar hands over
        are non-blocking): a full doorbell has rings pending already."""
        try:
            os.write(self._sq_efd, _ONE)
        except (BlockingIOError, ConnectionRefusedError, BrokenPipeError):
            pass

    def run(self, handle: int, timeout_ms: int = 0) -> FastCompletion:
        """Runs handle once and waits for its end (timeout_ms: this run's deadline, 0: the handle's).
        Returns the completion (check .ok, or .raise_for_code()); completions of submit()ted runs
        that arrive meanwhile wait for reap()."""
        if self.closed:
            self._check_open()
        ud = next(self._internal)
        if self.mode == "grpc":
            return self._grpc_run(handle, ud, timeout_ms)
        self._post(None, ud, OP_RUN, handle, int(timeout_ms), 0)
        u = self._u32
        while True:
            if u[CTL_CQ_TAIL] != self._cq_head:  # what _drain would find: nothing else to do
                for c in self._drain():
                    if c.user_data == ud:
                        return c
                    self._backlog.append(c)
            self._sleep(None)

    def reap(self, max: int = 64, timeout_ms: Optional[int] = None) -> List[FastCompletion]:  # noqa: A002
        """Up to max completions, waiting up to timeout_ms (None: for ever; 0: not at all) for the
        first. An empty list at the timeout."""
        self._check_open()
        end = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
        while True:
            if self.mode == "ring":
                self._backlog.extend(self._drain())
            else:
                self._grpc_collect()
            if self._backlog:
                out, self._backlog = self._backlog[:max], self._backlog[max:]
                return out
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return []
            if self.mode == "ring":
                self._sleep(left)
            else:
                self._grpc_wait(left)

    def _drain(self) -> List[FastCompletion]:
        u = self._u32
        assert u is not None and self._mm is not None
        out = []
        head, tail = self._cq_head, u[CTL_CQ_TAIL]
        mm, base, mask = self._mm, self.cq_offset, self.cq_entries - 1
        while head != tail:
            out.append(unpack_cqe(mm, base + (head & mask) * CQE.size))
            head = (head + 1) & _U32
        if out:
            self._cq_head = head
            u[CTL_CQ_HEAD] = head  # after the entries were copied out
            with self._fence:  # the head is stored before the flag is loaded
                pass
            if u[CTL_CQ_FLAGS] & CQ_NEED_WAKEUP:  # the sidecar waits for this room
                self._ring()
        return out

    def _sleep(self, timeout: Optional[float]) -> None:
        """Polls cq tail for spin_us, then sleeps on the completion doorbell (and the socket, which
        the sidecar closes when it ends the session) for at most timeout seconds."""
        u = self._u32
        assert u is not None
        if self.spin_us:
            spin_end = time.perf_counter() + self.spin_us / 1e6
            while time.perf_counter() < spin_end:
                if u[CTL_CQ_TAIL] != self._cq_head:
                    return
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        for fd, _ev in self._poll.poll(ms):
            if fd == self._cq_efd:
                self._clear_bell()
            elif u[CTL_CQ_TAIL] == self._cq_head and self._session_ended():
                raise errors.UnavailableError(grpc.StatusCode.UNAVAILABLE, "the sidecar ended the fast-path session "
                                              "(its log says why)")

    def _clear_bell(self) -> None:
        """Takes every ring waiting on the completion doorbell: one datagram per read (an older
        sidecar's eventfd: one read takes all). The fd is non-blocking: EAGAIN ends it."""
        try:
            for _ in range(1 << 16):
                os.read(self._cq_efd, 8)
        except BlockingIOError:
            pass

    def _session_ended(self) -> bool:
        try:
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""  # type: ignore[union-attr]
        except BlockingIOError:
            return False
        except OSError:
            return True

    # ---- grpc mode: one begin_read/begin_write per run, waited for and released ----
    def _grpc_begin(self, handle: int, user_data: int, timeout_ms: int) -> Any:
        h = self._handles.get(handle)
        if h is None:
            self._backlog.append(FastCompletion(user_data, grpc.StatusCode.NOT_FOUND.value[0], 0, 0, 0,
                                                "no fast-path handle %d in this session" % handle))
            return None
        kind, meta, _keep, wire, h_timeout, backend = h
        begin = self._sync.begin_read if kind == OperationKind.READ else self._sync.begin_write
        ms = timeout_ms or h_timeout
        try:
            op = begin(meta, list(wire), timeout=ms / 1000.0 if ms else None, backend=backend or None)
        except errors.SidecarError as e:
            self._backlog.append(FastCompletion(user_data, e.code.value[0], 0, 0, 0, e.message))
            return None
        self._pending[user_data] = op
        return op

    def _grpc_finish(self, user_data: int, op: Any) -> FastCompletion:
        self._pending.pop(user_data, None)
        err = op.error
        code = 0 if op.status == OperationStatus.COMPLETE else \
            (err.code.value[0] if err is not None else grpc.StatusCode.UNKNOWN.value[0])
        c = FastCompletion(user_data, code, op.status, op.backend, op.bytes_done, err.message if err else "")
        try:
            op.release()
        except errors.SidecarError:
            pass
        return c

    def _grpc_run(self, handle: int, user_data: int, timeout_ms: int) -> FastCompletion:
        n = len(self._backlog)
        op = self._grpc_begin(handle, user_data, timeout_ms)
        if op is None:
            return self._backlog.pop(n)
        try:
            op.wait_for_completion()
        except errors.SidecarError:
            pass  # the completion says how it ended
        return self._grpc_finish(user_data, op)

    def _grpc_collect(self) -> None:
        for ud, op in list(self._pending.items()):
            if op.refresh().terminal:
                self._backlog.append(self._grpc_finish(ud, op))

    def _grpc_wait(self, left: Optional[float]) -> None:
        if not self._pending:
            time.sleep(min(left, 0.05) if left is not None else 0.05)
            return
        op = next(iter(self._pending.values()))
        try:
            op.wait_for_completion(timeout=min(left, 1.0) if left is not None else 1.0)
        except errors.SidecarError:
            pass

    def __repr__(self) -> str:
        return "FastPath(%s, %s)" % (self.mode, "closed" if self.closed else self.sidecar_id or "open")


class _NoRing(Exception):
    """The sidecar offers no fast path here (grpc mode, unless the ring is required)."""


__all__ = ["FastPath", "FastCompletion", "pack_prepare", "pack_unprepare", "pack_sqe", "unpack_hello",
           "unpack_result", "unpack_cqe"]
