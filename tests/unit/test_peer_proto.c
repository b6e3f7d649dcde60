/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_peer_proto.c: the peer channel's frame codec (round trips, every malformed header and
 * body rejected, random garbage never accepted silently), the blocking I/O's deadline and cancel,
 * and the hello over a socketpair: same keys succeed; a different key, an unknown key id, a forged
 * proof in either direction, a replayed HELLO_FIN, a missing keyring and garbage all fail with
 * the right code.
 */
#include "check.h"

#include "meta/keys.h"
#include "meta/metadata.h"
#include "peer/proto.h"
#include "base/timer.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------------------------- */

/* A keyring with one random key (or two: id2 non-NULL adds a second, verifying-only, key). */
static struct sc_keyring *make_ring(const char *id, const char *id2)
{
	char text[512];
	size_t len = 0;
	const char *ids[2] = {id, id2};
	for (int i = 0; i < 2 && ids[i]; i++) {
		unsigned char key[32], b64[64];
		if (sc_random_bytes(key, sizeof(key)) != 0)
			return NULL;
		EVP_EncodeBlock(b64, key, sizeof(key));
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s:%s\n", ids[i], b64);
	}
	struct sc_keyring *ring = NULL;
	struct sc_err err;
	if (sc_keyring_parse(text, len, &ring, &err) != 0) {
		fprintf(stderr, "sc_keyring_parse: %s\n", err.msg);
		return NULL;
	}
	return ring;
}

static void make_pair(int sv[2])
{
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
		perror("socketpair");
		exit(1);
	}
	sc_peer_set_io_slice(sv[0], 20);
	sc_peer_set_io_slice(sv[1], 20);
}

static struct sc_peer_wait wait_ms(uint64_t ms)
{
	return (struct sc_peer_wait){.deadline_mono_ms = sc_clock_mono_ms() + ms};
}

struct hello_side {
	int fd;
	const struct sc_keyring *ring;
	const char *id;
	int rc;
	struct sc_err err;
	char peer[SC_NAME_MAX];
};

static void *server_thread(void *arg)
{
	struct hello_side *s = arg;
	struct sc_peer_wait w = wait_ms(3000);
	sc_err_clear(&s->err);
	s->rc = sc_peer_hello_server(s->fd, s->ring, s->id, &w, "test client", s->peer, &s->err);
	return NULL;
}

/* Runs a server hello on sv[1] in a thread, the client hello on sv[0] here. */
static void run_hello(const struct sc_keyring *cring, const struct sc_keyring *sring,
		      struct hello_side *cli, struct hello_side *srv)
{
	int sv[2];
	make_pair(sv);
	*srv = (struct hello_side){.fd = sv[1], .ring = sring, .id = "server-1"};
	*cli = (struct hello_side){.fd = sv[0], .ring = cring, .id = "client-1"};
	pthread_t t;
	pthread_create(&t, NULL, server_thread, srv);
	struct sc_peer_wait w = wait_ms(3000);
	sc_err_clear(&cli->err);
	cli->rc = sc_peer_hello_client(cli->fd, cli->ring, cli->id, &w, "test server", cli->peer,
				       &cli->err);
	if (cli->rc != 0)
		shutdown(sv[0], SHUT_RDWR); /* the server must not wait for us */
	pthread_join(t, NULL);
	close(sv[0]);
	close(sv[1]);
}

/* The documented transcript, computed independently of peer/proto.c. */
static void proof(const struct sc_keyring *ring, const char *label, const char *key_id,
		  const uint8_t *n1, const uint8_t *n2, const char *cid, const char *sid,
		  uint8_t out[SC_HMAC_LEN])
{
	const void *parts[] = {label, "", key_id, "", n1, n2, cid, "", sid, ""};
	const size_t lens[] = {strlen(label), 1, strlen(key_id), 1, 16, 16, strlen(cid), 1,
			       strlen(sid), 1};
	if (!sc_keyring_hmac(ring, key_id, parts, lens, 10, out))
		memset(out, 0, SC_HMAC_LEN);
}

static int send_msg(int fd, const struct sc_peer_msg *m)
{
	struct sc_peer_wait w = wait_ms(2000);
	struct sc_err err;
	return sc_peer_send_msg(fd, m, &w, "test", &err) == SC_PEER_IO_OK ? 0 : -1;
}

static int recv_msg(int fd, uint8_t *buf, size_t cap, struct sc_peer_msg *m)
{
	struct sc_peer_wait w = wait_ms(2000);
	struct sc_err err;
	return sc_peer_recv_msg(fd, buf, cap, m, &w, "test", &err) == SC_PEER_IO_OK ? 0 : -1;
}

/* ---- codec ----------------------------------------------------------------------------------- */

static size_t encode_sample(enum sc_frame_type type, uint8_t *buf, size_t cap,
			    struct sc_peer_msg *m)
{
	static const uint8_t opaque[5] = {1, 2, 3, 4, 5};
	static const struct sc_peer_piece pieces[3] = {
	    {.desc = 0, .offset = 0, .len = 1},
	    {.desc = 1048575, .offset = 0xffffffffffull, .len = 32768},
	    {.desc = 7, .offset = 3, .len = (1ull << 30) - 32769}};
	memset(m, 0, sizeof(*m));
	m->type = type;
	for (int i = 0; i < 16; i++) {
		m->nonce[i] = (uint8_t)(i * 7 + 1);
		m->token[i] = (uint8_t)(0xf0 - i);
	}
	for (int i = 0; i < SC_HMAC_LEN; i++)
		m->proof[i] = (uint8_t)(i ^ 0x5a);
	snprintf(m->id, sizeof(m->id), "sidecar-%d", (int)type);
	snprintf(m->key_id, sizeof(m->key_id), "key-2026");
	m->xfer_id = 0x0102030405060708ull;
	m->peer_kind = SC_OP_WRITE;
	m->total = (1ull << 40) + 3;
	m->desc = 4095;
	m->offset = 0xfffffffffull;
	m->len = 1ull << 30;
	m->code = SC_PERMISSION_DENIED;
	snprintf(m->text, sizeof(m->text), "a message with \"quotes\" and ünïcode");
	m->cookie = 0xdeadbeefcafef00dull;
	m->opaque = opaque;
	m->opaque_len = sizeof(opaque);
	m->piece_list = pieces;
	m->n_pieces = 3;
	return sc_peer_encode(m, buf, cap);
}

