/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/pool.c: the dialing side of the peer control channel. Dials peer sidecars (non-blocking
 * connect with a timeout, then the hello, with the id and keyring source it was created with) and
 * keeps authenticated idle connections per endpoint for reuse. The requests that run on a
 * connection (OPEN, READ, WRITE, DONE, PING, generic) are in peer/request.c.
 *
 * Idle connections are kept per endpoint (a bucket found by hash, so a get or put looks at that
 * peer's connections only) and on one list of all of them, most recently used first. The pool's
 * reaper thread closes those idle longer than SC_PEER_POOL_IDLE_MS, and those the peer closed
 * (no socket left in CLOSE-WAIT), every REAP_MS: by a timer, not on the next dial.
 *
 */
#include "peer/pool.h"
#include "peer/conn.h"

#include "base/log.h"
#include "peer/proto.h"
#include "peer/tls.h"
#include "base/idmap.h"
#include "base/timer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * Threads: any, and the reaper. The idle lists are guarded by pool->mu (never held during I/O,
 * except the cheap liveness peek of an idle connection that is not yet handed out). A connection
 * belongs to the thread that got it until it is put back; sc_peer_conn_abort may come from another
 * thread. The pool owns its idle connections and the reaper; a connection handed out is owned by
 * its caller.
 */

#define REAP_MS 1000 /* how often the reaper looks at the idle connections */

/* One endpoint's idle connections, most recently used first. */
struct bucket {
	char endpoint[80];
	struct sc_list idle; /* struct sc_peer_conn, by bucket_node */
	size_t n;
};

struct sc_peer_pool {
	char self_id[SC_NAME_MAX];
	struct sc_keyring_source keys; /* for each hello */
	struct sc_peer_tls *tls; /* NULL: plain TCP */
	sc_peer_admit_fn admit;	 /* NULL: no admission request after the hello */
	pthread_mutex_t mu;
	pthread_cond_t cv;	  /* stops the reaper */
	struct sc_list idle;	  /* every idle struct sc_peer_conn, most recently used first */
	struct sc_idmap *buckets; /* hash of the endpoint -> struct bucket */
	pthread_t reaper;
	bool reaper_running, stop;
	uint64_t idle_ms; /* SC_PEER_POOL_IDLE_MS (tests: SC_TEST_PEER_IDLE_MS) */
};

/* The buckets' key: FNV-1a of the endpoint (the bucket keeps the text to compare). */
static uint64_t endpoint_key(const char *endpoint)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *p = endpoint; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	return h;
}

static struct bucket *bucket_find_locked(struct sc_peer_pool *pool, const char *endpoint)
{
	uint64_t k = endpoint_key(endpoint);
	struct bucket *b = sc_idmap_get(pool->buckets, &k, sizeof(k));
	return b && strcmp(b->endpoint, endpoint) == 0 ? b : NULL;
}

/* Take an idle connection off both lists. Under pool->mu. */
static void idle_unlink_locked(struct sc_peer_conn *c)
{
	struct bucket *b = c->bucket;
	sc_list_remove(&c->idle_node);
	sc_list_remove(&c->bucket_node);
	b->n--;
	c->bucket = NULL;
}

static void *reaper_main(void *arg);

static void conn_close(struct sc_peer_conn *c)
{
	if (!c)
		return;
	sc_peer_tls_close(c->fd); /* the TLS state behind the fd, then the fd */
	free(c);
}

void sc_peer_pool_set_admit(struct sc_peer_pool *pool, sc_peer_admit_fn admit)
{
	pool->admit = admit;
}

void sc_peer_pool_set_tls(struct sc_peer_pool *pool, struct sc_peer_tls *tls)
{
	pool->tls = tls;
}

