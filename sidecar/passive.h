/* SPDX-License-Identifier: Apache-2.0 */
/*
 * passive.h: what a data-plane server (the TCP peer server, the ibverbs control path, the LOCAL
 * backend) asks of the engine when a peer touches a passive operation. Implemented in operation.c.
 *
 * The token (16 random bytes from the metadata) is the capability; the xfer_id (chosen by the
 * active side, unique per transfer) names one use of it. Every call checks the operation is live,
 * the direction, its deadline, and that xfer_id holds one of its uses; nothing outside the exposed
 * ranges is ever handed out. Thread-safe; any thread.
 *
 *   open (claims a use, INITIALIZED -> IN_PROGRESS)
 *     -> span / span_release, many times, from several connections at once
 *     -> done (the active side's verdict)  or  abandon (the connection died first)
 */
#ifndef SC_PASSIVE_H
#define SC_PASSIVE_H

#include "metadata.h"
#include "sc_types.h"

struct sc_engine;
struct sc_op;
struct sc_peer_pool;
struct sc_peer_server;

/* A pinned range of a passive operation's memory. While held, the memory stays mapped even if the
 * operation is cancelled or its region force-deregistered. */
struct sc_span {
	uint8_t *addr; /* a device address when gpu >= 0: move it with gpu.h, never dereference */
	int gpu;       /* SC_GPU_HOST or the CUDA device of the range */
	uint64_t len;
	struct sc_op *op;
};

/*
 * peer_kind: SC_OP_READ (the peer reads: needs a READABLE) or SC_OP_WRITE (needs a WRITABLE).
 * total_bytes must equal the operation's total. Re-opening the same xfer_id is allowed (several
 * connections of one transfer). Errors: NOT_FOUND (unknown token: "metadata does not name a live
 * operation"), FAILED_PRECONDITION (expired, uses exhausted, cancelled, completed),
 * INVALID_ARGUMENT (direction or size mismatch), PERMISSION_DENIED (peer is not the audience).
 * On success *descs_out (optional) receives the descriptor lengths count.
 */
int sc_passive_open(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, const char *peer_id, uint64_t total_bytes,
		    struct sc_err *err);
/* Record which backend moves this use's bytes (default: LOCAL for this sidecar, else TCP); the
 * control path calls it after open when the peer said it will use ibverbs. */
void sc_passive_set_backend(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN],
			    uint64_t xfer_id, enum sc_backend_kind backend);
/* Range [offset, offset+len) of descriptor desc_index, for a transfer that opened. peer_kind
 * says what the peer does with it (SC_OP_READ: we send it; SC_OP_WRITE: we receive into it) and
 * must match the operation (READABLE / WRITABLE). */
int sc_passive_span(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, uint32_t desc_index, uint64_t offset, uint64_t len, struct sc_span *out,
		    struct sc_err *err);
/* Unpin; bytes_moved counts into the operation's progress. */
void sc_passive_span_release(struct sc_engine *eng, struct sc_span *span, uint64_t bytes_moved);
/* The active side's verdict for its use: SC_OK completes the use (and the operation once all its
 * uses are done); anything else ends the operation with that status ("peer <id>: <msg>"). */
int sc_passive_done(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_status status, const char *msg, struct sc_err *err);
/* The connection carrying an opened use died before its DONE: the operation ends ERRORED. */
void sc_passive_abandon(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN],
			uint64_t xfer_id, const char *why);

/* The engine's cluster keyring (retained; release it) and its id, for the peer hello. */
struct sc_keyring *sc_engine_keyring(struct sc_engine *eng);
const char *sc_engine_id(struct sc_engine *eng);
const struct sc_config *sc_engine_config(struct sc_engine *eng);
/* The engine's peer-connection pool (authenticated, reusable data-plane connections), created by
 * the engine before any backend; shared by the tcp and ibverbs backends. */
struct sc_peer_pool *sc_engine_peer_pool(struct sc_engine *eng);
struct sc_peer_server *sc_engine_peer_server(struct sc_engine *eng);
/* The CUDA driver, for staging GPU spans (NULL without CUDA). */
struct sc_gpu *sc_engine_gpu(struct sc_engine *eng);

#endif
