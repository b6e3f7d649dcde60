/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/xfer_runner.h: the transfer bookkeeping the network backends (tcp, ibverbs) share, so
 * that a backend only says how a batch of pieces goes on its wire. Data flows one way: the engine
 * submits a struct sc_xfer, the backend admits it to its runner and queues a task; worker threads
 * run the backend's tasks; the backend cuts the transfer into batches with the runner's cursor and
 * moves them; the first failure, a cancel or the deadline stop it; the runner turns that into one
 * verdict and calls on_complete exactly once.
 *
 *   struct sc_xr        worker threads, a task queue, the transfers in flight (for cancel, stop
 *                       and "wait until idle")
 *   struct sc_xr_xfer   embedded in the backend's transfer: the stop flag, the first failure
 *   struct sc_xr_cursor where the next piece starts; sc_xr_cursor_take cuts a batch of pieces
 *
 * Locking: a runner has no lock of its own. It is guarded by the backend's mutex, handed to
 * sc_xr_init, so the backend's state and the runner's change together; calls named *_locked run
 * with that mutex held, the others take it. Tasks run without it. A backend's on_progress and
 * on_complete are never called with it held.
 */
#ifndef SC_XFER_RUNNER_H
#define SC_XFER_RUNNER_H

#include "backend/backend.h"
#include "base/list.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SC_XR_MAX_WORKERS 32

/*
 * A caller's offer to run a small transfer's first task on its own thread (a continuation, see
 * engine/engine.h, struct sc_active_req.here): zeroed on the caller's stack, handed down with the
 * request as sc_xfer.here while the transfer is submitted, and run by sc_xr_here_run once the
 * caller has answered. A backend parks at most one task in it (sc_xr_admit_here).
 */
struct sc_xr_here {
	struct sc_xr_task *task; /* parked, to run in sc_xr_here_run; NULL: none */
};
/* Runs the task parked in h, if any (blocking for the transfer), and empties h. */
void sc_xr_here_run(struct sc_xr_here *h);

/* One unit of work for a worker thread (the backend embeds it in its transfer). */
struct sc_xr_task {
	struct sc_list node; /* on the runner's queue */
	void (*run)(struct sc_xr_task *t);
};

/* A transfer in flight, as the runner sees it. */
struct sc_xr_xfer {
	struct sc_xfer *x;
	struct sc_list node; /* on the runner's live list */
	/* Post or send nothing more: set by a failure, a cancel or a stop. Read without the lock
	 * by a backend's I/O loops; written under it. */
	atomic_bool stop;
	uint64_t stop_mono_ms; /* when stop was first set */
	/* The first failure (under the lock). */
	bool failed;
	enum sc_status status;
	char msg[SC_ERR_MSG_MAX];
};

struct sc_xr {
	const char *name;    /* "tcp", "ibverbs": in messages */
	pthread_mutex_t *mu; /* the backend's */
	pthread_cond_t cv;   /* a task queued, or stopping: the workers wait on it */
	/* The last transfer in flight retired (n_live reached 0): sc_xr_wait_idle_locked waits on
	 * it. Not cv: a retire must not wake every idle worker (one futex storm per transfer). */
	pthread_cond_t idle_cv;
	struct sc_list queue; /* struct sc_xr_task, first in first out */
	struct sc_list live;  /* struct sc_xr_xfer, newest first */
	size_t n_live;
	bool started;  /* accepting transfers */
	bool stopping; /* refusing new transfers; the live ones are being cancelled */
	bool workers_exit;
	pthread_t workers[SC_XR_MAX_WORKERS];
	size_t n_workers;
};

/* mu: the backend's mutex, which guards the runner from now on. */
void sc_xr_init(struct sc_xr *r, const char *name, pthread_mutex_t *mu);
/* Joins the workers if stop did not. */
void sc_xr_destroy(struct sc_xr *r);
/* Starts n worker threads (at most SC_XR_MAX_WORKERS) and accepts transfers. On failure the
 * threads that started keep running until sc_xr_stop_workers. */
int sc_xr_start(struct sc_xr *r, size_t n, struct sc_err *err);
/* Refuses new transfers from now on and flags every live one cancelled and stopped; stop(t), if
 * given, is then called for each (under the lock) to cut its I/O. */
void sc_xr_begin_stop(struct sc_xr *r, void (*stop)(struct sc_xr_xfer *t));
/* Waits until no transfer is live or until_mono_ms passes. True when none is left. */
bool sc_xr_wait_idle_locked(struct sc_xr *r, uint64_t until_mono_ms);
/* Workers run what is queued, then exit; joins them. Without the lock. */
void sc_xr_stop_workers(struct sc_xr *r);

/* Makes t live for x and queues first (the task that starts it). UNAVAILABLE when the runner is
 * not started or stopping ("<name> backend is shutting down"). */
/* Whether x's first task could be parked now (sc_xr_admit_here): it came with an offer
 * (x->here) that holds no task yet. */
