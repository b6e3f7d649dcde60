/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/server.c: the data listeners (--data-listen: one per data endpoint, each a TCP rail, all
 * serving the same hello and the same passive operations) and the peer connections they accept,
 * the server's life and its public calls. Each connection accepted waits parked (peer/conns.c)
 * until a pool thread serves its hello and then its requests (peer/serve.c): OPEN / READ / WRITE /
 * DONE / PING through the passive-operation interface it was handed (backend/passive.h), and
 * QP_CONNECT through the handler the ibverbs backend registers. It also offers that interface on,
 * with the claim of a transfer OPENed "via backend" added (sc_peer_server_passive), for the
 * ibverbs completion notices.
 *
 * Threads: the accept thread (accepts on every listener within the room before the hello,
 * peer/prehello.c; closes connections idle too long or still without their hello; frees finished
 * ones; reports orphaned transfers); the engine's threads for the public calls. Owns the server:
 * the listening sockets, the epoll set, a wake-up eventfd, and (peer/internal.h) all the rest.
 */
#include "peer/internal.h"

#include "base/log.h"
#include "base/timer.h"
#include "net/ifaddr.h"
#include "net/listen.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* How often the accept thread looks for connections idle too long or without their hello. */
#define SWEEP_MS 250
/* How often it re-reads the address of --advertise if:NAME interfaces (tests may shorten it with
 * SC_TEST_IF_CHECK_MS). */
#define IF_CHECK_MS 1000

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
	bool room = ps_prehello_make_room_locked(srv, net, addr, now, &reserved);
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
		ps_prehello_leave_locked(srv, c);
		srv->n_live--;
		srv->n_unauth--;
		pthread_mutex_unlock(&srv->mu);
		log_refusal("peer-refused-resources", addr, strerror(e));
		close(fd);
		free(c);
	}
}

/* Publishes text as endpoint i's current value (the old one stays allocated until destroy). */
static int set_endpoint(struct sc_peer_server *srv, size_t i, const char *text)
{
	struct ps_endpoint *e = calloc(1, sizeof(*e));
	if (!e)
		return -1;
	snprintf(e->text, sizeof(e->text), "%s", text);
	pthread_mutex_lock(&srv->mu);
	e->next = srv->endpoints;
	srv->endpoints = e;
	pthread_mutex_unlock(&srv->mu);
	atomic_store(&srv->endpoint[i], e);
	return 0;
}

static bool join_hostport(char *out, size_t cap, const char *host, unsigned port);

/* --advertise if:NAME: the interface's address now; a change is published (new metadata carries
 * it; operations exposed before keep the address they were issued with), a lost interface or
 * address keeps the last one and is said once. Accept thread. */
static void follow_interfaces(struct sc_peer_server *srv)
{
	for (size_t i = 0; i < srv->n_listen; i++) {
		if (!srv->adv_if[i][0])
			continue;
		char host[64], text[80];
		struct sc_err err;
		sc_err_clear(&err);
		if (sc_ifaddr_lookup(srv->adv_if[i], host, sizeof(host), &err) != 0) {
			if (!srv->if_missing[i])
				SC_WARN("peer", "%s; peers are still told %s", err.msg,
					atomic_load(&srv->endpoint[i])->text);
			srv->if_missing[i] = true;
			continue;
		}
		srv->if_missing[i] = false;
		if (!join_hostport(text, sizeof(text), host, srv->bound_port[i]))
			continue;
		const char *old = atomic_load(&srv->endpoint[i])->text;
		if (strcmp(old, text) == 0)
			continue;
		SC_INFO("peer",
			"--advertise if:%s: the address changed, peers are now told %s (was %s)",
			srv->adv_if[i], text, old);
		if (set_endpoint(srv, i, text) != 0)
			SC_WARN("peer", "out of memory following if:%s", srv->adv_if[i]);
	}
}

