# SPDX-License-Identifier: Apache-2.0
"""librdma-sidecar-client from C: runs sc-client-test (tests/client/client_lib_test.c) against two
real sidecars and a real nats-server. The C program checks every RPC wrapper, the bytes moved,
error codes and messages, stream callbacks that stop, the JetStream hand-off through WaitMetadata
(publisher first, waiter first ordered by b's gRPC call counts on --metrics-listen, a deadline that
passes), traceparents on create and begin, and an unreachable sidecar. Sidecar a loads the
dgx8 hwloc fixture (RDMA_SIDECAR_TOPOLOGY_XML), so its rails and topology rows are known exactly."""
import os
import subprocess

from harness import SLOW, SidecarTest, free_port, main

BUILD = os.path.dirname(os.path.abspath(os.environ.get("SC_BINARY", "build/rdma-sidecar")))
EXE = os.path.join(BUILD, "client", "sc-client-test")
DGX8 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "topology", "dgx8.xml")


class ClientLibTest(SidecarTest):
    def test_library(self):
        nats = self.nats()
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, nats_url=nats.url, env={"RDMA_SIDECAR_TOPOLOGY_XML": DGX8})
        port = free_port()
        b = self.sidecar("b", key_file=keys, nats_url=nats.url, extra=["--metrics-listen", "127.0.0.1:%d" % port])
        # A file b can open read-write, registered as a host-file region by the C program.
        path = os.path.join(b.shm, "worker-file")
        with open(path, "wb") as f:
            f.truncate(1 << 20)
        r = subprocess.run([EXE, "unix:" + a.sock, "unix:" + b.sock, path, str(port)], capture_output=True, text=True,
                           timeout=120 * SLOW)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("all checks passed", r.stdout)


if __name__ == "__main__":
    main()
