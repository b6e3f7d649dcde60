/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/tls.h: optional TLS 1.3 on the peer data channel (--peer-tls-cert/-key/-ca). Every data
 * connection, dialed or accepted, runs a handshake with mutual certificate verification against
 * the cluster CA before the key-proof hello (peer/proto.h), which stays as a second check.
 *
 * After the handshake the connection is "attached" to its fd: the blocking I/O of peer/proto.h
 * (sc_peer_recv_all, sc_peer_sendv_all and everything built on them) asks the stream this file
 * layers under every fd (struct sc_peer_stream, set by sc_peer_tls_create), which looks the fd up
 * and
 *   - uses plain recv/sendmsg for a direction that kernel TLS (kTLS) took over: the kernel
 *     encrypts and decrypts, so throughput stays close to plain TCP;
 *   - uses SSL_read/SSL_write for a direction without kTLS (no `tls` kernel module, or OpenSSL
 *     3.0, which offloads only the sending side of TLS 1.3), through a per-connection bounce
 *     buffer of one record that the guarded copy fills and drains (os/fault_guard.h): the caller's
 *     buffer is region memory, which a worker may truncate, and nothing may longjmp out of
 *     OpenSSL. A buffer that lost its backing fails the call with EFAULT, as a system call would.
 * So callers keep passing an fd, and the TLS state lives behind it until sc_peer_tls_close.
 *
 * Identity (--peer-identity): with TLS, a sidecar's id is the one its verified certificate names;
 * the serving side checks it against the hello's claim (sc_peer_tls_check_claim), the dialing side
 * records it (sc_peer_tls_reached) for the check against the metadata's issuer (peer/pool.h).
 *
 * Threads: a context is created and destroyed by the engine's lifecycle thread and shared by the
 * peer server and pool; its certificate is swapped by sc_peer_tls_reload (any thread). A
 * connection's TLS state is used by the one thread that owns the connection; sc_peer_tls_close must
 * run when nobody else uses the fd.
 */
#ifndef SC_PEER_TLS_H
#define SC_PEER_TLS_H

#include "conf/config.h"
#include "peer/proto.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct sc_peer_tls;
struct x509_st; /* OpenSSL's X509 */

#define SC_TLS_SERIAL_MAX 80
#define SC_TLS_TRUST_DOMAIN_MAX 256

/* A certificate as loaded: for GetInfo, the metrics and the log. */
struct sc_tls_cert_info {
	char serial[SC_TLS_SERIAL_MAX]; /* hex, upper case, as OpenSSL prints it */
	int64_t not_before, not_after;  /* unix seconds */
	bool has_identity;              /* it names a sidecar id under --peer-identity */
	char identity[SC_NAME_MAX];
};

/* fds at or above this cannot carry TLS (the attach table's size). */
#define SC_PEER_TLS_MAX_FD 65536

/*
 * From --peer-tls-cert/--peer-tls-key/--peer-tls-ca: *out is NULL when none is set (plain TCP).
 * All three or none: otherwise INVALID_ARGUMENT naming what is missing (also when
 * --peer-identity-required is set without them). Unreadable files, a key that does not match the
 * certificate, a bad CA file, a certificate of ours that has expired or is not yet valid, or that
 * names another id than --id under --peer-identity (or none, with --peer-identity-required):
 * FAILED_PRECONDITION with the flag, the path and the reason.
 */
int sc_peer_tls_create(const struct sc_config *cfg, struct sc_peer_tls **out, struct sc_err *err);
/* Stops the watch; NULL ok. Connections still open keep their TLS state (sc_peer_tls_close). */
void sc_peer_tls_destroy(struct sc_peer_tls *tls);

/*
 * Reload the certificate, key and CA when their files changed since the last attempt (stat of the
 * paths: dev, inode, size, mtime), or always when force (SIGHUP). New handshakes use the new
 * context; connections made with the old one keep it until they close. Returns 1 when it loaded,
 * 0 when nothing changed, -1 when a file failed to load (err says why, logged as an error; the
 * old certificate stays). Any thread; reloads run one at a time.
 */
