/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer_pool.c: the dialing side of the peer control channel. Dials peer sidecars (non-blocking
 * connect with a timeout, then the hello), keeps authenticated idle connections per endpoint for
 * reuse, and runs the client calls (OPEN, READ, WRITE, DONE, PING, generic) on one connection.
 * READ receives straight into the caller's memory and WRITE sends straight from it.
 *
 * Threads: any. The pool's idle list is guarded by pool->mu (never held during I/O, except the
 * cheap liveness peek of an idle connection that is not yet handed out). A connection belongs to
 * the thread that got it until it is put back; sc_peer_conn_abort may come from another thread.
 * The pool owns its idle connections; a connection handed out is owned by its caller.
 */
#include "peer_pool.h"
#include "peer_stage.h"

#include "log.h"
#include "peer_proto.h"
#include "peer_tls.h"
#include "timer.h"

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

struct sc_peer_conn {
	int fd;
	char endpoint[80];
	char peer_id[SC_NAME_MAX];
	char what[SC_NAME_MAX + 120]; /* "peer sidecar \"id\" at H:P", for messages */
	atomic_bool broken;
	bool reused; /* handed out from the idle list (not freshly dialled) */
	unsigned outstanding; /* requests sent whose reply has not been received */
	bool hold_next; /* sc_peer_conn_hold_next: the next request is sent with MSG_MORE */
	bool held;      /* the last request went out with MSG_MORE: part of it may wait in the kernel */
	uint64_t idle_since_ms;
	struct sc_peer_conn *next; /* idle list */
	uint8_t buf[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
};

struct sc_peer_pool {
	char self_id[SC_NAME_MAX];
	struct sc_keyring_source keys; /* for each hello */
	struct sc_peer_tls *tls; /* NULL: plain TCP */
	pthread_mutex_t mu;
	struct sc_peer_conn *idle; /* most recently used first */
};

static void conn_close(struct sc_peer_conn *c)
{
	if (!c)
		return;
	sc_peer_tls_close(c->fd); /* the TLS state behind the fd, then the fd */
	free(c);
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
	pthread_mutex_init(&pool->mu, NULL);
	*out = pool;
	return 0;
}

void sc_peer_pool_destroy(struct sc_peer_pool *pool)
{
	if (!pool)
		return;
	while (pool->idle) {
		struct sc_peer_conn *c = pool->idle;
		pool->idle = c->next;
		conn_close(c);
	}
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
 * peer_server.c). A refusal the peer explained (ERROR frame), a certificate or a key that does
 * not verify, and garbage are final.
 */
static bool retryable(const struct sc_err *err, int connect_errno)
{
	if (connect_errno)
		return connect_errno == ECONNREFUSED || connect_errno == ECONNRESET ||
		       connect_errno == EAGAIN;
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
			snprintf(err->msg + used, sizeof(err->msg) - used,
				 " (TLS: %s: the peer did not accept this sidecar's --peer-tls-cert,"
				 " or does not use peer TLS)",
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
	if (attempts > 1)
		SC_INFO("peer", "connected to %s after %u attempts", c->what, attempts);
	else
		SC_DEBUG("peer", "connected to %s", c->what);
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
	struct sc_peer_conn *found = NULL, *stale = NULL;
	pthread_mutex_lock(&pool->mu);
	for (struct sc_peer_conn **pp = &pool->idle; *pp;) {
		struct sc_peer_conn *c = *pp;
		bool expired = now >= c->idle_since_ms + SC_PEER_POOL_IDLE_MS;
		bool mine = !found && !expired && strcmp(c->endpoint, endpoint) == 0;
		if (expired || (mine && !idle_alive(c))) {
			*pp = c->next;
			c->next = stale;
			stale = c;
		} else if (mine) {
			*pp = c->next;
			c->next = NULL;
			c->reused = true;
			found = c;
		} else {
			pp = &c->next;
		}
	}
	pthread_mutex_unlock(&pool->mu);
	while (stale) {
		struct sc_peer_conn *c = stale;
		stale = c->next;
		conn_close(c);
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
	conn->idle_since_ms = sc_clock_mono_ms();
	size_t same = 0;
	pthread_mutex_lock(&pool->mu);
	for (struct sc_peer_conn *c = pool->idle; c; c = c->next)
		same += strcmp(c->endpoint, conn->endpoint) == 0;
	if (same < SC_PEER_POOL_IDLE_PER_ENDPOINT) {
		conn->next = pool->idle;
		pool->idle = conn;
		conn = NULL;
	}
	pthread_mutex_unlock(&pool->mu);
	conn_close(conn);
}

int sc_peer_conn_fd(const struct sc_peer_conn *conn)
{
	return conn->fd;
}

const char *sc_peer_conn_peer_id(const struct sc_peer_conn *conn)
{
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

/* ---- calls ----------------------------------------------------------------------------------- */

/* A failed send or receive: the stream's state is unknown from here on. */
static int io_fail(struct sc_peer_conn *c, enum sc_peer_io rc, struct sc_err *err)
{
	atomic_store(&c->broken, true);
	if (rc == SC_PEER_IO_EOF)
		return sc_err_set(err, SC_UNAVAILABLE, "%s closed the connection mid-transfer",
				  c->what);
	if (rc == SC_PEER_IO_PROTOCOL && err) {
		sc_err_prefix(err, "%s sent garbage", c->what);
		err->code = SC_INTERNAL;
	}
	return -1; /* err already says why */
}

static int send_request(struct sc_peer_conn *c, const struct sc_peer_msg *m, const void *bulk,
			uint64_t bulk_len, const struct sc_peer_wait *w, struct sc_err *err)
{
	uint8_t hdr[128 + SC_ERR_MSG_MAX]; /* a DONE carries a message of up to SC_ERR_MSG_MAX */
	size_t n = sc_peer_encode(m, hdr, sizeof(hdr));
	if (n == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s request does not encode",
				  sc_frame_type_name(m->type));
	struct iovec iov[2] = {{.iov_base = hdr, .iov_len = n},
			       {.iov_base = (void *)bulk, .iov_len = (size_t)bulk_len}};
	struct sc_peer_wait held = *w;
	held.more = w->more || c->hold_next;
	c->hold_next = false;
	c->held = held.more;
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, bulk_len ? 2 : 1, &held, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, c->what, err);
		return io_fail(c, rc, err);
	}
	c->outstanding++;
	return 0;
}

/* Receive the reply to a request: `want`, or ERROR (the peer's refusal, mapped to its code). */
static int recv_reply(struct sc_peer_conn *c, enum sc_frame_type want, struct sc_peer_msg *m,
		      const struct sc_peer_wait *w, struct sc_err *err)
{
	if (c->outstanding == 0) {
		atomic_store(&c->broken, true);
		return sc_err_set(err, SC_INTERNAL, "waiting for a %s reply with no request sent",
				  sc_frame_type_name(want));
	}
	c->outstanding--;
	enum sc_peer_io rc = sc_peer_recv_msg(c->fd, c->buf, sizeof(c->buf), m, w, c->what, err);
	if (rc != SC_PEER_IO_OK)
		return io_fail(c, rc, err);
	if (m->type == SC_FRAME_ERROR) {
		/* With another request still in flight the stream cannot be reused: its reply would
		 * answer the next caller. */
		if (c->outstanding)
			atomic_store(&c->broken, true);
		enum sc_status code = sc_peer_status_from_wire(m->code);
		return sc_err_set(err, code == SC_OK ? SC_INTERNAL : code, "peer %s: %s",
				  c->peer_id, m->text);
	}
	if (m->type != want) {
		atomic_store(&c->broken, true);
		return sc_err_set(err, SC_INTERNAL, "%s sent %s where %s was expected", c->what,
				  sc_frame_type_name(m->type), sc_frame_type_name(want));
	}
	return 0;
}

static void fill_ref(struct sc_peer_msg *m, enum sc_frame_type type,
		     const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	memcpy(m->token, token, SC_TOKEN_LEN);
	m->xfer_id = xfer_id;
}

static struct sc_peer_wait client_wait(uint64_t deadline_mono_ms, const atomic_bool *cancel)
{
	return (struct sc_peer_wait){.deadline_mono_ms = deadline_mono_ms, .cancel = cancel};
}

static int open_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		     uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total, uint16_t flags,
		     uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	fill_ref(&m, SC_FRAME_OPEN, token, xfer_id);
	m.flags = flags;
	m.peer_kind = (uint8_t)peer_kind;
	m.total = total;
	return send_request(conn, &m, NULL, 0, &w, err);
}

int sc_peer_open_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total, uint16_t flags,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	sc_peer_conn_hold_next(conn);
	return open_send(conn, token, xfer_id, peer_kind, total, flags, deadline_mono_ms, cancel,
			 err);
}

