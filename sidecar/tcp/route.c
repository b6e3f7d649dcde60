/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/route.c: the paths of one transfer, and its failure. Every data endpoint of the metadata is
 * a path (the issuer serves each on its own interface); path i counts its bytes on this backend's
 * rail i (modulo the rails it has: one per --data-listen endpoint). The streams are spread over
 * the paths that are not cooling down, at least one per path when there are enough chunks; a
 * one-chunk transfer stays on the first path. A stream whose path fails (dial refused or timed
 * out, connection reset, I/O error, or no progress until the socket's TCP_USER_TIMEOUT /
 * keepalive gives up) marks the path dead for this transfer, cools it down (tcp/paths.h: 2 s
 * doubling to 60 s; its rail COOLING with the reason) and moves on to the next live path. The
 * transfer fails only when no path is left (the error names each path and why) or its deadline
 * passes.
 *
 * Threads: the transfer's streams; the paths' state under tb->mu. Owns nothing.
 */
#include "tcp/internal.h"

#include "base/log.h"
#include "base/timer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Record the transfer's first failure and stop every stream. A stream that fails because it was
 * stopped records nothing new (the first failure, or the cancel, is the cause), unless the
 * transfer commits (its DONE went out: the failure is the peer's verdict). */
void tcp_fail_xfer(struct tcp_xfer *tx, const struct sc_err *err)
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

size_t tcp_rail_of(const struct tcp_backend *tb, size_t path)
{
	return tb->base.n_rails ? path % tb->base.n_rails : 0;
}

const char *tcp_path_endpoint(const struct tcp_xfer *tx, size_t path)
{
	return tx->xr.x->meta->endpoints[path];
}

/* Paths of this transfer not failed yet. Under tb->mu. */
size_t tcp_live_paths_locked(const struct tcp_xfer *tx)
{
	size_t n = 0;
	for (size_t i = 0; i < tx->n_paths; i++)
		n += !tx->path_dead[i];
	return n;
}

/* The next live path after `path` in the transfer's order; false when none is left. */
bool tcp_next_live_path(struct tcp_xfer *tx, size_t *path)
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
	const char *ep = tcp_path_endpoint(tx, path);
	size_t rail = tcp_rail_of(tb, path);
	pthread_mutex_lock(&tb->mu);
	if (tx->path_dead[path]) {
		pthread_mutex_unlock(&tb->mu);
		return;
	}
	tx->path_dead[path] = true;
	snprintf(tx->path_why[path], sizeof(tx->path_why[path]), "%s", err->msg);
	size_t left = tcp_live_paths_locked(tx);
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
	const struct sc_xfer *x = tx->xr.x;
	SC_WARN_KV("tcp",
		   (&(struct sc_log_fields){.op = x->op_id, .peer = x->meta ? x->meta->issuer : NULL,
					    .backend = "tcp",
					    .rail = rail < tb->base.n_rails ? tb->base.rails[rail].name : ep,
					    .code = sc_status_name(err->code),
					    .trace_id = x->trace_id}),
		   "transfer %016" PRIx64 ": path to %s (rail %zu %s) failed: %s; %s, the path "
		   "cools down %u ms", x->xfer_id, ep, rail,
		   rail < tb->base.n_rails ? tb->base.rails[rail].name : "", err->msg,
		   left ? "its chunks move to the other paths" : "no path is left", cool);
}

/* A stream opened on path: a path that was cooling is healthy again (its probe worked). */
void tcp_path_works(struct tcp_xfer *tx, size_t path)
{
	struct tcp_backend *tb = tx->tb;
	const char *ep = tcp_path_endpoint(tx, path);
	pthread_mutex_lock(&tb->mu);
	bool recovered = sc_tcp_health_ok(&tb->health, ep, sc_clock_mono_ms());
	pthread_mutex_unlock(&tb->mu);
	if (!recovered)
		return;
	size_t rail = tcp_rail_of(tb, path);
	sc_rail_set_state(&tb->base, rail, SC_RAIL_UP, "path to %s is back (probed)", ep);
	SC_INFO_KV("tcp",
		   (&(struct sc_log_fields){.backend = "tcp",
					    .rail = rail < tb->base.n_rails ? tb->base.rails[rail].name : ep}),
		   "path to %s (rail %zu) works again after its cool-down", ep, rail);
}

