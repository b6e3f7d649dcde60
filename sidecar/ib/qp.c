/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/qp.c: RC queue pairs between sidecars, set up on demand over the authenticated peer control
 * channel (peer/pool.h / peer/server.h) with one QP_CONNECT request/reply (its body:
 * ib/qp_wire.c). The requester caches one QP per peer sidecar, or a tombstone after a failure,
 * and checks a cached QP with the peer first (VERIFY) when it may be stale; the responder keeps
 * "incoming" QPs, which never post anything. Both kinds are capped at --ib-max-qps, idle ones
 * making room. The rendezvous, the caps and expiry, tombstones and VERIFY: below.
 *
 * Threads: ib_qp_get on worker threads (and striped transfers' threads),
 * ib_connect on gRPC threads, the QP_CONNECT handler on peer-server threads, async errors and
 * expiry on the completion thread.
 * Owns: the peer table, the outgoing and incoming QPs (ib/internal.h, Lifetime), the QP_CONNECT
 * handler's registration, the test hooks of ib/test.h.
 */
#include "ib/internal.h"

#include "ib/test.h"
#include "base/log.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"
#include "peer/server.h"
#include "base/timer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * RC queue pairs between sidecars, set up on demand over the authenticated peer control
 * channel (peer/pool.h / peer/server.h), one QP_CONNECT request/reply:
 *
 *   requester (active side, a worker thread)        responder (passive side, a peer-server thread)
 *   create QP, INIT
 *   QP_CONNECT {qpn, psn, gid, lid, mtu, rd depths,
 *               prev_qpn, requester id}   -------->  create QP, INIT -> RTR -> RTS against it
 *   RTR -> RTS against the reply          <--------  QP_CONNECT {qpn, psn, gid, lid, mtu, ...}
 *
 * Path MTU is the smaller of both ports' active MTUs; timeout 14, retry 7, rnr_retry 7, 16 RDMA
 * READs in flight (capped to both devices). The requester caches its QP per peer sidecar id and
 * uses it for every transfer to that peer; the responder keeps its side ("incoming" QPs, which
 * never post anything) keyed by (peer id, requester qpn); when that peer connects again it drops
 * the one the requester says it replaced (prev_qpn) and those in the error state, keeps at most
 * IB_MAX_IN_PER_PEER per peer, and it destroys at once those an async event reports in error.
 *
 * Incoming QPs are capped at --ib-max-qps (ib->max_qps) and do not hold their slot for ever: at
 * the cap the least recently used one whose peer is idle here (no request in hand, no transfer
 * OPENed on the control channel: the peer server knows) is destroyed to admit the new peer
 * (logged, rdma_sidecar_ib_qps_evicted_total), and one whose peer made no request for
 * IB_IN_IDLE_MS expires (the completion thread looks every IB_IN_EXPIRE_CHECK_MS; tests shorten it
 * with SC_TEST_IB_QP_IDLE_MS). Only when
 * every one is in use is the new peer refused (RESOURCE_EXHAUSTED, saying so). A QP in use is
 * never destroyed: a running transfer holds its OPEN until its DONE or completion notice. The
 * peer server closes the victim's idle control connections in the same step, so the victim's
 * next transfer has to dial anew, and a cached QP behind a newly dialled connection is checked
 * with the peer first (VERIFY, below): it learns the QP is gone and reconnects, instead of posting
 * RDMA into a QP number that no longer exists. Outgoing QPs are capped the same way (LRU, idle
 * ones dropped). A QP that fails takes its peer out of the cache; transport failures
 * (retry exceeded, setup failures) also tombstone the peer for IB_TOMBSTONE_MS, during which
 * transfers to it fail at once with UNAVAILABLE and the reason, rather than hang.
 *
 * A cached QP that has been idle for IB_VERIFY_IDLE_MS is first checked with the peer (VERIFY:
 * "do you still have QP <yours> connected to my <mine>?"), one round trip: a peer that restarted
 * has lost its end, and RDMA into a QP number that no longer exists may never complete (Soft-RoCE
 * does not time it out), so the requester reconnects instead. The same check runs when a cached QP
 * is fresh but the control connection for the transfer had to be dialled anew (no idle one was
 * still open): a peer killed and restarted on the same address within IB_VERIFY_IDLE_MS closed
 * them all, and its end of the QP is gone.
 */

/* The rendezvous gives up after this long even when the transfer's deadline is later. */
#define RENDEZVOUS_MS 15000

/* ---- one QP ---------------------------------------------------------------------------------- */

static uint32_t random_psn(void)
{
	uint32_t v = 0;
	if (sc_random_bytes(&v, sizeof(v)) != 0)
		v = (uint32_t)sc_clock_mono_ms();
	return v & 0xffffff;
}

static void qp_free(struct ib_qp *q)
{
	if (!q)
		return;
	if (q->qp && ibv_destroy_qp(q->qp) != 0)
		SC_WARN("ibverbs", "ibv_destroy_qp (peer %s): %s", q->peer, strerror(errno));
	ib_notice_qp_fini(q);
	free(q->wrs);
	free(q);
}

/* A new RC QP on cq, in RESET. sq_depth 0: an incoming QP (posts nothing). */
static struct ib_qp *qp_create(struct ib_backend *ib, struct ibv_cq *cq, uint32_t sq_depth,
			       const char *peer, struct sc_err *err)
{
	struct ib_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	q->ib = ib;
	sc_list_init(&q->node);
	q->cq = cq;
	q->incoming = sq_depth == 0;
	snprintf(q->peer, sizeof(q->peer), "%s", peer);
	q->created_mono_ms = q->last_used_mono_ms = q->last_ok_mono_ms = sc_clock_mono_ms();
	if (sq_depth > ib->max_qp_wr)
		sq_depth = ib->max_qp_wr;
	q->sq_depth = sq_depth;
	if (sq_depth) {
		q->wrs = calloc(sq_depth, sizeof(*q->wrs));
		if (!q->wrs) {
			free(q);
			sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
			return NULL;
		}
		for (uint32_t i = 0; i < sq_depth; i++) {
			q->wrs[i].qp = q;
			q->wrs[i].next_free = i + 1 < sq_depth ? &q->wrs[i + 1] : NULL;
		}
		q->free_wrs = &q->wrs[0];
	}
	struct ibv_qp_init_attr a = {
	    .qp_context = q,
	    .send_cq = cq,
	    .recv_cq = cq,
	    .cap = {.max_send_wr = sq_depth ? sq_depth : 1,
		    .max_recv_wr = ib_notice_recv_wr(ib, sq_depth == 0),
		    .max_send_sge = ib->max_sge,
		    .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	    .sq_sig_all = 0,
	};
	q->qp = ibv_create_qp(ib->pd, &a);
	if (!q->qp) {
		sc_err_set(err, errno == ENOMEM ? SC_RESOURCE_EXHAUSTED : SC_INTERNAL,
			   "ibv_create_qp on %s: %s", ib->dev_name, strerror(errno));
		qp_free(q);
		return NULL;
	}
	ib_notice_qp_init(ib, q);
	return q;
}

static int qp_modify(struct ib_qp *q, struct ibv_qp_attr *a, int mask, const char *state,
		     struct sc_err *err)
{
	int rc = ibv_modify_qp(q->qp, a, mask);
	if (rc != 0)
		return sc_err_set(err, SC_INTERNAL, "ibv_modify_qp to %s (qpn %u, peer %s): %s",
				  state, q->qp->qp_num, q->peer, strerror(rc));
	return 0;
}

static int qp_to_init(struct ib_backend *ib, struct ib_qp *q, struct sc_err *err)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT,
	    .pkey_index = 0,
	    .port_num = ib->port,
	    /* What the MRs allow is what counts; the QP itself does not restrict. */
	    .qp_access_flags =
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
	};
	return qp_modify(q, &a,
			 IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
			 "INIT", err);
}

