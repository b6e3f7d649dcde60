/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/stage.h: GPU memory on the peer channel. The TCP data plane cannot send from or receive
 * into GPU memory, so these move a GPU range through a stager (gpu/gpu.h): device -> pinned buffer
 * -> socket, and socket -> pinned buffer -> device, the copy of one piece overlapping the network
 * I/O of the other. Used by the serving side (peer/serve.c) and the requesting side
 * (peer/pool.c) alike; lists of pieces travel packed, many per pinned buffer. Any thread (the
 * connection's); blocking with the given wait.
 */
#ifndef SC_PEER_STAGE_H
#define SC_PEER_STAGE_H

#include "gpu/gpu.h"
#include "peer/proto.h"

/* Send len bytes of GPU memory (device dev) on fd. On failure err is filled (network errors as
 * sc_peer_io_err, driver errors with the CUDA call) and *io (optional) says whether the socket
 * failed (anything but SC_PEER_IO_OK: the connection is unusable). */
int sc_peer_send_gpu(struct sc_gpu *g, int dev, int fd, const uint8_t *src, uint64_t len,
		     const struct sc_peer_wait *w, const char *what, enum sc_peer_io *io,
		     struct sc_err *err);
/* Receive len bytes from fd into GPU memory; returns once every byte is in GPU memory. */
int sc_peer_recv_gpu(struct sc_gpu *g, int dev, int fd, uint8_t *dst, uint64_t len,
		     const struct sc_peer_wait *w, const char *what, enum sc_peer_io *io,
		     struct sc_err *err);
/* The same for a list of pieces taken in order as one stream of bytes (READV, WRITEV): GPU pieces
 * (all on device dev) and host pieces packed together into each pinned buffer, the GPU ones copied
 * in one batch per buffer. */
int sc_peer_send_pieces_gpu(struct sc_gpu *g, int dev, int fd, const struct sc_stage_piece *p,
			    size_t n, const struct sc_peer_wait *w, const char *what,
			    enum sc_peer_io *io, struct sc_err *err);
int sc_peer_recv_pieces_gpu(struct sc_gpu *g, int dev, int fd, const struct sc_stage_piece *p,
			    size_t n, const struct sc_peer_wait *w, const char *what,
			    enum sc_peer_io *io, struct sc_err *err);

#endif
