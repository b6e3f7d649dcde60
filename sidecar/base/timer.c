/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/timer.c: the timer thread. Owns the pending timers: a binary min-heap ordered by (deadline,
 * order of adding), so equal deadlines fire first-added first, plus a slot table that maps a
 * timer id to its heap position, so add, cancel and pop are O(log n) at any number of pending
 * timers (one per live operation and per waiting WaitOperation: tens of thousands under load).
 * An id is (slot generation << 32 | slot index): a stale id never names a newer timer that reuses
 * the slot. One mutex guards it all; the thread sleeps on a condition variable (CLOCK_MONOTONIC)
 * until the earliest deadline, then runs due callbacks one at a time with the mutex released.
 * `running_id` lets cancel wait for a callback that is executing right now.
 */
#include "base/timer.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define NO_POS UINT32_MAX
/* Sleep at most this long in one wait, so far deadlines (UINT64_MAX: never) need no time_t math
 * that could overflow. */
#define MAX_SLEEP_MS (3600u * 1000u)

struct sc_timer_slot {
	uint64_t deadline;
	uint64_t seq; /* order of adding: ties on deadline fire first-added first */
	sc_timer_cb fn;
	void *ctx;
	uint32_t gen;      /* bumped each time the slot is freed */
	uint32_t heap_pos; /* NO_POS when the slot is free */
	uint32_t next_free;
};

struct sc_timers {
	pthread_mutex_t mu;
	pthread_cond_t wake;     /* new earliest deadline, or stop */
	pthread_cond_t finished; /* a callback returned */
	pthread_t thread;
	struct sc_timer_slot *slots;
	uint32_t *heap; /* slot indexes; same capacity as slots */
	uint32_t n_slots, cap, heap_len;
	uint32_t free_head; /* NO_POS: none */
	uint64_t seq;
	uint64_t running_id;
	bool stop;
};

uint64_t sc_clock_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t sc_clock_mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t sc_clock_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t sc_deadline_add_ms(uint64_t base_ms, uint64_t delay_ms)
{
	return delay_ms > UINT64_MAX - base_ms ? UINT64_MAX : base_ms + delay_ms;
}

uint64_t sc_clock_mono_after_ms(uint64_t delay_ms)
{
	return sc_deadline_add_ms(sc_clock_mono_ms(), delay_ms);
}

/* ---- bounded condition waits ----------------------------------------------------------------- */

static struct timespec clock_plus_ms(clockid_t clock, uint64_t ms)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	if (ms > 86400000ull * 365)
		ms = 86400000ull * 365; /* "never" within any time_t */
	ts.tv_sec += (time_t)(ms / 1000u);
	ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

int sc_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ms)
{
	struct timespec ts = clock_plus_ms(CLOCK_REALTIME, ms);
	return pthread_cond_timedwait(cv, mu, &ts);
}

int sc_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	int rc = pthread_cond_init(cv, &attr);
	pthread_condattr_destroy(&attr);
	return rc;
}