TEST(codec_round_trip_every_type)
{
	for (unsigned t = 1; t <= SC_FRAME_TYPE_MAX; t++) {
		uint8_t buf[1024];
		struct sc_peer_msg in, out;
		size_t n = encode_sample((enum sc_frame_type)t, buf, sizeof(buf), &in);
		CHECK(n >= SC_PEER_HDR_LEN);
		struct sc_frame_hdr h;
		struct sc_err err;
		CHECK_INT_EQ(sc_peer_decode_hdr(buf, &h, &err), 0);
		CHECK_INT_EQ(h.version, SC_PEER_VERSION);
		CHECK_INT_EQ(h.type, t);
		CHECK_INT_EQ(h.flags, 0);
		CHECK_U64_EQ(h.body_len, n - SC_PEER_HDR_LEN);
		memset(&out, 0xee, sizeof(out));
		CHECK_INT_EQ(sc_peer_decode_body(t, buf + SC_PEER_HDR_LEN, h.body_len, &out, &err),
			     0);
		CHECK_INT_EQ(out.type, t);
		switch (t) {
		case SC_FRAME_HELLO:
			CHECK(memcmp(out.nonce, in.nonce, 16) == 0);
			CHECK_STR_EQ(out.id, in.id);
			CHECK_STR_EQ(out.key_id, in.key_id);
			break;
		case SC_FRAME_HELLO_ACK:
			CHECK(memcmp(out.nonce, in.nonce, 16) == 0);
			CHECK_STR_EQ(out.id, in.id);
			CHECK(memcmp(out.proof, in.proof, SC_HMAC_LEN) == 0);
			break;
		case SC_FRAME_HELLO_FIN:
			CHECK(memcmp(out.proof, in.proof, SC_HMAC_LEN) == 0);
			break;
		case SC_FRAME_ERROR:
			CHECK_INT_EQ(out.code, in.code);
			CHECK_STR_EQ(out.text, in.text);
			break;
		case SC_FRAME_OPEN:
			CHECK(memcmp(out.token, in.token, 16) == 0);
			CHECK_U64_EQ(out.xfer_id, in.xfer_id);
			CHECK_INT_EQ(out.peer_kind, in.peer_kind);
			CHECK_U64_EQ(out.total, in.total);
			break;
		case SC_FRAME_READ:
		case SC_FRAME_WRITE:
			CHECK(memcmp(out.token, in.token, 16) == 0);
			CHECK_U64_EQ(out.xfer_id, in.xfer_id);
			CHECK_U64_EQ(out.desc, in.desc);
			CHECK_U64_EQ(out.offset, in.offset);
			CHECK_U64_EQ(out.len, in.len);
			break;
		case SC_FRAME_DATA:
			CHECK_U64_EQ(out.len, in.len);
			break;
		case SC_FRAME_DONE:
			CHECK(memcmp(out.token, in.token, 16) == 0);
			CHECK_U64_EQ(out.xfer_id, in.xfer_id);
			CHECK_INT_EQ(out.code, in.code);
			CHECK_STR_EQ(out.text, in.text);
			break;
		case SC_FRAME_PING:
		case SC_FRAME_PONG:
			CHECK_U64_EQ(out.cookie, in.cookie);
			break;
		case SC_FRAME_QP_CONNECT:
			CHECK_U64_EQ(out.opaque_len, in.opaque_len);
			CHECK(memcmp(out.opaque, in.opaque, in.opaque_len) == 0);
			break;
		case SC_FRAME_READV:
		case SC_FRAME_WRITEV:
			CHECK(memcmp(out.token, in.token, 16) == 0);
			CHECK_U64_EQ(out.xfer_id, in.xfer_id);
			CHECK_U64_EQ(out.n_pieces, 3);
			CHECK_U64_EQ(out.len, 1ull << 30); /* the pieces' total */
			for (uint32_t i = 0; i < 3; i++) {
				struct sc_peer_piece p = sc_peer_piece_at(&out, i);
				CHECK_U64_EQ(p.desc, in.piece_list[i].desc);
				CHECK_U64_EQ(p.offset, in.piece_list[i].offset);
				CHECK_U64_EQ(p.len, in.piece_list[i].len);
			}
			break;
		default:
			break;
		}
	}
}

TEST(codec_layout_is_little_endian_and_fixed)
{
	struct sc_peer_msg m = {.type = SC_FRAME_READ, .xfer_id = 0x1122334455667788ull,
				.desc = 0xa1b2c3d4, .offset = 5, .len = 0x10000};
	memset(m.token, 0xab, 16);
	uint8_t buf[128];
	size_t n = sc_peer_encode(&m, buf, sizeof(buf));
	static const uint8_t want_hdr[8] = {1, SC_FRAME_READ, 0, 0, 44, 0, 0, 0};
	CHECK_U64_EQ(n, 8 + 16 + 8 + 4 + 8 + 8);
	CHECK(memcmp(buf, want_hdr, 8) == 0);
	CHECK_INT_EQ(buf[8 + 16], 0x88);      /* xfer_id low byte first */
	CHECK_INT_EQ(buf[8 + 16 + 7], 0x11);
	CHECK_INT_EQ(buf[8 + 24], 0xd4);      /* desc */
	CHECK_INT_EQ(buf[8 + 28], 5);         /* offset */
	CHECK_INT_EQ(buf[8 + 36 + 2], 1);     /* len 0x10000 */
}

TEST(encode_refuses_what_does_not_fit)
{
	uint8_t buf[16];
	struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = 3};
	snprintf(m.text, sizeof(m.text), "far too long for sixteen bytes");
	CHECK_U64_EQ(sc_peer_encode(&m, buf, sizeof(buf)), 0);
	m.type = (enum sc_frame_type)99;
	uint8_t big[256];
	CHECK_U64_EQ(sc_peer_encode(&m, big, sizeof(big)), 0);
	/* QP_CONNECT bodies over SC_PEER_MAX_BODY */
	static uint8_t huge[SC_PEER_MAX_BODY + 64];
	struct sc_peer_msg q = {.type = SC_FRAME_QP_CONNECT, .opaque = huge,
				.opaque_len = SC_PEER_MAX_BODY + 1};
	CHECK_U64_EQ(sc_peer_encode(&q, huge, sizeof(huge)), 0);
}

