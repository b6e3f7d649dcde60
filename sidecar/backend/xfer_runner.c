/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/xfer_runner.c: the transfer bookkeeping the tcp and ibverbs backends share
 * (backend/xfer_runner.h): worker threads that run queued tasks, the list of transfers in flight,
 * stop and first-failure bookkeeping, the verdict, and the cursor that cuts a transfer's segments into batches.
 *
 * Threads: sc_xr_start creates the workers; each waits on r->cv under the backend's mutex, takes
 * the first queued task, and runs it without the lock. Everything else runs on the caller's thread
 * (engine threads for admit, worker and completion threads for the rest). A task parked in a
 * caller's offer (sc_xr_admit_here) runs on that caller's thread in sc_xr_here_run, with no
 * hand-off to a worker. Owns: the workers.
 */
#include "backend/xfer_runner.h"

#include "base/timer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void sc_xr_init(struct sc_xr *r, const char *name, pthread_mutex_t *mu)
{
	memset(r, 0, sizeof(*r));
	r->name = name;
	r->mu = mu;
	sc_list_init(&r->queue);
	sc_list_init(&r->live);
	pthread_cond_init(&r->cv, NULL);
	pthread_cond_init(&r->idle_cv, NULL);
}

void sc_xr_destroy(struct sc_xr *r)
{
	if (r->n_workers)
		sc_xr_stop_workers(r);
	pthread_cond_destroy(&r->cv);
	pthread_cond_destroy(&r->idle_cv);
}

static void *worker_main(void *arg)
{
	struct sc_xr *r = arg;
	pthread_mutex_lock(r->mu);
	for (;;) {
		while (sc_list_empty(&r->queue) && !r->workers_exit)
			pthread_cond_wait(&r->cv, r->mu);
		struct sc_list *first = sc_list_first(&r->queue);
		if (!first)
			break; /* told to exit, queue drained */
		sc_list_remove(first);
		struct sc_xr_task *t = sc_list_entry(first, struct sc_xr_task, node);
		pthread_mutex_unlock(r->mu);
		t->run(t);
		pthread_mutex_lock(r->mu);
	}
	pthread_mutex_unlock(r->mu);
	return NULL;
}

int sc_xr_start(struct sc_xr *r, size_t n, struct sc_err *err)
{
	if (n > SC_XR_MAX_WORKERS)
		n = SC_XR_MAX_WORKERS;
	pthread_mutex_lock(r->mu);
	r->workers_exit = false;
	r->stopping = false;
	for (; r->n_workers < n; r->n_workers++) {
		int rc = pthread_create(&r->workers[r->n_workers], NULL, worker_main, r);
		if (rc != 0) {
			pthread_mutex_unlock(r->mu);
			return sc_err_set(err, SC_INTERNAL, "cannot start %s worker threads: %s",
					  r->name, strerror(rc));
		}
	}
	r->started = true;
	pthread_mutex_unlock(r->mu);
	return 0;
}

void sc_xr_begin_stop(struct sc_xr *r, void (*stop)(struct sc_xr_xfer *t))
{
	pthread_mutex_lock(r->mu);
	r->stopping = true;
	struct sc_list *pos;
	sc_list_foreach(pos, &r->live) {
		struct sc_xr_xfer *t = sc_list_entry(pos, struct sc_xr_xfer, node);
		atomic_store(&t->x->cancel_requested, true);
		if (stop)
			stop(t);
	}
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(r->mu);
}

bool sc_xr_wait_idle_locked(struct sc_xr *r, uint64_t until_mono_ms)
{
	while (r->n_live > 0) {
		uint64_t now = sc_clock_mono_ms();
		if (now >= until_mono_ms)
			break;
		sc_cond_wait_ms(&r->idle_cv, r->mu, until_mono_ms - now);
	}
	return r->n_live == 0;
}

