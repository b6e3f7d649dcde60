/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.c: one server-side call: batches, sends, receives, answers (the API of call.h).
 *
 * Answers go out as batches, one send in flight per call (streams queue; a unary answer's message
 * and status leave in one batch), each batch holding a call reference until it completes, so a
 * call lives until its last batch is done. A RECV_CLOSE_ON_SERVER batch learns of cancellation and
 * runs the handler's on_cancel once; client streams read one message per sc_call_recv. Batches
 * start under the service's batch lock, so none starts on a queue that is closing.
 *
 * Threads: completions run on the completion-queue workers; handlers, engine/NATS/timer threads
 * answer on calls they hold a reference to (every sc_call_* is thread-safe, under the call's mu).
 * Owns each call's send queue, received buffers and handler state. Also the accessors handlers
 * use for the service (engine, config, health, listeners). Each call that arrived is counted for
 * the metrics when its last reference goes, with the status the client saw and the time since
 * arrival (the engine's grpc_server_* families).
 */
#include "internal.h"
#include "base/log.h"
#include "base/trace.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

#include <stdlib.h>
#include <string.h>

static grpc_byte_buffer *pack(const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	grpc_slice s = grpc_slice_malloc(len);
	protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
	grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	return bb;
}

ProtobufCMessage *sc_call_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb)
{
	grpc_byte_buffer_reader reader;
	if (!grpc_byte_buffer_reader_init(&reader, bb))
		return NULL;
	grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
	grpc_byte_buffer_reader_destroy(&reader);
	ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s),
							GRPC_SLICE_START_PTR(s));
	grpc_slice_unref(s);
	return m;
}

struct sc_engine *sc_call_engine(struct sc_call *c)
{
	return c->svc->eng;
}

struct sc_service *sc_call_service(struct sc_call *c)
{
	return c->svc;
}

const struct sc_config *sc_call_config(struct sc_call *c)
{
	return c->svc->cfg;
}

struct sc_health *sc_service_health(struct sc_service *svc)
{
	return svc->health;
}

size_t sc_service_listeners(struct sc_service *svc, const char ***out)
{
	*out = svc->listener_view;
	return svc->n_listeners;
}

bool sc_call_header(const struct sc_call *c, const char *key, char *out, size_t cap)
{
	for (size_t i = 0; i < c->req_md.count; i++) {
		const grpc_metadata *md = &c->req_md.metadata[i];
		if (grpc_slice_str_cmp(md->key, key) != 0)
			continue;
		size_t n = GRPC_SLICE_LENGTH(md->value);
		if (n >= cap)
			n = cap - 1;
		memcpy(out, GRPC_SLICE_START_PTR(md->value), n);
		out[n] = '\0';
		return true;
	}
	if (cap)
		out[0] = '\0';
	return false;
}

const char *sc_call_method(struct sc_call *c)
{
	return c->method ? c->method->path : "(unknown)";
}

bool sc_call_is_cancelled(struct sc_call *c)
{
	return atomic_load(&c->cancelled);
}

uint64_t sc_call_deadline_left_ms(struct sc_call *c)
{
	gpr_timespec d = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
	if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0)
		return UINT64_MAX;
	gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
	if (gpr_time_cmp(d, now) <= 0)
		return 0;
	gpr_timespec left = gpr_time_sub(d, now);
	return (uint64_t)left.tv_sec * 1000u + (uint64_t)left.tv_nsec / 1000000u;
}

void sc_call_set_state(struct sc_call *c, void *state, void (*free_fn)(void *state))
{
	c->state = state;
	c->state_free = free_fn;
}

void *sc_call_state(struct sc_call *c)
{
	return c->state;
}

void sc_call_on_cancel(struct sc_call *c, void (*fn)(struct sc_call *c))
{
	pthread_mutex_lock(&c->mu);
	c->cancel_fn = fn;
	bool fire = atomic_load(&c->cancelled) && !c->cancel_fired && fn;
	if (fire)
		c->cancel_fired = true;
	pthread_mutex_unlock(&c->mu);
	if (fire)
		fn(c);
}

void sc_call_on_drained(struct sc_call *c, void (*fn)(struct sc_call *c))
{
	c->drained_fn = fn;
}

