/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/tcp.c: the TCP data plane's active side. A transfer (struct sc_xfer) is cut into chunks
 * of at most --tcp-chunk-size, never across a segment; up to --tcp-streams streams move them in
 * parallel, each on one pooled, authenticated peer connection (peer/pool.h) that OPENs the
 * transfer once and then pulls chunks from a shared cursor, READing straight into or WRITing
 * straight from local region memory. The first error, the cancel flag or the deadline stops every
 * stream (connections blocked in I/O are aborted); then one DONE tells the passive side the
 * verdict, and on_complete runs exactly once.
 *
 * Paths. Every data endpoint of the metadata is a path (the issuer serves each on its own
 * interface); path i counts its bytes on this backend's rail i (modulo the rails it has: one per
 * --data-listen endpoint). The streams are spread over the paths that are not cooling down, at
 * least one per path when there are enough chunks, and pull chunks from the one cursor, so a
 * slower path takes fewer. A one-chunk transfer stays on the first path. A stream whose path
 * fails (dial refused or timed out, connection reset, I/O error, or no progress until the
 * socket's TCP_USER_TIMEOUT / keepalive gives up) gives its unfinished chunks back (whole: a
 * chunk is known complete only when its reply is in) to a queue the other streams take from
 * first, marks the path dead for this transfer, cools it down (tcp/paths.h: 2 s doubling
 * to 60 s; its rail COOLING with the reason) and moves on to the next live path. The transfer
 * fails only when no path is left (the error names each path and why) or its deadline passes.
 *
 * The bookkeeping is the shared transfer runner's (backend/xfer_runner.h): its workers, task queue, live
 * list, stop flag, first failure, verdict and cursor; this file says how pieces go on the wire.
 *
 * Threads: submit() and cancel() run on engine threads (with the engine lock held: they only
 * queue and flag); the runner's 2 x --tcp-streams worker threads (at least 2), started by start()
 * and joined by stop(), run the transfers. The worker that picks a transfer up leads it: it
 * connects, opens, queues helper streams for the other workers when there is more than one chunk,
 * moves chunks itself, reclaims helpers that never started, waits for the running ones, sends DONE
 * and completes. A one-chunk transfer therefore costs one hand-off (submit -> worker), or none: a
 * small one-request transfer with an idle pooled connection, begun inside the gRPC handler's
 * run-here window (engine/engine.h, sc_op_run_here_open), runs on that handler's thread once the
 * engine lock is released (at most RUN_HERE_MAX at once).
 *
 * Owns: the runner, the paths' health, and one struct tcp_xfer per transfer in flight (with the
 * chunks given back). The connections belong to the peer pool; a stream holds one while it runs.
 *
 * Locking: tb->mu guards the runner (its queue and list of transfers in flight) and each
 * transfer's stream table and verdict. It is never held while calling the engine (on_progress,
 * on_complete, the pool's keyring look-up) or doing I/O, so the engine lock (held around submit and
 * cancel) always comes first.
 */
#include "backend/backend.h"
#include "tcp/paths.h"
#include "base/log.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"
#include "peer/server.h"
#include "base/timer.h"
#include "base/trace.h"
#include "backend/xfer_runner.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STREAMS 16
#define DEFAULT_CHUNK (8ull << 20)
#define MAX_PATHS SC_MAX_ENDPOINTS
/* A dial on one of several live paths gives up after this long (on the last one left: at the
 * transfer's deadline, so a restarting peer is waited for as before). */
#define PATH_DIAL_MS 3000
/* A stream waiting for chunks that other streams may give back looks at its stop flag this
 * often. */
#define GIVEN_BACK_WAIT_MS 100
/* While another path is live, a stream on which no byte moves for this long takes its path as
 * dead (sooner than the socket's TCP_USER_TIMEOUT, SC_PEER_USER_TIMEOUT_MS). */
#define PATH_STALL_MS 5000
/* A transfer runs on the thread that began it (backend/xfer_runner.h, run-here window) when it is at most
 * this big, fits one request, is host memory only, no other transfer of this backend is in flight
 * (under load the workers overlap transfers better than gRPC threads blocked in them) and an idle
 * pooled connection to its first path is there; at most RUN_HERE_MAX such transfers at once (they
 * hold gRPC threads). */
#define RUN_HERE_MAX_BYTES (256u << 10)
#define RUN_HERE_MAX 2

struct tcp_xfer;

struct task {
	struct sc_xr_task t;
	struct tcp_xfer *tx;
	int slot; /* 0: the leader; 1..: helper streams */
};

struct tcp_backend {
	struct sc_backend base;
	struct sc_peer_pool *pool;
	uint32_t streams;
	uint64_t chunk;

	pthread_mutex_t mu; /* guards xr and health too */
	struct sc_xr xr;
	struct sc_tcp_health health; /* per peer endpoint: cooling down after a failure */
	atomic_uint here_running;    /* transfers running on the threads that began them */
};

/* Chunks a failed stream gave back, taken before the cursor's (under cursor_mu). */
struct given_back {
	struct sc_list node;
	size_t n;
	struct sc_xr_piece cut[];
};

struct tcp_xfer {
	struct sc_xr_xfer xr; /* the transfer (xr.x), stop flag, first failure; live in tb->xr */
	struct tcp_backend *tb;
	size_t n_paths; /* x->meta->endpoints used, at most MAX_PATHS */
	/* Paths in the order streams take them: usable ones (not cooling), then cooling ones (a
	 * last resort); n_start: how many streams start on (the usable ones, or all when none
	 * is). Set by the leader before any helper is queued; read-only after. */
	size_t order[MAX_PATHS], n_order, n_start;
	int start_path[MAX_STREAMS]; /* the path each stream starts on */
	atomic_bool quit; /* dial no more: stopping, or every chunk is done */

	/* Pieces travel many per request (READV/WRITEV): the peer reads them (metadata version 2).
	 * A request's local pieces are all host memory or all one GPU's (staged, packed). Set at
	 * submit, read-only after. */
	bool batch;
	/* Pieces in one request: SC_PEER_MAX_PIECES, or fewer when the transfer has fewer segments
	 * (a batch holds at most one piece of each), so a small transfer's piece arrays stay small
	 * (the full ones, ~150 KiB, went to mmap or grew and trimmed a malloc arena per transfer).
	 */
	size_t max_pieces;
	pthread_mutex_t cursor_mu; /* guards cur, given and in_flight */
	pthread_cond_t work_cv;	   /* chunks given back, or in_flight reached 0 */
	struct sc_xr_cursor cur;
	struct sc_list given; /* struct given_back */
	unsigned in_flight;   /* chunks taken and neither complete nor given back */
	atomic_uint_fast64_t bytes_moved;

