# SPDX-License-Identifier: Apache-2.0
"""Scheduler admission (DESIGN section 7): any removal from the slot queue (a cancel, a deadline)
admits what now fits, strictly in FIFO order. The passive sidecar is stopped (SIGSTOP) so that a
running transfer keeps its slot while the test rearranges the queue behind it. Real daemons."""
import os
import signal
import time

from harness import SLOW, SidecarTest, desc, main, pb, wait_until

MiB = 1 << 20


class SchedulerTest(SidecarTest):
    def test_removal_from_the_queue_admits_what_fits_in_fifo_order(self):
        keys = self.key_file()
        a = self.sidecar("act", key_file=keys, extra=["--max-inflight-bytes", "16MiB",
                                                      "--max-concurrent-transfers", "8"])
        b = self.sidecar("pas", key_file=keys)
        order = ("run", "big1", "small1", "big2", "small2")
        sizes = {"run": 4 * MiB, "big1": 16 * MiB, "small1": 4 * MiB, "big2": 16 * MiB, "small2": 4 * MiB}
        rb = b.create_region(sum(sizes.values()) + 4096)
        ra = a.create_region(sum(sizes.values()) + 4096)
        payload = os.urandom(sum(sizes.values()))
        b.fill(rb, 0, payload)
        offs, pos = {}, 0
        for k in order:
            offs[k] = pos
            pos += sizes[k]

        def readable(k):
            return b.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rb, offs[k], sizes[k])],
                                                                 timeout_ms=300000), timeout=10 * SLOW)

        def status(op):
            return a.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id),
                                       timeout=5 * SLOW).status

        # Warm the pooled connection a -> b (b's kernel keeps accepting while b is stopped).
        warm = readable("small1")
        op = a.stub.BeginRead(pb.BeginTransferRequest(metadata=warm.metadata,
                                                      descriptors=[desc(ra, offs["small1"], sizes["small1"])]),
                              timeout=10 * SLOW)
        self.assertEqual(a.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        ra_zero = b"\0" * sizes["small1"]
        a.fill(ra, offs["small1"], ra_zero)
        passive = {k: readable(k) for k in sizes}
        try:
            b.pause()
            ops = {}
            for k in order:
                # Not scaled by SLOW: a new connection's hello times out after 5 s while b is
                # stopped, so small1 (dialled at the cancel below) must see b again before that.
                timeout_ms = 2000 if k == "big2" else 300000
                ops[k] = a.stub.BeginRead(pb.BeginTransferRequest(
                    metadata=passive[k].metadata, descriptors=[desc(ra, offs[k], sizes[k])],
                    timeout_ms=timeout_ms), timeout=10 * SLOW)
            self.assertEqual(status(ops["run"]), pb.OPERATION_STATUS_IN_PROGRESS)
            for k in order[1:]:
                self.assertEqual(status(ops[k]), pb.OPERATION_STATUS_SCHEDULED, k)
            # The case: cancel the queued 16 MiB head (it does not fit beside 4 MiB); the
            # 4 MiB read behind it fits (4 + 4 <= 16 MiB) and must start now, not when the running
            # transfer ends (which it cannot while b is stopped).
            c = a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ops["big1"].operation_id),
                                       timeout=5 * SLOW)
            self.assertEqual(c.status, pb.OPERATION_STATUS_CANCELLED)
            wait_until(lambda: status(ops["small1"]) == pb.OPERATION_STATUS_IN_PROGRESS, 5,
                       "the 4 MiB read queued behind the cancelled one to start")
            self.assertEqual(status(ops["run"]), pb.OPERATION_STATUS_IN_PROGRESS)
            # FIFO: small2 would fit (12 MiB) but waits behind big2, which does not.
            time.sleep(0.2)
            self.assertEqual(status(ops["big2"]), pb.OPERATION_STATUS_SCHEDULED)
            self.assertEqual(status(ops["small2"]), pb.OPERATION_STATUS_SCHEDULED)
            self.assertEqual(status(ops["run"]), pb.OPERATION_STATUS_IN_PROGRESS)
            # big2 leaves the queue at its deadline: small2 starts.
            done = a.wait(ops["big2"].operation_id, 10000)
            self.assertEqual(done.status, pb.OPERATION_STATUS_ERRORED)
            self.assertIn("deadline", done.error.message)
            wait_until(lambda: status(ops["small2"]) == pb.OPERATION_STATUS_IN_PROGRESS, 2,
                       "the 4 MiB read queued behind the expired one to start")
        finally:
            b.proc.send_signal(signal.SIGCONT)
        for k in ("run", "small1", "small2"):
            done = a.wait(ops[k].operation_id)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            self.assertEqual(a.peek(ra, offs[k], sizes[k]), payload[offs[k]:offs[k] + sizes[k]], k)
        # Nothing was written where the removed reads would have landed.
        for k in ("big1", "big2"):
            self.assertEqual(a.peek(ra, offs[k], sizes[k]), bytes(sizes[k]), k)


if __name__ == "__main__":
    main()
