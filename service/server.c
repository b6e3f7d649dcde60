/* SPDX-License-Identifier: Apache-2.0 */
/*
 * server.c: the gRPC C-core servers: one completion queue, --grpc-threads workers blocked in
 * grpc_completion_queue_next, each event's tag carrying its callback. For every method of the
 * table one request is always armed; when a call arrives the next one is armed at once, the call
 * is admitted or refused, and its handler runs (call.c carries the call from there). A generic
 * request answers every unknown method UNIMPLEMENTED.
 *
 * The API server (every --grpc-listen) and, with --health-listen, the probe server (Health only,
 * the rest PERMISSION_DENIED) share the queue. API TCP addresses use TLS/mTLS when configured, and
 * with --grpc-token-file non-unix calls need "authorization: Bearer <token>" (health excepted).
 * Unix sockets are checked and moded (net/api_listen.c); with --allowed-uids the sidecar accepts
 * on them itself (net/uds_accept.c, SO_PEERCRED; gRPC names the peer "fd:N"). grpc_shutdown is
 * bounded (bounded_grpc_shutdown). Threads: main creates, starts and shuts down; workers run the
 * arrivals. Owns the servers, the queue, the worker threads and the listeners.
 */
#include "absl_tune.h"
#include "grpc_certs.h"
#include "internal.h"
#include "base/log.h"

#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include <errno.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------------------------- */

/* Client and bidirectional streams: the handler reads every request itself (sc_call_recv). */
static bool no_initial_payload(const struct sc_method_def *m)
{
	return m->kind == SC_METHOD_CLIENT_STREAM || m->kind == SC_METHOD_BIDI_STREAM;
}

/* ---- arrival --------------------------------------------------------------------------------- */

static void on_call_start(struct tag *t, bool ok);
static void on_generic_start(struct tag *t, bool ok);

/* Arm the request for method index i (or the generic request when i == n_methods). */
static void arm(struct srv *s, size_t i)
{
	struct sc_service *svc = s->svc;
	const struct sc_method_def *m = i < sc_n_methods ? &sc_methods[i] : NULL;
	struct sc_call *c = sc_call_new(s, m);
	if (!c) {
		SC_ERROR("grpc", "out of memory arming %s", m ? m->path : "generic");
		return;
	}
	grpc_call_error e;
	if (m) {
		c->t_start.cb = on_call_start;
		e = grpc_server_request_registered_call(
			s->server, s->method_handles[i], &c->call, &c->deadline, &c->req_md,
			no_initial_payload(m) ? NULL : &c->payload, svc->cq, svc->cq,
			&c->t_start);
	} else {
		c->t_start.cb = on_generic_start;
		e = grpc_server_request_call(s->server, &c->call, &c->details, &c->req_md, svc->cq,
					     svc->cq, &c->t_start);
	}
	if (e != GRPC_CALL_OK) {
		SC_ERROR("grpc", "cannot arm %s: %d", m ? m->path : "generic", (int)e);
		sc_call_unref(c);
	}
}

#define PROBE_PORT_MSG                                                                             \
	"this is the health-only probe port (--health-listen): it serves grpc.health.v1.Health "   \
	"Check and Watch only; call rdma_sidecar.v1.Sidecar on a --grpc-listen address"

static bool is_health_method(const struct sc_method_def *m)
{
	return strncmp(m->path, "/grpc.health.v1.Health/", 23) == 0;
}

/*
 * May this call go on? Calls from connections the sidecar accepted itself (--allowed-uids; gRPC
 * names their peer "fd:N") need an allowed uid; with --grpc-token-file, calls from TCP need the
 * token (health checks excepted). SC_OK, or the status with msg filled.
 */
