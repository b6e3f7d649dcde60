/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/serve.c: serving one request of an authenticated connection: OPEN, READ(V), WRITE(V),
 * DONE, PING and QP_CONNECT, through the passive-operation interface it was handed
 * (backend/passive.h: the engine checks token, direction, bounds, deadline and state). READ sends
 * straight from the pinned span and WRITE receives straight into it: no staging copy.
 *
 * Access ends with the operation: while a connection serves a READ, WRITE, READV or WRITEV it
 * says which token (serving_begin/serving_end). When that operation ends the engine calls
 * sc_peer_server_revoke, which raises the connection's `revoked` flag and shuts its socket down:
 * the blocked send or receive returns at once, the I/O loop stops before its next system call,
 * the spans are released and the connection ends. One request's I/O is also bounded by the
 * operation's deadline (struct sc_span).
 *
 * Threads: the pool thread that took the connection (peer/conns.c), in its frame buffer and
 * read-ahead (peer/internal.h). Owns nothing beyond the request in hand.
 */
#include "peer/internal.h"
#include "peer/stage.h"

#include "base/log.h"
#include "base/timer.h"
#include "base/trace.h"
#include "peer/tls.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* A request or reply that stops moving for this long ends its connection. */
#define STALL_MS 30000
/* After refusing a hello with an ERROR frame, read what the peer still sends for this long, so
 * the close does not reset the connection before the peer has read why. */
#define REFUSAL_DRAIN_MS 200

/* ---- replies --------------------------------------------------------------------------------- */

static const struct sc_peer_wait *busy_wait(const struct conn *c, struct sc_peer_wait *w)
{
	*w = (struct sc_peer_wait){
	    .stall_ms = STALL_MS, .cancel = &c->revoked, .stop = &c->srv->stopping};
	return w;
}

/* A data request of this token starts (before its first span is pinned) or ends (after its last
 * is released): from begin to end, sc_peer_server_revoke cuts this connection. */
static void serving_begin(struct conn *c, const uint8_t token[SC_TOKEN_LEN])
{
	pthread_mutex_lock(&c->srv->mu);
	memcpy(c->serving_token, token, SC_TOKEN_LEN);
	c->serving = true;
	sc_list_insert_tail(&c->srv->serving, &c->serving_node);
	pthread_mutex_unlock(&c->srv->mu);
}

static void serving_end(struct conn *c)
{
	pthread_mutex_lock(&c->srv->mu);
	c->serving = false;
	sc_list_remove(&c->serving_node);
	pthread_mutex_unlock(&c->srv->mu);
}

/* Why a request's I/O stopped, when it was the operation that ended (revoked) or its deadline:
 * else the I/O error as usual. */
static void io_stop_reason(const struct conn *c, enum sc_peer_io rc, int e, struct sc_err *err)
{
	if (atomic_load(&c->revoked))
		sc_err_set(err, SC_CANCELLED,
			   "the operation ended (completed, cancelled, released, past its deadline "
			   "or its region deregistered) while %s was still moving its bytes: "
			   "connection cut, no further byte moves",
			   c->what);
	else
		sc_peer_io_err(rc, e, c->what, err);
}

/*
 * Whether the next request is already here and answered at once: an OPEN, READ or DONE (a
 * pipelined single-stream transfer sends OPEN, its data requests and DONE back to back), or a
 * WRITE whose bytes have all arrived too. The reply about to go out then waits for the next one
 * (MSG_MORE) and both leave together: the peer wakes once, not once per reply. Never before a
 * WRITE still arriving (its bulk may be slow) or anything else, nor under TLS (the bytes on the
 * socket are records, not frames). A reply held this way leaves with the next reply or when the
 * connection closes.
 */
