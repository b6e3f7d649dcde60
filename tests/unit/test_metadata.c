/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metadata.c: signing and verifying "rsm1." metadata (sidecar/meta/metadata.c) and the base64
 * codecs (sidecar/base/base64.c): round trips, key rotation, tampering and truncation at every position,
 * garbage, each verification step's status code and message, and the struct limits. Keys are drawn
 * at run time; nothing secret is committed. Single-threaded.
 */
#include "check.h"
#include "meta/keys.h"
#include "meta/metadata.h"

#include "rdma_sidecar/v1/sidecar.pb-c.h"

#include <time.h>

#include <openssl/evp.h>

#define NOW 1700000000000ull /* a fixed clock for every test */

static struct sc_keyring *ring_a;  /* "a1" (signs) */
static struct sc_keyring *ring_b;  /* "b1" (signs), "a1" (verifies): after rotation */
static struct sc_keyring *ring_a2; /* "a1" with different bytes */

static void random_key_b64(char *buf, size_t cap)
{
	unsigned char raw[32];
	if (cap < 45 || sc_random_bytes(raw, sizeof(raw)) != 0)
		abort();
	EVP_EncodeBlock((unsigned char *)buf, raw, (int)sizeof(raw));
}

static struct sc_keyring *ring_from(const char *text)
{
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	if (sc_keyring_parse(text, strlen(text), &ring, &err) != 0) {
		fprintf(stderr, "ring: %s\n", err.msg);
		abort();
	}
	return ring;
}

static void rings_setup(void)
{
	if (ring_a)
		return;
	char ka[64], kb[64], ka2[64], text[256];
	random_key_b64(ka, sizeof(ka));
	random_key_b64(kb, sizeof(kb));
	random_key_b64(ka2, sizeof(ka2));
	snprintf(text, sizeof(text), "a1:%s\n", ka);
	ring_a = ring_from(text);
	snprintf(text, sizeof(text), "b1:%s\na1:%s\n", kb, ka);
	ring_b = ring_from(text);
	snprintf(text, sizeof(text), "a1:%s\n", ka2);
	ring_a2 = ring_from(text);
}

/* A full metadata: 3 descriptors, 2 endpoints, TCP+ibverbs, an ibverbs endpoint. */
static void sample(struct sc_metadata *md, struct sc_meta_desc descs[3])
{
	memset(md, 0, sizeof(*md));
	md->version = SC_METADATA_VERSION;
	snprintf(md->issuer, sizeof(md->issuer), "sidecar-a");
	md->kind = SC_OP_READABLE;
	sc_random_bytes(md->token, sizeof(md->token));
	snprintf(md->endpoints[0], sizeof(md->endpoints[0]), "10.0.0.1:7001");
	snprintf(md->endpoints[1], sizeof(md->endpoints[1]), "[fd00::1]:7001");
	md->n_endpoints = 2;
	md->backends = SC_BACKEND_BIT_TCP | SC_BACKEND_BIT_IBVERBS;
	md->ib.present = true;
	for (int i = 0; i < 16; i++)
		md->ib.gid[i] = (uint8_t)(0xf0 + i);
	md->ib.lid = 7;
	md->ib.port = 1;
	md->ib.mtu = 4096;
	snprintf(md->ib.device, sizeof(md->ib.device), "mlx5_0");
	descs[0] = (struct sc_meta_desc){.length = 4096,
					 .device_kind = SC_DEVICE_HOST,
					 .remote_addr = 0x7f0000001000ull,
					 .rkey = 0x1234};
	descs[1] = (struct sc_meta_desc){.length = 1ull << 33,
					 .device_kind = SC_DEVICE_CUDA,
					 .remote_addr = 0x7f0000100000ull,
					 .rkey = 0xffffffffu};
	descs[2] = (struct sc_meta_desc){.length = 1, .device_kind = SC_DEVICE_HOST};
	md->descs = descs;
	md->n_descs = 3;
	md->issued_unix_ms = NOW;
	md->expires_unix_ms = NOW + 60000;
	sc_random_bytes(md->nonce, sizeof(md->nonce));
	md->max_uses = 2;
}

static char *sign_or_die(const struct sc_keyring *ring, const struct sc_metadata *md)
{
	char *text = NULL;
	struct sc_err err = {0};
	if (sc_metadata_sign(ring, md, &text, &err) != 0) {
		fprintf(stderr, "sign: %s %s\n", sc_status_name(err.code), err.msg);
		abort();
	}
	return text;
}

/* Verify and return the status (SC_OK on success); the struct is freed. msg gets the message. */
static enum sc_status verify_code(const struct sc_keyring *ring, const char *text, const char *self,
				  uint64_t now, char *msg, size_t msg_cap)
{
	struct sc_metadata out;
	struct sc_err err = {0};
	if (sc_metadata_verify(ring, text, self, now, &out, &err) == 0) {
		sc_metadata_free(&out);
		if (msg)
			snprintf(msg, msg_cap, "ok");
		return SC_OK;
	}
	if (msg)
		snprintf(msg, msg_cap, "%s", err.msg);
	return err.code == SC_OK ? SC_INTERNAL : err.code;
}

/* Sign a hand-built RdmaMetadata with `key_id` of ring (for payloads sc_metadata_sign cannot make).
 */
static char *sign_raw_payload(const struct sc_keyring *ring, const char *key_id,
			      const uint8_t *payload, size_t len, size_t mac_len)
{
	uint8_t mac[SC_HMAC_LEN];
	const void *parts[] = {"rsm1", "", key_id, "", payload};
	size_t lens[] = {4, 1, strlen(key_id), 1, len};
	if (!sc_keyring_hmac(ring, key_id, parts, lens, 5, mac))
		memset(mac, 0, sizeof(mac));
	RdmaSidecar__V1__SignedMetadata s = RDMA_SIDECAR__V1__SIGNED_METADATA__INIT;
	s.key_id = (char *)key_id;
	s.payload.data = (uint8_t *)payload;
	s.payload.len = len;
	s.mac.data = mac;
	s.mac.len = mac_len;
	size_t n = rdma_sidecar__v1__signed_metadata__get_packed_size(&s);
	uint8_t *buf = malloc(n + 1);
	rdma_sidecar__v1__signed_metadata__pack(&s, buf);
	char *b64 = NULL;
	if (sc_base64url_encode(buf, n, &b64) != 0)
		abort();
	free(buf);
	char *text = malloc(strlen(b64) + 6);
	sprintf(text, "rsm1.%s", b64);
	free(b64);
	return text;
}

static char *sign_raw(const struct sc_keyring *ring, const RdmaSidecar__V1__RdmaMetadata *m)
{
	size_t n = rdma_sidecar__v1__rdma_metadata__get_packed_size(m);
	uint8_t *buf = malloc(n + 1);
	rdma_sidecar__v1__rdma_metadata__pack(m, buf);
	char *text = sign_raw_payload(ring, sc_keyring_signing_id(ring), buf, n, SC_HMAC_LEN);
	free(buf);
	return text;
}

/* A valid hand-built RdmaMetadata; the caller changes one thing. Storage lives in *st. */
struct raw_md {
	RdmaSidecar__V1__RdmaMetadata m;
	RdmaSidecar__V1__RemoteDescriptor d;
	RdmaSidecar__V1__RemoteDescriptor *dp[1];
	RdmaSidecar__V1__IbverbsEndpoint ib;
	uint8_t token[SC_TOKEN_LEN], nonce[SC_TOKEN_LEN], gid[16];
};