/* INIT -> RTR -> RTS against the remote side's parameters. */
static int qp_to_rts(struct ib_backend *ib, struct ib_qp *q, uint32_t local_psn,
		     const struct ib_qpc *remote, struct sc_err *err)
{
	enum ibv_mtu mtu = ib_mtu_from_bytes(remote->mtu);
	if (mtu > ib->active_mtu)
		mtu = ib->active_mtu;
	q->path_mtu = ib_mtu_bytes(mtu);
	q->remote_qpn = remote->qpn;
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_RTR,
	    .path_mtu = mtu,
	    .dest_qp_num = remote->qpn,
	    .rq_psn = remote->psn,
	    .max_dest_rd_atomic = (uint8_t)ib->max_dest_rd,
	    .min_rnr_timer = IB_QP_MIN_RNR_TIMER,
	    .ah_attr = {.dlid = remote->lid, .sl = 0, .src_path_bits = 0, .port_num = ib->port},
	};
	if (ib->link_layer == IBV_LINK_LAYER_ETHERNET || remote->lid == 0) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t)ib->gid_index;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.grh.traffic_class = 0;
		a.ah_attr.grh.flow_label = 0;
	}
	if (qp_modify(q, &a,
		      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		      "RTR", err) != 0)
		return -1;
	uint32_t rd = ib->max_init_rd < remote->max_dest_rd ? ib->max_init_rd : remote->max_dest_rd;
	q->max_rd = rd ? rd : 1;
	struct ibv_qp_attr r = {
	    .qp_state = IBV_QPS_RTS,
	    .timeout = IB_QP_TIMEOUT,
	    .retry_cnt = IB_QP_RETRY_CNT,
	    .rnr_retry = IB_QP_RNR_RETRY,
	    .sq_psn = local_psn,
	    .max_rd_atomic = (uint8_t)q->max_rd,
	};
	return qp_modify(q, &r,
			 IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
			 "RTS", err);
}

/* The requester's half: INIT, QP_CONNECT on c, RTR/RTS against the reply. */
static int rendezvous(struct ib_backend *ib, struct ib_qp *q, struct sc_peer_conn *c,
		      uint32_t prev_qpn, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		      struct sc_err *err)
{
	uint8_t lane = q->remote_lane;
	if (qp_to_init(ib, q, err) != 0)
		return -1;
	uint32_t psn = random_psn();
	struct ib_qpc req;
	ib_qpc_fill_local(ib, q, QPC_REQUEST, psn, &req);
	req.prev_qpn = prev_qpn;
	req.lane = lane;
	uint8_t body[QPC_MAX], reply[QPC_MAX];
	size_t len = ib_qpc_encode(&req, body, sizeof(body)), rlen = 0;
	uint64_t limit = sc_clock_mono_ms() + RENDEZVOUS_MS;
	if (!deadline_mono_ms || deadline_mono_ms > limit)
		deadline_mono_ms = limit;
	if (sc_peer_call(c, SC_FRAME_QP_CONNECT, body, len, reply, sizeof(reply), &rlen,
			 deadline_mono_ms, cancel, err) != 0)
		return sc_err_prefix(err, "QP_CONNECT to %s", sc_peer_conn_endpoint(c));
	struct ib_qpc rep;
	if (ib_qpc_decode(reply, rlen, QPC_REPLY, &rep, err) != 0)
		return sc_err_prefix(err, "reply from %s", sc_peer_conn_endpoint(c));
	if (strcmp(rep.id, q->peer) != 0)
		return sc_err_set(err, SC_UNAVAILABLE,
				  "QP_CONNECT reply from sidecar \"%s\", expected \"%s\"", rep.id,
				  q->peer);
	q->peer_notice = (rep.flags & QPC_F_NOTICE) != 0;
	return qp_to_rts(ib, q, psn, &rep, err);
}

/* ---- outgoing QPs (requester) ---------------------------------------------------------------- */

static struct ib_peer *peer_find_locked(struct ib_backend *ib, const char *id, bool add)
{
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->peers) {
		struct ib_peer *p = sc_list_entry(pos, struct ib_peer, node);
		if (strcmp(p->id, id) == 0)
			return p;
	}
	if (!add)
		return NULL;
	struct ib_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	snprintf(p->id, sizeof(p->id), "%s", id);
	sc_list_insert_head(&ib->peers, &p->node);
	return p;
}

