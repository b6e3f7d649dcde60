/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/runs.c: encode and decode the RemoteRun form of metadata version 2 (see
 * meta/runs.h and the proto). A run is a maximal stretch of consecutive descriptors with the
 * same length, device kind and rkey; its addresses are written as base + stride * k with stride
 * the greatest common divisor of (address - lowest address), and k either implicit (a strided
 * run: k = i), the k of an earlier run (the same block ids in every layer tensor), plain indices
 * or zig-zag deltas, whichever packs smaller. TCP metadata has no addresses, so a whole list of
 * equal blocks is one run. Pure functions; run on the caller's thread (gRPC workers, NATS thread).
 */
#include "meta/runs.h"

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

/* Descriptors [i, j) that one run will carry. */
struct seg {
	size_t i, j;
};

struct segs {
	struct seg *v;
	size_t n, cap;
};

static int seg_push(struct segs *s, size_t i, size_t j)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct seg *v = realloc(s->v, cap * sizeof(*v));
		if (!v)
			return -1;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct seg){i, j};
	return 0;
}

/* How many descriptors from p (before j) have addresses base + stride * t for one stride
 * (strictly increasing, or all equal): the stretch an implicit run can carry. */
static size_t ap_len(const struct sc_meta_desc *d, size_t p, size_t j)
{
	if (p + 1 >= j || d[p + 1].remote_addr < d[p].remote_addr)
		return 1;
	uint64_t step = d[p + 1].remote_addr - d[p].remote_addr;
	size_t t = p + 1;
	while (t + 1 < j && t + 1 - p < UINT32_MAX &&
	       d[t + 1].remote_addr >= d[t].remote_addr &&
	       d[t + 1].remote_addr - d[t].remote_addr == step)
		t++;
	return t + 1 - p;
}

/* Cut a group of descriptors with one length, device kind and rkey into runs: every stretch of
 * at least MIN_STRIDED equally spaced addresses is a run of its own (written with no indices),
 * and what lies between such stretches is one run with indices. */
#define MIN_STRIDED 32
static int segment_group(const struct sc_meta_desc *d, size_t i, size_t j, struct segs *out)
{
	size_t p = i, pending = i; /* [pending, p): indices run under way */
	while (p < j) {
		size_t len = ap_len(d, p, j);
		if (len >= MIN_STRIDED || (p == i && len == j - i)) {
			if (pending < p && seg_push(out, pending, p) != 0)
				return -1;
			if (seg_push(out, p, p + len) != 0)
				return -1;
			p += len;
			pending = p;
		} else if (p + len >= j) {
			p = j; /* a shorter stretch from any later p ends at j too */
		} else {
			/* Stretches from p + 1 .. p + len - 2 end where this one does: skip them. */
			p += len > 2 ? len - 1 : 1;
		}
		if (p - pending >= UINT32_MAX - MIN_STRIDED) {
			if (seg_push(out, pending, p) != 0)
				return -1;
			pending = p;
		}
	}
	if (pending < j && seg_push(out, pending, j) != 0)
		return -1;
	return 0;
}

/* Earlier runs with written indices, found by (count, hash of the indices). */
struct kindex {
	size_t *slot; /* run index + 1; 0 is empty */
	uint64_t *hash;
	size_t mask;
};

static uint64_t hash_k(const uint64_t *k, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull ^ n;
	for (size_t t = 0; t < n; t++)
		h = (h ^ k[t]) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

int sc_meta_runs_encode(const struct sc_meta_desc *d, size_t n, struct sc_meta_runs *out,
			struct sc_err *err)
{
	memset(out, 0, sizeof(*out));
	struct segs segs = {0};
	struct kindex ix = {0};
	int rc = -1;
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		while (j < n && !d[j].run_start && same_run(&d[i], &d[j]))
			j++;
		if (segment_group(d, i, j, &segs) != 0)
			goto oom;
		i = j;
	}
	size_t cap = 16;
	while (cap < 2 * segs.n)
		cap *= 2;
	ix.slot = calloc(cap, sizeof(*ix.slot));
	ix.hash = calloc(cap, sizeof(*ix.hash));
	ix.mask = cap - 1;
	out->runs = calloc(segs.n ? segs.n : 1, sizeof(*out->runs));
	out->ptrs = calloc(segs.n ? segs.n : 1, sizeof(*out->ptrs));
	out->k = calloc(n ? n : 1, sizeof(*out->k));
	out->deltas = calloc(n ? n : 1, sizeof(*out->deltas));
	if (!ix.slot || !ix.hash || !out->runs || !out->ptrs || !out->k || !out->deltas)
		goto oom;
	for (size_t r = 0; r < segs.n; r++) {
		size_t i = segs.v[r].i, j = segs.v[r].j, cnt = j - i;
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
		if (implicit) /* k = i, or all addresses equal (stride 0) */
			continue;
		uint64_t h = hash_k(k, cnt);
		size_t at = h & ix.mask;
		for (; ix.slot[at]; at = (at + 1) & ix.mask) {
			const pb_run *e = out->ptrs[ix.slot[at] - 1];
			const uint64_t *ek = e->indices ? e->indices : &out->k[e->index_deltas - out->deltas];
			if (ix.hash[at] == h && e->count == cnt &&
			    memcmp(ek, k, cnt * sizeof(*k)) == 0)
				break;
		}
		if (ix.slot[at]) {
			run->same_indices_as = (uint32_t)ix.slot[at];
			continue;
		}
		ix.slot[at] = r + 1;
		ix.hash[at] = h;
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
	}
	out->n = segs.n;
	rc = 0;
	goto out;
oom:
	sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
out:
	free(segs.v);
	free(ix.slot);
	free(ix.hash);
	return rc;
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
			d[at].run_start = t == 0;
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
