/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/xfer.c: the ibverbs data path's active side, one lane's. A transfer runs setup (a worker: a
 * QP from ib/qp.c, then OPEN on an authenticated control connection), posting (RDMA READ/WRITE
 * chunks from or into the local region's MR, a window of them in flight, the completion thread
 * posting the rest) and finish (a worker: DONE unless the completion notice, ib/notify.c, told
 * the passive side; then on_complete, once). The steps, failures and moves to a fresh QP
 * (ib/retry.c), and what the shared transfer runner keeps (backend/xfer_runner.h): below.
 *
 * Threads: submit() and cancel() run on engine threads under the engine lock (they only queue,
 * flag and wake); the runner's IB_WORKERS worker threads run setup, keep-alive pings and finish;
 * one completion thread per device polls the CQ (ibv_get_cq_event on a non-blocking channel,
 * poll() with a 100 ms timeout), the async-event fd, a wake-up eventfd and the idle control
 * connections of running transfers (a peer that dies closes them), and posts everything after
 * the first batch. Owns: the workers, the completion thread, the CQ and channel, one struct
 * ib_xfer per transfer.
 */
#include "ib/internal.h"

#include "base/log.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"
#include "base/timer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/*
 * A transfer (struct sc_xfer) runs in three steps:
 *
 *   1. setup (a worker thread): a QP to the issuing sidecar (ib/qp.c: cached or connected now),
 *      then OPEN on an authenticated control connection, flagged "via ibverbs", so the passive
 *      side checks token, uses, deadline and audience and the operation goes IN_PROGRESS. The
 *      connection stays with the transfer: if this sidecar dies, the passive side sees it close;
 *      if the passive one dies, the completion thread sees it close and flushes the transfer.
 *   2. posting (the worker posts the first batch, the completion thread the rest): each segment
 *      is cut into chunks of at most min(max_msg_sz, 1 MiB), each one signalled RDMA READ
 *      (SC_OP_READ) or RDMA WRITE from or into the local region's MR (seg->local_mr) at the
 *      segment's remote address and rkey. Up to
 *      IB_XFER_WINDOW chunks (IB_XFER_WINDOW_BYTES) of a transfer are in flight (enough to keep
 *      a NIC busy, small enough that a cancel drains quickly), bounded by the QP's send queue, its
 *      max_rd_atomic for READs and the CQ's size; every completion reports progress and posts
 *      the next chunk. Cancel, the deadline, a failed work completion or a failed QP stop the
 *      posting; the transfer then waits until every posted work request has completed or been
 *      flushed (after FLUSH_AFTER_MS the QP is moved to ERR to flush them), since region memory
 *      must not be released while the NIC may still touch it.
 *   3. finish (a worker thread): on_complete, exactly once. A transfer whose every chunk
 *      completed told the passive side already with the completion notice (ib/notify.c: a SEND
 *      posted behind its last chunk, whose completion ends step 2); any other ending, or a peer
 *      that takes no notices, sends DONE {status} on the control connection first.
 *
 * A work-completion error ends the transfer ERRORED with ibv_wc_status_str in the message and
 * takes the QP out (ib_qp_fail_locked; transport errors also tombstone the peer). The other
 * transfers on that QP, whose work requests were only flushed, move to a fresh QP (ib/retry.c,
 * the IB_TASK_MOVE task) and go on from their first byte not known complete. The passive side
 * does nothing per chunk: DONE completes it (peer/serve.c calls sc_passive_done).
 *
 * The bookkeeping is the shared transfer runner's (backend/xfer_runner.h): its workers and task
 * queue, the list of transfers in flight, the stop flag and first failure, the verdict, and the
 * cursor that cuts segments into work requests; this file says how pieces go on a QP.
 */

#define IB_WORKERS 4
#define POLL_MS 100
#define WC_BATCH 32
#define POST_BATCH 16
#define IB_SIGNAL_EVERY 4 /* of a batch's work requests, every 4th (and its last) is signalled */
/* The control connection of a long transfer is pinged this often (the peer server closes idle
 * connections after SC_PEER_SERVER_IDLE_MS). */
#define KEEPALIVE_MS 30000
/* A stopped transfer whose work requests are still out after this long gets its QP flushed:
 * well inside CancelOperation's default --cancel-wait (1 s), so a cancel ends with the memory
 * quiet even when the link drains slowly (the QP's other transfers move to a fresh one). */
#define FLUSH_AFTER_MS 500
/* stop() waits this long for transfers to end before flushing every QP. */
#define STOP_WAIT_MS 20000
#define CQ_ENTRIES 4096

static void wake_cq(struct ib_backend *ib)
{
	uint64_t one = 1;
	ssize_t n = write(ib->wake_fd, &one, sizeof(one));
	(void)n;
}

static void queue_task_locked(struct ib_backend *ib, struct ib_xfer *xf, enum ib_task task)
{
	xf->task = task;
	sc_xr_queue_locked(&ib->xr, &xf->run);
}

/* Record the transfer's first failure and stop it. A transfer already stopping (cancelled, or
 * failed) keeps its first reason. Under ib->mu. */
#define xfer_fail_locked(xf, ...) sc_xr_fail_locked(&(xf)->xr, false, __VA_ARGS__)

static void xfer_stop_locked(struct ib_xfer *xf)
{
	sc_xr_stop_locked(&xf->xr);
}

/* Take a QP out of service from the transfer path. The cache's reference is dropped in place:
 * it is never the last, since the transfer calling this holds one. Under ib->mu. */
static void fail_qp_locked(struct ib_backend *ib, struct ib_qp *qp, bool tombstone, const char *why)
{
	struct ib_qp *drop = NULL;
	ib_qp_fail_locked(ib, qp, tombstone, why, &drop);
	if (drop)
		drop->refs--;
}

static uint64_t now_us(void)
{
	return sc_clock_mono_us();
}

/* ---- finish (worker) ------------------------------------------------------------------------- */