static void raw_sample(struct raw_md *st)
{
	RdmaSidecar__V1__RdmaMetadata m = RDMA_SIDECAR__V1__RDMA_METADATA__INIT;
	RdmaSidecar__V1__RemoteDescriptor d = RDMA_SIDECAR__V1__REMOTE_DESCRIPTOR__INIT;
	RdmaSidecar__V1__IbverbsEndpoint ib = RDMA_SIDECAR__V1__IBVERBS_ENDPOINT__INIT;
	st->m = m;
	st->d = d;
	st->ib = ib;
	memset(st->token, 1, sizeof(st->token));
	memset(st->nonce, 2, sizeof(st->nonce));
	memset(st->gid, 3, sizeof(st->gid));
	st->d.length = 100;
	st->d.device_kind = RDMA_SIDECAR__V1__DEVICE_KIND__DEVICE_KIND_HOST;
	st->dp[0] = &st->d;
	st->m.version = 1;
	st->m.issuer = "raw";
	st->m.kind = RDMA_SIDECAR__V1__OPERATION_KIND__OPERATION_KIND_WRITABLE;
	st->m.token.data = st->token;
	st->m.token.len = SC_TOKEN_LEN;
	st->m.n_descriptors = 1;
	st->m.descriptors = st->dp;
	st->m.issued_unix_ms = NOW;
	st->m.expires_unix_ms = NOW + 1000;
	st->m.nonce.data = st->nonce;
	st->m.nonce.len = SC_TOKEN_LEN;
	st->ib.gid.data = st->gid;
	st->ib.gid.len = sizeof(st->gid);
	st->ib.device = "rxe0";
	st->m.ibverbs = &st->ib;
}

/* ---- base64 ---------------------------------------------------------------------------------- */

TEST(base64url_round_trip_matches_openssl)
{
	uint8_t data[100];
	for (size_t len = 0; len <= sizeof(data); len++) {
		CHECK_INT_EQ(sc_random_bytes(data, len), 0);
		char *enc = NULL;
		CHECK_INT_EQ(sc_base64url_encode(data, len, &enc), 0);
		/* OpenSSL's standard alphabet, translated and unpadded, must match. */
		char std[200];
		int n = EVP_EncodeBlock((unsigned char *)std, data, (int)len);
		while (n > 0 && std[n - 1] == '=')
			std[--n] = '\0';
		for (int i = 0; i < n; i++)
			std[i] = std[i] == '+' ? '-' : std[i] == '/' ? '_' : std[i];
		CHECK_STR_EQ(enc, std);
		uint8_t *dec = NULL;
		size_t dec_len = 99999;
		CHECK(sc_base64url_decode(enc, strlen(enc), &dec, &dec_len));
		CHECK_U64_EQ(dec_len, len);
		CHECK(memcmp(dec, data, len) == 0);
		free(dec);
		free(enc);
	}
}

static bool b64url_ok(const char *s)
{
	uint8_t *out = NULL;
	size_t n = 0;
	bool ok = sc_base64url_decode(s, strlen(s), &out, &n);
	free(out);
	return ok;
}

static bool b64std_ok(const char *s, const char *want)
{
	uint8_t *out = NULL;
	size_t n = 0;
	if (!sc_base64_decode(s, strlen(s), &out, &n))
		return false;
	bool same = want && n == strlen(want) && memcmp(out, want, n) == 0;
	free(out);
	return same;
}

TEST(base64url_rejects_bad_input)
{
	CHECK(b64url_ok(""));
	CHECK(b64url_ok("AA"));
	CHECK(b64url_ok("-_8"));
	CHECK(!b64url_ok("A"));	    /* no encoder makes len % 4 == 1 */
	CHECK(!b64url_ok("AAAAA")); /* same */
	CHECK(!b64url_ok("AB"));    /* leftover bits set: non-canonical */
	CHECK(!b64url_ok("AAB"));
	CHECK(!b64url_ok("AA==")); /* no padding in base64url */
	CHECK(!b64url_ok("AA+/")); /* standard alphabet */
	CHECK(!b64url_ok("AA A"));
	CHECK(!b64url_ok("AA\nA"));
	CHECK(!b64url_ok("AA\xc3\xa9"));
	uint8_t *out = NULL;
	size_t n = 0;
	CHECK(!sc_base64url_decode("AA\0A", 4, &out, &n)); /* NUL inside */
	CHECK(out == NULL);
}

TEST(base64_standard_rfc4648_vectors)
{
	CHECK(b64std_ok("", ""));
	CHECK(b64std_ok("Zg==", "f"));
	CHECK(b64std_ok("Zm8=", "fo"));
	CHECK(b64std_ok("Zm9v", "foo"));
	CHECK(b64std_ok("Zm9vYg==", "foob"));
	CHECK(b64std_ok("Zm9vYmE=", "fooba"));
	CHECK(b64std_ok("Zm9vYmFy", "foobar"));
	CHECK(b64std_ok("+/+/", "\xfb\xff\xbf"));
	CHECK(!b64std_ok("Zg", "f")); /* padding required */
	CHECK(!b64std_ok("Zg=", "f"));
	CHECK(!b64std_ok("Zh==", "f")); /* non-canonical */
	CHECK(!b64std_ok("Z===", ""));
	CHECK(!b64std_ok("====", ""));
	CHECK(!b64std_ok("Zg==Zg==", "ff")); /* padding in the middle */
	CHECK(!b64std_ok("Zm9v=", "foo"));
	CHECK(!b64std_ok("-_-_", "")); /* url alphabet */
	CHECK(!b64std_ok("Zm9 ", ""));
}

/* ---- round trips ----------------------------------------------------------------------------- */

TEST(round_trip_full)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	char *text = sign_or_die(ring_a, &md);
	CHECK(strncmp(text, "rsm1.", 5) == 0);
	CHECK(strlen(text) < SC_METADATA_MAX_TEXT);
	for (const char *p = text + 5; *p; p++)
		CHECK(
		    strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", *p));

	struct sc_metadata out;
	struct sc_err err = {0};
	int rc = sc_metadata_verify(ring_a, text, "anyone", NOW, &out, &err);
	free(text);
	if (rc != 0)
		CHECK_FAIL_("verify: %s %s", sc_status_name(err.code), err.msg);
	CHECK_INT_EQ(out.version, SC_METADATA_VERSION);
	CHECK_STR_EQ(out.issuer, "sidecar-a");
	CHECK_STR_EQ(out.audience, "");
	CHECK_INT_EQ(out.kind, SC_OP_READABLE);
	CHECK(memcmp(out.token, md.token, SC_TOKEN_LEN) == 0);
	CHECK_U64_EQ(out.n_endpoints, 2);
	CHECK_STR_EQ(out.endpoints[0], "10.0.0.1:7001");
	CHECK_STR_EQ(out.endpoints[1], "[fd00::1]:7001");
	CHECK_INT_EQ(out.backends, SC_BACKEND_BIT_TCP | SC_BACKEND_BIT_IBVERBS);
	CHECK(out.ib.present);
	CHECK(memcmp(out.ib.gid, md.ib.gid, 16) == 0);
	CHECK_INT_EQ(out.ib.lid, 7);
	CHECK_INT_EQ(out.ib.port, 1);
	CHECK_INT_EQ(out.ib.mtu, 4096);
	CHECK_STR_EQ(out.ib.device, "mlx5_0");
	CHECK_U64_EQ(out.n_descs, 3);
	for (size_t i = 0; i < 3; i++) {
		CHECK_U64_EQ(out.descs[i].length, descs[i].length);
		CHECK_INT_EQ(out.descs[i].device_kind, descs[i].device_kind);
		CHECK_U64_EQ(out.descs[i].remote_addr, descs[i].remote_addr);
		CHECK_U64_EQ(out.descs[i].rkey, descs[i].rkey);
	}
	CHECK_U64_EQ(out.issued_unix_ms, NOW);
	CHECK_U64_EQ(out.expires_unix_ms, NOW + 60000);
	CHECK(memcmp(out.nonce, md.nonce, SC_TOKEN_LEN) == 0);
	CHECK_INT_EQ(out.max_uses, 2);
	CHECK_STR_EQ(out.key_id, "a1");
	sc_metadata_free(&out);
	CHECK(out.descs == NULL);
	sc_metadata_free(&out); /* twice is harmless */
	sc_metadata_free(NULL);
}