int sc_peer_pool_create(const char *self_id, const struct sc_keyring_source *keys,
			struct sc_peer_pool **out, struct sc_err *err)
{
	struct sc_peer_pool *pool = calloc(1, sizeof(*pool));
	if (!pool)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	snprintf(pool->self_id, sizeof(pool->self_id), "%s", self_id);
	pool->keys = *keys;
	pool->idle_ms = sc_peer_test_idle_ms(SC_PEER_POOL_IDLE_MS);
	pthread_mutex_init(&pool->mu, NULL);
	pthread_cond_init(&pool->cv, NULL);
	sc_list_init(&pool->idle);
	if (!(pool->buckets = sc_idmap_create())) {
		sc_peer_pool_destroy(pool);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	int rc = pthread_create(&pool->reaper, NULL, reaper_main, pool);
	if (rc != 0) {
		sc_peer_pool_destroy(pool);
		return sc_err_set(err, SC_INTERNAL, "cannot start the peer pool's reaper: %s",
				  strerror(rc));
	}
	pool->reaper_running = true;
	*out = pool;
	return 0;
}

static void free_bucket(void *ctx, void *value)
{
	(void)ctx;
	free(value);
}

void sc_peer_pool_destroy(struct sc_peer_pool *pool)
{
	if (!pool)
		return;
	if (pool->reaper_running) {
		pthread_mutex_lock(&pool->mu);
		pool->stop = true;
		pthread_cond_signal(&pool->cv);
		pthread_mutex_unlock(&pool->mu);
		pthread_join(pool->reaper, NULL);
	}
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &pool->idle) {
		struct sc_peer_conn *c = sc_list_entry(pos, struct sc_peer_conn, idle_node);
		idle_unlink_locked(c);
		conn_close(c);
	}
	if (pool->buckets)
		sc_idmap_each(pool->buckets, free_bucket, NULL);
	sc_idmap_destroy(pool->buckets);
	pthread_cond_destroy(&pool->cv);
	pthread_mutex_destroy(&pool->mu);
	free(pool);
}

/* ---- dialing --------------------------------------------------------------------------------- */

/* Connect one address with a timeout, looking at cancel (may be NULL) every CONNECT_SLICE_MS.
 * Returns the fd (blocking) or -1 with errno (ECANCELED: cancelled). */
#define CONNECT_SLICE_MS 50
static int connect_addr(const struct addrinfo *ai, uint64_t until_ms, const atomic_bool *cancel)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			ai->ai_protocol);
	if (fd < 0)
		return -1;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		if (errno != EINPROGRESS)
			goto fail;
		for (;;) {
			uint64_t now = sc_clock_mono_ms();
			if (now >= until_ms) {
				errno = ETIMEDOUT;
				goto fail;
			}
			if (cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
				errno = ECANCELED;
				goto fail;
			}
			uint64_t slice = until_ms - now < CONNECT_SLICE_MS ? until_ms - now
									    : CONNECT_SLICE_MS;
			struct pollfd pfd = {.fd = fd, .events = POLLOUT};
			int n = poll(&pfd, 1, (int)slice);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				goto fail;
			if (n == 0)
				continue;
			int soerr = 0;
			socklen_t sl = sizeof(soerr);
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
				goto fail;
			if (soerr) {
				errno = soerr;
				goto fail;
			}
			break;
		}
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || sc_peer_tune_socket(fd) != 0)
		goto fail;
	return fd;
fail:;
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

/*
 * A failure worth another try: the peer's data port refused or reset the connection, or closed
 * it before saying anything (what a busy data port does to connections it cannot take, see
 * peer/prehello.c), or it said it is busy and to retry (RESOURCE_EXHAUSTED "... busy: retry in a
 * few seconds": --data-max-peers, or this sidecar's share of it, all with a request in hand). Any
 * other refusal the peer explained (ERROR frame), a certificate or a key that does not verify,
 * and garbage are final.
 */
static bool retryable(const struct sc_err *err, int connect_errno)
{
	if (connect_errno)
		return connect_errno == ECONNREFUSED || connect_errno == ECONNRESET ||
		       connect_errno == EAGAIN;
	if (err->code == SC_RESOURCE_EXHAUSTED && strstr(err->msg, "busy: retry in"))
		return true;
	return err->code == SC_UNAVAILABLE && !strstr(err->msg, "refused the hello") &&
	       (strstr(err->msg, "closed the connection") || strstr(err->msg, strerror(ECONNRESET)) ||
		strstr(err->msg, strerror(EPIPE)));
}

/* One attempt: connect, TLS when configured, hello, each stopped by cancel (may be NULL).
 * *connect_errno: the connect's errno (0 when the connection was made and a later step failed). */
