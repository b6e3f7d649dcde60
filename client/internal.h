/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h: what the client library's files share (never installed). call.c owns the gRPC
 * channel and runs calls; api.c turns each RPC into protobuf-c messages and back into C types;
 * fast.c is the fast path (rings shared with the sidecar, or rsc_read/rsc_write without them).
 */
#ifndef RSC_INTERNAL_H
#define RSC_INTERNAL_H

#include "rdma_sidecar/client.h"

#include <protobuf-c/protobuf-c.h>
#include <stdarg.h>

int rsc_fail(rsc_status *st, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int rsc_ok(rsc_status *st);
/* The client's deadline of each unary call, in ms (its options' call_timeout_ms, or 30000). */
uint32_t rsc_client_call_timeout(const rsc_client *c);

/* One unary call: packs req, waits up to timeout_ms (0 = the client's call timeout) and unpacks
 * the answer with resp_desc into *resp (free with protobuf_c_message_free_unpacked). */
int rsc_call_unary(rsc_client *c, const char *method, const ProtobufCMessage *req,
		   const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
		   uint64_t timeout_ms, rsc_status *st);

/* A server-streaming call: on_msg gets each unpacked message (freed after it returns) and returns
 * non-zero to stop, which cancels the call and returns RSC_OK with *stopped = 1. on_ready (may be
 * NULL) runs once when the server's response headers arrive, before any message.
 * timeout_ms 0 = no deadline. */
typedef int (*rsc_stream_cb)(const ProtobufCMessage *msg, void *user);
int rsc_call_server_stream(rsc_client *c, const char *method, const ProtobufCMessage *req,
			   const ProtobufCMessageDescriptor *resp_desc, rsc_stream_cb on_msg,
			   void (*on_ready)(void *user), void *user, uint64_t timeout_ms,
			   int *stopped, rsc_status *st);

/* A client-streaming call: next(user, &msg) fills the next request (returns 1) or says the stream
 * ended (0) or failed (-1 with st filled); msg stays valid until the next call of next(). */
typedef int (*rsc_stream_next)(void *user, const ProtobufCMessage **msg, rsc_status *st);
int rsc_call_client_stream(rsc_client *c, const char *method, rsc_stream_next next, void *user,
			   const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
			   uint64_t timeout_ms, rsc_status *st);

#endif
