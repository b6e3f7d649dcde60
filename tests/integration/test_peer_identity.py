# SPDX-License-Identifier: Apache-2.0
"""Issue 23 items 4 and 5: per-sidecar identity on the peer channel, and certificates that rotate.

Real sidecars with certificates made at test time by the openssl CLI (a CA, leaves with SPIFFE URI
SANs spiffe://test.example/ns/default/sidecar/ID, `openssl ca` for exact validity windows), and a
cluster key every sidecar holds, so only the certificates tell sidecars apart:
  - a sidecar whose certificate names M but whose hello claims B is refused (PERMISSION_DENIED
    naming both), on the serving side, whatever it asks for;
  - M using metadata whose audience is B is refused;
  - M minting writable metadata that names A as issuer but M's data endpoint: B's BeginWrite is
    refused before a byte leaves B (M's region keeps its random bytes);
  - A, B and M with the right ids and certificates move random bytes both ways;
  - rotation: A's certificate files replaced by a symlink swap (as the kubelet does for
    cert-manager's and SPIRE's volumes) while a transfer waits on a paused peer: it completes, and
    the next connection presents the new certificate (GetInfo and the peer's log); a garbage file
    keeps the old one, logged;
  - an expired certificate is refused with a message that says so, on both sides;
  - start-up errors: --peer-identity-required without peer TLS, a certificate naming another id,
    an expired certificate of our own.
Every refusal is checked by status code and message text."""
import datetime
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request

import grpc
from harness import BINARY, SLOW, SidecarTest, desc, free_port, main, pb, rpc, wait_until

PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
TD = "test.example"


def _openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=30)


def _utc(offset_s):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_s)
    return t.strftime("%y%m%d%H%M%SZ")


def pb_stub(channel):
    return rpc.SidecarStub(channel)


class Pki:
    """A CA signing leaves with `openssl ca`, so each leaf gets the validity window asked for."""

    def __init__(self, workdir, name="cluster"):
        self.dir = os.path.join(workdir, "pki-" + name)
        os.makedirs(os.path.join(self.dir, "new"), exist_ok=True)
        self.key = os.path.join(self.dir, "ca.key")
        self.cert = os.path.join(self.dir, "ca.pem")
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", self.key, "-out", self.cert, "-days", "2", "-subj", "/CN=test " + name,
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        open(os.path.join(self.dir, "index.txt"), "w").close()
        with open(os.path.join(self.dir, "serial"), "w") as f:
            f.write("%06X\n" % (0x100000 + int.from_bytes(os.urandom(2), "big")))
        self.cnf = os.path.join(self.dir, "ca.cnf")
        with open(self.cnf, "w") as f:
            f.write("[ca]\ndefault_ca = d\n[d]\ndir = %s\ndatabase = $dir/index.txt\n"
                    "new_certs_dir = $dir/new\nserial = $dir/serial\ndefault_md = sha256\n"
                    "policy = p\nunique_subject = no\ncopy_extensions = none\n"
                    "[p]\ncommonName = supplied\n" % self.dir)
        self.n = 0

    def issue(self, cn, san=None, start=-3600, end=86400):
        """(cert, key) for a leaf with subject CN cn, SAN `san` (default the SPIFFE ID naming cn),
        valid from now+start to now+end seconds."""
        self.n += 1
        base = os.path.join(self.dir, "%s-%d" % (cn, self.n))
        key, csr, cert, ext = base + ".key", base + ".csr", base + ".pem", base + ".ext"
        if san is None:
            san = "URI:spiffe://%s/ns/default/sidecar/%s" % (TD, cn)
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n")
            if san:
                f.write("subjectAltName=%s\n" % san)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", key, "-out", csr, "-subj", "/CN=%s" % cn)
        _openssl("ca", "-batch", "-config", self.cnf, "-cert", self.cert, "-keyfile", self.key,
                 "-in", csr, "-out", cert, "-notext", "-extfile", ext,
                 "-startdate", _utc(start), "-enddate", _utc(end))
        os.chmod(key, 0o600)
        return cert, key

    @staticmethod
    def serial(cert):
        out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", cert], check=True,
                             capture_output=True, text=True, timeout=30).stdout
        return out.strip().split("=", 1)[1].upper()


