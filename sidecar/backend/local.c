/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/local.c: the LOCAL backend, for transfers whose two ends live on this same sidecar:
 * memory to memory, no socket. It goes through the same passive-operation interface as a remote
 * peer (open, span, done; backend/passive.h, handed in with its sc_backend_env), so a local
 * transfer obeys the same token, bounds, uses and deadline rules.
 * One worker thread takes submitted transfers from a FIFO and copies in slices, checking cancel
 * and deadline between slices. Owns the queue and the thread.
 */
#include "backend/backend.h"
#include "os/fault_guard.h"
#include "gpu/gpu.h"
#include "base/list.h"
#include "base/log.h"
#include "backend/passive.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLICE_BYTES (8u << 20)

struct local_job {
	struct sc_xfer *x;
	struct sc_list node; /* on lb->queue */
};

struct local_backend {
	struct sc_backend base;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t thread;
	bool running;
	bool stop;
	struct sc_list queue; /* struct local_job, first in first out */
};

static struct local_backend *to_local(struct sc_backend *b)
{
	return container_of(b, struct local_backend, base);
}

/* Move one transfer; returns its final status, with msg filled on failure. */
static enum sc_status run_one(const struct sc_backend_env *env, struct sc_xfer *x, char *msg,
			      size_t cap)
{
	const struct sc_passive *pv = &env->passive;
	struct sc_gpu *gpu = env->gpu;
	struct sc_err err;
	sc_err_clear(&err);
	const uint8_t *token = x->meta->token;
	if (sc_passive_open(pv, token, x->xfer_id, x->kind, env->self_id, x->total, x->trace_id,
			    &err) != 0)
		goto fail;
	for (size_t i = 0; i < x->n_segs; i++) {
		const struct sc_xfer_seg *s = &x->segs[i];
		for (uint64_t off = 0; off < s->len;) {
			if (atomic_load(&x->cancel_requested)) {
				sc_err_set(&err, SC_CANCELLED, "transfer cancelled");
				goto fail_done;
			}
			if (sc_clock_mono_ms() >= x->deadline_mono_ms) {
				sc_err_set(&err, SC_DEADLINE_EXCEEDED, "transfer deadline passed");
				goto fail_done;
			}
			uint64_t n = s->len - off < SLICE_BYTES ? s->len - off : SLICE_BYTES;
			struct sc_span span;
			if (sc_passive_span(pv, token, x->xfer_id, x->kind, s->remote_desc, off, n, &span,
					    &err) != 0)
				goto fail_done;
			/* GPU ranges: device to device, across GPUs, or between host and GPU by the
			 * CUDA driver; host to host: memcpy. */
			int rc = x->kind == SC_OP_READ
					 ? sc_gpu_copy(gpu, s->local + off, s->local_gpu, span.addr,
						       span.gpu, n, &err)
					 : sc_gpu_copy(gpu, span.addr, span.gpu, s->local + off,
						       s->local_gpu, n, &err);
			sc_passive_span_release(pv, &span, rc == 0 ? n : 0);
			if (rc != 0)
				goto fail_done;
			x->on_progress(x, n);
			off += n;
		}
	}
	if (sc_passive_done(pv, token, x->xfer_id, SC_OK, NULL, &err) != 0)
		goto fail;
	return SC_OK;
fail_done:
	sc_passive_done(pv, token, x->xfer_id, err.code, err.msg, NULL);
fail:
	snprintf(msg, cap, "%s", err.msg);
	return err.code;
}

static void *local_main(void *arg)
{
	struct local_backend *lb = arg;
	pthread_mutex_lock(&lb->mu);
	for (;;) {
		while (sc_list_empty(&lb->queue) && !lb->stop)
			pthread_cond_wait(&lb->cv, &lb->mu);
		struct sc_list *first = sc_list_first(&lb->queue);
		if (!first)
			break; /* stop requested and nothing left */
		sc_list_remove(first);
		struct local_job *j = sc_list_entry(first, struct local_job, node);
		pthread_mutex_unlock(&lb->mu);
		char msg[SC_ERR_MSG_MAX] = "";
		enum sc_status st = run_one(&lb->base.env, j->x, msg, sizeof(msg));
		j->x->on_complete(j->x, st, msg);
		free(j);
		pthread_mutex_lock(&lb->mu);
	}
	pthread_mutex_unlock(&lb->mu);
	return NULL;
}

static int local_start(struct sc_backend *b, struct sc_err *err)
{
	struct local_backend *lb = to_local(b);
	if (pthread_create(&lb->thread, NULL, local_main, lb) != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot start the local backend thread");
	pthread_setname_np(lb->thread, "sc-local");
	lb->running = true;
	return 0;
}

static void local_stop(struct sc_backend *b)
{
	struct local_backend *lb = to_local(b);
	pthread_mutex_lock(&lb->mu);
	lb->stop = true;
	struct sc_list *pos;
	sc_list_foreach(pos, &lb->queue)
		atomic_store(&sc_list_entry(pos, struct local_job, node)->x->cancel_requested, true);
	pthread_cond_broadcast(&lb->cv);
	pthread_mutex_unlock(&lb->mu);
	if (lb->running)
		pthread_join(lb->thread, NULL);
	lb->running = false;
}

static void local_destroy(struct sc_backend *b)
{
	struct local_backend *lb = to_local(b);
	local_stop(b);
	pthread_cond_destroy(&lb->cv);
	pthread_mutex_destroy(&lb->mu);
	free(lb);
}

static int local_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	struct local_backend *lb = to_local(b);
	struct local_job *j = calloc(1, sizeof(*j));
	if (!j)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	j->x = x;
	pthread_mutex_lock(&lb->mu);
	if (lb->stop || !lb->running) {
		pthread_mutex_unlock(&lb->mu);
		free(j);
		return sc_err_set(err, SC_UNAVAILABLE, "local backend is stopped");
	}
	sc_list_insert_tail(&lb->queue, &j->node);
	pthread_cond_signal(&lb->cv);
	pthread_mutex_unlock(&lb->mu);
	return 0;
}

static void local_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	atomic_store(&x->cancel_requested, true);
}

/* Same-sidecar transfers: a peer that is this sidecar may copy on the token alone. */
static void local_advertise(struct sc_backend *b, struct sc_metadata *md)
{
	md->backends |= SC_BACKEND_BIT_LOCAL;
}

static const struct sc_backend_ops local_ops = {
	.kind = SC_BACKEND_LOCAL, /* name, level and the ops left out: engine/backend_registry.c */
	.start = local_start,
	.stop = local_stop,
	.destroy = local_destroy,
	.submit = local_submit,
	.cancel = local_cancel,
	.advertise = local_advertise,
};

struct sc_backend *sc_backend_local_create(const struct sc_backend_env *env)
{
	struct local_backend *lb = calloc(1, sizeof(*lb));
	if (!lb)
		return NULL;
	lb->base.ops = &local_ops;
	lb->base.env = *env;
	lb->base.available = true;
	snprintf(lb->base.detail, sizeof(lb->base.detail), "memory to memory inside this sidecar");
	pthread_mutex_init(&lb->mu, NULL);
	pthread_cond_init(&lb->cv, NULL);
	sc_list_init(&lb->queue);
	return &lb->base;
}