void ib_qp_put(struct ib_backend *ib, struct ib_qp *q)
{
	if (!q)
		return;
	pthread_mutex_lock(&ib->mu);
	bool last = --q->refs == 0;
	if (last) {
		sc_list_remove(&q->node);
		if (q->incoming)
			ib->n_in--;
		else
			ib->n_out--;
	}
	pthread_mutex_unlock(&ib->mu);
	if (last) {
		SC_DEBUG("ibverbs", "destroying %s QP %u (peer %s)",
			 q->incoming ? "incoming" : "outgoing", q->qp->qp_num, q->peer);
		qp_free(q);
	}
}

void ib_qp_fail_locked(struct ib_backend *ib, struct ib_qp *q, bool tombstone, const char *why,
		       struct ib_qp **drop)
{
	*drop = NULL;
	if (q->broken)
		return;
	q->broken = true;
	snprintf(q->why, sizeof(q->why), "%s", why);
	struct ib_peer *p = peer_find_locked(ib, q->peer, false);
	if (p && p->qp == q) {
		p->qp = NULL;
		p->prev_qpn = q->qp->qp_num;
		*drop = q; /* the cache's reference */
	}
	if (p && tombstone) {
		p->failed_mono_ms = sc_clock_mono_ms();
		p->retry_mono_ms = p->failed_mono_ms + IB_TOMBSTONE_MS;
		snprintf(p->why, sizeof(p->why), "%s", why);
	}
	SC_WARN("ibverbs", "QP %u to peer %s failed: %s%s", q->qp->qp_num, q->peer, why,
		tombstone ? "; peer refused for 2 s" : "; reconnecting on next use");
}

void ib_qp_flush(struct ib_qp *q)
{
	if (q->flushing)
		return;
	q->flushing = true;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	int rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
	if (rc != 0)
		SC_WARN("ibverbs", "moving QP %u (peer %s) to ERR to flush it: %s", q->qp->qp_num,
			q->peer, strerror(rc));
}


/* Connect a new outgoing QP to md's issuer. *failed_qpn: our QP number when it got as far as
 * asking the peer (so the next attempt tells the peer to drop its half). */
static int connect_peer(struct ib_backend *ib, const struct sc_metadata *md, uint32_t prev_qpn,
			uint64_t deadline_mono_ms, const atomic_bool *cancel, struct ib_qp **out,
			struct sc_peer_conn **conn, int *endpoint, uint32_t *failed_qpn,
			struct sc_err *err)
{
	*failed_qpn = 0;
	struct sc_peer_conn *c = sc_peer_pool_get_issuer(ib->pool, md, deadline_mono_ms, cancel, endpoint, err);
	if (!c) {
		if (err->code == SC_OK)
			sc_err_set(err, SC_UNAVAILABLE, "cannot reach sidecar %s", md->issuer);
		return -1;
	}
	struct ib_qp *q = qp_create(ib, ib->cq, IB_SQ_DEPTH, md->issuer, err);
	if (!q) {
		sc_peer_pool_put(ib->pool, c, true);
		return -1;
	}
	q->remote_lane = (uint8_t)ib_lane_remote(ib, md);
	if (rendezvous(ib, q, c, prev_qpn, deadline_mono_ms, cancel, err) != 0) {
		*failed_qpn = q->qp->qp_num;
		sc_peer_pool_put(ib->pool, c, sc_peer_conn_usable(c));
		qp_free(q);
		return -1;
	}
	SC_INFO("ibverbs",
		"QP to peer %s connected: qpn %u <-> %u, mtu %u, %u READs in flight; %s to its "
		"rail %u",
		md->issuer, q->qp->qp_num, q->remote_qpn, q->path_mtu, q->max_rd, ib->dev_name,
		q->remote_lane);
	*out = q;
	*conn = c;
	return 0;
}

/* Make room for one more outgoing QP: drop the least recently used idle one. Under ib->mu. */
static int make_room_locked(struct ib_backend *ib, struct ib_qp **drop)
{
	*drop = NULL;
	if (ib->n_out < ib->max_qps)
		return 0;
	struct ib_peer *victim = NULL;
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->peers) {
		struct ib_peer *p = sc_list_entry(pos, struct ib_peer, node);
		if (p->qp && p->qp->refs == 1 &&
		    (!victim || p->qp->last_used_mono_ms < victim->qp->last_used_mono_ms))
			victim = p;
	}
	if (!victim)
		return -1;
	SC_INFO("ibverbs", "dropping the idle QP to peer %s (at the cap of %u QPs, --ib-max-qps)",
		victim->id, ib->max_qps);
	victim->prev_qpn = victim->qp->qp->qp_num;
	*drop = victim->qp;
	victim->qp = NULL;
	return 0;
}

/* Connect a new QP to p (p->connecting set and a QP slot reserved by the caller; ib->mu not
 * held), cache it, and return it with the caller's reference; or tombstone p on failure. */
static int connect_and_cache(struct ib_backend *ib, struct ib_peer *p, const struct sc_metadata *md,
			     uint32_t prev_qpn, uint64_t deadline_mono_ms,
			     const atomic_bool *cancel, struct ib_qp **out,
			     struct sc_peer_conn **conn, int *endpoint, struct sc_err *err)
{
	struct ib_qp *q = NULL;
	struct sc_peer_conn *c = NULL;
	int ep = -1;
	uint32_t failed_qpn = 0;
	int rc =
	    connect_peer(ib, md, prev_qpn, deadline_mono_ms, cancel, &q, &c, &ep, &failed_qpn, err);

	pthread_mutex_lock(&ib->mu);
	p->connecting = false;
	if (rc == 0) {
		q->refs = 2; /* the cache's and the caller's */
		sc_list_insert_head(&ib->out_qps, &q->node);
		p->qp = q;
		p->failed_mono_ms = 0;
		p->prev_qpn = 0;
	} else {
		ib->n_out--;
		if (failed_qpn)
			p->prev_qpn = failed_qpn;
		bool callers_own = err->code == SC_CANCELLED ||
				   (err->code == SC_DEADLINE_EXCEEDED && deadline_mono_ms &&
				    sc_clock_mono_ms() >= deadline_mono_ms);
		if (!callers_own) {
			p->failed_mono_ms = sc_clock_mono_ms();
			p->retry_mono_ms = p->failed_mono_ms + IB_TOMBSTONE_MS;
			snprintf(p->why, sizeof(p->why), "%s", err->msg);
			SC_WARN("ibverbs",
				"connecting to peer %s failed: %s; refusing it for %d ms",
				md->issuer, err->msg, IB_TOMBSTONE_MS);
			sc_err_prefix(err, "ibverbs connection to peer %s", md->issuer);
			if (err->code != SC_UNAUTHENTICATED && err->code != SC_RESOURCE_EXHAUSTED)
				err->code = SC_UNAVAILABLE;
		}
	}
	pthread_cond_broadcast(&ib->cv);
	pthread_mutex_unlock(&ib->mu);
	if (rc != 0)
		return -1;
	*out = q;
	if (conn)
		*conn = c;
	else
		sc_peer_pool_put(ib->pool, c, true);
	if (endpoint)
		*endpoint = ep;
	return 0;
}