TEST(round_trip_minimal_and_every_backend)
{
	rings_setup();
	struct sc_meta_desc d = {.length = 10, .device_kind = SC_DEVICE_HOST};
	struct sc_metadata md = {.version = 0, /* 0 signs as the current version */
				 .kind = SC_OP_WRITABLE,
				 .backends = SC_BACKEND_BIT_LOCAL | SC_BACKEND_BIT_TCP |
					     SC_BACKEND_BIT_IBVERBS,
				 .descs = &d,
				 .n_descs = 1,
				 .expires_unix_ms = NOW};
	char *text = sign_or_die(ring_a, &md);
	struct sc_metadata out;
	struct sc_err err = {0};
	int rc = sc_metadata_verify(ring_a, text, NULL, NOW, &out, &err);
	free(text);
	if (rc != 0)
		CHECK_FAIL_("verify: %s", err.msg);
	CHECK_INT_EQ(out.version, SC_METADATA_VERSION);
	CHECK_INT_EQ(out.kind, SC_OP_WRITABLE);
	CHECK_INT_EQ(out.backends,
		     SC_BACKEND_BIT_LOCAL | SC_BACKEND_BIT_TCP | SC_BACKEND_BIT_IBVERBS);
	CHECK(!out.ib.present);
	CHECK_U64_EQ(out.n_endpoints, 0);
	CHECK_U64_EQ(out.n_descs, 1);
	CHECK_U64_EQ(out.descs[0].length, 10);
	sc_metadata_free(&out);

	/* A NULL out verifies without keeping anything. */
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(sc_metadata_verify(ring_a, text, NULL, NOW, NULL, &err), 0);
	free(text);
}

TEST(rotation_old_key_still_verifies)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	/* Producer still on ring A (signs with a1); consumer already rotated to B (b1, a1). */
	char *text = sign_or_die(ring_a, &md);
	struct sc_metadata out;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_metadata_verify(ring_b, text, NULL, NOW, &out, &err), 0);
	CHECK_STR_EQ(out.key_id, "a1");
	sc_metadata_free(&out);
	free(text);
	/* Producer rotated first (signs with b1); consumer on A does not know b1 yet. */
	text = sign_or_die(ring_b, &md);
	CHECK_INT_EQ(sc_metadata_verify(ring_a, text, NULL, NOW, &out, &err), -1);
	free(text);
	CHECK_INT_EQ(err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(err.msg, "metadata signed with unknown key id 'b1'");
	CHECK_STR_CONTAINS(err.msg, "add it to --key-file on this sidecar");
}

TEST(same_key_id_different_key_fails_mac)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	char *text = sign_or_die(ring_a2, &md);
	char msg[SC_ERR_MSG_MAX];
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(msg, "does not verify with key 'a1'");
	free(text);
}

TEST(no_keys_sign_and_verify)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	char *text = (char *)"junk";
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_metadata_sign(NULL, &md, &text, &err), -1);
	CHECK(text == NULL);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "--key-file");
	text = sign_or_die(ring_a, &md);
	char msg[SC_ERR_MSG_MAX];
	CHECK_INT_EQ(verify_code(NULL, text, NULL, NOW, msg, sizeof(msg)), SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(msg, "--key-file");
	free(text);
}

/* ---- hostile text ---------------------------------------------------------------------------- */

/* Every position, several replacement characters: never accepted, only the two codes. */
TEST(tamper_every_position)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	snprintf(md.audience, sizeof(md.audience), "b");
	char *text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, "b", NOW, NULL, 0), SC_OK);
	size_t len = strlen(text);
	char *t = strdup(text);
	static const char repl[] = "AB_-z09.*";
	int unauth = 0, invalid = 0;
	for (size_t i = 0; i < len; i++) {
		for (const char *r = repl; *r; r++) {
			if (*r == text[i])
				continue;
			memcpy(t, text, len + 1);
			t[i] = *r;
			char msg[SC_ERR_MSG_MAX];
			enum sc_status c = verify_code(ring_a, t, "b", NOW, msg, sizeof(msg));
			if (c != SC_UNAUTHENTICATED && c != SC_INVALID_ARGUMENT)
				CHECK_FAIL_("flip at %zu to '%c': %s (%s)", i, *r,
					    sc_status_name(c), msg);
			CHECK(strstr(msg, text + len - 12) == NULL); /* no text in messages */
			unauth += c == SC_UNAUTHENTICATED;
			invalid += c == SC_INVALID_ARGUMENT;
		}
	}
	free(t);
	free(text);
	/* Both the decoder and the MAC were reached. */
	CHECK(unauth > 100);
	CHECK(invalid > 10);
}

TEST(truncation_every_length)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	char *text = sign_or_die(ring_a, &md);
	size_t len = strlen(text);
	for (size_t n = 0; n < len; n++) {
		char *t = strndup(text, n);
		char msg[SC_ERR_MSG_MAX];
		enum sc_status c = verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg));
		free(t);
		if (c != SC_UNAUTHENTICATED && c != SC_INVALID_ARGUMENT)
			CHECK_FAIL_("truncated to %zu: %s (%s)", n, sc_status_name(c), msg);
	}
	/* Extra characters after a valid text break it too. */
	char *longer = malloc(len + 5);
	snprintf(longer, len + 5, "%sAAAA", text);
	CHECK(verify_code(ring_a, longer, NULL, NOW, NULL, 0) != SC_OK);
	free(longer);
	free(text);
}

TEST(garbage)
{
	rings_setup();
	static const char alphabet[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	char buf[2048];
	uint8_t rnd[2048];
	for (int iter = 0; iter < 3000; iter++) {
		size_t n;
		CHECK_INT_EQ(sc_random_bytes(&n, sizeof(n)), 0);
		n %= 1500;
		CHECK_INT_EQ(sc_random_bytes(rnd, n), 0);
		size_t o = 0;
		if (iter % 3 != 0) {
			memcpy(buf, "rsm1.", 5);
			o = 5;
		}
		for (size_t i = 0; i < n; i++) {
			if (iter % 3 == 2)
				buf[o++] = alphabet[rnd[i] & 63];
			else
				buf[o++] = (char)(rnd[i] ? rnd[i] : 'x');
		}
		buf[o] = '\0';
		enum sc_status c = verify_code(ring_a, buf, NULL, NOW, NULL, 0);
		if (c != SC_UNAUTHENTICATED && c != SC_INVALID_ARGUMENT)
			CHECK_FAIL_("garbage #%d: %s", iter, sc_status_name(c));
	}
	/* Garbage that is valid base64url of a valid envelope with a wrong MAC. */
	uint8_t payload[40];
	CHECK_INT_EQ(sc_random_bytes(payload, sizeof(payload)), 0);
	char *t = sign_raw_payload(ring_a2, "a1", payload, sizeof(payload), SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, NULL, 0), SC_UNAUTHENTICATED);
	free(t);
}

