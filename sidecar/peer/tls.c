/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/tls.c: TLS 1.3 with mutual certificate verification for the peer data channel, on
 * OpenSSL 3.0 with kernel TLS offload where the kernel and OpenSSL allow it (see peer/tls.h).
 * Owns the SSL_CTX (swapped whole when the certificate files change: handshakes take a reference
 * under a lock, connections keep the context they began with), the table that maps a connection's
 * fd to its SSL and to which directions kTLS took over, and the names in certificates that are
 * sidecar ids (--peer-identity: SPIFFE ID, DNS SAN or CN) with the checks built on them.
 * Runs on the thread that owns the connection: peer server connection threads, tcp backend
 * workers, the ibverbs rendezvous; reloads run on its own watch thread (every
 * --tls-reload-interval) and on the main thread (SIGHUP).
 */
#include "peer/tls.h"
#include "os/file_sig.h"

#include "os/fault_guard.h"
#include "base/log.h"
#include "base/timer.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#define REASON_MAX 200
#define READ_BUFFER_LEN (256u * 1024u)

/* The stream layered under every fd once a context exists (defined with the I/O below). */
static const struct sc_peer_stream tls_stream;

enum { F_CERT, F_KEY, F_CA, N_FILES };

struct sc_peer_tls {
	/* Guards ctx and info: a handshake takes a reference to ctx (SSL_new), a reload swaps it;
	 * connections made with the old one keep it alive (OpenSSL counts them) until they end. */
	pthread_mutex_t mu;
	SSL_CTX *ctx;
	struct sc_tls_cert_info info;		    /* this sidecar's certificate, as loaded */
	char trust_domain[SC_TLS_TRUST_DOMAIN_MAX]; /* spiffe: ours; "" when ours names none */
	char self_id[SC_NAME_MAX];
	enum sc_peer_identity source;
	bool required;
	char *paths[N_FILES];
	/* Reloads (watch thread, SIGHUP on the main thread) one at a time. */
	pthread_mutex_t reload_mu;
	struct sc_file_sig sigs[N_FILES]; /* under reload_mu: what the last load attempt saw */
	/* The watch thread: stat the files every watch_ms. */
	pthread_mutex_t watch_mu;
	pthread_cond_t watch_cv;
	pthread_t watch_thread;
	bool watching, watch_stop;
	uint64_t watch_ms;
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
	/* Userspace TLS never hands OpenSSL the caller's buffer: that is region memory more often
	 * than not, and a worker may truncate its file, so the bytes go through here, copied in or
	 * out with the guarded copy (a fault cannot be caught inside OpenSSL: no longjmp out of
	 * it). One record's plaintext: SSL_read returns at most one record, and SSL_write (partial
	 * writes on) returns after each, so a larger buffer would save no call. */
	uint8_t bounce[SSL3_RT_MAX_PLAIN_LENGTH];
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

/* ---- certificates and the names in them ------------------------------------------------------ */

/*
 * A SPIFFE ID "spiffe://TRUST-DOMAIN/PATH": the trust domain (lower-case letters, digits, . - _)
 * and the last path segment, which must be a sidecar id. False when uri is not one.
 */
static bool parse_spiffe(const char *uri, size_t len, char *td, size_t td_cap, char *id,
			 size_t id_cap)
{
	static const char scheme[] = "spiffe://";
	if (len <= sizeof(scheme) - 1 || strncmp(uri, scheme, sizeof(scheme) - 1) != 0)
		return false;
	const char *p = uri + sizeof(scheme) - 1, *end = uri + len;
	const char *slash = memchr(p, '/', (size_t)(end - p));
	if (!slash || slash == p || (size_t)(slash - p) >= td_cap)
		return false;
	for (const char *q = p; q < slash; q++)
		if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '.' ||
		      *q == '-' || *q == '_'))
			return false;
	const char *last = slash + 1;
	for (const char *q = slash + 1; q < end; q++) {
		if (*q == '?' || *q == '#' || *q == '\0')
			return false;
		if (*q == '/')
			last = q + 1;
	}
	size_t id_len = (size_t)(end - last);
	if (!sc_config_id_valid(last, id_len) || id_len >= id_cap)
		return false;
	memcpy(td, p, (size_t)(slash - p));
	td[slash - p] = '\0';
	memcpy(id, last, id_len);
	id[id_len] = '\0';
	return true;
}

