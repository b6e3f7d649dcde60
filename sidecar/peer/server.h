/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/server.h: the serving side of the peer control channel (--data-listen). Peer sidecars
 * connect, authenticate with the hello (peer/proto.h), then OPEN / READ / WRITE / DONE passive
 * operations by token; every request goes through the passive-operation interface
 * (backend/passive.h) the server was created with, so the engine checks direction, bounds, deadline
 * and state, and bytes move straight between region memory and the socket.
 *
 * Threads: one accept thread, and a pool of threads serving the connections (at most
 * --data-max-peers authenticated ones, a quarter of them per peer id: at a cap an idle one, with
 * no request in hand whatever it has OPENed, is closed for a new peer, and only when every one
 * is busy is a peer refused, told to retry). Handlers registered for extra frame types (the ibverbs
 * backend's QP_CONNECT) run on connection threads. Create, start and destroy are called from the
 * engine's lifecycle thread; the other calls from any thread.
 */
#ifndef SC_PEER_SERVER_H
#define SC_PEER_SERVER_H

#include "conf/config.h"
#include "meta/keys.h"
#include "backend/passive.h"
#include "peer/proto.h"
#include "base/types.h"
#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

struct sc_gpu;
struct sc_peer_server;

/* Authenticated connections (after the hello). Connections still before their hello have their
 * own room, --data-max-unauth (per address, per /24 or /64, a quarter kept for recent peers; full,
 * its oldest silent one is closed), and deadlines: --data-first-byte-timeout, then 2 s. */
#define SC_PEER_SERVER_MAX_CONNS 1024 /* --data-max-peers' default */
/* One peer id holds at most a quarter of --data-max-peers (at least 1): at its share a new
 * connection of it closes its own idle one, or is refused while all of them are busy. */
/* Transfers one connection may hold OPENed at once (DONE not yet come, operation not ended): an
 * OPEN past it is refused RESOURCE_EXHAUSTED "this connection already has N transfers open",
 * the connection goes on. */
#define SC_PEER_SERVER_MAX_OPEN 256u
/* A connection with no request for this long is closed (the pool forgets idle ones sooner). */
#define SC_PEER_SERVER_IDLE_MS (180u * 1000u)

/*
 * Binds each of cfg->data_listen's endpoints (a comma list of "HOST:PORT", port 0 = ephemeral,
 * at most SC_MAX_ENDPOINTS; cfg->advertise: the hosts peers dial, one per endpoint in the same
 * order) and listens; no thread yet. Every endpoint serves the same hello. A port in
 * use or a bad host is an error here (FAILED_PRECONDITION with the address and the reason), so the
 * daemon fails at start-up. *out is set only on success.
 */
struct sc_peer_server_env {
	const char *self_id;           /* this sidecar's id (copied) */
	struct sc_keyring_source keys; /* the current keyring, for each hello */
	struct sc_gpu *gpu;            /* GPU access for staging GPU spans; NULL without CUDA */
	struct sc_passive passive;     /* the passive operations the connections serve */
};
int sc_peer_server_create(const struct sc_peer_server_env *env, const struct sc_config *cfg,
			  struct sc_peer_server **out, struct sc_err *err);
/* Peer TLS for every connection accepted from now on (NULL: plain TCP). tls must outlive the
 * server. Lifecycle thread, before sc_peer_server_start. */
struct sc_peer_tls;
void sc_peer_server_set_tls(struct sc_peer_server *srv, struct sc_peer_tls *tls);
/* Starts the accept thread. */
int sc_peer_server_start(struct sc_peer_server *srv, struct sc_err *err);
/* "host:port" that peers dial: --advertise if set, else the listen host, except a wildcard
 * (0.0.0.0, ::, empty) which becomes 127.0.0.1 (with a one-time WARN to set --advertise).
 * Valid from create to destroy. */
const char *sc_peer_server_endpoint(const struct sc_peer_server *srv);
/* Every data endpoint, one per --data-listen entry in its order (endpoint 0 is the one above);
 * each is a TCP rail of the tcp backend. Valid from create to destroy; at_ out of range: "". */
size_t sc_peer_server_n_endpoints(const struct sc_peer_server *srv);
const char *sc_peer_server_endpoint_at(const struct sc_peer_server *srv, size_t i);
/* Closes the listener, shuts every connection down and joins every thread. Connections that had
 * opened transfers without their DONE are reported through the passive interface (abandon). NULL ok. */
void sc_peer_server_destroy(struct sc_peer_server *srv);

/*
 * A handler for a request type the server does not serve itself (today: SC_FRAME_QP_CONNECT).
 * Runs on the connection's thread with the authenticated peer id and the request body; fills
 * reply (at most reply_cap bytes) and returns 0, or returns -1 with err (sent back as ERROR).
 * Without a handler the server answers ERROR UNIMPLEMENTED. fn NULL removes it. Returns 0, or -1
 * for a type that cannot have a handler (only SC_FRAME_QP_CONNECT can). Any thread but the
 * handler's own: replacing or removing a handler waits until its running calls return, so ctx
 * may be freed as soon as this returns.
 */
typedef int (*sc_peer_handler_fn)(void *ctx, const char *peer_id, const uint8_t *body,
				  size_t len, uint8_t *reply, size_t reply_cap, size_t *reply_len,
				  struct sc_err *err);
int sc_peer_server_set_handler(struct sc_peer_server *srv, enum sc_frame_type type,
			       sc_peer_handler_fn fn, void *ctx);

/*
 * The passive-operation interface (backend/passive.h) as seen through this server: every call goes
 * to the interface the server was created with, and claim answers for transfers that a connection
 * authenticated as the peer OPENed saying that backend `via` moves the bytes (OPEN's via-backend
 * flag: ibverbs) and whose DONE has not come; a claimed
 * transfer is no longer tracked (as after a DONE), so its connection's end does not abandon it.
 * For the ibverbs completion notices (ib/notify.c). Valid from create to destroy; any thread.
 */
struct sc_passive sc_peer_server_passive(struct sc_peer_server *srv);

/*
 * A passive operation with this token ended (complete, cancelled, released, past its deadline,
 * its region deregistered): every connection now serving a READ, WRITE, READV or WRITEV of it is
 * cut (shut down; its thread stops between two system calls, releases its spans and ends the
 * connection), so no further byte of the operation's memory is read or written. Connections that
 * only opened it are left open, but their records of it are dropped (they hold no room for it,
 * and no orphan of it is reported): their next request of it is refused. Any thread; takes only
 * the server's lock, costs O(connections serving + records of the token), never blocks.
 */
void sc_peer_server_revoke(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN]);

