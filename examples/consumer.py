#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Consumer worker: a pipeline stage that receives bytes from the previous stage through its rdma-sidecar.

It talks gRPC only to its own sidecar and never touches the network itself:

  1. READ   subscribes to a NATS subject (through the sidecar), receives the producer's READABLE
            metadata, allocates a region from the advertised descriptor lengths and pulls the bytes
            with BeginRead into ranges at offsets of its own choosing.
  2. WRITE  creates a region, exposes three ranges of it as a WRITABLE operation, publishes the
            metadata on another subject and waits until the producer has written into it.

It prints the SHA-256 of the bytes it received (compare with the producer's) and checks that no
byte outside the ranges changed. Run examples/producer.py against the other sidecar
(scripts/demo.sh runs both).
"""
import argparse
import hashlib
import json
import mmap
import os
import queue
import signal
import sys
import threading
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


def import_stubs(path):
    """The Python stubs generated from proto/rdma_sidecar/v1/sidecar.proto (protoc + grpc plugin)."""
    try:
        import grpc
    except ImportError:
        sys.exit("consumer: the grpc module is missing: apt-get install python3-grpcio (or pip install grpcio)")
    sys.path.insert(0, os.path.abspath(path))
    try:
        from rdma_sidecar.v1 import sidecar_pb2, sidecar_pb2_grpc
    except ImportError as e:
        sys.exit("consumer: cannot import the generated stubs from %s (%s): build them with "
                 "`cmake --build build` or point --stubs at them" % (path, e))
    return grpc, sidecar_pb2, sidecar_pb2_grpc


def layout(lengths, first_gap, gap, tail=0):
    """Offsets for ranges of the given lengths, separated by gaps; returns (offsets, region size)."""
    offsets, pos = [], first_gap
    for n in lengths:
        offsets.append(pos)
        pos += n + gap
    return offsets, pos - gap + tail


def outside(ranges, size):
    """The parts of [0, size) that no range covers."""
    out, pos = [], 0
    for off, n in sorted(ranges):
        if off > pos:
            out.append((pos, off - pos))
        pos = max(pos, off + n)
    if pos < size:
        out.append((pos, size - pos))
    return out


def sha256_of(mm, ranges):
    h = hashlib.sha256()
    with memoryview(mm) as mv:
        for off, n in ranges:
            h.update(mv[off:off + n])
    return h.hexdigest()


class Consumer:
    def __init__(self, args, grpc, pb, pb_grpc):
        self.grpc, self.pb, self.args = grpc, pb, args
        self.channel = grpc.insecure_channel(args.sidecar)
        self.stub = pb_grpc.SidecarStub(self.channel)
        self.rpc_timeout = 10
        self.regions = {}  # region_id -> our mapping of its file
        self.ops = []

    def status(self, op):
        return self.pb.OperationStatus.Name(op.status).removeprefix("OPERATION_STATUS_")

    def backend(self, op):
        return self.pb.Backend.Name(op.backend).removeprefix("BACKEND_").lower()

    # ---- memory ----------------------------------------------------------------------------------

    def create_region(self, size, name):
        """The sidecar allocates a file under its --shm-dir; we map the same file."""
        r = self.stub.CreateRegion(self.pb.CreateRegionRequest(size=size, name=name), timeout=self.rpc_timeout)
        with open(r.path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), r.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.regions[r.region_id] = mm
        log("region %s: %d bytes at %s" % (r.region_id, r.size, r.path))
        return r, mm

    def descriptors(self, region, offsets, lengths):
        return [self.pb.Descriptor(region_id=region.region_id, offset=o, length=n) for o, n in zip(offsets, lengths)]

    @staticmethod
    def plant_canaries(mm, ranges, size):
        """Random bytes outside the ranges: they must be there, unchanged, after the transfer."""
        canaries = [(off, os.urandom(n)) for off, n in outside(ranges, size)]
        for off, data in canaries:
            mm[off:off + len(data)] = data
        return canaries

    @staticmethod
    def check_canaries(mm, canaries):
        for off, data in canaries:
            if mm[off:off + len(data)] != data:
                raise SystemExit("consumer: bytes outside the descriptors changed at [%d, %d)"
                                 % (off, off + len(data)))
        return sum(len(d) for _, d in canaries)

    # ---- operations ------------------------------------------------------------------------------

    def wait(self, op_id, deadline, what):
        """WaitOperation until the operation is terminal; cancel it if the deadline passes."""
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                op = self.stub.CancelOperation(self.pb.CancelOperationRequest(operation_id=op_id),
                                               timeout=self.rpc_timeout)
                raise SystemExit("consumer: %s did not finish within --timeout (%s); cancelled it"
                                 % (what, self.status(op)))
            step = min(left_ms, 5000)
            op = self.stub.WaitOperation(self.pb.WaitOperationRequest(operation_id=op_id, timeout_ms=step),
                                         timeout=step / 1000 + self.rpc_timeout)
            if self.status(op) in TERMINAL:
                return op

    def publish_until_used(self, op, subject, deadline):
        """Publish the passive operation's metadata and wait until the peer has finished with it.

        Plain NATS delivers a message only to the subscribers present at that moment, so while no
        peer has started on the operation the metadata is published again (after 2 s, 4 s, 8 s...)."""
        kind = self.pb.OperationKind.Name(op.kind).removeprefix("OPERATION_KIND_").lower()
        published, next_publish = 0, time.monotonic()
        while True:
            now = time.monotonic()
            if self.status(op) == "INITIALIZED" and now >= next_publish:
                req = self.pb.PublishMetadataRequest(subject=subject, operation_id=op.operation_id)
                self.stub.PublishMetadata(req, timeout=self.rpc_timeout)
                published += 1
                next_publish = now + 2 ** published
                log("published %s metadata on NATS subject %r%s"
                    % (kind, subject, "" if published == 1 else " (again: not used yet)"))
            if now >= deadline:
                self.stub.CancelOperation(self.pb.CancelOperationRequest(operation_id=op.operation_id),
                                          timeout=self.rpc_timeout)
                raise SystemExit("consumer: no peer finished %s within --timeout; cancelled it" % op.operation_id)
            wake = min(deadline, next_publish) if self.status(op) == "INITIALIZED" else min(deadline, now + 5)
            step = max(1, int((wake - now) * 1000))
            op = self.stub.WaitOperation(self.pb.WaitOperationRequest(operation_id=op.operation_id, timeout_ms=step),
                                         timeout=step / 1000 + self.rpc_timeout)
            if self.status(op) in TERMINAL:
                return op

    def subscribe(self, subject):
        """SubscribeMetadata as a background reader: returns (queue of MetadataEvent, call to cancel)."""
        call = self.stub.SubscribeMetadata(self.pb.SubscribeMetadataRequest(subject=subject),
                                           timeout=3 * self.args.timeout + 30)
        events = queue.Queue()

        def reader():
            try:
                for ev in call:
                    events.put(ev)
            except self.grpc.RpcError as e:
                if e.code() != self.grpc.StatusCode.CANCELLED:
                    events.put(e)
        threading.Thread(target=reader, daemon=True).start()
        return events, call

    # ---- the two steps ---------------------------------------------------------------------------

    def read_from_readable(self, events):
        a = self.args
        log("waiting for a readable on %r" % a.read_subject)
        try:
            ev = events.get(timeout=a.timeout)
        except queue.Empty:
            raise SystemExit("consumer: no readable metadata arrived on %r within --timeout" % a.read_subject)
        if isinstance(ev, Exception):
            raise ev
        if ev.kind != self.pb.OPERATION_KIND_READABLE:
            raise SystemExit("consumer: expected READABLE metadata on %r, got %s"
                             % (a.read_subject, self.pb.OperationKind.Name(ev.kind)))
        lengths = list(ev.descriptor_lengths)
        log("readable from %s: %d ranges %s (%d bytes), expires in %.1fs"
            % (ev.issuer, len(lengths), lengths, sum(lengths), ev.expires_unix_ms / 1000 - time.time()))
        # Allocate what the metadata describes, at offsets of our own choosing.
        offsets, size = layout(lengths, first_gap=4093, gap=1001, tail=77)
        region, mm = self.create_region(size, "consumer-read-target")
        ranges = list(zip(offsets, lengths))
        canaries = self.plant_canaries(mm, ranges, size)
        t0 = time.perf_counter()
        op = self.stub.BeginRead(self.pb.BeginTransferRequest(
            metadata=ev.metadata, descriptors=self.descriptors(region, offsets, lengths),
            timeout_ms=int(a.timeout * 1000)), timeout=self.rpc_timeout)
        self.ops.append(op.operation_id)
        op = self.wait(op.operation_id, time.monotonic() + a.timeout, "the read")
        secs = time.perf_counter() - t0
        st = self.status(op)
        if st != "COMPLETE":
            raise SystemExit("consumer: read %s ended %s: %s" % (op.operation_id, st, op.error.message))
        log("read %s COMPLETE: %d bytes over %s in %.3fs (%.2f GB/s)%s"
            % (op.operation_id, op.bytes_done, self.backend(op), secs, op.bytes_done / secs / 1e9,
               ("; " + op.backend_reason) if op.backend_reason else ""))
        digest = sha256_of(mm, ranges)
        log("sha256 of received bytes: %s" % digest)
        n = self.check_canaries(mm, canaries)
        log("the %d bytes outside the ranges are untouched" % n)
        self.release(op.operation_id)
        self.drop_region(region.region_id)
        return {"sha256": digest, "bytes": op.bytes_done, "descriptors": len(ranges), "backend": self.backend(op),
                "seconds": secs, "sidecar_ms": op.completed_unix_ms - op.created_unix_ms, "status": st,
                "backend_reason": op.backend_reason, "outside_untouched": n}

    def expose_for_write(self):
        a = self.args
        # Three ranges at odd offsets with odd lengths: 129 bytes, range, 8191 bytes, range,
        # 8191 bytes, range, 31 bytes.
        rest = a.size - 129 - 2 * 8191 - 31
        lengths = [rest // 3 + 5, rest // 3 - 7]
        lengths.append(rest - sum(lengths))
        offsets, size = layout(lengths, first_gap=129, gap=8191, tail=31)
        region, mm = self.create_region(size, "consumer-write-target")
        ranges = list(zip(offsets, lengths))
        canaries = self.plant_canaries(mm, ranges, size)
        op = self.stub.CreateWritable(self.pb.CreatePassiveRequest(
            descriptors=self.descriptors(region, offsets, lengths), timeout_ms=int(a.timeout * 1000)),
            timeout=self.rpc_timeout)
        self.ops.append(op.operation_id)
        log("writable %s over %d ranges %s, %d bytes"
            % (op.operation_id, len(ranges), ", ".join("%d+%d" % r for r in ranges), op.bytes_total))
        op = self.publish_until_used(op, a.write_subject, time.monotonic() + a.timeout)
        st = self.status(op)
        log("writable %s finished: %s, %d/%d bytes, peer %s%s"
            % (op.operation_id, st, op.bytes_done, op.bytes_total, op.peer or "-",
               (": " + op.error.message) if op.error.message else ""))
        if st != "COMPLETE":
            raise SystemExit("consumer: the writable ended %s" % st)
        digest = sha256_of(mm, ranges)
        log("sha256 of written bytes: %s" % digest)
        n = self.check_canaries(mm, canaries)
        log("the %d bytes outside the ranges are untouched" % n)
        self.release(op.operation_id)
        self.drop_region(region.region_id)
        return {"sha256": digest, "bytes": op.bytes_total, "descriptors": len(ranges), "passive_status": st,
                "passive_backend": self.backend(op), "peer": op.peer, "outside_untouched": n}

    def release(self, op_id):
        self.stub.ReleaseOperation(self.pb.ReleaseOperationRequest(operation_id=op_id), timeout=self.rpc_timeout)
        self.ops.remove(op_id)

    def drop_region(self, region_id, force=False):
        """Unmap first, then tell the sidecar it may free the memory."""
        self.regions.pop(region_id).close()
        self.stub.DeregisterRegion(self.pb.DeregisterRegionRequest(region_id=region_id, force=force),
                                   timeout=self.rpc_timeout)

    def close(self):
        """Release what is left (after a failure too): operations, mappings, regions."""
        for op_id in list(self.ops):
            try:
                self.release(op_id)
            except self.grpc.RpcError as e:
                log("release %s: %s" % (op_id, e.details()))
        for region_id in list(self.regions):
            try:
                self.drop_region(region_id, force=True)
            except self.grpc.RpcError as e:
                log("deregister %s: %s" % (region_id, e.details()))
        self.channel.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Environment: SIDECAR_ADDR and SIDECAR_PYTHON_STUBS set the "
                                       "defaults of --sidecar and --stubs.")
    p.add_argument("--sidecar", metavar="ADDR",
                   default=os.environ.get("SIDECAR_ADDR", "unix:/tmp/rdma-sidecar/sidecar.sock"),
                   help="gRPC address of this worker's own sidecar (default: %(default)s)")
    p.add_argument("--stubs", metavar="DIR", default=os.environ.get("SIDECAR_PYTHON_STUBS", DEFAULT_STUBS),
                   help="directory with the generated Python stubs (default: build/python)")
    p.add_argument("--size", metavar="SIZE", type=parse_size, default=parse_size("256MiB"),
                   help="bytes of the region to expose for writing, e.g. 256MiB (default: 256MiB)")
    p.add_argument("--read-subject", metavar="SUBJECT", default="demo.read",
                   help="NATS subject the producer's readable arrives on (default: %(default)s)")
    p.add_argument("--write-subject", metavar="SUBJECT", default="demo.write",
                   help="NATS subject to publish the writable on (default: %(default)s)")
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                   help="seconds each step may take: operation deadlines and waits (default: %(default)s)")
    p.add_argument("--report", metavar="FILE", help="also write the results as JSON to FILE")
    a = p.parse_args()
    if a.size < 64 << 10:
        p.error("--size must be at least 64KiB")

    grpc, pb, pb_grpc = import_stubs(a.stubs)
    # SIGTERM (e.g. the pod stopping): unwind through `finally`, which gives everything back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("consumer: terminated"))
    w = Consumer(a, grpc, pb, pb_grpc)
    report = {}
    try:
        info = w.stub.GetInfo(pb.GetInfoRequest(), timeout=w.rpc_timeout)
        log("connected to sidecar %s (version %s) at %s; backends: %s; nats: %s"
            % (info.sidecar_id, info.version, a.sidecar,
               ", ".join(pb.Backend.Name(b.backend).removeprefix("BACKEND_").lower()
                         for b in info.backends if b.available), info.nats_state))
        if not info.signing_enabled:
            sys.exit("consumer: sidecar %s has no signing key: start it with --key-file" % info.sidecar_id)
        events, sub = w.subscribe(a.read_subject)
        report["read"] = w.read_from_readable(events)
        sub.cancel()
        report["write"] = w.expose_for_write()
    except grpc.RpcError as e:
        sys.exit("consumer: %s: %s" % (e.code().name, e.details()))
    finally:
        w.close()
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=2)
    log("done")


if __name__ == "__main__":
    main()