int sc_tls_cert_identity(const struct x509_st *cert, enum sc_peer_identity source, const char *want,
			 char out[SC_NAME_MAX], char trust_domain[SC_TLS_TRUST_DOMAIN_MAX],
			 char *why, size_t why_cap)
{
	out[0] = '\0';
	if (trust_domain)
		trust_domain[0] = '\0';
	snprintf(why, why_cap, "no certificate");
	if (!cert || source == SC_PEER_IDENTITY_OFF) {
		if (cert)
			snprintf(why, why_cap, "--peer-identity off");
		return 0;
	}
	X509 *x = (X509 *)cert; /* OpenSSL 3.0's getters take non-const */
	if (source == SC_PEER_IDENTITY_CN) {
		char cn[256];
		int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn,
						  sizeof(cn));
		if (n <= 0) {
			snprintf(why, why_cap, "its subject has no CN");
			return 0;
		}
		if (!sc_config_id_valid(cn, strlen(cn)) || (size_t)n != strlen(cn)) {
			snprintf(why, why_cap, "its CN \"%.100s\" is not a sidecar id", cn);
			return 0;
		}
		snprintf(out, SC_NAME_MAX, "%s", cn);
		return 1;
	}
	GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	int found = 0, seen = 0;
	char first_bad[120] = "";
	for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && found == 0; i++) {
		const GENERAL_NAME *gn = sk_GENERAL_NAME_value(sans, i);
		if (source == SC_PEER_IDENTITY_SPIFFE && gn->type == GEN_URI) {
			const char *uri =
			    (const char *)ASN1_STRING_get0_data(gn->d.uniformResourceIdentifier);
			size_t len = (size_t)ASN1_STRING_length(gn->d.uniformResourceIdentifier);
			if (len < 9 || strncmp(uri, "spiffe://", 9) != 0)
				continue;
			seen++;
			char td[SC_TLS_TRUST_DOMAIN_MAX];
			if (parse_spiffe(uri, len, td, sizeof(td), out, SC_NAME_MAX)) {
				if (trust_domain)
					snprintf(trust_domain, SC_TLS_TRUST_DOMAIN_MAX, "%s", td);
				found = 1;
			} else if (!first_bad[0]) {
				snprintf(first_bad, sizeof(first_bad), "%.*s",
					 (int)(len > 100 ? 100 : len), uri);
			}
		} else if (source == SC_PEER_IDENTITY_DNS && gn->type == GEN_DNS) {
			const char *dns = (const char *)ASN1_STRING_get0_data(gn->d.dNSName);
			size_t len = (size_t)ASN1_STRING_length(gn->d.dNSName);
			seen++;
			if (!sc_config_id_valid(dns, len))
				continue;
			if (want && strlen(want) == len && memcmp(dns, want, len) == 0) {
				snprintf(out, SC_NAME_MAX, "%s", want);
				found = 1;
			} else if (!out[0]) {
				snprintf(out, SC_NAME_MAX, "%.*s", (int)len, dns); /* first valid */
			}
		}
	}
	GENERAL_NAMES_free(sans);
	if (found)
		return 1;
	if (source == SC_PEER_IDENTITY_DNS) {
		if (out[0])
			return 1; /* names another id than want */
		snprintf(why, why_cap, "%s",
			 seen ? "none of its DNS names is a sidecar id"
			      : "it has no DNS subject alternative name");
		return 0;
	}
	if (first_bad[0])
		snprintf(why, why_cap, "its SPIFFE ID %s does not end in a sidecar id", first_bad);
	else
		snprintf(why, why_cap,
			 "it has no SPIFFE ID (URI SAN spiffe://TRUST-DOMAIN/.../ID)");
	return 0;
}

