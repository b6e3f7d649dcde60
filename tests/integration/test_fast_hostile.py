# SPDX-License-Identifier: Apache-2.0
"""The fast path's worker boundary against hostile workers (issue 32, items 1-4), real sidecars:

- Doorbells: a worker clears O_NONBLOCK on both doorbells it got, fills the completion doorbell
  (an eventfd counter at its maximum, in older sidecars; a datagram doorbell it never reads, with
  the smallest receive buffer), steals the rings of the submission doorbell, and keeps submitting.
  Meanwhile the daemon answers GetInfo within 1 s every time and another session's runs complete;
  once the worker is killed the sidecar's threads and fds return to their baseline; SIGTERM ends
  the daemon (exit 0) within its grace period.
- Per-uid share: with --allowed-uids 0,65534 and --fast-path-max-sessions 4, uid 65534 (a forked
  child) gets 2 sessions and a RESOURCE_EXHAUSTED naming its uid and the cap for the third; uid 0
  still gets its own.
- 64 sessions whose completion rings are full and whose workers read nothing: the sidecar's CPU
  (utime + stime from /proc/PID/stat) over 5 s stays under 0.02 of a core. A bound on idle polling
  by construction (a stalled session sleeps until its worker rings, or a back-off up to 1 s); the
  figure is printed.
- A second sidecar pointed at a fast-path socket that a live sidecar serves refuses to start, and
  says so naming --fast-path-socket (not --grpc-listen).
- Runs are not logged one by one at info (a worker runs thousands a second).
- Log flood: 3,000 connections of a uid outside --allowed-uids write a handful of lines, and the
  count of what was held back comes in the next line: every refusal is either a line or counted.
The workers are written here from rdma_sidecar/fast_ring.h (socket, fcntl, mmap), not the client.
"""
import mmap
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from harness import BINARY, SLOW, STUBS, SidecarTest, main, pb, wait_until  # noqa: E402

import rdma_sidecar  # noqa: E402,F401
from rdma_sidecar import fast  # noqa: E402  (the wire format's structs only)

READ = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


def open_session(path):
    """A raw session: (socket, hello dict, memfd, sq doorbell, cq doorbell, mmap)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10 * SLOW)
    s.connect(path)
    msg, fds, _f, _a = socket.recv_fds(s, fast.MSG_MAX, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        _t, code, _h, _n, message = fast.unpack_result(msg)
        s.close()
        raise RuntimeError("refused: code %d: %s" % (code, message))
    h = fast.unpack_hello(msg)
    mm = mmap.mmap(fds[0], h["map_size"])
    return s, h, fds[0], fds[1], fds[2], mm


def prepare(s, metadata, region_id, length):
    s.send(fast.pack_prepare(1, READ, metadata, [(region_id, 0, length)]))
    _t, code, handle, _n, message = fast.unpack_result(s.recv(fast.MSG_MAX))
    assert code == 0, message
    return handle


def proc_threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def proc_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def proc_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)


# The hostile worker: its own process, so that whatever blocks it (it made its doorbells blocking)
# blocks only it. argv: fast socket path, metadata, region id, length, attack ("cq" or "sq").
HOSTILE = r"""
import fcntl, mmap, os, select, signal, socket, stat, struct, sys, time
sys.path[:0] = sys.argv[1].split(os.pathsep)
from rdma_sidecar import fast
path, meta, rid, length, attack = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]

class Late(Exception):
    pass

def late(*_):
    raise Late()

signal.signal(signal.SIGALRM, late)

def guarded(fn, *a):
    # A call that may block now that the doorbells block: given up after 50 ms.
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        return fn(*a)
    except (Late, OSError):
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
msg, fds, _f, _a = socket.recv_fds(s, fast.MSG_MAX, 3)
h = fast.unpack_hello(msg)
memfd, sq, cq = fds
for fd in (sq, cq):  # the attack: whatever the sidecar does on these now blocks, if it shares them
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
mm = mmap.mmap(memfd, h["map_size"])
u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
s.send(fast.pack_prepare(1, 3, meta, [(rid, 0, length)]))
_t, code, handle, _n, message = fast.unpack_result(s.recv(fast.MSG_MAX))
assert code == 0, message
eventfds = not stat.S_ISSOCK(os.fstat(cq).st_mode)
if eventfds:
    guarded(os.write, cq, (0xFFFFFFFFFFFFFFFE).to_bytes(8, "little"))  # the counter's maximum