static enum sc_status call_admission(struct sc_call *c, char *msg, size_t cap)
{
	const struct sc_config *cfg = c->svc->cfg;
	struct sc_token_store *ts = c->svc->tokens;
	char *peer = grpc_call_get_peer(c->call);
	enum sc_status code = SC_OK;
	if (peer && strncmp(peer, "fd:", 3) == 0) {
		uid_t uid;
		bool ok = sc_uds_peer_uid(atoi(peer + 3), &uid);
		for (size_t i = 0; ok && i < cfg->n_allowed_uids; i++)
			if (cfg->allowed_uids[i] == (uint32_t)uid)
				goto out;
		code = SC_PERMISSION_DENIED;
		if (ok)
			snprintf(msg, cap,
				 "uid %u may not call this sidecar: its unix socket serves only the "
				 "uids of --allowed-uids; ask the operator to add yours",
				 (unsigned)uid);
		else
			snprintf(msg, cap, "the caller's uid is unknown (no SO_PEERCRED): refused "
					   "under --allowed-uids");
		goto out;
	}
	if (!ts || is_health_method(c->method) || (peer && strncmp(peer, "unix:", 5) == 0))
		goto out;
	for (size_t i = 0; i < c->req_md.count; i++) {
		const grpc_metadata *md = &c->req_md.metadata[i];
		if (grpc_slice_str_cmp(md->key, "authorization") != 0)
			continue;
		if (sc_token_check(ts, (const char *)GRPC_SLICE_START_PTR(md->value),
				   GRPC_SLICE_LENGTH(md->value)))
			goto out;
		break;
	}
	code = SC_UNAUTHENTICATED;
	snprintf(msg, cap, "missing or wrong bearer token: TCP calls to this sidecar need metadata "
			   "\"authorization: Bearer <token>\" with the token of its --grpc-token-file "
			   "(or use the unix socket)");
out:
	gpr_free(peer);
	return code;
}

static void on_call_start(struct tag *t, bool ok)
{
	struct sc_call *c = (struct sc_call *)((char *)t - offsetof(struct sc_call, t_start));
	if (!ok) {
		/* Server shutting down: this request will never be a call. */
		sc_call_unref(c);
		return;
	}
	arm(c->srv, (size_t)(c->method - sc_methods));
	sc_call_arrived(c, (size_t)(c->method - sc_methods));
	sc_call_watch_close(c);
	const struct sc_method_def *m = c->method;
	SC_DEBUG("grpc", "call %s%s", m->path, c->srv->probe ? " (probe port)" : "");
	char why[300];
	enum sc_status denied = SC_OK;
	if (c->srv->probe && !is_health_method(m)) {
		sc_call_fail(c, SC_PERMISSION_DENIED, PROBE_PORT_MSG);
	} else if (!c->srv->probe && (denied = call_admission(c, why, sizeof(why))) != SC_OK) {
		SC_WARN_LIMITED("grpc", "grpc-refused", "%s refused: %s", m->path, why);
		sc_call_fail(c, denied, why);
	} else if (no_initial_payload(m)) {
		m->fn(c, NULL);
	} else if (!c->payload) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "request message missing");
	} else {
		ProtobufCMessage *req = sc_call_unpack(m->request, c->payload);
		grpc_byte_buffer_destroy(c->payload);
		c->payload = NULL;
		if (!req) {
			sc_call_fail(c, SC_INVALID_ARGUMENT,
				     "malformed request (protobuf decode failed): check the client "
				     "was generated from rdma_sidecar/v1/sidecar.proto");
		} else {
			m->fn(c, req);
			protobuf_c_message_free_unpacked(req, NULL);
		}
	}
	sc_call_unref(c); /* the arrival's reference; batches and holders keep their own */
}

static void on_generic_start(struct tag *t, bool ok)
{
	struct sc_call *c = (struct sc_call *)((char *)t - offsetof(struct sc_call, t_start));
	if (!ok) {
		sc_call_unref(c);
		return;
	}
	arm(c->srv, sc_n_methods);
	sc_call_arrived(c, sc_n_methods);
	char path[256];
	size_t len = GRPC_SLICE_LENGTH(c->details.method);
	if (len >= sizeof(path))
		len = sizeof(path) - 1;
	memcpy(path, GRPC_SLICE_START_PTR(c->details.method), len);
	path[len] = '\0';
	SC_DEBUG("grpc", "unknown method %s", path);
	sc_call_watch_close(c);
	char msg[320];
	if (c->srv->probe)
		snprintf(msg, sizeof(msg), "unknown method %s: " PROBE_PORT_MSG, path);
	else
		snprintf(msg, sizeof(msg),
			 "unknown method %s: see proto/rdma_sidecar/v1/sidecar.proto", path);
	sc_call_fail(c, SC_UNIMPLEMENTED, msg);
	sc_call_unref(c);
}