void sc_xr_stop_workers(struct sc_xr *r)
{
	pthread_mutex_lock(r->mu);
	r->workers_exit = true;
	pthread_cond_broadcast(&r->cv);
	size_t n = r->n_workers;
	r->n_workers = 0;
	pthread_mutex_unlock(r->mu);
	/* Workers run what is queued (cancelled by now, so quickly), then exit. */
	for (size_t i = 0; i < n; i++)
		pthread_join(r->workers[i], NULL);
	pthread_mutex_lock(r->mu);
	r->started = false;
	pthread_mutex_unlock(r->mu);
}

void sc_xr_here_run(struct sc_xr_here *h)
{
	struct sc_xr_task *t = h ? h->task : NULL;
	if (!t)
		return;
	h->task = NULL;
	t->run(t);
}

bool sc_xr_here_possible(const struct sc_xfer *x)
{
	return x->here && !x->here->task;
}

static int admit(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x, struct sc_xr_task *first,
		 bool park, struct sc_err *err);

int sc_xr_admit_here(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x,
		     struct sc_xr_task *first, struct sc_err *err)
{
	return admit(r, t, x, first, sc_xr_here_possible(x), err);
}

int sc_xr_admit(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x, struct sc_xr_task *first,
		struct sc_err *err)
{
	return admit(r, t, x, first, false, err);
}

/* park: the first task waits in x's offer (it is live, so a cancel or a stop reaches it, and
 * wait-until-idle waits for it) instead of on the queue. */
static int admit(struct sc_xr *r, struct sc_xr_xfer *t, struct sc_xfer *x, struct sc_xr_task *first,
		 bool park, struct sc_err *err)
{
	t->x = x;
	sc_list_init(&t->node);
	atomic_init(&t->stop, false);
	t->stop_mono_ms = 0;
	t->failed = false;
	t->status = SC_OK;
	t->msg[0] = '\0';
	pthread_mutex_lock(r->mu);
	if (!r->started || r->stopping) {
		bool stopping = r->stopping;
		pthread_mutex_unlock(r->mu);
		return sc_err_set(err, SC_UNAVAILABLE, "the %s backend is %s", r->name,
				  stopping ? "shutting down" : "not started");
	}
	sc_list_insert_head(&r->live, &t->node);
	r->n_live++;
	if (park)
		x->here->task = first;
	else
		sc_xr_queue_locked(r, first);
	pthread_mutex_unlock(r->mu);
	return 0;
}

void sc_xr_retire_locked(struct sc_xr *r, struct sc_xr_xfer *t)
{
	sc_list_remove(&t->node);
	if (--r->n_live == 0)
		pthread_cond_broadcast(&r->idle_cv);
}

void sc_xr_queue_locked(struct sc_xr *r, struct sc_xr_task *task)
{
	sc_list_insert_tail(&r->queue, &task->node);
	pthread_cond_signal(&r->cv);
}

size_t sc_xr_unqueue_locked(struct sc_xr *r, bool (*match)(const struct sc_xr_task *t, void *arg),
			    void *arg)
{
	size_t n = 0;
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &r->queue) {
		struct sc_xr_task *t = sc_list_entry(pos, struct sc_xr_task, node);
		if (match(t, arg)) {
			sc_list_remove(&t->node);
			n++;
		}
	}
	return n;
}

/* ---- one transfer ------------------------------------------------------------------------- */

void sc_xr_stop_locked(struct sc_xr_xfer *t)
{
	if (!atomic_load(&t->stop)) {
		t->stop_mono_ms = sc_clock_mono_ms();
		atomic_store(&t->stop, true);
	}
}

void sc_xr_fail_locked(struct sc_xr_xfer *t, bool even_if_stopping, enum sc_status code,
		       const char *fmt, ...)
{
	if (!t->failed && (even_if_stopping || !sc_xr_should_stop(t))) {
		t->failed = true;
		t->status = code == SC_OK ? SC_INTERNAL : code;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(t->msg, sizeof(t->msg), fmt, ap);
		va_end(ap);
	}
	sc_xr_stop_locked(t);
}

