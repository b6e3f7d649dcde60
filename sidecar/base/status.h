/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/status.h: the one status enum of the engine, and the per-call error struct.
 *
 * Values equal the gRPC status codes so the service layer maps them 1:1 without including engine
 * knowledge, and the engine never includes a gRPC header. Names and default texts come from one
 * X-macro table. The detail of a failure (errno, ibverbs, OpenSSL, CUresult text) travels in the
 * caller's struct sc_err, never in a global. Thread-safe: everything here is pure.
 */
#ifndef SC_STATUS_H
#define SC_STATUS_H

#include <stddef.h>

#define SC_STATUS_MAP(X)                                                                           \
	X(OK, 0, "ok")                                                                             \
	X(CANCELLED, 1, "cancelled")                                                               \
	X(INVALID_ARGUMENT, 3, "invalid argument")                                                 \
	X(DEADLINE_EXCEEDED, 4, "deadline exceeded")                                               \
	X(NOT_FOUND, 5, "not found")                                                               \
	X(ALREADY_EXISTS, 6, "already exists")                                                     \
	X(PERMISSION_DENIED, 7, "permission denied")                                               \
	X(RESOURCE_EXHAUSTED, 8, "resource exhausted")                                             \
	X(FAILED_PRECONDITION, 9, "failed precondition")                                           \
	X(ABORTED, 10, "aborted")                                                                  \
	X(OUT_OF_RANGE, 11, "out of range")                                                        \
	X(UNIMPLEMENTED, 12, "unimplemented")                                                      \
	X(INTERNAL, 13, "internal error")                                                          \
	X(UNAVAILABLE, 14, "unavailable")                                                          \
	X(UNAUTHENTICATED, 16, "unauthenticated")

enum sc_status {
#define SC_STATUS_ENUM(name, value, text) SC_##name = value,
	SC_STATUS_MAP(SC_STATUS_ENUM)
#undef SC_STATUS_ENUM
};

#define SC_ERR_MSG_MAX 512

/* A call's error: a status and a message that says what was wrong and what to do. */
struct sc_err {
	enum sc_status code;
	char msg[SC_ERR_MSG_MAX];
};

/* "INVALID_ARGUMENT" etc.; "UNKNOWN" for values outside the table. */
const char *sc_status_name(enum sc_status code);
/* The table's default text ("invalid argument"). */
const char *sc_status_text(enum sc_status code);

/* Fill err (may be NULL) and return -1, so callers can `return sc_err_set(...)`. */
int sc_err_set(struct sc_err *err, enum sc_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prefix an existing message: "what we were doing: <old message>". Returns -1. */
int sc_err_prefix(struct sc_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sc_err_clear(struct sc_err *err);

#endif
