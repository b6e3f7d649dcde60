# SPDX-License-Identifier: Apache-2.0
"""NATS as a cluster: three nats-servers with routes on loopback, sidecars given all three URLs.

A publisher sidecar streams signed metadata (one fresh readable per message, so every message is
distinct) to a queue group of two subscriber sidecars and to a plain subscriber, while the test
SIGKILLs the nats-server that one sidecar is connected to. Checked: the sidecar reconnects to
another node on its own and its SubscribeMetadata streams go on without client action; no message
reaches the queue group twice; every publish that returned OK is delivered (nats.c buffers publishes
made while reconnecting, up to the reconnect buffer, and sends them once reconnected; a publish that
does not fit gets UNAVAILABLE); a metadata exchange with a transfer (bytes compared) works while the
node is down. A hung node (SIGSTOP): publishes report UNAVAILABLE until nats.c's pings declare it
stale and the sidecar moves on. Figures printed (look for "figure:"): reconnect time, messages lost by a plain
subscriber whose own node died (core NATS delivers at most once: nothing is kept for a subscriber
while it reconnects).
"""
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request

import grpc
from harness import NATS_SERVER, SLOW, SidecarTest, desc, free_port, main, pb, wait_until

N_MSGS = 150
GAP_S = 0.02  # between publishes: the stream lasts about 3 s plus the publish calls


class Node:
    """One nats-server of the cluster (client port, route port, monitoring port)."""

    def __init__(self, workdir, idx, ports, cluster_ports, mon_ports):
        self.idx, self.port, self.mon = idx, ports[idx], mon_ports[idx]
        self.url = "nats://127.0.0.1:%d" % self.port
        routes = ",".join("nats://127.0.0.1:%d" % p for i, p in enumerate(cluster_ports) if i != idx)
        self.log = open(os.path.join(workdir, "nats-node%d.log" % idx), "wb")
        self.proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port),
                                      "-m", str(self.mon), "--cluster_name", "sc-test",
                                      "--cluster", "nats://127.0.0.1:%d" % cluster_ports[idx],
                                      "--routes", routes],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def monitor(self, what):
        with urllib.request.urlopen("http://127.0.0.1:%d/%s" % (self.mon, what), timeout=2) as r:
            return json.loads(r.read())

    def routes(self):
        try:
            return self.monitor("routez").get("num_routes", 0)
        except OSError:
            return 0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Collector:
    """Reads one SubscribeMetadata stream on a thread: (monotonic time, metadata) per event."""

    def __init__(self, side, subject, group=""):
        self.events = []
        self.error = None
        self.stream = side.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject=subject,
                                                                              queue_group=group),
                                                  timeout=300 * SLOW)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            for ev in self.stream:
                self.events.append((time.monotonic(), ev.metadata))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e

    def close(self):
        self.stream.cancel()
        self.thread.join(10)


