/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/server.c: the data listeners (--data-listen: one per data endpoint, each a TCP rail, all
 * serving the same hello and the same passive operations) and the peer connections they accept. Each
 * connection authenticates with the hello, then serves OPEN / READ / WRITE / DONE / PING through
 * the passive-operation interface it was handed (backend/passive.h: the engine checks token, direction,
 * bounds, deadline and state), and QP_CONNECT through the handler the ibverbs backend registers.
 * It also offers that interface on, with the claim of a transfer OPENed "via backend" added
 * (sc_peer_server_passive), for the ibverbs completion notices. READ sends straight from the pinned span and
 * WRITE receives straight into it: no staging copy.
 *
 * Threads: the accept thread (accepts on every listener, closes connections idle too long or
 * still without their hello, frees finished ones, reports orphaned transfers) and a pool of
 * connection threads, not one per connection. A connection with no request in hand is parked in
 * an epoll set (one-shot); whichever pool thread is waiting takes it when bytes arrive, serves the
 * hello or the requests that are there (each with the blocking, deadline-bounded I/O of
 * peer/proto.h, in the thread's own frame buffer) and parks it again. --data-io-threads threads
 * wait; while every one is busy another starts, so a stalled peer holds one thread and never
 * another peer; those beyond the number end after WORKER_IDLE_MS without work. A parked
 * connection costs its struct conn (about 1 KB) and its socket, whatever the number of peers.
 * The server owns the listening sockets, the epoll set, a wake-up eventfd, every connection and
 * the list of orphaned transfers.
 *
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
 *
 * A transfer (token, xfer_id) opened on a connection is tracked (struct rec) until its DONE
 * arrives (on any connection, since the active side spreads one transfer over several) or its
 * operation ends (sc_peer_server_revoke). When the last connection that opened it ends without a
 * DONE, the transfer becomes an orphan: after ORPHAN_GRACE_MS (time for a DONE still on its way on
 * another connection, e.g. after the active side cancelled and cut its streams) the engine is told
 * through the interface's abandon. A connection holds at most SC_PEER_SERVER_MAX_OPEN of them and
 * they hold no slot: a connection with no request in hand may be closed for a new peer whatever it
 * has opened. The records are hashed, so nothing a peer OPENs makes another request, a hello or a
 * connection's end walk them (see struct rec).
 *
 * Access ends with the operation: while a connection serves a READ, WRITE, READV or WRITEV it
 * says which token (serving_begin/serving_end). When that operation ends the engine calls
 * sc_peer_server_revoke, which raises the connection's `revoked` flag and shuts its socket down:
 * the blocked send or receive returns at once, the I/O loop stops before its next system call,
 * the spans are released and the connection ends. One request's I/O is also bounded by the
 * operation's deadline (struct sc_span).
 *
 * Locking: srv->mu guards the connection lists, every connection's opened list and serving token,
 * the transfer records and their indexes, the peer ids' counts, the orphans and the handler. It is
 * never held while calling the engine or doing socket I/O (a revoke only raises a flag and calls
 * shutdown under it).
 */
#include "peer/server.h"
#include "peer/stage.h"

#include "base/list.h"
#include "net/listen.h"
#include "base/log.h"
#include "base/idmap.h"
#include "backend/passive.h"
#include "peer/proto.h"
#include "peer/tls.h"
#include "base/timer.h"
#include "base/trace.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define ORPHAN_GRACE_MS 1000
/* A request or reply that stops moving for this long ends its connection. */
#define STALL_MS 30000
#define CONN_STACK_BYTES (512u * 1024u)
/* A pool thread beyond --data-io-threads ends after this long without a connection to serve. */
#define WORKER_IDLE_MS 10000
/* How often the accept thread looks for connections idle too long or without their hello. */
#define SWEEP_MS 250
#define SERVER_SLICE_MS 1000
/* A new connection's first byte (its TLS ClientHello or its hello) must arrive within
 * --data-first-byte-timeout (1 s; a dialing sidecar sends at once), and the TLS handshake and the
 * hello must end within UNAUTH_HELLO_MS after that: 3 s from the accept by default, sooner than
 * the dialing side's SC_PEER_HELLO_TIMEOUT_MS. */
#define UNAUTH_HELLO_MS 2000
/* Room before the hello (see accept_one): addresses whose hello succeeded within RECENT_AUTH_MS
 * (at most RECENT_AUTH_SLOTS of them, the longest-silent forgotten first) have a quarter of
 * --data-max-unauth kept for them; a /24 (IPv4) or /64 (IPv6) may hold at most a quarter of the
 * rest, or --data-max-unauth-per-ip when that is larger. */
#define RECENT_AUTH_SLOTS 64
#define RECENT_AUTH_MS (10u * 60u * 1000u)
/* After refusing a hello with an ERROR frame, read what the peer still sends for this long, so
 * the close does not reset the connection before the peer has read why. */
#define REFUSAL_DRAIN_MS 200
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

/* The authenticated connections of one peer id (its share of --data-max-peers). */
struct ident {
	char id[SC_NAME_MAX];
	uint32_t n;
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

/* A reply held back to leave with the next send (a pool thread's; see serve_open()). */
struct held {
	size_t len;
	uint8_t p[HELD_CAP];
};

enum { CONN_IDLE = 0, CONN_BUSY, CONN_EVICTED, CONN_EXPIRED };

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
	char endpoint[SC_MAX_ENDPOINTS][80]; /* what peers dial, in --data-listen order */
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
	/* Before the hello (accept_one): connections holding room, oldest first; of them, in the
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

/* ---- small helpers --------------------------------------------------------------------------- */

static void wake(struct sc_peer_server *srv)
{
	uint64_t one = 1;
	ssize_t n = write(srv->wake_fd, &one, sizeof(one));
	(void)n;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
		snprintf(out, cap, "%s:%u", host, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
		snprintf(out, cap, "[%s]:%u", host, port);
	} else {
		snprintf(out, cap, "(unknown address family %d)", sa->sa_family);
	}
}

/* ---- transfer records (struct rec; all under srv->mu) ---------------------------------------- */

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* For one token a bijection of xfer_id, so only records of different tokens share a key. */
static uint64_t rec_key(const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	uint64_t t = rd64(token + 8);
	return xfer_id ^ rd64(token) ^ (t << 29 | t >> 35);
}

static struct rec **chain_next(struct rec *r, bool by_xfer)
{
	return by_xfer ? &r->xfer_next : &r->hash_next;
}

/* Add r to the chain at key (second when there is one: the map is not touched). */
static int chain_add(struct sc_u64map *m, uint64_t key, struct rec *r, bool by_xfer)
{
	struct rec *head = sc_u64map_get(m, key);
	if (!head) {
		*chain_next(r, by_xfer) = NULL;
		return sc_u64map_put(m, key, r);
	}
	*chain_next(r, by_xfer) = *chain_next(head, by_xfer);
	*chain_next(head, by_xfer) = r;
	return 0;
}

static void chain_del(struct sc_u64map *m, uint64_t key, struct rec *r, bool by_xfer)
{
	struct rec *head = sc_u64map_get(m, key);
	if (head == r) {
		struct rec *next = *chain_next(r, by_xfer);
		if (next)
			sc_u64map_replace(m, key, next);
		else
			sc_u64map_del(m, key);
		return;
	}
	for (struct rec *p = head; p; p = *chain_next(p, by_xfer)) {
		if (*chain_next(p, by_xfer) == r) {
			*chain_next(p, by_xfer) = *chain_next(r, by_xfer);
			return;
		}
	}
}

static struct rec *rec_find_locked(const struct sc_peer_server *srv,
				   const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	for (struct rec *r = sc_u64map_get(&srv->recs, rec_key(token, xfer_id)); r; r = r->hash_next)
		if (r->xfer_id == xfer_id && memcmp(r->token, token, SC_TOKEN_LEN) == 0)
			return r;
	return NULL;
}

/* A new record, indexed three ways; NULL when out of memory. */
static struct rec *rec_new_locked(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN],
				  uint64_t xfer_id)
{
	struct rec *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	memcpy(r->token, token, SC_TOKEN_LEN);
	r->xfer_id = xfer_id;
	sc_list_init(&r->holds);
	struct tok *t = sc_idmap_get(srv->toks, token, SC_TOKEN_LEN);
	bool new_tok = !t;
	if (new_tok) {
		t = calloc(1, sizeof(*t));
		if (!t)
			goto fail;
		memcpy(t->token, token, SC_TOKEN_LEN);
		sc_list_init(&t->recs);
		if (sc_idmap_put(srv->toks, token, SC_TOKEN_LEN, t) != 0) {
			free(t);
			goto fail;
		}
	}
	if (chain_add(&srv->recs, rec_key(token, xfer_id), r, false) != 0)
		goto fail_tok;
	if (chain_add(&srv->by_xfer, xfer_id, r, true) != 0) {
		chain_del(&srv->recs, rec_key(token, xfer_id), r, false);
		goto fail_tok;
	}
	r->tok = t;
	sc_list_insert_tail(&t->recs, &r->tok_node);
	return r;
fail_tok:
	if (new_tok) {
		sc_idmap_del(srv->toks, token, SC_TOKEN_LEN);
		free(t);
	}
fail:
	free(r);
	return NULL;
}

static void hold_free_locked(struct hold *h)
{
	sc_list_remove(&h->conn_node);
	sc_list_remove(&h->rec_node);
	h->c->n_opened--;
	free(h);
}

/* The transfer ended (its DONE, its claim, its operation's end, or as an orphan told): forget it
 * everywhere. */
static void rec_drop_locked(struct sc_peer_server *srv, struct rec *r)
{
	while (!sc_list_empty(&r->holds))
		hold_free_locked(sc_list_entry(sc_list_first(&r->holds), struct hold, rec_node));
	if (r->orphan) {
		sc_list_remove(&r->orphan->node);
		free(r->orphan);
	}
	chain_del(&srv->recs, rec_key(r->token, r->xfer_id), r, false);
	chain_del(&srv->by_xfer, r->xfer_id, r, true);
	sc_list_remove(&r->tok_node);
	if (sc_list_empty(&r->tok->recs)) {
		sc_idmap_del(srv->toks, r->token, SC_TOKEN_LEN);
		free(r->tok);
	}
	free(r);
}

static struct hold *hold_of(const struct rec *r, const struct conn *c)
{
	const struct sc_list *pos;
	sc_list_foreach(pos, &r->holds) {
		struct hold *h = sc_list_entry(pos, struct hold, rec_node);
		if (h->c == c)
			return h;
	}
	return NULL;
}

/* May this connection OPEN (token, xfer_id)? Not past SC_PEER_SERVER_MAX_OPEN open transfers,
 * unless it holds this one already (another OPEN of it). Asked before the engine, so a refused
 * OPEN claims no use. Only the connection's own thread adds to its records, so the room is still
 * there when it tracks the transfer. */
static bool open_room(struct conn *c, const struct sc_peer_msg *m, struct sc_err *err)
{
	struct sc_peer_server *srv = c->srv;
	pthread_mutex_lock(&srv->mu);
	bool ok = c->n_opened < SC_PEER_SERVER_MAX_OPEN;
	if (!ok) {
		const struct rec *r = rec_find_locked(srv, m->token, m->xfer_id);
		ok = r && hold_of(r, c);
	}
	size_t n = c->n_opened;
	pthread_mutex_unlock(&srv->mu);
	if (ok)
		return true;
	sc_err_set(err, SC_RESOURCE_EXHAUSTED,
		   "this connection already has %zu transfers open on sidecar %s (the most one "
		   "peer connection may hold): send their DONE, or OPEN on another connection",
		   n, srv->self_id);
	SC_WARN_LIMITED("peer", "peer-open-cap", "refused an OPEN from %s: %s", c->what, err->msg);
	return false;
}

/* Track a transfer this connection opened. Returns -1 when out of memory. */
static int track(struct conn *c, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_op_kind kind, enum sc_backend_kind via)
{
	struct sc_peer_server *srv = c->srv;
	int rc = 0;
	pthread_mutex_lock(&srv->mu);
	struct rec *r = rec_find_locked(srv, token, xfer_id);
	if (!r && !(r = rec_new_locked(srv, token, xfer_id))) {
		rc = -1;
		goto out;
	}
	if (r->orphan) { /* OPENed again: no longer an orphan */
		sc_list_remove(&r->orphan->node);
		free(r->orphan);
		r->orphan = NULL;
	}
	if (hold_of(r, c))
		goto out;
	struct hold *h = calloc(1, sizeof(*h));
	if (!h) {
		if (sc_list_empty(&r->holds))
			rec_drop_locked(srv, r);
		rc = -1;
		goto out;
	}
	h->rec = r;
	h->c = c;
	h->kind = kind;
	h->via = via;
	sc_list_insert_tail(&r->holds, &h->rec_node);
	sc_list_insert_tail(&c->opened, &h->conn_node);
	c->n_opened++;
out:
	pthread_mutex_unlock(&srv->mu);
	return rc;
}

/* Was the transfer OPENed on this connection, for this direction? READ and WRITE must be, so a
 * peer can never write into memory it opened for reading (or read what it may only write). */
static bool opened_here(struct conn *c, const struct sc_peer_msg *m, enum sc_op_kind kind,
			struct sc_err *err)
{
	bool found = false, ok = false;
	pthread_mutex_lock(&c->srv->mu);
	const struct rec *r = rec_find_locked(c->srv, m->token, m->xfer_id);
	const struct hold *h = r ? hold_of(r, c) : NULL;
	if (h) {
		found = true;
		ok = h->kind == kind;
	}
	pthread_mutex_unlock(&c->srv->mu);
	if (!found)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "%s of transfer %016" PRIx64 " before its OPEN on this connection (or "
			   "after its DONE, or after its operation ended)",
			   sc_frame_type_name(m->type), m->xfer_id);
	else if (!ok)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "%s of transfer %016" PRIx64 ", which was opened for %s",
			   sc_frame_type_name(m->type), m->xfer_id,
			   kind == SC_OP_READ ? "WRITE" : "READ");
	return ok;
}

