/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_xfer_runner.c: the transfer runner both network backends share (sidecar/backend/xfer_runner.c),
 * driven directly: the cursor cuts batches by pieces, bytes and a join rule (over empty segments,
 * across a seek), the verdict's order (deadline, cancel, first failure; cancel_wins), the first
 * failure stays first, and the worker pool runs tasks, gives back unstarted ones, refuses new
 * transfers while stopping and waits for live ones with a deadline. The tcp and ibverbs suites
 * cover the backends on top of it.
 */
#include "check.h"
#include "base/timer.h"
#include "backend/xfer_runner.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static void noop_progress(struct sc_xfer *x, uint64_t d)
{
	(void)x;
	(void)d;
}

static atomic_int completions;
static enum sc_status last_status;
static void count_complete(struct sc_xfer *x, enum sc_status st, const char *msg)
{
	(void)x;
	(void)msg;
	last_status = st;
	atomic_fetch_add(&completions, 1);
}

/* segs: lengths; gpu: local memory of each (SC_GPU_HOST or a device); remote contiguous runs of
 * one rkey per `run` segments. */
static void make_xfer(struct sc_xfer *x, struct sc_xfer_seg *segs, const uint64_t *lens,
		      const int *gpu, size_t n, size_t run)
{
	static uint8_t mem[1 << 20];
	uint64_t total = 0, raddr = 0x10000;
	for (size_t i = 0; i < n; i++) {
		if (run && i % run == 0)
			raddr += 4096; /* a gap: a new remote run */
		segs[i] = (struct sc_xfer_seg){.local = mem + total % sizeof(mem), .len = lens[i],
					       .local_gpu = gpu ? gpu[i] : SC_GPU_HOST,
					       .remote_desc = (uint32_t)i, .remote_addr = raddr,
					       .rkey = (uint32_t)(run ? i / run : 0)};
		raddr += lens[i];
		total += lens[i];
	}
	*x = (struct sc_xfer){.kind = SC_OP_READ, .segs = segs, .n_segs = n, .total = total,
			      .on_progress = noop_progress, .on_complete = count_complete};
	atomic_init(&x->cancel_requested, false);
	atomic_init(&x->committed, false);
}

static bool same_gpu(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
		     const struct sc_xfer_seg *next)
{
	(void)prev;
	return next->local_gpu == first->local_gpu;
}

static bool remote_goes_on(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
			   const struct sc_xfer_seg *next)
{
	(void)first;
	return next->rkey == prev->rkey && next->remote_addr == prev->remote_addr + prev->len;
}

TEST(cursor_cuts_by_pieces_bytes_and_join_rule)
{
	/* 7 segments: 100, 0 (empty), 300, 5000, 50, 50, 50; the last three on GPU 1. */
	uint64_t lens[] = {100, 0, 300, 5000, 50, 50, 50};
	int gpu[] = {SC_GPU_HOST, SC_GPU_HOST, SC_GPU_HOST, SC_GPU_HOST, 1, 1, 1};
	struct sc_xfer_seg segs[7];
	struct sc_xfer x;
	make_xfer(&x, segs, lens, gpu, 7, 0);
	struct sc_xr_cursor c = {0};
	struct sc_xr_piece p[8];
	/* 1024 bytes at most: 100 + (empty skipped) 300 + 624 of the 5000 */
	size_t n = sc_xr_cursor_take(&c, &x, 1024, 8, same_gpu, p);
	CHECK_INT_EQ(n, 3);
	CHECK(p[0].seg == &segs[0] && p[0].off == 0 && p[0].len == 100);
	CHECK(p[1].seg == &segs[2] && p[1].len == 300);
	CHECK(p[2].seg == &segs[3] && p[2].off == 0 && p[2].len == 624);
	/* a piece that did not use its segment up ends the batch even with room left */
	n = sc_xr_cursor_take(&c, &x, 10000, 8, same_gpu, p);
	CHECK_INT_EQ(n, 1);
	CHECK(p[0].seg == &segs[3] && p[0].off == 624 && p[0].len == 5000 - 624);
	/* the GPU pieces do not join a host batch; two pieces at most */
	CHECK(!sc_xr_cursor_done(&c, &x));
	n = sc_xr_cursor_take(&c, &x, 10000, 2, same_gpu, p);
	CHECK_INT_EQ(n, 2);
	CHECK(p[0].seg == &segs[4] && p[1].seg == &segs[5]);
	n = sc_xr_cursor_take(&c, &x, 10000, 2, same_gpu, p);
	CHECK_INT_EQ(n, 1);
	CHECK(p[0].seg == &segs[6]);
	CHECK(sc_xr_cursor_done(&c, &x));
	CHECK_INT_EQ(sc_xr_cursor_take(&c, &x, 10000, 2, same_gpu, p), 0);
	CHECK(!sc_xr_cursor_more(&c, &x));

	/* seek: byte 450 is offset 50 in the 5000-byte segment */
	sc_xr_cursor_seek(&c, &x, 450);
	CHECK_INT_EQ(c.seg, 3);
	CHECK_U64_EQ(c.off, 50);
	sc_xr_cursor_seek(&c, &x, x.total);
	CHECK(sc_xr_cursor_done(&c, &x));
	sc_xr_cursor_seek(&c, &x, 0);
	n = sc_xr_cursor_take(&c, &x, UINT64_MAX, 1, NULL, p);
	CHECK_INT_EQ(n, 1);
	CHECK(p[0].seg == &segs[0] && p[0].len == 100);
}

