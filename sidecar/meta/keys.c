/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/keys.c: the keyring from --key-file ("key_id:base64key" lines) and HMAC-SHA256 with its
 * keys. Loading runs on the main thread (start-up, SIGHUP); a loaded ring is immutable, so
 * sc_keyring_hmac and the getters run on any thread. The ring owns copies of the key bytes, a
 * fetched EVP_MAC and, per key, an HMAC-SHA256 context keyed once (each MAC starts from a copy of
 * it: no digest look-up and no key set-up per call, which cost microseconds on every BeginRead);
 * the last sc_keyring_release wipes the bytes (OPENSSL_cleanse) and frees them all.
 * Error messages name file:line and never contain key material.
 */
#include "meta/keys.h"
#include "base/base64.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

/* A key file is a few lines; anything this big is the wrong file. */
#define SC_KEY_FILE_MAX (1024 * 1024)
#define SC_KEYS_MAX 1024

#define KEYGEN_HINT                                                                                \
	"generate one with: printf 'k1:%s\\n' \"$(head -c 32 /dev/urandom | base64 -w0)\""

struct sc_key {
	char id[SC_KEY_ID_MAX];
	size_t line; /* where it was defined, for duplicate messages */
	size_t len;
	uint8_t bytes[SC_KEY_MAX_BYTES];
	EVP_MAC_CTX *keyed; /* initialized with these bytes; only copied (NULL: key per call) */
};

struct sc_keyring {
	atomic_uint refs;
	EVP_MAC *hmac;
	size_t cap;
	size_t n;
	struct sc_key keys[]; /* keys[0] signs */
};

static bool key_id_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

bool sc_key_id_valid(const char *id, size_t len)
{
	if (!id || len == 0 || len >= SC_KEY_ID_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (!key_id_char((unsigned char)id[i]))
			return false;
	}
	return true;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* An HMAC-SHA256 context keyed with key's bytes, or NULL (then each MAC keys its own). */
static EVP_MAC_CTX *hmac_keyed(EVP_MAC *mac, const struct sc_key *key)
{
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
	    OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
	    OSSL_PARAM_construct_end(),
	};
	EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
	if (ctx && !EVP_MAC_init(ctx, key->bytes, key->len, params)) {
		EVP_MAC_CTX_free(ctx);
		ctx = NULL;
	}
	return ctx;
}

static void ring_free(struct sc_keyring *ring)
{
	if (!ring)
		return;
	for (size_t i = 0; i < ring->n; i++)
		EVP_MAC_CTX_free(ring->keys[i].keyed);
	OPENSSL_cleanse(ring->keys, ring->cap * sizeof(ring->keys[0]));
	EVP_MAC_free(ring->hmac);
	free(ring);
}

/* Parse one non-comment line [s, e) into *key. `where` is "file:line" for messages. */
static int parse_line(const char *s, const char *e, const char *where, struct sc_key *key,
		      struct sc_err *err)
{
	const char *colon = memchr(s, ':', (size_t)(e - s));
	if (!colon)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s: expected 'key_id:base64key' (no ':' on this line)", where);
	size_t id_len = (size_t)(colon - s);
	if (id_len == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s: empty key id before ':'", where);
	if (id_len >= SC_KEY_ID_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s: key id is %zu characters, at most %d allowed", where, id_len,
				  SC_KEY_ID_MAX - 1);
	for (size_t i = 0; i < id_len; i++) {
		if (!key_id_char((unsigned char)s[i]))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s: key id has a character outside [A-Za-z0-9._-] at "
					  "position %zu",
					  where, i + 1);
	}
	memcpy(key->id, s, id_len);
	key->id[id_len] = '\0';

