/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/passive.h: the passive-operation interface: what a data-plane server (the TCP peer
 * server, the ibverbs notice path, the LOCAL backend) asks when a peer touches a passive operation.
 * A const ops table plus a context, handed to each of them when the engine creates them;
 * engine/op_passive.c implements it (sc_op_passive), the peer server wraps it to add the notice
 * claim (sc_peer_server_passive). Nothing below the engine calls into engine/.
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

#include "meta/metadata.h"
#include "base/types.h"
#include "base/status.h"

#include <stdint.h>

struct sc_op;

/* The uses of one passive operation open at once (OPENed, their DONE not yet come): an OPEN past
 * it is refused RESOURCE_EXHAUSTED "operation X ... already has N transfers open at once", and
 * goes through once some finish. Bounds the engine's bookkeeping per operation (a hash of the
 * uses in flight, each OPEN and DONE O(1) under the engine lock), whatever a peer holding an
 * any_uses token sends. */
#define SC_OP_MAX_OPEN_USES 1024u

/* A pinned range of a passive operation's memory. While held, the memory stays mapped even if the
 * operation is cancelled or its region force-deregistered; so the holder moves it within a bound:
 * by deadline_mono_ms, and no further once the operation ends (the engine then tells the data
 * plane to cut the connections serving it: sc_peer_server_revoke), and releases it at once. The
 * engine's CancelOperation, ReleaseOperation and forced deregistration wait for every span to be
 * released before they answer, so the worker may reuse the memory when they return. */
struct sc_span {
	uint8_t *addr; /* a device address when gpu >= 0: move it with gpu/gpu.h, never dereference */
	int gpu;       /* SC_GPU_HOST or the CUDA device of the range */
	uint64_t len;
	uint64_t deadline_mono_ms; /* the operation's deadline: no I/O on the span after it */
	struct sc_op *op;
};

/*
 * The calls, each with ctx first. Every op is set (missing ones point at stubs), so callers never
 * test for NULL; call them through the sc_passive_* wrappers below.
 */
struct sc_passive_ops {
	/*
	 * peer_kind: SC_OP_READ (the peer reads: needs a READABLE) or SC_OP_WRITE (needs a
	 * WRITABLE). total_bytes must equal the operation's total. Re-opening the same xfer_id is
	 * allowed (several connections of one transfer). Errors: NOT_FOUND (unknown token:
	 * "metadata does not name a live operation"), FAILED_PRECONDITION (expired, uses
	 * exhausted, cancelled, completed), INVALID_ARGUMENT (direction or size mismatch),
	 * PERMISSION_DENIED (peer is not the audience), RESOURCE_EXHAUSTED (SC_OP_MAX_OPEN_USES
	 * uses already open). trace_id: the transfer's W3C trace id (32 hex digits) as the peer
	 * sent it, NULL or "" for none; an operation created without one takes it.
	 */
	int (*open)(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, const char *peer_id, uint64_t total_bytes,
		    const char *trace_id, struct sc_err *err);
	/* Record which backend moves this use's bytes (default: LOCAL for this sidecar, else
	 * TCP); the control path calls it after open when the peer said another backend moves
	 * them (OPEN's via-backend flag). */
	void (*set_backend)(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			    enum sc_backend_kind backend);
	/* Range [offset, offset+len) of descriptor desc_index, for a transfer that opened.
	 * peer_kind says what the peer does with it (SC_OP_READ: we send it; SC_OP_WRITE: we
	 * receive into it) and must match the operation (READABLE / WRITABLE). */
	int (*span)(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_op_kind peer_kind, uint32_t desc_index, uint64_t offset, uint64_t len,
		    struct sc_span *out, struct sc_err *err);
	/* Unpin; bytes_moved counts into the operation's progress. */
	void (*span_release)(void *ctx, struct sc_span *span, uint64_t bytes_moved);
	/* The active side's verdict for its use: SC_OK completes the use (and the operation once
	 * all its uses are done); anything else ends the operation with that status
	 * ("peer <id>: <msg>"). */
	int (*done)(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		    enum sc_status status, const char *msg, struct sc_err *err);
	/* The connection carrying an opened use died before its DONE: the operation ends
	 * ERRORED. */
	void (*abandon)(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			const char *why);
	/*
	 * A backend's own end-of-transfer notice (the ibverbs completion notice) says peer
	 * peer_id's transfer xfer_id ended. Succeeds only when a connection authenticated as
	 * peer_id OPENed that transfer saying backend `via` moves its bytes, and no DONE came
	 * yet: then *token receives its token and the transfer counts as told (as after a DONE),
	 * so the caller reports the verdict with done. -1 otherwise (nothing changed). Only the
	 * peer server tracks OPENs (sc_peer_server_passive); elsewhere this is always -1.
	 */
	int (*claim)(void *ctx, const char *peer_id, uint64_t xfer_id, enum sc_backend_kind via,
		     uint8_t token[SC_TOKEN_LEN]);
};

/* The interface as handed to a data-plane server or backend at creation: copy it freely; ctx
 * outlives every user (the engine creates and destroys them). */
struct sc_passive {
	const struct sc_passive_ops *ops;
	void *ctx;
};

static inline int sc_passive_open(const struct sc_passive *p, const uint8_t token[SC_TOKEN_LEN],
				  uint64_t xfer_id, enum sc_op_kind peer_kind, const char *peer_id,
				  uint64_t total_bytes, const char *trace_id, struct sc_err *err)
{
	return p->ops->open(p->ctx, token, xfer_id, peer_kind, peer_id, total_bytes, trace_id, err);
}
static inline void sc_passive_set_backend(const struct sc_passive *p,
					  const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
					  enum sc_backend_kind backend)
{
	p->ops->set_backend(p->ctx, token, xfer_id, backend);
}
static inline int sc_passive_span(const struct sc_passive *p, const uint8_t token[SC_TOKEN_LEN],
				  uint64_t xfer_id, enum sc_op_kind peer_kind, uint32_t desc_index,
				  uint64_t offset, uint64_t len, struct sc_span *out,
				  struct sc_err *err)
{
	return p->ops->span(p->ctx, token, xfer_id, peer_kind, desc_index, offset, len, out, err);
}
static inline void sc_passive_span_release(const struct sc_passive *p, struct sc_span *span,
					   uint64_t bytes_moved)
{
	p->ops->span_release(p->ctx, span, bytes_moved);
}
static inline int sc_passive_done(const struct sc_passive *p, const uint8_t token[SC_TOKEN_LEN],
				  uint64_t xfer_id, enum sc_status status, const char *msg,
				  struct sc_err *err)
{
	return p->ops->done(p->ctx, token, xfer_id, status, msg, err);
}
static inline void sc_passive_abandon(const struct sc_passive *p, const uint8_t token[SC_TOKEN_LEN],
				      uint64_t xfer_id, const char *why)
{
	p->ops->abandon(p->ctx, token, xfer_id, why);
}
static inline int sc_passive_claim(const struct sc_passive *p, const char *peer_id,
				   uint64_t xfer_id, enum sc_backend_kind via,
				   uint8_t token[SC_TOKEN_LEN])
{
	return p->ops->claim(p->ctx, peer_id, xfer_id, via, token);
}

#endif