/* Idle peer connections closed so far to admit a new peer at --data-max-peers. Any thread. */
uint64_t sc_peer_server_evicted(const struct sc_peer_server *srv);

/* What the peer server holds now, for the metrics: authenticated connections parked (idle) or
 * being served (busy), connections before their hello, and the pool's threads. */
struct sc_peer_server_load {
	uint32_t idle, busy, hello;
	uint32_t threads, threads_waiting;
};
/* Zeroes for NULL. Takes the server's lock (walks its connections). */
void sc_peer_server_load(struct sc_peer_server *srv, struct sc_peer_server_load *out);

/*
 * Whether peer_id is idle here, and if so make it start afresh: 0 when none of its connections is
 * handling a request, holds an OPENed transfer (or left one orphaned), or finished a request less
 * than min_idle_ms ago; its idle connections are then closed, so that its next request dials anew
 * (an ibverbs requester then checks its QP with us before using it: ib/qp.c). -1 (busy) otherwise;
 * connections closed before a busy one was met stay closed, which is harmless. The ibverbs backend
 * calls it before destroying the peer's incoming QP. Any thread; takes only the server's lock.
 */
int sc_peer_server_retire_peer(struct sc_peer_server *srv, const char *peer_id,
			       uint64_t min_idle_ms);

#endif