static bool next_request_prompt(const struct conn *c)
{
	struct sc_peer_rxbuf *rb = c->rb;
	if (c->srv->tls || !rb)
		return false;
	/* What has arrived is read ahead (not peeked): the next request is served from it. */
	if (sc_peer_rxbuf_avail(rb) < SC_PEER_HDR_LEN)
		sc_peer_rxbuf_fill_nowait(c->fd, rb);
	const uint8_t *peek = rb->p + rb->off;
	size_t n = sc_peer_rxbuf_avail(rb);
	if (n < 2 || peek[0] != SC_PEER_VERSION)
		return false;
	if (peek[1] == SC_FRAME_OPEN || peek[1] == SC_FRAME_READ || peek[1] == SC_FRAME_READV ||
	    peek[1] == SC_FRAME_DONE)
		return true;
	struct sc_frame_hdr h;
	struct sc_peer_msg m;
	struct sc_err err;
	int avail = 0;
	if (peek[1] != SC_FRAME_WRITE || n < SC_PEER_HDR_LEN ||
	    sc_peer_decode_hdr(peek, &h, &err) != 0)
		return false;
	if (n < SC_PEER_HDR_LEN + h.body_len) {
		sc_peer_rxbuf_fill_nowait(c->fd, rb);
		peek = rb->p + rb->off;
		n = sc_peer_rxbuf_avail(rb);
	}
	return n >= SC_PEER_HDR_LEN + h.body_len &&
	       sc_peer_decode_body(h.type, peek + SC_PEER_HDR_LEN, h.body_len, &m, &err) == 0 &&
	       ioctl(c->fd, FIONREAD, &avail) == 0 &&
	       (uint64_t)avail + n >= SC_PEER_HDR_LEN + h.body_len + m.len;
}

/*
 * Is the next request a READ or READV of the transfer `open` just opened, read ahead whole (the
 * pipelined OPEN + READV of a small transfer)? It is answered without reading anything more, so
 * the OPEN's OK may wait to leave in the same sendmsg as its DATA. Only the same transfer's: if
 * that READ is cut (its operation ended: revoked), the OK lost with it concerned that transfer.
 */
static bool next_read_buffered(const struct conn *c, const struct sc_peer_msg *open)
{
	size_t n = sc_peer_rxbuf_avail(c->rb);
	if (n < SC_PEER_HDR_LEN)
		return false;
	const uint8_t *p = c->rb->p + c->rb->off;
	struct sc_frame_hdr h;
	struct sc_peer_msg next;
	struct sc_err err;
	return sc_peer_decode_hdr(p, &h, &err) == 0 && n >= SC_PEER_HDR_LEN + h.body_len &&
	       (h.type == SC_FRAME_READ || h.type == SC_FRAME_READV) &&
	       sc_peer_decode_body(h.type, p + SC_PEER_HDR_LEN, h.body_len, &next, &err) == 0 &&
	       next.xfer_id == open->xfer_id &&
	       memcmp(next.token, open->token, SC_TOKEN_LEN) == 0;
}

/* The replies held back, as the first iovec of a send (empty when none): call held_sent after. */
static size_t held_iov(const struct conn *c, struct iovec *v)
{
	size_t n = c->held ? c->held->len : 0;
	*v = (struct iovec){.iov_base = n ? c->held->p : NULL, .iov_len = n};
	return n;
}

static void held_sent(struct conn *c)
{
	if (c->held)
		c->held->len = 0;
}

/* Send what is held back now (before parking or closing the connection); best effort. */
void ps_held_flush(struct conn *c)
{
	struct iovec v;
	if (!held_iov(c, &v))
		return;
	struct sc_peer_wait w;
	int e;
	busy_wait(c, &w);
	w.deadline_mono_ms = sc_clock_mono_ms() + SERVER_SLICE_MS;
	sc_peer_sendv_all(c->fd, &v, 1, &w, NULL, &e);
	held_sent(c);
}

/* Send a reply (after what is held back, in one sendmsg); on failure say why in `why` and return
 * -1 (the connection ends). */
static int reply(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_peer_wait w;
	struct sc_err err;
	busy_wait(c, &w);
	w.more = next_request_prompt(c);
	uint8_t buf[SC_PEER_HDR_LEN + 1024];
	size_t n = m->type == SC_FRAME_QP_CONNECT ? 0 : sc_peer_encode(m, buf, sizeof(buf));
	struct iovec iov[2];
	if (!held_iov(c, &iov[0]) || n == 0) {
		ps_held_flush(c);
		if (sc_peer_send_msg(c->fd, m, &w, c->what, &err) != SC_PEER_IO_OK)
			goto fail;
		return 0;
	}
	iov[1] = (struct iovec){.iov_base = buf, .iov_len = n};
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(c->fd, iov, 2, &w, NULL, &e);
	held_sent(c);
	if (rc == SC_PEER_IO_OK)
		return 0;
	sc_peer_io_err(rc, e, c->what, &err);
fail:
	snprintf(why, why_cap, "sending %s failed: %s", sc_frame_type_name(m->type), err.msg);
	return -1;
}

static int reply_ok(struct conn *c, char *why, size_t why_cap)
{
	struct sc_peer_msg m = {.type = SC_FRAME_OK};
	return reply(c, &m, why, why_cap);
}

