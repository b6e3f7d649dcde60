/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/client.h: a small, robust NATS publish/subscribe bus over nats.c 3.4.1. It moves opaque
 * bytes between subjects and knows nothing about what they mean (the engine signs and verifies
 * metadata before and after calling it).
 *
 * Connection: connects in the background and keeps reconnecting forever with jittered waits;
 * subscriptions survive server restarts (nats.c resends them on reconnect); publishes made while
 * not connected are buffered up to a bound and sent, after the subscriptions, on (re)connect.
 *
 * Threads: every call below may be made from any thread, concurrently, except
 * sc_nats_bus_destroy (no other call on the same bus may be in progress or follow) and
 * sc_nats_bus_library_shutdown. Message handlers run on a NATS delivery thread (one per
 * subscription); the state observer runs on nats.c's single, process-wide connection-callback
 * thread. Neither may block; neither may call sc_nats_bus_destroy.
 *
 * Errors: functions that can fail return 0 or -1 and fill the caller's struct sc_err (may be NULL).
 */
#ifndef SC_NATS_BUS_H
#define SC_NATS_BUS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct sc_nats_bus;

/* Longest subject or queue group accepted, in bytes (the server's control line is 4 KiB). */
#define SC_NATS_SUBJECT_MAX 1024

/*
 * State observer: "connected", "reconnecting" or "closed" (the state a bus starts in,
 * "connecting", is not reported). Called once per transition, in order, never concurrently with
 * itself for one bus: on nats.c's connection-callback thread, or, when the server is reachable at
 * once, on the thread inside sc_nats_bus_create_ex before it returns. Must not block.
 */
typedef void (*sc_nats_state_fn)(void *ctx, const char *state);

/* Options for sc_nats_bus_create_ex. Zero-initialise; a zero field takes the default. */
struct sc_nats_bus_opts {
	sc_nats_state_fn on_state; /* optional observer */
	void *on_state_ctx;
	int reconnect_wait_ms;	 /* wait between rounds of attempts; default 1000 */
	int reconnect_jitter_ms; /* plus a random 0..jitter; default 1000 */
	int reconnect_buf_bytes; /* publishes buffered while not connected; default 8 MiB */
	int flush_timeout_ms; /* how long a publish waits for the server to confirm; default 1000 */
	/* Security (paths; NULL or "" = unset). tls_ca turns TLS on and verifies the server with
	 * that CA; tls_cert + tls_key: the client certificate (both or neither; also turns TLS
	 * on); creds_file: user JWT + seed (.creds); nkey_seed_file: NKey auth (not with creds). */
	const char *tls_ca;
	const char *tls_cert;
	const char *tls_key;
	const char *creds_file;
	const char *nkey_seed_file;
};

/*
 * Create a bus and start connecting. url: "nats://host:port[,nats://host:port...]" (no
 * credentials in the URL; port defaults to 4222; "[v6addr]" allowed). name: the connection name
 * shown by the server (the sidecar id); NULL or "" for none.
 * Returns 0 and fills *out even when no server is up yet (state "connecting"; the first attempt
 * may take up to the 2 s connect timeout). Returns -1 without touching *out: INVALID_ARGUMENT for
 * a bad url/name/option, FAILED_PRECONDITION after sc_nats_bus_library_shutdown, INTERNAL or
 * RESOURCE_EXHAUSTED when nats.c cannot start.
 */
int sc_nats_bus_create(const char *url, const char *name, struct sc_nats_bus **out,
		       struct sc_err *err);
int sc_nats_bus_create_ex(const char *url, const char *name, const struct sc_nats_bus_opts *opts,
			  struct sc_nats_bus **out, struct sc_err *err);

/*
 * Unsubscribe all (synchronously, as sc_nats_bus_unsubscribe), close the connection (buffered
 * publishes that were not sent are dropped), wait for nats.c's closed callback, free. NULL is a
 * no-op. Never call from a message handler or observer (refused with an error log: it would
 * deadlock).
 */
