# SPDX-License-Identifier: Apache-2.0
"""The peer port's slots against key holders that OPEN and never DONE (issue 32, items 7 and 9).

A holder of the cluster key and of one token (even of an operation released since) used to hold
a --data-max-peers slot for ever: a connection with a transfer OPENed was never evicted, its
records went only with a DONE or its close, and the dialing side did not retry the "busy"
refusal. Now: a connection with no request in hand is evictable whatever it has OPENed; the
records of a transfer go with its operation; a connection holds at most 256 open transfers
(SC_PEER_SERVER_MAX_OPEN) and an operation at most 1,024 uses open at once
(SC_OP_MAX_OPEN_USES), each refused past it with RESOURCE_EXHAUSTED and a message that says so;
one peer id holds at most a quarter of --data-max-peers; the dialing side retries an explained
"busy: retry" refusal with backoff within its deadline. The OPEN flood (100,000 OPENs on two
connections, one any_uses token) completes and its own work is capped; bench/open_flood.py
measures what it costs an honest reader. No assertion depends on the machine's speed."""
import os
import random
import threading
import urllib.request

from harness import SLOW, SidecarTest, desc, free_port, main, pb, wait_until
from peer_client import OK, PEER_READ, Peer, PeerError, metadata_token, open_frame

MAX_OPEN = 256        # SC_PEER_SERVER_MAX_OPEN (sidecar/peer/server.h)
MAX_OPEN_USES = 1024  # SC_OP_MAX_OPEN_USES (sidecar/backend/passive.h)
RESOURCE_EXHAUSTED = 8