static int reply_error(struct conn *c, const struct sc_err *e, char *why, size_t why_cap)
{
	struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = (uint32_t)e->code};
	snprintf(m.text, sizeof(m.text), "%s", e->msg);
	c->refused = true;
	return reply(c, &m, why, why_cap);
}

/* After a refusal: stop sending, and read (and drop) what the peer still sends for a moment, so
 * the close that follows does not reset the connection before the peer has read our ERROR. */
void ps_drain_before_close(int fd)
{
	shutdown(fd, SHUT_WR);
	uint64_t until = sc_clock_mono_ms() + REFUSAL_DRAIN_MS;
	uint8_t sink[4096];
	for (uint64_t now = sc_clock_mono_ms(); now < until; now = sc_clock_mono_ms()) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		if (poll(&pfd, 1, (int)(until - now)) <= 0)
			break;
		if (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0)
			break;
	}
}

/* ---- requests -------------------------------------------------------------------------------- */

static int serve_open(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	if (!ps_open_room(c, m, &err) ||
	    sc_passive_open(&c->srv->passive, m->token, m->xfer_id, (enum sc_op_kind)m->peer_kind,
			    c->peer_id, m->total, m->trace_id, &err) != 0) {
		/* The passive side's refusal (used up, expired, wrong audience, unknown token): the
		 * peer hears it too, and can send OPENs at will, so rate-limited. */
		sc_log_kv_limited(SC_LOG_INFO, "peer", "peer-open-refused",
				  &(struct sc_log_fields){.peer = c->peer_id,
							  .bytes = m->total, .has_bytes = true,
							  .code = sc_status_name(err.code),
							  .trace_id = m->trace_id},
				  "refused transfer %016" PRIx64 " of %s: %s", m->xfer_id, c->what,
				  err.msg);
		return reply_error(c, &err, why, why_cap);
	}
	enum sc_backend_kind via = sc_peer_via_backend(m->flags);
	if (ps_track(c, m->token, m->xfer_id, (enum sc_op_kind)m->peer_kind, via) != 0) {
		sc_passive_abandon(&c->srv->passive, m->token, m->xfer_id,
				   "peer server out of memory");
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
		return reply_error(c, &err, why, why_cap);
	}
	if (via != SC_BACKEND_NONE)
		sc_passive_set_backend(&c->srv->passive, m->token, m->xfer_id, via);
	/* This transfer's pipelined READ / READV is already here: its DATA takes the OK along. */
	if (c->held && c->held->len == 0 && next_request_prompt(c) && next_read_buffered(c, m)) {
		struct sc_peer_msg ok = {.type = SC_FRAME_OK};
		c->held->len = sc_peer_encode(&ok, c->held->p, HELD_CAP);
		if (c->held->len)
			return 0;
	}
	return reply_ok(c, why, why_cap);
}

/* Pin the next piece of [offset, offset+len) of a READ or WRITE. The engine may hand out less
 * than asked (never more, never nothing). */
static int next_span(struct conn *c, const struct sc_peer_msg *m, uint64_t done,
		     struct sc_span *span, struct sc_err *err)
{
	if (sc_passive_span(&c->srv->passive, m->token, m->xfer_id,
			    m->type == SC_FRAME_WRITE ? SC_OP_WRITE : SC_OP_READ, m->desc, m->offset + done,
			    m->len - done, span, err) != 0)
		return -1;
	if (span->len == 0 || span->len > m->len - done) {
		sc_passive_span_release(&c->srv->passive, span, 0);
		return sc_err_set(err, SC_INTERNAL, "engine returned a span of %" PRIu64
				  " bytes for %" PRIu64, span->len, m->len - done);
	}
	return 0;
}

