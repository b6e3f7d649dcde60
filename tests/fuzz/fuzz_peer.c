/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_peer.c: libFuzzer target for the peer control channel (sidecar/peer/proto.c). The first
 * input byte picks what the rest is fed to:
 *   0: the frame decoder: the bytes as a stream of frames (header, then body_len bytes of body).
 *      Every frame that decodes must re-encode, and its encoding must decode to a message that
 *      encodes to the same bytes (a fixed point), else abort. The same bytes read from a socket
 *      straight and through a small read-ahead buffer must give the same frames and bulk.
 *   1: the serving side of the hello (sc_peer_hello_server): the bytes are what a client sent.
 *   2: the dialling side (sc_peer_hello_client): the bytes are what the server answered.
 * The hello runs on one end of a socketpair; the input is written to the other end, which is then
 * shut for writing, so the reads end at the input's end (EOF) rather than blocking. Outcomes are
 * 0 or -1 with an error; any crash or sanitizer report is the finding.
 * Built with -DSC_FUZZ_GEN_SEEDS (no libFuzzer) it instead writes a seed corpus into argv[1]:
 * one encoded frame of every type, and the bytes each side of a real hello sent (captured from a
 * client and a server talking over a socketpair with the fixture keyring). Single-threaded except
 * for the seed generator's hello server thread.
 * The key is the byte pattern 0..31, made at start-up: a fixture, not a secret.
 */
#include "meta/keys.h"
#include "peer/proto.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>

static struct sc_keyring *ring;

static void ring_init(void)
{
	if (ring)
		return;
	unsigned char k[32];
	for (size_t i = 0; i < sizeof(k); i++)
		k[i] = (unsigned char)i;
	char b[64], text[128];
	EVP_EncodeBlock((unsigned char *)b, k, (int)sizeof(k));
	snprintf(text, sizeof(text), "fz1:%s\n", b);
	struct sc_err err = {0};
	if (sc_keyring_parse(text, strlen(text), &ring, &err) != 0) {
		fprintf(stderr, "fuzz ring: %s\n", err.msg);
		abort();
	}
}

#ifndef SC_FUZZ_GEN_SEEDS

