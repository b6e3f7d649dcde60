/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/access.c: memory registration of the libfabric backend, as ib/access.c does it for ibverbs.
 *
 *   regions  one local MR per rail (FI_READ | FI_WRITE), made once per region, used as the local
 *            descriptor of every RMA when the provider asks for one (FI_MR_LOCAL / FI_MR_HMEM);
 *   grants   remote access exists only while a passive operation is live: per (operation,
 *            region) one MR over the span of its descriptors in that region, on every rail, with
 *            FI_REMOTE_READ (a READABLE) or FI_REMOTE_WRITE (a WRITABLE) only, under a fresh key
 *            (chosen here, or the provider's with FI_MR_PROV_KEY). The keys go into the metadata;
 *            revoke closes the MRs (fi_close), after which the provider refuses the old key.
 *
 * mr_mode bits: FI_MR_LOCAL / FI_MR_HMEM (local descriptors passed), FI_MR_VIRT_ADDR (RMA
 * addresses are virtual addresses, else offsets from the MR's start: OfiEndpoint.virt_addr),
 * FI_MR_PROV_KEY (fi_mr_key), FI_MR_ALLOCATED (regions are mapped memory: always so here),
 * FI_MR_ENDPOINT (fi_mr_bind to the endpoint, fi_mr_enable), FI_MR_RAW (refused at start).
 *
 * Threads: gRPC workers and the engine's threads, under the engine lock for expose/revoke.
 * Owns: struct ofi_region (per region) and struct ofi_grant (per exposure).
 */
#include "ofi/internal.h"

#include "base/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ofi_region {
	uint8_t *addr;
	uint64_t len;
	int gpu;
	size_t n_rails;
	struct fid_mr *mr[OFI_MAX_RAILS];
	void *desc[OFI_MAX_RAILS];
};

struct ofi_grant {
	size_t n_mrs; /* n_spans * n_rails */
	struct fid_mr **mrs;
};

static int reg(struct ofi_backend *ob, struct ofi_rail *rl, void *addr, uint64_t len, int gpu,
	       uint64_t access, uint64_t key, struct fid_mr **out, char *why, size_t cap)
{
	struct iovec iov = {.iov_base = addr, .iov_len = len};
	struct fi_mr_attr attr = {.mr_iov = &iov,
				  .iov_count = 1,
				  .access = access,
				  .requested_key = key,
				  .iface = FI_HMEM_SYSTEM};
	if (gpu != SC_GPU_HOST) {
		attr.iface = FI_HMEM_CUDA;
		attr.device.cuda = gpu;
	}
	uint64_t flags = 0;
	int rc = fi_mr_regattr(rl->domain, &attr, flags, out);
	if (rc) {
		snprintf(why, cap, "fi_mr_regattr of %" PRIu64 " bytes on %s (%s): %s", len,
			 rl->info->domain_attr->name, gpu == SC_GPU_HOST ? "host" : "FI_HMEM_CUDA",
			 ofi_fn.strerror(-rc));
		return -1;
	}
	if (rl->mr_mode & FI_MR_ENDPOINT) {
		if ((rc = fi_mr_bind(*out, &rl->ep->fid, 0)) || (rc = fi_mr_enable(*out))) {
			snprintf(why, cap, "binding an MR to the endpoint of %s: %s",
				 rl->info->domain_attr->name, ofi_fn.strerror(-rc));
			fi_close(&(*out)->fid);
			*out = NULL;
			return -1;
		}
	}
	(void)ob;
	return 0;
}

int ofi_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		 struct sc_err *err)
{
	struct ofi_backend *ob = to_ofi(b);
	if (gpu != SC_GPU_HOST && !ob->hmem)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "%s", ob->hmem_reason);
	struct ofi_region *r = calloc(1, sizeof(*r));
	if (!r)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	r->addr = addr;
	r->len = len;
	r->gpu = gpu;
	for (size_t i = 0; i < ob->n_rails; i++) {
		struct ofi_rail *rl = &ob->rails[i];
		char why[256];
		uint64_t key = atomic_fetch_add(&ob->next_key, 1);
		if (reg(ob, rl, addr, len, gpu, FI_READ | FI_WRITE, key, &r->mr[i], why,
			sizeof(why)) != 0) {
			r->n_rails = i;
			ofi_deregister(b, r);
			return sc_err_set(err,
					  gpu == SC_GPU_HOST ? SC_INTERNAL : SC_FAILED_PRECONDITION,
					  "libfabric: %s", why);
		}
		r->desc[i] = fi_mr_desc(r->mr[i]);
		r->n_rails = i + 1;
	}
	*handle = r;
	return 0;
}

void ofi_deregister(struct sc_backend *b, void *handle)
{
	(void)b;
	struct ofi_region *r = handle;
	if (!r)
		return;
	for (size_t i = 0; i < r->n_rails; i++)
		if (r->mr[i])
			fi_close(&r->mr[i]->fid);
	free(r);
}

void *ofi_region_desc(void *region_handle, size_t rail)
{
	struct ofi_region *r = region_handle;
	return r && rail < r->n_rails ? r->desc[rail] : NULL;
}

/* ---- grants ------------------------------------------------------------------------------------
 */

struct span {
	struct ofi_region *r;
	uint64_t lo, hi; /* addresses */
};