static int serve_read(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	const struct sc_passive *pv = &c->srv->passive;
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span span;
	if (!ps_opened_here(c, m, SC_OP_READ, &err) || next_span(c, m, 0, &span, &err) != 0)
		return reply_error(c, &err, why, why_cap);

	struct sc_peer_msg data = {.type = SC_FRAME_DATA, .len = m->len};
	uint8_t hdr[32];
	size_t hdr_len = sc_peer_encode(&data, hdr, sizeof(hdr));
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = span.deadline_mono_ms;
	w.more = next_request_prompt(c);
	/* Replies held back, the DATA header and the first bytes go in one sendmsg (GPU memory:
	 * staged after it). */
	struct iovec iov[3];
	size_t lead = held_iov(c, &iov[0]) + hdr_len;
	iov[1] = (struct iovec){.iov_base = hdr, .iov_len = hdr_len};
	iov[2] = (struct iovec){.iov_base = span.addr, .iov_len = span.len};
	int iovcnt = span.gpu == SC_GPU_HOST ? 3 : 2;
	bool hdr_pending = true;
	uint64_t done = 0;
	for (;;) {
		size_t sent = 0;
		int e = 0;
		enum sc_peer_io rc = SC_PEER_IO_OK;
		uint64_t moved;
		if (hdr_pending && iovcnt == 2)
			rc = sc_peer_sendv_all(c->fd, iov, 2, &w, &sent, &e);
		if (hdr_pending)
			held_sent(c);
		if (rc == SC_PEER_IO_OK && span.gpu != SC_GPU_HOST) {
			if (sc_peer_send_gpu(c->srv->gpu, span.gpu, c->fd, span.addr,
					     span.len, &w, c->what, &rc, &err) != 0) {
				sc_passive_span_release(pv, &span, 0);
				snprintf(why, why_cap, "sending READ data (GPU memory) failed: %s",
					 err.msg);
				return -1;
			}
			moved = span.len;
		} else if (rc == SC_PEER_IO_OK) {
			rc = sc_peer_sendv_all(c->fd, iov, iovcnt, &w, &sent, &e);
			moved = hdr_pending && iovcnt == 3 ? (sent > lead ? sent - lead : 0) : sent;
		} else {
			moved = 0;
		}
		hdr_pending = false;
		sc_passive_span_release(pv, &span, moved);
		if (rc != SC_PEER_IO_OK) {
			io_stop_reason(c, rc, e, &err);
			snprintf(why, why_cap, "sending READ data failed: %s", err.msg);
			return -1;
		}
		done += moved;
		if (done == m->len)
			return 0;
		/* The DATA frame promised m->len bytes: a failure now can only end the
		 * connection. */
		if (next_span(c, m, done, &span, &err) != 0) {
			snprintf(why, why_cap, "cannot serve the rest of a READ: %s", err.msg);
			return -1;
		}
		iov[0] = (struct iovec){.iov_base = span.addr, .iov_len = span.len};
		iovcnt = 1;
	}
}

/* Receive len bytes into GPU memory: what was read ahead first (copied up), then the socket's
 * bytes through the stager. As sc_peer_recv_gpu. */
static int recv_gpu(struct conn *c, int dev, uint8_t *dst, uint64_t len,
		    const struct sc_peer_wait *w, enum sc_peer_io *io, struct sc_err *err)
{
	*io = SC_PEER_IO_OK;
	size_t k = sc_peer_rxbuf_avail(c->rb);
	if (k > len)
		k = (size_t)len;
	if (k) {
		if (sc_gpu_copy(c->srv->gpu, dst, dev, c->rb->p + c->rb->off, SC_GPU_HOST, k,
				err) != 0)
			return -1;
		c->rb->off += k;
		if (c->rb->off == c->rb->len)
			c->rb->off = c->rb->len = 0;
	}
	if (k == len)
		return 0;
	return sc_peer_recv_gpu(c->srv->gpu, dev, c->fd, dst + k, len - k, w, c->what, io, err);
}

static int serve_write(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	const struct sc_passive *pv = &c->srv->passive;
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_peer_wait w;
	busy_wait(c, &w);
	uint64_t done = 0;
	bool allowed = ps_opened_here(c, m, SC_OP_WRITE, &err);
	while (done < m->len) {
		struct sc_span span;
		if (!allowed || next_span(c, m, done, &span, &err) != 0) {
			/* Refused: the bulk bytes that follow are not read; the connection ends. */
			reply_error(c, &err, why, why_cap);
			ps_drain_before_close(c->fd); /* no reset before the peer reads why */
			snprintf(why, why_cap, "refused a WRITE: %s", err.msg);
			return -1;
		}
		size_t got = 0;
		int e = 0;
		enum sc_peer_io rc;
		w.deadline_mono_ms = span.deadline_mono_ms;
		if (span.gpu != SC_GPU_HOST) {
			/* Staged: acknowledged (OK below) only once the bytes are in GPU memory. */
			if (recv_gpu(c, span.gpu, span.addr, span.len, &w, &rc, &err) != 0) {
				sc_passive_span_release(pv, &span, 0);
				if (rc == SC_PEER_IO_OK) /* the driver failed: tell the peer why */
					reply_error(c, &err, why, why_cap);
				snprintf(why, why_cap, "receiving WRITE data (GPU memory) failed: %s",
					 err.msg);
				return -1;
			}
			got = span.len;
		} else {
			rc = sc_peer_recv_rb(c->fd, c->rb, span.addr, span.len, &w, &got, &e);
		}
		sc_passive_span_release(pv, &span, got);
		if (rc != SC_PEER_IO_OK) {
			io_stop_reason(c, rc, e, &err);
			snprintf(why, why_cap, "receiving WRITE data failed: %s", err.msg);
			return -1;
		}
		done += got;
	}
	return reply_ok(c, why, why_cap);
}