TEST(wrong_prefix_and_empty)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	char *text = sign_or_die(ring_a, &md);
	char msg[SC_ERR_MSG_MAX], t[4096];
	static const char *prefixes[] = {"rsm2.", "RSM1.", "rsm1:", "rsm1", " rsm1.", "", "rsm1.."};
	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
		snprintf(t, sizeof(t), "%s%s", prefixes[i], text + 5);
		CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)),
			     SC_INVALID_ARGUMENT);
	}
	snprintf(t, sizeof(t), "rsm2.%s", text + 5);
	verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg));
	CHECK_STR_CONTAINS(msg, "'rsm2' is not supported");
	snprintf(t, sizeof(t), "xyz1.%s", text + 5);
	verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg));
	CHECK_STR_CONTAINS(msg, "does not start with 'rsm1.'");
	CHECK_INT_EQ(verify_code(ring_a, "", NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(verify_code(ring_a, NULL, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(verify_code(ring_a, "rsm1.", NULL, NOW, msg, sizeof(msg)),
		     SC_INVALID_ARGUMENT);
	free(text);
}

TEST(oversized_text_capped_before_decoding)
{
	rings_setup();
	size_t n = SC_METADATA_MAX_TEXT + 1;
	char *t = malloc(n + 1);
	memcpy(t, "rsm1.", 5);
	memset(t + 5, 'A', n - 5);
	t[n] = '\0';
	char msg[SC_ERR_MSG_MAX];
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "cap");
	/* Exactly at the cap: not refused for size (it fails later, as a bad envelope). */
	t[SC_METADATA_MAX_TEXT] = '\0';
	t[SC_METADATA_MAX_TEXT - 1] = 'A';
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK(strstr(msg, "cap") == NULL);
	free(t);
}

TEST(envelope_checks)
{
	rings_setup();
	struct raw_md st;
	raw_sample(&st);
	size_t n = rdma_sidecar__v1__rdma_metadata__get_packed_size(&st.m);
	uint8_t *payload = malloc(n);
	rdma_sidecar__v1__rdma_metadata__pack(&st.m, payload);
	char msg[SC_ERR_MSG_MAX];
	char *t = sign_raw_payload(ring_a, "a1", payload, n, SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_OK);
	free(t);
	t = sign_raw_payload(ring_a, "a1", payload, n, SC_HMAC_LEN - 1);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "31 byte MAC");
	free(t);
	t = sign_raw_payload(ring_a, "", payload, n, SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "key id");
	free(t);
	t = sign_raw_payload(ring_a, "a1'%s\n", payload, n, SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	free(t);
	char id64[65];
	memset(id64, 'k', 64);
	id64[64] = '\0';
	t = sign_raw_payload(ring_a, id64, payload, n, SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	free(t);
	t = sign_raw_payload(ring_a, "k9", payload, n, SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(msg, "unknown key id 'k9': add it to --key-file on this sidecar");
	free(t);
	/* A signed payload that is not an RdmaMetadata. */
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
	t = sign_raw_payload(ring_a, "a1", junk, sizeof(junk), SC_HMAC_LEN);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "payload does not parse");
	free(t);
	free(payload);
}

/* ---- the steps after the MAC ----------------------------------------------------------------- */

TEST(expiry_with_skew)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	md.expires_unix_ms = NOW;
	char *text = sign_or_die(ring_a, &md);
	char msg[SC_ERR_MSG_MAX];
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW - 100000, msg, sizeof(msg)), SC_OK);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_OK);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW + SC_METADATA_SKEW_MS, msg, sizeof(msg)),
		     SC_OK);
	CHECK_INT_EQ(
	    verify_code(ring_a, text, NULL, NOW + SC_METADATA_SKEW_MS + 1, msg, sizeof(msg)),
	    SC_FAILED_PRECONDITION);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW + 12300, msg, sizeof(msg)),
		     SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(msg, "metadata expired 12.3 s ago (issued by sidecar-a): ask the "
				"producer for fresh metadata");
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, UINT64_MAX, msg, sizeof(msg)),
		     SC_FAILED_PRECONDITION);
	free(text);
	/* Far-future expiry must not overflow the skew arithmetic. */
	md.expires_unix_ms = UINT64_MAX;
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_OK);
	free(text);
	md.expires_unix_ms = 0;
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "no expiry");
	free(text);
}

TEST(audience)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	snprintf(md.audience, sizeof(md.audience), "b");
	char *text = sign_or_die(ring_a, &md);
	char msg[SC_ERR_MSG_MAX];
	CHECK_INT_EQ(verify_code(ring_a, text, "a", NOW, msg, sizeof(msg)), SC_PERMISSION_DENIED);
	CHECK_STR_CONTAINS(msg, "metadata is for sidecar 'b' but this is 'a'");
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_PERMISSION_DENIED);
	CHECK_INT_EQ(verify_code(ring_a, text, "bb", NOW, msg, sizeof(msg)), SC_PERMISSION_DENIED);
	CHECK_INT_EQ(verify_code(ring_a, text, "b", NOW, msg, sizeof(msg)), SC_OK);
	free(text);
	md.audience[0] = '\0';
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, "a", NOW, msg, sizeof(msg)), SC_OK);
	CHECK_INT_EQ(verify_code(ring_a, text, NULL, NOW, msg, sizeof(msg)), SC_OK);
	free(text);
}

static enum sc_md_reject why_of(const struct sc_keyring *ring, const char *text, const char *self,
				uint64_t now)
{
	struct sc_metadata out;
	struct sc_err err;
	enum sc_md_reject why = SC_MD_NUM_REJECT;
	if (sc_metadata_verify_why(ring, text, self, now, &out, &why, &err) == 0)
		sc_metadata_free(&out);
	return why;
}

