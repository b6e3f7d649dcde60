/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/stripe.c: striped transfers over the ibverbs lanes (ib/lanes.c). Lane 0's submit sends a
 * transfer here when it is large enough (--ib-stripe-min) and the backend has two lanes or more,
 * or when lane 0 should not carry it; anything else goes whole to lane 0 (ib/xfer.c). A striped
 * transfer does OPEN and DONE once, runs its bytes as slices (--ib-slice-size), data-only
 * transfers of the lanes (ib_xfer_submit_slice), and moves a slice to the other lanes when its
 * rail fails, that lane cooling down. How, in detail: below.
 *
 * Threads: submit and cancel on engine threads (queue, flag); one thread per striped transfer
 * runs it (control connection, handing out slices, reaping them, pings, the verdict); the lanes'
 * workers and completion threads call the slices' on_progress / on_complete, which only count and
 * signal. Locks: sx->mu (one transfer) before st->mu (lane health, live list); neither is held by
 * the lanes when they call back. Owns: struct ib_stripe (lane health), the striped transfers.
 */
#include "ib/internal.h"

#include "base/log.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"
#include "base/timer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Lane 0's submit sends a transfer of at least --ib-stripe-min bytes, when the backend has two
 * lanes or more, here; anything smaller goes whole to lane 0 (ib/xfer.c), the lowest latency,
 * exactly as with one rail, unless lane 0's rail is down or cooling down, or the local memory is
 * nearer other rails (GPU memory by the topology: ib_lane_far0): then it comes here too, to go
 * around lane 0.
 *
 * A striped transfer does what ib/xfer.c does for one, once: OPEN on an authenticated control
 * connection (so the passive operation goes IN_PROGRESS and watches that connection) and, at the
 * end, DONE with the verdict (never the completion notice: no single QP carries the last byte).
 * In between its bytes are cut into slices of --ib-slice-size, handed out from one queue: every
 * usable lane keeps SLICE_DEPTH slices in flight and takes the next when one completes, so a slow
 * or loaded rail simply takes fewer. A slice runs as a data-only transfer of its lane (no OPEN, no
 * notice, no DONE: ib_xfer_submit_slice) on that lane's QP to the peer's rail it pairs with (local
 * lane i with the peer's rail i modulo its rail count, ib_lane_remote), with the peer rail's rkeys
 * (metadata IbverbsRail) and the local lane's MRs. Progress is reported once per byte of the
 * transfer; the bytes each rail moved go to x->rail_bytes (Operation.rails).
 *
 * Failover: a slice that fails for its rail's reason (QP or transport error, a lane that cannot
 * connect, or no progress for STALL_MS: rxe keeps retransmitting into a dead link instead of
 * failing) goes back to the front of the queue for the other lanes and re-moves its bytes (RDMA
 * READ and WRITE are idempotent); its lane cools down (COOL_MIN_MS doubling to COOL_MAX_MS, for
 * every transfer: the rail shows "cooling" with the reason, its errors and failovers are counted,
 * a WARN says so) and after the cool-down carries one slice as a probe before it gets its full
 * share again. A failure that is the operation's own (the peer revoked its access, the deadline,
 * a cancel) ends the whole transfer as with one rail. The transfer fails when its deadline passes
 * or when every lane it could use has failed STRIPE_GIVE_UP times, the message naming the rails
 * and why. Cancel and the deadline stop every slice; on_complete runs once all of them have ended
 * (their work requests completed or flushed: ib/xfer.c), so the memory is quiet.
 */

#define SLICE_DEPTH 4	      /* slices in flight per lane */
#define COOL_MIN_MS 2000      /* a failed lane's first cool-down ... */
#define COOL_MAX_MS 60000     /* ... doubling up to this */
#define STALL_MS 5000	      /* a slice without progress this long: its lane stopped completing */
#define STRIPE_GIVE_UP 3      /* failures of every lane within one transfer: it fails */
#define PING_MS 30000	      /* the control connection's keep-alive */
#define WAIT_MS 100
#define STOP_WAIT_MS 25000

struct lane_health {
	uint64_t cool_until_ms;
	uint64_t backoff_ms; /* 0: healthy */
	bool probing;	     /* cooled down: one slice decides */
};

struct ib_stripe {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a striped transfer ended */
	struct lane_health lane[SC_MAX_IB_RAILS];
	struct sc_list live; /* struct sx */
	size_t n_live;
	bool stopping;
};

