#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end demo: two sidecars, a real nats-server and two worker processes on this machine.

Starts nats-server on a free loopback port, writes a fresh signing key (mode 0600) into a temporary
directory, starts the sidecars "stage-a" and "stage-b" (each with its own unix socket, shm directory
and data port), then runs examples/producer.py against stage-a and examples/consumer.py against
stage-b: a READ (the consumer pulls the producer's readable) and a WRITE (the producer pushes into
the consumer's writable), the metadata travelling over NATS. Compares the SHA-256 both workers print,
prints a summary, stops everything (SIGTERM, every sidecar must exit 0) and removes the temporary
files. Exits non-zero on any mismatch or failure; nothing is left running, on failure or Ctrl-C too.

Normally run through scripts/demo.sh, which installs the packages and builds first.
"""
import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


class DemoError(Exception):
    pass


def say(msg=""):
    print(msg, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise DemoError("timed out after %.0fs waiting for %s" % (timeout, what))


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return "(%s)\n" % e


class Proc:
    """A child process in its own session (a Ctrl-C reaches only the demo, which then stops it in
    order) that also gets SIGTERM should the demo itself die."""

    def __init__(self, name, args, log_path=None, echo=False, env=None):
        self.name, self.args, self.log_path = name, args, log_path
        out = open(log_path, "wb") if log_path else subprocess.PIPE
        self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env, preexec_fn=_die_with_parent)
        if log_path:
            out.close()
        self.reader = None
        if echo:
            self.reader = threading.Thread(target=self._echo, daemon=True)
            self.reader.start()

    def _echo(self):
        for line in self.proc.stdout:
            say("  %-8s| %s" % (self.name, line.decode(errors="replace").rstrip()))

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=20, sig=signal.SIGTERM):
        """Signal (SIGTERM), wait; SIGKILL if it does not go. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise DemoError("%s did not exit within %ds of %s; killed it"
                                % (self.name, timeout, signal.Signals(sig).name))
        if self.reader:
            self.reader.join(5)
        return self.proc.returncode


try:
    import ctypes
    _LIBC = ctypes.CDLL(None)  # loaded here: the child between fork and exec only calls into it
except OSError:
    _LIBC = None


def _die_with_parent():
    """Linux: the child gets SIGTERM when the demo process dies, however it dies (even SIGKILL)."""
    if _LIBC is not None:
        _LIBC.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def start_nats(nats_server, tmp):
    for _ in range(3):
        port = free_port()
        # -js: the sidecars keep published metadata in JetStream (their default --nats-handoff).
        p = Proc("nats", [nats_server, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", os.path.join(tmp, "js")],
                 os.path.join(tmp, "nats.log"))

        def up():
            if not p.alive():
                return "exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return "up"
            except OSError:
                return None
        if wait_for(up, 10, "nats-server on port %d" % port) == "up":
            return p, "nats://127.0.0.1:%d" % port
        p.stop()  # most likely the port was taken in between: try another
    raise DemoError("nats-server did not start:\n" + tail(os.path.join(tmp, "nats.log")))


class Sidecar:
    def __init__(self, binary, name, tmp, shm_root, nats_url, key_file, pb, pb_grpc, health_pb2, health_grpc, grpc,
                 env=None):
        self.name = name
        self.sock = os.path.join(tmp, name + ".sock")
        self.addr = "unix:" + self.sock
        self.shm = os.path.join(shm_root, name)
        os.makedirs(self.shm)
        self.log = os.path.join(tmp, name + ".log")
        self.proc = Proc(name, [binary, "--id", name, "--grpc-listen", self.addr, "--shm-dir", self.shm,
                                "--data-listen", "127.0.0.1:0", "--nats-url", nats_url, "--key-file", key_file,
                                "--log-level", "info"], self.log, env=env)

        def listening():
            if not self.proc.alive():
                raise DemoError("sidecar %s exited with %s during start-up:\n%s"
                                % (name, self.proc.proc.returncode, tail(self.log)))
            return os.path.exists(self.sock)
        # Connect only once the socket exists: a channel that failed once backs off for seconds.
        wait_for(listening, 15, "sidecar %s to listen on %s" % (name, self.addr))
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = pb_grpc.SidecarStub(self.channel)
        health = health_grpc.HealthStub(self.channel)

        def serving():
            if not self.proc.alive():
                raise DemoError("sidecar %s exited with %s during start-up:\n%s"
                                % (name, self.proc.proc.returncode, tail(self.log)))
            try:
                r = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return r.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False
        wait_for(serving, 15, "sidecar %s to serve on %s" % (name, self.addr))
        self.info = wait_for(lambda: self._info_if_connected(pb), 10, "sidecar %s to connect to NATS" % name)

    def _info_if_connected(self, pb):
        i = self.stub.GetInfo(pb.GetInfoRequest(), timeout=5)
        return i if i.nats_state == "connected" else None

    def stop(self):
        self.channel.close()
        return self.proc.stop()  # SIGTERM: the sidecar drains and exits 0


def run_workers(workers, timeout):
    """Wait for both workers; if one fails, stop the other at once. Returns {name: exit code}."""
    end = time.monotonic() + timeout
    codes = {}
    while len(codes) < len(workers):
        for w in workers:
            if w.name not in codes and not w.alive():
                codes[w.name] = w.proc.returncode
                if w.proc.returncode != 0:
                    for other in workers:
                        if other.alive():
                            say("  (%s failed: stopping %s)" % (w.name, other.name))
                            other.stop(10)
        if time.monotonic() > end:
            for w in workers:
                if w.alive():
                    w.stop(10)
            raise DemoError("the workers did not finish within %.0fs" % timeout)
        time.sleep(0.05)
    for w in workers:
        w.stop()  # reap, join the output reader
    return codes


def choose_memory(choice, build_dir):
    """--gpu: returns (device or None, extra environment, a sentence saying what the workers use)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    env = {}
    if choice == "off":
        return None, env, "host memory (region files in /dev/shm), as asked (--gpu off)"
    if choice == "stand-in":
        lib = os.path.join(build_dir, "tests", "libsc_fake_cuda.so")
        if not os.path.exists(lib):
            raise SystemExit("demo: --gpu stand-in needs %s (built with the CUDA headers)" % lib)
        env["SC_TEST_CUDA_DRIVER"] = os.environ["SC_TEST_CUDA_DRIVER"] = lib
        device = 0
    else:
        os.environ.pop("SC_TEST_CUDA_DRIVER", None)
        device = 0 if choice == "auto" else int(choice)
    import cudadrv as cu
    try:
        cu.init(device)
        name = cu.device_name(device) if hasattr(cu, "device_name") else "GPU %d" % device
    except Exception as e:  # noqa: BLE001 (no driver, no device: say why)
        if choice == "auto":
            return None, env, "host memory (region files in /dev/shm): no usable GPU here (%s)" % e
        raise SystemExit("demo: --gpu %s: %s" % (choice, e))
    what = ("GPU %d (%s) memory that each worker allocates itself and registers by CUDA IPC handle"
            % (device, name))
    if choice == "stand-in":
        what += " -- the TEST STAND-IN driver (host memory behind the CUDA API), not a real GPU"
    return device, env, what


def table(rows, headers):
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = "  ".join("%%-%ds" % w for w in widths)
    out = [line % tuple(headers), line % tuple("-" * w for w in widths)]
    out += [line % tuple(r) for r in rows]
    return "\n".join(r.rstrip() for r in out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")),
                   help="where rdma-sidecar and the Python stubs (python/) were built (default: build/)")
    p.add_argument("--size", default="256MiB", help="region size for each direction, e.g. 64MiB (default: 256MiB)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds each worker step may take (default: 30)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) after a success")
    p.add_argument("--gpu", default="auto", metavar="auto|off|stand-in|N",
                   help="where the workers keep the data: auto (GPU 0 when a CUDA GPU is usable, else "
                        "host memory), off (host memory), N (GPU N), stand-in (the test suite's stand-in "
                        "CUDA driver: exercises the GPU path without a GPU) (default: auto)")
    a = p.parse_args()
    if a.gpu not in ("auto", "off", "stand-in") and not a.gpu.isdigit():
        p.error("--gpu takes auto, off, stand-in or a device number, not %r" % a.gpu)

    binary = os.path.join(a.build_dir, "rdma-sidecar")
    stubs = os.path.join(a.build_dir, "python")
    nats_server = shutil.which("nats-server") or "/usr/sbin/nats-server"
    for path, hint in ((binary, "build it: cmake -S . -B build && cmake --build build"),
                       (os.path.join(stubs, "rdma_sidecar", "v1", "sidecar_pb2_grpc.py"),
                        "the build makes them when protoc and grpc_python_plugin are installed"),
                       (nats_server, "apt-get install nats-server")):
        if not os.path.exists(path):
            raise SystemExit("demo: %s is missing (%s)" % (path, hint))
    sys.path.insert(0, stubs)
    import grpc
    from rdma_sidecar.v1 import sidecar_pb2 as pb, sidecar_pb2_grpc as pb_grpc
    from sc_health import health_pb2, health_pb2_grpc

    # A Ctrl-C or SIGTERM unwinds through `finally` below; children are in their own sessions.
    def on_signal(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_signal)  # set even where the shell started us with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)

    gpu, gpu_env, memory = choose_memory(a.gpu, a.build_dir)

    tmp = tempfile.mkdtemp(prefix="rdma-sidecar-demo-", dir="/tmp")  # short: unix socket paths
    # Region files live in tmpfs, like /dev/shm in a pod (a disk-backed directory would write back).
    shm_root = tempfile.mkdtemp(prefix="rdma-sidecar-demo-", dir="/dev/shm" if os.path.isdir("/dev/shm") else tmp)
    nats, sidecars, workers, ok, failure = None, [], [], False, None
    key_file = os.path.join(tmp, "keys")
    try:
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write("demo-%s:%s\n" % (secrets.token_hex(3), base64.b64encode(secrets.token_bytes(32)).decode()))
        say("== work dir %s (logs, key file), region files under %s" % (tmp, shm_root))

        nats, nats_url = start_nats(nats_server, tmp)
        say("== nats-server %s (pid %d)" % (nats_url, nats.proc.pid))

        for name in ("stage-a", "stage-b"):
            s = Sidecar(binary, name, tmp, shm_root, nats_url, key_file, pb, pb_grpc, health_pb2,
                        health_pb2_grpc, grpc, env=dict(os.environ, **gpu_env))
            sidecars.append(s)
            i = s.info
            say("== sidecar %s (pid %d): gRPC %s, data %s, backends %s, nats %s, signing key %s"
                % (name, s.proc.proc.pid, s.addr, ",".join(i.data_endpoints),
                   ",".join(pb.Backend.Name(b.backend).removeprefix("BACKEND_").lower()
                            for b in i.backends if b.available), i.nats_state, i.signing_key_id))
            for b in i.backends:
                if not b.available:
                    say("   %s unavailable: %s" % (pb.Backend.Name(b.backend).removeprefix("BACKEND_").lower(),
                                                   b.detail))
            say("   cuda: %s" % i.cuda_detail)
            for g in i.gpus:
                say("   gpu %d: %s, ibverbs path: %s" % (g.index, g.name, g.rdma_path))

        run_id = secrets.token_hex(4)
        common = ["--stubs", stubs, "--size", a.size, "--timeout", str(a.timeout),
                  "--read-subject", "demo.%s.read" % run_id, "--write-subject", "demo.%s.write" % run_id]
        if gpu is not None:
            common += ["--gpu", str(gpu)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **gpu_env)
        say("== memory: %s" % memory)
        say("== workers: producer -> stage-a, consumer -> stage-b")
        t0 = time.monotonic()
        consumer = Proc("consumer", [sys.executable, os.path.join(ROOT, "examples", "consumer.py"),
                                     "--sidecar", sidecars[1].addr, "--report", os.path.join(tmp, "consumer.json")]
                        + common, echo=True, env=env)
        workers.append(consumer)
        producer = Proc("producer", [sys.executable, os.path.join(ROOT, "examples", "producer.py"),
                                     "--sidecar", sidecars[0].addr, "--report", os.path.join(tmp, "producer.json")]
                        + common, echo=True, env=env)
        workers.append(producer)
        codes = run_workers([consumer, producer], 3 * a.timeout + 30)
        workers_s = time.monotonic() - t0
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            raise DemoError("worker(s) failed: %s" % ", ".join("%s exit %s" % kv for kv in sorted(bad.items())))

        with open(os.path.join(tmp, "producer.json")) as f:
            prod = json.load(f)
        with open(os.path.join(tmp, "consumer.json")) as f:
            cons = json.load(f)
        problems = []
        rows = []
        for direction, active, passive in (("READ", cons["read"], prod["read"]),
                                           ("WRITE", prod["write"], cons["write"])):
            if active["sha256"] != passive["sha256"]:
                problems.append("%s: SHA-256 differs: %s side %s, %s side %s"
                                % (direction, "consumer" if direction == "READ" else "producer", active["sha256"],
                                   "producer" if direction == "READ" else "consumer", passive["sha256"]))
            if active["bytes"] != passive["bytes"]:
                problems.append("%s: byte counts differ: %d vs %d" % (direction, active["bytes"], passive["bytes"]))
            if passive["passive_status"] != "COMPLETE":
                problems.append("%s: the passive side ended %s" % (direction, passive["passive_status"]))
            rows.append((direction, active["bytes"], active["descriptors"], active["backend"],
                         "%.3f" % active["seconds"], "%.2f" % (active["bytes"] / active["seconds"] / 1e9),
                         "%.3f" % (active["sidecar_ms"] / 1000.0), passive["passive_status"],
                         "match" if active["sha256"] == passive["sha256"] else "MISMATCH"))
        say()
        say(table(rows, ("direction", "bytes", "descriptors", "backend", "seconds", "GB/s", "sidecar s",
                         "passive status", "sha256")))
        say()
        say("seconds: the active worker's BeginRead/BeginWrite call until WaitOperation returned COMPLETE; "
            "sidecar s: the operation's own created-to-completed timestamps (ms resolution).")
        reasons = sorted({r for r in (cons["read"].get("backend_reason"), prod["write"].get("backend_reason")) if r})
        for r in reasons:
            say("why this backend: %s" % r)
        say("workers ran %.1fs in all (region set-up, random fill and hashing included)" % workers_s)
        say("memory: %s" % memory)
        if problems:
            raise DemoError("; ".join(problems))

        say("== stopping (SIGTERM)")
        for s in reversed(sidecars):
            code = s.stop()
            if code != 0:
                raise DemoError("sidecar %s exited with %s after SIGTERM:\n%s" % (s.name, code, tail(s.log)))
            left = os.listdir(s.shm)
            if left:
                raise DemoError("sidecar %s left region files behind: %s" % (s.name, left))
            say("   sidecar %s exited 0" % s.name)
        code = nats.stop(sig=signal.SIGINT)  # nats-server exits 1 after SIGTERM, 0 after SIGINT
        if code != 0:
            raise DemoError("nats-server exited with %s:\n%s" % (code, tail(nats.log_path)))
        say("   nats-server exited 0")
        ok = True
    except KeyboardInterrupt:
        say("\ndemo: interrupted; stopping everything")
    except DemoError as e:
        failure = e
        say("\ndemo: FAILED: %s" % e)
    finally:
        # Cleanup is bounded (every stop has a timeout, then SIGKILL): a second Ctrl-C must not cut
        # it short. Workers first (they release their operations and regions), then the sidecars,
        # then NATS.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for p in workers + list(reversed(sidecars)) + ([nats] if nats else []):
            try:
                if p is nats:
                    p.stop(10, sig=signal.SIGINT)  # nats-server exits 1 after SIGTERM, 0 after SIGINT
                elif p in workers:
                    p.stop(10)
                else:
                    p.stop()
            except DemoError as e:
                say("demo: %s" % e)
        for s in sidecars:
            if failure and os.path.exists(s.log):
                say("---- last lines of %s (exit %s)" % (s.log, s.proc.proc.returncode))
                say(tail(s.log).rstrip())
        shutil.rmtree(shm_root, ignore_errors=True)
        if failure or a.keep:
            if os.path.exists(key_file):
                os.unlink(key_file)  # the logs stay for a look; the key does not
            say("demo: logs kept in %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if not ok:
        sys.exit(1)
    say("== demo passed: every byte arrived, both directions")


if __name__ == "__main__":
    main()