void sc_xr_reset_locked(struct sc_xr_xfer *t)
{
	t->failed = false;
	t->status = SC_OK;
	t->msg[0] = '\0';
	t->stop_mono_ms = 0;
	atomic_store(&t->stop, false);
}

enum sc_status sc_xr_verdict(struct sc_xr *r, struct sc_xr_xfer *t, uint64_t moved,
			     bool cancel_wins, char *msg, size_t cap)
{
	const struct sc_xfer *x = t->x;
	pthread_mutex_lock(r->mu);
	bool failed = t->failed;
	enum sc_status status = t->status;
	char why[SC_ERR_MSG_MAX];
	snprintf(why, sizeof(why), "%s", t->msg);
	pthread_mutex_unlock(r->mu);
	bool cancelled = atomic_load(&x->cancel_requested);
	msg[0] = '\0';
	if (!failed && moved == x->total && !(cancel_wins && cancelled))
		return SC_OK;
	if (cancelled && sc_xr_deadline_passed(x, sc_clock_mono_ms())) {
		/* The engine's deadline timer cancels: tell the passive side the real reason. */
		snprintf(msg, cap, "deadline passed after %" PRIu64 " of %" PRIu64 " bytes", moved,
			 x->total);
		return SC_DEADLINE_EXCEEDED;
	}
	if (cancelled) {
		snprintf(msg, cap, "cancelled by the active side after %" PRIu64 " of %" PRIu64
			 " bytes", moved, x->total);
		return SC_CANCELLED;
	}
	if (failed) {
		snprintf(msg, cap, "%s", why);
		return status;
	}
	snprintf(msg, cap, "%s transfer stopped without a reason", r->name);
	return SC_INTERNAL;
}

/* ---- cutting a transfer into pieces -------------------------------------------------------- */

bool sc_xr_cursor_more(struct sc_xr_cursor *c, const struct sc_xfer *x)
{
	while (c->seg < x->n_segs && c->off >= x->segs[c->seg].len) {
		c->seg++;
		c->off = 0;
	}
	return c->seg < x->n_segs;
}

bool sc_xr_cursor_done(const struct sc_xr_cursor *c, const struct sc_xfer *x)
{
	uint64_t off = c->off;
	for (size_t i = c->seg; i < x->n_segs; i++, off = 0)
		if (off < x->segs[i].len)
			return false;
	return true;
}

size_t sc_xr_cursor_take(struct sc_xr_cursor *c, const struct sc_xfer *x, uint64_t max_bytes,
			 size_t max_pieces, sc_xr_joins_fn joins, struct sc_xr_piece *out)
{
	size_t n = 0;
	uint64_t bytes = 0;
	const struct sc_xfer_seg *first = NULL, *prev = NULL;
	while (n < max_pieces && bytes < max_bytes && sc_xr_cursor_more(c, x)) {
		const struct sc_xfer_seg *s = &x->segs[c->seg];
		if (prev) {
			if (joins && !joins(first, prev, s))
				break;
		} else {
			first = s;
		}
		uint64_t left = s->len - c->off;
		uint64_t take = left < max_bytes - bytes ? left : max_bytes - bytes;
		out[n++] = (struct sc_xr_piece){.seg = s, .off = c->off, .len = take};
		bytes += take;
		c->off += take;
		if (c->off < s->len)
			break; /* only a piece that used its segment up lets the batch go on */
		prev = s;
	}
	return n;
}

void sc_xr_cursor_seek(struct sc_xr_cursor *c, const struct sc_xfer *x, uint64_t done)
{
	size_t seg = 0;
	while (seg < x->n_segs && done >= x->segs[seg].len) {
		done -= x->segs[seg].len;
		seg++;
	}
	c->seg = seg;
	c->off = seg < x->n_segs ? done : 0;
}
