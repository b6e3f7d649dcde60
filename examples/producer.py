#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Producer worker: a pipeline stage that hands bytes to the next stage through its rdma-sidecar.

It talks gRPC only to its own sidecar and never touches the network itself:

  1. READ   creates a region, fills it with random bytes through the region's shared file (mmap),
            exposes three ranges of it as a READABLE operation and publishes the operation's signed
            metadata on a NATS subject; the consumer's sidecar then pulls the bytes.
  2. WRITE  receives the consumer's WRITABLE metadata on another subject, fills a region with fresh
            random bytes and pushes them into the consumer's ranges with BeginWrite.

It prints the SHA-256 of the bytes it exposed / wrote, so they can be compared with what the
consumer prints. Run examples/consumer.py against the other sidecar (scripts/demo.sh runs both).
"""
import os
import sys
import time

# sidecar_worker.py sits beside this file; make sure it is found whatever the cwd or sys.path.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from sidecar_worker import SidecarWorker, layout, log, parse_args, run, sha256_of  # noqa: E402


def fill_random(mm, ranges, chunk=8 << 20):
    """Random bytes into the ranges of a mapping or a GpuBuffer."""
    for off, n in ranges:
        for pos in range(off, off + n, chunk):
            k = min(chunk, off + n - pos)
            mm[pos:pos + k] = os.urandom(k)


class Producer(SidecarWorker):
    name = "producer"

    def steps(self):
        # Subscribe before anything else so the consumer's writable cannot pass us by.
        events, sub = self.subscribe(self.args.write_subject)
        report = {"read": self.expose_for_read()}
        report["write"] = self.write_into_writable(events)
        sub.close()
        return report

    # ---- the two steps ---------------------------------------------------------------------------

    def expose_for_read(self):
        a = self.args
        # Three ranges at odd offsets with odd lengths, covering most of the region:
        # 7 bytes, range, 1021 bytes, range, 1021 bytes, range, 13 bytes.
        rest = a.size - 7 - 2 * 1021 - 13
        lengths = [rest // 2 + 1, rest // 4 - 3]
        lengths.append(rest - sum(lengths))
        offsets, _ = layout(lengths, first_gap=7, gap=1021, tail=13)
        region, mm = self.create_region(a.size, "producer-read-source")
        t = time.monotonic()
        fill_random(mm, [(0, a.size)])
        log("filled %d bytes with random data in %.2fs" % (a.size, time.monotonic() - t))
        ranges = list(zip(offsets, lengths))
        digest = sha256_of(mm, ranges)
        op = self.expose(self.c.create_readable, region, offsets, lengths)
        log("readable %s over %d ranges %s, %d bytes; metadata %d chars (%s...)"
            % (op.id, len(ranges), ", ".join("%d+%d" % r for r in ranges), op.bytes_total,
               len(op.metadata), op.metadata[:12]))
        log("sha256 of exposed bytes: %s" % digest)
        op = self.publish_and_wait(op, a.read_subject)
        self.release(op)
        self.drop_region(region.region_id)
        return {"sha256": digest, "bytes": op.bytes_total, "descriptors": len(ranges),
                "passive_status": self.status(op), "passive_backend": self.backend(op), "peer": op.peer}

    def write_into_writable(self, events):
        a = self.args
        log("waiting for the consumer's writable on %r" % a.write_subject)
        ev, lengths = self.receive_metadata(events, "writable", a.write_subject)
        # Our source ranges: the same lengths, at offsets of our own choosing.
        offsets, size = layout(lengths, first_gap=3, gap=513, tail=9)
        region, mm = self.create_region(size, "producer-write-source")
        ranges = list(zip(offsets, lengths))
        fill_random(mm, ranges)
        digest = sha256_of(mm, ranges)
        log("sha256 of bytes to write: %s" % digest)
        op, result = self.transfer(self.c.begin_write, "write", ev.metadata, region, offsets, lengths)
        self.release(op)
        self.drop_region(region.region_id)
        return {"sha256": digest, **result}


def main():
    run(Producer, parse_args(__doc__,
                             size_help="bytes of the region to expose for reading, e.g. 256MiB (default: 256MiB)",
                             read_subject_help="NATS subject to publish the readable on (default: %(default)s)",
                             write_subject_help="NATS subject the consumer's writable arrives on "
                                                "(default: %(default)s)"))


if __name__ == "__main__":
    main()
