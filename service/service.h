/* SPDX-License-Identifier: Apache-2.0 */
/*
 * service.h: the gRPC front end, as main sees it. No gRPC types here.
 *
 * Lifecycle (main thread): create (binds every --grpc-listen address; a bad or busy address is a
 * configuration error) -> start (worker threads, health SERVING) -> begin_drain (health
 * NOT_SERVING, new calls refused) -> shutdown (waits up to the grace period for calls, cancels the
 * rest, joins the workers) -> destroy.
 */
#ifndef SC_SERVICE_H
#define SC_SERVICE_H

#include "conf/config.h"
#include "engine/engine.h"
#include "base/status.h"

struct sc_service;

int sc_service_create(struct sc_engine *eng, const struct sc_config *cfg,
		      struct sc_service **out, struct sc_err *err);
int sc_service_start(struct sc_service *svc, struct sc_err *err);
void sc_service_begin_drain(struct sc_service *svc);
void sc_service_shutdown(struct sc_service *svc, uint64_t grace_ms);
void sc_service_destroy(struct sc_service *svc); /* NULL ok; calls grpc_shutdown */
/* true when sc_service_destroy left gRPC's own teardown running (it lingers up to 10 s after a
 * blocked write): the process must then end with _exit, not return from main. */
bool sc_service_teardown_pending(void);

/* SIGHUP: reload --grpc-token-file (the old token stays on error). 0 without a token file. */
int sc_service_reload_auth(struct sc_service *svc, struct sc_err *err);
/* SIGHUP: reload --grpc-tls-cert/--grpc-tls-key/--grpc-tls-client-ca (new connections take them;
 * also reloaded when the files change, every --tls-reload-interval). The old ones stay on failure
 * (logged). Nothing to do without them. */
int sc_service_reload_tls(struct sc_service *svc, struct sc_err *err);

/* The listeners actually bound ("unix:/tmp/x.sock", "127.0.0.1:50051"). */
size_t sc_service_listeners(struct sc_service *svc, const char ***out);

#endif
