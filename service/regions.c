/* SPDX-License-Identifier: Apache-2.0 */
/*
 * regions.c: the region RPCs: CreateRegion, RegisterRegion, DeregisterRegion, ListRegions, and the
 * byte streams WriteRegion (client stream) and ReadRegion (server stream, flow-controlled: the
 * next chunk is read from the region only when the previous one has been sent). gRPC worker
 * threads.
 */
#include "handlers.h"
#include "paging.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_CHUNK (1u << 20)

static void reply_region(struct sc_call *c, const struct sc_region_info *info)
{
	RdmaSidecar__V1__Region m;
	sc_pb_region_fill(&m, info);
	sc_call_reply(c, &m.base);
}

void sc_h_create_region(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__CreateRegionRequest *r = (RdmaSidecar__V1__CreateRegionRequest *)req;
	struct sc_region_info info;
	struct sc_err err;
	sc_err_clear(&err);
	if (r->device_kind == RDMA_SIDECAR__V1__DEVICE_KIND__DEVICE_KIND_CUDA &&
	    sc_region_gpu_by_uuid(sc_call_engine(c), r->device_uuid, &r->device_index, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	if (sc_region_create(sc_call_engine(c), r->size, (enum sc_device_kind)r->device_kind,
			     r->device_index, r->name, &info, &err) != 0)
		sc_call_fail_err(c, &err);
	else
		reply_region(c, &info);
}

void sc_h_register_region(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__RegisterRegionRequest *r = (RdmaSidecar__V1__RegisterRegionRequest *)req;
	struct sc_region_info info;
	struct sc_err err;
	sc_err_clear(&err);
	switch (r->source_case) {
	case RDMA_SIDECAR__V1__REGISTER_REGION_REQUEST__SOURCE_HOST_FILE:
		if (sc_region_register_host(sc_call_engine(c), r->host_file->path,
					    r->host_file->offset, r->host_file->size, r->name, &info,
					    &err) != 0)
			sc_call_fail_err(c, &err);
		else
			reply_region(c, &info);
		return;
	case RDMA_SIDECAR__V1__REGISTER_REGION_REQUEST__SOURCE_CUDA_IPC: {
		RdmaSidecar__V1__CudaIpcSource *src = r->cuda_ipc;
		if (sc_region_gpu_by_uuid(sc_call_engine(c), src->device_uuid, &src->device_index,
					  &err) != 0) {
			sc_call_fail_err(c, &err);
			return;
		}
		if (sc_region_register_cuda_ipc(sc_call_engine(c), src->device_index,
						src->handle.data, src->handle.len, src->offset,
						src->size, r->name, &info, &err) != 0)
			sc_call_fail_err(c, &err);
		else
			reply_region(c, &info);
		return;
	}
	case RDMA_SIDECAR__V1__REGISTER_REGION_REQUEST__SOURCE_CUDA_FD: {
		RdmaSidecar__V1__CudaFdSource *src = r->cuda_fd;
		if (sc_region_gpu_by_uuid(sc_call_engine(c), src->device_uuid, &src->device_index,
					  &err) != 0) {
			sc_call_fail_err(c, &err);
			return;
		}
		if (sc_region_register_cuda_fd(sc_call_engine(c), src->device_index, src->pid,
					       src->fd, src->offset, src->size,
					       src->allocation_size, src->gpudirect_rdma_capable,
					       r->name, &info, &err) != 0)
			sc_call_fail_err(c, &err);
		else
			reply_region(c, &info);
		return;
	}
	default:
		sc_call_fail(c, SC_INVALID_ARGUMENT,
			     "set one source: host_file, cuda_ipc or cuda_fd");
		return;
	}
}

void sc_h_deregister_region(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__DeregisterRegionRequest *r =
		(RdmaSidecar__V1__DeregisterRegionRequest *)req;
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_region_deregister(sc_call_engine(c), r->region_id, r->force, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__DeregisterRegionResponse m = RDMA_SIDECAR__V1__DEREGISTER_REGION_RESPONSE__INIT;
	sc_call_reply(c, &m.base);
}

void sc_h_list_regions(struct sc_call *c, ProtobufCMessage *req)
{
	const RdmaSidecar__V1__ListRegionsRequest *r = (const void *)req;
	struct sc_region_info *infos = NULL;
	size_t n = 0;
	bool more = false;
	char none[1] = "";
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_page_token_check(r->page_token, &err) != 0 ||
	    sc_region_list_page(sc_call_engine(c), r->page_token, sc_page_size(r->page_size), &infos,
				&n, &more, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__Region *regs = calloc(n ? n : 1, sizeof(*regs));
	RdmaSidecar__V1__Region **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
	if (!regs || !ptrs) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
	} else {
		for (size_t i = 0; i < n; i++) {
			sc_pb_region_fill(&regs[i], &infos[i]);
			ptrs[i] = &regs[i];
		}
		RdmaSidecar__V1__ListRegionsResponse m = RDMA_SIDECAR__V1__LIST_REGIONS_RESPONSE__INIT;
		m.n_regions = n;
		m.regions = ptrs;
		m.next_page_token = more && n ? infos[n - 1].id : none;
		sc_call_reply(c, &m.base);
	}
	free(regs);
	free(ptrs);
	free(infos);
}

/* ---- WriteRegion: a client stream ------------------------------------------------------------ */

struct write_state {
	char region_id[SC_ID_MAX];
	uint64_t written;
};

static void write_next(struct sc_call *c, ProtobufCMessage *msg, bool end)
{
	struct write_state *st = sc_call_state(c);
	if (end) {
		if (sc_call_is_cancelled(c)) {
			sc_call_finish(c, SC_CANCELLED, "client cancelled the stream");
			return;
		}
		if (!st->region_id[0]) {
			sc_call_fail(c, SC_INVALID_ARGUMENT,
				     "empty stream: the first message must name region_id");
			return;
		}
		RdmaSidecar__V1__WriteRegionResponse m = RDMA_SIDECAR__V1__WRITE_REGION_RESPONSE__INIT;
		m.bytes_written = st->written;
		sc_call_reply(c, &m.base);
		return;
	}
	RdmaSidecar__V1__WriteRegionRequest *r = (RdmaSidecar__V1__WriteRegionRequest *)msg;
	if (r->region_id && r->region_id[0]) {
		if (st->region_id[0] && strcmp(st->region_id, r->region_id) != 0) {
			sc_call_fail(c, SC_INVALID_ARGUMENT,
				     "one WriteRegion stream writes one region: open another stream "
				     "for another region");
			return;
		}
		if (strlen(r->region_id) >= sizeof(st->region_id)) {
			sc_call_fail(c, SC_NOT_FOUND, "no such region (id too long)");
			return;
		}
		strcpy(st->region_id, r->region_id);
	}
	if (!st->region_id[0]) {
		sc_call_fail(c, SC_INVALID_ARGUMENT, "the first message must name region_id");
		return;
	}
	struct sc_err err;
	sc_err_clear(&err);
	if (r->data.len && sc_region_write(sc_call_engine(c), st->region_id, r->offset,
					   r->data.data, r->data.len, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	st->written += r->data.len;
	sc_call_recv(c, &rdma_sidecar__v1__write_region_request__descriptor, write_next);
}

void sc_h_write_region(struct sc_call *c, ProtobufCMessage *req)
{
	struct write_state *st = calloc(1, sizeof(*st));
	if (!st) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	sc_call_set_state(c, st, free);
	sc_call_recv(c, &rdma_sidecar__v1__write_region_request__descriptor, write_next);
}

/* ---- ReadRegion: a flow-controlled server stream --------------------------------------------- */

struct read_state {
	char region_id[SC_ID_MAX];
	uint64_t offset;
	uint64_t end;
	uint8_t *buf;
};

static void read_state_free(void *p)
{
	struct read_state *st = p;
	free(st->buf);
	free(st);
}

static void read_more(struct sc_call *c)
{
	struct read_state *st = sc_call_state(c);
	if (sc_call_is_cancelled(c)) {
		sc_call_finish(c, SC_CANCELLED, "client cancelled the stream");
		return;
	}
	if (st->offset >= st->end) {
		sc_call_finish(c, SC_OK, NULL);
		return;
	}
	uint64_t n = st->end - st->offset < READ_CHUNK ? st->end - st->offset : READ_CHUNK;
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_region_read(sc_call_engine(c), st->region_id, st->offset, st->buf, n, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__ReadRegionResponse m = RDMA_SIDECAR__V1__READ_REGION_RESPONSE__INIT;
	m.offset = st->offset;
	m.data.data = st->buf;
	m.data.len = n;
	st->offset += n;
	sc_call_send(c, &m.base); /* packed at once: buf can be reused after */
}

void sc_h_read_region(struct sc_call *c, ProtobufCMessage *req)
{
	RdmaSidecar__V1__ReadRegionRequest *r = (RdmaSidecar__V1__ReadRegionRequest *)req;
	struct sc_region_info info;
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_region_get(sc_call_engine(c), r->region_id, &info, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	uint64_t length = r->length ? r->length : (r->offset < info.size ? info.size - r->offset : 0);
	if (r->offset > info.size || length > info.size - r->offset) {
		char msg[200];
		snprintf(msg, sizeof(msg),
			 "range [%" PRIu64 ", +%" PRIu64 ") is outside region %s (%" PRIu64 " bytes)",
			 r->offset, length, info.id, info.size);
		sc_call_fail(c, SC_INVALID_ARGUMENT, msg);
		return;
	}
	struct read_state *st = calloc(1, sizeof(*st));
	if (st)
		st->buf = malloc(READ_CHUNK);
	if (!st || !st->buf) {
		if (st)
			free(st);
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	snprintf(st->region_id, sizeof(st->region_id), "%s", info.id);
	st->offset = r->offset;
	st->end = r->offset + length;
	sc_call_set_state(c, st, read_state_free);
	sc_call_on_drained(c, read_more);
	read_more(c);
}
