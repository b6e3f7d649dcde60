/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer_tls.h: optional TLS 1.3 on the peer data channel (--peer-tls-cert/-key/-ca). Every data
 * connection, dialed or accepted, runs a handshake with mutual certificate verification against
 * the cluster CA before the key-proof hello (peer_proto.h), which stays as a second check.
 *
 * After the handshake the connection is "attached" to its fd: the blocking I/O of peer_proto.h
 * (sc_peer_recv_all, sc_peer_sendv_all and everything built on them) asks the stream this file
 * layers under every fd (struct sc_peer_stream, set by sc_peer_tls_create), which looks the fd up
 * and
 *   - uses plain recv/sendmsg for a direction that kernel TLS (kTLS) took over: the kernel
 *     encrypts and decrypts, so throughput stays close to plain TCP;
 *   - uses SSL_read/SSL_write for a direction without kTLS (no `tls` kernel module, or OpenSSL
 *     3.0, which offloads only the sending side of TLS 1.3).
 * So callers keep passing an fd, and the TLS state lives behind it until sc_peer_tls_close.
 *
 * Threads: a context is created and destroyed by the engine's lifecycle thread and shared
 * read-only by the peer server and pool. A connection's TLS state is used by the one thread that
 * owns the connection; sc_peer_tls_close must run when nobody else uses the fd.
 */
#ifndef SC_PEER_TLS_H
#define SC_PEER_TLS_H

#include "config.h"
#include "peer_proto.h"
#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct sc_peer_tls;

/* fds at or above this cannot carry TLS (the attach table's size). */
#define SC_PEER_TLS_MAX_FD 65536

/*
 * From --peer-tls-cert/--peer-tls-key/--peer-tls-ca: *out is NULL when none is set (plain TCP).
 * All three or none: otherwise INVALID_ARGUMENT naming what is missing. Unreadable files, a key
 * that does not match the certificate or a bad CA file: FAILED_PRECONDITION with the flag, the
 * path and OpenSSL's reason.
 */
int sc_peer_tls_create(const struct sc_config *cfg, struct sc_peer_tls **out, struct sc_err *err);
void sc_peer_tls_destroy(struct sc_peer_tls *tls); /* NULL ok; no connection may still use it */

/*
 * Handshake on a connected blocking fd (with the I/O slice set) as client or server, within w.
 * On success the TLS state is attached to fd. Errors: UNAVAILABLE "TLS handshake with <what>
 * failed: <reason>" (the peer speaks plain TCP, its certificate is not from the cluster CA, it
 * closed), DEADLINE_EXCEEDED, CANCELLED, RESOURCE_EXHAUSTED (fd over SC_PEER_TLS_MAX_FD).
 */
int sc_peer_tls_client(struct sc_peer_tls *tls, int fd, const struct sc_peer_wait *w,
		       const char *what, struct sc_err *err);
int sc_peer_tls_server(struct sc_peer_tls *tls, int fd, const struct sc_peer_wait *w,
		       const char *what, struct sc_err *err);

/* "kTLS tx+rx", "kTLS tx, userspace rx (...)", "userspace (kTLS unavailable: ...)": what the
 * most recent handshake used (before one: what is expected). Never NULL. */
const char *sc_peer_tls_mode(const struct sc_peer_tls *tls);

/* Free the TLS state attached to fd (if any), then close(fd). fd < 0: nothing. */
void sc_peer_tls_close(int fd);

/* OpenSSL's reason for the last failed read or write on fd ("tlsv13 alert certificate
 * required"), or NULL. */
const char *sc_peer_tls_last_error(int fd);

#endif
