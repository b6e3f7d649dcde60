/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/scheduler.c: transfer slots and progress gates (DESIGN section 7). An active operation
 * moves bytes only while it holds a slot: at most --max-concurrent-transfers at once and at most
 * --max-inflight-bytes in flight (a larger transfer runs alone). Operations gated on worker
 * progress wait until ReportProgress meets their requirement, then queue for a slot, strictly
 * FIFO: whatever frees room (a slot given back, exactly once, from the completion; a queued
 * operation leaving) admits the head while it fits. Progress records (one per request id, in
 * eng->progress_ids) that no operation waits on age on eng->progress_idle and go after
 * --progress-grace, or earlier, logged, past --max-progress-records; a waited-on record stays.
 * It reaches operations only through the hooks the engine hands it at creation (sc_sched_init:
 * start a transfer, drop a reference), so it sits beneath them. Runs under eng->mu on whatever
 * thread drives the change (RPC handlers, backend completions, the timer thread, the scrape).
 */
#include "engine/internal.h"
#include "base/log.h"
#include "engine/metrics.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

void sc_sched_init(struct sc_engine *eng, const struct sc_sched_hooks *hooks)
{
	eng->sched_hooks = *hooks;
	sc_list_init(&eng->sched);
	sc_list_init(&eng->progress_idle);
}

static bool slot_free(struct sc_engine *eng, const struct sc_op *op)
{
	if (eng->active_transfers >= eng->cfg->max_concurrent_transfers)
		return false;
	if (eng->active_transfers == 0)
		return true; /* an oversized transfer runs alone rather than never */
	return eng->inflight_bytes + op->bytes_total <= eng->cfg->max_inflight_bytes;
}

static void take_slot_and_start(struct sc_engine *eng, struct sc_op *op)
{
	op->slot_held = true;
	eng->active_transfers++;
	eng->inflight_bytes += op->bytes_total;
	op->xfer_start_ns = sc_metrics_clock_ns();
	eng->sched_hooks.start(eng, op);
}

void sc_sched_admit(struct sc_engine *eng, struct sc_op *op)
{
	sc_sched_ungate(eng, op);
	if (sc_list_empty(&eng->sched) && slot_free(eng, op)) {
		take_slot_and_start(eng, op);
		return;
	}
	op->queued = true;
	op->refs++; /* the queue's */
	sc_list_insert_tail(&eng->sched, &op->sched_node);
	SC_DEBUG("sched", "%s queued: %u transfers, %" PRIu64 " bytes in flight", op->id,
		 eng->active_transfers, eng->inflight_bytes);
}

/* Start queued operations from the head while they fit. */
static void admit_queued(struct sc_engine *eng)
{
	struct sc_list *first;
	while ((first = sc_list_first(&eng->sched)) &&
	       slot_free(eng, sc_list_entry(first, struct sc_op, sched_node))) {
		struct sc_op *next = sc_list_entry(first, struct sc_op, sched_node);
		sc_list_remove(&next->sched_node);
		next->queued = false;
		if (next->status == SC_OPS_SCHEDULED)
			take_slot_and_start(eng, next);
		eng->sched_hooks.drop(eng, next);
	}
}

void sc_sched_remove(struct sc_engine *eng, struct sc_op *op)
{
	sc_sched_ungate(eng, op);
	if (!op->queued)
		return;
	sc_list_remove(&op->sched_node);
	op->queued = false;
	eng->sched_hooks.drop(eng, op);
	/* The removed operation may have been the head that did not fit: what waited behind it
	 * may fit now. */
	admit_queued(eng);
}

void sc_sched_release(struct sc_engine *eng, struct sc_op *op)
{
	if (!op->slot_held)
		return;
	op->slot_held = false;
	eng->active_transfers--;
	eng->inflight_bytes -= op->bytes_total;
	admit_queued(eng);
}

size_t sc_sched_queued(struct sc_engine *eng)
{
	size_t n = 0;
	const struct sc_list *pos;
	sc_list_foreach(pos, &eng->sched)
		n++;
	return n;
}

/* ---- progress records ------------------------------------------------------------------------ */

#define PROGRESS_KEY_LEN (1 + 32) /* "\0" + SHA-256 of a request id too long for the map */
_Static_assert(sizeof(((struct sc_progress *)0)->long_key) == PROGRESS_KEY_LEN, "long_key");

