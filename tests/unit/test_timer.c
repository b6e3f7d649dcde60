/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_timer.c: the deadline timer (sidecar/base/timer.c) driven directly: 10k random deadlines fire in
 * deadline order, cancel and try_cancel from the middle of the heap, a callback that adds and
 * cancels timers, stale ids, saturated deadlines. Prints the add+cancel rate at 10k pending timers
 * (a figure for the README, not an assert). Every wait has a deadline.
 */
#include "check.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define N_RANDOM 10000

struct record {
	pthread_mutex_t mu;
	uint64_t deadlines[N_RANDOM + 16];
	int tags[N_RANDOM + 16];
	size_t n;
};

struct item {
	struct record *rec;
	uint64_t deadline;
	int tag;
};

static void record_cb(void *ctx)
{
	struct item *it = ctx;
	pthread_mutex_lock(&it->rec->mu);
	it->rec->deadlines[it->rec->n] = it->deadline;
	it->rec->tags[it->rec->n] = it->tag;
	it->rec->n++;
	pthread_mutex_unlock(&it->rec->mu);
}

static size_t record_count(struct record *r)
{
	pthread_mutex_lock(&r->mu);
	size_t n = r->n;
	pthread_mutex_unlock(&r->mu);
	return n;
}

/* Wait until r has `want` entries or timeout_ms passed. */
static bool wait_count(struct record *r, size_t want, uint64_t timeout_ms)
{
	uint64_t end = sc_clock_mono_ms() + timeout_ms;
	while (record_count(r) < want) {
		if (sc_clock_mono_ms() >= end)
			return false;
		usleep(2000);
	}
	return true;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static struct record *record_new(void)
{
	struct record *r = calloc(1, sizeof(*r));
	pthread_mutex_init(&r->mu, NULL);
	return r;
}

static void record_free(struct record *r)
{
	pthread_mutex_destroy(&r->mu);
	free(r);
}

TEST(random_10k_fire_in_order_minus_cancelled)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	struct record *r = record_new();
	struct item *items = calloc(N_RANDOM, sizeof(*items));
	uint64_t *ids = calloc(N_RANDOM, sizeof(*ids));
	uint64_t base = sc_clock_mono_ms() + 300;
	for (int i = 0; i < N_RANDOM; i++) {
		items[i] = (struct item){.rec = r, .deadline = base + rng() % 400, .tag = i};
		ids[i] = sc_timers_add(t, items[i].deadline, record_cb, &items[i]);
		CHECK(ids[i] != 0);
	}
	CHECK_INT_EQ(sc_timers_pending(t), N_RANDOM);
	/* Cancel every third one, from all over the heap, before any is due. */
	size_t cancelled = 0;
	for (int i = 0; i < N_RANDOM; i += 3) {
		CHECK(sc_timers_cancel(t, ids[i]));
		cancelled++;
	}
	CHECK(!sc_timers_cancel(t, ids[0])); /* twice: already gone */
	CHECK(!sc_timers_try_cancel(t, ids[3]));
	size_t want = N_RANDOM - cancelled;
	CHECK(wait_count(r, want, 10000));
	usleep(50000);
	CHECK_U64_EQ(record_count(r), want);
	for (size_t i = 1; i < r->n; i++)
		if (r->deadlines[i] < r->deadlines[i - 1])
			CHECK_FAIL_("fired out of order at %zu: %" PRIu64 " after %" PRIu64, i,
				    r->deadlines[i], r->deadlines[i - 1]);
	for (size_t i = 0; i < r->n; i++)
		if (r->tags[i] % 3 == 0)
			CHECK_FAIL_("cancelled timer %d fired", r->tags[i]);
	CHECK_INT_EQ(sc_timers_pending(t), 0);
	sc_timers_destroy(t);
	free(ids);
	free(items);
	record_free(r);
}

TEST(equal_deadlines_fire_in_add_order)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	struct record *r = record_new();
	struct item items[64];
	uint64_t due = sc_clock_mono_ms() + 50;
	for (int i = 0; i < 64; i++) {
		items[i] = (struct item){.rec = r, .deadline = due, .tag = i};
		CHECK(sc_timers_add(t, due, record_cb, &items[i]) != 0);
	}
	CHECK(wait_count(r, 64, 5000));
	for (int i = 0; i < 64; i++)
		CHECK_INT_EQ(r->tags[i], i);
	sc_timers_destroy(t);
	record_free(r);
}

struct slow {
	atomic_int started, finished;
};

static void slow_cb(void *ctx)
{
	struct slow *s = ctx;
	atomic_store(&s->started, 1);
	usleep(200000);
	atomic_store(&s->finished, 1);
}

