/* SPDX-License-Identifier: Apache-2.0 */
/*
 * desc_lists.c: a request's descriptor list, plain and compact (BlockList, StridedRun in
 * DescriptorSet), expanded in order into the engine's (region, offset, length) array. The count is
 * computed and checked against --max-descriptors before anything is allocated, so a small request
 * cannot make the sidecar allocate more than max-descriptors entries; every compact form is
 * checked (zero counts and lengths, empty region lists, offsets overflowing 64 bits) with the set's
 * index in the message. Region existence and bounds are the engine's checks (sc_region_resolve).
 * Pure; runs on gRPC worker threads.
 */
#include "handlers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef RdmaSidecar__V1__DescriptorSet pb_set;
typedef RdmaSidecar__V1__BlockList pb_blocks;
typedef RdmaSidecar__V1__StridedRun pb_run;

static int region_ok(const char *id, const char *what, size_t set, struct sc_err *err)
{
	if (!id || !id[0] || strlen(id) >= SC_ID_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor_sets[%zu]: %s must be 1..%d characters", set, what,
				  SC_ID_MAX - 1);
	return 0;
}

/* How many descriptors set i expands to; checks its shape. */
static int set_count(const pb_set *s, size_t i, uint64_t *count, struct sc_err *err)
{
	switch (s->set_case) {
	case RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_DESCRIPTOR:
		if (region_ok(s->descriptor->region_id, "descriptor.region_id", i, err) != 0)
			return -1;
		*count = 1;
		return 0;
	case RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_BLOCK_LIST: {
		const pb_blocks *b = s->block_list;
		if (b->n_region_ids == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: block_list names no region_ids",
					  i);
		for (size_t r = 0; r < b->n_region_ids; r++) {
			if (region_ok(b->region_ids[r], "block_list.region_ids[]", i, err) != 0)
				return -1;
		}
		if (b->block_length == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: block_list.block_length is 0", i);
		if ((b->n_offsets == 0) == (b->n_block_ids == 0))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: block_list needs exactly one of "
					  "offsets and block_ids (it has %s)",
					  i, b->n_offsets ? "both" : "neither");
		if (b->n_offsets && (b->block_stride || b->base_offset))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "descriptor_sets[%zu]: block_stride and base_offset go with "
			    "block_ids, not offsets",
			    i);
		size_t per = b->n_offsets ? b->n_offsets : b->n_block_ids;
		if (per > UINT64_MAX / b->n_region_ids)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: block_list too large", i);
		*count = (uint64_t)per * b->n_region_ids;
		return 0;
	}
	case RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_STRIDED_RUN: {
		const pb_run *r = s->strided_run;
		if (region_ok(r->region_id, "strided_run.region_id", i, err) != 0)
			return -1;
		if (r->count == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: strided_run.count is 0", i);
		if (r->length == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor_sets[%zu]: strided_run.length is 0", i);
		if (r->count > 1 && r->stride == 0)
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "descriptor_sets[%zu]: strided_run.stride is 0 with count "
			    "%u: give a stride, or one descriptor",
			    i, r->count);
		if (r->count > 1 && r->stride > (UINT64_MAX - r->offset) / (r->count - 1))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "descriptor_sets[%zu]: strided_run offsets overflow 64 bits", i);
		*count = r->count;
		return 0;
	}
	default:
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor_sets[%zu] is empty: set descriptor, block_list or "
				  "strided_run",
				  i);
	}
}

static void put(struct sc_desc *d, const char *region, uint64_t offset, uint64_t length)
{
	memcpy(d->region_id, region, strlen(region) + 1);
	d->offset = offset;
	d->length = length;
}

/* Expand block list i into d; checks each offset's arithmetic. */
static int expand_blocks(const pb_blocks *b, size_t i, struct sc_desc *d, struct sc_err *err)
{
	uint64_t stride = b->block_stride ? b->block_stride : b->block_length;
	size_t per = b->n_offsets ? b->n_offsets : b->n_block_ids;
	for (size_t k = 0; k < per; k++) {
		uint64_t off;
		if (b->n_offsets) {
			off = b->offsets[k];
		} else {
			uint64_t id = b->block_ids[k];
			if (id && stride > (UINT64_MAX - b->base_offset) / id)
				return sc_err_set(err, SC_INVALID_ARGUMENT,
						  "descriptor_sets[%zu]: block_ids[%zu] = %" PRIu64
						  " times block_stride %" PRIu64
						  " overflows 64 bits",
						  i, k, id, stride);
			off = b->base_offset + id * stride;
		}
		for (size_t r = 0; r < b->n_region_ids; r++)
			put(&d[r * per + k], b->region_ids[r], off, b->block_length);
	}
	return 0;
}

int sc_pb_desc_list(RdmaSidecar__V1__Descriptor **plain, size_t n_plain,
		    RdmaSidecar__V1__DescriptorSet **sets, size_t n_sets, uint32_t max,
		    struct sc_desc **out, size_t *n_out, struct sc_err *err)
{
	*out = NULL;
	*n_out = 0;
	uint64_t total = n_plain;
	for (size_t i = 0; i < n_sets; i++) {
		uint64_t c = 0;
		if (set_count(sets[i], i, &c, err) != 0)
			return -1;
		if (c > UINT64_MAX - total)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "descriptor count overflows");
		total += c;
	}
	if (total > max)
		return sc_err_set(
		    err, SC_RESOURCE_EXHAUSTED,
		    "%" PRIu64 " descriptors: at most %u per operation "
		    "(--max-descriptors); merge adjacent ranges or split the transfer",
		    total, max);
	struct sc_desc *d = NULL;
	if (sc_pb_descs(plain, n_plain, &d, err) != 0)
		return -1;
	if (n_sets == 0) {
		*out = d;
		*n_out = n_plain;
		return 0;
	}
	struct sc_desc *all = realloc(d, (size_t)(total ? total : 1) * sizeof(*d));
	if (!all) {
		free(d);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	size_t at = n_plain;
	for (size_t i = 0; i < n_sets; i++) {
		const pb_set *s = sets[i];
		uint64_t c = 0;
		(void)set_count(s, i, &c, err); /* checked above */
		if (s->set_case == RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_DESCRIPTOR) {
			put(&all[at], s->descriptor->region_id, s->descriptor->offset,
			    s->descriptor->length);
		} else if (s->set_case == RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_BLOCK_LIST) {
			if (expand_blocks(s->block_list, i, &all[at], err) != 0) {
				free(all);
				return -1;
			}
		} else {
			const pb_run *r = s->strided_run;
			for (uint32_t k = 0; k < r->count; k++)
				put(&all[at + k], r->region_id, r->offset + (uint64_t)k * r->stride,
				    r->length);
		}
		at += (size_t)c;
	}
	*out = all;
	*n_out = at;
	return 0;
}
