/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/log.c: formats one log line and writes it to stderr with a single write(2), so lines from
 * different threads never interleave. Any thread. The level and format are set once at start-up
 * (sc_log_configure) before other threads exist, and read with relaxed atomics after.
 * Control characters in a message are escaped in both formats (text: \n, \xHH; JSON: \u00HH),
 * so one call writes exactly one line whatever text a worker or a peer managed to put into it.
 * The rate limiter's table (sc_log_limited) is guarded by its own mutex, held only to decide.
 * Structured fields (struct sc_log_fields) follow the message: JSON keys after "msg", or
 * key=value pairs after the text (a value with a space, '"', '=' or '\\' is quoted logfmt-style).
 * A thread's log scope (sc_log_scope_enter) is a thread-local pointer, merged key by key.
 * Trace ids (W3C traceparent parsing, fresh ids from getrandom) live here too: they are what
 * ties the lines of one transfer together.
 */
#include "base/log.h"
#include "base/parse.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
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

static _Thread_local const struct sc_log_fields *tl_scope;

const struct sc_log_fields *sc_log_scope_enter(const struct sc_log_fields *f)
{
	const struct sc_log_fields *prev = tl_scope;
	tl_scope = f;
	return prev;
}

void sc_log_scope_leave(const struct sc_log_fields *prev)
{
	tl_scope = prev;
}

static const char *pick(const char *line_value, const char *scope_value)
{
	return line_value && line_value[0] ? line_value : scope_value;
}

/* The line's fields over the thread's scope, key by key. */
static struct sc_log_fields merge_fields(const struct sc_log_fields *f)
{
	const struct sc_log_fields *sc = tl_scope;
	struct sc_log_fields out = {0};
	/* A line about another operation than the scope's takes none of the scope's keys. */
	if (sc && f && f->op && f->op[0] && sc->op && sc->op[0] && strcmp(f->op, sc->op) != 0)
		sc = NULL;
	if (sc)
		out = *sc;
	if (!f)
		return out;
	out.op = pick(f->op, out.op);
	out.peer = pick(f->peer, out.peer);
	out.backend = pick(f->backend, out.backend);
	out.rail = pick(f->rail, out.rail);
	out.code = pick(f->code, out.code);
	out.key_id = pick(f->key_id, out.key_id);
	out.trace_id = pick(f->trace_id, out.trace_id);
	if (f->has_bytes) {
		out.bytes = f->bytes;
		out.has_bytes = true;
	}
	return out;
}

/* Append " key=value" for the text form; a value with a space, '=' or '"' is quoted, its '"'
 * written \" (control characters and '\\' are escaped by text_escape). A pair that does not fit
 * whole is left out. */
static size_t text_kv(char *line, size_t len, size_t cap, const char *key, const char *value)
{
	if (!value || !value[0])
		return len;
	char safe[512], pair[1100];
	text_escape(safe, sizeof(safe), value);
	bool quote = strpbrk(safe, " =\"") != NULL;
	size_t n = (size_t)snprintf(pair, sizeof(pair), " %s=%s", key, quote ? "\"" : "");
	for (const char *p = safe; *p && n + 3 < sizeof(pair); p++) {
		if (*p == '"')
			pair[n++] = '\\';
		pair[n++] = *p;
	}
	if (quote)
		pair[n++] = '"';
	if (n > cap - len)
		return len;
	memcpy(line + len, pair, n);
	return len + n;
}

/* Append ,"key":"value" for JSON; left out when it does not fit whole. */
static size_t json_kv(char *line, size_t len, size_t cap, const char *key, const char *value)
{
	if (!value || !value[0])
		return len;
	char pair[1200];
	size_t n = (size_t)snprintf(pair, sizeof(pair), ",\"%s\":\"", key);
	n = json_escape(pair, n, sizeof(pair) - 1, value);
	pair[n++] = '"';
	if (n > cap - len)
		return len;
	memcpy(line + len, pair, n);
	return len + n;
}

static void vlog_kv(enum sc_log_level level, const char *area, const struct sc_log_fields *lf,
		    const char *fmt, va_list ap)
{
	if (!sc_log_enabled(level) || level >= SC_LOG_OFF)
		return;
	char msg[2048];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	struct sc_log_fields f = merge_fields(lf);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[40];
	size_t wl = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + wl, sizeof(when) - wl, ".%03ldZ", ts.tv_nsec / 1000000);

	/* Room for the fields is kept back from the message (cut first). */
	char line[4096];
	const size_t tail = 1024;
	size_t cap = sizeof(line) - tail;
	size_t len;
	bool json = atomic_load_explicit(&g_json, memory_order_relaxed);
	if (json) {
		len = (size_t)snprintf(line, cap, "{\"ts\":\"%s\",\"level\":\"%s\",\"area\":\"",
				       when, level_names[level]);
		len = json_escape(line, len, cap, area);
		len += (size_t)snprintf(line + len, cap - len, "\",\"msg\":\"");
		len = json_escape(line, len, cap, msg);
		line[len++] = '"';
	} else {
		char safe[sizeof(msg) * 2];
		text_escape(safe, sizeof(safe), msg);
		len = (size_t)snprintf(line, cap, "%s %-5s [%s] %s", when, level_names[level], area,
				       safe);
		if (len >= cap)
			len = cap - 1;
	}
	cap = sizeof(line) - 3; /* the closing "}\n" */
	char bytes[24] = "";
	if (f.has_bytes)
		snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)f.bytes);
	const char *keys[] = {"op", "peer", "backend", "rail", "bytes", "code", "key_id", "trace_id"};
	const char *vals[] = {f.op, f.peer, f.backend, f.rail, bytes, f.code, f.key_id, f.trace_id};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (json && i == 4 && bytes[0]) {
			char num[40];
			size_t n = (size_t)snprintf(num, sizeof(num), ",\"bytes\":%s", bytes);
			if (n <= cap - len) {
				memcpy(line + len, num, n);
				len += n;
			}
		} else if (json) {
			len = json_kv(line, len, cap, keys[i], vals[i]);
		} else {
			len = text_kv(line, len, cap, keys[i], vals[i]);
		}
	}
	if (json)
		line[len++] = '}';
	line[len++] = '\n';
	ssize_t rc = write(STDERR_FILENO, line, len);
	(void)rc;
}

