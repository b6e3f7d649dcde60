/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/status.c: names and texts of enum sc_status, and the helpers that fill a struct sc_err.
 * Pure functions; any thread.
 */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sc_status_name(enum sc_status code)
{
	switch (code) {
#define SC_STATUS_NAME(name, value, text)                                                          \
	case SC_##name:                                                                            \
		return #name;
		SC_STATUS_MAP(SC_STATUS_NAME)
#undef SC_STATUS_NAME
	}
	return "UNKNOWN";
}

const char *sc_status_text(enum sc_status code)
{
	switch (code) {
#define SC_STATUS_TEXT(name, value, text)                                                          \
	case SC_##name:                                                                            \
		return text;
		SC_STATUS_MAP(SC_STATUS_TEXT)
#undef SC_STATUS_TEXT
	}
	return "unknown status";
}

int sc_err_set(struct sc_err *err, enum sc_status code, const char *fmt, ...)
{
	if (!err)
		return -1;
	err->code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return -1;
}

int sc_err_prefix(struct sc_err *err, const char *fmt, ...)
{
	if (!err)
		return -1;
	char prefix[SC_ERR_MSG_MAX];
	char old[SC_ERR_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	/* prefix + ": " + old, cut to fit (assembled by hand: -Wformat-truncation). */
	size_t pl = strnlen(prefix, sizeof(err->msg) - 1);
	memcpy(err->msg, prefix, pl);
	size_t len = pl;
	if (len + 2 < sizeof(err->msg)) {
		err->msg[len++] = ':';
		err->msg[len++] = ' ';
	}
	size_t ol = strnlen(old, sizeof(old));
	if (ol > sizeof(err->msg) - 1 - len)
		ol = sizeof(err->msg) - 1 - len;
	memcpy(err->msg + len, old, ol);
	err->msg[len + ol] = '\0';
	return -1;
}

void sc_err_clear(struct sc_err *err)
{
	if (!err)
		return;
	err->code = SC_OK;
	err->msg[0] = '\0';
}