class PeerSlotsTest(SidecarTest):
    def pair(self, extra_a=()):
        key = os.urandom(32)
        keys = self.key_file(keys=[("k1", key)])
        self.metrics_port = free_port()
        a = self.sidecar("a", key_file=keys,
                         extra=list(extra_a) + ["--metrics-listen", "127.0.0.1:%d" % self.metrics_port])
        b = self.sidecar("b", key_file=keys)
        host, port = a.info().data_endpoints[0].rsplit(":", 1)
        return a, b, key, host, int(port)

    def readable(self, s, size, **kw):
        r = s.create_region(size)
        data = os.urandom(size)
        s.fill(r, 0, data)
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, size)],
                                                           timeout_ms=int(120000 * SLOW), **kw), timeout=10)
        return op, data

    def honest_read(self, a, b, size=4096, timeout_ms=20000):
        """b reads a fresh readable of a: the bytes compared. Returns the finished operation."""
        op, data = self.readable(a, size)
        rb = b.create_region(size)
        got = b.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(rb, 0, size)],
                                                       timeout_ms=int(timeout_ms * SLOW)), timeout=10)
        done = b.wait(got.operation_id, int((timeout_ms + 10000) * SLOW))
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertTrue(b.peek(rb, 0, size) == data, "bytes differ after the READ")
        return done

    def wait_conns(self, state, n):
        """Until n of a's authenticated connections are in state ("idle", "busy")."""
        def there():
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=10).read()
            return ('rdma_sidecar_peer_connections{state="%s"} %d' % (state, n)) in text.decode()
        wait_until(there, 10 * SLOW, "%d %s peer connections" % (n, state))

    def hold_requests(self, peers):
        """Leave a request in hand on each of peers (taken by a thread: not evictable) and wait until
        a's metrics count them busy. First every one must be idle: a connection whose hello or PING
        was just answered counts busy for a moment before its thread parks it, which a busy host
        stretches (an ASan run beside two busy loops saw it), and that moment must not pass for the
        request in hand."""
        self.wait_conns("idle", len(peers))
        for p in peers:
            p.begin_request()
        self.wait_conns("busy", len(peers))

    def close_all(self, peers):
        for p in peers:
            p.sock.close()

    # ---- item 7 --------------------------------------------------------------------------------

    def test_open_holders_do_not_lock_out_an_honest_reader(self):
        a, b, key, host, port = self.pair(["--data-max-peers", "8"])
        self.honest_read(a, b)  # b's pool now holds an idle connection to a
        held, _ = self.readable(a, 4096, any_uses=True)
        token = metadata_token(held.metadata)
        hostile = []
        self.addCleanup(self.close_all, hostile)
        for i in range(8):  # every slot: b's idle connection is closed for the eighth
            p = Peer(host, port, "k1", key, client_id="holder%d" % i)
            hostile.append(p)
            for _ in range(3):
                p.open(token, random.getrandbits(64), PEER_READ, 4096)
            p.ping()  # use (a transfer is open), yet no request in hand: evictable
        # Eight connections, each with transfers OPENed and no DONE, none with a request in hand:
        # the honest reader's new connection closes one of them.
        for _ in range(3):
            self.honest_read(a, b)
        self.assertIn("closed the one idle longest", a.read_log())

    def test_records_of_ended_operations_are_dropped(self):
        a, b, key, host, port = self.pair()
        p = Peer(host, port, "k1", key, client_id="holder")
        self.addCleanup(p.sock.close)
        first, _ = self.readable(a, 4096, any_uses=True)
        token = metadata_token(first.metadata)
        for _ in range(MAX_OPEN):
            p.open(token, random.getrandbits(64), PEER_READ, 4096)
        e = p.try_open(token, random.getrandbits(64), PEER_READ, 4096)
        self.assertIsNotNone(e, "an OPEN past %d open transfers was accepted" % MAX_OPEN)
        self.assertEqual(e.code, RESOURCE_EXHAUSTED)
        # The operation ends: its records go with it, and with them the connection's room.
        a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=first.operation_id), timeout=10)
        second, _ = self.readable(a, 4096, any_uses=True)
        token2 = metadata_token(second.metadata)
        for _ in range(MAX_OPEN):
            p.open(token2, random.getrandbits(64), PEER_READ, 4096)
        p.ping()
        # (the released operation itself is refused, as ended, on a connection with room)
        q = Peer(host, port, "k1", key, client_id="holder")
        self.addCleanup(q.sock.close)
        e = q.try_open(token, random.getrandbits(64), PEER_READ, 4096)
        self.assertIsNotNone(e)
        self.assertNotIn("transfers open", e.text)

    def test_open_cap_per_connection(self):
        a, b, key, host, port = self.pair()
        p = Peer(host, port, "k1", key, client_id="holder")
        self.addCleanup(p.sock.close)
        op, _ = self.readable(a, 4096, any_uses=True)
        token = metadata_token(op.metadata)
        xfers = [random.getrandbits(64) for _ in range(MAX_OPEN)]
        for x in xfers:
            p.open(token, x, PEER_READ, 4096)
        p.open(token, xfers[0], PEER_READ, 4096)  # another OPEN of one it holds: still fine
        e = p.try_open(token, random.getrandbits(64), PEER_READ, 4096)
        self.assertIsNotNone(e, "an OPEN past %d open transfers was accepted" % MAX_OPEN)
        self.assertEqual(e.code, RESOURCE_EXHAUSTED)
        self.assertIn("this connection already has %d transfers open on sidecar a (the most one peer "
                      "connection may hold): send their DONE, or OPEN on another connection" % MAX_OPEN, e.text)
        p.ping()  # the connection goes on
        other = Peer(host, port, "k1", key, client_id="holder")  # another connection has its own room
        self.addCleanup(other.sock.close)
        other.open(token, random.getrandbits(64), PEER_READ, 4096)
        wait_until(lambda: "refused an OPEN from peer sidecar \"holder\"" in a.read_log(), 10 * SLOW,
                   "the refusal in the log")

    def test_each_peer_id_has_a_share(self):
        a, b, key, host, port = self.pair(["--data-max-peers", "8"])  # a share of 2 per id
        hog = []
        self.addCleanup(self.close_all, hog)
        for _ in range(2):  # one after the other: its PONG says it was admitted (in this order)
            hog.append(Peer(host, port, "k1", key, client_id="hog"))
            hog[-1].ping()
        # Both idle: a third connection of the same id closes the one of its own idle longest. (A
        # connection whose PING was just answered counts busy until its thread parks it, which a
        # busy host stretches: wait until both are parked, or the one just pinged may be the one
        # left standing while the other is closed.)
        self.wait_conns("idle", 2)
        hog.append(Peer(host, port, "k1", key, client_id="hog"))
        hog[-1].ping()
        wait_until(lambda: 'peer "hog" holds its share of 2 connections' in a.read_log(), 10 * SLOW,
                   "the eviction of its own connection in the log")
        # Both live ones busy (a request in hand): the next one of that id is refused, told why...
        self.hold_requests(hog[1:])
        late = Peer(host, port, "k1", key, client_id="hog")  # the refusal answers its first request
        self.addCleanup(late.sock.close)
        late.sock.settimeout(10 * SLOW)
        with self.assertRaises(PeerError) as cm:
            late.ping()
        self.assertEqual(cm.exception.code, RESOURCE_EXHAUSTED)
        self.assertIn('sidecar a is serving 2 connections of peer "hog" (its share: a quarter of --data-max-peers '
                      '8), all of them busy: retry in a few seconds', cm.exception.text)
        # ...while the cap has room for others, and an honest sidecar reads.
        other = Peer(host, port, "k1", key, client_id="other")
        self.addCleanup(other.sock.close)
        other.ping()
        self.honest_read(a, b)

    def test_refused_requests_do_not_keep_a_connection_fresh(self):
        """A peer that sends OPENs the sidecar refuses (a token it does not know) is not using its
        connection: at the cap, that connection is still the one idle longest and is evicted."""
        a, b, key, host, port = self.pair(["--data-max-peers", "4"])
        peers = []
        self.addCleanup(self.close_all, peers)
        for i in range(4):  # admitted in this order (each PONG says so): p0 is idle longest
            peers.append(Peer(host, port, "k1", key, client_id="p%d" % i))
            peers[-1].ping()
        for x in range(20):  # p0 keeps asking, and is refused every time
            e = peers[0].try_open(os.urandom(16), 1000 + x, PEER_READ, 4096)
            self.assertIsInstance(e, PeerError)
        self.wait_conns("idle", 4)  # p0's last refusal answered and its connection parked again
        newcomer = Peer(host, port, "k1", key, client_id="p4")
        peers.append(newcomer)
        newcomer.ping()  # admitted: an idle connection was closed for it
        peers[0].sock.settimeout(10 * SLOW)
        with self.assertRaises((PeerError, ConnectionError, OSError)):
            peers[0].ping()  # p0 was the one closed, refused OPENs or not
        for p in peers[1:]:
            p.ping()

    def test_dialing_side_retries_busy_within_its_deadline(self):
        a, b, key, host, port = self.pair(["--data-max-peers", "1"])
        busy = Peer(host, port, "k1", key, client_id="busy")
        self.addCleanup(busy.sock.close)
        self.hold_requests([busy])  # the only slot, a request in hand
        op, data = self.readable(a, 4096)
        rb = b.create_region(4096)
        got = b.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(rb, 0, 4096)],
                                                       timeout_ms=int(60000 * SLOW)), timeout=10)
        # b was refused at least once (a says so), and is still trying...
        wait_until(lambda: "sidecar a is serving 1 peer connections (--data-max-peers), all of them busy" in
                   a.read_log(), 20 * SLOW, "a's refusal of b in a's log")
        self.assertIn(b.stub.GetOperation(pb.GetOperationRequest(operation_id=got.operation_id),
                                          timeout=10).status,
                      (pb.OPERATION_STATUS_SCHEDULED, pb.OPERATION_STATUS_IN_PROGRESS))
        busy.sock.close()  # the slot frees: b's next try is admitted
        done = b.wait(got.operation_id, int(70000 * SLOW))
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertTrue(b.peek(rb, 0, 4096) == data, "bytes differ after the READ")

    # ---- item 9 --------------------------------------------------------------------------------

    def flood(self, p, token, n, out, i):
        """Pipeline n OPENs (distinct transfer ids) on p and read every reply; out[i] = replies."""
        frames = b"".join(open_frame(token, random.getrandbits(64), PEER_READ, 4096) for _ in range(n))
        sender = threading.Thread(target=p.sock.sendall, args=(frames,))
        sender.start()
        out[i] = p.replies(n)
        sender.join()

    def test_open_flood_completes_and_is_capped(self):
        a, b, key, host, port = self.pair()
        op, _ = self.readable(a, 4096, any_uses=True)
        token = metadata_token(op.metadata)
        flooders = [Peer(host, port, "k1", key, client_id="flood", timeout=300 * SLOW) for _ in range(2)]
        self.addCleanup(self.close_all, flooders)
        out = [None, None]
        threads = [threading.Thread(target=self.flood, args=(p, token, 50000, out, i))
                   for i, p in enumerate(flooders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600 * SLOW)
        self.assertTrue(all(o is not None for o in out), "the flood did not complete")
        for replies in out:
            self.assertEqual(len(replies), 50000)
            oks = sum(1 for r in replies if r[0] == OK)
            self.assertEqual(oks, MAX_OPEN, "OPENs accepted on one connection")
            refused = [r for r in replies if r[0] != OK]
            self.assertTrue(all(r[1] == RESOURCE_EXHAUSTED and "transfers open" in r[2] for r in refused),
                            refused[:1])
        # Uses per operation: more connections reach the operation's cap of uses open at once.
        more = [Peer(host, port, "k1", key, client_id="flood%d" % i, timeout=60 * SLOW) for i in range(3)]
        self.addCleanup(self.close_all, more)
        accepted = 2 * MAX_OPEN
        last = None
        for p in more:
            p.sock.sendall(b"".join(open_frame(token, random.getrandbits(64), PEER_READ, 4096)
                                    for _ in range(MAX_OPEN)))
            for r in p.replies(MAX_OPEN):
                if r[0] == OK:
                    accepted += 1
                else:
                    last = r
        self.assertEqual(accepted, MAX_OPEN_USES, "uses open at once on one operation")
        self.assertEqual(last[1], RESOURCE_EXHAUSTED)
        self.assertIn("already has %d transfers open at once (the most a passive operation serves at once)" %
                      MAX_OPEN_USES, last[2])
        # The flood's records hold nothing of anyone else's: an honest reader still reads, and
        # the flooders' connections still answer.
        self.honest_read(a, b)
        for p in flooders + more:
            p.ping()


if __name__ == "__main__":
    main()
