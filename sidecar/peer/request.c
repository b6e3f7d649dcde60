/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/request.c: the client requests of the peer control channel, each on one connection taken
 * from the pool (peer/pool.c): OPEN, READ/READV, WRITE/WRITEV, DONE, PING and the generic call,
 * whole or in halves for pipelining, and the end-of-transfer verdict that the tcp and ibverbs
 * backends share. READ receives straight into the caller's memory and WRITE sends straight from
 * it; GPU memory goes through pinned staging buffers (peer/stage.h).
 *
 * Every call waits until the caller's deadline or cancel flag, and, where the holder set one
 * (sc_peer_conn_set_stall: the tcp backend on a path with others beside it), no longer than the
 * connection's stall limit without a byte moving.
 *
 * Threads: the caller's. A connection belongs to the thread that got it from the pool; these
 * calls keep no state of their own beyond the connection's.
 */
#include "peer/request.h"
#include "peer/conn.h"
#include "peer/stage.h"

#include "base/log.h"
#include "peer/proto.h"
#include "base/timer.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- calls ----------------------------------------------------------------------------------- */

/* A failed send or receive: the stream's state is unknown from here on. */
static int io_fail(struct sc_peer_conn *c, enum sc_peer_io rc, struct sc_err *err)
{
	atomic_store(&c->broken, true);
	c->peer_closed = rc == SC_PEER_IO_EOF;
	if (rc == SC_PEER_IO_EOF)
		return sc_err_set(err, SC_UNAVAILABLE, "%s closed the connection mid-transfer",
				  c->what);
	if (rc == SC_PEER_IO_PROTOCOL && err) {
		sc_err_prefix(err, "%s sent garbage", c->what);
		err->code = SC_INTERNAL;
	}
	return -1; /* err already says why */
}

static int send_request(struct sc_peer_conn *c, const struct sc_peer_msg *m, const void *bulk,
			uint64_t bulk_len, const struct sc_peer_wait *w, struct sc_err *err)
{
	uint8_t hdr[128 + SC_ERR_MSG_MAX]; /* a DONE carries a message of up to SC_ERR_MSG_MAX */
	size_t n = sc_peer_encode(m, hdr, sizeof(hdr));
	if (n == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s request does not encode",
				  sc_frame_type_name(m->type));
	struct iovec iov[2] = {{.iov_base = hdr, .iov_len = n},
			       {.iov_base = (void *)bulk, .iov_len = (size_t)bulk_len}};
	struct sc_peer_wait held = *w;
	held.more = w->more || c->hold_next;
	c->hold_next = false;
	c->held = held.more;
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, bulk_len ? 2 : 1, &held, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, c->what, err);
		return io_fail(c, rc, err);
	}
	c->outstanding++;
	return 0;
}

/* Receive the reply to a request: `want`, or ERROR (the peer's refusal, mapped to its code). */
static int recv_reply(struct sc_peer_conn *c, enum sc_frame_type want, struct sc_peer_msg *m,
		      const struct sc_peer_wait *w, struct sc_err *err)
{
	if (c->outstanding == 0) {
		atomic_store(&c->broken, true);
		return sc_err_set(err, SC_INTERNAL, "waiting for a %s reply with no request sent",
				  sc_frame_type_name(want));
	}
	c->outstanding--;
	enum sc_peer_io rc = sc_peer_recv_msg(c->fd, c->buf, sizeof(c->buf), m, w, c->what, err);
	if (rc != SC_PEER_IO_OK)
		return io_fail(c, rc, err);
	if (m->type == SC_FRAME_ERROR) {
		/* With another request still in flight the stream cannot be reused: its reply would
		 * answer the next caller. */
		if (c->outstanding)
			atomic_store(&c->broken, true);
		enum sc_status code = sc_peer_status_from_wire(m->code);
		return sc_err_set(err, code == SC_OK ? SC_INTERNAL : code, "peer %s: %s",
				  c->peer_id, m->text);
	}
	if (m->type != want) {
		atomic_store(&c->broken, true);
		return sc_err_set(err, SC_INTERNAL, "%s sent %s where %s was expected", c->what,
				  sc_frame_type_name(m->type), sc_frame_type_name(want));
	}
	return 0;
}

