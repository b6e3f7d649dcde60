/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/tcp.c: the TCP data plane's active side: the backend's ops, and the lead of each transfer.
 * A transfer (struct sc_xfer) is cut into chunks (tcp/cursor.c); up to --tcp-streams streams move
 * them in parallel (tcp/stream.c) over the issuer's paths (tcp/route.c). The first error, the
 * cancel flag or the deadline stops every stream (connections blocked in I/O are aborted); then
 * one DONE tells the passive side the verdict, and on_complete runs exactly once. The bookkeeping
 * is the shared transfer runner's (backend/xfer_runner.h).
 *
 * Threads: submit() and cancel() run on engine threads (with the engine lock held: they only
 * queue and flag); the runner's 2 x --tcp-streams worker threads (at least 2), started by start()
 * and joined by stop(), run the transfers. The worker that picks a transfer up leads it (lead()).
 * A small one-request transfer with an idle pooled connection, begun with the caller's offer to
 * run it (sc_xfer.here: the gRPC handler's, a fast-path session's), runs on that caller's thread
 * once it has answered (at most RUN_HERE_MAX at once). Owns the runner, the paths' health, and
 * one struct tcp_xfer per transfer in flight; the connections belong to the peer pool.
 */
#include "tcp/internal.h"

#include "base/log.h"
#include "base/timer.h"
#include "base/trace.h"
#include "peer/request.h"
#include "peer/server.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CHUNK (8ull << 20)
/* A transfer runs on the thread that began it (backend/xfer_runner.h, sc_xfer.here) when it is at most
 * this big, fits one request, is host memory only, no other transfer of this backend is in flight
 * (under load the workers overlap transfers better than gRPC threads blocked in them) and an idle
 * pooled connection to its first path is there; at most RUN_HERE_MAX such transfers at once (they
 * hold gRPC threads). */
