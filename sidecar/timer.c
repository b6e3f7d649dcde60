/* SPDX-License-Identifier: Apache-2.0 */
/*
 * timer.c: the timer thread. Owns a list of pending timers sorted by deadline, guarded by one
 * mutex; the thread sleeps on a condition variable (CLOCK_MONOTONIC) until the earliest deadline,
 * then runs due callbacks one at a time with the mutex released. `running_id` lets cancel wait for
 * a callback that is executing right now. Few timers are live at once (one per live operation),
 * so a sorted singly linked list is enough.
 */
#include "timer.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct sc_timer_entry {
	uint64_t id;
	uint64_t deadline;
	sc_timer_cb fn;
	void *ctx;
	struct sc_timer_entry *next;
};

struct sc_timers {
	pthread_mutex_t mu;
	pthread_cond_t wake;     /* new earliest deadline, or stop */
	pthread_cond_t finished; /* a callback returned */
	pthread_t thread;
	struct sc_timer_entry *head;
	uint64_t next_id;
	uint64_t running_id;
	bool stop;
};

uint64_t sc_clock_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t sc_clock_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *timer_main(void *arg)
{
	struct sc_timers *t = arg;
	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		uint64_t now = sc_clock_mono_ms();
		struct sc_timer_entry *e = t->head;
		if (e && e->deadline <= now) {
			t->head = e->next;
			t->running_id = e->id;
			pthread_mutex_unlock(&t->mu);
			e->fn(e->ctx);
			free(e);
			pthread_mutex_lock(&t->mu);
			t->running_id = 0;
			pthread_cond_broadcast(&t->finished);
			continue;
		}
		if (!e) {
			pthread_cond_wait(&t->wake, &t->mu);
			continue;
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t wait_ms = e->deadline - now;
		ts.tv_sec += (time_t)(wait_ms / 1000u);
		ts.tv_nsec += (long)(wait_ms % 1000u) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&t->wake, &t->mu, &ts);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

int sc_timers_create(struct sc_timers **out)
{
	struct sc_timers *t = calloc(1, sizeof(*t));
	if (!t)
		return -1;
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->wake, &attr);
	pthread_cond_init(&t->finished, NULL);
	pthread_condattr_destroy(&attr);
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
	while (t->head) {
		struct sc_timer_entry *e = t->head;
		t->head = e->next;
		free(e);
	}
	pthread_cond_destroy(&t->finished);
	pthread_cond_destroy(&t->wake);
	pthread_mutex_destroy(&t->mu);
	free(t);
}

uint64_t sc_timers_add(struct sc_timers *t, uint64_t deadline_mono_ms, sc_timer_cb fn, void *ctx)
{
	struct sc_timer_entry *e = calloc(1, sizeof(*e));
	if (!e)
		return 0;
	e->deadline = deadline_mono_ms;
	e->fn = fn;
	e->ctx = ctx;
	pthread_mutex_lock(&t->mu);
	e->id = ++t->next_id;
	struct sc_timer_entry **pp = &t->head;
	while (*pp && (*pp)->deadline <= deadline_mono_ms)
		pp = &(*pp)->next;
	e->next = *pp;
	*pp = e;
	if (t->head == e)
		pthread_cond_signal(&t->wake);
	uint64_t id = e->id;
	pthread_mutex_unlock(&t->mu);
	return id;
}

/* Remove a pending timer; caller holds t->mu. */
static bool remove_locked(struct sc_timers *t, uint64_t id)
{
	for (struct sc_timer_entry **pp = &t->head; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == id) {
			struct sc_timer_entry *e = *pp;
			*pp = e->next;
			free(e);
			return true;
		}
	}
	return false;
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
