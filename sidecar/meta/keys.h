/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/keys.h: the cluster keys from --key-file: lines "key_id:base64key" (32+ random bytes each;
 * blank lines and lines starting with '#' ignored). The first key signs; every key verifies.
 * A keyring is immutable once loaded and reference counted: SIGHUP loads a new one and swaps it in,
 * while calls that hold the old one finish with it. Thread-safe (C11 atomics for the count).
 * Key material is wiped (OPENSSL_cleanse) when the last reference goes.
 */
#ifndef SC_KEYS_H
#define SC_KEYS_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SC_KEY_ID_MAX 64
#define SC_KEY_MIN_BYTES 32
#define SC_KEY_MAX_BYTES 128
#define SC_HMAC_LEN 32

struct sc_keyring;

/* Errors: INVALID_ARGUMENT with file:line for a bad line, short key, duplicate id, empty file;
 * FAILED_PRECONDITION when the file cannot be read or is readable by group/others (mode & 077). */
int sc_keyring_load(const char *path, struct sc_keyring **out, struct sc_err *err);
/* Build from memory (same syntax as the file); for tests and tools. */
int sc_keyring_parse(const char *text, size_t len, struct sc_keyring **out, struct sc_err *err);
struct sc_keyring *sc_keyring_retain(struct sc_keyring *ring);
void sc_keyring_release(struct sc_keyring *ring); /* NULL ok */

/* Where a long-lived user (the peer server and pool) finds the current keyring, which the owner
 * may swap (SIGHUP): get returns it retained (release it), or NULL when there is none to prove
 * with (no --key-file). Thread-safe. */
struct sc_keyring_source {
	struct sc_keyring *(*get)(void *ctx);
	void *ctx;
};
static inline struct sc_keyring *sc_keyring_source_get(const struct sc_keyring_source *s)
{
	return s->get(s->ctx);
}

/* True when id[0..len) is a valid key id: 1..SC_KEY_ID_MAX-1 characters of [A-Za-z0-9._-]. */
bool sc_key_id_valid(const char *id, size_t len);

const char *sc_keyring_signing_id(const struct sc_keyring *ring);
size_t sc_keyring_count(const struct sc_keyring *ring);
/* HMAC-SHA256 with key `key_id` over the concatenation of parts. Returns false for unknown id. */
bool sc_keyring_hmac(const struct sc_keyring *ring, const char *key_id, const void *const *parts,
		     const size_t *part_lens, size_t n_parts, uint8_t out[SC_HMAC_LEN]);

#endif