bool sc_xr_here_possible(const struct sc_xfer *x);
/* As sc_xr_admit, but the first task is parked in x's offer (x->here, to run when its caller
 * calls sc_xr_here_run) instead of queued for a worker; queued when there is no offer or it
 * already holds one. */
int sc_xr_admit_here(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x,
		     struct sc_xr_task *first, struct sc_err *err);
int sc_xr_admit(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x, struct sc_xr_task *first,
		struct sc_err *err);
/* t is no longer live (before its on_complete). Under the lock. */
void sc_xr_retire_locked(struct sc_xr *r, struct sc_xr_xfer *t);
void sc_xr_queue_locked(struct sc_xr *r, struct sc_xr_task *task);
/* Takes back the queued tasks for which match(task, arg) holds (no worker has started them);
 * returns how many. Under the lock. */
size_t sc_xr_unqueue_locked(struct sc_xr *r, bool (*match)(const struct sc_xr_task *t, void *arg),
			    void *arg);

/* ---- one transfer ------------------------------------------------------------------------- */

/* Stop flag, or cancel asked for: move nothing more. Any thread, no lock. */
static inline bool sc_xr_should_stop(const struct sc_xr_xfer *t)
{
	return atomic_load_explicit(&t->stop, memory_order_relaxed) ||
	       atomic_load_explicit(&t->x->cancel_requested, memory_order_relaxed);
}
static inline bool sc_xr_deadline_passed(const struct sc_xfer *x, uint64_t now_mono_ms)
{
	return x->deadline_mono_ms && now_mono_ms >= x->deadline_mono_ms;
}
/* Sets the stop flag (first time: stop_mono_ms). Under the lock. */
void sc_xr_stop_locked(struct sc_xr_xfer *t);
/* Records the transfer's first failure and stops it. A transfer already stopping (a cancel, an
 * earlier failure) keeps its first reason, unless even_if_stopping (TCP after its DONE went out:
 * the peer judges the bytes, a cancel can no longer cut them). Under the lock. */
void sc_xr_fail_locked(struct sc_xr_xfer *t, bool even_if_stopping, enum sc_status code,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Clears the stop flag and failure to start the transfer over. Under the lock. */
void sc_xr_reset_locked(struct sc_xr_xfer *t);

/*
 * The transfer's verdict: SC_OK when nothing failed and all of x->total moved; else the deadline
 * (a cancel from the engine's timer after it passed), a cancel, the first failure, or INTERNAL.
 * cancel_wins: a cancel decides even when every byte moved (the engine has already ended the
 * operation CANCELLED); without it, bytes the peer was told are complete stay complete.
 * msg receives the message ("" for SC_OK).
 */
enum sc_status sc_xr_verdict(struct sc_xr *r, struct sc_xr_xfer *t, uint64_t moved,
			     bool cancel_wins, char *msg, size_t cap);
/* on_complete, exactly once, after the backend has told the passive side and let go of the
 * transfer (retired, its memory freed: t may be gone, x stays). Without the lock. */
static inline void sc_xr_complete(struct sc_xfer *x, enum sc_status status, const char *msg)
{
	x->priv = NULL;
	x->on_complete(x, status, status == SC_OK ? NULL : msg);
}

/* ---- cutting a transfer into pieces -------------------------------------------------------- */

struct sc_xr_cursor {
	size_t seg;   /* the segment the next piece starts in */
	uint64_t off; /* and where in it */
};

struct sc_xr_piece {
	const struct sc_xfer_seg *seg;
	uint64_t off; /* within the segment, which is also the offset in its remote descriptor */
	uint64_t len;
};

/* Whether segment next may join a batch whose previous piece is in prev and whose first piece
 * is in first (same local memory kind; ibverbs: the remote range goes on). */
typedef bool (*sc_xr_joins_fn)(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
			       const struct sc_xfer_seg *next);

/* True when a piece is left (steps over used-up and empty segments). */
bool sc_xr_cursor_more(struct sc_xr_cursor *c, const struct sc_xfer *x);
/* True when no piece is left; moves nothing. */
bool sc_xr_cursor_done(const struct sc_xr_cursor *c, const struct sc_xfer *x);
/*
 * The next batch: up to max_pieces pieces and max_bytes bytes, in list order. A piece is the rest
 * of its segment, or what the byte limit leaves; the batch goes on into the next segment only when
 * a piece used its segment up and joins (NULL: any) accepts it. Returns the number of pieces in
 * out (0: none left). The caller serialises calls on one cursor.
 */
size_t sc_xr_cursor_take(struct sc_xr_cursor *c, const struct sc_xfer *x, uint64_t max_bytes,
			 size_t max_pieces, sc_xr_joins_fn joins, struct sc_xr_piece *out);
/* Moves the cursor to byte `done` of the transfer (a restart, or a move to a fresh QP). */
void sc_xr_cursor_seek(struct sc_xr_cursor *c, const struct sc_xfer *x, uint64_t done);

#endif