	const char *k = colon + 1;
	while (k < e && is_blank(*k))
		k++;
	uint8_t *bytes = NULL;
	size_t n = 0;
	if (!sc_base64_decode(k, (size_t)(e - k), &bytes, &n))
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "%s: key '%s' is not valid standard base64 with padding (one line, "
		    "no wrapping; %s)",
		    where, key->id, KEYGEN_HINT);
	if (n < SC_KEY_MIN_BYTES || n > SC_KEY_MAX_BYTES) {
		OPENSSL_cleanse(bytes, n);
		free(bytes);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s: key '%s' is %zu bytes, want %d..%d random bytes (%s)", where,
				  key->id, n, SC_KEY_MIN_BYTES, SC_KEY_MAX_BYTES, KEYGEN_HINT);
	}
	memcpy(key->bytes, bytes, n);
	key->len = n;
	OPENSSL_cleanse(bytes, n);
	free(bytes);
	return 0;
}

static int keyring_parse_named(const char *name, const char *text, size_t len,
			       struct sc_keyring **out, struct sc_err *err)
{
	if (!text && len)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s: no text", name);
	size_t cap = 0;
	for (size_t i = 0; i < len; i++)
		cap += text[i] == '\n';
	cap++;
	if (cap > SC_KEYS_MAX)
		cap = SC_KEYS_MAX;
	struct sc_keyring *ring = calloc(1, sizeof(*ring) + cap * sizeof(ring->keys[0]));
	if (!ring)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "%s: out of memory", name);
	ring->cap = cap;
	char where[512];
	size_t lineno = 0;
	const char *p = text, *end = text + len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end;
		lineno++;
		snprintf(where, sizeof(where), "%s:%zu", name, lineno);
		const char *s = p;
		p = nl ? nl + 1 : end;
		if (memchr(s, '\0', (size_t)(e - s))) {
			sc_err_set(err, SC_INVALID_ARGUMENT, "%s: NUL byte in a key file line",
				   where);
			goto fail;
		}
		while (s < e && is_blank(*s))
			s++;
		while (e > s && is_blank(e[-1]))
			e--;
		if (s == e || *s == '#')
			continue;
		if (ring->n == cap) {
			sc_err_set(err, SC_INVALID_ARGUMENT, "%s: more than %d keys", where,
				   SC_KEYS_MAX);
			goto fail;
		}
		struct sc_key *key = &ring->keys[ring->n];
		if (parse_line(s, e, where, key, err) < 0)
			goto fail;
		for (size_t i = 0; i < ring->n; i++) {
			if (strcmp(ring->keys[i].id, key->id) == 0) {
				sc_err_set(err, SC_INVALID_ARGUMENT,
					   "%s: duplicate key id '%s' (first on line %zu): give "
					   "each key its own id",
					   where, key->id, ring->keys[i].line);
				goto fail;
			}
		}
		key->line = lineno;
		ring->n++;
	}
	if (ring->n == 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "%s: no keys (want lines 'key_id:base64key'; the first one signs; %s)",
			   name, KEYGEN_HINT);
		goto fail;
	}
	ring->hmac = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
	if (!ring->hmac) {
		sc_err_set(err, SC_INTERNAL, "%s: OpenSSL has no HMAC implementation", name);
		goto fail;
	}
	for (size_t i = 0; i < ring->n; i++)
		ring->keys[i].keyed = hmac_keyed(ring->hmac, &ring->keys[i]);
	atomic_init(&ring->refs, 1);
	*out = ring;
	return 0;
fail:
	ring_free(ring);
	return -1;
}

int sc_keyring_parse(const char *text, size_t len, struct sc_keyring **out, struct sc_err *err)
{
	return keyring_parse_named("key text", text, len, out, err);
}