TEST(decode_rejects_bad_headers)
{
	struct {
		uint8_t h[8];
		const char *why;
	} cases[] = {
		{{2, SC_FRAME_PING, 0, 0, 8, 0, 0, 0}, "version 2"},
		{{0, SC_FRAME_PING, 0, 0, 8, 0, 0, 0}, "version 0"},
		{{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}, "HTTP"},
		{{1, 0, 0, 0, 0, 0, 0, 0}, "type 0"},
		{{1, SC_FRAME_TYPE_MAX + 1, 0, 0, 0, 0, 0, 0}, "type max+1"},
		{{1, 200, 0, 0, 0, 0, 0, 0}, "type 200"},
		{{1, SC_FRAME_PING, 1, 0, 8, 0, 0, 0}, "flags"},
		{{1, SC_FRAME_QP_CONNECT, 0, 0, 1, 0, 1, 0}, "body over 64 KiB"},
		{{1, SC_FRAME_READ, 0, 0, 0xff, 0xff, 0xff, 0xff}, "body 4 GiB"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct sc_frame_hdr h;
		struct sc_err err;
		sc_err_clear(&err);
		if (sc_peer_decode_hdr(cases[i].h, &h, &err) == 0)
			CHECK_FAIL_("header accepted: %s", cases[i].why);
		CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
		CHECK_STR_CONTAINS(err.msg, "protocol error");
	}
	uint8_t ok[8] = {1, SC_FRAME_QP_CONNECT, 0, 0, 0, 0, 1, 0}; /* exactly 64 KiB */
	struct sc_frame_hdr h;
	CHECK_INT_EQ(sc_peer_decode_hdr(ok, &h, NULL), 0);
}

TEST(decode_rejects_truncated_and_padded_bodies)
{
	for (unsigned t = 1; t <= SC_FRAME_TYPE_MAX; t++) {
		if (t == SC_FRAME_QP_CONNECT)
			continue; /* opaque: any length */
		uint8_t buf[1024];
		struct sc_peer_msg in, out;
		size_t n = encode_sample((enum sc_frame_type)t, buf, sizeof(buf), &in);
		size_t body = n - SC_PEER_HDR_LEN;
		for (size_t cut = 0; cut < body; cut++) {
			struct sc_err err;
			if (sc_peer_decode_body(t, buf + SC_PEER_HDR_LEN, cut, &out, &err) == 0)
				CHECK_FAIL_("%s accepted with %zu of %zu bytes",
					    sc_frame_type_name(t), cut, body);
			CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
		}
		buf[n] = 0;
		struct sc_err err;
		if (sc_peer_decode_body(t, buf + SC_PEER_HDR_LEN, body + 1, &out, &err) == 0)
			CHECK_FAIL_("%s accepted with a trailing byte", sc_frame_type_name(t));
		/* OPEN reads what follows its fixed fields as extensions: one byte is a cut one */
		CHECK_STR_CONTAINS(err.msg, t == SC_FRAME_OPEN ? "bad extension" : "trailing");
	}
}

TEST(open_extensions_trace_id_and_unknown_tags)
{
	uint8_t buf[1024];
	struct sc_peer_msg in, out;
	struct sc_err err;
	size_t plain = encode_sample(SC_FRAME_OPEN, buf, sizeof(buf), &in);
	/* The trace id: 16 bytes after the fixed fields, tag 1, and back as lowercase hex. */
	snprintf(in.trace_id, sizeof(in.trace_id), "%s", "0af7651916cd43dd8448eb211c80319c");
	size_t n = sc_peer_encode(&in, buf, sizeof(buf));
	CHECK_U64_EQ(n, plain + 18);
	CHECK_INT_EQ(buf[plain], SC_PEER_OPEN_EXT_TRACE);
	CHECK_INT_EQ(buf[plain + 1], 16);
	CHECK_INT_EQ(buf[plain + 2], 0x0a);
	CHECK_INT_EQ(buf[plain + 17], 0x9c);
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8, &out, &err), 0);
	CHECK_STR_EQ(out.trace_id, in.trace_id);
	CHECK_U64_EQ(out.total, in.total);
	/* Without one the frame is the old OPEN, byte for byte; decoded, no trace id. */
	in.trace_id[0] = '\0';
	CHECK_U64_EQ(sc_peer_encode(&in, buf, sizeof(buf)), plain);
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, plain - 8, &out, &err), 0);
	CHECK_STR_EQ(out.trace_id, "");
	/* A trace id that is not 32 hex digits is not encoded. */
	snprintf(in.trace_id, sizeof(in.trace_id), "%s", "not-a-trace-id");
	CHECK_U64_EQ(sc_peer_encode(&in, buf, sizeof(buf)), 0);

	/* An unknown tag (a later release's) is skipped, before and after the trace id. */
	in.trace_id[0] = '\0';
	n = sc_peer_encode(&in, buf, sizeof(buf));
	const uint8_t more[] = {200, 3, 'x', 'y', 'z', SC_PEER_OPEN_EXT_TRACE, 16,
				0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6,
				0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36, 201, 0};
	memcpy(buf + n, more, sizeof(more));
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8 + sizeof(more), &out, &err),
		     0);
	CHECK_STR_EQ(out.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
	/* A trace extension of another length, or one cut short, is a protocol error. */
	const uint8_t short_trace[] = {SC_PEER_OPEN_EXT_TRACE, 8, 1, 2, 3, 4, 5, 6, 7, 8};
	memcpy(buf + n, short_trace, sizeof(short_trace));
	CHECK(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8 + sizeof(short_trace), &out,
				  &err) != 0);
	CHECK_STR_CONTAINS(err.msg, "trace id");
	const uint8_t cut[] = {SC_PEER_OPEN_EXT_TRACE, 16, 1, 2};
	memcpy(buf + n, cut, sizeof(cut));
	CHECK(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8 + sizeof(cut), &out, &err) != 0);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	/* All zeros is no trace (W3C: invalid). */
	uint8_t zeros[18] = {SC_PEER_OPEN_EXT_TRACE, 16};
	memcpy(buf + n, zeros, sizeof(zeros));
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8 + sizeof(zeros), &out, &err),
		     0);
	CHECK_STR_EQ(out.trace_id, "");
}

