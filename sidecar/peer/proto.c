/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/proto.c: the peer control channel's wire format (frame codec), blocking socket I/O with
 * deadlines and cancel flags (through the stream layered under the fds, when one is set: peer TLS),
 * and the mutual-authentication hello (see peer/proto.h for layouts).
 * Runs on whichever thread calls it (peer server connection threads, tcp backend workers, the
 * ibverbs rendezvous); it owns nothing beyond the caller's buffers and fd for the call's length.
 */
#include "peer/proto.h"

#include "os/fault_guard.h"
#include "base/log.h"
#include "base/timer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <openssl/crypto.h>

static const char *const frame_names[] = {
	[SC_FRAME_HELLO] = "HELLO",	    [SC_FRAME_HELLO_ACK] = "HELLO_ACK",
	[SC_FRAME_HELLO_FIN] = "HELLO_FIN", [SC_FRAME_OK] = "OK",
	[SC_FRAME_ERROR] = "ERROR",	    [SC_FRAME_OPEN] = "OPEN",
	[SC_FRAME_READ] = "READ",	    [SC_FRAME_DATA] = "DATA",
	[SC_FRAME_WRITE] = "WRITE",	    [SC_FRAME_DONE] = "DONE",
	[SC_FRAME_PING] = "PING",	    [SC_FRAME_PONG] = "PONG",
	[SC_FRAME_QP_CONNECT] = "QP_CONNECT", [SC_FRAME_READV] = "READV",
	[SC_FRAME_WRITEV] = "WRITEV",
};

const char *sc_frame_type_name(unsigned type)
{
	if (type >= 1 && type <= SC_FRAME_TYPE_MAX)
		return frame_names[type];
	return "UNKNOWN";
}

/* ---- encoding -------------------------------------------------------------------------------- */

struct wbuf {
	uint8_t *p;
	size_t len, cap;
	bool bad;
};

