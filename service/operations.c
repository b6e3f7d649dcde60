/* SPDX-License-Identifier: Apache-2.0 */
/*
 * operations.c: the operation RPCs: CreateReadable/CreateWritable (passive), BeginRead/BeginWrite
 * (active), GetOperation, WaitOperation, WatchOperation, CancelOperation, ReleaseOperation,
 * ListOperations and ReportProgress.
 *
 * WaitOperation and WatchOperation answer later: they register an engine watcher (which runs on
 * whatever engine thread changes the operation) and, for Wait, a timer. Exactly one of watcher,
 * timer and client cancellation answers; an atomic flag in the shared waiter decides which.
 * Handlers start on gRPC worker threads.
 */
#include "handlers.h"
#include "paging.h"
#include "base/log.h"
#include "base/trace.h"
#include "meta/metadata.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reply_op(struct sc_call *c, const struct sc_op_info *info)
{
	struct sc_pb_op p;
	sc_pb_op_fill(&p, info);
	sc_call_reply(c, &p.msg.base);
	sc_pb_op_clear(&p);
}

static bool send_op(struct sc_call *c, const struct sc_op_info *info)
{
	struct sc_pb_op p;
	sc_pb_op_fill(&p, info);
	bool ok = sc_call_send(c, &p.msg.base);
	sc_pb_op_clear(&p);
	return ok;
}

/* Answer with the operation, or the error. Frees info. */
static void answer(struct sc_call *c, int rc, struct sc_op_info *info, const struct sc_err *err)
{
	if (rc != 0) {
		sc_call_fail_err(c, err);
		return;
	}
	reply_op(c, info);
	sc_op_info_free(info);
}

/* The request's plain descriptors then its descriptor sets, expanded (free *out); on failure the
 * call is answered and *err says why. */
static int desc_list(struct sc_call *c, RdmaSidecar__V1__Descriptor **plain, size_t n_plain,
		     RdmaSidecar__V1__DescriptorSet **sets, size_t n_sets, struct sc_desc **out,
		     size_t *n_out, struct sc_err *err)
{
	sc_err_clear(err);
	if (sc_pb_desc_list(plain, n_plain, sets, n_sets, sc_call_config(c)->max_descriptors, out,
			    n_out, err) == 0)
		return 0;
	sc_call_fail_err(c, err);
	return -1;
}

static const char bad_traceparent[] =
    "traceparent is not a W3C traceparent: expected \"00-<32 hex trace id>-<16 hex parent id>-"
    "<2 hex flags>\", neither id all zeros; leave it empty to start a new trace";

/*
 * The call's W3C trace id into out: the request's traceparent field (a malformed one is
 * INVALID_ARGUMENT: answered, -1), else the "traceparent" metadata header (a malformed header is
 * ignored, as W3C Trace Context asks), else "" (the engine starts a new trace where it needs one).
 */
static int call_trace_id(struct sc_call *c, const char *field, char out[SC_TRACE_ID_LEN])
{
	out[0] = '\0';
	if (field && field[0]) {
		if (sc_trace_id_from_traceparent(field, out))
			return 0;
		sc_call_fail(c, SC_INVALID_ARGUMENT, bad_traceparent);
		return -1;
	}
	char header[256];
	if (sc_call_header(c, "traceparent", header, sizeof(header)) &&
	    !sc_trace_id_from_traceparent(header, out))
		SC_DEBUG("grpc", "%s: ignored a malformed traceparent header", sc_call_method(c));
	return 0;
}

/*
 * A BeginRead/BeginWrite refused here, before it reaches the engine (a malformed traceparent,
 * a bad descriptor list, requirement or backend): logged at INFO like the engine's own refusals
 * (engine/op_active.c, same rate-limit keys: anyone holding metadata can cause them at will),
 * with the code, the metadata's key id and the caller's trace id where known.
 */
static void log_begin_refused(enum sc_op_kind kind, const char *metadata, const char *trace_id,
			      enum sc_status code, const char *msg)
{
	if (!sc_log_enabled(SC_LOG_INFO))
		return;
	char key_id[SC_KEY_ID_MAX] = "";
	if (metadata)
		sc_metadata_peek_key_id(metadata, key_id);
	struct sc_log_fields lf = {
	    .code = sc_status_name(code),
	    .key_id = key_id[0] ? key_id : NULL,
	    .trace_id = trace_id && sc_trace_id_valid(trace_id) ? trace_id : NULL,
	};
	const char *what = kind == SC_OP_READ ? "BeginRead" : "BeginWrite";
	sc_log_kv_limited(SC_LOG_INFO, "op",
			  kind == SC_OP_READ ? "begin-read-refused" : "begin-write-refused", &lf,
			  "%s refused (%s): %s", what, sc_status_name(code), msg);
}

