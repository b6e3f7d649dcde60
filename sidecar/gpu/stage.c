/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu/stage.c: staging of GPU memory through pinned host buffers, wherever the NIC or the CPU
 * cannot touch GPU memory itself (the TCP data plane, ibverbs without dma-buf or nvidia_peermem,
 * WriteRegion/ReadRegion, LOCAL copies between host and GPU).
 *
 * A stager is one CUDA stream of the sidecar's own and two pinned buffers of SC_GPU_STAGE_BYTES,
 * each with an event marking the end of its last copy: sending copies piece k+1 device-to-host
 * while piece k goes to the network; receiving waits for every host-to-device copy before it
 * returns, so COMPLETE means the bytes are in GPU memory (never waiting on the worker's streams).
 * Lists of pieces are packed: a buffer's pieces go in one cuMemcpyBatchAsync where the driver has
 * it (CUDA 12.8+).
 *
 * Threads: any thread; a stager belongs to one thread between get and put. The pools (one per
 * device, under g->mu) keep stagers until sc_gpu_close, which frees them through the hook
 * (g->free_stager) this file sets when it pools its first stager.
 */
#include "build_config.h"
#include "gpu/gpu.h"

#if SC_HAVE_CUDA_H

#include "os/fault_guard.h"
#include "gpu/internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STAGERS_PER_DEVICE 64

/* Free a stager that is not in a pool; also sc_gpu_close's hook for the pooled ones. */
static void stager_free(struct sc_gpu *g, struct sc_stager *s)
{
	for (int b = 0; b < 2; b++) {
		if (s->buf[b])
			g->cu.cuMemFreeHost(s->buf[b]);
		if (s->done[b])
			g->cu.cuEventDestroy(s->done[b]);
	}
	if (s->stream)
		g->cu.cuStreamDestroy(s->stream);
	free(s->bdst);
	free(s->bsrc);
	free(s->bsize);
	free(s);
}

static int stager_new(struct sc_gpu *g, int device, struct sc_stager **out, struct sc_err *err)
{
	struct sc_stager *s = calloc(1, sizeof(*s));
	if (!s)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	s->g = g;
	s->device = device;
	CUresult rc = g->cu.cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING);
	const char *call = "cuStreamCreate";
	for (int b = 0; rc == CUDA_SUCCESS && b < 2; b++) {
		call = "cuMemHostAlloc";
		rc = g->cu.cuMemHostAlloc((void **)&s->buf[b], SC_GPU_STAGE_BYTES, 0);
		if (rc == CUDA_SUCCESS) {
			call = "cuEventCreate";
			/* BLOCKING_SYNC: a waiting thread sleeps instead of spinning a core (up
			 * to 64 stagers per GPU wait at once). */
			rc = g->cu.cuEventCreate(&s->done[b],
						 CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
		}
	}
	if (rc != CUDA_SUCCESS) {
		stager_free(g, s);
		return sc_gpu_fail(g, rc, call, err);
	}
	*out = s;
	return 0;
}

int sc_stager_get(struct sc_gpu *g, int device, struct sc_stager **out, struct sc_err *err)
{
	if (sc_gpu_use(g, device, err) != 0)
		return -1;
	struct sc_gpu_dev *d = &g->dev[device];
	pthread_mutex_lock(&g->mu);
	struct sc_stager *s = d->free_stagers;
	if (s) {
		d->free_stagers = s->next;
	} else if (d->n_stagers >= MAX_STAGERS_PER_DEVICE) {
		pthread_mutex_unlock(&g->mu);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "all %d staging buffers of GPU %d are in use: retry later",
				  MAX_STAGERS_PER_DEVICE, device);
	} else {
		d->n_stagers++;
	}
	pthread_mutex_unlock(&g->mu);
	if (!s && stager_new(g, device, &s, err) != 0) {
		pthread_mutex_lock(&g->mu);
		d->n_stagers--;
		pthread_mutex_unlock(&g->mu);
		return -1;
	}
	s->pending[0] = s->pending[1] = false;
	s->next = NULL;
	*out = s;
	return 0;
}

