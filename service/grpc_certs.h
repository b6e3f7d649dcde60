/* SPDX-License-Identifier: Apache-2.0 */
/*
 * grpc_certs.h: the certificate, key and client CA of the TCP API listeners (--grpc-tls-cert,
 * --grpc-tls-key, --grpc-tls-client-ca), reloaded when their files change, through gRPC core's
 * certificate config fetcher: gRPC asks it on every new handshake, and it answers with a new
 * config when the files changed (checked at most every --tls-reload-interval, or at once after
 * sc_grpc_certs_reload). Live connections keep the certificate they began with. A file that fails
 * to load keeps the old certificate (logged as an error with the path and OpenSSL's reason).
 * The certificate in use is reported to the engine (sc_engine_set_grpc_certificate: the expiry
 * metric).
 *
 * Threads: created and destroyed on the main thread; the fetcher runs on gRPC's threads and
 * sc_grpc_certs_reload on the main thread (SIGHUP): one lock guards the state.
 */
#ifndef SC_GRPC_CERTS_H
#define SC_GRPC_CERTS_H

#include "conf/config.h"
#include "base/status.h"

#include <grpc/grpc_security.h>

struct sc_engine;
struct sc_grpc_certs;

/*
 * From cfg's --grpc-tls-*: *creds and *out stay NULL without --grpc-tls-cert. Files that do not
 * load, a key that does not match, or an expired certificate: INVALID_ARGUMENT naming the flag,
 * the path and the reason. *creds belongs to the caller (grpc_server_credentials_release); *out
 * must outlive the server that uses *creds.
 */
int sc_grpc_certs_create(const struct sc_config *cfg, struct sc_engine *eng,
			 grpc_server_credentials **creds, struct sc_grpc_certs **out,
			 struct sc_err *err);
/* SIGHUP: load the files now (new handshakes take them). -1 when they fail to load (logged; the
 * old certificate stays). NULL ok. */
int sc_grpc_certs_reload(struct sc_grpc_certs *c, struct sc_err *err);
/* After the server that used the credentials is destroyed. NULL ok. */
void sc_grpc_certs_destroy(struct sc_grpc_certs *c);

#endif