static void create_passive(struct sc_call *c, ProtobufCMessage *req, enum sc_op_kind kind)
{
	RdmaSidecar__V1__CreatePassiveRequest *r = (RdmaSidecar__V1__CreatePassiveRequest *)req;
	struct sc_err err;
	sc_err_clear(&err);
	char trace_id[SC_TRACE_ID_LEN];
	if (call_trace_id(c, r->traceparent, trace_id) != 0)
		return;
	struct sc_desc *descs;
	size_t n_descs;
	if (desc_list(c, r->descriptors, r->n_descriptors, r->descriptor_sets, r->n_descriptor_sets,
		      &descs, &n_descs, &err) != 0)
		return;
	struct sc_passive_req pr = {
		.descs = descs,
		.n_descs = n_descs,
		.timeout_ms = r->timeout_ms,
		.audience = r->audience,
		.max_uses = r->max_uses,
		.any_uses = r->any_uses,
		.request_id = r->request_id,
		.trace_id = trace_id,
		.omit_descs = r->n_descriptor_sets > 0,
	};
	struct sc_op_info info;
	int rc = sc_op_create_passive(sc_call_engine(c), kind, &pr, &info, &err);
	free(descs);
	answer(c, rc, &info, &err);
}

void sc_h_create_readable(struct sc_call *c, ProtobufCMessage *req)
{
	create_passive(c, req, SC_OP_READABLE);
}

void sc_h_create_writable(struct sc_call *c, ProtobufCMessage *req)
{
	create_passive(c, req, SC_OP_WRITABLE);
}

/* What a waiter answers: WaitOperation (the state at the end or at the timeout), WatchOperation
 * (every change, streamed), or CancelOperation's bounded wait (a timeout answered
 * FAILED_PRECONDITION, saying why). */
enum wait_mode { WAIT_ONCE, WAIT_STREAM, WAIT_CANCEL };

static void wait_or_watch(struct sc_call *c, const char *op_id, uint64_t timeout_ms,
			  enum wait_mode mode);
static void cancel_not_yet(struct sc_call *c, const struct sc_op_info *info);

static void begin(struct sc_call *c, ProtobufCMessage *req, enum sc_op_kind kind)
{
	RdmaSidecar__V1__BeginTransferRequest *r = (RdmaSidecar__V1__BeginTransferRequest *)req;
	sc_trace_call_in();
	struct sc_err err;
	sc_err_clear(&err);
	char trace_id[SC_TRACE_ID_LEN];
	if (call_trace_id(c, r->traceparent, trace_id) != 0) {
		log_begin_refused(kind, r->metadata, NULL, SC_INVALID_ARGUMENT, bad_traceparent);
		return;
	}
	struct sc_desc *descs;
	size_t n_descs;
	if (desc_list(c, r->descriptors, r->n_descriptors, r->descriptor_sets, r->n_descriptor_sets,
		      &descs, &n_descs, &err) != 0) {
		log_begin_refused(kind, r->metadata, trace_id, err.code, err.msg);
		return;
	}
	struct sc_active_req ar = {
		.metadata = r->metadata,
		.descs = descs,
		.n_descs = n_descs,
		.timeout_ms = r->timeout_ms,
		.backend = (enum sc_backend_kind)r->backend,
		.request_id = r->request_id,
		.trace_id = trace_id,
		.omit_descs = r->n_descriptor_sets > 0,
	};
	if (r->requirement) {
		const char *rid = r->requirement->request_id ? r->requirement->request_id : "";
		if (!rid[0] || strlen(rid) >= sizeof(ar.requirement.request_id)) {
			static const char msg[] =
			    "requirement.request_id must be 1..127 characters";
			free(descs);
			sc_call_fail(c, SC_INVALID_ARGUMENT, msg);
			log_begin_refused(kind, r->metadata, trace_id, SC_INVALID_ARGUMENT, msg);
			return;
		}
		ar.requirement.set = true;
		strcpy(ar.requirement.request_id, rid);
		ar.requirement.iteration = r->requirement->iteration;
		ar.requirement.has_layer = r->requirement->has_layer;
		ar.requirement.layer = r->requirement->layer;
	}
	if (r->backend > RDMA_SIDECAR__V1__BACKEND__BACKEND_LIBFABRIC) {
		char msg[96];
		snprintf(msg, sizeof(msg), "unknown backend value %d", (int)r->backend);
		free(descs);
		sc_call_fail(c, SC_INVALID_ARGUMENT, msg);
		log_begin_refused(kind, r->metadata, trace_id, SC_INVALID_ARGUMENT, msg);
		return;
	}
	struct sc_op_info info;
	/* A small transfer on a warm connection may run on this thread once it has answered (or, for
	 * a call that waits, before it waits): no hand-off to a worker thread and back. */
	struct sc_run_here here = {0};
	ar.here = &here;
	int rc = sc_op_begin(sc_call_engine(c), kind, &ar, &info, &err);
	free(descs);
	if (rc != 0 || !r->wait || sc_op_status_terminal(info.status)) {
		answer(c, rc, &info, &err);
		sc_op_run_here(&here);
		return;
	}
	/* One call to the end. A small transfer parked for this thread runs now, before any waiter
	 * exists: when it ends here the answer needs no watch, no timer and no hand-off. */
	char id[SC_ID_MAX];
	memcpy(id, info.id, sizeof(id));
	sc_op_run_here(&here);
	sc_op_info_free(&info);
	if (sc_op_get(sc_call_engine(c), id, &info, &err) != 0) {
		sc_call_fail_err(c, &err); /* released meanwhile by another call */
		return;
	}
	if (sc_op_status_terminal(info.status)) {
		answer(c, 0, &info, &err);
		return;
	}
	/* The operation's own deadline ends it, so waiting until then (plus a second for the
	 * verdict to arrive) always sees a terminal state unless the client's gRPC deadline is
	 * shorter. */
	uint64_t now = sc_now_unix_ms();
	uint64_t left = info.deadline_unix_ms > now ? info.deadline_unix_ms - now : 0;
	sc_op_info_free(&info);
	wait_or_watch(c, id, left + 1000, WAIT_ONCE);
}

