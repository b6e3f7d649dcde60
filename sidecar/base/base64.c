/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/base64.c: base64url without padding (the "rsm1." metadata text) and standard base64 with
 * padding (key files), RFC 4648. Decoders are strict: they reject characters outside the alphabet,
 * lengths that no encoder produces, misplaced padding and non-zero leftover bits, so every byte
 * string has exactly one accepted text and a changed character can never decode to the same bytes.
 * Pure functions; any thread. Results are malloc'd and owned by the caller.
 */
#include "base/base64.h"

#include <stdlib.h>
#include <string.h>

static const char b64url_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* Value of c in the alphabet that uses c62/c63 for the last two values, or -1. */
static int b64_value(unsigned char c, char c62, char c63)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == (unsigned char)c62)
		return 62;
	if (c == (unsigned char)c63)
		return 63;
	return -1;
}

int sc_base64url_encode(const uint8_t *data, size_t len, char **out)
{
	*out = NULL;
	if (len > (SIZE_MAX - 1) / 4 * 3)
		return -1;
	size_t cap = (len + 2) / 3 * 4 + 1;
	char *s = malloc(cap);
	if (!s)
		return -1;
	size_t o = 0, i = 0;
	for (; i + 3 <= len; i += 3) {
		uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
		s[o++] = b64url_alphabet[v >> 18 & 63];
		s[o++] = b64url_alphabet[v >> 12 & 63];
		s[o++] = b64url_alphabet[v >> 6 & 63];
		s[o++] = b64url_alphabet[v & 63];
	}
	if (len - i == 1) {
		uint32_t v = (uint32_t)data[i] << 16;
		s[o++] = b64url_alphabet[v >> 18 & 63];
		s[o++] = b64url_alphabet[v >> 12 & 63];
	} else if (len - i == 2) {
		uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8;
		s[o++] = b64url_alphabet[v >> 18 & 63];
		s[o++] = b64url_alphabet[v >> 12 & 63];
		s[o++] = b64url_alphabet[v >> 6 & 63];
	}
	s[o] = '\0';
	*out = s;
	return 0;
}

/*
 * Decode `len` alphabet characters (no padding). len % 4 == 1 is impossible; the bits left over in
 * the last character must be zero.
 */
static bool b64_decode_core(const char *text, size_t len, char c62, char c63, uint8_t **out,
			    size_t *out_len)
{
	if (len % 4 == 1)
		return false;
	size_t n = len / 4 * 3 + (len % 4 ? len % 4 - 1 : 0);
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		return false;
	size_t o = 0;
	uint32_t acc = 0;
	unsigned bits = 0;
	for (size_t i = 0; i < len; i++) {
		int v = b64_value((unsigned char)text[i], c62, c63);
		if (v < 0)
			goto bad;
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			buf[o++] = (uint8_t)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	if (acc != 0) /* non-canonical: leftover bits set */
		goto bad;
	*out = buf;
	*out_len = o;
	return true;
bad:
	free(buf);
	return false;
}

bool sc_base64url_decode(const char *text, size_t text_len, uint8_t **out, size_t *out_len)
{
	if (!text || !out || !out_len)
		return false;
	return b64_decode_core(text, text_len, '-', '_', out, out_len);
}

bool sc_base64_decode(const char *text, size_t text_len, uint8_t **out, size_t *out_len)
{
	if (!text || !out || !out_len || text_len % 4 != 0)
		return false;
	size_t pad = 0;
	if (text_len >= 1 && text[text_len - 1] == '=')
		pad++;
	if (text_len >= 2 && text[text_len - 2] == '=')
		pad++;
	/* Any other '=' is caught as a bad character by the core decoder. */
	return b64_decode_core(text, text_len - pad, '+', '/', out, out_len);
}
