/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/parse.h: value parsers (base/parse.c): HOST:PORT, sizes, durations, integers in a range,
 * booleans, uid lists, and the host checks behind them. Each returns 0, or -1 with err
 * INVALID_ARGUMENT and a message that quotes the value (at most SC_VALUE_SHOWN characters of it).
 * Pure functions; any thread.
 */
#ifndef SC_PARSE_H
#define SC_PARSE_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SC_HOST_MAX_LEN 255
#define SC_VALUE_SHOWN 200 /* at most this much of a bad value is echoed in an error message */
#define SC_KIB (UINT64_C(1) << 10)
#define SC_MIB (UINT64_C(1) << 20)
#define SC_GIB (UINT64_C(1) << 30)
#define SC_TIB (UINT64_C(1) << 40)

/*
 * Split "host:port", "[v6]:port" into host (without brackets) and port. Port must be 0..65535.
 * Returns 0, or -1 with err INVALID_ARGUMENT.
 */
int sc_parse_hostport(const char *text, char *host, size_t host_cap, uint16_t *port,
		      struct sc_err *err);
/* "64MiB", "4k", "1G", "123" -> bytes. Returns 0 or -1 with err. */
/* The value of hex digit c (either case), or -1. Pure. */
int sc_parse_hex_digit(char c);
int sc_parse_size(const char *text, uint64_t *out, struct sc_err *err);
/* "500ms", "30s", "2m", "1h", "1500" (ms) -> milliseconds. Returns 0 or -1 with err. */
int sc_parse_duration_ms(const char *text, uint64_t *out, struct sc_err *err);
/* Decimal integer in [min, max], with an optional leading '-' when min < 0. */
int sc_parse_int_range(const char *text, long long min, long long max, long long *out,
		       struct sc_err *err);
/* 1/true/yes/on or 0/false/no/off, any case. */
int sc_parse_bool(const char *text, bool *out, struct sc_err *err);
/* "0,1000,65532" -> uids (at most cap). 0 or -1 with err. */
int sc_parse_uid_list(const char *text, uint32_t *uids, size_t cap, size_t *n, struct sc_err *err);

/* A hostname of letters, digits, '.', '-', '_' (1-SC_HOST_MAX_LEN characters); all digits and dots
 * must be a dotted IPv4 address. */
bool sc_valid_hostname(const char *h, size_t len);
/* An IPv6 literal, optionally with a %zone suffix. */
bool sc_valid_ipv6(const char *h, size_t len);

#endif