	/* Under tb->mu. */
	struct sc_peer_conn *conns[MAX_STREAMS]; /* what each stream has in I/O, for abort */
	unsigned helpers; /* helper tasks queued or running: the leader waits for none */
	pthread_cond_t helpers_cv;
	/* DONE {OK} went out behind the last data request (see commit_done): a failure from here on
	 * is recorded even when a stop was asked for. A cancel still cuts the stream (the worker's
	 * memory must be quiet when CancelOperation answers); the deadline's own stop does not. */
	bool committing;
	bool done_sent; /* the leader's own: DONE {OK} was sent (finish tells no verdict) */
	bool path_dead[MAX_PATHS];     /* failed during this transfer: not used again by it */
	char path_why[MAX_PATHS][160]; /* and why */
	bool here; /* runs on the thread that began it (counted in tb->here_running) */

	struct task tasks[MAX_STREAMS];
};

static inline struct tcp_backend *to_tcp(struct sc_backend *b)
{
	return container_of(b, struct tcp_backend, base);
}

/* ---- transfer state -------------------------------------------------------------------------- */

struct piece {
	const struct sc_xfer_seg *seg;
	uint64_t off; /* within the segment, which is also the offset in its remote descriptor */
	uint64_t len; /* a batch: the pieces' total */
	/* A batch (tx->batch): n pieces, each a (remote descriptor, offset, length) on the wire and
	 * an iovec of local memory; the arrays belong to the stream (tx->max_pieces each). */
	uint32_t n;
	struct sc_peer_piece *pp;
	struct iovec *iov;
	struct sc_xr_piece *cut; /* what the cursor handed out (given back if the path fails) */
	size_t n_cut;
	int gpu; /* a batch: where its local pieces are (SC_GPU_HOST or one device) */
};

/* One request, one kind of local memory: host, or one GPU's (staged and packed). */
static bool same_local_memory(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
			      const struct sc_xfer_seg *next)
{
	(void)prev;
	return next->local_gpu == first->local_gpu;
}

static bool should_stop(struct tcp_xfer *tx)
{
	return sc_xr_should_stop(&tx->xr);
}

/* The next chunk: one given back by a failed stream, else the cursor's. wait: when neither has
 * one but other streams hold chunks, wait for those to complete or come back. Counts the chunk
 * in flight until piece_done or give_back. */
static bool next_piece(struct tcp_xfer *tx, struct piece *p, bool wait)
{
	uint64_t chunk = tx->tb->chunk;
	size_t n = 0;
	pthread_mutex_lock(&tx->cursor_mu);
	for (;;) {
		struct sc_list *first = sc_list_first(&tx->given);
		if (first) {
			struct given_back *g = sc_list_entry(first, struct given_back, node);
			sc_list_remove(first);
			n = g->n;
			memcpy(p->cut, g->cut, n * sizeof(g->cut[0]));
			free(g);
			break;
		}
		/* A batch: up to SC_PEER_MAX_PIECES pieces and --tcp-chunk-size bytes, in list
		 * order. */
		n = tx->batch ? sc_xr_cursor_take(&tx->cur, tx->xr.x, chunk, tx->max_pieces,
						  same_local_memory, p->cut)
			      : sc_xr_cursor_take(&tx->cur, tx->xr.x, chunk, 1, NULL, p->cut);
		if (n || !wait || tx->in_flight == 0 || should_stop(tx))
			break;
		sc_cond_wait_ms(&tx->work_cv, &tx->cursor_mu, GIVEN_BACK_WAIT_MS);
	}
	if (n)
		tx->in_flight++;
	pthread_mutex_unlock(&tx->cursor_mu);
	if (n == 0)
		return false;
	p->n_cut = n;
	p->n = 0;
	p->seg = p->cut[0].seg;
	p->off = p->cut[0].off;
	p->len = p->cut[0].len;
	if (!tx->batch)
		return true;
	p->gpu = p->seg->local_gpu;
	p->len = 0;
	for (size_t i = 0; i < n; i++) {
		const struct sc_xr_piece *c = &p->cut[i];
		p->pp[i] = (struct sc_peer_piece){
		    .desc = c->seg->remote_desc, .offset = c->off, .len = c->len};
		p->iov[i] = (struct iovec){.iov_base = c->seg->local + c->off, .iov_len = (size_t)c->len};
		p->len += c->len;
	}
	p->n = (uint32_t)n;
	return true;
}

/* Under cursor_mu: nothing is left to take nor in flight. */
static bool all_done_locked(struct tcp_xfer *tx)
{
	return tx->in_flight == 0 && sc_list_empty(&tx->given) &&
	       sc_xr_cursor_done(&tx->cur, tx->xr.x);
}

/* A chunk's reply is in. The last one tells streams still dialing to give up. */
static void piece_done(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	tx->in_flight--;
	if (tx->in_flight == 0)
		pthread_cond_broadcast(&tx->work_cv);
	if (all_done_locked(tx))
		atomic_store(&tx->quit, true);
	pthread_mutex_unlock(&tx->cursor_mu);
}

/* A chunk that will not complete on this stream: back to the queue (requeue), or only out of
 * flight (the transfer is failing anyway). False when out of memory. */
static bool give_back(struct tcp_xfer *tx, const struct piece *p, bool requeue)
{
	struct given_back *g = NULL;
	if (requeue) {
		g = malloc(sizeof(*g) + p->n_cut * sizeof(g->cut[0]));
		if (g) {
			g->n = p->n_cut;
			memcpy(g->cut, p->cut, p->n_cut * sizeof(g->cut[0]));
		}
	}
	pthread_mutex_lock(&tx->cursor_mu);
	if (g)
		sc_list_insert_tail(&tx->given, &g->node);
	tx->in_flight--;
	pthread_cond_broadcast(&tx->work_cv);
	pthread_mutex_unlock(&tx->cursor_mu);
	return g || !requeue;
}

/* Whether a chunk is left to take (the leader of a single stream owns them: nobody else moves
 * the cursor). */
static bool pieces_left(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	bool left = !sc_list_empty(&tx->given) || sc_xr_cursor_more(&tx->cur, tx->xr.x);
	pthread_mutex_unlock(&tx->cursor_mu);
	return left;
}