/* ---- many pieces per request (READV, WRITEV) ------------------------------------------------- */

static void release_spans(const struct sc_passive *pv, struct sc_span *spans, size_t n,
			  uint64_t moved)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t k = moved < spans[i].len ? moved : spans[i].len;
		moved -= k;
		sc_passive_span_release(pv, &spans[i], k);
	}
}

/* Pin every piece of a READV/WRITEV into *spans / *iov, in order (*iov has two empty iovecs
 * first, for what goes ahead of the pieces in a sendmsg); *gpu_out: SC_GPU_HOST when every piece
 * is host memory, else a GPU that holds one. */
static int pin_pieces(struct conn *c, const struct sc_peer_msg *m, enum sc_op_kind kind,
		      struct sc_span **spans_out, struct iovec **iov_out, size_t *n_out,
		      int *gpu_out, struct sc_err *err)
{
	const struct sc_passive *pv = &c->srv->passive;
	size_t cap = m->n_pieces, n = 0;
	int gpu = SC_GPU_HOST;
	struct sc_span *spans = malloc(cap * sizeof(*spans));
	if (!spans)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	for (uint32_t i = 0; i < m->n_pieces; i++) {
		struct sc_peer_piece p = sc_peer_piece_at(m, i);
		for (uint64_t done = 0; done < p.len;) {
			if (n == cap) {
				struct sc_span *more = realloc(spans, 2 * cap * sizeof(*spans));
				if (!more) {
					sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
					goto fail;
				}
				spans = more;
				cap *= 2;
			}
			struct sc_span *sp = &spans[n];
			if (sc_passive_span(pv, m->token, m->xfer_id, kind, p.desc, p.offset + done,
					    p.len - done, sp, err) != 0) {
				sc_err_prefix(err, "piece %u", i);
				goto fail;
			}
			n++;
			if (sp->gpu != SC_GPU_HOST) /* staged: see staged_pieces */
				gpu = sp->gpu;
			if (sp->len == 0 || sp->len > p.len - done) {
				sc_err_set(err, SC_INTERNAL, "engine returned a span of %" PRIu64
					   " bytes for %" PRIu64, sp->len, p.len - done);
				goto fail;
			}
			done += sp->len;
		}
	}
	struct iovec *iov = malloc((n + 2) * sizeof(*iov));
	if (!iov) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
		goto fail;
	}
	iov[0] = iov[1] = (struct iovec){0};
	for (size_t i = 0; i < n; i++)
		iov[2 + i] = (struct iovec){.iov_base = spans[i].addr, .iov_len = spans[i].len};
	*spans_out = spans;
	*iov_out = iov;
	*n_out = n;
	*gpu_out = gpu;
	return 0;
fail:
	release_spans(pv, spans, n, 0);
	free(spans);
	return -1;
}

/* The pieces of a READV/WRITEV that has GPU memory in it, in order, packed through pinned buffers:
 * each stretch whose GPU pieces are on one device (host pieces join the stretch they are in) goes
 * through that device's stager (every stretch has a GPU piece: the list has one, and a stretch
 * ends only at a GPU piece of another device). */
