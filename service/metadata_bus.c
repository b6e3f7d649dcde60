/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metadata_bus.c: PublishMetadata and SubscribeMetadata (NATS). A subscription is a server
 * stream: every verified metadata message on the subject becomes a MetadataEvent, sent from the
 * NATS delivery thread; the stream ends when the client cancels (the NATS subscription is removed
 * synchronously first). WaitMetadata is a one-shot subscription answered by the first verified
 * event (the stored copy, with the JetStream hand-off) or by its deadline (an engine timer).
 * Handlers start on gRPC worker threads; events run on NATS delivery threads, deadlines on the
 * engine's timer thread (which hands the unsubscribe to the store's deleter thread).
 */
#include "handlers.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sc_h_publish_metadata(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__PublishMetadataRequest *r = (RdmaSidecar__V1__PublishMetadataRequest *)req;
	const char *op_id =
		r->source_case == RDMA_SIDECAR__V1__PUBLISH_METADATA_REQUEST__SOURCE_OPERATION_ID
			? r->operation_id
			: NULL;
	const char *md = r->source_case == RDMA_SIDECAR__V1__PUBLISH_METADATA_REQUEST__SOURCE_METADATA
				 ? r->metadata
				 : NULL;
	struct sc_err err;
	sc_err_clear(&err);
	if (!r->subject || !r->subject[0]) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "subject is required");
		return;
	}
	if (sc_bus_publish(sc_call_engine(c), r->subject, op_id, md, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__PublishMetadataResponse m = RDMA_SIDECAR__V1__PUBLISH_METADATA_RESPONSE__INIT;
	sc_call_reply(c, &m.base);
}

struct sub_state {
	uint64_t sub_id;
	atomic_bool ended;
};

/* A MetadataEvent message that borrows ev's fields (valid while ev is). */
static RdmaSidecar__V1__MetadataEvent event_view(const struct sc_bus_event *ev)
{
	RdmaSidecar__V1__MetadataEvent m = RDMA_SIDECAR__V1__METADATA_EVENT__INIT;
	m.subject = (char *)ev->subject;
	m.metadata = (char *)ev->metadata;
	m.issuer = (char *)ev->issuer;
	m.kind = (RdmaSidecar__V1__OperationKind)ev->kind;
	m.n_descriptor_lengths = ev->n_descriptors;
	m.descriptor_lengths = (uint64_t *)ev->descriptor_lengths;
	m.expires_unix_ms = ev->expires_unix_ms;
	return m;
}

static void on_event(void *ctx, const struct sc_bus_event *ev)
{
	struct sc_call *c = ctx;
	struct sub_state *st = sc_call_state(c);
	if (atomic_load(&st->ended) || ev->refused)
		return;
	RdmaSidecar__V1__MetadataEvent m = event_view(ev);
	sc_call_send(c, &m.base);
}

static void on_cancel(struct sc_call *c)
{
	struct sub_state *st = sc_call_state(c);
	if (atomic_exchange(&st->ended, true))
		return;
	sc_bus_unsubscribe(sc_call_engine(c), st->sub_id); /* synchronous */
	sc_call_finish(c, SC_CANCELLED, "subscription cancelled by the client");
	sc_call_unref(c); /* the subscription's */
}

void sc_h_subscribe_metadata(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__SubscribeMetadataRequest *r =
		(RdmaSidecar__V1__SubscribeMetadataRequest *)req;
	struct sub_state *st = calloc(1, sizeof(*st));
	if (!st) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	sc_call_set_state(c, st, free);
	struct sc_err err;
	sc_err_clear(&err);
	if (!r->subject || !r->subject[0]) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "subject is required");
		return;
	}
	sc_call_ref(c); /* the subscription's, dropped when it ends */
	if (sc_bus_subscribe(sc_call_engine(c), r->subject, r->queue_group, on_event, c,
			     &st->sub_id, &err) != 0) {
		atomic_store(&st->ended, true);
		sc_call_fail_err(c, &err);
		sc_call_unref(c);
		return;
	}
	sc_call_on_cancel(c, on_cancel);
	sc_call_send_headers(c); /* the subscription is in place: tell the client */
}

/* ---- WaitMetadata ---------------------------------------------------------------------------- */

enum { WAIT_DEFAULT_MS = 30 * 1000 };
#define WAIT_MAX_MS (24ULL * 3600 * 1000)

