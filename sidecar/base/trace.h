/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/trace.h: hand-off timestamps along a transfer, for finding where a small transfer's time
 * goes. Off unless the (hidden) environment variable RDMA_SIDECAR_TRACE_HANDOFFS=1 is set when the
 * sidecar starts; off, each trace point costs one relaxed atomic load.
 *
 * On, sc_trace_mark records (transfer id, stage, CLOCK_MONOTONIC microseconds) in a fixed
 * in-memory table (SC_TRACE_MAX records, then further records are dropped and counted), with no
 * lock and no I/O on the data path. sc_trace_dump writes the table to stderr (the log), one line
 * per record: "handoff xfer=<16 hex> stage=<name> us=<monotonic us>", when the sidecar starts
 * draining. Both ends of a transfer name it by the same transfer id (the one on the wire), and
 * sidecars on one host share the monotonic clock, so bench/handoff_trace.py can lay both
 * sidecars' records on one time line.
 *
 * Thread safety: every call may be made from any thread. sc_trace_call_in / sc_trace_call_take
 * pass the arrival time of a gRPC call to the engine code the same thread runs next, and
 * sc_trace_set_current / sc_trace_current name the transfer whose completion the calling thread
 * is delivering (thread-local: no lock).
 */
#ifndef SC_TRACE_H
#define SC_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define SC_TRACE_MAX (1u << 20)

/* 1: on, 0: off, -1: not looked at yet (the first sc_trace_on reads the environment). */
extern atomic_int sc_trace_state;
bool sc_trace_init(void);

static inline bool sc_trace_on(void)
{
	int s = atomic_load_explicit(&sc_trace_state, memory_order_relaxed);
	return s > 0 || (s < 0 && sc_trace_init());
}

/* Record that transfer xfer_id reached `stage` (a string literal: it is kept, not copied) now,
 * or at mono_us when that is not 0. xfer_id 0 (no transfer) records nothing. */
void sc_trace_record(uint64_t xfer_id, const char *stage, uint64_t mono_us);
#define sc_trace_mark(xfer_id, stage)                                                              \
	do {                                                                                       \
		if (sc_trace_on())                                                                 \
			sc_trace_record((xfer_id), (stage), 0);                                    \
	} while (0)

/* The gRPC layer notes when a call arrived; the engine takes it (and clears it) once the call's
 * transfer has an id. 0: none noted on this thread. */
void sc_trace_call_in(void);
uint64_t sc_trace_call_take(void);

/* The transfer whose completion this thread is delivering (0: none). */
void sc_trace_set_current(uint64_t xfer_id);
uint64_t sc_trace_current(void);

/* Write every record to stderr (once; later calls write what was recorded since, a record still
 * being written included). Called by one thread at a time. */
void sc_trace_dump(void);

#endif
