# SPDX-License-Identifier: Apache-2.0
"""gRPC server reflection (grpc.reflection.v1 and v1alpha ServerReflectionInfo).

- a real reflection client from another ecosystem (Node: grpc-js-reflection-client, installed
  from npm into build/npm by tests/node/install.sh) lists the services, fetches descriptors and
  calls GetInfo through a client built only from what reflection returned, over TCP and the unix
  socket, for v1 and v1alpha;
- a Python client speaks the stream itself: several requests on one stream, transitive imports,
  symbols (service, method, nested message, enum), errors for what does not exist, and the file
  bytes equal to what protoc wrote (build/gen/descriptor_set.pb);
- --no-reflection / RDMA_SIDECAR_REFLECTION=false: UNIMPLEMENTED, saying so;
- the health-only probe port (--health-listen) never serves it.
The Node part is skipped (unittest skip, with the reason) when node/npm or the npm registry are not there.
"""
import json
import os
import subprocess

import harness
from harness import SidecarTest, SLOW, free_port, grpc, main, pb

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.dirname(os.path.abspath(harness.BINARY))
NPM_DIR = os.path.join(BUILD, "npm")
DESCRIPTOR_SET = os.path.join(BUILD, "gen", "descriptor_set.pb")

SERVICES = ["rdma_sidecar.v1.Sidecar", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
OFF_MSG = "server reflection is off on this sidecar (--no-reflection)"


def load_set():
    with open(DESCRIPTOR_SET, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    factory = message_factory.MessageFactory(pool)
    req = factory.GetPrototype(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    resp = factory.GetPrototype(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse"))
    return {fd.name: fd.SerializeToString() for fd in fds.file}, req, resp


FILES, Req, Resp = load_set()


def reflect(channel, requests, version="v1", timeout=10):
    """One stream carrying every request; returns the responses in order."""
    call = channel.stream_stream("/grpc.reflection.%s.ServerReflection/ServerReflectionInfo" % version,
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=Resp.FromString)
    return list(call(iter(requests), timeout=timeout * SLOW))


def names(resp):
    return [descriptor_pb2.FileDescriptorProto.FromString(b).name
            for b in resp.file_descriptor_response.file_descriptor_proto]


class ReflectionTest(SidecarTest):
    def test_node_reflection_client(self):
        r = subprocess.run(["bash", os.path.join(HERE, "..", "node", "install.sh"), NPM_DIR],
                           capture_output=True, text=True, timeout=400)
        if r.returncode in (2, 3):
            self.skipTest("node reflection client: " + (r.stdout + r.stderr).strip())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        s = self.sidecar("nodecli")
        want = s.info()
        env = dict(os.environ, NODE_PATH=os.path.join(NPM_DIR, "node_modules"))
        for target in ("127.0.0.1:%d" % s.port, "unix:" + s.sock):
            for version in ("v1", "v1alpha"):
                p = subprocess.run(["node", os.path.join(HERE, "reflection_client.js"), target, version],
                                   capture_output=True, text=True, timeout=60 * SLOW, env=env)
                self.assertEqual(p.returncode, 0, "%s %s: %s %s" % (target, version, p.stdout, p.stderr))
                out = json.loads(p.stdout.strip().splitlines()[-1])
                self.assertEqual(sorted(out["services"]), sorted(SERVICES))
                self.assertIn("GetInfo", out["methods"])
                self.assertIn("WriteRegion", out["methods"])
                self.assertIn("ConnectPeer", out["methods"])
                # Every method of the proto's Sidecar service, as the generated stubs know it.
                self.assertEqual(sorted(out["methods"]),
                                 sorted(m.name for m in pb.DESCRIPTOR.services_by_name["Sidecar"].methods))
                self.assertGreater(out["file_types"], 30)
                self.assertIn('symbol "rdma_sidecar.v1.NoSuchThing" not found', out["missing_symbol"])
                # GetInfo through the reflected client: the same answer the generated stub gets.
                self.assertEqual(out["info"]["sidecar_id"], want.sidecar_id)
                self.assertEqual(out["info"]["data_endpoints"], list(want.data_endpoints))
                self.assertEqual(out["info"]["version"], want.version)

    def test_stream_answers(self):
        s = self.sidecar("pyrefl")
        for version in ("v1", "v1alpha"):
            rs = reflect(s.channel, [
                Req(host="h", list_services=""),
                Req(file_by_filename="rdma_sidecar/v1/sidecar.proto"),
                Req(file_containing_symbol="rdma_sidecar.v1.Sidecar.GetInfo"),
                Req(file_containing_symbol="grpc.health.v1.HealthCheckResponse.ServingStatus"),
                Req(file_containing_symbol="grpc.reflection.v1alpha.ServerReflection"),
                Req(file_containing_symbol="rdma_sidecar.v1"),
                Req(file_by_filename="no/such.proto"),
                Req(file_containing_symbol="rdma_sidecar.v1.Sidecar.NoMethod"),
                Req(all_extension_numbers_of_type="rdma_sidecar.v1.GetInfoRequest"),
                Req(),
            ], version)
            self.assertEqual(len(rs), 10)
            self.assertEqual(rs[0].valid_host, "h")
            self.assertEqual(rs[0].original_request.list_services, "")
            self.assertEqual(sorted(x.name for x in rs[0].list_services_response.service), sorted(SERVICES))
            # The bytes are protoc's, unchanged.
            self.assertEqual(names(rs[1]), ["rdma_sidecar/v1/sidecar.proto"])
            self.assertEqual(rs[1].file_descriptor_response.file_descriptor_proto[0],
                             FILES["rdma_sidecar/v1/sidecar.proto"])
            self.assertEqual(names(rs[2]), ["rdma_sidecar/v1/sidecar.proto"])
            self.assertEqual(names(rs[3]), ["grpc/health/v1/health.proto"])
            self.assertEqual(names(rs[4]), ["grpc/reflection/v1alpha/reflection.proto"])
            self.assertEqual(names(rs[5]), ["rdma_sidecar/v1/sidecar.proto"])
            self.assertEqual(rs[6].error_response.error_code, grpc.StatusCode.NOT_FOUND.value[0])
            self.assertIn('file "no/such.proto" not found', rs[6].error_response.error_message)
            self.assertEqual(rs[7].error_response.error_code, grpc.StatusCode.NOT_FOUND.value[0])
            self.assertEqual(rs[8].all_extension_numbers_response.base_type_name,
                             "rdma_sidecar.v1.GetInfoRequest")
            self.assertEqual(list(rs[8].all_extension_numbers_response.extension_number), [])
            self.assertEqual(rs[9].error_response.error_code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            self.assertIn("empty ServerReflectionRequest", rs[9].error_response.error_message)

    def test_transitive_imports(self):
        # A file that imports another gets both, the requested one first. The sidecar's protos
        # import nothing today, so check against the embedded set's own dependency lists.
        s = self.sidecar("deps")
        for name, raw in FILES.items():
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            rs = reflect(s.channel, [Req(file_by_filename=name)])
            got = names(rs[0])
            self.assertEqual(got[0], name)
            self.assertEqual(sorted(got[1:]), sorted(set(fd.dependency)))

    def test_reflection_off(self):
        for kw in ({"extra": ["--no-reflection"]}, {"extra": ["--reflection=false"]},
                   {"env": {"RDMA_SIDECAR_REFLECTION": "0"}}):
            s = self.sidecar("off%d" % free_port(), **kw)
            for version in ("v1", "v1alpha"):
                with self.assertRaises(grpc.RpcError) as cm:
                    reflect(s.channel, [Req(list_services="")], version)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
                self.assertIn(OFF_MSG, cm.exception.details())
            self.assertEqual(s.info().sidecar_id, s.name)  # the API is untouched
            s.stop()

    def test_not_on_probe_port(self):
        port = free_port()
        s = self.sidecar("probe", extra=["--health-listen", "127.0.0.1:%d" % port])
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        try:
            with self.assertRaises(grpc.RpcError) as cm:
                reflect(ch, [Req(list_services="")])
            self.assertEqual(cm.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
            self.assertIn("health-only probe port", cm.exception.details())
        finally:
            ch.close()
        self.assertEqual(len(reflect(s.channel, [Req(list_services="")])[0]
                             .list_services_response.service), 4)


if __name__ == "__main__":
    main()