TEST(decode_rejects_bad_fields)
{
	uint8_t buf[1024];
	struct sc_peer_msg m, out;
	struct sc_err err;

	/* HELLO with a wrong magic */
	size_t n = encode_sample(SC_FRAME_HELLO, buf, sizeof(buf), &m);
	buf[SC_PEER_HDR_LEN] ^= 1;
	CHECK(sc_peer_decode_body(SC_FRAME_HELLO, buf + 8, n - 8, &out, &err) != 0);
	CHECK_STR_CONTAINS(err.msg, "magic");

	/* a NUL inside an id */
	n = encode_sample(SC_FRAME_HELLO, buf, sizeof(buf), &m);
	buf[8 + 4 + 16 + 2 + 1] = 0;
	CHECK(sc_peer_decode_body(SC_FRAME_HELLO, buf + 8, n - 8, &out, &err) != 0);

	/* an id longer than SC_NAME_MAX - 1 */
	memset(&m, 0, sizeof(m));
	m.type = SC_FRAME_HELLO_ACK;
	struct wire {
		uint8_t nonce[16];
		uint8_t len[2];
		char id[SC_NAME_MAX];
		uint8_t proof[32];
	} __attribute__((packed)) w;
	memset(&w, 'x', sizeof(w));
	w.len[0] = SC_NAME_MAX;
	w.len[1] = 0;
	CHECK(sc_peer_decode_body(SC_FRAME_HELLO_ACK, (uint8_t *)&w, sizeof(w), &out, &err) != 0);
	w.len[0] = SC_NAME_MAX - 1; /* fits: the proof then has one byte too many */
	CHECK(sc_peer_decode_body(SC_FRAME_HELLO_ACK, (uint8_t *)&w, sizeof(w) - 1, &out, &err) ==
	      0);
	CHECK_U64_EQ(strlen(out.id), SC_NAME_MAX - 1);

	/* a string length pointing past the body */
	n = encode_sample(SC_FRAME_ERROR, buf, sizeof(buf), &m);
	buf[8 + 4] = 0xff;
	buf[8 + 5] = 0xff;
	CHECK(sc_peer_decode_body(SC_FRAME_ERROR, buf + 8, n - 8, &out, &err) != 0);

	/* OPEN with a peer kind that is not READ or WRITE */
	n = encode_sample(SC_FRAME_OPEN, buf, sizeof(buf), &m);
	buf[8 + 24] = SC_OP_READABLE;
	CHECK(sc_peer_decode_body(SC_FRAME_OPEN, buf + 8, n - 8, &out, &err) != 0);

	/* READ / WRITE of 0 bytes or more than 1 GiB; DATA over 1 GiB */
	unsigned types[] = {SC_FRAME_READ, SC_FRAME_WRITE};
	uint64_t lens[] = {0, SC_PEER_MAX_BULK + 1, UINT64_MAX};
	for (size_t i = 0; i < 2; i++) {
		for (size_t j = 0; j < 3; j++) {
			encode_sample((enum sc_frame_type)types[i], buf, sizeof(buf), &m);
			m.len = lens[j];
			n = sc_peer_encode(&m, buf, sizeof(buf));
			CHECK(n > 0);
			CHECK(sc_peer_decode_body(types[i], buf + 8, n - 8, &out, &err) != 0);
			CHECK_STR_CONTAINS(err.msg, "length");
		}
	}
	/* READV / WRITEV: 0 or more than 1,024 pieces, a piece of 0 bytes, more than 1 GiB in all;
	 * 1,024 pieces is the most and encodes within the body limit */
	static struct sc_peer_piece many[SC_PEER_MAX_PIECES + 1];
	static uint8_t big[SC_PEER_HDR_LEN + 64 + (SC_PEER_MAX_PIECES + 1) * SC_PEER_PIECE_WIRE];
	for (size_t i = 0; i <= SC_PEER_MAX_PIECES; i++)
		many[i] = (struct sc_peer_piece){.desc = (uint32_t)i, .offset = i * 4096, .len = 4096};
	for (size_t i = 0; i < 2; i++) {
		unsigned t = i ? SC_FRAME_WRITEV : SC_FRAME_READV;
		encode_sample((enum sc_frame_type)t, big, sizeof(big), &m);
		m.piece_list = many;
		m.n_pieces = SC_PEER_MAX_PIECES;
		n = sc_peer_encode(&m, big, sizeof(big));
		CHECK(n > 0 && n - 8 <= SC_PEER_MAX_BODY);
		CHECK_INT_EQ(sc_peer_decode_body(t, big + 8, n - 8, &out, &err), 0);
		CHECK_U64_EQ(out.len, SC_PEER_MAX_PIECES * 4096ull);
		m.n_pieces = 0;
		CHECK_U64_EQ(sc_peer_encode(&m, big, sizeof(big)), 0);
		/* the count field says 1,025: refused (whatever follows) */
		m.n_pieces = SC_PEER_MAX_PIECES;
		n = sc_peer_encode(&m, big, sizeof(big));
		big[8 + 24] = (SC_PEER_MAX_PIECES + 1) & 0xff;
		big[8 + 25] = (SC_PEER_MAX_PIECES + 1) >> 8;
		CHECK(sc_peer_decode_body(t, big + 8, n - 8, &out, &err) != 0);
		CHECK_STR_CONTAINS(err.msg, "piece count");
		big[8 + 24] = big[8 + 25] = 0; /* 0 pieces */
		CHECK(sc_peer_decode_body(t, big + 8, 28, &out, &err) != 0);
		CHECK_STR_CONTAINS(err.msg, "piece count");
		many[5].len = 0;
		n = sc_peer_encode(&m, big, sizeof(big));
		CHECK(sc_peer_decode_body(t, big + 8, n - 8, &out, &err) != 0);
		CHECK_STR_CONTAINS(err.msg, "piece length");
		many[5].len = SC_PEER_MAX_BULK - 4096 * 5; /* with the 5 before it: exactly 1 GiB */
		m.n_pieces = 6;
		n = sc_peer_encode(&m, big, sizeof(big));
		CHECK_INT_EQ(sc_peer_decode_body(t, big + 8, n - 8, &out, &err), 0);
		m.n_pieces = 7; /* one more byte of pieces: over */
		n = sc_peer_encode(&m, big, sizeof(big));
		CHECK(sc_peer_decode_body(t, big + 8, n - 8, &out, &err) != 0);
		CHECK_STR_CONTAINS(err.msg, "at most 1 GiB");
		many[5].len = UINT64_MAX; /* no wrap-around */
		n = sc_peer_encode(&m, big, sizeof(big));
		CHECK(sc_peer_decode_body(t, big + 8, n - 8, &out, &err) != 0);
		many[5].len = 4096;
	}

	m = (struct sc_peer_msg){.type = SC_FRAME_DATA, .len = SC_PEER_MAX_BULK + 1};
	n = sc_peer_encode(&m, buf, sizeof(buf));
	CHECK(sc_peer_decode_body(SC_FRAME_DATA, buf + 8, n - 8, &out, &err) != 0);
	m.len = SC_PEER_MAX_BULK;
	n = sc_peer_encode(&m, buf, sizeof(buf));
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_DATA, buf + 8, n - 8, &out, &err), 0);

	/* a long ERROR message is cut, not refused */
	uint8_t long_err[4 + 2 + 1000];
	memset(long_err, 'm', sizeof(long_err));
	long_err[0] = 9;
	long_err[1] = long_err[2] = long_err[3] = 0;
	long_err[4] = 1000 & 0xff;
	long_err[5] = 1000 >> 8;
	CHECK_INT_EQ(sc_peer_decode_body(SC_FRAME_ERROR, long_err, sizeof(long_err), &out, &err),
		     0);
	CHECK_U64_EQ(strlen(out.text), SC_ERR_MSG_MAX - 1);
	CHECK_INT_EQ(sc_peer_status_from_wire(out.code), SC_FAILED_PRECONDITION);
	CHECK_INT_EQ(sc_peer_status_from_wire(2), SC_INTERNAL); /* no such status */
	CHECK_INT_EQ(sc_peer_status_from_wire(0xffffffffu), SC_INTERNAL);

	CHECK(sc_peer_decode_body(0, buf, 0, &out, &err) != 0);
	CHECK(sc_peer_decode_body(SC_FRAME_TYPE_MAX + 1, buf, 0, &out, &err) != 0);
}