struct slice {
	size_t seg;	 /* where it starts */
	uint64_t seg_off;
	uint64_t len;
	size_t n_segs;	 /* segments it touches */
	uint64_t reported; /* progress reported for it (a retried slice reports past this only) */
	bool done;
};

struct sx;

struct child {
	struct sc_xfer x;
	struct sx *sx;
	unsigned lane;
	size_t slice;
	uint64_t acked;
	uint64_t last_progress_ms;
	bool cancelled, stalled, ended;
	enum sc_status status;
	char msg[SC_ERR_MSG_MAX];
	struct sc_list node; /* sx->flying, then sx->ended */
	struct sc_xfer_seg segs[];
};

struct sx {
	struct ib_backend *ib;
	struct sc_xfer *x;
	struct sc_list node; /* st->live */
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a slice ended */
	struct slice *slices;
	size_t n_slices, n_done;
	size_t *q; /* ring of pending slice numbers */
	size_t q_head, q_len;
	struct sc_list flying, ended;
	unsigned inflight[SC_MAX_IB_RAILS];
	uint64_t lane_last[SC_MAX_IB_RAILS]; /* the lane's last progress (or first slice out) */
	bool eligible[SC_MAX_IB_RAILS]; /* the lane has this transfer's local and remote memory */
	unsigned failures[SC_MAX_IB_RAILS];
	int rj[SC_MAX_IB_RAILS]; /* the metadata's IbverbsRail the lane pairs with; -1: rail 0 */
	uint32_t *group_of;	 /* remote descriptor -> its rkey group (when some rj >= 0) */
	bool fatal, stop;
	enum sc_status status;
	char msg[SC_ERR_MSG_MAX];
	char tried[SC_ERR_MSG_MAX / 2]; /* the rails that failed, and why */
};

static const char *rail_name(struct ib_backend *ib, unsigned k)
{
	int r = ib->lanes[k]->rail;
	return r >= 0 ? ib->base.rails[r].name : ib->lanes[k]->dev_name;
}

/* ---- lane health (st->mu) -------------------------------------------------------------------- */

static void lane_fail(struct sx *sx, unsigned k, const char *why)
{
	struct ib_backend *ib = sx->ib;
	struct ib_stripe *st = ib->stripe;
	uint64_t now = sc_clock_mono_ms();
	pthread_mutex_lock(&st->mu);
	struct lane_health *h = &st->lane[k];
	h->backoff_ms = h->backoff_ms ? h->backoff_ms * 2 : COOL_MIN_MS;
	if (h->backoff_ms > COOL_MAX_MS)
		h->backoff_ms = COOL_MAX_MS;
	h->cool_until_ms = now + h->backoff_ms;
	h->probing = false;
	uint64_t cool = h->backoff_ms;
	pthread_mutex_unlock(&st->mu);
	sx->failures[k]++;
	int r = ib->lanes[k]->rail;
	if (r >= 0) {
		atomic_fetch_add_explicit(&ib->base.rails[r].failovers, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&ib->base.rails[r].errors, 1, memory_order_relaxed);
		sc_rail_set_state(&ib->base, (size_t)r, SC_RAIL_COOLING,
				  "%.150s; its slices moved to the other rails, cooling down %" PRIu64
				  " s",
				  why, cool / 1000);
	}
	size_t used = strlen(sx->tried);
	if (used + 8 < sizeof(sx->tried))
		snprintf(sx->tried + used, sizeof(sx->tried) - used, "%s%s: %.120s",
			 used ? "; " : "", rail_name(ib, k), why);
	SC_WARN_KV("ibverbs",
		   (&(struct sc_log_fields){.op = sx->x->op_id, .peer = sx->x->meta->issuer,
					    .backend = "ibverbs", .rail = rail_name(ib, k),
					    .trace_id = sx->x->trace_id}),
		   "transfer %016" PRIx64 ": rail %s failed (%s): its slices move to the other rails; "
		   "it cools down %" PRIu64 " s, then carries one slice as a probe",
		   sx->x->xfer_id, rail_name(ib, k), why, cool / 1000);
}

