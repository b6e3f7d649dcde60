/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/pool.h: the dialing side of the peer control channel. A pool of authenticated connections
 * to peer sidecars, keyed by endpoint ("host:port"). The blocking client calls that run one
 * request/reply on a connection are in peer/request.h.
 *
 * A connection is used by one thread at a time (the one that got it); sc_peer_conn_abort is the
 * only call another thread may make on it, to interrupt a blocked call. Every call here and in
 * peer/request.h honours a monotonic deadline (0 = none) and an optional cancel flag; a blocked
 * call notices them within SC_PEER_IO_SLICE_MS. Errors:
 *   - a remote ERROR frame: its code, message "peer <id>: <msg>" (the connection stays usable,
 *     except after a refused WRITE, which the server closes);
 *   - EOF / reset: UNAVAILABLE "peer sidecar <id> at H:P closed the connection mid-transfer";
 *   - deadline: DEADLINE_EXCEEDED; cancel flag: CANCELLED; garbage from the peer: INTERNAL.
 * After any failure other than a remote ERROR the connection is marked broken, and
 * sc_peer_pool_put closes it whatever `reusable` says.
 * The pool itself is thread-safe.
 */
#ifndef SC_PEER_POOL_H
#define SC_PEER_POOL_H

#include "base/status.h"
#include "base/types.h"
#include "meta/metadata.h"
#include "peer/proto.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sc_peer_pool;
struct sc_peer_conn;

/* Idle connections kept per endpoint, and how long one may stay idle before it is closed. */
#define SC_PEER_POOL_IDLE_PER_ENDPOINT 8
#define SC_PEER_POOL_IDLE_MS (60u * 1000u)
/* Dialing (TCP connect) gives up after this long even when the caller's deadline is later. */
#define SC_PEER_CONNECT_TIMEOUT_MS 10000

/* self_id: this sidecar's id, said in every hello (copied); keys: where each hello finds the
 * current keyring (copied; its ctx must outlive the pool). *out is set only on success. */
int sc_peer_pool_create(const char *self_id, const struct sc_keyring_source *keys,
			struct sc_peer_pool **out, struct sc_err *err);
/* Peer TLS for every connection dialed from now on (NULL: plain TCP). tls must outlive the
 * pool. Lifecycle thread, before the first sc_peer_pool_get. */
struct sc_peer_tls;
void sc_peer_pool_set_tls(struct sc_peer_pool *pool, struct sc_peer_tls *tls);
/* The request a new connection sends right after its hello to learn whether the peer admits it
 * under its caps (the peer decides only after the hello, and says "busy: retry in ..." when it
 * does not): the engine hands in sc_peer_ping (peer/request.h), so the pool never calls up into
 * the requests that run on its connections. A "busy" answer is retried with back-off within the
 * caller's deadline. NULL (the default): none. Lifecycle thread, before the first get. */
struct sc_peer_conn;
typedef int (*sc_peer_admit_fn)(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
				const atomic_bool *cancel, struct sc_err *err);
void sc_peer_pool_set_admit(struct sc_peer_pool *pool, sc_peer_admit_fn admit);
/* Closes idle connections. Connections still out must be put back first. NULL ok. */
void sc_peer_pool_destroy(struct sc_peer_pool *pool);

/*
 * An authenticated connection to endpoint ("host:port", "[v6]:port"): an idle one when the pool
 * has one that is still open, else a new one (connect with a timeout, then the hello). Errors:
 * UNAVAILABLE "cannot reach peer sidecar at H:P: <reason>", UNAUTHENTICATED (hello refused in
 * either direction, no --key-file), DEADLINE_EXCEEDED, INVALID_ARGUMENT (bad endpoint).
 */
int sc_peer_pool_get(struct sc_peer_pool *pool, const char *endpoint, uint64_t deadline_mono_ms,
		     struct sc_peer_conn **out, struct sc_err *err);
/* The same; a new connection that was refused, reset or closed before the hello, or that the peer
 * refused as busy (RESOURCE_EXHAUSTED "... busy: retry in a few seconds", asked with a PING after
 * the hello: its caps admit a connection only then), is dialed again with backoff (50 ms
 * doubling to 1 s) until the deadline (SC_PEER_CONNECT_TIMEOUT_MS when 0), and cancel (NULL:
 * none) ends the retries with CANCELLED. */