/* DONE arrived: no connection is responsible for the transfer any more. */
static void untrack_everywhere(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN],
			       uint64_t xfer_id)
{
	pthread_mutex_lock(&srv->mu);
	struct rec *r = rec_find_locked(srv, token, xfer_id);
	if (r)
		rec_drop_locked(srv, r);
	pthread_mutex_unlock(&srv->mu);
}

/* The passive interface's claim (backend/passive.h): a transfer that peer_id OPENed here via `via`. */
static int claim(struct sc_peer_server *srv, const char *peer_id, uint64_t xfer_id,
		 enum sc_backend_kind via, uint8_t token[SC_TOKEN_LEN])
{
	struct rec *found = NULL;
	if (via == SC_BACKEND_NONE)
		return -1;
	pthread_mutex_lock(&srv->mu);
	for (struct rec *r = sc_u64map_get(&srv->by_xfer, xfer_id); r && !found; r = r->xfer_next) {
		if (r->xfer_id != xfer_id)
			continue;
		if (r->orphan && r->orphan->via == via && strcmp(r->orphan->peer_id, peer_id) == 0)
			found = r;
		const struct sc_list *pos;
		sc_list_foreach(pos, &r->holds) {
			const struct hold *h = sc_list_entry(pos, struct hold, rec_node);
			if (h->via == via && h->c->authed && strcmp(h->c->peer_id, peer_id) == 0)
				found = r;
		}
	}
	if (found) {
		memcpy(token, found->token, SC_TOKEN_LEN);
		rec_drop_locked(srv, found);
	}
	pthread_mutex_unlock(&srv->mu);
	return found ? 0 : -1;
}

/* Tell the engine about orphans that are due (all of them when `all`). Accept thread or destroy.
 * The orphans are in the order they fall due (each is due ORPHAN_GRACE_MS after its making). */
static uint64_t expire_orphans(struct sc_peer_server *srv, bool all)
{
	uint64_t now = sc_clock_mono_ms();
	uint64_t next_due = 0;
	struct sc_list due = SC_LIST_INIT(due);
	struct sc_list *pos, *tmp;
	pthread_mutex_lock(&srv->mu);
	while (!sc_list_empty(&srv->orphans)) {
		struct orphan *o = sc_list_entry(sc_list_first(&srv->orphans), struct orphan, node);
		if (!all && o->due_mono_ms > now) {
			next_due = o->due_mono_ms;
			break;
		}
		sc_list_remove(&o->node);
		sc_list_insert_tail(&due, &o->node);
		o->rec->orphan = NULL;
		rec_drop_locked(srv, o->rec);
		o->rec = NULL;
	}
	pthread_mutex_unlock(&srv->mu);
	sc_list_foreach_safe(pos, tmp, &due) {
		struct orphan *o = sc_list_entry(pos, struct orphan, node);
		sc_passive_abandon(&srv->passive, o->token, o->xfer_id, o->why);
		free(o);
	}
	return next_due;
}

/* ---- peer ids and their share of --data-max-peers (struct ident; under srv->mu) ------------- */

/* The id itself when it fits the map's key, else its first 40 bytes and a hash of the rest (ids
 * that meet there share one count: harmless). */
static size_t ident_key(const char *id, uint8_t key[SC_IDMAP_KEY_MAX])
{
	size_t n = strlen(id);
	if (n <= SC_IDMAP_KEY_MAX) {
		memcpy(key, id, n);
		return n;
	}
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)id[i]) * 1099511628211ull;
	memcpy(key, id, SC_IDMAP_KEY_MAX - 8);
	memcpy(key + SC_IDMAP_KEY_MAX - 8, &h, 8);
	return SC_IDMAP_KEY_MAX;
}

static struct ident *ident_get_locked(struct sc_peer_server *srv, const char *id, bool make)
{
	uint8_t key[SC_IDMAP_KEY_MAX];
	size_t klen = ident_key(id, key);
	struct ident *p = sc_idmap_get(srv->idents, key, klen);
	if (p || !make)
		return p;
	if (!(p = calloc(1, sizeof(*p))))
		return NULL;
	snprintf(p->id, sizeof(p->id), "%s", id);
	if (sc_idmap_put(srv->idents, key, klen, p) != 0) {
		free(p);
		return NULL;
	}
	return p;
}

/* An authenticated connection of this id leaves the count (evicted or ended). */
static void ident_leave_locked(struct sc_peer_server *srv, const struct conn *c)
{
	uint8_t key[SC_IDMAP_KEY_MAX];
	size_t klen = ident_key(c->peer_id, key);
	struct ident *p = sc_idmap_get(srv->idents, key, klen);
	if (p && --p->n == 0) {
		sc_idmap_del(srv->idents, key, klen);
		free(p);
	}
}

/* ---- replies --------------------------------------------------------------------------------- */

static const struct sc_peer_wait *busy_wait(const struct conn *c, struct sc_peer_wait *w)
{
	*w = (struct sc_peer_wait){
	    .stall_ms = STALL_MS, .cancel = &c->revoked, .stop = &c->srv->stopping};
	return w;
}

/* A data request of this token starts (before its first span is pinned) or ends (after its last
 * is released): from begin to end, sc_peer_server_revoke cuts this connection. */
static void serving_begin(struct conn *c, const uint8_t token[SC_TOKEN_LEN])
{
	pthread_mutex_lock(&c->srv->mu);
	memcpy(c->serving_token, token, SC_TOKEN_LEN);
	c->serving = true;
	sc_list_insert_tail(&c->srv->serving, &c->serving_node);
	pthread_mutex_unlock(&c->srv->mu);
}

static void serving_end(struct conn *c)
{
	pthread_mutex_lock(&c->srv->mu);
	c->serving = false;
	sc_list_remove(&c->serving_node);
	pthread_mutex_unlock(&c->srv->mu);
}

/* Why a request's I/O stopped, when it was the operation that ended (revoked) or its deadline:
 * else the I/O error as usual. */
static void io_stop_reason(const struct conn *c, enum sc_peer_io rc, int e, struct sc_err *err)
{
	if (atomic_load(&c->revoked))
		sc_err_set(err, SC_CANCELLED,
			   "the operation ended (completed, cancelled, released, past its deadline "
			   "or its region deregistered) while %s was still moving its bytes: "
			   "connection cut, no further byte moves",
			   c->what);
	else
		sc_peer_io_err(rc, e, c->what, err);
}

/*
 * Whether the next request is already here and answered at once: an OPEN, READ or DONE (a
 * pipelined single-stream transfer sends OPEN, its data requests and DONE back to back), or a
 * WRITE whose bytes have all arrived too. The reply about to go out then waits for the next one
 * (MSG_MORE) and both leave together: the peer wakes once, not once per reply. Never before a
 * WRITE still arriving (its bulk may be slow) or anything else, nor under TLS (the bytes on the
 * socket are records, not frames). A reply held this way leaves with the next reply or when the
 * connection closes.
 */
static bool next_request_prompt(const struct conn *c)
{
	struct sc_peer_rxbuf *rb = c->rb;
	if (c->srv->tls || !rb)
		return false;
	/* What has arrived is read ahead (not peeked): the next request is served from it. */
	if (sc_peer_rxbuf_avail(rb) < SC_PEER_HDR_LEN)
		sc_peer_rxbuf_fill_nowait(c->fd, rb);
	const uint8_t *peek = rb->p + rb->off;
	size_t n = sc_peer_rxbuf_avail(rb);
	if (n < 2 || peek[0] != SC_PEER_VERSION)
		return false;
	if (peek[1] == SC_FRAME_OPEN || peek[1] == SC_FRAME_READ || peek[1] == SC_FRAME_READV ||
	    peek[1] == SC_FRAME_DONE)
		return true;
	struct sc_frame_hdr h;
	struct sc_peer_msg m;
	struct sc_err err;
	int avail = 0;
	if (peek[1] != SC_FRAME_WRITE || n < SC_PEER_HDR_LEN ||
	    sc_peer_decode_hdr(peek, &h, &err) != 0)
		return false;
	if (n < SC_PEER_HDR_LEN + h.body_len) {
		sc_peer_rxbuf_fill_nowait(c->fd, rb);
		peek = rb->p + rb->off;
		n = sc_peer_rxbuf_avail(rb);
	}
	return n >= SC_PEER_HDR_LEN + h.body_len &&
	       sc_peer_decode_body(h.type, peek + SC_PEER_HDR_LEN, h.body_len, &m, &err) == 0 &&
	       ioctl(c->fd, FIONREAD, &avail) == 0 &&
	       (uint64_t)avail + n >= SC_PEER_HDR_LEN + h.body_len + m.len;
}

/*
 * Is the next request a READ or READV of the transfer `open` just opened, read ahead whole (the
 * pipelined OPEN + READV of a small transfer)? It is answered without reading anything more, so
 * the OPEN's OK may wait to leave in the same sendmsg as its DATA. Only the same transfer's: if
 * that READ is cut (its operation ended: revoked), the OK lost with it concerned that transfer.
 */
static bool next_read_buffered(const struct conn *c, const struct sc_peer_msg *open)
{
	size_t n = sc_peer_rxbuf_avail(c->rb);
	if (n < SC_PEER_HDR_LEN)
		return false;
	const uint8_t *p = c->rb->p + c->rb->off;
	struct sc_frame_hdr h;
	struct sc_peer_msg next;
	struct sc_err err;
	return sc_peer_decode_hdr(p, &h, &err) == 0 && n >= SC_PEER_HDR_LEN + h.body_len &&
	       (h.type == SC_FRAME_READ || h.type == SC_FRAME_READV) &&
	       sc_peer_decode_body(h.type, p + SC_PEER_HDR_LEN, h.body_len, &next, &err) == 0 &&
	       next.xfer_id == open->xfer_id &&
	       memcmp(next.token, open->token, SC_TOKEN_LEN) == 0;
}

/* The replies held back, as the first iovec of a send (empty when none): call held_sent after. */
static size_t held_iov(const struct conn *c, struct iovec *v)
{
	size_t n = c->held ? c->held->len : 0;
	*v = (struct iovec){.iov_base = n ? c->held->p : NULL, .iov_len = n};
	return n;
}

static void held_sent(struct conn *c)
{
	if (c->held)
		c->held->len = 0;
}

/* Send what is held back now (before parking or closing the connection); best effort. */
static void held_flush(struct conn *c)
{
	struct iovec v;
	if (!held_iov(c, &v))
		return;
	struct sc_peer_wait w;
	int e;
	busy_wait(c, &w);
	w.deadline_mono_ms = sc_clock_mono_ms() + SERVER_SLICE_MS;
	sc_peer_sendv_all(c->fd, &v, 1, &w, NULL, &e);
	held_sent(c);
}

/* Send a reply (after what is held back, in one sendmsg); on failure say why in `why` and return
 * -1 (the connection ends). */
static int reply(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_peer_wait w;
	struct sc_err err;
	busy_wait(c, &w);
	w.more = next_request_prompt(c);
	uint8_t buf[SC_PEER_HDR_LEN + 1024];
	size_t n = m->type == SC_FRAME_QP_CONNECT ? 0 : sc_peer_encode(m, buf, sizeof(buf));
	struct iovec iov[2];
	if (!held_iov(c, &iov[0]) || n == 0) {
		held_flush(c);
		if (sc_peer_send_msg(c->fd, m, &w, c->what, &err) != SC_PEER_IO_OK)
			goto fail;
		return 0;
	}
	iov[1] = (struct iovec){.iov_base = buf, .iov_len = n};
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, 2, &w, NULL, &e);
	held_sent(c);
	if (rc == SC_PEER_IO_OK)
		return 0;
	sc_peer_io_err(rc, e, c->what, &err);