static uint64_t count_chunks(const struct tcp_xfer *tx, uint64_t chunk)
{
	const struct sc_xfer *x = tx->xr.x;
	if (tx->batch) { /* requests: by bytes, and by pieces */
		uint64_t by_bytes = (x->total + chunk - 1) / chunk;
		uint64_t by_pieces = (x->n_segs + SC_PEER_MAX_PIECES - 1) / SC_PEER_MAX_PIECES;
		return by_bytes > by_pieces ? by_bytes : by_pieces;
	}
	uint64_t n = 0;
	for (size_t i = 0; i < x->n_segs; i++)
		n += (x->segs[i].len + chunk - 1) / chunk;
	return n;
}

/* Record the transfer's first failure and stop every stream. A stream that fails because it was
 * stopped records nothing new (the first failure, or the cancel, is the cause), unless the
 * transfer commits (its DONE went out: the failure is the peer's verdict). */
static void fail_xfer(struct tcp_xfer *tx, const struct sc_err *err)
{
	struct tcp_backend *tb = tx->tb;
	pthread_mutex_lock(&tb->mu);
	sc_xr_fail_locked(&tx->xr, tx->committing, err->code, "%s", err->msg);
	atomic_store(&tx->quit, true);
	for (int i = 0; i < MAX_STREAMS; i++)
		if (tx->conns[i])
			sc_peer_conn_abort(tx->conns[i]);
	pthread_mutex_unlock(&tb->mu);
}

/* Publish the connection a stream is about to block on (so a stop can abort it). Returns false
 * when the transfer is already stopping. */
static bool set_conn(struct tcp_xfer *tx, int slot, struct sc_peer_conn *c)
{
	pthread_mutex_lock(&tx->tb->mu);
	tx->conns[slot] = c;
	bool go = c == NULL || !should_stop(tx);
	pthread_mutex_unlock(&tx->tb->mu);
	return go;
}

/* ---- paths ---------------------------------------------------------------------------------- */

static size_t rail_of(const struct tcp_backend *tb, size_t path)
{
	return tb->base.n_rails ? path % tb->base.n_rails : 0;
}

static const char *path_endpoint(const struct tcp_xfer *tx, size_t path)
{
	return tx->xr.x->meta->endpoints[path];
}

/* Paths of this transfer not failed yet. Under tb->mu. */
static size_t live_paths_locked(const struct tcp_xfer *tx)
{
	size_t n = 0;
	for (size_t i = 0; i < tx->n_paths; i++)
		n += !tx->path_dead[i];
	return n;
}

/* The next live path after `path` in the transfer's order; false when none is left. */
static bool next_live_path(struct tcp_xfer *tx, size_t *path)
{
	size_t at = 0;
	for (size_t k = 0; k < tx->n_order; k++)
		if (tx->order[k] == *path)
			at = k;
	pthread_mutex_lock(&tx->tb->mu);
	bool found = false;
	for (size_t k = 1; k <= tx->n_order && !found; k++) {
		size_t p = tx->order[(at + k) % tx->n_order];
		if (!tx->path_dead[p]) {
			*path = p;
			found = true;
		}
	}
	pthread_mutex_unlock(&tx->tb->mu);
	return found;
}

/* A path failed under this transfer: dead for it, cooling down for everyone, its rail COOLING. */
static void path_failed(struct tcp_xfer *tx, size_t path, const struct sc_err *err)
{
	struct tcp_backend *tb = tx->tb;
	const char *ep = path_endpoint(tx, path);
	size_t rail = rail_of(tb, path);
	pthread_mutex_lock(&tb->mu);
	if (tx->path_dead[path]) {
		pthread_mutex_unlock(&tb->mu);
		return;
	}
	tx->path_dead[path] = true;
	snprintf(tx->path_why[path], sizeof(tx->path_why[path]), "%s", err->msg);
	size_t left = live_paths_locked(tx);
	uint32_t cool = sc_tcp_health_failed(&tb->health, ep, sc_clock_mono_ms());
	if (!left)
		atomic_store(&tx->quit, true); /* streams still dialing: no path is left to dial */
	pthread_mutex_unlock(&tb->mu);
	if (rail < tb->base.n_rails) {
		atomic_fetch_add(&tb->base.rails[rail].errors, 1);
		if (left)
			atomic_fetch_add(&tb->base.rails[rail].failovers, 1);
	}
	sc_rail_set_state(&tb->base, rail, SC_RAIL_COOLING,
			  "path to %s failed: %.120s; cooling down %u s, then probed", ep, err->msg,
			  cool / 1000);
	SC_WARN("tcp", "transfer %016" PRIx64 ": path to %s (rail %zu %s) failed: %s; %s, the path "
		"cools down %u ms", tx->xr.x->xfer_id, ep, rail,
		rail < tb->base.n_rails ? tb->base.rails[rail].name : "", err->msg,
		left ? "its chunks move to the other paths" : "no path is left", cool);
}

/* A stream opened on path: a path that was cooling is healthy again (its probe worked). */
static void path_works(struct tcp_xfer *tx, size_t path)
{
	struct tcp_backend *tb = tx->tb;
	const char *ep = path_endpoint(tx, path);
	pthread_mutex_lock(&tb->mu);
	bool recovered = sc_tcp_health_ok(&tb->health, ep, sc_clock_mono_ms());
	pthread_mutex_unlock(&tb->mu);
	if (!recovered)
		return;
	size_t rail = rail_of(tb, path);
	sc_rail_set_state(&tb->base, rail, SC_RAIL_UP, "path to %s is back (probed)", ep);
	SC_INFO("tcp", "path to %s (rail %zu) works again after its cool-down", ep, rail);
}

/* Why a failure is the path's (move its chunks to another) rather than the transfer's: the
 * transfer has another path, the connection broke or could not be made, and nothing else stops
 * the transfer (a cancel, the deadline, another failure, a DONE already sent). A peer's refusal
 * leaves its connection usable and is its verdict. */
static bool is_path_failure(struct tcp_xfer *tx, struct sc_peer_conn *c, const struct sc_err *err)
{
	if (tx->n_paths < 2) /* nowhere to move: the failure is the transfer's, as ever */
		return false;
	if (err->code != SC_UNAVAILABLE && err->code != SC_DEADLINE_EXCEEDED)
		return false;
	if (should_stop(tx) || sc_xr_deadline_passed(tx->xr.x, sc_clock_mono_ms()))
		return false;
	if (c && sc_peer_conn_usable(c))
		return false;
	pthread_mutex_lock(&tx->tb->mu);
	bool committing = tx->committing;
	pthread_mutex_unlock(&tx->tb->mu);
	return !committing;
}