static void finish(struct ib_xfer *xf)
{
	struct ib_backend *ib = xf->ib;
	struct sc_xfer *x = xf->xr.x;
	char msg[SC_ERR_MSG_MAX];
	/* A cancel wins even when the bytes in flight all landed: the engine has already ended
	 * the operation CANCELLED, and both sides must agree. */
	enum sc_status status = sc_xr_verdict(&ib->xr, &xf->xr, xf->bytes_acked, true, msg,
					      sizeof(msg));

	struct sc_peer_conn *c = xf->conn;
	xf->conn = NULL;
	/* The notice completed (RC: the peer's NIC has it) and nothing failed: the passive side
	 * completes from it, no DONE round trip. */
	bool noticed = xf->notice == IB_NOTICE_POSTED && status == SC_OK;
	if (noticed)
		atomic_fetch_add(&ib->n_notice_sent, 1);
	bool moved = status == SC_UNAVAILABLE &&
		     ib_hand_to_tcp(ib, x, c, xf->opened, msg, ib->rail >= 0 ? 1 : 0, &ib->rail);
	if (moved)
		status = SC_ABORTED;
	if (xf->opened && !noticed && !moved) {
		sc_peer_tell_verdict(ib->pool, &c, x->meta->endpoints[xf->endpoint], x->meta->token,
				     x->xfer_id, x->deadline_mono_ms, &status, msg, sizeof(msg),
				     "ibverbs");
	}
	sc_peer_pool_put(ib->pool, c, c && sc_peer_conn_usable(c));
	ib_qp_put(ib, xf->qp);
	xf->qp = NULL;
	if (xf->t_acked_us)
		SC_DEBUG("ibverbs",
			 "transfer %016" PRIx64 ": %" PRIu64 " bytes; setup+OPEN %" PRIu64
			 " us, to first post %" PRIu64 " us, data %" PRIu64 " us, DONE %" PRIu64
			 " us%s",
			 x->xfer_id, x->total, xf->t_opened_us - xf->t_submit_us,
			 xf->t_posted_us - xf->t_opened_us, xf->t_acked_us - xf->t_posted_us,
			 now_us() - xf->t_acked_us,
			 noticed ? " (completion notice acknowledged)" : "");
	if (status != SC_OK && status != SC_CANCELLED)
		SC_INFO_KV("ibverbs", IB_XFER_FIELDS(x),
			   "transfer %016" PRIx64 " with %s ended %s: %s", x->xfer_id,
			x->meta->issuer, sc_status_name(status), msg);

	pthread_mutex_lock(&ib->mu);
	sc_xr_retire_locked(&ib->xr, &xf->xr);
	pthread_mutex_unlock(&ib->mu);
	free(xf);
	sc_xr_complete(x, status, msg);
}

/* ---- moving a transfer to tcp ---------------------------------------------------------------- */

bool ib_hand_to_tcp(struct ib_backend *ib, struct sc_xfer *x, struct sc_peer_conn *c, bool opened,
		    const char *msg, size_t n_rails, const int *rails)
{
	if (!sc_peer_take_back(c, x, opened, msg, "ibverbs"))
		return false;
	for (size_t i = 0; i < n_rails; i++)
		if (rails[i] >= 0)
			atomic_fetch_add_explicit(&ib->top->rails[rails[i]].failovers, 1,
						  memory_order_relaxed);
	return true;
}

/* ---- setup and keep-alive (worker) ----------------------------------------------------------- */

static void post_more(struct ib_backend *ib, struct ib_xfer *xf);

static void setup(struct ib_xfer *xf)
{
	struct ib_backend *ib = xf->ib;
	struct sc_xfer *x = xf->xr.x;
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_peer_conn *c = NULL;
	if (atomic_load(&x->cancel_requested))
		goto fail;
	if (xf->data_only) { /* a slice: the striped transfer holds the OPEN */
		if (ib_qp_get(ib, x->meta, x->deadline_mono_ms, &x->cancel_requested, &xf->qp,
			      NULL, NULL, &err) != 0)
			goto fail;
		goto running;
	}
	for (int tries = 0;; tries++) {
		struct ib_qp *qp = NULL;
		if (ib_qp_get(ib, x->meta, x->deadline_mono_ms, &x->cancel_requested, &qp, &c,
			      &xf->endpoint, &err) != 0)
			goto fail;
		pthread_mutex_lock(&ib->mu);
		xf->qp = qp;
		pthread_mutex_unlock(&ib->mu);
		if (!c && !(c = sc_peer_pool_get_issuer(ib->pool, x->meta, x->deadline_mono_ms,
						&x->cancel_requested, &xf->endpoint, &err)))
			goto fail;
		if (sc_peer_open_xfer(c, x, SC_BACKEND_IBVERBS, &err) == 0)
			break;
		/* After a refused OPEN the connection is still good; one broken mid-OPEN is closed
		 * (the server abandons whatever it may have opened). A pooled one that the peer
		 * closed just then (it gave up our idle QP to admit another peer, ib/qp.c, and
		 * closed our connections with it) is no failure of this transfer: once more, on a
		 * fresh connection, which checks the QP with the peer first. */
		bool again = tries == 0 && sc_peer_conn_reused(c) && !sc_peer_conn_usable(c) &&
			     err.code != SC_CANCELLED && !atomic_load(&x->cancel_requested) &&
			     !sc_xr_deadline_passed(x, sc_clock_mono_ms());
		sc_peer_pool_put(ib->pool, c, sc_peer_conn_usable(c));
		c = NULL;
		if (!again)
			goto fail;
		SC_INFO_KV("ibverbs", IB_XFER_FIELDS(x),
			"transfer %016" PRIx64 ": the control connection to %s closed under the OPEN "
			"(%s): once more on a fresh one",
			x->xfer_id, x->meta->issuer, err.msg);
		sc_err_clear(&err);
		pthread_mutex_lock(&ib->mu);
		xf->qp = NULL;
		pthread_mutex_unlock(&ib->mu);
		ib_qp_put(ib, qp);
	}
	SC_DEBUG("ibverbs",
		 "transfer %016" PRIx64 ": opened on %s, QP %u, %zu segment(s), %" PRIu64 " bytes",
		 x->xfer_id, x->meta->issuer, xf->qp->qp->qp_num, x->n_segs, x->total);
running:
	pthread_mutex_lock(&ib->mu);
	xf->conn = c;
	xf->opened = c != NULL;
	xf->task = IB_TASK_NONE;
	xf->state = IB_XS_RUNNING;
	xf->last_ping_mono_ms = sc_clock_mono_ms();
	xf->last_progress_mono_ms = xf->last_ping_mono_ms;
	xf->t_opened_us = now_us();
	/* The first work requests go out from here, saving the hand-over to the completion
	 * thread; it posts the rest as completions come back. */
	if (!atomic_load(&x->cancel_requested) && !ib->xr.stopping && !xf->qp->broken)
		post_more(ib, xf);
	pthread_mutex_unlock(&ib->mu);
	wake_cq(ib);
	return;
fail:
	pthread_mutex_lock(&ib->mu);
	if (err.code != SC_OK && !atomic_load(&x->cancel_requested))
		xfer_fail_locked(xf, err.code, "%s", err.msg);
	xfer_stop_locked(xf);
	xf->state = IB_XS_FINISHING;
	xf->task = IB_TASK_NONE;
	xf->conn = c;
	pthread_mutex_unlock(&ib->mu);
	finish(xf);
}