void sc_peer_conn_hold_next(struct sc_peer_conn *conn)
{
	conn->hold_next = true;
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

int sc_peer_open_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, bool *refused, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	m.type = SC_FRAME_OK;
	int rc = recv_reply(conn, SC_FRAME_OK, &m, &w, err);
	if (refused)
		*refused = rc != 0 && m.type == SC_FRAME_ERROR;
	return rc;
}

int sc_peer_open_flags(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total, uint16_t flags,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	if (open_send(conn, token, xfer_id, peer_kind, total, flags, deadline_mono_ms, cancel,
		      err) != 0)
		return -1;
	return sc_peer_open_recv(conn, deadline_mono_ms, cancel, NULL, err);
}

int sc_peer_open(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_op_kind peer_kind, uint64_t total, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	return sc_peer_open_flags(conn, token, xfer_id, peer_kind, total, 0, deadline_mono_ms,
				  cancel, err);
}

static int bulk_request(struct sc_peer_conn *conn, enum sc_frame_type type,
			const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id, uint32_t desc,
			uint64_t offset, uint64_t len, const uint8_t *src,
			const struct sc_peer_wait *w, struct sc_err *err)
{
	if (len == 0 || len > SC_PEER_MAX_BULK)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s of %" PRIu64 " bytes: must be 1 byte .. 1 GiB",
				  sc_frame_type_name(type), len);
	struct sc_peer_msg m;
	fill_ref(&m, type, token, xfer_id);
	m.desc = desc;
	m.offset = offset;
	m.len = len;
	return send_request(conn, &m, src, src ? len : 0, w, err);
}

