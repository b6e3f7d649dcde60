/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/backend.c: the ibverbs backend's ops tables and lifecycle, the top of ib/. At create (main
 * thread, before the engine starts) it finds the rails (ib/rails.c: every port of every device,
 * in --ib-devices order, each with its GID, ib/port.c), opens the first usable one as lane 0, this
 * object (ib/device.c), then every other usable rail as a lane of its own (ib/lanes.c); `detail`
 * says exactly what was chosen or why nothing is usable. With one lane the ops table is the
 * one-rail backend's (ib/access.c, ib/xfer.c, ib/qp.c); with several, regions and grants go to
 * every lane and large transfers are striped (ib/stripe.c). Every lane is made with the one-rail
 * table handed in (ib_backend_new), so no file below calls back into this one.
 *
 * Threads: create, start, stop and destroy on the main thread; the ops on engine threads.
 * Owns: lane 0 (its device context and PD, ib/device.c; through ib/qp.c / ib/xfer.c, the CQ, QPs
 * and threads), the other lanes (ib/lanes.c).
 */
#include "ib/internal.h"

#include "base/log.h"
#include "peer/server.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The one-rail ops table (below): lane 0's until it has several lanes, and every other lane's. */
static const struct sc_backend_ops ib_ops;

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
		ib_lanes_open(ib, &ib_ops, list, n);
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

static void ib_destroy(struct sc_backend *b)
{
	struct ib_backend *ib = to_ib(b);
	ib_stop(b);
	ib_lanes_destroy(ib);
	ib_stripe_fini(ib);
	ib_backend_free(ib);
}

/* The control channel's endpoint where no backend before it (tcp) wrote one. Its bit in
 * md->backends comes with a grant (ib_expose): the rkeys are what a peer needs. */
static void ib_advertise(struct sc_backend *b, struct sc_metadata *md)
{
	struct ib_backend *ib = to_ib(b);
	/* The server's endpoint as it is now (--advertise if:NAME follows its interface). */
	const char *ep = ib->srv ? sc_peer_server_endpoint(ib->srv) : b->endpoint;
	if (md->n_endpoints == 0 && ep[0]) {
		snprintf(md->endpoints[0], sizeof(md->endpoints[0]), "%s", ep);
		md->n_endpoints = 1;
	}
}

/* A grant: the ranges' rkeys and the rails in md (ib/access.c, ib/lanes.c), then this backend's
 * bit, since a peer needs those to use it. */
static int ib_grant(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		    const int *gpus, void *const *region_handles, void **handle, struct sc_err *err)
{
	if (ib_expose(b, md, addrs, gpus, region_handles, handle, err) != 0)
		return -1;
	md->backends |= SC_BACKEND_BIT_IBVERBS;
	return 0;
}

static int ib_lanes_grant(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
			  const int *gpus, void *const *region_handles, void **handle,
			  struct sc_err *err)
{
	if (ib_lanes_expose(b, md, addrs, gpus, region_handles, handle, err) != 0)
		return -1;
	md->backends |= SC_BACKEND_BIT_IBVERBS;
	return 0;
}

static const struct sc_backend_ops ib_ops = {
    .kind = SC_BACKEND_IBVERBS, /* name and level: engine/backend_registry.c */
    .start = ib_start,
    .stop = ib_stop,
    .destroy = ib_destroy,
    .register_region = ib_register,
    .deregister_region = ib_deregister,
    .expose = ib_grant,
    .revoke = ib_revoke,
    .submit = ib_xfer_submit,
    .cancel = ib_xfer_cancel,
    .connect = ib_connect,
    .advertise = ib_advertise,
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
    .expose = ib_lanes_grant,
    .revoke = ib_lanes_revoke,
    .submit = ib_stripe_submit,
    .cancel = ib_stripe_cancel,
    .connect = ib_connect,
    .advertise = ib_advertise,
};

struct sc_backend *sc_backend_ibverbs_create(const struct sc_backend_env *env)
{
	const struct sc_config *cfg = env->cfg;
	struct ib_backend *ib = ib_backend_new(env, &ib_ops);
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
