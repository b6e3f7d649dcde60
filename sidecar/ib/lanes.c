/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/lanes.c: the ibverbs backend on several rails. The backend the registry holds (lane 0) opens
 * the first usable rail (ib/backend.c); here it opens every other usable rail as a lane of its
 * own: a struct ib_backend (ib/device.c) with its own device context, PD, CQ, completion thread,
 * workers, QP cache and remote access, never seen by the registry, its rails and counters kept on
 * lane 0's base. With one usable rail nothing here runs and the backend is exactly the one-rail
 * backend. With several, regions and grants go to every lane (below, and ib_lane_mr).
 *
 * Threads: open at create (main thread); start/stop/destroy with the backend's; register,
 * deregister, expose and revoke on engine threads under the engine lock; ib_lane_mr from workers.
 * Owns: the other lanes, the per-region table of their MRs (regs_mu).
 */
#include "ib/internal.h"

#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * With several lanes, lane 0's ops table (ib/backend.c) registers each region on every lane (GPU
 * memory only on the lanes whose rails the topology puts nearest to its GPU, and lane 0; the
 * handle stays lane 0's MR, what the engine hands back as seg->local_mr; the other lanes' MRs are
 * found from it, ib_lane_mr) and grants each passive operation's remote access on every lane. The
 * metadata keeps lane 0 where it always was (the descriptors' rkeys, the `ibverbs` endpoint: older
 * readers use that one rail) and lists the other lanes (IbverbsRail: number, endpoint, and one
 * rkey per group of descriptors, a group being a distinct lane-0 rkey, in order of first
 * appearance: one per exposed region with memory windows). A lane whose registration or grant
 * fails cannot carry that region or operation and is left out of its metadata.
 */

/* One region's MRs on every lane; [0] is the handle the engine holds. */
struct ib_lane_regs {
	struct ibv_mr *mr[SC_MAX_IB_RAILS];
	bool far0; /* lane 0 holds it for the handle only: the topology puts other rails nearer */
	struct ib_lane_regs *next;
};

/* One passive operation's grants on every lane (NULL where the lane has none). */
struct ib_lane_grant {
	void *g[SC_MAX_IB_RAILS];
};

void ib_lanes_open(struct ib_backend *ib, const struct sc_backend_ops *lane_ops,
		   struct ibv_device **list, int n)
{
	for (size_t r = 0; r < ib->base.n_rails && ib->n_lanes < SC_MAX_IB_RAILS; r++) {
		if (!ib->rail_port[r].usable || (int)r == ib->rail)
			continue;
		struct ib_backend *l = ib_backend_new(&ib->base.env, lane_ops);
		if (!l) {
			sc_rail_set_state(&ib->base, r, SC_RAIL_UNUSABLE, "out of memory");
			continue;
		}
		l->primary = ib;
		l->top = &ib->base;
		l->lane = (unsigned)ib->n_lanes;
		l->lanes[0] = NULL;
		l->n_lanes = 0;
		l->rail_port[r] = ib->rail_port[r];
		char why[256];
		if (ib_open_rail(l, list, n, r, why, sizeof(why)) != 0) {
			SC_WARN_KV("ibverbs",
				   (&(struct sc_log_fields){.backend = "ibverbs",
							    .rail = ib->base.rails[r].name}),
				   "rail %s cannot carry data: %s", ib->base.rails[r].name, why);
			sc_rail_set_state(&ib->base, r, SC_RAIL_UNUSABLE, "%s", why);
			ib_backend_free(l);
			continue;
		}
		ib->lanes[ib->n_lanes++] = l;
		SC_INFO("ibverbs", "lane %u on rail %s: %s", l->lane, ib->base.rails[r].name,
			l->base.detail);
	}
	if (ib->n_lanes > 1) { /* said before the (long) remote-access part */
		char *d = ib->base.detail, rest[sizeof(ib->base.detail)];
		char *cut = strstr(d, "; remote access:");
		snprintf(rest, sizeof(rest), "%s", cut ? cut : "");
		if (cut)
			*cut = '\0';
		size_t used = strlen(d);
		snprintf(d + used, sizeof(ib->base.detail) - used,
			 "; %zu rails, transfers from %llu KiB striped in %llu KiB slices%s",
			 ib->n_lanes, (unsigned long long)(ib->stripe_min >> 10),
			 (unsigned long long)(ib->slice_bytes >> 10), rest);
	}
}

int ib_lanes_start(struct ib_backend *ib, struct sc_err *err)
{
	for (size_t k = 1; k < ib->n_lanes; k++) {
		if (ib_xfer_start(ib->lanes[k], err) != 0)
			return sc_err_prefix(err, "ibverbs lane %zu (%s)", k, ib->lanes[k]->dev_name);
	}
	return 0;
}