static void fill_ref(struct sc_peer_msg *m, enum sc_frame_type type,
		     const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	memcpy(m->token, token, SC_TOKEN_LEN);
	m->xfer_id = xfer_id;
}

/* How a request on conn waits: the caller's deadline and cancel flag, and the connection's stall
 * limit (sc_peer_conn_set_stall). */
static struct sc_peer_wait client_wait(const struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
				       const atomic_bool *cancel)
{
	return (struct sc_peer_wait){
	    .deadline_mono_ms = deadline_mono_ms, .stall_ms = conn->stall_ms, .cancel = cancel};
}

static int open_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		     uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total,
		     enum sc_backend_kind via, const char *trace_id, uint64_t deadline_mono_ms,
		     const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	fill_ref(&m, SC_FRAME_OPEN, token, xfer_id);
	m.flags = sc_peer_via_flags(via);
	m.peer_kind = (uint8_t)peer_kind;
	m.total = total;
	if (trace_id && sc_trace_id_valid(trace_id))
		snprintf(m.trace_id, sizeof(m.trace_id), "%s", trace_id);
	return send_request(conn, &m, NULL, 0, &w, err);
}

/* x's trace id, when its issuer reads it in an OPEN; else NULL. */
static const char *xfer_wire_trace(const struct sc_xfer *x)
{
	return x->meta && (x->meta->peer_features & SC_MD_FEATURE_OPEN_EXT) && x->trace_id[0]
		       ? x->trace_id
		       : NULL;
}

int sc_peer_open_xfer(struct sc_peer_conn *conn, const struct sc_xfer *x,
		      enum sc_backend_kind via, struct sc_err *err)
{
	if (open_send(conn, x->meta->token, x->xfer_id, x->kind, x->total, via, xfer_wire_trace(x),
		      x->deadline_mono_ms, &x->cancel_requested, err) != 0)
		return -1;
	return sc_peer_open_recv(conn, x->deadline_mono_ms, &x->cancel_requested, NULL, err);
}

int sc_peer_open_xfer_send(struct sc_peer_conn *conn, const struct sc_xfer *x, struct sc_err *err)
{
	sc_peer_conn_hold_next(conn);
	return open_send(conn, x->meta->token, x->xfer_id, x->kind, x->total, SC_BACKEND_NONE,
			 xfer_wire_trace(x), x->deadline_mono_ms, &x->cancel_requested, err);
}

int sc_peer_open_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total,
		      enum sc_backend_kind via, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		      struct sc_err *err)
{
	sc_peer_conn_hold_next(conn);
	return open_send(conn, token, xfer_id, peer_kind, total, via, NULL, deadline_mono_ms,
			 cancel, err);
}

int sc_peer_open_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, bool *refused, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	m.type = SC_FRAME_OK;
	int rc = recv_reply(conn, SC_FRAME_OK, &m, &w, err);
	if (refused)
		*refused = rc != 0 && m.type == SC_FRAME_ERROR;
	return rc;
}

int sc_peer_open_via(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		     uint64_t xfer_id, enum sc_op_kind peer_kind, uint64_t total,
		     enum sc_backend_kind via, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		     struct sc_err *err)
{
	if (open_send(conn, token, xfer_id, peer_kind, total, via, NULL, deadline_mono_ms, cancel,
		      err) != 0)
		return -1;
	return sc_peer_open_recv(conn, deadline_mono_ms, cancel, NULL, err);
}

int sc_peer_open(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_op_kind peer_kind, uint64_t total, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	return sc_peer_open_via(conn, token, xfer_id, peer_kind, total, SC_BACKEND_NONE,
				deadline_mono_ms, cancel, err);
}

static int bulk_request(struct sc_peer_conn *conn, enum sc_frame_type type,
			const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id, uint32_t desc,
			uint64_t offset, uint64_t len, const uint8_t *src,
			const struct sc_peer_wait *w, struct sc_err *err)
{
	if (len == 0 || len > SC_PEER_MAX_BULK)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s of %" PRIu64 " bytes: must be 1 byte .. 1 GiB",
				  sc_frame_type_name(type), len);
	struct sc_peer_msg m;
	fill_ref(&m, type, token, xfer_id);
	m.desc = desc;
	m.offset = offset;
	m.len = len;
	return send_request(conn, &m, src, src ? len : 0, w, err);
}

