/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client_check.h: the checks of the client library's test programs (client_lib_test.c,
 * fast_path_test.c), each a program of one file that includes this once. A failed check prints
 * where and why on stderr, counts in `failures` (not atomic: check on one thread) and lets the
 * program go on; main returns non-zero when any failed. OK and CODE read the caller's
 * `rsc_status st`.
 */
#ifndef SC_CLIENT_CHECK_H
#define SC_CLIENT_CHECK_H

#include <rdma_sidecar/client.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			failures++;                                                                \
		}                                                                                  \
	} while (0)
/* The call returned RSC_OK. */
#define OK(call) CHECK((call) == RSC_OK, "%s: %s", rsc_code_name(st.code), st.message)
/* The call returned want, st says so and its message holds substr. */
#define CODE(call, want, substr)                                                                   \
	do {                                                                                       \
		int got_ = (call);                                                                 \
		CHECK(got_ == (want) && st.code == (want), "code %s, want %s (%s)",                \
		      rsc_code_name(got_), rsc_code_name(want), st.message);                       \
		CHECK(strstr(st.message, (substr)) != NULL, "message \"%s\" lacks \"%s\"",         \
		      st.message, (substr));                                                       \
	} while (0)

#define MIB (1u << 20)

/* Fills p with n bytes of xorshift32 from *x, left where it ended. */
static inline void check_fill_xorshift(unsigned char *p, size_t n, uint32_t *x)
{
	for (size_t i = 0; i < n; i++) {
		*x ^= *x << 13;
		*x ^= *x >> 17;
		*x ^= *x << 5;
		p[i] = (unsigned char)*x;
	}
}

#endif
