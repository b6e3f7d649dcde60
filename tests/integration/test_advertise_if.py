# SPDX-License-Identifier: Apache-2.0
"""--advertise if:NAME on a real interface: a sidecar in its own network namespace advertises the
address of a veth interface there (as Multus' net1 would be), in GetInfo and in the metadata it
issues; when the interface's address changes, new metadata carries the new one (operations issued
before keep theirs); when the interface goes away the last address stays and the log says why; a
missing interface at start is a clear error (exit 2). Needs root and `ip netns` (else SKIP)."""
import base64
import os
import subprocess
import unittest

from harness import SidecarTest, desc, main, pb, wait_until
import netns


def endpoints_of(metadata_text):
    raw = metadata_text[len("rsm1."):]
    signed = pb.SignedMetadata.FromString(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    return list(pb.RdmaMetadata.FromString(signed.payload).data_endpoints)


class AdvertiseIfTest(SidecarTest):
    def setUp(self):
        why = netns.can_run(iptables=False)
        if why:
            raise unittest.SkipTest(why)
        super().setUp()
        self.ns = "scadv%d" % (os.getpid() % 100000)
        netns.sh("ip", "netns", "del", self.ns, check=False)
        netns.sh("ip", "netns", "add", self.ns)
        self.addCleanup(netns.sh, "ip", "netns", "del", self.ns, check=False)
        netns.sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def ip(self, *args):
        netns.sh("ip", "-n", self.ns, *args)

    def test_follows_the_interface(self):
        self.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1p")
        self.ip("addr", "add", "10.79.0.5/24", "dev", "net1")
        self.ip("link", "set", "net1", "up")
        s = self.sidecar("a", key_file=self.key_file(), prefix=("ip", "netns", "exec", self.ns),
                         data_listen="0.0.0.0:0", extra=["--advertise", "if:net1"],
                         env={"SC_TEST_IF_CHECK_MS": "100"}, tcp=False)
        ep = s.info().data_endpoints[0]
        host, port = ep.rsplit(":", 1)
        self.assertEqual(host, "10.79.0.5")
        region = s.create_region(1 << 16)
        before = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, 0, 4096)],
                                                               timeout_ms=60000), timeout=10)
        self.assertEqual(endpoints_of(before.metadata), ["10.79.0.5:" + port])

        # The address changes (a new lease, a re-plumbed secondary network).
        self.ip("addr", "del", "10.79.0.5/24", "dev", "net1")
        self.ip("addr", "add", "10.79.0.9/24", "dev", "net1")
        wait_until(lambda: s.info().data_endpoints[0] == "10.79.0.9:" + port, 10,
                   "GetInfo to show the new address")
        after = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, 4096, 4096)],
                                                              timeout_ms=60000), timeout=10)
        self.assertEqual(endpoints_of(after.metadata), ["10.79.0.9:" + port])
        self.assertEqual(endpoints_of(s.stub.GetOperation(pb.GetOperationRequest(
            operation_id=before.operation_id), timeout=10).metadata), ["10.79.0.5:" + port])
        self.assertIn("--advertise if:net1: the address changed, peers are now told 10.79.0.9:%s "
                      "(was 10.79.0.5:%s)" % (port, port), s.read_log())

        # The interface goes away: the last address stays, said once in the log.
        self.ip("link", "del", "net1")
        wait_until(lambda: 'there is no network interface "net1" here' in s.read_log(), 10,
                   "the sidecar to notice the interface is gone")
        self.assertIn("peers are still told 10.79.0.9:" + port, s.read_log())
        self.assertEqual(s.info().data_endpoints[0], "10.79.0.9:" + port)

    def test_missing_interface_is_a_clear_error(self):
        r = subprocess.run(["ip", "netns", "exec", self.ns, os.environ.get("SC_BINARY", "build/rdma-sidecar"),
                            "--grpc-listen", "unix:" + os.path.join(self.workdir, "x.sock"),
                            "--shm-dir", self.workdir, "--advertise", "if:net7"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('--advertise if:net7: there is no network interface "net7" here (there are: lo)', r.stderr)
        self.ip("link", "add", "net7", "type", "veth", "peer", "name", "net7p")  # there, but without an address
        r = subprocess.run(["ip", "netns", "exec", self.ns, os.environ.get("SC_BINARY", "build/rdma-sidecar"),
                            "--grpc-listen", "unix:" + os.path.join(self.workdir, "x.sock"),
                            "--shm-dir", self.workdir, "--advertise", "if:net7"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--advertise if:net7: the interface has no IPv4 address", r.stderr)


if __name__ == "__main__":
    main()
