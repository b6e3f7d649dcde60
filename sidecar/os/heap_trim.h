/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/heap_trim.h: give the allocator's free pages back to the system now and then (glibc
 * malloc_trim), so the resident heap follows what is in use rather than every arena's high-water
 * mark. Thread-safe; the periodic trim runs on the timer thread.
 */
#ifndef SC_HEAP_TRIM_H
#define SC_HEAP_TRIM_H

#include "base/timer.h"

#include <stdbool.h>
#include <stdint.h>

/* The period the engine uses (sc_engine_start). */
#define SC_HEAP_TRIM_PERIOD_MS 10000u

/* Trim every period (SC_HEAP_TRIM_PERIOD_MS unless set below) on t's thread until t is destroyed;
 * each timers instance runs its own chain, so several engines in one process are fine. Returns
 * false when the timer cannot be added (out of memory): the sidecar then runs without trimming. */
bool sc_heap_trim_start(struct sc_timers *t);

/* For tests: the period of chains armed from now on (0: back to SC_HEAP_TRIM_PERIOD_MS). */
void sc_heap_trim_set_period(uint64_t period_ms);

/* Trim once, now (any thread). True when glibc gave memory back. */
bool sc_heap_trim_now(void);

/* glibc malloc's own figures (mallinfo2), summed over every arena. */
struct sc_heap_stats {
	uint64_t in_use; /* bytes in allocated chunks (uordblks + hblkhd; includes thread caches) */
	uint64_t free;	 /* bytes in free chunks (fordblks): reusable, resident or trimmed */
	uint64_t arena;	 /* bytes malloc has from the system outside mmap'd chunks (arena) */
	uint64_t mmapped; /* bytes in chunks mmap'd on their own (hblkhd) */
};
void sc_heap_stats(struct sc_heap_stats *out);

/* Trims done so far (periodic and sc_heap_trim_now), for tests. */
uint64_t sc_heap_trim_count(void);

#endif