void sc_tls_cert_serial(const struct x509_st *cert, char *out, size_t cap)
{
	BIGNUM *bn = cert ? ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL) : NULL;
	char *hex = bn ? BN_bn2hex(bn) : NULL;
	snprintf(out, cap, "%s", hex ? hex : "");
	OPENSSL_free(hex);
	BN_free(bn);
}

static int64_t asn1_time_unix(const ASN1_TIME *t)
{
	struct tm tm;
	return t && ASN1_TIME_to_tm(t, &tm) == 1 ? (int64_t)timegm(&tm) : 0;
}

void sc_tls_cert_validity(const struct x509_st *cert, int64_t *not_before, int64_t *not_after)
{
	*not_before = cert ? asn1_time_unix(X509_get0_notBefore(cert)) : 0;
	*not_after = cert ? asn1_time_unix(X509_get0_notAfter(cert)) : 0;
}

/* Serial (hex), validity and identity of this sidecar's certificate. */
static void cert_info(X509 *x, enum sc_peer_identity source, const char *self_id,
		      struct sc_tls_cert_info *info, char *td, char *why, size_t why_cap)
{
	memset(info, 0, sizeof(*info));
	sc_tls_cert_serial(x, info->serial, sizeof(info->serial));
	sc_tls_cert_validity(x, &info->not_before, &info->not_after);
	info->has_identity =
	    sc_tls_cert_identity(x, source, self_id, info->identity, td, why, why_cap) == 1;
}

/*
 * A context from the files, with this sidecar's certificate checked: loads, matches its key, is
 * valid now, and names --id (or nothing, unless required). Fills *info and td.
 */
static int load_ctx(const struct sc_peer_tls *t, SSL_CTX **out, struct sc_tls_cert_info *info,
		    char td[SC_TLS_TRUST_DOMAIN_MAX], struct sc_err *err)
{
	*out = NULL;
	char reason[REASON_MAX];
	ERR_clear_error();
	SSL_CTX *ctx = SSL_CTX_new(TLS_method());
	if (!ctx) {
		ssl_reason(reason, sizeof(reason), "unknown");
		return sc_err_set(err, SC_INTERNAL, "cannot create the peer TLS context: %s",
				  reason);
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	/* AES-128-GCM first: the fastest with AES-NI, and what every kTLS implementation offloads. */
	SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
				      "TLS_CHACHA20_POLY1305_SHA256");
	SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS | SSL_OP_IGNORE_UNEXPECTED_EOF |
				     SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/* No session tickets: nothing arrives after the handshake that the hello would trip on,
	 * and an idle pooled connection never has bytes waiting. */
	SSL_CTX_set_num_tickets(ctx, 0);
	/* Userspace receive: read whole socket buffers, not one 5-byte header and one record per
	 * recv (halves the system calls of a bulk transfer). */
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_default_read_buffer_len(ctx, READ_BUFFER_LEN);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	const char *cert = t->paths[F_CERT], *key = t->paths[F_KEY], *ca = t->paths[F_CA];
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-cert %s: cannot load the certificate (PEM): %s", cert,
			   reason);
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-key %s: cannot load the private key (PEM): %s", key, reason);
		goto fail;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ssl_reason(reason, sizeof(reason), "mismatch");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-key %s does not match --peer-tls-cert %s: %s", key, cert,
			   reason);
		goto fail;
	}
	if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
		ssl_reason(reason, sizeof(reason), "unreadable");
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-ca %s: cannot load the CA certificate(s) (PEM): %s", ca,
			   reason);
		goto fail;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);

	X509 *own = SSL_CTX_get0_certificate(ctx);
	char why[REASON_MAX];
	cert_info(own, t->source, t->self_id, info, td, why, sizeof(why));
	if (X509_cmp_current_time(X509_get0_notAfter(own)) < 0) {
		sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "--peer-tls-cert %s: this sidecar's certificate (serial %s) has expired: "
		    "renew it",
		    cert, info->serial);
		goto fail;
	}
	if (X509_cmp_current_time(X509_get0_notBefore(own)) > 0) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-cert %s: this sidecar's certificate (serial %s) is not yet "
			   "valid (check the clock)",
			   cert, info->serial);
		goto fail;
	}
	if (info->has_identity && strcmp(info->identity, t->self_id) != 0) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-tls-cert %s names sidecar \"%s\" (--peer-identity %s), but --id "
			   "is \"%s\": start this sidecar with --id %s, or give it its own "
			   "certificate",
			   cert, info->identity, sc_peer_identity_name(t->source), t->self_id,
			   info->identity);
		goto fail;
	}
	if (!info->has_identity && t->required) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "--peer-identity-required: --peer-tls-cert %s names no sidecar identity "
			   "(--peer-identity %s: %s)",
			   cert, sc_peer_identity_name(t->source), why);
		goto fail;
	}
	*out = ctx;
	return 0;