int sc_peer_tls_reload(struct sc_peer_tls *tls, bool force, struct sc_err *err);
/* Start a thread that calls sc_peer_tls_reload every interval_ms (0: none). Lifecycle thread. */
int sc_peer_tls_watch(struct sc_peer_tls *tls, uint64_t interval_ms, struct sc_err *err);
/* The certificate new handshakes present. Any thread. */
void sc_peer_tls_info(struct sc_peer_tls *tls, struct sc_tls_cert_info *out);

/*
 * The sidecar id cert names under source (--peer-identity), pure: spiffe: the last path segment
 * of its URI SAN spiffe://TRUST-DOMAIN/.../ID (trust_domain, may be NULL, gets TRUST-DOMAIN);
 * dns: want when one of its DNS SANs equals it, else the first DNS SAN that is a sidecar id; cn:
 * its subject CN. Only names that are sidecar ids (1-100 of A-Z a-z 0-9 . _ -) count. Returns 1
 * with out set, or 0 with why saying what it has instead.
 */
int sc_tls_cert_identity(const struct x509_st *cert, enum sc_peer_identity source,
			 const char *want, char out[SC_NAME_MAX],
			 char trust_domain[SC_TLS_TRUST_DOMAIN_MAX], char *why, size_t why_cap);
/* cert's serial number in hex, upper case ("" when cert is NULL), and its notBefore/notAfter in
 * unix seconds (0 where unreadable). Pure; for the peer and the gRPC certificates alike. */
void sc_tls_cert_serial(const struct x509_st *cert, char *out, size_t cap);
void sc_tls_cert_validity(const struct x509_st *cert, int64_t *not_before, int64_t *not_after);
/* Does the verified certificate of fd's peer name an identity (want: as above)? out: it, or "".
 * A SPIFFE ID from another trust domain than ours names none. */
int sc_peer_tls_peer_identity(struct sc_peer_tls *tls, int fd, const char *want, char *out,
			      size_t cap);
/*
 * The serving side, after the hello: the certificate of fd's peer must name the id its hello
 * claimed. 0 when it does (or tls is NULL, or --peer-identity off, or it names none and identity
 * is not required: logged, rate-limited); else -1 with PERMISSION_DENIED "peer certificate names
 * sidecar "M" but its hello claims "B"", or that it names none under --peer-identity-required, or
 * that its SPIFFE trust domain is not ours, after telling the peer why (an ERROR frame, within
 * w), as sc_peer_hello_server does.
 */
int sc_peer_tls_check_claim(struct sc_peer_tls *tls, int fd, const char *claimed,
			    const struct sc_peer_wait *w, const char *what, struct sc_err *err);
/*
 * The dialing side, after the hello: out = the identity the certificate of the sidecar reached
 * names ("" when none, or without TLS or identity). Errors as sc_peer_tls_check_claim for a
 * certificate that names none (required) or another trust domain.
 */
int sc_peer_tls_reached(struct sc_peer_tls *tls, int fd, const char *claimed, const char *what,
			char out[SC_NAME_MAX], struct sc_err *err);

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

/* Has TLS on fd read ahead bytes the socket no longer shows (OpenSSL's buffer; not with kernel
 * TLS receive)? A connection parked for its next request must not have any: epoll would not see
 * them. False for a plain connection. The thread that owns the connection. */
bool sc_peer_tls_pending(int fd);

/* Free the TLS state attached to fd (if any), then close(fd). fd < 0: nothing. */
void sc_peer_tls_close(int fd);

/* OpenSSL's reason for the last failed read or write on fd ("tlsv13 alert certificate
 * required"), or NULL. */
const char *sc_peer_tls_last_error(int fd);

#endif