static void put_bytes(struct wbuf *b, const void *src, size_t n)
{
	if (b->bad || n > b->cap - b->len) {
		b->bad = true;
		return;
	}
	memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void put_uint(struct wbuf *b, uint64_t v, size_t width)
{
	uint8_t tmp[8];
	for (size_t i = 0; i < width; i++)
		tmp[i] = (uint8_t)(v >> (8 * i));
	put_bytes(b, tmp, width);
}

static void put_str(struct wbuf *b, const char *s)
{
	size_t n = strlen(s);
	if (n > UINT16_MAX) {
		b->bad = true;
		return;
	}
	put_uint(b, n, 2);
	put_bytes(b, s, n);
}

static void put_xfer_ref(struct wbuf *b, const struct sc_peer_msg *m)
{
	put_bytes(b, m->token, SC_TOKEN_LEN);
	put_uint(b, m->xfer_id, 8);
}

/* 32 hex digits (sc_trace_id_valid) into 16 bytes. */
static bool trace_hex_to_raw(const char *hex, uint8_t raw[16])
{
	if (!sc_trace_id_valid(hex))
		return false;
	for (size_t i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return false;
		raw[i] = (uint8_t)v;
	}
	return true;
}

size_t sc_peer_encode(const struct sc_peer_msg *m, uint8_t *buf, size_t cap)
{
	if (cap < SC_PEER_HDR_LEN)
		return 0;
	struct wbuf b = {.p = buf + SC_PEER_HDR_LEN, .cap = cap - SC_PEER_HDR_LEN};
	if (b.cap > SC_PEER_MAX_BODY)
		b.cap = SC_PEER_MAX_BODY;
	switch (m->type) {
	case SC_FRAME_HELLO:
		put_uint(&b, SC_PEER_MAGIC, 4);
		put_bytes(&b, m->nonce, SC_PEER_NONCE_LEN);
		put_str(&b, m->id);
		put_str(&b, m->key_id);
		break;
	case SC_FRAME_HELLO_ACK:
		put_bytes(&b, m->nonce, SC_PEER_NONCE_LEN);
		put_str(&b, m->id);
		put_bytes(&b, m->proof, SC_HMAC_LEN);
		break;
	case SC_FRAME_HELLO_FIN:
		put_bytes(&b, m->proof, SC_HMAC_LEN);
		break;
	case SC_FRAME_OK:
		break;
	case SC_FRAME_ERROR:
		put_uint(&b, m->code, 4);
		put_str(&b, m->text);
		break;
	case SC_FRAME_OPEN:
		put_xfer_ref(&b, m);
		put_uint(&b, m->peer_kind, 1);
		put_uint(&b, m->total, 8);
		if (m->trace_id[0]) {
			uint8_t raw[16];
			if (!trace_hex_to_raw(m->trace_id, raw))
				return 0;
			put_uint(&b, SC_PEER_OPEN_EXT_TRACE, 1);
			put_uint(&b, sizeof(raw), 1);
			put_bytes(&b, raw, sizeof(raw));
		}
		break;
	case SC_FRAME_READ:
	case SC_FRAME_WRITE:
		put_xfer_ref(&b, m);
		put_uint(&b, m->desc, 4);
		put_uint(&b, m->offset, 8);
		put_uint(&b, m->len, 8);
		break;
	case SC_FRAME_READV:
	case SC_FRAME_WRITEV:
		if (m->n_pieces == 0 || m->n_pieces > SC_PEER_MAX_PIECES ||
		    (!m->piece_list && !m->pieces_wire))
			return 0;
		put_xfer_ref(&b, m);
		put_uint(&b, m->n_pieces, 4);
		if (!m->piece_list) /* a decoded message: its pieces as they came */
			put_bytes(&b, m->pieces_wire, (size_t)m->n_pieces * SC_PEER_PIECE_WIRE);
		for (uint32_t i = 0; m->piece_list && i < m->n_pieces; i++) {
			put_uint(&b, m->piece_list[i].desc, 4);
			put_uint(&b, m->piece_list[i].offset, 8);
			put_uint(&b, m->piece_list[i].len, 8);
		}
		break;
	case SC_FRAME_DATA:
		put_uint(&b, m->len, 8);
		break;
	case SC_FRAME_DONE:
		put_xfer_ref(&b, m);
		put_uint(&b, m->code, 4);
		put_str(&b, m->text);
		break;
	case SC_FRAME_PING:
	case SC_FRAME_PONG:
		put_uint(&b, m->cookie, 8);
		break;
	case SC_FRAME_QP_CONNECT:
		put_bytes(&b, m->opaque, m->opaque_len);
		break;
	default:
		return 0;
	}
	if (b.bad)
		return 0;
	struct wbuf h = {.p = buf, .cap = SC_PEER_HDR_LEN};
	put_uint(&h, SC_PEER_VERSION, 1);
	put_uint(&h, (uint64_t)m->type, 1);
	put_uint(&h, m->type == SC_FRAME_OPEN ? (m->flags & SC_PEER_OPEN_FLAGS) : 0, 2);
	put_uint(&h, b.len, 4);
	return SC_PEER_HDR_LEN + b.len;
}

uint16_t sc_peer_via_flags(enum sc_backend_kind via)
{
	return via == SC_BACKEND_IBVERBS     ? SC_PEER_FLAG_VIA_BACKEND
	       : via == SC_BACKEND_LIBFABRIC ? SC_PEER_FLAG_VIA_BACKEND | SC_PEER_FLAG_VIA_LIBFABRIC
					     : 0;
}

enum sc_backend_kind sc_peer_via_backend(uint16_t flags)
{
	if (!(flags & SC_PEER_FLAG_VIA_BACKEND))
		return SC_BACKEND_NONE;
	return (flags & SC_PEER_FLAG_VIA_LIBFABRIC) ? SC_BACKEND_LIBFABRIC : SC_BACKEND_IBVERBS;
}

/* ---- decoding -------------------------------------------------------------------------------- */

struct rbuf {
	const uint8_t *p;
	size_t len, off;
	const char *bad; /* the first problem found */
};

static const uint8_t *get_bytes(struct rbuf *b, size_t n, const char *what)
{
	if (b->bad)
		return NULL;
	if (n > b->len - b->off) {
		b->bad = what;
		return NULL;
	}
	const uint8_t *at = b->p + b->off;
	b->off += n;
	return at;
}

static void get_copy(struct rbuf *b, void *dst, size_t n, const char *what)
{
	const uint8_t *at = get_bytes(b, n, what);
	if (at)
		memcpy(dst, at, n);
}

static uint64_t get_uint(struct rbuf *b, size_t width, const char *what)
{
	const uint8_t *at = get_bytes(b, width, what);
	uint64_t v = 0;
	for (size_t i = 0; at && i < width; i++)
		v |= (uint64_t)at[i] << (8 * i);
	return v;
}

/* A string into dst[cap]. `cut`: longer strings are truncated (messages); otherwise they are an
 * error (ids). NUL bytes are never accepted. */
static void get_str(struct rbuf *b, char *dst, size_t cap, bool cut, const char *what)
{
	size_t n = (size_t)get_uint(b, 2, what);
	const uint8_t *at = get_bytes(b, n, what);
	dst[0] = '\0';
	if (!at)
		return;
	if (memchr(at, '\0', n)) {
		b->bad = what;
		return;
	}
	if (n >= cap) {
		if (!cut) {
			b->bad = what;
			return;
		}
		n = cap - 1;
	}
	memcpy(dst, at, n);
	dst[n] = '\0';
}

static void get_xfer_ref(struct rbuf *b, struct sc_peer_msg *m)
{
	get_copy(b, m->token, SC_TOKEN_LEN, "token");
	m->xfer_id = get_uint(b, 8, "xfer_id");
}

/* OPEN's extensions, to the end of the body: the ones known are kept, the others skipped. */
static void get_open_ext(struct rbuf *b, struct sc_peer_msg *m)
{
	m->trace_id[0] = '\0';
	while (!b->bad && b->off < b->len) {
		unsigned tag = (unsigned)get_uint(b, 1, "extension tag");
		size_t n = (size_t)get_uint(b, 1, "extension length");
		const uint8_t *v = get_bytes(b, n, "extension");
		if (!v)
			return;
		if (tag == SC_PEER_OPEN_EXT_TRACE) {
			if (n != 16) {
				b->bad = "trace id extension (16 bytes)";
				return;
			}
			for (size_t i = 0; i < 16; i++) {
				m->trace_id[2 * i] = "0123456789abcdef"[v[i] >> 4];
				m->trace_id[2 * i + 1] = "0123456789abcdef"[v[i] & 15];
			}
			m->trace_id[32] = '\0';
			if (!sc_trace_id_valid(m->trace_id)) /* all zeros: no trace */
				m->trace_id[0] = '\0';
		}
	}
}

int sc_peer_decode_hdr(const uint8_t in[SC_PEER_HDR_LEN], struct sc_frame_hdr *h,
		       struct sc_err *err)
{
	h->version = in[0];
	h->type = in[1];
	h->flags = (uint16_t)(in[2] | in[3] << 8);
	h->body_len = (uint32_t)in[4] | (uint32_t)in[5] << 8 | (uint32_t)in[6] << 16 |
		      (uint32_t)in[7] << 24;
	if (h->version != SC_PEER_VERSION)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: frame version %u, expected %u (%s)", h->version,
				  SC_PEER_VERSION,
				  h->version == 0x16 ? "a TLS handshake: the peer uses --peer-tls-*, "
						       "this sidecar does not; configure the same "
						       "peer TLS on both"
						     : "not an rdma-sidecar peer, or a different "
						       "release");
	if (h->type < 1 || h->type > SC_FRAME_TYPE_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "protocol error: unknown frame type %u",
				  h->type);
	if (h->flags != 0 && !(h->type == SC_FRAME_OPEN && (h->flags == SC_PEER_FLAG_VIA_BACKEND ||
						h->flags == SC_PEER_OPEN_FLAGS)))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: %s frame with unknown flags 0x%x",
				  sc_frame_type_name(h->type), h->flags);
	if (h->body_len > SC_PEER_MAX_BODY)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: %s frame body of %u bytes (limit %u)",
				  sc_frame_type_name(h->type), h->body_len, SC_PEER_MAX_BODY);
	return 0;
}