/* Ask the peer whether it still has its end of q. 1: yes; 0: no (q is stale); -1: the control
 * call failed (err). */
static int verify_peer(struct ib_backend *ib, struct ib_qp *q, struct sc_peer_conn *c,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct ib_qpc req;
	ib_qpc_fill_local(ib, q, QPC_VERIFY, 0, &req);
	req.prev_qpn = q->remote_qpn;
	req.lane = q->remote_lane;
	uint8_t body[QPC_MAX], reply[QPC_MAX];
	size_t len = ib_qpc_encode(&req, body, sizeof(body)), rlen = 0;
	uint64_t limit = sc_clock_mono_ms() + RENDEZVOUS_MS;
	if (!deadline_mono_ms || deadline_mono_ms > limit)
		deadline_mono_ms = limit;
	if (sc_peer_call(c, SC_FRAME_QP_CONNECT, body, len, reply, sizeof(reply), &rlen,
			 deadline_mono_ms, cancel, err) != 0)
		return -1;
	struct ib_qpc rep;
	if (ib_qpc_decode(reply, rlen, QPC_VERIFY_REPLY, &rep, err) != 0)
		return -1;
	return rep.status == 1 ? 1 : 0;
}

/*
 * The cached QP q of peer p has been idle: check it with the peer (p->connecting is set, a
 * reference on q held, ib->mu not held). Returns 1 (good: *conn holds the control connection),
 * 0 (stale: dropped from the cache, the caller connects anew) or -1 (err).
 */
static int verify_cached(struct ib_backend *ib, struct ib_peer *p, struct ib_qp *q,
			 const struct sc_metadata *md, uint64_t deadline_mono_ms,
			 const atomic_bool *cancel, struct sc_peer_conn **conn, int *endpoint,
			 struct sc_err *err)
{
	int ep = -1;
	struct sc_peer_conn *c = sc_peer_pool_get_issuer(ib->pool, md, deadline_mono_ms, cancel, &ep, err);
	int rc = c ? verify_peer(ib, q, c, deadline_mono_ms, cancel, err) : -1;
	struct ib_qp *drop = NULL;
	pthread_mutex_lock(&ib->mu);
	p->connecting = false;
	if (rc == 1)
		q->last_ok_mono_ms = sc_clock_mono_ms();
	else if (rc == 0)
		ib_qp_fail_locked(
		    ib, q, false,
		    "the peer no longer has its end of this QP (it restarted or dropped "
		    "it)",
		    &drop);
	else if (err->code != SC_CANCELLED &&
		 !(deadline_mono_ms && sc_clock_mono_ms() >= deadline_mono_ms))
		ib_qp_fail_locked(ib, q, true, err->msg, &drop); /* the peer is unreachable */
	pthread_cond_broadcast(&ib->cv);
	pthread_mutex_unlock(&ib->mu);
	ib_qp_put(ib, drop);
	if (rc == 1) {
		*conn = c;
		*endpoint = ep;
		return 1;
	}
	if (c)
		sc_peer_pool_put(ib->pool, c, sc_peer_conn_usable(c));
	return rc;
}

static int qp_get(struct ib_backend *ib, const struct sc_metadata *md, uint64_t deadline_mono_ms,
		  const atomic_bool *cancel, struct ib_qp **out, struct sc_peer_conn **conn,
		  int *endpoint, struct sc_err *err)
{
	*out = NULL;
	if (conn)
		*conn = NULL;
	struct sc_peer_conn *c = NULL;
	int ep = -1;
	struct ib_qp *got = NULL;
	pthread_mutex_lock(&ib->mu);
	struct ib_peer *p;
	for (;;) {
		if (ib->xr.stopping) {
			pthread_mutex_unlock(&ib->mu);
			return sc_err_set(err, SC_UNAVAILABLE,
					  "the ibverbs backend is shutting down");
		}
		p = peer_find_locked(ib, md->issuer, true);
		if (!p) {
			pthread_mutex_unlock(&ib->mu);
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		}
		uint64_t now = sc_clock_mono_ms();
		if (p->qp && !p->connecting) {
			struct ib_qp *q = p->qp;
			q->refs++;
			q->last_used_mono_ms = now;
			if (now - q->last_ok_mono_ms < IB_VERIFY_IDLE_MS) {
				got = q; /* fresh: use it */
				break;
			}
			p->connecting = true;
			pthread_mutex_unlock(&ib->mu);
			int rc =
			    verify_cached(ib, p, q, md, deadline_mono_ms, cancel, &c, &ep, err);
			pthread_mutex_lock(&ib->mu);
			if (rc == 1 && !q->broken) {
				got = q;
				break;
			}
			pthread_mutex_unlock(&ib->mu);
			if (rc == 1) { /* it failed meanwhile (another transfer's error) */
				sc_peer_pool_put(ib->pool, c, true);
				c = NULL;
				rc = 0;
			}
			ib_qp_put(ib, q);
			if (rc < 0)
				return sc_err_prefix(err, "checking the ibverbs QP to peer %s",
						     md->issuer);
			SC_INFO("ibverbs", "the QP to peer %s went stale while idle: reconnecting",
				md->issuer);
			pthread_mutex_lock(&ib->mu);
			continue;
		}
		if (!p->connecting && p->failed_mono_ms && now < p->retry_mono_ms) {
			sc_err_set(err, SC_UNAVAILABLE,
				   "ibverbs connection to peer %s failed %" PRIu64 " ms ago: %s; "
				   "retrying after %" PRIu64 " ms",
				   p->id, now - p->failed_mono_ms, p->why, p->retry_mono_ms - now);
			pthread_mutex_unlock(&ib->mu);
			return -1;
		}
		if (!p->connecting) {
			/* Connect a new one. */
			struct ib_qp *evict;
			if (make_room_locked(ib, &evict) != 0) {
				pthread_mutex_unlock(&ib->mu);
				return sc_err_set(
				    err, SC_RESOURCE_EXHAUSTED,
				    "this sidecar has %u outgoing ibverbs QPs, every one in use by a "
				    "transfer (--ib-max-qps): retry once one of them ends",
				    ib->max_qps);
			}
			p->connecting = true;
			ib->n_out++; /* reserved */
			uint32_t prev_qpn = p->prev_qpn;
			pthread_mutex_unlock(&ib->mu);
			ib_qp_put(ib, evict);
			return connect_and_cache(ib, p, md, prev_qpn, deadline_mono_ms, cancel, out,
						 conn, endpoint, err);
		}
		/* Another transfer is connecting to (or checking) the same peer: wait for it. */
		if (cancel && atomic_load(cancel)) {
			pthread_mutex_unlock(&ib->mu);
			return sc_err_set(err, SC_CANCELLED,
					  "cancelled while connecting to peer %s", md->issuer);
		}
		if (deadline_mono_ms && now >= deadline_mono_ms) {
			pthread_mutex_unlock(&ib->mu);
			return sc_err_set(err, SC_DEADLINE_EXCEEDED,
					  "deadline passed while connecting to peer %s",
					  md->issuer);
		}
		sc_cond_wait_ms(&ib->cv, &ib->mu, 100);
	}
	/* A cached QP, with the caller's reference. */
	*out = got;
	pthread_mutex_unlock(&ib->mu);
	if (conn)
		*conn = c;
	else
		sc_peer_pool_put(ib->pool, c, true);
	if (endpoint && c)
		*endpoint = ep;
	return 0;
}

