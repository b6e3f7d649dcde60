# SPDX-License-Identifier: Apache-2.0
"""The hand-off trace (sidecar/base/trace.h, bench/handoff_trace.py): off by default (no record in the
log); with RDMA_SIDECAR_TRACE_HANDOFFS=1 both sidecars log, when they drain, every stage of a small
READ and WRITE under the transfer id the two ends share, in time order, the active side's from the
gRPC call's arrival to its answer. Small transfers are also the ones that run on the gRPC handler's
thread (the run-here window): bytes compared, and a transfer with several segments still runs."""
import os
import re

from harness import SidecarTest, desc, main, pb

LINE = re.compile(r"^handoff xfer=([0-9a-f]{16}) stage=(\S+) us=(\d+)$")
ACTIVE = ["grpc_in", "engine_submit", "runner_picked_up", "tcp_connection_ready", "tcp_requests_sent",
          "tcp_reply_received", "tcp_done_confirmed", "tcp_finished", "engine_complete"]
# Recorded when the completion answers the waiting call; a transfer that completes before its call
# has registered the wait is answered by the handler itself, which the trace does not mark.
REPLY = "grpc_reply_queued"


def records(sidecar):
    out = {}
    for line in sidecar.read_log().splitlines():
        m = LINE.match(line.strip())
        if m:
            out.setdefault(m.group(1), []).append((int(m.group(3)), m.group(2)))
    return out


class HandoffTraceTest(SidecarTest):
    def transfers(self, a, b, n=3):
        """n READs and n WRITEs of 4 KiB (a passive, b active), one call each, bytes compared."""
        for i in range(n):
            ra, rb = a.create_region(16384), b.create_region(16384)
            data = os.urandom(4096)
            a.fill(ra, 0, data)
            op = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, 4096)], timeout_ms=30000),
                                       timeout=10)
            done = b.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(rb, 0, 4096)],
                                                            timeout_ms=30000, wait=True), timeout=30)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            self.assertEqual(b.peek(rb, 0, 4096), data)
            # WRITE from two segments into two ranges
            payload = os.urandom(4096)
            b.fill(rb, 0, payload)
            wop = a.stub.CreateWritable(pb.CreatePassiveRequest(
                descriptors=[desc(ra, 4096, 1000), desc(ra, 6000, 3096)], timeout_ms=30000), timeout=10)
            done = b.stub.BeginWrite(pb.BeginTransferRequest(
                metadata=wop.metadata, descriptors=[desc(rb, 0, 1000), desc(rb, 5000, 3096)], timeout_ms=30000,
                wait=True), timeout=30)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            self.assertEqual(a.peek(ra, 4096, 1000), payload[:1000])
            self.assertEqual(a.peek(ra, 6000, 3096), b.peek(rb, 5000, 3096))

    def test_off_by_default(self):
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        self.transfers(a, b)
        a.stop()
        b.stop()
        self.assertEqual(records(a), {})
        self.assertEqual(records(b), {})

    def test_stages_of_both_sidecars(self):
        keys = self.key_file()
        env = {"RDMA_SIDECAR_TRACE_HANDOFFS": "1"}
        a = self.sidecar("a", key_file=keys, env=env)
        b = self.sidecar("b", key_file=keys, env=env)
        self.transfers(a, b)
        self.assertEqual(a.stop(), 0)
        self.assertEqual(b.stop(), 0)
        ra, rb = records(a), records(b)
        self.assertEqual(len(rb), 6, sorted(rb))  # 3 READs, 3 WRITEs
        for xfer, recs in rb.items():
            stages = [s for _, s in recs]
            for s in ACTIVE:
                self.assertIn(s, stages, "transfer %s on the active side: %s" % (xfer, stages))
            t = {s: us for us, s in recs}
            times = [t[s] for s in ["grpc_in", "engine_submit", "runner_picked_up", "tcp_connection_ready",
                                    "tcp_reply_received", "tcp_finished", "engine_complete", REPLY] if s in t]
            self.assertEqual(times, sorted(times), "active stages out of order: %s" % recs)
            # the passive side logged the same transfer id: OPEN, the data request, DONE
            self.assertIn(xfer, ra, "transfer %s unknown to the passive side" % xfer)
            pstages = [s for _, s in ra[xfer]]
            for s in ("passive_open_received", "passive_open_answered", "passive_done_received",
                      "passive_done_answered"):
                self.assertIn(s, pstages)
            self.assertTrue("passive_read_served" in pstages or "passive_write_stored" in pstages, pstages)
            self.assertLessEqual(t["grpc_in"], min(us for us, _ in ra[xfer]))  # one clock on one host


if __name__ == "__main__":
    main()
