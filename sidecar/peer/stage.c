/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/stage.c: GPU ranges on the peer channel, staged through pinned host buffers (see
 * peer/stage.h). Runs on the thread of the connection that moves the bytes; holds a stager from
 * the GPU's pool for the duration of one call.
 */
#include "peer/stage.h"

#include <sys/uio.h>

struct stage_io {
	int fd;
	const struct sc_peer_wait *w;
	const char *what;
	enum sc_peer_io rc;
};

static int stage_send(void *ctx, uint8_t *buf, size_t n, struct sc_err *err)
{
	struct stage_io *io = ctx;
	struct iovec iov = {.iov_base = buf, .iov_len = n};
	int e = 0;
	io->rc = sc_peer_sendv_all(io->fd, &iov, 1, io->w, NULL, &e);
	return io->rc == SC_PEER_IO_OK ? 0 : sc_peer_io_err(io->rc, e, io->what, err);
}

static int stage_recv(void *ctx, uint8_t *buf, size_t n, struct sc_err *err)
{
	struct stage_io *io = ctx;
	int e = 0;
	io->rc = sc_peer_recv_all(io->fd, buf, n, io->w, NULL, &e);
	return io->rc == SC_PEER_IO_OK ? 0 : sc_peer_io_err(io->rc, e, io->what, err);
}

/* A list of pieces (host memory, or GPU dev's), packed into the pinned buffers (gpu/gpu.h). */
static int run_pieces(struct sc_gpu *g, int dev, int fd, const struct sc_stage_piece *p, size_t n,
		      bool send, const struct sc_peer_wait *w, const char *what,
		      enum sc_peer_io *io_out, struct sc_err *err)
{
	struct stage_io io = {.fd = fd, .w = w, .what = what, .rc = SC_PEER_IO_OK};
	struct sc_stager *s;
	int rc = sc_stager_get(g, dev, &s, err);
	if (rc == 0) {
		rc = send ? sc_stager_send_pieces(s, p, n, stage_send, &io, err)
			  : sc_stager_recv_pieces(s, p, n, stage_recv, &io, err);
		sc_stager_put(g, s);
	}
	if (io_out)
		*io_out = io.rc;
	return rc;
}

int sc_peer_send_gpu(struct sc_gpu *g, int dev, int fd, const uint8_t *src, uint64_t len,
		     const struct sc_peer_wait *w, const char *what, enum sc_peer_io *io,
		     struct sc_err *err)
{
	struct sc_stage_piece p = {.addr = (uint8_t *)src, .len = len, .gpu = dev};
	return run_pieces(g, dev, fd, &p, 1, true, w, what, io, err);
}

int sc_peer_recv_gpu(struct sc_gpu *g, int dev, int fd, uint8_t *dst, uint64_t len,
		     const struct sc_peer_wait *w, const char *what, enum sc_peer_io *io,
		     struct sc_err *err)
{
	struct sc_stage_piece p = {.addr = dst, .len = len, .gpu = dev};
	return run_pieces(g, dev, fd, &p, 1, false, w, what, io, err);
}

int sc_peer_send_pieces_gpu(struct sc_gpu *g, int dev, int fd, const struct sc_stage_piece *p,
			    size_t n, const struct sc_peer_wait *w, const char *what,
			    enum sc_peer_io *io, struct sc_err *err)
{
	return run_pieces(g, dev, fd, p, n, true, w, what, io, err);
}

int sc_peer_recv_pieces_gpu(struct sc_gpu *g, int dev, int fd, const struct sc_stage_piece *p,
			    size_t n, const struct sc_peer_wait *w, const char *what,
			    enum sc_peer_io *io, struct sc_err *err)
{
	return run_pieces(g, dev, fd, p, n, false, w, what, io, err);
}