static int dial_once(struct sc_peer_pool *pool, struct sc_keyring *ring, struct sc_peer_conn *c,
		     const char *host, uint16_t port, uint64_t deadline_mono_ms,
		     const atomic_bool *cancel, int *connect_errno,
		     struct sc_err *err)
{
	const char *endpoint = c->endpoint;
	*connect_errno = 0;
	atomic_store(&c->broken, false); /* a fresh attempt (after a failed one) */
	c->peer_closed = c->hold_next = c->held = false;
	c->outstanding = 0;
	snprintf(c->what, sizeof(c->what), "peer sidecar at %s", endpoint);
	char port_text[8];
	snprintf(port_text, sizeof(port_text), "%u", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	int gai = getaddrinfo(host, port_text, &hints, &res);
	if (gai != 0)
		return sc_err_set(err, SC_UNAVAILABLE, "cannot reach peer sidecar at %s: %s",
				  endpoint, gai_strerror(gai));
	uint64_t now = sc_clock_mono_ms();
	uint64_t until = now + SC_PEER_CONNECT_TIMEOUT_MS;
	bool deadline_first = deadline_mono_ms && deadline_mono_ms < until;
	if (deadline_first)
		until = deadline_mono_ms;
	int last_errno = ECONNREFUSED;
	for (struct addrinfo *ai = res; ai && c->fd < 0; ai = ai->ai_next) {
		c->fd = connect_addr(ai, until, cancel);
		if (c->fd < 0)
			last_errno = errno;
	}
	freeaddrinfo(res);
	if (c->fd < 0 && last_errno == ECANCELED)
		return sc_err_set(err, SC_CANCELLED, "cancelled while connecting to peer sidecar at %s",
				  endpoint);
	if (c->fd < 0) {
		*connect_errno = last_errno;
		if (last_errno == ETIMEDOUT && deadline_first)
			return sc_err_set(err, SC_DEADLINE_EXCEEDED,
					  "deadline passed while connecting to peer sidecar at %s",
					  endpoint);
		return sc_err_set(err, SC_UNAVAILABLE, "cannot reach peer sidecar at %s: %s",
				  endpoint, strerror(last_errno));
	}

	uint64_t hello_until = sc_clock_mono_ms() + SC_PEER_HELLO_TIMEOUT_MS;
	struct sc_peer_wait w = {.deadline_mono_ms = deadline_mono_ms && deadline_mono_ms <
								 hello_until
							 ? deadline_mono_ms
							 : hello_until,
				 .cancel = cancel};
	int rc = 0;
	if (pool->tls)
		rc = sc_peer_tls_client(pool->tls, c->fd, &w, c->what, err);
	if (rc == 0)
		rc = sc_peer_hello_client(c->fd, ring, pool->self_id, &w, c->what,
					  c->peer_id, err);
	if (rc == 0) /* whom its certificate names (checked against the issuer by the caller) */
		rc = sc_peer_tls_reached(pool->tls, c->fd, c->peer_id, c->what, c->cert_id, err);
	if (rc == 0) {
		/* The peer admits a connection under its caps only after the hello (peer/conns.c),
		 * and a refusal then answers the first request. Ask with a PING now (one round
		 * trip per new connection), so that "busy: retry" is an answer here, retried with
		 * backoff within the caller's deadline, and never fails a transfer. */
		snprintf(c->what, sizeof(c->what), "peer sidecar \"%s\" at %s", c->peer_id, endpoint);
		rc = pool->admit ? pool->admit(c, w.deadline_mono_ms, cancel, err) : 0;
		if (rc != 0 && err && err->code == SC_DEADLINE_EXCEEDED &&
		    w.deadline_mono_ms == hello_until)
			err->code = SC_UNAVAILABLE;
	}
	if (rc != 0) {
		if (err && err->code == SC_INVALID_ARGUMENT) /* garbage: not a sidecar */
			err->code = SC_UNAVAILABLE;
		if (err && err->code == SC_DEADLINE_EXCEEDED && w.deadline_mono_ms == hello_until)
			sc_err_set(err, SC_UNAVAILABLE,
				   "peer sidecar at %s did not finish the %s within %d ms "
				   "(overloaded, or not an rdma-sidecar data port)",
				   endpoint, pool->tls ? "TLS handshake and hello" : "hello",
				   SC_PEER_HELLO_TIMEOUT_MS);
		/* TLS 1.3 lets the client finish its handshake before the server has checked the
		 * client's certificate: a refusal then shows up on the first read. */
		const char *tls_why = sc_peer_tls_last_error(c->fd);
		if (err && tls_why) {
			size_t used = strlen(err->msg);
			if (strstr(tls_why, "certificate expired"))
				snprintf(err->msg + used, sizeof(err->msg) - used,
					 " (TLS: %s: the peer says this sidecar's certificate has "
					 "expired: renew --peer-tls-cert)",
					 tls_why);
			else
				snprintf(err->msg + used, sizeof(err->msg) - used,
					 " (TLS: %s: the peer did not accept this sidecar's "
					 "--peer-tls-cert, or does not use peer TLS)",
					 tls_why);
		}
		sc_peer_tls_close(c->fd);
		c->fd = -1;
		return -1;
	}
	return 0;
}

/* First pause between attempts; doubled after each, up to RETRY_MAX_MS. */
#define RETRY_FIRST_MS 50
#define RETRY_MAX_MS 1000

/* Pause ms between attempts, waking every RETRY_FIRST_MS to look at cancel. False: cancelled. */
static bool retry_pause(unsigned ms, const atomic_bool *cancel)
{
	uint64_t until = sc_clock_mono_ms() + ms;
	for (uint64_t now = sc_clock_mono_ms(); now < until; now = sc_clock_mono_ms()) {
		if (cancel && atomic_load_explicit(cancel, memory_order_relaxed))
			return false;
		uint64_t left = until - now;
		usleep((useconds_t)(left < RETRY_FIRST_MS ? left : RETRY_FIRST_MS) * 1000u);
	}
	return !(cancel && atomic_load_explicit(cancel, memory_order_relaxed));
}

static int dial(struct sc_peer_pool *pool, const char *endpoint, uint64_t deadline_mono_ms,
		const atomic_bool *cancel, struct sc_peer_conn **out, struct sc_err *err)
{
	struct sc_err scratch;
	if (!err)
		err = &scratch;
	char host[256];
	uint16_t port;
	if (strlen(endpoint) >= sizeof((*out)->endpoint) ||
	    sc_parse_hostport(endpoint, host, sizeof(host), &port, err) != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "bad peer data endpoint \"%.100s\": expected host:port",
				  endpoint);
	struct sc_keyring *ring = sc_keyring_source_get(&pool->keys);
	if (!ring)
		return sc_err_set(err, SC_UNAUTHENTICATED,
				  "sidecar \"%s\" has no --key-file, so it cannot authenticate "
				  "to peer sidecar at %s: cross-sidecar transfers need "
				  "--key-file on both sidecars",
				  pool->self_id, endpoint);
	struct sc_peer_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		sc_keyring_release(ring);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	c->fd = -1;
	sc_list_init(&c->idle_node);
	sc_list_init(&c->bucket_node);
	atomic_init(&c->broken, false);
	snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);

