/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/internal.h: what nats/client.c shares with nats/store.c (JetStream) and nothing else
 * includes: the bus's nats.c connection and a subscription opened by a caller-supplied nats.c
 * call (core or JetStream) behind the bus's handler gate, so sc_nats_bus_unsubscribe and
 * sc_nats_bus_destroy treat both alike.
 */
#ifndef SC_NATS_INTERNAL_H
#define SC_NATS_INTERNAL_H

#include <stdbool.h>

#include <nats/nats.h>

#include "nats/client.h"

/* The bus's connection (set once at create; never NULL for a created bus). */
natsConnection *sc_nats_bus_conn(struct sc_nats_bus *bus);

/* Opens the nats.c subscription: must call a nats.c subscribe with (cb, closure) as its handler
 * and fill *out. Returns the nats.c status; fills err (with its own wording) when not NATS_OK. */
typedef natsStatus (*sc_nats_open_fn)(void *arg, natsConnection *nc, natsMsgHandler cb,
				      void *closure, natsSubscription **out, struct sc_err *err);
/* Handler given the whole message (headers, JetStream metadata); valid only during the call. */
typedef void (*sc_nats_raw_fn)(void *ctx, natsMsg *msg);

/*
 * sc_nats_bus_subscribe with the nats.c call supplied (open) and a raw handler: same gate, same
 * ids, same synchronous unsubscribe. subject is for messages only. free_ctx (may be NULL) frees
 * ctx once no handler can run any more, also when this call fails. On failure err is what open
 * said, or INVALID_ARGUMENT / UNAVAILABLE / RESOURCE_EXHAUSTED as sc_nats_bus_subscribe.
 */
int sc_nats_sub_open(struct sc_nats_bus *bus, const char *subject, sc_nats_open_fn open, void *arg,
		     sc_nats_raw_fn raw, void *ctx, void (*free_ctx)(void *ctx), uint64_t *sub_id,
		     struct sc_err *err);

/* The bus's subject check (what: "publish" or "subscribe"; wildcards allowed or not). */
int sc_nats_check_subject(const char *subject, bool wildcards, const char *what,
			  struct sc_err *err);

#endif