TEST(decode_survives_random_garbage)
{
	/* Random bodies of random types: the decoder never reads past the body (ASan in the
	 * sanitizer build) and accepts only what re-encodes to the same bytes. */
	uint8_t body[200], again[300];
	unsigned accepted = 0;
	uint64_t x;
	sc_random_bytes(&x, sizeof(x));
	x |= 1;
	for (int i = 0; i < 50000; i++) {
		uint64_t r[26]; /* xorshift64*: cheap, also under valgrind */
		for (size_t k = 0; k < 26; k++) {
			x ^= x >> 12;
			x ^= x << 25;
			x ^= x >> 27;
			r[k] = x * 0x2545f4914f6cdd1dull;
		}
		unsigned type = 1 + (unsigned)(r[0] % SC_FRAME_TYPE_MAX);
		size_t len = (size_t)(r[0] >> 32) % sizeof(body);
		memcpy(body, &r[1], len);
		struct sc_peer_msg m;
		struct sc_err err;
		if (sc_peer_decode_body(type, body, len, &m, &err) != 0)
			continue;
		accepted++;
		if (type == SC_FRAME_ERROR || type == SC_FRAME_DONE)
			continue; /* messages may be cut */
		if (type == SC_FRAME_OPEN) {
			/* Unknown extensions are skipped (and an all-zero trace id means none): the
			 * fixed fields re-encode to the same bytes, and what was kept decodes back
			 * the same. */
			const size_t fixed = SC_TOKEN_LEN + 8 + 1 + 8;
			size_t n = sc_peer_encode(&m, again, sizeof(again));
			CHECK(len >= fixed && n >= SC_PEER_HDR_LEN + fixed);
			CHECK(memcmp(again + SC_PEER_HDR_LEN, body, fixed) == 0);
			struct sc_peer_msg m2;
			CHECK_INT_EQ(sc_peer_decode_body(type, again + SC_PEER_HDR_LEN,
							 n - SC_PEER_HDR_LEN, &m2, &err),
				     0);
			CHECK_STR_EQ(m2.trace_id, m.trace_id);
			continue;
		}
		size_t n = sc_peer_encode(&m, again, sizeof(again));
		CHECK_U64_EQ(n, len + SC_PEER_HDR_LEN);
		CHECK(memcmp(again + SC_PEER_HDR_LEN, body, len) == 0);
	}
	CHECK(accepted > 0); /* OK, PING and QP_CONNECT bodies do happen */
}

/* ---- blocking I/O ---------------------------------------------------------------------------- */

TEST(io_deadline_and_cancel)
{
	int sv[2];
	make_pair(sv);
	uint8_t b[4];
	int e;
	uint64_t t0 = sc_clock_mono_ms();
	struct sc_peer_wait w = wait_ms(150);
	CHECK_INT_EQ(sc_peer_recv_all(sv[0], b, sizeof(b), &w, NULL, &e), SC_PEER_IO_DEADLINE);
	uint64_t took = sc_clock_mono_ms() - t0;
	CHECK(took >= 150 && took < 1000);

	atomic_bool cancel = true;
	w = (struct sc_peer_wait){.cancel = &cancel};
	CHECK_INT_EQ(sc_peer_recv_all(sv[0], b, sizeof(b), &w, NULL, &e), SC_PEER_IO_CANCELLED);

	/* stall: 2 of 4 bytes arrive, then nothing */
	CHECK_INT_EQ(write(sv[1], "ab", 2), 2);
	w = (struct sc_peer_wait){.stall_ms = 100};
	size_t got = 0;
	CHECK_INT_EQ(sc_peer_recv_all(sv[0], b, sizeof(b), &w, &got, &e), SC_PEER_IO_DEADLINE);
	CHECK_U64_EQ(got, 2);

	/* a partial frame and then EOF */
	uint8_t frame[64];
	struct sc_peer_msg m;
	struct sc_err err;
	CHECK_INT_EQ(write(sv[1], "\x01\x0b\x00\x00\x08\x00", 6), 6);
	shutdown(sv[1], SHUT_WR);
	w = wait_ms(1000);
	CHECK_INT_EQ(sc_peer_recv_msg(sv[0], frame, sizeof(frame), &m, &w, "the test", &err),
		     SC_PEER_IO_EOF);
	CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(err.msg, "the test closed the connection");
	close(sv[0]);
	close(sv[1]);
}

TEST(recv_msg_refuses_frames_larger_than_the_buffer)
{
	int sv[2];
	make_pair(sv);
	struct sc_peer_msg m = {.type = SC_FRAME_ERROR, .code = 5};
	memset(m.text, 'z', 300);
	CHECK_INT_EQ(send_msg(sv[1], &m), 0);
	uint8_t small[SC_PEER_HDR_LEN + 64];
	struct sc_peer_wait w = wait_ms(1000);
	struct sc_err err;
	CHECK_INT_EQ(sc_peer_recv_msg(sv[0], small, sizeof(small), &m, &w, "x", &err),
		     SC_PEER_IO_PROTOCOL);
	CHECK_STR_CONTAINS(err.msg, "at most 64");
	close(sv[0]);
	close(sv[1]);
}

