/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_log.c: sc_log_limited, the rate limiter for WARN lines an outsider can trigger (issue 8
 * finding 6): one line per key per second, the next one saying how many were suppressed, keys
 * independent. stderr is sent to a temporary file while a test runs. Single-threaded.
 */
#include "check.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Run body with stderr in a temporary file; leave what was written in buf. */
static void capture(void (*body)(void), char *buf, size_t cap)
{
	FILE *tmp = tmpfile();
	CHECK(tmp != NULL);
	fflush(stderr);
	int saved = dup(STDERR_FILENO);
	dup2(fileno(tmp), STDERR_FILENO);
	body();
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(tmp);
	size_t n = fread(buf, 1, cap - 1, tmp);
	buf[n] = '\0';
	fclose(tmp);
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void burst(void)
{
	for (int i = 0; i < 100; i++)
		SC_WARN_LIMITED("test", "burst-a", "refused connection %d", i);
	SC_WARN_LIMITED("test", "burst-b", "another kind");
	sleep_ms(SC_LOG_LIMIT_MS + 100);
	SC_WARN_LIMITED("test", "burst-a", "refused connection %d", 100);
	SC_WARN_LIMITED("test", "burst-a", "refused connection %d", 101);
}

TEST(one_line_per_key_per_interval_with_count)
{
	static char out[16384];
	capture(burst, out, sizeof(out));
	CHECK_INT_EQ(count(out, "refused connection"), 2);
	CHECK_STR_CONTAINS(out, "refused connection 0\n");
	CHECK_STR_CONTAINS(out, "refused connection 100 (99 similar suppressed)\n");
	CHECK_INT_EQ(count(out, "another kind"), 1);
	CHECK_INT_EQ(count(out, "WARN"), 3);
}

static void many_keys(void)
{
	char key[32];
	/* More keys than the table holds: every first line of a key still gets out. */
	for (int i = 0; i < SC_LOG_LIMIT_KEYS * 2; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		SC_WARN_LIMITED("test", key, "first of %s", key);
	}
}

TEST(more_keys_than_slots)
{
	static char out[65536];
	capture(many_keys, out, sizeof(out));
	CHECK_INT_EQ(count(out, "first of key-"), SC_LOG_LIMIT_KEYS * 2);
}

static void below_level(void)
{
	sc_log_configure(SC_LOG_ERROR, false);
	SC_WARN_LIMITED("test", "quiet", "not shown");
	sc_log_configure(SC_LOG_INFO, false);
}

TEST(respects_the_level)
{
	char out[1024];
	capture(below_level, out, sizeof(out));
	CHECK_INT_EQ(count(out, "not shown"), 0);
}

RUN_TESTS(T(one_line_per_key_per_interval_with_count), T(more_keys_than_slots),
	  T(respects_the_level))
