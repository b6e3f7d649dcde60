# SPDX-License-Identifier: Apache-2.0
"""GetInfo's rail topology table (issue 24) on node layouts this machine does not have: the
sidecar loads an hwloc XML fixture (RDMA_SIDECAR_TOPOLOGY_XML, tests/unit/topology/) and the
stand-in CUDA driver reports GPUs at the fixture's PCI bus ids (FAKE_CUDA_PCI_BUS_IDS). The
fixture's NICs are no RDMA devices here: they are listed as rails of state "absent", and every GPU
row and NUMA row names the rails expected from the layout (written out by hand below), with the
distance classes. Without a fixture, the table comes from this host (sysfs), and a fixture that
cannot be read is reported, not fatal."""
import os
import sys

from harness import SidecarTest, main

FAKE = os.environ.get("SC_FAKE_CUDA", "")
if not FAKE or not os.path.exists(FAKE):
    print("SKIP: the stand-in CUDA driver was not built (no cuda.h at build time)")
    sys.exit(77)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "topology")


class TopologyInfoTest(SidecarTest):
    def info_with(self, fixture, bus_ids):
        env = {"SC_TEST_CUDA_DRIVER": FAKE, "FAKE_CUDA_DEVICES": str(len(bus_ids)),
               "FAKE_CUDA_PCI_BUS_IDS": ",".join(bus_ids),
               "RDMA_SIDECAR_TOPOLOGY_XML": os.path.join(FIXTURES, fixture)}
        s = self.sidecar(fixture.split(".")[0], env=env)
        return s, s.info()

    def rows(self, info):
        return {r.memory: r for r in info.topology}

    def test_eight_gpus_eight_nics_two_sockets(self):
        gpus = ["0000:13:00.0", "0000:14:00.0", "0000:33:00.0", "0000:34:00.0",
                "0000:93:00.0", "0000:94:00.0", "0000:b3:00.0", "0000:b4:00.0"]
        s, info = self.info_with("dgx8.xml", gpus)
        self.assertTrue(info.topology_source.endswith("dgx8.xml"), info.topology_source)
        absent = [(r.name, r.pci_address, r.numa_node) for r in info.rails if r.state == "absent"]
        self.assertEqual(absent, [("mlx5_0", "0000:15:00.0", 0), ("mlx5_1", "0000:16:00.0", 0),
                                  ("mlx5_2", "0000:35:00.0", 0), ("mlx5_3", "0000:36:00.0", 0),
                                  ("mlx5_4", "0000:95:00.0", 1), ("mlx5_5", "0000:96:00.0", 1),
                                  ("mlx5_6", "0000:b5:00.0", 1), ("mlx5_7", "0000:b6:00.0", 1)])
        rows = self.rows(info)
        want = {0: ["mlx5_0", "mlx5_1"], 1: ["mlx5_0", "mlx5_1"], 2: ["mlx5_2", "mlx5_3"],
                3: ["mlx5_2", "mlx5_3"], 4: ["mlx5_4", "mlx5_5"], 5: ["mlx5_4", "mlx5_5"],
                6: ["mlx5_6", "mlx5_7"], 7: ["mlx5_6", "mlx5_7"]}
        for g, chosen in want.items():
            r = rows["gpu %d" % g]
            self.assertEqual(list(r.chosen), chosen, r)
            self.assertEqual(r.gpu_index, g)
            self.assertEqual(r.pci_address.lower()[-12:], gpus[g])
            self.assertEqual(r.numa_node, 0 if g < 4 else 1)
            nics = [d.distance for d in r.rails if d.rail.startswith("mlx5")]  # TCP rails: UNKNOWN
            self.assertEqual(nics[:2], ["PIX", "PIX"], r)
            self.assertEqual(nics[-4:], ["SYS"] * 4, r)
        gpu2 = [(d.rail, d.distance) for d in rows["gpu 2"].rails if d.rail.startswith("mlx5")]
        self.assertEqual(gpu2, [("mlx5_2", "PIX"), ("mlx5_3", "PIX"), ("mlx5_0", "NODE"), ("mlx5_1", "NODE"),
                                ("mlx5_4", "SYS"), ("mlx5_5", "SYS"), ("mlx5_6", "SYS"), ("mlx5_7", "SYS")])
        self.assertEqual(list(rows["numa 0"].chosen), ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])
        self.assertEqual(list(rows["numa 1"].chosen), ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"])
        self.assertEqual(rows["numa 1"].gpu_index, -1)
        self.assertIn("[topology] gpu0 0000:13:00.0: rails mlx5_0, mlx5_1 (PIX)", s.read_log())

    def test_four_gpus_share_each_nic(self):
        s, info = self.info_with("shared2.xml", ["0000:05:00.0", "0000:06:00.0", "0000:0a:00.0",
                                                  "0000:0b:00.0", "0000:85:00.0", "0000:86:00.0",
                                                  "0000:8a:00.0", "0000:8b:00.0"])
        rows = self.rows(info)
        nics = [r.name for r in info.rails if r.state == "absent"]
        self.assertEqual(nics, ["mlx5_0", "mlx5_1"], info.rails)
        for g in range(8):
            r = rows["gpu %d" % g]
            self.assertEqual(list(r.chosen), ["mlx5_0" if g < 4 else "mlx5_1"], r)
            self.assertEqual(r.rails[0].distance, "PXB", r)

    def test_nics_on_one_socket(self):
        s, info = self.info_with("onesocket.xml", ["0000:03:00.0", "0000:10:00.0", "0000:81:00.0",
                                                    "0000:82:00.0"])
        rows = self.rows(info)
        self.assertEqual([r.name for r in info.rails if r.state == "absent"], ["mlx5_0", "mlx5_1"])
        self.assertEqual(list(rows["gpu 0"].chosen), ["mlx5_0"])
        self.assertEqual([(d.rail, d.distance) for d in rows["gpu 1"].rails if d.rail.startswith("mlx5")],
                         [("mlx5_0", "PHB"), ("mlx5_1", "PHB")])
        self.assertEqual(list(rows["gpu 1"].chosen), ["mlx5_0", "mlx5_1"])
        self.assertEqual(list(rows["numa 0"].chosen), ["mlx5_0", "mlx5_1"])
        # NUMA node 1 has no NIC: its host memory (and its GPUs', all SYS) may use every rail.
        self.assertEqual([d.distance for d in rows["numa 1"].rails if d.rail.startswith("mlx5")], ["SYS", "SYS"])
        # (every rail: the TCP rail of this sidecar's data endpoint too)
        self.assertEqual([c for c in rows["numa 1"].chosen if c.startswith("mlx5")], ["mlx5_0", "mlx5_1"])
        self.assertEqual(list(rows["numa 1"].chosen), [r.name for r in info.rails if r.backend == 1] + ["mlx5_0", "mlx5_1"])
        self.assertEqual([c for c in rows["gpu 3"].chosen if c.startswith("mlx5")], ["mlx5_0", "mlx5_1"])

    def test_this_host_and_a_bad_file(self):
        s = self.sidecar("host")
        info = s.info()
        self.assertEqual(info.topology_source, "sysfs", info.topology_source)
        self.assertTrue(any(r.memory.startswith("numa ") for r in info.topology), info.topology)
        bad = self.sidecar("bad", env={"RDMA_SIDECAR_TOPOLOGY_XML": "/nonexistent/topo.xml"})
        info = bad.info()
        self.assertTrue(info.topology_source.startswith("none: "), info.topology_source)
        self.assertIn("/nonexistent/topo.xml", info.topology_source)


if __name__ == "__main__":
    main()