/* Frames and bulk read through a read-ahead buffer (struct sc_peer_rxbuf): one write carries
 * OPEN, WRITE + its bulk and DONE; each comes out whole and in order, the bulk lands where asked
 * (part from the buffer, the rest from the socket), and nothing is left behind. */
TEST(recv_through_read_ahead)
{
	int sv[2];
	make_pair(sv);
	uint8_t wire[4096], *p = wire;
	struct sc_peer_msg open = {.type = SC_FRAME_OPEN, .xfer_id = 7, .peer_kind = SC_OP_WRITE,
				   .total = 100};
	struct sc_peer_msg wr = {.type = SC_FRAME_WRITE, .xfer_id = 7, .desc = 1, .len = 100};
	struct sc_peer_msg done = {.type = SC_FRAME_DONE, .xfer_id = 7};
	p += sc_peer_encode(&open, p, sizeof(wire) - (size_t)(p - wire));
	p += sc_peer_encode(&wr, p, sizeof(wire) - (size_t)(p - wire));
	for (int i = 0; i < 100; i++)
		*p++ = (uint8_t)i;
	p += sc_peer_encode(&done, p, sizeof(wire) - (size_t)(p - wire));
	CHECK_INT_EQ(write(sv[1], wire, (size_t)(p - wire)), (int)(p - wire));

	uint8_t mem[64]; /* small: the WRITE's bulk is split between buffer and socket */
	struct sc_peer_rxbuf rb = {.p = mem, .cap = sizeof(mem)};
	uint8_t frame[SC_PEER_HDR_LEN + 256];
	struct sc_peer_msg m;
	struct sc_err err;
	struct sc_peer_wait w = wait_ms(2000);
	CHECK_INT_EQ(sc_peer_recv_msg_rb(sv[0], &rb, frame, sizeof(frame), &m, &w, "x", &err),
		     SC_PEER_IO_OK);
	CHECK_INT_EQ(m.type, SC_FRAME_OPEN);
	CHECK_U64_EQ(m.total, 100);
	CHECK_INT_EQ(sc_peer_recv_msg_rb(sv[0], &rb, frame, sizeof(frame), &m, &w, "x", &err),
		     SC_PEER_IO_OK);
	CHECK_INT_EQ(m.type, SC_FRAME_WRITE);
	CHECK_U64_EQ(m.len, 100);
	uint8_t bulk[100];
	int e;
	size_t got = 0;
	CHECK(sc_peer_rxbuf_avail(&rb) > 0);
	CHECK_INT_EQ(sc_peer_recv_rb(sv[0], &rb, bulk, sizeof(bulk), &w, &got, &e), SC_PEER_IO_OK);
	CHECK_U64_EQ(got, 100);
	for (int i = 0; i < 100; i++)
		CHECK_INT_EQ(bulk[i], i);
	CHECK_INT_EQ(sc_peer_recv_msg_rb(sv[0], &rb, frame, sizeof(frame), &m, &w, "x", &err),
		     SC_PEER_IO_OK);
	CHECK_INT_EQ(m.type, SC_FRAME_DONE);
	CHECK_U64_EQ(sc_peer_rxbuf_avail(&rb), 0);
	/* Nothing more: a non-blocking fill says so, and the end is seen through the buffer. */
	CHECK_INT_EQ((int)sc_peer_rxbuf_fill_nowait(sv[0], &rb), -1);
	CHECK_INT_EQ(write(sv[1], "\x01\x0b", 2), 2);
	shutdown(sv[1], SHUT_WR);
	CHECK_INT_EQ(sc_peer_recv_msg_rb(sv[0], &rb, frame, sizeof(frame), &m, &w, "x", &err),
		     SC_PEER_IO_EOF);
	close(sv[0]);
	close(sv[1]);
}

/* ---- hello ----------------------------------------------------------------------------------- */

TEST(hello_same_keyring_succeeds)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	CHECK(ring);
	struct hello_side cli, srv;
	run_hello(ring, ring, &cli, &srv);
	CHECK_INT_EQ(cli.rc, 0);
	CHECK_INT_EQ(srv.rc, 0);
	CHECK_STR_EQ(cli.peer, "server-1");
	CHECK_STR_EQ(srv.peer, "client-1");
	sc_keyring_release(ring);
}

TEST(hello_rotated_key_verifies)
{
	/* The server signs with k-new but still knows k-old, which the client signs with. */
	char text[512];
	unsigned char key[32], b64[64], b64b[64];
	sc_random_bytes(key, sizeof(key));
	EVP_EncodeBlock(b64, key, sizeof(key));
	int n = snprintf(text, sizeof(text), "k-old:%s\n", b64);
	struct sc_keyring *client;
	CHECK_INT_EQ(sc_keyring_parse(text, (size_t)n, &client, NULL), 0);
	sc_random_bytes(key, sizeof(key));
	EVP_EncodeBlock(b64b, key, sizeof(key));
	n = snprintf(text, sizeof(text), "k-new:%s\nk-old:%s\n", b64b, b64);
	struct sc_keyring *server;
	CHECK_INT_EQ(sc_keyring_parse(text, (size_t)n, &server, NULL), 0);
	struct hello_side cli, srv;
	run_hello(client, server, &cli, &srv);
	CHECK_INT_EQ(cli.rc, 0);
	CHECK_INT_EQ(srv.rc, 0);
	sc_keyring_release(client);
	sc_keyring_release(server);
}

