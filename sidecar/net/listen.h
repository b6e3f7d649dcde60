/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/listen.h: bind a TCP listener from a flag's host:port, with the error messages an operator
 * needs. Used by the data plane (--data-listen) and the metrics endpoint (--metrics-listen).
 * Pure apart from the socket it returns; any thread.
 */
#ifndef SC_LISTEN_H
#define SC_LISTEN_H

#include "base/status.h"

#include <stdint.h>

/*
 * Resolve node:port (AI_PASSIVE, any family), bind and listen on the first address that works;
 * the socket is CLOEXEC and non-blocking, with SO_REUSEADDR. flag and flag_value name the option
 * in messages ("--data-listen", "0.0.0.0:7000"); in_use_hint is appended to the advice when the
 * port is taken. On success *fd_out is the socket and *bound_port the port actually bound (port 0
 * asks for an ephemeral one). Errors: FAILED_PRECONDITION (cannot resolve, cannot bind or listen),
 * INTERNAL (getsockname).
 */
int sc_listen_tcp(const char *flag, const char *flag_value, const char *node, uint16_t port,
		  int backlog, const char *in_use_hint, int *fd_out, uint16_t *bound_port,
		  struct sc_err *err);

#endif