int sc_peer_read_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	return bulk_request(conn, SC_FRAME_READ, token, xfer_id, desc, offset, len, NULL, &w, err);
}

/* The DATA header answering a READ of len bytes; the bytes follow on the connection. */
static int recv_data_header(struct sc_peer_conn *conn, uint64_t len, const struct sc_peer_wait *w,
			    struct sc_err *err)
{
	struct sc_peer_msg m;
	if (recv_reply(conn, SC_FRAME_DATA, &m, w, err) != 0)
		return -1;
	if (m.len != len) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_INTERNAL,
				  "%s sent %" PRIu64 " bytes for a READ of %" PRIu64, conn->what,
				  m.len, len);
	}
	return 0;
}

int sc_peer_read_recv(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (recv_data_header(conn, len, &w, err) != 0)
		return -1;
	int e;
	enum sc_peer_io rc = sc_peer_recv_all(conn->fd, dst, (size_t)len, &w, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, conn->what, err);
		return io_fail(conn, rc, err);
	}
	return 0;
}

/* A refused WRITE: the server answered ERROR and closed before reading our bytes. Its reason
 * (after the replies to earlier requests) is more useful than our broken pipe. */
static void refused_write_reason(struct sc_peer_conn *conn, const atomic_bool *cancel,
				 struct sc_err *err)
{
	if (sc_peer_conn_usable(conn))
		return;
	struct sc_peer_wait quick = client_wait(sc_clock_mono_ms() + 200, cancel);
	for (unsigned i = 0; i <= conn->outstanding; i++) {
		struct sc_peer_msg r;
		struct sc_err why;
		if (sc_peer_recv_msg(conn->fd, conn->buf, sizeof(conn->buf), &r, &quick,
				     conn->what, &why) != SC_PEER_IO_OK)
			break;
		if (r.type == SC_FRAME_ERROR) {
			enum sc_status code = sc_peer_status_from_wire(r.code);
			sc_err_set(err, code == SC_OK ? SC_INTERNAL : code, "peer %s: %s",
				   conn->peer_id, r.text);
			break;
		}
	}
}