/* ---- lifetime -------------------------------------------------------------------------------- */

void sc_call_ref(struct sc_call *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void sc_call_arrived(struct sc_call *c, size_t method_index)
{
	c->method_index = method_index;
	c->arrived_ns = sc_engine_clock_ns();
	sc_engine_grpc_call_started(c->svc->eng, method_index);
}

/* The call is over (its last reference went): the status the client saw (CANCELLED when it left
 * or the status could not be sent) and how long since arrival. */
static void count_handled(struct sc_call *c)
{
	enum sc_status code = c->final_code;
	if (atomic_load(&c->cancelled) || c->cancelled_flag || !c->answered)
		code = SC_CANCELLED;
	sc_engine_grpc_call_done(c->svc->eng, c->method_index, code,
				 sc_engine_clock_ns() - c->arrived_ns);
}

void sc_call_unref(struct sc_call *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->arrived_ns && !atomic_load(&c->svc->calls_uncounted))
		count_handled(c);
	if (c->state_free)
		c->state_free(c->state);
	while (c->q_head) {
		struct out_msg *m = c->q_head;
		c->q_head = m->next;
		if (m->bb)
			grpc_byte_buffer_destroy(m->bb);
		free(m);
	}
	if (c->have_details)
		grpc_slice_unref(c->final_details);
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->recv_bb)
		grpc_byte_buffer_destroy(c->recv_bb);
	grpc_metadata_array_destroy(&c->req_md);
	if (!c->method)
		grpc_call_details_destroy(&c->details);
	if (c->call)
		grpc_call_unref(c->call);
	pthread_mutex_destroy(&c->mu);
	atomic_fetch_sub(&c->svc->live_calls, 1);
	free(c);
}

/* ---- sending --------------------------------------------------------------------------------- */

/* grpc_call_start_batch unless the queue is closing; GRPC_CALL_ERROR otherwise. */
static grpc_call_error start_batch(struct sc_call *c, const grpc_op *ops, size_t n, struct tag *t)
{
	struct sc_service *svc = c->svc;
	pthread_rwlock_rdlock(&svc->batch_lock);
	grpc_call_error e = svc->cq_closed ? GRPC_CALL_ERROR
					   : grpc_call_start_batch(c->call, ops, n, t, NULL);
	pthread_rwlock_unlock(&svc->batch_lock);
	return e;
}

static void on_send_done(struct tag *t, bool ok);

/* Start the next send batch if none is in flight. Caller holds c->mu. */
static void pump_locked(struct sc_call *c)
{
	if (c->send_in_flight || !c->q_head)
		return;
	struct out_msg *m = c->q_head;
	c->q_head = m->next;
	if (!c->q_head)
		c->q_tail = NULL;
	grpc_op ops[3];
	memset(ops, 0, sizeof(ops));
	size_t n = 0;
	grpc_byte_buffer *sending = m->bb;
	/* Headers sent on purpose (sc_call_send_headers: "ready", e.g. a subscription in place)
	 * carry one entry, so a client can tell them from the empty headers of a failed call. */
	grpc_metadata ready = {.key = grpc_slice_from_static_string(SC_READY_HEADER),
			       .value = grpc_slice_from_static_string("1")};
	if (!c->initial_md_sent) {
		ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
		ops[n].data.send_initial_metadata.count = m->md_only ? 1 : 0;
		ops[n].data.send_initial_metadata.metadata = m->md_only ? &ready : NULL;
		n++;
		c->initial_md_sent = true;
	}
	if (m->bb) {
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n].data.send_message.send_message = m->bb;
		n++;
	}
	if (m->bb && c->q_head && !c->q_head->bb && !c->q_head->md_only) {
		/* A message right before the status (a unary answer): both in one batch, so the
		 * client gets them in one write and no completion round trip separates them. */
		struct out_msg *st = c->q_head;
		c->q_head = NULL;
		c->q_tail = NULL;
		free(m);
		m = st;
	}
	if (!m->bb && !m->md_only) { /* the status: always last in the queue */
		ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
		ops[n].data.send_status_from_server.trailing_metadata_count = 0;
		ops[n].data.send_status_from_server.status = (grpc_status_code)c->final_code;
		ops[n].data.send_status_from_server.status_details =
			c->have_details ? &c->final_details : NULL;
		n++;
	}
	if (n == 0) { /* headers already went out: nothing to do for an md_only entry */
		free(m);
		pump_locked(c);
		return;
	}
	c->sending = sending;
	free(m);
	c->send_in_flight = true;
	sc_call_ref(c);
	grpc_call_error e = start_batch(c, ops, n, &c->t_send);
	if (e != GRPC_CALL_OK) {
		if (e != GRPC_CALL_ERROR)
			SC_ERROR("grpc", "%s: start_batch failed: %d", sc_call_method(c), (int)e);
		if (c->sending)
			grpc_byte_buffer_destroy(c->sending);
		c->sending = NULL;
		c->send_in_flight = false;
		atomic_fetch_sub(&c->refs, 1); /* cannot be the last: the caller holds one */
	}
}