static int staged_pieces(struct conn *c, const struct sc_span *spans, size_t n, bool send,
			 const struct sc_peer_wait *w, enum sc_peer_io *io, struct sc_err *err)
{
	*io = SC_PEER_IO_OK;
	struct sc_stage_piece *p = malloc((n ? n : 1) * sizeof(*p));
	if (!p)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	for (size_t i = 0; i < n; i++)
		p[i] = (struct sc_stage_piece){
		    .addr = spans[i].addr, .len = spans[i].len, .gpu = spans[i].gpu};
	struct sc_gpu *g = c->srv->gpu;
	int rc = 0;
	size_t i = 0;
	/* Receiving: the bytes read ahead come first (read-ahead invariant, peer/internal.h). */
	for (; !send && i < n && sc_peer_rxbuf_avail(c->rb); i++) {
		size_t k = sc_peer_rxbuf_avail(c->rb);
		if (k > p[i].len)
			k = (size_t)p[i].len;
		if (sc_gpu_copy(g, p[i].addr, p[i].gpu, c->rb->p + c->rb->off, SC_GPU_HOST, k,
				err) != 0) {
			free(p);
			return -1;
		}
		c->rb->off += k;
		p[i].addr += k;
		p[i].len -= k;
		if (p[i].len)
			break;
	}
	if (!sc_peer_rxbuf_avail(c->rb) && c->rb)
		c->rb->off = c->rb->len = 0;
	for (; rc == 0 && i < n;) {
		int dev = SC_GPU_HOST;
		size_t j = i;
		for (; j < n && (p[j].gpu == SC_GPU_HOST || dev == SC_GPU_HOST || p[j].gpu == dev);
		     j++)
			dev = p[j].gpu != SC_GPU_HOST ? p[j].gpu : dev;
		rc = send ? sc_peer_send_pieces_gpu(g, dev, c->fd, p + i, j - i, w, c->what, io, err)
			  : sc_peer_recv_pieces_gpu(g, dev, c->fd, p + i, j - i, w, c->what, io, err);
		i = j;
	}
	free(p);
	return rc;
}

/* READV: the DATA header, then every piece gathered straight from region memory (sendmsg with
 * up to IOV_MAX iovecs per call). */
static int serve_readv(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span *spans = NULL;
	struct iovec *iov = NULL;
	size_t n = 0;
	int gpu = SC_GPU_HOST;
	if (!ps_opened_here(c, m, SC_OP_READ, &err) ||
	    pin_pieces(c, m, SC_OP_READ, &spans, &iov, &n, &gpu, &err) != 0)
		return reply_error(c, &err, why, why_cap);
	struct sc_peer_msg data = {.type = SC_FRAME_DATA, .len = m->len};
	uint8_t hdr[32];
	size_t hdr_len = sc_peer_encode(&data, hdr, sizeof(hdr));
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = n ? spans[0].deadline_mono_ms : 0;
	w.more = next_request_prompt(c);
	/* Replies held back, the DATA header and (host memory) every piece in one sendmsg. */
	size_t lead = held_iov(c, &iov[0]) + hdr_len;
	iov[1] = (struct iovec){.iov_base = hdr, .iov_len = hdr_len};
	size_t sent = 0;
	int e = 0;
	enum sc_peer_io rc =
	    sc_peer_sendv_all(c->fd, iov, gpu != SC_GPU_HOST ? 2 : (int)n + 2, &w, &sent, &e);
	held_sent(c);
	if (rc == SC_PEER_IO_OK && gpu != SC_GPU_HOST) {
		if (staged_pieces(c, spans, n, true, &w, &rc, &err) != 0) {
			release_spans(&c->srv->passive, spans, n, 0);
			free(spans);
			free(iov);
			snprintf(why, why_cap, "sending READV data (GPU memory) failed: %s", err.msg);
			return -1;
		}
		sent = (size_t)m->len;
	} else {
		sent = sent > lead ? sent - lead : 0;
	}
	release_spans(&c->srv->passive, spans, n, sent);
	free(spans);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		io_stop_reason(c, rc, e, &err);
		snprintf(why, why_cap, "sending READV data failed: %s", err.msg);
		return -1;
	}
	return 0;
}

/* WRITEV: the bulk scattered straight into region memory (recvmsg), then OK. */
static int serve_writev(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_span *spans = NULL;
	struct iovec *iov = NULL;
	size_t n = 0;
	int gpu = SC_GPU_HOST;
	if (!ps_opened_here(c, m, SC_OP_WRITE, &err) ||
	    pin_pieces(c, m, SC_OP_WRITE, &spans, &iov, &n, &gpu, &err) != 0) {
		/* Refused: the bulk bytes that follow are not read; the connection ends. */
		reply_error(c, &err, why, why_cap);
		ps_drain_before_close(c->fd);
		snprintf(why, why_cap, "refused a WRITEV: %s", err.msg);
		return -1;
	}
	struct sc_peer_wait w;
	busy_wait(c, &w);
	w.deadline_mono_ms = n ? spans[0].deadline_mono_ms : 0;
	size_t got = 0;
	int e = 0;
	enum sc_peer_io rc;
	if (gpu != SC_GPU_HOST) {
		/* Staged: acknowledged (OK below) only once the bytes are in GPU memory. */
		if (staged_pieces(c, spans, n, false, &w, &rc, &err) != 0) {
			release_spans(&c->srv->passive, spans, n, 0);
			free(spans);
			free(iov);
			if (rc == SC_PEER_IO_OK) /* the driver failed: tell the peer why */
				reply_error(c, &err, why, why_cap);
			snprintf(why, why_cap, "receiving WRITEV data (GPU memory) failed: %s",
				 err.msg);
			return -1;
		}
		got = (size_t)m->len;
	} else {
		rc = sc_peer_recvv_rb(c->fd, c->rb, iov + 2, (int)n, &w, &got, &e);
	}
	release_spans(&c->srv->passive, spans, n, got);
	free(spans);
	free(iov);
	if (rc != SC_PEER_IO_OK) {
		io_stop_reason(c, rc, e, &err);
		snprintf(why, why_cap, "receiving WRITEV data failed: %s", err.msg);
		return -1;
	}
	return reply_ok(c, why, why_cap);
}