int ib_qp_get(struct ib_backend *ib, const struct sc_metadata *md, uint64_t deadline_mono_ms,
	      const atomic_bool *cancel, struct ib_qp **out, struct sc_peer_conn **conn,
	      int *endpoint, struct sc_err *err)
{
	for (int attempt = 0;; attempt++) {
		if (qp_get(ib, md, deadline_mono_ms, cancel, out, conn, endpoint, err) != 0)
			return -1;
		if (!conn || *conn)
			return 0; /* connected now (or the caller needs no control connection) */
		/*
		 * A cached QP: the caller's OPEN needs a control connection, take it now. When no
		 * idle one to the peer was open any more and a new one was dialled, the peer may
		 * have restarted (same address) since the QP was last used, its end of the QP gone;
		 * RDMA to it would then never complete on some devices. One round trip tells.
		 */
		struct ib_qp *q = *out;
		int ep = -1;
		struct sc_peer_conn *c = sc_peer_pool_get_issuer(ib->pool, md, deadline_mono_ms, cancel, &ep, err);
		int rc = !c ? -1 : sc_peer_conn_reused(c) ? 1
							   : verify_peer(ib, q, c, deadline_mono_ms,
									 cancel, err);
		if (rc == 1) {
			*conn = c;
			if (endpoint)
				*endpoint = ep;
			return 0;
		}
		struct ib_qp *drop = NULL;
		uint32_t qpn = q->qp->qp_num;
		if (rc == 0) {
			pthread_mutex_lock(&ib->mu);
			ib_qp_fail_locked(ib, q, false,
					  "the peer no longer has its end of this QP (it restarted, or "
					  "gave it up while idle)",
					  &drop);
			pthread_mutex_unlock(&ib->mu);
		}
		if (c)
			sc_peer_pool_put(ib->pool, c, sc_peer_conn_usable(c));
		ib_qp_put(ib, drop);
		ib_qp_put(ib, q);
		*out = NULL;
		if (rc < 0)
			return c ? sc_err_prefix(err, "checking the ibverbs QP to peer %s", md->issuer)
				 : -1;
		if (attempt >= 1)
			return sc_err_set(err, SC_UNAVAILABLE,
					  "the ibverbs QPs to peer %s keep going stale (does it restart "
					  "in a loop?)",
					  md->issuer);
		SC_INFO("ibverbs",
			"peer %s no longer has its end of QP %u (it restarted, or gave the idle QP up "
			"at its --ib-max-qps): reconnecting",
			md->issuer, qpn);
	}
}

/* ---- incoming QPs (responder) ---------------------------------------------------------------- */

/*
 * Destroy an incoming QP whose peer is idle: the least recently used one (not the requester's own:
 * `except`) whose peer has no request in hand, no transfer OPENed here and no request for
 * min_idle_ms, and whose QP was last used (created, verified, a notice) min_idle_ms ago or more.
 * The peer server closes that peer's idle control connections in the same step
 * (sc_peer_server_retire_peer), so its next transfer dials anew and checks its QP with us first
 * (ib_qp_get: VERIFY says "unknown", it reconnects) rather than posting into a QP that is gone.
 * Returns 0 (one destroyed; the slot it frees is the caller's: n_in stays) or -1 (every one is in
 * use). Not under ib->mu; a peer-server thread (at the cap) or the completion thread (expiry).
 */