/* The map key of a request id: the id itself when it fits the map, else a NUL byte (never in an
 * id) and the id's SHA-256. Returns its length, 0 if hashing failed. */
static size_t progress_key(const char *request_id, unsigned char key[SC_IDMAP_KEY_MAX])
{
	size_t n = strlen(request_id);
	if (n <= SC_IDMAP_KEY_MAX) {
		memcpy(key, request_id, n);
		return n;
	}
	key[0] = '\0';
	if (EVP_Digest(request_id, n, key + 1, NULL, EVP_sha256(), NULL) != 1)
		return 0;
	return PROGRESS_KEY_LEN;
}

static struct sc_progress *progress_find(struct sc_engine *eng, const char *request_id)
{
	unsigned char key[SC_IDMAP_KEY_MAX];
	size_t klen = progress_key(request_id, key);
	return klen ? sc_idmap_get(eng->progress_ids, key, klen) : NULL;
}

static struct sc_progress *progress_new(struct sc_engine *eng, const char *request_id,
					struct sc_err *err)
{
	struct sc_progress *p = calloc(1, sizeof(*p));
	if (!p)
		goto oom;
	snprintf(p->request_id, sizeof(p->request_id), "%s", request_id);
	unsigned char key[SC_IDMAP_KEY_MAX];
	size_t klen = progress_key(request_id, key);
	if (klen == 0 || sc_idmap_put(eng->progress_ids, key, klen, p) != 0)
		goto oom;
	p->key_len = (uint8_t)klen;
	p->hashed = key[0] == '\0'; /* never the first byte of an id */
	if (p->hashed)
		memcpy(p->long_key, key, klen);
	sc_list_init(&p->waiters);
	sc_list_init(&p->node);
	eng->n_progress++;
	return p;
oom:
	free(p);
	sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory for the progress of request %s",
		   request_id);
	return NULL;
}

static void progress_free(struct sc_engine *eng, struct sc_progress *p)
{
	const void *key = p->hashed ? (const void *)p->long_key : (const void *)p->request_id;
	sc_idmap_del(eng->progress_ids, key, p->key_len);
	sc_list_remove(&p->node);
	eng->n_progress--;
	free(p);
}

/* Drop idle records past the grace (quietly: their requests are over), then, while more than
 * --max-progress-records exist, the oldest idle one (logged: an operation that still comes for it
 * will wait for its next report). Records some operation waits on stay. */
static void progress_trim(struct sc_engine *eng, uint64_t now)
{
	struct sc_list *first;
	while ((first = sc_list_first(&eng->progress_idle))) {
		struct sc_progress *p = sc_list_entry(first, struct sc_progress, node);
		if (now - p->idle_since_mono_ms < eng->cfg->progress_grace_ms)
			break;
		progress_free(eng, p);
	}
	while (eng->n_progress > eng->cfg->max_progress_records &&
	       (first = sc_list_first(&eng->progress_idle))) {
		struct sc_progress *p = sc_list_entry(first, struct sc_progress, node);
		SC_WARN_LIMITED("sched", "progress-records",
				"dropped the progress of request %s (iteration %" PRIu64
				", idle %" PRIu64 " ms): more than --max-progress-records %u "
				"request ids reported within --progress-grace; an operation that "
				"still requires it waits for its next ReportProgress (raise the "
				"flag if requests live that long)",
				p->request_id, p->iteration, now - p->idle_since_mono_ms,
				eng->cfg->max_progress_records);
		progress_free(eng, p);
	}
}

/* No operation waits on p any more: it ages on the idle list (a placeholder nobody reported is
 * worth nothing and goes at once). */
static void progress_idle(struct sc_engine *eng, struct sc_progress *p, uint64_t now)
{
	if (!sc_list_empty(&p->waiters))
		return;
	if (!p->reported) {
		progress_free(eng, p);
		return;
	}
	sc_list_remove(&p->node);
	p->idle_since_mono_ms = now;
	sc_list_insert_tail(&eng->progress_idle, &p->node);
}

static bool progress_meets(const struct sc_progress *p, const struct sc_requirement *req)
{
	if (!p->reported)
		return false;
	if (p->iteration != req->iteration)
		return p->iteration > req->iteration;
	if (p->iteration_complete)
		return true;
	return req->has_layer && p->has_layer && p->layer >= req->layer;
}