static int span_cmp(const void *a, const void *b)
{
	const struct sc_ofi_key *x = a, *y = b;
	return x->base < y->base ? -1 : x->base > y->base;
}

void ofi_revoke(struct sc_backend *b, void *handle)
{
	struct ofi_backend *ob = to_ofi(b);
	struct ofi_grant *g = handle;
	if (!g)
		return;
	for (size_t i = 0; i < g->n_mrs; i++)
		if (g->mrs[i]) {
			fi_close(&g->mrs[i]->fid);
			atomic_fetch_add(&ob->base.keys_revoked, 1);
		}
	free(g->mrs);
	free(g);
}

int ofi_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs, const int *gpus,
	       void *const *region_handles, void **handle, struct sc_err *err)
{
	struct ofi_backend *ob = to_ofi(b);
	/* The spans: per region, from its first exposed byte to its last. Few regions per
	 * operation (KV: one per layer tensor), so a linear search is enough. */
	size_t n_sp = 0, cap_sp = 8;
	struct span *sp = calloc(cap_sp, sizeof(*sp));
	if (!sp)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	for (size_t i = 0; i < md->n_descs; i++) {
		struct ofi_region *r = region_handles[i];
		if (!r && gpus[i] != SC_GPU_HOST && !ob->hmem) {
			free(sp);
			return sc_err_set(err, SC_FAILED_PRECONDITION, "%s", ob->hmem_reason);
		}
		if (!r) {
			free(sp);
			return sc_err_set(
			    err, SC_FAILED_PRECONDITION,
			    "libfabric: descriptor %zu's region is not registered with "
			    "libfabric",
			    i);
		}
		uint64_t lo = (uint64_t)(uintptr_t)addrs[i], hi = lo + md->descs[i].length;
		size_t s = 0;
		while (s < n_sp && sp[s].r != r)
			s++;
		if (s == n_sp) {
			if (n_sp == cap_sp) {
				struct span *n = realloc(sp, 2 * cap_sp * sizeof(*sp));
				if (!n) {
					free(sp);
					return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
							  "out of memory");
				}
				sp = n;
				cap_sp *= 2;
			}
			sp[n_sp++] = (struct span){r, lo, hi};
		} else {
			if (lo < sp[s].lo)
				sp[s].lo = lo;
			if (hi > sp[s].hi)
				sp[s].hi = hi;
		}
		/* The RMA address of a descriptor is its virtual address (ibverbs writes the same).
		 */
		md->descs[i].remote_addr = lo;
	}
	if (n_sp > SC_OFI_MAX_KEYS) {
		free(sp);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "libfabric: an operation over %zu regions; at most %d", n_sp,
				  SC_OFI_MAX_KEYS);
	}
	struct ofi_grant *g = calloc(1, sizeof(*g));
	struct sc_ofi_key *keys = calloc(n_sp, sizeof(*keys));
	uint64_t *rail_keys =
	    ob->n_rails > 1 ? calloc((ob->n_rails - 1) * n_sp, sizeof(uint64_t)) : NULL;
	if (g)
		g->mrs = calloc(n_sp * ob->n_rails, sizeof(*g->mrs));
	if (!g || !g->mrs || !keys || (ob->n_rails > 1 && !rail_keys)) {
		if (g)
			free(g->mrs);
		free(g);
		free(keys);
		free(rail_keys);
		free(sp);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	g->n_mrs = n_sp * ob->n_rails;
	uint64_t access = md->kind == SC_OP_READABLE ? FI_REMOTE_READ : FI_REMOTE_WRITE;
	/* Sorted by base so the active side finds a descriptor's key by binary search. */
	for (size_t s = 0; s < n_sp; s++) {
		keys[s].base = sp[s].lo;
		keys[s].length = sp[s].hi - sp[s].lo;
		keys[s].key = s; /* the span's index, until sorted */
	}
	qsort(keys, n_sp, sizeof(*keys), span_cmp);
	for (size_t k = 0; k < n_sp; k++) {
		const struct span *s = &sp[keys[k].key];
		for (size_t i = 0; i < ob->n_rails; i++) {
			struct ofi_rail *rl = &ob->rails[i];
			char why[256];
			uint64_t want = atomic_fetch_add(&ob->next_key, 1);
			if (rl->key_size && rl->key_size < 8)
				want &= (1ull << (8 * rl->key_size)) - 1;
			struct fid_mr **mr = &g->mrs[k * ob->n_rails + i];
			if (reg(ob, rl, (void *)(uintptr_t)s->lo, s->hi - s->lo, s->r->gpu, access,
				want, mr, why, sizeof(why)) != 0) {
				ofi_revoke(b, g);
				free(keys);
				free(rail_keys);
				free(sp);
				return sc_err_set(err, SC_INTERNAL, "libfabric: %s", why);
			}
			atomic_fetch_add(&ob->base.keys_granted, 1);
			uint64_t key = fi_mr_key(*mr);
			if (i == 0)
				keys[k].key = key;
			else
				rail_keys[(i - 1) * n_sp + k] = key;
		}
	}
	free(sp);
	free(md->ofi.keys);
	free(md->ofi.rail_keys);
	md->ofi.keys = keys;
	md->ofi.rail_keys = rail_keys;
	md->ofi.n_keys = n_sp;
	md->ofi.virt_addr = (ob->rails[0].mr_mode & FI_MR_VIRT_ADDR) != 0;
	*handle = g;
	return 0;
}