void sc_stager_put(struct sc_gpu *g, struct sc_stager *s)
{
	if (!s)
		return;
	struct sc_err err;
	/* Never hand out a stager with copies still running: they would race the next user. */
	if (sc_gpu_use(g, s->device, &err) != 0 ||
	    g->cu.cuStreamSynchronize(s->stream) != CUDA_SUCCESS) {
		pthread_mutex_lock(&g->mu);
		g->dev[s->device].n_stagers--;
		pthread_mutex_unlock(&g->mu);
		stager_free(g, s);
		return;
	}
	pthread_mutex_lock(&g->mu);
	g->free_stager = stager_free;
	s->next = g->dev[s->device].free_stagers;
	g->dev[s->device].free_stagers = s;
	pthread_mutex_unlock(&g->mu);
}

/* Wait for the last copy that used buffer b. */
static int wait_buf(struct sc_stager *s, int b, struct sc_err *err)
{
	if (!s->pending[b])
		return 0;
	s->pending[b] = false;
	CUresult rc = s->g->cu.cuEventSynchronize(s->done[b]);
	return rc == CUDA_SUCCESS ? 0 : sc_gpu_fail(s->g, rc, "cuEventSynchronize", err);
}

static int record(struct sc_stager *s, int b, CUresult rc, const char *call, struct sc_err *err)
{
	if (rc == CUDA_SUCCESS)
		rc = s->g->cu.cuEventRecord(s->done[b], s->stream);
	if (rc != CUDA_SUCCESS)
		return sc_gpu_fail(s->g, rc, call, err);
	s->pending[b] = true;
	return 0;
}

/* Drain the stream before an error return, so no copy touches the buffers afterwards. */
static int stop(struct sc_stager *s)
{
	s->g->cu.cuStreamSynchronize(s->stream);
	s->pending[0] = s->pending[1] = false;
	return -1;
}

/* ---- lists of pieces ------------------------------------------------------------------------- */

static int batch_add(struct sc_stager *s, CUdeviceptr dst, CUdeviceptr src, size_t n,
		     struct sc_err *err)
{
	if (s->bn == s->bcap) {
		size_t cap = s->bcap ? 2 * s->bcap : 256;
		CUdeviceptr *d = realloc(s->bdst, cap * sizeof(*d));
		if (d)
			s->bdst = d;
		CUdeviceptr *sr = d ? realloc(s->bsrc, cap * sizeof(*sr)) : NULL;
		if (sr)
			s->bsrc = sr;
		size_t *z = sr ? realloc(s->bsize, cap * sizeof(*z)) : NULL;
		if (!z)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory staging pieces");
		s->bsize = z;
		s->bcap = cap;
	}
	/* A piece that continues the previous one on both sides joins it. */
	if (s->bn && s->bdst[s->bn - 1] + s->bsize[s->bn - 1] == dst &&
	    s->bsrc[s->bn - 1] + s->bsize[s->bn - 1] == src) {
		s->bsize[s->bn - 1] += n;
		return 0;
	}
	s->bdst[s->bn] = dst;
	s->bsrc[s->bn] = src;
	s->bsize[s->bn] = n;
	s->bn++;
	return 0;
}

/* Issue the batched copies into or out of buffer b (one driver call where the driver batches)
 * and record b's event behind them. to_dev: host-to-device. */