static void ping(struct ib_xfer *xf)
{
	struct ib_backend *ib = xf->ib;
	struct sc_err err;
	sc_err_clear(&err);
	int rc = sc_peer_ping(xf->conn, sc_clock_mono_ms() + 10000, &xf->xr.x->cancel_requested, &err);
	pthread_mutex_lock(&ib->mu);
	xf->task = IB_TASK_NONE;
	xf->last_ping_mono_ms = sc_clock_mono_ms();
	if (rc != 0 && err.code != SC_CANCELLED)
		xfer_fail_locked(xf, SC_UNAVAILABLE, "lost the control connection to peer %s: %s",
				 xf->xr.x->meta->issuer, err.msg);
	if (xf->want_finish) {
		xf->want_finish = false;
		queue_task_locked(ib, xf, IB_TASK_FINISH);
	}
	pthread_mutex_unlock(&ib->mu);
	wake_cq(ib);
}

/* xf's QP failed under it and its work requests are back: go on on a fresh QP (ib/retry.c). */
static void move_qp(struct ib_xfer *xf)
{
	struct ib_backend *ib = xf->ib;
	struct sc_err err;
	sc_err_clear(&err);
	struct ib_qp *fresh = NULL, *old = NULL;
	int rc = ib_retry_fresh_qp(xf, &fresh, &err);
	pthread_mutex_lock(&ib->mu);
	xf->task = IB_TASK_NONE;
	if (rc != 0) {
		if (err.code != SC_CANCELLED)
			xfer_fail_locked(xf, err.code,
					 "the QP to peer %s failed under this transfer (%s) after "
					 "%" PRIu64 " of %" PRIu64 " bytes; moving it to a fresh QP "
					 "failed: %s",
					 xf->qp->peer, xf->qp->why, xf->bytes_acked, xf->xr.x->total,
					 err.msg);
		xfer_stop_locked(xf);
		xf->moving = false;
	} else if (ib_xfer_stopped(xf) || xf->state != IB_XS_RUNNING) {
		old = fresh; /* cancelled or expired meanwhile */
		xf->moving = false;
	} else {
		ib_retry_resume_locked(xf, fresh, &old);
		if (!ib->xr.stopping)
			post_more(ib, xf);
	}
	if (xf->want_finish) {
		xf->want_finish = false;
		queue_task_locked(ib, xf, IB_TASK_FINISH);
	}
	pthread_mutex_unlock(&ib->mu);
	ib_qp_put(ib, old);
	wake_cq(ib);
}

/* A worker runs the task queued for xf (xf->task, set under ib->mu before it was queued). */
static void run_task(struct sc_xr_task *t)
{
	struct ib_xfer *xf = container_of(t, struct ib_xfer, run);
	struct sc_xfer_log_scope scope;
	sc_xfer_log_scope_enter(&scope, xf->xr.x, "ibverbs");
	switch (xf->task) {
	case IB_TASK_SETUP:
		setup(xf);
		break;
	case IB_TASK_PING:
		ping(xf);
		break;
	case IB_TASK_FINISH:
		finish(xf);
		break;
	case IB_TASK_MOVE:
		move_qp(xf);
		break;
	case IB_TASK_NONE:
		break;
	}
	sc_xfer_log_scope_leave(&scope);
}

/* ---- a stalled path (completion thread) ---------------------------------------------------- */

/* Work requests are out, none of this transfer's has completed for --ib-stall-timeout, and the
 * QP is not already failing: the path stalled (a NIC or link that stopped answering; Soft-RoCE
 * retransmits forever where a NIC would report retry-exceeded). Under ib->mu. */
static bool stalled_locked(const struct ib_backend *ib, const struct ib_xfer *xf, uint64_t now)
{
	return ib->stall_ms && xf->outstanding && !xf->moving && !xf->qp->broken &&
	       xf->last_progress_mono_ms && now - xf->last_progress_mono_ms >= ib->stall_ms;
}

/* Stop the transfer (UNAVAILABLE: finish() may then hand it to tcp) and flush the QP, whose other
 * transfers move to a fresh one; the peer is tombstoned for a while. Under ib->mu. */
