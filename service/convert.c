/* SPDX-License-Identifier: Apache-2.0 */
/*
 * convert.c: engine snapshots <-> protobuf-c messages. Filled messages point into the snapshot's
 * strings (no copies); only the arrays and sub-messages allocated here are freed by the *_clear
 * functions. Pure; any thread.
 */
#include "handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *s(const char *text)
{
	return (char *)(text ? text : "");
}

void sc_pb_op_fill(struct sc_pb_op *p, const struct sc_op_info *info)
{
	memset(p, 0, sizeof(*p));
	RdmaSidecar__V1__Operation *m = &p->msg;
	rdma_sidecar__v1__operation__init(m);
	m->operation_id = s(info->id);
	m->kind = (RdmaSidecar__V1__OperationKind)info->kind;
	m->status = (RdmaSidecar__V1__OperationStatus)info->status;
	m->backend = (RdmaSidecar__V1__Backend)info->backend;
	m->bytes_total = info->bytes_total;
	m->bytes_done = info->bytes_done;
	m->metadata = s(info->metadata);
	m->peer = s(info->peer);
	m->created_unix_ms = info->created_unix_ms;
	m->deadline_unix_ms = info->deadline_unix_ms;
	m->completed_unix_ms = info->completed_unix_ms;
	m->request_id = s(info->request_id);
	m->trace_id = s(info->trace_id);
	m->backend_reason = s(info->backend_reason);
	m->uses_left = info->uses_left;
	m->uses_done = info->uses_done;
	m->bytes_served = info->bytes_served;
	m->committed = info->committed;
	m->descriptor_count = (uint32_t)info->desc_count;
	if (info->err_code != SC_OK || info->err_msg[0]) {
		rdma_sidecar__v1__operation_error__init(&p->error);
		p->error.code = (int32_t)info->err_code;
		p->error.message = s(info->err_msg);
		m->error = &p->error;
	}
	for (size_t i = 0; i < info->n_rails && i < SC_MAX_RAILS; i++) {
		rdma_sidecar__v1__rail_usage__init(&p->rails[i]);
		p->rails[i].rail = s(info->rails[i].rail);
		p->rails[i].bytes = info->rails[i].bytes;
		p->rail_ptrs[i] = &p->rails[i];
		m->n_rails = i + 1;
	}
	m->rails = m->n_rails ? p->rail_ptrs : NULL;
	if (info->n_descs) {
		p->descs = calloc(info->n_descs, sizeof(*p->descs));
		p->desc_ptrs = calloc(info->n_descs, sizeof(*p->desc_ptrs));
		if (p->descs && p->desc_ptrs) {
			for (size_t i = 0; i < info->n_descs; i++) {
				rdma_sidecar__v1__descriptor__init(&p->descs[i]);
				p->descs[i].region_id = s(info->descs[i].region_id);
				p->descs[i].offset = info->descs[i].offset;
				p->descs[i].length = info->descs[i].length;
				p->desc_ptrs[i] = &p->descs[i];
			}
			m->n_descriptors = info->n_descs;
			m->descriptors = p->desc_ptrs;
		}
	}
}

void sc_pb_op_clear(struct sc_pb_op *p)
{
	free(p->descs);
	free(p->desc_ptrs);
	p->descs = NULL;
	p->desc_ptrs = NULL;
}

void sc_pb_region_fill(RdmaSidecar__V1__Region *m, const struct sc_region_info *info)
{
	rdma_sidecar__v1__region__init(m);
	m->region_id = s(info->id);
	m->device_kind = (RdmaSidecar__V1__DeviceKind)info->kind;
	m->device_index = info->device_index;
	m->size = info->size;
	m->path = s(info->path);
	m->name = s(info->name);
	m->file_offset = info->file_offset;
	m->live_operations = info->live_ops;
	if (info->has_cuda_ipc_handle) {
		m->cuda_ipc_handle.data = (uint8_t *)info->cuda_ipc_handle;
		m->cuda_ipc_handle.len = sizeof(info->cuda_ipc_handle);
	}
	m->gpudirect_rdma_capable = info->gdr_capable;
	m->gpu_path = s(info->gpu_path);
}

int sc_pb_descs(RdmaSidecar__V1__Descriptor **in, size_t n, struct sc_desc **out,
		struct sc_err *err)
{
	struct sc_desc *d = calloc(n ? n : 1, sizeof(*d));
	if (!d)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const char *id = in[i]->region_id ? in[i]->region_id : "";
		if (!id[0] || strlen(id) >= sizeof(d[i].region_id)) {
			free(d);
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor %zu: region_id must be 1..%zu characters", i,
					  sizeof(d[i].region_id) - 1);
		}
		snprintf(d[i].region_id, sizeof(d[i].region_id), "%s", id);
		d[i].offset = in[i]->offset;
		d[i].length = in[i]->length;
	}
	*out = d;
	return 0;
}