int sc_peer_read_recv_gpu(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
			  struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			  const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (recv_data_header(conn, len, &w, err) != 0)
		return -1;
	enum sc_peer_io io;
	if (sc_peer_recv_gpu(g, dev, conn->fd, dst, len, &w, conn->what, &io, err) != 0) {
		atomic_store(&conn->broken, true); /* the rest of the DATA is still on the wire */
		return -1;
	}
	return 0;
}

int sc_peer_write_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			   uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
			   const uint8_t *src, struct sc_gpu *g, int dev,
			   uint64_t deadline_mono_ms, const atomic_bool *cancel,
			   struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	/* The WRITE header promises len bytes; they follow, staged. */
	if (bulk_request(conn, SC_FRAME_WRITE, token, xfer_id, desc, offset, len, NULL, &w, err) !=
	    0)
		return -1;
	enum sc_peer_io io;
	if (sc_peer_send_gpu(g, dev, conn->fd, src, len, &w, conn->what, &io, err) != 0) {
		atomic_store(&conn->broken, true);
		if (io != SC_PEER_IO_OK)
			refused_write_reason(conn, cancel, err);
		return -1;
	}
	return 0;
}

int sc_peer_read_into(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	if (sc_peer_read_send(conn, token, xfer_id, desc, offset, len, deadline_mono_ms, cancel,
			      err) != 0)
		return -1;
	return sc_peer_read_recv(conn, len, dst, deadline_mono_ms, cancel, err);
}

/* READV / WRITEV: the frame (header and piece list, up to ~20 KiB) and, for WRITEV, the pieces'
 * bytes gathered straight from local memory in the same sendmsg calls. */
static int send_pieces(struct sc_peer_conn *c, enum sc_frame_type type,
		       const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		       const struct sc_peer_piece *pieces, uint32_t n, const struct iovec *src,
		       const struct sc_peer_wait *w, struct sc_err *err)
{
	if (n == 0 || n > SC_PEER_MAX_PIECES)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s of %u pieces: 1..%d",
				  sc_frame_type_name(type), n, SC_PEER_MAX_PIECES);
	struct sc_peer_msg m;
	fill_ref(&m, type, token, xfer_id);
	m.piece_list = pieces;
	m.n_pieces = n;
	size_t cap = SC_PEER_HDR_LEN + 32 + (size_t)n * SC_PEER_PIECE_WIRE;
	uint8_t *frame = malloc(cap);
	struct iovec *iov = malloc(sizeof(*iov) * (src ? n + 1 : 1));
	if (!frame || !iov) {
		free(frame);
		free(iov);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	size_t len = sc_peer_encode(&m, frame, cap);
	if (len == 0) {
		free(frame);
		free(iov);
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s request does not encode",
				  sc_frame_type_name(type));
	}
	iov[0] = (struct iovec){.iov_base = frame, .iov_len = len};
	if (src)
		memcpy(&iov[1], src, sizeof(*iov) * n);
	struct sc_peer_wait held = *w;
	held.more = w->more || c->hold_next;
	c->hold_next = false;
	c->held = held.more;
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, src ? (int)n + 1 : 1, &held, NULL, &e);
	free(frame);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, c->what, err);
		return io_fail(c, rc, err);
	}
	c->outstanding++;
	return 0;
}

int sc_peer_readv_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	return send_pieces(conn, SC_FRAME_READV, token, xfer_id, pieces, n, NULL, &w, err);
}

