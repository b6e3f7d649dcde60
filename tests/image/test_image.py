# SPDX-License-Identifier: Apache-2.0
"""The container image, built and smoke-tested on this machine (ctest label "image").

Builds the image with scripts/build-image.sh (podman, base bootstrapped from Debian when absent),
mounts it (`podman image mount`) and, in a private mount and network namespace (unshare), runs
inside it with chroot as uid 65532 on a read-only root (writable tmpfs only where the pod has
volumes: /run/rdma-sidecar, /dev/shm, /tmp):
- `rdma-sidecar --version` (the version of the OCI label) and `--help`;
- the daemon with the image's own environment (ENV of the Dockerfile, nothing added): health
  SERVING on the probe port :50053 (and the API refused there), GetInfo on the unix socket, the
  socket's mode; SIGTERM exits 0;
- GPU support compiled in (the image the gpu-rdma, dra, sriov and efa overlays run; no GPU needed to
  see it): --help says "GPU memory: supported", and GetInfo's cuda_detail says the CUDA driver was
  looked for at run time and not found here (no libcuda.so.1 in the image: the NVIDIA container
  runtime mounts the node's), not "built without CUDA support";
- no compiler and no headers in the runtime image (cuda.h stays in the build stage); OCI labels
  with version and commit;
- reports the build time and the image size.
`podman run` cannot work in these sandboxes (setrlimit refused), hence chroot. Exits 77 (skipped)
with the reason when podman/mmdebstrap/unshare are missing, the base cannot be bootstrapped (no
Debian mirror), this is not root, or SC_SKIP_IMAGE=1. SC_IMAGE_TAG reuses an image built before instead of building.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
STUBS = os.environ.get("SC_PYTHON_STUBS", os.path.join(SRC, "build", "python"))
SKIP = 77
SOCK = "/run/rdma-sidecar/sock/sidecar.sock"


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def outer():
    if os.environ.get("SC_SKIP_IMAGE") == "1":
        skip("SC_SKIP_IMAGE=1")
    if os.geteuid() != 0:
        skip("needs root (podman image mount, chroot, unshare)")
    for tool in ("podman", "unshare", "chroot"):
        if run(["sh", "-c", "command -v " + tool]).returncode != 0:
            skip(tool + " is not installed (Debian: podman, util-linux, coreutils)")
    version = run(["sed", "-n", r"s/^project(rdma-sidecar VERSION \([0-9.]*\).*/\1/p",
                   os.path.join(SRC, "CMakeLists.txt")]).stdout.strip()
    tag = os.environ.get("SC_IMAGE_TAG")
    if not tag:
        tag = "localhost/rdma-sidecar-test:" + version
        t0 = time.monotonic()
        b = subprocess.run(["bash", os.path.join(SRC, "scripts", "build-image.sh"), tag], timeout=3000)
        print("image build: %.0f s (scripts/build-image.sh, including the base bootstrap when absent)"
              % (time.monotonic() - t0))
        if b.returncode == 3:
            skip("scripts/build-image.sh could not build (see its message above)")
        assert b.returncode == 0, "scripts/build-image.sh failed: %d" % b.returncode
    info = json.loads(run(["podman", "image", "inspect", tag], check=True).stdout)[0]
    labels = info.get("Labels") or info["Config"].get("Labels") or {}
    env = info["Config"].get("Env") or []
    print("image %s: %.1f MiB (podman image inspect Size)" % (tag, info["Size"] / (1 << 20)))
    assert labels.get("org.opencontainers.image.version") == version, labels
    commit = labels.get("org.opencontainers.image.revision", "")
    head = run(["git", "-C", SRC, "rev-parse", "HEAD"]).stdout.strip()
    assert commit and (not head or commit.startswith(head)), (commit, head)
    print("labels: version %s, revision %s" % (version, commit))
    assert info["Config"].get("User") == "65532:65532", info["Config"].get("User")
    mnt = run(["podman", "image", "mount", tag], check=True).stdout.strip()
    try:
        r = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "--",
                            sys.executable, os.path.abspath(__file__), "--inner", mnt, json.dumps(env),
                            version], timeout=300)
        return r.returncode
    finally:
        run(["podman", "image", "unmount", tag])


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True)


def inner(mnt, env, version):
    """In the private namespaces: a read-only view of the image with the pod's writable mounts."""
    root = "/tmp/sc-image-root-%d" % os.getpid()
    os.makedirs(root)
    sh("mount --bind %s %s && mount -o remount,bind,ro %s" % (mnt, root, root))
    sh("mount --rbind /dev %s/dev && mount -t tmpfs -o mode=1777 tmpfs %s/dev/shm" % (root, root))
    sh("mount --rbind /proc %s/proc" % root)
    sh("mount -t tmpfs -o mode=1777 tmpfs %s/tmp" % root)
    sh("mount -t tmpfs -o mode=0755,uid=65532,gid=65532 tmpfs %s/run/rdma-sidecar" % root)
    sh("ip link set lo up")
    as_user = ["chroot", "--userspec=65532:65532", root]
    clean_env = ["env", "-i"] + env

    # 1. read-only root, even for root
    r = run(["chroot", root, "/bin/sh", "-c", "touch /probe-write"])
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r
    r = run(as_user + ["/bin/sh", "-c", "id -u; touch /usr/local/bin/x"])
    assert r.stdout.strip() == "65532" and r.returncode != 0, r

    # 2. --version, --help
    r = run(as_user + clean_env + ["/usr/local/bin/rdma-sidecar", "--version"])
    assert r.returncode == 0 and r.stdout.strip() == "rdma-sidecar " + version, r
    r = run(as_user + clean_env + ["/usr/local/bin/rdma-sidecar", "--help"])
    assert r.returncode == 0 and "--health-listen" in r.stdout and "--reflection" in r.stdout, r
    print("--version: rdma-sidecar %s; --help: %d lines" % (version, len(r.stdout.splitlines())))
    gpu_line = next((l for l in r.stdout.splitlines() if l.startswith("GPU memory:")), None)
    assert gpu_line and gpu_line.startswith("GPU memory: supported"), \
        "the image was built without GPU support: %r (scripts/build-image.sh passes cuda.h)" % gpu_line
    print("--help: " + gpu_line)
    # `man rdma-sidecar`: the help2man page (Dockerfile) and man-db (install-deps.sh --runtime)
    r = run(as_user + clean_env + ["PATH=/usr/bin:/bin", "MANPAGER=cat", "MANWIDTH=100", "/usr/bin/man", "rdma-sidecar"])
    assert r.returncode == 0 and "RDMA-SIDECAR(8)" in r.stdout and "--grpc-listen" in r.stdout, r
    print("man rdma-sidecar: %d lines" % len(r.stdout.splitlines()))

    # 3. no compiler, no headers
    for p in ("opt/cuda", "usr/local/cuda", "usr/include/cuda.h", "usr/bin/gcc", "usr/bin/cc", "usr/bin/c++", "usr/bin/cpp", "usr/bin/cmake", "usr/bin/ld",
              "usr/bin/make", "usr/bin/protoc-c"):
        assert not os.path.lexists(os.path.join(root, p)), "the runtime image holds /" + p
    headers = run(["sh", "-c", "find %s/usr/include %s/usr/local/include -name '*.h' 2>/dev/null | head -5"
                   % (root, root)]).stdout.split()
    assert not headers, "headers in the runtime image: %s" % headers
    dev = run(["chroot", root, "dpkg-query", "-W", "-f", "${Package}\\n"]).stdout.split()
    bad = [p for p in dev if p.endswith("-dev") or p in ("gcc", "gcc-12", "cpp", "cpp-12", "binutils", "cmake")]
    assert not bad, "build packages in the runtime image: %s" % bad
    print("runtime image: %d Debian packages, no compiler, no headers; du %s"
          % (len(dev), run(["du", "-sh", "--one-file-system", root]).stdout.split()[0]))

    # 4. the daemon, with the image's default environment only
    log = open("/tmp/sc-image-daemon-%d.log" % os.getpid(), "w+")
    d = subprocess.Popen(as_user + clean_env + ["/usr/local/bin/rdma-sidecar"], stdout=log,
                         stderr=subprocess.STDOUT)
    try:
        sys.path.insert(0, STUBS)
        import grpc
        from rdma_sidecar.v1 import sidecar_pb2 as pb, sidecar_pb2_grpc as rpc
        from sc_health import health_pb2, health_pb2_grpc
        sock = root + SOCK
        end = time.monotonic() + 30
        while not os.path.exists(sock):
            assert d.poll() is None, "daemon exited %s: %s" % (d.returncode, open(log.name).read())
            assert time.monotonic() < end, "no socket after 30 s: " + open(log.name).read()
            time.sleep(0.05)
        probe = grpc.insecure_channel("127.0.0.1:50053")
        status = None
        while time.monotonic() < end:
            try:
                status = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                time.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.SERVING, status
        try:
            rpc.SidecarStub(probe).GetInfo(pb.GetInfoRequest(), timeout=5)
            raise AssertionError("the probe port served the API")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        api = grpc.insecure_channel("unix:" + sock)
        info = rpc.SidecarStub(api).GetInfo(pb.GetInfoRequest(), timeout=5)
        assert info.version == version, info
        assert "unix:" + SOCK in info.grpc_listeners, info.grpc_listeners
        assert any(e.endswith(":50052") for e in info.data_endpoints), info.data_endpoints
        # GPU support compiled in: the driver was looked for (and is absent: no GPU runtime here).
        assert "built without CUDA support" not in info.cuda_detail, info.cuda_detail
        assert not info.cuda_available and info.cuda_detail.startswith("CUDA driver not found (dlopen libcuda.so.1"), \
            info.cuda_detail
        print("GetInfo: cuda_available false, cuda_detail %r (GPU support compiled in; no driver here)"
              % info.cuda_detail)
        mode = os.stat(sock).st_mode & 0o777
        assert mode == 0o660, oct(mode)
        st = os.stat(os.path.dirname(sock))
        assert st.st_uid == 65532 and st.st_mode & 0o777 == 0o750, (st.st_uid, oct(st.st_mode))
        print("daemon: health SERVING on :50053 (API refused there), GetInfo on %s (mode 0660): "
              "id %s, backends %s" % (SOCK, info.sidecar_id,
                                      ", ".join("%s=%s" % (pb.Backend.Name(b.backend), b.available)
                                                for b in info.backends)))
        api.close()
        probe.close()
        d.send_signal(signal.SIGTERM)
        rc = d.wait(timeout=40)
        assert rc == 0, "exit %s after SIGTERM: %s" % (rc, open(log.name).read()[-2000:])
        print("SIGTERM: exit 0")
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
        os.unlink(log.name)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        sys.exit(inner(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))
    sys.exit(outer())
