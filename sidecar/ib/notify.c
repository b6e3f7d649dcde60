/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/notify.c: the completion notice, which takes DONE off the active side's critical path for
 * ibverbs transfers: right after a transfer's last RDMA READ/WRITE the active side posts a SEND
 * {xfer_id, status} on the same RC QP, and the passive side's completion thread turns its receive
 * completion into the passive interface's done. Ordering, when DONE is still sent, the wire
 * format and the buffers: below.
 *
 * Threads: posting runs under ib->mu on whichever thread posts data (a worker or the completion
 * thread); receive completions and their delivery to the engine run on the completion thread.
 * Owns: the notice buffers and their MRs (per QP), the received notices not yet delivered.
 */
#include "ib/internal.h"

#include "base/log.h"
#include "backend/passive.h"
#include "peer/proto.h" /* sc_peer_status_from_wire */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Ordering: RC executes a QP's requests in order, so when the passive side receives the notice
 * every RDMA WRITE before it has landed; READs get IBV_SEND_FENCE, so the SEND leaves only after
 * every READ response has arrived. The active side completes its operation when the SEND
 * completes (RC: the peer's NIC acknowledged it); the passive side's completion thread turns the
 * receive completion into the passive interface's done, once its claim (answered by the peer
 * server, which the engine's interface is handed through) confirms that the QP's
 * (authenticated) peer OPENed that transfer flagged "via ibverbs".
 *
 * Only successful transfers use it. A transfer that failed, was cancelled or ran out of time
 * still sends DONE {status} on its control connection (ib/xfer.c finish()); so does every
 * transfer to a peer whose QP_CONNECT reply does not say "notices" (an older sidecar). The
 * control connection still carries OPEN and stays the liveness signal of a running transfer.
 * A cancel (or the deadline) that lands after the notice was posted still ends the active
 * operation as the engine decided and sends DONE; the passive side may already have completed
 * from the notice by then (every byte had landed), and then refuses that DONE (logged). A notice
 * that fails (its QP failed) fails the transfer like any work request, and DONE says so.
 *
 * Wire format of a notice (NOTICE_LEN bytes, little-endian): u8 version (1), u8 type (1: done),
 * u16 status (an sc_status), u32 0, u64 xfer_id, then a NUL-padded text (the status message).
 *
 * Buffers: an outgoing QP has one NOTICE_LEN slot per send-queue record (ib_wr), so a notice's
 * slot is free exactly when its ib_wr is. An incoming QP keeps ib->notice_recvs receives posted
 * from before its QP_CONNECT reply (so the requester never meets an empty receive queue; more
 * notices than that in flight wait on RNR, which rnr_retry 7 retries for ever) and re-posts each
 * after its completion. Receive wr_ids carry RECV_MARK, the QP's generation and the slot, never a
 * pointer: a completion still queued for a QP that was destroyed meanwhile names no live QP and
 * is dropped. The buffers are freed only after ibv_destroy_qp (nothing is posted any more).
 * The CQ is sized for the receives of --ib-max-qps incoming QPs on top of the send budget: up to
 * NOTICE_RECVS each, fewer when the device's max_cqe leaves less room (at least NOTICE_MIN_RECVS,
 * else notices are off).
 */

#define NOTICE_LEN 64
#define NOTICE_VERSION 1
#define NOTICE_DONE 1
#define NOTICE_TEXT 16
/* Receives posted per incoming QP (capped by the device and the CQ; -DNOTICE_RECVS=0 builds a
 * sidecar that takes no notices, for A/B runs). */
#ifndef NOTICE_RECVS
#define NOTICE_RECVS 32
#endif
#define NOTICE_MIN_RECVS 4
#define RECV_MARK (1ull << 63)

struct ib_notice_ring {
	uint8_t *buf; /* slots * NOTICE_LEN */
	struct ibv_mr *mr;
	uint32_t slots;
};

struct ib_notice_msg {
	char peer[SC_NAME_MAX];
	uint64_t xfer_id;
	uint32_t status;
	char text[NOTICE_LEN - NOTICE_TEXT + 1];
};

uint32_t ib_notice_cq_reserve(struct ib_backend *ib, uint32_t max_cqe, uint32_t send_cqe)
{
	uint32_t room = max_cqe > send_cqe ? (max_cqe - send_cqe) / ib->max_qps : 0;
	uint32_t want = NOTICE_RECVS;
	uint32_t n = room < want ? room : want;
	if (n > ib->max_qp_wr)
		n = ib->max_qp_wr;
	ib->notice_recvs = n >= NOTICE_MIN_RECVS ? n : 0;
	if (!ib->notice_recvs)
		SC_INFO("ibverbs",
			"%s: no room for completion-notice receives (max_cqe %u, --ib-max-qps %u): "
			"DONE goes on the control connection",
			ib->dev_name, max_cqe, ib->max_qps);
	return ib->notice_recvs * ib->max_qps;
}

uint32_t ib_notice_recv_wr(const struct ib_backend *ib, bool incoming)
{
	return incoming && ib->notice_recvs ? ib->notice_recvs : 1;
}