static void stall_locked(struct ib_backend *ib, struct ib_xfer *xf, uint64_t now)
{
	const char *rail = ib->rail >= 0 ? ib->top->rails[ib->rail].name : ib->dev_name;
	xfer_fail_locked(xf, SC_UNAVAILABLE,
			 "the RDMA path to peer %s stalled: no work request of this transfer completed "
			 "for %" PRIu64 " ms (--ib-stall-timeout) on rail %s, %" PRIu64 " of %" PRIu64
			 " bytes moved",
			 xf->qp->peer, now - xf->last_progress_mono_ms, rail, xf->bytes_acked,
			 xf->xr.x->total);
	xfer_stop_locked(xf);
	SC_WARN_KV("ibverbs", IB_XFER_FIELDS(xf->xr.x),
		   "transfer %016" PRIx64 ": no completion for %" PRIu64
		" ms from peer %s on rail %s: flushing QP %u",
		xf->xr.x->xfer_id, now - xf->last_progress_mono_ms, xf->qp->peer, rail,
		xf->qp->qp->qp_num);
	if (ib->rail >= 0)
		atomic_fetch_add_explicit(&ib->top->rails[ib->rail].errors, 1, memory_order_relaxed);
	fail_qp_locked(ib, xf->qp, true, "stalled: no completion within --ib-stall-timeout");
	ib_qp_flush(xf->qp);
}

/* ---- posting and completions (completion thread) --------------------------------------------- */

/* A work request's pieces go on while the remote run does: the next segment's remote range starts
 * where this one ends, under the same rkey (one window per region makes that common). */
static bool remote_run_goes_on(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
			       const struct sc_xfer_seg *next)
{
	(void)first;
	return next->rkey == prev->rkey && next->remote_addr == prev->remote_addr + prev->len;
}

/*
 * The next work request of xf from its cursor: one chunk of the current segment, then, while the
 * remote run goes on and the request has room, pieces of the following segments as more
 * scatter/gather entries, wherever their local memory lies. Fills sge[] and returns the entry
 * count (0: nothing left); *len, *raddr and *rkey receive the request's bytes and remote start.
 * Under ib->mu.
 */
static int next_wr(struct ib_backend *ib, struct ib_xfer *xf, bool read, struct ibv_sge *sge,
		   uint32_t *len, uint64_t *raddr, uint32_t *rkey)
{
	struct sc_xr_piece pieces[IB_MAX_SGE];
	uint32_t max_sge = read ? ib->max_sge_rd : ib->max_sge;
	size_t n = sc_xr_cursor_take(&xf->cur, xf->xr.x, ib->max_msg,
				     max_sge < IB_MAX_SGE ? max_sge : IB_MAX_SGE, remote_run_goes_on,
				     pieces);
	uint32_t total = 0;
	for (size_t i = 0; i < n; i++) {
		const struct sc_xr_piece *p = &pieces[i];
		const struct ibv_mr *mr = p->seg->local_mr;
		sge[i] = (struct ibv_sge){.addr = (uintptr_t)(p->seg->local + p->off),
					  .length = (uint32_t)p->len, .lkey = mr->lkey};
		total += (uint32_t)p->len;
	}
	if (n) {
		*raddr = pieces[0].seg->remote_addr + pieces[0].off;
		*rkey = pieces[0].seg->rkey;
	}
	*len = total;
	return (int)n;
}

/* Post as many work requests of xf as the window and the QP allow, chained: one doorbell per
 * batch. Under ib->mu. */
static void post_more(struct ib_backend *ib, struct ib_xfer *xf)
{
	struct ib_qp *qp = xf->qp;
	struct sc_xfer *x = xf->xr.x;
	bool read = x->kind == SC_OP_READ;
	struct ibv_send_wr wrs[POST_BATCH];
	struct ibv_sge sges[POST_BATCH][IB_MAX_SGE];
	int n = 0;
	while (n < POST_BATCH && xf->outstanding < IB_XFER_WINDOW &&
	       xf->bytes_out < IB_XFER_WINDOW_BYTES && qp->free_wrs &&
	       qp->outstanding < qp->sq_depth && ib->cq_out < ib->cq_cap &&
	       (!read || qp->reads_out < qp->max_rd)) {
		uint32_t len, rkey = 0;
		uint64_t raddr = 0;
		int nsge = next_wr(ib, xf, read, sges[n], &len, &raddr, &rkey);
		if (nsge == 0)
			break;
		struct ib_wr *w = qp->free_wrs;
		qp->free_wrs = w->next_free;
		w->xf = xf;
		w->len = len;
		w->read = read;
		w->notice = false;
		wrs[n] = (struct ibv_send_wr){
		    .wr_id = (uintptr_t)w,
		    .sg_list = sges[n],
		    .num_sge = nsge,
		    .opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
		    /* Selective signalling: every IB_SIGNAL_EVERY-th and the batch's last. */
		    .send_flags = (n + 1) % IB_SIGNAL_EVERY == 0 ? IBV_SEND_SIGNALED : 0,
		    .wr.rdma = {.remote_addr = raddr, .rkey = rkey},
		};
		if (n > 0)
			wrs[n - 1].next = &wrs[n];
		xf->outstanding++;
		xf->bytes_out += len;
		qp->outstanding++;
		qp->reads_out += read;
		ib->cq_out++;
		n++;
	}
	if (n == 0) {
		ib_notice_maybe_post_locked(ib, xf);
		return;
	}
	if (!xf->t_posted_us)
		xf->t_posted_us = now_us();
	qp->last_used_mono_ms = sc_clock_mono_ms();
	wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp->qp, wrs, &bad);
	for (int i = 0; i < n && (rc == 0 || &wrs[i] != bad); i++)
		ib_wr_posted_locked(qp, (struct ib_wr *)(uintptr_t)wrs[i].wr_id);
	if (rc == 0) {
		ib_notice_maybe_post_locked(ib, xf);
		return;
	}
	/* Take back what was not posted (bad and after); the transfer ends. */
	for (struct ibv_send_wr *wr = bad; wr; wr = wr->next) {
		struct ib_wr *w = (struct ib_wr *)(uintptr_t)wr->wr_id;
		xf->outstanding--;
		xf->bytes_out -= w->len;
		qp->outstanding--;
		qp->reads_out -= w->read;
		ib->cq_out--;
		w->next_free = qp->free_wrs;
		qp->free_wrs = w;
	}
	char why[160];
	snprintf(why, sizeof(why), "ibv_post_send: %s", strerror(rc));
	fail_qp_locked(ib, qp, false, why);
	xfer_fail_locked(xf, SC_INTERNAL, "RDMA %s to peer %s could not be posted: %s",
			 read ? "READ" : "WRITE", x->meta->issuer, why);
}