static void lane_ok(struct sx *sx, unsigned k)
{
	struct ib_backend *ib = sx->ib;
	struct ib_stripe *st = ib->stripe;
	pthread_mutex_lock(&st->mu);
	struct lane_health *h = &st->lane[k];
	bool healed = h->probing && h->backoff_ms;
	if (healed) {
		h->backoff_ms = 0;
		h->cool_until_ms = 0;
		h->probing = false;
	}
	pthread_mutex_unlock(&st->mu);
	int r = ib->lanes[k]->rail;
	if (healed && r >= 0) {
		sc_rail_set_state(&ib->base, (size_t)r, SC_RAIL_UP,
				  "carries data again: a probe slice completed after its cool-down");
		SC_INFO_KV("ibverbs",
			   (&(struct sc_log_fields){.backend = "ibverbs", .rail = rail_name(ib, k)}),
			   "rail %s carries data again after its cool-down", rail_name(ib, k));
	}
}

/* How many slices lane k may have in flight now (0: none). */
static unsigned lane_depth(struct sx *sx, unsigned k, uint64_t now)
{
	struct ib_backend *ib = sx->ib;
	if (!sx->eligible[k])
		return 0;
	int r = ib->lanes[k]->rail;
	if (r >= 0) {
		struct sc_rail_report rep;
		sc_rail_snapshot(&ib->base, (size_t)r, &rep);
		if (rep.state == SC_RAIL_DOWN || rep.state == SC_RAIL_UNUSABLE)
			return 0;
	}
	struct ib_stripe *st = ib->stripe;
	unsigned depth = SLICE_DEPTH;
	pthread_mutex_lock(&st->mu);
	struct lane_health *h = &st->lane[k];
	if (h->backoff_ms) {
		if (now < h->cool_until_ms)
			depth = 0;
		else {
			h->probing = true;
			depth = 1;
		}
	}
	pthread_mutex_unlock(&st->mu);
	return depth;
}

/* ---- slices ---------------------------------------------------------------------------------- */

static void child_progress(struct sc_xfer *x, uint64_t delta)
{
	struct child *c = x->owner;
	struct sx *sx = c->sx;
	uint64_t fwd = 0;
	pthread_mutex_lock(&sx->mu);
	c->acked += delta;
	c->last_progress_ms = sc_clock_mono_ms();
	sx->lane_last[c->lane] = c->last_progress_ms;
	struct slice *s = &sx->slices[c->slice];
	if (c->acked > s->reported) {
		fwd = c->acked - s->reported;
		s->reported = c->acked;
	}
	pthread_mutex_unlock(&sx->mu);
	int r = sx->ib->lanes[c->lane]->rail;
	if (r >= 0 && r < SC_XFER_MAX_RAILS)
		atomic_fetch_add_explicit(&sx->x->rail_bytes[r], delta, memory_order_relaxed);
	if (fwd)
		sx->x->on_progress(sx->x, fwd);
}

static void child_complete(struct sc_xfer *x, enum sc_status status, const char *msg)
{
	struct child *c = x->owner;
	struct sx *sx = c->sx;
	pthread_mutex_lock(&sx->mu);
	c->ended = true;
	c->status = status;
	snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "");
	sc_list_remove(&c->node);
	sc_list_insert_head(&sx->ended, &c->node);
	pthread_cond_broadcast(&sx->cv);
	pthread_mutex_unlock(&sx->mu);
}

/* The rkey of remote descriptor d on the peer rail lane k pairs with. */
static uint32_t remote_rkey(const struct sx *sx, unsigned k, uint32_t d, uint32_t rkey0)
{
	const struct sc_metadata *md = sx->x->meta;
	int j = sx->rj[k];
	if (j < 0 || !sx->group_of || d >= md->n_descs)
		return rkey0;
	return md->ib_rkeys[(size_t)j * md->n_ib_groups + sx->group_of[d]];
}