static int retire_one_in(struct ib_backend *ib, const char *except, uint64_t min_idle_ms,
			 bool keep_slot, const char *why)
{
	pthread_mutex_lock(&ib->mu);
	uint64_t round = ++ib->evict_round;
	for (;;) {
		struct ib_qp *lru = NULL;
		uint64_t now = sc_clock_mono_ms();
		struct sc_list *pos;
		sc_list_foreach(pos, &ib->in_qps) {
			struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
			if (q->busy_round == round || (except && strcmp(q->peer, except) == 0) ||
			    q->last_used_mono_ms + min_idle_ms > now)
				continue;
			if (!lru || q->used_seq < lru->used_seq)
				lru = q;
		}
		if (!lru) {
			pthread_mutex_unlock(&ib->mu);
			return -1;
		}
		char peer[SC_NAME_MAX];
		snprintf(peer, sizeof(peer), "%s", lru->peer);
		uint64_t seq = lru->used_seq;
		pthread_mutex_unlock(&ib->mu);
		int busy = sc_peer_server_retire_peer(ib->srv, peer, min_idle_ms);
		pthread_mutex_lock(&ib->mu);
		/* Still listed and unused since (the list may have changed while unlocked)? */
		struct ib_qp *still = NULL;
		sc_list_foreach(pos, &ib->in_qps) {
			if (sc_list_entry(pos, struct ib_qp, node) == lru) {
				still = lru;
				break;
			}
		}
		if (!still)
			continue;
		if (busy != 0 || still->used_seq != seq) {
			still->busy_round = round;
			continue;
		}
		sc_list_remove(&still->node);
		if (!keep_slot)
			ib->n_in--;
		uint64_t idle_ms = now - still->last_used_mono_ms;
		pthread_mutex_unlock(&ib->mu);
		SC_INFO("ibverbs", "destroyed incoming QP %u from peer %s (%s; idle %" PRIu64 " ms)",
			still->qp->qp_num, still->peer, why, idle_ms);
		qp_free(still);
		return 0;
	}
}

/* At the cap: make room for requester by destroying the least recently used idle incoming QP. */
static int evict_idle_in(struct ib_backend *ib, const char *requester)
{
	char why[160];
	snprintf(why, sizeof(why), "evicted at --ib-max-qps %u to admit peer %s", ib->max_qps,
		 requester);
	if (retire_one_in(ib, requester, 0, true, why) != 0)
		return -1;
	atomic_fetch_add(&ib->top->qps_evicted, 1);
	return 0;
}

void ib_qp_expire_idle(struct ib_backend *ib)
{
	uint64_t now = sc_clock_mono_ms();
	if (now - ib->last_expire_mono_ms < IB_IN_EXPIRE_CHECK_MS) /* the completion thread's own */
		return;
	ib->last_expire_mono_ms = now;
	pthread_mutex_lock(&ib->mu);
	bool any = ib->n_in > 0;
	pthread_mutex_unlock(&ib->mu);
	if (!any)
		return;
	char why[96];
	snprintf(why, sizeof(why), "expired: its peer made no request for %" PRIu64 " s",
		 ib->in_idle_ms / 1000);
	while (retire_one_in(ib, NULL, ib->in_idle_ms, false, why) == 0)
		atomic_fetch_add(&ib->top->qps_expired, 1);
}

/* VERIFY: is the incoming QP the requester asks about still connected to it? */
static int serve_verify(struct ib_backend *ib, const char *peer_id, const struct ib_qpc *req,
			uint8_t *reply, size_t reply_cap, size_t *reply_len, struct sc_err *err)
{
	bool alive = false;
	struct ib_qp *found = NULL;
	pthread_mutex_lock(&ib->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->in_qps) {
		struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
		if (strcmp(q->peer, peer_id) == 0 && q->remote_qpn == req->qpn &&
		    q->qp->qp_num == req->prev_qpn) {
			found = q;
			break;
		}
	}
	if (found) {
		/* Under the lock, so the QP cannot be destroyed meanwhile. */
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		alive = ibv_query_qp(found->qp, &a, IBV_QP_STATE, &ia) == 0 &&
			a.qp_state == IBV_QPS_RTS;
		if (alive)
			ib_qp_touch_in_locked(ib, found); /* the peer is about to use it */
	}
	pthread_mutex_unlock(&ib->mu);
	SC_DEBUG("ibverbs", "peer %s asks about QP %u <-> %u: %s", peer_id, req->prev_qpn, req->qpn,
		 alive	 ? "alive"
		 : found ? "in error"
			 : "unknown");
	struct ib_qpc rep;
	memset(&rep, 0, sizeof(rep));
	rep.op = QPC_VERIFY_REPLY;
	rep.status = alive ? 1 : 0;
	rep.qpn = req->prev_qpn ? req->prev_qpn : 1;
	rep.mtu = ib_mtu_bytes(ib->active_mtu);
	rep.max_rd = ib->max_init_rd;
	rep.max_dest_rd = ib->max_dest_rd;
	snprintf(rep.id, sizeof(rep.id), "%s", ib->self_id);
	*reply_len = ib_qpc_encode(&rep, reply, reply_cap);
	if (*reply_len == 0)
		return sc_err_set(err, SC_INTERNAL, "QP_CONNECT verify reply does not fit");
	return 0;
}

