/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_log.c: sc_log_limited, the rate limiter for WARN lines an outsider can trigger (issue 8
 * finding 6): one line per key per second, the next one saying how many were suppressed, keys
 * independent; structured fields (JSON keys, text key=value, only when set, a thread's scope
 * merged key by key, hostile values escaped); W3C traceparent parsing and fresh trace ids.
 * stderr is sent to a temporary file while a test runs. Single-threaded.
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

static void json_fields(void)
{
	sc_log_configure(SC_LOG_DEBUG, true);
	SC_INFO_KV("op", (&(struct sc_log_fields){.op = "op-1", .peer = "b", .backend = "tcp",
						  .rail = "eth0", .bytes = 0, .has_bytes = true,
						  .code = "OK", .key_id = "k1",
						  .trace_id = "0af7651916cd43dd8448eb211c80319c"}),
		   "op-1 READ COMPLETE: %d bytes", 0);
	SC_WARN_KV("op", (&(struct sc_log_fields){.op = "op-2", .peer = ""}), "only op");
	SC_INFO_KV("op", (&(struct sc_log_fields){.peer = "evil\"\n{\"x\":1}"}), "hostile");
	sc_log_configure(SC_LOG_INFO, false);
}

TEST(json_keys_beside_the_message_only_when_set)
{
	static char out[8192];
	capture(json_fields, out, sizeof(out));
	CHECK_STR_CONTAINS(out, "\"area\":\"op\",\"msg\":\"op-1 READ COMPLETE: 0 bytes\",\"op\":"
				"\"op-1\",\"peer\":\"b\",\"backend\":\"tcp\",\"rail\":\"eth0\","
				"\"bytes\":0,\"code\":\"OK\",\"key_id\":\"k1\",\"trace_id\":"
				"\"0af7651916cd43dd8448eb211c80319c\"}\n");
	CHECK_STR_CONTAINS(out, "\"msg\":\"only op\",\"op\":\"op-2\"}\n");
	CHECK_STR_CONTAINS(out, "\"msg\":\"hostile\",\"peer\":\"evil\\\"\\u000a{\\\"x\\\":1}\"}\n");
	CHECK_INT_EQ(count(out, "\n"), 3);
}

static void long_json(void)
{
	static char msg[5000], peer[200];
	memset(msg, '\x01', sizeof(msg) - 1); /* 6 bytes each once escaped */
	memset(peer, '\n', sizeof(peer) - 1);
	sc_log_configure(SC_LOG_DEBUG, true);
	SC_INFO_KV("op", (&(struct sc_log_fields){.op = "op-long", .peer = peer,
						  .trace_id = "0af7651916cd43dd8448eb211c80319c"}),
		   "%s", msg);
	sc_log_configure(SC_LOG_INFO, false);
}

TEST(json_line_cut_stays_one_valid_line)
{
	static char out[16384];
	capture(long_json, out, sizeof(out));
	CHECK_INT_EQ(count(out, "\n"), 1);
	size_t n = strlen(out);
	CHECK(n > 3 && n <= 4096);
	CHECK_STR_CONTAINS(out, "\",\"op\":\"op-long\"");
	/* the cut message still closes its string; a key that does not fit whole is left out */
	CHECK(out[n - 2] == '}' && out[n - 3] == '"');
	CHECK_STR_CONTAINS(out, "\"trace_id\":\"0af7651916cd43dd8448eb211c80319c\"}\n");
}

static void text_fields(void)
{
	struct sc_log_fields scope = {.op = "op-s", .trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"};
	const struct sc_log_fields *prev = sc_log_scope_enter(&scope);
	SC_INFO("op", "plain line in a scope");
	SC_INFO_KV("op", (&(struct sc_log_fields){.op = "op-s", .rail = "mlx5_0 port 1",
						  .bytes = 42, .has_bytes = true}),
		   "own fields win");
	SC_INFO_KV("op", (&(struct sc_log_fields){.op = "op-other"}), "another operation");
	sc_log_scope_leave(prev);
	SC_INFO("op", "no scope");
	SC_INFO_KV("op", (&(struct sc_log_fields){.peer = "a=\"b\""}), "quoted");
}

TEST(text_key_value_after_the_message)
{
	static char out[8192];
	capture(text_fields, out, sizeof(out));
	CHECK_STR_CONTAINS(out, "[op] plain line in a scope op=op-s "
				"trace_id=4bf92f3577b34da6a3ce929d0e0e4736\n");
	CHECK_STR_CONTAINS(out, "[op] own fields win op=op-s rail=\"mlx5_0 port 1\" bytes=42 "
				"trace_id=4bf92f3577b34da6a3ce929d0e0e4736\n");
	CHECK_STR_CONTAINS(out, "[op] another operation op=op-other\n");
	CHECK_STR_CONTAINS(out, "[op] no scope\n");
	CHECK_STR_CONTAINS(out, "[op] quoted peer=\"a=\\\"b\\\"\"\n");
}

TEST(traceparent)
{
	char t[SC_TRACE_ID_LEN];
	CHECK(sc_trace_id_from_traceparent(
	    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", t));
	CHECK_STR_EQ(t, "0af7651916cd43dd8448eb211c80319c");
	/* a later version may append fields; 00 may not */
	CHECK(sc_trace_id_from_traceparent(
	    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", t));
	CHECK(!sc_trace_id_from_traceparent(
	    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", t));
	CHECK_STR_EQ(t, "");
	const char *bad[] = {
	    "", "00", "garbage", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
	    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
	    "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
	    "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(!sc_trace_id_from_traceparent(bad[i], t));
	CHECK(!sc_trace_id_from_traceparent(NULL, t));

	char a[SC_TRACE_ID_LEN], b[SC_TRACE_ID_LEN];
	sc_trace_id_new(a);
	sc_trace_id_new(b);
	CHECK(sc_trace_id_valid(a));
	CHECK(sc_trace_id_valid(b));
	CHECK(strcmp(a, b) != 0);
	CHECK(!sc_trace_id_valid("00000000000000000000000000000000"));
	CHECK(!sc_trace_id_valid("0af7651916cd43dd8448eb211c80319"));
}

RUN_TESTS(T(one_line_per_key_per_interval_with_count), T(more_keys_than_slots),
	  T(respects_the_level), T(json_keys_beside_the_message_only_when_set),
	  T(text_key_value_after_the_message), T(json_line_cut_stays_one_valid_line),
	  T(traceparent))