void ib_lanes_stop(struct ib_backend *ib)
{
	for (size_t k = 1; k < ib->n_lanes; k++) {
		ib_xfer_stop(ib->lanes[k]);
		ib_qp_drop_all(ib->lanes[k]);
	}
}

void ib_lanes_destroy(struct ib_backend *ib)
{
	for (size_t k = 1; k < ib->n_lanes; k++) {
		ib_backend_free(ib->lanes[k]);
		ib->lanes[k] = NULL;
	}
	ib->n_lanes = 1;
	while (ib->regs) {
		struct ib_lane_regs *r = ib->regs;
		ib->regs = r->next;
		free(r);
	}
}

struct ibv_mr *ib_lane_mr(struct ib_backend *ib, const void *mr0, unsigned k)
{
	struct ib_backend *p = ib->primary;
	if (k == 0)
		return (struct ibv_mr *)mr0;
	if (k >= SC_MAX_IB_RAILS || !mr0)
		return NULL;
	struct ibv_mr *out = NULL;
	pthread_mutex_lock(&p->regs_mu);
	for (struct ib_lane_regs *r = p->regs; r; r = r->next) {
		if (r->mr[0] == mr0) {
			out = r->mr[k];
			break;
		}
	}
	pthread_mutex_unlock(&p->regs_mu);
	return out;
}

/* ---- regions --------------------------------------------------------------------------------- */

/* Whether `name` is an entry of the comma list `list`. */
bool ib_lane_far0(struct ib_backend *ib, const void *mr0)
{
	struct ib_backend *p = ib->primary;
	bool far = false;
	pthread_mutex_lock(&p->regs_mu);
	for (struct ib_lane_regs *r = p->regs; r; r = r->next) {
		if (r->mr[0] == mr0) {
			far = r->far0;
			break;
		}
	}
	pthread_mutex_unlock(&p->regs_mu);
	return far;
}

int ib_lanes_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		      struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	struct ib_lane_regs *r = calloc(1, sizeof(*r));
	if (!r)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	void *h = NULL;
	if (ib_register(b, addr, len, gpu, &h, err) != 0) {
		free(r);
		return -1;
	}
	r->mr[0] = h;
	/* Memory goes on its nearest rails (the node's topology, engine/rail_table.c); lane 0 always holds
	 * it too, since its MR is the handle and one-rail peers use that rail, but when it is not
	 * among them (far0) this side's transfers of it leave lane 0 out (ib/stripe.c). */
	bool allow[SC_MAX_RAILS];
	/* (SC_TEST_IB_HOST_RAILS: the VM's soft devices have no PCI address, so no topology places
	 * them; the tests name the rails host memory is near.) */
	bool chosen = sc_rail_choice(ib->top, gpu, "SC_TEST_IB_HOST_RAILS", allow);
	r->far0 = chosen && ib->rail >= 0 && !allow[ib->rail];
	for (size_t k = 1; k < ib->n_lanes; k++) {
		struct sc_err e2;
		sc_err_clear(&e2);
		void *hk = NULL;
		int rail = ib->lanes[k]->rail;
		if (chosen && rail >= 0 && !allow[rail]) {
			SC_DEBUG("ibverbs", "GPU %d's region not registered on rail %s: the topology "
				 "puts other rails nearer to it", gpu, ib->top->rails[rail].name);
			continue;
		}
		if (ib_register(&ib->lanes[k]->base, addr, len, gpu, &hk, &e2) != 0) {
			SC_INFO("ibverbs", "region of %llu bytes not registered on lane %zu (%s): %s",
				(unsigned long long)len, k, ib->lanes[k]->dev_name, e2.msg);
			continue;
		}
		r->mr[k] = hk;
	}
	pthread_mutex_lock(&ib->regs_mu);
	r->next = ib->regs;
	ib->regs = r;
	pthread_mutex_unlock(&ib->regs_mu);
	*handle = h;
	return 0;
}

void ib_lanes_deregister(struct sc_backend *b, void *handle)
{
	struct ib_backend *ib = to_ib(b);
	if (!handle)
		return;
	struct ib_lane_regs *found = NULL;
	pthread_mutex_lock(&ib->regs_mu);
	for (struct ib_lane_regs **pp = &ib->regs; *pp; pp = &(*pp)->next) {
		if ((*pp)->mr[0] == handle) {
			found = *pp;
			*pp = found->next;
			break;
		}
	}
	pthread_mutex_unlock(&ib->regs_mu);
	if (found) {
		for (size_t k = 1; k < ib->n_lanes; k++)
			if (found->mr[k])
				ib_deregister(&ib->lanes[k]->base, found->mr[k]);
		free(found);
	}
	ib_deregister(b, handle);
}