/* Slice n as a data-only transfer of lane k, submitted. Under sx->mu. */
static int slice_start(struct sx *sx, unsigned k, size_t n, struct sc_err *err)
{
	struct ib_backend *ib = sx->ib;
	struct sc_xfer *px = sx->x;
	const struct slice *s = &sx->slices[n];
	struct child *c = calloc(1, sizeof(*c) + s->n_segs * sizeof(c->segs[0]));
	if (!c)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	uint64_t left = s->len, off = s->seg_off;
	size_t ns = 0;
	const void *last0 = NULL;
	struct ibv_mr *lastk = NULL;
	for (size_t i = s->seg; left && i < px->n_segs; i++, off = 0) {
		const struct sc_xfer_seg *g = &px->segs[i];
		uint64_t take = g->len - off < left ? g->len - off : left;
		if (!take)
			continue;
		struct sc_xfer_seg *o = &c->segs[ns++];
		*o = *g;
		o->local = g->local + off;
		o->len = take;
		o->remote_addr = g->remote_addr + off;
		o->rkey = remote_rkey(sx, k, g->remote_desc, g->rkey);
		if (g->local_mr != last0) {
			last0 = g->local_mr;
			lastk = ib_lane_mr(ib, g->local_mr, k);
		}
		o->local_mr = lastk;
		left -= take;
	}
	c->sx = sx;
	c->lane = k;
	c->slice = n;
	c->last_progress_ms = sc_clock_mono_ms();
	struct sc_xfer *x = &c->x;
	x->kind = px->kind;
	x->meta = px->meta;
	x->xfer_id = px->xfer_id;
	x->segs = c->segs;
	x->n_segs = ns;
	x->total = s->len;
	x->deadline_mono_ms = px->deadline_mono_ms;
	atomic_init(&x->cancel_requested, false);
	atomic_init(&x->committed, false);
	x->on_progress = child_progress;
	x->on_complete = child_complete;
	x->owner = c;
	sc_list_insert_head(&sx->flying, &c->node);
	if (ib_xfer_submit_slice(ib->lanes[k], x, err) != 0) {
		sc_list_remove(&c->node);
		free(c);
		return -1;
	}
	if (sx->inflight[k]++ == 0)
		sx->lane_last[k] = c->last_progress_ms;
	return 0;
}

static void requeue_front(struct sx *sx, size_t n)
{
	sx->q_head = (sx->q_head + sx->n_slices - 1) % sx->n_slices;
	sx->q[sx->q_head] = n;
	sx->q_len++;
}

static size_t dequeue(struct sx *sx)
{
	size_t n = sx->q[sx->q_head];
	sx->q_head = (sx->q_head + 1) % sx->n_slices;
	sx->q_len--;
	return n;
}

/* The slice failed for a reason of its own operation, not its rail's. */
static bool operation_reason(enum sc_status st)
{
	return st == SC_FAILED_PRECONDITION || st == SC_DEADLINE_EXCEEDED || st == SC_CANCELLED ||
	       st == SC_PERMISSION_DENIED || st == SC_INVALID_ARGUMENT ||
	       st == SC_UNAUTHENTICATED || st == SC_NOT_FOUND;
}