void sc_h_begin_read(struct sc_call *c, ProtobufCMessage *req)
{
	begin(c, req, SC_OP_READ);
}

void sc_h_begin_write(struct sc_call *c, ProtobufCMessage *req)
{
	begin(c, req, SC_OP_WRITE);
}

void sc_h_get_operation(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__GetOperationRequest *r = (RdmaSidecar__V1__GetOperationRequest *)req;
	struct sc_err err;
	struct sc_op_info info;
	sc_err_clear(&err);
	int rc = sc_op_get(sc_call_engine(c), r->operation_id, &info, &err);
	answer(c, rc, &info, &err);
}

void sc_h_cancel_operation(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__CancelOperationRequest *r = (RdmaSidecar__V1__CancelOperationRequest *)req;
	struct sc_err err;
	struct sc_op_info info;
	sc_err_clear(&err);
	int rc = sc_op_cancel(sc_call_engine(c), r->operation_id, &info, &err);
	if (rc != 0 || sc_op_status_terminal(info.status)) {
		answer(c, rc, &info, &err);
		return;
	}
	/* An active operation whose transfer is in flight ends once its backend has stopped
	 * touching the worker's memory: answer then, so CANCELLED means the memory is quiet (a
	 * committed transfer too: its streams are cut; its peer may still report COMPLETE). Wait
	 * at most --cancel-wait (backends stop well within it), then answer FAILED_PRECONDITION
	 * saying how it ends. */
	if (sc_call_config(c)->cancel_wait_ms == 0) {
		cancel_not_yet(c, &info);
		sc_op_info_free(&info);
		return;
	}
	char id[SC_ID_MAX];
	memcpy(id, info.id, sizeof(id));
	sc_op_info_free(&info);
	wait_or_watch(c, id, sc_call_config(c)->cancel_wait_ms, WAIT_CANCEL);
}

