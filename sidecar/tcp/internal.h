/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/internal.h: the tcp backend's private structs (the backend, a transfer in flight, its
 * streams' tasks and pieces), the constants more than one of its files uses, and the prototypes
 * its files share (prefix tcp_). The files, highest first (each calls only those below it):
 * tcp.c (the ops, leading a transfer) > stream.c (one stream) > route.c (the paths of a transfer,
 * its failure) > cursor.c (its chunks); paths.c (rail facts, path health) is under them all.
 *
 * Locking: tb->mu guards the runner (its queue and list of transfers in flight) and each
 * transfer's stream table and verdict. It is never held while calling the engine (on_progress,
 * on_complete, the pool's keyring look-up) or doing I/O, so the engine lock (held around submit and
 * cancel) always comes first.
 */
#ifndef SC_TCP_INTERNAL_H
#define SC_TCP_INTERNAL_H

#include "backend/backend.h"
#include "backend/xfer_runner.h"
#include "base/list.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "tcp/paths.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MAX_STREAMS 16
#define MAX_PATHS SC_MAX_ENDPOINTS
/* A dial on one of several live paths gives up after this long (on the last one left: at the
 * transfer's deadline, so a restarting peer is waited for as before). */
#define PATH_DIAL_MS 3000

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
	/* DONE {OK} went out behind the last data request (see commit_done, tcp/stream.c): a
	 * failure from here on is recorded even when a stop was asked for. A cancel still cuts the
	 * stream (the worker's memory must be quiet when CancelOperation answers); the deadline's
	 * own stop does not. */
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

/* What became of a stream's run on one connection. */
enum moved {
	MOVED_DONE,	   /* no chunk left, or the transfer stopped (its failure recorded) */
	MOVED_PATH_FAILED, /* the path failed: its chunks were given back (*why says how) */
	MOVED_STALE, /* the peer closed the connection, or a pooled one was dead before anything
		      * moved: chunks given back, the path worth another try */
};

/* tcp/cursor.c: the shared chunk cursor of a transfer. */
bool tcp_should_stop(struct tcp_xfer *tx);
bool tcp_next_piece(struct tcp_xfer *tx, struct piece *p, bool wait);
bool tcp_all_done_locked(struct tcp_xfer *tx);
void tcp_piece_done(struct tcp_xfer *tx);
bool tcp_give_back(struct tcp_xfer *tx, const struct piece *p, bool requeue);
bool tcp_pieces_left(struct tcp_xfer *tx);
uint64_t tcp_count_chunks(const struct tcp_xfer *tx, uint64_t chunk);

/* tcp/route.c: the paths of a transfer, and its failure. */
size_t tcp_rail_of(const struct tcp_backend *tb, size_t path);
const char *tcp_path_endpoint(const struct tcp_xfer *tx, size_t path);
size_t tcp_live_paths_locked(const struct tcp_xfer *tx);
bool tcp_next_live_path(struct tcp_xfer *tx, size_t *path);
void tcp_path_works(struct tcp_xfer *tx, size_t path);
bool tcp_is_path_failure(struct tcp_xfer *tx, struct sc_peer_conn *c, const struct sc_err *err);
void tcp_fail_xfer(struct tcp_xfer *tx, const struct sc_err *err);
size_t tcp_verdict_path(struct tcp_xfer *tx);
void tcp_plan_paths(struct tcp_xfer *tx, uint32_t streams);
uint32_t tcp_stream_count(struct tcp_xfer *tx, uint64_t chunks);
void tcp_fail_no_path(struct tcp_xfer *tx);
bool tcp_fail_over(struct tcp_xfer *tx, size_t *path, const struct sc_err *why);

/* tcp/stream.c: one stream. */
struct sc_peer_conn *tcp_open_stream(struct tcp_xfer *tx, int slot, size_t path, bool pipelined,
				     int *open_pending, struct sc_err *err);
enum moved tcp_move_chunks(struct tcp_xfer *tx, int slot, struct sc_peer_conn *c,
			   int *open_pending, bool done_early, size_t rail, struct sc_err *why);

#endif