int sc_peer_decode_body(unsigned type, const uint8_t *body, size_t len, struct sc_peer_msg *m,
			struct sc_err *err)
{
	struct rbuf b = {.p = body, .len = len};
	m->type = (enum sc_frame_type)type;
	switch (type) {
	case SC_FRAME_HELLO:
		if (get_uint(&b, 4, "magic") != SC_PEER_MAGIC && !b.bad)
			b.bad = "magic (not an rdma-sidecar peer)";
		get_copy(&b, m->nonce, SC_PEER_NONCE_LEN, "nonce");
		get_str(&b, m->id, sizeof(m->id), false, "client id");
		get_str(&b, m->key_id, sizeof(m->key_id), false, "key id");
		break;
	case SC_FRAME_HELLO_ACK:
		get_copy(&b, m->nonce, SC_PEER_NONCE_LEN, "nonce");
		get_str(&b, m->id, sizeof(m->id), false, "server id");
		get_copy(&b, m->proof, SC_HMAC_LEN, "proof");
		break;
	case SC_FRAME_HELLO_FIN:
		get_copy(&b, m->proof, SC_HMAC_LEN, "proof");
		break;
	case SC_FRAME_OK:
		break;
	case SC_FRAME_ERROR:
		m->code = (uint32_t)get_uint(&b, 4, "code");
		get_str(&b, m->text, sizeof(m->text), true, "message");
		break;
	case SC_FRAME_OPEN:
		get_xfer_ref(&b, m);
		m->peer_kind = (uint8_t)get_uint(&b, 1, "peer kind");
		m->total = get_uint(&b, 8, "total");
		if (!b.bad && m->peer_kind != SC_OP_READ && m->peer_kind != SC_OP_WRITE)
			b.bad = "peer kind";
		get_open_ext(&b, m);
		break;
	case SC_FRAME_READ:
	case SC_FRAME_WRITE:
		get_xfer_ref(&b, m);
		m->desc = (uint32_t)get_uint(&b, 4, "descriptor");
		m->offset = get_uint(&b, 8, "offset");
		m->len = get_uint(&b, 8, "length");
		if (!b.bad && (m->len == 0 || m->len > SC_PEER_MAX_BULK))
			b.bad = "length (must be 1 byte .. 1 GiB)";
		break;
	case SC_FRAME_READV:
	case SC_FRAME_WRITEV: {
		get_xfer_ref(&b, m);
		m->n_pieces = (uint32_t)get_uint(&b, 4, "piece count");
		if (!b.bad && (m->n_pieces == 0 || m->n_pieces > SC_PEER_MAX_PIECES)) {
			b.bad = "piece count (must be 1 .. 1024)";
			break;
		}
		m->pieces_wire = get_bytes(&b, (size_t)m->n_pieces * SC_PEER_PIECE_WIRE, "pieces");
		m->len = 0;
		for (uint32_t i = 0; !b.bad && i < m->n_pieces; i++) {
			struct sc_peer_piece p = sc_peer_piece_at(m, i);
			if (p.len == 0 || p.len > SC_PEER_MAX_BULK - m->len)
				b.bad = "piece length (each at least 1 byte, all together at most "
					"1 GiB)";
			else
				m->len += p.len;
		}
		break;
	}
	case SC_FRAME_DATA:
		m->len = get_uint(&b, 8, "length");
		if (!b.bad && m->len > SC_PEER_MAX_BULK)
			b.bad = "length (over 1 GiB)";
		break;
	case SC_FRAME_DONE:
		get_xfer_ref(&b, m);
		m->code = (uint32_t)get_uint(&b, 4, "status");
		get_str(&b, m->text, sizeof(m->text), true, "message");
		break;
	case SC_FRAME_PING:
	case SC_FRAME_PONG:
		m->cookie = get_uint(&b, 8, "cookie");
		break;
	case SC_FRAME_QP_CONNECT:
		m->opaque = body;
		m->opaque_len = len;
		b.off = len;
		break;
	default:
		return sc_err_set(err, SC_INVALID_ARGUMENT, "protocol error: unknown frame type %u",
				  type);
	}
	if (b.bad)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "protocol error: %s frame: bad %s",
				  sc_frame_type_name(type), b.bad);
	if (b.off != b.len)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: %s frame: %zu unexpected trailing bytes",
				  sc_frame_type_name(type), b.len - b.off);
	return 0;
}

