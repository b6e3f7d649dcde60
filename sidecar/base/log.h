/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/log.h: leveled logging to stderr, plain text ("2026-11-21T20:16:30.123Z INFO  [area] msg")
 * or JSON lines ({"ts":..,"level":..,"area":..,"msg":..}). Thread-safe: one write(2) per line.
 * Never log secrets or whole metadata (log sc_log_redact()'d prefixes instead).
 */
#ifndef SC_LOG_H
#define SC_LOG_H

#include <stdbool.h>

enum sc_log_level { SC_LOG_DEBUG = 0, SC_LOG_INFO, SC_LOG_WARN, SC_LOG_ERROR, SC_LOG_OFF };

void sc_log_configure(enum sc_log_level level, bool json);
/* Parse "debug|info|warn|error|off"; returns false for anything else. */
bool sc_log_level_parse(const char *text, enum sc_log_level *out);
bool sc_log_enabled(enum sc_log_level level);
void sc_log(enum sc_log_level level, const char *area, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

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

#define SC_DEBUG(area, ...)                                                                        \
	do {                                                                                       \
		if (sc_log_enabled(SC_LOG_DEBUG))                                                  \
			sc_log(SC_LOG_DEBUG, area, __VA_ARGS__);                                   \
	} while (0)
#define SC_INFO(area, ...) sc_log(SC_LOG_INFO, area, __VA_ARGS__)
#define SC_WARN(area, ...) sc_log(SC_LOG_WARN, area, __VA_ARGS__)
#define SC_ERROR(area, ...) sc_log(SC_LOG_ERROR, area, __VA_ARGS__)

#endif