/* ---- the server ------------------------------------------------------------------------------ */

static void on_shutdown(struct tag *t, bool ok)
{
	struct srv *s = (struct srv *)((char *)t - offsetof(struct srv, t_shutdown));
	atomic_store(&s->shutdown_done, true);
}

/* Every server's shutdown notification has arrived. */
static bool servers_shut_down(struct sc_service *svc)
{
	return atomic_load(&svc->api.shutdown_done) &&
	       (!svc->have_probe || atomic_load(&svc->probe.shutdown_done));
}

static void servers_cancel_all_calls(struct sc_service *svc)
{
	grpc_server_cancel_all_calls(svc->api.server);
	if (svc->have_probe)
		grpc_server_cancel_all_calls(svc->probe.server);
}

static void servers_shutdown_and_notify(struct sc_service *svc)
{
	grpc_server_shutdown_and_notify(svc->api.server, svc->cq, &svc->api.t_shutdown);
	if (svc->have_probe)
		grpc_server_shutdown_and_notify(svc->probe.server, svc->cq, &svc->probe.t_shutdown);
}

/* Close the queue once no batch can start any more; workers then drain it and exit. */
static void close_queue(struct sc_service *svc)
{
	pthread_rwlock_wrlock(&svc->batch_lock);
	bool was = svc->cq_closed;
	svc->cq_closed = true;
	pthread_rwlock_unlock(&svc->batch_lock);
	if (!was)
		grpc_completion_queue_shutdown(svc->cq);
}

static void *worker_main(void *arg)
{
	struct sc_service *svc = arg;
	for (;;) {
		grpc_event ev = grpc_completion_queue_next(svc->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
							   NULL);
		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type != GRPC_OP_COMPLETE)
			continue;
		struct tag *t = ev.tag;
		t->cb(t, ev.success != 0);
	}
	return NULL;
}

/* A grpc_server with the queue and every method of the table registered. */
static int srv_init(struct sc_service *svc, struct srv *s, bool probe,
		    const grpc_channel_args *chargs, struct sc_err *err)
{
	s->svc = svc;
	s->probe = probe;
	s->t_shutdown.cb = on_shutdown;
	s->server = grpc_server_create(chargs, NULL);
	grpc_server_register_completion_queue(s->server, svc->cq, NULL);
	s->method_handles = calloc(sc_n_methods, sizeof(void *));
	if (!s->method_handles)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	for (size_t i = 0; i < sc_n_methods; i++) {
		grpc_server_register_method_payload_handling ph =
			no_initial_payload(&sc_methods[i])
				? GRPC_SRM_PAYLOAD_NONE
				: GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER;
		s->method_handles[i] =
			grpc_server_register_method(s->server, sc_methods[i].path, NULL, ph, 0);
		if (!s->method_handles[i])
			return sc_err_set(err, SC_INTERNAL, "cannot register %s",
					  sc_methods[i].path);
	}
	return 0;
}

/* "HOST:0" as bound: the real port. */
static char *shown_addr(const char *addr, int port)
{
	if (strncmp(addr, "unix:", 5) == 0)
		return strdup(addr);
	const char *colon = strrchr(addr, ':');
	size_t hl = colon ? (size_t)(colon - addr) : strlen(addr);
	char *shown = malloc(hl + 8);
	if (shown)
		snprintf(shown, hl + 8, "%.*s:%d", (int)hl, addr, port);
	return shown;
}

/* The method table's names and kinds for the engine's gRPC metrics (index = sc_methods index). */
static void name_methods(struct sc_engine *eng)
{
	static const char *const kind_name[] = {[SC_METHOD_UNARY] = "unary",
						[SC_METHOD_SERVER_STREAM] = "server_stream",
						[SC_METHOD_CLIENT_STREAM] = "client_stream",
						[SC_METHOD_BIDI_STREAM] = "bidi_stream"};
	const char *paths[64], *types[64];
	size_t n = sc_n_methods < 64 ? sc_n_methods : 64;
	for (size_t i = 0; i < n; i++) {
		paths[i] = sc_methods[i].path;
		types[i] = kind_name[sc_methods[i].kind];
	}
	sc_engine_grpc_methods(eng, paths, types, n);
}

