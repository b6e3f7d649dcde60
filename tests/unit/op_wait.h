/* SPDX-License-Identifier: Apache-2.0 */
/*
 * op_wait.h: wait for an engine operation to end, for the C tests that drive engines in-process
 * (test_tcp_transfer, test_ib_transfer). Registers an engine watcher and waits on a condition
 * variable in 10 ms slices, so a missed wake-up costs at most a slice and the timeout always holds.
 */
#ifndef SC_TEST_OP_WAIT_H
#define SC_TEST_OP_WAIT_H

#include "engine/engine.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
};

static inline bool on_change(void *ctx, const struct sc_op_info *info)
{
	struct waiter *w = ctx;
	if (!sc_op_status_terminal(info->status))
		return true;
	pthread_mutex_lock(&w->mu);
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return false;
}

/* Wait until op is terminal (or timeout_ms passes); fill *out with its final state. */
static inline int wait_op(struct sc_engine *eng, const char *id, uint64_t timeout_ms,
		   struct sc_op_info *out)
{
	struct waiter w = {.done = false};
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	uint64_t watch_id;
	struct sc_op_info first;
	struct sc_err err;
	if (sc_op_watch(eng, id, on_change, &w, &watch_id, &first, &err) != 0) {
		fprintf(stderr, "watch %s: %s\n", id, err.msg);
		return -1;
	}
	bool terminal = sc_op_status_terminal(first.status);
	sc_op_info_free(&first);
	uint64_t until = sc_clock_mono_ms() + timeout_ms;
	pthread_mutex_lock(&w.mu);
	while (!terminal && !w.done && sc_clock_mono_ms() < until) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&w.cv, &w.mu, &ts);
	}
	pthread_mutex_unlock(&w.mu);
	sc_op_unwatch(eng, watch_id);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
	return sc_op_get(eng, id, out, &err);
}

#endif