fail:
	snprintf(why, why_cap, "sending %s failed: %s", sc_frame_type_name(m->type), err.msg);
	return -1;
}

static int reply_ok(struct conn *c, char *why, size_t why_cap)
{
	struct sc_peer_msg m = {.type = SC_FRAME_OK};
	return reply(c, &m, why, why_cap);
}

static int reply_error(struct conn *c, const struct sc_err *e, char *why, size_t why_cap)
{
	struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = (uint32_t)e->code};
	snprintf(m.text, sizeof(m.text), "%s", e->msg);
	c->refused = true;
	return reply(c, &m, why, why_cap);
}

/* ---- requests -------------------------------------------------------------------------------- */

static void drain_before_close(int fd);

static int serve_open(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	if (!open_room(c, m, &err) ||
	    sc_passive_open(&c->srv->passive, m->token, m->xfer_id, (enum sc_op_kind)m->peer_kind,
			    c->peer_id, m->total, &err) != 0)
		return reply_error(c, &err, why, why_cap);
	enum sc_backend_kind via = sc_peer_via_backend(m->flags);
	if (track(c, m->token, m->xfer_id, (enum sc_op_kind)m->peer_kind, via) != 0) {
		sc_passive_abandon(&c->srv->passive, m->token, m->xfer_id,
				   "peer server out of memory");
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
		return reply_error(c, &err, why, why_cap);
	}
	if (via != SC_BACKEND_NONE)
		sc_passive_set_backend(&c->srv->passive, m->token, m->xfer_id, via);
	/* This transfer's pipelined READ / READV is already here: its DATA takes the OK along. */
	if (c->held && c->held->len == 0 && next_request_prompt(c) && next_read_buffered(c, m)) {
		struct sc_peer_msg ok = {.type = SC_FRAME_OK};
		c->held->len = sc_peer_encode(&ok, c->held->p, HELD_CAP);
		if (c->held->len)
			return 0;
	}
	return reply_ok(c, why, why_cap);
}

/* Pin the next piece of [offset, offset+len) of a READ or WRITE. The engine may hand out less
 * than asked (never more, never nothing). */
static int next_span(struct conn *c, const struct sc_peer_msg *m, uint64_t done,
		     struct sc_span *span, struct sc_err *err)
{
	if (sc_passive_span(&c->srv->passive, m->token, m->xfer_id,
			    m->type == SC_FRAME_WRITE ? SC_OP_WRITE : SC_OP_READ, m->desc, m->offset + done,
			    m->len - done, span, err) != 0)
		return -1;
	if (span->len == 0 || span->len > m->len - done) {
		sc_passive_span_release(&c->srv->passive, span, 0);
		return sc_err_set(err, SC_INTERNAL, "engine returned a span of %" PRIu64
				  " bytes for %" PRIu64, span->len, m->len - done);
	}
	return 0;
}

static int serve_read(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	const struct sc_passive *pv = &c->srv->passive;
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span span;
	if (!opened_here(c, m, SC_OP_READ, &err) || next_span(c, m, 0, &span, &err) != 0)
		return reply_error(c, &err, why, why_cap);

	struct sc_peer_msg data = {.type = SC_FRAME_DATA, .len = m->len};
	uint8_t hdr[32];
	size_t hdr_len = sc_peer_encode(&data, hdr, sizeof(hdr));
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = span.deadline_mono_ms;
	w.more = next_request_prompt(c);
	/* Replies held back, the DATA header and the first bytes go in one sendmsg (GPU memory:
	 * staged after it). */
	struct iovec iov[3];
	size_t lead = held_iov(c, &iov[0]) + hdr_len;
	iov[1] = (struct iovec){.iov_base = hdr, .iov_len = hdr_len};
	iov[2] = (struct iovec){.iov_base = span.addr, .iov_len = span.len};
	int iovcnt = span.gpu == SC_GPU_HOST ? 3 : 2;
	bool hdr_pending = true;
	uint64_t done = 0;
	for (;;) {
		size_t sent = 0;
		int e = 0;
		enum sc_peer_io rc = SC_PEER_IO_OK;
		uint64_t moved;
		if (hdr_pending && iovcnt == 2)
			rc = sc_peer_sendv_all(c->fd, iov, 2, &w, &sent, &e);
		if (hdr_pending)
			held_sent(c);
		if (rc == SC_PEER_IO_OK && span.gpu != SC_GPU_HOST) {
			if (sc_peer_send_gpu(c->srv->gpu, span.gpu, c->fd, span.addr,
					     span.len, &w, c->what, &rc, &err) != 0) {
				sc_passive_span_release(pv, &span, 0);
				snprintf(why, why_cap, "sending READ data (GPU memory) failed: %s",
					 err.msg);
				return -1;
			}
			moved = span.len;
		} else if (rc == SC_PEER_IO_OK) {
			rc = sc_peer_sendv_all(c->fd, iov, iovcnt, &w, &sent, &e);
			moved = hdr_pending && iovcnt == 3 ? (sent > lead ? sent - lead : 0) : sent;
		} else {
			moved = 0;
		}
		hdr_pending = false;
		sc_passive_span_release(pv, &span, moved);
		if (rc != SC_PEER_IO_OK) {
			io_stop_reason(c, rc, e, &err);
			snprintf(why, why_cap, "sending READ data failed: %s", err.msg);
			return -1;
		}
		done += moved;
		if (done == m->len)
			return 0;
		/* The DATA frame promised m->len bytes: a failure now can only end the
		 * connection. */
		if (next_span(c, m, done, &span, &err) != 0) {
			snprintf(why, why_cap, "cannot serve the rest of a READ: %s", err.msg);
			return -1;
		}
		iov[0] = (struct iovec){.iov_base = span.addr, .iov_len = span.len};
		iovcnt = 1;
	}
}

/* Receive len bytes into GPU memory: what was read ahead first (copied up), then the socket's
 * bytes through the stager. As sc_peer_recv_gpu. */
static int recv_gpu(struct conn *c, int dev, uint8_t *dst, uint64_t len,
		    const struct sc_peer_wait *w, enum sc_peer_io *io, struct sc_err *err)
{
	*io = SC_PEER_IO_OK;
	size_t k = sc_peer_rxbuf_avail(c->rb);
	if (k > len)
		k = (size_t)len;
	if (k) {
		if (sc_gpu_copy(c->srv->gpu, dst, dev, c->rb->p + c->rb->off, SC_GPU_HOST, k,
				err) != 0)
			return -1;
		c->rb->off += k;
		if (c->rb->off == c->rb->len)
			c->rb->off = c->rb->len = 0;
	}
	if (k == len)
		return 0;
	return sc_peer_recv_gpu(c->srv->gpu, dev, c->fd, dst + k, len - k, w, c->what, io, err);
}

static int serve_write(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	const struct sc_passive *pv = &c->srv->passive;
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_peer_wait w;
	busy_wait(c, &w);
	uint64_t done = 0;
	bool allowed = opened_here(c, m, SC_OP_WRITE, &err);
	while (done < m->len) {
		struct sc_span span;
		if (!allowed || next_span(c, m, done, &span, &err) != 0) {
			/* Refused: the bulk bytes that follow are not read; the connection ends. */
			reply_error(c, &err, why, why_cap);
			drain_before_close(c->fd); /* no reset before the peer reads why */
			snprintf(why, why_cap, "refused a WRITE: %s", err.msg);
			return -1;
		}
		size_t got = 0;
		int e = 0;
		enum sc_peer_io rc;
		w.deadline_mono_ms = span.deadline_mono_ms;
		if (span.gpu != SC_GPU_HOST) {
			/* Staged: acknowledged (OK below) only once the bytes are in GPU memory. */
			if (recv_gpu(c, span.gpu, span.addr, span.len, &w, &rc, &err) != 0) {
				sc_passive_span_release(pv, &span, 0);
				if (rc == SC_PEER_IO_OK) /* the driver failed: tell the peer why */
					reply_error(c, &err, why, why_cap);
				snprintf(why, why_cap, "receiving WRITE data (GPU memory) failed: %s",
					 err.msg);
				return -1;
			}
			got = span.len;
		} else {
			rc = sc_peer_recv_rb(c->fd, c->rb, span.addr, span.len, &w, &got, &e);
		}
		sc_passive_span_release(pv, &span, got);
		if (rc != SC_PEER_IO_OK) {
			io_stop_reason(c, rc, e, &err);
			snprintf(why, why_cap, "receiving WRITE data failed: %s", err.msg);
			return -1;
		}
		done += got;
	}
	return reply_ok(c, why, why_cap);
}

/* ---- many pieces per request (READV, WRITEV) ------------------------------------------------- */

static void release_spans(const struct sc_passive *pv, struct sc_span *spans, size_t n,
			  uint64_t moved)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t k = moved < spans[i].len ? moved : spans[i].len;
		moved -= k;
		sc_passive_span_release(pv, &spans[i], k);
	}
}

/* Pin every piece of a READV/WRITEV into *spans / *iov, in order (*iov has two empty iovecs
 * first, for what goes ahead of the pieces in a sendmsg); *gpu_out: SC_GPU_HOST when every piece
 * is host memory, else a GPU that holds one. */
static int pin_pieces(struct conn *c, const struct sc_peer_msg *m, enum sc_op_kind kind,
		      struct sc_span **spans_out, struct iovec **iov_out, size_t *n_out,
		      int *gpu_out, struct sc_err *err)
{
	const struct sc_passive *pv = &c->srv->passive;
	size_t cap = m->n_pieces, n = 0;
	int gpu = SC_GPU_HOST;
	struct sc_span *spans = malloc(cap * sizeof(*spans));
	if (!spans)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	for (uint32_t i = 0; i < m->n_pieces; i++) {
		struct sc_peer_piece p = sc_peer_piece_at(m, i);
		for (uint64_t done = 0; done < p.len;) {
			if (n == cap) {
				struct sc_span *more = realloc(spans, 2 * cap * sizeof(*spans));
				if (!more) {
					sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
					goto fail;
				}
				spans = more;
				cap *= 2;
			}
			struct sc_span *sp = &spans[n];
			if (sc_passive_span(pv, m->token, m->xfer_id, kind, p.desc, p.offset + done,
					    p.len - done, sp, err) != 0) {
				sc_err_prefix(err, "piece %u", i);
				goto fail;
			}
			n++;
			if (sp->gpu != SC_GPU_HOST) /* staged: see staged_pieces */
				gpu = sp->gpu;
			if (sp->len == 0 || sp->len > p.len - done) {
				sc_err_set(err, SC_INTERNAL, "engine returned a span of %" PRIu64
					   " bytes for %" PRIu64, sp->len, p.len - done);
				goto fail;
			}
			done += sp->len;
		}
	}
	struct iovec *iov = malloc((n + 2) * sizeof(*iov));
	if (!iov) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
		goto fail;
	}
	iov[0] = iov[1] = (struct iovec){0};
	for (size_t i = 0; i < n; i++)
		iov[2 + i] = (struct iovec){.iov_base = spans[i].addr, .iov_len = spans[i].len};
	*spans_out = spans;
	*iov_out = iov;
	*n_out = n;
	*gpu_out = gpu;
	return 0;
fail:
	release_spans(pv, spans, n, 0);
	free(spans);
	return -1;
}

/* The pieces of a READV/WRITEV that has GPU memory in it, in order, packed through pinned buffers:
 * each stretch whose GPU pieces are on one device (host pieces join the stretch they are in) goes
 * through that device's stager (every stretch has a GPU piece: the list has one, and a stretch
 * ends only at a GPU piece of another device). */
static int staged_pieces(struct conn *c, const struct sc_span *spans, size_t n, bool send,
			 const struct sc_peer_wait *w, enum sc_peer_io *io, struct sc_err *err)
{
	*io = SC_PEER_IO_OK;
	struct sc_stage_piece *p = malloc((n ? n : 1) * sizeof(*p));
	if (!p)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	for (size_t i = 0; i < n; i++)
		p[i] = (struct sc_stage_piece){
		    .addr = spans[i].addr, .len = spans[i].len, .gpu = spans[i].gpu};
	struct sc_gpu *g = c->srv->gpu;
	int rc = 0;
	size_t i = 0;
	/* Receiving: the bytes read ahead come first (read-ahead invariant, top of file). */
	for (; !send && i < n && sc_peer_rxbuf_avail(c->rb); i++) {
		size_t k = sc_peer_rxbuf_avail(c->rb);
		if (k > p[i].len)
			k = (size_t)p[i].len;
		if (sc_gpu_copy(g, p[i].addr, p[i].gpu, c->rb->p + c->rb->off, SC_GPU_HOST, k,
				err) != 0) {
			free(p);
			return -1;
		}
		c->rb->off += k;
		p[i].addr += k;
		p[i].len -= k;
		if (p[i].len)
			break;
	}
	if (!sc_peer_rxbuf_avail(c->rb) && c->rb)
		c->rb->off = c->rb->len = 0;
	for (; rc == 0 && i < n;) {
		int dev = SC_GPU_HOST;
		size_t j = i;
		for (; j < n && (p[j].gpu == SC_GPU_HOST || dev == SC_GPU_HOST || p[j].gpu == dev);
		     j++)
			dev = p[j].gpu != SC_GPU_HOST ? p[j].gpu : dev;
		rc = send ? sc_peer_send_pieces_gpu(g, dev, c->fd, p + i, j - i, w, c->what, io, err)
			  : sc_peer_recv_pieces_gpu(g, dev, c->fd, p + i, j - i, w, c->what, io, err);
		i = j;
	}
	free(p);
	return rc;
}