static void *accept_main(void *arg)
{
	struct sc_peer_server *srv = arg;
	while (!atomic_load(&srv->stopping)) {
		uint64_t next_due = ps_expire_orphans(srv, false);
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
		ps_reap(srv);
		if (atomic_load(&srv->stopping))
			break;
		uint64_t now = sc_clock_mono_ms();
		if (now - srv->last_sweep_mono_ms >= SWEEP_MS) {
			srv->last_sweep_mono_ms = now;
			ps_sweep(srv);
		}
		if (now - srv->last_if_check_mono_ms >=
		    sc_test_env_ms("SC_TEST_IF_CHECK_MS", IF_CHECK_MS)) {
			srv->last_if_check_mono_ms = now;
			follow_interfaces(srv);
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
	char if_host[64];
	srv->bound_port[i] = bound;
	if (adv && strncmp(adv, SC_IFADDR_PREFIX, strlen(SC_IFADDR_PREFIX)) == 0) {
		const char *name = adv + strlen(SC_IFADDR_PREFIX);
		if (!sc_ifname_valid(name))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "--advertise %s: not a network interface name", adv);
		if (sc_ifaddr_lookup(name, if_host, sizeof(if_host), err) != 0)
			return -1;
		snprintf(srv->adv_if[i], sizeof(srv->adv_if[i]), "%s", name);
		adv = if_host;
	}
	if (!adv && is_wildcard(host)) {
		SC_WARN("peer", "--data-listen %s listens on every address but peers are told "
				"127.0.0.1: set --advertise to an address other hosts can reach "
				"for multi-host transfers",
			listen_text);
		adv = "127.0.0.1";
	}
	char text[sizeof(((struct ps_endpoint *)0)->text)];
	if (!join_hostport(text, sizeof(text), adv ? adv : host, bound))
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "%s \"%s\" is too long for a data endpoint (at most %zu characters "
		    "with the port)",
		    given ? "--advertise" : "--data-listen host", adv ? adv : host,
		    sizeof(text) - 1);
	if (set_endpoint(srv, i, text) != 0)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	if (srv->adv_if[i][0])
		SC_INFO("peer",
			"data listener on %s, advertised as %s (the address of interface %s, "
			"followed when it changes)",
			listen_text, text, srv->adv_if[i]);
	else
		SC_INFO("peer", "data listener on %s, advertised as %s", listen_text, text);
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
		rc = ps_spawn_worker_locked(srv) != 0 ? errno : 0;
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
		    const char *trace_id, struct sc_err *err)
{
	struct sc_peer_server *srv = ctx;
	return sc_passive_open(&srv->passive, token, xfer_id, peer_kind, peer_id, total_bytes,
			       trace_id, err);
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
	return ps_claim(ctx, peer_id, xfer_id, via, token);
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
		ps_rec_drop_locked(srv, sc_list_entry(sc_list_first(&t->recs), struct rec, tok_node));
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
	return sc_peer_server_endpoint_at(srv, 0);
}

size_t sc_peer_server_n_endpoints(const struct sc_peer_server *srv)
{
	return srv->n_listen;
}

const char *sc_peer_server_endpoint_at(const struct sc_peer_server *srv, size_t i)
{
	struct ps_endpoint *e = i < srv->n_listen ? atomic_load(&srv->endpoint[i]) : NULL;
	return e ? e->text : "";
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
		ps_wake(srv);
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
		ps_conn_finish(c, why);
	}
	ps_reap(srv);
	ps_expire_orphans(srv, true);
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
	while (srv->endpoints) {
		struct ps_endpoint *e = srv->endpoints;
		srv->endpoints = e->next;
		free(e);
	}
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
		if (!ps_idle_locked(o) || o->n_opened ||
		    atomic_load(&o->last_active_mono_ms) + min_idle_ms > now) {
			rc = -1;
			goto out;
		}
	}
	sc_list_foreach(pos, &srv->live) {
		struct conn *o = sc_list_entry(pos, struct conn, node);
		if (!o->authed || strcmp(o->peer_id, peer_id) != 0)
			continue;
		if (!ps_evict_locked(srv, o, true)) {
			rc = -1; /* a request just arrived on it */
			goto out;
		}
	}
out:
	pthread_mutex_unlock(&srv->mu);
	return rc;
}
