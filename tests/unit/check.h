/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.h: a tiny test harness. Typed asserts print both values and the location, then the test
 * fails. A file defines tests with TEST(name) and lists them in RUN_TESTS(...). The closing line is
 * "N passed, N failed" so CI reads the counts. Exit 0 when all pass, 1 otherwise.
 */
#ifndef SC_CHECK_H
#define SC_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failed_;

#define CHECK_FAIL_(...)                                                                           \
	do {                                                                                       \
		fprintf(stderr, "  FAIL %s:%d: ", __FILE__, __LINE__);                             \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		check_failed_ = 1;                                                                 \
		return;                                                                            \
	} while (0)

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			CHECK_FAIL_("CHECK(%s)", #cond);                                           \
	} while (0)
#define CHECK_INT_EQ(a, b)                                                                         \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		if (a_ != b_)                                                                      \
			CHECK_FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_);                     \
	} while (0)
#define CHECK_U64_EQ(a, b)                                                                         \
	do {                                                                                       \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                   \
		if (a_ != b_)                                                                      \
			CHECK_FAIL_("%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, a_, b_);          \
	} while (0)
#define CHECK_STR_EQ(a, b)                                                                         \
	do {                                                                                       \
		const char *a_ = (a), *b_ = (b);                                                   \
		if (!a_ || !b_ || strcmp(a_, b_) != 0)                                             \
			CHECK_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)",      \
				    b_ ? b_ : "(null)");                                           \
	} while (0)
#define CHECK_STR_CONTAINS(hay, needle)                                                            \
	do {                                                                                       \
		const char *h_ = (hay), *n_ = (needle);                                            \
		if (!h_ || !strstr(h_, n_))                                                        \
			CHECK_FAIL_("%s contains \"%s\": got \"%s\"", #hay, n_, h_ ? h_ : "(null)"); \
	} while (0)

#define TEST(name) static void test_##name(void)

typedef struct {
	const char *name;
	void (*fn)(void);
} check_case_;

#define T(name) {#name, test_##name}
#define RUN_TESTS(...)                                                                             \
	int main(void)                                                                             \
	{                                                                                          \
		static const check_case_ cases[] = {__VA_ARGS__};                                  \
		int passed = 0, failed = 0;                                                        \
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {                  \
			check_failed_ = 0;                                                         \
			cases[i].fn();                                                             \
			if (check_failed_) {                                                       \
				failed++;                                                          \
				fprintf(stderr, "not ok %s\n", cases[i].name);                     \
			} else {                                                                   \
				passed++;                                                          \
				fprintf(stderr, "ok %s\n", cases[i].name);                         \
			}                                                                          \
		}                                                                                  \
		printf("%d passed, %d failed\n", passed, failed);                                  \
		return failed ? 1 : 0;                                                             \
	}

#endif
