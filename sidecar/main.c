/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c: the rdma-sidecar daemon. Parses the configuration, creates the engine and the gRPC
 * service, then waits for signals on the main thread (every other thread has them blocked):
 *   SIGTERM/SIGINT  drain: health NOT_SERVING, refuse new work, let live transfers finish within
 *                   --grace-period, cancel the rest, exit 0
 *   SIGHUP          reload --key-file (key rotation), --grpc-token-file, and the peer and gRPC
 *                   TLS certificates, keys and CAs (also reloaded when their files change)
 * Exit codes: 0 clean, 1 runtime failure, 2 bad configuration.
 */
#include "base/log.h"
#include "base/trace.h"
#include "conf/config.h"
#include "engine/engine.h"
#include "fast/socket.h"
#include "nats/client.h"
#include "os/memlock.h"
#include "service.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv)
{
	struct sc_config cfg;
	struct sc_err err;
	sc_err_clear(&err);
	enum sc_config_result cr = sc_config_parse(&cfg, argc, argv, environ, &err);
	if (cr != SC_CONFIG_OK) {
		if (cr == SC_CONFIG_ERROR)
			fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		sc_config_free(&cfg);
		return cr == SC_CONFIG_EXIT ? 0 : 2;
	}
	sc_log_configure(cfg.log_level, cfg.log_json);

	/* Block the signals we handle before any thread starts, so only sigwait sees them. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	int rc = 0;
	struct sc_engine *eng = NULL;
	struct sc_service *svc = NULL;
	struct sc_fast_path *fast = NULL;
	/* Creation fails only on configuration the host cannot honour (shm dir, key file, data
	 * port, listeners): exit 2 like a bad flag. */
	sc_memlock_raise(); /* before any backend registers memory */
	if (sc_engine_create(&cfg, &eng, &err) != 0) {
		fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		rc = 2;
		goto out;
	}
	if (sc_service_create(eng, &cfg, &svc, &err) != 0) {
		fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		rc = 2;
		goto out;
	}
	if (sc_fast_path_create(eng, &cfg, &fast, &err) != 0) {
		fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		rc = 2;
		goto out;
	}
	if (sc_engine_start(eng, &err) != 0) {
		fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		rc = err.code == SC_INVALID_ARGUMENT ? 2 : 1;
		goto out;
	}
	if (sc_service_start(svc, &err) != 0 || sc_fast_path_start(fast, &err) != 0) {
		fprintf(stderr, "rdma-sidecar: %s\n", err.msg);
		rc = 1;
		goto out;
	}
	struct sc_info info;
	sc_engine_info(eng, &info);
	SC_INFO("main", "rdma-sidecar %s ready: id %s, data endpoint %s, nats %s, signing %s",
		info.version, info.sidecar_id,
		info.n_data_endpoints ? info.data_endpoints[0] : "(none)", info.nats_state,
		info.signing_enabled ? info.signing_key_id : "off (no --key-file)");
	bool rdma = false;
	for (size_t i = 0; i < info.n_backends; i++)
		rdma |=
		    info.backends[i].backend == SC_BACKEND_IBVERBS && info.backends[i].available;
	struct sc_memlock ml;
	sc_memlock_assess(rdma, cfg.max_total_region_bytes, &ml);
	if (ml.enough)
		SC_INFO("main", "%s", ml.detail);
	else
		SC_WARN("main", "%s", ml.detail);

	for (;;) {
		int sig = 0;
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGHUP) {
			sc_err_clear(&err);
			if (sc_engine_reload_keys(eng, &err) != 0)
				SC_ERROR("main", "SIGHUP: keeping the old keys: %s", err.msg);
			sc_err_clear(&err);
			sc_engine_reload_tls(eng, &err); /* logs why it kept the old certificate */
			sc_err_clear(&err);
			sc_service_reload_tls(svc, &err); /* the same */
			sc_err_clear(&err);
			if (sc_service_reload_auth(svc, &err) != 0)
				SC_ERROR("main", "SIGHUP: keeping the old bearer token: %s",
					 err.msg);
			continue;
		}
		SC_INFO("main", "%s: draining (grace period %llu ms)", strsignal(sig),
			(unsigned long long)cfg.grace_ms);
		break;
	}
	sc_trace_dump(); /* RDMA_SIDECAR_TRACE_HANDOFFS=1: the hand-off trace, into the log */
	sc_service_begin_drain(svc);
	sc_engine_begin_drain(eng);
	if (!sc_engine_wait_idle(eng, cfg.grace_ms))
		SC_WARN("main", "grace period over: cancelling the transfers still running");
	sc_service_shutdown(svc, 250); /* unary calls in flight; streams are then cancelled */
out:
	/* Fast-path sessions end before the engine: they cancel and release their runs. */
	sc_fast_path_destroy(fast);
	/* The engine goes first: it cancels and waits for its transfers, which gRPC calls watch. */
	sc_engine_destroy(eng);
	/* What the peer server's threads recorded between the dump above and their end (a DONE's
	 * answer leaves before its record is made: the peer may already have told us to stop). */
	sc_trace_dump();
	sc_service_destroy(svc);
	sc_nats_bus_library_shutdown();
	sc_config_free(&cfg);
	if (rc == 0)
		SC_INFO("main", "stopped");
	if (sc_service_teardown_pending()) {
		/* gRPC's threads are still tearing down: exit() would run library destructors under
		 * them. Everything of ours is released. */
		fflush(NULL);
		_exit(rc);
	}
	return rc;
}
