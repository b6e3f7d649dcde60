# SPDX-License-Identifier: Apache-2.0
"""The Debian package, built and installed into a fresh Debian bookworm root (ctest label "packaging").

1. `bash scripts/build-deb.sh` builds build/deb/rdma-sidecar_<version>-1_<arch>.deb.
2. A fresh bookworm root: `mmdebstrap --variant=minbase` (the smallest Debian that has apt), made once
   and kept as a tar under build/deb/cache/ (SC_DEB_BASE overrides the path); each run unpacks a new
   copy, so every run installs into a root that has never seen the package. The packages apt
   downloads are kept in build/deb/cache/archives/ for the next run.
3. In a private mount namespace (unshare), chrooted: `apt-get install ./rdma-sidecar_....deb` (the
   dependencies come from the Debian mirror through the package's Depends), then checks the files
   (daemon, ctl, library, header, pkg-config file, man pages, systemd unit, conffile), the system
   user made by postinst, and runs the daemon as the unit would (that user, the conffile's
   environment, /run/rdma-sidecar, LimitMEMLOCK=infinity) and calls it with the installed
   rdma-sidecar-ctl (info: GetInfo, with the memlock limit the unit sets); SIGTERM ends it with exit
   0. Last, `apt-get remove` keeps the conffile.
Exits 77 (skipped) with the reason when this is not root, mmdebstrap/unshare/chroot are missing, the
mirror cannot be reached, or SC_SKIP_DEB=1.
"""
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
CACHE = os.path.join(SRC, "build", "deb", "cache")
BASE = os.environ.get("SC_DEB_BASE", os.path.join(CACHE, "bookworm-minbase.tar"))
SKIP = 77
SOCK = "/run/rdma-sidecar/sock/sidecar.sock"


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def mirror():
    for path in glob.glob("/etc/apt/sources.list.d/*.sources"):
        for line in open(path):
            if line.startswith("URIs:") and line.split()[1].rstrip("/").endswith("/debian"):
                return line.split()[1]
    if os.path.exists("/etc/apt/sources.list"):
        for line in open("/etc/apt/sources.list"):
            parts = line.split()
            if len(parts) > 2 and parts[0] == "deb" and parts[1].rstrip("/").endswith("/debian"):
                return parts[1]
    return os.environ.get("SC_DEB_MIRROR")


def make_base():
    """The bookworm minbase root as a tar (once; later runs reuse it)."""
    if os.path.exists(BASE):
        return
    m = os.environ.get("SC_DEB_MIRROR") or mirror()
    if not m:
        skip("no Debian mirror in /etc/apt/sources.list*: set SC_DEB_MIRROR")
    os.makedirs(os.path.dirname(BASE), exist_ok=True)
    t0 = time.monotonic()
    # Lists kept (apt installs without an update); docs (but copyrights) and locales left out. Man
    # pages stay: the package's own are checked.
    r = run(["mmdebstrap", "--variant=minbase", "--format=tar", "--skip=cleanup/apt/lists",
             "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
             "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-exclude=/usr/share/info/*",
             "bookworm", BASE + ".tmp", "deb %s bookworm main" % m, "deb %s bookworm-updates main" % m],
            timeout=1800)
    if r.returncode != 0:
        print(r.stderr[-2000:])
        skip("mmdebstrap could not bootstrap bookworm from %s (no network to the mirror?)" % m)
    os.rename(BASE + ".tmp", BASE)
    print("base: mmdebstrap --variant=minbase bookworm in %.0f s, %d MiB" % (time.monotonic() - t0,
                                                                         os.path.getsize(BASE) >> 20))


