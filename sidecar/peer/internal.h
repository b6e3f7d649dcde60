/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/internal.h: the peer server's private structs (the server, its connections, pool threads
 * and transfer records), the constants more than one of its files uses, and the prototypes its
 * files share (prefix ps_). The files, highest first (each calls only those below it):
 * server.c (listeners, accept, life, public calls) > conns.c (parked connections, the pool,
 * eviction) > serve.c (one request) > records.c (transfers opened per connection, orphans);
 * prehello.c (the room before the hello) is called by server.c and conns.c.
 *
 * Locking: srv->mu guards the connection lists, every connection's opened list and serving token,
 * the transfer records and their indexes, the peer ids' counts, the orphans and the handler. It is
 * never held while calling the engine or doing socket I/O (a revoke only raises a flag and calls
 * shutdown under it).
 */
#ifndef SC_PEER_INTERNAL_H
#define SC_PEER_INTERNAL_H

#include "peer/server.h"

#include "backend/passive.h"
#include "base/idmap.h"
#include "base/list.h"
#include "peer/proto.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define ORPHAN_GRACE_MS 1000
#define SERVER_SLICE_MS 1000
/* Room before the hello (peer/prehello.c): addresses whose hello succeeded within RECENT_AUTH_MS
 * (at most RECENT_AUTH_SLOTS of them, the longest-silent forgotten first) have a quarter of
 * --data-max-unauth kept for them; a /24 (IPv4) or /64 (IPv6) may hold at most a quarter of the
 * rest, or --data-max-unauth-per-ip when that is larger. */
#define RECENT_AUTH_SLOTS 64
#define RECENT_AUTH_MS (10u * 60u * 1000u)
/* A pool thread's read-ahead (struct sc_peer_rxbuf): enough for a pipelined OPEN + READV + DONE
 * with a few dozen pieces, or a small WRITE with its bulk, in one recv. */
#define RX_AHEAD (16u * 1024u)
/* Replies held back at most (one OK: 8 bytes). */
#define HELD_CAP 64u

/*
 * The transfer records. A transfer (token, xfer_id) OPENed here whose DONE has not come and whose
 * operation has not ended is a struct rec, held (struct hold) by each live connection that OPENed
 * it; once the last of them ended it is an orphan for ORPHAN_GRACE_MS. Records are indexed by
 * (token, xfer_id) (srv->recs), by xfer_id (srv->by_xfer: the claim) and by token (srv->toks: the
 * revoke), so an OPEN, READ, DONE, claim or revoke costs O(1) under srv->mu whatever the number
 * of connections and records, and a connection's end O(its own records), at most
 * SC_PEER_SERVER_MAX_OPEN. The two u64 maps chain records whose keys meet (only transfers of
 * different tokens can: for one token the key is the xfer_id's bijection).
 */
struct rec;

struct orphan {
	uint8_t token[SC_TOKEN_LEN];
	uint64_t xfer_id;
	enum sc_backend_kind via;
	char peer_id[SC_NAME_MAX]; /* who opened it */
	uint64_t due_mono_ms;
	char why[SC_ERR_MSG_MAX];
	struct sc_list node; /* on srv->orphans, first due first */
	struct rec *rec;
};

struct tok { /* the records of one token */
	uint8_t token[SC_TOKEN_LEN];
	struct sc_list recs; /* struct rec */
};

struct rec {
	uint8_t token[SC_TOKEN_LEN];
	uint64_t xfer_id;
	struct sc_list holds;  /* struct hold: the live connections that OPENed it */
	struct orphan *orphan; /* once the last of them ended without its DONE */
	struct tok *tok;
	struct sc_list tok_node;
	struct rec *hash_next, *xfer_next; /* chains in srv->recs and srv->by_xfer */
};

struct hold { /* connection c OPENed rec */
	struct rec *rec;
	struct conn *c;
	enum sc_op_kind kind; /* what the peer OPENed it for: SC_OP_READ or SC_OP_WRITE */
	enum sc_backend_kind via; /* OPENed saying this backend moves the bytes (NONE: this channel) */
	struct sc_list conn_node; /* on c->opened */
	struct sc_list rec_node;  /* on rec->holds */
};