/* READV: the DATA header, then every piece gathered straight from region memory (sendmsg with
 * up to IOV_MAX iovecs per call). */
static int serve_readv(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span *spans = NULL;
	struct iovec *iov = NULL;
	size_t n = 0;
	int gpu = SC_GPU_HOST;
	if (!opened_here(c, m, SC_OP_READ, &err) ||
	    pin_pieces(c, m, SC_OP_READ, &spans, &iov, &n, &gpu, &err) != 0)
		return reply_error(c, &err, why, why_cap);
	struct sc_peer_msg data = {.type = SC_FRAME_DATA, .len = m->len};
	uint8_t hdr[32];
	size_t hdr_len = sc_peer_encode(&data, hdr, sizeof(hdr));
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = n ? spans[0].deadline_mono_ms : 0;
	w.more = next_request_prompt(c);
	/* Replies held back, the DATA header and (host memory) every piece in one sendmsg. */
	size_t lead = held_iov(c, &iov[0]) + hdr_len;
	iov[1] = (struct iovec){.iov_base = hdr, .iov_len = hdr_len};
	size_t sent = 0;
	int e = 0;
	enum sc_peer_io rc =
	    sc_peer_sendv_all(c->fd, iov, gpu != SC_GPU_HOST ? 2 : (int)n + 2, &w, &sent, &e);
	held_sent(c);
	if (rc == SC_PEER_IO_OK && gpu != SC_GPU_HOST) {
		if (staged_pieces(c, spans, n, true, &w, &rc, &err) != 0) {
			release_spans(&c->srv->passive, spans, n, 0);
			free(spans);
			free(iov);
			snprintf(why, why_cap, "sending READV data (GPU memory) failed: %s", err.msg);
			return -1;
		}
		sent = (size_t)m->len;
	} else {
		sent = sent > lead ? sent - lead : 0;
	}
	release_spans(&c->srv->passive, spans, n, sent);
	free(spans);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		io_stop_reason(c, rc, e, &err);
		snprintf(why, why_cap, "sending READV data failed: %s", err.msg);
		return -1;
	}
	return 0;
}

/* WRITEV: the bulk scattered straight into region memory (recvmsg), then OK. */
static int serve_writev(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span *spans = NULL;
	struct iovec *iov = NULL;
	size_t n = 0;
	int gpu = SC_GPU_HOST;
	if (!opened_here(c, m, SC_OP_WRITE, &err) ||
	    pin_pieces(c, m, SC_OP_WRITE, &spans, &iov, &n, &gpu, &err) != 0) {
		/* Refused: the bulk bytes that follow are not read; the connection ends. */
		reply_error(c, &err, why, why_cap);
		drain_before_close(c->fd);
		snprintf(why, why_cap, "refused a WRITEV: %s", err.msg);
		return -1;
	}
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = n ? spans[0].deadline_mono_ms : 0;
	size_t got = 0;
	int e = 0;
	enum sc_peer_io rc;
	if (gpu != SC_GPU_HOST) {
		/* Staged: acknowledged (OK below) only once the bytes are in GPU memory. */
		if (staged_pieces(c, spans, n, false, &w, &rc, &err) != 0) {
			release_spans(&c->srv->passive, spans, n, 0);
			free(spans);
			free(iov);
			if (rc == SC_PEER_IO_OK) /* the driver failed: tell the peer why */
				reply_error(c, &err, why, why_cap);
			snprintf(why, why_cap, "receiving WRITEV data (GPU memory) failed: %s",
				 err.msg);
			return -1;
		}
		got = (size_t)m->len;
	} else {
		rc = sc_peer_recvv_rb(c->fd, c->rb, iov + 2, (int)n, &w, &got, &e);
	}
	release_spans(&c->srv->passive, spans, n, got);
	free(spans);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		io_stop_reason(c, rc, e, &err);
		snprintf(why, why_cap, "receiving WRITEV data failed: %s", err.msg);
		return -1;
	}
	return reply_ok(c, why, why_cap);
}

static int serve_done(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	untrack_everywhere(c->srv, m->token, m->xfer_id);
	if (sc_passive_done(&c->srv->passive, m->token, m->xfer_id, sc_peer_status_from_wire(m->code),
			    m->text, &err) != 0)
		return reply_error(c, &err, why, why_cap);
	return reply_ok(c, why, why_cap);
}

static int serve_handler(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_peer_server *srv = c->srv;
	struct sc_err err;
	sc_err_clear(&err);
	pthread_mutex_lock(&srv->mu);
	sc_peer_handler_fn fn = srv->qp_fn;
	void *ctx = srv->qp_ctx;
	if (fn)
		srv->qp_busy++;
	pthread_mutex_unlock(&srv->mu);
	if (!fn) {
		sc_err_set(&err, SC_UNIMPLEMENTED,
			   "sidecar \"%s\" serves no %s (its ibverbs backend is not running): use "
			   "the tcp backend",
			   srv->self_id, sc_frame_type_name(m->type));
		return reply_error(c, &err, why, why_cap);
	}
	uint8_t *out = malloc(SC_PEER_MAX_BODY);
	size_t out_len = 0;
	int rc = -1;
	if (!out)
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	else if ((rc = fn(ctx, c->peer_id, m->opaque, m->opaque_len, out, SC_PEER_MAX_BODY,
			  &out_len, &err)) == 0 &&
		 out_len > SC_PEER_MAX_BODY)
		rc = sc_err_set(&err, SC_INTERNAL, "%s handler returned %zu bytes",
				sc_frame_type_name(m->type), out_len);
	pthread_mutex_lock(&srv->mu);
	srv->qp_busy--;
	pthread_cond_broadcast(&srv->cv);
	pthread_mutex_unlock(&srv->mu);
	int sent;
	if (rc == 0) {
		struct sc_peer_msg r = {.type = m->type, .opaque = out, .opaque_len = out_len};
		sent = reply(c, &r, why, why_cap);
	} else {
		if (err.code == SC_OK)
			sc_err_set(&err, SC_INTERNAL, "%s handler failed",
				   sc_frame_type_name(m->type));
		sent = reply_error(c, &err, why, why_cap);
	}
	free(out);
	return sent;
}

/* Does the connection hold a transfer it OPENed (DONE not come, operation not ended)? */
static bool holds_open(struct conn *c)
{
	pthread_mutex_lock(&c->srv->mu);
	bool yes = c->n_opened > 0;
	pthread_mutex_unlock(&c->srv->mu);
	return yes;
}

/* The connection received a request (or finished its hello): it is now the most recently used. */
static void mark_active(struct conn *c)
{
	atomic_store(&c->last_active_mono_ms, sc_clock_mono_ms());
	atomic_store(&c->last_active_seq, atomic_fetch_add(&c->srv->activity_seq, 1) + 1);
}

/* The hand-off trace's stage name (base/trace.h) for a request received, or answered. */
static const char *trace_stage(enum sc_frame_type t, bool answered)
{
	switch (t) {
	case SC_FRAME_OPEN:
		return answered ? "passive_open_answered" : "passive_open_received";
	case SC_FRAME_READ:
	case SC_FRAME_READV:
		return answered ? "passive_read_served" : "passive_read_received";
	case SC_FRAME_WRITE:
	case SC_FRAME_WRITEV:
		return answered ? "passive_write_stored" : "passive_write_received";
	case SC_FRAME_DONE:
		return answered ? "passive_done_answered" : "passive_done_received";
	default:
		return answered ? "passive_other_answered" : "passive_other_received";
	}
}

/* One request, its bytes already arriving: 0 when served (the connection goes on), else -1 with
 * `why` saying how the connection ends. */