TEST(cursor_joins_only_while_the_remote_run_goes_on)
{
	/* 6 segments of 64 bytes, remote runs of 3 (one rkey each, a gap between runs). */
	uint64_t lens[] = {64, 64, 64, 64, 64, 64};
	struct sc_xfer_seg segs[6];
	struct sc_xfer x;
	make_xfer(&x, segs, lens, NULL, 6, 3);
	struct sc_xr_cursor c = {0};
	struct sc_xr_piece p[16];
	size_t n = sc_xr_cursor_take(&c, &x, 1 << 20, 16, remote_goes_on, p);
	CHECK_INT_EQ(n, 3);
	CHECK(p[2].seg == &segs[2]);
	n = sc_xr_cursor_take(&c, &x, 1 << 20, 16, remote_goes_on, p);
	CHECK_INT_EQ(n, 3);
	CHECK(p[0].seg == &segs[3]);
	/* every byte handed out once, in order */
	uint64_t sum = 0;
	sc_xr_cursor_seek(&c, &x, 0);
	while ((n = sc_xr_cursor_take(&c, &x, 100, 16, remote_goes_on, p)) > 0)
		for (size_t i = 0; i < n; i++)
			sum += p[i].len;
	CHECK_U64_EQ(sum, x.total);
}

TEST(verdict_order_and_first_failure)
{
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	struct sc_xr r;
	sc_xr_init(&r, "test", &mu);
	uint64_t lens[] = {10, 20};
	struct sc_xfer_seg segs[2];
	struct sc_xfer x;
	make_xfer(&x, segs, lens, NULL, 2, 0);
	struct sc_xr_xfer t = {.x = &x};
	atomic_init(&t.stop, false);
	char msg[SC_ERR_MSG_MAX];

	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 30, false, msg, sizeof(msg)), SC_OK);
	CHECK_STR_EQ(msg, "");
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 29, false, msg, sizeof(msg)), SC_INTERNAL);
	CHECK_STR_EQ(msg, "test transfer stopped without a reason");

	pthread_mutex_lock(&mu);
	sc_xr_fail_locked(&t, false, SC_UNAVAILABLE, "peer %s went away", "b");
	sc_xr_fail_locked(&t, false, SC_INTERNAL, "second"); /* the first one stays */
	pthread_mutex_unlock(&mu);
	CHECK(sc_xr_should_stop(&t));
	CHECK(t.stop_mono_ms > 0);
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 30, false, msg, sizeof(msg)), SC_UNAVAILABLE);
	CHECK_STR_EQ(msg, "peer b went away");

	/* a cancel outranks the failure; after the deadline it is the deadline */
	atomic_store(&x.cancel_requested, true);
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 12, false, msg, sizeof(msg)), SC_CANCELLED);
	CHECK_STR_EQ(msg, "cancelled by the active side after 12 of 30 bytes");
	x.deadline_mono_ms = 1;
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 12, false, msg, sizeof(msg)), SC_DEADLINE_EXCEEDED);
	CHECK_STR_EQ(msg, "deadline passed after 12 of 30 bytes");

	/* all moved, nothing failed, then a cancel: cancel_wins decides */
	pthread_mutex_lock(&mu);
	sc_xr_reset_locked(&t);
	pthread_mutex_unlock(&mu);
	x.deadline_mono_ms = 0;
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 30, false, msg, sizeof(msg)), SC_OK);
	CHECK_INT_EQ(sc_xr_verdict(&r, &t, 30, true, msg, sizeof(msg)), SC_CANCELLED);

	/* while stopping (cancelled), a failure is recorded only when asked to */
	pthread_mutex_lock(&mu);
	sc_xr_fail_locked(&t, false, SC_UNAVAILABLE, "ignored");
	CHECK(!t.failed);
	sc_xr_fail_locked(&t, true, SC_UNAVAILABLE, "the peer refused the DONE");
	CHECK(t.failed);
	pthread_mutex_unlock(&mu);
	sc_xr_destroy(&r);
}

struct job {
	struct sc_xr_task t;
	struct sc_xr *r;
	struct sc_xr_xfer xr;
	struct sc_xfer x;
	struct sc_xfer_seg seg;
	atomic_bool release; /* the task returns once set */
	atomic_int ran;
};