static void fuzz_frames(const uint8_t *data, size_t size)
{
	static uint8_t enc[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY],
	    enc2[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
	while (size >= SC_PEER_HDR_LEN) {
		struct sc_frame_hdr h;
		struct sc_err err = {0};
		if (sc_peer_decode_hdr(data, &h, &err) != 0)
			return;
		data += SC_PEER_HDR_LEN;
		size -= SC_PEER_HDR_LEN;
		if (h.body_len > size)
			return;
		struct sc_peer_msg m;
		memset(&m, 0, sizeof(m));
		if (sc_peer_decode_body(h.type, data, h.body_len, &m, &err) == 0) {
			m.flags = h.flags;
			size_t n = sc_peer_encode(&m, enc, sizeof(enc));
			if (n == 0) {
				fprintf(stderr, "decoded %s frame does not re-encode\n",
					sc_frame_type_name(h.type));
				abort();
			}
			struct sc_frame_hdr h2;
			struct sc_peer_msg m2;
			memset(&m2, 0, sizeof(m2));
			if (sc_peer_decode_hdr(enc, &h2, &err) != 0 ||
			    sc_peer_decode_body(h2.type, enc + SC_PEER_HDR_LEN, h2.body_len, &m2,
						&err) != 0) {
				fprintf(stderr, "re-encoded %s frame does not decode: %s\n",
					sc_frame_type_name(h.type), err.msg);
				abort();
			}
			m2.flags = h2.flags;
			size_t n2 = sc_peer_encode(&m2, enc2, sizeof(enc2));
			if (n2 != n || memcmp(enc, enc2, n) != 0) {
				fprintf(stderr, "%s frame: encode(decode(encode)) differs\n",
					sc_frame_type_name(h.type));
				abort();
			}
		}
		data += h.body_len;
		size -= h.body_len;
	}
}

/* A socketpair holding the bytes, shut for writing after them (cut at 1 MiB). */
static void pair_with(int sv[2], const uint8_t *data, size_t size)
{
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		abort();
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	sc_peer_set_io_slice(sv[0], 100);
	size_t off = 0;
	while (off < size) {
		ssize_t n = write(sv[1], data + off, size - off);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	shutdown(sv[1], SHUT_WR);
}

/* Mode 0 also: the bytes read as frames (and the bulk of DATA / WRITE / WRITEV) straight from the
 * socket and through a small read-ahead buffer (sc_peer_recv_msg_rb, sc_peer_recv_rb) must give
 * the same frames, bulk bytes and outcomes. */
static void fuzz_read_ahead(const uint8_t *data, size_t size)
{
	static uint8_t fa[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
	static uint8_t fb[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
	static uint8_t ba[4096], bb[4096];
	uint8_t mem[200];
	struct sc_peer_rxbuf rb = {.p = mem, .cap = 24 + (size ? data[0] % 176 : 0)};
	int a[2], b[2];
	pair_with(a, data, size);
	pair_with(b, data, size);
	for (int i = 0; i < 64; i++) {
		struct sc_peer_wait w = {.deadline_mono_ms = sc_clock_mono_ms() + 2000};
		struct sc_peer_msg ma, mb;
		struct sc_err ea = {0}, eb = {0};
		enum sc_peer_io ra = sc_peer_recv_msg(a[0], fa, sizeof(fa), &ma, &w, "a", &ea);
		enum sc_peer_io rb_rc =
		    sc_peer_recv_msg_rb(b[0], &rb, fb, sizeof(fb), &mb, &w, "b", &eb);
		if (ra != rb_rc || (ra == SC_PEER_IO_OK && ma.type != mb.type))
			abort();
		if (ra != SC_PEER_IO_OK)
			break;
		if (ma.type != SC_FRAME_DATA && ma.type != SC_FRAME_WRITE &&
		    ma.type != SC_FRAME_WRITEV)
			continue;
		size_t len = ma.len < sizeof(ba) ? (size_t)ma.len : sizeof(ba), ga = 0, gb = 0;
		int e;
		ra = sc_peer_recv_all(a[0], ba, len, &w, &ga, &e);
		rb_rc = sc_peer_recv_rb(b[0], &rb, bb, len, &w, &gb, &e);
		if (ra != rb_rc || ga != gb || memcmp(ba, bb, ga) != 0)
			abort();
		if (ra != SC_PEER_IO_OK)
			break;
	}
	close(a[0]);
	close(a[1]);
	close(b[0]);
	close(b[1]);
}

static void fuzz_hello(bool server, const uint8_t *data, size_t size)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		abort();
	int big = 1 << 20;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	sc_peer_set_io_slice(sv[0], 100);
	size_t off = 0;
	while (off < size) {
		ssize_t n = write(sv[1], data + off, size - off);
		if (n <= 0)
			break; /* larger than the buffer: the rest is cut */
		off += (size_t)n;
	}
	shutdown(sv[1], SHUT_WR);
	struct sc_peer_wait w = {.deadline_mono_ms = sc_clock_mono_ms() + 2000};
	char peer_id[SC_NAME_MAX];
	struct sc_err err = {0};
	int rc = server
		     ? sc_peer_hello_server(sv[0], ring, "fuzz-server", &w, "fuzz", peer_id, &err)
		     : sc_peer_hello_client(sv[0], ring, "fuzz-client", &w, "fuzz", peer_id, &err);
	if (rc == 0 && !memchr(peer_id, '\0', sizeof(peer_id)))
		abort();
	if (rc != 0 && err.code == SC_OK)
		abort(); /* a failure must say why */
	close(sv[0]);
	close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ring_init();
	if (size == 0)
		return 0;
	switch (data[0] % 3) {
	case 0:
		fuzz_frames(data + 1, size - 1);
		fuzz_read_ahead(data + 1, size - 1);
		break;
	case 1:
		fuzz_hello(true, data + 1, size - 1);
		break;
	default:
		fuzz_hello(false, data + 1, size - 1);
		break;
	}
	return 0;
}

#else /* the seed generator */

static const char *seed_dir;
static int seed_n;

static void write_seed(uint8_t mode, const uint8_t *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/peer-%02d", seed_dir, seed_n++);
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fwrite(&mode, 1, 1, f);
	fwrite(p, 1, n, f);
	fclose(f);
}

struct side {
	int fd;
	int rc;
};

static void *server_main(void *arg)
{
	struct side *s = arg;
	struct sc_peer_wait w = {.deadline_mono_ms = sc_clock_mono_ms() + 5000};
	char peer[SC_NAME_MAX];
	struct sc_err err = {0};
	s->rc = sc_peer_hello_server(s->fd, ring, "seed-server", &w, "seed", peer, &err);
	return NULL;
}

static void *client_main(void *arg)
{
	struct side *c = arg;
	struct sc_peer_wait w = {.deadline_mono_ms = sc_clock_mono_ms() + 5000};
	char peer[SC_NAME_MAX];
	struct sc_err err = {0};
	c->rc = sc_peer_hello_client(c->fd, ring, "seed-client", &w, "seed", peer, &err);
	return NULL;
}

/* A real hello, client and server on a socketpair through a relay that records both
 * directions: the client's bytes seed mode 1, the server's mode 2. */
static void capture_hello(void)
{
	int c[2], s[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, c) != 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, s) != 0)
		exit(1);
	/* client <-> c[0] | c[1] relay s[1] | s[0] <-> server. This thread relays frame by frame
	 * (HELLO c->s, HELLO_ACK s->c, HELLO_FIN c->s, OK s->c) and records each. */
	struct side srv = {.fd = s[0]}, cli = {.fd = c[0]};
	pthread_t ts, tc;
	pthread_create(&ts, NULL, server_main, &srv);
	pthread_create(&tc, NULL, client_main, &cli);
	static uint8_t from_client[8192], from_server[8192];
	size_t nc = 0, ns = 0;
	for (int step = 0; step < 4; step++) {
		int from = step % 2 == 0 ? c[1] : s[1], to = step % 2 == 0 ? s[1] : c[1];
		uint8_t *rec = step % 2 == 0 ? from_client : from_server;
		size_t *len = step % 2 == 0 ? &nc : &ns;
		uint8_t hdr[SC_PEER_HDR_LEN];
		if (read(from, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr))
			break;
		struct sc_frame_hdr h;
		struct sc_err err = {0};
		if (sc_peer_decode_hdr(hdr, &h, &err) != 0)
			break;
		uint8_t body[SC_PEER_MAX_BODY];
		size_t got = 0;
		while (got < h.body_len) {
			ssize_t n = read(from, body + got, h.body_len - got);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		memcpy(rec + *len, hdr, sizeof(hdr));
		memcpy(rec + *len + sizeof(hdr), body, got);
		*len += sizeof(hdr) + got;
		if (write(to, hdr, sizeof(hdr)) < 0 || write(to, body, got) < 0)
			break;
	}
	pthread_join(tc, NULL);
	pthread_join(ts, NULL);
	if (srv.rc != 0 || cli.rc != 0) {
		fprintf(stderr, "seed hello failed: server %d client %d\n", srv.rc, cli.rc);
		exit(1);
	}
	write_seed(1, from_client, nc);
	write_seed(2, from_server, ns);
	write_seed(0, from_client, nc);
	write_seed(0, from_server, ns);
	close(c[0]);
	close(c[1]);
	close(s[0]);
	close(s[1]);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
		return 2;
	}
	seed_dir = argv[1];
	ring_init();
	static uint8_t buf[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
	uint8_t opaque[64];
	for (size_t i = 0; i < sizeof(opaque); i++)
		opaque[i] = (uint8_t)(i * 7);
	for (unsigned type = 1; type <= SC_FRAME_TYPE_MAX; type++) {
		struct sc_peer_msg m;
		memset(&m, 0, sizeof(m));
		m.type = (enum sc_frame_type)type;
		for (size_t i = 0; i < sizeof(m.nonce); i++)
			m.nonce[i] = (uint8_t)i;
		snprintf(m.id, sizeof(m.id), "sidecar-a");
		snprintf(m.key_id, sizeof(m.key_id), "fz1");
		memset(m.proof, 0x5a, sizeof(m.proof));
		memset(m.token, 0x33, sizeof(m.token));
		m.xfer_id = 0x1122334455667788ull;
		m.peer_kind = 1;
		m.total = 1 << 20;
		m.desc = 2;
		m.offset = 4096;
		m.len = 65536;
		m.code = 5;
		snprintf(m.text, sizeof(m.text), "peer said no");
		m.cookie = 42;
		m.opaque = opaque;
		m.opaque_len = sizeof(opaque);
		/* READV / WRITEV: three pieces, as a KV-cache batch sends them */
		static const struct sc_peer_piece pieces[3] = {
		    {.desc = 0, .offset = 0, .len = 32768},
		    {.desc = 63, .offset = 1u << 20, .len = 32768},
		    {.desc = 16383, .offset = 5, .len = 4093}};
		m.piece_list = pieces;
		m.n_pieces = 3;
		if (type == SC_FRAME_OPEN)
			m.flags = SC_PEER_FLAG_VIA_BACKEND;
		size_t n = sc_peer_encode(&m, buf, sizeof(buf));
		if (n == 0) {
			fprintf(stderr, "cannot encode a %s seed\n", sc_frame_type_name(type));
			return 1;
		}
		write_seed(0, buf, n);
		if (type == SC_FRAME_OPEN) { /* and with its trace id extension */
			snprintf(m.trace_id, sizeof(m.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
			n = sc_peer_encode(&m, buf, sizeof(buf));
			if (n == 0) {
				fprintf(stderr, "cannot encode an OPEN seed with a trace id\n");
				return 1;
			}
			write_seed(0, buf, n);
		}
	}
	capture_hello();
	printf("%d seeds in %s\n", seed_n, seed_dir);
	return 0;
}

#endif
