/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metadata_bus.c: PublishMetadata and SubscribeMetadata (NATS). A subscription is a server
 * stream: every verified metadata message on the subject becomes a MetadataEvent, sent from the
 * NATS delivery thread; the stream ends when the client cancels (the NATS subscription is removed
 * synchronously first). Handlers start on gRPC worker threads.
 */
#include "handlers.h"

#include <stdatomic.h>
#include <stdlib.h>

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

static void on_event(void *ctx, const struct sc_bus_event *ev)
{
	struct sc_call *c = ctx;
	struct sub_state *st = sc_call_state(c);
	if (atomic_load(&st->ended))
		return;
	RdmaSidecar__V1__MetadataEvent m = RDMA_SIDECAR__V1__METADATA_EVENT__INIT;
	m.subject = (char *)ev->subject;
	m.metadata = (char *)ev->metadata;
	m.issuer = (char *)ev->issuer;
	m.kind = (RdmaSidecar__V1__OperationKind)ev->kind;
	m.n_descriptor_lengths = ev->n_descriptors;
	m.descriptor_lengths = (uint64_t *)ev->descriptor_lengths;
	m.expires_unix_ms = ev->expires_unix_ms;
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