static int batch_flush(struct sc_stager *s, int b, bool to_dev, struct sc_err *err)
{
	struct sc_cu *cu = &s->g->cu;
	CUresult rc = CUDA_SUCCESS;
	const char *call = "cuMemcpyBatchAsync";
	if (s->bn > 1 && (cu->memcpy_batch_13 || cu->memcpy_batch_12)) {
		/* Sources are read in stream order: the pinned buffer was filled before the call,
		 * device memory belongs to the region. */
		CUmemcpyAttributes attr;
		memset(&attr, 0, sizeof(attr));
		attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		attr.srcLocHint.type = to_dev ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
		attr.srcLocHint.id = to_dev ? 0 : s->device;
		attr.dstLocHint.type = to_dev ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
		attr.dstLocHint.id = to_dev ? s->device : 0;
		size_t idx = 0, fail_idx = SIZE_MAX;
		rc = cu->memcpy_batch_13
			 ? cu->memcpy_batch_13(s->bdst, s->bsrc, s->bsize, s->bn, &attr, &idx, 1,
					       s->stream)
			 : cu->memcpy_batch_12(s->bdst, s->bsrc, s->bsize, s->bn, &attr, &idx, 1,
					       &fail_idx, s->stream);
	} else {
		call = to_dev ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
		for (size_t i = 0; rc == CUDA_SUCCESS && i < s->bn; i++)
			rc = to_dev ? cu->cuMemcpyHtoDAsync(s->bdst[i],
							    (const void *)(uintptr_t)s->bsrc[i],
							    s->bsize[i], s->stream)
				    : cu->cuMemcpyDtoHAsync((void *)(uintptr_t)s->bdst[i],
							    s->bsrc[i], s->bsize[i], s->stream);
	}
	s->bn = 0;
	return record(s, b, rc, call, err);
}

struct cursor {
	const struct sc_stage_piece *p;
	size_t n, i;
	uint64_t off;
};

/* Walk the next `want` bytes of the list between buffer b at `at` and the pieces: GPU pieces
 * into the batch, host pieces copied at once (guarded: a region file a worker truncated). */
static int walk(struct sc_stager *s, struct cursor *c, int b, size_t want, bool to_dev,
		struct sc_err *err)
{
	size_t at = 0;
	while (at < want && c->i < c->n) {
		const struct sc_stage_piece *p = &c->p[c->i];
		uint64_t left = p->len - c->off;
		size_t take = left < want - at ? (size_t)left : want - at;
		uint8_t *mem = p->addr + c->off, *buf = s->buf[b] + at;
		int rc;
		if (p->gpu == SC_GPU_HOST)
			rc = to_dev ? sc_guarded_memcpy(mem, buf, take, err)
				    : sc_guarded_memcpy(buf, mem, take, err);
		else if (p->gpu != s->device)
			rc = sc_err_set(err, SC_INVALID_ARGUMENT,
					"piece %zu is on GPU %d, the stager on GPU %d", c->i,
					p->gpu, s->device);
		else
			rc = to_dev ? batch_add(s, (CUdeviceptr)(uintptr_t)mem,
						(CUdeviceptr)(uintptr_t)buf, take, err)
				    : batch_add(s, (CUdeviceptr)(uintptr_t)buf,
						(CUdeviceptr)(uintptr_t)mem, take, err);
		if (rc != 0) {
			s->bn = 0;
			return -1;
		}
		at += take;
		c->off += take;
		if (c->off == p->len) {
			c->i++;
			c->off = 0;
		}
	}
	return batch_flush(s, b, to_dev, err);
}

static uint64_t pieces_total(const struct sc_stage_piece *p, size_t n)
{
	uint64_t t = 0;
	for (size_t i = 0; i < n; i++)
		t += p[i].len;
	return t;
}

int sc_stager_send_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err)
{
	uint64_t len = pieces_total(p, n);
	if (len == 0)
		return 0;
	if (sc_gpu_use(s->g, s->device, err) != 0)
		return -1;
	struct cursor c = {.p = p, .n = n};
	size_t fill[2] = {len < SC_GPU_STAGE_BYTES ? (size_t)len : SC_GPU_STAGE_BYTES, 0};
	if (walk(s, &c, 0, fill[0], false, err) != 0)
		return stop(s);
	int b = 0;
	for (uint64_t off = 0; off < len; b ^= 1) {
		uint64_t next = off + fill[b];
		if (wait_buf(s, b, err) != 0)
			return stop(s);
		if (next < len) {
			fill[b ^ 1] = len - next < SC_GPU_STAGE_BYTES ? (size_t)(len - next)
								       : SC_GPU_STAGE_BYTES;
			if (walk(s, &c, b ^ 1, fill[b ^ 1], false, err) != 0)
				return stop(s);
		}
		if (fn(ctx, s->buf[b], fill[b], err) != 0)
			return stop(s);
		off = next;
	}
	return 0;
}