/* Whether a failed work completion is the connection's fault (tombstone the peer) rather than
 * this operation's (the peer revoked access, a bad address). */
static bool transport_error(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
	case IBV_WC_FATAL_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_GENERAL_ERR:
		return true;
	default:
		return false;
	}
}

static void wc_error_locked(struct ib_backend *ib, const struct ibv_wc *wc, struct ib_wr *w)
{
	struct ib_xfer *xf = w->xf;
	struct ib_qp *qp = w->qp;
	const char *op = w->notice ? "SEND (completion notice)" : w->read ? "READ" : "WRITE";
	const char *peer = qp->peer;
	if (wc->status == IBV_WC_WR_FLUSH_ERR) {
		fail_qp_locked(ib, qp, false, "work requests flushed");
		/* A flushed notice told nothing: DONE tells the verdict instead, unless the move
		 * below re-posts the notice on the fresh QP (ib_retry_resume_locked). */
		if (w->notice)
			xf->notice = IB_NOTICE_UNUSED;
		/* Not this transfer's fault: it moves to a fresh QP, up to IB_XFER_MOVES times. */
		if (ib_retry_begin_locked(xf) < 0)
			xfer_fail_locked(xf, SC_UNAVAILABLE,
					 "RDMA %s to peer %s flushed: its QP failed: %s (after %d "
					 "moves to a fresh QP, the limit)",
					 op, peer, qp->why, IB_XFER_MOVES);
		return;
	}
	char why[200];
	snprintf(why, sizeof(why), "%s (status %d, vendor error 0x%x) on an RDMA %s of %u bytes",
		 ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err, op, w->len);
	fail_qp_locked(ib, qp, transport_error(wc->status), why);
	if (ib->rail >= 0)
		atomic_fetch_add_explicit(&ib->top->rails[ib->rail].errors, 1, memory_order_relaxed);
	switch (wc->status) {
	case IBV_WC_REM_ACCESS_ERR:
		xfer_fail_locked(xf, SC_FAILED_PRECONDITION,
				 "peer %s refused the RDMA %s: %s: its operation has ended "
				 "(cancelled, expired or completed) and its access was revoked",
				 peer, op, ibv_wc_status_str(wc->status));
		break;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		xfer_fail_locked(xf, SC_UNAVAILABLE,
				 "peer %s did not answer the RDMA %s: %s (is its sidecar alive and "
				 "reachable on %s?)",
				 peer, op, ibv_wc_status_str(wc->status), ib->dev_name);
		break;
	default:
		xfer_fail_locked(xf, SC_INTERNAL, "RDMA %s with peer %s failed: %s", op, peer, why);
		break;
	}
}

/* Retire the first work request of qp's posted list: with its completion wc, or, NULL, as
 * completed by a later signalled one. Under ib->mu, completion thread. */
static void wr_retire_locked(struct ib_backend *ib, struct ib_qp *qp, const struct ibv_wc *wc)
{
	struct ib_wr *w = qp->posted_head;
	if (!w || (wc && (struct ib_wr *)(uintptr_t)wc->wr_id != w)) {
		/* Cannot be: completions come in posting order. Retire it alone. */
		SC_ERROR("ibverbs", "QP %u: a completion out of posting order", qp->qp->qp_num);
		w = (struct ib_wr *)(uintptr_t)wc->wr_id;
		struct ib_wr **pp = &qp->posted_head;
		struct ib_wr *prev = NULL;
		while (*pp && *pp != w) {
			prev = *pp;
			pp = &(*pp)->posted_next;
		}
		if (*pp)
			*pp = w->posted_next;
		if (qp->posted_tail == w)
			qp->posted_tail = prev;
	} else {
		qp->posted_head = w->posted_next;
		if (!qp->posted_head)
			qp->posted_tail = NULL;
	}
	struct ib_xfer *xf = w->xf;
	qp->outstanding--;
	qp->reads_out -= w->read;
	ib->cq_out--;
	xf->outstanding--;
	xf->bytes_out -= w->len;
	if (!wc || wc->status == IBV_WC_SUCCESS) {
		qp->last_ok_mono_ms = sc_clock_mono_ms();
		xf->bytes_acked += w->len;
		xf->progress += w->len;
		xf->last_progress_mono_ms = qp->last_ok_mono_ms;
		sc_rail_add_bytes(ib->top, xf->xr.x, (size_t)ib->rail, w->len);
	} else {
		wc_error_locked(ib, wc, w);
	}
	w->xf = NULL;
	w->posted_next = NULL;
	w->next_free = qp->free_wrs;
	qp->free_wrs = w;
}

struct progress {
	struct ib_xfer *xf;
	uint64_t delta;
};

/* Poll the CQ empty and report progress (outside the lock). Completion thread. */
static void drain_cq(struct ib_backend *ib, struct progress **prog, size_t *prog_cap)
{
	struct ibv_wc wc[WC_BATCH];
	size_t n_prog = 0;
	for (;;) {
		pthread_mutex_lock(&ib->mu);
		int n = ibv_poll_cq(ib->cq, WC_BATCH, wc);
		if (n < 0)
			SC_ERROR("ibverbs", "ibv_poll_cq on %s failed (%d)", ib->dev_name, n);
		for (int i = 0; i < n; i++) {
			if (ib_notice_wc_locked(ib, &wc[i]))
				continue; /* a receive on an incoming QP */
			struct ib_wr *w = (struct ib_wr *)(uintptr_t)wc[i].wr_id;
			struct ib_qp *qp = w->qp;
			/* The unsignalled ones posted before it on this QP completed too. */
			while (qp->posted_head && qp->posted_head != w)
				wr_retire_locked(ib, qp, NULL);
			wr_retire_locked(ib, qp, &wc[i]);
		}
		/* Progress to report: one entry per transfer with news. */
		if (n > 0) {
			if (*prog_cap < ib->xr.n_live) {
				size_t cap = ib->xr.n_live * 2;
				struct progress *p = realloc(*prog, cap * sizeof(*p));
				if (p) {
					*prog = p;
					*prog_cap = cap;
				}
			}
			n_prog = 0;
			struct ib_xfer *xf;
			IB_FOR_EACH_XFER(ib, xf) {
				if (n_prog >= *prog_cap)
					break;
				if (xf->progress) {
					(*prog)[n_prog++] = (struct progress){xf, xf->progress};
					xf->progress = 0;
				}
			}
		}
		pthread_mutex_unlock(&ib->mu);
		ib_notice_deliver(ib);
		/* Transfers cannot finish meanwhile: only this thread queues their FINISH. */
		for (size_t i = 0; i < n_prog; i++)
			(*prog)[i].xf->xr.x->on_progress((*prog)[i].xf->xr.x, (*prog)[i].delta);
		n_prog = 0;
		if (n < WC_BATCH)
			break;
	}
}