static void set_fatal(struct sx *sx, enum sc_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void set_fatal(struct sx *sx, enum sc_status st, const char *fmt, ...)
{
	if (sx->fatal)
		return;
	sx->fatal = true;
	sx->status = st;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(sx->msg, sizeof(sx->msg), fmt, ap);
	va_end(ap);
}

/* Ended slices: done, back to the queue, or the transfer's end. Under sx->mu. */
static void reap(struct sx *sx)
{
	while (!sc_list_empty(&sx->ended)) {
		struct child *c = sc_list_entry(sx->ended.next, struct child, node);
		sc_list_remove(&c->node);
		sx->inflight[c->lane]--;
		struct slice *s = &sx->slices[c->slice];
		if (c->status == SC_OK) {
			s->done = true;
			sx->n_done++;
			lane_ok(sx, c->lane);
		} else if (c->stalled) {
			requeue_front(sx, c->slice); /* its lane was failed when it stalled */
		} else if (sx->stop || sx->fatal) {
			/* stopping anyway */
		} else if (!operation_reason(c->status)) {
			requeue_front(sx, c->slice);
			lane_fail(sx, c->lane, c->msg[0] ? c->msg : sc_status_name(c->status));
		} else {
			set_fatal(sx, c->status, "%s (on rail %s)", c->msg,
				  rail_name(sx->ib, c->lane));
		}
		free(c);
	}
}

static void cancel_flying(struct sx *sx)
{
	struct sc_list *pos;
	sc_list_foreach(pos, &sx->flying) {
		struct child *c = sc_list_entry(pos, struct child, node);
		if (!c->cancelled) {
			c->cancelled = true;
			ib_xfer_cancel(&sx->ib->lanes[c->lane]->base, &c->x);
		}
	}
}

/* Hand out, watch and reap slices until every one is done or the transfer stops. Transfer
 * thread; takes sx->mu. */
static void run_slices(struct sx *sx, struct sc_peer_conn *conn)
{
	struct ib_backend *ib = sx->ib;
	struct sc_xfer *x = sx->x;
	uint64_t last_ping = sc_clock_mono_ms();
	pthread_mutex_lock(&sx->mu);
	for (;;) {
		reap(sx);
		if (sx->n_done == sx->n_slices && sc_list_empty(&sx->flying))
			break;
		uint64_t now = sc_clock_mono_ms();
		pthread_mutex_lock(&ib->stripe->mu);
		bool stopping = ib->stripe->stopping;
		pthread_mutex_unlock(&ib->stripe->mu);
		if (!sx->stop && (atomic_load(&x->cancel_requested) || stopping))
			sx->stop = true;
		if (!sx->stop && !sx->fatal && sc_xr_deadline_passed(x, now))
			set_fatal(sx, SC_DEADLINE_EXCEEDED,
				  "deadline passed with %zu of %zu slices moved", sx->n_done,
				  sx->n_slices);
		if (sx->stop || sx->fatal) {
			cancel_flying(sx);
			if (sc_list_empty(&sx->flying))
				break;
		} else {
			/* A lane whose slices made no progress for STALL_MS stopped completing
			 * (a dead link: rxe retransmits for ever): its slices go elsewhere. */
			for (unsigned k = 0; k < ib->n_lanes; k++) {
				if (!sx->inflight[k] || now - sx->lane_last[k] < STALL_MS)
					continue;
				bool any = false;
				struct sc_list *pos;
				sc_list_foreach(pos, &sx->flying) {
					struct child *c = sc_list_entry(pos, struct child, node);
					if (c->lane != k || c->cancelled)
						continue;
					c->cancelled = c->stalled = true;
					ib_xfer_cancel(&ib->lanes[k]->base, &c->x);
					any = true;
				}
				if (any) {
					char why[96];
					snprintf(why, sizeof(why), "no progress for %d s",
						 STALL_MS / 1000);
					lane_fail(sx, k, why);
				}
			}
			/* Hand out. */
			for (unsigned k = 0; k < ib->n_lanes && sx->q_len; k++) {
				unsigned depth = lane_depth(sx, k, now);
				while (sx->inflight[k] < depth && sx->q_len) {
					size_t n = dequeue(sx);
					struct sc_err err;
					sc_err_clear(&err);
					if (slice_start(sx, k, n, &err) != 0) {
						requeue_front(sx, n);
						if (err.code == SC_UNAVAILABLE &&
						    strstr(err.msg, "shutting down")) {
							sx->stop = true;
							break;
						}
						lane_fail(sx, k, err.msg);
						break;
					}
				}
			}
			/* Nothing in flight and no lane left for this transfer: it fails. */
			bool left = false;
			for (unsigned k = 0; k < ib->n_lanes; k++)
				left = left || (sx->eligible[k] && sx->failures[k] < STRIPE_GIVE_UP);
			if (!left && sc_list_empty(&sx->flying) && sx->q_len) {
				set_fatal(sx, SC_UNAVAILABLE,
					  "no ibverbs rail is left to peer %s after %zu of %zu slices: "
					  "%s",
					  x->meta->issuer, sx->n_done, sx->n_slices, sx->tried);
				continue;
			}
		}
		if (conn && !sx->stop && !sx->fatal && now - last_ping >= PING_MS) {
			pthread_mutex_unlock(&sx->mu);
			struct sc_err err;
			sc_err_clear(&err);
			int rc = sc_peer_ping(conn, sc_clock_mono_ms() + 10000, &x->cancel_requested,
					      &err);
			pthread_mutex_lock(&sx->mu);
			last_ping = sc_clock_mono_ms();
			if (rc != 0 && err.code != SC_CANCELLED)
				set_fatal(sx, SC_UNAVAILABLE,
					  "lost the control connection to peer %s: %s",
					  x->meta->issuer, err.msg);
			continue;
		}
		if (sc_list_empty(&sx->ended))
			sc_cond_wait_ms(&sx->cv, &sx->mu, WAIT_MS);
	}
	pthread_mutex_unlock(&sx->mu);
}

/* ---- the striped transfer -------------------------------------------------------------------- */

static void sx_free(struct sx *sx)
{
	if (!sx)
		return;
	pthread_cond_destroy(&sx->cv);
	pthread_mutex_destroy(&sx->mu);
	free(sx->slices);
	free(sx->q);
	free(sx->group_of);
	free(sx);
}

static void *sx_main(void *arg)
{
	struct sx *sx = arg;
	struct ib_backend *ib = sx->ib;
	struct sc_xfer *x = sx->x;
	struct sc_err err;
	sc_err_clear(&err);
	int ep = -1;
	bool opened = false;
	struct sc_peer_conn *c =
	    sc_peer_pool_get_issuer(ib->pool, x->meta, x->deadline_mono_ms, &x->cancel_requested, &ep, &err);
	if (c) {
		if (sc_peer_open_xfer(c, x, SC_BACKEND_IBVERBS, &err) != 0) {
			sc_peer_pool_put(ib->pool, c, sc_peer_conn_usable(c));
			c = NULL;
		} else {
			opened = true;
		}
	}
	if (opened) {
		SC_DEBUG("ibverbs",
			 "transfer %016" PRIx64 ": striped, %zu slices over %zu lanes to %s",
			 x->xfer_id, sx->n_slices, ib->n_lanes, x->meta->issuer);
		run_slices(sx, c);
	} else if (err.code != SC_OK && !atomic_load(&x->cancel_requested)) {
		set_fatal(sx, err.code, "%s", err.msg);
	}
	enum sc_status status;
	char msg[SC_ERR_MSG_MAX];
	msg[0] = '\0';
	bool cancelled = atomic_load(&x->cancel_requested);
	uint64_t moved = 0;
	for (size_t i = 0; i < sx->n_slices; i++)
		moved += sx->slices[i].done ? sx->slices[i].len : 0;
	if (!sx->fatal && sx->n_done == sx->n_slices && !cancelled) {
		status = SC_OK;
	} else if (cancelled && sc_xr_deadline_passed(x, sc_clock_mono_ms())) {
		status = SC_DEADLINE_EXCEEDED;
		snprintf(msg, sizeof(msg), "deadline passed after %" PRIu64 " of %" PRIu64 " bytes",
			 moved, x->total);
	} else if (cancelled || (sx->stop && !sx->fatal)) {
		status = SC_CANCELLED;
		snprintf(msg, sizeof(msg),
			 "cancelled by the active side after %" PRIu64 " of %" PRIu64 " bytes", moved,
			 x->total);
	} else {
		status = sx->status;
		snprintf(msg, sizeof(msg), "%s", sx->msg);
	}
	/* No rail is left but the peer offers tcp: the same transfer goes on over tcp (ABORTED
	 * tells the peer this attempt ended, and the engine to move it; ib_hand_to_tcp). */
	int lane_rails[SC_MAX_IB_RAILS];
	for (size_t k = 0; k < ib->n_lanes; k++)
		lane_rails[k] = ib->lanes[k]->rail;
	bool to_tcp = status == SC_UNAVAILABLE && !cancelled &&
		     ib_hand_to_tcp(ib, x, c, opened, msg, ib->n_lanes, lane_rails);
	if (to_tcp)
		status = SC_ABORTED;
	if (opened && !to_tcp)
		sc_peer_tell_verdict(ib->pool, &c, x->meta->endpoints[ep], x->meta->token,
				     x->xfer_id, x->deadline_mono_ms, &status, msg, sizeof(msg),
				     "ibverbs");
	sc_peer_pool_put(ib->pool, c, c && sc_peer_conn_usable(c));
	for (size_t k = 0; k < ib->n_lanes; k++) {
		int r = ib->lanes[k]->rail;
		if (r >= 0 && r < SC_XFER_MAX_RAILS && atomic_load(&x->rail_bytes[r]))
			atomic_fetch_add_explicit(&ib->base.rails[r].operations, 1,
						  memory_order_relaxed);
	}
	if (status != SC_OK && status != SC_CANCELLED)
		SC_INFO_KV("ibverbs",
			   (&(struct sc_log_fields){.op = x->op_id, .peer = x->meta->issuer,
						    .backend = "ibverbs",
						    .code = sc_status_name(status),
						    .trace_id = x->trace_id}),
			   "striped transfer %016" PRIx64 " with %s ended %s: %s", x->xfer_id,
			   x->meta->issuer, sc_status_name(status), msg);
	struct ib_stripe *st = ib->stripe;
	pthread_mutex_lock(&st->mu);
	sc_list_remove(&sx->node);
	st->n_live--;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	sx_free(sx);
	x->priv = NULL;
	x->on_complete(x, status, status == SC_OK ? NULL : msg);
	return NULL;
}

struct rkey_group {
	uint32_t rkey;
	uint32_t g;
};

static int rkey_group_cmp(const void *pa, const void *pb)
{
	const struct rkey_group *a = pa, *b = pb;
	return a->rkey < b->rkey ? -1 : a->rkey > b->rkey;
}

/* group_of[d] for every remote descriptor: the index of its rkey among the distinct ones. */
static int build_groups(struct sx *sx)
{
	const struct sc_metadata *md = sx->x->meta;
	size_t g = md->n_ib_groups;
	uint32_t *g0 = malloc((g ? g : 1) * sizeof(*g0));
	struct rkey_group *tab = malloc((g ? g : 1) * sizeof(*tab));
	sx->group_of = malloc((md->n_descs ? md->n_descs : 1) * sizeof(uint32_t));
	int rc = -1;
	if (!g0 || !tab || !sx->group_of)
		goto out;
	if (sc_metadata_rkey_groups(md->descs, md->n_descs, g0) != g)
		goto out; /* verify checked it */
	for (size_t i = 0; i < g; i++)
		tab[i] = (struct rkey_group){g0[i], (uint32_t)i};
	qsort(tab, g, sizeof(*tab), rkey_group_cmp);
	for (size_t d = 0; d < md->n_descs; d++) {
		struct rkey_group key = {md->descs[d].rkey, 0};
		const struct rkey_group *hit = bsearch(&key, tab, g, sizeof(*tab), rkey_group_cmp);
		if (!hit)
			goto out;
		sx->group_of[d] = hit->g;
	}
	rc = 0;
out:
	free(g0);
	free(tab);
	return rc;
}

/* Lane 0 is down or cooling: a small transfer then takes the striped path too (as one or a few
 * slices), which goes around it. */
static bool lane0_failing(struct ib_backend *ib)
{
	if (ib->rail >= 0) {
		struct sc_rail_report rep;
		sc_rail_snapshot(&ib->base, (size_t)ib->rail, &rep);
		if (rep.state == SC_RAIL_DOWN || rep.state == SC_RAIL_COOLING)
			return true;
	}
	pthread_mutex_lock(&ib->stripe->mu);
	bool cooling = ib->stripe->lane[0].backoff_ms != 0;
	pthread_mutex_unlock(&ib->stripe->mu);
	return cooling;
}

int ib_stripe_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	struct ib_stripe *st = ib->stripe;
	const struct sc_metadata *md = x->meta;
	if (!st || ib->n_lanes < 2 || !ib->stripe_min ||
	    (x->kind != SC_OP_READ && x->kind != SC_OP_WRITE) || md->n_endpoints == 0)
		return ib_xfer_submit(b, x, err);
	/* Local memory nearer other rails than lane 0's (GPU memory by the topology): lane 0 is
	 * left out, and a small transfer takes this path too, to its nearest rails. */
	bool far0 = false;
	const void *seen = NULL;
	for (size_t i = 0; i < x->n_segs; i++) {
		if (!x->segs[i].local_mr)
			return ib_xfer_submit(b, x, err); /* it says why */
		if (x->segs[i].local_mr != seen) {
			seen = x->segs[i].local_mr;
			far0 = far0 || ib_lane_far0(ib, seen);
		}
	}
	if (x->total < ib->stripe_min && !far0 && !lane0_failing(ib))
		return ib_xfer_submit(b, x, err);
	struct sx *sx = calloc(1, sizeof(*sx));
	if (!sx)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	sx->ib = ib;
	sx->x = x;
	pthread_mutex_init(&sx->mu, NULL);
	pthread_cond_init(&sx->cv, NULL);
	sc_list_init(&sx->flying);
	sc_list_init(&sx->ended);
	/* Which lanes reach this transfer's memory on both ends. */
	size_t eligible = 0;
	bool need_groups = false;
	for (unsigned k = 0; k < ib->n_lanes; k++) {
		unsigned rl = ib_lane_remote(ib->lanes[k], md);
		sx->rj[k] = -1;
		for (size_t j = 0; j < md->n_ib_rails && rl; j++)
			if (md->ib_rails[j].index == rl)
				sx->rj[k] = (int)j;
		bool ok = (rl == 0 || sx->rj[k] >= 0) && !(k == 0 && far0);
		const void *last = NULL;
		for (size_t i = 0; i < x->n_segs && ok && k; i++) {
			if (x->segs[i].local_mr == last)
				continue;
			last = x->segs[i].local_mr;
			ok = ib_lane_mr(ib, last, k) != NULL;
		}
		sx->eligible[k] = ok;
		eligible += ok;
		need_groups = need_groups || (ok && sx->rj[k] >= 0);
	}
	if (eligible == 0 || (eligible < 2 && !far0) || (need_groups && build_groups(sx) != 0)) {
		sx_free(sx);
		return ib_xfer_submit(b, x, err);
	}
	/* The slices. */
	uint64_t slice = ib->slice_bytes;
	sx->n_slices = (size_t)((x->total + slice - 1) / slice);
	sx->slices = calloc(sx->n_slices, sizeof(*sx->slices));
	sx->q = calloc(sx->n_slices, sizeof(*sx->q));
	if (!sx->slices || !sx->q) {
		sx_free(sx);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	size_t seg = 0;
	uint64_t off = 0;
	for (size_t n = 0; n < sx->n_slices; n++) {
		struct slice *s = &sx->slices[n];
		while (seg < x->n_segs && off >= x->segs[seg].len) {
			seg++;
			off = 0;
		}
		s->seg = seg;
		s->seg_off = off;
		uint64_t left = slice;
		while (left && seg < x->n_segs) {
			uint64_t take = x->segs[seg].len - off < left ? x->segs[seg].len - off : left;
			s->len += take;
			s->n_segs++;
			left -= take;
			off += take;
			if (off >= x->segs[seg].len && left) {
				seg++;
				off = 0;
			}
		}
		sx->q[n] = n;
	}
	sx->q_len = sx->n_slices;
	pthread_mutex_lock(&st->mu);
	if (st->stopping) {
		pthread_mutex_unlock(&st->mu);
		sx_free(sx);
		return sc_err_set(err, SC_UNAVAILABLE, "the ibverbs backend is shutting down");
	}
	sc_list_insert_head(&st->live, &sx->node);
	st->n_live++;
	x->priv = sx;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	int rc = pthread_create(&t, &attr, sx_main, sx);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		sc_list_remove(&sx->node);
		st->n_live--;
		pthread_mutex_unlock(&st->mu);
		x->priv = NULL;
		sx_free(sx);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "cannot start a thread for a striped transfer: %s", strerror(rc));
	}
	pthread_mutex_unlock(&st->mu);
	return 0;
}