/* The reason rdma_sidecar_metadata_rejected_total counts, for each way verification refuses. */
TEST(reject_reasons)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	md.expires_unix_ms = NOW;
	snprintf(md.audience, sizeof(md.audience), "b");
	char *text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(why_of(ring_a, text, "b", NOW), SC_MD_ACCEPTED);
	CHECK_INT_EQ(why_of(ring_a, text, "a", NOW), SC_MD_WRONG_AUDIENCE);
	CHECK_INT_EQ(why_of(ring_a, text, "b", NOW + SC_METADATA_SKEW_MS + 1), SC_MD_EXPIRED);
	CHECK_INT_EQ(why_of(ring_a2, text, "b", NOW), SC_MD_BAD_SIGNATURE);
	CHECK_INT_EQ(why_of(NULL, text, "b", NOW), SC_MD_NO_KEYS);
	text[3] = '2'; /* rsm2. */
	CHECK_INT_EQ(why_of(ring_a, text, "b", NOW), SC_MD_UNSUPPORTED_VERSION);
	text[3] = '1';
	text[strlen(text) / 2] ^= 0x01; /* one base64url character changed */
	CHECK(why_of(ring_a, text, "b", NOW) == SC_MD_BAD_SIGNATURE ||
	      why_of(ring_a, text, "b", NOW) == SC_MD_MALFORMED);
	free(text);
	text = sign_or_die(ring_b, &md); /* key id b1: ring A does not hold it */
	CHECK_INT_EQ(why_of(ring_a, text, "b", NOW), SC_MD_UNKNOWN_KEY);
	free(text);
	CHECK_INT_EQ(why_of(ring_a, "", "b", NOW), SC_MD_MALFORMED);
	CHECK_INT_EQ(why_of(ring_a, "rsm1.!!", "b", NOW), SC_MD_MALFORMED);
	CHECK_INT_EQ(why_of(ring_a, "hello", "b", NOW), SC_MD_MALFORMED);
	CHECK_STR_CONTAINS(sc_md_reject_name(SC_MD_WRONG_AUDIENCE), "wrong_audience");
	CHECK_STR_CONTAINS(sc_md_reject_name(SC_MD_NUM_REJECT), "unknown");
}

/* Sign md (crafted) with ring A and expect verify to fail with code and a message part. */
static int expect_crafted(const struct sc_metadata *md, enum sc_status code, const char *want)
{
	char *text = sign_or_die(ring_a, md);
	char msg[SC_ERR_MSG_MAX];
	enum sc_status c = verify_code(ring_a, text, "self", NOW, msg, sizeof(msg));
	free(text);
	if (c != code || (want && !strstr(msg, want))) {
		fprintf(stderr, "  got %s \"%s\", want %s containing \"%s\"\n", sc_status_name(c),
			msg, sc_status_name(code), want ? want : "");
		return -1;
	}
	return 0;
}

TEST(descriptor_sanity)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	md.n_descs = 0;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "no descriptors"), 0);
	md.descs = NULL;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "no descriptors"), 0);

	sample(&md, descs);
	descs[1].length = 0;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "run 1 has length 0"), 0);
	md.version = 1; /* the plain form still reads, with its own checks */
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "descriptor 1 has length 0"), 0);
	descs[1].length = 77;
	CHECK_INT_EQ(expect_crafted(&md, SC_OK, NULL), 0);

	sample(&md, descs);
	descs[0].length = UINT64_MAX;
	descs[1].length = 1;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "overflow"), 0);
	md.n_descs = 1; /* UINT64_MAX alone does not overflow */
	CHECK_INT_EQ(expect_crafted(&md, SC_OK, NULL), 0);
	descs[0].length = UINT64_MAX / 2 + 1;
	descs[1].length = UINT64_MAX / 2 + 1;
	md.n_descs = 2;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "overflow"), 0);

	sample(&md, descs);
	descs[2].device_kind = (enum sc_device_kind)7;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "device kind 7"), 0);

	struct sc_meta_desc *many = calloc(SC_METADATA_MAX_DESCS + 1, sizeof(*many));
	for (size_t i = 0; i <= SC_METADATA_MAX_DESCS; i++) {
		many[i].length = UINT64_MAX / (SC_METADATA_MAX_DESCS + 1);
		many[i].device_kind = SC_DEVICE_CUDA;
		many[i].remote_addr = UINT64_MAX - SC_METADATA_MAX_DESCS + i; /* one strided run */
		many[i].rkey = UINT32_MAX;
	}
	sample(&md, descs);
	md.descs = many;
	md.n_descs = SC_METADATA_MAX_DESCS + 1;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "at most 1048576"), 0);
	md.n_descs = SC_METADATA_MAX_DESCS; /* the largest allowed metadata fits under the cap */
	CHECK_INT_EQ(expect_crafted(&md, SC_OK, NULL), 0);
	free(many);
}

/* Field 17: the issuer's other ibverbs rails, one rkey per distinct rail-0 rkey in order of first
 * appearance. Round trip; counts, numbers and gids checked; small for the KV shape. */
TEST(ib_rails)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	descs[2].rkey = 0x1234; /* groups: 0x1234, 0xffffffff */
	uint32_t rk[4] = {0x11, 0x22, 0x33, 0x44};
	md.n_ib_rails = 2;
	md.ib_rkeys = rk;
	md.n_ib_groups = 2;
	for (size_t j = 0; j < 2; j++) {
		md.ib_rails[j].index = (uint32_t)(j + 1);
		md.ib_rails[j].ep = md.ib;
		md.ib_rails[j].ep.gid[15] = (uint8_t)j;
		snprintf(md.ib_rails[j].ep.device, sizeof(md.ib_rails[j].ep.device), "mlx5_%zu",
			 j + 1);
	}
	uint32_t g[3];
	CHECK_INT_EQ((int)sc_metadata_rkey_groups(descs, 3, g), 2);
	CHECK_INT_EQ((int)g[0], 0x1234);
	CHECK_INT_EQ((int)g[1], (int)0xffffffffu);
	char *text = sign_or_die(ring_a, &md);
	struct sc_metadata out;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_metadata_verify(ring_a, text, "self", NOW, &out, &err), 0);
	free(text);
	CHECK_INT_EQ((int)out.n_ib_rails, 2);
	CHECK_INT_EQ((int)out.n_ib_groups, 2);
	CHECK_INT_EQ((int)out.ib_rails[1].index, 2);
	CHECK_STR_EQ(out.ib_rails[1].ep.device, "mlx5_2");
	CHECK_INT_EQ(out.ib_rails[1].ep.gid[15], 1);
	CHECK_INT_EQ((int)out.ib_rkeys[3], 0x44);
	CHECK_INT_EQ((int)out.descs[1].rkey, (int)0xffffffffu); /* rail 0 unchanged */
	sc_metadata_free(&out);

	md.ib_rails[1].index = 1;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "each once"), 0);
	md.ib_rails[1].index = 0;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "each once"), 0);
	md.ib_rails[1].index = SC_MAX_IB_RAILS;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "each once"), 0);
	md.ib_rails[1].index = 2;
	md.n_ib_groups = 1; /* one rkey per rail for two groups */
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "1 rkeys for 2 groups"), 0);
	md.n_ib_groups = 2;
	CHECK_INT_EQ(expect_crafted(&md, SC_OK, NULL), 0);

	/* The KV shape with memory windows: 16,384 x 32 KiB in 64 regions, eight rails. */
	enum { N = 16384, R = 64, RAILS = 8 };
	struct sc_meta_desc *d = calloc(N, sizeof(*d));
	uint32_t *keys = calloc((RAILS - 1) * R, sizeof(*keys));
	for (size_t i = 0; i < N; i++)
		d[i] = (struct sc_meta_desc){.length = 32768, .device_kind = SC_DEVICE_CUDA,
					     .remote_addr = 0x7f0000000000ull + i * 32768 +
							    (i / (N / R)) * 4096,
					     .rkey = (uint32_t)(0x100 + i / (N / R))};
	for (size_t i = 0; i < (RAILS - 1) * R; i++)
		keys[i] = 0x01000000u + (uint32_t)i * 977;
	sample(&md, descs);
	md.descs = d;
	md.n_descs = N;
	text = sign_or_die(ring_a, &md);
	size_t one = strlen(text);
	free(text);
	md.n_ib_rails = RAILS - 1;
	md.ib_rkeys = keys;
	md.n_ib_groups = R;
	for (size_t j = 0; j < RAILS - 1; j++) {
		md.ib_rails[j].index = (uint32_t)(j + 1);
		md.ib_rails[j].ep = md.ib;
	}
	text = sign_or_die(ring_a, &md);
	size_t eight = strlen(text);
	free(text);
	printf("  KV shape (16,384 x 32 KiB, 64 regions): %zu bytes of text on one rail, %zu on "
	       "eight (%zu per more rail)\n",
	       one, eight, (eight - one) / (RAILS - 1));
	CHECK((eight - one) / (RAILS - 1) < 600);
	free(keys);
	free(d);
}