struct sc_peer_piece sc_peer_piece_at(const struct sc_peer_msg *m, uint32_t i)
{
	struct rbuf b = {.p = m->pieces_wire + (size_t)i * SC_PEER_PIECE_WIRE,
			 .len = SC_PEER_PIECE_WIRE};
	struct sc_peer_piece p;
	p.desc = (uint32_t)get_uint(&b, 4, "descriptor");
	p.offset = get_uint(&b, 8, "offset");
	p.len = get_uint(&b, 8, "length");
	return p;
}

enum sc_status sc_peer_status_from_wire(uint32_t code)
{
	switch (code) {
#define SC_PEER_STATUS_CASE(name, value, text)                                                     \
	case value:                                                                                \
		return SC_##name;
		SC_STATUS_MAP(SC_PEER_STATUS_CASE)
#undef SC_PEER_STATUS_CASE
	}
	return SC_INTERNAL;
}

/* ---- blocking I/O ---------------------------------------------------------------------------- */

int sc_peer_set_io_slice(int fd, unsigned ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000};
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
		return -1;
	return 0;
}

uint64_t sc_peer_test_idle_ms(uint64_t dflt)
{
	return sc_test_env_ms("SC_TEST_PEER_IDLE_MS", dflt);
}

int sc_peer_tune_socket(int fd)
{
	int one = 1, idle = 5, intvl = 2, cnt = 3;
	unsigned user_timeout = SC_PEER_USER_TIMEOUT_MS;
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout)) != 0)
		return -1;
	return sc_peer_set_io_slice(fd, SC_PEER_IO_SLICE_MS);
}

static _Atomic(const struct sc_peer_stream *) g_stream;

void sc_peer_set_stream(const struct sc_peer_stream *s)
{
	atomic_store_explicit(&g_stream, s, memory_order_release);
}

static const struct sc_peer_stream *stream(void)
{
	return atomic_load_explicit(&g_stream, memory_order_acquire);
}

/* After a slice without completion: should the call give up? */
static enum sc_peer_io wait_check(const struct sc_peer_wait *w, uint64_t last_progress_ms)
{
	if (!w)
		return SC_PEER_IO_OK;
	if ((w->cancel && atomic_load_explicit(w->cancel, memory_order_relaxed)) ||
	    (w->stop && atomic_load_explicit(w->stop, memory_order_relaxed)))
		return SC_PEER_IO_CANCELLED;
	if (w->deadline_mono_ms || w->stall_ms) {
		uint64_t now = sc_clock_mono_ms();
		if (w->deadline_mono_ms && now >= w->deadline_mono_ms)
			return SC_PEER_IO_DEADLINE;
		if (w->stall_ms && now >= last_progress_ms + w->stall_ms)
			return SC_PEER_IO_DEADLINE;
	}
	return SC_PEER_IO_OK;
}

/* A system call answered EFAULT for these buffers: the kernel could not copy to or from one of
 * them (region memory whose file a worker truncated). Note which (a probe finds it: a sendmsg can
 * fail whole, its iovecs not advanced), so sc_peer_io_err names its region. */
static void note_efault(const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++)
		if (sc_fault_guard_probe(iov[i].iov_base, iov[i].iov_len, NULL) != 0)
			return; /* noted where */
	sc_fault_guard_note(iovcnt > 0 ? iov[0].iov_base : NULL);
}

static enum sc_peer_io classify_errno(int e, int *errno_out)
{
	*errno_out = e;
	if (e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ESHUTDOWN)
		return SC_PEER_IO_EOF;
	return SC_PEER_IO_ERRNO;
}

enum sc_peer_io sc_peer_recv_all(int fd, void *buf, size_t len, const struct sc_peer_wait *w,
				 size_t *got, int *errno_out)
{
	uint8_t *p = buf;
	size_t done = 0;
	uint64_t progress_ms = (w && w->stall_ms) ? sc_clock_mono_ms() : 0;
	enum sc_peer_io rc = SC_PEER_IO_OK;
	*errno_out = 0;
	/* The flags are looked at before blocking, so a raised flag is never missed. */
	if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
		goto out;
	const struct sc_peer_stream *st = stream();
	bool tls = st && st->user_rx(st->ctx, fd); /* TLS without kernel offload for receiving */
	while (done < len) {
		ssize_t n = tls ? st->recv(st->ctx, fd, p + done, len - done)
				: recv(fd, p + done, len - done, MSG_WAITALL);
		if (n > 0) {
			done += (size_t)n;
			if (done == len)
				break;
			if (w && w->stall_ms)
				progress_ms = sc_clock_mono_ms();
		} else if (n == 0) {
			rc = SC_PEER_IO_EOF;
			goto out;
		} else if (errno == EINTR) {
			continue;
		} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
			int e = errno;
			struct iovec rest = {.iov_base = p + done, .iov_len = len - done};
			if (e == EFAULT && !tls) /* the stream notes its own faults */
				note_efault(&rest, 1);
			rc = classify_errno(e, errno_out);
			goto out;
		}
		if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
			goto out;
	}