/* Why a failure is the path's (move its chunks to another) rather than the transfer's: the
 * transfer has another path, the connection broke or could not be made, and nothing else stops
 * the transfer (a cancel, the deadline, another failure, a DONE already sent). A peer's refusal
 * leaves its connection usable and is its verdict. */
bool tcp_is_path_failure(struct tcp_xfer *tx, struct sc_peer_conn *c, const struct sc_err *err)
{
	if (tx->n_paths < 2) /* nowhere to move: the failure is the transfer's, as ever */
		return false;
	if (err->code != SC_UNAVAILABLE && err->code != SC_DEADLINE_EXCEEDED)
		return false;
	if (tcp_should_stop(tx) || sc_xr_deadline_passed(tx->xr.x, sc_clock_mono_ms()))
		return false;
	if (c && sc_peer_conn_usable(c))
		return false;
	pthread_mutex_lock(&tx->tb->mu);
	bool committing = tx->committing;
	pthread_mutex_unlock(&tx->tb->mu);
	return !committing;
}

/* The first path not failed (the verdict goes there when the leader's connection is gone). */
size_t tcp_verdict_path(struct tcp_xfer *tx)
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

/* The paths in the order streams take them (usable first, cooling ones as a last resort) and
 * where each stream starts: streams spread over the usable paths. */
void tcp_plan_paths(struct tcp_xfer *tx, uint32_t streams)
{
	struct tcp_backend *tb = tx->tb;
	uint64_t now = sc_clock_mono_ms(), cooling;
	size_t cool[MAX_PATHS], n_cool = 0;
	tx->n_order = 0;
	pthread_mutex_lock(&tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++) {
		if (sc_tcp_health_usable(&tb->health, tcp_path_endpoint(tx, i), now, &cooling))
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
uint32_t tcp_stream_count(struct tcp_xfer *tx, uint64_t chunks)
{
	struct tcp_backend *tb = tx->tb;
	uint64_t now = sc_clock_mono_ms(), cooling;
	uint32_t usable = 0;
	pthread_mutex_lock(&tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++)
		usable += sc_tcp_health_usable(&tb->health, tcp_path_endpoint(tx, i), now, &cooling);
	pthread_mutex_unlock(&tb->mu);
	uint32_t want = tb->streams > usable ? tb->streams : usable;
	if (want > MAX_STREAMS)
		want = MAX_STREAMS;
	return chunks < want ? (uint32_t)(chunks ? chunks : 1) : want;
}

/* No path was left with chunks still to move: the transfer fails, naming each path and why. */
void tcp_fail_no_path(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	bool left = !tcp_all_done_locked(tx);
	pthread_mutex_unlock(&tx->cursor_mu);
	if (!left || tcp_should_stop(tx))
		return;
	struct sc_err err;
	sc_err_set(&err, SC_UNAVAILABLE, "no path to sidecar %s is left (%" PRIu64 " of %" PRIu64
		   " bytes moved):", tx->xr.x->meta->issuer, (uint64_t)atomic_load(&tx->bytes_moved),
		   tx->xr.x->total);
	pthread_mutex_lock(&tx->tb->mu);
	for (size_t i = 0; i < tx->n_paths; i++) {
		size_t used = strlen(err.msg);
		snprintf(err.msg + used, sizeof(err.msg) - used, "%s %s: %s", i ? ";" : "",
			 tcp_path_endpoint(tx, i), tx->path_dead[i] ? tx->path_why[i] : "not tried");
	}
	pthread_mutex_unlock(&tx->tb->mu);
	tcp_fail_xfer(tx, &err);
}

/* The path a stream failed on is dead for the transfer; which one it goes on with. False: none
 * is left. */
bool tcp_fail_over(struct tcp_xfer *tx, size_t *path, const struct sc_err *why)
{
	path_failed(tx, *path, why);
	return !tcp_should_stop(tx) && tcp_next_live_path(tx, path);
}