/* Post, check stop conditions, queue finishes and keep-alives. Completion thread. */
static void tick(struct ib_backend *ib)
{
	pthread_mutex_lock(&ib->mu);
	uint64_t now = sc_clock_mono_ms();
	struct ib_xfer *xf;
	IB_FOR_EACH_XFER(ib, xf) {
		if (xf->state != IB_XS_RUNNING)
			continue;
		struct sc_xfer *x = xf->xr.x;
		if (!ib_xfer_stopped(xf)) {
			if (atomic_load(&x->cancel_requested) || ib->xr.stopping)
				xfer_stop_locked(xf);
			else if (sc_xr_deadline_passed(x, now))
				xfer_fail_locked(xf, SC_DEADLINE_EXCEEDED,
						 "deadline passed with %" PRIu64 " of %" PRIu64
						 " bytes moved",
						 xf->bytes_acked, x->total);
			else if (xf->qp->broken && ib_retry_begin_locked(xf) < 0)
				xfer_fail_locked(xf, SC_UNAVAILABLE,
						 "the QP to peer %s failed: %s (after %d moves to a "
						 "fresh QP, the limit)",
						 xf->qp->peer, xf->qp->why, IB_XFER_MOVES);
			else if (stalled_locked(ib, xf, now))
				stall_locked(ib, xf, now);
		}
		if (xf->moving && ib_xfer_stopped(xf))
			xf->moving = false; /* cancelled or expired while waiting to move */
		if (xf->moving) {
			/* Once its work requests are back (and a ping in progress returned). */
			if (xf->outstanding == 0 && xf->task == IB_TASK_NONE)
				queue_task_locked(ib, xf, IB_TASK_MOVE);
			continue;
		}
		if (!ib_xfer_stopped(xf) && !xf->qp->broken)
			post_more(ib, xf);
		/* All posted, the completion notice included when the QP takes one. */
		bool all_posted = ib_xfer_all_posted(xf) && xf->notice != IB_NOTICE_NONE;
		if (xf->outstanding == 0 && (ib_xfer_stopped(xf) || all_posted)) {
			xf->state = IB_XS_FINISHING;
			xf->t_acked_us = now_us();
			if (xf->task != IB_TASK_NONE)
				xf->want_finish = true; /* after the ping in progress */
			else
				queue_task_locked(ib, xf, IB_TASK_FINISH);
			continue;
		}
		if (ib_xfer_stopped(xf) && xf->outstanding && now - xf->xr.stop_mono_ms >= FLUSH_AFTER_MS &&
		    !xf->qp->flushing) {
			SC_WARN("ibverbs",
				"transfer %016" PRIx64 ": %u work request(s) still out %" PRIu64
				" ms after it stopped: flushing QP %u to peer %s",
				x->xfer_id, xf->outstanding, now - xf->xr.stop_mono_ms,
				xf->qp->qp->qp_num, xf->qp->peer);
			fail_qp_locked(ib, xf->qp, false, "flushed to end a stopped transfer");
			ib_qp_flush(xf->qp);
		}
		if (!ib_xfer_stopped(xf) && xf->task == IB_TASK_NONE && xf->conn &&
		    now - xf->last_ping_mono_ms >= KEEPALIVE_MS)
			queue_task_locked(ib, xf, IB_TASK_PING);
	}
	pthread_mutex_unlock(&ib->mu);
}

static void handle_async(struct ib_backend *ib)
{
	struct ibv_async_event ev;
	while (ibv_get_async_event(ib->ctx, &ev) == 0) {
		enum ibv_event_type type = ev.event_type;
		const char *name = ibv_event_type_str(type);
		switch (type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_PATH_MIG_ERR: {
			struct ibv_qp *qp = ev.element.qp;
			/* Ack first: destroying the QP waits for its events to be acked. */
			ibv_ack_async_event(&ev);
			ib_qp_async_error(ib, qp, name);
			continue;
		}
		case IBV_EVENT_PORT_ERR:
			SC_WARN("ibverbs",
				"%s port %d went down (%s): transfers will fail until it "
				"is back",
				ib->dev_name, ev.element.port_num, name);
			ib_rails_port_event(ib, (uint8_t)ev.element.port_num, false, name);
			break;
		case IBV_EVENT_PORT_ACTIVE:
			SC_INFO("ibverbs", "%s port %d is active again", ib->dev_name,
				ev.element.port_num);
			ib_rails_port_event(ib, (uint8_t)ev.element.port_num, true, name);
			break;
		case IBV_EVENT_DEVICE_FATAL:
		case IBV_EVENT_CQ_ERR:
			SC_ERROR("ibverbs",
				 "%s: %s: ibverbs transfers will fail; restart the sidecar",
				 ib->dev_name, name);
			break;
		default:
			SC_DEBUG("ibverbs", "%s: async event %s", ib->dev_name, name);
			break;
		}
		ibv_ack_async_event(&ev);
	}
}