int sc_peer_read_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	return bulk_request(conn, SC_FRAME_READ, token, xfer_id, desc, offset, len, NULL, &w, err);
}

/* The DATA header answering a READ of len bytes; the bytes follow on the connection. */
static int recv_data_header(struct sc_peer_conn *conn, uint64_t len, const struct sc_peer_wait *w,
			    struct sc_err *err)
{
	struct sc_peer_msg m;
	if (recv_reply(conn, SC_FRAME_DATA, &m, w, err) != 0)
		return -1;
	if (m.len != len) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_INTERNAL,
				  "%s sent %" PRIu64 " bytes for a READ of %" PRIu64, conn->what,
				  m.len, len);
	}
	return 0;
}

int sc_peer_read_recv(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (recv_data_header(conn, len, &w, err) != 0)
		return -1;
	int e;
	enum sc_peer_io rc = sc_peer_recv_all(conn->fd, dst, (size_t)len, &w, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, conn->what, err);
		return io_fail(conn, rc, err);
	}
	return 0;
}

/* A refused WRITE: the server answered ERROR and closed before reading our bytes. Its reason
 * (after the replies to earlier requests) is more useful than our broken pipe. */
static void refused_write_reason(struct sc_peer_conn *conn, const atomic_bool *cancel,
				 struct sc_err *err)
{
	if (sc_peer_conn_usable(conn))
		return;
	struct sc_peer_wait quick = client_wait(conn, sc_clock_mono_ms() + 200, cancel);
	for (unsigned i = 0; i <= conn->outstanding; i++) {
		struct sc_peer_msg r;
		struct sc_err why;
		if (sc_peer_recv_msg(conn->fd, conn->buf, sizeof(conn->buf), &r, &quick,
				     conn->what, &why) != SC_PEER_IO_OK)
			break;
		if (r.type == SC_FRAME_ERROR) {
			enum sc_status code = sc_peer_status_from_wire(r.code);
			sc_err_set(err, code == SC_OK ? SC_INTERNAL : code, "peer %s: %s",
				   conn->peer_id, r.text);
			break;
		}
	}
}

int sc_peer_read_recv_gpu(struct sc_peer_conn *conn, uint64_t len, uint8_t *dst,
			  struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			  const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (recv_data_header(conn, len, &w, err) != 0)
		return -1;
	enum sc_peer_io io;
	if (sc_peer_recv_gpu(g, dev, conn->fd, dst, len, &w, conn->what, &io, err) != 0) {
		atomic_store(&conn->broken, true); /* the rest of the DATA is still on the wire */
		return -1;
	}
	return 0;
}

int sc_peer_write_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			   uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
			   const uint8_t *src, struct sc_gpu *g, int dev,
			   uint64_t deadline_mono_ms, const atomic_bool *cancel,
			   struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	/* The WRITE header promises len bytes; they follow, staged. */
	if (bulk_request(conn, SC_FRAME_WRITE, token, xfer_id, desc, offset, len, NULL, &w, err) !=
	    0)
		return -1;
	enum sc_peer_io io;
	if (sc_peer_send_gpu(g, dev, conn->fd, src, len, &w, conn->what, &io, err) != 0) {
		atomic_store(&conn->broken, true);
		if (io != SC_PEER_IO_OK)
			refused_write_reason(conn, cancel, err);
		return -1;
	}
	return 0;
}

int sc_peer_read_into(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len, uint8_t *dst,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	if (sc_peer_read_send(conn, token, xfer_id, desc, offset, len, deadline_mono_ms, cancel,
			      err) != 0)
		return -1;
	return sc_peer_read_recv(conn, len, dst, deadline_mono_ms, cancel, err);
}

/* READV / WRITEV: the frame (header and piece list, up to ~20 KiB) and, for WRITEV, the pieces'
 * bytes gathered straight from local memory in the same sendmsg calls. */