static int serve_one(struct conn *c, char *why, size_t why_cap)
{
	struct sc_peer_server *srv = c->srv;
	/* The frame has begun to arrive: the rest must keep coming. */
	struct sc_peer_wait w = {.stall_ms = STALL_MS, .stop = &srv->stopping};
	struct sc_peer_msg m;
	struct sc_err err;
	sc_err_clear(&err);
	enum sc_peer_io io =
	    sc_peer_recv_msg_rb(c->fd, c->rb, c->buf, c->buf_cap, &m, &w, c->what, &err);
	if (io != SC_PEER_IO_OK) {
		if (io == SC_PEER_IO_PROTOCOL) /* the peer chose it: rate-limited */
			SC_WARN_LIMITED("peer", "peer-protocol-error", "closing connection from %s: %s",
					c->what, err.msg);
		if (io == SC_PEER_IO_CANCELLED)
			snprintf(why, why_cap, "sidecar \"%s\" is shutting down", srv->self_id);
		else
			snprintf(why, why_cap, "%s", err.msg);
		return -1;
	}
	if (sc_trace_on())
		sc_trace_record(m.xfer_id, trace_stage(m.type, false), 0);
	/* Most recently used from the request's arrival, before any reply leaves: a peer that has its
	 * answer is already ordered after every earlier one (marking after the reply raced with the
	 * next peer's requests when this thread was slow to run on). A PING is use only on a
	 * connection with a transfer open (the liveness check of a long ibverbs transfer's control
	 * connection): elsewhere it neither keeps a connection from expiring nor moves it up the
	 * order of eviction. */
	bool use = m.type != SC_FRAME_PING || holds_open(c);
	/* A refused request is no use either: restored below, so that a peer sending OPENs past its
	 * caps (or for tokens that are spent) cannot keep its connections fresh against eviction. */
	uint64_t was_ms = atomic_load(&c->last_active_mono_ms);
	uint64_t was_seq = atomic_load(&c->last_active_seq);
	if (use)
		mark_active(c);
	c->refused = false;
	int rc;
	switch (m.type) {
	case SC_FRAME_OPEN:
		rc = serve_open(c, &m, why, why_cap);
		break;
	case SC_FRAME_READ:
		serving_begin(c, m.token);
		rc = serve_read(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_WRITE:
		serving_begin(c, m.token);
		rc = serve_write(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_READV:
		serving_begin(c, m.token);
		rc = serve_readv(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_WRITEV:
		serving_begin(c, m.token);
		rc = serve_writev(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_DONE:
		rc = serve_done(c, &m, why, why_cap);
		break;
	case SC_FRAME_PING: {
		struct sc_peer_msg pong = {.type = SC_FRAME_PONG, .cookie = m.cookie};
		rc = reply(c, &pong, why, why_cap);
		break;
	}
	case SC_FRAME_QP_CONNECT:
		rc = serve_handler(c, &m, why, why_cap);
		break;
	default:
		SC_WARN_LIMITED("peer", "peer-unexpected-frame",
				"closing connection from %s: protocol error: unexpected %s frame from "
				"a client",
				c->what, sc_frame_type_name(m.type));
		snprintf(why, why_cap, "protocol error: unexpected %s frame",
			 sc_frame_type_name(m.type));
		rc = -1;
		break;
	}
	if (sc_trace_on())
		sc_trace_record(m.xfer_id, trace_stage(m.type, true), 0);
	if (rc != 0)
		return -1;
	if (use && c->refused) {
		atomic_store(&c->last_active_mono_ms, was_ms);
		atomic_store(&c->last_active_seq, was_seq);
	} else if (use) { /* idle from the request's end */
		atomic_store(&c->last_active_mono_ms, sc_clock_mono_ms());
	}
	if (atomic_load(&c->revoked)) { /* it finished as the operation ended: end anyway */
		snprintf(why, why_cap, "an operation it served ended: connection cut");
		return -1;
	}
	return 0;
}

/* Are bytes of a next request already here (read ahead by us or by TLS, or on the socket)? Without
 * TLS what is on the socket is read ahead now, so the request is served without another recv; an
 * end or error of the connection also counts (serving it ends the connection at once). */
static bool input_waiting(const struct conn *c)
{
	if (sc_peer_rxbuf_avail(c->rb))
		return true;
	if (c->rb)
		return sc_peer_rxbuf_fill_nowait(c->fd, c->rb) >= 0 ||
		       (errno != EAGAIN && errno != EWOULDBLOCK);
	uint8_t b;
	return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1 || sc_peer_tls_pending(c->fd);
}

/* ---- connection threads ---------------------------------------------------------------------- */

static void prehello_leave_locked(struct sc_peer_server *srv, struct conn *c);
static void recent_auth_note_locked(struct sc_peer_server *srv, const uint8_t net[16],
				    uint64_t now);

/* The connection ends: hand its transfers over, close it, queue it for freeing. The pool thread
 * that served it (or destroy) calls this last: the connection may be freed as it returns. */
static void conn_finish(struct conn *c, const char *why)
{
	struct sc_peer_server *srv = c->srv;
	uint64_t due = sc_clock_mono_ms() + ORPHAN_GRACE_MS;
	pthread_mutex_lock(&srv->mu);
	sc_list_remove(&c->node);
	prehello_leave_locked(srv, c);
	srv->n_live--;
	if (c->authed) {
		srv->n_authed--;
		ident_leave_locked(srv, c);
	} else {
		srv->n_unauth--;
	}
	/* Its records: one no other connection holds becomes an orphan. O(its own records). */
	while (c->opened.next && !sc_list_empty(&c->opened)) {
		struct hold *h = sc_list_entry(sc_list_first(&c->opened), struct hold, conn_node);
		struct rec *r = h->rec;
		enum sc_backend_kind via = h->via;
		hold_free_locked(h);
		if (!sc_list_empty(&r->holds) || r->orphan)
			continue;
		struct orphan *o = calloc(1, sizeof(*o));
		if (!o) {
			/* Cannot wait: tell the engine now, without the lock. */
			uint8_t token[SC_TOKEN_LEN];
			uint64_t xfer_id = r->xfer_id;
			memcpy(token, r->token, SC_TOKEN_LEN);
			rec_drop_locked(srv, r);
			pthread_mutex_unlock(&srv->mu);
			sc_passive_abandon(&srv->passive, token, xfer_id, why);
			pthread_mutex_lock(&srv->mu);
			continue;
		}
		memcpy(o->token, r->token, SC_TOKEN_LEN);
		o->xfer_id = r->xfer_id;
		o->via = via;
		snprintf(o->peer_id, sizeof(o->peer_id), "%s", c->peer_id);
		o->due_mono_ms = due;
		snprintf(o->why, sizeof(o->why), "%.480s, before DONE", why);
		o->rec = r;
		r->orphan = o;
		sc_list_insert_tail(&srv->orphans, &o->node);
	}
	int fd = c->fd;
	c->fd = -1;
	pthread_mutex_unlock(&srv->mu);
	/* Nobody else touches the fd once the connection left the live list. Closed before the
	 * connection goes on the dead list: from there the accept thread may free it any time. */
	sc_peer_tls_close(fd);
	pthread_mutex_lock(&srv->mu);
	sc_list_insert_head(&srv->dead, &c->node);
	pthread_cond_broadcast(&srv->cv);
	pthread_mutex_unlock(&srv->mu);
	wake(srv);
}

/* After a refusal: stop sending, and read (and drop) what the peer still sends for a moment, so
 * the close that follows does not reset the connection before the peer has read our ERROR. */
static void drain_before_close(int fd)
{
	shutdown(fd, SHUT_WR);
	uint64_t until = sc_clock_mono_ms() + REFUSAL_DRAIN_MS;
	uint8_t sink[4096];
	for (uint64_t now = sc_clock_mono_ms(); now < until; now = sc_clock_mono_ms()) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		if (poll(&pfd, 1, (int)(until - now)) <= 0)
			break;
		if (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0)
			break;
	}
}

/* May this connection be closed for another peer? Authenticated, parked, no request in hand,
 * whatever it has OPENed (a peer could otherwise hold its slot forever with an OPEN and no DONE;
 * what it opened becomes an orphan, abandoned unless its DONE comes on another connection). Under
 * srv->mu. */
static bool idle_locked(const struct conn *o)
{
	return o->authed && !o->serving && atomic_load(&o->state) == CONN_IDLE;
}

/* Close an idle connection now and give its room back at once: it still counts until a pool
 * thread ends it (its shutdown wakes one). False when a request just arrived on it
 * (compare-and-swap). retired: closed with its peer's ibverbs QP (sc_peer_server_retire_peer),
 * which its log line says. Under srv->mu. */
static bool evict_locked(struct sc_peer_server *srv, struct conn *o, bool retired)
{
	atomic_store(&o->retired, retired);
	int idle = CONN_IDLE;
	if (!atomic_compare_exchange_strong(&o->state, &idle, CONN_EVICTED)) {
		atomic_store(&o->retired, false);
		return false;
	}
	shutdown(o->fd, SHUT_RDWR);
	srv->n_authed--;
	ident_leave_locked(srv, o);
	o->authed = false;
	srv->n_unauth++;
	return true;
}

/*
 * A cap is reached: close an idle connection (idle_locked: no request in hand), of peer `of`
 * only when given, to make room for `for_conn`: one with no transfer open first, else the one
 * used longest ago. Its thread sees the shutdown and ends; the peer's pool dials again when it
 * needs one. True when one was evicted. Under srv->mu; walks the live connections (only at a
 * cap).
 */
static bool evict_idle_locked(struct sc_peer_server *srv, const struct conn *for_conn,
			      const char *of)
{
	struct conn *lru = NULL;
	uint64_t oldest = UINT64_MAX;
	bool lru_clear = false;
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->live) {
		struct conn *o = sc_list_entry(pos, struct conn, node);
		if (o == for_conn || !idle_locked(o) || (of && strcmp(o->peer_id, of) != 0))
			continue;
		uint64_t seq = atomic_load(&o->last_active_seq);
		bool clear = o->n_opened == 0;
		if (!lru || (clear && !lru_clear) || (clear == lru_clear && seq < oldest)) {
			oldest = seq;
			lru = o;
			lru_clear = clear;
		}
	}
	if (!lru || !evict_locked(srv, lru, false))
		return false;
	atomic_fetch_add(&srv->n_evicted, 1);
	if (of)
		SC_WARN_LIMITED("peer", "peer-evicted-share",
				"peer \"%s\" holds its share of %u connections (a quarter of "
				"--data-max-peers): closed its one idle longest, %s, idle %llu ms, to "
				"admit %s",
				of, srv->max_per_id, lru->what,
				(unsigned long long)(sc_clock_mono_ms() -
						     atomic_load(&lru->last_active_mono_ms)),
				for_conn->addr);
	else
		SC_WARN_LIMITED("peer", "peer-evicted",
				"%u peer connections (--data-max-peers): closed the one idle longest, "
				"%s, idle %llu ms, to admit %s",
				srv->max_peers, lru->what,
				(unsigned long long)(sc_clock_mono_ms() -
						     atomic_load(&lru->last_active_mono_ms)),
				for_conn->addr);
	return true;
}

/*
 * Admit an authenticated connection under the caps: one peer id holds at most its share
 * (srv->max_per_id; at it, its own idle connection goes), and all of them at most
 * --data-max-peers (at it, another idle connection goes). False with err (RESOURCE_EXHAUSTED,
 * "... busy: retry in a few seconds", which the dialing side retries) when every candidate has a
 * request in hand. On success the connection counts for its id and can track OPENs. Under
 * srv->mu.
 */
static bool admit_locked(struct sc_peer_server *srv, struct conn *c, struct sc_err *err)
{
	struct ident *id = ident_get_locked(srv, c->peer_id, true);
	if (!id) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar %s is out of memory: retry in a few "
			   "seconds", srv->self_id);
		return false;
	}
	if (id->n >= srv->max_per_id) {
		if (!evict_idle_locked(srv, c, c->peer_id)) {
			sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				   "sidecar %s is serving %u connections of peer \"%s\" (its share: a "
				   "quarter of --data-max-peers %u), all of them busy: retry in a few "
				   "seconds",
				   srv->self_id, id->n, c->peer_id, srv->max_peers);
			return false;
		}
	} else if (srv->n_authed >= srv->max_peers && !evict_idle_locked(srv, c, NULL)) {
		if (id->n == 0) {
			uint8_t key[SC_IDMAP_KEY_MAX];
			size_t klen = ident_key(c->peer_id, key);
			free(sc_idmap_del(srv->idents, key, klen));
		}
		sc_err_set(err, SC_RESOURCE_EXHAUSTED,
			   "sidecar %s is serving %u peer connections (--data-max-peers), all of them "
			   "busy: retry in a few seconds",
			   srv->self_id, srv->max_peers);
		return false;
	}
	/* An eviction of its own id's connection may have freed the count: look it up again. */
	if (!(id = ident_get_locked(srv, c->peer_id, true))) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar %s is out of memory: retry in a few "
			   "seconds", srv->self_id);
		return false;
	}
	id->n++;
	sc_list_init(&c->opened);
	return true;
}

/* The TLS handshake and the hello of a new connection, then its admission under --data-max-peers.
 * 0 when authenticated; else -1 with `why` (the refusal was sent and logged). */
static int handshake(struct conn *c, char *why, size_t why_cap)
{
	struct sc_peer_server *srv = c->srv;
	struct sc_peer_wait w = {.deadline_mono_ms = c->accepted_mono_ms + srv->first_byte_ms +
							 UNAUTH_HELLO_MS,
				 .stop = &srv->stopping};
	struct sc_err err;
	sc_err_clear(&err);
	int rc = 0;
	if (srv->tls)
		rc = sc_peer_tls_server(srv->tls, c->fd, &w, c->what, &err);
	if (rc == 0) {
		struct sc_keyring *ring = sc_keyring_source_get(&srv->keys);
		rc = sc_peer_hello_server(c->fd, ring, srv->self_id, &w, c->what,
					  c->peer_id, &err);
		sc_keyring_release(ring);
	}
	if (rc == 0) /* the id the hello claimed must be the one its certificate names */
		rc = sc_peer_tls_check_claim(srv->tls, c->fd, c->peer_id, &w, c->what, &err);
	if (rc == 0) {
		/* Authenticated: move from the pre-hello limits to the authenticated cap. */
		pthread_mutex_lock(&srv->mu);
		bool room = admit_locked(srv, c, &err);
		if (room) {
			c->authed = true;
			srv->n_unauth--;
			srv->n_authed++;
			mark_active(c);
			prehello_leave_locked(srv, c);
			recent_auth_note_locked(srv, c->net, sc_clock_mono_ms());
		}
		pthread_mutex_unlock(&srv->mu);
		if (!room) { /* err says why (admit_locked) */
			rc = -1;
			sc_peer_send_refusal(c->fd, &w, &err);
		}
	}
	if (rc == 0) {
		snprintf(c->what, sizeof(c->what), "peer sidecar \"%s\" at %s", c->peer_id,
			 c->addr);
		SC_DEBUG("peer", "authenticated %s", c->what);
		return 0;
	}
	/* A bare connect-and-close (a port probe) is not worth a warning; an idle or refused one
	 * is, but rate-limited: anyone who can reach the port can cause it. */
	if (err.code == SC_UNAVAILABLE && strstr(err.msg, "closed the connection"))
		SC_DEBUG("peer", "connection from %s ended during the hello: %s", c->addr, err.msg);
	else if (err.code != SC_CANCELLED) {
		/* One limit per kind of failure: a flood of garbage or idle connections does not
		 * hide a peer that fails to authenticate. */
		char key[32];
		snprintf(key, sizeof(key), "peer-hello-rejected-%d", (int)err.code);
		SC_WARN_LIMITED("peer", key, "rejected connection from %s: %s", c->addr, err.msg);
	}
	snprintf(why, why_cap, "hello failed: %s", err.msg);
	if (err.code != SC_DEADLINE_EXCEEDED && err.code != SC_CANCELLED)
		drain_before_close(c->fd);
	return -1;
}

/* Park a connection with no request in hand until its next bytes (or its end) arrive. Its state
 * is IDLE first, so an eviction or expiry may close it from then on: the shutdown wakes the epoll
 * set at once. -1 (errno) when it cannot be parked. */