void ib_stripe_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	struct ib_backend *ib = to_ib(b);
	struct ib_stripe *st = ib->stripe;
	bool striped = false;
	if (st) {
		pthread_mutex_lock(&st->mu);
		struct sc_list *pos;
		sc_list_foreach(pos, &st->live) {
			struct sx *sx = sc_list_entry(pos, struct sx, node);
			if (sx->x == x) {
				striped = true;
				atomic_store(&x->cancel_requested, true);
				/* Not under sx->mu (it comes before st->mu): a missed wake-up
				 * costs at most WAIT_MS. */
				pthread_cond_broadcast(&sx->cv);
				break;
			}
		}
		pthread_mutex_unlock(&st->mu);
	}
	if (!striped)
		ib_xfer_cancel(b, x);
}

int ib_stripe_init(struct ib_backend *ib)
{
	struct ib_stripe *st = calloc(1, sizeof(*st));
	if (!st)
		return -1;
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cv, NULL);
	sc_list_init(&st->live);
	ib->stripe = st;
	return 0;
}

void ib_stripe_stop(struct ib_backend *ib)
{
	struct ib_stripe *st = ib->stripe;
	if (!st)
		return;
	pthread_mutex_lock(&st->mu);
	st->stopping = true;
	struct sc_list *pos;
	sc_list_foreach(pos, &st->live) {
		struct sx *sx = sc_list_entry(pos, struct sx, node);
		pthread_cond_broadcast(&sx->cv);
	}
	uint64_t end = sc_clock_mono_ms() + STOP_WAIT_MS;
	while (st->n_live && sc_clock_mono_ms() < end)
		sc_cond_wait_ms(&st->cv, &st->mu, WAIT_MS);
	if (st->n_live)
		SC_ERROR("ibverbs", "%zu striped transfer(s) still running %d s after stop",
			 st->n_live, STOP_WAIT_MS / 1000);
	pthread_mutex_unlock(&st->mu);
}

void ib_stripe_fini(struct ib_backend *ib)
{
	struct ib_stripe *st = ib->stripe;
	if (!st)
		return;
	pthread_cond_destroy(&st->cv);
	pthread_mutex_destroy(&st->mu);
	free(st);
	ib->stripe = NULL;
}