int sc_service_create(struct sc_engine *eng, const struct sc_config *cfg,
		      struct sc_service **out, struct sc_err *err)
{
	grpc_server_credentials *tls = NULL;
	if (sc_api_listen_check(cfg, err) != 0)
		return -1;
	struct sc_service *svc = calloc(1, sizeof(*svc));
	if (!svc)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	svc->eng = eng;
	svc->cfg = cfg;
	name_methods(eng);
	pthread_rwlock_init(&svc->batch_lock, NULL);
	svc->health = sc_health_create();
	sc_absl_tune(); /* before gRPC locks its first absl::Mutex: see absl_tune.h */
	grpc_init();
	if (cfg->grpc_token_file && sc_token_store_create(cfg->grpc_token_file, &svc->tokens, err))
		goto fail;
	/* TLS for the TCP API listeners, reloaded when the files change (grpc_certs.h). */
	if (sc_grpc_certs_create(cfg, eng, &tls, &svc->certs, err) != 0)
		goto fail;

	grpc_arg args[4];
	memset(args, 0, sizeof(args));
	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[0].value.integer = (int)cfg->max_message_bytes;
	args[1].type = GRPC_ARG_INTEGER;
	args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
	args[1].value.integer = (int)cfg->max_message_bytes;
	args[2].type = GRPC_ARG_INTEGER;
	args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
	args[2].value.integer = 0;
	args[3].type = GRPC_ARG_INTEGER;
	args[3].key = GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS;
	args[3].value.integer = 1;
	grpc_channel_args chargs = {.num_args = 4, .args = args};
	svc->cq = grpc_completion_queue_create_for_next(NULL);
	if (srv_init(svc, &svc->api, false, &chargs, err) != 0)
		goto fail;

	for (size_t i = 0; i < cfg->n_grpc_listen; i++) {
		const char *addr = cfg->grpc_listen[i];
		bool is_unix = strncmp(addr, "unix:", 5) == 0;
		if (is_unix && sc_unix_socket_prepare(addr + 5, err) != 0)
			goto fail;
		if (is_unix && cfg->n_allowed_uids) {
			/* Accepted by the sidecar itself, to learn each caller's uid. */
			if (sc_uds_acceptor_create(addr + 5, cfg->unix_socket_mode,
						   &svc->uds[svc->n_uds], err) != 0)
				goto fail;
			svc->n_uds++;
			char *shown = strdup(addr);
			svc->listeners[svc->n_listeners] = shown;
			svc->listener_view[svc->n_listeners] = shown ? shown : addr;
			svc->n_listeners++;
			continue;
		}
		grpc_server_credentials *creds =
			!is_unix && tls ? tls : grpc_insecure_server_credentials_create();
		int port = grpc_server_add_http2_port(svc->api.server, addr, creds);
		if (creds != tls)
			grpc_server_credentials_release(creds);
		if (port == 0) {
			sc_err_set(err, SC_INVALID_ARGUMENT,
				   "--grpc-listen %s: cannot listen there (address in use, not "
				   "permitted, or not an address): pick another with --grpc-listen",
				   addr);
			goto fail;
		}
		/* Bound and listening, not yet served: the mode is in place before any call. */
		if (is_unix && sc_unix_socket_set_mode(addr + 5, cfg->unix_socket_mode, err) != 0)
			goto fail;
		char *shown = shown_addr(addr, port);
		svc->listeners[svc->n_listeners] = shown;
		svc->listener_view[svc->n_listeners] = shown ? shown : addr;
		svc->n_listeners++;
		if (!is_unix)
			SC_INFO("grpc", "%s: %s%s", addr,
				tls ? (cfg->grpc_tls_client_ca ? "mTLS" : "TLS") : "plain TCP",
				svc->tokens ? ", bearer token required" : "");
	}

