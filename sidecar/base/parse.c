/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/parse.c: value parsers: HOST:PORT, sizes, durations, uid lists (and integers in a range,
 * booleans, the hostname and IPv6 checks behind HOST:PORT). conf/config.c checks every option
 * with them; the data and metrics listeners and the peer pool split their addresses with
 * sc_parse_hostport. Error messages quote the bad value and say what was expected.
 *
 * Pure functions: any thread, no state.
 */
#include "base/parse.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HOSTPORT_HINT "expected HOST:PORT (e.g. 0.0.0.0:7000)"

/* Decimal digits only, no sign, no spaces: 0, -1 on garbage, -2 past UINT64_MAX. */
static int parse_u64_digits(const char *s, const char **end, uint64_t *out)
{
	uint64_t v = 0;
	const char *p = s;
	if (!isdigit((unsigned char)*p))
		return -1;
	for (; isdigit((unsigned char)*p); p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -2;
		v = v * 10 + d;
	}
	*end = p;
	*out = v;
	return 0;
}

bool sc_valid_hostname(const char *h, size_t len)
{
	bool all_numeric = true;
	if (len == 0 || len > SC_HOST_MAX_LEN)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)h[i];
		if (!isalnum(c) && c != '.' && c != '-' && c != '_')
			return false;
		if (!isdigit(c) && c != '.')
			all_numeric = false;
	}
	if (all_numeric) { /* looks like dotted IPv4: must be one */
		char tmp[SC_HOST_MAX_LEN + 1];
		struct in_addr a;
		memcpy(tmp, h, len);
		tmp[len] = '\0';
		return inet_pton(AF_INET, tmp, &a) == 1;
	}
	return true;
}

bool sc_valid_ipv6(const char *h, size_t len)
{
	char tmp[SC_HOST_MAX_LEN + 1];
	struct in6_addr a;
	if (len == 0 || len > SC_HOST_MAX_LEN)
		return false;
	memcpy(tmp, h, len);
	tmp[len] = '\0';
	char *zone = strchr(tmp, '%');
	if (zone) {
		*zone++ = '\0';
		if (!*zone)
			return false;
		for (const char *z = zone; *z; z++)
			if (!isalnum((unsigned char)*z) && *z != '.' && *z != '-' && *z != '_')
				return false;
	}
	return inet_pton(AF_INET6, tmp, &a) == 1;
}

int sc_parse_hostport(const char *text, char *host, size_t host_cap, uint16_t *port,
		      struct sc_err *err)
{
	if (!text)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "(null): " HOSTPORT_HINT);
	const char *h, *colon;
	size_t hlen;
	if (text[0] == '[') {
		const char *close = strchr(text, ']');
		if (!close)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": missing ']' after the IPv6 address, expected "
					  "[V6]:PORT (e.g. [::1]:50051)",
					  SC_VALUE_SHOWN, text);
		h = text + 1;
		hlen = (size_t)(close - h);
		if (hlen == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": empty host, " HOSTPORT_HINT, SC_VALUE_SHOWN,
					  text);
		if (!sc_valid_ipv6(h, hlen))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": \"%.*s\" is not an IPv6 address, expected "
					  "[V6]:PORT (e.g. [::1]:50051)",
					  SC_VALUE_SHOWN, text,
					  (int)(hlen > SC_VALUE_SHOWN ? SC_VALUE_SHOWN : hlen), h);
		if (close[1] != ':')
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": missing port, expected [V6]:PORT (e.g. "
					  "[::1]:50051)",
					  SC_VALUE_SHOWN, text);
		colon = close + 1;
	} else {
		colon = strrchr(text, ':');
		if (!colon)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": missing port, " HOSTPORT_HINT, SC_VALUE_SHOWN,
					  text);
		if (memchr(text, ':', (size_t)(colon - text)))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": an IPv6 address needs brackets, e.g. "
					  "[::1]:50051",
					  SC_VALUE_SHOWN, text);
		h = text;
		hlen = (size_t)(colon - text);
		if (hlen == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": empty host, " HOSTPORT_HINT, SC_VALUE_SHOWN,
					  text);
		if (hlen > SC_HOST_MAX_LEN || !sc_valid_hostname(h, hlen))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "\"%.*s\": bad host, expected a hostname, an IPv4 address "
			    "or [V6] (e.g. 0.0.0.0:7000)",
			    SC_VALUE_SHOWN, text);
	}

	const char *ps = colon + 1, *end;
	uint64_t p;
	if (!*ps)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": missing port, " HOSTPORT_HINT, SC_VALUE_SHOWN, text);
	int rc = parse_u64_digits(ps, &end, &p);
	if (rc == -1 || (rc == 0 && *end))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": port \"%.*s\" is not a number, " HOSTPORT_HINT,
				  SC_VALUE_SHOWN, text, SC_VALUE_SHOWN, ps);
	if (rc == -2 || p > 65535)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": port %.*s is out of range, use 0-65535", SC_VALUE_SHOWN,
				  text, SC_VALUE_SHOWN, ps);

	if (host && host_cap) {
		if (hlen >= host_cap)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": host is longer than %zu characters",
					  SC_VALUE_SHOWN, text, host_cap - 1);
		memcpy(host, h, hlen);
		host[hlen] = '\0';
	}
	if (port)
		*port = (uint16_t)p;
	return 0;
}

