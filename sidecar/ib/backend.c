/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/backend.c: the ibverbs backend's ops table and what it owns per device. At create (main
 * thread, before the engine starts) it finds the rails (ib/rails.c: every port of every device,
 * in --ib-devices order, each with its GID: --ib-gid-index or the first RoCE v2 GID with an IPv4
 * address), opens the first usable one (lane 0, this object) and allocates its protection
 * domain, then every other usable rail as a lane of its own (ib/lanes.c); `detail` says exactly
 * what was chosen or why nothing is usable. With one lane the ops table is the one-rail backend's;
 * with several, regions and grants go to every lane and large transfers are striped (ib/stripe.c).
 * Region MRs and per-operation remote access (memory windows, or MRs where the device has none)
 * live in ib/access.c.
 *
 * Owns: the device context, the PD (and through ib/qp.c / ib/xfer.c, the CQ, QPs and threads),
 * the other lanes (ib/lanes.c).
 */
#include "ib/internal.h"

#include "base/log.h"
#include "peer/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

uint32_t ib_mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256:
		return 256;
	case IBV_MTU_512:
		return 512;
	case IBV_MTU_1024:
		return 1024;
	case IBV_MTU_2048:
		return 2048;
	case IBV_MTU_4096:
		return 4096;
	}
	return 0;
}

enum ibv_mtu ib_mtu_from_bytes(uint32_t bytes)
{
	if (bytes >= 4096)
		return IBV_MTU_4096;
	if (bytes >= 2048)
		return IBV_MTU_2048;
	if (bytes >= 1024)
		return IBV_MTU_1024;
	if (bytes >= 512)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

static bool gid_v4mapped(const union ibv_gid *g)
{
	for (int i = 0; i < 10; i++)
		if (g->raw[i])
			return false;
	return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

static bool gid_zero(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

void ib_gid_text(const union ibv_gid *gid, char *out, size_t cap)
{
	char buf[INET6_ADDRSTRLEN] = "?";
	if (gid_v4mapped(gid)) {
		inet_ntop(AF_INET, gid->raw + 12, buf, sizeof(buf));
		snprintf(out, cap, "::ffff:%s", buf);
		return;
	}
	inet_ntop(AF_INET6, gid->raw, buf, sizeof(buf));
	snprintf(out, cap, "%s", buf);
}

const char *ib_gid_type_name(unsigned t)
{
	switch (t) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	}
	return "unknown";
}

/* ---- selection ------------------------------------------------------------------------------- */

int ib_pick_gid(struct ibv_context *ctx, const char *dev, struct ib_pick *p, int want, char *why,
		size_t cap)
{
	struct ibv_gid_entry e;
	if (want >= 0) {
		if (want >= p->pa.gid_tbl_len ||
		    ibv_query_gid_ex(ctx, p->port, (uint32_t)want, &e, 0) != 0 ||
		    gid_zero(&e.gid)) {
			snprintf(why, cap,
				 "%s port %u has no GID at --ib-gid-index %d (table of %d)", dev,
				 p->port, want, p->pa.gid_tbl_len);
			return -1;
		}
		p->gid_index = want;
		p->gid = e.gid;
		p->gid_type = e.gid_type;
		p->ndev_ifindex = e.ndev_ifindex;
		return 0;
	}
	if (p->pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		for (int i = 0; i < p->pa.gid_tbl_len; i++) {
			if (ibv_query_gid_ex(ctx, p->port, (uint32_t)i, &e, 0) != 0)
				continue;
			if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_v4mapped(&e.gid)) {
				p->gid_index = i;
				p->gid = e.gid;
				p->gid_type = e.gid_type;
				p->ndev_ifindex = e.ndev_ifindex;
				return 0;
			}
		}
		snprintf(why, cap,
			 "%s port %u has no RoCE v2 GID with an IPv4 address (is an IPv4 address "
			 "on its netdev?) -- pass --ib-gid-index",
			 dev, p->port);
		return -1;
	}
	if (ibv_query_gid_ex(ctx, p->port, 0, &e, 0) != 0) {
		snprintf(why, cap, "%s port %u: cannot read GID 0: %s", dev, p->port,
			 strerror(errno));
		return -1;
	}
	p->gid_index = 0;
	p->gid = e.gid;
	p->gid_type = e.gid_type;
	p->ndev_ifindex = e.ndev_ifindex;
	return 0;
}

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

/* Find the rails, then open the first usable one. Fills ib's device fields or `detail` with the
 * reason. */
static void choose_device(struct ib_backend *ib, const struct sc_config *cfg)
{
	struct sc_backend *b = &ib->base;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		snprintf(
		    b->detail, sizeof(b->detail),
		    "no RDMA devices found (ibv_get_device_list: %s; check /dev/infiniband and "
		    "the NIC driver, or add Soft-RoCE with: rdma link add rxe0 type rxe netdev "
		    "ETH)",
		    list ? "0 devices" : strerror(errno));
		if (list)
			ibv_free_device_list(list);
		return;
	}
	for (int i = 0; i < n && b->n_devices < 4; i++)
		snprintf(b->devices[b->n_devices++], sizeof(b->devices[0]), "%s",
			 ibv_get_device_name(list[i]));
	char why[256] = "";
	ib_rails_discover(ib, cfg, list, n, why, sizeof(why));
	for (size_t r = 0; r < b->n_rails && !ib->pd; r++) {
		if (!ib->rail_port[r].usable)
			continue;
		char reason[256];
		if (ib_open_rail(ib, list, n, r, reason, sizeof(reason)) != 0) {
			sc_rail_set_state(b, r, SC_RAIL_UNUSABLE, "%s", reason);
			if (!why[0])
				snprintf(why, sizeof(why), "%s", reason);
		}
	}
	if (!ib->pd) {
		snprintf(b->detail, sizeof(b->detail), "%s", why);
	} else {
		ib_lanes_open(ib, list, n);
		ib_rails_mark_data_rail(ib);
	}
	ibv_free_device_list(list);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static int ib_start(struct sc_backend *b, struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	if (!ib->pd)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "%s", b->detail);
	if (!ib->pool || !ib->srv)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "no peer control channel (--data-listen) for the QP rendezvous");
	if (ib_xfer_start(ib, err) != 0)
		return -1; /* stop() undoes what started */
	if (ib_qp_start(ib, err) != 0)
		return -1;
	if (ib_lanes_start(ib, err) != 0)
		return -1;
	SC_INFO("ibverbs", "using %s (%u KiB per work request, %u READs in flight per QP)",
		b->detail, ib->max_msg >> 10, ib->max_init_rd);
	return 0;
}