int sc_stager_recv_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err)
{
	uint64_t len = pieces_total(p, n);
	if (sc_gpu_use(s->g, s->device, err) != 0)
		return -1;
	struct cursor c = {.p = p, .n = n};
	int b = 0;
	for (uint64_t off = 0; off < len; b ^= 1) {
		size_t k = len - off < SC_GPU_STAGE_BYTES ? (size_t)(len - off) : SC_GPU_STAGE_BYTES;
		if (wait_buf(s, b, err) != 0 || fn(ctx, s->buf[b], k, err) != 0 ||
		    walk(s, &c, b, k, true, err) != 0)
			return stop(s);
		off += k;
	}
	if (wait_buf(s, 0, err) != 0 || wait_buf(s, 1, err) != 0)
		return stop(s);
	return 0;
}

/* ---- copies involving GPU memory ------------------------------------------------------------- */

/* Host memory may be a region file a worker truncated: guarded copies (os/fault_guard.h). */
static int to_host(void *ctx, uint8_t *buf, size_t n, struct sc_err *err)
{
	uint8_t **dst = ctx;
	if (sc_guarded_memcpy(*dst, buf, n, err) != 0)
		return -1;
	*dst += n;
	return 0;
}

static int from_host(void *ctx, uint8_t *buf, size_t n, struct sc_err *err)
{
	const uint8_t **src = ctx;
	if (sc_guarded_memcpy(buf, *src, n, err) != 0)
		return -1;
	*src += n;
	return 0;
}

int sc_gpu_copy(struct sc_gpu *g, uint8_t *dst, int dst_gpu, const uint8_t *src, int src_gpu,
		uint64_t n, struct sc_err *err)
{
	if (dst_gpu == SC_GPU_HOST && src_gpu == SC_GPU_HOST)
		return sc_guarded_memcpy(dst, src, n, err);
	int dev = src_gpu != SC_GPU_HOST ? src_gpu : dst_gpu;
	struct sc_stager *s;
	if (sc_stager_get(g, dev, &s, err) != 0)
		return -1;
	int rc;
	if (dst_gpu == SC_GPU_HOST) {
		uint8_t *cursor = dst;
		struct sc_stage_piece p = {.addr = (uint8_t *)src, .len = n, .gpu = src_gpu};
		rc = sc_stager_send_pieces(s, &p, 1, to_host, &cursor, err);
	} else if (src_gpu == SC_GPU_HOST) {
		const uint8_t *cursor = src;
		struct sc_stage_piece p = {.addr = dst, .len = n, .gpu = dst_gpu};
		rc = sc_stager_recv_pieces(s, &p, 1, from_host, &cursor, err);
	} else {
		CUresult cr;
		const char *call;
		if (src_gpu == dst_gpu) {
			call = "cuMemcpyDtoDAsync";
			cr = g->cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst,
						     (CUdeviceptr)(uintptr_t)src, n, s->stream);
		} else {
			call = "cuMemcpyPeerAsync";
			cr = g->cu.cuMemcpyPeerAsync((CUdeviceptr)(uintptr_t)dst,
						     g->dev[dst_gpu].ctx,
						     (CUdeviceptr)(uintptr_t)src,
						     g->dev[src_gpu].ctx, n, s->stream);
		}
		if (cr == CUDA_SUCCESS) {
			call = "cuEventRecord";
			cr = g->cu.cuEventRecord(s->done[0], s->stream);
		}
		if (cr == CUDA_SUCCESS) {
			call = "cuEventSynchronize"; /* a blocking-sync event: sleeps, no spinning */
			cr = g->cu.cuEventSynchronize(s->done[0]);
		}
		rc = cr == CUDA_SUCCESS ? 0 : sc_gpu_fail(g, cr, call, err);
	}
	sc_stager_put(g, s);
	return rc;
}

#endif