static int send_pieces(struct sc_peer_conn *c, enum sc_frame_type type,
		       const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		       const struct sc_peer_piece *pieces, uint32_t n, const struct iovec *src,
		       const struct sc_peer_wait *w, struct sc_err *err)
{
	if (n == 0 || n > SC_PEER_MAX_PIECES)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s of %u pieces: 1..%d",
				  sc_frame_type_name(type), n, SC_PEER_MAX_PIECES);
	struct sc_peer_msg m;
	fill_ref(&m, type, token, xfer_id);
	m.piece_list = pieces;
	m.n_pieces = n;
	size_t cap = SC_PEER_HDR_LEN + 32 + (size_t)n * SC_PEER_PIECE_WIRE;
	uint8_t *frame = malloc(cap);
	struct iovec *iov = malloc(sizeof(*iov) * (src ? n + 1 : 1));
	if (!frame || !iov) {
		free(frame);
		free(iov);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	size_t len = sc_peer_encode(&m, frame, cap);
	if (len == 0) {
		free(frame);
		free(iov);
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s request does not encode",
				  sc_frame_type_name(type));
	}
	iov[0] = (struct iovec){.iov_base = frame, .iov_len = len};
	if (src)
		memcpy(&iov[1], src, sizeof(*iov) * n);
	struct sc_peer_wait held = *w;
	held.more = w->more || c->hold_next;
	c->hold_next = false;
	c->held = held.more;
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, src ? (int)n + 1 : 1, &held, NULL, &e);
	free(frame);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, c->what, err);
		return io_fail(c, rc, err);
	}
	c->outstanding++;
	return 0;
}

int sc_peer_readv_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	return send_pieces(conn, SC_FRAME_READV, token, xfer_id, pieces, n, NULL, &w, err);
}

int sc_peer_readv_recv(struct sc_peer_conn *conn, uint64_t total, struct iovec *iov, uint32_t n,
		       uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (recv_data_header(conn, total, &w, err) != 0)
		return -1;
	int e;
	enum sc_peer_io rc = sc_peer_recvv_all(conn->fd, iov, (int)n, &w, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, conn->what, err);
		return io_fail(conn, rc, err);
	}
	return 0;
}

int sc_peer_writev_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			const struct iovec *iov, uint64_t deadline_mono_ms,
			const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (send_pieces(conn, SC_FRAME_WRITEV, token, xfer_id, pieces, n, iov, &w, err) == 0)
		return 0;
	refused_write_reason(conn, cancel, err);
	return -1;
}

/* iov (GPU memory of dev) as stager pieces; NULL when out of memory. */
static struct sc_stage_piece *gpu_pieces(const struct iovec *iov, uint32_t n, int dev)
{
	struct sc_stage_piece *p = malloc((n ? n : 1) * sizeof(*p));
	for (uint32_t i = 0; p && i < n; i++)
		p[i] = (struct sc_stage_piece){
		    .addr = iov[i].iov_base, .len = iov[i].iov_len, .gpu = dev};
	return p;
}

int sc_peer_readv_recv_gpu(struct sc_peer_conn *conn, uint64_t total, const struct iovec *iov,
			   uint32_t n, struct sc_gpu *g, int dev, uint64_t deadline_mono_ms,
			   const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (recv_data_header(conn, total, &w, err) != 0)
		return -1;
	struct sc_stage_piece *p = gpu_pieces(iov, n, dev);
	if (!p) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	enum sc_peer_io io;
	int rc = sc_peer_recv_pieces_gpu(g, dev, conn->fd, p, n, &w, conn->what, &io, err);
	free(p);
	if (rc != 0)
		atomic_store(&conn->broken, true); /* the rest of the DATA is still on the wire */
	return rc;
}

int sc_peer_writev_send_gpu(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
			    uint64_t xfer_id, const struct sc_peer_piece *pieces, uint32_t n,
			    const struct iovec *iov, struct sc_gpu *g, int dev,
			    uint64_t deadline_mono_ms, const atomic_bool *cancel,
			    struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_stage_piece *p = gpu_pieces(iov, n, dev);
	if (!p)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	/* The WRITEV frame promises the pieces' bytes; they follow, staged. */
	int rc = send_pieces(conn, SC_FRAME_WRITEV, token, xfer_id, pieces, n, NULL, &w, err);
	enum sc_peer_io io = SC_PEER_IO_OK;
	if (rc == 0 &&
	    (rc = sc_peer_send_pieces_gpu(g, dev, conn->fd, p, n, &w, conn->what, &io, err)) != 0) {
		atomic_store(&conn->broken, true);
		if (io != SC_PEER_IO_OK)
			refused_write_reason(conn, cancel, err);
	} else if (rc != 0) {
		refused_write_reason(conn, cancel, err);
	}
	free(p);
	return rc;
}