/*
 * One wait. Whoever sets `answered` first (the first verified event, the deadline timer, the
 * client's cancel) answers the call; the subscription and the timer are then removed by the
 * event's own handler (self-unsubscribe), the timer or the cancel, and the call's reference
 * dropped once: by the timer when it ran, else by whoever cancelled it (try_cancel).
 */
struct wait_state {
	pthread_mutex_t mu;
	bool answered;
	bool setup_done;
	uint64_t sub_id;
	uint64_t timer_id;
	uint64_t timeout_ms;
	char subject[1100];
	RdmaSidecar__V1__MetadataEvent *stash; /* answered before setup_done: the event */
	char refused[SC_ERR_MSG_MAX];	      /* the last refused message's reason */
	enum sc_status refused_code;
};

static void wait_state_free(void *p)
{
	struct wait_state *w = p;
	if (w->stash) {
		free(w->stash->subject);
		free(w->stash->metadata);
		free(w->stash->issuer);
		free(w->stash->descriptor_lengths);
		free(w->stash);
	}
	pthread_mutex_destroy(&w->mu);
	free(w);
}

static RdmaSidecar__V1__MetadataEvent *event_copy(const struct sc_bus_event *ev)
{
	RdmaSidecar__V1__MetadataEvent *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	rdma_sidecar__v1__metadata_event__init(m);
	m->subject = strdup(ev->subject);
	m->metadata = strdup(ev->metadata);
	m->issuer = strdup(ev->issuer);
	m->kind = (RdmaSidecar__V1__OperationKind)ev->kind;
	m->n_descriptor_lengths = ev->n_descriptors;
	m->descriptor_lengths = calloc(ev->n_descriptors ? ev->n_descriptors : 1, sizeof(uint64_t));
	if (m->descriptor_lengths && ev->n_descriptors)
		memcpy(m->descriptor_lengths, ev->descriptor_lengths,
		       ev->n_descriptors * sizeof(uint64_t));
	m->expires_unix_ms = ev->expires_unix_ms;
	return m;
}

static void on_wait_event(void *ctx, const struct sc_bus_event *ev)
{
	struct sc_call *c = ctx;
	struct wait_state *w = sc_call_state(c);
	struct sc_engine *eng = sc_call_engine(c);
	pthread_mutex_lock(&w->mu);
	if (w->answered) {
		pthread_mutex_unlock(&w->mu);
		return;
	}
	if (ev->refused) {
		snprintf(w->refused, sizeof(w->refused), "%s", ev->refused);
		w->refused_code = ev->refused_code;
		pthread_mutex_unlock(&w->mu);
		return;
	}
	w->answered = true;
	if (!w->setup_done) {
		w->stash = event_copy(ev); /* the starting thread answers */
		pthread_mutex_unlock(&w->mu);
		return;
	}
	uint64_t sub_id = w->sub_id, timer_id = w->timer_id;
	pthread_mutex_unlock(&w->mu);
	RdmaSidecar__V1__MetadataEvent m = event_view(ev);
	sc_call_reply(c, &m.base);
	sc_bus_unsubscribe(eng, sub_id); /* our own subscription: returns at once */
	if (sc_engine_timer_try_cancel(eng, timer_id))
		sc_call_unref(c);
	/* else the deadline timer is running: it sees `answered` and drops the reference */
}

static void unref_call(void *ctx)
{
	sc_call_unref(ctx);
}