TEST(hello_different_key_fails_both_sides)
{
	struct sc_keyring *a = make_ring("k1", NULL), *b = make_ring("k1", NULL);
	CHECK(a && b);
	struct hello_side cli, srv;
	run_hello(a, b, &cli, &srv);
	CHECK_INT_EQ(cli.rc, -1);
	CHECK_INT_EQ(cli.err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(cli.err.msg, "failed to prove");
	CHECK_INT_EQ(srv.rc, -1);
	CHECK_INT_EQ(srv.err.code, SC_UNAUTHENTICATED);
	sc_keyring_release(a);
	sc_keyring_release(b);
}

TEST(hello_unknown_key_id_fails)
{
	struct sc_keyring *a = make_ring("k-client", NULL), *b = make_ring("k-server", NULL);
	CHECK(a && b);
	struct hello_side cli, srv;
	run_hello(a, b, &cli, &srv);
	CHECK_INT_EQ(cli.rc, -1);
	CHECK_INT_EQ(cli.err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(cli.err.msg, "k-client");
	CHECK_STR_CONTAINS(cli.err.msg, "--key-file");
	CHECK_INT_EQ(srv.rc, -1);
	CHECK_INT_EQ(srv.err.code, SC_UNAUTHENTICATED);
	sc_keyring_release(a);
	sc_keyring_release(b);
}

TEST(hello_missing_keyring_fails_with_hint)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	CHECK(ring);
	struct hello_side cli, srv;
	run_hello(ring, NULL, &cli, &srv); /* server has none */
	CHECK_INT_EQ(cli.rc, -1);
	CHECK_INT_EQ(cli.err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(cli.err.msg, "--key-file on both sidecars");
	CHECK_INT_EQ(srv.err.code, SC_UNAUTHENTICATED);
	run_hello(NULL, ring, &cli, &srv); /* client has none */
	CHECK_INT_EQ(cli.rc, -1);
	CHECK_INT_EQ(cli.err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(cli.err.msg, "--key-file on both sidecars");
	CHECK_INT_EQ(srv.rc, -1);
	sc_keyring_release(ring);
}

/* A hand-made client that follows the documented transcript; returns the server's verdict. */
struct raw_client {
	int fd;
	uint8_t buf[2048];
	struct sc_peer_msg hello, ack;
};

static int raw_hello_start(struct raw_client *rc, const struct sc_keyring *ring)
{
	rc->hello = (struct sc_peer_msg){.type = SC_FRAME_HELLO};
	sc_random_bytes(rc->hello.nonce, 16);
	snprintf(rc->hello.id, sizeof(rc->hello.id), "raw-client");
	snprintf(rc->hello.key_id, sizeof(rc->hello.key_id), "%s", sc_keyring_signing_id(ring));
	if (send_msg(rc->fd, &rc->hello) != 0)
		return -1;
	return recv_msg(rc->fd, rc->buf, sizeof(rc->buf), &rc->ack) == 0 &&
			       rc->ack.type == SC_FRAME_HELLO_ACK
		       ? 0
		       : -1;
}

TEST(hello_transcript_matches_the_documented_proofs)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	int sv[2];
	make_pair(sv);
	struct hello_side srv = {.fd = sv[1], .ring = ring, .id = "server-1"};
	pthread_t t;
	pthread_create(&t, NULL, server_thread, &srv);
	struct raw_client rc = {.fd = sv[0]};
	CHECK_INT_EQ(raw_hello_start(&rc, ring), 0);
	uint8_t want[SC_HMAC_LEN];
	proof(ring, "rsm1-hello-s", "k1", rc.hello.nonce, rc.ack.nonce, "raw-client", "server-1",
	      want);
	CHECK(memcmp(want, rc.ack.proof, SC_HMAC_LEN) == 0);
	struct sc_peer_msg fin = {.type = SC_FRAME_HELLO_FIN};
	proof(ring, "rsm1-hello-c", "k1", rc.ack.nonce, rc.hello.nonce, "raw-client", "server-1",
	      fin.proof);
	CHECK_INT_EQ(send_msg(sv[0], &fin), 0);
	struct sc_peer_msg ok;
	CHECK_INT_EQ(recv_msg(sv[0], rc.buf, sizeof(rc.buf), &ok), 0);
	CHECK_INT_EQ(ok.type, SC_FRAME_OK);
	pthread_join(t, NULL);
	CHECK_INT_EQ(srv.rc, 0);
	CHECK_STR_EQ(srv.peer, "raw-client");
	close(sv[0]);
	close(sv[1]);
	sc_keyring_release(ring);
}

TEST(hello_forged_or_replayed_client_proof_fails)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	struct sc_peer_msg replay = {.type = SC_FRAME_HELLO_FIN};
	for (int round = 0; round < 3; round++) {
		int sv[2];
		make_pair(sv);
		struct hello_side srv = {.fd = sv[1], .ring = ring, .id = "server-1"};
		pthread_t t;
		pthread_create(&t, NULL, server_thread, &srv);
		struct raw_client rc = {.fd = sv[0]};
		CHECK_INT_EQ(raw_hello_start(&rc, ring), 0);
		struct sc_peer_msg fin = {.type = SC_FRAME_HELLO_FIN};
		if (round == 0) {
			/* a valid session, recorded */
			proof(ring, "rsm1-hello-c", "k1", rc.ack.nonce, rc.hello.nonce,
			      "raw-client", "server-1", fin.proof);
			replay = fin;
		} else if (round == 1) {
			fin = replay; /* replayed into a session with a fresh server nonce */
		} else {
			/* reflection: the server's own proof sent back */
			memcpy(fin.proof, rc.ack.proof, SC_HMAC_LEN);
		}
		CHECK_INT_EQ(send_msg(sv[0], &fin), 0);
		struct sc_peer_msg verdict;
		CHECK_INT_EQ(recv_msg(sv[0], rc.buf, sizeof(rc.buf), &verdict), 0);
		pthread_join(t, NULL);
		if (round == 0) {
			CHECK_INT_EQ(verdict.type, SC_FRAME_OK);
			CHECK_INT_EQ(srv.rc, 0);
		} else {
			CHECK_INT_EQ(verdict.type, SC_FRAME_ERROR);
			CHECK_INT_EQ(verdict.code, SC_UNAUTHENTICATED);
			CHECK_INT_EQ(srv.rc, -1);
			CHECK_INT_EQ(srv.err.code, SC_UNAUTHENTICATED);
			CHECK_STR_CONTAINS(srv.err.msg, "failed to prove");
		}
		close(sv[0]);
		close(sv[1]);
	}
	sc_keyring_release(ring);
}

struct raw_server {
	int fd;
	const struct sc_keyring *ring;
	bool valid_proof;
	struct sc_peer_msg reply; /* what the client sent after our ACK */
};

static void *raw_server_thread(void *arg)
{
	struct raw_server *rs = arg;
	uint8_t buf[2048];
	struct sc_peer_msg hello;
	if (recv_msg(rs->fd, buf, sizeof(buf), &hello) != 0)
		return NULL;
	struct sc_peer_msg ack = {.type = SC_FRAME_HELLO_ACK};
	sc_random_bytes(ack.nonce, 16);
	snprintf(ack.id, sizeof(ack.id), "impostor");
	if (rs->valid_proof)
		proof(rs->ring, "rsm1-hello-s", hello.key_id, hello.nonce, ack.nonce, hello.id,
		      "impostor", ack.proof);
	else
		sc_random_bytes(ack.proof, SC_HMAC_LEN);
	send_msg(rs->fd, &ack);
	recv_msg(rs->fd, buf, sizeof(buf), &rs->reply);
	if (rs->reply.type == SC_FRAME_HELLO_FIN) {
		struct sc_peer_msg ok = {.type = SC_FRAME_OK};
		send_msg(rs->fd, &ok);
	}
	return NULL;
}

TEST(hello_forged_server_proof_fails)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	for (int valid = 0; valid < 2; valid++) {
		int sv[2];
		make_pair(sv);
		struct raw_server rs = {.fd = sv[1], .ring = ring, .valid_proof = valid};
		pthread_t t;
		pthread_create(&t, NULL, raw_server_thread, &rs);
		struct sc_peer_wait w = wait_ms(2000);
		struct sc_err err;
		char peer[SC_NAME_MAX];
		int rc = sc_peer_hello_client(sv[0], ring, "client-1", &w, "test server", peer,
					      &err);
		pthread_join(t, NULL);
		if (valid) {
			CHECK_INT_EQ(rc, 0);
			CHECK_STR_EQ(peer, "impostor");
			CHECK_INT_EQ(rs.reply.type, SC_FRAME_HELLO_FIN);
		} else {
			CHECK_INT_EQ(rc, -1);
			CHECK_INT_EQ(err.code, SC_UNAUTHENTICATED);
			CHECK_STR_CONTAINS(err.msg, "failed to prove");
			/* the client told the server, and never sent a proof of its own */
			CHECK_INT_EQ(rs.reply.type, SC_FRAME_ERROR);
			CHECK_INT_EQ(rs.reply.code, SC_UNAUTHENTICATED);
		}
		close(sv[0]);
		close(sv[1]);
	}
	sc_keyring_release(ring);
}

