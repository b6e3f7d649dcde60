/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_metadata.c: libFuzzer target for sc_metadata_verify (sidecar/meta/metadata.c, base/base64.c, meta/keys.c).
 * Each input is verified twice:
 *   1. as the text itself, against a fixed keyring (prefix, base64url, envelope, key id, MAC);
 *   2. unless it starts with "rsm1.", as a payload that this file signs with the ring's key, so the
 *      steps after the MAC (payload parse, version, expiry, audience, descriptor sanity) see
 *      arbitrary bytes too.
 * Accepted metadata must satisfy the struct's invariants and survive sign -> verify unchanged;
 * anything else aborts so libFuzzer reports it.
 * Built with -DSC_FUZZ_GEN_SEEDS (no libFuzzer) it instead writes a seed corpus of valid texts and
 * payloads into the directory named by argv[1]. Single-threaded; the ring lives for the process.
 * The "fixed" key is the byte pattern 0..31, made at start-up: a fixture, not a secret.
 */
#include "meta/keys.h"
#include "meta/metadata.h"

#include "rdma_sidecar/v1/sidecar.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#define FUZZ_NOW 1700000000000ull
#define FUZZ_SELF "fuzz-self"

static struct sc_keyring *ring;

static void ring_init(void)
{
	if (ring)
		return;
	unsigned char k1[32], k2[48];
	for (size_t i = 0; i < sizeof(k1); i++)
		k1[i] = (unsigned char)i;
	for (size_t i = 0; i < sizeof(k2); i++)
		k2[i] = (unsigned char)(0x80 + i);
	char b1[64], b2[80], text[200];
	EVP_EncodeBlock((unsigned char *)b1, k1, (int)sizeof(k1));
	EVP_EncodeBlock((unsigned char *)b2, k2, (int)sizeof(k2));
	snprintf(text, sizeof(text), "fz1:%s\nfz2:%s\n", b1, b2);
	struct sc_err err = {0};
	if (sc_keyring_parse(text, strlen(text), &ring, &err) != 0) {
		fprintf(stderr, "fuzz ring: %s\n", err.msg);
		abort();
	}
}

/* Sign raw payload bytes with key_id, as sc_metadata_sign would, and return the text. */
static char *sign_payload(const char *key_id, const uint8_t *payload, size_t len)
{
	uint8_t mac[SC_HMAC_LEN];
	const void *parts[] = {"rsm1", "", key_id, "", payload};
	size_t lens[] = {4, 1, strlen(key_id), 1, len};
	if (!sc_keyring_hmac(ring, key_id, parts, lens, 5, mac))
		abort();
	RdmaSidecar__V1__SignedMetadata s = RDMA_SIDECAR__V1__SIGNED_METADATA__INIT;
	s.key_id = (char *)key_id;
	s.payload.data = (uint8_t *)payload;
	s.payload.len = len;
	s.mac.data = mac;
	s.mac.len = sizeof(mac);
	size_t n = rdma_sidecar__v1__signed_metadata__get_packed_size(&s);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		abort();
	rdma_sidecar__v1__signed_metadata__pack(&s, buf);
	char *b64 = NULL;
	if (sc_base64url_encode(buf, n, &b64) != 0)
		abort();
	free(buf);
	size_t bl = strlen(b64);
	char *text = malloc(bl + 6);
	if (!text)
		abort();
	memcpy(text, "rsm1.", 5);
	memcpy(text + 5, b64, bl + 1);
	free(b64);
	return text;
}

static void check_invariants(const struct sc_metadata *md)
{
	if (md->version < 1 || md->version > SC_METADATA_VERSION)
		abort();
	if (md->kind != SC_OP_READABLE && md->kind != SC_OP_WRITABLE)
		abort();
	if (!memchr(md->issuer, 0, sizeof(md->issuer)) ||
	    !memchr(md->audience, 0, sizeof(md->audience)) ||
	    !memchr(md->key_id, 0, sizeof(md->key_id)) ||
	    !memchr(md->ib.device, 0, sizeof(md->ib.device)))
		abort();
	if (md->audience[0] && strcmp(md->audience, FUZZ_SELF) != 0)
		abort();
	if (md->n_endpoints > SC_MAX_ENDPOINTS)
		abort();
	for (size_t i = 0; i < md->n_endpoints; i++) {
		if (!memchr(md->endpoints[i], 0, sizeof(md->endpoints[i])))
			abort();
	}
	if (md->n_descs == 0 || md->n_descs > SC_METADATA_MAX_DESCS || !md->descs)
		abort();
	uint64_t total = 0;
	for (size_t i = 0; i < md->n_descs; i++) {
		if (md->descs[i].length == 0 || md->descs[i].length > UINT64_MAX - total)
			abort();
		total += md->descs[i].length;
	}
	/* Field 17: the other ibverbs rails, numbers 1..15 each once, one rkey per group. */
	if (md->n_ib_rails > SC_MAX_IB_RAILS - 1 || (md->n_ib_rails && !md->ib_rkeys))
		abort();
	uint32_t seen = 0;
	for (size_t j = 0; j < md->n_ib_rails; j++) {
		uint32_t k = md->ib_rails[j].index;
		if (k == 0 || k >= SC_MAX_IB_RAILS || (seen & (1u << k)) ||
		    !memchr(md->ib_rails[j].ep.device, 0, sizeof(md->ib_rails[j].ep.device)))
			abort();
		seen |= 1u << k;
	}
	if (md->n_ib_rails &&
	    md->n_ib_groups != sc_metadata_rkey_groups(md->descs, md->n_descs, NULL))
		abort();
	if (md->expires_unix_ms == 0 || (FUZZ_NOW > md->expires_unix_ms &&
					 FUZZ_NOW - md->expires_unix_ms > SC_METADATA_SKEW_MS))
		abort();
}

