# SPDX-License-Identifier: Apache-2.0
"""The GPU kit (scripts/gpu-kit.sh) runs where nothing but it is: a bare Debian chroot.

A lent GPU machine has the NVIDIA driver and Python, but none of the Debian libraries the sidecar
links (gRPC, abseil, protobuf-c, nats.c, microhttpd, ibverbs...). This test packs the kit, then
runs `scripts/gpu-check.sh` from it inside a fresh `mmdebstrap --variant=minbase bookworm` root
(no -dev package, none of those libraries, no Python, no GPU): the daemon must start from the kit,
answer `rdma-sidecar-ctl info` and health, and stop cleanly on SIGTERM; every GPU step must be
SKIPPED with its reason; the report must say so. It also checks the kit's size limit.

The minbase root is bootstrapped once (from this machine's Debian mirror, or SC_IMAGE_MIRROR) and
kept as a tar in the build directory (SC_TEST_TMP/..). Exits 77 (skipped) with the reason when this
is not root, mmdebstrap or unshare is missing, or the root cannot be bootstrapped (no mirror).
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
BUILD = os.path.dirname(os.environ["SC_BINARY"]) if os.environ.get("SC_BINARY") else os.path.join(ROOT, "build")
CACHE = os.path.join(BUILD, "gpu-kit-minbase.tar")


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def mirror():
    if os.environ.get("SC_IMAGE_MIRROR"):
        return os.environ["SC_IMAGE_MIRROR"]
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", open(path).read(), re.M)
        if m:
            return m.group(1)
    if os.path.exists("/etc/apt/sources.list"):
        m = re.search(r"^deb\s+(\S+/debian)\s+bookworm\s", open("/etc/apt/sources.list").read(), re.M)
        if m:
            return m.group(1)
    return None


def bootstrap():
    if os.path.exists(CACHE):
        return
    url = mirror()
    if not url:
        skip("no Debian mirror in /etc/apt/sources.list*: set SC_IMAGE_MIRROR")
    tmp = CACHE + ".part.tar"
    print("bootstrapping a minbase bookworm root with mmdebstrap from %s (once; cached in %s)" % (url, CACHE),
          flush=True)
    r = subprocess.run(["mmdebstrap", "--variant=minbase", "--format=tar", "--dpkgopt=path-exclude=/usr/share/man/*",
                        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
                        "bookworm", tmp, "deb %s bookworm main" % url], capture_output=True, text=True,
                       timeout=1200)
    if r.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        skip("mmdebstrap could not bootstrap bookworm from %s: %s" % (url, r.stderr.strip()[-600:]))
    os.replace(tmp, CACHE)


def main():
    if os.geteuid() != 0:
        skip("needs root (chroot, mount namespaces)")
    for tool in ("mmdebstrap", "unshare", "chroot"):
        if not shutil.which(tool):
            skip("%s is not installed (Debian: mmdebstrap, util-linux, coreutils)" % tool)
    bootstrap()
    work = tempfile.mkdtemp(prefix="sc-gpukit-", dir=os.environ.get("SC_TEST_TMP") or None)
    try:
        kit = os.path.join(work, "kit")
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-kit.sh"), "--no-build", "--build", BUILD,
                            "--out", kit], capture_output=True, text=True, timeout=300)
        print(r.stdout + r.stderr)
        assert r.returncode == 0, "gpu-kit.sh failed"
        assert re.search(r"gpu-kit: \S+: \d+ MiB in \d+ libraries and 5 programs", r.stdout), r.stdout
        manifest = open(os.path.join(kit, "MANIFEST")).read()
        for need in ("./libexec/rdma-sidecar", "./libexec/rdma-sidecar-ctl", "./libexec/nats-server",
                     "./python/rdma_sidecar/v1/sidecar_pb2.py"):
            assert need in manifest, need
        for lib in ("libgrpc.so", "libnats.so", "libprotobuf-c.so", "libmicrohttpd.so", "libibverbs.so",
                    "libhwloc.so"):
            assert any(n.startswith(lib) for n in os.listdir(os.path.join(kit, "lib"))), lib
        # A size limit below the kit's size fails, saying so.
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-kit.sh"), "--no-build", "--build", BUILD,
                            "--out", os.path.join(work, "small"), "--max-mib", "1"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 1 and "over --max-mib 1" in r.stderr, r.stderr

        rootfs = os.path.join(work, "root")
        os.makedirs(rootfs)
        with tarfile.open(CACHE) as t:
            t.extractall(rootfs, numeric_owner=True)
        libdir = os.path.join(rootfs, "usr", "lib", "x86_64-linux-gnu")
        assert not glob.glob(os.path.join(libdir, "libgrpc.so*")), "the root has gRPC: not bare"
        assert not glob.glob(os.path.join(rootfs, "usr", "bin", "python3*")), "the root has Python: not bare"
        dev = subprocess.run(["chroot", rootfs, "dpkg-query", "-W", "-f", "${Package}\\n"], capture_output=True,
                             text=True, check=True).stdout.split()
        assert not [p for p in dev if p.endswith("-dev")], [p for p in dev if p.endswith("-dev")]
        ck = os.path.join(rootfs, "ck")
        os.makedirs(os.path.join(ck, "scripts"))
        shutil.copy(os.path.join(ROOT, "scripts", "gpu-check.sh"), os.path.join(ck, "scripts"))
        shutil.copytree(kit, os.path.join(ck, "build-gpu-kit"), symlinks=True)
        inner = ("set -e; mount --rbind /dev {r}/dev; mount -t tmpfs -o mode=1777 tmpfs {r}/dev/shm; "
                 "mount -t proc proc {r}/proc; mount -t tmpfs -o mode=1777 tmpfs {r}/tmp; "
                 "exec chroot {r} /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "
                 "/bin/bash /ck/scripts/gpu-check.sh --report /ck/report.txt").format(r=rootfs)
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--fork", "bash", "-c", inner],
                           capture_output=True, text=True, timeout=600)
        report = open(os.path.join(ck, "report.txt")).read()
        print(report)
        assert r.returncode == 0, "gpu-check.sh failed in the chroot (exit %d):\n%s" % (r.returncode, r.stderr)
        assert "-- daemon: PASS" in report, "the daemon did not start from the kit"
        assert "cuda     CUDA driver not found" in report
        assert "SERVING" in report and "rdma-sidecar exited with 0 after SIGTERM" in report
        for s in ("probe", "tests", "torch", "bench"):
            assert re.search(r"== %s: SKIPPED \(no (GPU|python3)" % s, report), s
        assert "# python: none" in report
        assert "no step failed" in report
        print("OK: the kit starts the daemon in a bare bookworm root (%d packages, no -dev, no Python)" % len(dev))
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", work])


if __name__ == "__main__":
    main()
