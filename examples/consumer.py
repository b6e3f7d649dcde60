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
import os
import sys

# sidecar_worker.py sits beside this file; make sure it is found whatever the cwd or sys.path.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from sidecar_worker import SidecarWorker, layout, log, parse_args, run, sha256_of  # noqa: E402


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


class Consumer(SidecarWorker):
    name = "consumer"

    def steps(self):
        events, sub = self.subscribe(self.args.read_subject)
        report = {"read": self.read_from_readable(events)}
        sub.close()
        report["write"] = self.expose_for_write()
        return report

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

    # ---- the two steps ---------------------------------------------------------------------------

    def read_from_readable(self, events):
        a = self.args
        log("waiting for a readable on %r" % a.read_subject)
        ev, lengths = self.receive_metadata(events, "readable", a.read_subject)
        # Allocate what the metadata describes, at offsets of our own choosing.
        offsets, size = layout(lengths, first_gap=4093, gap=1001, tail=77)
        region, mm = self.create_region(size, "consumer-read-target")
        ranges = list(zip(offsets, lengths))
        canaries = self.plant_canaries(mm, ranges, size)
        op, result = self.transfer(self.c.begin_read, "read", ev.metadata, region, offsets, lengths)
        digest = sha256_of(mm, ranges)
        log("sha256 of received bytes: %s" % digest)
        n = self.check_canaries(mm, canaries)
        log("the %d bytes outside the ranges are untouched" % n)
        self.release(op)
        self.drop_region(region.region_id)
        return {"sha256": digest, **result, "outside_untouched": n}

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
        op = self.expose(self.c.create_writable, region, offsets, lengths)
        log("writable %s over %d ranges %s, %d bytes"
            % (op.id, len(ranges), ", ".join("%d+%d" % r for r in ranges), op.bytes_total))
        op = self.publish_and_wait(op, a.write_subject)
        digest = sha256_of(mm, ranges)
        log("sha256 of written bytes: %s" % digest)
        n = self.check_canaries(mm, canaries)
        log("the %d bytes outside the ranges are untouched" % n)
        self.release(op)
        self.drop_region(region.region_id)
        return {"sha256": digest, "bytes": op.bytes_total, "descriptors": len(ranges),
                "passive_status": self.status(op), "passive_backend": self.backend(op), "peer": op.peer,
                "outside_untouched": n}


def main():
    run(Consumer, parse_args(__doc__,
                             size_help="bytes of the region to expose for writing, e.g. 256MiB (default: 256MiB)",
                             read_subject_help="NATS subject the producer's readable arrives on "
                                               "(default: %(default)s)",
                             write_subject_help="NATS subject to publish the writable on (default: %(default)s)"))


if __name__ == "__main__":
    main()