TEST(version_and_kind)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	md.version = 3;
	CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "version 3 is not supported"), 0);
	sample(&md, descs);
	enum sc_op_kind bad[] = {SC_OP_NONE, SC_OP_READ, SC_OP_WRITE, (enum sc_op_kind)99};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		md.kind = bad[i];
		CHECK_INT_EQ(expect_crafted(&md, SC_INVALID_ARGUMENT, "not READABLE or WRITABLE"),
			     0);
	}
}

/* The order of the steps: the earlier failure wins. */
TEST(verification_order)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	snprintf(md.audience, sizeof(md.audience), "other");
	md.n_descs = 0;
	md.version = 3;
	md.expires_unix_ms = NOW - 60000;
	char *text = sign_or_die(ring_a, &md);
	char msg[SC_ERR_MSG_MAX];
	/* a bad MAC beats everything after it */
	CHECK_INT_EQ(verify_code(ring_a2, text, "self", NOW, msg, sizeof(msg)), SC_UNAUTHENTICATED);
	CHECK_INT_EQ(verify_code(ring_a, text, "self", NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "version");
	free(text);
	md.version = 1;
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, "self", NOW, msg, sizeof(msg)),
		     SC_FAILED_PRECONDITION);
	free(text);
	md.expires_unix_ms = NOW + 1;
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, "self", NOW, msg, sizeof(msg)),
		     SC_PERMISSION_DENIED);
	free(text);
	md.audience[0] = '\0';
	text = sign_or_die(ring_a, &md);
	CHECK_INT_EQ(verify_code(ring_a, text, "self", NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "no descriptors");
	free(text);
}

/* Limits that sc_metadata_sign cannot violate, built by hand and signed with a valid key. */
/* ---- version 2: runs ------------------------------------------------------------------------- */

/* Sign descs as version 2, verify, compare every field of every descriptor; *text_len and the
 * verification time (best of 5) reported. */