/*
 * The poll set: the CQ channel, the async-event fd, the wake-up eventfd, then the control
 * connection of every running transfer that has no request out on it. The peer server never
 * speaks first, so such a connection turning readable (EOF, reset, or stray bytes) means the
 * passive sidecar is gone or broken: its RDMA will not complete, so the transfer stops now rather
 * than when RDMA retries (or the next keep-alive) give up. Completion thread, under ib->mu.
 */
struct pollset {
	struct pollfd *fds;
	struct ib_xfer **xfs; /* [i - 3]: the transfer of fds[i] */
	size_t n, cap;
};

static void pollset_build_locked(struct ib_backend *ib, struct pollset *ps)
{
	size_t want = 3 + ib->xr.n_live;
	if (ps->cap < want) {
		struct pollfd *f = realloc(ps->fds, want * sizeof(*f));
		if (f)
			ps->fds = f;
		struct ib_xfer **x = realloc(ps->xfs, want * sizeof(*x));
		if (x)
			ps->xfs = x;
		if (f && x)
			ps->cap = want;
	}
	ps->n = 0;
	if (ps->cap < 3)
		return; /* out of memory: the caller retries */
	ps->n = 3;
	ps->fds[0] = (struct pollfd){.fd = ib->chan->fd, .events = POLLIN};
	ps->fds[1] = (struct pollfd){.fd = ib->ctx->async_fd, .events = POLLIN};
	ps->fds[2] = (struct pollfd){.fd = ib->wake_fd, .events = POLLIN};
	struct ib_xfer *xf;
	IB_FOR_EACH_XFER(ib, xf) {
		if (ps->n >= ps->cap)
			break;
		if (xf->state != IB_XS_RUNNING || ib_xfer_stopped(xf) || !xf->conn ||
		    xf->task != IB_TASK_NONE)
			continue;
		ps->xfs[ps->n - 3] = xf;
		ps->fds[ps->n++] =
		    (struct pollfd){.fd = sc_peer_conn_fd(xf->conn), .events = POLLIN | POLLRDHUP};
	}
}

/* Fail the transfers whose control connection spoke. Under ib->mu. */
static void pollset_check_locked(struct ib_backend *ib, const struct pollset *ps)
{
	for (size_t i = 3; i < ps->n; i++) {
		if (!ps->fds[i].revents)
			continue;
		struct ib_xfer *xf = ps->xfs[i - 3];
		bool live = false;
		struct ib_xfer *it;
		IB_FOR_EACH_XFER(ib, it) {
			if ((live = it == xf))
				break;
		}
		if (!live || xf->state != IB_XS_RUNNING || xf->task != IB_TASK_NONE)
			continue;
		sc_peer_conn_abort(xf->conn); /* its stream state is unknown now */
		xfer_fail_locked(xf, SC_UNAVAILABLE,
				 "peer sidecar %s closed the control connection mid-transfer (it "
				 "stopped or died) after %" PRIu64 " of %" PRIu64 " bytes",
				 xf->xr.x->meta->issuer, xf->bytes_acked, xf->xr.x->total);
		SC_WARN_KV("ibverbs", IB_XFER_FIELDS(xf->xr.x), "transfer %016" PRIx64 ": %s",
			   xf->xr.x->xfer_id, xf->xr.msg);
		/* Its work requests will not complete against a dead peer: flush them now. */
		fail_qp_locked(ib, xf->qp, false, "the peer closed its control connection");
		ib_qp_flush(xf->qp);
	}
}

static void *cq_main(void *arg)
{
	struct ib_backend *ib = arg;
	struct progress *prog = NULL;
	size_t prog_cap = 0;
	struct pollset ps = {0};
	if (ibv_req_notify_cq(ib->cq, 0) != 0)
		SC_ERROR("ibverbs", "ibv_req_notify_cq: %s", strerror(errno));
	while (!atomic_load(&ib->cq_stop)) {
		pthread_mutex_lock(&ib->mu);
		pollset_build_locked(ib, &ps);
		pthread_mutex_unlock(&ib->mu);
		if (ps.n == 0) {
			SC_ERROR("ibverbs", "completion thread: out of memory");
			usleep(POLL_MS * 1000);
			continue;
		}
		int n = poll(ps.fds, (nfds_t)ps.n, POLL_MS);
		if (n < 0 && errno != EINTR)
			SC_ERROR("ibverbs", "completion thread: poll: %s", strerror(errno));
		if (n > 0 && (ps.fds[2].revents & POLLIN)) {
			uint64_t v;
			ssize_t r = read(ib->wake_fd, &v, sizeof(v));
			(void)r;
		}
		if (n > 0 && (ps.fds[0].revents & POLLIN)) {
			struct ibv_cq *cq;
			void *cq_ctx;
			unsigned events = 0;
			while (ibv_get_cq_event(ib->chan, &cq, &cq_ctx) == 0)
				events++;
			if (events) {
				ibv_ack_cq_events(ib->cq, events);
				if (ibv_req_notify_cq(ib->cq, 0) != 0)
					SC_ERROR("ibverbs", "ibv_req_notify_cq: %s",
						 strerror(errno));
			}
		}
		if (n > 0 && (ps.fds[1].revents & POLLIN))
			handle_async(ib);
		if (n > 0 && ps.n > 3) {
			pthread_mutex_lock(&ib->mu);
			pollset_check_locked(ib, &ps);
			pthread_mutex_unlock(&ib->mu);
		}
		/* Poll after re-arming, so no completion waits for the next event. */
		drain_cq(ib, &prog, &prog_cap);
		tick(ib);
		ib_qp_expire_idle(ib);
	}
	free(ps.fds);
	free(ps.xfs);
	free(prog);
	return NULL;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static int submit(struct ib_backend *ib, struct sc_xfer *x, bool data_only, struct sc_err *err)
{
	if (x->kind != SC_OP_READ && x->kind != SC_OP_WRITE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "ibverbs backend: not a READ or WRITE");
	if (x->n_segs == 0 || x->total == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "ibverbs backend: nothing to move");
	if (x->meta->n_endpoints == 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "the metadata from sidecar %s names no control endpoint for the "
				  "ibverbs rendezvous",
				  x->meta->issuer);
	for (size_t i = 0; i < x->n_segs; i++) {
		if (!x->segs[i].local_mr)
			return sc_err_set(err, SC_FAILED_PRECONDITION,
					  "local descriptor %zu: its region has no ibverbs "
					  "registration (it was registered while ibverbs was not "
					  "running): register the region again",
					  i);
	}
	struct ib_xfer *xf = calloc(1, sizeof(*xf));
	if (!xf)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	xf->ib = ib;
	xf->data_only = data_only;
	xf->endpoint = -1;
	xf->state = IB_XS_SETUP;
	xf->t_submit_us = now_us();
	xf->run.run = run_task;
	xf->task = IB_TASK_SETUP;
	x->priv = xf;
	if (ib->rail >= 0 && !xf->data_only)
		atomic_fetch_add_explicit(&ib->top->rails[ib->rail].operations, 1,
					  memory_order_relaxed);
	if (sc_xr_admit(&ib->xr, &xf->xr, x, &xf->run, err) != 0) {
		x->priv = NULL;
		free(xf);
		return -1;
	}
	return 0;
}

int ib_xfer_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	return submit(to_ib(b), x, false, err);
}