int sc_peer_readv_recv(struct sc_peer_conn *conn, uint64_t total, struct iovec *iov, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (recv_data_header(conn, total, &w, err) != 0)
		return -1;
	int e;
	enum sc_peer_io rc = sc_peer_recvv_all(conn->fd, iov, (int)n, &w, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, conn->what, err);
		return io_fail(conn, rc, err);
	}
	return 0;
}

int sc_peer_writev_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			const struct iovec *iov, uint64_t deadline_mono_ms,
			const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (send_pieces(conn, SC_FRAME_WRITEV, token, xfer_id, pieces, n, iov, &w, err) == 0)
		return 0;
	refused_write_reason(conn, cancel, err);
	return -1;
}

/* iov (GPU memory of dev) as stager pieces; NULL when out of memory. */
static struct sc_stage_piece *gpu_pieces(const struct iovec *iov, uint32_t n, int dev)
{
	struct sc_stage_piece *p = malloc((n ? n : 1) * sizeof(*p));
	for (uint32_t i = 0; p && i < n; i++)
		p[i] = (struct sc_stage_piece){
		    .addr = iov[i].iov_base, .len = iov[i].iov_len, .gpu = dev};
	return p;
}

int sc_peer_readv_recv_gpu(struct sc_peer_conn *conn, uint64_t total, const struct iovec *iov,
			   uint32_t n, struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			   const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (recv_data_header(conn, total, &w, err) != 0)
		return -1;
	struct sc_stage_piece *p = gpu_pieces(iov, n, dev);
	if (!p) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	enum sc_peer_io io;
	int rc = sc_peer_recv_pieces_gpu(g, dev, conn->fd, p, n, &w, conn->what, &io, err);
	free(p);
	if (rc != 0)
		atomic_store(&conn->broken, true); /* the rest of the DATA is still on the wire */
	return rc;
}

int sc_peer_writev_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			    uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			    const struct iovec *iov, struct sc_gpu *g, int dev,
			    uint64_t deadline_mono_ms, const atomic_bool *cancel,
			    struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_stage_piece *p = gpu_pieces(iov, n, dev);
	if (!p)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	/* The WRITEV frame promises the pieces' bytes; they follow, staged. */
	int rc = send_pieces(conn, SC_FRAME_WRITEV, token, xfer_id, pieces, n, NULL, &w, err);
	enum sc_peer_io io = SC_PEER_IO_OK;
	if (rc == 0 &&
	    (rc = sc_peer_send_pieces_gpu(g, dev, conn->fd, p, n, &w, conn->what, &io, err)) != 0) {
		atomic_store(&conn->broken, true);
		if (io != SC_PEER_IO_OK)
			refused_write_reason(conn, cancel, err);
	} else if (rc != 0) {
		refused_write_reason(conn, cancel, err);
	}
	free(p);
	return rc;
}

int sc_peer_write_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	if (bulk_request(conn, SC_FRAME_WRITE, token, xfer_id, desc, offset, len, src, &w, err) ==
	    0)
		return 0;
	refused_write_reason(conn, cancel, err);
	return -1;
}

int sc_peer_write_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		       const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	int rc = recv_reply(conn, SC_FRAME_OK, &m, &w, err);
	if (rc != 0)
		atomic_store(&conn->broken, true); /* the server closes after a refused WRITE */
	return rc;
}

int sc_peer_write_from(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err)
{
	if (sc_peer_write_send(conn, token, xfer_id, desc, offset, len, src, deadline_mono_ms,
			       cancel, err) != 0)
		return -1;
	return sc_peer_write_recv(conn, deadline_mono_ms, cancel, err);
}

int sc_peer_done_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_status status, const char *msg,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	fill_ref(&m, SC_FRAME_DONE, token, xfer_id);
	m.code = (uint32_t)status;
	snprintf(m.text, sizeof(m.text), "%s", msg ? msg : "");
	return send_request(conn, &m, NULL, 0, &w, err);
}

int sc_peer_done_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	return recv_reply(conn, SC_FRAME_OK, &m, &w, err);
}

