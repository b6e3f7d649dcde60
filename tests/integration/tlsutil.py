# SPDX-License-Identifier: Apache-2.0
"""Certificates made at test time with the openssl CLI: a CA and leaf certificates it signs
(EC P-256, valid one day, SAN 127.0.0.1 + localhost, usable as TLS server and client)."""
import os
import subprocess


def _run(*args):
    subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=30)


class CA:
    def __init__(self, workdir, name="ca"):
        self.dir = os.path.join(workdir, "pki-" + name)
        os.makedirs(self.dir, exist_ok=True)
        self.key = os.path.join(self.dir, "ca.key")
        self.cert = os.path.join(self.dir, "ca.pem")
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", self.key, "-out", self.cert, "-days", "1", "-subj", "/CN=test %s" % name,
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, name):
        """Returns (cert path, key path) for a leaf called name."""
        key = os.path.join(self.dir, name + ".key")
        csr = os.path.join(self.dir, name + ".csr")
        cert = os.path.join(self.dir, name + ".pem")
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n"
                    "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", "/CN=%s" % name)
        _run("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
             "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext)
        os.chmod(key, 0o600)
        return cert, key

    def peer_flags(self, name, trust=None):
        """--peer-tls-* flags for a sidecar with a leaf from this CA, trusting `trust` (a CA,
        default this one)."""
        cert, key = self.issue(name)
        return ["--peer-tls-cert", cert, "--peer-tls-key", key,
                "--peer-tls-ca", (trust or self).cert]
