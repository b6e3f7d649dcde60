# SPDX-License-Identifier: Apache-2.0
"""What a sidecar costs as the cluster grows (issue 25), for one or more builds side by side.

Four shapes, on loopback with default flags:
- all-to-all: N sidecars, each with a 1 MiB readable of random bytes open to any number of uses;
  every sidecar reads every other's once (N x (N-1) reads, one reader thread per sidecar).
- fan-in: one hub and N readers; each reader reads the hub's readable once, all at once.
- one-to-many: one 64 MiB readable (any number of uses) read once by each of N reader sidecars at
  once: the time until the last completes and the aggregate GB/s.
- light peers: N hand-written protocol clients (tests/integration/peer_client.py) authenticate to
  one sidecar and PING; its threads, fds and memory with all N open.

After the reads, with every connection still pooled, each process is measured from /proc: threads,
open fds, established TCP connections and anonymous memory (RssAnon). The table gives the mean per
sidecar (all-to-all) or the hub's (fan-in), the reads that failed and the time. Every read is
checked: status COMPLETE and the bytes equal to the source's.

Usage: /usr/bin/python3 bench/scale_bench.py [--build LABEL=BUILD_DIR ...] [--all-to-all 2,16,48]
       [--fan-in 300] [--one-to-many 4,16,64] [--light-peers 1024] [--json FILE]
A baseline build (e.g. the commit before a change, built in another directory) goes beside the
current one with a second --build.
"""
import argparse
import concurrent.futures as cf
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

MiB = 1 << 20