/* Accepted metadata re-signed must verify to the same struct. The signer keeps the runs it was
 * read with (run_start), and within a run writes no more indices than it read (it may cut out a
 * strided stretch of 32 or more as a run of its own), so only text already near the size limit
 * may come out too large to sign. */
static void check_resign(const struct sc_metadata *md, size_t in_len)
{
	char *text = NULL;
	struct sc_err err = {0};
	if (sc_metadata_sign(ring, md, &text, &err) != 0) {
		if (in_len > SC_METADATA_MAX_TEXT / 2 && strstr(err.msg, "would be larger"))
			return;
		fprintf(stderr, "re-sign failed: %s (%zu descriptors)\n", err.msg, md->n_descs);
		abort();
	}
	struct sc_metadata again;
	if (sc_metadata_verify(ring, text, FUZZ_SELF, FUZZ_NOW, &again, &err) != 0)
		abort();
	free(text);
	if (again.n_descs != md->n_descs)
		abort();
	const struct sc_metadata *a = &again, *b = md;
	bool same = a->version == b->version && strcmp(a->issuer, b->issuer) == 0 &&
		    strcmp(a->audience, b->audience) == 0 && a->kind == b->kind &&
		    memcmp(a->token, b->token, SC_TOKEN_LEN) == 0 &&
		    a->n_endpoints == b->n_endpoints && a->backends == b->backends &&
		    a->ib.present == b->ib.present && a->issued_unix_ms == b->issued_unix_ms &&
		    a->expires_unix_ms == b->expires_unix_ms &&
		    memcmp(a->nonce, b->nonce, SC_TOKEN_LEN) == 0 && a->max_uses == b->max_uses;
	for (size_t i = 0; same && i < a->n_endpoints; i++)
		same = strcmp(a->endpoints[i], b->endpoints[i]) == 0;
	if (same && a->ib.present)
		same = memcmp(a->ib.gid, b->ib.gid, 16) == 0 && a->ib.lid == b->ib.lid &&
		       a->ib.port == b->ib.port && a->ib.mtu == b->ib.mtu &&
		       strcmp(a->ib.device, b->ib.device) == 0;
	same = same && a->n_ib_rails == b->n_ib_rails &&
	       (!a->n_ib_rails || a->n_ib_groups == b->n_ib_groups);
	for (size_t j = 0; same && j < a->n_ib_rails; j++) {
		const struct sc_ib_rail *x = &a->ib_rails[j], *y = &b->ib_rails[j];
		same = x->index == y->index && memcmp(x->ep.gid, y->ep.gid, 16) == 0 &&
		       x->ep.lid == y->ep.lid && x->ep.port == y->ep.port &&
		       x->ep.mtu == y->ep.mtu && strcmp(x->ep.device, y->ep.device) == 0;
		for (size_t g = 0; same && g < a->n_ib_groups; g++)
			same = a->ib_rkeys[j * a->n_ib_groups + g] ==
			       b->ib_rkeys[j * b->n_ib_groups + g];
	}
	for (size_t i = 0; same && i < a->n_descs; i++)
		same = a->descs[i].length == b->descs[i].length &&
		       a->descs[i].device_kind == b->descs[i].device_kind &&
		       a->descs[i].remote_addr == b->descs[i].remote_addr &&
		       a->descs[i].rkey == b->descs[i].rkey;
	if (!same)
		abort();
	sc_metadata_free(&again);
}

static void verify_one(const char *text)
{
	struct sc_metadata md;
	struct sc_err err = {0};
	if (sc_metadata_verify(ring, text, FUZZ_SELF, FUZZ_NOW, &md, &err) != 0) {
		if (err.code == SC_OK || !memchr(err.msg, 0, sizeof(err.msg)))
			abort();
		return;
	}
	check_invariants(&md);
	check_resign(&md, strlen(text));
	sc_metadata_free(&md);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ring_init();
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	verify_one(text);
	free(text);
	if (size < 5 || memcmp(data, "rsm1.", 5) != 0) {
		text = sign_payload(size % 2 ? "fz2" : "fz1", data, size);
		verify_one(text);
		free(text);
	}
	return 0;
}

