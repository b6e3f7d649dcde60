#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 8: a newline from a worker cannot forge a log line (text and JSON logs); a FIFO
as the key file is refused at start and on SIGHUP instead of blocking; --nats-subject-prefix keeps
a sidecar's workers inside their subjects (real nats-server)."""
import json
import os
import signal
import subprocess
import threading
import time

import grpc

from harness import BINARY, SLOW, SidecarTest, desc, main, pb, wait_until

FORGED = "2026-01-01T00:00:00.000Z ERROR [keys] FORGED key compromised"


class LogInjectionTest(SidecarTest):
    def test_text_log_escapes_newlines(self):
        s = self.sidecar("a")
        r = s.create_region(4096, name="x\n" + FORGED + "\r\x1b[2J")
        self.assertIn("\n", r.name)
        wait_until(lambda: r.region_id in s.read_log(), 10, "the region's log line")
        log = s.read_log()
        self.assertNotIn("\n" + FORGED, log)
        for line in log.splitlines():
            self.assertFalse(line.startswith(FORGED), line)
        self.assertIn("name=x\\n" + FORGED + "\\r\\x1b[2J", log)

    def test_json_log_escapes_newlines(self):
        s = self.sidecar("a", extra=["--log-json"])
        r = s.create_region(4096, name="x\n" + FORGED)
        wait_until(lambda: r.region_id in s.read_log(), 10, "the region's log line")
        lines = [json.loads(line) for line in s.read_log().splitlines() if line.startswith("{")]
        mine = [entry for entry in lines if r.region_id in entry["msg"]]
        self.assertTrue(mine)
        self.assertIn("name=x\n" + FORGED, mine[0]["msg"])
        self.assertFalse(any(line.startswith(FORGED) for line in s.read_log().splitlines()))


class KeyFileFifoTest(SidecarTest):
    def test_fifo_key_file_at_start(self):
        fifo = os.path.join(self.workdir, "keys.fifo")
        os.mkfifo(fifo, 0o600)
        t0 = time.monotonic()
        out = subprocess.run([BINARY, "--grpc-listen", "unix:" + os.path.join(self.workdir, "f.sock"),
                              "--key-file", fifo], capture_output=True, timeout=30 * SLOW)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(b"is not a regular file", out.stderr)
        self.assertLess(time.monotonic() - t0, 15 * SLOW)

    def test_fifo_key_file_on_sighup(self):
        keys = self.key_file()
        s = self.sidecar("a", key_file=keys)
        os.rename(keys, keys + ".real")
        os.mkfifo(keys, 0o600)
        s.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP: keeping the old keys" in s.read_log(), 10, "the refused reload")
        self.assertIn("is not a regular file", s.read_log())
        self.assertEqual(s.info().sidecar_id, "a")
        # The signal thread is not stuck in open(): a real file reloads, SIGTERM still stops it.
        os.unlink(keys)
        os.rename(keys + ".real", keys)
        s.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloaded 1 key(s)" in s.read_log(), 10, "the reload")
        self.assertEqual(s.stop(timeout=20), 0)


class SubjectPrefixTest(SidecarTest):
    def test_subjects_outside_prefix_are_refused(self):
        n = self.nats()
        keys = self.key_file()
        s = self.sidecar("a", key_file=keys, nats_url=n.url, extra=["--nats-subject-prefix", "team-a"])
        other = self.sidecar("b", key_file=keys, nats_url=n.url)
        wait_until(lambda: s.info().nats_state and "connected" in s.info().nats_state.lower(), 10,
                   "NATS connection")
        for subject in (">", "*", "*.kv", "team-b.kv", "team-ab.kv", "team-a*", "team-a.", "foo.team-a.x"):
            self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED,
                                lambda: next(s.stub.SubscribeMetadata(
                                    pb.SubscribeMetadataRequest(subject=subject), timeout=10)),
                                contains='outside --nats-subject-prefix "team-a"')
        r = s.create_region(4096)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]), timeout=10)
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, s.stub.PublishMetadata,
                            pb.PublishMetadataRequest(subject="team-b.kv", operation_id=ro.operation_id),
                            timeout=10, contains="--nats-subject-prefix")

        # Inside the prefix works, wildcards after it included; another sidecar without the
        # flag is unaffected.
        got = []
        stream = s.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="team-a.>"), timeout=30)
        reader = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
        reader.start()
        end = time.monotonic() + 15 * SLOW
        while not got and time.monotonic() < end:
            other_r = other.create_region(4096)
            op = other.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(other_r, 0, 16)],
                                                                   audience="a"), timeout=10)
            other.stub.PublishMetadata(pb.PublishMetadataRequest(subject="team-a.kv.1",
                                                                 operation_id=op.operation_id), timeout=10)
            reader.join(0.3)
        stream.cancel()
        self.assertTrue(got, "no metadata arrived on team-a.>")
        self.assertEqual(got[0].subject, "team-a.kv.1")
        s.stub.PublishMetadata(pb.PublishMetadataRequest(subject="team-a", operation_id=ro.operation_id),
                               timeout=10)


if __name__ == "__main__":
    main()