out:
	if (got)
		*got = done;
	return rc;
}

enum sc_peer_io sc_peer_recvv_all(int fd, struct iovec *iov, int iovcnt,
				  const struct sc_peer_wait *w, size_t *got, int *errno_out)
{
	size_t done = 0;
	uint64_t progress_ms = (w && w->stall_ms) ? sc_clock_mono_ms() : 0;
	enum sc_peer_io rc = SC_PEER_IO_OK;
	*errno_out = 0;
	if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
		goto out;
	const struct sc_peer_stream *st = stream();
	bool tls = st && st->user_rx(st->ctx, fd); /* TLS without kernel offload for receiving */
	while (iovcnt > 0) {
		if (iov->iov_len == 0) {
			iov++;
			iovcnt--;
			continue;
		}
		struct msghdr mh = {.msg_iov = iov,
				    .msg_iovlen = (size_t)(iovcnt < IOV_MAX ? iovcnt : IOV_MAX)};
		ssize_t n = tls ? st->recv(st->ctx, fd, iov->iov_base, iov->iov_len)
				: recvmsg(fd, &mh, MSG_WAITALL);
		if (n > 0) {
			done += (size_t)n;
			size_t left = (size_t)n;
			while (iovcnt > 0 && left >= iov->iov_len) {
				left -= iov->iov_len;
				iov->iov_len = 0;
				iov++;
				iovcnt--;
			}
			if (iovcnt == 0)
				break;
			iov->iov_base = (uint8_t *)iov->iov_base + left;
			iov->iov_len -= left;
			if (w && w->stall_ms)
				progress_ms = sc_clock_mono_ms();
		} else if (n == 0) {
			rc = SC_PEER_IO_EOF;
			goto out;
		} else if (errno == EINTR) {
			continue;
		} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
			int e = errno;
			if (e == EFAULT && !tls)
				note_efault(iov, iovcnt);
			rc = classify_errno(e, errno_out);
			goto out;
		}
		if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
			goto out;
	}
out:
	if (got)
		*got = done;
	return rc;
}

enum sc_peer_io sc_peer_sendv_all(int fd, struct iovec *iov, int iovcnt,
				  const struct sc_peer_wait *w, size_t *sent, int *errno_out)
{
	size_t done = 0;
	uint64_t progress_ms = (w && w->stall_ms) ? sc_clock_mono_ms() : 0;
	enum sc_peer_io rc = SC_PEER_IO_OK;
	*errno_out = 0;
	if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
		goto out;
	const struct sc_peer_stream *st = stream();
	bool tls = st && st->user_tx(st->ctx, fd); /* TLS without kernel offload for sending */
	while (iovcnt > 0) {
		if (iov->iov_len == 0) {
			iov++;
			iovcnt--;
			continue;
		}
		struct msghdr mh = {.msg_iov = iov,
				    .msg_iovlen = (size_t)(iovcnt < IOV_MAX ? iovcnt : IOV_MAX)};
		ssize_t n = tls ? st->send(st->ctx, fd, iov->iov_base, iov->iov_len)
				: sendmsg(fd, &mh, MSG_NOSIGNAL | (w && w->more ? MSG_MORE : 0));
		if (n > 0) {
			done += (size_t)n;
			size_t left = (size_t)n;
			while (iovcnt > 0 && left >= iov->iov_len) {
				left -= iov->iov_len;
				iov->iov_len = 0;
				iov++;
				iovcnt--;
			}
			if (iovcnt > 0) {
				iov->iov_base = (uint8_t *)iov->iov_base + left;
				iov->iov_len -= left;
			} else {
				break;
			}
			if (w && w->stall_ms)
				progress_ms = sc_clock_mono_ms();
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			int e = errno;
			if (e == EFAULT && !tls)
				note_efault(iov, iovcnt);
			rc = classify_errno(e, errno_out);
			goto out;
		}
		if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
			goto out;
	}
out:
	if (sent)
		*sent = done;
	return rc;
}

int sc_peer_io_err(enum sc_peer_io rc, int errno_val, const char *what, struct sc_err *err)
{
	switch (rc) {
	case SC_PEER_IO_OK:
		break;
	case SC_PEER_IO_EOF:
		return sc_err_set(err, SC_UNAVAILABLE, "%s closed the connection", what);
	case SC_PEER_IO_ERRNO:
		if (errno_val == EFAULT) { /* our memory, not the connection: name the region */
			char stopped[SC_ERR_MSG_MAX / 2];
			snprintf(stopped, sizeof(stopped), "moving bytes with %s", what);
			return sc_fault_guard_error(err, stopped);
		}
		return sc_err_set(err, SC_UNAVAILABLE, "connection to %s failed: %s", what,
				  strerror(errno_val));
	case SC_PEER_IO_DEADLINE:
		return sc_err_set(err, SC_DEADLINE_EXCEEDED,
				  "deadline passed while waiting for %s", what);
	case SC_PEER_IO_CANCELLED:
		return sc_err_set(err, SC_CANCELLED, "cancelled while talking to %s", what);
	case SC_PEER_IO_PROTOCOL:
		return sc_err_set(err, SC_INVALID_ARGUMENT, "protocol error from %s", what);
	}
	return sc_err_set(err, SC_INTERNAL, "unexpected I/O result with %s", what);
}