static void on_send_done(struct tag *t, bool ok)
{
	struct sc_call *c = (struct sc_call *)((char *)t - offsetof(struct sc_call, t_send));
	void (*drained)(struct sc_call *) = NULL;
	pthread_mutex_lock(&c->mu);
	if (c->sending)
		grpc_byte_buffer_destroy(c->sending);
	c->sending = NULL;
	c->send_in_flight = false;
	if (!ok) {
		/* The call is gone (cancelled): drop what is queued. */
		while (c->q_head) {
			struct out_msg *m = c->q_head;
			c->q_head = m->next;
			if (m->bb)
				grpc_byte_buffer_destroy(m->bb);
			free(m);
		}
		c->q_tail = NULL;
		c->answered = true;
	}
	pump_locked(c);
	if (!c->send_in_flight && !c->q_head && !c->answered)
		drained = c->drained_fn;
	uint64_t traced = !c->send_in_flight && c->answered ? c->trace_xfer : 0;
	pthread_mutex_unlock(&c->mu);
	if (traced)
		sc_trace_mark(traced, "grpc_reply_sent");
	if (drained)
		drained(c);
	sc_call_unref(c);
}

/* Append an entry to the send queue. Caller holds c->mu. */
static void queue_locked(struct sc_call *c, struct out_msg *m)
{
	if (c->q_tail)
		c->q_tail->next = m;
	else
		c->q_head = m;
	c->q_tail = m;
}

/* Queue a message behind what is queued; false once the call has been answered. final: the OK
 * status goes right behind it (sc_call_reply), queued under the same lock so that both leave in
 * one batch. */
static bool enqueue(struct sc_call *c, grpc_byte_buffer *bb, bool final)
{
	struct out_msg *m = calloc(1, sizeof(*m));
	struct out_msg *st = final ? calloc(1, sizeof(*st)) : NULL;
	pthread_mutex_lock(&c->mu);
	if (!m || (final && !st) || c->answered) {
		pthread_mutex_unlock(&c->mu);
		grpc_byte_buffer_destroy(bb);
		free(m);
		free(st);
		return false;
	}
	m->bb = bb;
	queue_locked(c, m);
	if (final) {
		c->answered = true;
		c->final_code = SC_OK;
		queue_locked(c, st);
	}
	pump_locked(c);
	pthread_mutex_unlock(&c->mu);
	return true;
}

void sc_call_send_headers(struct sc_call *c)
{
	struct out_msg *m = calloc(1, sizeof(*m));
	if (!m)
		return;
	m->md_only = true;
	pthread_mutex_lock(&c->mu);
	if (c->answered || c->initial_md_sent) {
		pthread_mutex_unlock(&c->mu);
		free(m);
		return;
	}
	if (c->q_tail)
		c->q_tail->next = m;
	else
		c->q_head = m;
	c->q_tail = m;
	pump_locked(c);
	pthread_mutex_unlock(&c->mu);
}

bool sc_call_send(struct sc_call *c, const ProtobufCMessage *msg)
{
	return enqueue(c, pack(msg), false);
}