	/* A refused or reset connection is tried again, with backoff, until the caller's deadline
	 * (or SC_PEER_CONNECT_TIMEOUT_MS when it has none): a peer whose data port is flooded or
	 * restarting is reached as soon as it has room. */
	uint64_t give_up = deadline_mono_ms ? deadline_mono_ms
					    : sc_clock_mono_ms() + SC_PEER_CONNECT_TIMEOUT_MS;
	unsigned pause_ms = RETRY_FIRST_MS, attempts = 0;
	for (;;) {
		int connect_errno;
		attempts++;
		if (dial_once(pool, ring, c, host, port, deadline_mono_ms, cancel, &connect_errno,
			      err) == 0)
			break;
		uint64_t now = sc_clock_mono_ms();
		if (!retryable(err, connect_errno) || now + pause_ms >= give_up)
			goto fail;
		SC_DEBUG("peer", "attempt %u to reach %s failed (%s); retrying in %u ms", attempts,
			 endpoint, err->msg, pause_ms);
		if (!retry_pause(pause_ms, cancel)) {
			sc_err_set(err, SC_CANCELLED, "cancelled while retrying to reach %s",
				   endpoint);
			goto fail;
		}
		pause_ms = pause_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : pause_ms * 2;
	}
	sc_keyring_release(ring);
	snprintf(c->what, sizeof(c->what), "peer sidecar \"%s\" at %s", c->peer_id, endpoint);
	struct sc_log_fields lf = {.peer = c->peer_id, .rail = endpoint};
	if (attempts > 1)
		SC_INFO_KV("peer", &lf, "connected to %s after %u attempts", c->what, attempts);
	else
		SC_DEBUG_KV("peer", &lf, "connected to %s", c->what);
	*out = c;
	return 0;
fail:
	if (attempts > 1)
		sc_err_prefix(err, "after %u attempts", attempts);
	sc_keyring_release(ring);
	conn_close(c);
	return -1;
}

