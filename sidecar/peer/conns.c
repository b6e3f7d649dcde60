/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/conns.c: the peer connections between requests, the pool of threads that serves them, and
 * their admission and eviction under --data-max-peers. A connection with no request in hand is
 * parked in an epoll set (one-shot); whichever pool thread is waiting takes it when bytes arrive,
 * serves the hello or the requests that are there (peer/serve.c: blocking, deadline-bounded I/O
 * in the thread's own frame buffer) and parks it again. --data-io-threads threads wait; while
 * every one is busy another starts, so a stalled peer holds one thread and never another peer;
 * those beyond the number end after WORKER_IDLE_MS without work. A parked connection costs its
 * struct conn (about 1 KB) and its socket, whatever the number of peers. A connection that ends
 * leaves what it OPENed as orphans (peer/records.c).
 *
 * Threads: the pool threads (worker_main, take), the accept thread (sweep, reap) and destroy.
 * Owns the epoll set's connections, the pool threads and the peer ids' counts (struct ident).
 */
#include "peer/internal.h"

#include "base/log.h"
#include "base/timer.h"
#include "peer/tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONN_STACK_BYTES (512u * 1024u)
/* A pool thread beyond --data-io-threads ends after this long without a connection to serve. */
#define WORKER_IDLE_MS 10000
/* A new connection's first byte (its TLS ClientHello or its hello) must arrive within
 * --data-first-byte-timeout (1 s; a dialing sidecar sends at once), and the TLS handshake and the
 * hello must end within UNAUTH_HELLO_MS after that: 3 s from the accept by default, sooner than
 * the dialing side's SC_PEER_HELLO_TIMEOUT_MS. */
#define UNAUTH_HELLO_MS 2000

/* The authenticated connections of one peer id (its share of --data-max-peers). */
struct ident {
	char id[SC_NAME_MAX];
	uint32_t n;
};

void ps_wake(struct sc_peer_server *srv)
{
	uint64_t one = 1;
	ssize_t n = write(srv->wake_fd, &one, sizeof(one));
	(void)n;
}

/* ---- peer ids and their share of --data-max-peers (struct ident; under srv->mu) -------------- */

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

/* ---- connection threads ---------------------------------------------------------------------- */

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

/* The connection ends: hand its transfers over, close it, queue it for freeing. The pool thread
 * that served it (or destroy) calls this last: the connection may be freed as it returns. */
void ps_conn_finish(struct conn *c, const char *why)
{
	struct sc_peer_server *srv = c->srv;
	uint64_t due = sc_clock_mono_ms() + ORPHAN_GRACE_MS;
	pthread_mutex_lock(&srv->mu);
	sc_list_remove(&c->node);
	ps_prehello_leave_locked(srv, c);
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
		ps_hold_free_locked(h);
		if (!sc_list_empty(&r->holds) || r->orphan)
			continue;
		struct orphan *o = calloc(1, sizeof(*o));
		if (!o) {
			/* Cannot wait: tell the engine now, without the lock. */
			uint8_t token[SC_TOKEN_LEN];
			uint64_t xfer_id = r->xfer_id;
			memcpy(token, r->token, SC_TOKEN_LEN);
			ps_rec_drop_locked(srv, r);
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
	ps_wake(srv);
}

/* May this connection be closed for another peer? Authenticated, parked, no request in hand,
 * whatever it has OPENed (a peer could otherwise hold its slot forever with an OPEN and no DONE;
 * what it opened becomes an orphan, abandoned unless its DONE comes on another connection). Under
 * srv->mu. */
bool ps_idle_locked(const struct conn *o)
{
	return o->authed && !o->serving && atomic_load(&o->state) == CONN_IDLE;
}

/* Close an idle connection now and give its room back at once: it still counts until a pool
 * thread ends it (its shutdown wakes one). False when a request just arrived on it
 * (compare-and-swap). retired: closed with its peer's ibverbs QP (sc_peer_server_retire_peer),
 * which its log line says. Under srv->mu. */
bool ps_evict_locked(struct sc_peer_server *srv, struct conn *o, bool retired)
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
 * A cap is reached: close an idle connection (ps_idle_locked: no request in hand), of peer `of`
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
		if (o == for_conn || !ps_idle_locked(o) || (of && strcmp(o->peer_id, of) != 0))
			continue;
		uint64_t seq = atomic_load(&o->last_active_seq);
		bool clear = o->n_opened == 0;
		if (!lru || (clear && !lru_clear) || (clear == lru_clear && seq < oldest)) {
			oldest = seq;
			lru = o;
			lru_clear = clear;
		}
	}
	if (!lru || !ps_evict_locked(srv, lru, false))
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
			ps_mark_active(c);
			ps_prehello_leave_locked(srv, c);
			ps_recent_auth_note_locked(srv, c->net, sc_clock_mono_ms());
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
		SC_DEBUG_KV("peer", (&(struct sc_log_fields){.peer = c->peer_id}), "authenticated %s",
			    c->what);
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
		sc_log_kv_limited(SC_LOG_WARN, "peer", key,
				  &(struct sc_log_fields){.code = sc_status_name(err.code)},
				  "rejected connection from %s: %s", c->addr, err.msg);
	}
	snprintf(why, why_cap, "hello failed: %s", err.msg);
	if (err.code != SC_DEADLINE_EXCEEDED && err.code != SC_CANCELLED)
		ps_drain_before_close(c->fd);
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
 * long as they keep coming, then park it again, or end it (ps_conn_finish).
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
		if (ps_serve_one(c, why, sizeof(why)) != 0)
			goto end;
	} while (input_waiting(c));
park:
	/* input_waiting said no: nothing is read ahead that epoll would never announce. */
	ps_held_flush(c); /* (every request answers, so nothing is held here) */
	c->buf = NULL;
	c->rb = NULL;
	c->held = NULL;
	if (park(c) == 0)
		return;
	snprintf(why, sizeof(why), "cannot wait for its next request: %s", strerror(errno));
end:
	ps_held_flush(c); /* replies held back still leave, as they would have */
	c->buf = NULL;
	c->rb = NULL; /* what was read ahead ends with the connection */
	c->held = NULL;
	SC_DEBUG("peer", "connection from %s ended: %s", c->what, why);
	ps_conn_finish(c, why);
}

/*
 * Close connections that have waited too long: authenticated ones idle for srv->idle_ms,
 * new ones silent for --data-first-byte-timeout (a parked connection is never served, so
 * the hello's own deadline cannot run for it). Only a parked one is closed (compare-and-swap);
 * its shutdown wakes a pool thread, which ends it. Accept thread.
 */
void ps_sweep(struct sc_peer_server *srv)
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
int ps_spawn_worker_locked(struct sc_peer_server *srv)
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
			ps_wake(srv);
			return NULL;
		}
		if (n <= 0 || !ev.data.ptr) { /* a timeout, or stop_fd */
			pthread_mutex_unlock(&srv->mu);
			continue;
		}
		if (--srv->n_waiting == 0 && ps_spawn_worker_locked(srv) != 0)
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
void ps_reap(struct sc_peer_server *srv)
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