/* A connection to the issuing sidecar on path. A dial gives up after PATH_DIAL_MS while other
 * paths are live, else at the transfer's deadline. NULL with err clear when told to quit. */
static struct sc_peer_conn *connect_path(struct tcp_xfer *tx, size_t path, struct sc_err *err)
{
	const struct sc_metadata *md = tx->xr.x->meta;
	const char *ep = path_endpoint(tx, path);
	uint64_t deadline = tx->xr.x->deadline_mono_ms;
	pthread_mutex_lock(&tx->tb->mu);
	bool others = live_paths_locked(tx) > 1;
	pthread_mutex_unlock(&tx->tb->mu);
	if (others) {
		uint64_t bound = sc_clock_mono_ms() + PATH_DIAL_MS;
		if (!deadline || bound < deadline)
			deadline = bound;
	}
	struct sc_peer_conn *c;
	if (sc_peer_pool_get_cancellable(tx->tb->pool, ep, deadline, &tx->quit, &c, err) != 0) {
		if (atomic_load(&tx->quit) && !should_stop(tx))
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
 * OPEN may be sent without waiting for its reply, which move_chunks takes after the first data
 * request went out (one round trip less); *open_pending says whether it did (1) or not (0). */
static struct sc_peer_conn *open_stream(struct tcp_xfer *tx, int slot, size_t path,
					bool pipelined, int *open_pending, struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	enum sc_op_kind peer_kind = x->kind == SC_OP_READ ? SC_OP_READ : SC_OP_WRITE;
	/* A pooled connection whose peer went away unseen (its FIN lost in a partition, the peer
	 * restarted on the same address) breaks on its first request: try the next one, then a
	 * fresh dial; at most the pool's depth per endpoint plus one tries. */
	for (unsigned tries = 0;; tries++) {
		if (should_stop(tx) || atomic_load(&tx->quit))
			return NULL;
		struct sc_peer_conn *c = connect_path(tx, path, err);
		if (!c)
			return NULL;
		/* A pipelined OPEN on a dead pooled connection fails later, in move_chunks: the
		 * leader then starts over (restart_after_stale). */
		bool pipe = pipelined;
		if (set_conn(tx, slot, c) &&
		    (pipe ? sc_peer_open_send(c, x->meta->token, x->xfer_id, peer_kind, x->total, 0,
					      x->deadline_mono_ms, &x->cancel_requested, err)
			  : sc_peer_open(c, x->meta->token, x->xfer_id, peer_kind, x->total,
					 x->deadline_mono_ms, &x->cancel_requested, err)) == 0) {
			*open_pending = pipe ? 1 : 0;
			path_works(tx, path);
			return c;
		}
		set_conn(tx, slot, NULL);
		bool stale = sc_peer_conn_reused(c) && !sc_peer_conn_usable(c) &&
			     err->code == SC_UNAVAILABLE && tries < SC_PEER_POOL_IDLE_PER_ENDPOINT;
		/* After a refused OPEN the connection is still good; one broken mid-OPEN is closed
		 * (the server abandons whatever it may have opened). */
		sc_peer_pool_put(tx->tb->pool, c, sc_peer_conn_usable(c));
		if (!stale || should_stop(tx))
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

/* The reply to a pipelined OPEN (see open_stream). *open_pending: 1 while it is due; afterwards
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
 * replies are awaited until sc_peer_verdict_ok_deadline (the same bound as a confirmed DONE). False when the transfer is already stopping (nothing sent: the verdict is told
 * the usual way) or the send failed (err says why).
 */
static bool commit_done(struct tcp_xfer *tx, struct sc_peer_conn *c, struct io_bound *b,
			struct sc_err *err)
{
	struct sc_xfer *x = tx->xr.x;
	pthread_mutex_lock(&tx->tb->mu);
	bool go = !should_stop(tx);
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

/* What became of a stream's run on one connection. */
enum moved {
	MOVED_DONE,	   /* no chunk left, or the transfer stopped (its failure recorded) */
	MOVED_PATH_FAILED, /* the path failed: its chunks were given back (*why says how) */
	MOVED_STALE, /* the peer closed the connection, or a pooled one was dead before anything
		      * moved: chunks given back, the path worth another try */
};

/*
 * Move chunks on an opened stream until none is left or the transfer stops. One request runs
 * ahead: the next chunk is asked for (or sent) before the current one's reply is taken, so the
 * server goes from one chunk to the next without waiting for a round trip. done_early: the
 * leader of a single-stream transfer sends DONE {OK} behind the last request (commit_done).
 * Bytes count on rail `rail`. A failure of the path gives the chunk in flight and the one ahead
 * back (whole: the first byte not known complete is a chunk's first) instead of failing the
 * transfer.
 */
static enum moved move_chunks(struct tcp_xfer *tx, int slot, struct sc_peer_conn *c,
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
	bool others = live_paths_locked(tx) > 1;
	pthread_mutex_unlock(&tx->tb->mu);
	sc_peer_conn_set_stall(c, others ? PATH_STALL_MS : 0);
	/* With DONE going early, the last data request waits for it: both leave in one segment. */
	if (!next_piece(tx, &cur, true))
		goto out;
	have_cur = true;
	if (done_early && !pieces_left(tx))
		sc_peer_conn_hold_next(c);
	if (piece_send(tx, c, &cur, &err) != 0)
		goto out;
	for (;;) {
		bool more = !should_stop(tx) && next_piece(tx, &next, false);
		have_next = more;
		if (more && sc_xr_deadline_passed(x, sc_clock_mono_ms())) {
			sc_err_set(&err, SC_DEADLINE_EXCEEDED,
				   "deadline passed with %" PRIu64 " of %" PRIu64 " bytes moved",
				   (uint64_t)atomic_load(&tx->bytes_moved), x->total);
			break;
		}
		if (more && done_early && !pieces_left(tx))
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
		piece_done(tx);
		have_cur = false;
		if (!more) {
			/* Nothing to take now; chunks other streams hold may come back. */
			if (done_early || should_stop(tx) || !next_piece(tx, &cur, true))
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
	if (err.code != SC_OK && is_path_failure(tx, c, &err))
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
	if ((have_cur && !give_back(tx, &cur, requeue)) ||
	    (have_next && !give_back(tx, &next, requeue))) {
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "out of memory giving chunks back");
		result = MOVED_DONE;
	}
	if (result == MOVED_DONE && err.code != SC_OK)
		fail_xfer(tx, &err);
	if (result != MOVED_DONE)
		*why = err;
	set_conn(tx, slot, NULL);
	free(arrays);
	return result;
}

/* ---- leading a transfer ---------------------------------------------------------------------- */

static void free_tx(struct tcp_xfer *tx)
{
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &tx->given) {
		sc_list_remove(pos);
		free(sc_list_entry(pos, struct given_back, node));
	}
	pthread_cond_destroy(&tx->work_cv);
	pthread_cond_destroy(&tx->helpers_cv);
	pthread_mutex_destroy(&tx->cursor_mu);
	free(tx);
}

static bool task_of(const struct sc_xr_task *t, void *tx)
{
	return container_of(t, struct task, t)->tx == tx;
}

/* Take back this transfer's helpers that no worker has started. Under tb->mu. */
static void reclaim_helpers_locked(struct tcp_backend *tb, struct tcp_xfer *tx)
{
	tx->helpers -= (unsigned)sc_xr_unqueue_locked(&tb->xr, task_of, tx);
}

/* The first path not failed (the verdict goes there when the leader's connection is gone). */
static size_t verdict_path(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->tb->mu);
	size_t path = tx->n_order ? tx->order[0] : 0;
	for (size_t k = 0; k < tx->n_order; k++)
		if (!tx->path_dead[tx->order[k]]) {
			path = tx->order[k];
			break;
		}
	pthread_mutex_unlock(&tx->tb->mu);
	return path;
}

/* The verdict, DONE to the passive side (when `opened`: c is then the leader's connection, or
 * NULL when its path failed), and on_complete. */
static void finish(struct tcp_xfer *tx, struct sc_peer_conn *c, bool opened)
{
	struct tcp_backend *tb = tx->tb;
	struct sc_xfer *x = tx->xr.x;
	char msg[SC_ERR_MSG_MAX];
	/* Bytes the peer was told are complete (a pipelined DONE) stay complete after a cancel. */
	enum sc_status status = sc_xr_verdict(&tb->xr, &tx->xr, atomic_load(&tx->bytes_moved),
					      false, msg, sizeof(msg));

	if (opened && !tx->done_sent) {
		/* The verdict on the passive side. A success must be confirmed (the operation is
		 * complete on both sides or on neither); a failure is told best effort. After a
		 * pipelined DONE {OK} nothing more is told: the passive side has judged it, or sees
		 * the connection end without it and abandons the transfer. */
		sc_peer_tell_verdict(tb->pool, &c, path_endpoint(tx, verdict_path(tx)), x->meta->token,
				     x->xfer_id, x->deadline_mono_ms, &status, msg, sizeof(msg),
				     "tcp");
	}
	sc_peer_pool_put(tb->pool, c, c && sc_peer_conn_usable(c));
	for (size_t i = 0; i < tb->base.n_rails && i < SC_XFER_MAX_RAILS; i++)
		if (atomic_load(&x->rail_bytes[i]))
			atomic_fetch_add(&tb->base.rails[i].operations, 1);

	pthread_mutex_lock(&tb->mu);
	sc_xr_retire_locked(&tb->xr, &tx->xr);
	pthread_mutex_unlock(&tb->mu);
	free_tx(tx);
	sc_trace_mark(x->xfer_id, "tcp_finished");
	sc_xr_complete(x, status, msg);
}

/* The leader's pipelined OPEN went unanswered on a pooled connection and nothing moved: that
 * connection was dead (its peer went away unseen, e.g. restarted behind a partition). Start over
 * once: the same transfer id may be OPENed again, and nothing reached the passive side's memory.
 * Only for single-stream transfers (no helper holds a piece). */
static bool restart_after_stale(struct tcp_xfer *tx, struct sc_peer_conn *c, int open_pending,
				uint32_t streams)
{
	struct tcp_backend *tb = tx->tb;
	struct sc_xfer *x = tx->xr.x;
	if (open_pending != 2 || streams != 1 || !sc_peer_conn_reused(c) ||
	    atomic_load(&tx->bytes_moved) != 0 || atomic_load(&x->cancel_requested) ||
	    sc_xr_deadline_passed(x, sc_clock_mono_ms()))
		return false;
	pthread_mutex_lock(&tb->mu);
	bool restart = !tb->xr.stopping && tx->xr.failed && tx->xr.status == SC_UNAVAILABLE;
	if (restart) {
		SC_DEBUG("tcp", "transfer %016" PRIx64 ": a pooled connection was dead (%s); starting "
				"over on another",
			 x->xfer_id, tx->xr.msg);
		sc_xr_reset_locked(&tx->xr);
		atomic_store(&tx->quit, false);
		tx->committing = false;
		atomic_store(&x->committed, false);
		tx->done_sent = false;
	}
	pthread_mutex_unlock(&tb->mu);
	if (restart) {
		pthread_mutex_lock(&tx->cursor_mu);
		sc_xr_cursor_seek(&tx->cur, tx->xr.x, 0);
		pthread_mutex_unlock(&tx->cursor_mu);
	}
	return restart;
}

/* DONE {OK} may go out before the last reply when nothing on this side can fail after the bytes
 * left the peer: not for a READ into GPU memory (the staged copy to the GPU could still fail). */
static bool done_can_go_early(const struct sc_xfer *x)
{
	if (x->kind == SC_OP_WRITE)
		return true;
	for (size_t i = 0; i < x->n_segs; i++)
		if (x->segs[i].local_gpu != SC_GPU_HOST)
			return false;
	return true;
}

/* The paths in the order streams take them (usable first, cooling ones as a last resort) and
 * where each stream starts: streams spread over the usable paths. */
static void plan_paths(struct tcp_xfer *tx, uint32_t streams)
{
	struct tcp_backend *tb = tx->tb;
	uint64_t now = sc_clock_mono_ms(), cooling;
	size_t cool[MAX_PATHS], n_cool = 0;
	tx->n_order = 0;
	pthread_mutex_lock(&tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++) {
		if (sc_tcp_health_usable(&tb->health, path_endpoint(tx, i), now, &cooling))
			tx->order[tx->n_order++] = i;
		else
			cool[n_cool++] = i;
	}
	pthread_mutex_unlock(&tb->mu);
	tx->n_start = tx->n_order ? tx->n_order : n_cool;
	for (size_t i = 0; i < n_cool; i++)
		tx->order[tx->n_order++] = cool[i];
	for (uint32_t s = 0; s < streams; s++)
		tx->start_path[s] = (int)tx->order[s % tx->n_start];
}

/* Streams for a transfer of `chunks` chunks: --tcp-streams, at least one per usable path, never
 * more than chunks. */
static uint32_t stream_count(struct tcp_xfer *tx, uint64_t chunks)
{
	struct tcp_backend *tb = tx->tb;
	uint64_t now = sc_clock_mono_ms(), cooling;
	uint32_t usable = 0;
	pthread_mutex_lock(&tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++)
		usable += sc_tcp_health_usable(&tb->health, path_endpoint(tx, i), now, &cooling);
	pthread_mutex_unlock(&tb->mu);
	uint32_t want = tb->streams > usable ? tb->streams : usable;
	if (want > MAX_STREAMS)
		want = MAX_STREAMS;
	return chunks < want ? (uint32_t)(chunks ? chunks : 1) : want;
}

/* No path was left with chunks still to move: the transfer fails, naming each path and why. */
static void fail_no_path(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	bool left = !all_done_locked(tx);
	pthread_mutex_unlock(&tx->cursor_mu);
	if (!left || should_stop(tx))
		return;
	struct sc_err err;
	sc_err_set(&err, SC_UNAVAILABLE, "no path to sidecar %s is left (%" PRIu64 " of %" PRIu64
		   " bytes moved):", tx->xr.x->meta->issuer, (uint64_t)atomic_load(&tx->bytes_moved),
		   tx->xr.x->total);
	pthread_mutex_lock(&tx->tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++) {
		size_t used = strlen(err.msg);
		snprintf(err.msg + used, sizeof(err.msg) - used, "%s %s: %s", i ? ";" : "",
			 path_endpoint(tx, i), tx->path_dead[i] ? tx->path_why[i] : "not tried");
	}
	pthread_mutex_unlock(&tx->tb->mu);
	fail_xfer(tx, &err);
}

/* The path a stream failed on is dead for the transfer; which one it goes on with. False: none
 * is left. */
static bool fail_over(struct tcp_xfer *tx, size_t *path, const struct sc_err *why)
{
	path_failed(tx, *path, why);
	return !should_stop(tx) && next_live_path(tx, path);
}

static void lead(struct tcp_xfer *tx)
{
	struct tcp_backend *tb = tx->tb;
	struct sc_err err;
	sc_err_clear(&err);
	uint64_t chunks = count_chunks(tx, tb->chunk);
	uint32_t streams = stream_count(tx, chunks);
	plan_paths(tx, streams);
	size_t path = (size_t)tx->start_path[0];
	int open_pending = 0;
	bool done_early = streams == 1 && done_can_go_early(tx->xr.x);
	bool pipelined = streams == 1, opened = false, helpers_queued = false;
	unsigned stale = 0;
	struct sc_peer_conn *c = NULL;
	sc_trace_mark(tx->xr.x->xfer_id, "runner_picked_up");
	for (;;) {
		sc_err_clear(&err);
		c = open_stream(tx, 0, path, pipelined, &open_pending, &err);
		if (c)
			sc_trace_mark(tx->xr.x->xfer_id, "tcp_connection_ready");
		if (!c) {
			if (err.code != SC_OK && is_path_failure(tx, NULL, &err) &&
			    fail_over(tx, &path, &err)) {
				pipelined = false;
				continue;
			}
			if (err.code != SC_OK && !is_path_failure(tx, NULL, &err))
				fail_xfer(tx, &err);
			break;
		}
		opened = true;
		if (streams > 1 && !helpers_queued) {
			pthread_mutex_lock(&tb->mu);
			for (uint32_t i = 1; i < streams; i++)
				sc_xr_queue_locked(&tb->xr, &tx->tasks[i].t);
			tx->helpers += streams - 1;
			pthread_mutex_unlock(&tb->mu);
			helpers_queued = true;
		}
		struct sc_err why;
		enum moved m = move_chunks(tx, 0, c, &open_pending, done_early, rail_of(tb, path),
					   &why);
		if (m == MOVED_DONE && restart_after_stale(tx, c, open_pending, streams)) {
			sc_peer_pool_put(tb->pool, c, false);
			c = NULL;
			pipelined = false; /* synchronous: retries stale ones */
			continue;
		}
		if (m == MOVED_DONE)
			break;
		sc_peer_pool_put(tb->pool, c, false);
		c = NULL;
		pipelined = false;
		if (m == MOVED_STALE && stale++ == 0)
			continue; /* once on a fresh connection, same path */
		if (!fail_over(tx, &path, &why))
			break;
	}
	if (helpers_queued) {
		pthread_mutex_lock(&tb->mu);
		reclaim_helpers_locked(tb, tx);
		while (tx->helpers)
			pthread_cond_wait(&tx->helpers_cv, &tb->mu);
		pthread_mutex_unlock(&tb->mu);
	}
	fail_no_path(tx); /* chunks left and no failure recorded: every path failed */
	/* A refused OPEN: the passive side keeps its use and hears nothing from us. */
	finish(tx, c, opened && open_pending != -1);
}

/* A helper stream. One that cannot connect or open is not an error: the streams that did take
 * its share of the chunks. One whose path fails moves on to the next live path. */
static void help(struct tcp_xfer *tx, int slot)
{
	struct tcp_backend *tb = tx->tb;
	size_t path = (size_t)tx->start_path[slot];
	unsigned stale = 0;
	for (;;) {
		struct sc_err err, why;
		sc_err_clear(&err);
		pthread_mutex_lock(&tb->mu);
		bool dead = tx->path_dead[path];
		pthread_mutex_unlock(&tb->mu);
		if (dead && !next_live_path(tx, &path))
			break;
		int opened = 0;
		struct sc_peer_conn *c = open_stream(tx, slot, path, false, &opened, &err);
		if (!c) {
			if (err.code != SC_OK && is_path_failure(tx, NULL, &err) &&
			    fail_over(tx, &path, &err))
				continue;
			if (err.code != SC_OK)
				SC_DEBUG("tcp", "transfer %016" PRIx64 ": stream %d not started: %s",
					 tx->xr.x->xfer_id, slot, err.msg);
			break;
		}
		enum moved m = move_chunks(tx, slot, c, &opened, false, rail_of(tb, path), &why);
		sc_peer_pool_put(tb->pool, c, sc_peer_conn_usable(c));
		if (m == MOVED_DONE)
			break;
		if (m == MOVED_STALE && stale++ == 0)
			continue;
		if (!fail_over(tx, &path, &why))
			break;
	}
	pthread_mutex_lock(&tb->mu);
	tx->helpers--;
	pthread_cond_signal(&tx->helpers_cv);
	pthread_mutex_unlock(&tb->mu);
}

/* A worker runs a transfer's task: its leader, or one of its helper streams. */
static void run_task(struct sc_xr_task *t)
{
	struct task *task = container_of(t, struct task, t);
	if (task->slot != 0) {
		help(task->tx, task->slot);
		return;
	}
	struct tcp_backend *tb = task->tx->tb;
	bool here = task->tx->here;
	lead(task->tx); /* frees tx */
	if (here)
		atomic_fetch_sub(&tb->here_running, 1);
}

/* Whether a transfer may run on the thread that began it (see RUN_HERE_MAX_BYTES): one request
 * on a warm connection, so the hand-off to a worker would cost more than the transfer. Counts it
 * in tb->here_running when it may. */
static bool may_run_here(struct tcp_xfer *tx)
{
	struct tcp_backend *tb = tx->tb;
	const struct sc_xfer *x = tx->xr.x;
	if (!sc_xr_here_possible() || x->total > RUN_HERE_MAX_BYTES || x->total > tb->chunk ||
	    count_chunks(tx, tb->chunk) != 1)
		return false;
	for (size_t i = 0; i < x->n_segs; i++)
		if (x->segs[i].local_gpu != SC_GPU_HOST)
			return false;
	uint64_t cooling;
	pthread_mutex_lock(&tb->mu);
	bool usable = tb->xr.n_live == 0 && sc_tcp_health_usable(&tb->health, path_endpoint(tx, 0),
								 sc_clock_mono_ms(), &cooling);
	pthread_mutex_unlock(&tb->mu);
	if (!usable || !sc_peer_pool_has_idle(tb->pool, path_endpoint(tx, 0)))
		return false;
	unsigned n = atomic_load(&tb->here_running);
	do {
		if (n >= RUN_HERE_MAX)
			return false;
	} while (!atomic_compare_exchange_weak(&tb->here_running, &n, n + 1));
	return true;
}

/* ---- ops ------------------------------------------------------------------------------------- */

static int tcp_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	struct tcp_backend *tb = to_tcp(b);
	if (x->kind != SC_OP_READ && x->kind != SC_OP_WRITE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "tcp backend: not a READ or WRITE");
	struct tcp_xfer *tx = calloc(1, sizeof(*tx));
	if (!tx)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	tx->tb = tb;
	tx->n_paths = x->meta->n_endpoints < MAX_PATHS ? x->meta->n_endpoints : MAX_PATHS;
	tx->batch = x->meta->version >= 2;
	tx->max_pieces =
	    x->n_segs && x->n_segs < SC_PEER_MAX_PIECES ? x->n_segs : SC_PEER_MAX_PIECES;
	pthread_mutex_init(&tx->cursor_mu, NULL);
	pthread_cond_init(&tx->work_cv, NULL);
	pthread_cond_init(&tx->helpers_cv, NULL);
	sc_list_init(&tx->given);
	atomic_init(&tx->bytes_moved, 0);
	atomic_init(&tx->quit, false);
	for (int i = 0; i < MAX_STREAMS; i++)
		tx->tasks[i] = (struct task){.t = {.run = run_task}, .tx = tx, .slot = i};
	x->priv = tx;
	if (tx->n_paths == 0) {
		x->priv = NULL;
		free_tx(tx);
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "the metadata from sidecar %s names no data endpoint (its tcp "
				  "backend is off)",
				  x->meta->issuer);
	}
	tx->xr.x = x;
	tx->here = may_run_here(tx);
	if ((tx->here ? sc_xr_admit_here : sc_xr_admit)(&tb->xr, &tx->xr, x, &tx->tasks[0].t,
							err) != 0) {
		if (tx->here)
			atomic_fetch_sub(&tb->here_running, 1);
		x->priv = NULL;
		free_tx(tx);
		return -1;
	}
	return 0;
}

/* Cut a transfer's I/O. force: also a transfer that commits (cut by a cancel or when the backend
 * stops). Under tb->mu. */
static void stop_xfer_locked(struct tcp_xfer *tx, bool force)
{
	sc_xr_stop_locked(&tx->xr);
	atomic_store(&tx->quit, true);
	if (tx->committing && !force)
		return;
	for (int i = 0; i < MAX_STREAMS; i++)
		if (tx->conns[i])
			sc_peer_conn_abort(tx->conns[i]);
}

static void stop_for_shutdown(struct sc_xr_xfer *t)
{
	stop_xfer_locked(container_of(t, struct tcp_xfer, xr), true);
}

static void tcp_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	struct tcp_backend *tb = to_tcp(b);
	atomic_store(&x->cancel_requested, true);
	pthread_mutex_lock(&tb->mu);
	struct sc_list *pos;
	/* A cancel cuts even a committed transfer, so the worker's memory is quiet when
	 * CancelOperation answers; the deadline's stop lets a committed one take its replies until
	 * sc_peer_verdict_ok_deadline, as the passive side was told it succeeded. */
	bool force = !sc_xr_deadline_passed(x, sc_clock_mono_ms());
	sc_list_foreach(pos, &tb->xr.live) {
		struct tcp_xfer *tx = sc_list_entry(pos, struct tcp_xfer, xr.node);
		if (tx->xr.x == x)
			stop_xfer_locked(tx, force);
	}
	pthread_mutex_unlock(&tb->mu);
}

static int tcp_start(struct sc_backend *b, struct sc_err *err)
{
	struct tcp_backend *tb = to_tcp(b);
	if (!tb->pool)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "no peer connection pool");
	size_t want = 2 * (size_t)tb->streams;
	return sc_xr_start(&tb->xr, want < 2 ? 2 : want, err); /* stop() joins those that started */
}

