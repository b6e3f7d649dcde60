/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer_tls.c: TLS 1.3 with mutual certificate verification for the peer data channel, on
 * OpenSSL 3.0 with kernel TLS offload where the kernel and OpenSSL allow it (see peer_tls.h).
 * Owns the SSL_CTX (shared, read-only after create) and the table that maps a connection's fd to
 * its SSL and to which directions kTLS took over. Runs on the thread that owns the connection:
 * peer server connection threads, tcp backend workers, the ibverbs rendezvous.
 */
#include "peer_tls.h"

#include "log.h"
#include "timer.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#define REASON_MAX 200
#define READ_BUFFER_LEN (256u * 1024u)

/* The stream layered under every fd once a context exists (defined with the I/O below). */
static const struct sc_peer_stream tls_stream;

struct sc_peer_tls {
	SSL_CTX *ctx;
	/* what kTLS can do here, probed at create: why a direction stays in userspace */
	char why_no_tx[REASON_MAX];
	char why_no_rx[REASON_MAX];
	bool kernel_tls; /* the kernel offers the tls ULP */
	/* Mode strings for the 4 combinations of (tx offloaded, rx offloaded). */
	char modes[4][3 * REASON_MAX];
	atomic_int last_mode; /* -1: no handshake yet */
};

struct link {
	SSL *ssl;
	bool ktls_tx, ktls_rx;
	char why[REASON_MAX]; /* OpenSSL's reason for the last failed read or write */
};

static _Atomic(struct link *) g_links[SC_PEER_TLS_MAX_FD];

/* OpenSSL's most recent reason on this thread, or `fallback`. Clears the queue. */
static void ssl_reason(char *out, size_t cap, const char *fallback)
{
	unsigned long e = ERR_peek_last_error();
	if (e) {
		char buf[256];
		ERR_error_string_n(e, buf, sizeof(buf));
		const char *r = ERR_reason_error_string(e);
		snprintf(out, cap, "%s", r ? r : buf);
	} else {
		snprintf(out, cap, "%s", fallback);
	}
	ERR_clear_error();
}

/* Does the kernel offer the "tls" upper-layer protocol? Fills why when it does not. */
static bool kernel_has_tls(char *why, size_t cap)
{
	FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_ulp", "re");
	if (!f) {
		snprintf(why, cap, "cannot read /proc/sys/net/ipv4/tcp_available_ulp: %s",
			 strerror(errno));
		return false;
	}
	char line[256] = "";
	if (!fgets(line, sizeof(line), f))
		line[0] = '\0';
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	for (char *save = NULL, *tok = strtok_r(line, " ", &save); tok;
	     tok = strtok_r(NULL, " ", &save)) {
		if (strcmp(tok, "tls") == 0)
			return true;
	}
	snprintf(why, cap, "the kernel has no tls module (tcp_available_ulp: %s; try modprobe tls)",
		 line[0] ? line : "empty");
	return false;
}

static void build_modes(struct sc_peer_tls *t)
{
	snprintf(t->modes[3], sizeof(t->modes[3]), "kTLS tx+rx");
	snprintf(t->modes[1], sizeof(t->modes[1]), "kTLS tx, userspace rx (kTLS rx unavailable: %s)",
		 t->why_no_rx);
	snprintf(t->modes[2], sizeof(t->modes[2]), "kTLS rx, userspace tx (kTLS tx unavailable: %s)",
		 t->why_no_tx);
	if (strcmp(t->why_no_tx, t->why_no_rx) == 0)
		snprintf(t->modes[0], sizeof(t->modes[0]), "userspace (kTLS unavailable: %s)",
			 t->why_no_tx);
	else
		snprintf(t->modes[0], sizeof(t->modes[0]),
			 "userspace (kTLS unavailable: tx: %s; rx: %s)", t->why_no_tx,
			 t->why_no_rx);
}

