/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/trace.c: the hand-off trace (base/trace.h). Any thread records into one fixed table,
 * claiming a slot with an atomic counter; main dumps the table to stderr when the sidecar starts
 * draining, and what came after once the threads that record have ended. Owns the table (allocated
 * on first use when the trace is on, never freed: the process is ending when it is dumped).
 */
#include "base/trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct record {
	uint64_t xfer_id;
	const char *stage;
	uint64_t us;
};

atomic_int sc_trace_state = -1;
static struct record *table;
static atomic_uint_fast64_t next_slot, dumped;
static _Thread_local uint64_t call_in_us, current_xfer;

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

bool sc_trace_init(void)
{
	static atomic_flag once = ATOMIC_FLAG_INIT;
	if (atomic_flag_test_and_set(&once)) {
		/* another thread is deciding: off until it has */
		return atomic_load(&sc_trace_state) > 0;
	}
	const char *v = getenv("RDMA_SIDECAR_TRACE_HANDOFFS");
	bool on = v && strcmp(v, "1") == 0;
	if (on) {
		table = calloc(SC_TRACE_MAX, sizeof(*table));
		on = table != NULL;
	}
	atomic_store(&sc_trace_state, on ? 1 : 0);
	return on;
}

void sc_trace_record(uint64_t xfer_id, const char *stage, uint64_t mono_us)
{
	if (!table || !xfer_id) /* 0: no transfer (e.g. an answer not delivered by a completion) */
		return;
	uint64_t i = atomic_fetch_add_explicit(&next_slot, 1, memory_order_relaxed);
	if (i >= SC_TRACE_MAX)
		return; /* full: dropped (the dump says how many) */
	table[i].xfer_id = xfer_id;
	table[i].us = mono_us ? mono_us : now_us();
	atomic_thread_fence(memory_order_release);
	table[i].stage = stage;
}

void sc_trace_call_in(void)
{
	if (sc_trace_on())
		call_in_us = now_us();
}

uint64_t sc_trace_call_take(void)
{
	uint64_t t = call_in_us;
	call_in_us = 0;
	return t;
}

void sc_trace_set_current(uint64_t xfer_id)
{
	current_xfer = xfer_id;
}

uint64_t sc_trace_current(void)
{
	return current_xfer;
}

void sc_trace_dump(void)
{
	if (!sc_trace_on())
		return;
	uint64_t end = atomic_load(&next_slot);
	uint64_t n = end < SC_TRACE_MAX ? end : SC_TRACE_MAX;
	atomic_thread_fence(memory_order_acquire);
	uint64_t i = atomic_load(&dumped);
	for (; i < n; i++) {
		if (!table[i].stage) /* a record still being written: the next dump starts there */
			break;
		fprintf(stderr, "handoff xfer=%016" PRIx64 " stage=%s us=%" PRIu64 "\n",
			table[i].xfer_id, table[i].stage, table[i].us);
	}
	atomic_store(&dumped, i);
	if (end > SC_TRACE_MAX)
		fprintf(stderr, "handoff dropped=%" PRIu64 " (table full)\n", end - SC_TRACE_MAX);
	fflush(stderr);
}