TEST(cancel_waits_for_running_callback_try_cancel_does_not)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	struct slow s = {0};
	uint64_t id = sc_timers_add(t, sc_clock_mono_ms(), slow_cb, &s);
	uint64_t end = sc_clock_mono_ms() + 5000;
	while (!atomic_load(&s.started) && sc_clock_mono_ms() < end)
		usleep(1000);
	CHECK(atomic_load(&s.started));
	CHECK(!sc_timers_try_cancel(t, id)); /* running: not removed, returns at once */
	CHECK_INT_EQ(atomic_load(&s.finished), 0);
	CHECK(!sc_timers_cancel(t, id)); /* running: waits until it returned */
	CHECK_INT_EQ(atomic_load(&s.finished), 1);
	/* try_cancel of a pending one removes it: it never runs. */
	struct slow s2 = {0};
	uint64_t id2 = sc_timers_add(t, sc_clock_mono_ms() + 100, slow_cb, &s2);
	CHECK(sc_timers_try_cancel(t, id2));
	usleep(250000);
	CHECK_INT_EQ(atomic_load(&s2.started), 0);
	sc_timers_destroy(t);
}

struct nested {
	struct sc_timers *t;
	struct record *rec;
	struct item child, victim;
	uint64_t victim_id;
	atomic_bool cancelled_victim;
};

/* A callback that adds a timer and cancels another (both allowed inside a callback). */
static void nested_cb(void *ctx)
{
	struct nested *n = ctx;
	n->child = (struct item){.rec = n->rec, .deadline = sc_clock_mono_ms() + 20, .tag = 1};
	sc_timers_add(n->t, n->child.deadline, record_cb, &n->child);
	atomic_store(&n->cancelled_victim, sc_timers_cancel(n->t, n->victim_id));
}

TEST(callback_adds_and_cancels_timers)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	struct nested n = {.t = t, .rec = record_new()};
	n.victim = (struct item){.rec = n.rec, .deadline = sc_clock_mono_ms() + 500, .tag = 2};
	n.victim_id = sc_timers_add(t, n.victim.deadline, record_cb, &n.victim);
	CHECK(sc_timers_add(t, sc_clock_mono_ms() + 10, nested_cb, &n) != 0);
	CHECK(wait_count(n.rec, 1, 5000));
	usleep(600000); /* past the victim's deadline */
	CHECK_U64_EQ(record_count(n.rec), 1);
	CHECK_INT_EQ(n.rec->tags[0], 1);
	CHECK(atomic_load(&n.cancelled_victim));
	sc_timers_destroy(t);
	record_free(n.rec);
}

static void count_cb(void *ctx)
{
	atomic_fetch_add((atomic_int *)ctx, 1);
}

TEST(stale_id_cancels_nothing_and_saturated_deadline_never_fires)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	atomic_int fired = 0;
	uint64_t a = sc_timers_add(t, UINT64_MAX, count_cb, &fired);
	CHECK(sc_timers_cancel(t, a));
	/* The slot is reused by b; a's id must not name b. */
	uint64_t b = sc_timers_add(t, sc_clock_mono_ms() + 30, count_cb, &fired);
	CHECK(a != b);
	CHECK(!sc_timers_cancel(t, a));
	CHECK(!sc_timers_try_cancel(t, (uint64_t)12345 << 32 | 7));
	uint64_t end = sc_clock_mono_ms() + 5000;
	while (atomic_load(&fired) == 0 && sc_clock_mono_ms() < end)
		usleep(1000);
	CHECK_INT_EQ(atomic_load(&fired), 1);
	/* Saturation: now + 2^64-1 is "never", not a wrapped deadline in the past. */
	CHECK_U64_EQ(sc_deadline_add_ms(1000, UINT64_MAX), UINT64_MAX);
	CHECK_U64_EQ(sc_deadline_add_ms(1000, 5), 1005);
	uint64_t never = sc_timers_add(t, sc_clock_mono_after_ms(UINT64_MAX), count_cb, &fired);
	usleep(100000);
	CHECK_INT_EQ(atomic_load(&fired), 1);
	CHECK(sc_timers_try_cancel(t, never));
	sc_timers_destroy(t); /* pending timers never run and are freed */
}

static void never_cb(void *ctx)
{
	(void)ctx;
}

/* The figure: add+cancel pairs per second with 10k timers pending (printed, not asserted). */
TEST(rate_add_cancel_at_10k_pending)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	uint64_t far = sc_clock_mono_ms() + 3600 * 1000;
	for (int i = 0; i < N_RANDOM; i++)
		CHECK(sc_timers_add(t, far + rng() % 100000, never_cb, NULL) != 0);
	enum { PAIRS = 200000 };
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < PAIRS; i++) {
		uint64_t id = sc_timers_add(t, far + rng() % 100000, never_cb, NULL);
		if (!sc_timers_cancel(t, id))
			CHECK_FAIL_("cancel %d failed", i);
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	printf("timer: %d add+cancel pairs at %d pending in %.3f s: %.0f pairs/s\n", PAIRS,
	       N_RANDOM, s, PAIRS / s);
	CHECK_INT_EQ(sc_timers_pending(t), N_RANDOM);
	sc_timers_destroy(t);
}

RUN_TESTS(T(random_10k_fire_in_order_minus_cancelled), T(equal_deadlines_fire_in_add_order),
	  T(cancel_waits_for_running_callback_try_cancel_does_not),
	  T(callback_adds_and_cancels_timers),
	  T(stale_id_cancels_nothing_and_saturated_deadline_never_fires),
	  T(rate_add_cancel_at_10k_pending))