struct conn {
	struct sc_peer_server *srv;
	int fd;
	uint64_t accepted_mono_ms;
	char addr[80];          /* "1.2.3.4:5678" */
	char ip[INET6_ADDRSTRLEN]; /* "1.2.3.4": the source address, for messages */
	uint8_t net[16]; /* the source address the flood limits count by (IPv4 as ::ffff:a.b.c.d) */
	bool authed;               /* under srv->mu: the hello succeeded */
	/* Before the hello (under srv->mu): on srv->prehello, oldest first, while it holds room
	 * there; in the room kept for recently authenticated addresses; closed to admit a newer
	 * connection. */
	struct sc_list wait_node;
	bool reserved;
	bool displaced;
	char peer_id[SC_NAME_MAX];
	char what[SC_NAME_MAX + 120]; /* "peer sidecar \"id\" at addr", for messages */
	/* Under srv->mu: struct hold, the transfers it OPENed (set up when it is admitted: zeroed
	 * before), and their number (at most SC_PEER_SERVER_MAX_OPEN). */
	struct sc_list opened;
	size_t n_opened;
	struct sc_list serving_node;        /* under srv->mu: on srv->serving while serving */
	bool serving;                       /* under srv->mu: a data request holds spans of... */
	uint8_t serving_token[SC_TOKEN_LEN]; /* ...this operation */
	atomic_bool revoked; /* that operation ended mid-request: stop moving bytes, end */
	bool refused;        /* its thread only: the request being served was answered ERROR */
	/* CONN_IDLE while parked, CONN_BUSY while a pool thread serves it (its hello or a
	 * request), CONN_EVICTED once closed to admit a new peer, CONN_EXPIRED once closed for
	 * idling (only a parked one is: compare-and-swap; its shutdown wakes a pool thread). */
	atomic_int state;
	atomic_bool retired; /* evicted by sc_peer_server_retire_peer, not for --data-max-peers */
	atomic_uint_fast64_t last_active_mono_ms; /* the end of its last request (or the hello) */
	atomic_uint_fast64_t last_active_seq;     /* its last request's arrival (or the hello) in
						   * srv->activity order: the LRU order */
	struct sc_list node; /* on srv->live, then srv->dead; newest first */
	uint8_t *buf; /* while served: the pool thread's frame buffer */
	size_t buf_cap;
	struct sc_peer_rxbuf *rb; /* while served without TLS: the pool thread's read-ahead */
	struct held *held;        /* while served without TLS: replies held back (struct held) */
};

/* A reply held back to leave with the next send (a pool thread's; see serve_open(), in
 * peer/serve.c). */
struct held {
	size_t len;
	uint8_t p[HELD_CAP];
};

enum { CONN_IDLE = 0, CONN_BUSY, CONN_EVICTED, CONN_EXPIRED };

/*
 * Read-ahead: without TLS a pool thread reads a connection's frames through its own buffer
 * (worker.rb, RX_AHEAD bytes; peer/proto.h), so one recv brings a pipelined OPEN + READV, or a
 * request and the next. The invariant: the buffer is empty whenever the thread has no connection
 * taken. A connection is parked only when input_waiting() says nothing is here, and input_waiting
 * answers yes while the buffer holds a byte (epoll would never announce bytes already read); a
 * connection that ends drops what was read ahead with it. Every read of the connection's bytes
 * (frames, WRITE/WRITEV bulk into host or GPU memory) takes what is buffered first. So the
 * buffering costs a parked connection nothing. Under TLS the stream reads records itself and
 * the buffer is not used (c->rb NULL). An OPEN's OK whose transfer's READ or READV is already
 * read ahead whole (the pipelined OPEN + READV of a small transfer) is held back (worker.held)
 * and leaves in the same sendmsg as that READ's DATA header and bulk; whatever is held is sent
 * before any other reply, and before the connection is parked or closed.
 */
/* A pool thread. */
struct worker {
	struct sc_peer_server *srv;
	pthread_t thread;
	struct sc_list node; /* on srv->workers, then srv->dead_workers */
	uint8_t buf[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
	struct sc_peer_rxbuf rb; /* over rx_mem; empty whenever no connection is taken */
	uint8_t rx_mem[RX_AHEAD];
	struct held held; /* empty whenever no connection is taken */
};

/* One advertised endpoint's text (never changed once published; see sc_peer_server.endpoint). */
struct ps_endpoint {
	struct ps_endpoint *next;
	char text[80];
};

struct sc_peer_server {
	struct sc_passive passive; /* the engine's passive operations (backend/passive.h) */
	char self_id[SC_NAME_MAX];
	struct sc_keyring_source keys; /* for each hello */
	struct sc_gpu *gpu;            /* staging GPU spans; NULL without CUDA */
	int listen_fd[SC_MAX_ENDPOINTS]; /* one per --data-listen entry */
	size_t n_listen;
	int wake_fd;
	int epfd;    /* parked connections (one-shot) and stop_fd */
	int stop_fd; /* written once, at destroy: level-triggered, it wakes every pool thread */
	int spare_fd; /* /dev/null, given up to refuse a peer with a reason when out of fds */
	char listen_addr[SC_MAX_ENDPOINTS][300];
	/* What peers dial, in --data-listen order: "host:port" text in a struct ps_endpoint. An
	 * --advertise if:NAME entry (adv_if[i] non-empty) is re-resolved by the accept thread every
	 * IF_CHECK_MS; a change swaps the pointer, and the old text stays allocated (on
	 * `endpoints`) until destroy, so a reader's pointer is never freed under it. */
	_Atomic(struct ps_endpoint *) endpoint[SC_MAX_ENDPOINTS];
	struct ps_endpoint *endpoints;	       /* every text ever current; freed at destroy */
	char adv_if[SC_MAX_ENDPOINTS][16];     /* the interface of if:NAME entries, else "" */
	uint16_t bound_port[SC_MAX_ENDPOINTS]; /* the data port of each endpoint */
	uint64_t last_if_check_mono_ms;	       /* accept thread only */
	bool if_missing[SC_MAX_ENDPOINTS];     /* accept thread only: said once per loss */
	pthread_t accept_thread;
	bool started, accept_started;
	atomic_bool stopping;

