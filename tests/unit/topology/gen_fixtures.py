#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gen_fixtures.py: writes the hwloc 2.x XML fixtures of test_topology.c (committed beside it).

Each fixture is a small hand-described node: packages (one NUMA node each, two PUs each) and, below
them, PCI host bridges, PCI-to-PCI bridges (root ports, PCIe switch upstream and downstream ports),
GPUs (class 0x0302, vendor 0x10de) and NICs (class 0x0207, vendor 0x15b3, with an OpenFabrics OS
device mlx5_N). Regenerate with `python3 gen_fixtures.py` in this directory and check each file
with `hwloc-info --input <file>` (package hwloc). The expected values in test_topology.c are
written out by hand from the layouts below, not computed from these files.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


class Gen:
    def __init__(self):
        self.gp = 0
        self.lines = []

    def gpi(self):
        self.gp += 1
        return self.gp

    def out(self, depth, text):
        self.lines.append("  " * depth + text)


def gpu(bdf, cuda=None):
    return ("gpu", bdf, cuda)


def nic(bdf, name):
    return ("nic", bdf, name)


def port(bdf, lo, hi, children):
    """A PCI-to-PCI bridge (root port, switch upstream or downstream port) over buses [lo-hi]."""
    return ("bridge", bdf, lo, hi, children)


def switch(usp_bdf, lo, hi, dsps):
    """A PCIe switch: its upstream port over [lo-hi], dsps = [(bdf, lo, hi, device)]."""
    return port(usp_bdf, lo, hi, [port(b, l, h, [d]) for (b, l, h, d) in dsps])


def emit_io(g, depth, node, bdepth=1):
    """depth: XML indentation; bdepth: the bridge depth below the host bridge (root port: 1)."""
    kind = node[0]
    if kind == "bridge":
        _, bdf, lo, hi, children = node
        g.out(depth, f'<object type="Bridge" gp_index="{g.gpi()}" bridge_type="1-1" depth="{bdepth}" '
                     f'bridge_pci="{bdf[:4]}:[{lo:02x}-{hi:02x}]" pci_busid="{bdf}" '
                     f'pci_type="0604 [8086:2030] [0000:0000] 04" pci_link_speed="0.000000">')
        for c in children:
            emit_io(g, depth + 1, c, bdepth + 1)
        g.out(depth, "</object>")
    elif kind == "gpu":
        _, bdf, cuda = node
        g.out(depth, f'<object type="PCIDev" gp_index="{g.gpi()}" pci_busid="{bdf}" '
                     f'pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.507692">')
        if cuda is not None:
            g.out(depth + 1, f'<object type="OSDev" gp_index="{g.gpi()}" name="{cuda}" osdev_type="5">')
            g.out(depth + 2, '<info name="CoProcType" value="CUDA"/>')
            g.out(depth + 2, '<info name="Backend" value="CUDA"/>')
            g.out(depth + 1, "</object>")
        g.out(depth, "</object>")
    elif kind == "nic":
        _, bdf, name = node
        g.out(depth, f'<object type="PCIDev" gp_index="{g.gpi()}" pci_busid="{bdf}" '
                     f'pci_type="0207 [15b3:1021] [15b3:0041] 00" pci_link_speed="31.507692">')
        g.out(depth + 1, f'<object type="OSDev" gp_index="{g.gpi()}" name="{name}" osdev_type="3">')
        g.out(depth + 2, '<info name="NodeGUID" value="0000:0000:0000:0000"/>')
        g.out(depth + 1, "</object>")
        g.out(depth, "</object>")


def cpuset(pus):
    return "0x%08x" % sum(1 << p for p in pus)