int sc_cond_wait_until_mono(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t until_mono_ms)
{
	uint64_t now = sc_clock_mono_ms();
	struct timespec ts = clock_plus_ms(CLOCK_MONOTONIC, until_mono_ms > now ? until_mono_ms - now : 0);
	return pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- the heap (caller holds mu) -------------------------------------------------------------- */

static bool earlier(const struct sc_timers *t, uint32_t a, uint32_t b)
{
	const struct sc_timer_slot *x = &t->slots[a], *y = &t->slots[b];
	return x->deadline < y->deadline || (x->deadline == y->deadline && x->seq < y->seq);
}

static void heap_set(struct sc_timers *t, uint32_t pos, uint32_t slot)
{
	t->heap[pos] = slot;
	t->slots[slot].heap_pos = pos;
}

static void sift_up(struct sc_timers *t, uint32_t pos)
{
	uint32_t slot = t->heap[pos];
	while (pos > 0) {
		uint32_t parent = (pos - 1) / 2;
		if (!earlier(t, slot, t->heap[parent]))
			break;
		heap_set(t, pos, t->heap[parent]);
		pos = parent;
	}
	heap_set(t, pos, slot);
}

static void sift_down(struct sc_timers *t, uint32_t pos)
{
	uint32_t slot = t->heap[pos];
	for (;;) {
		uint32_t child = 2 * pos + 1;
		if (child >= t->heap_len)
			break;
		if (child + 1 < t->heap_len && earlier(t, t->heap[child + 1], t->heap[child]))
			child++;
		if (!earlier(t, t->heap[child], slot))
			break;
		heap_set(t, pos, t->heap[child]);
		pos = child;
	}
	heap_set(t, pos, slot);
}

/* Take the timer in `slot` out of the heap and free the slot. */
static void remove_slot(struct sc_timers *t, uint32_t slot)
{
	uint32_t pos = t->slots[slot].heap_pos;
	uint32_t last = t->heap[--t->heap_len];
	if (pos != t->heap_len) {
		heap_set(t, pos, last);
		if (pos > 0 && earlier(t, last, t->heap[(pos - 1) / 2]))
			sift_up(t, pos);
		else
			sift_down(t, pos);
	}
	struct sc_timer_slot *s = &t->slots[slot];
	s->heap_pos = NO_POS;
	s->fn = NULL;
	s->ctx = NULL;
	s->gen = s->gen == UINT32_MAX ? 1 : s->gen + 1;
	s->next_free = t->free_head;
	t->free_head = slot;
}

static uint64_t slot_id(const struct sc_timers *t, uint32_t slot)
{
	return (uint64_t)t->slots[slot].gen << 32 | slot;
}

/* The slot a pending timer's id names, or NO_POS. */
static uint32_t find_slot(const struct sc_timers *t, uint64_t id)
{
	uint32_t slot = (uint32_t)id;
	if (slot >= t->n_slots)
		return NO_POS;
	const struct sc_timer_slot *s = &t->slots[slot];
	if (s->heap_pos == NO_POS || s->gen != (uint32_t)(id >> 32))
		return NO_POS;
	return slot;
}

static int grow(struct sc_timers *t)
{
	if (t->cap >= NO_POS / 2)
		return -1;
	uint32_t cap = t->cap ? t->cap * 2 : 64;
	struct sc_timer_slot *slots = realloc(t->slots, (size_t)cap * sizeof(*slots));
	if (!slots)
		return -1;
	t->slots = slots;
	uint32_t *heap = realloc(t->heap, (size_t)cap * sizeof(*heap));
	if (!heap)
		return -1; /* slots grew; cap did not: harmless */
	t->heap = heap;
	t->cap = cap;
	return 0;
}

/* ---- the thread ------------------------------------------------------------------------------ */

static void *timer_main(void *arg)
{
	struct sc_timers *t = arg;
	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		if (t->heap_len == 0) {
			pthread_cond_wait(&t->wake, &t->mu);
			continue;
		}
		uint64_t now = sc_clock_mono_ms();
		uint32_t top = t->heap[0];
		struct sc_timer_slot *s = &t->slots[top];
		if (s->deadline <= now) {
			sc_timer_cb fn = s->fn;
			void *ctx = s->ctx;
			t->running_id = slot_id(t, top);
			remove_slot(t, top);
			pthread_mutex_unlock(&t->mu);
			fn(ctx);
			pthread_mutex_lock(&t->mu);
			t->running_id = 0;
			pthread_cond_broadcast(&t->finished);
			continue;
		}
		uint64_t wait_ms = s->deadline - now;
		if (wait_ms > MAX_SLEEP_MS)
			wait_ms = MAX_SLEEP_MS;
		sc_cond_wait_until_mono(&t->wake, &t->mu, now + wait_ms);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

int sc_timers_create(struct sc_timers **out)
{
	struct sc_timers *t = calloc(1, sizeof(*t));
	if (!t)
		return -1;
	t->free_head = NO_POS;
	pthread_mutex_init(&t->mu, NULL);
	sc_cond_init_mono(&t->wake);
	pthread_cond_init(&t->finished, NULL);
	if (pthread_create(&t->thread, NULL, timer_main, t) != 0) {
		pthread_cond_destroy(&t->finished);
		pthread_cond_destroy(&t->wake);
		pthread_mutex_destroy(&t->mu);
		free(t);
		return -1;
	}
	pthread_setname_np(t->thread, "sc-timer");
	*out = t;
	return 0;
}

void sc_timers_destroy(struct sc_timers *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_broadcast(&t->wake);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->thread, NULL);
	free(t->heap);
	free(t->slots);
	pthread_cond_destroy(&t->finished);
	pthread_cond_destroy(&t->wake);
	pthread_mutex_destroy(&t->mu);
	free(t);
}

uint64_t sc_timers_add(struct sc_timers *t, uint64_t deadline_mono_ms, sc_timer_cb fn, void *ctx)
{
	pthread_mutex_lock(&t->mu);
	uint32_t slot = t->free_head;
	if (slot != NO_POS) {
		t->free_head = t->slots[slot].next_free;
	} else {
		if (t->n_slots == t->cap && grow(t) != 0) {
			pthread_mutex_unlock(&t->mu);
			return 0;
		}
		slot = t->n_slots++;
		t->slots[slot].gen = 1;
	}
	struct sc_timer_slot *s = &t->slots[slot];
	s->deadline = deadline_mono_ms;
	s->seq = ++t->seq;
	s->fn = fn;
	s->ctx = ctx;
	t->heap[t->heap_len] = slot;
	sift_up(t, t->heap_len++);
	if (t->heap[0] == slot)
		pthread_cond_signal(&t->wake);
	uint64_t id = slot_id(t, slot);
	pthread_mutex_unlock(&t->mu);
	return id;
}

/* Remove a pending timer; caller holds t->mu. */
static bool remove_locked(struct sc_timers *t, uint64_t id)
{
	uint32_t slot = find_slot(t, id);
	if (slot == NO_POS)
		return false;
	remove_slot(t, slot);
	return true;
}

bool sc_timers_try_cancel(struct sc_timers *t, uint64_t id)
{
	if (!t || id == 0)
		return false;
	pthread_mutex_lock(&t->mu);
	bool removed = remove_locked(t, id);
	pthread_mutex_unlock(&t->mu);
	return removed;
}

bool sc_timers_cancel(struct sc_timers *t, uint64_t id)
{
	if (!t || id == 0)
		return false;
	pthread_mutex_lock(&t->mu);
	bool removed = remove_locked(t, id);
	if (!removed && !pthread_equal(pthread_self(), t->thread)) {
		while (t->running_id == id)
			pthread_cond_wait(&t->finished, &t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return removed;
}

size_t sc_timers_pending(struct sc_timers *t)
{
	pthread_mutex_lock(&t->mu);
	size_t n = t->heap_len;
	pthread_mutex_unlock(&t->mu);
	return n;
}

uint64_t sc_test_env_ms(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long ms = v ? strtoull(v, &end, 10) : 0;
	return v && *v && !*end && ms > 0 ? (uint64_t)ms : dflt;
}
