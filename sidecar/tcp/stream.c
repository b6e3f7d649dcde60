/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/stream.c: one stream of a transfer, on one pooled, authenticated peer connection
 * (peer/pool.h): it OPENs the transfer once and then pulls chunks from the shared cursor
 * (tcp/cursor.c), READing straight into or WRITing straight from local region memory, one request
 * ahead of the reply it waits for. The leader of a single-stream transfer pipelines its OPEN and
 * sends DONE {OK} right behind the last data request (commit_done). The connection a stream
 * blocks on is published in the transfer (tx->conns), so a stop can abort it.
 *
 * Threads: a runner worker (the leader or a helper stream), or the thread that began a small
 * transfer. Owns the connection while it runs on it (the peer pool's otherwise).
 */
#include "tcp/internal.h"

#include "base/log.h"
#include "base/timer.h"
#include "base/trace.h"
#include "peer/request.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* While another path is live, a stream on which no byte moves for this long takes its path as
 * dead (sooner than the socket's TCP_USER_TIMEOUT, SC_PEER_USER_TIMEOUT_MS). */
#define PATH_STALL_MS 5000

/* Publish the connection a stream is about to block on (so a stop can abort it). Returns false
 * when the transfer is already stopping. */
static bool set_conn(struct tcp_xfer *tx, int slot, struct sc_peer_conn *c)
{
	pthread_mutex_lock(&tx->tb->mu);
	tx->conns[slot] = c;
	bool go = c == NULL || !tcp_should_stop(tx);
	pthread_mutex_unlock(&tx->tb->mu);
	return go;
}

/* A connection to the issuing sidecar on path. A dial gives up after PATH_DIAL_MS while other
 * paths are live, else at the transfer's deadline. NULL with err clear when told to quit. */
static struct sc_peer_conn *connect_path(struct tcp_xfer *tx, size_t path, struct sc_err *err)
{
	const struct sc_metadata *md = tx->xr.x->meta;
	const char *ep = tcp_path_endpoint(tx, path);
	uint64_t deadline = tx->xr.x->deadline_mono_ms;
	pthread_mutex_lock(&tx->tb->mu);
	bool others = tcp_live_paths_locked(tx) > 1;
	pthread_mutex_unlock(&tx->tb->mu);
	if (others) {
		uint64_t bound = sc_clock_mono_ms() + PATH_DIAL_MS;
		if (!deadline || bound < deadline)
			deadline = bound;
	}
	struct sc_peer_conn *c;
	if (sc_peer_pool_get_cancellable(tx->tb->pool, ep, deadline, &tx->quit, &c, err) != 0) {
		if (atomic_load(&tx->quit) && !tcp_should_stop(tx))
			sc_err_clear(err); /* every chunk is done: this stream is not needed */
		return NULL;
	}
	if (sc_peer_conn_check_issuer(c, md->issuer, err) != 0) {
		sc_peer_pool_put(tx->tb->pool, c, false); /* an impostor: nothing is sent */
		return NULL;
	}
	if (strcmp(sc_peer_conn_peer_id(c), md->issuer) != 0) {
		sc_err_set(err, SC_UNAVAILABLE,
			   "data endpoint %s is sidecar \"%s\", but the metadata was issued by "
			   "\"%s\" (stale metadata, or a wrong --advertise)",
			   ep, sc_peer_conn_peer_id(c), md->issuer);
		sc_peer_pool_put(tx->tb->pool, c, true);
		return NULL;
	}
	return c;
}

/* A stream's connection, with the transfer OPENed on it and published for abort. NULL when the
 * transfer is stopping or on failure (err says why, unless it was only stopped). pipelined: the
 * OPEN may be sent without waiting for its reply, which tcp_move_chunks takes after the first data
 * request went out (one round trip less); *open_pending says whether it did (1) or not (0). */
struct sc_peer_conn *tcp_open_stream(struct tcp_xfer *tx, int slot, size_t path,
				     bool pipelined, int *open_pending, struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	/* A pooled connection whose peer went away unseen (its FIN lost in a partition, the peer
	 * restarted on the same address) breaks on its first request: try the next one, then a
	 * fresh dial; at most the pool's depth per endpoint plus one tries. */
	for (unsigned tries = 0;; tries++) {
		if (tcp_should_stop(tx) || atomic_load(&tx->quit))
			return NULL;
		struct sc_peer_conn *c = connect_path(tx, path, err);
		if (!c)
			return NULL;
		/* A pipelined OPEN on a dead pooled connection fails later, in tcp_move_chunks: the
		 * leader then starts over (restart_after_stale). */
		bool pipe = pipelined;
		if (set_conn(tx, slot, c) &&
		    (pipe ? sc_peer_open_xfer_send(c, x, err)
			  : sc_peer_open_xfer(c, x, SC_BACKEND_NONE, err)) == 0) {
			*open_pending = pipe ? 1 : 0;
			tcp_path_works(tx, path);
			return c;
		}
		set_conn(tx, slot, NULL);
		bool stale = sc_peer_conn_reused(c) && !sc_peer_conn_usable(c) &&
			     err->code == SC_UNAVAILABLE && tries < SC_PEER_POOL_IDLE_PER_ENDPOINT;
		/* After a refused OPEN the connection is still good; one broken mid-OPEN is closed
		 * (the server abandons whatever it may have opened). */
		sc_peer_pool_put(tx->tb->pool, c, sc_peer_conn_usable(c));
		if (!stale || tcp_should_stop(tx))
			return NULL;
		SC_DEBUG("tcp", "transfer %016" PRIx64 ": a pooled connection to %s was dead (%s); "
			 "trying another", x->xfer_id, x->meta->issuer, err->msg);
	}
}

/* How long a stream's I/O may wait, and what stops it: the transfer's deadline and cancel flag,
 * or after commit_done sc_peer_verdict_ok_deadline and no cancel. */
struct io_bound {
	uint64_t deadline_mono_ms;
	const atomic_bool *cancel;
};

static int piece_send(struct tcp_xfer *tx, struct sc_peer_conn *c, const struct piece *p,
		      struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	const uint8_t *token = x->meta->token;
	if (p->n && x->kind == SC_OP_READ)
		return sc_peer_readv_send(c, token, x->xfer_id, p->pp, p->n, x->deadline_mono_ms,
					  &x->cancel_requested, err);
	if (p->n && p->gpu != SC_GPU_HOST)
		return sc_peer_writev_send_gpu(c, token, x->xfer_id, p->pp, p->n, p->iov,
					       tx->tb->base.env.gpu, p->gpu, x->deadline_mono_ms,
					       &x->cancel_requested, err);
	if (p->n)
		return sc_peer_writev_send(c, token, x->xfer_id, p->pp, p->n, p->iov,
					   x->deadline_mono_ms, &x->cancel_requested, err);
	if (x->kind == SC_OP_READ)
		return sc_peer_read_send(c, token, x->xfer_id, p->seg->remote_desc, p->off, p->len,
					 x->deadline_mono_ms, &x->cancel_requested, err);
	if (p->seg->local_gpu != SC_GPU_HOST)
		return sc_peer_write_send_gpu(c, token, x->xfer_id, p->seg->remote_desc, p->off,
					      p->len, p->seg->local + p->off, tx->tb->base.env.gpu,
					      p->seg->local_gpu, x->deadline_mono_ms,
					      &x->cancel_requested, err);
	return sc_peer_write_send(c, token, x->xfer_id, p->seg->remote_desc, p->off, p->len,
				  p->seg->local + p->off, x->deadline_mono_ms, &x->cancel_requested,
				  err);
}

static int piece_recv(struct tcp_xfer *tx, struct sc_peer_conn *c, const struct piece *p,
		      const struct io_bound *b, struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	if (p->n && x->kind == SC_OP_READ && p->gpu != SC_GPU_HOST)
		return sc_peer_readv_recv_gpu(c, p->len, p->iov, p->n, tx->tb->base.env.gpu, p->gpu,
					      b->deadline_mono_ms, b->cancel, err);
	if (p->n && x->kind == SC_OP_READ)
		return sc_peer_readv_recv(c, p->len, p->iov, p->n, b->deadline_mono_ms, b->cancel,
					  err);
	if (p->n)
		return sc_peer_write_recv(c, b->deadline_mono_ms, b->cancel, err);
	if (x->kind == SC_OP_READ && p->seg->local_gpu != SC_GPU_HOST)
		return sc_peer_read_recv_gpu(c, p->len, p->seg->local + p->off, tx->tb->base.env.gpu,
					     p->seg->local_gpu, b->deadline_mono_ms, b->cancel, err);
	if (x->kind == SC_OP_READ)
		return sc_peer_read_recv(c, p->len, p->seg->local + p->off, b->deadline_mono_ms,
					 b->cancel, err);
	return sc_peer_write_recv(c, b->deadline_mono_ms, b->cancel, err);
}

/* The reply to a pipelined OPEN (see tcp_open_stream). *open_pending: 1 while it is due; afterwards
 * 0 (accepted), -1 (refused: the passive side keeps its use and hears nothing from us) or 2 (not
 * known: the verdict is told anyway, and refused by the peer if the OPEN never took). */
static int take_open_reply(struct sc_peer_conn *c, int *open_pending, const struct io_bound *b,
			   struct sc_err *err)
{
	if (*open_pending != 1)
		return 0;
	bool refused = false;
	int rc = sc_peer_open_recv(c, b->deadline_mono_ms, b->cancel, &refused, err);
	*open_pending = rc == 0 ? 0 : refused ? -1 : 2;
	return rc;
}

/*
 * The verdict of a single-stream transfer without a round trip of its own: DONE {OK} goes out
 * right behind the last data request, and the passive side judges it after that request (a
 * connection's frames are served in order; a DONE {OK} after a refused request is refused). Its
 * reply arrives right behind the last data reply. From here the transfer commits: the passive
 * side may complete as soon as the bytes are out, so a cancel no longer cuts the stream, and the
 * replies are awaited until sc_peer_verdict_ok_deadline (the same bound as a confirmed DONE). False
 * when the transfer is already stopping (nothing sent: the verdict is told the usual way) or the send failed (err says why).
 */
static bool commit_done(struct tcp_xfer *tx, struct sc_peer_conn *c, struct io_bound *b,
			struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	pthread_mutex_lock(&tx->tb->mu);
	bool go = !tcp_should_stop(tx);
	tx->committing = go;
	atomic_store(&x->committed, go);
	pthread_mutex_unlock(&tx->tb->mu);
	if (!go)
		return false;
	b->deadline_mono_ms = sc_peer_verdict_ok_deadline(x->deadline_mono_ms);
	b->cancel = NULL;
	if (sc_peer_done_send(c, x->meta->token, x->xfer_id, SC_OK, NULL, b->deadline_mono_ms, NULL,
			      err) != 0)
		return false;
	tx->done_sent = true;
	return true;
}

/* The reply to the DONE commit_done sent, after every data reply. */
static int take_done_reply(struct sc_peer_conn *c, const struct io_bound *b, struct sc_err *err)
{
	if (sc_peer_done_recv(c, b->deadline_mono_ms, b->cancel, err) == 0)
		return 0;
	if (err->code == SC_UNAVAILABLE || err->code == SC_DEADLINE_EXCEEDED)
		sc_err_prefix(err, "all bytes moved but the peer did not confirm completion");
	return -1;
}

/*
 * Move chunks on an opened stream until none is left or the transfer stops. One request runs
 * ahead: the next chunk is asked for (or sent) before the current one's reply is taken, so the
 * server goes from one chunk to the next without waiting for a round trip. done_early: the
 * leader of a single-stream transfer sends DONE {OK} behind the last request (commit_done).
 * Bytes count on rail `rail`. A failure of the path gives the chunk in flight and the one ahead
 * back (whole: the first byte not known complete is a chunk's first) instead of failing the
 * transfer.
 */
enum moved tcp_move_chunks(struct tcp_xfer *tx, int slot, struct sc_peer_conn *c,
			   int *open_pending, bool done_early, size_t rail, struct sc_err *why)
{
	struct sc_xfer *x = tx->xr.x;
	struct sc_err err;
	sc_err_clear(&err);
	struct io_bound b = {.deadline_mono_ms = x->deadline_mono_ms, .cancel = &x->cancel_requested};
	struct sc_xr_piece cut_a, cut_b;
	struct piece cur = {.cut = &cut_a}, next = {.cut = &cut_b};
	bool have_cur = false, have_next = false;
	uint64_t moved_here = 0;
	void *arrays = NULL;
	if (tx->batch) {
		/* two batches' piece lists, iovecs and cursor pieces (the one in flight and the
		 * next) */
		size_t one = tx->max_pieces * (sizeof(struct sc_peer_piece) + sizeof(struct iovec) +
					       sizeof(struct sc_xr_piece));
		arrays = malloc(2 * one);
		if (!arrays) {
			sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "out of memory");
			goto out;
		}
		cur.pp = arrays;
		cur.iov = (struct iovec *)(cur.pp + tx->max_pieces);
		cur.cut = (struct sc_xr_piece *)(cur.iov + tx->max_pieces);
		next.pp = (struct sc_peer_piece *)((uint8_t *)arrays + one);
		next.iov = (struct iovec *)(next.pp + tx->max_pieces);
		next.cut = (struct sc_xr_piece *)(next.iov + tx->max_pieces);
	}
	pthread_mutex_lock(&tx->tb->mu);
	bool others = tcp_live_paths_locked(tx) > 1;
	pthread_mutex_unlock(&tx->tb->mu);
	sc_peer_conn_set_stall(c, others ? PATH_STALL_MS : 0);
	/* With DONE going early, the last data request waits for it: both leave in one segment. */
	if (!tcp_next_piece(tx, &cur, true))
		goto out;
	have_cur = true;
	if (done_early && !tcp_pieces_left(tx))
		sc_peer_conn_hold_next(c);
	if (piece_send(tx, c, &cur, &err) != 0)
		goto out;
	for (;;) {
		bool more = !tcp_should_stop(tx) && tcp_next_piece(tx, &next, false);
		have_next = more;
		if (more && sc_xr_deadline_passed(x, sc_clock_mono_ms())) {
			sc_err_set(&err, SC_DEADLINE_EXCEEDED,
				   "deadline passed with %" PRIu64 " of %" PRIu64 " bytes moved",
				   (uint64_t)atomic_load(&tx->bytes_moved), x->total);
			break;
		}
		if (more && done_early && !tcp_pieces_left(tx))
			sc_peer_conn_hold_next(c);
		if (more && piece_send(tx, c, &next, &err) != 0)
			break;
		if (!more && done_early && !commit_done(tx, c, &b, &err)) {
			if (err.code != SC_OK)
				break;
			sc_peer_conn_flush(c); /* stopping: no DONE to carry the held request */
		}
		sc_trace_mark(x->xfer_id, "tcp_requests_sent");
		if (take_open_reply(c, open_pending, &b, &err) != 0 ||
		    piece_recv(tx, c, &cur, &b, &err) != 0)
			break;
		sc_trace_mark(x->xfer_id, "tcp_reply_received");
		atomic_fetch_add(&tx->bytes_moved, cur.len);
		moved_here += cur.len;
		sc_rail_add_bytes(&tx->tb->base, x, rail, cur.len);
		x->on_progress(x, cur.len);
		tcp_piece_done(tx);
		have_cur = false;
		if (!more) {
			/* Nothing to take now; chunks other streams hold may come back. */
			if (done_early || tcp_should_stop(tx) || !tcp_next_piece(tx, &cur, true))
				break;
			have_cur = true;
			if (piece_send(tx, c, &cur, &err) != 0)
				break;
			continue;
		}
		struct piece done_one = cur; /* its arrays take the next batch after this one */
		cur = next;
		next.pp = done_one.pp;
		next.iov = done_one.iov;
		next.cut = done_one.cut;
		have_next = false;
		have_cur = true;
	}
	if (tx->done_sent && err.code == SC_OK && take_done_reply(c, &b, &err) == 0)
		sc_trace_mark(x->xfer_id, "tcp_done_confirmed");
out:
	if (*open_pending == 1 && err.code == SC_OK && sc_peer_conn_usable(c)) {
		sc_peer_conn_flush(c); /* no piece went out on this stream to carry the OPEN */
		take_open_reply(c, open_pending, &b, &err);
	}
	else if (*open_pending == 1)
		*open_pending = 2;
	sc_peer_conn_set_stall(c, 0);
	enum moved result = MOVED_DONE;
	/* A connection the peer closed (it ended the operation, restarted, or shed connections)
	 * or a pooled one that was dead before anything moved: once more on the same path, where
	 * a fresh dial or OPEN says what the path is worth. */
	if (err.code != SC_OK && tcp_is_path_failure(tx, c, &err))
		result = (sc_peer_conn_reused(c) && moved_here == 0) || sc_peer_conn_peer_closed(c)
			     ? MOVED_STALE
			     : MOVED_PATH_FAILED;
	if (err.code != SC_OK && err.code != SC_CANCELLED && result == MOVED_DONE &&
	    rail < tx->tb->base.n_rails)
		atomic_fetch_add(&tx->tb->base.rails[rail].errors, 1);
	if (result != MOVED_DONE && err.code == SC_DEADLINE_EXCEEDED) /* the stall limit */
		sc_err_set(&err, SC_UNAVAILABLE, "no byte moved for %u ms on %s", PATH_STALL_MS,
			   sc_peer_conn_endpoint(c));
	bool requeue = result != MOVED_DONE;
	if ((have_cur && !tcp_give_back(tx, &cur, requeue)) ||
	    (have_next && !tcp_give_back(tx, &next, requeue))) {
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "out of memory giving chunks back");
		result = MOVED_DONE;
	}
	if (result == MOVED_DONE && err.code != SC_OK)
		tcp_fail_xfer(tx, &err);
	if (result != MOVED_DONE)
		*why = err;
	set_conn(tx, slot, NULL);
	free(arrays);
	return result;
}