class Volume:
    """Certificate files as a Kubernetes secret or CSI volume holds them: tls.crt and tls.key are
    symlinks through ..data, a symlink to a timestamped directory; an update writes a new
    directory and renames a new ..data over the old one."""

    def __init__(self, root):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.n = 0
        for name in ("tls.crt", "tls.key"):
            os.symlink(os.path.join("..data", name), os.path.join(root, name))

    def put(self, cert_bytes, key_bytes):
        self.n += 1
        d = "..ts%d" % self.n
        os.makedirs(os.path.join(self.root, d))
        for name, data in (("tls.crt", cert_bytes), ("tls.key", key_bytes)):
            with open(os.path.join(self.root, d, name), "wb") as f:
                f.write(data)
        tmp = os.path.join(self.root, "..data_tmp")
        os.symlink(d, tmp)
        os.rename(tmp, os.path.join(self.root, "..data"))

    def put_files(self, cert, key):
        with open(cert, "rb") as c, open(key, "rb") as k:
            self.put(c.read(), k.read())

    @property
    def cert(self):
        return os.path.join(self.root, "tls.crt")

    @property
    def key(self):
        return os.path.join(self.root, "tls.key")


class PeerIdentityTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.pki = Pki(self.workdir)
        self.keys = self.key_file()

    def tls_flags(self, cert, key):
        return ["--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", self.pki.cert]

    def ident_sidecar(self, name, cert_name=None, sidecar_id=None, extra=(), san=None):
        """A sidecar called name whose certificate names cert_name (default name) and whose
        --id is sidecar_id (default name)."""
        cert, key = self.pki.issue(cert_name or name, san=san)
        flags = self.tls_flags(cert, key) + list(extra)
        if sidecar_id:
            flags += ["--id", sidecar_id]
        return self.sidecar(name, key_file=self.keys, extra=flags)

    # ---- helpers --------------------------------------------------------------------------------

    def transfer(self, passive, active, size, direction, audience="", timeout_ms=30000):
        rp, ra = passive.create_region(size + 10), active.create_region(size + 10)
        noise_p, noise_a = os.urandom(size + 10), os.urandom(size + 10)
        passive.fill(rp, 0, noise_p)
        active.fill(ra, 0, noise_a)
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, 3, size)], timeout_ms=timeout_ms,
                                            audience=audience), timeout=10 * SLOW)
        begin = active.stub.BeginRead if direction == "read" else active.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(ra, 7, size)],
                                           timeout_ms=timeout_ms), timeout=10 * SLOW)
        done = active.wait(op.operation_id, timeout_ms)
        return done, po, rp, ra, noise_p, noise_a

    def check_moved(self, passive, active, size, direction, audience=""):
        done, po, rp, ra, noise_p, noise_a = self.transfer(passive, active, size, direction,
                                                           audience)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        if direction == "read":
            expect = bytearray(noise_a)
            expect[7:7 + size] = noise_p[3:3 + size]
            self.assertTrue(active.peek(ra, 0, size + 10) == bytes(expect), "READ bytes differ")
        else:
            expect = bytearray(noise_p)
            expect[3:3 + size] = noise_a[7:7 + size]
            self.assertTrue(passive.peek(rp, 0, size + 10) == bytes(expect), "WRITE bytes differ")
        self.assertEqual(passive.wait(po.operation_id, 20000).status,
                         pb.OPERATION_STATUS_COMPLETE)

    def check_refused(self, passive, active, direction, code, contains, audience=""):
        """The transfer errors with code and every text of contains; neither region changed."""
        size = 1 << 20
        done, po, rp, ra, noise_p, noise_a = self.transfer(passive, active, size, direction,
                                                           audience)
        self.assertEqual(done.status, pb.OPERATION_STATUS_ERRORED, done.error.message)
        self.assertEqual(done.error.code, code, done.error.message)
        for text in contains:
            self.assertIn(text, done.error.message)
        self.assertTrue(passive.peek(rp, 0, size + 10) == noise_p, "passive region changed")
        self.assertTrue(active.peek(ra, 0, size + 10) == noise_a, "active region changed")
        return done

    def start_fails(self, args, contains):
        """The daemon started with args exits 2 with contains on stderr."""
        sock = os.path.join(self.workdir, "x-%d.sock" % len(args))
        r = subprocess.run([BINARY, "--grpc-listen", "unix:" + sock, "--shm-dir", self.workdir,
                            "--data-listen", "127.0.0.1:0", "--key-file", self.keys] + list(args),
                           capture_output=True, text=True, timeout=30 * SLOW)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(contains, r.stderr)
        return r.stderr

    # ---- identity -------------------------------------------------------------------------------

    def test_right_ids_move_bytes_both_ways(self):
        a, b, m = self.ident_sidecar("A"), self.ident_sidecar("B"), self.ident_sidecar("M")
        for passive, active in ((a, b), (b, a), (a, m), (m, b)):
            for direction in ("read", "write"):
                with self.subTest(passive=passive.name, active=active.name, direction=direction):
                    self.check_moved(passive, active, (1 << 20) + 5, direction)
        # the audience is checked against the verified identity, and the right one passes
        self.check_moved(a, b, 4097, "read", audience="B")
        # GetInfo says which certificate this sidecar presents and whom it names
        pc = a.info().peer_certificate
        self.assertEqual(pc.identity, "A")
        self.assertEqual(pc.identity_source, "spiffe")
        self.assertTrue(pc.serial and pc.not_after_unix_s > time.time() > pc.not_before_unix_s, pc)

    def test_hello_claiming_another_id_refused(self):
        a = self.ident_sidecar("A")
        # M holds a certificate naming M and the cluster key, and claims to be B in its hello
        # (--peer-identity off on M itself: the check is the receiver's)
        m = self.ident_sidecar("M", sidecar_id="B", extra=["--peer-identity", "off"])
        want = 'peer certificate names sidecar "M" but its hello claims "B"'
        for direction in ("read", "write"):
            with self.subTest(direction=direction):
                self.check_refused(a, m, direction, PERMISSION_DENIED, [want])
        wait_until(lambda: want in a.read_log(), 10, "A to log the refusal")

    def test_dns_and_cn_sources(self):
        for source, san in (("dns", "DNS:%s,DNS:localhost,IP:127.0.0.1"), ("cn", "")):
            with self.subTest(source=source):
                mode = ["--peer-identity", source]
                a = self.ident_sidecar("A-" + source, cert_name="A", sidecar_id="A", extra=mode,
                                       san=san and san % "A")
                b = self.ident_sidecar("B-" + source, cert_name="B", sidecar_id="B", extra=mode,
                                       san=san and san % "B")
                self.check_moved(a, b, 4097, "read")
                self.check_moved(b, a, 4097, "write")
                self.assertEqual(a.info().peer_certificate.identity, "A")
                self.assertEqual(a.info().peer_certificate.identity_source, source)
                m = self.ident_sidecar("M-" + source, cert_name="M", sidecar_id="B",
                                       extra=["--peer-identity", "off"], san=san and san % "M")
                self.check_refused(a, m, "read", PERMISSION_DENIED,
                                   ['peer certificate names sidecar "M" but its hello claims "B"'])
                for s in (a, b, m):
                    s.stop()
                    self._procs.remove(s)

    def test_audience_is_the_verified_identity(self):
        a, m = self.ident_sidecar("A"), self.ident_sidecar("M")
        # M's own sidecar refuses metadata whose audience is B
        rp = a.create_region(4096)
        po = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rp, 0, 4096)],
                                                           audience="B"), timeout=10 * SLOW)
        ra = m.create_region(4096)
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, m.stub.BeginRead,
                            pb.BeginTransferRequest(metadata=po.metadata,
                                                    descriptors=[desc(ra, 0, 4096)]),
                            timeout=10 * SLOW, contains="metadata is for sidecar 'B'")
        # so M claims B to get past it, and A refuses: its certificate names M
        m2 = self.ident_sidecar("M2", cert_name="M", sidecar_id="B",
                                extra=["--peer-identity", "off"])
        self.check_refused(a, m2, "read", PERMISSION_DENIED,
                           ['certificate names sidecar "M"', 'hello claims "B"'], audience="B")

    def test_impostor_issuer_gets_no_byte(self):
        b = self.ident_sidecar("B")
        # M mints metadata naming A as issuer with M's own data endpoint (it runs as --id A with
        # its own certificate, and checks nobody)
        m = self.ident_sidecar("M", sidecar_id="A", extra=["--peer-identity", "off"])
        endpoint = m.info().data_endpoints[0]
        want = ('sidecar at %s presents the certificate of "M", not the metadata\'s issuer "A"'
                % endpoint)
        # B's BeginWrite into M's writable: refused before a byte leaves B, M's region keeps its
        # random bytes; and B's BeginRead from M's readable writes nothing into B's region
        for direction in ("write", "read"):
            with self.subTest(direction=direction):
                self.check_refused(m, b, direction, PERMISSION_DENIED, [want])

    def test_identity_required(self):
        a = self.ident_sidecar("A", extra=["--peer-identity-required"])
        # P's certificate names nobody (no SPIFFE ID): served by sidecars that do not require
        # identity, refused by A in both roles
        p = self.ident_sidecar("P", san="DNS:localhost,IP:127.0.0.1")
        b = self.ident_sidecar("B")
        self.check_moved(b, p, 4097, "read")
        want = "names no sidecar identity"
        self.check_refused(a, p, "read", PERMISSION_DENIED, [want, "--peer-identity-required"])
        self.check_refused(p, a, "read", PERMISSION_DENIED, [want, "--peer-identity-required"])
        wait_until(lambda: "taking its id \"P\" as its hello claims it" in b.read_log(), 10,
                   "B to log that P's certificate names no identity")
        # a peer from another trust domain (same CA) is refused whatever it claims
        o = self.ident_sidecar("O", san="URI:spiffe://other.example/ns/default/sidecar/O")
        self.check_refused(a, o, "read", PERMISSION_DENIED,
                           ['trust domain "test.example", not this sidecar\'s "other.example"'])
        self.check_refused(o, a, "read", PERMISSION_DENIED,
                           ['trust domain "other.example", not this sidecar\'s "test.example"'])

    def test_start_up_errors(self):
        self.start_fails(["--id", "A", "--peer-identity-required"],
                         "--peer-identity-required needs peer TLS")
        cert, key = self.pki.issue("M")
        self.start_fails(["--id", "A"] + self.tls_flags(cert, key),
                         'names sidecar "M" (--peer-identity spiffe), but --id is "A"')
        cert, key = self.pki.issue("N", san="DNS:localhost")
        self.start_fails(["--id", "N", "--peer-identity-required"] + self.tls_flags(cert, key),
                         "names no sidecar identity")
        cert, key = self.pki.issue("E", start=-7200, end=-3600)
        self.start_fails(["--id", "E"] + self.tls_flags(cert, key), "has expired")
        cert, key = self.pki.issue("F", start=3600, end=7200)
        self.start_fails(["--id", "F"] + self.tls_flags(cert, key), "is not yet valid")
        # without --peer-identity-required a certificate naming nobody is a warning
        cert, key = self.pki.issue("W", san="DNS:localhost")
        w = self.sidecar("W", key_file=self.keys, extra=self.tls_flags(cert, key))
        self.assertIn("names no sidecar identity", w.read_log())
        self.assertEqual(w.info().peer_certificate.identity, "")

    def test_expired_certificate_refused(self):
        a = self.ident_sidecar("A")
        # E's certificate is valid for a few seconds: long enough to start
        life = 6 * SLOW
        cert, key = self.pki.issue("E", end=life)
        t_end = time.time() + life
        e = self.sidecar("E", key_file=self.keys, extra=self.tls_flags(cert, key))
        time.sleep(max(0, t_end - time.time()) + 1.5)
        # A dials E: A sees E's expired certificate
        done = self.check_refused(e, a, "read", UNAVAILABLE, [
            "the certificate of peer sidecar at %s has expired" % e.info().data_endpoints[0],
            "it must renew its --peer-tls-cert"])
        # E dials A: A refuses E's certificate, and E's worker reads that it expired
        done = self.check_refused(a, e, "read", UNAVAILABLE,
                                  ["the peer says this sidecar's certificate has expired"])
        wait_until(lambda: "has expired (certificate has expired)" in a.read_log(), 10,
                   "A to log the expired certificate")

    # ---- rotation -------------------------------------------------------------------------------

    def test_rotation_keeps_live_transfers_and_serves_the_new_certificate(self):
        vol = Volume(os.path.join(self.workdir, "a-certs"))
        c1, k1 = self.pki.issue("A")
        vol.put_files(c1, k1)
        port = free_port()
        a = self.sidecar("A", key_file=self.keys,
                         extra=["--peer-tls-cert", vol.cert, "--peer-tls-key", vol.key,
                                "--peer-tls-ca", self.pki.cert, "--tls-reload-interval", "200ms",
                                "--metrics-listen", "127.0.0.1:%d" % port])
        serial1 = Pki.serial(c1)
        self.assertEqual(a.info().peer_certificate.serial, serial1)

        def expiry():
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                        timeout=10 * SLOW) as r:
                text = r.read().decode()
            if shutil.which("promtool"):  # the exposition format stays valid with the gauge
                p = subprocess.run(["promtool", "check", "metrics"], input=text,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual((p.returncode, p.stdout + p.stderr), (0, ""), text)
            return [l for l in text.splitlines()
                    if l.startswith("rdma_sidecar_certificate_expiry_timestamp_seconds{")]
        pc = a.info().peer_certificate
        self.assertEqual(expiry(), ['rdma_sidecar_certificate_expiry_timestamp_seconds'
                                    '{use="peer",serial="%s"} %d' % (serial1, pc.not_after_unix_s)])
        p = self.ident_sidecar("P")
        # A reads from P once, so A's pool holds connections made with the first certificate
        self.check_moved(p, a, 4097, "read")
        # P stops answering; A's next READ waits on it, on connections made before the rotation
        size = (8 << 20) + 3
        rp, ra = p.create_region(size), a.create_region(size)
        data = os.urandom(size)
        p.fill(rp, 0, data)
        po = p.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rp, 0, size)],
                                                           timeout_ms=60000), timeout=10 * SLOW)
        p.pause()
        try:
            op = a.stub.BeginRead(pb.BeginTransferRequest(metadata=po.metadata,
                                                          descriptors=[desc(ra, 0, size)],
                                                          timeout_ms=60000), timeout=10 * SLOW)
            time.sleep(0.5)
            self.assertEqual(a.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id),
                                                 timeout=5 * SLOW).status,
                             pb.OPERATION_STATUS_IN_PROGRESS)
            c2, k2 = self.pki.issue("A")
            serial2 = Pki.serial(c2)
            self.assertNotEqual(serial1, serial2)
            vol.put_files(c2, k2)
            wait_until(lambda: a.info().peer_certificate.serial == serial2, 10,
                       "A to load the new certificate")
        finally:
            p.proc.send_signal(signal.SIGCONT)
        done = a.wait(op.operation_id, 60000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertTrue(a.peek(ra, 0, size) == data, "READ bytes differ")
        self.assertEqual(len(expiry()), 1)
        self.assertIn('{use="peer",serial="%s"}' % serial2, expiry()[0])
        self.assertIn("loaded certificate serial %s" % serial2, a.read_log())
        # the next connection presents the new certificate: a new peer sees serial2
        q = self.ident_sidecar("Q")
        self.check_moved(a, q, 4097, "read")
        wait_until(lambda: "its serial %s" % serial2 in q.read_log(), 10,
                   "Q to see A's new certificate")
        self.assertNotIn("its serial %s" % serial1, q.read_log())

        # a garbage certificate file: the old one stays, logged with the path and the reason
        with open(k2, "rb") as f:
            vol.put(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n", f.read())
        wait_until(lambda: "keeping the current certificate (serial %s)" % serial2 in a.read_log(),
                   10, "A to log the bad file")
        self.assertIn("--peer-tls-cert %s: cannot load the certificate" % vol.cert, a.read_log())
        self.assertEqual(a.info().peer_certificate.serial, serial2)
        r = self.ident_sidecar("R")
        self.check_moved(a, r, 4097, "write")
        # a key that does not match: kept too
        c3, _ = self.pki.issue("A")
        _, k_other = self.pki.issue("A")
        vol.put_files(c3, k_other)
        wait_until(lambda: "--peer-tls-key %s: cannot load the private key (PEM): key values "
                   "mismatch" % vol.key in a.read_log(), 10, "A to log the mismatched key")
        self.assertEqual(a.info().peer_certificate.serial, serial2)
        # SIGHUP reloads at once, also with the watch off
        c4, k4 = self.pki.issue("A")
        vol.put_files(c4, k4)
        a.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: a.info().peer_certificate.serial == Pki.serial(c4), 10,
                   "A to load the certificate on SIGHUP")

    def test_grpc_certificate_rotates(self):
        vol = Volume(os.path.join(self.workdir, "g-certs"))
        c1, k1 = self.pki.issue("localhost", san="DNS:localhost,IP:127.0.0.1")
        vol.put_files(c1, k1)
        client_cert, client_key = self.pki.issue("client", san="DNS:client")
        mport = free_port()
        g = self.sidecar("G", tcp=False, key_file=self.keys,
                         extra=["--grpc-listen", "127.0.0.1:0", "--grpc-tls-cert", vol.cert,
                                "--grpc-tls-key", vol.key, "--grpc-tls-client-ca", self.pki.cert,
                                "--tls-reload-interval", "200ms",
                                "--metrics-listen", "127.0.0.1:%d" % mport])
        gport = [int(a.rsplit(":", 1)[1]) for a in g.info().grpc_listeners
                 if a.startswith("127.0.0.1:")][0]

        def served_serial():
            """The serial of the certificate a new TLS connection to the API port presents."""
            ctx = ssl.create_default_context(cafile=self.pki.cert)
            ctx.load_cert_chain(client_cert, client_key)
            ctx.set_alpn_protocols(["h2"])
            with socket.create_connection(("127.0.0.1", gport), timeout=10 * SLOW) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as t:
                    der = t.getpeercert(binary_form=True)
            out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial"],
                                 input=der, capture_output=True, check=True, timeout=30).stdout
            return out.decode().strip().split("=", 1)[1].upper()

        def grpc_expiry():
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,
                                        timeout=10 * SLOW) as r:
                return [l for l in r.read().decode().splitlines()
                        if l.startswith('rdma_sidecar_certificate_expiry_timestamp_seconds'
                                        '{use="grpc"')]
        with open(self.pki.cert, "rb") as f:
            root = f.read()
        with open(client_cert, "rb") as f, open(client_key, "rb") as k:
            creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=k.read(),
                                                 certificate_chain=f.read())
        opts = [("grpc.ssl_target_name_override", "localhost")]
        serial1, serial2 = Pki.serial(c1), None
        self.assertEqual(served_serial(), serial1)
        self.assertEqual(len(grpc_expiry()), 1)
        self.assertIn('serial="%s"' % serial1, grpc_expiry()[0])
        with grpc.secure_channel("127.0.0.1:%d" % gport, creds, options=opts) as ch:
            stub = pb_stub(ch)
            self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), timeout=10 * SLOW).sidecar_id, "G")
            c2, k2 = self.pki.issue("localhost", san="DNS:localhost,IP:127.0.0.1")
            serial2 = Pki.serial(c2)
            vol.put_files(c2, k2)
            # gRPC asks on each new handshake; the files are looked at every 200 ms
            wait_until(lambda: served_serial() == serial2, 10, "the API port to present serial2")
            # the connection made before goes on
            self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), timeout=10 * SLOW).sidecar_id, "G")
        self.assertIn('serial="%s"' % serial2, grpc_expiry()[0])
        self.assertIn("gRPC TLS: loaded certificate serial %s" % serial2, g.read_log())
        # a garbage file keeps the old certificate, logged with the path and the reason
        with open(k2, "rb") as f:
            vol.put(b"garbage", f.read())
        wait_until(lambda: served_serial() == serial2 and "gRPC TLS: keeping the current "
                   "certificate (serial %s)" % serial2 in g.read_log(), 10,
                   "G to log the bad file")
        self.assertIn("--grpc-tls-cert %s: cannot load the certificate" % vol.cert, g.read_log())
        # SIGHUP loads at once
        c3, k3 = self.pki.issue("localhost", san="DNS:localhost,IP:127.0.0.1")
        vol.put_files(c3, k3)
        g.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: served_serial() == Pki.serial(c3), 10, "SIGHUP to load serial3")
        with grpc.secure_channel("127.0.0.1:%d" % gport, creds, options=opts) as ch:
            self.assertEqual(pb_stub(ch).GetInfo(pb.GetInfoRequest(), timeout=10 * SLOW)
                             .sidecar_id, "G")

    def test_sighup_only(self):
        vol = Volume(os.path.join(self.workdir, "a-certs"))
        c1, k1 = self.pki.issue("A")
        vol.put_files(c1, k1)
        a = self.sidecar("A", key_file=self.keys,
                         extra=["--peer-tls-cert", vol.cert, "--peer-tls-key", vol.key,
                                "--peer-tls-ca", self.pki.cert, "--tls-reload-interval", "0"])
        c2, k2 = self.pki.issue("A")
        vol.put_files(c2, k2)
        time.sleep(1)
        self.assertEqual(a.info().peer_certificate.serial, Pki.serial(c1))
        a.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: a.info().peer_certificate.serial == Pki.serial(c2), 10,
                   "A to load the certificate on SIGHUP")


if __name__ == "__main__":
    main()
