/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/socket.h: the shared-memory fast path beside gRPC (rdma_sidecar/fast_ring.h): a unix socket
 * (--fast-path-socket) on which each worker that connects gets its own session (fast/session.c).
 *
 * create (main thread: binds the socket with --unix-socket-mode; *out NULL when the fast path is
 * off) -> start (the accept thread) -> destroy (stops accepting, ends every session, cancelling
 * its runs, unlinks the socket; before the engine goes).
 */
#ifndef SC_FAST_PATH_H
#define SC_FAST_PATH_H

#include "conf/config.h"
#include "engine/engine.h"

struct sc_fast_path;

int sc_fast_path_create(struct sc_engine *eng, const struct sc_config *cfg,
			struct sc_fast_path **out, struct sc_err *err);
int sc_fast_path_start(struct sc_fast_path *fp, struct sc_err *err);
void sc_fast_path_destroy(struct sc_fast_path *fp); /* NULL ok */

#endif
