# SPDX-License-Identifier: Apache-2.0
"""rdma-sidecar-ctl and librdma-sidecar-client against real sidecars (and a real nats-server):
every command, --json output parsed and checked, exit codes (0 ok, 1 failed, 2 usage, 3 cannot
reach the sidecar), files moved with `ctl read` / `ctl write` compared byte for byte with the
bytes outside the ranges unchanged, rails and the topology table (a sidecar on the dgx8 hwloc
fixture), `connect` to a peer, the JetStream hand-off with `publish` and `wait-metadata` (publisher
first, waiter first, a deadline that passes), `--traceparent` on a transfer, and the installed library
used through pkg-config."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

from harness import SLOW, SidecarTest, desc, free_port, main, pb, wait_until

BUILD = os.path.dirname(os.path.abspath(os.environ.get("SC_BINARY", "build/rdma-sidecar")))
CTL = os.path.join(BUILD, "client", "rdma-sidecar-ctl")
DGX8 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "topology", "dgx8.xml")


def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


class CtlTest(SidecarTest):
    def ctl(self, sidecar, *args, timeout=30, env=None):
        cmd = [CTL] + (["--sidecar", "unix:" + sidecar.sock] if sidecar else []) + list(args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * SLOW,
                              env=dict(os.environ, **(env or {})))

    def ok_json(self, sidecar, *args, **kw):
        r = self.ctl(sidecar, "--json", *args, **kw)
        self.assertEqual(r.returncode, 0, "ctl %s: %s" % (" ".join(args), r.stderr))
        return json.loads(r.stdout)

    def pair(self, **kw):
        keys = self.key_file()
        return self.sidecar("a", key_file=keys, **kw), self.sidecar("b", key_file=keys, **kw)

    def readable(self, s, region, lengths, start=7, gap=4099):
        descs, off = [], start
        for ln in lengths:
            descs.append(desc(region, off, ln))
            off += ln + gap
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=descs, timeout_ms=60000), timeout=10)
        return op, descs

    def test_ping(self):
        """ping: --count calls timed, one line each, a ping(8)-like summary; --json; bad flags and
        values refused with a clear message (exit 2); an unreachable sidecar exits 3."""
        a = self.sidecar("a")
        r = self.ctl(a, "ping", "--count", "20", "--interval-ms", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("PING unix:%s: grpc.health.v1 Check, 20 calls" % a.sock), lines[0])
        seqs = [ln for ln in lines if ln.startswith("seq=")]
        self.assertEqual([int(ln.split()[0][4:]) for ln in seqs], list(range(1, 21)))
        for ln in seqs:
            self.assertRegex(ln, r"^seq=\d+ time=\d+\.\d us$")
        self.assertIn("--- unix:%s ping statistics ---" % a.sock, lines)
        self.assertRegex(r.stdout, r"\n20 calls, 20 answered, 0% failed, time \d+ ms\n")
        m = re.search(r"rtt min/p50/p99/max = ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) us", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        mn, p50, p99, mx = (float(v) for v in m.groups())
        self.assertTrue(0 < mn <= p50 <= p99 <= mx, m.group(0))
        # --json: one summary object; the interval is honoured (4 calls, 3 pauses of 50 ms)
        t0 = time.monotonic()
        j = self.ok_json(a, "ping", "--count", "4", "--interval-ms", "50")
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)
        self.assertEqual((j["calls"], j["answered"], j["failed"]), (4, 4, 0))
        self.assertTrue(0 < j["min_us"] <= j["p50_us"] <= j["p99_us"] <= j["max_us"], j)
        # bad flags and values: exit 2, saying which
        r = self.ctl(a, "ping", "--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unrecognized option '--bogus'", r.stderr)
        self.assertEqual(r.stdout, "")
        for flag, value in (("--count", "0"), ("--count", "x"), ("--interval-ms", "-1"), ("--interval-ms", "1.5")):
            r = self.ctl(a, "ping", flag, value)
            self.assertEqual(r.returncode, 2, (flag, value))
            self.assertIn("bad value %s for %s" % (value, flag), r.stderr)
        r = self.ctl(a, "ping", "extra")
        self.assertEqual(r.returncode, 2)
        self.assertIn("ping takes 0 arguments", r.stderr)
        # --help documents it
        r = self.ctl(None, "ping", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--interval-ms", r.stdout)
        self.assertIn("min/p50/p99/max", r.stdout)
        # nobody there: exit 3
        r = self.ctl(None, "--sidecar", "unix:" + os.path.join(self.workdir, "none.sock"), "--connect-timeout", "0.5",
                     "ping", "--count", "2")
        self.assertEqual(r.returncode, 3, r.stderr)

    def test_info_health_regions_ops(self):
        a = self.sidecar("a", key_file=self.key_file())
        info = self.ok_json(a, "info")
        self.assertEqual(info["sidecar_id"], "a")
        self.assertIn("unix:" + a.sock, info["grpc_listeners"])
        self.assertTrue(info["signing_enabled"])
        self.assertEqual(info["nats_state"], "disabled")
        by = {b["backend"]: b for b in info["backends"]}
        self.assertTrue(by["tcp"]["available"])
        self.assertTrue(by["local"]["available"])
        self.assertIn("ibverbs", by)
        text = self.ctl(a, "info")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("sidecar  a", text.stdout)

        self.assertEqual(self.ok_json(a, "health"), {"status": "SERVING", "serving": True})
        self.assertEqual(self.ctl(a, "health").stdout.strip(), "SERVING")

        self.assertEqual(self.ok_json(a, "regions"), {"regions": []})
        self.assertEqual(self.ok_json(a, "ops"), {"operations": []})
        r = a.create_region(1 << 20, name="ctl-test")
        op, _ = self.readable(a, r, [1000, 2000])
        regions = self.ok_json(a, "regions")["regions"]
        self.assertEqual(len(regions), 1)
        self.assertEqual(regions[0]["region_id"], r.region_id)
        self.assertEqual(regions[0]["size"], 1 << 20)
        self.assertEqual(regions[0]["name"], "ctl-test")
        self.assertEqual(regions[0]["path"], r.path)
        self.assertGreaterEqual(regions[0]["live_operations"], 1)
        ops = self.ok_json(a, "ops")["operations"]
        self.assertEqual([o["operation_id"] for o in ops], [op.operation_id])
        self.assertEqual(ops[0]["kind"], "readable")
        self.assertEqual(ops[0]["status"], "initialized")
        self.assertEqual(ops[0]["metadata"], op.metadata)
        self.assertEqual([d["length"] for d in ops[0]["descriptors"]], [1000, 2000])
        self.assertIn(op.operation_id, self.ctl(a, "ops").stdout)
        self.assertIn(r.region_id, self.ctl(a, "regions").stdout)

        # The address from the environment, and over TCP.
        env = self.ctl(None, "--json", "health", env={"RDMA_SIDECAR_ADDR": "unix:" + a.sock})
        self.assertEqual(env.returncode, 0, env.stderr)
        tcp = self.ctl(None, "--json", "--sidecar", "127.0.0.1:%d" % a.port, "info")
        self.assertEqual(tcp.returncode, 0, tcp.stderr)
        self.assertEqual(json.loads(tcp.stdout)["sidecar_id"], "a")

    def test_op_wait_cancel(self):
        a = self.sidecar("a", key_file=self.key_file())
        r = a.create_region(1 << 16)
        op, _ = self.readable(a, r, [4096])
        got = self.ok_json(a, "op", op.operation_id)
        self.assertEqual(got["operation_id"], op.operation_id)
        self.assertEqual(got["status"], "initialized")
        self.assertIsNone(got["error"])

        missing = self.ctl(a, "--json", "op", "op-doesnotexist")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("NOT_FOUND", missing.stderr)
        self.assertIn("op-doesnotexist", missing.stderr)
        self.assertEqual(missing.stdout, "")

        # Not terminal within the timeout: the state is printed, exit 1.
        t0 = time.monotonic()
        w = self.ctl(a, "--json", "--timeout", "0.3", "wait", op.operation_id)
        self.assertEqual(w.returncode, 1, w.stderr)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(json.loads(w.stdout)["status"], "initialized")
        self.assertIn("still initialized", w.stderr)

        c = self.ok_json(a, "cancel", op.operation_id)
        self.assertEqual(c["status"], "cancelled")
        self.assertEqual(c["error"]["code_name"], "CANCELLED")
        w = self.ctl(a, "--json", "wait", op.operation_id)
        self.assertEqual(w.returncode, 1)
        self.assertEqual(json.loads(w.stdout)["status"], "cancelled")
        self.assertEqual(a.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id),
                                             timeout=5).status, pb.OPERATION_STATUS_CANCELLED)
        # A second cancel changes nothing and still succeeds.
        self.assertEqual(self.ok_json(a, "cancel", op.operation_id)["status"], "cancelled")

        # wait on a completed transfer: exit 0.
        src = a.create_region(1 << 16)
        ro, _ = self.readable(a, src, [5000])
        dst = a.create_region(1 << 16)
        act = a.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(dst, 0, 5000)],
                                                       timeout_ms=30000), timeout=10)
        w = self.ok_json(a, "wait", act.operation_id)
        self.assertEqual(w["status"], "complete")
        self.assertEqual(w["backend"], "local")
        self.assertEqual(w["bytes_done"], 5000)
        # op shows the rails the transfer used: none for LOCAL.
        self.assertEqual(self.ok_json(a, "op", act.operation_id)["rails"], [])
        self.assertNotIn("\nrail ", self.ctl(a, "op", act.operation_id).stdout)

    def test_op_rails_of_a_tcp_transfer(self):
        a, b = self.pair()
        src = a.create_region(1 << 20)
        ro, _ = self.readable(a, src, [300000])
        dst = b.create_region(1 << 20)
        act = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(dst, 0, 300000)],
                                                       timeout_ms=30000, wait=True), timeout=30 * SLOW)
        self.assertEqual(act.status, pb.OPERATION_STATUS_COMPLETE, act.error.message)
        got = self.ok_json(b, "op", act.operation_id)
        self.assertEqual(got["backend"], "tcp")
        # What the sidecar reports, as reported (TCP may name no rails yet): each a rail and its bytes.
        self.assertEqual(got["rails"], [{"rail": u.rail, "bytes": u.bytes} for u in act.rails])
        if got["rails"]:
            self.assertEqual(sum(u["bytes"] for u in got["rails"]), 300000)
        text = self.ctl(b, "op", act.operation_id).stdout
        for u in act.rails:
            self.assertIn("rail     %s  %d bytes" % (u.rail, u.bytes), text)

    def test_info_rails_and_topology(self):
        a = self.sidecar("a", env={"RDMA_SIDECAR_TOPOLOGY_XML": DGX8})
        info = self.ok_json(a, "info")
        self.assertTrue(info["topology_source"].endswith("dgx8.xml"), info["topology_source"])
        absent = [r for r in info["rails"] if r["state"] == "absent"]
        self.assertEqual([(r["name"], r["backend"], r["pci_address"], r["numa_node"]) for r in absent],
                         [("mlx5_0", "ibverbs", "0000:15:00.0", 0), ("mlx5_1", "ibverbs", "0000:16:00.0", 0),
                          ("mlx5_2", "ibverbs", "0000:35:00.0", 0), ("mlx5_3", "ibverbs", "0000:36:00.0", 0),
                          ("mlx5_4", "ibverbs", "0000:95:00.0", 1), ("mlx5_5", "ibverbs", "0000:96:00.0", 1),
                          ("mlx5_6", "ibverbs", "0000:b5:00.0", 1), ("mlx5_7", "ibverbs", "0000:b6:00.0", 1)])
        for r in absent:
            self.assertEqual(set(r), {"index", "backend", "name", "pci_address", "numa_node", "rate_mbps", "state",
                                      "detail", "netdev", "bytes", "operations", "errors", "failovers"})
            self.assertIn("dgx8.xml", r["detail"])
        rows = {t["memory"]: t for t in info["topology"]}
        numa0 = rows["numa 0"]
        self.assertEqual(numa0["chosen"], ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])
        self.assertEqual((numa0["gpu_index"], numa0["numa_node"], numa0["pci_address"]), (-1, 0, ""))
        self.assertEqual(rows["numa 1"]["chosen"], ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"])
        cls = {d["rail"]: d["distance"] for d in numa0["rails"]}
        self.assertEqual(set(cls) >= {"mlx5_%d" % i for i in range(8)}, True, numa0["rails"])

        text = self.ctl(a, "info")
        self.assertEqual(text.returncode, 0, text.stderr)
        lines = text.stdout.splitlines()
        rail0 = [ln for ln in lines if ln.startswith("rail ") and " mlx5_0 " in ln]
        self.assertEqual(len(rail0), 1, text.stdout)
        self.assertRegex(rail0[0], r"^rail +mlx5_0 +ibverbs +absent +pci 0000:15:00\.0 numa 0 +rate \? +named by "
                                   r"the topology file .*dgx8\.xml")
        self.assertEqual(len([ln for ln in lines if ln.startswith("rail ")]), len(info["rails"]))
        self.assertIn("topology " + info["topology_source"], lines)
        want = "  numa 0   -> " + ", ".join("%s (%s)" % (r, cls[r]) for r in numa0["chosen"])
        self.assertIn(want, lines)

        # Without a fixture: this host's table (NUMA rows, perhaps with no rail to choose).
        b = self.sidecar("b")
        info = self.ok_json(b, "info")
        self.assertEqual(info["topology_source"], "sysfs")
        self.assertTrue(any(t["memory"].startswith("numa ") for t in info["topology"]), info["topology"])
        self.assertIn("topology sysfs", self.ctl(b, "info").stdout.splitlines())

    def test_connect(self):
        a, b = self.pair()
        src = a.create_region(1 << 16)
        ro, _ = self.readable(a, src, [5000])
        r = self.ctl(b, "connect", ro.metadata)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines()[0], "peer     a")
        self.assertRegex(r.stdout.splitlines()[1],
                         r"^path +tcp +ready +\d+\.\d{3} ms +\d+ connection\(s\) to a at 127\.0\.0\.1:\d+ "
                         r"\(0 were open already\)$")
        md_file = os.path.join(self.workdir, "connect-md.txt")
        with open(md_file, "w") as f:
            f.write(ro.metadata + "\n")
        got = self.ok_json(b, "--timeout", "5", "connect", "@" + md_file)
        self.assertEqual(got["peer"], "a")
        self.assertTrue(got["ready"])
        self.assertEqual([(p["backend"], p["ready"]) for p in got["paths"]], [("tcp", True)], got)
        self.assertNotIn("(0 were open already)", got["paths"][0]["detail"])
        self.assertIsInstance(got["paths"][0]["elapsed_us"], int)
        # Checked, not used up: the read that follows still works.
        self.assertEqual(a.stub.GetOperation(pb.GetOperationRequest(operation_id=ro.operation_id),
                                             timeout=5).uses_left, 1)
        out = os.path.join(self.workdir, "after-connect.bin")
        self.assertEqual(self.ok_json(b, "read", ro.metadata, out)["operation"]["status"], "complete")

        bad = self.ctl(b, "connect", "rsm1.garbage")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("connect: INVALID_ARGUMENT: metadata is not valid base64url", bad.stderr)
        self.assertEqual(bad.stdout, "")
        missing = self.ctl(b, "connect", "@" + os.path.join(self.workdir, "nope.txt"))
        self.assertEqual(missing.returncode, 2)
        self.assertIn("cannot open", missing.stderr)
        # A peer that is gone: no path, exit 1 with the reason.
        ro2, _ = self.readable(a, src, [10])
        self.assertEqual(a.stop(), 0)
        gone = self.ctl(b, "--timeout", "2", "connect", ro2.metadata)
        self.assertEqual(gone.returncode, 1, gone.stdout)
        self.assertIn("UNAVAILABLE", gone.stderr)
        self.assertIn("cannot reach peer sidecar", gone.stderr)

    def test_watch(self):
        a, b = self.pair()
        src = a.create_region(2 << 20)
        ro, _ = self.readable(a, src, [1 << 20])
        watch = subprocess.Popen([CTL, "--sidecar", "unix:" + a.sock, "--json", "--timeout", str(30 * SLOW), "watch",
                                  ro.operation_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = json.loads(watch.stdout.readline())  # the current state comes first
            self.assertEqual(first["status"], "initialized")
            dst = b.create_region(1 << 20)
            op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(dst, 0, 1 << 20)],
                                                          timeout_ms=30000), timeout=10)
            self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
            out, err = watch.communicate(timeout=20 * SLOW)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        self.assertEqual(watch.returncode, 0, err)
        states = [json.loads(line) for line in out.strip().splitlines()]
        self.assertEqual(states[-1]["status"], "complete")
        self.assertEqual(states[-1]["bytes_done"], 1 << 20)
        self.assertTrue(all(s["operation_id"] == ro.operation_id for s in states))

        # Still live when the timeout passes: exit 1; cancelled: exit 1; unknown: exit 1 NOT_FOUND.
        ro2, _ = self.readable(a, src, [10])
        r = self.ctl(a, "--json", "--timeout", "0.3", "watch", ro2.operation_id)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("still initialized", r.stderr)
        self.assertEqual(json.loads(r.stdout.splitlines()[0])["status"], "initialized")
        self.assertEqual(self.ctl(a, "cancel", ro2.operation_id).returncode, 0)
        r = self.ctl(a, "--json", "watch", ro2.operation_id)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(json.loads(r.stdout.splitlines()[-1])["status"], "cancelled")
        r = self.ctl(a, "watch", "op-nope")
        self.assertEqual(r.returncode, 1)
        self.assertIn("NOT_FOUND", r.stderr)

    def test_read_compact_kv_metadata(self):
        """A readable made from a compact block list (8 layer regions x 512 random block ids of
        509 bytes): ctl reads it with one strided run into a file, byte for byte."""
        import random
        a, b = self.pair()
        regions = [a.create_region(1024 * 512) for _ in range(8)]
        noise = [os.urandom(r.size) for r in regions]
        for r, n in zip(regions, noise):
            a.fill(r, 0, n)
        ids = random.sample(range(1024), 512)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(timeout_ms=60000, descriptor_sets=[pb.DescriptorSet(
            block_list=pb.BlockList(region_ids=[r.region_id for r in regions], block_length=509,
                                    block_ids=ids, block_stride=512))]), timeout=10)
        self.assertEqual(ro.descriptor_count, 4096)
        out = os.path.join(self.workdir, "kv.bin")
        res = self.ok_json(b, "read", ro.metadata, out)
        self.assertEqual((res["bytes"], res["descriptors"]), (4096 * 509, 4096))
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"".join(n[i * 512:i * 512 + 509] for n in noise for i in ids))

    def test_read_and_write_files(self):
        a, b = self.pair()
        # READ: three ranges at odd offsets of a region full of noise on a; ctl read on b.
        lengths = [1 << 20, 123457, 3]
        total = sum(lengths)
        src = a.create_region(4 << 20)
        noise = os.urandom(src.size)
        a.fill(src, 0, noise)
        ro, descs = self.readable(a, src, lengths)
        expect = b"".join(noise[d.offset:d.offset + d.length] for d in descs)
        out = os.path.join(self.workdir, "read.bin")
        res = self.ok_json(b, "read", ro.metadata, out)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), expect)
        self.assertEqual(res["bytes"], total)
        self.assertEqual(res["descriptors"], 3)
        self.assertEqual(res["operation"]["status"], "complete")
        self.assertEqual(res["operation"]["backend"], "tcp")
        self.assertEqual(res["operation"]["peer"], "a")
        self.assertEqual(a.peek(src, 0, src.size), noise)  # the source is untouched
        # The passive side completed; b kept nothing (the region and operation were released).
        self.assertEqual(a.wait(ro.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(self.ok_json(b, "regions"), {"regions": []})
        self.assertEqual(self.ok_json(b, "ops"), {"operations": []})

        # The metadata used up: exit 1 with the sidecar's reason, and the old file is not replaced.
        again = self.ctl(b, "read", ro.metadata, out + ".2")
        self.assertEqual(again.returncode, 1, again.stdout)
        self.assertFalse(os.path.exists(out + ".2"))
        self.assertIn("errored", again.stdout)

        # WRITE: a file pushed from b into two ranges of a writable on a, metadata from a file (@).
        dst = a.create_region(2 << 20)
        noise = os.urandom(dst.size)
        a.fill(dst, 0, noise)
        wlen = [700001, 4096]
        wdescs = [desc(dst, 11, wlen[0]), desc(dst, 11 + wlen[0] + 999, wlen[1])]
        wo = a.stub.CreateWritable(pb.CreatePassiveRequest(descriptors=wdescs, timeout_ms=60000), timeout=10)
        payload = os.urandom(sum(wlen))
        src_file = os.path.join(self.workdir, "write.bin")
        with open(src_file, "wb") as f:
            f.write(payload)
        md_file = os.path.join(self.workdir, "md.txt")
        with open(md_file, "w") as f:
            f.write(wo.metadata + "\n")

        # A file of the wrong size is refused before anything moves.
        short = os.path.join(self.workdir, "short.bin")
        with open(short, "wb") as f:
            f.write(payload[:-1])
        bad = self.ctl(b, "write", "@" + md_file, short)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("takes %d" % sum(wlen), bad.stderr)
        self.assertEqual(a.peek(dst, 0, dst.size), noise)
        # Readable metadata given to write (and the other way round): refused, exit 1.
        ro2, _ = self.readable(a, src, [10])
        wrong = self.ctl(b, "write", ro2.metadata, src_file)
        self.assertEqual(wrong.returncode, 1)
        self.assertIn("use `read`", wrong.stderr)
        wrong = self.ctl(b, "read", wo.metadata, out)
        self.assertEqual(wrong.returncode, 1)
        self.assertIn("use `write`", wrong.stderr)

        res = self.ok_json(b, "write", "@" + md_file, src_file)
        self.assertEqual(res["operation"]["status"], "complete")
        self.assertEqual(res["bytes"], sum(wlen))
        self.assertEqual(a.wait(wo.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        expect = bytearray(noise)
        expect[11:11 + wlen[0]] = payload[:wlen[0]]
        off = 11 + wlen[0] + 999
        expect[off:off + wlen[1]] = payload[wlen[0]:]
        self.assertEqual(a.peek(dst, 0, dst.size), bytes(expect))

        # LOCAL: both ends on one sidecar, text output.
        ro3, d3 = self.readable(a, src, [65536])
        loc = self.ctl(a, "read", ro3.metadata, out)
        self.assertEqual(loc.returncode, 0, loc.stderr)
        self.assertIn("complete over local", loc.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), a.peek(src, d3[0].offset, 65536))

    def test_publish_subscribe(self):
        nats = self.nats()
        a, b = self.pair(nats_url=nats.url)
        r = a.create_region(1 << 16)
        op, _ = self.readable(a, r, [100, 200])
        sub = subprocess.Popen([CTL, "--sidecar", "unix:" + b.sock, "--json", "--count", "1", "--timeout",
                                str(20 * SLOW), "subscribe", "kv.>"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            # Plain NATS delivers only to present subscribers: publish until the subscriber has one.
            end = time.monotonic() + 20 * SLOW
            while sub.poll() is None and time.monotonic() < end:
                res = self.ok_json(a, "publish", "kv.layer0", op.operation_id)
                self.assertEqual(res, {"published": True, "subject": "kv.layer0", "operation_id": op.operation_id})
                time.sleep(0.1)
            out, err = sub.communicate(timeout=10 * SLOW)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait()
        self.assertEqual(sub.returncode, 0, err)
        lines = out.strip().splitlines()
        self.assertEqual(len(lines), 1, out)
        ev = json.loads(lines[0])
        self.assertEqual(ev["subject"], "kv.layer0")
        self.assertEqual(ev["metadata"], op.metadata)
        self.assertEqual(ev["issuer"], "a")
        self.assertEqual(ev["kind"], "readable")
        self.assertEqual(ev["descriptor_lengths"], [100, 200])

        # Too few events before the timeout: exit 1; no --count: the timeout ends it with 0.
        t0 = time.monotonic()
        few = self.ctl(b, "--count", "2", "--timeout", "0.5", "subscribe", "nobody.here")
        self.assertEqual(few.returncode, 1, few.stderr)
        self.assertIn("0 of 2 events", few.stderr)
        self.assertLess(time.monotonic() - t0, 10 * SLOW)
        self.assertEqual(self.ctl(b, "--timeout", "0.3", "subscribe", "nobody.here").returncode, 0)
        # Publishing an unknown operation fails with the sidecar's reason.
        bad = self.ctl(a, "publish", "kv.x", "op-nope")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("NOT_FOUND", bad.stderr)

    def test_wait_metadata_handoff(self):
        nats = self.nats()  # -js: the sidecars' default --nats-handoff jetstream
        port = free_port()
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, nats_url=nats.url)
        b = self.sidecar("b", key_file=keys, nats_url=nats.url,
                         extra=["--metrics-listen", "127.0.0.1:%d" % port])

        def waits_started():  # b's WaitMetadata calls so far (grpc_server_started_total)
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
            m = re.search(r'^grpc_server_started_total\{[^}]*grpc_method="WaitMetadata"[^}]*\} (\d+)$', text, re.M)
            return int(m.group(1)) if m else 0

        src = a.create_region(1 << 18)
        n = 40001 + int.from_bytes(os.urandom(2), "little")
        data = os.urandom(n)
        a.fill(src, 333, data)
        # Publisher first: the stored copy is what the later wait gets; text output is the metadata
        # alone (md=$(rdma-sidecar-ctl wait-metadata SUBJECT)), --json the event.
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(src, 333, n)], timeout_ms=60000),
                                   timeout=10)
        self.assertEqual(self.ok_json(a, "publish", "wm.first", ro.operation_id),
                         {"published": True, "subject": "wm.first", "operation_id": ro.operation_id})
        r = self.ctl(b, "--timeout", str(10 * SLOW), "wait-metadata", "wm.first")
        self.assertEqual((r.returncode, r.stdout), (0, ro.metadata + "\n"), r.stderr)
        ev = self.ok_json(b, "wait-metadata", "wm.*")
        self.assertEqual((ev["subject"], ev["issuer"], ev["kind"], ev["descriptor_lengths"], ev["metadata"]),
                         ("wm.first", "a", "readable", [n], ro.metadata))
        self.assertGreater(ev["expires_unix_ms"], time.time() * 1000)
        # The metadata got is used, with a traceparent of the caller's: the bytes, and the trace id.
        tid = os.urandom(16).hex()
        out = os.path.join(self.workdir, "wm.bin")
        res = self.ok_json(b, "--traceparent", "00-%s-%s-01" % (tid, os.urandom(8).hex()), "read", r.stdout.strip(), out)
        self.assertEqual((res["operation"]["status"], res["operation"]["trace_id"]), ("complete", tid))
        with open(out, "rb") as f:
            self.assertEqual(f.read(), data)
        bad_tp = self.ctl(b, "--traceparent", "00-xyz", "read", ro.metadata, out)
        self.assertEqual(bad_tp.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", bad_tp.stderr)
        self.assertIn("traceparent is not a W3C traceparent", bad_tp.stderr)

        # Waiter first: b's wait is counted before the writable even exists; then a publishes the
        # metadata as text (@file), and the waiter prints it.
        before = waits_started()
        self.assertGreaterEqual(before, 2)
        waiter = subprocess.Popen([CTL, "--sidecar", "unix:" + b.sock, "--json", "--timeout", str(20 * SLOW),
                                   "wait-metadata", "wm.later"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            wait_until(lambda: waits_started() > before, 10, "b to have the wait")
            self.assertIsNone(waiter.poll())
            dst = a.create_region(1 << 16)
            wo = a.stub.CreateWritable(pb.CreatePassiveRequest(descriptors=[desc(dst, 17, 4097)], timeout_ms=60000),
                                       timeout=10)
            md_file = os.path.join(self.workdir, "wm.md")
            with open(md_file, "w") as f:
                f.write(wo.metadata + "\n")
            self.assertEqual(self.ok_json(a, "publish", "wm.later", "@" + md_file),
                             {"published": True, "subject": "wm.later", "metadata": wo.metadata})
            wout, werr = waiter.communicate(timeout=20 * SLOW)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        self.assertEqual(waiter.returncode, 0, werr)
        wev = json.loads(wout)
        self.assertEqual((wev["subject"], wev["kind"], wev["descriptor_lengths"], wev["metadata"]),
                         ("wm.later", "writable", [4097], wo.metadata))
        text = self.ctl(a, "publish", "wm.text", wo.metadata)
        self.assertEqual((text.returncode, text.stdout.strip()),
                         (0, "published metadata (%d characters) on wm.text" % len(wo.metadata)), text.stderr)

        # A deadline that passes: exit 1, the sidecar's reason (nothing stored under the subject).
        t0 = time.monotonic()
        late = self.ctl(b, "--timeout", "0.4", "wait-metadata", "wm.nobody")
        self.assertGreaterEqual(time.monotonic() - t0, 0.4)
        self.assertEqual((late.returncode, late.stdout), (1, ""), late.stderr)
        self.assertIn("rdma-sidecar-ctl: wait-metadata: DEADLINE_EXCEEDED: WaitMetadata on wm.nobody: no metadata "
                      "within 400 ms: nothing is stored", late.stderr)
        # Refusals: text the sidecar cannot verify is not published; a subject NATS refuses.
        bad = self.ctl(a, "publish", "wm.bad", "rsm1.!!!")
        self.assertEqual(bad.returncode, 1)
        self.assertIn("publish: INVALID_ARGUMENT", bad.stderr)
        self.assertEqual(self.ctl(b, "--timeout", "1", "wait-metadata", "bad subject").returncode, 1)
        self.assertEqual(self.ctl(b, "wait-metadata").returncode, 2)
        self.assertEqual(self.ctl(a, "publish", "wm.x", "@" + os.path.join(self.workdir, "none")).returncode, 2)

    def test_usage_and_unreachable(self):
        for args in ([], ["frobnicate"], ["op"], ["op", "a", "b"], ["--timeout", "abc", "ops"],
                     ["--count", "0", "subscribe", "x"], ["--bogus", "info"], ["help", "nope"]):
            r = self.ctl(None, *args)
            self.assertEqual(r.returncode, 2, "%s: %s %s" % (args, r.stdout, r.stderr))
            self.assertTrue(r.stderr, args)
        h = self.ctl(None, "--help")
        self.assertEqual(h.returncode, 0)
        for name in ("info", "health", "regions", "ops", "op", "wait", "watch", "cancel", "publish", "subscribe",
                     "wait-metadata", "read", "write", "connect", "--traceparent", "RDMA_SIDECAR_ADDR",
                     "exit codes"):
            self.assertIn(name, h.stdout)
        for args in (["help", "read"], ["read", "--help"]):
            r = self.ctl(None, *args)
            self.assertEqual(r.returncode, 0)
            self.assertIn("rdma-sidecar-ctl [options] read METADATA FILE", r.stdout)
        for args in (["help", "connect"], ["connect", "--help"]):
            r = self.ctl(None, *args)
            self.assertEqual(r.returncode, 0)
            self.assertIn("rdma-sidecar-ctl [options] connect METADATA", r.stdout)
            self.assertIn("exit 0 when any path is ready, 1 otherwise", r.stdout)
        for args in (["connect"], ["connect", "a", "b"]):
            self.assertEqual(self.ctl(None, *args).returncode, 2, args)

        gone = os.path.join(self.workdir, "no.sock")
        r = self.ctl(None, "--sidecar", "unix:" + gone, "info")
        self.assertEqual(r.returncode, 3)
        self.assertIn("cannot reach the sidecar at unix:" + gone, r.stderr)
        r = self.ctl(None, "--sidecar", "127.0.0.1:%d" % free_port(), "--json", "ops", env={})
        self.assertEqual(r.returncode, 3)
        self.assertEqual(r.stdout, "")
        r = self.ctl(None, "info", env={"RDMA_SIDECAR_ADDR": "unix:" + gone})
        self.assertEqual(r.returncode, 3)

        # A sidecar that stops: 3 from then on.
        a = self.sidecar("a")
        self.assertEqual(self.ctl(a, "health").returncode, 0)
        self.assertEqual(a.stop(), 0)
        self.assertEqual(self.ctl(a, "health").returncode, 3)

    def test_tls(self):
        """--tls-ca / --tls-cert / --tls-key against a TLS gRPC server that requires a client
        certificate (grpcio serving the Sidecar service; the sidecar itself serves plaintext)."""
        openssl = shutil.which("openssl")
        if not openssl:
            self.skipTest("openssl not installed")
        import grpc
        from concurrent import futures
        from harness import rpc
        d = self.workdir

        def sh(*args):
            r = subprocess.run([openssl] + list(args), capture_output=True, text=True, timeout=60, cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(d, "san.ext"), "w") as f:
            f.write("subjectAltName=DNS:localhost\n")
        sh("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
           "-subj", "/CN=test-ca")
        for name, cn, ext in (("srv", "localhost", ["-extfile", "san.ext"]), ("cli", "worker-7", [])):
            sh("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj",
               "/CN=" + cn)
            sh("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
               "-out", name + ".pem", "-days", "1", *ext)

        def read(name):
            with open(os.path.join(d, name), "rb") as f:
                return f.read()

        class Fake(rpc.SidecarServicer):
            def GetInfo(self, request, context):
                ids = context.peer_identities() or []
                return pb.SidecarInfo(sidecar_id="tls-fake", version=b",".join(ids).decode())

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_SidecarServicer_to_server(Fake(), server)
        creds = grpc.ssl_server_credentials([(read("srv.key"), read("srv.pem"))], root_certificates=read("ca.pem"),
                                            require_client_auth=True)
        port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        try:
            tls = ["--sidecar", "127.0.0.1:%d" % port, "--tls-server-name", "localhost",
                   "--tls-ca", os.path.join(d, "ca.pem")]
            mine = ["--tls-cert", os.path.join(d, "cli.pem"), "--tls-key", os.path.join(d, "cli.key")]
            r = self.ctl(None, "--json", *(tls + mine), "info")
            self.assertEqual(r.returncode, 0, r.stderr)
            info = json.loads(r.stdout)
            self.assertEqual(info["sidecar_id"], "tls-fake")
            self.assertEqual(info["version"], "worker-7")  # the server saw our client certificate
            # No client certificate, plaintext, or a CA that did not sign the server: no connection.
            for args in (tls, ["--sidecar", "127.0.0.1:%d" % port]):
                r = self.ctl(None, "--connect-timeout", "3", *args, "info")
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
                self.assertIn("cannot reach the sidecar", r.stderr)
            r = self.ctl(None, "--connect-timeout", "3", *(tls[:-1] + [os.path.join(d, "cli.pem")] + mine), "info")
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            # A certificate without its key is a usage error, found before connecting.
            r = self.ctl(None, *(tls + mine[:2]), "info")
            self.assertEqual(r.returncode, 2)
            self.assertIn("certificate and key together", r.stderr)
        finally:
            server.stop(0)

    def test_installed_library_pkg_config(self):
        prefix = os.path.join(self.workdir, "prefix")
        r = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        pcdirs = [os.path.join(d, "pkgconfig") for d, _, _ in os.walk(prefix)
                  if os.path.exists(os.path.join(d, "pkgconfig", "rdma-sidecar-client.pc"))]
        self.assertEqual(len(pcdirs), 1, os.listdir(prefix))
        self.assertTrue(os.path.exists(os.path.join(prefix, "include", "rdma_sidecar", "client.h")))
        self.assertTrue(os.path.exists(os.path.join(prefix, "bin", "rdma-sidecar-ctl")))
        env = dict(os.environ, PKG_CONFIG_PATH=pcdirs[0])
        pc = subprocess.run(["pkg-config", "--cflags", "--libs", "rdma-sidecar-client"], capture_output=True,
                            text=True, env=env, timeout=30)
        self.assertEqual(pc.returncode, 0, pc.stderr)
        incs = [os.path.normpath(f[2:]) for f in pc.stdout.split() if f.startswith("-I")]
        self.assertIn(os.path.join(prefix, "include"), incs)
        self.assertIn("-lrdma-sidecar-client", pc.stdout)
        cc = shutil.which("cc")
        if not cc:
            self.skipTest("no C compiler to build against the installed library")
        exe = os.path.join(self.workdir, "c_client_read")
        src = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "c_client_read.c")
        # A sanitizer build's library needs the sanitizer runtime in the program too.
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            sanitize = ["-fsanitize=address,undefined"] if "SANITIZE:BOOL=ON" in f.read() else []
        r = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-o", exe, src] + sanitize + pc.stdout.split(),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)

        cxx = shutil.which("c++")
        if cxx:  # the header is usable from C++ too (extern "C", no C-only syntax)
            r = subprocess.run([cxx, "-x", "c++", "-std=c++11", "-Wall", "-Werror", "-fsyntax-only", "-"]
                               + [f for f in pc.stdout.split() if f.startswith("-I")],
                               input="#include <rdma_sidecar/client.h>\nint main() { return RSC_OK; }\n",
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)

        a, b = self.pair()
        region = a.create_region(1 << 20)
        noise = os.urandom(region.size)
        a.fill(region, 0, noise)
        ro, descs = self.readable(a, region, [300000, 5])
        # Neither the example built with the .pc file (its RUNPATH) nor the installed ctl
        # ($ORIGIN/../lib...) needs LD_LIBRARY_PATH or ldconfig to find the library.
        bare = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        r = subprocess.run([os.path.join(prefix, "bin", "rdma-sidecar-ctl"), "--sidecar", "unix:" + b.sock,
                            "--json", "info"], capture_output=True, text=True, timeout=30 * SLOW, env=bare)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["sidecar_id"], "b")
        ldd = subprocess.run(["ldd", os.path.join(prefix, "bin", "rdma-sidecar-ctl")], capture_output=True,
                             text=True, env=bare, timeout=30).stdout
        found = [ln.split("=>")[1].split()[0] for ln in ldd.splitlines() if "librdma-sidecar-client" in ln]
        self.assertEqual([os.path.dirname(os.path.realpath(f)) for f in found],
                         [os.path.realpath(os.path.dirname(pcdirs[0]))], ldd)
        r = subprocess.run([exe, "unix:" + b.sock, ro.metadata], capture_output=True, text=True,
                           timeout=30 * SLOW, env=bare)
        self.assertEqual(r.returncode, 0, r.stderr)
        expect = b"".join(noise[d.offset:d.offset + d.length] for d in descs)
        self.assertEqual(r.stdout.strip(), "read %d bytes over tcp, fnv1a %016x" % (len(expect), fnv1a(expect)))


if __name__ == "__main__":
    main()