def proc_stats(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Threads", "RssAnon"):
                out[k] = int(v.split()[0])
    fd_dir = "/proc/%d/fd" % pid
    inodes = set()
    fds = 0
    for name in os.listdir(fd_dir):
        fds += 1
        try:
            link = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    established = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "01" and cols[9] in inodes:
                        established += 1
        except FileNotFoundError:
            pass
    return {"threads": out["Threads"], "fds": fds, "tcp": established, "anon_kib": out["RssAnon"]}


def start_all(harness, workdir, names, keys, pool):
    # Four at a time: on a small machine, hundreds starting at once miss their start-up deadline.
    # One that misses it (a loaded machine) is started again, once.
    def start(name):
        try:
            return harness.Sidecar(workdir, name, key_file=keys, tcp=False, extra=["--log-level", "warn"])
        except AssertionError:
            subprocess.run(["pkill", "-f", "--", "--id %s " % name], check=False)
            return harness.Sidecar(workdir, name, key_file=keys, tcp=False, extra=["--log-level", "warn"])
    with cf.ThreadPoolExecutor(max_workers=4) as starters:
        return list(starters.map(start, names))


def readable(h, s, size):
    r = s.stub.CreateRegion(h.pb.CreateRegionRequest(size=size), timeout=30)
    data = os.urandom(size)
    s.fill(r, 0, data)
    op = s.stub.CreateReadable(h.pb.CreatePassiveRequest(descriptors=[h.desc(r, 0, size)], any_uses=True,
                                                         timeout_ms=3600 * 1000), timeout=30)
    return op.metadata, data


def read_once(h, s, region, off, metadata, data):
    done = s.stub.BeginRead(h.pb.BeginTransferRequest(metadata=metadata, descriptors=[h.desc(region, off, len(data))],
                                                      timeout_ms=120000, wait=True), timeout=180)
    if done.status != h.pb.OPERATION_STATUS_COMPLETE:
        return done.error.message or "status %d" % done.status
    if s.peek(region, off, len(data)) != data:
        return "bytes differ"
    return None


def stop_all(sidecars, pool):
    list(pool.map(lambda s: s.stop(timeout=60), sidecars))
    for s in sidecars:
        s.log.close()


def all_to_all(h, n, size, pool):
    workdir = tempfile.mkdtemp(prefix="sc-scale-", dir="/tmp")
    keys = h.write_key_file(os.path.join(workdir, "keys"))
    sidecars = start_all(h, workdir, ["s%03d" % i for i in range(n)], keys, pool)
    try:
        sources = [readable(h, s, size) for s in sidecars]
        failures = []
        lock = threading.Lock()

        def reader(i):
            s = sidecars[i]
            region = s.stub.CreateRegion(h.pb.CreateRegionRequest(size=size * (n - 1) or size), timeout=30)
            k = 0
            for j in range(n):
                if j != i:
                    err = read_once(h, s, region, k * size, *sources[j])
                    k += 1
                    if err:
                        with lock:
                            failures.append(err)
        t0 = time.monotonic()
        list(pool.map(reader, range(n)))
        seconds = time.monotonic() - t0
        stats = [proc_stats(s.proc.pid) for s in sidecars]
        mean = {k: sum(st[k] for st in stats) / n for k in stats[0]}
        return dict(mean, reads=n * (n - 1), failed=len(failures), seconds=seconds,
                    first_failure=failures[0] if failures else "")
    finally:
        stop_all(sidecars, pool)


def readers_of_one(h, n, size, pool):
    """One readable of `size` bytes (any number of uses) on a hub, read once by each of n reader
    sidecars, all at once (fan-in and one-to-many): the hub's cost, the time until the last read
    completes, the aggregate GB/s."""
    workdir = tempfile.mkdtemp(prefix="sc-scale-", dir="/tmp")
    keys = h.write_key_file(os.path.join(workdir, "keys"))
    hub = start_all(h, workdir, ["hub"], keys, pool)[0]
    readers = []
    try:
        readers = start_all(h, workdir, ["r%03d" % i for i in range(n)], keys, pool)
        metadata, data = readable(h, hub, size)
        regions = [s.stub.CreateRegion(h.pb.CreateRegionRequest(size=size), timeout=30) for s in readers]
        base = proc_stats(hub.proc.pid)
        t0 = time.monotonic()
        errors = [e for e in pool.map(lambda i: read_once(h, readers[i], regions[i], 0, metadata, data), range(n))
                  if e]
        seconds = time.monotonic() - t0
        st = proc_stats(hub.proc.pid)
        return dict(st, threads_before=base["threads"], reads=n, failed=len(errors), seconds=seconds,
                    gbps=n * size / seconds / 1e9, first_failure=errors[0] if errors else "")
    finally:
        stop_all(readers + [hub], pool)


def light_peers(h, n):
    """n hand-written protocol clients (tests/integration/peer_client.py) connect to one sidecar,
    authenticate and PING; the sidecar's cost is measured with all n open."""
    from peer_client import Peer
    import base64
    workdir = tempfile.mkdtemp(prefix="sc-scale-", dir="/tmp")
    keys = h.write_key_file(os.path.join(workdir, "keys"))
    with open(keys) as f:
        kid, b64 = f.read().split()[0].split(":", 1)
    key = base64.b64decode(b64)
    hub = h.Sidecar(workdir, "hub", key_file=keys, tcp=False, extra=["--log-level", "warn"])
    peers = []
    try:
        host, port = hub.info().data_endpoints[0].rsplit(":", 1)
        base = proc_stats(hub.proc.pid)
        t0 = time.monotonic()
        for i in range(n):
            peers.append(Peer(host, int(port), kid, key, client_id="p%04d" % i, timeout=60))
            peers[-1].ping()
        seconds = time.monotonic() - t0
        st = proc_stats(hub.proc.pid)
        return dict(st, threads_before=base["threads"], anon_before_kib=base["anon_kib"], reads=n, failed=0,
                    seconds=seconds, first_failure="")
    finally:
        for p in peers:
            p.sock.close()
        hub.stop(timeout=60)
        hub.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", default=[],
                    help="LABEL=BUILD_DIR (its rdma-sidecar and python stubs); repeat for a baseline")
    ap.add_argument("--all-to-all", default="2,16,48", help="sidecar counts, comma list ('' for none)")
    ap.add_argument("--fan-in", default="300", help="reader counts, comma list ('' for none)")
    ap.add_argument("--one-to-many", default="4,16,64", help="reader counts of one readable, comma list")
    ap.add_argument("--otm-size", type=int, default=64 * MiB, help="the one readable's bytes")
    ap.add_argument("--light-peers", default="1024", help="hand-written peer connections to one sidecar")
    ap.add_argument("--size", type=int, default=MiB, help="bytes per read (all-to-all, fan-in)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.build] or [["this", os.path.join(HERE, "..", "build")]]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    a2a = [int(x) for x in args.all_to_all.split(",") if x]
    fan = [int(x) for x in args.fan_in.split(",") if x]
    otm = [int(x) for x in args.one_to_many.split(",") if x]
    light = [int(x) for x in args.light_peers.split(",") if x]
    results = []
    for label, build in builds:
        os.environ["SC_BINARY"] = os.path.abspath(os.path.join(build, "rdma-sidecar"))
        stubs = os.path.join(build, "python")  # a binary-only baseline build uses this tree's
        if "SC_PYTHON_STUBS" not in os.environ:
            os.environ["SC_PYTHON_STUBS"] = os.path.abspath(
                stubs if os.path.isdir(stubs) else os.path.join(HERE, "..", "build", "python"))
        import harness as h  # the stubs path is read at import; every build has the same proto
        h.BINARY = os.environ["SC_BINARY"]
        workers = max(a2a + fan + otm + [2]) + 1
        with cf.ThreadPoolExecutor(max_workers=workers) as pool:
            for n in a2a:
                r = all_to_all(h, n, args.size, pool)
                results.append(dict(r, build=label, shape="all-to-all", n=n))
                print(json.dumps(results[-1]), file=sys.stderr)
            for n in fan:
                r = readers_of_one(h, n, args.size, pool)
                results.append(dict(r, build=label, shape="fan-in", n=n))
                print(json.dumps(results[-1]), file=sys.stderr)
            for n in otm:
                r = readers_of_one(h, n, args.otm_size, pool)
                results.append(dict(r, build=label, shape="one-to-many", n=n))
                print(json.dumps(results[-1]), file=sys.stderr)
            for n in light:
                r = light_peers(h, n)
                results.append(dict(r, build=label, shape="light peers", n=n))
                print(json.dumps(results[-1]), file=sys.stderr)
    print("| build | shape | sidecars | reads | failed | threads | fds | TCP conns | anon memory | time |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        if r["shape"] in ("one-to-many", "light peers"):
            continue
        n = r["n"] if r["shape"] == "all-to-all" else r["n"] + 1
        who = "per sidecar" if r["shape"] == "all-to-all" else "hub"
        print("| %s | %s (%s) | %d | %d | %d | %.1f | %.0f | %.0f | %.1f MB | %.1f s |"
              % (r["build"], r["shape"], who, n, r["reads"], r["failed"], r["threads"], r["fds"], r["tcp"],
                 r["anon_kib"] / 1024, r["seconds"]))
    otm_rows = [r for r in results if r["shape"] == "one-to-many"]
    if otm_rows:
        print("\n| build | readers of one %d MiB readable | failed | time until the last completes | aggregate GB/s |"
              % (args.otm_size // MiB))
        print("| --- | ---: | ---: | ---: | ---: |")
        for r in otm_rows:
            print("| %s | %d | %d | %.2f s | %.2f |" % (r["build"], r["n"], r["failed"], r["seconds"], r["gbps"]))
    light_rows = [r for r in results if r["shape"] == "light peers"]
    if light_rows:
        print("\n| build | light peer connections | threads before / with them | fds | anon memory before / with them | "
              "bytes per connection | time to connect all |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in light_rows:
            print("| %s | %d | %d / %d | %d | %.1f / %.1f MB | %.0f | %.1f s |"
                  % (r["build"], r["n"], r["threads_before"], r["threads"], r["fds"], r["anon_before_kib"] / 1024,
                     r["anon_kib"] / 1024, (r["anon_kib"] - r["anon_before_kib"]) * 1024 / r["n"], r["seconds"]))
    for r in results:
        if r["failed"]:
            print("%s %s %d: first failure: %s" % (r["build"], r["shape"], r["n"], r["first_failure"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