static void tcp_stop(struct sc_backend *b)
{
	struct tcp_backend *tb = to_tcp(b);
	sc_xr_begin_stop(&tb->xr, stop_for_shutdown);
	sc_xr_stop_workers(&tb->xr);
}

static void tcp_destroy(struct sc_backend *b)
{
	struct tcp_backend *tb = to_tcp(b);
	if (tb->xr.n_workers)
		tcp_stop(b);
	sc_xr_destroy(&tb->xr);
	pthread_mutex_destroy(&tb->mu);
	free(tb);
}

/* ConnectPeer: the connections a transfer to md's issuer would open (--tcp-streams, at least one
 * per path, spread over the paths as lead() spreads its streams), put back into the pool for the
 * first transfer to find (the pool keeps them while idle). A path that does not answer is left
 * out (its dial bounded by PATH_DIAL_MS while there are others). gRPC worker thread. */
static int tcp_connect(struct sc_backend *b, const struct sc_metadata *md, uint64_t deadline_mono_ms,
		       char *detail, size_t cap, struct sc_err *err)
{
	struct tcp_backend *tb = container_of(b, struct tcp_backend, base);
	if (md->n_endpoints == 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "the metadata from sidecar %s names no data endpoint", md->issuer);
	size_t n_paths = md->n_endpoints < MAX_PATHS ? md->n_endpoints : MAX_PATHS;
	uint64_t dial_deadline = deadline_mono_ms;
	if (n_paths > 1) {
		uint64_t bound = sc_clock_mono_ms() + PATH_DIAL_MS;
		if (!dial_deadline || bound < dial_deadline)
			dial_deadline = bound;
	}
	struct sc_peer_conn *conns[64];
	size_t want = tb->streams > n_paths ? tb->streams : n_paths;
	want = want < 64 ? want : 64;
	size_t got = 0, reused = 0, ok[MAX_PATHS], n_ok = 0;
	char eps[MAX_PATHS * 82] = "";
	/* One connection per path first: the issuer's identity is checked on each. */
	for (size_t i = 0; i < n_paths; i++) {
		struct sc_peer_conn *c;
		if (sc_peer_pool_get(tb->pool, md->endpoints[i], dial_deadline, &c, err) != 0) {
			if (err->code == SC_DEADLINE_EXCEEDED && deadline_mono_ms &&
			    sc_clock_mono_ms() >= deadline_mono_ms)
				break;
			continue;
		}
		if (sc_peer_conn_check_issuer(c, md->issuer, err) != 0) {
			sc_peer_pool_put(tb->pool, c, false);
			for (size_t k = 0; k < got; k++)
				sc_peer_pool_put(tb->pool, conns[k], sc_peer_conn_usable(conns[k]));
			return -1;
		}
		if (strcmp(sc_peer_conn_peer_id(c), md->issuer) != 0) {
			sc_err_set(err, SC_UNAVAILABLE,
				   "data endpoint %s is sidecar \"%s\", but the metadata was issued by "
				   "\"%s\"",
				   md->endpoints[i], sc_peer_conn_peer_id(c), md->issuer);
			sc_peer_pool_put(tb->pool, c, true);
			continue;
		}
		size_t used = strlen(eps);
		snprintf(eps + used, sizeof(eps) - used, "%s%s", n_ok ? ", " : "", md->endpoints[i]);
		ok[n_ok++] = i;
		reused += sc_peer_conn_reused(c);
		conns[got++] = c;
	}
	if (n_ok == 0)
		return -1;
	/* The rest, round robin over the paths that answered. */
	while (got < want) {
		if (sc_peer_pool_get(tb->pool, md->endpoints[ok[got % n_ok]], deadline_mono_ms,
				     &conns[got], err) != 0)
			break;
		reused += sc_peer_conn_reused(conns[got]);
		got++;
	}
	for (size_t i = 0; i < got; i++)
		sc_peer_pool_put(tb->pool, conns[i], sc_peer_conn_usable(conns[i]));
	snprintf(detail, cap, "%zu connection(s) to %s at %s (%zu were open already)", got,
		 md->issuer, eps, reused);
	return 0;
}

