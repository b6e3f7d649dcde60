#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 5: every resource a worker can create has a limit (RESOURCE_EXHAUSTED naming the
flag, nothing created past it, room again once something is freed), and the List RPCs page."""
import grpc

from harness import SidecarTest, desc, main, pb

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaTest(SidecarTest):
    def regions(self, s):
        return list(s.stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions)

    def test_max_regions(self):
        s = self.sidecar("a", extra=["--max-regions", "3"])
        made = [s.create_region(4096) for _ in range(3)]
        self.assertRpcError(EXHAUSTED, s.create_region, 4096, contains="--max-regions 3 reached")
        self.assertRpcError(EXHAUSTED, s.stub.RegisterRegion, pb.RegisterRegionRequest(
            host_file=pb.HostFileSource(path=made[0].path, offset=0, size=4096)), timeout=10,
            contains="--max-regions")
        self.assertEqual(len(self.regions(s)), 3)
        s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=made[0].region_id), timeout=10)
        s.create_region(4096)
        self.assertEqual(len(self.regions(s)), 3)

    def test_max_total_region_bytes(self):
        s = self.sidecar("a", extra=["--max-total-region-bytes", "1MiB"])
        r = s.create_region(600 << 10)
        e = self.assertRpcError(EXHAUSTED, s.create_region, 600 << 10,
                                contains="--max-total-region-bytes 1048576 reached")
        self.assertIn("614400 bytes in regions", e.details())
        self.assertRpcError(EXHAUSTED, s.create_region, 2 << 20, contains="--max-total-region-bytes")
        self.assertEqual(len(self.regions(s)), 1)
        s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)
        s.create_region(1 << 20)

    def test_max_operations(self):
        s = self.sidecar("a", extra=["--max-operations", "5"])
        r = s.create_region(4096)
        ops = [s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]), timeout=10)
               for _ in range(5)]
        self.assertRpcError(EXHAUSTED, s.stub.CreateReadable,
                            pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]), timeout=10,
                            contains="--max-operations 5 reached")
        self.assertRpcError(EXHAUSTED, s.stub.BeginRead, pb.BeginTransferRequest(
            metadata=ops[0].metadata, descriptors=[desc(r, 100, 16)]), timeout=10,
            contains="--max-operations")
        # Retained (terminal) operations count too: cancel is not enough, release frees the slot.
        s.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ops[0].operation_id), timeout=10)
        self.assertRpcError(EXHAUSTED, s.stub.CreateReadable,
                            pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]), timeout=10,
                            contains="--max-operations")
        s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=ops[0].operation_id), timeout=10)
        s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]), timeout=10)
        self.assertEqual(len(s.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations), 5)

    def test_max_descriptors(self):
        s = self.sidecar("a", extra=["--max-descriptors", "4"])
        r = s.create_region(4096)
        many = [desc(r, 16 * i, 16) for i in range(5)]
        self.assertRpcError(EXHAUSTED, s.stub.CreateReadable, pb.CreatePassiveRequest(descriptors=many),
                            timeout=10, contains="at most 4 per operation (--max-descriptors)")
        s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=many[:4]), timeout=10)
        self.assertEqual(len(s.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations), 1)


class PagingTest(SidecarTest):
    def page_all(self, call, req_type, field, page_size):
        seen, token, pages = [], "", 0
        while True:
            resp = call(req_type(page_size=page_size, page_token=token), timeout=30)
            items = list(getattr(resp, field))
            seen.extend(items)
            pages += 1
            self.assertLessEqual(len(items), page_size)
            if not resp.next_page_token:
                return seen, pages
            self.assertEqual(len(items), page_size)
            token = resp.next_page_token
            self.assertLess(pages, 100, "paging does not end")

    def test_page_through_1200_regions(self):
        s = self.sidecar("a")
        ids = {s.create_region(4096).region_id for _ in range(1200)}
        self.assertEqual(len(ids), 1200)
        got, pages = self.page_all(s.stub.ListRegions, pb.ListRegionsRequest, "regions", 500)
        got_ids = [r.region_id for r in got]
        self.assertEqual(pages, 3)
        self.assertEqual(len(got_ids), len(set(got_ids)), "a region came twice")
        self.assertEqual(set(got_ids), ids)
        self.assertEqual(got_ids, sorted(got_ids))
        # Default page: 500; more than the maximum asked: at most 5000 (here: all 1200).
        first = s.stub.ListRegions(pb.ListRegionsRequest(), timeout=30)
        self.assertEqual(len(first.regions), 500)
        self.assertEqual(first.next_page_token, first.regions[-1].region_id)
        big = s.stub.ListRegions(pb.ListRegionsRequest(page_size=100000), timeout=30)
        self.assertEqual(len(big.regions), 1200)
        self.assertEqual(big.next_page_token, "")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, s.stub.ListRegions,
                            pb.ListRegionsRequest(page_token="x\n../y"), timeout=10,
                            contains="page_token is not one this sidecar handed out")

    def test_page_operations(self):
        s = self.sidecar("a")
        r = s.create_region(4096)
        ids = {s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 16)]),
                                     timeout=10).operation_id for _ in range(12)}
        got, pages = self.page_all(s.stub.ListOperations, pb.ListOperationsRequest, "operations", 5)
        got_ids = [o.operation_id for o in got]
        self.assertEqual(pages, 3)
        self.assertEqual(sorted(got_ids), sorted(ids))
        self.assertEqual(len(got_ids), len(set(got_ids)))


if __name__ == "__main__":
    main()
