# SPDX-License-Identifier: Apache-2.0
"""What every worker that talks to its own rdma-sidecar needs: the plumbing shared by producer.py and
consumer.py.

  import_package() the rdma_sidecar package (clients/python: pip-installed, or this checkout's)
  parse_args()     the options both workers take (--sidecar, --stubs, --size, --read-subject,
                   --write-subject, --timeout, --report) and parse_size() for sizes like 256MiB
  GpuBuffer        GPU memory this worker allocated itself (cuMemAlloc through cudadrv.py), shared
                   with the sidecar by its CUDA IPC handle; sliced like the mmap of a host region
  SidecarWorker    an rdma_sidecar.sync.Connector to the sidecar plus the bookkeeping that lets a
                   worker give back what it holds (regions, operations), and the moves of a pipeline stage:
                   the passive side (expose() ranges as an operation, publish_and_wait() for a peer
                   to use it) and the active side (receive_metadata() from subscribe(), transfer())
  run()            connect, run a worker's steps, clean up (on failure and SIGTERM too), write the report

A worker subclasses SidecarWorker, sets `name` (the prefix of its error messages) and implements
steps(); its main() is `run(MyWorker, parse_args(__doc__, ...))`. Nothing here touches the network
itself: every byte moves through the sidecar.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_STUBS = os.path.join(HERE, "..", "build", "python")
TERMINAL = ("COMPLETE", "CANCELLED", "ERRORED")


def parse_size(text):
    """'256MiB', '256M', '1G', '4096' -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        return int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError("bad size %r (e.g. 256MiB, 64K, 1048576)" % text) from None


def log(msg):
    print(msg, flush=True)


def import_package(prog, stubs=DEFAULT_STUBS):
    """The rdma_sidecar package: installed (pip install ./clients/python) or this checkout's
    clients/python with its generated half under the build directory (`stubs`, build/python: the
    CMake build writes it there, never into clients/python). Exits with a hint, prefixed `prog: `,
    when it cannot be imported."""
    sys.path.append(os.path.join(HERE, "..", "clients", "python"))
    sys.path.append(stubs)
    try:
        import rdma_sidecar
        import rdma_sidecar.sync  # noqa: F401
    except ImportError as e:
        sys.exit("%s: cannot import the rdma_sidecar package (%s): build the checkout (`cmake --build build`, "
                 "which generates its modules under build/python; --stubs names another build) "
                 "or /usr/bin/python3 -m pip install --no-build-isolation ./clients/python; the grpc module "
                 "comes with apt-get install python3-grpcio" % (prog, e))
    return rdma_sidecar