int sc_peer_tls_create(const struct sc_config *cfg, struct sc_peer_tls **out, struct sc_err *err)
{
	*out = NULL;
	bool have_cert = cfg->peer_tls_cert && cfg->peer_tls_cert[0];
	bool have_key = cfg->peer_tls_key && cfg->peer_tls_key[0];
	bool have_ca = cfg->peer_tls_ca && cfg->peer_tls_ca[0];
	if (!have_cert && !have_key && !have_ca)
		return 0;
	if (!have_cert || !have_key || !have_ca)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "peer TLS needs all of --peer-tls-cert, --peer-tls-key and "
				  "--peer-tls-ca; missing:%s%s%s",
				  have_cert ? "" : " --peer-tls-cert", have_key ? "" : " --peer-tls-key",
				  have_ca ? "" : " --peer-tls-ca");
	struct sc_peer_tls *t = calloc(1, sizeof(*t));
	if (!t)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	atomic_init(&t->last_mode, -1);
	char reason[REASON_MAX];
	ERR_clear_error();
	t->ctx = SSL_CTX_new(TLS_method());
	if (!t->ctx) {
		ssl_reason(reason, sizeof(reason), "unknown");
		sc_err_set(err, SC_INTERNAL, "cannot create the peer TLS context: %s", reason);
		goto fail;
	}
	SSL_CTX_set_min_proto_version(t->ctx, TLS1_3_VERSION);
	/* AES-128-GCM first: the fastest with AES-NI, and what every kTLS implementation offloads. */
	SSL_CTX_set_ciphersuites(t->ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
					 "TLS_CHACHA20_POLY1305_SHA256");
	SSL_CTX_set_options(t->ctx, SSL_OP_ENABLE_KTLS | SSL_OP_IGNORE_UNEXPECTED_EOF |
					    SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
					 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/* No session tickets: nothing arrives after the handshake that the hello would trip on,
	 * and an idle pooled connection never has bytes waiting. */
	SSL_CTX_set_num_tickets(t->ctx, 0);
	/* Userspace receive: read whole socket buffers, not one 5-byte header and one record per
	 * recv (halves the system calls of a bulk transfer). */
	SSL_CTX_set_read_ahead(t->ctx, 1);
	SSL_CTX_set_default_read_buffer_len(t->ctx, READ_BUFFER_LEN);
	SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_OFF);
	if (SSL_CTX_use_certificate_chain_file(t->ctx, cfg->peer_tls_cert) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-cert %s: cannot load the certificate (PEM): %s",
			   cfg->peer_tls_cert, reason);
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(t->ctx, cfg->peer_tls_key, SSL_FILETYPE_PEM) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-key %s: cannot load the private key (PEM): %s",
			   cfg->peer_tls_key, reason);
		goto fail;
	}
	if (SSL_CTX_check_private_key(t->ctx) != 1) {
		ssl_reason(reason, sizeof(reason), "mismatch");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-key %s does not match --peer-tls-cert %s: %s",
			   cfg->peer_tls_key, cfg->peer_tls_cert, reason);
		goto fail;
	}
	if (SSL_CTX_load_verify_locations(t->ctx, cfg->peer_tls_ca, NULL) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-ca %s: cannot load the CA certificate(s) (PEM): %s",
			   cfg->peer_tls_ca, reason);
		goto fail;
	}
	SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);

	char why[REASON_MAX];
	t->kernel_tls = kernel_has_tls(why, sizeof(why));
	if (!t->kernel_tls) {
		snprintf(t->why_no_tx, sizeof(t->why_no_tx), "%s", why);
		snprintf(t->why_no_rx, sizeof(t->why_no_rx), "%s", why);
	} else {
		snprintf(t->why_no_tx, sizeof(t->why_no_tx),
			 "OpenSSL did not enable it for this connection");
		if (OPENSSL_VERSION_NUMBER < 0x30200000L)
			snprintf(t->why_no_rx, sizeof(t->why_no_rx),
				 "OpenSSL %s offloads only the sending side of TLS 1.3",
				 OPENSSL_VERSION_TEXT);
		else
			snprintf(t->why_no_rx, sizeof(t->why_no_rx),
				 "OpenSSL did not enable it for this connection");
	}
	build_modes(t);
	sc_peer_set_stream(&tls_stream); /* before any fd carries TLS state */
	SC_INFO("peer", "peer TLS on (TLS 1.3, certificates verified against %s); expected: %s",
		cfg->peer_tls_ca, sc_peer_tls_mode(t));
	*out = t;
	return 0;
fail:
	sc_peer_tls_destroy(t);
	return -1;
}

void sc_peer_tls_destroy(struct sc_peer_tls *tls)
{
	if (!tls)
		return;
	SSL_CTX_free(tls->ctx);
	free(tls);
}

const char *sc_peer_tls_mode(const struct sc_peer_tls *tls)
{
	int m = atomic_load(&tls->last_mode);
	if (m >= 0)
		return tls->modes[m];
	/* Before any handshake: what the probe at create expects (kTLS sends where the kernel has
	 * the tls module). */
	return tls->modes[tls->kernel_tls ? 1 : 0];
}

/* ---- handshake ------------------------------------------------------------------------------- */

