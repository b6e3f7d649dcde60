/* SPDX-License-Identifier: Apache-2.0 */
/*
 * grpc_certs.c: the TCP API listeners' TLS files, reloaded when they change (see grpc_certs.h).
 * The files are checked with OpenSSL before gRPC sees them (a certificate that does not parse, a
 * key that does not match it, an expired certificate), so a bad file never reaches a handshake.
 *
 * Threads: the fetcher runs on whichever gRPC thread starts a handshake, sc_grpc_certs_reload on
 * the main thread; c->mu guards everything below it. Owns the PEM texts of the config it hands
 * gRPC next (gRPC owns each config once handed over).
 */
#include "grpc_certs.h"

#include "net/api_listen.h"
#include "engine/engine.h"
#include "os/file_sig.h"
#include "base/log.h"
#include "peer/tls.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#define PEM_MAX (1u << 20)

enum { F_CERT, F_KEY, F_CA, N_FILES };

static const char *const flag_names[N_FILES] = {"--grpc-tls-cert", "--grpc-tls-key",
						"--grpc-tls-client-ca"};

struct sc_grpc_certs {
	struct sc_engine *eng;
	const char *paths[N_FILES]; /* cfg's strings (the config outlives the service) */
	uint64_t interval_ms;	    /* 0: only on sc_grpc_certs_reload */
	pthread_mutex_t mu;
	struct sc_file_sig sigs[N_FILES];		  /* what the last load attempt saw */
	uint64_t next_check_ms;			  /* monotonic: when the fetcher stats the files */
	grpc_ssl_server_certificate_config *next; /* loaded, not yet handed to gRPC */
	char serial[SC_TLS_SERIAL_MAX];			  /* the certificate in use (or next) */
};

/* OpenSSL's most recent reason, or fallback; clears the queue. */
static const char *ssl_reason(const char *fallback)
{
	unsigned long e = ERR_peek_last_error();
	const char *r = e ? ERR_reason_error_string(e) : NULL;
	ERR_clear_error();
	return r ? r : fallback;
}

/*
 * Read and check the files; on success *config is a new gRPC config and serial/not_after describe
 * the certificate. Errors name the flag, the path and the reason.
 */
static int load(const struct sc_grpc_certs *c, grpc_ssl_server_certificate_config **config,
		char serial[SC_TLS_SERIAL_MAX], int64_t *not_after, struct sc_err *err)
{
	char *pem[N_FILES] = {NULL, NULL, NULL};
	size_t n;
	int rc = -1;
	X509 *cert = NULL;
	EVP_PKEY *key = NULL;
	BIO *bio = NULL;
	*config = NULL;
	for (int i = 0; i < N_FILES; i++)
		if (c->paths[i] &&
		    sc_read_small_file(c->paths[i], PEM_MAX, flag_names[i], &pem[i], &n, err) != 0)
			goto out;
	ERR_clear_error();
	bio = BIO_new_mem_buf(pem[F_CERT], -1);
	cert = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
	BIO_free(bio);
	if (!cert) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--grpc-tls-cert %s: cannot load the certificate "
			   "(PEM): %s",
			   c->paths[F_CERT], ssl_reason("no certificate"));
		goto out;
	}
	bio = BIO_new_mem_buf(pem[F_KEY], -1);
	key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
	BIO_free(bio);
	if (!key) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--grpc-tls-key %s: cannot load the private key "
			   "(PEM): %s",
			   c->paths[F_KEY], ssl_reason("no key"));
		goto out;
	}
	if (X509_check_private_key(cert, key) != 1) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--grpc-tls-key %s does not match --grpc-tls-cert "
			   "%s: %s",
			   c->paths[F_KEY], c->paths[F_CERT], ssl_reason("mismatch"));
		goto out;
	}
	if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--grpc-tls-cert %s: the certificate has expired: renew it",
			   c->paths[F_CERT]);
		goto out;
	}
	if (pem[F_CA]) {
		bio = BIO_new_mem_buf(pem[F_CA], -1);
		X509 *ca = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
		BIO_free(bio);
		if (!ca) {
			sc_err_set(err, SC_INVALID_ARGUMENT,
				   "--grpc-tls-client-ca %s: cannot load the CA certificate(s) "
				   "(PEM): %s",
				   c->paths[F_CA], ssl_reason("no certificate"));
			goto out;
		}
		X509_free(ca);
	}
	int64_t not_before;
	sc_tls_cert_serial(cert, serial, SC_TLS_SERIAL_MAX);
	sc_tls_cert_validity(cert, &not_before, not_after);
	grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[F_KEY], .cert_chain = pem[F_CERT]};
	*config = grpc_ssl_server_certificate_config_create(pem[F_CA], &pair, 1);
	if (!*config) {
		sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "--grpc-tls-cert/--grpc-tls-key/--grpc-tls-client-ca: gRPC refused the "
		    "TLS files: check they are PEM and that the key matches the certificate");
		goto out;
	}
	rc = 0;
