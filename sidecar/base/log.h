/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/log.h: leveled logging to stderr, plain text ("2026-11-21T20:16:30.123Z INFO  [area] msg
 * op=.. trace_id=..") or JSON lines ({"ts":..,"level":..,"area":..,"msg":..,"op":..,..}).
 * Thread-safe: one write(2) per line. Never log secrets or whole metadata.
 *
 * Structured keys (docs/operations/logs.md): a line may say what it is about in fields beside
 * its prose, each written only when set: op, peer, backend, rail, bytes, code, key_id, trace_id.
 * Pass them per line (sc_log_kv, SC_INFO_KV) or for a stretch of one thread's work
 * (sc_log_scope_enter/leave: every line that thread logs meanwhile carries them, a line's own
 * fields winning key by key).
 */
#ifndef SC_LOG_H
#define SC_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum sc_log_level { SC_LOG_DEBUG = 0, SC_LOG_INFO, SC_LOG_WARN, SC_LOG_ERROR, SC_LOG_OFF };

void sc_log_configure(enum sc_log_level level, bool json);
/* Parse "debug|info|warn|error|off"; returns false for anything else. */
bool sc_log_level_parse(const char *text, enum sc_log_level *out);
bool sc_log_enabled(enum sc_log_level level);
void sc_log(enum sc_log_level level, const char *area, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* W3C trace ids are 16 bytes, written as 32 lowercase hex digits (+ NUL). */
#define SC_TRACE_ID_LEN 33

/*
 * What a line is about. Every member is optional: a NULL or empty string, or has_bytes false,
 * leaves its key out. The strings are only read during the call. Keys, in output order:
 *   op        operation id ("op-..."), either side
 *   peer      the other sidecar's id
 *   backend   "tcp", "ibverbs", "local"
 *   rail      a rail's name (device or interface), or an endpoint
 *   bytes     a byte count (JSON number): the operation's total, or what moved
 *   code      a status name ("DEADLINE_EXCEEDED", sc_status_name)
 *   key_id    a signing key's id
 *   trace_id  the W3C trace id (32 hex digits) of the transfer
 */
struct sc_log_fields {
	const char *op;
	const char *peer;
	const char *backend;
	const char *rail;
	uint64_t bytes;
	bool has_bytes;
	const char *code;
	const char *key_id;
	const char *trace_id;
};

/* sc_log with fields (f may be NULL). Usable as
 * sc_log_kv(SC_LOG_INFO, "op", &(struct sc_log_fields){.op = id, .trace_id = t}, "...", ...). */
void sc_log_kv(enum sc_log_level level, const char *area, const struct sc_log_fields *f,
	       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/*
 * A thread's log scope: until sc_log_scope_leave, every line this thread logs also carries the
 * set members of *f (which must stay valid until then), except a line whose own op differs from
 * the scope's (a line about another operation). Scopes nest: enter returns the one it replaces,
 * and leave restores it. Per thread; no locking.
 */
const struct sc_log_fields *sc_log_scope_enter(const struct sc_log_fields *f);
void sc_log_scope_leave(const struct sc_log_fields *prev);

/*
 * W3C Trace Context. sc_trace_id_from_traceparent: the trace id of a traceparent header
 * ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"; a later version may append fields)
 * into out, lowercase; false (out "") when it is not one, or its trace id is all zeros.
 * sc_trace_id_valid: text is 32 lowercase-or-uppercase hex digits, not all zeros.
 * sc_trace_id_new: a fresh random trace id. Any thread.
 */
bool sc_trace_id_from_traceparent(const char *traceparent, char out[SC_TRACE_ID_LEN]);
bool sc_trace_id_valid(const char *text);
void sc_trace_id_new(char out[SC_TRACE_ID_LEN]);

/*
 * Rate-limited logging for lines an outsider can trigger at will (refused connections, failed
 * hellos): at most one line per `key` per SC_LOG_LIMIT_MS; the next line that gets through ends
 * with " (N similar suppressed)". Keys are compared as strings (a static literal per call site);
 * up to SC_LOG_LIMIT_KEYS keys are tracked, the longest-silent one is forgotten first.
 */
#define SC_LOG_LIMIT_MS 1000
#define SC_LOG_LIMIT_KEYS 32
void sc_log_limited(enum sc_log_level level, const char *area, const char *key, const char *fmt,
		    ...) __attribute__((format(printf, 4, 5)));
#define SC_WARN_LIMITED(area, key, ...) sc_log_limited(SC_LOG_WARN, area, key, __VA_ARGS__)
/* sc_log_limited with fields (f may be NULL). */
void sc_log_kv_limited(enum sc_log_level level, const char *area, const char *key,
		       const struct sc_log_fields *f, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

#define SC_DEBUG(area, ...)                                                                        \
	do {                                                                                       \
		if (sc_log_enabled(SC_LOG_DEBUG))                                                  \
			sc_log(SC_LOG_DEBUG, area, __VA_ARGS__);                                   \
	} while (0)
#define SC_INFO(area, ...) sc_log(SC_LOG_INFO, area, __VA_ARGS__)
#define SC_WARN(area, ...) sc_log(SC_LOG_WARN, area, __VA_ARGS__)
#define SC_ERROR(area, ...) sc_log(SC_LOG_ERROR, area, __VA_ARGS__)
/* With fields: SC_INFO_KV("op", &fields, "fmt", ...). */
#define SC_DEBUG_KV(area, f, ...)                                                                  \
	do {                                                                                       \
		if (sc_log_enabled(SC_LOG_DEBUG))                                                  \
			sc_log_kv(SC_LOG_DEBUG, area, f, __VA_ARGS__);                             \
	} while (0)
#define SC_INFO_KV(area, f, ...) sc_log_kv(SC_LOG_INFO, area, f, __VA_ARGS__)
#define SC_WARN_KV(area, f, ...) sc_log_kv(SC_LOG_WARN, area, f, __VA_ARGS__)
#define SC_ERROR_KV(area, f, ...) sc_log_kv(SC_LOG_ERROR, area, f, __VA_ARGS__)

#endif