/* The QP_CONNECT handler: runs on a peer-server connection thread, peer_id authenticated. */
static int qp_connect_handler(void *ctx, const char *peer_id, const uint8_t *body, size_t len,
			      uint8_t *reply, size_t reply_cap, size_t *reply_len,
			      struct sc_err *err)
{
	struct ib_backend *ib = ctx;
	struct ib_qpc req;
	uint8_t op = len > 1 ? body[1] : 0;
	if (ib_qpc_decode(body, len, op == QPC_VERIFY ? QPC_VERIFY : QPC_REQUEST, &req, err) != 0)
		return -1;
	if (req.lane) { /* another of this sidecar's rails: its own device, CQ and QPs */
		if (req.lane >= ib->n_lanes || !ib->lanes[req.lane])
			return sc_err_set(err, SC_UNAVAILABLE,
					  "sidecar %s has no ibverbs rail %u (it has %zu)",
					  ib->self_id, req.lane, ib->n_lanes);
		ib = ib->lanes[req.lane];
	}
	if (op == QPC_VERIFY) {
		if (strcmp(req.id, peer_id) != 0)
			return sc_err_set(err, SC_PERMISSION_DENIED,
					  "QP_CONNECT verify from \"%s\" names \"%s\"", peer_id,
					  req.id);
		return serve_verify(ib, peer_id, &req, reply, reply_cap, reply_len, err);
	}
	if (strcmp(req.id, peer_id) != 0)
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "QP_CONNECT names requester \"%s\" but the connection is sidecar "
				  "\"%s\"",
				  req.id, peer_id);

	/* Drop what the requester replaced, and its oldest beyond the per-peer cap. */
	struct ib_qp *drops[2 * IB_MAX_IN_PER_PEER + 2];
	size_t n_drops = 0;
	pthread_mutex_lock(&ib->mu);
	if (ib->xr.stopping) {
		pthread_mutex_unlock(&ib->mu);
		return sc_err_set(err, SC_UNAVAILABLE,
				  "sidecar %s is shutting down its ibverbs "
				  "backend",
				  ib->self_id);
	}
	size_t mine = 0;
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &ib->in_qps) {
		struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
		if (strcmp(q->peer, peer_id) != 0)
			continue;
		/* Replaced by the requester, a stale duplicate, or dead (an RDMA error took it). */
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		bool dead =
		    ibv_query_qp(q->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR;
		if (((req.prev_qpn && q->remote_qpn == req.prev_qpn) || q->remote_qpn == req.qpn ||
		     dead) &&
		    n_drops < sizeof(drops) / sizeof(drops[0])) {
			sc_list_remove(&q->node);
			ib->n_in--;
			drops[n_drops++] = q;
		} else {
			mine++;
		}
	}
	/* Still too many live ones: the oldest go (a requester uses its newest). */
	while (mine >= IB_MAX_IN_PER_PEER && n_drops < sizeof(drops) / sizeof(drops[0])) {
		struct ib_qp *oldest = NULL;
		sc_list_foreach(pos, &ib->in_qps) {
			struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
			if (strcmp(q->peer, peer_id) == 0 &&
			    (!oldest || q->created_mono_ms < oldest->created_mono_ms))
				oldest = q;
		}
		if (!oldest)
			break;
		sc_list_remove(&oldest->node);
		ib->n_in--;
		drops[n_drops++] = oldest;
		mine--;
	}
	bool full = ib->n_in >= ib->max_qps;
	if (!full)
		ib->n_in++; /* reserved */
	pthread_mutex_unlock(&ib->mu);
	for (size_t i = 0; i < n_drops; i++) {
		SC_INFO("ibverbs", "dropping incoming QP %u from peer %s (replaced or failed)",
			drops[i]->qp->qp_num, drops[i]->peer);
		qp_free(drops[i]);
	}
	if (full && evict_idle_in(ib, peer_id) != 0) {
		atomic_fetch_add(&ib->top->qps_refused, 1);
		SC_WARN_LIMITED("ibverbs", "ib-qps-refused",
				"refused a QP to peer %s: all %u incoming QPs (--ib-max-qps) are in "
				"use by transfers",
				peer_id, ib->max_qps);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "sidecar %s serves %u ibverbs QPs (--ib-max-qps), every one in use "
				  "by a transfer of its peer: retry once one of them ends (in seconds; "
				  "an idle one is given up at once)",
				  ib->self_id, ib->max_qps);
	}

	struct ib_qp *q = qp_create(ib, ib->cq, 0, peer_id, err);
	uint32_t psn = random_psn();
	bool notice = false; /* receives posted before the reply: the requester never meets RNR */
	int rc = !q || qp_to_init(ib, q, err) != 0 ? -1 : 0;
	if (rc == 0) {
		notice = ib_notice_post_recvs(ib, q);
		rc = qp_to_rts(ib, q, psn, &req, err);
	}
	if (rc != 0) {
		qp_free(q);
		pthread_mutex_lock(&ib->mu);
		ib->n_in--;
		pthread_mutex_unlock(&ib->mu);
		return -1;
	}
	struct ib_qpc rep;
	ib_qpc_fill_local(ib, q, QPC_REPLY, psn, &rep);
	rep.flags = notice ? QPC_F_NOTICE : 0;
	*reply_len = ib_qpc_encode(&rep, reply, reply_cap);
	if (*reply_len == 0) {
		qp_free(q);
		pthread_mutex_lock(&ib->mu);
		ib->n_in--;
		pthread_mutex_unlock(&ib->mu);
		return sc_err_set(err, SC_INTERNAL, "QP_CONNECT reply does not fit");
	}
	pthread_mutex_lock(&ib->mu);
	q->refs = 1;
	ib_qp_touch_in_locked(ib, q);
	sc_list_insert_head(&ib->in_qps, &q->node);
	pthread_mutex_unlock(&ib->mu);
	SC_INFO("ibverbs", "QP from peer %s accepted: qpn %u <-> %u, mtu %u", peer_id,
		q->qp->qp_num, q->remote_qpn, q->path_mtu);
	return 0;
}