fail:
	SSL_CTX_free(ctx);
	return -1;
}

int sc_peer_tls_create(const struct sc_config *cfg, struct sc_peer_tls **out, struct sc_err *err)
{
	*out = NULL;
	bool have_cert = cfg->peer_tls_cert && cfg->peer_tls_cert[0];
	bool have_key = cfg->peer_tls_key && cfg->peer_tls_key[0];
	bool have_ca = cfg->peer_tls_ca && cfg->peer_tls_ca[0];
	if (!have_cert && !have_key && !have_ca) {
		if (cfg->peer_identity_required)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "--peer-identity-required needs peer TLS "
					  "(--peer-tls-cert, --peer-tls-key and --peer-tls-ca)");
		return 0;
	}
	if (!have_cert || !have_key || !have_ca)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "peer TLS needs all of --peer-tls-cert, --peer-tls-key and "
				  "--peer-tls-ca; missing:%s%s%s",
				  have_cert ? "" : " --peer-tls-cert",
				  have_key ? "" : " --peer-tls-key",
				  have_ca ? "" : " --peer-tls-ca");
	struct sc_peer_tls *t = calloc(1, sizeof(*t));
	if (!t)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	atomic_init(&t->last_mode, -1);
	pthread_mutex_init(&t->mu, NULL);
	pthread_mutex_init(&t->reload_mu, NULL);
	pthread_mutex_init(&t->watch_mu, NULL);
	sc_cond_init_mono(&t->watch_cv);
	snprintf(t->self_id, sizeof(t->self_id), "%s", cfg->id ? cfg->id : "");
	t->source = cfg->peer_identity;
	t->required = cfg->peer_identity_required;
	t->paths[F_CERT] = strdup(cfg->peer_tls_cert);
	t->paths[F_KEY] = strdup(cfg->peer_tls_key);
	t->paths[F_CA] = strdup(cfg->peer_tls_ca);
	if (!t->paths[F_CERT] || !t->paths[F_KEY] || !t->paths[F_CA]) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	for (int i = 0; i < N_FILES; i++)
		sc_file_sig_of(t->paths[i], &t->sigs[i]);
	if (load_ctx(t, &t->ctx, &t->info, t->trust_domain, err) != 0)
		goto fail;
	if (t->source != SC_PEER_IDENTITY_OFF && !t->info.has_identity)
		SC_WARN("peer",
			"--peer-tls-cert %s names no sidecar identity (--peer-identity %s): peers "
			"take this sidecar's id as its hello claims it; give it a certificate that "
			"names \"%s\"",
			t->paths[F_CERT], sc_peer_identity_name(t->source), t->self_id);

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
	SC_INFO("peer",
		"peer TLS on (TLS 1.3, certificates verified against %s; certificate serial %s, "
		"identity %s, expires %lld); expected: %s",
		cfg->peer_tls_ca, t->info.serial,
		t->info.has_identity ? t->info.identity : "(none)", (long long)t->info.not_after,
		sc_peer_tls_mode(t));
	*out = t;
	return 0;
fail:
	sc_peer_tls_destroy(t);
	return -1;
}

/* ---- reloading ------------------------------------------------------------------------------- */