/* Is an idle connection still open (no EOF, no unexpected bytes)? */
static bool idle_alive(const struct sc_peer_conn *c)
{
	uint8_t b;
	ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

int sc_peer_pool_get(struct sc_peer_pool *pool, const char *endpoint, uint64_t deadline_mono_ms,
		     struct sc_peer_conn **out, struct sc_err *err)
{
	return sc_peer_pool_get_cancellable(pool, endpoint, deadline_mono_ms, NULL, out, err);
}

int sc_peer_pool_get_cancellable(struct sc_peer_pool *pool, const char *endpoint,
				 uint64_t deadline_mono_ms, const atomic_bool *cancel,
				 struct sc_peer_conn **out, struct sc_err *err)
{
	uint64_t now = sc_clock_mono_ms();
	struct sc_peer_conn *found = NULL;
	struct sc_list stale = SC_LIST_INIT(stale), *pos, *tmp;
	pthread_mutex_lock(&pool->mu);
	struct bucket *b = bucket_find_locked(pool, endpoint);
	while (b && b->n && !found) {
		struct sc_peer_conn *c =
		    sc_list_entry(sc_list_first(&b->idle), struct sc_peer_conn, bucket_node);
		idle_unlink_locked(c);
		if (now >= c->idle_since_ms + pool->idle_ms || !idle_alive(c)) {
			sc_list_insert_tail(&stale, &c->idle_node);
		} else {
			c->reused = true;
			found = c;
		}
	}
	pthread_mutex_unlock(&pool->mu);
	sc_list_foreach_safe(pos, tmp, &stale) {
		sc_list_remove(pos);
		conn_close(sc_list_entry(pos, struct sc_peer_conn, idle_node));
	}
	if (found) {
		*out = found;
		return 0;
	}
	if (deadline_mono_ms && now >= deadline_mono_ms)
		return sc_err_set(err, SC_DEADLINE_EXCEEDED,
				  "deadline passed before connecting to peer sidecar at %s",
				  endpoint);
	return dial(pool, endpoint, deadline_mono_ms, cancel, out, err);
}

bool sc_peer_pool_has_idle(struct sc_peer_pool *pool, const char *endpoint)
{
	pthread_mutex_lock(&pool->mu);
	struct bucket *b = bucket_find_locked(pool, endpoint);
	bool idle = b && b->n > 0;
	pthread_mutex_unlock(&pool->mu);
	return idle;
}

void sc_peer_pool_put(struct sc_peer_pool *pool, struct sc_peer_conn *conn, bool reusable)
{
	if (!conn)
		return;
	/* A reply still due would answer the next caller's request: such a stream is not reused. */
	if (!reusable || atomic_load(&conn->broken) || conn->outstanding) {
		conn_close(conn);
		return;
	}
	if (conn->held) /* its next user would wait for a reply to a request still held back */
		sc_peer_conn_flush(conn);
	conn->hold_next = false;
	conn->stall_ms = 0;
	conn->idle_since_ms = sc_clock_mono_ms();
	pthread_mutex_lock(&pool->mu);
	struct bucket *b = bucket_find_locked(pool, conn->endpoint);
	if (!b) {
		uint64_t k = endpoint_key(conn->endpoint);
		/* A key taken by another endpoint (a hash collision): that one keeps it. */
		b = sc_idmap_get(pool->buckets, &k, sizeof(k)) ? NULL : calloc(1, sizeof(*b));
		if (b) {
			snprintf(b->endpoint, sizeof(b->endpoint), "%s", conn->endpoint);
			sc_list_init(&b->idle);
			if (sc_idmap_put(pool->buckets, &k, sizeof(k), b) != 0) {
				free(b);
				b = NULL;
			}
		}
	}
	if (b && b->n < SC_PEER_POOL_IDLE_PER_ENDPOINT) {
		sc_list_insert_head(&pool->idle, &conn->idle_node);
		sc_list_insert_head(&b->idle, &conn->bucket_node);
		conn->bucket = b;
		b->n++;
		conn = NULL;
	}
	pthread_mutex_unlock(&pool->mu);
	conn_close(conn);
}

/* ---- the reaper ------------------------------------------------------------------------------ */

/* Every REAP_MS: close the idle connections past SC_PEER_POOL_IDLE_MS (the oldest are at the
 * tail) and those the peer has closed or written to. Its own thread. */
static void *reaper_main(void *arg)
{
	struct sc_peer_pool *pool = arg;
	pthread_mutex_lock(&pool->mu);
	while (!pool->stop) {
		sc_cond_wait_ms(&pool->cv, &pool->mu, REAP_MS);
		if (pool->stop)
			break;
		uint64_t now = sc_clock_mono_ms();
		struct sc_list stale = SC_LIST_INIT(stale), *pos, *tmp;
		sc_list_foreach_safe(pos, tmp, &pool->idle) {
			struct sc_peer_conn *c = sc_list_entry(pos, struct sc_peer_conn, idle_node);
			if (now >= c->idle_since_ms + pool->idle_ms || !idle_alive(c)) {
				idle_unlink_locked(c);
				sc_list_insert_tail(&stale, &c->idle_node);
			}
		}
		pthread_mutex_unlock(&pool->mu);
		sc_list_foreach_safe(pos, tmp, &stale) {
			sc_list_remove(pos);
			conn_close(sc_list_entry(pos, struct sc_peer_conn, idle_node));
		}
		pthread_mutex_lock(&pool->mu);
	}
	pthread_mutex_unlock(&pool->mu);
	return NULL;
}

int sc_peer_conn_fd(const struct sc_peer_conn *conn)
{
	return conn->fd;
}

int sc_peer_conn_check_issuer(const struct sc_peer_conn *conn, const char *issuer,
			      struct sc_err *err)
{
	if (conn->cert_id[0] && strcmp(conn->cert_id, issuer) != 0)
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "sidecar at %s presents the certificate of \"%s\", not the "
				  "metadata's issuer \"%s\"",
				  conn->endpoint, conn->cert_id, issuer);
	return 0;
}

