/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/request.h: the client requests of the peer control channel, run on a connection from the
 * pool (peer/pool.h): one request/reply each, or in halves to pipeline several. Deadlines, cancel
 * flags, errors and what a failure does to the connection are as peer/pool.h describes. The wire
 * format of each request is in peer/proto.h.
 */
#ifndef SC_PEER_REQUEST_H
#define SC_PEER_REQUEST_H

#include "meta/metadata.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "backend/backend.h"
#include "base/types.h"
#include "base/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* OPEN one use (xfer_id) of the passive operation named by token. peer_kind: SC_OP_READ or
 * SC_OP_WRITE (what this side does to the remote memory); total: all bytes of the transfer. */
int sc_peer_open(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_op_kind peer_kind, uint64_t total, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err);
/* The same, saying that backend `via` moves the bytes, not this connection (ibverbs: the passive
 * side then reports backend IBVERBS, and takes its completion notice). SC_BACKEND_NONE: as
 * sc_peer_open. */
int sc_peer_open_via(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		     uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total,
		     enum sc_backend_kind via, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		     struct sc_err *err);
/* OPEN in halves, to pipeline the first data request behind it (no round trip of its own): the
 * server handles a connection's frames in order, so a READ or WRITE sent after an OPEN is judged
 * after it; a refused OPEN refuses what follows too (and a refused WRITE ends the connection).
 * The OPEN is held back (sc_peer_conn_hold_next) and leaves in one segment with the next request
 * sent on the connection: when none follows, call sc_peer_conn_flush before waiting for its
 * reply. */
int sc_peer_open_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total,
		      enum sc_backend_kind via,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
/* sc_peer_open_via and sc_peer_open_send for transfer x: its token, xfer_id, kind, total,
 * deadline and cancel flag, and its trace id when the issuer reads OPEN extensions
 * (x->meta->peer_features). */
int sc_peer_open_xfer(struct sc_peer_conn *conn, const struct sc_xfer *x,
		      enum sc_backend_kind via, struct sc_err *err);
int sc_peer_open_xfer_send(struct sc_peer_conn *conn, const struct sc_xfer *x, struct sc_err *err);
/* *refused (optional): the peer answered the OPEN with a refusal (nothing was opened); false when
 * the reply could not be read (then the OPEN may or may not have been accepted). */
int sc_peer_open_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, bool *refused, struct sc_err *err);
/* READ len bytes (1 .. SC_PEER_MAX_BULK) at offset of remote descriptor desc straight into dst. */
int sc_peer_read_into(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
/* WRITE len bytes from src to offset of remote descriptor desc. */
int sc_peer_write_from(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err);
/*
 * The same two calls in halves, for pipelining: send the next request before receiving the reply
 * to the previous one, so the server never waits for a round trip between chunks. Replies come in
 * request order; each *_recv takes the oldest. Any failure while another request is in flight
 * leaves the connection broken.
 */
int sc_peer_read_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
int sc_peer_read_recv(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
int sc_peer_write_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err);
int sc_peer_write_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		       const atomic_bool *cancel, struct sc_err *err);
/*
 * Many pieces per request (READV / WRITEV; only to a sidecar whose metadata is version 2 or later,
 * host memory on both ends). readv: the reply's bytes are scattered straight into iov (the
 * pieces' local memory, in order, total bytes); writev: iov (n entries) is gathered straight from
 * local memory behind the request. Replies as sc_peer_read_recv / sc_peer_write_recv.
 */
int sc_peer_readv_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
int sc_peer_readv_recv(struct sc_peer_conn *conn, uint64_t total, struct iovec *iov, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
int sc_peer_writev_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			const struct iovec *iov, uint64_t deadline_mono_ms,
			const atomic_bool *cancel, struct sc_err *err);
/* sc_peer_read_recv / sc_peer_write_send for GPU memory (device dev): the bytes go through
 * pinned host buffers (peer/stage.h); a READ returns once they are all in GPU memory. Any failure
 * leaves the connection broken. */
struct sc_gpu;
int sc_peer_read_recv_gpu(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
			  struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			  const atomic_bool *cancel, struct sc_err *err);
int sc_peer_write_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			   uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
			   const uint8_t *src, struct sc_gpu *g, int dev,
			   uint64_t deadline_mono_ms, const atomic_bool *cancel,
			   struct sc_err *err);
/* sc_peer_readv_recv / sc_peer_writev_send for pieces that are all GPU memory of device dev,
 * packed many per pinned buffer (peer/stage.h). */
int sc_peer_readv_recv_gpu(struct sc_peer_conn *conn, uint64_t total, const struct iovec *iov,
			   uint32_t n, struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			   const atomic_bool *cancel, struct sc_err *err);
int sc_peer_writev_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			    uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			    const struct iovec *iov, struct sc_gpu *g, int dev,
			    uint64_t deadline_mono_ms, const atomic_bool *cancel,
			    struct sc_err *err);
/* DONE: this side's verdict for the use (SC_OK, or the error / SC_CANCELLED and its message). */
int sc_peer_done(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_status status, const char *msg, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err);
/* Until when a successful transfer waits for the passive side to confirm its DONE: 30 s from
 * now, or the transfer's deadline when that comes first (0: none). */
uint64_t sc_peer_verdict_ok_deadline(uint64_t xfer_deadline_mono_ms);
/* DONE in halves, to pipeline a success behind the last data request of a single-stream transfer
 * (no round trip of its own): the server judges the DONE after every request before it on the
 * connection, and refuses a successful DONE for a transfer one of whose requests it refused. */
int sc_peer_done_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_status status, const char *msg,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err);
int sc_peer_done_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, struct sc_err *err);
/*
 * Tell the passive side a transfer's verdict (DONE) at the end of a transfer, for the tcp and
 * ibverbs backends alike: on *conn while it is usable, else on a fresh connection to endpoint
 * (*conn is then replaced; the caller puts whatever *conn holds back into the pool). A success
 * must be confirmed, so the operation is complete on both sides or on neither: when the peer does
 * not confirm (within the transfer's deadline, at most 30 s), *status becomes that failure and msg
 * says so. A failure is told best effort, within 1 s. area: the caller's log area.
 */
void sc_peer_tell_verdict(struct sc_peer_pool *pool, struct sc_peer_conn **conn,
			  const char *endpoint, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			  uint64_t xfer_deadline_mono_ms, enum sc_status *status, char *msg,
			  size_t msg_cap, const char *area);
/*
 * An RDMA path (ibverbs, libfabric) of transfer x failed and tcp may go on with it
 * (x->fallback_ok): asks the passive side, on c, to take this attempt back (DONE with
 * SC_ABORTED: its operation stays open for the same transfer on another path). true when it did;
 * false (tell the failure as usual) when the transfer was never OPENed, c no longer answers, a
 * cancel or the deadline came, or the peer refused. area: the caller's log area.
 */
bool sc_peer_take_back(struct sc_peer_conn *c, const struct sc_xfer *x, bool opened,
		       const char *msg, const char *area);
int sc_peer_ping(struct sc_peer_conn *conn, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		 struct sc_err *err);
/* A generic request/reply (QP_CONNECT): sends a frame of `type` with body, expects a reply of
 * the same type whose body (at most reply_cap bytes) lands in reply. */
int sc_peer_call(struct sc_peer_conn *conn, unsigned type, const void *body, size_t len,
		 uint8_t *reply, size_t reply_cap, size_t *reply_len, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err);

#endif