int sc_peer_write_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	if (bulk_request(conn, SC_FRAME_WRITE, token, xfer_id, desc, offset, len, src, &w, err) ==
	    0)
		return 0;
	refused_write_reason(conn, cancel, err);
	return -1;
}

int sc_peer_write_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		       const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	int rc = recv_reply(conn, SC_FRAME_OK, &m, &w, err);
	if (rc != 0)
		atomic_store(&conn->broken, true); /* the server closes after a refused WRITE */
	return rc;
}

int sc_peer_write_from(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		       uint64_t xfer_id, uint32_t desc, uint64_t offset, uint64_t len,
		       const uint8_t *src, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		       struct sc_err *err)
{
	if (sc_peer_write_send(conn, token, xfer_id, desc, offset, len, src, deadline_mono_ms,
			       cancel, err) != 0)
		return -1;
	return sc_peer_write_recv(conn, deadline_mono_ms, cancel, err);
}

int sc_peer_done_send(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN],
		      uint64_t xfer_id, enum sc_status status, const char *msg,
		      uint64_t deadline_mono_ms, const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	fill_ref(&m, SC_FRAME_DONE, token, xfer_id);
	m.code = (uint32_t)status;
	snprintf(m.text, sizeof(m.text), "%s", msg ? msg : "");
	return send_request(conn, &m, NULL, 0, &w, err);
}

int sc_peer_done_recv(struct sc_peer_conn *conn, uint64_t deadline_mono_ms,
		      const atomic_bool *cancel, struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m;
	return recv_reply(conn, SC_FRAME_OK, &m, &w, err);
}

int sc_peer_done(struct sc_peer_conn *conn, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
		 enum sc_status status, const char *msg, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	if (sc_peer_done_send(conn, token, xfer_id, status, msg, deadline_mono_ms, cancel, err) != 0)
		return -1;
	return sc_peer_done_recv(conn, deadline_mono_ms, cancel, err);
}

int sc_peer_ping(struct sc_peer_conn *conn, uint64_t deadline_mono_ms, const atomic_bool *cancel,
		 struct sc_err *err)
{
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	uint64_t cookie = sc_clock_mono_ms() ^ (uint64_t)(uintptr_t)conn;
	struct sc_peer_msg m = {.type = SC_FRAME_PING, .cookie = cookie};
	if (send_request(conn, &m, NULL, 0, &w, err) != 0)
		return -1;
	if (recv_reply(conn, SC_FRAME_PONG, &m, &w, err) != 0)
		return -1;
	if (m.cookie != cookie) {
		atomic_store(&conn->broken, true);
		return sc_err_set(err, SC_INTERNAL, "%s answered PING with a wrong cookie",
				  conn->what);
	}
	return 0;
}

int sc_peer_call(struct sc_peer_conn *conn, unsigned type, const void *body, size_t len,
		 uint8_t *reply, size_t reply_cap, size_t *reply_len, uint64_t deadline_mono_ms,
		 const atomic_bool *cancel, struct sc_err *err)
{
	if (type != SC_FRAME_QP_CONNECT)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "sc_peer_call: %s is not a generic call",
				  sc_frame_type_name(type));
	struct sc_peer_wait w = client_wait(conn, deadline_mono_ms, cancel);
	struct sc_peer_msg m = {
		.type = (enum sc_frame_type)type, .opaque = body, .opaque_len = len};
	enum sc_peer_io rc = sc_peer_send_msg(conn->fd, &m, &w, conn->what, err);
	if (rc != SC_PEER_IO_OK)
		return rc == SC_PEER_IO_PROTOCOL ? -1 : io_fail(conn, rc, err);
	conn->outstanding++;
	if (recv_reply(conn, (enum sc_frame_type)type, &m, &w, err) != 0)
		return -1;
	if (m.opaque_len > reply_cap)
		return sc_err_set(err, SC_INTERNAL,
				  "%s sent a %s reply of %zu bytes (room for %zu)", conn->what,
				  sc_frame_type_name(type), m.opaque_len, reply_cap);
	memcpy(reply, m.opaque, m.opaque_len);
	*reply_len = m.opaque_len;
	return 0;
}

