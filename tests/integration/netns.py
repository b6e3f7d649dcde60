# SPDX-License-Identifier: Apache-2.0
"""Two network namespaces joined by a veth pair, for tests that need a real link between two
sidecars: shaped with a token bucket (tbf; the host kernel has no netem) so that a transfer takes a
known minimum time by construction, and cut with iptables DROP (a partition). Used by
test_partition.py and test_faults.py. Needs root, `ip netns`, tc (and iptables to cut): can_run()
says why not."""
import os
import shutil
import subprocess


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
