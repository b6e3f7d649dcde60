# SPDX-License-Identifier: Apache-2.0
"""A peer that speaks the sidecar-to-sidecar protocol (sidecar/peer/proto.h) from Python, as a holder
of the cluster key could: the hello with its HMAC proofs, then OPEN, READV/WRITEV and DONE frames
written by hand, so a test can behave as no real sidecar would (trickle, stall, keep going after
the operation ended). Plain TCP only."""
import base64
import hashlib
import hmac
import os
import socket
import struct

from harness import pb

VERSION = 1
HELLO, HELLO_ACK, HELLO_FIN, OK, ERROR, OPEN = 1, 2, 3, 4, 5, 6
DATA, DONE, PING, PONG, READV, WRITEV = 8, 10, 11, 12, 14, 15
PEER_READ, PEER_WRITE = 3, 4  # sc_op_kind: what the peer does with the passive operation
HDR = struct.Struct("<BBHI")


def metadata_token(text):
    """The 16-byte token (the capability) inside `rsm1.` metadata."""
    assert text.startswith("rsm1."), text[:8]
    raw = text[5:]
    signed = pb.SignedMetadata.FromString(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    return pb.RdmaMetadata.FromString(signed.payload).token


def _str(s):
    b = s.encode()
    return struct.pack("<H", len(b)) + b


class PeerError(Exception):
    def __init__(self, code, text):
        super().__init__("ERROR frame %d: %s" % (code, text))
        self.code, self.text = code, text


class Peer:
    """One authenticated connection to a sidecar's data port."""

    def __init__(self, host, port, key_id, key, client_id="mallory", timeout=10):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cnonce = os.urandom(16)
        self.send(HELLO, struct.pack("<I", 0x504D5352) + cnonce + _str(client_id) + _str(key_id))
        typ, body = self.recv_frame()
        self.check(typ, body, HELLO_ACK)
        snonce, rest = body[:16], body[16:]
        (n,) = struct.unpack_from("<H", rest)
        server_id = rest[2:2 + n].decode()

        def proof(label, first, second):
            msg = (label + b"\0" + key_id.encode() + b"\0" + first + second + client_id.encode() + b"\0"
                   + server_id.encode() + b"\0")
            return hmac.new(key, msg, hashlib.sha256).digest()

        assert hmac.compare_digest(rest[2 + n:], proof(b"rsm1-hello-s", cnonce, snonce)), "bad server proof"
        self.send(HELLO_FIN, proof(b"rsm1-hello-c", snonce, cnonce))
        self.check(*self.recv_frame(), OK)
        self.server_id = server_id

    def send(self, typ, body=b""):
        self.sock.sendall(HDR.pack(VERSION, typ, 0, len(body)) + body)

    def recv_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the sidecar closed the connection")
            out += chunk
        return out

    def recv_frame(self):
        _, typ, _, n = HDR.unpack(self.recv_exact(HDR.size))
        return typ, self.recv_exact(n)

    @staticmethod
    def check(typ, body, want):
        if typ == ERROR:
            code, n = struct.unpack_from("<IH", body)
            raise PeerError(code, body[6:6 + n].decode(errors="replace"))
        assert typ == want, "frame %d, expected %d" % (typ, want)

    def ping(self):
        """One PING/PONG round trip: the sidecar has admitted the connection and served it."""
        cookie = os.urandom(8)
        self.send(PING, cookie)
        typ, body = self.recv_frame()
        self.check(typ, body, PONG)
        assert body == cookie, "PONG %r for PING %r" % (body, cookie)

    def open(self, token, xfer_id, peer_kind, total):
        self.send(OPEN, token + struct.pack("<QBQ", xfer_id, peer_kind, total))
        self.check(*self.recv_frame(), OK)

    def pieces_frame(self, typ, token, xfer_id, pieces):
        body = token + struct.pack("<QI", xfer_id, len(pieces))
        for d, off, ln in pieces:
            body += struct.pack("<IQQ", d, off, ln)
        self.send(typ, body)

    def readv_start(self, token, xfer_id, pieces):
        """Ask for the pieces; returns the DATA frame's length (the bulk is left to read)."""
        self.pieces_frame(READV, token, xfer_id, pieces)
        typ, body = self.recv_frame()
        self.check(typ, body, DATA)
        return struct.unpack("<Q", body)[0]


def open_frame(token, xfer_id, peer_kind, total):
    """The bytes of one OPEN frame (to pipeline many in one send)."""
    body = token + struct.pack("<QBQ", xfer_id, peer_kind, total)
    return HDR.pack(VERSION, OPEN, 0, len(body)) + body


def _peer_begin_request(self):
    """Leave a request in hand: the first two bytes of a PING's header, the rest never sent. The
    sidecar's thread takes the connection and waits for the rest (the connection is busy)."""
    self.sock.sendall(bytes([VERSION, PING]))


def _peer_replies(self, n):
    """Read n reply frames in bulk: a list of (type, ERROR code or 0, ERROR text or "")."""
    out, buf = [], b""
    while len(out) < n:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the sidecar closed the connection after %d of %d replies" % (len(out), n))
        buf += chunk
        off = 0
        while len(out) < n and len(buf) - off >= HDR.size:
            _, typ, _, blen = HDR.unpack_from(buf, off)
            if len(buf) - off - HDR.size < blen:
                break
            body = buf[off + HDR.size:off + HDR.size + blen]
            off += HDR.size + blen
            if typ == ERROR:
                code, tlen = struct.unpack_from("<IH", body)
                out.append((typ, code, body[6:6 + tlen].decode(errors="replace")))
            else:
                out.append((typ, 0, ""))
        buf = buf[off:]
    return out


def _peer_try_open(self, token, xfer_id, peer_kind, total):
    """OPEN; None when it was accepted, else its PeerError."""
    try:
        self.open(token, xfer_id, peer_kind, total)
        return None
    except PeerError as e:
        return e


Peer.begin_request = _peer_begin_request
Peer.replies = _peer_replies
Peer.try_open = _peer_try_open