def parse_args(doc, size_help, read_subject_help, write_subject_help):
    """The command line both workers share; the help texts say what this worker does with each.

    The description is the first paragraph of `doc` (the worker's module docstring)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                epilog="Environment: RDMA_SIDECAR_ADDR and SIDECAR_PYTHON_STUBS set the "
                                       "defaults of --sidecar and --stubs.")
    p.add_argument("--sidecar", metavar="ADDR",
                   default=os.environ.get("RDMA_SIDECAR_ADDR", "unix:/tmp/rdma-sidecar/sidecar.sock"),
                   help="gRPC address of this worker's own sidecar (default: %(default)s)")
    p.add_argument("--stubs", metavar="DIR", default=os.environ.get("SIDECAR_PYTHON_STUBS", DEFAULT_STUBS),
                   help="unused: the workers use the rdma_sidecar package now (kept so that older scripts "
                        "that pass it still work)")
    p.add_argument("--size", metavar="SIZE", type=parse_size, default=parse_size("256MiB"), help=size_help)
    p.add_argument("--read-subject", metavar="SUBJECT", default="demo.read", help=read_subject_help)
    p.add_argument("--write-subject", metavar="SUBJECT", default="demo.write", help=write_subject_help)
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                   help="seconds each step may take: operation deadlines and waits (default: %(default)s)")
    p.add_argument("--report", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--gpu", metavar="DEVICE", type=int,
                   help="keep the data in GPU memory of this CUDA device, allocated by this worker and "
                        "registered with the sidecar by its IPC handle (default: host memory in a region "
                        "file); the same GPUs must be visible to the sidecar")
    a = p.parse_args()
    if a.size < 64 << 10:
        p.error("--size must be at least 64KiB")
    return a


def layout(lengths, first_gap, gap, tail=0):
    """Offsets for ranges of the given lengths, separated by gaps; returns (offsets, region size)."""
    offsets, pos = [], first_gap
    for n in lengths:
        offsets.append(pos)
        pos += n + gap
    return offsets, pos - gap + tail


def sha256_of(mm, ranges, chunk=8 << 20):
    """SHA-256 (hex) of the given (offset, length) ranges of a mapping (or a GpuBuffer), in order."""
    h = hashlib.sha256()
    for off, n in ranges:
        for pos in range(off, off + n, chunk):
            h.update(mm[pos:min(pos + chunk, off + n)])
    return h.hexdigest()


class GpuBuffer:
    """GPU memory this process allocated (cuMemAlloc, 2 MiB granules so that the IPC handle exposes
    nothing else) and reads and writes with the driver; buf[a:b] and buf[a:b] = data work as on an
    mmap. The sidecar opens it with the IPC handle: the bytes never leave the GPU for a transfer
    the NIC can reach, and are staged by the sidecar otherwise."""

    def __init__(self, cu, device, size):
        self.cu, self.device, self.size = cu, device, size
        cu.init(device)
        self.block = (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        self.ptr = cu.alloc(self.block)

    def __len__(self):
        return self.size

    def _range(self, key):
        start, stop, _ = key.indices(self.size)
        return start, max(0, stop - start)

    def __getitem__(self, key):
        start, n = self._range(key)
        self.cu.set_current(self.device)
        return self.cu.dtoh(self.ptr + start, n)

    def __setitem__(self, key, data):
        start, n = self._range(key)
        if n != len(data):
            raise ValueError("slice of %d bytes, data of %d" % (n, len(data)))
        self.cu.set_current(self.device)
        self.cu.htod(self.ptr + start, data)

    def close(self):
        if self.ptr:
            self.cu.set_current(self.device)
            self.cu.free(self.ptr)
            self.ptr = 0


class SidecarWorker:
    """A Connector (rdma_sidecar.sync) to this worker's own sidecar and what the worker holds through it.

    Every region it creates stays in `regions` and every operation it starts is listed in `ops`
    until it gives them back (release(), drop_region()); close() gives back whatever is left, so a
    failure halfway through leaves nothing allocated in the sidecar."""

    name = "worker"  # prefix of the error messages; subclasses set their own

    def __init__(self, args, rs):
        self.rs, self.args = rs, args
        self.c = rs.sync.Connector(args.sidecar, rpc_timeout=10)
        self.regions = {}  # region_id -> (Region, our view of its memory: memoryview or GpuBuffer)
        self.ops = []

    def steps(self):
        """The worker's own work, once connected; returns the report (a dict, written as JSON)."""
        raise NotImplementedError

    @staticmethod
    def status(op):
        return op.status.name

    @staticmethod
    def backend(op):
        return op.backend.name.lower()

    def connect(self):
        """GetInfo: say which sidecar we talk to; exit unless it can sign metadata."""
        info = self.c.info()
        log("connected to sidecar %s (version %s) at %s; backends: %s; nats: %s"
            % (info.sidecar_id, info.version, self.args.sidecar,
               ", ".join(self.rs.Backend(b.backend).name.lower() for b in info.backends if b.available),
               info.nats_state))
        if not info.signing_enabled:
            sys.exit("%s: sidecar %s has no signing key: start it with --key-file" % (self.name, info.sidecar_id))
        return info

    # ---- memory ----------------------------------------------------------------------------------

    def create_region(self, size, name):
        """Host memory: the sidecar allocates a file under its --shm-dir that the package maps.
        With --gpu: GPU memory of our own, registered by its CUDA IPC handle."""
        if self.args.gpu is not None:
            return self.create_gpu_region(size, name)
        r = self.c.create_region(size, name)
        mem = r.memoryview()
        self.regions[r.region_id] = (r, mem)
        log("region %s: %d bytes at %s" % (r.region_id, r.size, r.path))
        return r, mem

    def create_gpu_region(self, size, name):
        import cudadrv as cu  # beside this file: ctypes over libcuda.so.1
        buf = GpuBuffer(cu, self.args.gpu, size)
        try:
            r = self.c.register_cuda(buf.ptr, size, self.args.gpu, name)
        except BaseException:
            buf.close()
            raise
        self.regions[r.region_id] = (r, buf)
        log("region %s: %d bytes of GPU %d memory (ours, shared by CUDA IPC handle)" % (r.region_id, size, self.args.gpu))
        return r, buf

    @staticmethod
    def descriptors(region, offsets, lengths):
        return [(region, o, n) for o, n in zip(offsets, lengths)]

    def drop_region(self, region_id, force=False):
        """The package unmaps host regions first, then tells the sidecar it may free the memory.
        GPU memory is ours: the sidecar closes its IPC mapping first, then we free it."""
        region, mem = self.regions.pop(region_id)
        if isinstance(mem, GpuBuffer):
            try:
                self.c.free(region, force=force)
            finally:
                mem.close()
            return
        mem.release()
        self.c.free(region, force=force)

    # ---- operations ------------------------------------------------------------------------------

    def wait(self, op, deadline, what):
        """Waits until the operation is terminal (returns it); cancels it if the deadline passes."""
        try:
            op.wait_for_completion(max(0.001, deadline - time.monotonic()))
        except self.rs.DeadlineExceededError:
            if not op.status.terminal:
                st = op.cancel()
                raise SystemExit("%s: %s did not finish within --timeout (%s); cancelled it" % (self.name, what, st.name))
        except self.rs.SidecarError:
            pass  # ERRORED or CANCELLED: the caller reports op.status and op.error
        return op

    def publish_until_used(self, op, subject, deadline):
        """Publish the passive operation's metadata and wait until the peer has finished with it.

        Plain NATS delivers a message only to the subscribers present at that moment, so while no
        peer has started on the operation the metadata is published again (after 2 s, 4 s, 8 s...)."""
        kind = op.kind.name.lower()
        published, next_publish = 0, time.monotonic()
        while True:
            now = time.monotonic()
            if op.status == self.rs.OperationStatus.INITIALIZED and now >= next_publish:
                self.c.publish(subject, op)
                published += 1
                next_publish = now + 2 ** published
                log("published %s metadata on NATS subject %r%s"
                    % (kind, subject, "" if published == 1 else " (again: not used yet)"))
            if now >= deadline:
                op.cancel()
                raise SystemExit("%s: no peer finished %s within --timeout; cancelled it" % (self.name, op.id))
            initialized = op.status == self.rs.OperationStatus.INITIALIZED
            wake = min(deadline, next_publish) if initialized else min(deadline, now + 5)
            try:
                op.wait_for_completion(max(0.001, wake - now))
            except self.rs.DeadlineExceededError:
                if op.status.terminal:
                    return op
                continue
            except self.rs.SidecarError:
                pass
            return op

    def subscribe(self, subject):
        """SubscribeMetadata, in place when this returns: (the subscription, the same to close)."""
        sub = self.c.subscribe(subject)
        return sub, sub

    def receive_metadata(self, sub, kind, subject):
        """The next MetadataEvent of subscribe(), which must describe a `kind` ("readable" or
        "writable") operation; exits if none arrives within --timeout. Returns (event, lengths)."""
        try:
            ev = sub.next(timeout=self.args.timeout)
        except TimeoutError:
            raise SystemExit("%s: no %s metadata arrived on %r within --timeout" % (self.name, kind, subject))
        if ev.kind != self.rs.OperationKind[kind.upper()]:
            raise SystemExit("%s: expected %s metadata on %r, got %s" % (self.name, kind.upper(), subject, ev.kind.name))
        lengths = list(ev.descriptor_lengths)
        log("%s from %s: %d ranges %s (%d bytes), expires in %.1fs"
            % (kind, ev.issuer, len(lengths), lengths, sum(lengths), ev.expires_unix_ms / 1000 - time.time()))
        return ev, lengths

    def transfer(self, begin, what, metadata, region, offsets, lengths):
        """The active side: begin (connector.begin_read or begin_write) a transfer between the peer's
        operation (its signed metadata) and our ranges, wait until it is COMPLETE; exit otherwise.

        `what` ("read", "write") names it in messages. Returns (operation, its report fields)."""
        a = self.args
        t0 = time.perf_counter()
        op = begin(metadata, self.descriptors(region, offsets, lengths), timeout=a.timeout)
        self.ops.append(op)
        op = self.wait(op, time.monotonic() + a.timeout, "the " + what)
        secs = time.perf_counter() - t0
        st = self.status(op)
        if st != "COMPLETE":
            raise SystemExit("%s: %s %s ended %s: %s" % (self.name, what, op.id, st, op.error and op.error.message))
        log("%s %s COMPLETE: %d bytes over %s in %.3fs (%.2f GB/s)%s"
            % (what, op.id, op.bytes_done, self.backend(op), secs, op.bytes_done / secs / 1e9,
               ("; " + op.backend_reason) if op.backend_reason else ""))
        return op, {"bytes": op.bytes_done, "descriptors": len(lengths), "backend": self.backend(op),
                    "seconds": secs, "sidecar_ms": op.proto.completed_unix_ms - op.proto.created_unix_ms,
                    "status": st, "backend_reason": op.backend_reason}

    def expose(self, create, region, offsets, lengths):
        """The passive side: create (connector.create_readable or create_writable) an operation over
        our ranges that lives for --timeout; returns it (publish it with publish_and_wait())."""
        op = create(self.descriptors(region, offsets, lengths), timeout=self.args.timeout)
        self.ops.append(op)
        return op

    def publish_and_wait(self, op, subject):
        """publish_until_used() within --timeout; exits unless the peer COMPLETEd the operation.
        Returns the operation as it finished."""
        kind = op.kind.name.lower()
        op = self.publish_until_used(op, subject, time.monotonic() + self.args.timeout)
        st = self.status(op)
        log("%s %s finished: %s, %d/%d bytes, peer %s%s"
            % (kind, op.id, st, op.bytes_done, op.bytes_total, op.peer or "-",
               (": " + op.error.message) if op.error else ""))
        if st != "COMPLETE":
            raise SystemExit("%s: the %s ended %s" % (self.name, kind, st))
        return op

    def release(self, op):
        op.release()
        self.ops.remove(op)

    def close(self):
        """Release what is left (after a failure too): operations, mappings, regions."""
        for op in list(self.ops):
            try:
                self.release(op)
            except self.rs.SidecarError as e:
                log("release %s: %s" % (op.id, e.message))
        for region_id in list(self.regions):
            try:
                self.drop_region(region_id, force=True)
            except self.rs.SidecarError as e:
                log("deregister %s: %s" % (region_id, e.message))
        self.c.close()


def run(worker_class, args):
    """A worker's main(): import the package, connect, run steps(), give everything back, write --report.

    Exits non-zero with `name: reason` on a gRPC error, a failed step or SIGTERM; prints "done" last."""
    rs = import_package(worker_class.name, args.stubs)
    # SIGTERM (e.g. the pod stopping): unwind through `finally`, which gives everything back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("%s: terminated" % worker_class.name))
    w = worker_class(args, rs)
    try:
        w.connect()
        report = w.steps()
    except rs.SidecarError as e:
        sys.exit("%s: %s: %s" % (w.name, e.code.name, e.message))
    finally:
        w.close()
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    log("done")