void ib_notice_qp_init(struct ib_backend *ib, struct ib_qp *q)
{
	uint32_t slots = q->incoming ? ib->notice_recvs : q->sq_depth;
	q->gen = (uint32_t)atomic_fetch_add(&ib->notice_gen, 1) + 1;
	if (!slots)
		return;
	struct ib_notice_ring *r = calloc(1, sizeof(*r));
	if (r)
		r->buf = calloc(slots, NOTICE_LEN);
	if (r && r->buf)
		r->mr =
		    ibv_reg_mr(ib->pd, r->buf, (size_t)slots * NOTICE_LEN, IBV_ACCESS_LOCAL_WRITE);
	if (!r || !r->buf || !r->mr) {
		SC_WARN("ibverbs",
			"QP %u (peer %s): no completion-notice buffers (%s): DONE goes on the "
			"control connection",
			q->qp->qp_num, q->peer, r && r->buf ? strerror(errno) : "out of memory");
		if (r)
			free(r->buf);
		free(r);
		return;
	}
	r->slots = slots;
	q->nr = r;
}

void ib_notice_qp_fini(struct ib_qp *q)
{
	struct ib_notice_ring *r = q->nr;
	if (!r)
		return;
	q->nr = NULL;
	if (ibv_dereg_mr(r->mr) != 0)
		SC_WARN("ibverbs", "deregistering the notice buffers of peer %s: %s", q->peer,
			strerror(errno));
	free(r->buf);
	free(r);
}

static int post_recv(struct ib_qp *q, uint32_t slot)
{
	struct ib_notice_ring *r = q->nr;
	struct ibv_sge sge = {.addr = (uintptr_t)(r->buf + (size_t)slot * NOTICE_LEN),
			      .length = NOTICE_LEN,
			      .lkey = r->mr->lkey};
	struct ibv_recv_wr wr = {
	    .wr_id = RECV_MARK | ((uint64_t)q->gen << 24) | slot,
	    .sg_list = &sge,
	    .num_sge = 1,
	};
	struct ibv_recv_wr *bad = NULL;
	return ibv_post_recv(q->qp, &wr, &bad);
}

bool ib_notice_post_recvs(struct ib_backend *ib, struct ib_qp *q)
{
	(void)ib;
	if (!q->nr || !q->incoming)
		return false;
	for (uint32_t i = 0; i < q->nr->slots; i++) {
		int rc = post_recv(q, i);
		if (rc != 0) {
			/* Those posted stay posted (freed after the QP is destroyed); without the
			 * whole ring the peer is not told to send notices. */
			SC_WARN(
			    "ibverbs",
			    "incoming QP %u (peer %s): ibv_post_recv: %s: no completion notices",
			    q->qp->qp_num, q->peer, strerror(rc));
			return false;
		}
	}
	return true;
}

void ib_notice_maybe_post_locked(struct ib_backend *ib, struct ib_xfer *xf)
{
	struct ib_qp *qp = xf->qp;
	struct sc_xfer *x = xf->xr.x;
	if (xf->notice != IB_NOTICE_NONE || ib_xfer_stopped(xf) || !ib_xfer_all_posted(xf))
		return;
	if (!qp->nr || !qp->peer_notice || xf->data_only) {
		xf->notice = IB_NOTICE_UNUSED;
		return;
	}
	/* No room now: a later call (after completions) posts it. */
	if (!qp->free_wrs || qp->outstanding >= qp->sq_depth || ib->cq_out >= ib->cq_cap)
		return;
	struct ib_wr *w = qp->free_wrs;
	size_t slot = (size_t)(w - qp->wrs);
	uint8_t *m = qp->nr->buf + slot * NOTICE_LEN;
	memset(m, 0, NOTICE_LEN);
	m[0] = NOTICE_VERSION;
	m[1] = NOTICE_DONE;
	ib_put_le(m + 2, SC_OK, 2);
	ib_put_le(m + 8, x->xfer_id, 8);
	bool read = x->kind == SC_OP_READ;
	struct ibv_sge sge = {.addr = (uintptr_t)m, .length = NOTICE_LEN, .lkey = qp->nr->mr->lkey};
	struct ibv_send_wr wr = {
	    .wr_id = (uintptr_t)w,
	    .sg_list = &sge,
	    .num_sge = 1,
	    .opcode = IBV_WR_SEND,
	    /* READ: wait until every READ response is in, so the notice means "done reading". */
	    .send_flags = IBV_SEND_SIGNALED | (read ? IBV_SEND_FENCE : 0),
	};
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp->qp, &wr, &bad);
	if (rc != 0) {
		SC_WARN("ibverbs",
			"transfer %016" PRIx64 ": posting the completion notice on QP %u: %s: DONE "
			"goes on the control connection",
			x->xfer_id, qp->qp->qp_num, strerror(rc));
		xf->notice = IB_NOTICE_UNUSED;
		return;
	}
	qp->free_wrs = w->next_free;
	w->xf = xf;
	w->len = 0;
	w->read = false;
	w->notice = true;
	ib_wr_posted_locked(qp, w);
	xf->outstanding++;
	qp->outstanding++;
	ib->cq_out++;
	xf->notice = IB_NOTICE_POSTED;
}

