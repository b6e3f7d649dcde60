/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conf/rail_filter.c: the --ib-devices list (conf/rail_filter.h): parsing, and which ports it
 * keeps in which order. Pure functions over their arguments; any thread.
 */
#include "conf/rail_filter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == '-';
}

/* One "name[:port]" of length len at s into e. */
static int parse_entry(const char *s, size_t len, struct sc_rail_filter_entry *e,
		       struct sc_err *err)
{
	size_t name_len = 0;
	while (name_len < len && s[name_len] != ':')
		name_len++;
	if (name_len == 0 || name_len >= sizeof(e->device))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"%.*s\": expected a device name of 1-63 characters, e.g. mlx5_0 "
				  "or mlx5_0:1",
				  (int)len, s);
	for (size_t i = 0; i < name_len; i++)
		if (!name_char(s[i]))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "\"%.*s\": a device name has only A-Z a-z 0-9 _ . -",
					  (int)len, s);
	memcpy(e->device, s, name_len);
	e->device[name_len] = 0;
	e->port = 0;
	if (name_len == len)
		return 0;
	const char *p = s + name_len + 1;
	size_t plen = len - name_len - 1;
	int port = 0;
	if (plen == 0 || plen > 3)
		goto bad_port;
	for (size_t i = 0; i < plen; i++) {
		if (p[i] < '0' || p[i] > '9')
			goto bad_port;
		port = port * 10 + (p[i] - '0');
	}
	if (port < 1 || port > 255)
		goto bad_port;
	e->port = port;
	return 0;
bad_port:
	return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\": the port after ':' is 1-255",
			  (int)len, s);
}

int sc_rail_filter_parse(const char *text, struct sc_rail_filter *out, struct sc_err *err)
{
	struct sc_rail_filter f;
	memset(&f, 0, sizeof(f));
	if (!text || !text[0] || strcmp(text, "auto") == 0) {
		*out = f;
		return 0;
	}
	const char *s = text;
	if (*s == '^') {
		f.exclude = true;
		s++;
	}
	if (!*s)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "\"^\" needs the devices to leave out, e.g. ^mlx5_1");
	while (*s) {
		const char *end = strchr(s, ',');
		size_t len = end ? (size_t)(end - s) : strlen(s);
		if (f.n == SC_RAIL_FILTER_MAX)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "more than %d devices",
					  SC_RAIL_FILTER_MAX);
		if (parse_entry(s, len, &f.e[f.n], err) != 0)
			return -1;
		for (size_t i = 0; i < f.n; i++)
			if (strcmp(f.e[i].device, f.e[f.n].device) == 0 &&
			    f.e[i].port == f.e[f.n].port)
				return sc_err_set(err, SC_INVALID_ARGUMENT, "\"%.*s\" is listed twice",
						  (int)len, s);
		f.n++;
		if (!end)
			break;
		s = end + 1;
		if (!*s)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "a trailing ','");
	}
	*out = f;
	return 0;
}

static bool entry_matches(const struct sc_rail_filter_entry *e, const char *device, int port)
{
	return strcmp(e->device, device) == 0 && (e->port == 0 || e->port == port);
}

int sc_rail_filter_rank(const struct sc_rail_filter *f, const char *device, int port)
{
	for (size_t i = 0; i < f->n; i++)
		if (entry_matches(&f->e[i], device, port))
			return f->exclude ? -1 : (int)i;
	return f->exclude || f->n == 0 ? 0 : -1;
}

bool sc_rail_filter_names(const struct sc_rail_filter *f, const char *device)
{
	for (size_t i = 0; i < f->n; i++)
		if (strcmp(f->e[i].device, device) == 0)
			return true;
	return false;
}