static int serve_done(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_err err;
	sc_err_clear(&err);
	ps_untrack_everywhere(c->srv, m->token, m->xfer_id);
	if (sc_passive_done(&c->srv->passive, m->token, m->xfer_id, sc_peer_status_from_wire(m->code),
			    m->text, &err) != 0)
		return reply_error(c, &err, why, why_cap);
	return reply_ok(c, why, why_cap);
}

static int serve_handler(struct conn *c, const struct sc_peer_msg *m, char *why, size_t why_cap)
{
	struct sc_peer_server *srv = c->srv;
	struct sc_err err;
	sc_err_clear(&err);
	pthread_mutex_lock(&srv->mu);
	sc_peer_handler_fn fn = srv->qp_fn;
	void *ctx = srv->qp_ctx;
	if (fn)
		srv->qp_busy++;
	pthread_mutex_unlock(&srv->mu);
	if (!fn) {
		sc_err_set(&err, SC_UNIMPLEMENTED,
			   "sidecar \"%s\" serves no %s (its ibverbs backend is not running): use "
			   "the tcp backend",
			   srv->self_id, sc_frame_type_name(m->type));
		return reply_error(c, &err, why, why_cap);
	}
	uint8_t *out = malloc(SC_PEER_MAX_BODY);
	size_t out_len = 0;
	int rc = -1;
	if (!out)
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "sidecar out of memory");
	else if ((rc = fn(ctx, c->peer_id, m->opaque, m->opaque_len, out, SC_PEER_MAX_BODY,
			  &out_len, &err)) == 0 &&
		 out_len > SC_PEER_MAX_BODY)
		rc = sc_err_set(&err, SC_INTERNAL, "%s handler returned %zu bytes",
				sc_frame_type_name(m->type), out_len);
	pthread_mutex_lock(&srv->mu);
	srv->qp_busy--;
	pthread_cond_broadcast(&srv->cv);
	pthread_mutex_unlock(&srv->mu);
	int sent;
	if (rc == 0) {
		struct sc_peer_msg r = {.type = m->type, .opaque = out, .opaque_len = out_len};
		sent = reply(c, &r, why, why_cap);
	} else {
		if (err.code == SC_OK)
			sc_err_set(&err, SC_INTERNAL, "%s handler failed",
				   sc_frame_type_name(m->type));
		sent = reply_error(c, &err, why, why_cap);
	}
	free(out);
	return sent;
}

/* ---- one request ----------------------------------------------------------------------------- */

/* Does the connection hold a transfer it OPENed (DONE not come, operation not ended)? */
static bool holds_open(struct conn *c)
{
	pthread_mutex_lock(&c->srv->mu);
	bool yes = c->n_opened > 0;
	pthread_mutex_unlock(&c->srv->mu);
	return yes;
}

/* The connection received a request (or finished its hello): it is now the most recently used. */
void ps_mark_active(struct conn *c)
{
	atomic_store(&c->last_active_mono_ms, sc_clock_mono_ms());
	atomic_store(&c->last_active_seq, atomic_fetch_add(&c->srv->activity_seq, 1) + 1);
}

/* The hand-off trace's stage name (base/trace.h) for a request received, or answered. */
static const char *trace_stage(enum sc_frame_type t, bool answered)
{
	switch (t) {
	case SC_FRAME_OPEN:
		return answered ? "passive_open_answered" : "passive_open_received";
	case SC_FRAME_READ:
	case SC_FRAME_READV:
		return answered ? "passive_read_served" : "passive_read_received";
	case SC_FRAME_WRITE:
	case SC_FRAME_WRITEV:
		return answered ? "passive_write_stored" : "passive_write_received";
	case SC_FRAME_DONE:
		return answered ? "passive_done_answered" : "passive_done_received";
	default:
		return answered ? "passive_other_answered" : "passive_other_received";
	}
}

