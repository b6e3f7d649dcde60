#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two Ray actors hand a tensor to each other through their sidecars (Ray Direct Transport with
the rdma_sidecar transport): the producer returns a tensor, the consumer receives it without Ray's
object store, every byte compared. Runnable where Ray (>= the version with
ray.experimental.register_tensor_transport) and the rdma_sidecar package are installed, with a
sidecar beside each actor ($RDMA_SIDECAR_ADDR, or the default unix socket), e.g. on one machine:

    build/rdma-sidecar --key-file keys --grpc-listen unix:/tmp/rdma-sidecar/sidecar.sock &
    python3 examples/ray_transport.py --size 64MiB [--device cuda]

Not run by the project's tests (Ray is not installable there): test_ray_transport.py drives the
same adapter the way Ray's runtime calls it."""
import argparse
import hashlib

import ray
import torch

import rdma_sidecar.ray


def parse_size(text):
    units = {"": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}
    num = text.upper().rstrip("IB").rstrip("KMG")
    return int(num) * units[text.upper()[len(num):]]


@ray.remote
class Producer:
    def __init__(self):
        rdma_sidecar.ray.register()  # every process that uses the transport registers it

    @ray.method(tensor_transport=rdma_sidecar.ray.NAME)
    def make(self, nbytes, device):
        t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
        self.digest = hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()
        return t

    def sha(self):
        return self.digest


@ray.remote
class Consumer:
    def __init__(self):
        rdma_sidecar.ray.register()

    def digest(self, t):
        return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest(), str(t.device), t.numel()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="64MiB", help="bytes to move, e.g. 4KiB, 64MiB (default 64MiB)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    a = p.parse_args()
    rdma_sidecar.ray.register()  # before actors are created
    producer, consumer = Producer.remote(), Consumer.remote()
    ref = producer.make.remote(parse_size(a.size), a.device)
    got, device, n = ray.get(consumer.digest.remote(ref))
    want = ray.get(producer.sha.remote())
    print("moved %d bytes (%s) through rdma-sidecar: %s" % (n, device, "match" if got == want else "MISMATCH"))
    raise SystemExit(0 if got == want else 1)


if __name__ == "__main__":
    main()
