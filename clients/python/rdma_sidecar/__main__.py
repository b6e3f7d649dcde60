# SPDX-License-Identifier: Apache-2.0
"""python3 -m rdma_sidecar: a quick look at a sidecar (info, regions, ops) from the command line."""
import argparse
import json
import sys
from typing import Any, List, Optional

from google.protobuf import json_format

from . import errors
from ._pb import pb
from .sync import Connector


def _name(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value).replace(prefix, "").lower()


def _info(c: Connector, as_json: bool) -> None:
    i = c.info()
    if as_json:
        print(json_format.MessageToJson(i))
        return
    print("sidecar   %s (version %s) at %s, health %s" % (i.sidecar_id, i.version, c.address, c.health()))
    print("listeners %s" % ", ".join(i.grpc_listeners))
    print("data      %s" % ", ".join(i.data_endpoints))
    print("nats      %s" % i.nats_state)
    print("signing   %s" % ("key " + i.signing_key_id if i.signing_enabled else "disabled (no --key-file)"))
    for b in i.backends:
        print("backend   %-8s %-11s %s" % (_name(pb.Backend, b.backend, "BACKEND_"),
                                          "available" if b.available else "unavailable", b.detail))
    print("cuda      %s" % ("available" if i.cuda_available else "unavailable") + (": " + i.cuda_detail if i.cuda_detail else ""))
    for g in i.gpus:
        print("gpu %-5d %s (%s), %d MiB, path: %s" % (g.index, g.name, g.pci_bus_id, g.total_memory >> 20, g.rdma_path))


def _regions(c: Connector, as_json: bool) -> None:
    rs = c.list_regions()
    if as_json:
        print(json.dumps([json_format.MessageToDict(r) for r in rs], indent=2))
        return
    print("%-22s %-6s %14s %5s  %s" % ("REGION", "DEVICE", "BYTES", "OPS", "NAME / PATH"))
    for r in rs:
        dev = "cuda%d" % r.device_index if r.device_kind == pb.DEVICE_KIND_CUDA else "host"
        print("%-22s %-6s %14d %5d  %s %s" % (r.region_id, dev, r.size, r.live_operations, r.name, r.path))
    print("%d region(s)" % len(rs))


def _ops(c: Connector, as_json: bool) -> None:
    ops = c.list_operations()
    if as_json:
        print(json.dumps([json_format.MessageToDict(o) for o in ops], indent=2))
        return
    print("%-22s %-9s %-12s %-8s %23s  %s" % ("OPERATION", "KIND", "STATUS", "BACKEND", "BYTES DONE/TOTAL", "PEER"))
    for o in ops:
        print("%-22s %-9s %-12s %-8s %23s  %s" % (
            o.operation_id, _name(pb.OperationKind, o.kind, "OPERATION_KIND_"),
            _name(pb.OperationStatus, o.status, "OPERATION_STATUS_"), _name(pb.Backend, o.backend, "BACKEND_"),
            "%d/%d" % (o.bytes_done, o.bytes_total), o.peer or "-"))
    print("%d operation(s)" % len(ops))


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: python3 -m rdma_sidecar [--address ADDR] [--json] {info,regions,ops}."""
    p = argparse.ArgumentParser(prog="python3 -m rdma_sidecar",
                                description="A quick look at an rdma-sidecar through its gRPC API.",
                                epilog="Environment: RDMA_SIDECAR_ADDR sets the default of --address, "
                                       "RDMA_SIDECAR_WAIT_FOR_READY that of --wait.")
    p.add_argument("--address", metavar="ADDR", default=None,
                   help="gRPC address of the sidecar (default: $RDMA_SIDECAR_ADDR, else "
                        "unix:/tmp/rdma-sidecar/sidecar.sock)")
    p.add_argument("--json", action="store_true", help="print the messages as JSON")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="wait up to SECONDS for a sidecar that is not up yet (default: "
                        "$RDMA_SIDECAR_WAIT_FOR_READY, else 0)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="seconds each call may take (default: %(default)s)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("info", help="identity, version, listeners, backends, NATS, signing, GPUs")
    sub.add_parser("regions", help="the regions the sidecar holds")
    sub.add_parser("ops", help="the operations the sidecar holds")
    a = p.parse_args(argv)
    try:
        c = Connector(a.address, rpc_timeout=a.timeout, wait_for_ready=a.wait)
    except ValueError as e:
        p.error(str(e))
    try:
        {"info": _info, "regions": _regions, "ops": _ops}[a.command](c, a.json)
    except errors.SidecarError as e:
        print("rdma_sidecar: %s: %s: %s" % (c.address, e.code.name, e.message), file=sys.stderr)
        return 1
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