enum sc_peer_io sc_peer_send_msg(int fd, const struct sc_peer_msg *m,
				 const struct sc_peer_wait *w, const char *what, struct sc_err *err)
{
	uint8_t small[1024];
	uint8_t *buf = small;
	size_t cap = sizeof(small);
	/* Only QP_CONNECT can be big. */
	uint8_t *big = NULL;
	if (m->type == SC_FRAME_QP_CONNECT && m->opaque_len + SC_PEER_HDR_LEN > cap) {
		cap = m->opaque_len + SC_PEER_HDR_LEN;
		if (!(big = malloc(cap))) {
			sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
			return SC_PEER_IO_PROTOCOL;
		}
		buf = big;
	}
	size_t n = sc_peer_encode(m, buf, cap);
	if (n == 0) {
		free(big);
		sc_err_set(err, SC_INVALID_ARGUMENT, "%s frame for %s does not fit in %u bytes",
			   sc_frame_type_name(m->type), what, SC_PEER_MAX_BODY);
		return SC_PEER_IO_PROTOCOL;
	}
	struct iovec iov = {.iov_base = buf, .iov_len = n};
	int e;
	enum sc_peer_io rc = sc_peer_sendv_all(fd, &iov, 1, w, NULL, &e);
	free(big);
	if (rc != SC_PEER_IO_OK)
		sc_peer_io_err(rc, e, what, err);
	return rc;
}

enum sc_peer_io sc_peer_recv_msg(int fd, uint8_t *buf, size_t cap, struct sc_peer_msg *m,
				 const struct sc_peer_wait *w, const char *what,
				 struct sc_err *err)
{
	return sc_peer_recv_msg_rb(fd, NULL, buf, cap, m, w, what, err);
}

/* ---- read-ahead ------------------------------------------------------------------------------ */

ssize_t sc_peer_rxbuf_take(struct sc_peer_rxbuf *rb, void *dst, size_t len)
{
	size_t n = sc_peer_rxbuf_avail(rb);
	if (n > len)
		n = len;
	/* dst is region memory more often than not: a worker may have truncated its file. */
	int rc = n ? sc_guarded_memcpy(dst, rb->p + rb->off, n, NULL) : 0;
	if (n)
		rb->off += n; /* taken even when lost: the stream is broken either way */
	if (rb && rb->off == rb->len)
		rb->off = rb->len = 0;
	if (rc != 0) { /* as recv would: EFAULT, the fault noted (sc_peer_io_err names it) */
		errno = EFAULT;
		return -1;
	}
	return (ssize_t)n;
}

/* Room at the end of the buffer for the next recv: the unread bytes move to the front. */
static void rxbuf_compact(struct sc_peer_rxbuf *rb)
{
	if (rb->off == 0)
		return;
	memmove(rb->p, rb->p + rb->off, rb->len - rb->off);
	rb->len -= rb->off;
	rb->off = 0;
}

ssize_t sc_peer_rxbuf_fill_nowait(int fd, struct sc_peer_rxbuf *rb)
{
	rxbuf_compact(rb);
	if (rb->len == rb->cap) {
		errno = EAGAIN;
		return -1;
	}
	ssize_t n;
	do
		n = recv(fd, rb->p + rb->len, rb->cap - rb->len, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n > 0)
		rb->len += (size_t)n;
	return n;
}

/* Block (in I/O slices, checking w) until the empty buffer holds at least one byte. */
static enum sc_peer_io rxbuf_fill(int fd, struct sc_peer_rxbuf *rb, const struct sc_peer_wait *w,
				  int *errno_out)
{
	uint64_t progress_ms = (w && w->stall_ms) ? sc_clock_mono_ms() : 0;
	enum sc_peer_io rc;
	rb->off = rb->len = 0;
	if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
		return rc;
	for (;;) {
		ssize_t n = recv(fd, rb->p, rb->cap, 0);
		if (n > 0) {
			rb->len = (size_t)n;
			return SC_PEER_IO_OK;
		}
		if (n == 0)
			return SC_PEER_IO_EOF;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return classify_errno(errno, errno_out);
		if ((rc = wait_check(w, progress_ms)) != SC_PEER_IO_OK)
			return rc;
	}
}

enum sc_peer_io sc_peer_recv_rb(int fd, struct sc_peer_rxbuf *rb, void *buf, size_t len,
				const struct sc_peer_wait *w, size_t *got, int *errno_out)
{
	uint8_t *p = buf;
	size_t done = 0;
	enum sc_peer_io rc = SC_PEER_IO_OK;
	*errno_out = 0;
	ssize_t took = sc_peer_rxbuf_take(rb, p, len);
	while (took >= 0) {
		done += (size_t)took;
		if (done == len)
			break;
		if (!rb || len - done >= rb->cap / 2) {
			size_t more = 0;
			rc = sc_peer_recv_all(fd, p + done, len - done, w, &more, errno_out);
			done += more;
			break;
		}
		if ((rc = rxbuf_fill(fd, rb, w, errno_out)) != SC_PEER_IO_OK)
			break;
		took = sc_peer_rxbuf_take(rb, p + done, len - done);
	}
	if (took < 0)
		rc = classify_errno(errno, errno_out);
	if (got)
		*got = done;
	return rc;
}