class NatsClusterTest(SidecarTest):
    def setUp(self):
        super().setUp()
        for _ in range(5):  # free ports may be taken by others before the servers bind them
            ports = [free_port() for _ in range(9)]
            if len(set(ports)) == 9:
                break
        self.nodes = [Node(self.workdir, i, ports[0:3], ports[3:6], ports[6:9]) for i in range(3)]
        self._procs.extend(self.nodes)
        wait_until(lambda: all(n.routes() == 2 for n in self.nodes), 20, "the three routes to form")
        # About 1 s after start each node dials the routes it learned by gossip again and closes
        # the duplicates ("Router connection closed: Duplicate Route"); interest registered over a
        # duplicate is dropped with it, so a subscription made in that second may never reach
        # another node (seen once in CI: a queue group got none of 20 messages published on the
        # other node). Subscriptions start after that settles.
        time.sleep(2.0)
        wait_until(lambda: all(n.routes() == 2 for n in self.nodes), 20, "the three routes to settle")
        self.urls = ",".join(n.url for n in self.nodes)
        self.keys = self.key_file()
        self.subject = "cluster.%d" % os.getpid()

    def start(self, name):
        # Core NATS: this test is about its semantics (queue groups, reconnects, what is lost);
        # the JetStream hand-off on a cluster is test_nats_jetstream.py's.
        s = self.sidecar(name, key_file=self.keys, nats_url=self.urls, tcp=False,
                         extra=["--nats-handoff", "core"])
        wait_until(lambda: s.info().nats_state == "connected", 15, "%s to connect to NATS" % name)
        return s

    def node_of(self, side):
        """The node a sidecar is connected to now, from its log's last (re)connect line."""
        urls = re.findall(r"(?:re)?connected to nats://127\.0\.0\.1:(\d+)", side.read_log())
        self.assertTrue(urls, "no connect line in %s's log" % side.name)
        return next(n for n in self.nodes if n.port == int(urls[-1]))

    def start_on(self, name, avoid):
        """A sidecar connected to a node not in avoid (nats.c picks a random server from the list:
        restart until it lands where the scenario needs it)."""
        for _ in range(30):
            s = self.start(name)
            if self.node_of(s) not in avoid:
                return s
            s.stop()
            self._procs.remove(s)
        self.fail("%s never landed on a node outside %s" % (name, [n.idx for n in avoid]))

    def stream(self, pub, kill_node, kill_after):
        """Publish N_MSGS distinct metadata, killing kill_node after kill_after of them.
        Returns ({metadata: index} of publishes that returned OK, [errors], kill time)."""
        r = pub.create_region(N_MSGS)
        pub.fill(r, 0, os.urandom(N_MSGS))
        ok, errors, kill_t = {}, [], None
        for i in range(N_MSGS):
            if i == kill_after:
                kill_t = time.monotonic()
                kill_node.kill()
            ro = pub.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, i, 1)],
                                                                 timeout_ms=120000), timeout=10 * SLOW)
            try:
                pub.stub.PublishMetadata(pb.PublishMetadataRequest(subject=self.subject,
                                                                   operation_id=ro.operation_id),
                                         timeout=10 * SLOW)
                ok[ro.metadata] = i
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                errors.append((i, e.details()))
            time.sleep(GAP_S)
        return ok, errors, kill_t

    def watch_reconnect(self, side, old):
        """Polls on a thread from now on; result() gives the moment the sidecar was connected to
        another node than old (GetInfo says connected and its log names the new node)."""
        box = {}

        def poll():
            end = time.monotonic() + 60 * SLOW
            while time.monotonic() < end:
                try:
                    if side.info().nats_state == "connected" and self.node_of(side) is not old:
                        box["t"] = time.monotonic()
                        return
                except (grpc.RpcError, AssertionError):
                    pass
                time.sleep(0.01)
        t = threading.Thread(target=poll, daemon=True)
        t.start()

        def result(kill_t):
            t.join(60 * SLOW)
            self.assertIn("t", box, "%s did not reconnect to another node" % side.name)
            m = re.findall(r"reconnected to \S+ after ([0-9.]+) s", side.read_log())
            return box["t"] - kill_t, (m[-1] if m else "?")
        return result

    def settle(self, collectors, expect, timeout=15):
        try:
            wait_until(lambda: sum(len(c.events) for c in collectors) >= expect, timeout,
                       "%d events" % expect)
        except AssertionError as e:
            # What each subscriber got, and what each live node knows of interest and routes: the
            # clues for a delivery that never came (seen rarely under ASan, cause not yet known).
            nodes = []
            for n in self.nodes:
                try:
                    z = n.monitor("subsz")
                    r = n.monitor("routez")
                    nodes.append("node%d: %s subscriptions, routes %s" % (
                        n.idx, z.get("num_subscriptions"),
                        [(x.get("rid"), x.get("port"), x.get("subscriptions", x.get("num_subs"))) for x in r.get("routes", [])]))
                except OSError as err:
                    nodes.append("node%d: %s" % (n.idx, err))
            raise AssertionError("%s; events per subscriber %s; %s" % (
                e, [len(c.events) for c in collectors], "; ".join(nodes))) from None
        time.sleep(0.5 * SLOW)  # duplicates, if any, would come now

    def exchange_while_down(self, pub, sub):
        """A metadata exchange and a READ (bytes compared) with one node down."""
        data = os.urandom(65537)
        r = pub.create_region(len(data))
        pub.fill(r, 0, data)
        ro = pub.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, len(data))],
                                                             timeout_ms=60000), timeout=10)
        subject = self.subject + ".xfer"
        c = Collector(sub, subject)
        end = time.monotonic() + 15 * SLOW
        while not c.events and time.monotonic() < end:  # until the subscription is in place
            pub.stub.PublishMetadata(pb.PublishMetadataRequest(subject=subject, operation_id=ro.operation_id),
                                     timeout=10)
            time.sleep(0.2)
        c.close()
        self.assertTrue(c.events, "no metadata delivered while a node was down")
        self.assertEqual(c.events[0][1], ro.metadata)
        rb = sub.create_region(len(data))
        op = sub.stub.BeginRead(pb.BeginTransferRequest(metadata=c.events[0][1],
                                                        descriptors=[desc(rb, 0, len(data))]), timeout=10)
        self.assertEqual(sub.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(sub.peek(rb, 0, len(data)), data)

    def check_group(self, g1, g2, ok):
        """No message twice to the queue group; returns the set of indices it received."""
        seen = {}
        for c in (g1, g2):
            for _, md in c.events:
                self.assertIn(md, ok, "the group got metadata that was never published")
                seen[md] = seen.get(md, 0) + 1
        twice = sorted(ok[md] for md, n in seen.items() if n > 1)
        self.assertEqual(twice, [], "messages delivered twice to the queue group")
        return {ok[md] for md in seen}

    def test_kill_subscribers_node(self):
        pub = self.start("pub")
        s1 = self.start_on("s1", avoid=[self.node_of(pub)])
        victim = self.node_of(s1)
        s2 = self.start_on("s2", avoid=[victim])
        g1, g2 = Collector(s1, self.subject, "g"), Collector(s2, self.subject, "g")
        plain1, plain2 = Collector(s1, self.subject), Collector(s2, self.subject)
        # Interest must have reached the publisher's node before the stream starts.
        time.sleep(0.5 * SLOW)
        watch = self.watch_reconnect(s1, victim)
        ok, errors, kill_t = self.stream(pub, victim, N_MSGS // 3)
        took, logged = watch(kill_t)
        self.assertEqual(errors, [], "the publisher's node was not touched: no publish may fail")
        self.settle([plain2], len(ok))
        got = self.check_group(g1, g2, ok)
        # The plain subscriber on the surviving node sees every message exactly once.
        self.assertEqual(sorted(ok[md] for _, md in plain2.events), list(range(N_MSGS)))
        # s1's streams resumed without client action: they get messages published after the reconnect.
        after = [t for t, _ in plain1.events if t > kill_t + took]
        self.assertTrue(after, "s1's plain subscription did not resume after the reconnect")
        self.assertTrue([t for t, _ in g1.events if t > kill_t + took] or
                        len(got) == N_MSGS, "s1's queue subscription did not resume")
        lost_plain = sorted(set(range(N_MSGS)) - {ok[md] for _, md in plain1.events})
        lost_group = sorted(set(range(N_MSGS)) - got)
        # Whatever was lost was published around the kill (in flight to the dead node, or while
        # s1 was away), never later.
        for i in lost_plain + lost_group:
            self.assertLess(i, N_MSGS // 3 + int((took + 1.0) / GAP_S),
                            "message %d, published well after the reconnect, was lost" % i)
        print("figure: subscriber's node killed: s1 reconnected to another node in %.2f s "
              "(its log: %s s); queue group got %d of %d, none twice; plain subscriber on the "
              "dead node missed %d (published during its %.2f s away), on a live node missed 0"
              % (took, logged, len(got), N_MSGS, len(lost_plain), took))
        for c in (g1, g2, plain1, plain2):
            self.assertIsNone(c.error)
        self.exchange_while_down(pub, s2)
        self.exchange_while_down(s2, s1)
        for c in (g1, g2, plain1, plain2):
            c.close()

    def test_kill_publishers_node(self):
        pub = self.start("pub")
        victim = self.node_of(pub)
        s1 = self.start_on("s1", avoid=[victim])
        s2 = self.start_on("s2", avoid=[victim])
        g1, g2 = Collector(s1, self.subject, "g"), Collector(s2, self.subject, "g")
        plain = Collector(s1, self.subject)
        time.sleep(0.5 * SLOW)
        watch = self.watch_reconnect(pub, victim)
        ok, errors, kill_t = self.stream(pub, victim, N_MSGS // 3)
        took, logged = watch(kill_t)
        self.settle([plain], len(ok))
        got = self.check_group(g1, g2, ok)
        plain_got = sorted(ok[md] for _, md in plain.events)
        self.assertEqual(len(plain_got), len(set(plain_got)), "the plain subscriber got duplicates")
        # Delivered or reported: every publish that returned OK reached both kinds of subscriber.
        self.assertEqual(sorted(got), sorted(ok.values()),
                         "publishes that returned OK were not delivered to the queue group")
        self.assertEqual(plain_got, sorted(ok.values()),
                         "publishes that returned OK were not delivered to the plain subscriber")
        print("figure: publisher's node killed: the publisher reconnected to another node in %.2f s "
              "(its log: %s s); %d publishes returned OK and all were delivered once to the queue "
              "group and to the plain subscriber; %d publishes failed: %s"
              % (took, logged, len(ok), len(errors), errors[:2]))
        self.exchange_while_down(pub, s1)
        for c in (g1, g2, plain):
            self.assertIsNone(c.error)
            c.close()

    def test_publishers_node_hangs(self):
        """SIGSTOP, not SIGKILL: the TCP connection stays up and nothing answers. Each publish then
        waits for its flush and returns UNAVAILABLE ("may or may not have been delivered") until
        nats.c's pings (every 10 s, 2 unanswered) declare the node stale and it moves to another;
        every publish that returned OK is delivered once."""
        pub = self.start("pub")
        victim = self.node_of(pub)
        s1 = self.start_on("s1", avoid=[victim])
        s2 = self.start_on("s2", avoid=[victim])
        g1, g2 = Collector(s1, self.subject, "g"), Collector(s2, self.subject, "g")
        time.sleep(0.5 * SLOW)
        r = pub.create_region(1000)
        watch = self.watch_reconnect(pub, victim)
        ok, errors = {}, []
        victim.proc.send_signal(signal.SIGSTOP)
        stop_t = time.monotonic()
        try:
            i = 0
            end = stop_t + 60 * SLOW
            while time.monotonic() < end and i < 1000:
                ro = pub.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, i, 1)],
                                                                     timeout_ms=120000), timeout=10 * SLOW)
                try:
                    pub.stub.PublishMetadata(pb.PublishMetadataRequest(subject=self.subject,
                                                                       operation_id=ro.operation_id),
                                             timeout=10 * SLOW)
                    ok[ro.metadata] = i
                    if errors and len([v for v in ok.values() if v > errors[-1][0]]) >= 20:
                        break  # reconnected and 20 publishes went through since the last error
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                    self.assertIn("may or may not have been delivered", e.details())
                    errors.append((i, e.details()))
                i += 1
                time.sleep(0.05)
            took, logged = watch(stop_t)
        finally:
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
        self.assertTrue(errors, "no publish reported the hung node")
        self.settle([g1, g2], len(ok))
        got = self.check_group(g1, g2, ok)
        self.assertEqual(sorted(got & set(ok.values())), sorted(ok.values()),
                         "publishes that returned OK were not delivered")
        print("figure: publisher's node hung (SIGSTOP): %d publishes returned UNAVAILABLE (%s...), "
              "the publisher moved to another node after %.1f s; all %d OK'd publishes delivered once"
              % (len(errors), errors[0][1][:90], took, len(ok)))
        for c in (g1, g2):
            self.assertIsNone(c.error)
            c.close()


if __name__ == "__main__":
    main()