int sc_parse_size(const char *text, uint64_t *out, struct sc_err *err)
{
	static const struct {
		const char *suffix;
		uint64_t mult;
	} units[] = {
	    {"", 1},	  {"b", 1},    {"k", SC_KIB},   {"kb", SC_KIB},  {"kib", SC_KIB},
	    {"m", SC_MIB},	  {"mb", SC_MIB}, {"mib", SC_MIB}, {"g", SC_GIB},   {"gb", SC_GIB},
	    {"gib", SC_GIB}, {"t", SC_TIB},  {"tb", SC_TIB},  {"tib", SC_TIB},
	};
	const char *end;
	uint64_t v;
	if (!text)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "(null): expected a size");
	if (text[0] == '-')
		return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\": a size cannot be negative",
				  SC_VALUE_SHOWN, text);
	int rc = parse_u64_digits(text, &end, &v);
	if (rc == -2)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": too large (at most 18446744073709551615 bytes)",
				  SC_VALUE_SHOWN, text);
	if (rc == 0) {
		for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
			if (strcasecmp(end, units[i].suffix) != 0)
				continue;
			if (v > UINT64_MAX / units[i].mult)
				return sc_err_set(err, SC_INVALID_ARGUMENT,
						  "\"%.*s\": too large (at most 16 EiB)",
						  SC_VALUE_SHOWN, text);
			*out = v * units[i].mult;
			return 0;
		}
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "\"%.*s\": expected a size in bytes with an optional K, M, G or T "
			  "(powers of 1024), e.g. 4096, 64KiB, 8M, 1GiB",
			  SC_VALUE_SHOWN, text);
}

int sc_parse_duration_ms(const char *text, uint64_t *out, struct sc_err *err)
{
	static const struct {
		const char *suffix;
		uint64_t mult;
	} units[] = {
	    {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60 * 1000}, {"h", 60 * 60 * 1000},
	};
	const char *end;
	uint64_t v;
	if (!text)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "(null): expected a duration");
	if (text[0] == '-')
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": a duration cannot be negative", SC_VALUE_SHOWN, text);
	int rc = parse_u64_digits(text, &end, &v);
	for (size_t i = 0; rc != -1 && i < sizeof(units) / sizeof(units[0]); i++) {
		if (rc == 0 && strcmp(end, units[i].suffix) != 0)
			continue;
		if (rc == -2 || v > UINT64_MAX / units[i].mult)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": too large (at most 18446744073709551615 ms)",
					  SC_VALUE_SHOWN, text);
		*out = v * units[i].mult;
		return 0;
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "\"%.*s\": expected a duration: a number with ms, s, m or h (plain "
			  "number = ms), e.g. 1500, 500ms, 30s, 2m, 1h",
			  SC_VALUE_SHOWN, text);
}

int sc_parse_int_range(const char *text, long long min, long long max, long long *out,
		       struct sc_err *err)
{
	const char *p = text, *end;
	bool neg = false;
	uint64_t v;
	if (*p == '-' && min < 0) {
		neg = true;
		p++;
	}
	int rc = parse_u64_digits(p, &end, &v);
	if (rc == 0 && *end == '\0' && v <= (uint64_t)LLONG_MAX) {
		long long s = neg ? -(long long)v : (long long)v;
		if (s >= min && s <= max) {
			*out = s;
			return 0;
		}
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "\"%.*s\": expected an integer from %lld to %lld", SC_VALUE_SHOWN, text, min,
			  max);
}

int sc_parse_bool(const char *text, bool *out, struct sc_err *err)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(text, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\": expected 1/true/yes or 0/false/no",
			  SC_VALUE_SHOWN, text);
}

int sc_parse_uid_list(const char *text, uint32_t *uids, size_t cap, size_t *n, struct sc_err *err)
{
	size_t k = 0;
	const char *p = text;
	if (!*p)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "\"\": expected uids, e.g. 0,1000");
	for (;;) {
		char *end;
		if (!isdigit((unsigned char)*p))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.200s\": expected a comma list of numeric uids, e.g. "
					  "0,1000",
					  text);
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (errno || v > UINT32_MAX - 1 || (*end && *end != ','))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.200s\": expected a comma list of numeric uids, e.g. "
					  "0,1000",
					  text);
		if (k >= cap)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.200s\": at most %zu uids",
					  text, cap);
		uids[k++] = (uint32_t)v;
		if (!*end)
			break;
		p = end + 1;
	}
	*n = k;
	return 0;
}

int sc_parse_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}
