/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/timer.h: one thread that runs callbacks at monotonic deadlines (operation deadlines,
 * retention, WaitOperation timeouts). Add and cancel from any thread. Cancel is synchronous: when
 * it returns the callback is not running and will not run (it must not be called from inside that
 * callback; calling cancel from inside a *different* timer's callback is fine). Timers due at the
 * same deadline run in the order they were added. Add, cancel and try_cancel cost O(log n) in the
 * number of pending timers (a binary heap indexed by timer id); an id names one timer only (a
 * slot's generation is part of it), so a stale id cancels nothing. A deadline of UINT64_MAX
 * never fires.
 */
#ifndef SC_TIMER_H
#define SC_TIMER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sc_timers;
typedef void (*sc_timer_cb)(void *ctx);

int sc_timers_create(struct sc_timers **out);
/* Stops the thread; pending callbacks never run. NULL ok. */
void sc_timers_destroy(struct sc_timers *t);
/* Returns an id > 0, or 0 when out of memory. fn may add or cancel other timers. */
uint64_t sc_timers_add(struct sc_timers *t, uint64_t deadline_mono_ms, sc_timer_cb fn, void *ctx);
bool sc_timers_cancel(struct sc_timers *t, uint64_t id);
/* Non-blocking: removes the timer if it has not started. Returns true if removed (fn will never
 * run); false if it already ran or is running right now (the callback then owns its ctx). */
bool sc_timers_try_cancel(struct sc_timers *t, uint64_t id);

/* Timers still waiting (not counting one that is running). */
size_t sc_timers_pending(struct sc_timers *t);

uint64_t sc_clock_mono_ms(void);
uint64_t sc_clock_mono_us(void);
uint64_t sc_clock_unix_ms(void);

/* A duration a test may shorten: the positive milliseconds in environment variable `name`
 * (digits only), else `dflt`. For tests that need seconds where the product waits minutes. */
uint64_t sc_test_env_ms(const char *name, uint64_t dflt);
/* base + delay, saturated at UINT64_MAX: every "now + timeout" goes through one of these, so a
 * huge timeout (a client's 2^64-1) means "never" rather than wrapping into the past. */
uint64_t sc_deadline_add_ms(uint64_t base_ms, uint64_t delay_ms);
uint64_t sc_clock_mono_after_ms(uint64_t delay_ms);

/* Bounded waits on a condition variable (mu held), the timespec arithmetic in one place. Both
 * return pthread_cond_timedwait's result (ETIMEDOUT once the bound passed); callers loop on their
 * own condition. */
/* cv made with pthread_cond_init(cv, NULL) (the realtime clock): waits at most ms. */
int sc_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ms);
/* cv made with sc_cond_init_mono: waits until the monotonic clock reads until_mono_ms. */
int sc_cond_init_mono(pthread_cond_t *cv);
int sc_cond_wait_until_mono(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t until_mono_ms);

#endif