/* One request, its bytes already arriving: 0 when served (the connection goes on), else -1 with
 * `why` saying how the connection ends. */
int ps_serve_one(struct conn *c, char *why, size_t why_cap)
{
	struct sc_peer_server *srv = c->srv;
	/* The frame has begun to arrive: the rest must keep coming. */
	struct sc_peer_wait w = {.stall_ms = STALL_MS, .stop = &srv->stopping};
	struct sc_peer_msg m;
	struct sc_err err;
	sc_err_clear(&err);
	enum sc_peer_io io =
	    sc_peer_recv_msg_rb(c->fd, c->rb, c->buf, c->buf_cap, &m, &w, c->what, &err);
	if (io != SC_PEER_IO_OK) {
		if (io == SC_PEER_IO_PROTOCOL) /* the peer chose it: rate-limited */
			sc_log_kv_limited(SC_LOG_WARN, "peer", "peer-protocol-error",
					  &(struct sc_log_fields){.peer = c->peer_id,
								  .code = sc_status_name(err.code)},
					  "closing connection from %s: %s", c->what, err.msg);
		if (io == SC_PEER_IO_CANCELLED)
			snprintf(why, why_cap, "sidecar \"%s\" is shutting down", srv->self_id);
		else
			snprintf(why, why_cap, "%s", err.msg);
		return -1;
	}
	if (sc_trace_on())
		sc_trace_record(m.xfer_id, trace_stage(m.type, false), 0);
	/* Most recently used from the request's arrival, before any reply leaves: a peer that has its
	 * answer is already ordered after every earlier one (marking after the reply raced with the
	 * next peer's requests when this thread was slow to run on). A PING is use only on a
	 * connection with a transfer open (the liveness check of a long ibverbs transfer's control
	 * connection): elsewhere it neither keeps a connection from expiring nor moves it up the
	 * order of eviction. */
	bool use = m.type != SC_FRAME_PING || holds_open(c);
	/* A refused request is no use either: restored below, so that a peer sending OPENs past its
	 * caps (or for tokens that are spent) cannot keep its connections fresh against eviction. */
	uint64_t was_ms = atomic_load(&c->last_active_mono_ms);
	uint64_t was_seq = atomic_load(&c->last_active_seq);
	if (use)
		ps_mark_active(c);
	c->refused = false;
	int rc;
	switch (m.type) {
	case SC_FRAME_OPEN:
		rc = serve_open(c, &m, why, why_cap);
		break;
	case SC_FRAME_READ:
		serving_begin(c, m.token);
		rc = serve_read(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_WRITE:
		serving_begin(c, m.token);
		rc = serve_write(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_READV:
		serving_begin(c, m.token);
		rc = serve_readv(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_WRITEV:
		serving_begin(c, m.token);
		rc = serve_writev(c, &m, why, why_cap);
		serving_end(c);
		break;
	case SC_FRAME_DONE:
		rc = serve_done(c, &m, why, why_cap);
		break;
	case SC_FRAME_PING: {
		struct sc_peer_msg pong = {.type = SC_FRAME_PONG, .cookie = m.cookie};
		rc = reply(c, &pong, why, why_cap);
		break;
	}
	case SC_FRAME_QP_CONNECT:
		rc = serve_handler(c, &m, why, why_cap);
		break;
	default:
		SC_WARN_LIMITED("peer", "peer-unexpected-frame",
				"closing connection from %s: protocol error: unexpected %s frame from "
				"a client",
				c->what, sc_frame_type_name(m.type));
		snprintf(why, why_cap, "protocol error: unexpected %s frame",
			 sc_frame_type_name(m.type));
		rc = -1;
		break;
	}
	if (sc_trace_on())
		sc_trace_record(m.xfer_id, trace_stage(m.type, true), 0);
	if (rc != 0)
		return -1;
	if (use && c->refused) {
		atomic_store(&c->last_active_mono_ms, was_ms);
		atomic_store(&c->last_active_seq, was_seq);
	} else if (use) { /* idle from the request's end */
		atomic_store(&c->last_active_mono_ms, sc_clock_mono_ms());
	}
	if (atomic_load(&c->revoked)) { /* it finished as the operation ended: end anyway */
		snprintf(why, why_cap, "an operation it served ended: connection cut");
		return -1;
	}
	return 0;
}
