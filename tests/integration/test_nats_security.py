# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 3, NATS side: TLS with a client certificate (--nats-tls-ca/-cert/-key) and
NKey authentication (--nats-nkey-seed) against a real nats-server, with certificates and keys
made at test time (openssl CLI). Metadata published through one sidecar over TLS is received
through another; a sidecar without the CA, without a client certificate or with a wrong NKey
never connects, and GetInfo's nats_state and the log say so. --nats-creds is tested against a
nats-server in operator mode, with operator, account and user JWTs signed here (openssl CLI
Ed25519), as `nsc` would make them."""
import base64
import json
import os
import queue
import socket
import subprocess
import threading
import time

from harness import NATS_SERVER, SLOW, SidecarTest, desc, free_port, main, pb, wait_until
from tlsutil import CA


def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def b32(raw):
    """NKey text: base32 (no padding) of raw + its CRC16, little-endian."""
    return base64.b32encode(raw + crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def b64u(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


# NKey prefix bytes: operator, account, user
OPERATOR, ACCOUNT, USER = 14 << 3, 0, 20 << 3


class NKey:
    """An Ed25519 NKey made with the openssl CLI: .pub ("U...", "A...", "O...") and .seed ("S...")."""

    def __init__(self, workdir, name, prefix=USER):
        self.dir = workdir
        self.pem = os.path.join(workdir, name + ".ed25519.pem")
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", self.pem], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        priv = subprocess.run(["openssl", "pkey", "-in", self.pem, "-outform", "DER"], check=True,
                              capture_output=True, timeout=30).stdout[-32:]
        pub = subprocess.run(["openssl", "pkey", "-in", self.pem, "-pubout", "-outform", "DER"],
                             check=True, capture_output=True, timeout=30).stdout[-32:]
        self.pub = b32(bytes([prefix]) + pub)
        self.seed = b32(bytes([(18 << 3) | (prefix >> 5), (prefix & 31) << 3]) + priv)

    def seed_file(self):
        path = self.pem[:-len(".ed25519.pem")] + ".nk"
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self.seed + "\n")
        return path

    def sign(self, data):
        p = os.path.join(self.dir, "to-sign")
        with open(p, "wb") as f:
            f.write(data)
        return subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", self.pem, "-rawin", "-in", p],
                              check=True, capture_output=True, timeout=30).stdout


def jwt(issuer, subject, name, nats):
    """A NATS JWT (ed25519-nkey) about subject, signed by issuer."""
    hdr = b64u(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = {"jti": b64u(os.urandom(24)), "iat": int(time.time()), "iss": issuer.pub,
              "name": name, "sub": subject.pub, "nats": nats}
    body = b64u(json.dumps(claims).encode())
    return hdr + "." + body + "." + b64u(issuer.sign((hdr + "." + body).encode()))


def operator_setup(workdir):
    """nats-server config for operator mode with one account; returns (config path, account)."""
    op = NKey(workdir, "operator", OPERATOR)
    acc = NKey(workdir, "account", ACCOUNT)
    op_jwt = jwt(op, op, "op", {"type": "operator", "version": 2})
    acc_jwt = jwt(op, acc, "acc", {"type": "account", "version": 2,
                                   "limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1,
                                              "exports": -1, "wildcards": True, "conn": -1, "leaf": -1,
                                              "mem_storage": -1, "disk_storage": -1, "streams": -1,
                                              "consumer": -1}})
    # JetStream (the sidecar's default hand-off) needs a system account in operator mode.
    sys_acc = NKey(workdir, "sys-account", ACCOUNT)
    sys_jwt = jwt(op, sys_acc, "SYS", {"type": "account", "version": 2})
    conf = os.path.join(workdir, "nats-operator.conf")
    with open(conf, "w") as f:
        f.write('operator: "%s"\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: "%s"\n'
                '  %s: "%s"\n}\n' % (op_jwt, sys_acc.pub, acc.pub, acc_jwt, sys_acc.pub, sys_jwt))
    return conf, acc


def creds_file(workdir, name, account):
    """A .creds file for a new user signed by account."""
    user = NKey(workdir, name, USER)
    user_jwt = jwt(account, user, name, {"type": "user", "version": 2, "pub": {}, "sub": {},
                                         "subs": -1, "data": -1, "payload": -1})
    path = os.path.join(workdir, name + ".creds")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n"
                "-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n"
                % (user_jwt, user.seed))
    return path


def nkey_user(workdir, name):
    """An NKey user: returns (seed file path, public key "U...")."""
    k = NKey(workdir, name, USER)
    return k.seed_file(), k.pub


class Nats:
    """nats-server with extra arguments (TLS, a config file)."""

    def __init__(self, workdir, args):
        self.port = free_port()
        self.url = "nats://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(workdir, "nats-%d.log" % self.port), "wb")
        # With JetStream: the sidecar's default hand-off keeps metadata there, through the same
        # TLS and credentials.
        js = ["-js", "-sd", os.path.join(workdir, "js-%d" % self.port)]
        self.proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)] + js + args,
                                     stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("nats-server exited: %s" % self.proc.returncode)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False
        wait_until(up, 10, "nats-server")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class NatsSecurityTest(SidecarTest):
    def start_nats(self, args):
        n = Nats(self.workdir, args)
        self._procs.append(n)
        return n

    def connected(self, s, timeout=15):
        wait_until(lambda: s.info().nats_state == "connected", timeout,
                   "sidecar %s to connect to NATS" % s.name)

    def never_connects(self, s, log_needle):
        # nats.c gives up on a server that refuses its TLS or credentials: GetInfo says
        # "closed" and the log says what to check
        wait_until(lambda: s.info().nats_state == "closed", 15, "%s's NATS state to be closed" % s.name)
        log = s.read_log()
        self.assertIn("it never connected", log)
        self.assertIn("--nats-tls-ca", log)
        self.assertIn(log_needle, log)

    def publish_and_receive(self, pub_side, sub_side):
        """pub_side publishes a readable's metadata; sub_side receives it and reads the bytes."""
        data = os.urandom(100003)
        r = pub_side.create_region(len(data))
        pub_side.fill(r, 0, data)
        ro = pub_side.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, len(data))],
                                                                  timeout_ms=60000), timeout=10)
        subject = "stage.%d" % os.getpid()
        got = queue.Queue()
        stream = sub_side.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject=subject),
                                                 timeout=30 * SLOW)

        def reader():
            try:
                for ev in stream:
                    got.put(ev)
                    return
            except Exception as e:  # noqa: BLE001 (cancelled at the end)
                got.put(e)
        t = threading.Thread(target=reader, daemon=True)
        t.start()
        ev = None
        end = time.monotonic() + 20 * SLOW
        while ev is None and time.monotonic() < end:  # until the subscription is in place
            pub_side.stub.PublishMetadata(pb.PublishMetadataRequest(subject=subject,
                                                                    operation_id=ro.operation_id),
                                          timeout=10)
            try:
                ev = got.get(timeout=0.5)
            except queue.Empty:
                pass
        stream.cancel()
        t.join(10)
        self.assertIsInstance(ev, pb.MetadataEvent, ev)
        self.assertEqual(ev.metadata, ro.metadata)
        self.assertEqual(ev.issuer, pub_side.name)
        rb = sub_side.create_region(len(data))
        op = sub_side.stub.BeginRead(pb.BeginTransferRequest(metadata=ev.metadata,
                                                             descriptors=[desc(rb, 0, len(data))]),
                                     timeout=10)
        self.assertEqual(sub_side.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(sub_side.peek(rb, 0, len(data)), data)

    def test_nats_tls_with_client_certificates(self):
        ca = CA(self.workdir, "nats")
        scert, skey = ca.issue("nats-server")
        n = self.start_nats(["--tls", "--tlscert", scert, "--tlskey", skey, "--tlsverify",
                             "--tlscacert", ca.cert])
        keys = self.key_file()

        def flags(name, with_ca=True, with_cert=True):
            out = []
            if with_ca:
                out += ["--nats-tls-ca", ca.cert]
            if with_cert:
                c, k = ca.issue(name)
                out += ["--nats-tls-cert", c, "--nats-tls-key", k]
            return out
        a = self.sidecar("a", key_file=keys, nats_url=n.url, extra=flags("a"))
        b = self.sidecar("b", key_file=keys, nats_url=n.url, extra=flags("b"))
        self.connected(a)
        self.connected(b)
        self.publish_and_receive(a, b)
        # no CA, no client certificate: nats-server requires TLS and verifies the client
        plain = self.sidecar("plain", key_file=keys, nats_url=n.url)
        self.never_connects(plain, "[nats]")
        nocert = self.sidecar("nocert", key_file=keys, nats_url=n.url,
                              extra=flags("nocert", with_cert=False))
        self.never_connects(nocert, "[nats]")
        # a CA that did not sign the server's certificate
        other = CA(self.workdir, "other")
        oc, ok = other.issue("x")
        wrong = self.sidecar("wrong", key_file=keys, nats_url=n.url,
                             extra=["--nats-tls-ca", other.cert, "--nats-tls-cert", oc,
                                    "--nats-tls-key", ok])
        self.never_connects(wrong, "[nats]")
        # the connected pair is not disturbed
        self.assertEqual(a.info().nats_state, "connected")

    def test_nats_tls_flag_errors_fail_start(self):
        ca = CA(self.workdir, "nats")
        c, _ = ca.issue("a")
        s = self.sidecar_expect_exit(["--nats-url", "nats://127.0.0.1:1", "--nats-tls-cert", c])
        self.assertIn("--nats-tls-cert and --nats-tls-key go together", s)
        s = self.sidecar_expect_exit(["--nats-url", "nats://127.0.0.1:1", "--nats-tls-ca",
                                      os.path.join(self.workdir, "missing.pem")])
        self.assertIn("--nats-tls-ca", s)
        bad = os.path.join(self.workdir, "bad.nk")
        with open(bad, "w") as f:
            f.write("SUNOTASEED\n")
        s = self.sidecar_expect_exit(["--nats-url", "nats://127.0.0.1:1", "--nats-nkey-seed", bad])
        self.assertIn("does not hold an NKey seed", s)
        s = self.sidecar_expect_exit(["--nats-url", "nats://127.0.0.1:1", "--nats-nkey-seed", bad,
                                      "--nats-creds", bad])
        self.assertIn("--nats-creds and --nats-nkey-seed are exclusive", s)

    def sidecar_expect_exit(self, extra):
        from harness import BINARY
        sock = os.path.join(self.workdir, "x%d.sock" % len(extra))
        p = subprocess.run([BINARY, "--id", "x", "--grpc-listen", "unix:" + sock, "--shm-dir",
                            self.workdir, "--data-listen", "127.0.0.1:0"] + extra,
                           capture_output=True, timeout=30 * SLOW)
        self.assertNotEqual(p.returncode, 0)
        return p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")

    def test_nats_nkey_authentication(self):
        seed, pub = nkey_user(self.workdir, "worker")
        bad_seed, bad_pub = nkey_user(self.workdir, "stranger")
        conf = os.path.join(self.workdir, "nats.conf")
        with open(conf, "w") as f:
            f.write("authorization { users = [ { nkey: %s } ] }\n" % pub)
        n = self.start_nats(["-c", conf])
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, nats_url=n.url, extra=["--nats-nkey-seed", seed])
        b = self.sidecar("b", key_file=keys, nats_url=n.url, extra=["--nats-nkey-seed", seed])
        self.connected(a)
        self.connected(b)
        self.assertIn("NATS authentication with NKey %s" % pub, a.read_log())
        self.publish_and_receive(a, b)
        stranger = self.sidecar("s", key_file=keys, nats_url=n.url,
                                extra=["--nats-nkey-seed", bad_seed])
        self.never_connects(stranger, bad_pub)
        anon = self.sidecar("anon", key_file=keys, nats_url=n.url)
        self.never_connects(anon, "[nats]")


    def test_nats_creds_authentication(self):
        conf, account = operator_setup(self.workdir)
        n = self.start_nats(["-c", conf])
        creds = creds_file(self.workdir, "worker", account)
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, nats_url=n.url, extra=["--nats-creds", creds])
        b = self.sidecar("b", key_file=keys, nats_url=n.url, extra=["--nats-creds", creds])
        self.connected(a)
        self.connected(b)
        self.publish_and_receive(a, b)
        # a user signed by an account the operator never issued
        rogue = NKey(self.workdir, "rogue-account", ACCOUNT)
        stranger = self.sidecar("s", key_file=keys, nats_url=n.url,
                                extra=["--nats-creds", creds_file(self.workdir, "stranger", rogue)])
        self.never_connects(stranger, "[nats]")
        anon = self.sidecar("anon", key_file=keys, nats_url=n.url)
        self.never_connects(anon, "[nats]")
        self.assertEqual(a.info().nats_state, "connected")


if __name__ == "__main__":
    main()
