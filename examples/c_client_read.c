/* SPDX-License-Identifier: Apache-2.0 */
/*
 * c_client_read.c: the smallest worker in C. Pulls the bytes of a remote readable into a fresh
 * region of the local sidecar, maps the region and prints how many bytes arrived and their FNV-1a
 * hash. Single-threaded.
 *
 *   c_client_read [unix:/path/sidecar.sock | host:port] rsm1.METADATA
 *
 * Build against an installed library: cc c_client_read.c $(pkg-config --cflags --libs
 * rdma-sidecar-client)
 */
#include <rdma_sidecar/client.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s SIDECAR_ADDR rsm1.METADATA\n", argv[0]);
		return 2;
	}
	rsc_status st;
	rsc_client *c = NULL;
	rsc_region region = {0};
	rsc_operation op = {0};
	uint64_t *lengths = NULL, total = 0;
	size_t n = 0;
	void *mem = NULL;
	int rc = 1;

	rsc_options opts = {.target = argv[1]};
	if (rsc_client_create(&opts, &c, &st) != RSC_OK)
		goto fail;
	/* What to allocate: the lengths the metadata advertises, laid out back to back. */
	if (rsc_metadata_lengths(argv[2], &lengths, &n, NULL, &st) != RSC_OK)
		goto fail;
	for (size_t i = 0; i < n; i++)
		total += lengths[i];
	if (rsc_region_create(c, total, "c_client_read", &region, &st) != RSC_OK)
		goto fail;
	rsc_descriptor *d = calloc(n ? n : 1, sizeof(*d));
	if (!d)
		goto cleanup;
	for (size_t i = 0, off = 0; i < n; off += lengths[i], i++)
		d[i] = (rsc_descriptor){
		    .region_id = region.region_id, .offset = off, .length = lengths[i]};
	rsc_transfer_args a = {
	    .metadata = argv[2], .descriptors = d, .n_descriptors = n, .timeout_ms = 30000};
	int r = rsc_read(c, &a, 30000, &op, &st);
	free(d);
	if (r != RSC_OK)
		goto fail;
	if (op.status != RSC_STATUS_COMPLETE) {
		fprintf(stderr, "read %s: %s\n", rsc_op_status_name(op.status), op.error_message);
		goto cleanup;
	}
	if (rsc_region_map(&region, &mem, &st) != RSC_OK)
		goto fail;
	uint64_t h = 1469598103934665603ull;
	for (uint64_t i = 0; i < total; i++)
		h = (h ^ ((const unsigned char *)mem)[i]) * 1099511628211ull;
	printf("read %" PRIu64 " bytes over %s, fnv1a %016" PRIx64 "\n", total,
	       rsc_backend_name(op.backend), h);
	rc = 0;
	goto cleanup;
fail:
	fprintf(stderr, "error: %s: %s\n", rsc_code_name(st.code), st.message);
cleanup:
	rsc_region_unmap(mem, region.size);
	if (op.operation_id)
		rsc_operation_release(c, op.operation_id, NULL);
	if (region.region_id)
		rsc_region_deregister(c, region.region_id, 1, NULL);
	rsc_operation_clear(&op);
	rsc_region_clear(&region);
	free(lengths);
	rsc_client_destroy(c);
	return rc;
}