static int runs_round_trip(const struct sc_meta_desc *d, size_t n, size_t *text_len, double *us)
{
	struct sc_metadata md;
	struct sc_meta_desc dummy[3];
	sample(&md, dummy);
	md.descs = (struct sc_meta_desc *)d;
	md.n_descs = n;
	char *text = sign_or_die(ring_a, &md);
	*text_len = strlen(text);
	*us = 1e30;
	int bad = 0;
	for (int rep = 0; rep < 5 && !bad; rep++) {
		struct timespec t0, t1;
		struct sc_metadata out;
		struct sc_err err = {0};
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int rc = sc_metadata_verify(ring_a, text, "x", NOW, &out, &err);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double t =
		    (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
		*us = t < *us ? t : *us;
		if (rc != 0) {
			fprintf(stderr, "  verify: %s\n", err.msg);
			bad = 1;
			break;
		}
		if (out.n_descs != n)
			bad = 1;
		for (size_t i = 0; !bad && i < n; i++) {
			if (out.descs[i].length != d[i].length ||
			    out.descs[i].device_kind != d[i].device_kind ||
			    out.descs[i].remote_addr != d[i].remote_addr ||
			    out.descs[i].rkey != d[i].rkey) {
				fprintf(stderr, "  descriptor %zu differs after the round trip\n",
					i);
				bad = 1;
			}
		}
		sc_metadata_free(&out);
	}
	free(text);
	return bad ? -1 : 0;
}

static uint64_t rnd64(void)
{
	uint64_t v;
	sc_random_bytes(&v, sizeof(v));
	return v;
}

/* vLLM's layout: 64 layer tensors (one rkey each, as with one memory window per region) x the same
 * 256 random block ids of 32 KiB: at most 8 KiB of text. */
TEST(runs_kv_shared_block_ids)
{
	rings_setup();
	enum { L = 64, B = 256 };
	struct sc_meta_desc *d = calloc(L * B, sizeof(*d));
	uint64_t ids[B];
	for (size_t b = 0; b < B; b++)
		ids[b] = rnd64() % 8192; /* a cache of 8,192 blocks per tensor, any order */
	for (size_t l = 0; l < L; l++) {
		uint64_t base = 0x7f0000000000ull + l * (8192ull * 32768 + 4096 * (l + 1));
		for (size_t b = 0; b < B; b++)
			d[l * B + b] = (struct sc_meta_desc){.length = 32768,
							     .device_kind = SC_DEVICE_CUDA,
							     .remote_addr = base + ids[b] * 32768,
							     .rkey = (uint32_t)(0x100 + l * 7)};
	}
	size_t len = 0;
	double us = 0;
	CHECK_INT_EQ(runs_round_trip(d, L * B, &len, &us), 0);
	printf("  64 x 256 shared ids, ibverbs: %zu bytes of text, verify %.0f us\n", len, us);
	CHECK(len <= 8192);
	/* TCP: no addresses, one run */
	for (size_t i = 0; i < L * B; i++)
		d[i].remote_addr = d[i].rkey = 0;
	CHECK_INT_EQ(runs_round_trip(d, L * B, &len, &us), 0);
	printf("  64 x 256, tcp: %zu bytes of text, verify %.0f us\n", len, us);
	CHECK(len < 400);
	free(d);
}

/* 16,384 arbitrary block offsets (a random permutation) in one region: at most 64 KiB; ascending
 * random ones (deltas); per-descriptor rkeys (one MR each) still round-trip exactly. */
TEST(runs_arbitrary_offsets)
{
	rings_setup();
	enum { N = 16384 };
	struct sc_meta_desc *d = calloc(N, sizeof(*d));
	uint64_t *perm = calloc(N, sizeof(*perm));
	for (size_t i = 0; i < N; i++)
		perm[i] = i;
	for (size_t i = N - 1; i > 0; i--) {
		size_t j = rnd64() % (i + 1);
		uint64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (size_t i = 0; i < N; i++)
		d[i] = (struct sc_meta_desc){.length = 32768,
					     .device_kind = SC_DEVICE_HOST,
					     .remote_addr = 0x7f1234560000ull + perm[i] * 32768,
					     .rkey = 0xabcdef};
	size_t len = 0;
	double us = 0;
	CHECK_INT_EQ(runs_round_trip(d, N, &len, &us), 0);
	printf("  16384 permuted offsets, one rkey: %zu bytes of text, verify %.0f us\n", len, us);
	CHECK(len <= 65536);
	uint64_t at = 0x7f0000000000ull;
	for (size_t i = 0; i < N; i++) {
		at += 4096 * (1 + rnd64() % 8);
		d[i].remote_addr = at;
		d[i].length = 4096;
	}
	CHECK_INT_EQ(runs_round_trip(d, N, &len, &us), 0);
	printf("  16384 ascending offsets: %zu bytes of text, verify %.0f us\n", len, us);
	CHECK(len <= 32768);
	/* one MR per descriptor (no windows): every address and rkey its own */
	for (size_t i = 0; i < 2048; i++) {
		d[i].remote_addr = rnd64();
		d[i].rkey = (uint32_t)rnd64();
		d[i].length = 1 + rnd64() % 100000;
		d[i].device_kind = i % 3 ? SC_DEVICE_HOST : SC_DEVICE_CUDA;
	}
	CHECK_INT_EQ(runs_round_trip(d, 2048, &len, &us), 0);
	/* a strided run, and every address equal */
	for (size_t i = 0; i < 100; i++)
		d[i] = (struct sc_meta_desc){.length = 5, .remote_addr = 1000 + 7 * i, .rkey = 3};
	CHECK_INT_EQ(runs_round_trip(d, 100, &len, &us), 0);
	for (size_t i = 0; i < 100; i++)
		d[i].remote_addr = 99;
	CHECK_INT_EQ(runs_round_trip(d, 100, &len, &us), 0);
	free(perm);
	free(d);
}

/* Strided stretches stay runs of their own when they share an rkey with their neighbours: one
 * stray descriptor before 98,304 strided ones (what fuzz_metadata found), two interleaved strided
 * runs in one region, and 64 layers of 256 consecutive blocks in one region (one MR). */
TEST(runs_adjacent_strided)
{
	rings_setup();
	enum { N = 98305 };
	struct sc_meta_desc *d = calloc(N, sizeof(*d));
	d[0] = (struct sc_meta_desc){.length = 32768, .remote_addr = 130, .rkey = 32};
	for (size_t i = 1; i < N; i++)
		d[i] = (struct sc_meta_desc){
		    .length = 32768, .remote_addr = (i - 1) * 32768, .rkey = 32};
	size_t len = 0;
	double us = 0;
	CHECK_INT_EQ(runs_round_trip(d, N, &len, &us), 0);
	printf("  1 + 98304 strided, one rkey: %zu bytes of text\n", len);
	CHECK(len < 600);
	for (size_t i = 0; i < 32768; i++)
		d[i] = (struct sc_meta_desc){.length = 4096,
					     .remote_addr = 0x7f0000000000ull + (i % 16384) * 65536 +
							    (i / 16384) * 32768,
					     .rkey = 9};
	CHECK_INT_EQ(runs_round_trip(d, 32768, &len, &us), 0);
	printf("  2 interleaved strided runs of 16384, one rkey: %zu bytes of text\n", len);
	CHECK(len < 600);
	for (size_t l = 0; l < 64; l++)
		for (size_t b = 0; b < 256; b++)
			d[l * 256 + b] = (struct sc_meta_desc){
			    .length = 32768,
			    .remote_addr = 0x7f0000000000ull + l * (8192ull * 32768) + (b + 17) * 32768,
			    .rkey = 9};
	CHECK_INT_EQ(runs_round_trip(d, 64 * 256, &len, &us), 0);
	printf("  64 layers x 256 consecutive blocks, one rkey: %zu bytes of text\n", len);
	CHECK(len < 4096);
	free(d);
}

/* Hand-built runs that a key holder could sign: each refused with its own message. */
TEST(runs_malformed)
{
	rings_setup();
	struct raw_md st;
	char msg[SC_ERR_MSG_MAX];
	RdmaSidecar__V1__RemoteRun r[2];
	RdmaSidecar__V1__RemoteRun *rp[2] = {&r[0], &r[1]};
	uint64_t idx[3] = {4, 1, 2};
	int64_t dl[3] = {2, -1, -5};
#define RUNS_RESET()                                                                               \
	do {                                                                                       \
		raw_sample(&st);                                                                   \
		st.m.version = 2;                                                                  \
		st.m.n_descriptors = 0;                                                            \
		st.m.descriptors = NULL;                                                           \
		for (int i_ = 0; i_ < 2; i_++) {                                                   \
			rdma_sidecar__v1__remote_run__init(&r[i_]);                                \
			r[i_].length = 64;                                                         \
			r[i_].count = 3;                                                           \
			r[i_].base_addr = 0x1000;                                                  \
			r[i_].stride = 64;                                                         \
		}                                                                                  \
		st.m.runs = rp;                                                                    \
		st.m.n_runs = 2;                                                                   \
	} while (0)
#define EXPECT_RUNS(code, want)                                                                    \
	do {                                                                                       \
		char *t_ = sign_raw(ring_a, &st.m);                                                \
		enum sc_status c_ = verify_code(ring_a, t_, NULL, NOW, msg, sizeof(msg));          \
		free(t_);                                                                          \
		CHECK_STR_EQ(sc_status_name(c_), sc_status_name(code));                            \
		if (want)                                                                          \
			CHECK_STR_CONTAINS(msg, (const char *)want);                               \
	} while (0)
	RUNS_RESET();
	EXPECT_RUNS(SC_OK, NULL);
	r[1].indices = idx;
	r[1].n_indices = 3;
	EXPECT_RUNS(SC_OK, NULL);
	r[1].n_indices = 2;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "run 1 has 2 indices for count 3");
	RUNS_RESET();
	r[1].count = 0;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "run 1 has count 0");
	RUNS_RESET();
	r[0].length = 0;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "run 0 has length 0");
	RUNS_RESET();
	st.m.n_runs = 0;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "no descriptors");
	RUNS_RESET();
	r[1].same_indices_as = 1;
	EXPECT_RUNS(SC_OK, NULL);
	r[1].same_indices_as = 2; /* itself */
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "same_indices_as 2 is not an earlier run");
	r[1].same_indices_as = 1;
	r[0].count = 2;
	EXPECT_RUNS(SC_INVALID_ARGUMENT,
		    "same_indices_as 1 is not an earlier run of the same count");
	RUNS_RESET();
	r[0].index_deltas = dl; /* 2, 1, -4: below zero */
	r[0].n_index_deltas = 3;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "index_deltas leave 0..2^64");
	dl[2] = -1;
	EXPECT_RUNS(SC_OK, NULL);
	r[0].indices = idx;
	r[0].n_indices = 3;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "more than one of indices");
	RUNS_RESET();
	r[0].base_addr = UINT64_MAX - 100;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "run 0: address of descriptor 2 overflows");
	RUNS_RESET();
	r[0].length = UINT64_MAX / 2;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "lengths overflow");
	RUNS_RESET();
	r[0].device_kind = (RdmaSidecar__V1__DeviceKind)9;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "run 0 has unknown device kind 9");
	RUNS_RESET();
	r[0].count = UINT32_MAX;
	r[1].count = UINT32_MAX; /* 2^33 descriptors: refused before anything is allocated */
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "at most 1048576");
	RUNS_RESET();
	st.m.n_descriptors = 1; /* v2 with plain descriptors */
	st.m.descriptors = st.dp;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "version 2 has plain descriptors");
	raw_sample(&st);
	st.m.runs = rp;
	st.m.n_runs = 1;
	EXPECT_RUNS(SC_INVALID_ARGUMENT, "version 1 has runs");
#undef RUNS_RESET
#undef EXPECT_RUNS
}