int ib_xfer_submit_slice(struct ib_backend *ib, struct sc_xfer *x, struct sc_err *err)
{
	return submit(ib, x, true, err);
}

void ib_xfer_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	struct ib_backend *ib = to_ib(b);
	atomic_store(&x->cancel_requested, true);
	pthread_mutex_lock(&ib->mu);
	struct ib_xfer *xf;
	IB_FOR_EACH_XFER(ib, xf) {
		if (xf->xr.x == x && xf->state == IB_XS_RUNNING)
			xfer_stop_locked(xf);
	}
	pthread_mutex_unlock(&ib->mu);
	wake_cq(ib);
}

int ib_xfer_start(struct ib_backend *ib, struct sc_err *err)
{
	struct ibv_device_attr da;
	if (ibv_query_device(ib->ctx, &da) != 0)
		return sc_err_set(err, SC_INTERNAL, "ibv_query_device: %s", strerror(errno));
	ib->cq_cap = da.max_cqe > 0 && da.max_cqe < CQ_ENTRIES ? (uint32_t)da.max_cqe : CQ_ENTRIES;
	if (!(ib->chan = ibv_create_comp_channel(ib->ctx)))
		return sc_err_set(err, SC_INTERNAL, "ibv_create_comp_channel: %s", strerror(errno));
	/* Plus room for the completion-notice receives of every incoming QP. */
	uint32_t cqe = ib->cq_cap + ib_notice_cq_reserve(ib, (uint32_t)da.max_cqe, ib->cq_cap);
	if (!(ib->cq = ibv_create_cq(ib->ctx, (int)cqe, ib, ib->chan, 0)))
		return sc_err_set(err, SC_INTERNAL, "ibv_create_cq of %u entries: %s", cqe,
				  strerror(errno));
	int fl1 = fcntl(ib->chan->fd, F_GETFL), fl2 = fcntl(ib->ctx->async_fd, F_GETFL);
	if (fl1 < 0 || fcntl(ib->chan->fd, F_SETFL, fl1 | O_NONBLOCK) != 0 || fl2 < 0 ||
	    fcntl(ib->ctx->async_fd, F_SETFL, fl2 | O_NONBLOCK) != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot make the verbs fds non-blocking: %s",
				  strerror(errno));
	if ((ib->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return sc_err_set(err, SC_INTERNAL, "eventfd: %s", strerror(errno));
	atomic_store(&ib->cq_stop, false);
	int rc = pthread_create(&ib->cq_thread, NULL, cq_main, ib);
	if (rc != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot start the completion thread: %s",
				  strerror(rc));
	ib->cq_thread_running = true;
	return sc_xr_start(&ib->xr, IB_WORKERS, err);
}

/* Stop a running transfer for the backend's shutdown (the runner flagged it cancelled). Under
 * ib->mu. */
static void stop_for_shutdown(struct sc_xr_xfer *t)
{
	struct ib_xfer *xf = container_of(t, struct ib_xfer, xr);
	if (xf->state == IB_XS_RUNNING)
		xfer_stop_locked(xf);
}

void ib_xfer_stop(struct ib_backend *ib)
{
	pthread_mutex_lock(&ib->mu);
	bool workers = ib->xr.n_workers > 0;
	pthread_mutex_unlock(&ib->mu);
	if (!ib->cq_thread_running && !workers)
		return;
	sc_xr_begin_stop(&ib->xr, stop_for_shutdown);
	wake_cq(ib);

	pthread_mutex_lock(&ib->mu);
	if (ib->cq_thread_running && workers &&
	    !sc_xr_wait_idle_locked(&ib->xr, sc_clock_mono_ms() + STOP_WAIT_MS)) {
		SC_ERROR("ibverbs",
			 "%zu transfer(s) still running %d s after stop: flushing their QPs",
			 ib->xr.n_live, STOP_WAIT_MS / 1000);
		struct sc_list *pos;
		sc_list_foreach(pos, &ib->out_qps) {
			struct ib_qp *q = sc_list_entry(pos, struct ib_qp, node);
			if (q->outstanding)
				ib_qp_flush(q);
		}
		if (!sc_xr_wait_idle_locked(&ib->xr, sc_clock_mono_ms() + 5000))
			SC_ERROR("ibverbs",
				 "%zu transfer(s) never ended; their memory stays mapped",
				 ib->xr.n_live);
	}
	pthread_mutex_unlock(&ib->mu);
	sc_xr_stop_workers(&ib->xr);
	if (ib->cq_thread_running) {
		atomic_store(&ib->cq_stop, true);
		wake_cq(ib);
		pthread_join(ib->cq_thread, NULL);
		ib->cq_thread_running = false;
	}
	ib_notice_stop(ib);
}