out:
	X509_free(cert);
	EVP_PKEY_free(key);
	for (int i = 0; i < N_FILES; i++) {
		if (i == F_KEY && pem[i])
			OPENSSL_cleanse(pem[i], strlen(pem[i]));
		free(pem[i]);
	}
	return rc;
}

/* Under mu: load the files when they changed (or force) into c->next. 1 loaded, 0 unchanged,
 * -1 failed (logged). */
static int check_locked(struct sc_grpc_certs *c, bool force, struct sc_err *err)
{
	struct sc_file_sig now[N_FILES];
	bool changed = false;
	for (int i = 0; i < N_FILES; i++) {
		sc_file_sig_of(c->paths[i], &now[i]);
		changed |= !sc_file_sig_eq(&now[i], &c->sigs[i]);
	}
	if (!changed && !force)
		return 0;
	memcpy(c->sigs, now, sizeof(now));
	grpc_ssl_server_certificate_config *config;
	char serial[SC_TLS_SERIAL_MAX];
	int64_t not_after;
	struct sc_err scratch;
	if (!err)
		err = &scratch;
	if (load(c, &config, serial, &not_after, err) != 0) {
		SC_ERROR("grpc", "gRPC TLS: keeping the current certificate (serial %s): %s",
			 c->serial, err->msg);
		return -1;
	}
	if (c->next)
		grpc_ssl_server_certificate_config_destroy(c->next);
	c->next = config;
	snprintf(c->serial, sizeof(c->serial), "%s", serial);
	sc_engine_set_grpc_certificate(c->eng, serial, not_after);
	SC_INFO("grpc",
		"gRPC TLS: loaded certificate serial %s (expires %lld) from %s; new "
		"connections use it",
		serial, (long long)not_after, c->paths[F_CERT]);
	return 1;
}

/* gRPC's fetcher: on every new handshake (and once at creation). */
static grpc_ssl_certificate_config_reload_status fetch(void *user_data,
						       grpc_ssl_server_certificate_config **config)
{
	struct sc_grpc_certs *c = user_data;
	pthread_mutex_lock(&c->mu);
	uint64_t now = sc_clock_mono_ms();
	if (c->interval_ms && now >= c->next_check_ms) {
		c->next_check_ms = now + c->interval_ms;
		check_locked(c, false, NULL);
	}
	grpc_ssl_certificate_config_reload_status st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
	if (c->next) {
		*config = c->next; /* gRPC owns it now */
		c->next = NULL;
		st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
	}
	pthread_mutex_unlock(&c->mu);
	return st;
}

int sc_grpc_certs_create(const struct sc_config *cfg, struct sc_engine *eng,
			 grpc_server_credentials **creds, struct sc_grpc_certs **out,
			 struct sc_err *err)
{
	*creds = NULL;
	*out = NULL;
	if (!cfg->grpc_tls_cert)
		return 0;
	struct sc_grpc_certs *c = calloc(1, sizeof(*c));
	if (!c)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	c->eng = eng;
	c->paths[F_CERT] = cfg->grpc_tls_cert;
	c->paths[F_KEY] = cfg->grpc_tls_key;
	c->paths[F_CA] = cfg->grpc_tls_client_ca;
	c->interval_ms = cfg->tls_reload_interval_ms;
	pthread_mutex_init(&c->mu, NULL);
	for (int i = 0; i < N_FILES; i++)
		sc_file_sig_of(c->paths[i], &c->sigs[i]);
	char serial[SC_TLS_SERIAL_MAX];
	int64_t not_after;
	if (load(c, &c->next, serial, &not_after, err) != 0)
		goto fail;
	snprintf(c->serial, sizeof(c->serial), "%s", serial);
	sc_engine_set_grpc_certificate(eng, serial, not_after);
	c->next_check_ms = sc_clock_mono_ms() + c->interval_ms;
	grpc_ssl_server_credentials_options *opts =
	    grpc_ssl_server_credentials_create_options_using_config_fetcher(
		cfg->grpc_tls_client_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
					: GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
		fetch, c);
	*creds = opts ? grpc_ssl_server_credentials_create_with_options(opts) : NULL;
	if (!*creds) {
		sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "--grpc-tls-cert/--grpc-tls-key/--grpc-tls-client-ca: gRPC refused the "
		    "TLS files: check they are PEM and that the key matches the certificate");
		goto fail;
	}
	SC_INFO("grpc", "gRPC TLS: certificate serial %s (expires %lld) from %s", serial,
		(long long)not_after, cfg->grpc_tls_cert);
	*out = c;
	return 0;
fail:
	sc_grpc_certs_destroy(c);
	return -1;
}

int sc_grpc_certs_reload(struct sc_grpc_certs *c, struct sc_err *err)
{
	if (!c)
		return 0;
	pthread_mutex_lock(&c->mu);
	int rc = check_locked(c, true, err);
	pthread_mutex_unlock(&c->mu);
	return rc < 0 ? -1 : 0;
}

void sc_grpc_certs_destroy(struct sc_grpc_certs *c)
{
	if (!c)
		return;
	if (c->next)
		grpc_ssl_server_certificate_config_destroy(c->next);
	pthread_mutex_destroy(&c->mu);
	free(c);
}
