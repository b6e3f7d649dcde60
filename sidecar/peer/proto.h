/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/proto.h: the sidecar-to-sidecar control channel (DESIGN section 5): frame layout, codec,
 * blocking I/O with deadlines, and the mutual-authentication hello. Shared by the peer server
 * (serving side), the peer pool (dialing side) and, through them, the tcp and ibverbs backends.
 *
 * A frame is an 8-byte header {u8 version = 1, u8 type, u16 flags, u32 body_len} followed by
 * body_len bytes of body. flags is 0, except on OPEN, where SC_PEER_FLAG_VIA_BACKEND says another
 * backend moves the transfer's bytes, not this channel (the passive operation then reports that
 * backend: sc_peer_via_backend). All integers are little-endian and fixed width; strings are u16
 * length + bytes (no NUL). DATA and WRITE frames are followed by bulk bytes whose count is in their
 * body. body_len is at most SC_PEER_MAX_BODY, a bulk at most SC_PEER_MAX_BULK (and exactly what was
 * asked for). Anything else is a protocol error: the receiver closes the connection.
 *
 *   type        body                                                      reply
 *   HELLO       magic u32 "RSMP", client_nonce[16], client_id, key_id    HELLO_ACK | ERROR
 *   HELLO_ACK   server_nonce[16], server_id, proof_s[32]                 (client) HELLO_FIN | ERROR
 *   HELLO_FIN   proof_c[32]                                              OK | ERROR
 *   OK          (empty)
 *   ERROR       code u32 (enum sc_status), msg
 *   OPEN        token[16], xfer_id u64, peer_kind u8, total u64          OK | ERROR
 *               [extensions: tag u8, len u8, len bytes; repeated to the end]
 *   READ        token[16], xfer_id u64, desc u32, offset u64, len u64    DATA + bulk | ERROR
 *   DATA        len u64                                                  (bulk of len bytes follows)
 *   WRITE       token[16], xfer_id u64, desc u32, offset u64, len u64    OK | ERROR (then closed)
 *               + len bulk bytes
 *   DONE        token[16], xfer_id u64, status u32, msg                  OK | ERROR
 *   PING        cookie u64                                               PONG (same cookie)
 *   QP_CONNECT  opaque (the ibverbs backend's rendezvous)                QP_CONNECT | ERROR
 *   READV       token[16], xfer_id u64, n u32, n x {desc u32, offset u64, len u64}
 *                                                                        DATA + bulk | ERROR
 *   WRITEV      as READV, + the pieces' bytes in order as one bulk       OK | ERROR (then closed)
 *
 * OPEN extensions follow its fixed fields, each {tag u8, len u8, len bytes}; a reader skips tags
 * it does not know. Tag 1 (SC_PEER_OPEN_EXT_TRACE): the transfer's W3C trace id, 16 bytes. An
 * OPEN with extensions goes only to a sidecar whose metadata sets SC_MD_FEATURE_OPEN_EXT in
 * peer_features (again the issuer is the serving side): older sidecars refuse trailing bytes.
 *
 * READV/WRITEV (many pieces per request, 1..SC_PEER_MAX_PIECES, the bulk being every piece's
 * bytes back to back, at most SC_PEER_MAX_BULK; GPU pieces are staged on either end, packed many
 * per pinned buffer, and one request's GPU pieces are on one GPU) are sent only to a
 * sidecar whose metadata is version 2 or later: the serving side is always the metadata's
 * issuer, so its metadata version says it reads them. An older sidecar issues version 1
 * metadata and is sent single-piece READ/WRITE as before; the frame version stays 1.
 *
 * Hello proofs (HMAC-SHA256 with the key named by the client's key_id; ids NUL-terminated in the
 * transcript so no two (client_id, server_id) pairs share one):
 *   proof_s = HMAC(key, "rsm1-hello-s" 0 key_id 0 client_nonce server_nonce client_id 0 server_id 0)
 *   proof_c = HMAC(key, "rsm1-hello-c" 0 key_id 0 server_nonce client_nonce client_id 0 server_id 0)
 *
 * Everything here is pure or works on one caller-owned fd; any thread.
 */
#ifndef SC_PEER_PROTO_H
#define SC_PEER_PROTO_H

#include "meta/keys.h"
#include "meta/metadata.h"
#include "base/types.h"
#include "base/status.h"
#include "base/log.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define SC_PEER_VERSION 1
#define SC_PEER_MAGIC 0x504d5352u /* "RSMP" little-endian */
#define SC_PEER_HDR_LEN 8
#define SC_PEER_MAX_BODY (64u * 1024u)
#define SC_PEER_MAX_BULK (1ull << 30)
#define SC_PEER_NONCE_LEN 16
#define SC_PEER_HELLO_TIMEOUT_MS 5000
/* Blocking sockets carry SO_RCVTIMEO/SO_SNDTIMEO of this many ms, so every blocked call wakes
 * this often to look at its deadline and cancel flags. */
#define SC_PEER_IO_SLICE_MS 100
/* OPEN header flag: the active side moves this transfer's bytes with another backend than this
 * channel. Which one is mapped at the edges (sc_peer_via_flags / sc_peer_via_backend): the wire
 * has one such bit, and it has always meant ibverbs (RDMA). */
#define SC_PEER_FLAG_VIA_BACKEND 0x0001u
/* With SC_PEER_FLAG_VIA_BACKEND: that backend is libfabric, not ibverbs. An older sidecar refuses
 * the OPEN ("unknown flags"), so a peer that does not know libfabric never counts it as ibverbs. */
#define SC_PEER_FLAG_VIA_LIBFABRIC 0x0002u
#define SC_PEER_OPEN_FLAGS (SC_PEER_FLAG_VIA_BACKEND | SC_PEER_FLAG_VIA_LIBFABRIC)
/* OPEN extension tags (see above). */
#define SC_PEER_OPEN_EXT_TRACE 1

/* The OPEN header flags that say backend `via` moves a transfer's bytes (0 for NONE and TCP,
 * which the channel itself carries), and back (SC_BACKEND_NONE: the channel carries them). */
uint16_t sc_peer_via_flags(enum sc_backend_kind via);
enum sc_backend_kind sc_peer_via_backend(uint16_t flags);

enum sc_frame_type {
	SC_FRAME_HELLO = 1,
	SC_FRAME_HELLO_ACK = 2,
	SC_FRAME_HELLO_FIN = 3,
	SC_FRAME_OK = 4,
	SC_FRAME_ERROR = 5,
	SC_FRAME_OPEN = 6,
	SC_FRAME_READ = 7,
	SC_FRAME_DATA = 8,
	SC_FRAME_WRITE = 9,
	SC_FRAME_DONE = 10,
	SC_FRAME_PING = 11,
	SC_FRAME_PONG = 12,
	SC_FRAME_QP_CONNECT = 13,
	SC_FRAME_READV = 14,
	SC_FRAME_WRITEV = 15,
	SC_FRAME_TYPE_MAX = SC_FRAME_WRITEV,
};

/* Pieces per READV/WRITEV: one iovec each, plus the frame header, within IOV_MAX calls. */
#define SC_PEER_MAX_PIECES 1024
#define SC_PEER_PIECE_WIRE 20 /* desc u32, offset u64, len u64 */

struct sc_peer_piece {
	uint32_t desc;
	uint64_t offset;
	uint64_t len;
};

/* "READ", "QP_CONNECT"; "UNKNOWN" otherwise. */
const char *sc_frame_type_name(unsigned type);

struct sc_frame_hdr {
	uint8_t version;
	uint8_t type;
	uint16_t flags;
	uint32_t body_len;
};

/* One decoded frame body. Only the fields of its type are meaningful. */
struct sc_peer_msg {
	enum sc_frame_type type;
	uint16_t flags; /* header flags: SC_PEER_FLAG_VIA_BACKEND on OPEN; encoded for OPEN only */
	/* HELLO, HELLO_ACK, HELLO_FIN */
	uint8_t nonce[SC_PEER_NONCE_LEN];
	char id[SC_NAME_MAX];       /* HELLO: client id; HELLO_ACK: server id */
	char key_id[SC_KEY_ID_MAX]; /* HELLO */
	uint8_t proof[SC_HMAC_LEN]; /* HELLO_ACK, HELLO_FIN */
	/* OPEN, READ, WRITE, DONE */
	uint8_t token[SC_TOKEN_LEN];
	uint64_t xfer_id;
	uint8_t peer_kind; /* OPEN: SC_OP_READ or SC_OP_WRITE */
	uint64_t total;    /* OPEN */
	char trace_id[SC_TRACE_ID_LEN]; /* OPEN: the trace id extension (32 hex); "" = none */
	uint32_t desc;     /* READ, WRITE */
	uint64_t offset;   /* READ, WRITE */
	uint64_t len;      /* READ, WRITE, DATA: bulk byte count */
	uint32_t code;     /* ERROR: enum sc_status; DONE: the active side's status */
	char text[SC_ERR_MSG_MAX]; /* ERROR, DONE (longer texts are cut on decode) */
	uint64_t cookie;           /* PING, PONG */
	const uint8_t *opaque;     /* QP_CONNECT: points into the encoded/decoded buffer */
	size_t opaque_len;
	/* READV, WRITEV: encode reads piece_list (or, when NULL, pieces_wire as is); decode sets
	 * pieces_wire (into the body: read each with sc_peer_piece_at) and len = the total. */
	const struct sc_peer_piece *piece_list;
	const uint8_t *pieces_wire;
	uint32_t n_pieces;
};

/* Piece i of a decoded READV/WRITEV. */
struct sc_peer_piece sc_peer_piece_at(const struct sc_peer_msg *m, uint32_t i);

/* Encode header + body of m into buf. Returns the frame length, or 0 when it does not fit (cap)
 * or a field is out of range (string too long, body over SC_PEER_MAX_BODY). */
size_t sc_peer_encode(const struct sc_peer_msg *m, uint8_t *buf, size_t cap);
/* Parse a header. Errors (INVALID_ARGUMENT, "protocol error: ..."): version, unknown type,
 * flags other than SC_PEER_FLAG_VIA_BACKEND on OPEN (0 elsewhere), body_len over
 * SC_PEER_MAX_BODY. */
int sc_peer_decode_hdr(const uint8_t in[SC_PEER_HDR_LEN], struct sc_frame_hdr *h,
		       struct sc_err *err);
/* Parse the body of a frame of `type`. Strict: every field present, nothing left over, lengths
 * and strings within their limits, ids without NUL bytes. m->opaque points into body. */
int sc_peer_decode_body(unsigned type, const uint8_t *body, size_t len, struct sc_peer_msg *m,
			struct sc_err *err);

/* ---- blocking I/O ------------------------------------------------------------------------------
 * The fd must be blocking with SO_RCVTIMEO/SO_SNDTIMEO set (sc_peer_set_io_slice), so that a
 * blocked call wakes every slice to check `w`. */

struct sc_peer_wait {
	uint64_t deadline_mono_ms; /* 0: none */
	uint64_t stall_ms;         /* 0: none; else give up when no byte moves for this long */
	const atomic_bool *cancel; /* NULL: none */
	const atomic_bool *stop;   /* NULL: none; a second flag (server shutdown, transfer stop) */
	bool more; /* sends: another send follows at once, so a partial last segment waits for it
		    * (MSG_MORE): the peer wakes once for both */
};

enum sc_peer_io {
	SC_PEER_IO_OK = 0,
	SC_PEER_IO_EOF,       /* the peer closed (or reset) the connection */
	SC_PEER_IO_ERRNO,     /* *errno_out says why */
	SC_PEER_IO_DEADLINE,  /* the deadline or the stall limit passed */
	SC_PEER_IO_CANCELLED, /* a flag was raised */
	SC_PEER_IO_PROTOCOL,  /* (sc_peer_recv_msg only) the peer sent a bad frame */
};

/*
 * A stream layered over some fds (peer TLS without kernel offload, peer/tls.c): the blocking I/O
 * below asks it, per call, whether fd's receiving or sending side goes through it, and then moves
 * bytes with its recv/send instead of recv/sendmsg. recv/send return the bytes moved (> 0), 0 at
 * EOF, or -1 with errno (EAGAIN: the I/O slice passed, try again after checking the wait).
 * Without one every fd is a plain socket. This is how peer_proto knows nothing of TLS.
 */
struct sc_peer_stream {
	bool (*user_rx)(void *ctx, int fd);
	bool (*user_tx)(void *ctx, int fd);
	ssize_t (*recv)(void *ctx, int fd, void *buf, size_t len);
	ssize_t (*send)(void *ctx, int fd, const void *buf, size_t len);
	void *ctx;
};
/* Layer s (static storage, or NULL for none) under every fd from now on, process-wide, as the fds
 * carry their TLS state process-wide. Set before the first fd that needs it is handed to the
 * calls below (peer/tls.c sets it when it creates a context); any thread. */
void sc_peer_set_stream(const struct sc_peer_stream *s);

int sc_peer_set_io_slice(int fd, unsigned ms);
/* A data-plane TCP socket's options: TCP_NODELAY, keepalive (idle 5 s, interval 2 s, 3 probes),
 * TCP_USER_TIMEOUT (SC_PEER_USER_TIMEOUT_MS), and the I/O slice. Returns -1 (errno set) when an
 * option cannot be set. */
#define SC_PEER_USER_TIMEOUT_MS 12000
int sc_peer_tune_socket(int fd);

/* How long an idle peer connection is kept (by the pool and by the server): `dflt`, or the
 * milliseconds in the environment variable SC_TEST_PEER_IDLE_MS (tests: seconds, not minutes). */
uint64_t sc_peer_test_idle_ms(uint64_t dflt);
/* Receive exactly len bytes. */
enum sc_peer_io sc_peer_recv_all(int fd, void *buf, size_t len, const struct sc_peer_wait *w,
				 size_t *got, int *errno_out);
/* Receive exactly the iovecs' bytes, scattered (recvmsg; modified: advanced past what came). */
enum sc_peer_io sc_peer_recvv_all(int fd, struct iovec *iov, int iovcnt,
				  const struct sc_peer_wait *w, size_t *got, int *errno_out);
/* Send every byte of the iovecs (modified: advanced past what was sent). MSG_NOSIGNAL. Any
 * iovcnt: sendmsg is given at most IOV_MAX at a time. */
enum sc_peer_io sc_peer_sendv_all(int fd, struct iovec *iov, int iovcnt,
				  const struct sc_peer_wait *w, size_t *sent, int *errno_out);
/* Tell the other side why we refuse (an ERROR frame with why's code and message), best effort:
 * it may already be gone. */
void sc_peer_send_refusal(int fd, const struct sc_peer_wait *w, const struct sc_err *why);
/* Fill err for a failed I/O: EOF/ERRNO -> UNAVAILABLE, DEADLINE -> DEADLINE_EXCEEDED,
 * CANCELLED -> CANCELLED; `what` names the connection ("peer sidecar X at H:P"). Returns -1. */
int sc_peer_io_err(enum sc_peer_io rc, int errno_val, const char *what, struct sc_err *err);

/* Encode m and send it. Failures fill err as sc_peer_io_err (an unencodable m: INVALID_ARGUMENT
 * with SC_PEER_IO_PROTOCOL). */
enum sc_peer_io sc_peer_send_msg(int fd, const struct sc_peer_msg *m,
				 const struct sc_peer_wait *w, const char *what, struct sc_err *err);
/*
 * Receive one frame into buf (cap: header + the largest body the caller accepts) and decode it
 * into m (which may point into buf). A bad header or body (or one larger than cap) returns
 * SC_PEER_IO_PROTOCOL with err INVALID_ARGUMENT "protocol error: ..."; I/O failures fill err as
 * sc_peer_io_err.
 */
enum sc_peer_io sc_peer_recv_msg(int fd, uint8_t *buf, size_t cap, struct sc_peer_msg *m,
				 const struct sc_peer_wait *w, const char *what,
				 struct sc_err *err);

/* ---- read-ahead ------------------------------------------------------------------------------
 * A caller-owned buffer that frames are read through, so that one recv brings a header, its body
 * and whatever else has arrived (a pipelined OPEN + READV, a small WRITE's bulk) instead of one
 * recv per header and per body. Bytes in it have left the socket: whoever owns it must consume
 * them (through the calls below) before anything else reads the fd or waits on it for input
 * (epoll, poll), or they are lost or never noticed. Plain sockets only: a fd whose receiving side
 * goes through the stream (peer TLS without kernel offload) must be read with rb NULL.
 * Reads of sizes at least cap / 2 go straight to their destination (after what is buffered). */
struct sc_peer_rxbuf {
	uint8_t *p;
	size_t cap;
	size_t off, len; /* the unread bytes are p[off..len) */
};

static inline size_t sc_peer_rxbuf_avail(const struct sc_peer_rxbuf *rb)
{
	return rb ? rb->len - rb->off : 0;
}
/* Move up to len buffered bytes to dst with the guarded copy (os/fault_guard.h: dst is region memory,
 * whose file a worker may have truncated); returns how many, or -1 with errno EFAULT when dst lost
 * its backing (as recv would: the fault noted, so sc_peer_io_err names the region; the bytes are
 * gone and the stream with them). */
ssize_t sc_peer_rxbuf_take(struct sc_peer_rxbuf *rb, void *dst, size_t len);
/* One recv(MSG_DONTWAIT) into the buffer's free room (when it has some): > 0 bytes added, 0 at EOF,
 * -1 with errno (EAGAIN: nothing has arrived). */
ssize_t sc_peer_rxbuf_fill_nowait(int fd, struct sc_peer_rxbuf *rb);
/* sc_peer_recv_all / sc_peer_recvv_all through rb (NULL: straight from the fd). */
enum sc_peer_io sc_peer_recv_rb(int fd, struct sc_peer_rxbuf *rb, void *buf, size_t len,
				const struct sc_peer_wait *w, size_t *got, int *errno_out);
enum sc_peer_io sc_peer_recvv_rb(int fd, struct sc_peer_rxbuf *rb, struct iovec *iov, int iovcnt,
				 const struct sc_peer_wait *w, size_t *got, int *errno_out);
/* sc_peer_recv_msg through rb (NULL: as sc_peer_recv_msg). */
enum sc_peer_io sc_peer_recv_msg_rb(int fd, struct sc_peer_rxbuf *rb, uint8_t *buf, size_t cap,
				    struct sc_peer_msg *m, const struct sc_peer_wait *w,
				    const char *what, struct sc_err *err);

/* ---- hello ----------------------------------------------------------------------------------
 * Both return 0 with the authenticated peer's id in peer_id, or -1: UNAUTHENTICATED for a failed
 * proof, an unknown key id or a missing keyring (either side); INVALID_ARGUMENT for a protocol
 * error; UNAVAILABLE / DEADLINE_EXCEEDED / CANCELLED for I/O. ring may be NULL (then the hello
 * fails with a message that says --key-file is needed on both sidecars). The deadline covers the
 * whole exchange. The server side tells the client why it refused before returning. */
int sc_peer_hello_client(int fd, const struct sc_keyring *ring, const char *self_id,
			 const struct sc_peer_wait *w, const char *what, char peer_id[SC_NAME_MAX],
			 struct sc_err *err);
int sc_peer_hello_server(int fd, const struct sc_keyring *ring, const char *self_id,
			 const struct sc_peer_wait *w, const char *what, char peer_id[SC_NAME_MAX],
			 struct sc_err *err);

/* Map a received frame's status code to an sc_status (unknown codes become INTERNAL; 0 is OK, as
 * in a DONE frame's success). An ERROR frame is a failure whatever its code: callers map OK to a
 * failure code themselves. */
enum sc_status sc_peer_status_from_wire(uint32_t code);

#endif