const char *sc_peer_conn_peer_id(const struct sc_peer_conn *conn)
{
	if (conn->cert_id[0])
		return conn->cert_id;
	return conn->peer_id;
}

const char *sc_peer_conn_endpoint(const struct sc_peer_conn *conn)
{
	return conn->endpoint;
}

bool sc_peer_conn_usable(const struct sc_peer_conn *conn)
{
	return !atomic_load(&conn->broken);
}

bool sc_peer_conn_reused(const struct sc_peer_conn *conn)
{
	return conn->reused;
}

void sc_peer_conn_abort(struct sc_peer_conn *conn)
{
	atomic_store(&conn->broken, true);
	shutdown(conn->fd, SHUT_RDWR);
}

void sc_peer_conn_hold_next(struct sc_peer_conn *conn)
{
	conn->hold_next = true;
}

bool sc_peer_conn_peer_closed(const struct sc_peer_conn *conn)
{
	return conn->peer_closed;
}

void sc_peer_conn_set_stall(struct sc_peer_conn *conn, uint32_t ms)
{
	conn->stall_ms = ms;
}

void sc_peer_conn_flush(struct sc_peer_conn *conn)
{
	int one = 1; /* setting TCP_NODELAY pushes what MSG_MORE held back */
	if (!conn)
		return;
	conn->held = false;
	if (setsockopt(conn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
		atomic_store(&conn->broken, true);
}

struct sc_peer_conn *sc_peer_pool_get_issuer(struct sc_peer_pool *pool,
					     const struct sc_metadata *md,
					     uint64_t deadline_mono_ms, const atomic_bool *cancel,
					     int *endpoint, struct sc_err *err)
{
	if (md->n_endpoints == 0) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "the metadata from sidecar %s names no control endpoint", md->issuer);
		return NULL;
	}
	for (size_t i = 0; i < md->n_endpoints; i++) {
		struct sc_peer_conn *c;
		if (sc_peer_pool_get_cancellable(pool, md->endpoints[i], deadline_mono_ms, cancel,
						 &c, err) != 0) {
			if (err->code == SC_DEADLINE_EXCEEDED || err->code == SC_CANCELLED)
				break;
			continue;
		}
		if (sc_peer_conn_check_issuer(c, md->issuer, err) != 0) {
			sc_peer_pool_put(pool, c, false); /* an impostor: no rendezvous */
			break;
		}
		if (strcmp(sc_peer_conn_peer_id(c), md->issuer) != 0) {
			sc_err_set(
			    err, SC_UNAVAILABLE,
			    "control endpoint %s is sidecar \"%s\", but the metadata was issued "
			    "by \"%s\" (stale metadata, or a wrong --advertise)",
			    md->endpoints[i], sc_peer_conn_peer_id(c), md->issuer);
			sc_peer_pool_put(pool, c, true);
			continue;
		}
		*endpoint = (int)i;
		return c;
	}
	return NULL;
}