TEST(raw_payload_limits)
{
	rings_setup();
	struct raw_md st;
	char msg[SC_ERR_MSG_MAX];
	char *t;
#define EXPECT_RAW(code, want)                                                                     \
	do {                                                                                       \
		t = sign_raw(ring_a, &st.m);                                                       \
		enum sc_status c_ = verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg));           \
		free(t);                                                                           \
		CHECK_STR_EQ(sc_status_name(c_), sc_status_name(code));                            \
		if (want)                                                                          \
			CHECK_STR_CONTAINS(msg, (const char *)want);                               \
	} while (0)

	raw_sample(&st);
	EXPECT_RAW(SC_OK, NULL);
	st.m.token.len = 15;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "token is 15 bytes");
	st.m.token.len = 0;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "token is 0 bytes");

	raw_sample(&st);
	st.m.nonce.len = 8;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "nonce is 8 bytes");
	st.m.nonce.len = 0; /* absent nonce is fine */
	EXPECT_RAW(SC_OK, NULL);

	raw_sample(&st);
	char *eps[SC_MAX_ENDPOINTS + 1] = {"a:1", "b:2", "c:3", "d:4", "e:5"};
	st.m.data_endpoints = eps;
	st.m.n_data_endpoints = SC_MAX_ENDPOINTS;
	EXPECT_RAW(SC_OK, NULL);
	st.m.n_data_endpoints = SC_MAX_ENDPOINTS + 1;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "5 data endpoints");
	char long_ep[81];
	memset(long_ep, 'h', 80);
	long_ep[80] = '\0';
	eps[0] = long_ep;
	st.m.n_data_endpoints = 1;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "endpoint 0 is longer");
	long_ep[79] = '\0';
	EXPECT_RAW(SC_OK, NULL);

	raw_sample(&st);
	char name[SC_NAME_MAX + 1];
	memset(name, 'n', SC_NAME_MAX);
	name[SC_NAME_MAX] = '\0';
	st.m.issuer = name;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "issuer id is longer");
	name[SC_NAME_MAX - 1] = '\0';
	EXPECT_RAW(SC_OK, NULL);
	st.m.issuer = "raw";
	name[SC_NAME_MAX - 1] = 'n';
	st.m.audience = name;
	/* audience first: a too-long audience can never match this sidecar's id */
	t = sign_raw(ring_a, &st.m);
	CHECK_INT_EQ(verify_code(ring_a, t, NULL, NOW, msg, sizeof(msg)), SC_PERMISSION_DENIED);
	CHECK_INT_EQ(verify_code(ring_a, t, name, NOW, msg, sizeof(msg)), SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(msg, "audience is longer");
	free(t);

	raw_sample(&st);
	st.ib.gid.len = 4;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "gid is 4 bytes");
	raw_sample(&st);
	char dev[65];
	memset(dev, 'd', 64);
	dev[64] = '\0';
	st.ib.device = dev;
	EXPECT_RAW(SC_INVALID_ARGUMENT, "device name is longer");

	raw_sample(&st);
	RdmaSidecar__V1__Backend bk[] = {(RdmaSidecar__V1__Backend)9,
					 RDMA_SIDECAR__V1__BACKEND__BACKEND_TCP,
					 RDMA_SIDECAR__V1__BACKEND__BACKEND_UNSPECIFIED};
	st.m.backends = bk;
	st.m.n_backends = 3;
	t = sign_raw(ring_a, &st.m);
	struct sc_metadata out;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_metadata_verify(ring_a, t, NULL, NOW, &out, &err), 0);
	free(t);
	CHECK_INT_EQ(out.backends, SC_BACKEND_BIT_TCP); /* unknown backends are ignored */
	CHECK_INT_EQ(out.kind, SC_OP_WRITABLE);
	CHECK(out.ib.present);
	CHECK_STR_EQ(out.ib.device, "rxe0");
	sc_metadata_free(&out);
#undef EXPECT_RAW
}

TEST(out_untouched_on_failure)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	sample(&md, descs);
	md.n_descs = 0;
	char *text = sign_or_die(ring_a, &md);
	struct sc_metadata out, before;
	memset(&out, 0xa5, sizeof(out));
	memcpy(&before, &out, sizeof(out));
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_metadata_verify(ring_a, text, NULL, NOW, &out, &err), -1);
	CHECK(memcmp(&out, &before, sizeof(out)) == 0);
	CHECK_INT_EQ(sc_metadata_verify(ring_a, "rsm1.AAAA", NULL, NOW, &out, &err), -1);
	CHECK(memcmp(&out, &before, sizeof(out)) == 0);
	free(text);
}

TEST(sign_rejects_unreadable_struct)
{
	rings_setup();
	struct sc_metadata md;
	struct sc_meta_desc descs[3];
	char *text = NULL;
	struct sc_err err = {0};
	sample(&md, descs);
	memset(md.issuer, 'x', sizeof(md.issuer)); /* no terminator */
	CHECK_INT_EQ(sc_metadata_sign(ring_a, &md, &text, &err), -1);
	CHECK(text == NULL);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	sample(&md, descs);
	md.n_endpoints = SC_MAX_ENDPOINTS + 1;
	CHECK_INT_EQ(sc_metadata_sign(ring_a, &md, &text, &err), -1);
	sample(&md, descs);
	md.descs = NULL;
	CHECK_INT_EQ(sc_metadata_sign(ring_a, &md, &text, &err), -1);
	sample(&md, descs);
	memset(md.ib.device, 'x', sizeof(md.ib.device));
	CHECK_INT_EQ(sc_metadata_sign(ring_a, &md, &text, &err), -1);
	md.ib.present = false; /* the device field is not read then */
	CHECK_INT_EQ(sc_metadata_sign(ring_a, &md, &text, &err), 0);
	free(text);
}

TEST(random_bytes)
{
	uint8_t a[32] = {0}, b[32] = {0}, zero[32] = {0};
	CHECK_INT_EQ(sc_random_bytes(a, sizeof(a)), 0);
	CHECK_INT_EQ(sc_random_bytes(b, sizeof(b)), 0);
	CHECK(memcmp(a, b, sizeof(a)) != 0);
	CHECK(memcmp(a, zero, sizeof(a)) != 0);
	CHECK_INT_EQ(sc_random_bytes(a, 0), 0);
}

TEST(teardown)
{
	sc_keyring_release(ring_a);
	sc_keyring_release(ring_b);
	sc_keyring_release(ring_a2);
	ring_a = ring_b = ring_a2 = NULL;
}

RUN_TESTS(T(base64url_round_trip_matches_openssl), T(base64url_rejects_bad_input),
	  T(base64_standard_rfc4648_vectors), T(round_trip_full),
	  T(round_trip_minimal_and_every_backend), T(rotation_old_key_still_verifies),
	  T(same_key_id_different_key_fails_mac), T(no_keys_sign_and_verify),
	  T(tamper_every_position), T(truncation_every_length), T(garbage),
	  T(wrong_prefix_and_empty), T(oversized_text_capped_before_decoding), T(envelope_checks),
	  T(expiry_with_skew), T(audience), T(reject_reasons), T(descriptor_sanity), T(ib_rails),
	  T(version_and_kind), T(verification_order), T(raw_payload_limits),
	  T(runs_kv_shared_block_ids), T(runs_arbitrary_offsets), T(runs_adjacent_strided), T(runs_malformed),
	  T(out_untouched_on_failure), T(sign_rejects_unreadable_struct), T(random_bytes),
	  T(teardown))