static enum sc_peer_io check_wait(const struct sc_peer_wait *w)
{
	if (!w)
		return SC_PEER_IO_OK;
	if ((w->cancel && atomic_load_explicit(w->cancel, memory_order_relaxed)) ||
	    (w->stop && atomic_load_explicit(w->stop, memory_order_relaxed)))
		return SC_PEER_IO_CANCELLED;
	if (w->deadline_mono_ms && sc_clock_mono_ms() >= w->deadline_mono_ms)
		return SC_PEER_IO_DEADLINE;
	return SC_PEER_IO_OK;
}

/*
 * Server side, before OpenSSL reads anything: a plain rdma-sidecar peer opens with a frame of
 * version 1, where a TLS client opens with a handshake record (0x16). Tell a plain peer in its
 * own framing why it is refused, so its operation fails with a message that says what to do.
 */
static int refuse_plain_peer(int fd, const struct sc_peer_wait *w, const char *what,
			     struct sc_err *err)
{
	uint8_t first = 0;
	for (;;) {
		ssize_t n = recv(fd, &first, 1, MSG_PEEK);
		if (n == 1)
			break;
		if (n == 0)
			return sc_err_set(err, SC_UNAVAILABLE,
					  "%s closed the connection before the TLS handshake",
					  what);
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return sc_err_set(err, SC_UNAVAILABLE, "connection to %s failed: %s", what,
					  strerror(errno));
		enum sc_peer_io rc = check_wait(w);
		if (rc != SC_PEER_IO_OK)
			return sc_peer_io_err(rc, 0, what, err);
	}
	if (first == 0x16)
		return 0;
	struct sc_err why;
	if (first == SC_PEER_VERSION)
		sc_err_set(&why, SC_UNAVAILABLE,
			   "this data port requires TLS (--peer-tls-cert/--peer-tls-key/"
			   "--peer-tls-ca): start the dialing sidecar with peer TLS and a "
			   "certificate from the same cluster CA");
	else
		sc_err_set(&why, SC_UNAVAILABLE, "not a TLS handshake (first byte 0x%02x)", first);
	if (first == SC_PEER_VERSION) {
		struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = (uint32_t)why.code};
		snprintf(m.text, sizeof(m.text), "%s", why.msg);
		struct sc_peer_wait quick = {.deadline_mono_ms = sc_clock_mono_ms() + 500};
		sc_peer_send_msg(fd, &m, &quick, what, NULL);
		return sc_err_set(err, SC_UNAVAILABLE,
				  "%s speaks plain TCP but this data port requires TLS "
				  "(--peer-tls-*): refused",
				  what);
	}
	return sc_err_set(err, SC_UNAVAILABLE, "%s: %s: refused", what, why.msg);
}

static int handshake(struct sc_peer_tls *tls, int fd, bool server, const struct sc_peer_wait *w,
		     const char *what, struct sc_err *err)
{
	if (fd < 0 || fd >= SC_PEER_TLS_MAX_FD)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "TLS with %s: descriptor %d is over the TLS table's %d entries "
				  "(too many open connections)",
				  what, fd, SC_PEER_TLS_MAX_FD);
	if (server && refuse_plain_peer(fd, w, what, err) != 0)
		return -1;
	ERR_clear_error();
	struct link *l = calloc(1, sizeof(*l));
	SSL *ssl = SSL_new(tls->ctx);
	if (!l || !ssl || SSL_set_fd(ssl, fd) != 1) {
		free(l);
		SSL_free(ssl);
		ERR_clear_error();
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "TLS with %s: out of memory", what);
	}
	for (;;) {
		ERR_clear_error();
		errno = 0;
		int r = server ? SSL_accept(ssl) : SSL_connect(ssl);
		int sys = errno;
		if (r == 1)
			break;
		int e = SSL_get_error(ssl, r);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			enum sc_peer_io rc = check_wait(w);
			if (rc == SC_PEER_IO_OK)
				continue;
			sc_peer_io_err(rc, 0, what, err);
			sc_err_prefix(err, "TLS handshake");
			goto fail;
		}
		char reason[REASON_MAX];
		long vr = SSL_get_verify_result(ssl);
		if (vr != X509_V_OK) {
			snprintf(reason, sizeof(reason),
				 "its certificate does not verify against --peer-tls-ca: %s",
				 X509_verify_cert_error_string(vr));
			ERR_clear_error();
		} else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN) {
			snprintf(reason, sizeof(reason), "%s",
				 sys ? strerror(sys) : "the peer closed the connection");
			ERR_clear_error();
		} else {
			ssl_reason(reason, sizeof(reason), "protocol error");
		}
		sc_err_set(err, SC_UNAVAILABLE,
			   "TLS handshake with %s failed: %s (both sidecars need --peer-tls-cert, "
			   "--peer-tls-key and --peer-tls-ca with certificates from the same CA)",
			   what, reason);
		goto fail;
	}
	l->ssl = ssl;
	l->ktls_tx = BIO_get_ktls_send(SSL_get_wbio(ssl));
	l->ktls_rx = BIO_get_ktls_recv(SSL_get_rbio(ssl));
	int mode = (l->ktls_tx ? 1 : 0) | (l->ktls_rx ? 2 : 0);
	int prev = atomic_exchange(&tls->last_mode, mode);
	if (prev != mode)
		SC_INFO("peer", "peer TLS: %s", tls->modes[mode]);
	struct link *old = atomic_exchange_explicit(&g_links[fd], l, memory_order_acq_rel);
	if (old) { /* a stale entry: its fd was closed without sc_peer_tls_close */
		SSL_free(old->ssl);
		free(old);
	}
	return 0;