int sc_peer_done(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_status status, const char *msg, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	if (sc_peer_done_send(conn, token, xfer_id, status, msg, deadline_mono_ms, cancel, err) != 0)
		return -1;
	return sc_peer_done_recv(conn, deadline_mono_ms, cancel, err);
}

int sc_peer_ping(struct sc_peer_conn *conn, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		 struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	uint64_t cookie = sc_clock_mono_ms() ^ (uint64_t)(uintptr_t)conn;
	struct sc_peer_msg m = {.type = SC_FRAME_PING, .cookie = cookie};
	if (send_request(conn, &m, NULL, 0, &w, err) != 0)
		return -1;
	if (recv_reply(conn, SC_FRAME_PONG, &m, &w, err) != 0)
		return -1;
	if (m.cookie != cookie) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_INTERNAL, "%s answered PING with a wrong cookie",
				  conn->what);
	}
	return 0;
}

int sc_peer_call(struct sc_peer_conn *conn, unsigned type, const void *body, size_t len,
		 uint8_t *reply, size_t reply_cap, size_t *reply_len, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	if (type != SC_FRAME_QP_CONNECT)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "sc_peer_call: %s is not a generic call",
				  sc_frame_type_name(type));
	struct sc_peer_wait w = client_wait(deadline_mono_ms, cancel);
	struct sc_peer_msg m = {
		.type = (enum sc_frame_type)type, .opaque = body, .opaque_len = len};
	enum sc_peer_io rc = sc_peer_send_msg(conn->fd, &m, &w, conn->what, err);
	if (rc != SC_PEER_IO_OK)
		return rc == SC_PEER_IO_PROTOCOL ? -1 : io_fail(conn, rc, err);
	conn->outstanding++;
	if (recv_reply(conn, (enum sc_frame_type)type, &m, &w, err) != 0)
		return -1;
	if (m.opaque_len > reply_cap)
		return sc_err_set(err, SC_INTERNAL,
				  "%s sent a %s reply of %zu bytes (room for %zu)", conn->what,
				  sc_frame_type_name(type), m.opaque_len, reply_cap);
	memcpy(reply, m.opaque, m.opaque_len);
	*reply_len = m.opaque_len;
	return 0;
}

#define VERDICT_FAIL_WAIT_MS 1000
#define VERDICT_OK_WAIT_MS 30000

uint64_t sc_peer_verdict_ok_deadline(uint64_t xfer_deadline_mono_ms)
{
	uint64_t deadline = sc_clock_mono_ms() + VERDICT_OK_WAIT_MS;
	return xfer_deadline_mono_ms && xfer_deadline_mono_ms < deadline ? xfer_deadline_mono_ms
									  : deadline;
}

void sc_peer_tell_verdict(struct sc_peer_pool *pool, struct sc_peer_conn **conn,
			  const char *endpoint, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			  uint64_t xfer_deadline_mono_ms, enum sc_status *status, char *msg,
			  size_t msg_cap, const char *area)
{
	bool ok = *status == SC_OK;
	uint64_t deadline = ok ? sc_peer_verdict_ok_deadline(xfer_deadline_mono_ms)
			       : sc_clock_mono_ms() + VERDICT_FAIL_WAIT_MS;
	struct sc_err err;
	sc_err_clear(&err);
	if (!*conn || !sc_peer_conn_usable(*conn)) {
		/* Its stream failed or was aborted: tell the verdict on a fresh one. */
		sc_peer_pool_put(pool, *conn, false);
		*conn = NULL;
		sc_peer_pool_get(pool, endpoint, deadline, conn, &err);
	}
	int rc = *conn ? sc_peer_done(*conn, token, xfer_id, *status, msg, deadline, NULL, &err)
		       : -1;
	if (rc != 0 && ok) {
		*status = err.code == SC_OK ? SC_UNAVAILABLE : err.code;
		snprintf(msg, msg_cap, "all bytes moved but the peer did not confirm completion: %.440s",
			 err.msg);
	} else if (rc != 0) {
		SC_DEBUG(area, "transfer %016" PRIx64 ": could not tell the peer (%s): %s", xfer_id,
			 sc_status_name(*status), err.msg);
	}
}