#define VERDICT_FAIL_WAIT_MS 1000
#define VERDICT_OK_WAIT_MS 30000

uint64_t sc_peer_verdict_ok_deadline(uint64_t xfer_deadline_mono_ms)
{
	uint64_t deadline = sc_clock_mono_ms() + VERDICT_OK_WAIT_MS;
	return xfer_deadline_mono_ms && xfer_deadline_mono_ms < deadline ? xfer_deadline_mono_ms
									  : deadline;
}

bool sc_peer_take_back(struct sc_peer_conn *c, const struct sc_xfer *x, bool opened,
		       const char *msg, const char *area)
{
	/* Only a transfer the peer knows (OPENed) whose control connection still answers: a peer
	 * that is unreachable or gone is not reached over tcp either. */
	if (!x->fallback_ok || !opened || !c || !sc_peer_conn_usable(c) ||
	    atomic_load(&x->cancel_requested) ||
	    (x->deadline_mono_ms && sc_clock_mono_ms() >= x->deadline_mono_ms))
		return false;
	uint64_t until = sc_clock_mono_ms() + 2000;
	if (x->deadline_mono_ms && x->deadline_mono_ms < until)
		until = x->deadline_mono_ms;
	struct sc_err e;
	sc_err_clear(&e);
	if (sc_peer_done(c, x->meta->token, x->xfer_id, SC_ABORTED, msg, until, NULL, &e) != 0) {
		SC_INFO_KV(area,
			   (&(struct sc_log_fields){.op = x->op_id,
						    .peer = x->meta->issuer,
						    .backend = area,
						    .trace_id = x->trace_id}),
			   "transfer %016" PRIx64 " not moved to tcp: peer %s did not take the "
			   "attempt back: %s",
			   x->xfer_id, x->meta->issuer, e.msg);
		return false;
	}
	return true;
}

void sc_peer_tell_verdict(struct sc_peer_pool *pool, struct sc_peer_conn **conn,
			  const char *endpoint, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			  uint64_t xfer_deadline_mono_ms, enum sc_status *status, char *msg,
			  size_t msg_cap, const char *area)
{
	bool ok = *status == SC_OK;
	uint64_t deadline = ok ? sc_peer_verdict_ok_deadline(xfer_deadline_mono_ms)
			       : sc_clock_mono_ms() + VERDICT_FAIL_WAIT_MS;
	struct sc_err err;
	sc_err_clear(&err);
	if (!*conn || !sc_peer_conn_usable(*conn)) {
		/* Its stream failed or was aborted: tell the verdict on a fresh one. */
		sc_peer_pool_put(pool, *conn, false);
		*conn = NULL;
		sc_peer_pool_get(pool, endpoint, deadline, conn, &err);
	}
	int rc = *conn ? sc_peer_done(*conn, token, xfer_id, *status, msg, deadline, NULL, &err)
		       : -1;
	if (rc != 0 && ok) {
		*status = err.code == SC_OK ? SC_UNAVAILABLE : err.code;
		snprintf(msg, msg_cap, "all bytes moved but the peer did not confirm completion: %.440s",
			 err.msg);
	} else if (rc != 0 && err.code != SC_UNAVAILABLE && err.code != SC_DEADLINE_EXCEEDED &&
		   err.code != SC_CANCELLED) {
		/* The peer answered why (its operation was cancelled, released or expired, which is
		 * also why it cut the connection): the worker sees that, not only a cut. */
		size_t used = strlen(msg);
		if (used + 16 < msg_cap)
			snprintf(msg + used, msg_cap - used, "; the peer says: %s", err.msg);
	} else if (rc != 0) {
		SC_DEBUG(area, "transfer %016" PRIx64 ": could not tell the peer (%s): %s", xfer_id,
			 sc_status_name(*status), err.msg);
	}
}