void sc_nats_bus_destroy(struct sc_nats_bus *bus);

/* "connecting" (never connected yet), "connected", "reconnecting", "closed". Static strings. */
const char *sc_nats_bus_state(struct sc_nats_bus *bus);

/*
 * Publish len bytes (binary-safe; data may be NULL when len is 0) to a literal subject.
 * Connected: sends and waits up to flush_timeout_ms for the server's confirmation (PING/PONG),
 * so a broken connection surfaces here. Not connected: buffers the message for the next
 * (re)connect and returns 0.
 * Errors: INVALID_ARGUMENT for a bad subject (empty, longer than SC_NATS_SUBJECT_MAX, whitespace
 * or control bytes, empty tokens, any '*' or '>') or a payload over the server's max_payload
 * (1 MiB, the NATS default, assumed before the first connect). UNAVAILABLE when not connected
 * and the reconnect buffer cannot take the message, when the server did not confirm in time or
 * the connection dropped while waiting (the message may or may not have been delivered), or
 * when the bus is closed.
 */
int sc_nats_bus_publish(struct sc_nats_bus *bus, const char *subject, const void *data, size_t len,
			struct sc_err *err);

/*
 * Handler for one message; data is valid only during the call (subject is NUL-terminated, data
 * is not guaranteed to be). Runs on the subscription's NATS delivery thread, one message at a
 * time per subscription. Must not block; may call sc_nats_bus_publish (waits one round trip)
 * and sc_nats_bus_unsubscribe for its own subscription.
 */
typedef void (*sc_nats_msg_fn)(void *ctx, const char *subject, const void *data, size_t len);

/*
 * Subscribe to subject ('*' and '>' wildcards allowed as whole tokens, '>' last). queue_group:
 * NULL or "" for none; subscribers sharing a group get each message once between them.
 * *sub_id receives a nonzero id for sc_nats_bus_unsubscribe. When connected, returns after the
 * server has confirmed the subscription (or the flush timed out, which is logged); otherwise the
 * subscription is sent on (re)connect. Errors: INVALID_ARGUMENT (bad subject/queue group, NULL
 * fn or sub_id), UNAVAILABLE (bus closed), INTERNAL.
 */
int sc_nats_bus_subscribe(struct sc_nats_bus *bus, const char *subject, const char *queue_group,
			  sc_nats_msg_fn fn, void *ctx, uint64_t *sub_id, struct sc_err *err);

/*
 * Synchronous: when it returns, fn is not running and will never run again for this id (called
 * from that subscription's own handler: it returns at once and fn is not called again after the
 * current call returns). Unknown or already removed id: no-op. Calling it from a handler for
 * another subscription waits for that handler, so two handlers must not unsubscribe each other.
 */
void sc_nats_bus_unsubscribe(struct sc_nats_bus *bus, uint64_t sub_id);

/*
 * Release nats.c's process-wide resources (nats_CloseAndWait with a 5 s limit). Call once from
 * main at exit, after every bus has been destroyed; afterwards sc_nats_bus_create fails with
 * FAILED_PRECONDITION (nats.c cannot be reopened in the same process). Safe if no bus was ever
 * created, and idempotent. When nats.c was opened it also finishes OpenSSL (OPENSSL_cleanup,
 * see nats/client.c): nothing may use OpenSSL afterwards.
 */
void sc_nats_bus_library_shutdown(void);

/* The connection's counters, for the metrics: times nats.c reconnected it, and the messages and
 * bytes it carried in and out. Any thread; all zero for NULL or when nats.c cannot say. */
struct sc_nats_bus_stats {
	uint64_t reconnects, in_msgs, out_msgs, in_bytes, out_bytes;
};
void sc_nats_bus_stats(struct sc_nats_bus *bus, struct sc_nats_bus_stats *out);

#endif