static void wait_deadline(void *ctx)
{
	struct sc_call *c = ctx;
	struct wait_state *w = sc_call_state(c);
	struct sc_engine *eng = sc_call_engine(c);
	pthread_mutex_lock(&w->mu);
	bool mine = !w->answered;
	w->answered = true;
	uint64_t sub_id = w->sub_id;
	pthread_mutex_unlock(&w->mu);
	/* Answer first: a handler running now sees `answered` and does nothing. */
	if (mine) {
		char msg[SC_ERR_MSG_MAX + 1400];
		const char *stream = sc_bus_store_name(eng);
		if (w->refused[0]) {
			snprintf(msg, sizeof(msg),
				 "WaitMetadata on %s: metadata %s on this subject was refused: %s; "
				 "nothing valid came within %llu ms",
				 w->subject, stream ? "stored or published" : "published",
				 w->refused, (unsigned long long)w->timeout_ms);
			sc_call_fail(c, w->refused_code, msg);
		} else if (stream) {
			snprintf(msg, sizeof(msg),
				 "WaitMetadata on %s: no metadata within %llu ms: nothing is stored "
				 "under this subject in JetStream stream %s and nothing was published "
				 "on it meanwhile (has the other worker published yet? its operation "
				 "may have ended or expired, which removes the stored copy)",
				 w->subject, (unsigned long long)w->timeout_ms, stream);
			sc_call_fail(c, SC_DEADLINE_EXCEEDED, msg);
		} else {
			snprintf(msg, sizeof(msg),
				 "WaitMetadata on %s: no metadata was published on it within %llu "
				 "ms (--nats-handoff core keeps nothing: metadata published before "
				 "this call started is lost; --nats-handoff jetstream keeps it)",
				 w->subject, (unsigned long long)w->timeout_ms);
			sc_call_fail(c, SC_DEADLINE_EXCEEDED, msg);
		}
	}
	/* Off this (timer) thread: removing a JetStream consumer is a NATS request, which waits
	 * out the store's timeout while NATS does not answer, and operation deadlines run here
	 * too. The call stays referenced until its handler can no longer run. */
	sc_bus_unsubscribe_later(eng, sub_id, unref_call, c);
}

static void wait_cancelled(struct sc_call *c)
{
	struct wait_state *w = sc_call_state(c);
	struct sc_engine *eng = sc_call_engine(c);
	pthread_mutex_lock(&w->mu);
	bool mine = !w->answered;
	w->answered = true;
	uint64_t sub_id = w->sub_id, timer_id = w->timer_id;
	pthread_mutex_unlock(&w->mu);
	if (!mine)
		return;
	sc_call_fail(c, SC_CANCELLED, "WaitMetadata cancelled by the client");
	if (sc_engine_timer_try_cancel(eng, timer_id)) {
		sc_bus_unsubscribe(eng, sub_id);
		sc_call_unref(c);
	}
}

void sc_h_wait_metadata(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__WaitMetadataRequest *r = (RdmaSidecar__V1__WaitMetadataRequest *)req;
	struct sc_engine *eng = sc_call_engine(c);
	if (!r->subject || !r->subject[0]) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "subject is required");
		return;
	}
	if (strlen(r->subject) > 1024) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "subject is longer than 1024 bytes");
		return;
	}
	uint64_t timeout = r->timeout_ms ? r->timeout_ms : WAIT_DEFAULT_MS;
	if (timeout > WAIT_MAX_MS) {
		sc_call_fail(c, SC_INVALID_ARGUMENT,
			     "timeout_ms is over 24 hours (86400000); 0 means 30 s");
		return;
	}
	uint64_t left = sc_call_deadline_left_ms(c);
	if (left < timeout)
		timeout = left;
	struct wait_state *w = calloc(1, sizeof(*w));
	if (!w) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	pthread_mutex_init(&w->mu, NULL);
	w->timeout_ms = timeout;
	snprintf(w->subject, sizeof(w->subject), "%s", r->subject);
	sc_call_set_state(c, w, wait_state_free);
	struct sc_err err;
	sc_err_clear(&err);
	sc_call_ref(c); /* the wait's, dropped once it is over */
	uint64_t sub_id = 0;
	uint64_t t0 = sc_clock_mono_ms();
	if (sc_bus_subscribe(eng, r->subject, NULL, on_wait_event, c, &sub_id, &err) != 0) {
		sc_call_fail_err(c, &err);
		sc_call_unref(c);
		return;
	}
	pthread_mutex_lock(&w->mu);
	w->sub_id = sub_id;
	w->setup_done = true;
	if (w->answered) {
		/* A stored copy came while subscribing (or the wait was cancelled meanwhile). */
		RdmaSidecar__V1__MetadataEvent *m = w->stash;
		pthread_mutex_unlock(&w->mu);
		sc_bus_unsubscribe(eng, sub_id);
		if (m && m->subject && m->metadata && m->issuer && m->descriptor_lengths)
			sc_call_reply(c, &m->base);
		else
			sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		sc_call_unref(c);
		return;
	}
	uint64_t spent = sc_clock_mono_ms() - t0; /* subscribing may wait out a NATS fail-over */
	w->timer_id = sc_engine_timer_add(eng, timeout > spent ? timeout - spent : 0, wait_deadline, c);
	pthread_mutex_unlock(&w->mu);
	sc_call_on_cancel(c, wait_cancelled);
}