#define RUN_HERE_MAX_BYTES (256u << 10)
#define RUN_HERE_MAX 2

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
		sc_peer_tell_verdict(tb->pool, &c, tcp_path_endpoint(tx, tcp_verdict_path(tx)), x->meta->token,
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

/* Lead a transfer (a runner worker, or the thread that began it): connect, open, queue helper
 * streams for the other workers when there is more than one chunk, move chunks itself, reclaim
 * helpers that never started, wait for the running ones, send DONE and complete. */
static void lead(struct tcp_xfer *tx)
{
	struct tcp_backend *tb = tx->tb;
	struct sc_err err;
	sc_err_clear(&err);
	uint64_t chunks = tcp_count_chunks(tx, tb->chunk);
	uint32_t streams = tcp_stream_count(tx, chunks);
	tcp_plan_paths(tx, streams);
	size_t path = (size_t)tx->start_path[0];
	int open_pending = 0;
	bool done_early = streams == 1 && done_can_go_early(tx->xr.x);
	bool pipelined = streams == 1, opened = false, helpers_queued = false;
	unsigned stale = 0;
	struct sc_peer_conn *c = NULL;
	sc_trace_mark(tx->xr.x->xfer_id, "runner_picked_up");
	for (;;) {
		sc_err_clear(&err);
		c = tcp_open_stream(tx, 0, path, pipelined, &open_pending, &err);
		if (c)
			sc_trace_mark(tx->xr.x->xfer_id, "tcp_connection_ready");
		if (!c) {
			if (err.code != SC_OK && tcp_is_path_failure(tx, NULL, &err) &&
			    tcp_fail_over(tx, &path, &err)) {
				pipelined = false;
				continue;
			}
			if (err.code != SC_OK && !tcp_is_path_failure(tx, NULL, &err))
				tcp_fail_xfer(tx, &err);
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
		enum moved m = tcp_move_chunks(tx, 0, c, &open_pending, done_early, tcp_rail_of(tb, path),
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
		if (!tcp_fail_over(tx, &path, &why))
			break;
	}
	if (helpers_queued) {
		pthread_mutex_lock(&tb->mu);
		reclaim_helpers_locked(tb, tx);
		while (tx->helpers)
			pthread_cond_wait(&tx->helpers_cv, &tb->mu);
		pthread_mutex_unlock(&tb->mu);
	}
	tcp_fail_no_path(tx); /* chunks left and no failure recorded: every path failed */
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
		if (dead && !tcp_next_live_path(tx, &path))
			break;
		int opened = 0;
		struct sc_peer_conn *c = tcp_open_stream(tx, slot, path, false, &opened, &err);
		if (!c) {
			if (err.code != SC_OK && tcp_is_path_failure(tx, NULL, &err) &&
			    tcp_fail_over(tx, &path, &err))
				continue;
			if (err.code != SC_OK)
				SC_DEBUG("tcp", "transfer %016" PRIx64 ": stream %d not started: %s",
					 tx->xr.x->xfer_id, slot, err.msg);
			break;
		}
		enum moved m = tcp_move_chunks(tx, slot, c, &opened, false, tcp_rail_of(tb, path), &why);
		sc_peer_pool_put(tb->pool, c, sc_peer_conn_usable(c));
		if (m == MOVED_DONE)
			break;
		if (m == MOVED_STALE && stale++ == 0)
			continue;
		if (!tcp_fail_over(tx, &path, &why))
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
	struct sc_xfer_log_scope scope;
	sc_xfer_log_scope_enter(&scope, task->tx->xr.x, "tcp");
	if (task->slot != 0) {
		help(task->tx, task->slot);
		sc_xfer_log_scope_leave(&scope);
		return;
	}
	struct tcp_backend *tb = task->tx->tb;
	bool here = task->tx->here;
	lead(task->tx); /* frees tx */
	if (here)
		atomic_fetch_sub(&tb->here_running, 1);
	sc_xfer_log_scope_leave(&scope);
}

/* Whether a transfer may run on the thread that began it (see RUN_HERE_MAX_BYTES): one request
 * on a warm connection, so the hand-off to a worker would cost more than the transfer. Counts it
 * in tb->here_running when it may. */
static bool may_run_here(struct tcp_xfer *tx)
{
	struct tcp_backend *tb = tx->tb;
	const struct sc_xfer *x = tx->xr.x;
	if (!sc_xr_here_possible(x) || x->total > RUN_HERE_MAX_BYTES || x->total > tb->chunk ||
	    tcp_count_chunks(tx, tb->chunk) != 1)
		return false;
	for (size_t i = 0; i < x->n_segs; i++)
		if (x->segs[i].local_gpu != SC_GPU_HOST)
			return false;
	uint64_t cooling;
	pthread_mutex_lock(&tb->mu);
	bool usable = tb->xr.n_live == 0 && sc_tcp_health_usable(&tb->health, tcp_path_endpoint(tx, 0),
								 sc_clock_mono_ms(), &cooling);
	pthread_mutex_unlock(&tb->mu);
	if (!usable || !sc_peer_pool_has_idle(tb->pool, tcp_path_endpoint(tx, 0)))
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

/* Every data endpoint of the peer server (the transfer stripes over all that answer: its paths),
 * else the backend's own; a peer may use tcp on the token alone. */
static void tcp_advertise(struct sc_backend *b, struct sc_metadata *md)
{
	struct sc_peer_server *srv = b->env.server;
	size_t n = srv ? sc_peer_server_n_endpoints(srv) : 0;
	for (size_t i = 0; i < n && i < SC_MAX_ENDPOINTS; i++)
		snprintf(md->endpoints[i], sizeof(md->endpoints[i]), "%s",
			 sc_peer_server_endpoint_at(srv, i));
	md->n_endpoints = n < SC_MAX_ENDPOINTS ? n : SC_MAX_ENDPOINTS;
	if (md->n_endpoints == 0) {
		snprintf(md->endpoints[0], sizeof(md->endpoints[0]), "%s", b->endpoint);
		md->n_endpoints = 1;
	}
	md->backends |= SC_BACKEND_BIT_TCP;
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
	.advertise = tcp_advertise,
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