int sc_sched_gate(struct sc_engine *eng, struct sc_op *op, bool *waits, struct sc_err *err)
{
	*waits = false;
	if (!op->req.set)
		return 0;
	uint64_t now = sc_clock_mono_ms();
	progress_trim(eng, now);
	struct sc_progress *p = progress_find(eng, op->req.request_id);
	if (p && progress_meets(p, &op->req))
		return 0;
	if (!p && !(p = progress_new(eng, op->req.request_id, err)))
		return -1;
	sc_list_remove(&p->node); /* waited on: off the idle list */
	sc_list_insert_tail(&p->waiters, &op->gate_node);
	op->gate = p;
	op->waiting_requirement = true;
	*waits = true;
	return 0;
}

void sc_sched_ungate(struct sc_engine *eng, struct sc_op *op)
{
	op->waiting_requirement = false;
	struct sc_progress *p = op->gate;
	if (!p)
		return;
	op->gate = NULL;
	sc_list_remove(&op->gate_node);
	progress_idle(eng, p, sc_clock_mono_ms());
}

size_t sc_sched_progress_records(struct sc_engine *eng)
{
	progress_trim(eng, sc_clock_mono_ms());
	return eng->n_progress;
}

int sc_progress_report(struct sc_engine *eng, const char *request_id, uint64_t iteration,
		       bool has_layer, uint32_t layer, bool iteration_complete, uint32_t *released,
		       struct sc_err *err)
{
	if (!request_id || !request_id[0])
		return sc_err_set(err, SC_INVALID_ARGUMENT, "request_id is required");
	if (strlen(request_id) >= SC_NAME_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "request_id longer than %d bytes",
				  SC_NAME_MAX - 1);
	pthread_mutex_lock(&eng->mu);
	uint64_t now = sc_clock_mono_ms();
	struct sc_progress *p = progress_find(eng, request_id);
	if (!p) {
		p = progress_new(eng, request_id, err);
		if (!p) {
			pthread_mutex_unlock(&eng->mu);
			return -1;
		}
	} else if (p->reported && iteration < p->iteration) {
		uint64_t have = p->iteration;
		pthread_mutex_unlock(&eng->mu);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "iteration %" PRIu64 " is behind the reported %" PRIu64
				  " for request %s: progress only moves forward",
				  iteration, have, request_id);
	}
	if (!p->reported || iteration > p->iteration) {
		p->has_layer = false;
		p->iteration_complete = false;
	}
	p->reported = true;
	p->iteration = iteration;
	if (has_layer && (!p->has_layer || layer > p->layer)) {
		p->layer = layer;
		p->has_layer = true;
	}
	p->iteration_complete |= iteration_complete;

	/* Release the waiters it satisfies, first come first (each queues for a slot). They leave
	 * p->waiters for a list of our own first: starting one may end others. p itself stays (it
	 * has been reported, so losing its last waiter only moves it to the idle list). */
	struct sc_list met, *pos, *tmp;
	sc_list_init(&met);
	sc_list_foreach_safe(pos, tmp, &p->waiters) {
		struct sc_op *op = sc_list_entry(pos, struct sc_op, gate_node);
		if (op->status == SC_OPS_SCHEDULED && progress_meets(p, &op->req)) {
			sc_list_remove(pos);
			sc_list_insert_tail(&met, pos);
		}
	}
	uint32_t n = 0;
	while ((pos = sc_list_first(&met))) {
		sc_sched_admit(eng, sc_list_entry(pos, struct sc_op, gate_node)); /* unlinks it */
		n++;
	}
	progress_idle(eng, p, now); /* no waiter left: it ages from now */
	progress_trim(eng, now);
	pthread_mutex_unlock(&eng->mu);
	if (released)
		*released = n;
	return 0;
}

static void free_record(void *ctx, void *value)
{
	(void)ctx;
	free(value);
}

void sc_sched_free_progress(struct sc_engine *eng)
{
	/* At shutdown, after every operation is gone: the map holds every record, idle or not. */
	if (eng->progress_ids)
		sc_idmap_each(eng->progress_ids, free_record, NULL);
	sc_idmap_destroy(eng->progress_ids);
	eng->progress_ids = NULL;
	sc_list_init(&eng->progress_idle);
	eng->n_progress = 0;
}
