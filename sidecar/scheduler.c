/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scheduler.c: transfer slots and progress gates (DESIGN section 7, dynamo-llm's connector
 * protocol). An active operation moves bytes only while it holds a slot: at most
 * --max-concurrent-transfers at once and at most --max-inflight-bytes in flight (a transfer larger
 * than the whole budget runs alone). Operations gated on worker progress (a requirement) wait until
 * ReportProgress satisfies it, then queue for a slot in FIFO order. Every slot taken is given back
 * exactly once (sc_sched_release, from the transfer's completion). Whatever frees room (a slot
 * given back, or a queued operation leaving the queue: cancelled, past its deadline) admits the
 * queue's head while it fits: strictly FIFO, a head that does not fit holds the ones behind it.
 * Runs under eng->mu on whatever thread drives the change (RPC handlers, backend completions, the
 * timer thread).
 */
#include "engine_internal.h"
#include "log.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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
	sc_op_start_transfer(eng, op);
}

void sc_sched_admit(struct sc_engine *eng, struct sc_op *op)
{
	op->waiting_requirement = false;
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
		sc_op_unref(eng, next);
	}
}

void sc_sched_remove(struct sc_engine *eng, struct sc_op *op)
{
	op->waiting_requirement = false;
	if (!op->queued)
		return;
	sc_list_remove(&op->sched_node);
	op->queued = false;
	sc_op_unref(eng, op);
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

static struct sc_progress *progress_find(struct sc_engine *eng, const char *request_id)
{
	struct sc_list *pos;
	sc_list_foreach(pos, &eng->progress) {
		struct sc_progress *p = sc_list_entry(pos, struct sc_progress, node);
		if (strcmp(p->request_id, request_id) == 0)
			return p;
	}
	return NULL;
}

size_t sc_sched_queued(struct sc_engine *eng)
{
	size_t n = 0;
	const struct sc_list *pos;
	sc_list_foreach(pos, &eng->sched)
		n++;
	return n;
}

bool sc_sched_requirement_met(struct sc_engine *eng, const struct sc_requirement *req)
{
	if (!req->set)
		return true;
	const struct sc_progress *p = progress_find(eng, req->request_id);
	if (!p)
		return false;
	if (p->iteration != req->iteration)
		return p->iteration > req->iteration;
	if (p->iteration_complete)
		return true;
	return req->has_layer && p->has_layer && p->layer >= req->layer;
}

struct release_ctx {
	struct sc_engine *eng;
	struct sc_op **ops;
	size_t n, cap;
};

static void collect_waiting(void *ctx, void *value)
{
	struct release_ctx *c = ctx;
	struct sc_op *op = value;
	if (op->waiting_requirement && op->status == SC_OPS_SCHEDULED && c->n < c->cap &&
	    sc_sched_requirement_met(c->eng, &op->req))
		c->ops[c->n++] = op;
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
	struct sc_progress *p = progress_find(eng, request_id);
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			pthread_mutex_unlock(&eng->mu);
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		}
		strcpy(p->request_id, request_id);
		sc_list_insert_head(&eng->progress, &p->node);
	} else if (iteration < p->iteration) {
		uint64_t have = p->iteration;
		pthread_mutex_unlock(&eng->mu);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "iteration %" PRIu64 " is behind the reported %" PRIu64
				  " for request %s: progress only moves forward",
				  iteration, have, request_id);
	}
	if (iteration > p->iteration) {
		p->has_layer = false;
		p->iteration_complete = false;
	}
	p->iteration = iteration;
	if (has_layer && (!p->has_layer || layer > p->layer)) {
		p->layer = layer;
		p->has_layer = true;
	}
	p->iteration_complete |= iteration_complete;

	size_t count = sc_idmap_count(eng->ops);
	struct release_ctx c = {eng, calloc(count ? count : 1, sizeof(struct sc_op *)), 0, count};
	uint32_t n = 0;
	if (c.ops) {
		sc_idmap_each(eng->ops, collect_waiting, &c);
		for (size_t i = 0; i < c.n; i++) {
			sc_sched_admit(eng, c.ops[i]);
			n++;
		}
		free(c.ops);
	}
	pthread_mutex_unlock(&eng->mu);
	if (released)
		*released = n;
	return 0;
}

void sc_sched_free_progress(struct sc_engine *eng)
{
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &eng->progress) {
		sc_list_remove(pos);
		free(sc_list_entry(pos, struct sc_progress, node));
	}
}
