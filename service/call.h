/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.h: one server-side gRPC call and what handlers may do with it (call.c). gRPC C-core types
 * stay in call.c, server.c and internal.h; handlers see struct sc_call and protobuf-c messages.
 *
 * Threads: a handler starts on a completion-queue worker thread; it may answer at once, or keep
 * the call (sc_call_ref) and answer later from any thread (engine watchers, NATS threads, timers).
 * All sc_call_* functions are thread-safe. A call is answered exactly once (reply, fail or
 * finish); later answers are ignored. Sends on a stream are queued and go out one at a time.
 * When the client cancels or its deadline passes, on_cancel (if set) runs once on a worker thread;
 * it must not hold locks the engine's watcher callbacks take.
 */
#ifndef SC_CALL_H
#define SC_CALL_H

#include "base/status.h"

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>

struct sc_call;
struct sc_service;
struct sc_config;

/* What the handlers need from the service. */
struct sc_engine *sc_call_engine(struct sc_call *c);
struct sc_service *sc_call_service(struct sc_call *c);
const struct sc_config *sc_call_config(struct sc_call *c);
/* The client's deadline as milliseconds from now (UINT64_MAX when none). */
uint64_t sc_call_deadline_left_ms(struct sc_call *c);
/* The method path, e.g. "/rdma_sidecar.v1.Sidecar/GetInfo". */
const char *sc_call_method(struct sc_call *c);
/* The value of the request's metadata header `key` (lowercase, as gRPC keeps them; the first
 * one) into out (NUL-terminated, cut to cap - 1): true when the call has it. */
bool sc_call_header(const struct sc_call *c, const char *key, char *out, size_t cap);
bool sc_call_is_cancelled(struct sc_call *c);

void sc_call_ref(struct sc_call *c);
void sc_call_unref(struct sc_call *c);

/* Unary answers. */
void sc_call_reply(struct sc_call *c, const ProtobufCMessage *msg);
void sc_call_fail(struct sc_call *c, enum sc_status code, const char *msg);
void sc_call_fail_err(struct sc_call *c, const struct sc_err *err);

/* Streams: send the response headers now, so the client knows the stream is live before the
 * first message (e.g. a subscription is in place). */
/* The header (initial metadata key, value "1") that sc_call_send_headers sends. */
#define SC_READY_HEADER "rdma-sidecar-ready"
void sc_call_send_headers(struct sc_call *c);
/* Streams: queue a message; end with a status. Returns false if the call has ended. */
bool sc_call_send(struct sc_call *c, const ProtobufCMessage *msg);
void sc_call_finish(struct sc_call *c, enum sc_status code, const char *msg);

/* Per-call handler state, freed with the call by `free_fn` (may be NULL). */
void sc_call_set_state(struct sc_call *c, void *state, void (*free_fn)(void *state));
void *sc_call_state(struct sc_call *c);
/* Runs once when the client cancels (or the deadline passes, or the server shuts down). */
void sc_call_on_cancel(struct sc_call *c, void (*fn)(struct sc_call *c));
/* Streams with flow control: runs (on a worker thread) whenever the send queue drains. */
void sc_call_on_drained(struct sc_call *c, void (*fn)(struct sc_call *c));

/* Client streams: ask for the next message; fn gets it (NULL at the end of the stream or when
 * the call failed). The message is freed after fn returns. */
typedef void (*sc_call_recv_fn)(struct sc_call *c, ProtobufCMessage *msg, bool end);
void sc_call_recv(struct sc_call *c, const ProtobufCMessageDescriptor *desc, sc_call_recv_fn fn);

#endif