void sc_call_finish(struct sc_call *c, enum sc_status code, const char *msg)
{
	/* The status rides in its own out_msg (bb NULL), queued after every message. */
	pthread_mutex_lock(&c->mu);
	if (c->answered) {
		pthread_mutex_unlock(&c->mu);
		return;
	}
	c->answered = true;
	c->final_code = code;
	if (msg && msg[0]) {
		c->final_details = grpc_slice_from_copied_string(msg);
		c->have_details = true;
	}
	struct out_msg *st = calloc(1, sizeof(*st));
	if (st) {
		if (c->q_tail)
			c->q_tail->next = st;
		else
			c->q_head = st;
		c->q_tail = st;
	}
	pump_locked(c);
	pthread_mutex_unlock(&c->mu);
	if (code != SC_OK)
		SC_DEBUG("grpc", "%s -> %s: %s", sc_call_method(c), sc_status_name(code),
			 msg ? msg : "");
}

void sc_call_reply(struct sc_call *c, const ProtobufCMessage *msg)
{
	if (sc_trace_on())
		c->trace_xfer = sc_trace_current();
	enqueue(c, pack(msg), true);
}

void sc_call_fail(struct sc_call *c, enum sc_status code, const char *msg)
{
	sc_call_finish(c, code, msg);
}

void sc_call_fail_err(struct sc_call *c, const struct sc_err *err)
{
	sc_call_finish(c, err->code == SC_OK ? SC_INTERNAL : err->code, err->msg);
}

/* ---- receiving (client streams) -------------------------------------------------------------- */

static void on_recv_done(struct tag *t, bool ok)
{
	struct sc_call *c = (struct sc_call *)((char *)t - offsetof(struct sc_call, t_recv));
	grpc_byte_buffer *bb = c->recv_bb;
	c->recv_bb = NULL;
	sc_call_recv_fn fn = c->recv_fn;
	if (!ok || !bb) {
		if (bb)
			grpc_byte_buffer_destroy(bb);
		fn(c, NULL, true);
	} else {
		ProtobufCMessage *m = sc_call_unpack(c->recv_desc, bb);
		grpc_byte_buffer_destroy(bb);
		if (!m)
			sc_call_fail(c, SC_INVALID_ARGUMENT,
				     "malformed message in the request stream (protobuf decode failed)");
		else
			fn(c, m, false);
		if (m)
			protobuf_c_message_free_unpacked(m, NULL);
	}
	sc_call_unref(c);
}

void sc_call_recv(struct sc_call *c, const ProtobufCMessageDescriptor *desc, sc_call_recv_fn fn)
{
	c->recv_desc = desc;
	c->recv_fn = fn;
	grpc_op op;
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &c->recv_bb;
	sc_call_ref(c);
	if (start_batch(c, &op, 1, &c->t_recv) != GRPC_CALL_OK) {
		sc_call_unref(c);
		fn(c, NULL, true);
	}
}

/* ---- creation and cancellation ------------------------------------------------------------- */

struct sc_call *sc_call_new(struct srv *s, const struct sc_method_def *m)
{
	struct sc_service *svc = s->svc;
	struct sc_call *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->svc = svc;
	c->srv = s;
	c->method = m;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->mu, NULL);
	grpc_metadata_array_init(&c->req_md);
	if (!m)
		grpc_call_details_init(&c->details);
	c->t_send.cb = on_send_done;
	c->t_recv.cb = on_recv_done;
	atomic_fetch_add(&svc->live_calls, 1);
	return c;
}

static void on_close(struct tag *t, bool ok)
{
	struct sc_call *c = (struct sc_call *)((char *)t - offsetof(struct sc_call, t_close));
	void (*fn)(struct sc_call *) = NULL;
	pthread_mutex_lock(&c->mu);
	if (c->cancelled_flag || !ok) {
		atomic_store(&c->cancelled, true);
		if (c->cancel_fn && !c->cancel_fired) {
			c->cancel_fired = true;
			fn = c->cancel_fn;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (fn)
		fn(c);
	sc_call_unref(c);
}

void sc_call_watch_close(struct sc_call *c)
{
	c->t_close.cb = on_close;
	grpc_op op;
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->cancelled_flag;
	sc_call_ref(c);
	if (start_batch(c, &op, 1, &c->t_close) != GRPC_CALL_OK)
		sc_call_unref(c);
}
