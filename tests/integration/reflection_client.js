// SPDX-License-Identifier: Apache-2.0
// A gRPC server reflection client from another ecosystem (Node: grpc-js-reflection-client on
// @grpc/grpc-js, protobufjs and @grpc/proto-loader), run by test_reflection.py:
//   NODE_PATH=build/npm/node_modules node reflection_client.js TARGET VERSION [TOKEN]
// Lists the services, fetches descriptors by symbol and by file name, then calls
// rdma_sidecar.v1.Sidecar/GetInfo through a client built only from the descriptors reflection
// returned (no .proto file, no generated code). Prints one JSON object; exits 1 on any failure.
'use strict';
const grpc = require('@grpc/grpc-js');
const { GrpcReflection } = require('grpc-js-reflection-client');

const [target, version, token] = process.argv.slice(2);
const deadline = () => new Date(Date.now() + 10000);

function callOpts() {
  const md = new grpc.Metadata();
  if (token) md.set('authorization', 'Bearer ' + token);
  return [md, { deadline: deadline() }];
}

function errText(e) {
  if (!e) return String(e);
  if (e.message && typeof e.message === 'object') return errText(e.message);
  const code = e.code !== undefined ? 'code ' + e.code + ': ' : '';
  return code + (e.details || e.message || String(e));
}

async function main() {
  const out = { version };
  const refl = new GrpcReflection(target, grpc.credentials.createInsecure(), {}, version);
  out.services = await refl.listServices('*', ...callOpts());

  const methods = await refl.listMethods('rdma_sidecar.v1.Sidecar', ...callOpts());
  out.methods = methods.map((m) => m.name).sort();

  const byFile = await refl.getDescriptorByFileName('rdma_sidecar/v1/sidecar.proto', ...callOpts());
  out.file_types = Object.keys(byFile.getProtobufJsRoot().lookup('rdma_sidecar.v1').nested).length;

  try {
    await refl.getDescriptorBySymbol('rdma_sidecar.v1.NoSuchThing', ...callOpts());
    out.missing_symbol = 'found?!';
  } catch (e) {
    out.missing_symbol = errText(e);
  }

  // The call: a client made from what reflection returned for the service symbol.
  const desc = await refl.getDescriptorBySymbol('rdma_sidecar.v1.Sidecar', ...callOpts());
  const pkg = desc.getPackageObject({ keepCase: true, longs: String, enums: String, defaults: true });
  const Sidecar = pkg.rdma_sidecar.v1.Sidecar;
  const client = new Sidecar(target, grpc.credentials.createInsecure());
  out.info = await new Promise((resolve, reject) => {
    client.GetInfo({}, ...callOpts(), (err, resp) => (err ? reject(err) : resolve(resp)));
  });
  client.close();
  console.log(JSON.stringify(out));
}

main().then(
  () => process.exit(0),
  (e) => {
    console.log(JSON.stringify({ error: errText(e) }));
    process.exit(1);
  },
);
