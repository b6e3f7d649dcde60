/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/base64.h: base64url without padding (metadata text) and standard base64 (key files), in
 * base/base64.c. Pure functions; any thread.
 */
#ifndef SC_BASE64_H
#define SC_BASE64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* base64url without padding. encode: *out malloc'd, NUL-terminated. decode: false on bad input. */
int sc_base64url_encode(const uint8_t *data, size_t len, char **out);
bool sc_base64url_decode(const char *text, size_t text_len, uint8_t **out, size_t *out_len);
/* Standard base64 (with padding), for key files. */
bool sc_base64_decode(const char *text, size_t text_len, uint8_t **out, size_t *out_len);

#endif