static int park(struct conn *c)
{
	atomic_store(&c->state, CONN_IDLE);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
	return epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/*
 * A pool thread took a connection whose bytes arrived: serve its hello or its requests for as
 * long as they keep coming, then park it again, or end it (conn_finish).
 */
static void take(struct conn *c, struct worker *wk)
{
	struct sc_peer_server *srv = c->srv;
	char why[SC_ERR_MSG_MAX + 64] = "closed";
	int was = CONN_IDLE;
	if (!atomic_compare_exchange_strong(&c->state, &was, CONN_BUSY)) {
		if (was == CONN_EVICTED && atomic_load(&c->retired))
			snprintf(why, sizeof(why),
				 "closed with its idle ibverbs QP (given up to admit another peer, "
				 "or expired)");
		else if (was == CONN_EVICTED)
			snprintf(why, sizeof(why), "closed to admit another peer (--data-max-peers %u)",
				 srv->max_peers);
		else if (c->authed)
			snprintf(why, sizeof(why), "idle for %llu ms",
				 (unsigned long long)srv->idle_ms);
		else if (c->displaced)
			snprintf(why, sizeof(why), "dropped before its hello to admit a newer "
						   "connection (--data-max-unauth)");
		else
			snprintf(why, sizeof(why), "no first byte within %llu ms "
						   "(--data-first-byte-timeout)",
				 (unsigned long long)srv->first_byte_ms);
		goto end;
	}
	c->buf = wk->buf;
	c->buf_cap = sizeof(wk->buf);
	/* Read-ahead only on plain sockets (TLS records are read by the stream, peer/proto.h). */
	wk->rb = (struct sc_peer_rxbuf){.p = wk->rx_mem, .cap = sizeof(wk->rx_mem)};
	c->rb = srv->tls ? NULL : &wk->rb;
	wk->held.len = 0;
	c->held = srv->tls ? NULL : &wk->held;
	if (!c->authed) {
		if (handshake(c, why, sizeof(why)) != 0)
			goto end;
		if (!input_waiting(c)) /* its first request is not here yet: no thread waits for it */
			goto park;
	}
	do {
		if (atomic_load(&srv->stopping)) {
			snprintf(why, sizeof(why), "sidecar \"%s\" is shutting down", srv->self_id);
			goto end;
		}
		if (serve_one(c, why, sizeof(why)) != 0)
			goto end;
	} while (input_waiting(c));
park:
	/* input_waiting said no: nothing is read ahead that epoll would never announce. */
	held_flush(c); /* (every request answers, so nothing is held here) */
	c->buf = NULL;
	c->rb = NULL;
	c->held = NULL;
	if (park(c) == 0)
		return;
	snprintf(why, sizeof(why), "cannot wait for its next request: %s", strerror(errno));
end:
	held_flush(c); /* replies held back still leave, as they would have */
	c->buf = NULL;
	c->rb = NULL; /* what was read ahead ends with the connection */
	c->held = NULL;
	SC_DEBUG("peer", "connection from %s ended: %s", c->what, why);
	conn_finish(c, why);
}

/*
 * Close connections that have waited too long: authenticated ones idle for srv->idle_ms,
 * new ones silent for --data-first-byte-timeout (a parked connection is never served, so
 * the hello's own deadline cannot run for it). Only a parked one is closed (compare-and-swap);
 * its shutdown wakes a pool thread, which ends it. Accept thread.
 */
static void sweep(struct sc_peer_server *srv)
{
	uint64_t now = sc_clock_mono_ms();
	pthread_mutex_lock(&srv->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->live) {
		struct conn *c = sc_list_entry(pos, struct conn, node);
		uint64_t since = c->authed ? atomic_load(&c->last_active_mono_ms) : c->accepted_mono_ms;
		uint64_t limit = c->authed ? srv->idle_ms : srv->first_byte_ms;
		int idle = CONN_IDLE;
		if (now - since >= limit &&
		    atomic_compare_exchange_strong(&c->state, &idle, CONN_EXPIRED))
			shutdown(c->fd, SHUT_RDWR);
	}
	pthread_mutex_unlock(&srv->mu);
}

/* ---- the pool -------------------------------------------------------------------------------- */

static void *worker_main(void *arg);

/* Start one more pool thread. Under srv->mu. */
static int spawn_worker_locked(struct sc_peer_server *srv)
{
	struct worker *wk = calloc(1, sizeof(*wk));
	if (!wk)
		return -1;
	wk->srv = srv;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, CONN_STACK_BYTES);
	int rc = pthread_create(&wk->thread, &attr, worker_main, wk);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		free(wk);
		errno = rc;
		return -1;
	}
	sc_list_insert_head(&srv->workers, &wk->node);
	srv->n_workers++;
	srv->n_waiting++;
	return 0;
}

/*
 * Wait for a parked connection whose bytes arrived, take it, and go back to waiting. When this
 * thread takes one and no other is left waiting, another starts first, so new requests never
 * queue behind a slow one. A thread beyond --data-io-threads that waited WORKER_IDLE_MS for
 * nothing ends.
 */
static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct sc_peer_server *srv = wk->srv;
	for (;;) {
		struct epoll_event ev;
		int n = epoll_wait(srv->epfd, &ev, 1, WORKER_IDLE_MS);
		if (atomic_load(&srv->stopping))
			break;
		if (n < 0 && errno != EINTR) {
			SC_ERROR("peer", "epoll_wait on the peer connections failed: %s",
				 strerror(errno));
			usleep(100 * 1000);
			continue;
		}
		pthread_mutex_lock(&srv->mu);
		if (n == 0 && srv->n_workers > srv->min_workers && !atomic_load(&srv->stopping)) {
			srv->n_workers--;
			srv->n_waiting--;
			sc_list_remove(&wk->node);
			sc_list_insert_head(&srv->dead_workers, &wk->node);
			pthread_mutex_unlock(&srv->mu);
			wake(srv);
			return NULL;
		}
		if (n <= 0 || !ev.data.ptr) { /* a timeout, or stop_fd */
			pthread_mutex_unlock(&srv->mu);
			continue;
		}
		if (--srv->n_waiting == 0 && spawn_worker_locked(srv) != 0)
			SC_WARN_LIMITED("peer", "peer-pool-thread",
					"cannot start another peer connection thread (%u running): %s; "
					"new requests wait for a running one",
					srv->n_workers, strerror(errno));
		pthread_mutex_unlock(&srv->mu);
		take(ev.data.ptr, wk);
		pthread_mutex_lock(&srv->mu);
		srv->n_waiting++;
		pthread_mutex_unlock(&srv->mu);
	}
	return NULL;
}

/* Free the connections that ended and join the pool threads that did. Accept thread or destroy. */
static void reap(struct sc_peer_server *srv)
{
	struct sc_list dead = SC_LIST_INIT(dead), dead_workers = SC_LIST_INIT(dead_workers);
	struct sc_list *pos, *tmp;
	pthread_mutex_lock(&srv->mu);
	sc_list_move_all(&srv->dead, &dead);
	sc_list_move_all(&srv->dead_workers, &dead_workers);
	pthread_mutex_unlock(&srv->mu);
	sc_list_foreach_safe(pos, tmp, &dead) {
		free(sc_list_entry(pos, struct conn, node));
	}
	sc_list_foreach_safe(pos, tmp, &dead_workers) {
		struct worker *wk = sc_list_entry(pos, struct worker, node);
		pthread_join(wk->thread, NULL);
		free(wk);
	}
}

/* key: one rate limit per kind of refusal, so a flood over one limit hides no other. */
static void log_refusal(const char *key, const char *addr, const char *reason)
{
	SC_WARN_LIMITED("peer", key, "refused connection from %s: %s", addr, reason);
}

/* The source address of a peer, without the port, for the per-address limit. */
static void format_ip(const struct sockaddr *sa, char *out, size_t cap)
{
	snprintf(out, cap, "?");
	if (sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)cap);
	else if (sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
			  (socklen_t)cap);
}

/* The source address as 16 bytes, IPv4 (also IPv4-mapped IPv6) as ::ffff:a.b.c.d. */
static void source_net(const struct sockaddr *sa, uint8_t out[16])
{
	memset(out, 0, 16);
	if (sa->sa_family == AF_INET) {
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

static bool net_is_v4(const uint8_t n[16])
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(n, mapped, sizeof(mapped)) == 0;
}

/* In the same /24 (IPv4) or /64 (IPv6)? */
static bool same_prefix(const uint8_t a[16], const uint8_t b[16])
{
	bool v4 = net_is_v4(a);
	return v4 == net_is_v4(b) && memcmp(a, b, v4 ? 15 : 8) == 0;
}

/* "10.1.2.0/24" or "2001:db8::/64". */
static void format_prefix(const uint8_t n[16], char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	if (net_is_v4(n)) {
		uint8_t v4[4] = {n[12], n[13], n[14], 0};
		inet_ntop(AF_INET, v4, host, sizeof(host));
		snprintf(out, cap, "%s/24", host);
	} else {
		uint8_t v6[16] = {0};
		memcpy(v6, n, 8);
		inet_ntop(AF_INET6, v6, host, sizeof(host));
		snprintf(out, cap, "%s/64", host);
	}
}

/* Did a hello from this address succeed within RECENT_AUTH_MS? Under mu. */
static bool recent_auth_has_locked(const struct sc_peer_server *srv, const uint8_t net[16],
				   uint64_t now)
{
	for (size_t i = 0; i < RECENT_AUTH_SLOTS; i++) {
		const struct recent_auth *r = &srv->recent_auth[i];
		if (r->mono_ms && now - r->mono_ms < RECENT_AUTH_MS && memcmp(r->net, net, 16) == 0)
			return true;
	}
	return false;
}

/* A hello from this address succeeded; the table full, the longest-silent address gives way.
 * Under mu. */
static void recent_auth_note_locked(struct sc_peer_server *srv, const uint8_t net[16], uint64_t now)
{
	struct recent_auth *slot = &srv->recent_auth[0];
	for (size_t i = 0; i < RECENT_AUTH_SLOTS; i++) {
		struct recent_auth *r = &srv->recent_auth[i];
		if (r->mono_ms && memcmp(r->net, net, 16) == 0) {
			slot = r;
			break;
		}
		if (r->mono_ms < slot->mono_ms)
			slot = r;
	}
	memcpy(slot->net, net, 16);
	slot->mono_ms = now ? now : 1;
}

/* The connection no longer holds room before the hello (authenticated, ended, or dropped for a
 * newer one). Under mu. */
static void prehello_leave_locked(struct sc_peer_server *srv, struct conn *c)
{
	if (!sc_list_linked(&c->wait_node))
		return;
	sc_list_remove(&c->wait_node);
	srv->n_waiting_room[c->reserved]--;
}

/* Parked, and not a byte arrived: a silent connection (a dialing sidecar speaks at once). */
static bool prehello_silent(const struct conn *c)
{
	int n = 0;
	return atomic_load(&c->state) == CONN_IDLE && ioctl(c->fd, FIONREAD, &n) == 0 && n == 0;
}

enum room_scope { ROOM_ADDR, ROOM_PREFIX, ROOM_GENERAL };

static bool in_room_scope(const struct conn *o, enum room_scope scope, const uint8_t net[16])
{
	switch (scope) {
	case ROOM_ADDR:
		return memcmp(o->net, net, 16) == 0;
	case ROOM_PREFIX:
		return !o->reserved && same_prefix(o->net, net);
	case ROOM_GENERAL:
		return !o->reserved;
	}
	return false;
}

/* Whom to close for room in a scope: the oldest silent connection; without one, the oldest in
 * its handshake (it sent a byte and stalled); else the oldest. Under mu. */
static struct conn *prehello_victim_locked(struct sc_peer_server *srv, enum room_scope scope,
					   const uint8_t net[16])
{
	struct conn *busy = NULL, *any = NULL;
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->prehello) { /* oldest first */
		struct conn *o = sc_list_entry(pos, struct conn, wait_node);
		if (!in_room_scope(o, scope, net))
			continue;
		if (prehello_silent(o))
			return o;
		if (!busy && atomic_load(&o->state) == CONN_BUSY)
			busy = o;
		if (!any)
			any = o;
	}
	return busy ? busy : any;
}

/*
 * Room for a new connection from `net` (addr: for messages) to wait for its hello. A full room
 * never turns the newcomer away (a flood that reopens what is closed would keep every honest peer
 * out): the oldest silent connection in the narrowest scope that is full is closed instead, at
 * once, its room free. The scopes: the address (--data-max-unauth-per-ip, both rooms); for the
 * general room, its /24 or /64 (max_unauth_per_prefix) and the room itself (--data-max-unauth
 * less reserved_room); for an address whose hello succeeded lately, the reserved room, which the
 * others never take (full, such a newcomer takes the general room). *reserved: which room it
 * takes. False only when no room could be made. Accept thread, under mu.
 */