bool ib_notice_wc_locked(struct ib_backend *ib, const struct ibv_wc *wc)
{
	if (!(wc->wr_id & RECV_MARK))
		return false;
	uint32_t gen = (uint32_t)(wc->wr_id >> 24) & 0xffffffffu;
	uint32_t slot = (uint32_t)(wc->wr_id & 0xffffff);
	struct ib_qp *q = NULL;
	struct sc_list *pos;
	sc_list_foreach(pos, &ib->in_qps) {
		struct ib_qp *it = sc_list_entry(pos, struct ib_qp, node);
		if (it->gen == gen) {
			q = it;
			break;
		}
	}
	if (!q || !q->nr || slot >= q->nr->slots)
		return true; /* its QP is gone: nothing to re-post, nobody to tell */
	if (wc->status != IBV_WC_SUCCESS) {
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			SC_WARN("ibverbs", "incoming QP %u (peer %s): receive failed: %s",
				q->qp->qp_num, q->peer, ibv_wc_status_str(wc->status));
		return true; /* the QP is in error: it is dropped on the peer's next connect */
	}
	ib_qp_touch_in_locked(ib, q);
	const uint8_t *m = q->nr->buf + (size_t)slot * NOTICE_LEN;
	bool ok = wc->opcode == IBV_WC_RECV && wc->byte_len == NOTICE_LEN &&
		  m[0] == NOTICE_VERSION && m[1] == NOTICE_DONE;
	if (ok && ib->n_notes == ib->cap_notes) {
		size_t cap = ib->cap_notes ? 2 * ib->cap_notes : 16;
		struct ib_notice_msg *grown = realloc(ib->notes, cap * sizeof(*grown));
		if (grown) {
			ib->notes = grown;
			ib->cap_notes = cap;
		}
	}
	if (!ok) {
		SC_WARN(
		    "ibverbs",
		    "incoming QP %u (peer %s): ignored a malformed completion notice (%u bytes)",
		    q->qp->qp_num, q->peer, wc->byte_len);
	} else if (ib->n_notes == ib->cap_notes) {
		/* Out of memory: the transfer's control connection ends it when it closes. */
		SC_ERROR("ibverbs", "out of memory: dropped a completion notice from peer %s",
			 q->peer);
	} else {
		struct ib_notice_msg *n = &ib->notes[ib->n_notes++];
		snprintf(n->peer, sizeof(n->peer), "%s", q->peer);
		n->status = (uint32_t)ib_get_le(m + 2, 2);
		n->xfer_id = ib_get_le(m + 8, 8);
		memcpy(n->text, m + NOTICE_TEXT, NOTICE_LEN - NOTICE_TEXT);
		n->text[NOTICE_LEN - NOTICE_TEXT] = '\0';
	}
	int rc = post_recv(q, slot);
	if (rc != 0)
		SC_WARN("ibverbs", "incoming QP %u (peer %s): re-posting a receive: %s",
			q->qp->qp_num, q->peer, strerror(rc));
	return true;
}

void ib_notice_deliver(struct ib_backend *ib)
{
	const struct sc_passive *pv = &ib->base.env.passive; /* the peer server's view */
	for (size_t i = 0; i < ib->n_notes; i++) {
		const struct ib_notice_msg *n = &ib->notes[i];
		uint8_t token[SC_TOKEN_LEN];
		if (sc_passive_claim(pv, n->peer, n->xfer_id, SC_BACKEND_IBVERBS, token) != 0) {
			SC_WARN("ibverbs",
				"ignored a completion notice from peer %s for transfer %016" PRIx64
				": that peer has no such transfer open via ibverbs here (never "
				"opened by it, or already ended by a DONE)",
				n->peer, n->xfer_id);
			continue;
		}
		struct sc_err err;
		sc_err_clear(&err);
		enum sc_status st = sc_peer_status_from_wire(n->status);
		if (sc_passive_done(pv, token, n->xfer_id, st, n->text, &err) != 0) {
			SC_INFO("ibverbs",
				"completion notice from peer %s for transfer %016" PRIx64
				" not applied: %s",
				n->peer, n->xfer_id, err.msg);
			continue;
		}
		atomic_fetch_add(&ib->n_notice_done, 1);
		SC_DEBUG("ibverbs",
			 "transfer %016" PRIx64 " from peer %s completed by its completion notice",
			 n->xfer_id, n->peer);
	}
	ib->n_notes = 0;
}

void ib_notice_stop(struct ib_backend *ib)
{
	SC_INFO("ibverbs",
		"completion notices: %" PRIu64 " sent and acknowledged, %" PRIu64
		" received and applied",
		(uint64_t)atomic_load(&ib->n_notice_sent),
		(uint64_t)atomic_load(&ib->n_notice_done));
	free(ib->notes);
	ib->notes = NULL;
	ib->n_notes = ib->cap_notes = 0;
}
