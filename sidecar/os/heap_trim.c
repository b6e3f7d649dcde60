/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/heap_trim.c: the periodic malloc_trim of os/heap_trim.h. Runs on the timer thread (one
 * callback per timers instance that re-arms itself; it ends when the timers are destroyed, which
 * drop pending callbacks); owns nothing but the period and a counter.
 *
 * Why (issue 12): glibc gives an arena's free pages back only from the top of the arena (and only
 * past M_TRIM_THRESHOLD), and a sidecar spreads its threads (gRPC workers, the timer, one thread
 * per peer connection, created and ended all the time) over up to 8 arenas per core. Transient
 * allocations touch pages in each, so the resident heap creeps up to the sum of every arena's
 * high-water mark, a slow rise that a soak cannot tell from a leak. malloc_trim(0) returns the
 * free pages inside every arena (madvise DONTNEED); pages that are needed again are faulted back
 * in. With a few MB of heap it takes well under a millisecond. sc_heap_stats reads malloc's own
 * figures (for the metrics endpoint): what is in use, as opposed to what is resident.
 */
#include "os/heap_trim.h"

#include <malloc.h>
#include <stdatomic.h>

static atomic_uint_fast64_t g_period_ms = SC_HEAP_TRIM_PERIOD_MS;
static atomic_uint_fast64_t g_trims;

bool sc_heap_trim_now(void)
{
	atomic_fetch_add(&g_trims, 1);
	return malloc_trim(0) != 0;
}

void sc_heap_stats(struct sc_heap_stats *out)
{
	struct mallinfo2 mi = mallinfo2();
	out->in_use = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
	out->free = (uint64_t)mi.fordblks;
	out->arena = (uint64_t)mi.arena;
	out->mmapped = (uint64_t)mi.hblkhd;
}

uint64_t sc_heap_trim_count(void)
{
	return atomic_load(&g_trims);
}

/* ctx: the timers the chain runs on (no other state, so nothing to free when they go). */
static void trim_cb(void *ctx)
{
	struct sc_timers *t = ctx;
	sc_heap_trim_now();
	/* Re-arm. Adding from a callback is allowed; once the timers are being destroyed this one
	 * is dropped unrun. */
	sc_timers_add(t, sc_clock_mono_after_ms(atomic_load(&g_period_ms)), trim_cb, t);
}

bool sc_heap_trim_start(struct sc_timers *t)
{
	return sc_timers_add(t, sc_clock_mono_after_ms(atomic_load(&g_period_ms)), trim_cb, t) != 0;
}

void sc_heap_trim_set_period(uint64_t period_ms)
{
	atomic_store(&g_period_ms, period_ms ? period_ms : SC_HEAP_TRIM_PERIOD_MS);
}