static bool prehello_make_room_locked(struct sc_peer_server *srv, const uint8_t net[16],
				      const char *addr, uint64_t now, bool *reserved)
{
	*reserved = srv->n_waiting_room[1] < srv->reserved_room &&
		    recent_auth_has_locked(srv, net, now);
	for (int round = 0; round < 4; round++) {
		size_t same_addr = 0, same_net = 0;
		struct sc_list *pos;
		sc_list_foreach(pos, &srv->prehello) {
			const struct conn *o = sc_list_entry(pos, struct conn, wait_node);
			same_addr += memcmp(o->net, net, 16) == 0;
			same_net += !o->reserved && same_prefix(o->net, net);
		}
		char reason[320], where[INET6_ADDRSTRLEN + 8];
		enum room_scope scope;
		const char *key;
		size_t general = srv->max_unauth - srv->reserved_room;
		if (same_addr >= srv->max_unauth_per_ip) {
			scope = ROOM_ADDR;
			key = "peer-prehello-drop-addr";
			snprintf(reason, sizeof(reason),
				 "%zu connections from its address are waiting for their hello "
				 "(--data-max-unauth-per-ip %u)",
				 same_addr, srv->max_unauth_per_ip);
		} else if (!*reserved && same_net >= srv->max_unauth_per_prefix) {
			scope = ROOM_PREFIX;
			key = "peer-prehello-drop-prefix";
			format_prefix(net, where, sizeof(where));
			snprintf(reason, sizeof(reason),
				 "%zu connections from %s are waiting for their hello (a share of "
				 "%u per /24 or /64: a quarter of --data-max-unauth %u less the room "
				 "kept for recent peers, at least --data-max-unauth-per-ip)",
				 same_net, where, srv->max_unauth_per_prefix, srv->max_unauth);
		} else if (!*reserved && srv->n_waiting_room[0] >= general) {
			scope = ROOM_GENERAL;
			key = "peer-prehello-drop-room";
			snprintf(reason, sizeof(reason),
				 "%zu connections are waiting for their hello (--data-max-unauth %u, "
				 "%u of it kept for addresses that authenticated recently)",
				 srv->n_waiting_room[0], srv->max_unauth, srv->reserved_room);
		} else { /* room in every scope (a reserved newcomer: its room has space) */
			return true;
		}
		struct conn *v = round < 3 ? prehello_victim_locked(srv, scope, net) : NULL;
		if (!v)
			break;
		bool silent = prehello_silent(v);
		prehello_leave_locked(srv, v);
		v->displaced = true;
		int idle = CONN_IDLE; /* parked: its pool thread ends it at once */
		atomic_compare_exchange_strong(&v->state, &idle, CONN_EXPIRED);
		shutdown(v->fd, SHUT_RDWR); /* in its handshake: its next read fails */
		SC_WARN_LIMITED("peer", key,
				"dropped connection from %s (%s for %llu ms) to admit %s: %s",
				v->addr, silent ? "silent" : "without its hello",
				(unsigned long long)(now - v->accepted_mono_ms), addr, reason);
	}
	return false;
}

static void accept_one(struct sc_peer_server *srv, int listen_fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int fd = accept4(listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE) && srv->spare_fd >= 0) {
		/* Out of descriptors: give the spare one up to accept the peer, tell it why, and
		 * take the spare back (an accept that fails leaves it in the backlog, silent). */
		int e = errno;
		close(srv->spare_fd);
		srv->spare_fd = -1;
		fd = accept4(listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
		if (fd >= 0) {
			char addr[80];
			format_addr((struct sockaddr *)&ss, addr, sizeof(addr));
			struct rlimit rl;
			unsigned long long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0
						     ? (unsigned long long)rl.rlim_cur
						     : 0;
			struct sc_err err;
			sc_err_set(&err, SC_RESOURCE_EXHAUSTED,
				   "sidecar %s is out of file descriptors (%s; open-file limit %llu): "
				   "retry later, or raise its limit (ulimit -Hn, LimitNOFILE=)",
				   srv->self_id, e == EMFILE ? "this process's limit" : "the system's",
				   lim);
			struct sc_peer_wait w = {.deadline_mono_ms = sc_clock_mono_ms() + 1000};
			sc_peer_send_refusal(fd, &w, &err);
			log_refusal("peer-refused-fds", addr, err.msg);
			/* Read what the peer sent (its hello) before closing, so the close is a FIN
			 * and not a reset that could destroy the refusal before the peer reads it. */
			shutdown(fd, SHUT_WR);
			struct pollfd p = {.fd = fd, .events = POLLIN};
			char sink[512];
			while (poll(&p, 1, 100) > 0 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
				;
			close(fd);
		}
		srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		return;
	}
	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			log_refusal("peer-refused-accept", "?", strerror(errno));
			usleep(100 * 1000); /* the backlog stays readable: do not spin */
		}
		return;
	}
	char addr[80], ip[INET6_ADDRSTRLEN];
	format_addr((struct sockaddr *)&ss, addr, sizeof(addr));
	format_ip((struct sockaddr *)&ss, ip, sizeof(ip));
	uint8_t net[16];
	source_net((struct sockaddr *)&ss, net);
	/* Only the accept thread adds connections, so the room made here is still there when the
	 * connection is added below. Authenticated connections have their own cap (checked after
	 * the hello), so a flood of idle connections cannot take their room. */
	uint64_t now = sc_clock_mono_ms();
	bool reserved = false;
	pthread_mutex_lock(&srv->mu);
	bool room = prehello_make_room_locked(srv, net, addr, now, &reserved);
	pthread_mutex_unlock(&srv->mu);
	if (!room) {
		log_refusal("peer-refused-unauth", addr, "no room before the hello");
		close(fd);
		return;
	}
	struct conn *c = calloc(1, sizeof(*c));
	if (!c) {
		log_refusal("peer-refused-resources", addr, "out of memory");
		close(fd);
		return;
	}
	c->srv = srv;
	c->fd = fd;
	c->accepted_mono_ms = now;
	memcpy(c->net, net, sizeof(c->net));
	c->reserved = reserved;
	sc_list_init(&c->wait_node);
	atomic_init(&c->revoked, false);
	atomic_init(&c->state, CONN_IDLE);
	atomic_init(&c->retired, false);
	atomic_init(&c->last_active_seq, 0);
	snprintf(c->addr, sizeof(c->addr), "%s", addr);
	snprintf(c->ip, sizeof(c->ip), "%s", ip);
	snprintf(c->what, sizeof(c->what), "peer at %s", c->addr);
	/* Server I/O waits with coarser slices than clients: its limits are seconds long and
	 * shutdown() wakes it at once when the server stops. */
	if (sc_peer_tune_socket(c->fd) != 0 || sc_peer_set_io_slice(c->fd, SERVER_SLICE_MS) != 0)
		SC_WARN_LIMITED("peer", "peer-sockopt", "connection from %s: cannot set socket "
				"options: %s", c->addr, strerror(errno));

	/* Parked until its hello arrives (a pool thread takes it then; sweep ends it when none
	 * comes in time). Live first: from the moment it is in the epoll set a thread may take
	 * it. */
	pthread_mutex_lock(&srv->mu);
	sc_list_insert_head(&srv->live, &c->node);
	srv->n_live++;
	srv->n_unauth++;
	sc_list_insert_tail(&srv->prehello, &c->wait_node);
	srv->n_waiting_room[reserved]++;
	pthread_mutex_unlock(&srv->mu);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		int e = errno;
		pthread_mutex_lock(&srv->mu);
		sc_list_remove(&c->node);
		prehello_leave_locked(srv, c);
		srv->n_live--;
		srv->n_unauth--;
		pthread_mutex_unlock(&srv->mu);
		log_refusal("peer-refused-resources", addr, strerror(e));
		close(fd);
		free(c);
	}
}

static void *accept_main(void *arg)
{
	struct sc_peer_server *srv = arg;
	while (!atomic_load(&srv->stopping)) {
		uint64_t next_due = expire_orphans(srv, false);
		int timeout = SWEEP_MS;
		if (next_due) {
			uint64_t now = sc_clock_mono_ms();
			timeout = next_due <= now ? 0
						  : (int)(next_due - now < SWEEP_MS ? next_due - now
										    : SWEEP_MS);
		}
		/* pfd[0]: the wake-up; then one per listening endpoint */
		struct pollfd pfd[1 + SC_MAX_ENDPOINTS] = {{.fd = srv->wake_fd, .events = POLLIN}};
		for (size_t i = 0; i < srv->n_listen; i++)
			pfd[1 + i] = (struct pollfd){.fd = srv->listen_fd[i], .events = POLLIN};
		int n = poll(pfd, (nfds_t)(1 + srv->n_listen), timeout);
		if (n < 0 && errno != EINTR) {
			SC_ERROR("peer", "poll on the data listener failed: %s", strerror(errno));
			usleep(100 * 1000);
			continue;
		}
		if (n > 0 && (pfd[0].revents & POLLIN)) {
			uint64_t v;
			ssize_t r = read(srv->wake_fd, &v, sizeof(v));
			(void)r;
		}
		reap(srv);
		if (atomic_load(&srv->stopping))
			break;
		uint64_t now = sc_clock_mono_ms();
		if (now - srv->last_sweep_mono_ms >= SWEEP_MS) {
			srv->last_sweep_mono_ms = now;
			sweep(srv);
		}
		for (size_t i = 0; n > 0 && i < srv->n_listen; i++)
			if (pfd[1 + i].revents & POLLIN)
				accept_one(srv, srv->listen_fd[i]);
	}
	return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static bool is_wildcard(const char *host)
{
	return !host[0] || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 ||
	       strcmp(host, "*") == 0;
}

/* "host:port" with IPv6 literals bracketed. False when it does not fit. */
static bool join_hostport(char *out, size_t cap, const char *host, unsigned port)
{
	int n;
	if (strchr(host, ':') && host[0] != '[')
		n = snprintf(out, cap, "[%s]:%u", host, port);
	else
		n = snprintf(out, cap, "%s:%u", host, port);
	return n > 0 && (size_t)n < cap;
}

/* The next entry of a comma list at *p into out (cut to cap); *p moves past it, NULL after the
 * last. */
static const char *list_entry(const char **p, char *out, size_t cap)
{
	const char *comma = strchr(*p, ',');
	size_t len = comma ? (size_t)(comma - *p) : strlen(*p);
	snprintf(out, cap, "%.*s", (int)len, *p);
	*p = comma ? comma + 1 : NULL;
	return out;
}

/* Bind and listen on endpoint i, listen_text ("HOST:PORT"); adv: the host peers dial (NULL:
 * derived). */
static int listen_one(struct sc_peer_server *srv, size_t i, const char *listen_text,
		      const char *adv, struct sc_err *err)
{
	char host[256];
	uint16_t port;
	if (sc_parse_hostport(listen_text, host, sizeof(host), &port, err) != 0)
		return sc_err_prefix(err, "--data-listen");
	const char *node = host[0] && strcmp(host, "*") != 0 ? host : "0.0.0.0";
	uint16_t bound;
	if (sc_listen_tcp("--data-listen", listen_text, node, port, 128,
			  " port, or 0 for an ephemeral one", &srv->listen_fd[i], &bound, err) != 0)
		return -1;
	bool given = adv != NULL;
	if (!adv && is_wildcard(host)) {
		SC_WARN("peer", "--data-listen %s listens on every address but peers are told "
				"127.0.0.1: set --advertise to an address other hosts can reach "
				"for multi-host transfers",
			listen_text);
		adv = "127.0.0.1";
	}
	if (!join_hostport(srv->endpoint[i], sizeof(srv->endpoint[i]), adv ? adv : host, bound))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s \"%s\" is too long for a data endpoint (at most %zu characters "
				  "with the port)",
				  given ? "--advertise" : "--data-listen host", adv ? adv : host,
				  sizeof(srv->endpoint[i]) - 1);
	SC_INFO("peer", "data listener on %s, advertised as %s", listen_text, srv->endpoint[i]);
	return 0;
}