int ib_qp_start(struct ib_backend *ib, struct sc_err *err)
{
	if (sc_peer_server_set_handler(ib->srv, SC_FRAME_QP_CONNECT, qp_connect_handler, ib) != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot register the QP_CONNECT handler");
	ib->handler_set = true;
	return 0;
}

void ib_qp_stop_handler(struct ib_backend *ib)
{
	if (!ib->handler_set)
		return;
	/* Waits for running handler calls. */
	sc_peer_server_set_handler(ib->srv, SC_FRAME_QP_CONNECT, NULL, NULL);
	ib->handler_set = false;
}

void ib_qp_async_error(struct ib_backend *ib, struct ibv_qp *ibqp, const char *what)
{
	struct ib_qp *drop = NULL, *dead = NULL;
	pthread_mutex_lock(&ib->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->out_qps) {
		struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
		if (q->qp == ibqp) {
			char why[128];
			snprintf(why, sizeof(why), "async event %s", what);
			ib_qp_fail_locked(ib, q, true, why, &drop);
			break;
		}
	}
	sc_list_foreach(pos, &ib->in_qps) {
		struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
		if (q->qp == ibqp) {
			sc_list_remove(&q->node);
			ib->n_in--;
			dead = q;
			break;
		}
	}
	pthread_mutex_unlock(&ib->mu);
	if (dead) {
		SC_WARN("ibverbs", "incoming QP %u from peer %s failed (async event %s): dropped",
			dead->qp->qp_num, dead->peer, what);
		qp_free(dead);
	}
	ib_qp_put(ib, drop);
}

void ib_qp_drop_all(struct ib_backend *ib)
{
	pthread_mutex_lock(&ib->mu);
	struct sc_list peers = SC_LIST_INIT(peers), in = SC_LIST_INIT(in);
	struct sc_list *pos, *tmp;
	sc_list_move_all(&ib->peers, &peers);
	sc_list_move_all(&ib->in_qps, &in);
	ib->n_in = 0;
	pthread_mutex_unlock(&ib->mu);
	sc_list_foreach_safe(pos, tmp, &peers) {
		struct ib_peer *p = sc_list_entry(pos, struct ib_peer, node);
		ib_qp_put(ib, p->qp); /* the cache's reference; transfers have ended */
		free(p);
	}
	sc_list_foreach_safe(pos, tmp, &in) {
		struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
		sc_list_remove(&q->node);
		qp_free(q);
	}
	pthread_mutex_lock(&ib->mu);
	size_t left = ib->n_out;
	pthread_mutex_unlock(&ib->mu);
	if (left)
		SC_WARN("ibverbs", "%zu outgoing QP(s) still referenced at stop", left);
}

/* ---- test hooks ------------------------------------------------------------------------------ */

static struct ib_backend *engine_ib(struct sc_backend *b)
{
	if (!b || b->ops->kind != SC_BACKEND_IBVERBS || !b->available)
		return NULL;
	return to_ib(b);
}

void sc_ib_test_qp_counts(struct sc_backend *b, size_t *out_qps, size_t *in_qps)
{
	struct ib_backend *ib = engine_ib(b);
	*out_qps = *in_qps = 0;
	if (!ib)
		return;
	pthread_mutex_lock(&ib->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->peers)
		*out_qps += sc_list_entry(pos, struct ib_peer, node)->qp != NULL;
	*in_qps = ib->n_in;
	pthread_mutex_unlock(&ib->mu);
}

int sc_ib_test_probe_read(struct sc_backend *b, const char *peer_id, const char *endpoint,
			  uint64_t remote_addr, uint32_t rkey, uint32_t len, int *wc_status,
			  char *status_text, size_t cap, struct sc_err *err)
{
	struct ib_backend *ib = engine_ib(b);
	if (!ib || !ib->xr.started)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "ibverbs is not running");
	int rc = -1;
	struct ibv_cq *cq = ibv_create_cq(ib->ctx, 4, NULL, NULL, 0);
	uint8_t *buf = calloc(1, len ? len : 1);
	struct ibv_mr *mr =
	    buf ? ibv_reg_mr(ib->pd, buf, len ? len : 1, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ib_qp *q = NULL;
	struct sc_peer_conn *c = NULL;
	if (!cq || !mr) {
		sc_err_set(err, SC_INTERNAL, "probe: cannot create a CQ or MR: %s",
			   strerror(errno));
		goto out;
	}
	uint64_t deadline = sc_clock_mono_ms() + 10000;
	if (sc_peer_pool_get(ib->pool, endpoint, deadline, &c, err) != 0)
		goto out;
	if (!(q = qp_create(ib, cq, 4, peer_id, err)) ||
	    rendezvous(ib, q, c, 0, deadline, NULL, err) != 0)
		goto out;
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = remote_addr, .rkey = rkey}};
	struct ibv_send_wr *bad = NULL;
	int prc = ibv_post_send(q->qp, &wr, &bad);
	if (prc != 0) {
		sc_err_set(err, SC_INTERNAL, "probe: ibv_post_send: %s", strerror(prc));
		goto out;
	}
	struct ibv_wc wc;
	int n = 0;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && sc_clock_mono_ms() < deadline)
		usleep(1000);
	if (n != 1) {
		sc_err_set(err, SC_DEADLINE_EXCEEDED, "probe: no completion within 10 s (%d)", n);
		goto out;
	}
	*wc_status = (int)wc.status;
	snprintf(status_text, cap, "%s", ibv_wc_status_str(wc.status));
	rc = 0;
out:
	sc_peer_pool_put(ib->pool, c, c && sc_peer_conn_usable(c));
	qp_free(q);
	if (mr)
		ibv_dereg_mr(mr);
	free(buf);
	if (cq)
		ibv_destroy_cq(cq);
	return rc;
}

/* ---- warming up (ConnectPeer) ---------------------------------------------------------------- */

int ib_connect(struct sc_backend *b, const struct sc_metadata *md, uint64_t deadline_mono_ms,
	       char *detail, size_t cap, struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	if (!ib->base.available)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "ibverbs is not available here: %s",
				  ib->base.detail);
	pthread_mutex_lock(&ib->mu);
	bool cached = false;
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->peers) {
		struct ib_peer *p = sc_list_entry(pos, struct ib_peer, node);
		if (strcmp(p->id, md->issuer) == 0 && p->qp)
			cached = true;
	}
	pthread_mutex_unlock(&ib->mu);
	struct ib_qp *qp = NULL;
	struct sc_peer_conn *conn = NULL;
	int endpoint = -1;
	if (ib_qp_get(ib, md, deadline_mono_ms, NULL, &qp, &conn, &endpoint, err) != 0)
		return -1;
	snprintf(detail, cap, "%s QP %u to %s (%s QP %u) on %s, control connection to %s",
		 cached ? "cached" : "new", qp->qp->qp_num, md->issuer, md->ib.device,
		 qp->remote_qpn, ib->base.rails[ib->rail >= 0 ? ib->rail : 0].name,
		 endpoint >= 0 ? md->endpoints[endpoint] : "?");
	sc_peer_pool_put(ib->pool, conn, sc_peer_conn_usable(conn));
	ib_qp_put(ib, qp);
	/* The other lanes' QPs, for striped transfers; a lane that fails here is only reported
	 * (its transfers fail over to the others). */
	for (size_t k = 1; k < ib->n_lanes; k++) {
		struct ib_backend *l = ib->lanes[k];
		struct sc_err e2;
		sc_err_clear(&e2);
		size_t used = strlen(detail);
		if (ib_qp_get(l, md, deadline_mono_ms, NULL, &qp, NULL, NULL, &e2) != 0) {
			snprintf(detail + used, cap - used, "; rail %s: %s",
				 ib->base.rails[l->rail].name, e2.msg);
			continue;
		}
		snprintf(detail + used, cap - used, "; QP %u on %s to its rail %u", qp->qp->qp_num,
			 ib->base.rails[l->rail].name, qp->remote_lane);
		ib_qp_put(l, qp);
	}
	return 0;
}