/* ---- passive operations ---------------------------------------------------------------------- */

struct rkey_group {
	uint32_t rkey;
	size_t g;
};

static int rkey_group_cmp(const void *pa, const void *pb)
{
	const struct rkey_group *a = pa, *b = pb;
	return a->rkey < b->rkey ? -1 : a->rkey > b->rkey;
}

int ib_lanes_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		    const int *gpus, void *const *region_handles, void **handle,
		    struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	*handle = NULL;
	struct ib_lane_grant *lg = calloc(1, sizeof(*lg));
	if (!lg)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	if (ib_expose(b, md, addrs, gpus, region_handles, &lg->g[0], err) != 0) {
		free(lg);
		return -1;
	}
	size_t nd = md->n_descs;
	uint32_t *r0 = malloc((nd ? nd : 1) * sizeof(*r0));
	size_t groups = sc_metadata_rkey_groups(md->descs, nd, NULL);
	uint32_t *g0 = groups != (size_t)-1 ? malloc((groups ? groups : 1) * sizeof(*g0)) : NULL;
	struct rkey_group *tab = g0 ? malloc((groups ? groups : 1) * sizeof(*tab)) : NULL;
	size_t *first = tab ? malloc((groups ? groups : 1) * sizeof(*first)) : NULL;
	void **rh = malloc((nd ? nd : 1) * sizeof(*rh));
	uint32_t *rkeys = malloc((ib->n_lanes * (groups ? groups : 1) + 1) * sizeof(*rkeys));
	if (!r0 || !g0 || !tab || !first || !rh || !rkeys) {
		SC_WARN("ibverbs", "out of memory granting access on the other rails: this "
			"operation's metadata offers rail 0 only");
		goto out;
	}
	for (size_t i = 0; i < nd; i++)
		r0[i] = md->descs[i].rkey;
	sc_metadata_rkey_groups(md->descs, nd, g0);
	for (size_t g = 0; g < groups; g++) {
		tab[g] = (struct rkey_group){g0[g], g};
		first[g] = SIZE_MAX;
	}
	qsort(tab, groups, sizeof(*tab), rkey_group_cmp);
	for (size_t i = 0; i < nd; i++) {
		if (i > 0 && r0[i] == r0[i - 1])
			continue;
		struct rkey_group key = {r0[i], 0};
		struct rkey_group *hit = bsearch(&key, tab, groups, sizeof(*tab), rkey_group_cmp);
		if (hit && first[hit->g] == SIZE_MAX)
			first[hit->g] = i;
	}
	struct sc_ib_endpoint ep0 = md->ib;
	size_t nr = 0;
	for (size_t k = 1; k < ib->n_lanes; k++) {
		struct ib_backend *l = ib->lanes[k];
		bool all = true;
		for (size_t i = 0; i < nd && all; i++)
			all = (rh[i] = ib_lane_mr(ib, region_handles[i], (unsigned)k)) != NULL;
		struct sc_err e2;
		sc_err_clear(&e2);
		if (!all || ib_expose(&l->base, md, addrs, gpus, rh, &lg->g[k], &e2) != 0) {
			SC_DEBUG("ibverbs", "operation not offered on lane %zu (%s): %s", k,
				 l->dev_name, all ? e2.msg : "a region is not registered there");
			lg->g[k] = NULL;
		} else {
			struct sc_ib_rail *r = &md->ib_rails[nr];
			r->index = (uint32_t)k;
			r->ep = md->ib;
			for (size_t g = 0; g < groups; g++)
				rkeys[nr * groups + g] = md->descs[first[g]].rkey;
			nr++;
		}
		for (size_t i = 0; i < nd; i++)
			md->descs[i].rkey = r0[i];
		md->ib = ep0;
	}
	if (nr) {
		free(md->ib_rkeys);
		md->ib_rkeys = rkeys;
		rkeys = NULL;
		md->n_ib_rails = nr;
		md->n_ib_groups = groups;
	}
out:
	free(r0);
	free(g0);
	free(tab);
	free(first);
	free(rh);
	free(rkeys);
	*handle = lg;
	return 0;
}

void ib_lanes_revoke(struct sc_backend *b, void *handle)
{
	struct ib_backend *ib = to_ib(b);
	struct ib_lane_grant *lg = handle;
	if (!lg)
		return;
	for (size_t k = ib->n_lanes; k-- > 1;)
		if (lg->g[k])
			ib_revoke(&ib->lanes[k]->base, lg->g[k]);
	ib_revoke(b, lg->g[0]);
	free(lg);
}