int sc_peer_tls_reload(struct sc_peer_tls *tls, bool force, struct sc_err *err)
{
	pthread_mutex_lock(&tls->reload_mu);
	struct sc_file_sig now[N_FILES];
	bool changed = false;
	for (int i = 0; i < N_FILES; i++) {
		sc_file_sig_of(tls->paths[i], &now[i]);
		changed |= !sc_file_sig_eq(&now[i], &tls->sigs[i]);
	}
	if (!changed && !force) {
		pthread_mutex_unlock(&tls->reload_mu);
		return 0;
	}
	/* Remember what this attempt saw: a file that fails to load is tried again when it
	 * changes again (or on SIGHUP), not logged every interval. */
	memcpy(tls->sigs, now, sizeof(now));
	SSL_CTX *ctx;
	struct sc_tls_cert_info info;
	char td[SC_TLS_TRUST_DOMAIN_MAX];
	struct sc_err scratch;
	if (!err)
		err = &scratch;
	if (load_ctx(tls, &ctx, &info, td, err) != 0) {
		pthread_mutex_unlock(&tls->reload_mu);
		SC_ERROR("peer", "peer TLS: keeping the current certificate (serial %s): %s",
			 tls->info.serial, err->msg);
		return -1;
	}
	pthread_mutex_lock(&tls->mu);
	SSL_CTX *old = tls->ctx;
	tls->ctx = ctx;
	tls->info = info;
	snprintf(tls->trust_domain, sizeof(tls->trust_domain), "%s", td);
	pthread_mutex_unlock(&tls->mu);
	pthread_mutex_unlock(&tls->reload_mu);
	SSL_CTX_free(old); /* live connections hold their own references */
	SC_INFO("peer",
		"peer TLS: loaded certificate serial %s (identity %s, expires %lld) from %s; new "
		"connections use it",
		info.serial, info.has_identity ? info.identity : "(none)",
		(long long)info.not_after, tls->paths[F_CERT]);
	return 1;
}

static void *watch_main(void *arg)
{
	struct sc_peer_tls *t = arg;
	pthread_mutex_lock(&t->watch_mu);
	while (!t->watch_stop) {
		uint64_t until = sc_clock_mono_after_ms(t->watch_ms);
		while (!t->watch_stop &&
		       sc_cond_wait_until_mono(&t->watch_cv, &t->watch_mu, until) != ETIMEDOUT)
			;
		if (t->watch_stop)
			break;
		pthread_mutex_unlock(&t->watch_mu);
		sc_peer_tls_reload(t, false, NULL);
		pthread_mutex_lock(&t->watch_mu);
	}
	pthread_mutex_unlock(&t->watch_mu);
	return NULL;
}

int sc_peer_tls_watch(struct sc_peer_tls *tls, uint64_t interval_ms, struct sc_err *err)
{
	if (!tls || interval_ms == 0 || tls->watching)
		return 0;
	tls->watch_ms = interval_ms;
	int rc = pthread_create(&tls->watch_thread, NULL, watch_main, tls);
	if (rc != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot start the peer TLS file watch: %s",
				  strerror(rc));
	tls->watching = true;
	return 0;
}

void sc_peer_tls_info(struct sc_peer_tls *tls, struct sc_tls_cert_info *out)
{
	pthread_mutex_lock(&tls->mu);
	*out = tls->info;
	pthread_mutex_unlock(&tls->mu);
}

