/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metadata_runs.c: encode and decode the RemoteRun form of metadata version 2 (see
 * metadata_runs.h and the proto). A run is a maximal stretch of consecutive descriptors with the
 * same length, device kind and rkey; its addresses are written as base + stride * k with stride
 * the greatest common divisor of (address - lowest address), and k either implicit (a strided
 * run: k = i), the k of an earlier run (the same block ids in every layer tensor), plain indices
 * or zig-zag deltas, whichever packs smaller. TCP metadata has no addresses, so a whole list of
 * equal blocks is one run. Pure functions; run on the caller's thread (gRPC workers, NATS thread).
 */
#include "metadata_runs.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef RdmaSidecar__V1__RemoteRun pb_run;

static uint64_t gcd(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static bool same_run(const struct sc_meta_desc *a, const struct sc_meta_desc *b)
{
	return a->length == b->length && a->device_kind == b->device_kind && a->rkey == b->rkey;
}

void sc_meta_runs_free(struct sc_meta_runs *r)
{
	free(r->runs);
	free(r->ptrs);
	free(r->k);
	free(r->deltas);
	memset(r, 0, sizeof(*r));
}

int sc_meta_runs_encode(const struct sc_meta_desc *d, size_t n, struct sc_meta_runs *out,
			struct sc_err *err)
{
	memset(out, 0, sizeof(*out));
	size_t n_runs = 0;
	for (size_t i = 0; i < n; n_runs++) {
		size_t j = i + 1;
		while (j < n && j - i < UINT32_MAX && same_run(&d[i], &d[j]))
			j++;
		i = j;
	}
	out->runs = calloc(n_runs ? n_runs : 1, sizeof(*out->runs));
	out->ptrs = calloc(n_runs ? n_runs : 1, sizeof(*out->ptrs));
	out->k = calloc(n ? n : 1, sizeof(*out->k));
	out->deltas = calloc(n ? n : 1, sizeof(*out->deltas));
	if (!out->runs || !out->ptrs || !out->k || !out->deltas)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
	size_t last_explicit = SIZE_MAX; /* the last run whose k is written out */
	size_t r = 0;
	for (size_t i = 0; i < n; r++) {
		size_t j = i + 1;
		while (j < n && j - i < UINT32_MAX && same_run(&d[i], &d[j]))
			j++;
		size_t cnt = j - i;
		pb_run *run = &out->runs[r];
		rdma_sidecar__v1__remote_run__init(run);
		out->ptrs[r] = run;
		run->length = d[i].length;
		run->count = (uint32_t)cnt;
		run->device_kind = (RdmaSidecar__V1__DeviceKind)d[i].device_kind;
		run->rkey = d[i].rkey;
		uint64_t base = d[i].remote_addr, g = 0;
		for (size_t t = i; t < j; t++)
			base = d[t].remote_addr < base ? d[t].remote_addr : base;
		for (size_t t = i; t < j; t++)
			g = gcd(g, d[t].remote_addr - base);
		run->base_addr = base;
		run->stride = g;
		uint64_t *k = &out->k[i];
		bool implicit = true;
		for (size_t t = 0; t < cnt; t++) {
			k[t] = g ? (d[i + t].remote_addr - base) / g : 0;
			implicit &= g ? k[t] == t : true;
		}
		if (implicit) { /* k = i, or all addresses equal (stride 0) */
			i = j;
			continue;
		}
		if (last_explicit != SIZE_MAX && out->runs[last_explicit].count == cnt) {
			size_t at =
			    (size_t)(out->ptrs[last_explicit]->indices
					 ? out->ptrs[last_explicit]->indices - out->k
					 : out->ptrs[last_explicit]->index_deltas - out->deltas);
			if (memcmp(&out->k[at], k, cnt * sizeof(*k)) == 0) {
				run->same_indices_as = (uint32_t)(last_explicit + 1);
				i = j;
				continue;
			}
		}
		size_t plain = 0, delta = 0;
		int64_t *dl = &out->deltas[i];
		bool small = true; /* deltas fit int64 */
		for (size_t t = 0; t < cnt; t++)
			small &= k[t] < ((uint64_t)1 << 62);
		for (size_t t = 0; small && t < cnt; t++) {
			dl[t] = (int64_t)(k[t] - (t ? k[t - 1] : 0));
			uint64_t zz = ((uint64_t)dl[t] << 1) ^ (uint64_t)(dl[t] >> 63);
			plain += varint_len(k[t]);
			delta += varint_len(zz);
		}
		if (small && delta < plain) {
			run->index_deltas = dl;
			run->n_index_deltas = cnt;
		} else {
			run->indices = k;
			run->n_indices = cnt;
		}
		last_explicit = r;
		i = j;
	}
	out->n = n_runs;
	return 0;
}

int sc_meta_runs_decode(RdmaSidecar__V1__RemoteRun *const *runs, size_t n, size_t max,
			struct sc_meta_desc **out, size_t *n_out, struct sc_err *err)
{
	*out = NULL;
	*n_out = 0;
	uint64_t total = 0, bytes = 0;
	for (size_t r = 0; r < n; r++) {
		const pb_run *run = runs[r];
		if (run->count == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata run %zu has count 0",
					  r);
		if (run->length == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata run %zu has length 0",
					  r);
		if ((int)run->device_kind < SC_DEVICE_UNSPECIFIED ||
		    (int)run->device_kind > SC_DEVICE_CUDA)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata run %zu has unknown device kind %d", r,
					  (int)run->device_kind);
		int forms =
		    (run->n_indices > 0) + (run->n_index_deltas > 0) + (run->same_indices_as > 0);
		if (forms > 1)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata run %zu sets more than one of indices, "
					  "index_deltas and same_indices_as",
					  r);
		if ((run->n_indices && run->n_indices != run->count) ||
		    (run->n_index_deltas && run->n_index_deltas != run->count))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata run %zu has %zu indices for count %u", r,
					  run->n_indices ? run->n_indices : run->n_index_deltas,
					  run->count);
		if (run->same_indices_as && (run->same_indices_as > r ||
					     runs[run->same_indices_as - 1]->count != run->count))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "metadata run %zu: same_indices_as %u is not an earlier run "
			    "of the same count",
			    r, run->same_indices_as);
		if (run->length > UINT64_MAX / run->count ||
		    run->length * run->count > UINT64_MAX - bytes)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata descriptor lengths overflow 64 bits at run %zu",
					  r);
		bytes += run->length * run->count;
		total += run->count;
		if (total > max)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata has more than %zu descriptors, at most %zu are "
					  "allowed",
					  max, max);
	}
	if (total == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has no descriptors: nothing to transfer");
	struct sc_meta_desc *d = calloc((size_t)total, sizeof(*d));
	uint64_t *k = calloc((size_t)total, sizeof(*k));
	size_t *start = calloc(n, sizeof(*start));
	if (!d || !k || !start) {
		free(d);
		free(k);
		free(start);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory verifying metadata");
	}
	size_t at = 0;
	for (size_t r = 0; r < n; r++) {
		const pb_run *run = runs[r];
		start[r] = at;
		uint64_t sum = 0;
		for (size_t t = 0; t < run->count; t++) {
			uint64_t kt = t;
			if (run->n_indices) {
				kt = run->indices[t];
			} else if (run->n_index_deltas) {
				int64_t dl = run->index_deltas[t];
				if ((dl < 0 && (uint64_t)(-(dl + 1)) >= sum) ||
				    (dl > 0 && (uint64_t)dl > UINT64_MAX - sum)) {
					sc_err_set(err, SC_INVALID_ARGUMENT,
						   "metadata run %zu: index_deltas leave 0..2^64",
						   r);
					goto fail;
				}
				sum += (uint64_t)dl;
				kt = sum;
			} else if (run->same_indices_as) {
				kt = k[start[run->same_indices_as - 1] + t];
			}
			if (run->stride && kt > (UINT64_MAX - run->base_addr) / run->stride) {
				sc_err_set(err, SC_INVALID_ARGUMENT,
					   "metadata run %zu: address of descriptor %zu overflows",
					   r, t);
				goto fail;
			}
			k[at] = kt;
			d[at].length = run->length;
			d[at].device_kind = (enum sc_device_kind)run->device_kind;
			d[at].remote_addr = run->base_addr + run->stride * kt;
			d[at].rkey = run->rkey;
			at++;
		}
	}
	free(k);
	free(start);
	*out = d;
	*n_out = at;
	return 0;
fail:
	free(d);
	free(k);
	free(start);
	return -1;
}