int sc_peer_pool_get_cancellable(struct sc_peer_pool *pool, const char *endpoint,
				 uint64_t deadline_mono_ms, const atomic_bool *cancel,
				 struct sc_peer_conn **out, struct sc_err *err);
/* A connection to the sidecar that issued md: its control endpoints tried in order (each as
 * sc_peer_pool_get_cancellable), the first one that is md's issuer (checked against its TLS
 * identity, and its hello's id) wins; *endpoint: its index in md->endpoints. cancel (NULL: none)
 * ends a dial or a hello in progress with CANCELLED (a stopped peer never answers the hello).
 * NULL with err set when none is (a deadline, a cancel or an impostor ends the search at once).
 * The backends' workers call it. */
struct sc_peer_conn *sc_peer_pool_get_issuer(struct sc_peer_pool *pool,
					     const struct sc_metadata *md,
					     uint64_t deadline_mono_ms, const atomic_bool *cancel,
					     int *endpoint, struct sc_err *err);
/* Give a connection back: kept for reuse when reusable, not broken and there is room; else
 * closed. NULL conn ok. */
void sc_peer_pool_put(struct sc_peer_pool *pool, struct sc_peer_conn *conn, bool reusable);
/* Whether an idle connection to endpoint is pooled now (a hint: another thread may take it, and
 * sc_peer_pool_get may still find it dead and dial). */
bool sc_peer_pool_has_idle(struct sc_peer_pool *pool, const char *endpoint);

int sc_peer_conn_fd(const struct sc_peer_conn *conn);
/* The authenticated id of the sidecar at the other end: the one its verified certificate names
 * (peer TLS with --peer-identity), else the one its hello claimed. */
const char *sc_peer_conn_peer_id(const struct sc_peer_conn *conn);
/* Before a transfer sends or receives a byte on conn: when the certificate of the sidecar reached
 * names an identity, it must be issuer. Else PERMISSION_DENIED "sidecar at H:P presents the
 * certificate of "M", not the metadata's issuer "A"" (the caller closes conn and stops). */
int sc_peer_conn_check_issuer(const struct sc_peer_conn *conn, const char *issuer,
			      struct sc_err *err);
const char *sc_peer_conn_endpoint(const struct sc_peer_conn *conn);
/* False once a call failed in a way that leaves the stream's state unknown. */
bool sc_peer_conn_usable(const struct sc_peer_conn *conn);
/* Did this connection come from the idle list (true) or from a fresh dial (false)? A reused one
 * may lead to a peer that went away unseen (its FIN lost in a partition, the peer restarted on the
 * same address): its first request fails at once, and a caller may retry on another connection. */
bool sc_peer_conn_reused(const struct sc_peer_conn *conn);
/* Did a call end because the peer closed or reset the connection (rather than an error on this
 * side, a timeout or a stall)? */
bool sc_peer_conn_peer_closed(const struct sc_peer_conn *conn);
/* Interrupt whatever call is blocked on conn (shutdown(SHUT_RDWR)) and mark it broken. Any thread,
 * as long as the conn has not been put back. */
void sc_peer_conn_abort(struct sc_peer_conn *conn);
/* The next request sent on the connection is held back (MSG_MORE) until the one after it, so
 * both leave in one segment (an OPEN before its first data request, a data request before its
 * DONE). */
void sc_peer_conn_hold_next(struct sc_peer_conn *conn);
/* From now until the connection is put back, a request on it fails (DEADLINE_EXCEEDED, the
 * connection broken) when no byte moves for ms (0: no limit, only the deadline): how a data path
 * that died without a reset is noticed sooner than TCP_USER_TIMEOUT. */
void sc_peer_conn_set_stall(struct sc_peer_conn *conn, uint32_t ms);
/* Send whatever sc_peer_open_send or sc_peer_conn_hold_next held back. */
void sc_peer_conn_flush(struct sc_peer_conn *conn);

#endif
