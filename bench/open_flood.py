# SPDX-License-Identifier: Apache-2.0
"""What a key holder's OPEN flood costs an honest reader (issue 32, item 9), beside the build before.

Two sidecars, a (passive) and b (honest, active). A 4 KiB readable with any_uses on a; b reads it
with BeginRead + WaitOperation (bytes compared once per phase), timed as the worker sees it. A
flooder holding the cluster key and the readable's token sends 100,000 OPENs (distinct transfer
ids, no DONE) pipelined on two connections (tests/integration/peer_client.py) and reads every
reply. Phases, each --reads honest READs of the same readable and of a second one (the flood's
operation and another operation):

  baseline   no flood
  flood      while the 100,000 OPENs are sent and answered (reads go on until the flood is over,
             at least --reads of them)
  held       after the flood, its connections still open (what it left in the bookkeeping)
  close      the flood's two connections close (each record checked as it goes), then a new
             peer's hello + PING: its time is printed too

Each build runs in its own process (SC_BINARY), alternating, --rounds times; the table gives, per
build and phase, p50 and p99 of the READ (us), the ratio of p99 to the baseline's, the flood's
duration and how many of its OPENs were accepted.

Usage: /usr/bin/python3 bench/open_flood.py [--builds new=build-peer/rdma-sidecar,old=/tmp/old-peer/build/rdma-sidecar]
       [--reads 300] [--rounds 1] [--opens 100000]
"""
import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def one(reads, opens):
    """One build (SC_BINARY): the phases; prints one JSON line."""
    import harness
    from harness import Sidecar, desc, pb, write_key_file
    from peer_client import Peer, metadata_token

    work = tempfile.mkdtemp(prefix="sc-flood-", dir="/tmp")
    key = os.urandom(32)
    keys = os.path.join(work, "keys")
    write_key_file(keys, [("k1", key)])
    quiet = ["--log-level", "info"]
    a = Sidecar(work, "a", key_file=keys, extra=quiet)
    b = Sidecar(work, "b", key_file=keys, extra=quiet)
    try:
        size = 4096
        ra = a.create_region(2 * size)
        data = os.urandom(2 * size)
        a.fill(ra, 0, data)
        ops = [a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, i * size, size)],
                                                             timeout_ms=600000, any_uses=True), timeout=10)
               for i in range(2)]
        rb = b.create_region(size)
        host, port = a.info().data_endpoints[0].rsplit(":", 1)
        port = int(port)

        def read(i, check=False):
            t0 = time.perf_counter()
            got = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ops[i].metadata,
                                                           descriptors=[desc(rb, 0, size)], timeout_ms=60000),
                                   timeout=60)
            done = b.wait(got.operation_id, 60000)
            us = (time.perf_counter() - t0) * 1e6
            b.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=got.operation_id), timeout=10)
            assert done.status == pb.OPERATION_STATUS_COMPLETE, done.error.message
            if check:
                assert b.peek(rb, 0, size) == data[i * size:(i + 1) * size], "bytes differ"
            return us

        def phase(until=None):
            lat = {0: [], 1: []}
            n = 0
            while n < reads or (until and not until()):
                for i in (0, 1):
                    lat[i].append(read(i, check=(n == 0)))
                n += 1
            return lat

        for _ in range(20):  # warm: connections pooled, code paths hot
            read(0), read(1)
        res = {"baseline": phase()}

        # The flooder is another process (its Python must not take the reader's GIL): two
        # connections, every frame built before the start, every reply read. It says "ready",
        # waits for a line, floods, says how many OPENs were accepted, waits for a line, closes.
        token = metadata_token(ops[0].metadata)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "integration"))
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--flooder", host, str(port),
                                  key.hex(), token.hex(), str(opens)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        assert child.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        child.stdin.write("go\n")
        result = []
        reader = threading.Thread(target=lambda: result.append(child.stdout.readline()))
        reader.start()
        res["flood"] = phase(until=lambda: not reader.is_alive())
        reader.join()
        flood_s = time.monotonic() - t0
        accepted = int(result[0])
        res["held"] = phase()
        child.stdin.write("close\n")  # the flood's connections close...
        assert child.stdout.readline().strip() == "closed"
        t_hello = time.perf_counter()  # ...and a new peer's hello comes at once
        p = Peer(host, port, "k1", key, client_id="newcomer", timeout=600)
        p.ping()
        hello_ms = (time.perf_counter() - t_hello) * 1e3
        p.sock.close()
        child.wait(60)
        res["close"] = phase()
        out = {"phases": {ph: {"own": res[ph][0], "other": res[ph][1]} for ph in res},
               "flood_s": flood_s, "accepted": accepted, "hello_after_close_ms": hello_ms}
        print("RESULT " + json.dumps(out))
    finally:
        for s in (a, b):
            s.stop()
            shutil.rmtree(s.shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        del harness


def flooder(host, port, key_hex, token_hex, opens):
    """The flood, in its own process (see one())."""
    from peer_client import OK, PEER_READ, Peer, open_frame
    key, token = bytes.fromhex(key_hex), bytes.fromhex(token_hex)
    peers = [Peer(host, port, "k1", key, client_id="flood", timeout=600) for _ in range(2)]
    frames = [b"".join(open_frame(token, random.getrandbits(64), PEER_READ, 4096) for _ in range(opens // 2))
              for _ in range(2)]
    replies = [None, None]

    def flood(k):
        sender = threading.Thread(target=peers[k].sock.sendall, args=(frames[k],))
        sender.start()
        replies[k] = peers[k].replies(opens // 2)
        sender.join()
    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=flood, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(1 for r in replies for f in r if f[0] == OK), flush=True)
    sys.stdin.readline()
    for p in peers:
        p.sock.close()
    print("closed", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", default="new=%s,old=/tmp/old-peer/build/rdma-sidecar" %
                    os.path.join(ROOT, "build-peer", "rdma-sidecar"))
    ap.add_argument("--stubs", default=os.path.join(ROOT, "build-peer", "python"))
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--opens", type=int, default=100000)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--flooder", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flooder:
        h, p, k, t, n = args.flooder
        flooder(h, int(p), k, t, int(n))
        return
    if args.one:
        one(args.reads, args.opens)
        return
    builds = [b.split("=", 1) for b in args.builds.split(",")]
    runs = {name: [] for name, _ in builds}
    for _ in range(args.rounds):
        for name, binary in builds:
            env = dict(os.environ, SC_BINARY=os.path.abspath(binary), SC_PYTHON_STUBS=args.stubs)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--reads", str(args.reads),
                                  "--opens", str(args.opens)], env=env, capture_output=True, text=True,
                                 timeout=1800)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                raise SystemExit("%s failed:\n%s%s" % (name, out.stdout[-3000:], out.stderr[-3000:]))
            runs[name].append(json.loads(line[0][7:]))
    print("4 KiB READ (BeginRead + WaitOperation, us) of the flooded operation (own) and of another (other); "
          "%d OPENs on two connections; %d reads per phase, %d round(s)" % (args.opens, args.reads, args.rounds))
    print("| build | phase | own p50 | own p99 | own p99 / baseline | other p50 | other p99 | other p99 / baseline |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _ in builds:
        merged = {}
        for r in runs[name]:
            for ph, d in r["phases"].items():
                for k in ("own", "other"):
                    merged.setdefault(ph, {}).setdefault(k, []).extend(d[k])
        base = merged["baseline"]
        for ph in ("baseline", "flood", "held", "close"):
            d = merged[ph]
            print("| %s | %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |" % (
                name, ph, pct(d["own"], 0.5), pct(d["own"], 0.99), pct(d["own"], 0.99) / pct(base["own"], 0.99),
                pct(d["other"], 0.5), pct(d["other"], 0.99), pct(d["other"], 0.99) / pct(base["other"], 0.99)))
    print()
    print("| build | flood s | OPENs accepted | new peer's hello + PING after the flood closes (ms) |")
    print("| --- | ---: | ---: | ---: |")
    for name, _ in builds:
        for r in runs[name]:
            print("| %s | %.2f | %d | %.1f |" % (name, r["flood_s"], r["accepted"], r["hello_after_close_ms"]))


if __name__ == "__main__":
    main()