	if (cfg->health_listen) {
		if (srv_init(svc, &svc->probe, true, &chargs, err) != 0)
			goto fail;
		svc->have_probe = true;
		grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
		int port = grpc_server_add_http2_port(svc->probe.server, cfg->health_listen, creds);
		grpc_server_credentials_release(creds);
		if (port == 0) {
			sc_err_set(err, SC_INVALID_ARGUMENT,
				   "--health-listen %s: cannot listen there (address in use, not "
				   "permitted, or not an address): pick another with --health-listen",
				   cfg->health_listen);
			goto fail;
		}
		svc->probe_addr = shown_addr(cfg->health_listen, port);
	}
	if (tls)
		grpc_server_credentials_release(tls);
	*out = svc;
	return 0;
fail:
	if (tls)
		grpc_server_credentials_release(tls);
	sc_service_destroy(svc);
	return -1;
}

int sc_service_reload_tls(struct sc_service *svc, struct sc_err *err)
{
	return svc ? sc_grpc_certs_reload(svc->certs, err) : 0;
}

int sc_service_reload_auth(struct sc_service *svc, struct sc_err *err)
{
	if (!svc || !svc->tokens)
		return 0;
	if (sc_token_store_reload(svc->tokens, err) != 0)
		return -1;
	SC_INFO("grpc", "bearer token reloaded from %s", svc->cfg->grpc_token_file);
	return 0;
}

/* A connection the acceptor let in (accept thread): gRPC serves it from now on. */
static void on_uds_conn(void *ctx, int fd)
{
	struct sc_service *svc = ctx;
	grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
	grpc_server_add_channel_from_fd(svc->api.server, fd, creds);
	grpc_server_credentials_release(creds);
}

static void stop_acceptors(struct sc_service *svc)
{
	for (size_t i = 0; i < svc->n_uds; i++)
		sc_uds_acceptor_destroy(svc->uds[i]);
	svc->n_uds = 0;
}

int sc_service_start(struct sc_service *svc, struct sc_err *err)
{
	grpc_server_start(svc->api.server);
	if (svc->have_probe)
		grpc_server_start(svc->probe.server);
	svc->started = true;
	for (size_t i = 0; i < svc->n_uds; i++)
		if (sc_uds_acceptor_start(svc->uds[i], on_uds_conn, svc, err) != 0)
			return -1;
	for (size_t i = 0; i <= sc_n_methods; i++) {
		arm(&svc->api, i);
		if (svc->have_probe)
			arm(&svc->probe, i);
	}
	svc->threads = calloc(svc->cfg->grpc_threads, sizeof(pthread_t));
	if (!svc->threads)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	for (uint32_t i = 0; i < svc->cfg->grpc_threads; i++) {
		if (pthread_create(&svc->threads[i], NULL, worker_main, svc) != 0)
			return sc_err_set(err, SC_INTERNAL, "cannot start gRPC worker thread");
		pthread_setname_np(svc->threads[i], "sc-grpc");
		svc->n_threads++;
	}
	sc_health_set(svc->health, true);
	for (size_t i = 0; i < svc->n_listeners; i++)
		SC_INFO("grpc", "serving on %s", svc->listener_view[i]);
	if (svc->have_probe)
		SC_INFO("grpc", "health probes (grpc.health.v1 only) on %s",
			svc->probe_addr ? svc->probe_addr : svc->cfg->health_listen);
	return 0;
}

void sc_service_begin_drain(struct sc_service *svc)
{
	if (!svc || svc->shutting_down)
		return;
	sc_health_set(svc->health, false);
	stop_acceptors(svc); /* no new connection may reach a server that shuts down */
	if (svc->started) {
		svc->shutting_down = true;
		servers_shutdown_and_notify(svc);
	}
}