fail:
	SSL_free(ssl);
	free(l);
	return -1;
}

int sc_peer_tls_client(struct sc_peer_tls *tls, int fd, const struct sc_peer_wait *w,
		       const char *what, struct sc_err *err)
{
	return handshake(tls, fd, false, w, what, err);
}

int sc_peer_tls_server(struct sc_peer_tls *tls, int fd, const struct sc_peer_wait *w,
		       const char *what, struct sc_err *err)
{
	return handshake(tls, fd, true, w, what, err);
}

void sc_peer_tls_close(int fd)
{
	if (fd < 0)
		return;
	if (fd < SC_PEER_TLS_MAX_FD) {
		struct link *l = atomic_exchange_explicit(&g_links[fd], NULL, memory_order_acq_rel);
		if (l) {
			SSL_free(l->ssl);
			free(l);
		}
	}
	close(fd);
}

/* ---- I/O ------------------------------------------------------------------------------------- */

static struct link *link_of(int fd)
{
	if (fd < 0 || fd >= SC_PEER_TLS_MAX_FD)
		return NULL;
	return atomic_load_explicit(&g_links[fd], memory_order_acquire);
}

static bool tls_user_rx(void *ctx, int fd)
{
	(void)ctx;
	struct link *l = link_of(fd);
	return l && !l->ktls_rx;
}

static bool tls_user_tx(void *ctx, int fd)
{
	(void)ctx;
	struct link *l = link_of(fd);
	return l && !l->ktls_tx;
}

/* After SSL_read/SSL_write returned r <= 0: 0 for EOF, else -1 with errno. */
static ssize_t io_fail(struct link *l, int r, int sys)
{
	int e = SSL_get_error(l->ssl, r);
	if (e == SSL_ERROR_SSL)
		ssl_reason(l->why, sizeof(l->why), "bad TLS record");
	ERR_clear_error();
	switch (e) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE:
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_SYSCALL:
		if (sys == 0)
			return 0;
		errno = sys;
		return -1;
	default:
		errno = EPROTO; /* a bad record: tampering, or not TLS */
		return -1;
	}
}

static ssize_t tls_recv(void *ctx, int fd, void *buf, size_t len)
{
	(void)ctx;
	struct link *l = link_of(fd);
	if (!l) {
		errno = EBADF;
		return -1;
	}
	ERR_clear_error();
	errno = 0;
	int r = SSL_read(l->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
	int sys = errno;
	if (r > 0)
		return r;
	return io_fail(l, r, sys);
}

static ssize_t tls_send(void *ctx, int fd, const void *buf, size_t len)
{
	(void)ctx;
	struct link *l = link_of(fd);
	if (!l) {
		errno = EBADF;
		return -1;
	}
	ERR_clear_error();
	errno = 0;
	int r = SSL_write(l->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
	int sys = errno;
	if (r > 0)
		return r;
	ssize_t rc = io_fail(l, r, sys);
	if (rc == 0) { /* no EOF on a write: the peer reset or closed */
		errno = EPIPE;
		rc = -1;
	}
	return rc;
}

/* Layered under every fd by sc_peer_tls_create: peer_proto's blocking I/O goes through it. */
static const struct sc_peer_stream tls_stream = {
	.user_rx = tls_user_rx,
	.user_tx = tls_user_tx,
	.recv = tls_recv,
	.send = tls_send,
};

const char *sc_peer_tls_last_error(int fd)
{
	struct link *l = link_of(fd);
	return l && l->why[0] ? l->why : NULL;
}