void sc_h_release_operation(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__ReleaseOperationRequest *r =
		(RdmaSidecar__V1__ReleaseOperationRequest *)req;
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_op_release(sc_call_engine(c), r->operation_id, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__ReleaseOperationResponse m = RDMA_SIDECAR__V1__RELEASE_OPERATION_RESPONSE__INIT;
	sc_call_reply(c, &m.base);
}

void sc_h_list_operations(struct sc_call *c, ProtobufCMessage *req)
{
	const RdmaSidecar__V1__ListOperationsRequest *r = (const void *)req;
	struct sc_op_info *infos = NULL;
	size_t n = 0;
	bool more = false;
	char none[1] = "";
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_page_token_check(r->page_token, &err) != 0 ||
	    sc_op_list_page(sc_call_engine(c), r->page_token, sc_page_size(r->page_size), &infos, &n,
			    &more, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	struct sc_pb_op *ops = calloc(n ? n : 1, sizeof(*ops));
	RdmaSidecar__V1__Operation **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	if (!ops || !ptrs) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
	} else {
		for (size_t i = 0; i < n; i++) {
			sc_pb_op_fill(&ops[i], &infos[i]);
			ptrs[i] = &ops[i].msg;
		}
		RdmaSidecar__V1__ListOperationsResponse m =
			RDMA_SIDECAR__V1__LIST_OPERATIONS_RESPONSE__INIT;
		m.n_operations = n;
		m.operations = ptrs;
		m.next_page_token = more && n ? infos[n - 1].id : none;
		sc_call_reply(c, &m.base);
		for (size_t i = 0; i < n; i++)
			sc_pb_op_clear(&ops[i]);
	}
	for (size_t i = 0; i < n; i++)
		sc_op_info_free(&infos[i]);
	free(infos);
	free(ops);
	free(ptrs);
}

void sc_h_report_progress(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__ReportProgressRequest *r = (RdmaSidecar__V1__ReportProgressRequest *)req;
	struct sc_err err;
	sc_err_clear(&err);
	uint32_t released = 0;
	if (sc_progress_report(sc_call_engine(c), r->request_id, r->iteration, r->has_layer,
			       r->layer, r->iteration_complete, &released, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__ReportProgressResponse m = RDMA_SIDECAR__V1__REPORT_PROGRESS_RESPONSE__INIT;
	m.released = released;
	sc_call_reply(c, &m.base);
}

/* ---- WaitOperation and WatchOperation -------------------------------------------------------- */

/* One Wait or Watch call's state. Owned by the call (sc_call_set_state): freed with the call's
 * state when its last reference goes, never before, so the cancel hook, which runs while the call
 * lives, always finds it. The engine watch and the timeout timer each hold a reference to the
 * *call* (not to the waiter) and drop it when they end; after dropping one, do not touch w. */
struct waiter {
	atomic_bool done; /* the call has been (or is being) answered */
	struct sc_call *call;
	struct sc_engine *eng;
	char op_id[SC_ID_MAX];
	uint64_t watch_id;
	/* The timer holds a call reference; whoever removes the timer (or the timer callback, when
	 * it runs) drops it. Atomic: the watcher reads it while the handler may still store it. */
	atomic_uint_fast64_t timer_id;
	enum wait_mode mode;
};

/* Drop the call reference that the watch or the timer held; may free w. */
static void waiter_release(struct waiter *w)
{
	sc_call_unref(w->call);
}

/* Remove the timeout timer if it is still pending and drop its reference. Non-blocking. */
static void waiter_drop_timer(struct waiter *w)
{
	uint64_t id = atomic_load(&w->timer_id);
	if (id && sc_engine_timer_try_cancel(w->eng, id))
		waiter_release(w);
}

/* Claim the right to answer; true for exactly one caller. */
static bool waiter_claim(struct waiter *w)
{
	return !atomic_exchange(&w->done, true);
}

/* Engine watcher: runs under the engine lock; must not call into the engine. */
static bool waiter_on_change(void *ctx, const struct sc_op_info *info)
{
	struct waiter *w = ctx;
	bool terminal = sc_op_status_terminal(info->status);
	if (w->mode == WAIT_STREAM) {
		if (atomic_load(&w->done))
			return false;
		send_op(w->call, info);
		if (terminal && waiter_claim(w)) {
			sc_call_finish(w->call, SC_OK, NULL);
			waiter_release(w); /* the watch's reference: the watch ends with terminal */
		}
		return !terminal;
	}
	if (!terminal)
		return true;
	if (waiter_claim(w)) {
		reply_op(w->call, info);
		sc_trace_mark(sc_trace_current(), "grpc_reply_queued");
		/* Free the call now rather than when the timeout would have fired. */
		waiter_drop_timer(w);
	}
	waiter_release(w); /* the watch's reference */
	return false;
}

/* CancelOperation's answer when the operation is still not terminal after --cancel-wait: the
 * cancel stays under way; say how it ends. */
static void cancel_not_yet(struct sc_call *c, const struct sc_op_info *info)
{
	uint64_t now = sc_now_unix_ms();
	uint64_t left = info->deadline_unix_ms > now ? info->deadline_unix_ms - now : 0;
	struct sc_err err;
	sc_err_set(&err, SC_FAILED_PRECONDITION,
		   "operation %s is being cancelled but its transfer (%s) has not stopped touching "
		   "the worker's memory yet; it ends CANCELLED (or ERRORED) by its deadline at the "
		   "latest (unix ms %" PRIu64 ", in %" PRIu64
		   " ms): WaitOperation tells when the memory is quiet",
		   info->id, sc_backend_name(info->backend), info->deadline_unix_ms, left);
	sc_call_fail_err(c, &err);
}

/* WaitOperation's timeout: answer with the current, unchanged state. Timer thread. */
static void waiter_on_timeout(void *ctx)
{
	struct waiter *w = ctx;
	if (waiter_claim(w)) {
		if (sc_op_unwatch(w->eng, w->watch_id))
			waiter_release(w); /* removed the watch before it answered */
		struct sc_op_info info;
		struct sc_err err;
		sc_err_clear(&err);
		int rc = sc_op_get(w->eng, w->op_id, &info, &err);
		if (rc == 0 && w->mode == WAIT_CANCEL && !sc_op_status_terminal(info.status)) {
			cancel_not_yet(w->call, &info);
			sc_op_info_free(&info);
		} else {
			answer(w->call, rc, &info, &err);
		}
	}
	waiter_release(w); /* the timer's reference */
}

/* The client went away (or its deadline passed, or the server is stopping). Worker thread; the
 * call (and so w, its state) is alive here: the close watch holds a reference. */
static void waiter_on_cancel(struct sc_call *c)
{
	struct waiter *w = sc_call_state(c);
	if (!waiter_claim(w))
		return;
	/* Read what we need before the releases: each may drop the call, and w with it. */
	struct sc_engine *eng = w->eng;
	uint64_t timer = atomic_load(&w->timer_id);
	sc_call_ref(c); /* keep the call (and w) until it is finished below */
	if (sc_op_unwatch(eng, w->watch_id))
		waiter_release(w);
	if (timer && sc_engine_timer_cancel(eng, timer))
		waiter_release(w);
	sc_call_finish(c, SC_CANCELLED, "cancelled by the client");
	sc_call_unref(c);
}

static void waiter_free(void *p)
{
	free(p);
}

/* Runs with the arrival's reference to c held, so w (c's state) lives through this function. */
static void wait_or_watch(struct sc_call *c, const char *op_id, uint64_t timeout_ms,
			  enum wait_mode mode)
{
	bool stream = mode == WAIT_STREAM;
	struct sc_engine *eng = sc_call_engine(c);
	if (!op_id || strlen(op_id) >= SC_ID_MAX) {
		sc_call_fail(c, SC_NOT_FOUND, "no such operation");
		return;
	}
	struct waiter *w = calloc(1, sizeof(*w));
	if (!w) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	strcpy(w->op_id, op_id);
	w->call = c;
	w->eng = eng;
	w->mode = mode;
	sc_call_set_state(c, w, waiter_free);

	struct sc_op_info first;
	struct sc_err err;
	sc_err_clear(&err);
	sc_call_ref(c); /* the watch's */
	if (sc_op_watch(eng, op_id, waiter_on_change, w, &w->watch_id, &first, &err) != 0) {
		atomic_store(&w->done, true);
		sc_call_fail_err(c, &err);
		waiter_release(w); /* no watch exists (not the last reference: the arrival's is held) */
		return;
	}
	bool terminal = sc_op_status_terminal(first.status);
	if (terminal)
		waiter_release(w); /* the watch ended at once */

	if (stream) {
		send_op(c, &first);
		if (terminal && waiter_claim(w))
			sc_call_finish(c, SC_OK, NULL);
	} else if (terminal || timeout_ms == 0 || sc_call_deadline_left_ms(c) == 0) {
		if (waiter_claim(w)) {
			if (!terminal && sc_op_unwatch(eng, w->watch_id))
				waiter_release(w);
			reply_op(c, &first);
		}
	} else {
		/* Both may be huge (UINT64_MAX: no client deadline); the timer saturates the sum. */
		uint64_t left = sc_call_deadline_left_ms(c);
		uint64_t wait = timeout_ms < left ? timeout_ms : left;
		sc_call_ref(c); /* the timer's */
		uint64_t timer = sc_engine_timer_add(eng, wait, waiter_on_timeout, w);
		atomic_store(&w->timer_id, timer);
		if (!timer)
			waiter_release(w);
		else if (atomic_load(&w->done))
			waiter_drop_timer(w); /* answered while the timer was being armed */
	}
	sc_op_info_free(&first);
	if (!atomic_load(&w->done))
		sc_call_on_cancel(c, waiter_on_cancel);
}

void sc_h_wait_operation(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__WaitOperationRequest *r = (RdmaSidecar__V1__WaitOperationRequest *)req;
	wait_or_watch(c, r->operation_id, r->timeout_ms, WAIT_ONCE);
}

void sc_h_watch_operation(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__WatchOperationRequest *r = (RdmaSidecar__V1__WatchOperationRequest *)req;
	wait_or_watch(c, r->operation_id, 0, WAIT_STREAM);
}
