/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_keys.c: libFuzzer target for the --key-file parser (sc_keyring_parse, sidecar/meta/keys.c). The
 * input is the file's text. A ring that parses must have 1..SC_KEYS_MAX keys, a valid signing id,
 * and sign with it (HMAC), else abort; a refusal must say why (err.code set, message non-empty).
 * Built with -DSC_FUZZ_GEN_SEEDS (no libFuzzer) it writes a seed corpus into argv[1]: key files
 * as operators and the tests write them (one key, several keys, comments and blank lines, CRLF,
 * 128-byte keys) plus a few a careless operator would (short key, duplicate id). Single-threaded.
 * The keys in the seeds are fixed byte patterns: fixtures, not secrets.
 */
#include "meta/keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#ifndef SC_FUZZ_GEN_SEEDS

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	if (sc_keyring_parse((const char *)data, size, &ring, &err) != 0) {
		if (err.code == SC_OK || !err.msg[0] || ring)
			abort();
		return 0;
	}
	size_t n = sc_keyring_count(ring);
	const char *id = sc_keyring_signing_id(ring);
	if (n == 0 || !id || !sc_key_id_valid(id, strlen(id)))
		abort();
	uint8_t mac[SC_HMAC_LEN];
	const void *parts[] = {"x"};
	size_t lens[] = {1};
	if (!sc_keyring_hmac(ring, id, parts, lens, 1, mac))
		abort();
	sc_keyring_release(sc_keyring_retain(ring));
	sc_keyring_release(ring);
	return 0;
}

#else

static void b64(const unsigned char *raw, size_t n, char *out)
{
	EVP_EncodeBlock((unsigned char *)out, raw, (int)n);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
		return 2;
	}
	unsigned char k32[32], k48[48], k128[128], k16[16];
	for (size_t i = 0; i < sizeof(k128); i++) {
		k128[i] = (unsigned char)(i * 3 + 1);
		if (i < sizeof(k48))
			k48[i] = (unsigned char)(0x80 + i);
		if (i < sizeof(k32))
			k32[i] = (unsigned char)i;
		if (i < sizeof(k16))
			k16[i] = (unsigned char)(0xf0 - i);
	}
	char a[64], b[80], c[200], d[32];
	b64(k32, sizeof(k32), a);
	b64(k48, sizeof(k48), b);
	b64(k128, sizeof(k128), c);
	b64(k16, sizeof(k16), d);
	char seeds[8][1024];
	int n = 0;
	snprintf(seeds[n++], 1024, "k1:%s\n", a);
	snprintf(seeds[n++], 1024, "prod-2:%s\nprod-1:%s\n", b, a);
	snprintf(seeds[n++], 1024, "# rotated 2026-01\n\nnew.key_1:%s\nold:%s\n", c, a);
	snprintf(seeds[n++], 1024, "crlf:%s\r\nsecond:%s\r\n", a, b);
	snprintf(seeds[n++], 1024, "k1:%s", a);
	snprintf(seeds[n++], 1024, "short:%s\n", d);
	snprintf(seeds[n++], 1024, "dup:%s\ndup:%s\n", a, b);
	snprintf(seeds[n++], 1024, "  spaced : %s  \n", a);
	for (int i = 0; i < n; i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/keys-%02d", argv[1], i);
		FILE *f = fopen(path, "wb");
		if (!f) {
			perror(path);
			return 1;
		}
		fwrite(seeds[i], 1, strlen(seeds[i]), f);
		fclose(f);
	}
	printf("%d seeds in %s\n", n, argv[1]);
	return 0;
}

#endif
