/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/store.h: published metadata kept by JetStream, so a reader that subscribes after the
 * writer published still receives it. One stream (created with limits on first use, or an
 * operator's, bound by name) holds the latest message of every subject: stream subject = the
 * stream's root ("NAME." when this module creates it) + the caller's subject. Copies expire
 * after max_age at the latest; sc_nats_store_forget removes one earlier (the engine calls it
 * when the operation behind it ends).
 *
 * Threads: every call may be made from any thread, except sc_nats_store_destroy. Watch handlers
 * run on the subscription's nats.c delivery thread (as nats/client.h's). One deleter thread per
 * store runs the removals queued by sc_nats_store_forget and the calls of sc_nats_store_defer.
 *
 * Errors: 0 or -1 with the caller's struct sc_err filled; messages name the subject, say whether
 * anything was stored, and what to enable (JetStream on the server, the account's permission
 * for $JS.API.>).
 */
#ifndef SC_NATS_STORE_H
#define SC_NATS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "nats/client.h"

struct sc_nats_store;

#define SC_NATS_STORE_DEFAULT_STREAM "RDMA_SIDECAR_METADATA"

/* Zero-initialise; a zero field takes the default. */
struct sc_nats_store_opts {
	const char *stream; /* the stream's name; default SC_NATS_STORE_DEFAULT_STREAM */
	int replicas;	    /* 0: 3 when the client knows >= 3 servers (a cluster), else 1 */
	int64_t max_age_ms; /* a stored copy is removed after this at the latest; default 7 days */
	int timeout_ms;	    /* each JetStream API request and publish; default 2000 */
	int failover_ms;    /* put and watch retry UNAVAILABLE failures this long; default 15000 */
};

/* No I/O: the stream is looked up or created on first use, and again after a failure.
 * Errors: INVALID_ARGUMENT (a stream name with '.', '*', '>', whitespace), RESOURCE_EXHAUSTED. */
int sc_nats_store_create(struct sc_nats_bus *bus, const struct sc_nats_store_opts *opts,
			 struct sc_nats_store **out, struct sc_err *err);
/* Runs the removals still queued (bounded: 2 s in all) and every deferred call, stops the
 * deleter, frees. Destroy the store before its bus. NULL is a no-op. */
void sc_nats_store_destroy(struct sc_nats_store *st);

/* The stream's name (as configured). */
const char *sc_nats_store_stream(const struct sc_nats_store *st);

/*
 * Store data as the latest message of subject (literal) and return once JetStream confirmed it
 * (replicated to a quorum on a cluster). *seq receives its stream sequence for forget.
 * Transient failures (not connected, no answer: a cluster electing a new leader) are retried
 * for failover_ms before UNAVAILABLE is returned.
 * Errors: INVALID_ARGUMENT (subject, size), UNAVAILABLE (not connected, no confirmation),
 * FAILED_PRECONDITION (JetStream off, no permission, the stream refused it).
 */
int sc_nats_store_put(struct sc_nats_store *st, const char *subject, const void *data, size_t len,
		      uint64_t *seq, struct sc_err *err);

/* Run fn(ctx) soon on the deleter thread, in order with other deferred calls: for work that is
 * a NATS request bounded by the store's timeout (removing a JetStream consumer), off a thread
 * that must not wait that long (the engine's timer thread). true: queued, and it runs, at the
 * latest during sc_nats_store_destroy; false (st NULL, the store being destroyed, out of
 * memory): not queued, the caller runs it. Any thread. */
bool sc_nats_store_defer(struct sc_nats_store *st, void (*fn)(void *ctx), void *ctx);

/* Remove the stored message seq (if it is still there) soon, on the deleter thread. Never
 * blocks; callable with any lock held. seq 0 is ignored. */
void sc_nats_store_forget(struct sc_nats_store *st, uint64_t seq);

/*
 * Handler of a watch: subject is the caller's subject (root stripped), data the stored bytes,
 * seq the stream sequence. Valid only during the call; same rules as sc_nats_msg_fn.
 */
typedef void (*sc_nats_store_fn)(void *ctx, const char *subject, const void *data, size_t len,
				 uint64_t seq);

/*
 * Deliver the latest stored message of every subject matching subject ('*', '>' allowed), then
 * each new one, until sc_nats_bus_unsubscribe(bus, *sub_id). An ordered consumer: it follows
 * reconnects and the loss of a cluster node by itself. Errors as sc_nats_store_put.
 */
int sc_nats_store_watch(struct sc_nats_store *st, const char *subject, sc_nats_store_fn fn,
			void *ctx, uint64_t *sub_id, struct sc_err *err);

/*
 * A queue group over the store's subjects: each message stored while the group's members are
 * subscribed goes to one of them (core NATS on the stream's subjects; stored copies published
 * earlier are not replayed to a group). Unsubscribe with sc_nats_bus_unsubscribe.
 */
int sc_nats_store_queue_subscribe(struct sc_nats_store *st, const char *subject,
				  const char *queue_group, sc_nats_store_fn fn, void *ctx,
				  uint64_t *sub_id, struct sc_err *err);

#endif