else:  # a doorbell it never reads, as small as it can make it
    c = socket.socket(fileno=os.dup(cq))
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    c.detach()
    guarded(os.write, cq, (0xFFFFFFFFFFFFFFFE).to_bytes(8, "little"))
print("attacking", "eventfds" if eventfds else "sockets", flush=True)
tail, ud, stolen = u[fast.CTL_SQ_TAIL], 0, 0
end = time.monotonic() + float(sys.argv[7])
while time.monotonic() < end:
    # submit what fits, ring, and (sq) take the ring back before the sidecar reads it
    while (tail - u[fast.CTL_SQ_HEAD]) & 0xFFFFFFFF < h["sq_entries"] and ud % 64 != 63:
        off = h["sq_offset"] + (tail % h["sq_entries"]) * 64
        mm[off:off + 64] = fast.pack_sqe(ud, fast.OP_RUN, handle)
        tail = (tail + 1) & 0xFFFFFFFF
        u[fast.CTL_SQ_TAIL] = tail
        ud += 1
    ud += 1
    guarded(os.write, sq, (1).to_bytes(8, "little"))
    if attack == "sq":
        for _ in range(200):
            if select.select([sq], [], [], 0)[0] and guarded(os.read, sq, 8):
                stolen += 1
            guarded(os.write, sq, (1).to_bytes(8, "little"))
            if select.select([sq], [], [], 0)[0] and guarded(os.read, sq, 8):
                stolen += 1
    else:
        u[fast.CTL_CQ_HEAD] = u[fast.CTL_CQ_TAIL]  # read nothing, free the ring: more completions
        time.sleep(0.001)