enum sc_peer_io sc_peer_recvv_rb(int fd, struct sc_peer_rxbuf *rb, struct iovec *iov, int iovcnt,
				 const struct sc_peer_wait *w, size_t *got, int *errno_out)
{
	size_t done = 0;
	*errno_out = 0;
	/* What is buffered goes first, into the iovecs in order; then recvmsg for the rest. */
	while (iovcnt > 0 && sc_peer_rxbuf_avail(rb)) {
		ssize_t took = sc_peer_rxbuf_take(rb, iov->iov_base, iov->iov_len);
		if (took < 0) {
			if (got)
				*got = done;
			return classify_errno(errno, errno_out);
		}
		size_t n = (size_t)took;
		done += n;
		iov->iov_base = (uint8_t *)iov->iov_base + n;
		iov->iov_len -= n;
		if (iov->iov_len == 0) {
			iov++;
			iovcnt--;
		}
	}
	size_t more = 0;
	enum sc_peer_io rc = SC_PEER_IO_OK;
	if (iovcnt > 0)
		rc = sc_peer_recvv_all(fd, iov, iovcnt, w, &more, errno_out);
	if (got)
		*got = done + more;
	return rc;
}

enum sc_peer_io sc_peer_recv_msg_rb(int fd, struct sc_peer_rxbuf *rb, uint8_t *buf, size_t cap,
				    struct sc_peer_msg *m, const struct sc_peer_wait *w,
				    const char *what, struct sc_err *err)
{
	struct sc_frame_hdr h;
	int e;
	enum sc_peer_io rc = sc_peer_recv_rb(fd, rb, buf, SC_PEER_HDR_LEN, w, NULL, &e);
	if (rc == SC_PEER_IO_OK && sc_peer_decode_hdr(buf, &h, err) != 0)
		return SC_PEER_IO_PROTOCOL;
	if (rc == SC_PEER_IO_OK && h.body_len > cap - SC_PEER_HDR_LEN) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "protocol error: %s frame body of %u bytes where at most %zu fit",
			   sc_frame_type_name(h.type), h.body_len, cap - SC_PEER_HDR_LEN);
		return SC_PEER_IO_PROTOCOL;
	}
	if (rc == SC_PEER_IO_OK)
		rc = sc_peer_recv_rb(fd, rb, buf + SC_PEER_HDR_LEN, h.body_len, w, NULL, &e);
	if (rc != SC_PEER_IO_OK) {
		sc_peer_io_err(rc, e, what, err);
		return rc;
	}
	if (sc_peer_decode_body(h.type, buf + SC_PEER_HDR_LEN, h.body_len, m, err) != 0)
		return SC_PEER_IO_PROTOCOL;
	m->flags = h.flags;
	return SC_PEER_IO_OK;
}

/* ---- hello ----------------------------------------------------------------------------------- */

#define NO_KEYS_HINT "cross-sidecar transfers need --key-file on both sidecars"

static bool hello_proof(const struct sc_keyring *ring, const char *label, const char *key_id,
			const uint8_t first_nonce[SC_PEER_NONCE_LEN],
			const uint8_t second_nonce[SC_PEER_NONCE_LEN], const char *client_id,
			const char *server_id, uint8_t out[SC_HMAC_LEN])
{
	const void *parts[] = {label, key_id, first_nonce, second_nonce, client_id, server_id};
	const size_t lens[] = {strlen(label) + 1,     strlen(key_id) + 1,    SC_PEER_NONCE_LEN,
			       SC_PEER_NONCE_LEN,     strlen(client_id) + 1, strlen(server_id) + 1};
	return sc_keyring_hmac(ring, key_id, parts, lens, 6, out);
}

void sc_peer_send_refusal(int fd, const struct sc_peer_wait *w, const struct sc_err *why)
{
	struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = (uint32_t)why->code};
	snprintf(m.text, sizeof(m.text), "%s", why->msg);
	sc_peer_send_msg(fd, &m, w, "peer", NULL);
}

/* Receive the next hello frame, which must be `want` (or ERROR: the other side refused). */
static int hello_recv(int fd, uint8_t *buf, size_t cap, enum sc_frame_type want,
		      const struct sc_peer_wait *w, const char *what, struct sc_peer_msg *m,
		      struct sc_err *err)
{
	if (sc_peer_recv_msg(fd, buf, cap, m, w, what, err) != SC_PEER_IO_OK)
		return -1;
	if (m->type == SC_FRAME_ERROR) {
		/* An ERROR frame is a failure whatever its code says: 0 (OK) or an unknown code
		 * reads as a refusal (found by tests/fuzz/fuzz_peer.c: it failed with code OK). */
		enum sc_status code = sc_peer_status_from_wire(m->code);
		return sc_err_set(err,
				  code == SC_INTERNAL || code == SC_OK ? SC_UNAUTHENTICATED : code,
				  "%s refused the hello: %s", what, m->text);
	}
	if (m->type != want)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: %s sent %s during the hello, expected %s", what,
				  sc_frame_type_name(m->type), sc_frame_type_name(want));
	return 0;
}

/* Hello frames are small: a stack buffer is enough (QP_CONNECT never appears in a hello). */
#define HELLO_BUF (SC_PEER_HDR_LEN + 1024)

