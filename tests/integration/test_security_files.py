#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 1: RegisterRegion maps only regular files beneath --shm-dir or a --register-dir,
resolved without symlinks or "..", never the --key-file. Every refused attempt must leave the
region table empty and the target file untouched."""
import os
import shutil
import tempfile

import grpc

from harness import SidecarTest, main, pb, wait_until

PAGE = os.sysconf("SC_PAGE_SIZE")
DENIED = grpc.StatusCode.PERMISSION_DENIED


class RegisterConfinementTest(SidecarTest):
    def register(self, s, path, size=PAGE, offset=0):
        return s.stub.RegisterRegion(pb.RegisterRegionRequest(
            host_file=pb.HostFileSource(path=path, offset=offset, size=size)), timeout=10)

    def assertRefused(self, s, path, code, contains, size=PAGE):
        before = None
        if os.path.isfile(path):
            with open(path, "rb") as f:
                before = f.read()
        e = self.assertRpcError(code, self.register, s, path, size, contains=contains)
        self.assertEqual(list(s.stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions), [],
                         "a refused registration must map nothing")
        if before is not None:
            with open(path, "rb") as f:
                self.assertEqual(f.read(), before)
        return e

    def outside_file(self, name="outside", data=None):
        """A readable file outside the shm dir (in the work dir): the stand-in for /etc/shadow."""
        path = os.path.join(self.workdir, name)
        with open(path, "wb") as f:
            f.write(data or os.urandom(2 * PAGE))
        return path

    def test_files_outside_are_refused(self):
        s = self.sidecar("a")
        e = self.assertRefused(s, "/etc/shadow", DENIED, "not beneath a directory")
        self.assertIn("--shm-dir " + s.shm, e.details())
        self.assertRefused(s, self.outside_file(), DENIED, "--shm-dir " + s.shm)
        # Lexically beneath the shm dir, but ".." climbs out of it.
        depth = len(s.shm.strip("/").split("/"))
        dots = s.shm + "/" + "../" * depth + "etc/hostname"
        self.assertTrue(os.path.isfile(dots))
        self.assertRefused(s, dots, DENIED, "symlink or \"..\"")
        self.assertEqual(s.info().sidecar_id, "a")

    def test_symlinks_are_refused(self):
        s = self.sidecar("a")
        target = self.outside_file(data=b"secret" * 1000)
        outdir = os.path.dirname(target)
        os.symlink(outdir, os.path.join(s.shm, "linkdir"))
        self.assertRefused(s, os.path.join(s.shm, "linkdir", os.path.basename(target)), DENIED,
                           "symlink")
        os.symlink(target, os.path.join(s.shm, "linkfile"))
        self.assertRefused(s, os.path.join(s.shm, "linkfile"), DENIED, "symlink")
        # A symlink to a file that is itself inside the shm dir is refused as well: the real
        # path must be given.
        inside = os.path.join(s.shm, "real")
        with open(inside, "wb") as f:
            f.write(os.urandom(PAGE))
        os.symlink(inside, os.path.join(s.shm, "alias"))
        self.assertRefused(s, os.path.join(s.shm, "alias"), DENIED, "symlink")

    def test_non_regular_files_are_refused(self):
        s = self.sidecar("a")
        fifo = os.path.join(s.shm, "fifo")
        os.mkfifo(fifo)
        self.assertRefused(s, fifo, grpc.StatusCode.INVALID_ARGUMENT, "not a regular file")
        sub = os.path.join(s.shm, "sub")
        os.mkdir(sub)
        self.assertRefused(s, sub, grpc.StatusCode.INVALID_ARGUMENT, "not a regular file")
        self.assertRefused(s, s.shm, DENIED, "not beneath")  # the directory itself
        self.assertEqual(s.info().sidecar_id, "a")

    def test_key_file_is_refused_even_inside_shm(self):
        shm = tempfile.mkdtemp(prefix="sc-keyshm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.addCleanup(shutil.rmtree, shm, True)
        keys = self.key_file()
        key_in_shm = os.path.join(shm, "cluster.key")
        shutil.copy(keys, key_in_shm)
        os.link(key_in_shm, os.path.join(shm, "hardlink"))
        s = self.sidecar("a", extra=["--shm-dir", shm, "--key-file", key_in_shm])
        self.assertRefused(s, key_in_shm, DENIED, "--key-file", size=16)
        self.assertRefused(s, os.path.join(shm, "hardlink"), DENIED, "--key-file", size=16)

    def test_other_secrets_are_refused_inside_shm(self):
        # The API bearer token is a secret like the signing key: never registrable.
        shm = tempfile.mkdtemp(prefix="sc-tokshm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.addCleanup(shutil.rmtree, shm, True)
        token = os.path.join(shm, "api.token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        s = self.sidecar("a", extra=["--shm-dir", shm, "--grpc-token-file", token])
        self.assertRefused(s, token, DENIED, "--grpc-token-file", size=16)

    def test_own_unix_socket_is_refused(self):
        s = self.sidecar("a")
        sock = os.path.join(s.shm, "api.sock")
        t = self.sidecar("t", extra=["--shm-dir", s.shm, "--grpc-listen", "unix:" + sock])
        wait_until(lambda: os.path.exists(sock), 10, "the second socket")
        self.assertRefused(t, sock, grpc.StatusCode.INVALID_ARGUMENT, "not a regular file")

    def test_legit_file_and_register_dir(self):
        extra_dir = os.path.join(self.workdir, "models")
        os.mkdir(extra_dir)
        s = self.sidecar("a", extra=["--register-dir", extra_dir])
        data = os.urandom(3 * PAGE)
        for d in (s.shm, extra_dir):
            path = os.path.join(d, "nested", "weights.bin")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            r = self.register(s, path, size=2 * PAGE, offset=PAGE)
            got = b"".join(m.data for m in s.stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=2 * PAGE), timeout=10))
            self.assertEqual(got, data[PAGE:3 * PAGE])
            s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)
        # The work dir itself is still off limits, and the message names both directories.
        e = self.assertRefused(s, self.outside_file(), DENIED, "--register-dir " + extra_dir)
        self.assertIn("--shm-dir " + s.shm, e.details())

    def test_register_dir_must_exist(self):
        import subprocess
        from harness import BINARY
        out = subprocess.run([BINARY, "--grpc-listen", "unix:" + os.path.join(self.workdir, "x.sock"),
                              "--register-dir", os.path.join(self.workdir, "missing")],
                             capture_output=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(b"--register-dir", out.stderr)

    def test_remote_sidecar_gets_nothing(self):
        """The reported attack: a worker registers the key file and creates a readable over it
        for a remote sidecar. Registration is refused, so there is nothing to expose."""
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)
        self.assertRefused(a, keys, DENIED, "not beneath")
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, a.stub.CreateReadable,
                            pb.CreatePassiveRequest(descriptors=[pb.Descriptor(
                                region_id="rgn-0000000000000000", offset=0, length=16)]), timeout=10)


if __name__ == "__main__":
    main()