def write(name, packages, comment):
    """packages: [[host bridge, ...], ...], host bridge = (domain, lo, hi, [children])."""
    g = Gen()
    npu = 2 * len(packages)
    allpus = list(range(npu))
    allnodes = list(range(len(packages)))
    g.out(0, '<?xml version="1.0" encoding="UTF-8"?>')
    g.out(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    g.out(0, '<topology version="2.0">')
    m = cpuset(allpus)
    ns = cpuset(allnodes)
    g.out(1, f'<object type="Machine" os_index="0" cpuset="{m}" complete_cpuset="{m}" allowed_cpuset="{m}" '
             f'nodeset="{ns}" complete_nodeset="{ns}" allowed_nodeset="{ns}" gp_index="{g.gpi()}">')
    g.out(2, '<info name="Backend" value="Linux"/>')
    g.out(2, f'<info name="HostName" value="fixture-{name}"/>')
    # The minimalistic XML parser (hwloc without libxml2) takes no comments: the layout goes here.
    g.out(2, f'<info name="Fixture" value="{comment}"/>')
    for p, bridges in enumerate(packages):
        pus = [2 * p, 2 * p + 1]
        cs = cpuset(pus)
        nd = cpuset([p])
        attrs = f'cpuset="{cs}" complete_cpuset="{cs}" nodeset="{nd}" complete_nodeset="{nd}"'
        g.out(2, f'<object type="Package" os_index="{p}" {attrs} gp_index="{g.gpi()}">')
        g.out(3, f'<object type="NUMANode" os_index="{p}" {attrs} gp_index="{g.gpi()}" '
                 f'local_memory="68719476736"/>')
        for pu in pus:
            one = cpuset([pu])
            pa = f'cpuset="{one}" complete_cpuset="{one}" nodeset="{nd}" complete_nodeset="{nd}"'
            g.out(3, f'<object type="Core" os_index="{pu}" {pa} gp_index="{g.gpi()}">')
            g.out(4, f'<object type="PU" os_index="{pu}" {pa} gp_index="{g.gpi()}"/>')
            g.out(3, "</object>")
        for (dom, lo, hi, children) in bridges:
            g.out(3, f'<object type="Bridge" gp_index="{g.gpi()}" bridge_type="0-1" depth="0" '
                     f'bridge_pci="{dom}:[{lo:02x}-{hi:02x}]">')
            for c in children:
                emit_io(g, 4, c)
            g.out(3, "</object>")
        g.out(2, "</object>")
    g.out(1, "</object>")
    g.out(0, "</topology>")
    with open(os.path.join(HERE, name + ".xml"), "w") as f:
        f.write("\n".join(g.lines) + "\n")


def rail_switch(base, gpus, nics):
    """A host bridge over [base-base+0xf]: root port, one switch, its dsps 2 GPUs then 2 NICs."""
    b = base
    dsps = []
    devs = [gpu(f"0000:{b + 3 + i:02x}:00.0", cuda) for i, cuda in enumerate(gpus)]
    devs += [nic(f"0000:{b + 3 + len(gpus) + i:02x}:00.0", n) for i, n in enumerate(nics)]
    for i, d in enumerate(devs):
        bus = b + 3 + i
        dsps.append((f"0000:{b + 2:02x}:{i:02x}.0", bus, bus, d))
    return ("0000", b, b + 0xf,
            [port(f"0000:{b:02x}:01.0", b + 1, b + 0xf, [switch(f"0000:{b + 1:02x}:00.0", b + 2, b + 0xf, dsps)])])


# (a) 8 GPUs / 8 NICs, two sockets, four PCIe switches (each: 2 GPUs + 2 NICs under one host
# bridge). Switch k sits on buses 0x10+0x20*k.. : GPUs 0000:(base+3):00.0, (base+4); NICs (base+5),
# (base+6). Socket 0: switches 0, 1 (bases 0x10, 0x30); socket 1: switches 2, 3 (0x90, 0xb0).
def fixture_a():
    sw = []
    for k, base in enumerate([0x10, 0x30, 0x90, 0xB0]):
        sw.append(rail_switch(base, [f"cuda{2 * k}", f"cuda{2 * k + 1}"],
                              [f"mlx5_{2 * k}", f"mlx5_{2 * k + 1}"]))
    write("dgx8", [[sw[0], sw[1]], [sw[2], sw[3]]],
          "8 GPUs, 8 NICs, 2 sockets, 4 PCIe switches of 2 GPUs + 2 NICs (gen_fixtures.py)")


# (b) four GPUs share each of two NICs: per socket one host bridge, a root port, a top switch whose
# downstream ports hold two sub-switches (2 GPUs each) and one NIC. No CUDA OS devices.
def fixture_b():
    pk = []
    for s, b in enumerate([0x00, 0x80]):
        def bus(x):
            return b + x

        def bdf(x, dev=0):
            return f"0000:{bus(x):02x}:{dev:02x}.0"
        sub0 = switch(bdf(3), bus(4), bus(7), [(bdf(4, 0), bus(5), bus(5), gpu(bdf(5))),
                                               (bdf(4, 1), bus(6), bus(6), gpu(bdf(6)))])
        sub1 = switch(bdf(8), bus(9), bus(0xC), [(bdf(9, 0), bus(0xA), bus(0xA), gpu(bdf(0xA))),
                                                 (bdf(9, 1), bus(0xB), bus(0xB), gpu(bdf(0xB)))])
        top = port(bdf(1), bus(2), bus(0xF), [
            port(bdf(2, 0), bus(3), bus(7), [sub0]),
            port(bdf(2, 1), bus(8), bus(0xC), [sub1]),
            port(bdf(2, 2), bus(0xD), bus(0xD), [nic(bdf(0xD), f"mlx5_{s}")])])
        root = port(bdf(0, 1), bus(1), bus(0xF), [top])
        pk.append([("0000", bus(0), bus(0x7F), [root])])
    write("shared2", pk, "8 GPUs sharing 2 NICs: per socket a switch over two sub-switches of 2 GPUs "
          "and one NIC (gen_fixtures.py)")


# (c) every NIC on socket 0. Socket 0, host bridge 0000:[00-3f]: root port 00:01.0 -> a switch with
# GPU0 03:00.0 and mlx5_0 04:00.0; root port 00:02.0 -> GPU1 10:00.0; root port 00:03.0 -> mlx5_1
# 20:00.0. Socket 1, host bridge 0000:[80-bf]: root ports 80:01.0 -> GPU2 81:00.0, 80:02.0 -> GPU3
# 82:00.0.
def fixture_c():
    s0 = ("0000", 0x00, 0x3F, [
        port("0000:00:01.0", 0x01, 0x0F, [switch("0000:01:00.0", 0x02, 0x0F, [
            ("0000:02:00.0", 0x03, 0x03, gpu("0000:03:00.0", "cuda0")),
            ("0000:02:01.0", 0x04, 0x04, nic("0000:04:00.0", "mlx5_0"))])]),
        port("0000:00:02.0", 0x10, 0x10, [gpu("0000:10:00.0", "cuda1")]),
        port("0000:00:03.0", 0x20, 0x20, [nic("0000:20:00.0", "mlx5_1")])])
    s1 = ("0000", 0x80, 0xBF, [
        port("0000:80:01.0", 0x81, 0x81, [gpu("0000:81:00.0", "cuda2")]),
        port("0000:80:02.0", 0x82, 0x82, [gpu("0000:82:00.0", "cuda3")])])
    write("onesocket", [[s0], [s1]], "4 GPUs over 2 sockets, both NICs on socket 0 (gen_fixtures.py)")


if __name__ == "__main__":
    fixture_a()
    fixture_b()
    fixture_c()