static void ib_stop(struct sc_backend *b)
{
	struct ib_backend *ib = to_ib(b);
	ib_stripe_stop(ib);
	ib_qp_stop_handler(ib);
	ib_xfer_stop(ib);
	ib_lanes_stop(ib);
	ib_qp_drop_all(ib);
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

static void ib_destroy(struct sc_backend *b)
{
	struct ib_backend *ib = to_ib(b);
	ib_stop(b);
	ib_lanes_destroy(ib);
	ib_stripe_fini(ib);
	ib_backend_free(ib);
}

static const struct sc_backend_ops ib_ops = {
    .kind = SC_BACKEND_IBVERBS, /* name and level: engine/backend_registry.c */
    .start = ib_start,
    .stop = ib_stop,
    .destroy = ib_destroy,
    .register_region = ib_register,
    .deregister_region = ib_deregister,
    .expose = ib_expose,
    .revoke = ib_revoke,
    .submit = ib_xfer_submit,
    .cancel = ib_xfer_cancel,
    .connect = ib_connect,
};

/* Several lanes: regions and grants on every lane, large transfers striped (ib/lanes.c,
 * ib/stripe.c). */
static const struct sc_backend_ops ib_lanes_ops = {
    .kind = SC_BACKEND_IBVERBS,
    .start = ib_start,
    .stop = ib_stop,
    .destroy = ib_destroy,
    .register_region = ib_lanes_register,
    .deregister_region = ib_lanes_deregister,
    .expose = ib_lanes_expose,
    .revoke = ib_lanes_revoke,
    .submit = ib_stripe_submit,
    .cancel = ib_stripe_cancel,
    .connect = ib_connect,
};

struct ib_backend *ib_backend_new(const struct sc_backend_env *env)
{
	struct ib_backend *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return NULL;
	ib->base.ops = &ib_ops;
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

struct sc_backend *sc_backend_ibverbs_create(const struct sc_backend_env *env)
{
	const struct sc_config *cfg = env->cfg;
	struct ib_backend *ib = ib_backend_new(env);
	if (!ib)
		return NULL;
	if (cfg->backends && !(cfg->backends & SC_BACKEND_BIT_IBVERBS)) {
		snprintf(ib->base.detail, sizeof(ib->base.detail), "disabled by --backends");
		return &ib->base;
	}
	choose_device(ib, cfg);
	if (!ib->pd) {
		SC_DEBUG("ibverbs", "unavailable: %s", ib->base.detail);
		return &ib->base;
	}
	if (!ib->pool || !ib->srv) {
		snprintf(ib->base.detail, sizeof(ib->base.detail),
			 "no peer control channel (--data-listen) for the QP rendezvous");
		return &ib->base;
	}
	/* Peers reach the rendezvous (and OPEN/DONE) on the control channel's endpoint. */
	snprintf(ib->base.endpoint, sizeof(ib->base.endpoint), "%s",
		 sc_peer_server_endpoint(ib->srv));
	ib->base.available = true;
	if (ib->n_lanes > 1) {
		ib->base.ops = &ib_lanes_ops;
		if (ib_stripe_init(ib) != 0) {
			ib->base.available = false;
			snprintf(ib->base.detail, sizeof(ib->base.detail), "out of memory");
			return &ib->base;
		}
	}
	SC_INFO("ibverbs", "chose %s", ib->base.detail);
	return &ib->base;
}
