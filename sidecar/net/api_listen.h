/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/api_listen.h: who may reach the worker API, without gRPC types (service/server.c applies it).
 *
 *  - the listener policy: a TCP --grpc-listen address serves the full API only with
 *    authentication (mTLS client CA and/or a bearer token file); a non-loopback one without is a
 *    configuration error, a loopback one is started with a loud WARN;
 *  - unix sockets: the directory is created (0750) or verified (a directory owned by this user,
 *    not group- or world-writable), a live server already answering on the path is refused, a
 *    stale file removed, and after gRPC bound it the socket gets its explicit mode;
 *  - the bearer token: loaded from a file (SIGHUP reloads), compared in constant time.
 *
 * Main thread at start-up; sc_token_check and sc_token_reload from any thread (the token store
 * has its own lock). Errors are INVALID_ARGUMENT (configuration) with what to change.
 */
#ifndef SC_API_LISTEN_H
#define SC_API_LISTEN_H

#include "conf/config.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

/* "127.0.0.1:1", "127.9.9.9:1", "localhost:1", "[::1]:1" -> true; unix: and anything else false. */
bool sc_addr_is_loopback(const char *addr);

/* true when TCP calls are authenticated: a client CA (mTLS) or a token file is configured. */
bool sc_api_tcp_authenticated(const struct sc_config *cfg);

/* The policy above over every --grpc-listen address; WARNs for loopback without authentication.
 * -1 with err for a non-loopback TCP address without authentication. */
int sc_api_listen_check(const struct sc_config *cfg, struct sc_err *err);

/* Before gRPC binds unix:path: directory made or verified, live server refused, stale removed. */
int sc_unix_socket_prepare(const char *path, struct sc_err *err);
/* The same for another unix socket: messages begin with what (e.g. "--fast-path-socket ") and the
 * path; a live server is probed with a socket of type (SOCK_STREAM, SOCK_SEQPACKET). */
int sc_unix_socket_prepare_as(const char *what, int type, const char *path, struct sc_err *err);

/* After gRPC bound unix:path (before serving): chmod to mode, whatever the umask was. */
int sc_unix_socket_set_mode(const char *path, unsigned mode, struct sc_err *err);

/* Read a whole small file (PEM, token) into a NUL-terminated malloc'd buffer; what names it in
 * messages ("--grpc-tls-cert"). Only regular files, at most max bytes. */
int sc_read_small_file(const char *path, size_t max, const char *what, char **out, size_t *len,
		       struct sc_err *err);

/* The bearer token of --grpc-token-file. */
struct sc_token_store;
int sc_token_store_create(const char *path, struct sc_token_store **out, struct sc_err *err);
void sc_token_store_destroy(struct sc_token_store *ts); /* NULL ok */
/* Reload the file; on error the old token stays and err says why. */
int sc_token_store_reload(struct sc_token_store *ts, struct sc_err *err);
/* header: the value of the "authorization" metadata (not NUL-terminated), NULL when absent.
 * true when it is "Bearer <token>" with the current token (constant-time compare). */
bool sc_token_check(struct sc_token_store *ts, const char *header, size_t len);

#endif