#ifdef SC_FUZZ_GEN_SEEDS
static void write_seed(const char *dir, const char *name, const void *data, size_t len)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
		return 2;
	}
	ring_init();
	struct sc_meta_desc descs[16];
	for (size_t i = 0; i < 16; i++)
		descs[i] =
		    (struct sc_meta_desc){.length = 4096u << (i % 8),
					  .device_kind = i % 3 ? SC_DEVICE_HOST : SC_DEVICE_CUDA,
					  .remote_addr = 0x7f0000000000ull + i * 0x100000,
					  .rkey = (uint32_t)(0x1000 + i)};
	/* KV-cache shaped (seed 5): 4 layer tensors (rkeys) x the same 4 block ids, version 2 runs
	 * with shared indices; seed 6 has ascending ids (deltas). Seed 4 is version 1 (plain). */
	struct sc_meta_desc kv[16];
	static const uint64_t ids[2][4] = {{7, 2, 9, 3}, {1, 2, 4, 40}};
	for (int v = 0; v < 7; v++) {
		struct sc_metadata md = {0};
		md.version = v == 4 ? 1 : SC_METADATA_VERSION;
		for (size_t i = 0; v >= 5 && i < 16; i++)
			kv[i] = (struct sc_meta_desc){.length = 32768,
						      .device_kind = SC_DEVICE_HOST,
						      .remote_addr = 0x7f0000000000ull +
								     (i / 4) * 0x10000000 +
								     ids[v - 5][i % 4] * 32768,
						      .rkey = (uint32_t)(0x2000 + i / 4)};
		snprintf(md.issuer, sizeof(md.issuer), "issuer-%d", v);
		if (v == 1)
			snprintf(md.audience, sizeof(md.audience), FUZZ_SELF);
		md.kind = v % 2 ? SC_OP_WRITABLE : SC_OP_READABLE;
		for (int i = 0; i < SC_TOKEN_LEN; i++) {
			md.token[i] = (uint8_t)(v * 16 + i);
			md.nonce[i] = (uint8_t)(0xff - i);
		}
		if (v >= 1) {
			snprintf(md.endpoints[0], sizeof(md.endpoints[0]), "10.0.0.%d:7001", v);
			md.n_endpoints = 1;
		}
		if (v == 3) {
			snprintf(md.endpoints[1], sizeof(md.endpoints[1]), "[fd00::%d]:7001", v);
			md.n_endpoints = 2;
		}
		md.backends = (unsigned)(v == 0 ? SC_BACKEND_BIT_TCP
						: SC_BACKEND_BIT_TCP | SC_BACKEND_BIT_IBVERBS);
		if (v >= 2) {
			md.ib.present = true;
			for (int i = 0; i < 16; i++)
				md.ib.gid[i] = (uint8_t)(0xfe - i);
			md.ib.lid = 3;
			md.ib.port = 1;
			md.ib.mtu = 4096;
			snprintf(md.ib.device, sizeof(md.ib.device), "mlx5_%d", v);
		}
		md.descs = v >= 5 ? kv : descs;
		md.n_descs = v == 3 || v >= 5 ? 16 : (size_t)v + 1;
		/* Seed 5 (the KV shape, 4 rkeys) also lists two more ibverbs rails (field 17). */
		uint32_t rail_rkeys[2 * 4] = {0x31, 0x32, 0x33, 0x34, 0x41, 0x42, 0x43, 0x44};
		if (v == 5) {
			md.n_ib_rails = 2;
			md.ib_rkeys = rail_rkeys;
			md.n_ib_groups = 4;
			for (uint32_t j = 0; j < 2; j++) {
				md.ib_rails[j].index = j + 1;
				md.ib_rails[j].ep = md.ib;
				md.ib_rails[j].ep.gid[15] = (uint8_t)j;
			}
		}
		md.issued_unix_ms = FUZZ_NOW - 1000;
		md.expires_unix_ms = FUZZ_NOW + 60000;
		md.max_uses = (uint32_t)v;
		char *text = NULL;
		struct sc_err err = {0};
		if (sc_metadata_sign(ring, &md, &text, &err) != 0) {
			fprintf(stderr, "sign: %s\n", err.msg);
			return 1;
		}
		char name[64];
		snprintf(name, sizeof(name), "text-%d", v);
		write_seed(argv[1], name, text, strlen(text));
		/* The payload alone, for the signed-payload path: decode the text back. */
		uint8_t *env = NULL;
		size_t env_len = 0;
		if (!sc_base64url_decode(text + 5, strlen(text + 5), &env, &env_len))
			return 1;
		RdmaSidecar__V1__SignedMetadata *s =
		    rdma_sidecar__v1__signed_metadata__unpack(NULL, env_len, env);
		if (!s)
			return 1;
		snprintf(name, sizeof(name), "payload-%d", v);
		write_seed(argv[1], name, s->payload.data, s->payload.len);
		rdma_sidecar__v1__signed_metadata__free_unpacked(s, NULL);
		free(env);
		/* Check the seeds pass through the target. */
		LLVMFuzzerTestOneInput((const uint8_t *)text, strlen(text));
		free(text);
	}
	sc_keyring_release(ring);
	printf("wrote 8 seeds to %s\n", argv[1]);
	return 0;
}
#endif
