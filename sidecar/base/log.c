/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/log.c: formats one log line and writes it to stderr with a single write(2), so lines from
 * different threads never interleave. Any thread. The level and format are set once at start-up
 * (sc_log_configure) before other threads exist, and read with relaxed atomics after.
 * Control characters in a message are escaped in both formats (text: \n, \xHH; JSON: \u00HH),
 * so one call writes exactly one line whatever text a worker or a peer managed to put into it.
 * The rate limiter's table (sc_log_limited) is guarded by its own mutex, held only to decide.
 */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = SC_LOG_INFO;
static atomic_bool g_json = false;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

void sc_log_configure(enum sc_log_level level, bool json)
{
	atomic_store(&g_level, (int)level);
	atomic_store(&g_json, json);
}

bool sc_log_level_parse(const char *text, enum sc_log_level *out)
{
	static const char *const names[] = {"debug", "info", "warn", "error", "off"};
	for (int i = 0; i <= SC_LOG_OFF; i++) {
		if (strcasecmp(text, names[i]) == 0) {
			*out = (enum sc_log_level)i;
			return true;
		}
	}
	if (strcasecmp(text, "warning") == 0) {
		*out = SC_LOG_WARN;
		return true;
	}
	return false;
}

bool sc_log_enabled(enum sc_log_level level)
{
	return (int)level >= atomic_load_explicit(&g_level, memory_order_relaxed);
}

/* Append s to buf as a JSON string body (no quotes). Returns the new length. */
static size_t json_escape(char *buf, size_t len, size_t cap, const char *s)
{
	for (; *s && len + 7 < cap; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			buf[len++] = '\\';
			buf[len++] = (char)c;
		} else if (c < 0x20) {
			len += (size_t)snprintf(buf + len, cap - len, "\\u%04x", c);
		} else {
			buf[len++] = (char)c;
		}
	}
	return len;
}

/*
 * Copy s into buf for a text log line with every control character escaped (\n, \r, \t, \xHH,
 * and \\ for a backslash), so text that came from a worker or a peer (a region name, a key id)
 * can never start a forged line. Always NUL-terminates.
 */
static void text_escape(char *buf, size_t cap, const char *s)
{
	size_t len = 0;
	for (; *s && len + 5 < cap; s++) {
		unsigned char c = (unsigned char)*s;
		const char *e = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
			      : c == '\\' ? "\\\\" : NULL;
		if (e) {
			buf[len++] = e[0];
			buf[len++] = e[1];
		} else if (c < 0x20 || c == 0x7f) {
			len += (size_t)snprintf(buf + len, cap - len, "\\x%02x", c);
		} else {
			buf[len++] = (char)c;
		}
	}
	buf[len] = '\0';
}

void sc_log(enum sc_log_level level, const char *area, const char *fmt, ...)
{
	if (!sc_log_enabled(level) || level >= SC_LOG_OFF)
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[40];
	size_t wl = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + wl, sizeof(when) - wl, ".%03ldZ", ts.tv_nsec / 1000000);

	char line[4096];
	size_t len;
	if (atomic_load_explicit(&g_json, memory_order_relaxed)) {
		len = (size_t)snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"%s\",\"area\":\"",
				       when, level_names[level]);
		len = json_escape(line, len, sizeof(line), area);
		len += (size_t)snprintf(line + len, sizeof(line) - len, "\",\"msg\":\"");
		len = json_escape(line, len, sizeof(line), msg);
		len += (size_t)snprintf(line + len, sizeof(line) - len, "\"}\n");
	} else {
		char safe[sizeof(msg) * 2];
		text_escape(safe, sizeof(safe), msg);
		len = (size_t)snprintf(line, sizeof(line), "%s %-5s [%s] %s\n", when,
				       level_names[level], area, safe);
	}
	if (len >= sizeof(line)) {
		len = sizeof(line) - 1;
		line[len - 1] = '\n';
	}
	ssize_t rc = write(STDERR_FILENO, line, len);
	(void)rc;
}

struct limit_slot {
	char key[48];
	uint64_t last_ms; /* when a line last got through; 0: free slot */
	unsigned suppressed;
};

static pthread_mutex_t g_limit_mu = PTHREAD_MUTEX_INITIALIZER;
static struct limit_slot g_limits[SC_LOG_LIMIT_KEYS];

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Should a line for key go out now? *suppressed: lines held back since the last one. */
static bool limit_pass(const char *key, unsigned *suppressed)
{
	uint64_t now = mono_ms() + 1; /* never 0 */
	bool pass = false;
	pthread_mutex_lock(&g_limit_mu);
	struct limit_slot *slot = NULL, *oldest = &g_limits[0];
	for (size_t i = 0; i < SC_LOG_LIMIT_KEYS; i++) {
		struct limit_slot *s = &g_limits[i];
		if (s->last_ms && strncmp(s->key, key, sizeof(s->key) - 1) == 0) {
			slot = s;
			break;
		}
		if (s->last_ms < oldest->last_ms)
			oldest = s;
	}
	if (!slot) {
		slot = oldest;
		snprintf(slot->key, sizeof(slot->key), "%s", key);
		slot->last_ms = 0;
		slot->suppressed = 0;
	}
	if (!slot->last_ms || now >= slot->last_ms + SC_LOG_LIMIT_MS) {
		*suppressed = slot->suppressed;
		slot->suppressed = 0;
		slot->last_ms = now;
		pass = true;
	} else {
		slot->suppressed++;
	}
	pthread_mutex_unlock(&g_limit_mu);
	return pass;
}

void sc_log_limited(enum sc_log_level level, const char *area, const char *key, const char *fmt,
		    ...)
{
	if (!sc_log_enabled(level) || level >= SC_LOG_OFF)
		return;
	unsigned suppressed = 0;
	if (!limit_pass(key, &suppressed))
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (suppressed)
		sc_log(level, area, "%s (%u similar suppressed)", msg, suppressed);
	else
		sc_log(level, area, "%s", msg);
}