TEST(hello_rejects_garbage_and_early_requests)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	/* 0: HTTP; 1: an OPEN before the hello; 2: a HELLO with a bad magic; 3: silence */
	for (int round = 0; round < 4; round++) {
		int sv[2];
		make_pair(sv);
		struct hello_side srv = {.fd = sv[1], .ring = ring, .id = "server-1"};
		pthread_t t;
		uint64_t t0 = sc_clock_mono_ms();
		if (round == 3) {
			/* the server's deadline: 3 s here, SC_PEER_HELLO_TIMEOUT_MS in a daemon */
			pthread_create(&t, NULL, server_thread, &srv);
			pthread_join(t, NULL);
			CHECK_INT_EQ(srv.err.code, SC_DEADLINE_EXCEEDED);
			CHECK(sc_clock_mono_ms() - t0 >= 3000);
			close(sv[0]);
			close(sv[1]);
			continue;
		}
		pthread_create(&t, NULL, server_thread, &srv);
		if (round == 0) {
			const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
			CHECK(write(sv[0], http, strlen(http)) > 0);
		} else if (round == 1) {
			struct sc_peer_msg open = {.type = SC_FRAME_OPEN, .peer_kind = SC_OP_READ};
			CHECK_INT_EQ(send_msg(sv[0], &open), 0);
		} else {
			uint8_t buf[256];
			struct sc_peer_msg hello = {.type = SC_FRAME_HELLO};
			snprintf(hello.id, sizeof(hello.id), "c");
			snprintf(hello.key_id, sizeof(hello.key_id), "k1");
			size_t n = sc_peer_encode(&hello, buf, sizeof(buf));
			buf[SC_PEER_HDR_LEN + 3] = 'X';
			CHECK_INT_EQ(write(sv[0], buf, n), (long long)n);
		}
		pthread_join(t, NULL);
		CHECK_INT_EQ(srv.rc, -1);
		CHECK_INT_EQ(srv.err.code, SC_INVALID_ARGUMENT);
		CHECK_STR_CONTAINS(srv.err.msg, "protocol error");
		CHECK(sc_clock_mono_ms() - t0 < 2000);
		close(sv[0]);
		close(sv[1]);
	}
	sc_keyring_release(ring);
}

/* Regression (tests/fuzz/fuzz_peer.c): a server answering the HELLO with an ERROR frame whose code
 * is 0 (OK) made the client fail with err.code OK, a failure that read as success. */
TEST(hello_error_frame_with_code_ok_is_a_refusal)
{
	struct sc_keyring *ring = make_ring("k1", NULL);
	int sv[2];
	make_pair(sv);
	struct sc_peer_msg e = {.type = SC_FRAME_ERROR, .code = 0};
	snprintf(e.text, sizeof(e.text), "no thanks");
	CHECK_INT_EQ(send_msg(sv[1], &e), 0);
	struct sc_peer_wait w = wait_ms(2000);
	struct sc_err err;
	sc_err_clear(&err);
	char peer[SC_NAME_MAX];
	int rc = sc_peer_hello_client(sv[0], ring, "client-1", &w, "test server", peer, &err);
	CHECK_INT_EQ(rc, -1);
	CHECK_INT_EQ(err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(err.msg, "test server refused the hello: no thanks");
	close(sv[0]);
	close(sv[1]);
	sc_keyring_release(ring);
}

RUN_TESTS(T(codec_round_trip_every_type), T(codec_layout_is_little_endian_and_fixed),
	  T(encode_refuses_what_does_not_fit), T(decode_rejects_bad_headers),
	  T(decode_rejects_truncated_and_padded_bodies),
	  T(open_extensions_trace_id_and_unknown_tags), T(decode_rejects_bad_fields),
	  T(decode_survives_random_garbage), T(io_deadline_and_cancel),
	  T(recv_msg_refuses_frames_larger_than_the_buffer), T(recv_through_read_ahead),
	  T(hello_same_keyring_succeeds),
	  T(hello_rotated_key_verifies), T(hello_different_key_fails_both_sides),
	  T(hello_unknown_key_id_fails), T(hello_missing_keyring_fails_with_hint),
	  T(hello_transcript_matches_the_documented_proofs),
	  T(hello_forged_or_replayed_client_proof_fails), T(hello_forged_server_proof_fails),
	  T(hello_rejects_garbage_and_early_requests),
	  T(hello_error_frame_with_code_ok_is_a_refusal))