static const struct sc_backend_ops tcp_ops = {
	.kind = SC_BACKEND_TCP, /* name and level: engine/backend_registry.c */
	.start = tcp_start,
	.stop = tcp_stop,
	.destroy = tcp_destroy,
	.register_region = sc_backend_register_unsupported, /* no registration needed: succeeds */
	.deregister_region = sc_backend_deregister_noop,
	.expose = sc_backend_expose_noop, /* the token is the grant; backend/passive.h checks it */
	.revoke = sc_backend_revoke_noop,
	.submit = tcp_submit,
	.cancel = tcp_cancel,
	.connect = tcp_connect,
};

struct sc_backend *sc_backend_tcp_create(const struct sc_backend_env *env)
{
	const struct sc_config *cfg = env->cfg;
	struct tcp_backend *tb = calloc(1, sizeof(*tb));
	if (!tb)
		return NULL;
	tb->base.ops = &tcp_ops;
	tb->base.env = *env;
	pthread_mutex_init(&tb->mu, NULL);
	sc_xr_init(&tb->xr, "tcp", &tb->mu);
	tb->streams = cfg->tcp_streams ? cfg->tcp_streams : 1;
	if (tb->streams > MAX_STREAMS)
		tb->streams = MAX_STREAMS;
	tb->chunk = cfg->tcp_chunk_bytes ? cfg->tcp_chunk_bytes : DEFAULT_CHUNK;
	if (tb->chunk > SC_PEER_MAX_BULK)
		tb->chunk = SC_PEER_MAX_BULK;
	tb->pool = env->pool;
	struct sc_peer_server *srv = env->server;
	if (!tb->pool || !srv) {
		tb->base.available = false;
		snprintf(tb->base.detail, sizeof(tb->base.detail),
			 "no data listener (--backends excludes tcp and ibverbs)");
		return &tb->base;
	}
	snprintf(tb->base.endpoint, sizeof(tb->base.endpoint), "%s", sc_peer_server_endpoint(srv));
	/* One rail per data endpoint (a path peers dial; this side's path i is rail i). */
	size_t n = sc_peer_server_n_endpoints(srv);
	for (size_t i = 0; i < n && i < SC_MAX_RAILS; i++) {
		sc_tcp_rail_facts(&tb->base.rails[i], sc_peer_server_endpoint_at(srv, i));
		tb->base.rails[i].state = SC_RAIL_UP;
		tb->base.n_rails = i + 1;
	}
	tb->base.available = true;
	snprintf(tb->base.detail, sizeof(tb->base.detail),
		 "tcp data plane on %s%s (%zu path(s), %u stream(s), %" PRIu64 " KiB chunks)",
		 tb->base.endpoint, n > 1 ? " and more" : "", n, tb->streams, tb->chunk >> 10);
	return &tb->base;
}