static void job_run(struct sc_xr_task *t)
{
	struct job *j = container_of(t, struct job, t);
	atomic_fetch_add(&j->ran, 1);
	uint64_t end = sc_clock_mono_ms() + 10000;
	while (!atomic_load(&j->release) && !sc_xr_should_stop(&j->xr) && sc_clock_mono_ms() < end)
		usleep(1000);
	char msg[SC_ERR_MSG_MAX];
	enum sc_status st = sc_xr_verdict(j->r, &j->xr, 0, true, msg, sizeof(msg));
	pthread_mutex_lock(j->r->mu);
	sc_xr_retire_locked(j->r, &j->xr);
	pthread_mutex_unlock(j->r->mu);
	sc_xr_complete(&j->x, st, msg);
}

static bool is_job(const struct sc_xr_task *t, void *arg)
{
	return t == arg;
}

static bool wait_ran(struct job *j, int want)
{
	uint64_t end = sc_clock_mono_ms() + 10000;
	while (atomic_load(&j->ran) < want && sc_clock_mono_ms() < end)
		usleep(1000);
	return atomic_load(&j->ran) >= want;
}

/* on_complete runs right after the retire that ends a wait for idle: wait for it too. */
static bool wait_completions(int want)
{
	uint64_t end = sc_clock_mono_ms() + 10000;
	while (atomic_load(&completions) < want && sc_clock_mono_ms() < end)
		usleep(1000);
	return atomic_load(&completions) == want;
}

static void job_init(struct job *j, struct sc_xr *r)
{
	uint64_t len = 0;
	make_xfer(&j->x, &j->seg, &len, NULL, 1, 0);
	j->t.run = job_run;
	j->r = r;
	atomic_init(&j->release, false);
	atomic_init(&j->ran, 0);
}

TEST(pool_runs_unqueues_refuses_and_waits)
{
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	struct sc_xr r;
	sc_xr_init(&r, "test", &mu);
	struct sc_err err;
	sc_err_clear(&err);
	static struct job a, b, c, d;
	job_init(&a, &r);
	job_init(&b, &r);
	job_init(&c, &r);
	job_init(&d, &r);
	/* not started: refused */
	CHECK(sc_xr_admit(&r, &a.xr, &a.x, &a.t, &err) != 0);
	CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
	CHECK_STR_EQ(err.msg, "the test backend is not started");

	CHECK_INT_EQ(sc_xr_start(&r, 1, &err), 0);
	atomic_store(&completions, 0);
	CHECK_INT_EQ(sc_xr_admit(&r, &a.xr, &a.x, &a.t, &err), 0);
	CHECK(wait_ran(&a, 1)); /* the one worker holds a */
	CHECK_INT_EQ(sc_xr_admit(&r, &b.xr, &b.x, &b.t, &err), 0);
	CHECK_INT_EQ(sc_xr_admit(&r, &c.xr, &c.x, &c.t, &err), 0);
	pthread_mutex_lock(&mu);
	CHECK_INT_EQ(r.n_live, 3);
	/* c never started: take it back, and retire it as its backend would */
	CHECK_INT_EQ(sc_xr_unqueue_locked(&r, is_job, &c.t), 1);
	CHECK_INT_EQ(sc_xr_unqueue_locked(&r, is_job, &c.t), 0);
	sc_xr_retire_locked(&r, &c.xr);
	/* nothing ends while a is held: the wait gives up at its deadline */
	CHECK(!sc_xr_wait_idle_locked(&r, sc_clock_mono_ms() + 50));
	pthread_mutex_unlock(&mu);

	atomic_store(&a.release, true);
	atomic_store(&b.release, true);
	pthread_mutex_lock(&mu);
	CHECK(sc_xr_wait_idle_locked(&r, sc_clock_mono_ms() + 10000));
	pthread_mutex_unlock(&mu);
	CHECK(wait_completions(2));
	CHECK_INT_EQ(atomic_load(&c.ran), 0);
	CHECK_INT_EQ(last_status, SC_OK); /* released, nothing to move: OK */

	/* stopping: live transfers are flagged cancelled, new ones refused */
	CHECK_INT_EQ(sc_xr_admit(&r, &d.xr, &d.x, &d.t, &err), 0);
	CHECK(wait_ran(&d, 1));
	sc_xr_begin_stop(&r, NULL);
	CHECK(sc_xr_admit(&r, &c.xr, &c.x, &c.t, &err) != 0);
	CHECK_STR_EQ(err.msg, "the test backend is shutting down");
	pthread_mutex_lock(&mu);
	CHECK(sc_xr_wait_idle_locked(&r, sc_clock_mono_ms() + 10000));
	pthread_mutex_unlock(&mu);
	CHECK(wait_completions(3));
	CHECK_INT_EQ(last_status, SC_CANCELLED);
	sc_xr_stop_workers(&r);
	CHECK(!r.started);
	sc_xr_destroy(&r);
}

RUN_TESTS(T(cursor_cuts_by_pieces_bytes_and_join_rule),
	  T(cursor_joins_only_while_the_remote_run_goes_on), T(verdict_order_and_first_failure),
	  T(pool_runs_unqueues_refuses_and_waits))
