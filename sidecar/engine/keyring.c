/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/keyring.c: the engine's keyring: the throw-away key without --key-file, the SIGHUP
 * reload, the keyring source the peer server and pool read it through, and the verification of
 * metadata text against it (BeginRead/BeginWrite, ConnectPeer, the NATS bus), counting refusals
 * in rdma_sidecar_metadata_rejected_total{source}. The keys are swapped under eng->mu and
 * retained by each reader, so verification runs outside the lock. Any thread (the reload: the
 * main thread). Owns nothing beyond eng->keys and eng->keys_ephemeral.
 */
#include "engine/internal.h"
#include "engine/metrics.h"
#include "engine/test.h"
#include "base/log.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

struct sc_keyring *sc_engine_keyring(struct sc_engine *eng)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_keyring *k = eng->keys_ephemeral ? NULL : sc_keyring_retain(eng->keys);
	pthread_mutex_unlock(&eng->mu);
	return k;
}

/* The keyring source handed to the peer server and pool: the keys swap on SIGHUP. */
static struct sc_keyring *engine_keyring(void *ctx)
{
	return sc_engine_keyring(ctx);
}

struct sc_keyring_source sc_engine_keyring_source(struct sc_engine *eng)
{
	return (struct sc_keyring_source){.get = engine_keyring, .ctx = eng};
}

/* Without --key-file the sidecar signs with a random key nobody else knows: metadata then works
 * for transfers inside this sidecar only, and peers reject it as signed by an unknown key. */
int sc_engine_ephemeral_keyring(struct sc_engine *eng, struct sc_err *err)
{
	unsigned char key[32];
	char b64[64];
	char text[SC_NAME_MAX + 80];
	if (sc_random_bytes(key, sizeof(key)) != 0)
		return sc_err_set(err, SC_INTERNAL, "no randomness for the ephemeral key");
	EVP_EncodeBlock((unsigned char *)b64, key, sizeof(key));
	int n = snprintf(text, sizeof(text), "local-only-%.40s:%s\n", eng->id, b64);
	memset(key, 0, sizeof(key));
	int rc = sc_keyring_parse(text, (size_t)n, &eng->keys, err);
	memset(text, 0, sizeof(text));
	memset(b64, 0, sizeof(b64));
	eng->keys_ephemeral = true;
	return rc;
}

int sc_engine_reload_keys(struct sc_engine *eng, struct sc_err *err)
{
	if (!eng->cfg->key_file || !eng->cfg->key_file[0])
		return sc_err_set(err, SC_FAILED_PRECONDITION, "no --key-file to reload");
	struct sc_keyring *ring;
	if (sc_keyring_load(eng->cfg->key_file, &ring, err) != 0)
		return -1;
	pthread_mutex_lock(&eng->mu);
	struct sc_keyring *old = eng->keys;
	eng->keys = ring;
	eng->keys_ephemeral = false;
	pthread_mutex_unlock(&eng->mu);
	sc_keyring_release(old);
	SC_INFO_KV("keys", (&(struct sc_log_fields){.key_id = sc_keyring_signing_id(ring)}),
		"reloaded %zu key(s) from %s; signing with \"%s\"",
		sc_keyring_count(ring), eng->cfg->key_file, sc_keyring_signing_id(ring));
	return 0;
}

int sc_engine_verify_metadata(struct sc_engine *eng, const char *text, const char *self_id,
			      enum sc_md_source source, struct sc_metadata *md, struct sc_err *err)
{
	/* Verify outside the lock: it is pure and may be slow for big metadata. */
	pthread_mutex_lock(&eng->mu);
	struct sc_keyring *ring = sc_keyring_retain(eng->keys);
	pthread_mutex_unlock(&eng->mu);
	enum sc_md_reject why;
	int rc = sc_metadata_verify_why(ring, text, self_id, sc_clock_unix_ms(), md, &why, err);
	sc_keyring_release(ring);
	if (rc != 0)
		sc_metrics_metadata_rejected(eng->metrics, source, why);
	return rc;
}