int sc_peer_server_create(const struct sc_peer_server_env *env, const struct sc_config *cfg,
			  struct sc_peer_server **out, struct sc_err *err)
{
	struct sc_peer_server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	srv->passive = env->passive;
	snprintf(srv->self_id, sizeof(srv->self_id), "%s", env->self_id);
	srv->keys = env->keys;
	srv->gpu = env->gpu;
	for (size_t i = 0; i < SC_MAX_ENDPOINTS; i++)
		srv->listen_fd[i] = -1;
	srv->wake_fd = -1;
	srv->epfd = -1;
	srv->stop_fd = -1;
	/* Held in reserve: when the process runs out of descriptors, closing it lets the accept
	 * thread take one more connection to tell that peer why it is refused. */
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	pthread_mutex_init(&srv->mu, NULL);
	pthread_cond_init(&srv->cv, NULL);
	sc_list_init(&srv->live);
	sc_list_init(&srv->dead);
	sc_list_init(&srv->workers);
	sc_list_init(&srv->dead_workers);
	sc_list_init(&srv->orphans);
	sc_list_init(&srv->serving);
	srv->toks = sc_idmap_create();
	srv->idents = sc_idmap_create();
	srv->min_workers = cfg->data_io_threads ? cfg->data_io_threads : 4;
	srv->idle_ms = sc_peer_test_idle_ms(SC_PEER_SERVER_IDLE_MS);
	atomic_init(&srv->stopping, false);
	srv->max_unauth_per_ip = cfg->data_max_unauth_per_ip ? cfg->data_max_unauth_per_ip : 16;
	srv->max_unauth = cfg->data_max_unauth ? cfg->data_max_unauth : 64;
	/* Before the hello: a quarter kept for recent peers; a /24 or /64 holds a quarter of the
	 * rest, or one address's limit when that is larger (RECENT_AUTH_MS, accept_one). */
	sc_list_init(&srv->prehello);
	srv->reserved_room = srv->max_unauth / 4;
	uint32_t general = srv->max_unauth - srv->reserved_room;
	srv->max_unauth_per_prefix = general / 4 > srv->max_unauth_per_ip ? general / 4
									  : srv->max_unauth_per_ip;
	if (srv->max_unauth_per_prefix > general)
		srv->max_unauth_per_prefix = general;
	srv->first_byte_ms = cfg->data_first_byte_timeout_ms ? cfg->data_first_byte_timeout_ms
							     : 1000;
	srv->max_peers = cfg->data_max_peers ? cfg->data_max_peers : SC_PEER_SERVER_MAX_CONNS;
	srv->max_per_id = srv->max_peers / 4 ? srv->max_peers / 4 : 1;
	if (!srv->toks || !srv->idents) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	atomic_init(&srv->n_evicted, 0);
	atomic_init(&srv->activity_seq, 0);
	if ((srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
	    (srv->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		sc_err_set(err, SC_INTERNAL, "eventfd: %s", strerror(errno));
		goto fail;
	}
	struct epoll_event stop_ev = {.events = EPOLLIN, .data.ptr = NULL};
	if ((srv->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->stop_fd, &stop_ev) != 0) {
		sc_err_set(err, SC_INTERNAL, "epoll for the peer connections: %s", strerror(errno));
		goto fail;
	}
	/* --data-listen and --advertise are comma lists, entry i of one going with entry i of
	 * the other (conf/config.c checked each entry's syntax). */
	const char *listen_list = cfg->data_listen ? cfg->data_listen : "0.0.0.0:0";
	const char *adv_list = cfg->advertise && cfg->advertise[0] ? cfg->advertise : NULL;
	const char *lp = listen_list, *ap = adv_list;
	while (lp && srv->n_listen < SC_MAX_ENDPOINTS) {
		size_t i = srv->n_listen;
		char adv[256];
		if (adv_list && !ap)
			break; /* fewer hosts than endpoints: said below */
		list_entry(&lp, srv->listen_addr[i], sizeof(srv->listen_addr[i]));
		if (listen_one(srv, i, srv->listen_addr[i],
			       ap ? list_entry(&ap, adv, sizeof(adv)) : NULL, err) != 0)
			goto fail;
		srv->n_listen++;
	}
	if (lp && srv->n_listen == SC_MAX_ENDPOINTS) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--data-listen names more than %d endpoints",
			   SC_MAX_ENDPOINTS);
		goto fail;
	}
	if (lp || ap) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--advertise must name one host per --data-listen endpoint, in the same "
			   "order");
		goto fail;
	}
	*out = srv;
	return 0;
fail:
	sc_peer_server_destroy(srv);
	return -1;
}

int sc_peer_server_start(struct sc_peer_server *srv, struct sc_err *err)
{
	if (srv->started)
		return 0;
	pthread_mutex_lock(&srv->mu);
	int rc = 0;
	while (rc == 0 && srv->n_workers < srv->min_workers)
		rc = spawn_worker_locked(srv) != 0 ? errno : 0;
	pthread_mutex_unlock(&srv->mu);
	if (rc == 0)
		rc = pthread_create(&srv->accept_thread, NULL, accept_main, srv);
	srv->started = true; /* destroy joins what did start */
	if (rc != 0) {
		srv->accept_started = false;
		return sc_err_set(err, SC_INTERNAL, "cannot start the peer connection threads: %s",
				  strerror(rc));
	}
	srv->accept_started = true;
	return 0;
}

/* ---- the passive interface as seen through this server (backend/passive.h) ---------------------------
 * Every call goes to the engine's interface unchanged, except claim, which only the server can
 * answer: it knows which connection OPENed which transfer, and how. */

static int srv_open(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, const char *peer_id, uint64_t total_bytes,
		    struct sc_err *err)
{
	struct sc_peer_server *srv = ctx;
	return sc_passive_open(&srv->passive, token, xfer_id, peer_kind, peer_id, total_bytes, err);
}

static void srv_set_backend(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			    enum sc_backend_kind backend)
{
	struct sc_peer_server *srv = ctx;
	sc_passive_set_backend(&srv->passive, token, xfer_id, backend);
}

static int srv_span(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, uint32_t desc_index, uint64_t offset, uint64_t len,
		    struct sc_span *out, struct sc_err *err)
{
	struct sc_peer_server *srv = ctx;
	return sc_passive_span(&srv->passive, token, xfer_id, peer_kind, desc_index, offset, len,
			       out, err);
}

static void srv_span_release(void *ctx, struct sc_span *span, uint64_t bytes_moved)
{
	struct sc_peer_server *srv = ctx;
	sc_passive_span_release(&srv->passive, span, bytes_moved);
}

static int srv_done(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_status status, const char *msg, struct sc_err *err)
{
	struct sc_peer_server *srv = ctx;
	return sc_passive_done(&srv->passive, token, xfer_id, status, msg, err);
}

static void srv_abandon(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			const char *why)
{
	struct sc_peer_server *srv = ctx;
	sc_passive_abandon(&srv->passive, token, xfer_id, why);
}

static int srv_claim(void *ctx, const char *peer_id, uint64_t xfer_id, enum sc_backend_kind via,
		     uint8_t token[SC_TOKEN_LEN])
{
	return claim(ctx, peer_id, xfer_id, via, token);
}

static const struct sc_passive_ops server_passive_ops = {
	.open = srv_open,
	.set_backend = srv_set_backend,
	.span = srv_span,
	.span_release = srv_span_release,
	.done = srv_done,
	.abandon = srv_abandon,
	.claim = srv_claim,
};

void sc_peer_server_revoke(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN])
{
	unsigned cut = 0;
	pthread_mutex_lock(&srv->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->serving) { /* only the connections serving a request */
		struct conn *c = sc_list_entry(pos, struct conn, serving_node);
		if (memcmp(c->serving_token, token, SC_TOKEN_LEN) != 0)
			continue;
		atomic_store(&c->revoked, true);
		shutdown(c->fd, SHUT_RDWR);
		cut++;
	}
	/* Its records go: a connection that only OPENed it holds nothing of it any more (nor its
	 * room), and no orphan of it is told. O(its records). */
	struct tok *t;
	while ((t = sc_idmap_get(srv->toks, token, SC_TOKEN_LEN)))
		rec_drop_locked(srv, sc_list_entry(sc_list_first(&t->recs), struct rec, tok_node));
	pthread_mutex_unlock(&srv->mu);
	if (cut)
		sc_log_limited(SC_LOG_INFO, "peer", "peer-revoke-cut", /* a peer can make it happen */
			       "an operation ended while %u peer connection(s) still moved its bytes: "
			       "cut them, so no further byte of its memory is read or written",
			       cut);
}

struct sc_passive sc_peer_server_passive(struct sc_peer_server *srv)
{
	return (struct sc_passive){.ops = &server_passive_ops, .ctx = srv};
}

const char *sc_peer_server_endpoint(const struct sc_peer_server *srv)
{
	return srv->endpoint[0];
}

size_t sc_peer_server_n_endpoints(const struct sc_peer_server *srv)
{
	return srv->n_listen;
}

const char *sc_peer_server_endpoint_at(const struct sc_peer_server *srv, size_t i)
{
	return i < srv->n_listen ? srv->endpoint[i] : "";
}

int sc_peer_server_set_handler(struct sc_peer_server *srv, enum sc_frame_type type,
			       sc_peer_handler_fn fn, void *ctx)
{
	if (type != SC_FRAME_QP_CONNECT)
		return -1;
	pthread_mutex_lock(&srv->mu);
	srv->qp_fn = fn;
	srv->qp_ctx = ctx;
	/* Removing (or replacing) a handler waits for its running calls, so the caller may free
	 * ctx as soon as this returns. */
	while (srv->qp_busy)
		pthread_cond_wait(&srv->cv, &srv->mu);
	pthread_mutex_unlock(&srv->mu);
	return 0;
}

void sc_peer_server_set_tls(struct sc_peer_server *srv, struct sc_peer_tls *tls)
{
	srv->tls = tls;
}

static void free_value(void *ctx, void *value)
{
	(void)ctx;
	free(value);
}

void sc_peer_server_destroy(struct sc_peer_server *srv)
{
	if (!srv)
		return;
	atomic_store(&srv->stopping, true);
	if (srv->accept_started) {
		wake(srv);
		pthread_join(srv->accept_thread, NULL);
		srv->accept_started = false;
	}
	for (size_t i = 0; i < SC_MAX_ENDPOINTS; i++) {
		if (srv->listen_fd[i] >= 0)
			close(srv->listen_fd[i]);
		srv->listen_fd[i] = -1;
	}
	/* Cut every connection: a request in hand ends at once; then wake every pool thread
	 * (stop_fd stays readable) and join them all. */
	pthread_mutex_lock(&srv->mu);
	struct sc_list *pos, *tmp;
	sc_list_foreach(pos, &srv->live) {
		shutdown(sc_list_entry(pos, struct conn, node)->fd, SHUT_RDWR);
	}
	pthread_mutex_unlock(&srv->mu);
	if (srv->stop_fd >= 0) {
		uint64_t one = 1;
		ssize_t n = write(srv->stop_fd, &one, sizeof(one));
		(void)n;
	}
	if (srv->started) {
		struct sc_list running = SC_LIST_INIT(running);
		pthread_mutex_lock(&srv->mu);
		sc_list_move_all(&srv->workers, &running);
		pthread_mutex_unlock(&srv->mu);
		sc_list_foreach_safe(pos, tmp, &running) {
			struct worker *wk = sc_list_entry(pos, struct worker, node);
			pthread_join(wk->thread, NULL);
			free(wk);
		}
		srv->started = false;
	}
	/* No thread is left to take them: end the parked connections here. */
	for (;;) {
		pthread_mutex_lock(&srv->mu);
		struct conn *c = sc_list_empty(&srv->live)
				     ? NULL
				     : sc_list_entry(srv->live.next, struct conn, node);
		pthread_mutex_unlock(&srv->mu);
		if (!c)
			break;
		char why[SC_NAME_MAX + 40];
		snprintf(why, sizeof(why), "sidecar \"%s\" is shutting down", srv->self_id);
		conn_finish(c, why);
	}
	reap(srv);
	expire_orphans(srv, true);
	/* Every connection ended and every orphan was told: no record is left. */
	sc_u64map_clear(&srv->recs);
	sc_u64map_clear(&srv->by_xfer);
	if (srv->idents)
		sc_idmap_each(srv->idents, free_value, NULL);
	sc_idmap_destroy(srv->idents);
	sc_idmap_destroy(srv->toks);
	if (srv->epfd >= 0)
		close(srv->epfd);
	if (srv->stop_fd >= 0)
		close(srv->stop_fd);
	if (srv->wake_fd >= 0)
		close(srv->wake_fd);
	if (srv->spare_fd >= 0)
		close(srv->spare_fd);
	pthread_cond_destroy(&srv->cv);
	pthread_mutex_destroy(&srv->mu);
	free(srv);
}

uint64_t sc_peer_server_evicted(const struct sc_peer_server *srv)
{
	return srv ? atomic_load(&srv->n_evicted) : 0;
}

void sc_peer_server_load(struct sc_peer_server *srv, struct sc_peer_server_load *out)
{
	*out = (struct sc_peer_server_load){0};
	if (!srv)
		return;
	pthread_mutex_lock(&srv->mu);
	const struct sc_list *pos;
	sc_list_foreach(pos, &srv->live) {
		const struct conn *c = sc_list_entry(pos, struct conn, node);
		if (!c->authed)
			out->hello++;
		else if (atomic_load(&c->state) == CONN_IDLE)
			out->idle++;
		else
			out->busy++;
	}
	out->threads = srv->n_workers;
	out->threads_waiting = srv->n_waiting;
	pthread_mutex_unlock(&srv->mu);
}

int sc_peer_server_retire_peer(struct sc_peer_server *srv, const char *peer_id,
			       uint64_t min_idle_ms)
{
	if (!srv)
		return 0;
	int rc = 0;
	uint64_t now = sc_clock_mono_ms();
	pthread_mutex_lock(&srv->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->orphans) {
		if (strcmp(sc_list_entry(pos, struct orphan, node)->peer_id, peer_id) == 0) {
			rc = -1; /* a transfer of it may still be moving bytes */
			goto out;
		}
	}
	sc_list_foreach(pos, &srv->live) {
		struct conn *o = sc_list_entry(pos, struct conn, node);
		if (!o->authed || strcmp(o->peer_id, peer_id) != 0)
			continue;
		if (!idle_locked(o) || o->n_opened ||
		    atomic_load(&o->last_active_mono_ms) + min_idle_ms > now) {
			rc = -1;
			goto out;
		}
	}
	sc_list_foreach(pos, &srv->live) {
		struct conn *o = sc_list_entry(pos, struct conn, node);
		if (!o->authed || strcmp(o->peer_id, peer_id) != 0)
			continue;
		if (!evict_locked(srv, o, true)) {
			rc = -1; /* a request just arrived on it */
			goto out;
		}
	}
out:
	pthread_mutex_unlock(&srv->mu);
	return rc;
}