void sc_service_shutdown(struct sc_service *svc, uint64_t grace_ms)
{
	if (!svc || !svc->started)
		return;
	sc_service_begin_drain(svc);
	/* Unary calls in flight get up to grace_ms to answer; streams (Watch, Subscribe, Wait)
	 * would wait forever, so everything left is cancelled after that. */
	struct timespec ts = {0, 10 * 1000000L};
	uint64_t waited = 0;
	for (; waited < grace_ms && !servers_shut_down(svc); waited += 10)
		nanosleep(&ts, NULL);
	servers_cancel_all_calls(svc);
	/* Every call frees itself once its last batch completes and its holders let go (cancel
	 * hooks run on the workers). Then no batch can start, and the queue may close. */
	for (waited = 0; waited < 10000 && (!servers_shut_down(svc) ||
					   atomic_load(&svc->live_calls) > 0);
	     waited += 10)
		nanosleep(&ts, NULL);
	if (atomic_load(&svc->live_calls) > 0)
		SC_WARN("grpc", "%d call(s) still held at shutdown", atomic_load(&svc->live_calls));
	close_queue(svc);
	for (size_t i = 0; i < svc->n_threads; i++)
		pthread_join(svc->threads[i], NULL);
	svc->n_threads = 0;
	svc->started = false;
	atomic_store(&svc->calls_uncounted, true);
}

/*
 * grpc_shutdown joins gRPC's executor threads. After a write that once blocked (any large answer,
 * e.g. a ListOperations the client then refused as oversized), gRPC 1.51's TCP backup poller
 * (tcp_posix.cc run_poller) waits in epoll_wait for up to 10 s with nothing left to wake it, and
 * grpc_shutdown waits for it: exit took 10 s whatever --grace-period said. So grpc_shutdown runs
 * on a helper thread for at most GRPC_SHUTDOWN_WAIT_MS; past that main exits without waiting
 * (sc_service_teardown_pending). Every call, server and queue is gone by then.
 */
#define GRPC_SHUTDOWN_WAIT_MS 1000

static atomic_bool grpc_teardown_pending;

static void *grpc_shutdown_main(void *arg)
{
	(void)arg;
	grpc_shutdown();
	return NULL;
}

static void bounded_grpc_shutdown(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, grpc_shutdown_main, NULL) != 0) {
		grpc_shutdown();
		return;
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += GRPC_SHUTDOWN_WAIT_MS / 1000;
	until.tv_nsec += (long)(GRPC_SHUTDOWN_WAIT_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	if (pthread_timedjoin_np(t, NULL, &until) == 0)
		return;
	SC_DEBUG("grpc", "grpc_shutdown still waiting after %d ms (gRPC's TCP backup poller lingers "
			 "up to 10 s after a blocked write): exiting without it",
		 GRPC_SHUTDOWN_WAIT_MS);
	pthread_detach(t);
	atomic_store(&grpc_teardown_pending, true);
}

static void srv_destroy(struct srv *s)
{
	if (s->server)
		grpc_server_destroy(s->server);
	free(s->method_handles);
}

void sc_service_destroy(struct sc_service *svc)
{
	if (!svc)
		return;
	if (svc->started)
		sc_service_shutdown(svc, 0);
	else if (svc->api.server && !svc->shutting_down) {
		/* Never started: still shut down cleanly so gRPC frees the ports. */
		svc->have_probe = svc->probe.server != NULL;
		servers_shutdown_and_notify(svc);
		servers_cancel_all_calls(svc);
		while (!servers_shut_down(svc)) {
			grpc_event ev = grpc_completion_queue_next(
				svc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
			if (ev.type == GRPC_OP_COMPLETE)
				((struct tag *)ev.tag)->cb(ev.tag, ev.success != 0);
		}
		close_queue(svc);
		worker_main(svc);
	}
	stop_acceptors(svc);
	srv_destroy(&svc->api);
	srv_destroy(&svc->probe);
	if (svc->cq)
		grpc_completion_queue_destroy(svc->cq);
	free(svc->threads);
	for (size_t i = 0; i < svc->n_listeners; i++)
		free(svc->listeners[i]);
	free(svc->probe_addr);
	sc_token_store_destroy(svc->tokens);
	sc_health_destroy(svc->health);
	pthread_rwlock_destroy(&svc->batch_lock);
	struct sc_grpc_certs *certs = svc->certs;
	free(svc);
	bounded_grpc_shutdown();
	/* gRPC's credentials call into certs on handshakes: free it only once gRPC is gone. */
	if (!atomic_load(&grpc_teardown_pending))
		sc_grpc_certs_destroy(certs);
}

bool sc_service_teardown_pending(void)
{
	return atomic_load(&grpc_teardown_pending);
}
