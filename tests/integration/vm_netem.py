# SPDX-License-Identifier: Apache-2.0
"""Loss, delay and reordering between two real sidecars (TCP data plane), beside iperf3 under the
same qdisc. Runs where the kernel has sch_netem: inside the Soft-RoCE VM (tests/vm/netem-guest.sh;
the host kernel has none), as root.

Two network namespaces joined by a veth pair (the Net helper of test_partition.py), one sidecar in
each (gRPC on unix sockets), netem on both veth ends. Per scenario (1% loss, 5% loss, 20 ms +-10 ms
delay with 25% reordering): iperf3 single stream for SC_NETEM_IPERF_S seconds, then a READ and a
WRITE of SC_NETEM_MIB MiB (default 256) with every byte compared. Prints a table of throughputs
and exits 1 when a transfer fails or a byte differs; 77 when netem is missing.
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Sidecar, desc, pb, write_key_file  # noqa: E402
from netns import Net, can_run, sh  # noqa: E402

SIZE = int(os.environ.get("SC_NETEM_MIB", "256")) << 20
IPERF_S = int(os.environ.get("SC_NETEM_IPERF_S", "5"))
SCENARIOS = [
    ("loss 1%", ("netem", "loss", "1%")),
    ("loss 5%", ("netem", "loss", "5%")),
    ("delay 20ms+-10ms reorder 25%", ("netem", "delay", "20ms", "10ms", "reorder", "25%", "50%")),
]


def iperf(net):
    srv = subprocess.Popen(["ip", "netns", "exec", net.ns[0], "iperf3", "-s", "-1", "-B", net.addr[0]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # until the server listens
            r = subprocess.run(["ip", "netns", "exec", net.ns[1], "iperf3", "-c", net.addr[0], "-t",
                                str(IPERF_S), "-J"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=IPERF_S + 60)
            try:
                return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 8 / 1e6
            except (ValueError, KeyError):
                time.sleep(0.2)  # the server was not listening yet
        raise RuntimeError("iperf3 failed: %s" % r.stdout[-300:])
    finally:
        srv.kill()
        srv.wait()


def transfer(a, b, ra, rb, direction):
    data = os.urandom(SIZE)
    (a if direction == "read" else b).fill(ra if direction == "read" else rb, 0, data)
    create = a.stub.CreateReadable if direction == "read" else a.stub.CreateWritable
    po = create(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, SIZE)], timeout_ms=600000), timeout=60)
    begin = b.stub.BeginRead if direction == "read" else b.stub.BeginWrite
    t0 = time.monotonic()
    ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(rb, 0, SIZE)],
                                       timeout_ms=500000), timeout=60)
    fin = b.wait(ao.operation_id, 500000)
    took = time.monotonic() - t0
    pw = a.wait(po.operation_id, 30000)
    if fin.status != pb.OPERATION_STATUS_COMPLETE or pw.status != pb.OPERATION_STATUS_COMPLETE:
        return None, "active %s (%s), passive %s (%s)" % (pb.OperationStatus.Name(fin.status), fin.error.message,
                                                          pb.OperationStatus.Name(pw.status), pw.error.message)
    got = b.peek(rb, 0, SIZE) if direction == "read" else a.peek(ra, 0, SIZE)
    if got != data:
        return None, "bytes differ"
    return SIZE / took / 1e6, "%.1f s" % took


def main():
    why = can_run(iptables=False)
    if why:
        print("vm_netem: skipped: " + why)
        return 77
    probe = Net(qdisc=None)
    try:
        if sh("ip", "netns", "exec", probe.ns[0], "tc", "qdisc", "add", "dev", probe.dev[0], "root",
              "netem", "loss", "1%", check=False).returncode != 0:
            print("vm_netem: skipped: no sch_netem in this kernel")
            return 77
    finally:
        probe.close()
    work = "/tmp/sc-netem-%d" % os.getpid()
    os.makedirs(work, exist_ok=True)
    keys = write_key_file(os.path.join(work, "keys"))
    net = Net(qdisc=None)
    sides = []
    rows, failed = [], False
    try:
        a, b = [Sidecar(work, n, key_file=keys, tcp=False, data_listen=addr + ":0",
                        prefix=("ip", "netns", "exec", ns))
                for n, ns, addr in zip("ab", net.ns, net.addr)]
        sides = [a, b]
        ra, rb = a.create_region(SIZE), b.create_region(SIZE)
        for name, q in SCENARIOS:
            net.set_qdisc(q)
            ip = iperf(net)
            row = [name, "%.1f" % ip]
            for d in ("read", "write"):
                mbs, note = transfer(a, b, ra, rb, d)
                if mbs is None:
                    failed = True
                    row.append("FAIL: " + note)
                else:
                    row.append("%.1f (%s, x%.2f)" % (mbs, note, mbs / ip))
            rows.append(row)
            print("vm_netem: %s: iperf3 %s MB/s, READ %s, WRITE %s" % tuple(row), flush=True)
    finally:
        for s in sides:
            s.stop()
            shutil.rmtree(s.shm, ignore_errors=True)
        net.close()
        shutil.rmtree(work, ignore_errors=True)
    print("vm_netem summary (%d MiB per transfer, MB/s; ratio to iperf3 single stream)" % (SIZE >> 20))
    print("  %-30s %12s %32s %32s" % ("qdisc", "iperf3", "READ", "WRITE"))
    for r in rows:
        print("  %-30s %12s %32s %32s" % tuple(r))
    print("vm_netem: %s" % ("FAIL" if failed else "OK"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