	pthread_mutex_t mu;
	pthread_cond_t cv;   /* a connection ended; a handler call ended */
	struct sc_list live; /* struct conn: threads running */
	struct sc_list dead; /* struct conn: ended, to free */
	struct sc_list workers;      /* struct worker: running */
	struct sc_list dead_workers; /* struct worker: ended, to join */
	uint32_t n_workers, n_waiting; /* running; of them, waiting for a connection */
	uint32_t min_workers;          /* --data-io-threads */
	uint64_t idle_ms; /* SC_PEER_SERVER_IDLE_MS (tests: SC_TEST_PEER_IDLE_MS) */
	uint64_t last_sweep_mono_ms;   /* accept thread only */
	size_t n_live;
	size_t n_unauth; /* live connections before their hello (limits: max_unauth*) */
	size_t n_authed; /* live connections after it (limit: max_peers) */
	uint32_t max_peers; /* --data-max-peers */
	atomic_uint_fast64_t n_evicted; /* idle connections closed to admit a new peer */
	/* Orders the ends of requests exactly (milliseconds tie): the least recently used idle
	 * connection is the one with the smallest number. */
	atomic_uint_fast64_t activity_seq;
	uint32_t max_unauth_per_ip, max_unauth;
	/* Before the hello (peer/prehello.c): connections holding room, oldest first; of them, in the
	 * general room [0] and in the room kept for recently authenticated addresses [1]. */
	struct sc_list prehello;
	size_t n_waiting_room[2];
	uint32_t reserved_room, max_unauth_per_prefix; /* derived from max_unauth, max_unauth_per_ip */
	uint64_t first_byte_ms; /* --data-first-byte-timeout */
	struct recent_auth {
		uint8_t net[16];
		uint64_t mono_ms; /* its last hello that succeeded; 0: a free slot */
	} recent_auth[RECENT_AUTH_SLOTS]; /* under mu */
	struct sc_peer_tls *tls; /* NULL: plain TCP */
	struct sc_list orphans; /* struct orphan */
	struct sc_u64map recs;    /* struct rec by rec_key(token, xfer_id), chained */
	struct sc_u64map by_xfer; /* struct rec by xfer_id, chained */
	struct sc_idmap *toks;    /* struct tok by token */
	struct sc_idmap *idents;  /* struct ident by ident_key(peer id) */
	struct sc_list serving;   /* struct conn: serving a data request (serving_node) */
	uint32_t max_per_id;      /* one peer id's share of max_peers */
	sc_peer_handler_fn qp_fn;
	void *qp_ctx;
	unsigned qp_busy;
};

/* peer/conns.c: parked connections, the pool threads, eviction. */
void ps_wake(struct sc_peer_server *srv);
void ps_conn_finish(struct conn *c, const char *why);
bool ps_idle_locked(const struct conn *o);
bool ps_evict_locked(struct sc_peer_server *srv, struct conn *o, bool retired);
void ps_sweep(struct sc_peer_server *srv);
int ps_spawn_worker_locked(struct sc_peer_server *srv);
void ps_reap(struct sc_peer_server *srv);

/* peer/serve.c: one request. */
int ps_serve_one(struct conn *c, char *why, size_t why_cap);
void ps_held_flush(struct conn *c);
void ps_drain_before_close(int fd);
void ps_mark_active(struct conn *c);

/* peer/records.c: transfers opened per connection, and orphans. */
void ps_hold_free_locked(struct hold *h);
void ps_rec_drop_locked(struct sc_peer_server *srv, struct rec *r);
bool ps_open_room(struct conn *c, const struct sc_peer_msg *m, struct sc_err *err);
int ps_track(struct conn *c, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
	     enum sc_op_kind kind, enum sc_backend_kind via);
bool ps_opened_here(struct conn *c, const struct sc_peer_msg *m, enum sc_op_kind kind,
		    struct sc_err *err);
void ps_untrack_everywhere(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN],
			   uint64_t xfer_id);
int ps_claim(struct sc_peer_server *srv, const char *peer_id, uint64_t xfer_id,
	     enum sc_backend_kind via, uint8_t token[SC_TOKEN_LEN]);
uint64_t ps_expire_orphans(struct sc_peer_server *srv, bool all);

/* peer/prehello.c: the room before the hello (all under srv->mu). */
bool ps_prehello_make_room_locked(struct sc_peer_server *srv, const uint8_t net[16],
				  const char *addr, uint64_t now, bool *reserved);
void ps_prehello_leave_locked(struct sc_peer_server *srv, struct conn *c);
void ps_recent_auth_note_locked(struct sc_peer_server *srv, const uint8_t net[16], uint64_t now);

#endif
