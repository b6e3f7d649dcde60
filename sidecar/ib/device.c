/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/device.c: one rail's object, a struct ib_backend (lane 0, the one the registry holds, or
 * another lane, ib/lanes.c): new (locks, lists, settings from the environment; its ops table
 * handed in by the caller, as rdma-core's verbs_set_ops, so nothing here knows ib/backend.c),
 * opening a rail's device into it (context, PD, port, GID, limits, remote access: ib/access.c)
 * and freeing it (CQ, channel, bind QP, PD, device, the object). Main thread at create and
 * destroy, after the lane's threads have stopped. Owns: the device context and the PD.
 */
#include "ib/internal.h"

#include "base/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Open rail r's device and allocate the protection domain: the rail that carries ibverbs data.
 * 0, or -1 with why filled. */
int ib_open_rail(struct ib_backend *ib, struct ibv_device **list, int n, size_t r, char *why,
		 size_t cap)
{
	struct sc_backend *b = &ib->base;
	const struct ib_rail_port *rp = &ib->rail_port[r];
	struct ibv_context *ctx = NULL;
	for (int i = 0; i < n && !ctx; i++)
		if (strcmp(ibv_get_device_name(list[i]), rp->dev) == 0)
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		snprintf(why, cap, "%s: ibv_open_device: %s", rp->dev, strerror(errno));
		return -1;
	}
	struct ibv_device_attr da;
	struct ibv_pd *pd = NULL;
	if (ibv_query_device(ctx, &da) != 0 || !(pd = ibv_alloc_pd(ctx))) {
		snprintf(why, cap, "%s: cannot allocate a protection domain: %s", rp->dev,
			 strerror(errno));
		ibv_close_device(ctx);
		return -1;
	}
	const struct ib_pick *p = &rp->pick;
	ib->ctx = ctx;
	ib->pd = pd;
	ib->rail = (int)r;
	snprintf(ib->dev_name, sizeof(ib->dev_name), "%s", rp->dev);
	ib->port = p->port;
	ib->gid_index = p->gid_index;
	ib->gid = p->gid;
	ib->lid = p->pa.lid;
	ib->active_mtu = p->pa.active_mtu;
	ib->link_layer = p->pa.link_layer;
	uint32_t max_msg = p->pa.max_msg_sz ? p->pa.max_msg_sz : IB_CHUNK_MAX;
	ib->max_msg = max_msg < IB_CHUNK_MAX ? max_msg : IB_CHUNK_MAX;
	ib->max_qp_wr = da.max_qp_wr > 0 ? (uint32_t)da.max_qp_wr : 1;
	uint32_t init_rd = da.max_qp_init_rd_atom > 0 ? (uint32_t)da.max_qp_init_rd_atom : 1;
	uint32_t dest_rd = da.max_qp_rd_atom > 0 ? (uint32_t)da.max_qp_rd_atom : 1;
	ib->max_init_rd = init_rd < IB_MAX_RD_ATOMIC ? init_rd : IB_MAX_RD_ATOMIC;
	ib->max_sge = da.max_sge > 0 ? (uint32_t)da.max_sge : 1;
	if (ib->max_sge > IB_MAX_SGE)
		ib->max_sge = IB_MAX_SGE;
	ib->max_sge_rd = da.max_sge_rd > 0 ? (uint32_t)da.max_sge_rd : 1;
	if (ib->max_sge_rd > ib->max_sge)
		ib->max_sge_rd = ib->max_sge;
	ib->max_dest_rd = dest_rd < IB_MAX_RD_ATOMIC ? dest_rd : IB_MAX_RD_ATOMIC;
	ib_access_init(ib, &da);
	char gid[64];
	ib_gid_text(&p->gid, gid, sizeof(gid));
	snprintf(b->detail, sizeof(b->detail),
		 "%s port %u ACTIVE, %s gid[%d] %s, mtu %u; remote access: %s", rp->dev, p->port,
		 ib_gid_type_name(p->gid_type), p->gid_index, gid, ib_mtu_bytes(p->pa.active_mtu),
		 ib->grant_why);
	return 0;
}

/* A lane's own teardown (stopped before): CQ, channel, bind QP, PD, device. */
void ib_backend_free(struct ib_backend *ib)
{
	if (ib->cq && ibv_destroy_cq(ib->cq) != 0)
		SC_WARN("ibverbs", "ibv_destroy_cq: %s", strerror(errno));
	if (ib->chan && ibv_destroy_comp_channel(ib->chan) != 0)
		SC_WARN("ibverbs", "ibv_destroy_comp_channel: %s", strerror(errno));
	if (ib->wake_fd >= 0)
		close(ib->wake_fd);
	if (atomic_load(&ib->n_grants))
		SC_WARN("ibverbs", "%" PRIu64 " operation grant(s) still registered at destroy",
			(uint64_t)atomic_load(&ib->n_grants));
	ib_access_fini(ib);
	if (ib->pd) {
		int rc = ibv_dealloc_pd(ib->pd);
		if (rc != 0)
			SC_WARN("ibverbs", "ibv_dealloc_pd: %s (memory regions still registered)",
				strerror(rc));
	}
	if (ib->ctx)
		ibv_close_device(ib->ctx);
	sc_xr_destroy(&ib->xr);
	pthread_cond_destroy(&ib->cv);
	pthread_mutex_destroy(&ib->mu);
	pthread_mutex_destroy(&ib->regs_mu);
	free(ib);
}

struct ib_backend *ib_backend_new(const struct sc_backend_env *env,
				  const struct sc_backend_ops *ops)
{
	struct ib_backend *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return NULL;
	ib->base.ops = ops;
	ib->base.env = *env;
	ib->wake_fd = -1;
	ib->rail = -1;
	ib->primary = ib;
	ib->top = &ib->base;
	ib->lanes[0] = ib;
	ib->n_lanes = 1;
	pthread_mutex_init(&ib->mu, NULL);
	pthread_mutex_init(&ib->regs_mu, NULL);
	pthread_cond_init(&ib->cv, NULL);
	sc_xr_init(&ib->xr, "ibverbs", &ib->mu);
	sc_list_init(&ib->peers);
	sc_list_init(&ib->out_qps);
	sc_list_init(&ib->in_qps);
	sc_list_init(&ib->nobind);
	atomic_init(&ib->cq_stop, false);
	atomic_init(&ib->n_grants, 0);
	snprintf(ib->self_id, sizeof(ib->self_id), "%s", env->self_id);
	ib->stall_ms = env->cfg->ib_stall_ms;
	ib->pool = env->pool;
	ib->srv = env->server;
	ib->stripe_min = env->cfg->ib_stripe_min_bytes;
	ib->slice_bytes = env->cfg->ib_slice_bytes ? env->cfg->ib_slice_bytes : (1u << 20);
	ib->max_qps = env->cfg->ib_max_qps ? env->cfg->ib_max_qps : 1024;
	/* tests: expiry in seconds, not minutes */
	ib->in_idle_ms = sc_test_env_ms("SC_TEST_IB_QP_IDLE_MS", IB_IN_IDLE_MS);
	return ib;
}