void sc_log(enum sc_log_level level, const char *area, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog_kv(level, area, NULL, fmt, ap);
	va_end(ap);
}

void sc_log_kv(enum sc_log_level level, const char *area, const struct sc_log_fields *f,
	       const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog_kv(level, area, f, fmt, ap);
	va_end(ap);
}

/* n hex digits at s, not all zero (when nonzero is set): lowercased into out (n + 1). */
static bool hex_run(const char *s, size_t n, bool nonzero, char *out)
{
	bool any = false;
	for (size_t i = 0; i < n; i++) {
		int v = sc_parse_hex_digit(s[i]);
		if (v < 0)
			return false;
		any |= v != 0;
		if (out)
			out[i] = "0123456789abcdef"[v];
	}
	if (out)
		out[n] = '\0';
	return any || !nonzero;
}

bool sc_trace_id_valid(const char *text)
{
	return text && strlen(text) == 32 && hex_run(text, 32, true, NULL);
}

bool sc_trace_id_from_traceparent(const char *tp, char out[SC_TRACE_ID_LEN])
{
	out[0] = '\0';
	if (!tp)
		return false;
	while (*tp == ' ' || *tp == '\t')
		tp++;
	/* version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 */
	size_t n = strlen(tp);
	while (n && (tp[n - 1] == ' ' || tp[n - 1] == '\t'))
		n--;
	if (n < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-')
		return false;
	if (!hex_run(tp, 2, false, NULL) || (sc_parse_hex_digit(tp[0]) == 0xf && sc_parse_hex_digit(tp[1]) == 0xf))
		return false; /* version ff is invalid */
	bool v00 = tp[0] == '0' && tp[1] == '0';
	if ((v00 && n != 55) || (!v00 && n > 55 && tp[55] != '-'))
		return false;
	char tid[SC_TRACE_ID_LEN];
	if (!hex_run(tp + 3, 32, true, tid) || !hex_run(tp + 36, 16, true, NULL) ||
	    !hex_run(tp + 53, 2, false, NULL))
		return false;
	memcpy(out, tid, SC_TRACE_ID_LEN);
	return true;
}

/* splitmix64: a per-thread generator seeded once from getrandom (trace ids need to be unique,
 * not secret; a fast-path run should not pay a system call for one). */
static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void sc_trace_id_new(char out[SC_TRACE_ID_LEN])
{
	static _Thread_local uint64_t state[2];
	static _Thread_local bool seeded;
	if (!seeded) {
		if (getrandom(state, sizeof(state), GRND_NONBLOCK) != (ssize_t)sizeof(state)) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			state[0] = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
			state[1] = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&ts;
		}
		seeded = true;
	}
	uint64_t r[2] = {splitmix64(&state[0]), splitmix64(&state[1])};
	if (!r[0] && !r[1])
		r[0] = 1; /* never all zeros */
	for (size_t i = 0; i < 16; i++) {
		unsigned v = (unsigned)(r[i / 8] >> (8 * (i % 8))) & 0xff;
		out[2 * i] = "0123456789abcdef"[v >> 4];
		out[2 * i + 1] = "0123456789abcdef"[v & 15];
	}
	out[32] = '\0';
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

static void vlog_kv_limited(enum sc_log_level level, const char *area, const char *key,
			    const struct sc_log_fields *f, const char *fmt, va_list ap)
{
	if (!sc_log_enabled(level) || level >= SC_LOG_OFF)
		return;
	unsigned suppressed = 0;
	if (!limit_pass(key, &suppressed))
		return;
	char msg[2048];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (suppressed)
		sc_log_kv(level, area, f, "%s (%u similar suppressed)", msg, suppressed);
	else
		sc_log_kv(level, area, f, "%s", msg);
}

void sc_log_limited(enum sc_log_level level, const char *area, const char *key, const char *fmt,
		    ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog_kv_limited(level, area, key, NULL, fmt, ap);
	va_end(ap);
}

void sc_log_kv_limited(enum sc_log_level level, const char *area, const char *key,
		       const struct sc_log_fields *f, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog_kv_limited(level, area, key, f, fmt, ap);
	va_end(ap);
}