def outer():
    if os.environ.get("SC_SKIP_DEB") == "1":
        skip("SC_SKIP_DEB=1")
    if os.geteuid() != 0:
        skip("needs root (mmdebstrap, unshare, chroot)")
    for tool in ("mmdebstrap", "unshare", "chroot", "dpkg-deb"):
        if not shutil.which(tool):
            skip("%s is not installed (Debian: mmdebstrap, util-linux, coreutils, dpkg)" % tool)
    t0 = time.monotonic()
    b = subprocess.run(["bash", os.path.join(SRC, "scripts", "build-deb.sh")], timeout=3000)
    if b.returncode == 3:
        skip("scripts/build-deb.sh could not build (see its message above)")
    assert b.returncode == 0, "scripts/build-deb.sh failed: %d" % b.returncode
    debs = glob.glob(os.path.join(SRC, "build", "deb", "rdma-sidecar_*.deb"))
    assert len(debs) == 1, debs
    print("package: %s, %d KiB, built in %.0f s" % (os.path.basename(debs[0]), os.path.getsize(debs[0]) >> 10,
                                                  time.monotonic() - t0))
    make_base()
    root = tempfile.mkdtemp(prefix="sc-deb-root-", dir=os.path.join(SRC, "build", "deb"))
    try:
        subprocess.run(["tar", "-xf", BASE, "-C", root], check=True, timeout=600)
        shutil.copy(debs[0], os.path.join(root, "tmp"))
        archives = os.path.join(CACHE, "archives")
        os.makedirs(archives, exist_ok=True)
        for f in glob.glob(os.path.join(archives, "*.deb")):
            shutil.copy(f, os.path.join(root, "var", "cache", "apt", "archives"))
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                            os.path.abspath(__file__), "--inner", root, os.path.basename(debs[0])], timeout=1200)
        for f in glob.glob(os.path.join(root, "var", "cache", "apt", "archives", "*.deb")):
            if not os.path.exists(os.path.join(archives, os.path.basename(f))):
                shutil.copy(f, archives)
        return r.returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


