# SPDX-License-Identifier: Apache-2.0
"""Two network namespaces joined by a veth pair, for tests that need a real link between two
sidecars: shaped with a token bucket (tbf; the host kernel has no netem) so that a transfer takes a
known minimum time by construction, and cut with iptables DROP (a partition). Used by
test_partition.py and test_faults.py. Paths: the same namespaces joined by several veth pairs, one
subnet and one shaped link each, for the TCP data plane on several paths (test_tcp_paths.py,
bench/tcp_paths_bench.py). Needs root, `ip netns`, tc (and iptables to cut): can_run() says why
not."""
import os
import shutil
import subprocess
import sys


def sh(*args, check=True):
    r = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    if check and r.returncode != 0:
        raise AssertionError("%s failed (%d): %s" % (" ".join(args), r.returncode, r.stdout.decode()))
    return r


def can_run(iptables=True):
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "iptables", "tc") if iptables else ("ip", "tc"):
        if not shutil.which(tool):
            return "%s not installed" % tool
    probe = "scpp%d" % os.getpid()
    if sh("ip", "netns", "add", probe, check=False).returncode != 0:
        return "ip netns add does not work here"
    ok = not iptables or sh("ip", "netns", "exec", probe, "iptables", "-L", "-n", check=False).returncode == 0
    sh("ip", "netns", "del", probe, check=False)
    return None if ok else "iptables does not work in a network namespace here"


class NeedsNetns:
    """A test case mixin (before SidecarTest): the whole class skips (exit 77, with the reason)
    where network namespaces, veth and tc cannot be used here."""

    @classmethod
    def setUpClass(cls):
        why = can_run()
        if why:
            print("skipped: " + why)
            sys.exit(77)
        super().setUpClass()


class Net:
    """Two namespaces and a veth pair between them, qdisc on both ends; removed by close()."""

    def __init__(self, rate=None, qdisc=None):
        """rate: a tbf token bucket on both ends (e.g. "100mbit"); or qdisc: any qdisc argument
        list (vm_netem.py's netem); neither: no qdisc."""
        if rate and not qdisc:
            qdisc = ("tbf", "rate", rate, "burst", "256kb", "latency", "100ms")
        tag = "%d" % (os.getpid() % 100000)
        self.ns = ["scpa%s" % tag, "scpb%s" % tag]
        self.dev = ["scva%s" % tag, "scvb%s" % tag]
        self.addr = ["10.77.0.1", "10.77.0.2"]
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for ns, dev, addr in zip(self.ns, self.dev, self.addr):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            if qdisc:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc)
        self.cut = False

    def set_qdisc(self, qdisc):
        for ns, dev in zip(self.ns, self.dev):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *qdisc)

    def partition(self):
        for ns in self.ns:
            sh("ip", "netns", "exec", ns, "iptables", "-I", "INPUT", "-j", "DROP")
        self.cut = True

    def heal(self):
        if self.cut:
            for ns in self.ns:
                sh("ip", "netns", "exec", ns, "iptables", "-D", "INPUT", "-j", "DROP", check=False)
            self.cut = False

    def close(self):
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)  # takes the veth pair with it


class Paths:
    """Two namespaces joined by n veth pairs: pair i is a subnet of its own (10.78.i.1 in a,
    10.78.i.2 in b), each end shaped with tbf at `rate`, so a sidecar in each namespace may serve
    one TCP data path per pair. cut(i) drops everything arriving on pair i in both namespaces
    (iptables DROP on its interfaces: no RST, no ICMP, as a dead link); restore(i) lets it through
    again. Removed by close()."""

    def __init__(self, n=2, rate="100mbit", burst="256kb", latency="100ms"):
        tag = "%d" % (os.getpid() % 100000)
        self.ns = ["scqa%s" % tag, "scqb%s" % tag]
        self.devs = []  # per pair: (dev in a, dev in b)
        self.addrs = []  # per pair: (address in a, address in b)
        self.cuts = {}  # pair -> the iptables rule cutting it
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i in range(n):
            devs = ("sq%da%s" % (i, tag), "sq%db%s" % (i, tag))
            addrs = ("10.78.%d.1" % i, "10.78.%d.2" % i)
            sh("ip", "link", "add", devs[0], "type", "veth", "peer", "name", devs[1])
            for ns, dev, addr in zip(self.ns, devs, addrs):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                if rate:
                    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                       "rate", rate, "burst", burst, "latency", latency)
            self.devs.append(devs)
            self.addrs.append(addrs)

    def shape(self, i, rate, burst="256kb", latency="100ms"):
        """Pair i's token bucket at another rate, both ends."""
        for ns, dev in zip(self.ns, self.devs[i]):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
               "rate", rate, "burst", burst, "latency", latency)

    def cut(self, i, reset=False):
        """Both ends of pair i drop everything they receive (a cut link: silence); or, with
        reset=True, the first namespace's end answers every TCP segment from pair i with a reset
        (a port gone down that the second namespace's programs hear about at once; on both ends
        a reset would be rejected too, and nobody would hear)."""
        if reset:
            sides = [(self.ns[0], self.devs[i][0], ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])]
        else:
            sides = [(ns, dev, ["-j", "DROP"]) for ns, dev in zip(self.ns, self.devs[i])]
        for ns, dev, rule in sides:
            sh("ip", "netns", "exec", ns, "iptables", "-I", "INPUT", "-i", dev, *rule)
        self.cuts[i] = sides

    def restore(self, i):
        for ns, dev, rule in self.cuts.pop(i, ()):
            sh("ip", "netns", "exec", ns, "iptables", "-D", "INPUT", "-i", dev, *rule, check=False)

    def close(self):
        for i in list(self.cuts):
            self.restore(i)
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)  # takes the veth pairs with them