void sc_peer_tls_destroy(struct sc_peer_tls *tls)
{
	if (!tls)
		return;
	if (tls->watching) {
		pthread_mutex_lock(&tls->watch_mu);
		tls->watch_stop = true;
		pthread_cond_broadcast(&tls->watch_cv);
		pthread_mutex_unlock(&tls->watch_mu);
		pthread_join(tls->watch_thread, NULL);
	}
	SSL_CTX_free(tls->ctx);
	for (int i = 0; i < N_FILES; i++)
		free(tls->paths[i]);
	pthread_cond_destroy(&tls->watch_cv);
	pthread_mutex_destroy(&tls->watch_mu);
	pthread_mutex_destroy(&tls->reload_mu);
	pthread_mutex_destroy(&tls->mu);
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
	/* The current context (a reload may swap it any time): the SSL keeps its own reference. */
	pthread_mutex_lock(&tls->mu);
	SSL *ssl = SSL_new(tls->ctx);
	pthread_mutex_unlock(&tls->mu);
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
		if (vr == X509_V_ERR_CERT_HAS_EXPIRED || vr == X509_V_ERR_CERT_NOT_YET_VALID) {
			snprintf(reason, sizeof(reason), "the certificate of %s %s", what,
				 vr == X509_V_ERR_CERT_HAS_EXPIRED
				     ? "has expired (certificate has expired)"
				     : "is not yet valid (check its notBefore and the clocks)");
			ERR_clear_error();
		} else if (vr != X509_V_OK) {
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
		if (vr == X509_V_ERR_CERT_HAS_EXPIRED || vr == X509_V_ERR_CERT_NOT_YET_VALID)
			sc_err_set(err, SC_UNAVAILABLE,
				   "TLS handshake with %s failed: %s: it must renew its "
				   "--peer-tls-cert",
				   what, reason);
		else
			sc_err_set(err, SC_UNAVAILABLE,
				   "TLS handshake with %s failed: %s (both sidecars need "
				   "--peer-tls-cert, --peer-tls-key and --peer-tls-ca with "
				   "certificates from the same CA)",
				   what, reason);
		goto fail;
	}
	l->ssl = ssl;
	l->ktls_tx = BIO_get_ktls_send(SSL_get_wbio(ssl));
	l->ktls_rx = BIO_get_ktls_recv(SSL_get_rbio(ssl));
	if (sc_log_enabled(SC_LOG_DEBUG)) {
		char ours[SC_TLS_SERIAL_MAX], theirs[SC_TLS_SERIAL_MAX];
		sc_tls_cert_serial(SSL_get_certificate(ssl), ours, sizeof(ours));
		sc_tls_cert_serial(SSL_get0_peer_certificate(ssl), theirs, sizeof(theirs));
		SC_DEBUG("peer", "TLS with %s: presented certificate serial %s, its serial %s",
			 what, ours, theirs);
	}
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

static struct link *link_of(int fd)
{
	if (fd < 0 || fd >= SC_PEER_TLS_MAX_FD)
		return NULL;
	return atomic_load_explicit(&g_links[fd], memory_order_acquire);
}

/* ---- identity -------------------------------------------------------------------------------- */

/*
 * What the verified certificate of fd's peer names (sc_tls_cert_identity with want): 1 with out
 * set, 0 (none; why says what it has), -1: a SPIFFE ID of another trust domain (why says so).
 */
static int peer_identity(struct sc_peer_tls *tls, int fd, const char *want, char out[SC_NAME_MAX],
			 char *why, size_t why_cap)
{
	out[0] = '\0';
	struct link *l = link_of(fd);
	X509 *cert = l ? SSL_get0_peer_certificate(l->ssl) : NULL;
	if (!cert) {
		snprintf(why, why_cap, "it presented no certificate");
		return 0;
	}
	char td[SC_TLS_TRUST_DOMAIN_MAX];
	int rc = sc_tls_cert_identity(cert, tls->source, want, out, td, why, why_cap);
	if (rc != 1 || tls->source != SC_PEER_IDENTITY_SPIFFE)
		return rc;
	pthread_mutex_lock(&tls->mu);
	char ours[SC_TLS_TRUST_DOMAIN_MAX];
	snprintf(ours, sizeof(ours), "%s", tls->trust_domain);
	pthread_mutex_unlock(&tls->mu);
	if (ours[0] && strcmp(ours, td) != 0) {
		snprintf(why, why_cap,
			 "its SPIFFE ID is in trust domain \"%.80s\", not this sidecar's \"%.80s\"",
			 td, ours);
		out[0] = '\0';
		return -1;
	}
	return 1;
}

int sc_peer_tls_peer_identity(struct sc_peer_tls *tls, int fd, const char *want, char *out,
			      size_t cap)
{
	char id[SC_NAME_MAX], why[REASON_MAX];
	int rc = tls ? peer_identity(tls, fd, want, id, why, sizeof(why)) : 0;
	snprintf(out, cap, "%s", rc == 1 ? id : "");
	return rc == 1;
}

/* A peer whose certificate names no identity: refused when required, else served as claimed. */
static int no_identity(struct sc_peer_tls *tls, int rc, const char *why, const char *claimed,
		       const char *what, struct sc_err *err)
{
	if (rc < 0)
		return sc_err_set(err, SC_PERMISSION_DENIED, "%s: %s", what, why);
	if (tls->required)
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "%s presents a certificate that names no sidecar identity "
				  "(--peer-identity %s: %s), and this sidecar has "
				  "--peer-identity-required",
				  what, sc_peer_identity_name(tls->source), why);
	SC_WARN_LIMITED("peer", "peer-no-identity",
			"%s presents a certificate that names no sidecar identity (--peer-identity "
			"%s: %s): taking its id \"%s\" as its hello claims it",
			what, sc_peer_identity_name(tls->source), why, claimed);
	return 0;
}