def inner(root, deb):
    def sh(cmd):
        subprocess.run(["sh", "-c", cmd], check=True)

    def chroot(*cmd, **kw):
        return run(["chroot", root] + list(cmd), **kw)

    sh("mount --rbind /dev %s/dev && mount -t tmpfs -o mode=1777 tmpfs %s/dev/shm" % (root, root))
    sh("mount -t proc proc %s/proc" % root)
    sh("mount -t tmpfs -o mode=0755 tmpfs %s/run" % root)
    shutil.copy("/etc/resolv.conf", os.path.join(root, "etc", "resolv.conf"))
    fails = []

    def check(cond, what):
        print("%s %s" % ("ok  " if cond else "FAIL", what))
        if not cond:
            fails.append(what)

    t0 = time.monotonic()
    r = chroot("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--no-install-recommends",
               "/tmp/" + deb, timeout=900)
    if r.returncode != 0 and ("Could not resolve" in r.stdout + r.stderr or "Failed to fetch" in r.stdout + r.stderr):
        print(r.stdout[-1500:] + r.stderr[-1500:])
        skip("apt-get could not download the dependencies (no network to the mirror?)")
    check(r.returncode == 0, "apt-get install ./%s (%.0f s)\n%s" % (deb, time.monotonic() - t0,
                                                                    "" if r.returncode == 0 else r.stdout[-3000:] + r.stderr[-2000:]))
    if r.returncode != 0:
        return 1
    v = chroot("rdma-sidecar", "--version")
    check(v.returncode == 0 and "rdma-sidecar" in v.stdout, "rdma-sidecar --version: %s" % v.stdout.strip())
    files = chroot("dpkg", "-L", "rdma-sidecar").stdout.split()
    for want in ("/usr/bin/rdma-sidecar", "/usr/bin/rdma-sidecar-ctl", "/usr/include/rdma_sidecar/client.h",
                 "/lib/systemd/system/rdma-sidecar.service", "/etc/default/rdma-sidecar",
                 "/usr/share/man/man8/rdma-sidecar.8.gz", "/usr/share/man/man1/rdma-sidecar-ctl.1.gz"):
        check(want in files and os.path.exists(root + want), "installed " + want)
    libs = [f for f in files if f.endswith("librdma-sidecar-client.so.0")]
    pcs = [f for f in files if f.endswith("/pkgconfig/rdma-sidecar-client.pc")]
    check(len(libs) == 1 and len(pcs) == 1, "library and pkg-config file: %s %s" % (libs, pcs))
    if pcs:
        pc = open(root + pcs[0]).read()
        check("-lrdma-sidecar-client" in pc and "rpath" not in pc, "the .pc file: no RUNPATH under /usr")
    ldd = chroot("ldd", "/usr/bin/rdma-sidecar-ctl").stdout
    found = [ln.split("=>")[1].split()[0] for ln in ldd.splitlines() if "librdma-sidecar-client.so.0 =>" in ln]
    check("not found" not in ldd and found and os.path.normpath(found[0]) == libs[0],
          "rdma-sidecar-ctl finds its library: %s" % found)
    unit = open(root + "/lib/systemd/system/rdma-sidecar.service").read()
    for line in ("LimitMEMLOCK=infinity", "EnvironmentFile=-/etc/default/rdma-sidecar",
                 "ExecStart=/usr/bin/rdma-sidecar", "User=rdma-sidecar", "RuntimeDirectory=rdma-sidecar"):
        check(line in unit.splitlines(), "unit has " + line)
    user = chroot("getent", "passwd", "rdma-sidecar").stdout
    check(user.startswith("rdma-sidecar:"), "postinst made the system user: " + user.strip())

    # As the unit runs it: the conffile's environment, the user, its runtime dir, memlock unlimited.
    env = {}
    for line in open(root + "/etc/default/rdma-sidecar"):
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, val = line.partition("=")
            env[k] = val
    check(env.get("RDMA_SIDECAR_GRPC_LISTEN") == "unix:" + SOCK, "the conffile sets the API socket")
    sh("install -d -o rdma-sidecar -g rdma-sidecar -m 0750 %s/run/rdma-sidecar" % root
       if run(["id", "rdma-sidecar"]).returncode == 0 else
       "chroot %s install -d -o rdma-sidecar -g rdma-sidecar -m 0750 /run/rdma-sidecar" % root)
    # LimitMEMLOCK=infinity, where this sandbox lets us raise the hard limit; else the sidecar
    # raises its soft limit to the hard one, which GetInfo must then report.
    limit = ["prlimit", "--memlock=unlimited", "--"]
    want_memlock = 2 ** 64 - 1
    if run(limit + ["true"]).returncode != 0:
        limit = []
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        want_memlock = 2 ** 64 - 1 if hard == resource.RLIM_INFINITY else hard
        print("note: cannot raise RLIMIT_MEMLOCK here; expecting the hard limit %d" % hard)
    log = open(os.path.join(root, "tmp", "sidecar.log"), "w")
    daemon = subprocess.Popen(limit + ["chroot", "--userspec=rdma-sidecar:rdma-sidecar",
                               root, "env", "-i", "PATH=/usr/bin:/bin"] + ["%s=%s" % kv for kv in env.items()]
                              + ["rdma-sidecar", "--id", "deb-node", "--data-listen", "127.0.0.1:0"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        r = chroot("rdma-sidecar-ctl", "--sidecar", "unix:" + SOCK, "--wait", "30", "--json", "info", timeout=60)
        check(r.returncode == 0, "rdma-sidecar-ctl info against the installed daemon: " + r.stderr.strip())
        if r.returncode == 0:
            info = json.loads(r.stdout)
            check(info["sidecar_id"] == "deb-node", "GetInfo sidecar_id: %s" % info["sidecar_id"])
            check(info["memlock_limit"] == want_memlock and info["memlock_enough"],
                  "GetInfo memlock: %s (%s)" % (info["memlock_limit"], info["memlock_detail"]))
            check("unix:" + SOCK in info["grpc_listeners"], "listens on %s" % info["grpc_listeners"])
        mode = oct(os.stat(root + SOCK).st_mode & 0o777) if os.path.exists(root + SOCK) else "absent"
        check(mode == "0o660", "the socket's mode: %s" % mode)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            code = daemon.wait(10)
        log.close()
    check(code == 0, "SIGTERM: the daemon exited %s" % code)
    if code != 0 or fails:
        print(open(os.path.join(root, "tmp", "sidecar.log")).read()[-3000:])
    r = chroot("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "rdma-sidecar", timeout=300)
    check(r.returncode == 0 and not os.path.exists(root + "/usr/bin/rdma-sidecar")
          and os.path.exists(root + "/etc/default/rdma-sidecar"), "apt-get remove: files gone, conffile kept")
    print("%d passed, %d failed" % (0 if fails else 1, 1 if fails else 0))
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        sys.exit(inner(sys.argv[2], sys.argv[3]))
    sys.exit(outer())
