/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/session.h: one worker's fast-path session (rdma_sidecar/fast_ring.h), owned by fast/socket.c.
 *
 * start (accept thread: builds the rings, sends HELLO, starts the session's thread) -> the thread
 * serves the socket and the rings until the worker closes the socket, breaks the protocol, or
 * sc_fast_session_stop -> on_exit (on the session's thread, last thing it does) -> join_free
 * (any other thread).
 */
#ifndef SC_FAST_SESSION_H
#define SC_FAST_SESSION_H

#include "engine/engine.h"

#include <stdint.h>
#include <sys/types.h>

struct sc_fast_session;

struct sc_fast_session_params {
	struct sc_engine *eng;
	int sock; /* the accepted SOCK_SEQPACKET connection; the session owns it from start on */
	pid_t pid;
	uid_t uid;
	uint32_t entries; /* submission and completion ring entries (power of two) */
	/* Called once on the session's thread as it ends (the session may then be joined). */
	void (*on_exit)(void *ctx, struct sc_fast_session *s);
	void *ctx;
};

/* 0, or -1 with err (the socket is closed either way on failure). */
int sc_fast_session_start(const struct sc_fast_session_params *p, struct sc_fast_session **out,
			  struct sc_err *err);
/* While the session's thread runs a small transfer itself, it looks at neither its ring nor its
 * socket: this, called every WATCH_MS by fast/socket.c's thread, cancels that transfer when the
 * worker queued a CANCEL for it or closed the socket. Never blocks. */
void sc_fast_session_watch(struct sc_fast_session *s);
/* Asks the session to end (its runs are cancelled); returns at once. Any thread. */
void sc_fast_session_stop(struct sc_fast_session *s);
/* Joins the session's thread and frees it. Not from the session's own thread. */
void sc_fast_session_join_free(struct sc_fast_session *s);

#endif