int sc_keyring_load(const char *path, struct sc_keyring **out, struct sc_err *err)
{
	if (!path || !*path)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "no key file path given");
	/* O_NONBLOCK: a FIFO given as the key file must be refused below, not block the caller
	 * (the signal thread on SIGHUP) until someone writes to it. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "cannot open key file %s: %s", path,
				  strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return sc_err_set(err, SC_FAILED_PRECONDITION, "cannot stat key file %s: %s", path,
				  strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return sc_err_set(err, SC_FAILED_PRECONDITION, "key file %s is not a regular file",
				  path);
	}
	/* PostgreSQL's rule: a file we own must be 0600 or tighter; a root-owned file may also be
	 * group-readable (0640/0440), which is what a Kubernetes Secret volume with fsGroup gives a
	 * non-root container. Nobody else may ever read it. */
	bool root_owned = st.st_uid == 0 && geteuid() != 0;
	mode_t forbidden = root_owned ? 037 : 077;
	if (st.st_mode & forbidden) {
		close(fd);
		return sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "key file %s has mode %04o, open to %s: run 'chmod 600 %s' (or, for a "
		    "root-owned file such as a Kubernetes Secret with fsGroup, 0640/0440)",
		    path, (unsigned)(st.st_mode & 07777), root_owned ? "others" : "group or others",
		    path);
	}
	if (st.st_size > SC_KEY_FILE_MAX) {
		close(fd);
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "key file %s is %lld bytes, more than a key file can be (%d): is it "
		    "the right file?",
		    path, (long long)st.st_size, SC_KEY_FILE_MAX);
	}
	size_t cap = (size_t)st.st_size + 1;
	char *buf = malloc(cap);
	if (!buf) {
		close(fd);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "key file %s: out of memory", path);
	}
	size_t len = 0;
	for (;;) {
		if (len == cap) { /* grew since fstat */
			sc_err_set(err, SC_INVALID_ARGUMENT, "key file %s changed while reading it",
				   path);
			goto fail;
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			sc_err_set(err, SC_FAILED_PRECONDITION, "cannot read key file %s: %s", path,
				   strerror(errno));
			goto fail;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	fd = -1;
	int rc = keyring_parse_named(path, buf, len, out, err);
	OPENSSL_cleanse(buf, cap);
	free(buf);
	return rc;
fail:
	OPENSSL_cleanse(buf, cap);
	free(buf);
	if (fd >= 0)
		close(fd);
	return -1;
}

struct sc_keyring *sc_keyring_retain(struct sc_keyring *ring)
{
	if (ring)
		atomic_fetch_add_explicit(&ring->refs, 1, memory_order_relaxed);
	return ring;
}

void sc_keyring_release(struct sc_keyring *ring)
{
	if (!ring)
		return;
	if (atomic_fetch_sub_explicit(&ring->refs, 1, memory_order_acq_rel) == 1)
		ring_free(ring);
}

const char *sc_keyring_signing_id(const struct sc_keyring *ring)
{
	return ring && ring->n ? ring->keys[0].id : NULL;
}

size_t sc_keyring_count(const struct sc_keyring *ring)
{
	return ring ? ring->n : 0;
}

bool sc_keyring_hmac(const struct sc_keyring *ring, const char *key_id, const void *const *parts,
		     const size_t *part_lens, size_t n_parts, uint8_t out[SC_HMAC_LEN])
{
	if (!ring || !key_id)
		return false;
	const struct sc_key *key = NULL;
	for (size_t i = 0; i < ring->n; i++) {
		if (strcmp(ring->keys[i].id, key_id) == 0) {
			key = &ring->keys[i];
			break;
		}
	}
	if (!key)
		return false;
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
	    OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
	    OSSL_PARAM_construct_end(),
	};
	bool ok = false;
	size_t out_len = 0;
	EVP_MAC_CTX *ctx = key->keyed ? EVP_MAC_CTX_dup(key->keyed) : EVP_MAC_CTX_new(ring->hmac);
	if (!ctx || (!key->keyed && !EVP_MAC_init(ctx, key->bytes, key->len, params)))
		goto out;
	for (size_t i = 0; i < n_parts; i++) {
		if (part_lens[i] && !EVP_MAC_update(ctx, parts[i], part_lens[i]))
			goto out;
	}
	ok = EVP_MAC_final(ctx, out, &out_len, SC_HMAC_LEN) && out_len == SC_HMAC_LEN;
out:
	EVP_MAC_CTX_free(ctx);
	if (!ok)
		OPENSSL_cleanse(out, SC_HMAC_LEN);
	return ok;
}
