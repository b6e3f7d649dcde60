/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/nkey.c: derives an NKey public key from a seed file (see nats/nkey.h): base32 decode,
 * CRC16 (XMODEM) check, Ed25519 public key from the 32-byte seed with OpenSSL, base32 encode
 * with the public key's prefix byte. Called on the lifecycle thread when NATS starts; owns
 * nothing beyond the call (the seed's bytes are wiped before returning).
 */
#include "nats/nkey.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#define SEED_RAW 36 /* 2 prefix bytes, 32 seed bytes, 2 CRC bytes */
#define PREFIX_SEED (18u << 3)

static const char b32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

static uint16_t crc16(const uint8_t *p, size_t n)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

/* Decode base32 text (no padding) into out; returns the byte count or -1. */
static int b32_decode(const char *text, size_t len, uint8_t *out, size_t cap)
{
	uint32_t acc = 0;
	int bits = 0;
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		const char *at = strchr(b32, text[i]);
		if (!at || !text[i])
			return -1;
		acc = (acc << 5) | (uint32_t)(at - b32);
		bits += 5;
		if (bits >= 8) {
			bits -= 8;
			if (n >= cap)
				return -1;
			out[n++] = (uint8_t)(acc >> bits);
		}
	}
	return (int)n;
}

static void b32_encode(const uint8_t *p, size_t n, char *out)
{
	uint32_t acc = 0;
	int bits = 0;
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		acc = (acc << 8) | p[i];
		bits += 8;
		while (bits >= 5) {
			bits -= 5;
			out[o++] = b32[(acc >> bits) & 31];
		}
	}
	if (bits > 0)
		out[o++] = b32[(acc << (5 - bits)) & 31];
	out[o] = '\0';
}

int sc_nkey_public_from_seed_file(const char *path, char pub[SC_NKEY_PUBLIC_LEN],
				  struct sc_err *err)
{
	char text[256] = "";
	uint8_t raw[SEED_RAW + 8];
	int rc = -1;
	FILE *f = fopen(path, "re");
	if (!f)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "--nats-nkey-seed %s: %s", path,
				  strerror(errno));
	size_t got = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[got] = '\0';
	/* The seed is the first word that starts with 'S' (nk writes it alone on a line). */
	char *s = text;
	while (*s && *s != 'S')
		s++;
	size_t len = 0;
	while (s[len] && !isspace((unsigned char)s[len]))
		len++;
	int n = b32_decode(s, len, raw, sizeof(raw));
	if (n != SEED_RAW) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--nats-nkey-seed %s does not hold an NKey seed (\"SU...\", 58 base32 "
			   "characters)",
			   path);
		goto out;
	}
	uint16_t want = (uint16_t)(raw[34] | raw[35] << 8);
	if (crc16(raw, 34) != want || (raw[0] & 0xf8) != PREFIX_SEED) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "--nats-nkey-seed %s: the seed's %s is wrong (a damaged or truncated file?)",
			   path, (raw[0] & 0xf8) != PREFIX_SEED ? "prefix" : "checksum");
		goto out;
	}
	uint8_t kind = (uint8_t)(((raw[0] & 7) << 5) | ((raw[1] & 0xf8) >> 3));
	EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw + 2, 32);
	uint8_t out[35];
	size_t plen = 32;
	if (!key || EVP_PKEY_get_raw_public_key(key, out + 1, &plen) != 1 || plen != 32) {
		EVP_PKEY_free(key);
		sc_err_set(err, SC_INTERNAL, "--nats-nkey-seed %s: cannot derive the public key",
			   path);
		goto out;
	}
	EVP_PKEY_free(key);
	out[0] = kind;
	uint16_t crc = crc16(out, 33);
	out[33] = (uint8_t)(crc & 0xff);
	out[34] = (uint8_t)(crc >> 8);
	b32_encode(out, sizeof(out), pub);
	rc = 0;
out:
	OPENSSL_cleanse(text, sizeof(text));
	OPENSSL_cleanse(raw, sizeof(raw));
	return rc;
}