int sc_peer_hello_client(int fd, const struct sc_keyring *ring, const char *self_id,
			 const struct sc_peer_wait *w, const char *what, char peer_id[SC_NAME_MAX],
			 struct sc_err *err)
{
	if (!ring || !sc_keyring_signing_id(ring))
		return sc_err_set(err, SC_UNAUTHENTICATED,
				  "this sidecar has no signing key: " NO_KEYS_HINT);
	uint8_t buf[HELLO_BUF];
	struct sc_peer_msg hello = {.type = SC_FRAME_HELLO};
	if (sc_random_bytes(hello.nonce, sizeof(hello.nonce)) != 0)
		return sc_err_set(err, SC_INTERNAL, "no randomness for the hello nonce");
	snprintf(hello.id, sizeof(hello.id), "%s", self_id);
	snprintf(hello.key_id, sizeof(hello.key_id), "%s", sc_keyring_signing_id(ring));
	if (sc_peer_send_msg(fd, &hello, w, what, err) != SC_PEER_IO_OK)
		return -1;

	struct sc_peer_msg ack;
	if (hello_recv(fd, buf, sizeof(buf), SC_FRAME_HELLO_ACK, w, what, &ack, err) != 0)
		return -1;
	uint8_t expect[SC_HMAC_LEN];
	if (!hello_proof(ring, "rsm1-hello-s", hello.key_id, hello.nonce, ack.nonce, hello.id,
			 ack.id, expect))
		return sc_err_set(err, SC_INTERNAL, "cannot compute the hello proof");
	if (CRYPTO_memcmp(expect, ack.proof, SC_HMAC_LEN) != 0) {
		sc_err_set(err, SC_UNAUTHENTICATED,
			   "%s (id \"%s\") failed to prove it holds key \"%s\": load the same "
			   "--key-file on both sidecars",
			   what, ack.id, hello.key_id);
		sc_peer_send_refusal(fd, w, err);
		return -1;
	}
	struct sc_peer_msg fin = {.type = SC_FRAME_HELLO_FIN};
	if (!hello_proof(ring, "rsm1-hello-c", hello.key_id, ack.nonce, hello.nonce, hello.id,
			 ack.id, fin.proof))
		return sc_err_set(err, SC_INTERNAL, "cannot compute the hello proof");
	if (sc_peer_send_msg(fd, &fin, w, what, err) != SC_PEER_IO_OK)
		return -1;
	struct sc_peer_msg ok;
	if (hello_recv(fd, buf, sizeof(buf), SC_FRAME_OK, w, what, &ok, err) != 0)
		return -1;
	snprintf(peer_id, SC_NAME_MAX, "%s", ack.id);
	return 0;
}

int sc_peer_hello_server(int fd, const struct sc_keyring *ring, const char *self_id,
			 const struct sc_peer_wait *w, const char *what, char peer_id[SC_NAME_MAX],
			 struct sc_err *err)
{
	uint8_t buf[HELLO_BUF];
	struct sc_peer_msg hello;
	enum sc_peer_io io = sc_peer_recv_msg(fd, buf, sizeof(buf), &hello, w, what, err);
	if (io == SC_PEER_IO_PROTOCOL && err) /* say why (a TLS client reads it as garbage) */
		sc_peer_send_refusal(fd, w, err);
	if (io != SC_PEER_IO_OK)
		return -1;
	if (hello.type != SC_FRAME_HELLO)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "protocol error: %s sent %s before the hello", what,
				  sc_frame_type_name(hello.type));
	if (!ring || !sc_keyring_signing_id(ring)) {
		sc_err_set(err, SC_UNAUTHENTICATED,
			   "sidecar \"%s\" has no --key-file: " NO_KEYS_HINT, self_id);
		sc_peer_send_refusal(fd, w, err);
		return -1;
	}
	struct sc_peer_msg ack = {.type = SC_FRAME_HELLO_ACK};
	if (sc_random_bytes(ack.nonce, sizeof(ack.nonce)) != 0)
		return sc_err_set(err, SC_INTERNAL, "no randomness for the hello nonce");
	snprintf(ack.id, sizeof(ack.id), "%s", self_id);
	if (!hello_proof(ring, "rsm1-hello-s", hello.key_id, hello.nonce, ack.nonce, hello.id,
			 ack.id, ack.proof)) {
		sc_err_set(err, SC_UNAUTHENTICATED,
			   "%s (id \"%s\") signs with key \"%s\", which sidecar \"%s\" does not "
			   "have: load the same --key-file on both sidecars",
			   what, hello.id, hello.key_id, self_id);
		sc_peer_send_refusal(fd, w, err);
		return -1;
	}
	if (sc_peer_send_msg(fd, &ack, w, what, err) != SC_PEER_IO_OK)
		return -1;

	struct sc_peer_msg fin;
	if (hello_recv(fd, buf, sizeof(buf), SC_FRAME_HELLO_FIN, w, what, &fin, err) != 0)
		return -1;
	uint8_t expect[SC_HMAC_LEN];
	if (!hello_proof(ring, "rsm1-hello-c", hello.key_id, ack.nonce, hello.nonce, hello.id,
			 ack.id, expect))
		return sc_err_set(err, SC_INTERNAL, "cannot compute the hello proof");
	if (CRYPTO_memcmp(expect, fin.proof, SC_HMAC_LEN) != 0) {
		sc_err_set(err, SC_UNAUTHENTICATED,
			   "%s (id \"%s\") failed to prove it holds key \"%s\"", what, hello.id,
			   hello.key_id);
		sc_peer_send_refusal(fd, w, err);
		return -1;
	}
	struct sc_peer_msg ok = {.type = SC_FRAME_OK};
	if (sc_peer_send_msg(fd, &ok, w, what, err) != SC_PEER_IO_OK)
		return -1;
	snprintf(peer_id, SC_NAME_MAX, "%s", hello.id);
	return 0;
}