int sc_peer_tls_check_claim(struct sc_peer_tls *tls, int fd, const char *claimed,
			    const struct sc_peer_wait *w, const char *what, struct sc_err *err)
{
	if (!tls || tls->source == SC_PEER_IDENTITY_OFF)
		return 0;
	char id[SC_NAME_MAX], why[REASON_MAX];
	int rc = peer_identity(tls, fd, claimed, id, why, sizeof(why));
	struct sc_err e;
	if (rc != 1 && no_identity(tls, rc, why, claimed, what, &e) == 0)
		return 0;
	if (rc == 1 && strcmp(id, claimed) == 0)
		return 0;
	if (rc == 1)
		sc_err_set(&e, SC_PERMISSION_DENIED,
			   "peer certificate names sidecar \"%s\" but its hello claims \"%s\" (%s)",
			   id, claimed, what);
	/* Tell the peer why, in its own framing (its next request reads it), as the hello does. */
	sc_peer_send_refusal(fd, w, &e);
	if (err)
		*err = e;
	return -1;
}

int sc_peer_tls_reached(struct sc_peer_tls *tls, int fd, const char *claimed, const char *what,
			char out[SC_NAME_MAX], struct sc_err *err)
{
	out[0] = '\0';
	if (!tls || tls->source == SC_PEER_IDENTITY_OFF)
		return 0;
	char why[REASON_MAX];
	int rc = peer_identity(tls, fd, claimed, out, why, sizeof(why));
	if (rc != 1) {
		out[0] = '\0';
		return no_identity(tls, rc, why, claimed, what, err);
	}
	return 0;
}

/* ---- I/O ------------------------------------------------------------------------------------- */

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

bool sc_peer_tls_pending(int fd)
{
	struct link *l = link_of(fd);
	return l && !l->ktls_rx && SSL_has_pending(l->ssl) == 1;
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

/* The stream's calls take the caller's buffer as a system call would: a buffer that lost its
 * backing (a truncated region file) is EFAULT, with the fault noted (os/fault_guard.h), never a
 * SIGBUS. Decrypted bytes that could not be delivered are lost: the connection is done. */
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
	size_t want = len > sizeof(l->bounce) ? sizeof(l->bounce) : len;
	int r = SSL_read(l->ssl, l->bounce, (int)want);
	int sys = errno;
	if (r <= 0)
		return io_fail(l, r, sys);
	if (sc_guarded_memcpy(buf, l->bounce, (size_t)r, NULL) != 0) {
		errno = EFAULT;
		return -1;
	}
	return r;
}

static ssize_t tls_send(void *ctx, int fd, const void *buf, size_t len)
{
	(void)ctx;
	struct link *l = link_of(fd);
	if (!l) {
		errno = EBADF;
		return -1;
	}
	/* A retry after WANT_WRITE copies the same bytes to the same place again, as OpenSSL asks
	 * of a retried write (same buffer, same length: the caller's iovec has not moved). */
	size_t n = len > sizeof(l->bounce) ? sizeof(l->bounce) : len;
	if (sc_guarded_memcpy(l->bounce, buf, n, NULL) != 0) {
		errno = EFAULT;
		return -1;
	}
	ERR_clear_error();
	errno = 0;
	int r = SSL_write(l->ssl, l->bounce, (int)n);
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