print("done", stolen, flush=True)
time.sleep(600)
"""


class FastHostileTest(SidecarTest):
    def passive(self, s, length):
        r = s.create_region(length)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id=r.region_id, offset=0, length=length)], any_uses=True,
            timeout_ms=int(600000 * SLOW)), timeout=10)
        dst = s.create_region(length)
        return ro, dst

    def submit(self, h, mm, sq, handle, first, n):
        """n RUN entries of handle from sq index first on, then the tail, then one ring."""
        u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
        for i in range(first, first + n):
            off = h["sq_offset"] + (i % h["sq_entries"]) * 64
            mm[off:off + 64] = fast.pack_sqe(i, fast.OP_RUN, handle)
        u[fast.CTL_SQ_TAIL] = (first + n) & 0xFFFFFFFF
        u.release()
        os.write(sq, (1).to_bytes(8, "little"))

    def info_within(self, s, limit):
        t0 = time.monotonic()
        s.stub.GetInfo(pb.GetInfoRequest(), timeout=limit)
        return time.monotonic() - t0

    def honest_run(self, path, ro, dst, length):
        sock, h, memfd, sq, cq, mm = open_session(path)
        try:
            handle = prepare(sock, ro.metadata, dst.region_id, length)
            u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
            tail = u[fast.CTL_SQ_TAIL]
            mm[h["sq_offset"]:h["sq_offset"] + 64] = fast.pack_sqe(7, fast.OP_RUN, handle)
            u[fast.CTL_SQ_TAIL] = tail + 1
            os.write(sq, (1).to_bytes(8, "little"))
            end = time.monotonic() + 10 * SLOW
            while u[fast.CTL_CQ_TAIL] == 0:
                self.assertLess(time.monotonic(), end, "an honest session's run got no completion")
                time.sleep(0.005)
            c = fast.unpack_cqe(mm, h["cq_offset"])
            u.release()
            return c
        finally:
            mm.close()
            for fd in (memfd, sq, cq):
                os.close(fd)
            sock.close()

    def attack(self, which):
        grace = 3
        s = self.sidecar("victim", extra=["--grace-period", "%ds" % grace])
        path = s.sock + ".fast"
        length = 4096
        ro, dst = self.passive(s, length)
        self.assertEqual(self.honest_run(path, ro, dst, length).code, 0)
        pid = s.proc.pid
        counts = []

        def settled():  # the honest session's thread joined: the same counts twice, 0.3 s apart
            counts.append((proc_threads(pid), proc_fds(pid)))
            time.sleep(0.3)
            return len(counts) > 1 and counts[-1] == counts[-2]
        wait_until(settled, 10, "the sidecar's threads and fds to settle")
        base_threads, base_fds = counts[-1]
        w = subprocess.Popen([sys.executable, "-c", HOSTILE,
                              os.pathsep.join([os.path.join(ROOT, "clients", "python"), os.path.abspath(STUBS)]), path,
                              ro.metadata, dst.region_id, str(length), which, str(3 * SLOW)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = w.stdout.readline()
            self.assertTrue(line.startswith("attacking"), line + (w.stderr.read() if w.poll() is not None else ""))
            print("  worker: %s" % line.strip())
            slowest, end = 0.0, time.monotonic() + 3 * SLOW
            while time.monotonic() < end:
                try:
                    slowest = max(slowest, self.info_within(s, 1.0 * SLOW))
                except Exception as e:  # noqa: BLE001
                    self.fail("GetInfo gave no answer within %.1f s while the worker attacked: %s"
                              % (1.0 * SLOW, type(e).__name__))
                time.sleep(0.1)
            print("  slowest GetInfo during the attack: %.3f s" % slowest)
            c = self.honest_run(path, ro, dst, length)
            self.assertEqual(c.code, 0, c)
        finally:
            w.kill()
            out, err = w.communicate()
        print("  worker after: %s" % out.strip().replace("\n", " | "))
        try:
            wait_until(lambda: (proc_threads(pid), proc_fds(pid)) == (base_threads, base_fds), 10,
                       "threads and fds back to their baseline")
        except AssertionError:
            self.fail("after the worker exited: %d threads (baseline %d), %d fds (baseline %d)"
                      % (proc_threads(pid), base_threads, proc_fds(pid), base_fds))
        t0 = time.monotonic()
        try:
            code = s.stop(timeout=grace + 5)
        except AssertionError as e:
            self.fail(str(e))
        took = time.monotonic() - t0
        print("  SIGTERM: exit %s after %.2f s (grace %d s)" % (code, took, grace))
        self.assertEqual(code, 0)
        self.assertLess(took, grace * SLOW + 1)

    def test_blocking_completion_doorbell(self):
        self.attack("cq")

    def test_stolen_submission_rings(self):
        self.attack("sq")

    # ---- per-uid share ------------------------------------------------------------------------

    def test_one_uid_cannot_take_every_session(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run a worker as another uid")
        os.chmod(self.workdir, 0o755)
        s = self.sidecar("share", extra=["--allowed-uids", "0,65534", "--unix-socket-mode", "0666",
                                         "--fast-path-max-sessions", "4"])
        os.chmod(os.path.dirname(s.sock), 0o755)
        path = s.sock + ".fast"
        rd, wr = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # uid 65534 takes what it can and holds it
            try:
                os.close(rd)
                os.close(go_w)
                os.setgid(65534)
                os.setuid(65534)
                held, refusal = [], ""
                for _ in range(8):
                    try:
                        held.append(open_session(path))
                    except RuntimeError as e:
                        refusal = str(e)
                        break
                os.write(wr, ("%d\n%s\n" % (len(held), refusal)).encode())
                os.read(go_r, 1)
            finally:
                os._exit(0)
        os.close(wr)
        os.close(go_r)
        try:
            with os.fdopen(rd) as f:
                n = int(f.readline())
                refusal = f.readline().strip()
            print("  uid 65534 holds %d sessions; refusal: %s" % (n, refusal))
            self.assertEqual(n, 2, refusal)
            self.assertRegex(refusal, r"code 8: uid 65534 holds 2 fast-path sessions, its share of "
                                      r"--fast-path-max-sessions 4")
            mine = [open_session(path), open_session(path)]  # uid 0's share
            with self.assertRaisesRegex(RuntimeError, "code 8: --fast-path-max-sessions 4 sessions are open"):
                open_session(path)
            for sock, _h, memfd, sq, cq, mm in mine:
                mm.close()
                for fd in (memfd, sq, cq):
                    os.close(fd)
                sock.close()
        finally:
            os.close(go_w)
            os.waitpid(pid, 0)

    # ---- stalled sessions ---------------------------------------------------------------------

    def test_stalled_sessions_cost_no_cpu(self):
        n, length = 64, 512
        s = self.sidecar("stall", extra=["--fast-path-max-sessions", str(n)])
        path = s.sock + ".fast"
        ro, dst = self.passive(s, length)
        sessions = []
        try:
            for _ in range(n):
                sock, h, memfd, sq, cq, mm = open_session(path)
                sessions.append((sock, memfd, sq, cq, mm))
                handle = prepare(sock, ro.metadata, dst.region_id, length)
                self.submit(h, mm, sq, handle, 0, h["sq_entries"])

            def taken(want):
                for sock, memfd, sq, cq, mm in sessions:
                    u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
                    head = u[fast.CTL_SQ_HEAD]
                    u.release()
                    if head != want:
                        return False
                return True
            # each took what its completion ring holds; what comes next waits for room
            wait_until(lambda: taken(h["cq_entries"]), 120, "every session's first runs")
            for sock, memfd, sq, cq, mm in sessions:
                self.submit(h, mm, sq, handle, h["sq_entries"], h["sq_entries"])
            time.sleep(2)  # the back-off reaches its longest
            pid = s.proc.pid
            c0, t0 = proc_cpu_s(pid), time.monotonic()
            time.sleep(5)
            c1, t1 = proc_cpu_s(pid), time.monotonic()
            cores = (c1 - c0) / (t1 - t0)
            print("  %d stalled sessions: %.4f of a core over %.1f s" % (n, cores, t1 - t0))
            self.assertLess(cores, 0.02)
            # the flag is up, and a worker that reads its completions and rings gets the rest
            sock, memfd, sq, cq, mm = sessions[0]
            u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
            self.assertEqual(u[fast.CTL_CQ_FLAGS] & 1, 1, "NEED_WAKEUP in cq_flags")
            taken = u[fast.CTL_SQ_HEAD]
            u[fast.CTL_CQ_HEAD] = u[fast.CTL_CQ_TAIL]
            os.write(sq, (1).to_bytes(8, "little"))
            wait_until(lambda: u[fast.CTL_SQ_HEAD] != taken, 5, "the sidecar to take more once woken")
            u.release()
        finally:
            for sock, memfd, sq, cq, mm in sessions:
                mm.close()
                for fd in (memfd, sq, cq):
                    os.close(fd)
                sock.close()

    def test_impossible_cq_head_ends_the_session(self):
        s = self.sidecar("solo")
        path = s.sock + ".fast"
        ro, dst = self.passive(s, 4096)
        sock, h, memfd, sq, cq, mm = open_session(path)
        try:
            handle = prepare(sock, ro.metadata, dst.region_id, 4096)
            u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
            u[fast.CTL_CQ_HEAD] = 5  # ahead of cq_tail (0)
            mm[h["sq_offset"]:h["sq_offset"] + 64] = fast.pack_sqe(1, fast.OP_RUN, handle)
            u[fast.CTL_SQ_TAIL] = 1
            os.write(sq, (1).to_bytes(8, "little"))
            u.release()
            wait_until(lambda: "ended: the worker broke its completion ring" in s.read_log(), 10,
                       "the session's end in the log")
            self.assertRegex(s.read_log(), r"WARN  \[fast\] session of pid %d: completion ring head 5 is ahead "
                             r"of tail 0 .*; ending the session" % os.getpid())
            sock.settimeout(10 * SLOW)
            self.assertEqual(sock.recv(10), b"", "the socket closes")
        finally:
            mm.close()
            for fd in (memfd, sq, cq):
                os.close(fd)
            sock.close()
        self.assertEqual(s.info().sidecar_id, "solo")

    # ---- the log ------------------------------------------------------------------------------

    def test_refusals_do_not_flood_the_log(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to connect as another uid")
        os.chmod(self.workdir, 0o755)
        s = self.sidecar("quiet", extra=["--allowed-uids", "0", "--unix-socket-mode", "0666"])
        os.chmod(os.path.dirname(s.sock), 0o755)
        path = s.sock + ".fast"
        n = 3000
        def refused_once():
            c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            c.settimeout(10)
            end = time.monotonic() + 10 * SLOW
            while True:  # a full listen backlog (the sidecar slower than us on a busy host): again
                try:
                    c.connect(path)
                    break
                except BlockingIOError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.001)
            try:
                c.recv(fast.MSG_MAX)  # the refusal, then the close
            except ConnectionResetError:
                pass  # refused all the same: the log below must count it (seen once under ASan)
            c.close()

        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                for _ in range(n):
                    refused_once()
                time.sleep(1.1)  # past the limiter's second: the next line says what it held back
                refused_once()
                code = 0
            except BaseException as e:  # noqa: BLE001 (said on stderr: the exit code alone says nothing)
                sys.stderr.write("refusing worker: %s: %s\n" % (type(e).__name__, e))
            finally:
                os._exit(code)
        t0 = time.monotonic()
        _p, status = os.waitpid(pid, 0)
        took = time.monotonic() - t0
        self.assertEqual(status, 0)
        pattern = re.compile(r"fast-path connection of pid \d+ refused: uid 65534 may not use this sidecar "
                             r"\(--allowed-uids does not list it\)(?: \((\d+) similar suppressed\))?")
        wait_until(lambda: sum(1 for m in pattern.finditer(s.read_log()) if m.group(1)) >= 1, 10,
                   "the line that counts the suppressed ones")
        log = s.read_log()
        lines = [m for m in pattern.finditer(log)]
        counted = len(lines) + sum(int(m.group(1) or 0) for m in lines)
        size = sum(len(m.group(0)) for m in lines)
        print("  %d refusals in %.2f s: %d lines (%d bytes), %d counted" % (n + 1, took, len(lines), size, counted))
        self.assertEqual(counted, n + 1, "every refusal is a line or counted in one")
        # one line per second at most (plus the first), however long the flood took
        self.assertLessEqual(len(lines), int(took) + 3)
        self.assertEqual(s.info().sidecar_id, "quiet")


    def test_runs_are_not_logged_one_by_one(self):
        """A worker runs thousands a second: at --log-level info each run writes no line (its start
        and end go to debug; the metrics count runs)."""
        s = self.sidecar("runs", extra=["--log-level", "info"])
        ro, dst = self.passive(s, 4096)
        sock, h, memfd, sq, cq, mm = open_session(s.sock + ".fast")
        n = 500
        try:
            handle = prepare(sock, ro.metadata, dst.region_id, 4096)
            u = memoryview(mm)[:fast.CTL_SIZE].cast("I")
            self.submit(h, mm, sq, handle, 0, n // 2)
            wait_until(lambda: u[fast.CTL_CQ_TAIL] == n // 2, 30, "the first runs")
            u[fast.CTL_CQ_HEAD] = n // 2
            self.submit(h, mm, sq, handle, n // 2, n // 2)
            wait_until(lambda: u[fast.CTL_CQ_TAIL] == n, 30, "the other runs")
            codes = {fast.unpack_cqe(mm, h["cq_offset"] + i * 128).code for i in range(h["cq_entries"])}
            u.release()
            self.assertEqual(codes, {0})
        finally:
            mm.close()
            for fd in (memfd, sq, cq):
                os.close(fd)
            sock.close()
        lines = [ln for ln in s.read_log().splitlines() if "[op]" in ln and (" READ " in ln or " READ:" in ln)]
        print("  %d runs: %d [op] lines of READs at info" % (n, len(lines)))
        self.assertLess(len(lines), 10, lines[:4])

    # ---- the socket in use --------------------------------------------------------------------

    def test_fast_socket_in_use_names_its_flag(self):
        s = self.sidecar("first")
        path = s.sock + ".fast"
        other = os.path.join(self.workdir, "second")
        os.makedirs(other)
        r = subprocess.run([BINARY, "--id", "second", "--grpc-listen", "unix:" + os.path.join(other, "s.sock"),
                            "--shm-dir", other, "--data-listen", "127.0.0.1:0", "--fast-path-socket", path],
                           capture_output=True, text=True, timeout=30 * SLOW)
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertIn("--fast-path-socket %s: another server (a running rdma-sidecar?) is answering on this "
                      "socket" % path, out)
        self.assertNotIn("--grpc-listen unix:%s" % path, out)
        self.assertEqual(s.info().sidecar_id, "first")
        sock, _h, memfd, sq, cq, mm = open_session(path)  # the first one still serves its fast path
        mm.close()
        for fd in (memfd, sq, cq):
            os.close(fd)
        sock.close()


if __name__ == "__main__":
    main()
