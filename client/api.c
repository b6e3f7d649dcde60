/* SPDX-License-Identifier: Apache-2.0 */
/*
 * api.c: one function per RPC of the Sidecar service (and Health/Check). Builds the protobuf-c
 * request from C arguments, runs it through call.c and copies the answer into the library's own
 * C structs, which then own every string and array (freed by the rsc_*_clear functions). Also
 * the region mapping helpers and the local decoding of "rsm1." metadata lengths. Runs on the
 * calling thread; no state of its own.
 */
#include "internal.h"

#include "grpc/health/v1/health.pb-c.h"
#include "rdma_sidecar/v1/sidecar.pb-c.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define M(name) "/rdma_sidecar.v1.Sidecar/" name
#define PBM(x) ((const ProtobufCMessage *)(x))
#define WRITE_CHUNK (1u << 20)

/* ---- names ------------------------------------------------------------------------------------
 */

const char *rsc_op_kind_name(int kind)
{
	static const char *const names[] = {"unspecified", "readable", "writable", "read", "write"};
	return kind >= 0 && kind <= 4 ? names[kind] : "unknown";
}

const char *rsc_op_status_name(int status)
{
	static const char *const names[] = {"unspecified", "initialized", "in_progress", "complete",
					    "cancelled",   "errored",	  "scheduled"};
	return status >= 0 && status <= 6 ? names[status] : "unknown";
}

/* Backend names come from the proto's enum (BACKEND_TCP -> "tcp"), lower-cased once. */
#define BACKEND_NAMES_MAX 16
static char backend_names[BACKEND_NAMES_MAX][32];
static pthread_once_t backend_names_once = PTHREAD_ONCE_INIT;

static void backend_names_init(void)
{
	const ProtobufCEnumDescriptor *d = &rdma_sidecar__v1__backend__descriptor;
	for (unsigned i = 0; i < d->n_values; i++) {
		int v = d->values[i].value;
		const char *n = d->values[i].name;
		if (v < 0 || v >= BACKEND_NAMES_MAX)
			continue;
		if (strncmp(n, "BACKEND_", 8) == 0)
			n += 8;
		size_t k = 0;
		for (; n[k] && k + 1 < sizeof(backend_names[0]); k++)
			backend_names[v][k] = (char)tolower((unsigned char)n[k]);
		backend_names[v][k] = '\0';
	}
}

const char *rsc_backend_name(int backend)
{
	pthread_once(&backend_names_once, backend_names_init);
	return backend >= 0 && backend < BACKEND_NAMES_MAX && backend_names[backend][0]
		   ? backend_names[backend]
		   : "unknown";
}

int rsc_op_status_terminal(int status)
{
	return status == RSC_STATUS_COMPLETE || status == RSC_STATUS_CANCELLED ||
	       status == RSC_STATUS_ERRORED;
}

/* ---- copies -----------------------------------------------------------------------------------
 */

static char *sdup(const char *s)
{
	return strdup(s ? s : "");
}

static char *pbs(const char *s)
{
	return (char *)(s ? s : "");
}

static void free_strv(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

static char **dup_strv(char **v, size_t n)
{
	char **out = calloc(n ? n : 1, sizeof(*out));
	for (size_t i = 0; out && i < n; i++)
		out[i] = sdup(v[i]);
	return out;
}

static void region_from(rsc_region *r, const RdmaSidecar__V1__Region *m)
{
	memset(r, 0, sizeof(*r));
	r->region_id = sdup(m->region_id);
	r->device_kind = m->device_kind;
	r->device_index = m->device_index;
	r->size = m->size;
	r->path = sdup(m->path);
	r->file_offset = m->file_offset;
	r->name = sdup(m->name);
	r->live_operations = m->live_operations;
}

void rsc_region_clear(rsc_region *r)
{
	if (!r)
		return;
	free(r->region_id);
	free(r->path);
	free(r->name);
	memset(r, 0, sizeof(*r));
}

void rsc_region_list_clear(rsc_region_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; l->items && i < l->count; i++)
		rsc_region_clear(&l->items[i]);
	free(l->items);
	memset(l, 0, sizeof(*l));
}

static void op_from(rsc_operation *o, const RdmaSidecar__V1__Operation *m)
{
	memset(o, 0, sizeof(*o));
	o->operation_id = sdup(m->operation_id);
	o->kind = m->kind;
	o->status = m->status;
	o->backend = m->backend;
	o->bytes_total = m->bytes_total;
	o->bytes_done = m->bytes_done;
	o->metadata = sdup(m->metadata);
	o->error_code = m->error ? m->error->code : 0;
	o->error_message = sdup(m->error ? m->error->message : "");
	o->peer = sdup(m->peer);
	o->created_unix_ms = m->created_unix_ms;
	o->deadline_unix_ms = m->deadline_unix_ms;
	o->completed_unix_ms = m->completed_unix_ms;
	o->request_id = sdup(m->request_id);
	o->backend_reason = sdup(m->backend_reason);
	o->uses_left = m->uses_left;
	o->trace_id = sdup(m->trace_id);
	o->descriptors = calloc(m->n_descriptors ? m->n_descriptors : 1, sizeof(*o->descriptors));
	if (o->descriptors) {
		o->n_descriptors = m->n_descriptors;
		for (size_t i = 0; i < m->n_descriptors; i++) {
			o->descriptors[i].region_id = sdup(m->descriptors[i]->region_id);
			o->descriptors[i].offset = m->descriptors[i]->offset;
			o->descriptors[i].length = m->descriptors[i]->length;
		}
	}
}

void rsc_operation_clear(rsc_operation *o)
{
	if (!o)
		return;
	free(o->operation_id);
	free(o->metadata);
	free(o->error_message);
	free(o->peer);
	free(o->request_id);
	free(o->backend_reason);
	free(o->trace_id);
	for (size_t i = 0; o->descriptors && i < o->n_descriptors; i++)
		free((char *)o->descriptors[i].region_id);
	free(o->descriptors);
	memset(o, 0, sizeof(*o));
}

void rsc_operation_list_clear(rsc_operation_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; l->items && i < l->count; i++)
		rsc_operation_clear(&l->items[i]);
	free(l->items);
	memset(l, 0, sizeof(*l));
}

void rsc_info_clear(rsc_info *in)
{
	if (!in)
		return;
	free(in->sidecar_id);
	free(in->version);
	for (size_t i = 0; in->backends && i < in->n_backends; i++)
		free(in->backends[i].detail);
	free(in->backends);
	free_strv(in->data_endpoints, in->n_data_endpoints);
	free(in->nats_state);
	free_strv(in->grpc_listeners, in->n_grpc_listeners);
	free(in->signing_key_id);
	free(in->cuda_detail);
	for (size_t i = 0; in->gpus && i < in->n_gpus; i++) {
		free(in->gpus[i].name);
		free(in->gpus[i].pci_bus_id);
		free(in->gpus[i].rdma_path);
	}
	free(in->gpus);
	memset(in, 0, sizeof(*in));
}

/* ---- info and health --------------------------------------------------------------------------
 */

static int get_info_call(rsc_client *c, ProtobufCMessage **resp, rsc_status *st)
{
	RdmaSidecar__V1__GetInfoRequest req = RDMA_SIDECAR__V1__GET_INFO_REQUEST__INIT;
	return rsc_call_unary(c, M("GetInfo"), PBM(&req),
			      &rdma_sidecar__v1__sidecar_info__descriptor, resp, 0, st);
}

static void info_from(rsc_info *out, const RdmaSidecar__V1__SidecarInfo *m)
{
	memset(out, 0, sizeof(*out));
	out->sidecar_id = sdup(m->sidecar_id);
	out->version = sdup(m->version);
	out->backends = calloc(m->n_backends ? m->n_backends : 1, sizeof(*out->backends));
	if (out->backends) {
		out->n_backends = m->n_backends;
		for (size_t i = 0; i < m->n_backends; i++) {
			out->backends[i].backend = m->backends[i]->backend;
			out->backends[i].available = m->backends[i]->available;
			out->backends[i].detail = sdup(m->backends[i]->detail);
		}
	}
	out->data_endpoints = dup_strv(m->data_endpoints, m->n_data_endpoints);
	out->n_data_endpoints = out->data_endpoints ? m->n_data_endpoints : 0;
	out->nats_state = sdup(m->nats_state);
	out->grpc_listeners = dup_strv(m->grpc_listeners, m->n_grpc_listeners);
	out->n_grpc_listeners = out->grpc_listeners ? m->n_grpc_listeners : 0;
	out->signing_enabled = m->signing_enabled;
	out->signing_key_id = sdup(m->signing_key_id);
	out->cuda_available = m->cuda_available;
	out->cuda_detail = sdup(m->cuda_detail);
	out->gpus = calloc(m->n_gpus ? m->n_gpus : 1, sizeof(*out->gpus));
	if (out->gpus) {
		out->n_gpus = m->n_gpus;
		for (size_t i = 0; i < m->n_gpus; i++) {
			out->gpus[i].index = m->gpus[i]->index;
			out->gpus[i].name = sdup(m->gpus[i]->name);
			out->gpus[i].pci_bus_id = sdup(m->gpus[i]->pci_bus_id);
			out->gpus[i].total_memory = m->gpus[i]->total_memory;
			out->gpus[i].rdma_path = sdup(m->gpus[i]->rdma_path);
		}
	}
}

int rsc_get_info(rsc_client *c, rsc_info *out, rsc_status *st)
{
	ProtobufCMessage *resp = NULL;
	int rc = get_info_call(c, &resp, st);
	if (rc != RSC_OK)
		return rc;
	info_from(out, (const RdmaSidecar__V1__SidecarInfo *)resp);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

static void info_rails_from(rsc_info_rails *r, const RdmaSidecar__V1__SidecarInfo *m)
{
	memset(r, 0, sizeof(*r));
	r->topology_source = sdup(m->topology_source);
	r->rails = calloc(m->n_rails ? m->n_rails : 1, sizeof(*r->rails));
	if (r->rails) {
		r->n_rails = m->n_rails;
		for (size_t i = 0; i < m->n_rails; i++) {
			const RdmaSidecar__V1__RailInfo *a = m->rails[i];
			rsc_rail_info *b = &r->rails[i];
			b->index = a->index;
			b->backend = a->backend;
			b->name = sdup(a->name);
			b->pci_address = sdup(a->pci_address);
			b->numa_node = a->numa_node;
			b->rate_mbps = a->rate_mbps;
			b->state = sdup(a->state);
			b->detail = sdup(a->detail);
			b->netdev = sdup(a->netdev);
			b->bytes = a->bytes;
			b->operations = a->operations;
			b->errors = a->errors;
			b->failovers = a->failovers;
		}
	}
	r->topology = calloc(m->n_topology ? m->n_topology : 1, sizeof(*r->topology));
	if (!r->topology)
		return;
	r->n_topology = m->n_topology;
	for (size_t i = 0; i < m->n_topology; i++) {
		const RdmaSidecar__V1__MemoryRails *a = m->topology[i];
		rsc_memory_rails *b = &r->topology[i];
		b->memory = sdup(a->memory);
		b->gpu_index = a->gpu_index;
		b->pci_address = sdup(a->pci_address);
		b->numa_node = a->numa_node;
		b->rails = calloc(a->n_rails ? a->n_rails : 1, sizeof(*b->rails));
		if (b->rails) {
			b->n_rails = a->n_rails;
			for (size_t k = 0; k < a->n_rails; k++) {
				b->rails[k].rail = sdup(a->rails[k]->rail);
				b->rails[k].distance = sdup(a->rails[k]->distance);
			}
		}
		b->chosen = dup_strv(a->chosen, a->n_chosen);
		b->n_chosen = b->chosen ? a->n_chosen : 0;
	}
}

void rsc_info_rails_clear(rsc_info_rails *r)
{
	if (!r)
		return;
	for (size_t i = 0; r->rails && i < r->n_rails; i++) {
		free(r->rails[i].name);
		free(r->rails[i].pci_address);
		free(r->rails[i].state);
		free(r->rails[i].detail);
		free(r->rails[i].netdev);
	}
	free(r->rails);
	for (size_t i = 0; r->topology && i < r->n_topology; i++) {
		rsc_memory_rails *t = &r->topology[i];
		free(t->memory);
		free(t->pci_address);
		for (size_t k = 0; t->rails && k < t->n_rails; k++) {
			free(t->rails[k].rail);
			free(t->rails[k].distance);
		}
		free(t->rails);
		free_strv(t->chosen, t->n_chosen);
	}
	free(r->topology);
	free(r->topology_source);
	memset(r, 0, sizeof(*r));
}

int rsc_get_info_rails(rsc_client *c, rsc_info *info, rsc_info_rails *rails, rsc_status *st)
{
	if (!rails)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_get_info_rails: rails is NULL");
	ProtobufCMessage *resp = NULL;
	int rc = get_info_call(c, &resp, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__SidecarInfo *m = (const void *)resp;
	if (info)
		info_from(info, m);
	info_rails_from(rails, m);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

int rsc_get_info_limits(rsc_client *c, rsc_info_limits *out, rsc_status *st)
{
	if (!out)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_get_info_limits: out is NULL");
	ProtobufCMessage *resp = NULL;
	int rc = get_info_call(c, &resp, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__SidecarInfo *m = (const void *)resp;
	memset(out, 0, sizeof(*out));
	out->open_files_limit = m->open_files_limit;
	out->memlock_limit = m->memlock_limit;
	out->memlock_needed = m->memlock_needed;
	out->memlock_enough = m->memlock_enough;
	out->memlock_detail = sdup(m->memlock_detail);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

void rsc_info_limits_clear(rsc_info_limits *out)
{
	if (!out)
		return;
	free(out->memlock_detail);
	memset(out, 0, sizeof(*out));
}

int rsc_health_check(rsc_client *c, const char *service, int *serving, rsc_status *st)
{
	Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	req.service = pbs(service);
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_unary(c, "/grpc.health.v1.Health/Check", PBM(&req),
				&grpc__health__v1__health_check_response__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	if (serving)
		*serving = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status;
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

/* ---- regions ----------------------------------------------------------------------------------
 */

static int region_call(rsc_client *c, const char *method, const ProtobufCMessage *req,
		       rsc_region *out, rsc_status *st)
{
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, method, req, &rdma_sidecar__v1__region__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	region_from(out, (const RdmaSidecar__V1__Region *)resp);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

int rsc_region_create(rsc_client *c, uint64_t size, const char *name, rsc_region *out,
		      rsc_status *st)
{
	RdmaSidecar__V1__CreateRegionRequest req = RDMA_SIDECAR__V1__CREATE_REGION_REQUEST__INIT;
	req.size = size;
	req.device_kind = RDMA_SIDECAR__V1__DEVICE_KIND__DEVICE_KIND_HOST;
	req.name = pbs(name);
	return region_call(c, M("CreateRegion"), PBM(&req), out, st);
}

int rsc_region_register_host_file(rsc_client *c, const char *path, uint64_t offset, uint64_t size,
				  const char *name, rsc_region *out, rsc_status *st)
{
	RdmaSidecar__V1__HostFileSource src = RDMA_SIDECAR__V1__HOST_FILE_SOURCE__INIT;
	RdmaSidecar__V1__RegisterRegionRequest req =
	    RDMA_SIDECAR__V1__REGISTER_REGION_REQUEST__INIT;
	if (!path || !path[0])
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"register a host file: the path is empty");
	src.path = (char *)path;
	src.offset = offset;
	src.size = size;
	req.source_case = RDMA_SIDECAR__V1__REGISTER_REGION_REQUEST__SOURCE_HOST_FILE;
	req.host_file = &src;
	req.name = pbs(name);
	return region_call(c, M("RegisterRegion"), PBM(&req), out, st);
}

int rsc_region_deregister(rsc_client *c, const char *region_id, int force, rsc_status *st)
{
	RdmaSidecar__V1__DeregisterRegionRequest req =
	    RDMA_SIDECAR__V1__DEREGISTER_REGION_REQUEST__INIT;
	req.region_id = pbs(region_id);
	req.force = force != 0;
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, M("DeregisterRegion"), PBM(&req),
			   &rdma_sidecar__v1__deregister_region_response__descriptor, &resp, 0, st);
	if (rc == RSC_OK)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}

int rsc_region_list_get(rsc_client *c, rsc_region_list *out, rsc_status *st)
{
	RdmaSidecar__V1__ListRegionsRequest req = RDMA_SIDECAR__V1__LIST_REGIONS_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_unary(c, M("ListRegions"), PBM(&req),
				&rdma_sidecar__v1__list_regions_response__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__ListRegionsResponse *m = (const void *)resp;
	memset(out, 0, sizeof(*out));
	out->items = calloc(m->n_regions ? m->n_regions : 1, sizeof(*out->items));
	if (out->items) {
		out->count = m->n_regions;
		for (size_t i = 0; i < m->n_regions; i++)
			region_from(&out->items[i], m->regions[i]);
	}
	protobuf_c_message_free_unpacked(resp, NULL);
	return out->items ? RSC_OK : rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory");
}

struct write_src {
	RdmaSidecar__V1__WriteRegionRequest msg;
	const char *region_id;
	const uint8_t *data;
	size_t len, done;
	uint64_t offset;
};

static int write_next(void *user, const ProtobufCMessage **msg, rsc_status *st)
{
	struct write_src *w = user;
	if (w->done == w->len && w->done > 0)
		return 0;
	size_t n = w->len - w->done < WRITE_CHUNK ? w->len - w->done : WRITE_CHUNK;
	rdma_sidecar__v1__write_region_request__init(&w->msg);
	w->msg.region_id = w->done == 0 ? (char *)w->region_id : (char *)"";
	w->msg.offset = w->offset + w->done;
	w->msg.data.data = (uint8_t *)w->data + w->done;
	w->msg.data.len = n;
	w->done += n;
	if (n == 0)
		w->len = w->done = 1; /* an empty write: one message, then the end */
	*msg = PBM(&w->msg);
	return 1;
}

int rsc_region_write(rsc_client *c, const char *region_id, uint64_t offset, const void *data,
		     size_t len, rsc_status *st)
{
	if (!region_id || !region_id[0] || (len && !data))
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"region write: a region id and data are needed");
	struct write_src w = {.region_id = region_id, .data = data, .len = len, .offset = offset};
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_client_stream(c, M("WriteRegion"), write_next, &w,
					&rdma_sidecar__v1__write_region_response__descriptor, &resp,
					0, st);
	if (rc != RSC_OK)
		return rc;
	uint64_t n = ((RdmaSidecar__V1__WriteRegionResponse *)resp)->bytes_written;
	protobuf_c_message_free_unpacked(resp, NULL);
	if (n != len)
		return rsc_fail(st, RSC_DATA_LOSS,
				"region write: the sidecar wrote %llu of %zu bytes",
				(unsigned long long)n, len);
	return RSC_OK;
}

struct read_dst {
	uint8_t *buf;
	size_t len, got;
	uint64_t offset;
	int bad;
};

static int read_chunk(const ProtobufCMessage *msg, void *user)
{
	const RdmaSidecar__V1__ReadRegionResponse *m = (const void *)msg;
	struct read_dst *r = user;
	if (m->offset < r->offset || m->offset - r->offset > r->len ||
	    m->data.len > r->len - (m->offset - r->offset)) {
		r->bad = 1;
		return 1;
	}
	memcpy(r->buf + (m->offset - r->offset), m->data.data, m->data.len);
	r->got += m->data.len;
	return 0;
}

int rsc_region_read(rsc_client *c, const char *region_id, uint64_t offset, void *buf, size_t len,
		    size_t *got, rsc_status *st)
{
	if (!region_id || !region_id[0] || !buf || len == 0)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"region read: a region id and a non-empty buffer are needed");
	RdmaSidecar__V1__ReadRegionRequest req = RDMA_SIDECAR__V1__READ_REGION_REQUEST__INIT;
	req.region_id = (char *)region_id;
	req.offset = offset;
	req.length = len;
	struct read_dst r = {.buf = buf, .len = len, .offset = offset};
	int stopped;
	int rc = rsc_call_server_stream(c, M("ReadRegion"), PBM(&req),
					&rdma_sidecar__v1__read_region_response__descriptor,
					read_chunk, NULL, &r, 300000, &stopped, st);
	if (got)
		*got = r.got;
	if (rc == RSC_OK && r.bad)
		return rsc_fail(
		    st, RSC_INTERNAL,
		    "region read: the sidecar sent a chunk outside the range asked for");
	return rc;
}

int rsc_region_map(const rsc_region *r, void **addr, rsc_status *st)
{
	if (!r || !r->path || !r->path[0] || r->size == 0)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"map: the region has no file (not a HOST region?)");
	long page = sysconf(_SC_PAGESIZE);
	uint64_t off = r->file_offset;
	if (page > 0 && off % (uint64_t)page)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"map: file offset %llu is not page aligned",
				(unsigned long long)off);
	int fd = open(r->path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return rsc_fail(st, RSC_FAILED_PRECONDITION,
				"map: cannot open %s: %s (is the sidecar's --shm-dir shared with "
				"this process?)",
				r->path, strerror(errno));
	void *p = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED)
		return rsc_fail(st, RSC_INTERNAL, "map: mmap of %s failed: %s", r->path,
				strerror(e));
	*addr = p;
	return rsc_ok(st);
}

void rsc_region_unmap(void *addr, uint64_t size)
{
	if (addr && size)
		munmap(addr, size);
}

/* ---- operations -------------------------------------------------------------------------------
 */

static int op_answer(int rc, ProtobufCMessage *resp, rsc_operation *out)
{
	if (rc != RSC_OK)
		return rc;
	op_from(out, (const RdmaSidecar__V1__Operation *)resp);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

/* Request descriptors: one array of messages plus one of pointers, freed by the caller. */
static int descs_to_pb(const rsc_descriptor *d, size_t n, RdmaSidecar__V1__Descriptor **msgs,
		       RdmaSidecar__V1__Descriptor ***ptrs, rsc_status *st)
{
	if (n && !d)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"descriptors missing (NULL with a count of %zu)", n);
	*msgs = calloc(n ? n : 1, sizeof(**msgs));
	*ptrs = calloc(n ? n : 1, sizeof(**ptrs));
	if (!*msgs || !*ptrs) {
		free(*msgs);
		free(*ptrs);
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		rdma_sidecar__v1__descriptor__init(&(*msgs)[i]);
		(*msgs)[i].region_id = pbs(d[i].region_id);
		(*msgs)[i].offset = d[i].offset;
		(*msgs)[i].length = d[i].length;
		(*ptrs)[i] = &(*msgs)[i];
	}
	return RSC_OK;
}

/* Compact sets as DescriptorSet messages: every array here freed with sets_free. */
struct pb_sets {
	RdmaSidecar__V1__DescriptorSet *sets;
	RdmaSidecar__V1__DescriptorSet **ptrs;
	RdmaSidecar__V1__Descriptor *descs;
	RdmaSidecar__V1__BlockList *blocks;
	RdmaSidecar__V1__StridedRun *runs;
};

static void sets_free(struct pb_sets *p)
{
	free(p->sets);
	free(p->ptrs);
	free(p->descs);
	free(p->blocks);
	free(p->runs);
}

static int sets_to_pb(const rsc_descriptor_set *in, size_t n, struct pb_sets *p, rsc_status *st)
{
	memset(p, 0, sizeof(*p));
	if (n && !in)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "sets missing (NULL with a count of %zu)",
				n);
	size_t k = n ? n : 1;
	p->sets = calloc(k, sizeof(*p->sets));
	p->ptrs = calloc(k, sizeof(*p->ptrs));
	p->descs = calloc(k, sizeof(*p->descs));
	p->blocks = calloc(k, sizeof(*p->blocks));
	p->runs = calloc(k, sizeof(*p->runs));
	if (!p->sets || !p->ptrs || !p->descs || !p->blocks || !p->runs) {
		sets_free(p);
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		RdmaSidecar__V1__DescriptorSet *m = &p->sets[i];
		rdma_sidecar__v1__descriptor_set__init(m);
		p->ptrs[i] = m;
		const rsc_block_list *b = &in[i].block_list;
		switch (in[i].kind) {
		case RSC_SET_DESCRIPTOR:
			rdma_sidecar__v1__descriptor__init(&p->descs[i]);
			p->descs[i].region_id = pbs(in[i].descriptor.region_id);
			p->descs[i].offset = in[i].descriptor.offset;
			p->descs[i].length = in[i].descriptor.length;
			m->set_case = RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_DESCRIPTOR;
			m->descriptor = &p->descs[i];
			break;
		case RSC_SET_BLOCK_LIST:
			if ((b->n_region_ids && !b->region_ids) || (b->n_offsets && !b->offsets) ||
			    (b->n_block_ids && !b->block_ids)) {
				sets_free(p);
				return rsc_fail(
				    st, RSC_INVALID_ARGUMENT,
				    "sets[%zu]: a block list array is NULL with a count", i);
			}
			rdma_sidecar__v1__block_list__init(&p->blocks[i]);
			p->blocks[i].region_ids = (char **)b->region_ids;
			p->blocks[i].n_region_ids = b->n_region_ids;
			p->blocks[i].block_length = b->block_length;
			p->blocks[i].offsets = (uint64_t *)b->offsets;
			p->blocks[i].n_offsets = b->n_offsets;
			p->blocks[i].block_ids = (uint64_t *)b->block_ids;
			p->blocks[i].n_block_ids = b->n_block_ids;
			p->blocks[i].block_stride = b->block_stride;
			p->blocks[i].base_offset = b->base_offset;
			m->set_case = RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_BLOCK_LIST;
			m->block_list = &p->blocks[i];
			break;
		case RSC_SET_STRIDED_RUN:
			rdma_sidecar__v1__strided_run__init(&p->runs[i]);
			p->runs[i].region_id = pbs(in[i].strided_run.region_id);
			p->runs[i].offset = in[i].strided_run.offset;
			p->runs[i].stride = in[i].strided_run.stride;
			p->runs[i].count = in[i].strided_run.count;
			p->runs[i].length = in[i].strided_run.length;
			m->set_case = RDMA_SIDECAR__V1__DESCRIPTOR_SET__SET_STRIDED_RUN;
			m->strided_run = &p->runs[i];
			break;
		default:
			sets_free(p);
			return rsc_fail(st, RSC_INVALID_ARGUMENT,
					"sets[%zu]: kind %d is not RSC_SET_DESCRIPTOR, "
					"RSC_SET_BLOCK_LIST or RSC_SET_STRIDED_RUN",
					i, in[i].kind);
		}
	}
	return RSC_OK;
}

static int passive(rsc_client *c, const char *method, const rsc_passive_args *a,
		   const rsc_descriptor_set *sets, size_t n_sets, const char *traceparent,
		   rsc_operation *out, rsc_status *st)
{
	if (!a)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "%s: no arguments", method);
	RdmaSidecar__V1__CreatePassiveRequest req = RDMA_SIDECAR__V1__CREATE_PASSIVE_REQUEST__INIT;
	RdmaSidecar__V1__Descriptor *msgs, **ptrs;
	struct pb_sets ps;
	int rc = sets_to_pb(sets, n_sets, &ps, st);
	if (rc != RSC_OK)
		return rc;
	rc = descs_to_pb(a->descriptors, a->n_descriptors, &msgs, &ptrs, st);
	if (rc != RSC_OK) {
		sets_free(&ps);
		return rc;
	}
	req.n_descriptor_sets = n_sets;
	req.descriptor_sets = ps.ptrs;
	req.n_descriptors = a->n_descriptors;
	req.descriptors = ptrs;
	req.timeout_ms = a->timeout_ms;
	req.audience = pbs(a->audience);
	req.max_uses = a->max_uses;
	req.request_id = pbs(a->request_id);
	req.traceparent = pbs(traceparent);
	ProtobufCMessage *resp = NULL;
	rc = rsc_call_unary(c, method, PBM(&req), &rdma_sidecar__v1__operation__descriptor, &resp,
			    0, st);
	free(msgs);
	free(ptrs);
	sets_free(&ps);
	return op_answer(rc, resp, out);
}

int rsc_create_readable(rsc_client *c, const rsc_passive_args *a, rsc_operation *out,
			rsc_status *st)
{
	return passive(c, M("CreateReadable"), a, NULL, 0, NULL, out, st);
}

int rsc_create_writable(rsc_client *c, const rsc_passive_args *a, rsc_operation *out,
			rsc_status *st)
{
	return passive(c, M("CreateWritable"), a, NULL, 0, NULL, out, st);
}

int rsc_create_readable_sets(rsc_client *c, const rsc_passive_args *a,
			     const rsc_descriptor_set *sets, size_t n_sets, rsc_operation *out,
			     rsc_status *st)
{
	return passive(c, M("CreateReadable"), a, sets, n_sets, NULL, out, st);
}

int rsc_create_writable_sets(rsc_client *c, const rsc_passive_args *a,
			     const rsc_descriptor_set *sets, size_t n_sets, rsc_operation *out,
			     rsc_status *st)
{
	return passive(c, M("CreateWritable"), a, sets, n_sets, NULL, out, st);
}

/* wait: one call to the final state (BeginTransferRequest.wait), bounded by call_timeout_ms. */
static int begin_sets(rsc_client *c, const char *method, const rsc_transfer_args *a,
		      const rsc_descriptor_set *sets, size_t n_sets, int wait,
		      uint64_t call_timeout_ms, const char *traceparent, rsc_operation *out,
		      rsc_status *st)
{
	if (!a || !a->metadata || !a->metadata[0])
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"%s: the metadata (\"rsm1.\" text) is missing", method);
	RdmaSidecar__V1__BeginTransferRequest req = RDMA_SIDECAR__V1__BEGIN_TRANSFER_REQUEST__INIT;
	RdmaSidecar__V1__TransferRequirement reqm = RDMA_SIDECAR__V1__TRANSFER_REQUIREMENT__INIT;
	RdmaSidecar__V1__Descriptor *msgs, **ptrs;
	struct pb_sets ps;
	int rc = sets_to_pb(sets, n_sets, &ps, st);
	if (rc != RSC_OK)
		return rc;
	rc = descs_to_pb(a->descriptors, a->n_descriptors, &msgs, &ptrs, st);
	if (rc != RSC_OK) {
		sets_free(&ps);
		return rc;
	}
	req.n_descriptor_sets = n_sets;
	req.descriptor_sets = ps.ptrs;
	req.metadata = (char *)a->metadata;
	req.n_descriptors = a->n_descriptors;
	req.descriptors = ptrs;
	req.timeout_ms = a->timeout_ms;
	req.backend = (RdmaSidecar__V1__Backend)a->backend;
	req.request_id = pbs(a->request_id);
	req.wait = wait != 0;
	req.traceparent = pbs(traceparent);
	if (a->has_requirement) {
		reqm.request_id = pbs(a->req_request_id);
		reqm.iteration = a->req_iteration;
		reqm.has_layer = a->req_has_layer != 0;
		reqm.layer = a->req_layer;
		req.requirement = &reqm;
	}
	ProtobufCMessage *resp = NULL;
	rc = rsc_call_unary(c, method, PBM(&req), &rdma_sidecar__v1__operation__descriptor, &resp,
			    call_timeout_ms, st);
	free(msgs);
	free(ptrs);
	sets_free(&ps);
	return op_answer(rc, resp, out);
}

static int begin(rsc_client *c, const char *method, const rsc_transfer_args *a, int wait,
		 uint64_t call_timeout_ms, rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, method, a, NULL, 0, wait, call_timeout_ms, NULL, out, st);
}

int rsc_begin_read_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			size_t n_sets, rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginRead"), a, sets, n_sets, 0, 0, NULL, out, st);
}

int rsc_begin_write_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			 size_t n_sets, rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginWrite"), a, sets, n_sets, 0, 0, NULL, out, st);
}

int rsc_read_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		  size_t n_sets, uint64_t timeout_ms, rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginRead"), a, sets, n_sets, 1, timeout_ms ? timeout_ms : 30000,
			  NULL, out, st);
}

int rsc_write_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		   size_t n_sets, uint64_t timeout_ms, rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginWrite"), a, sets, n_sets, 1, timeout_ms ? timeout_ms : 30000,
			  NULL, out, st);
}

char *rsc_traceparent_new(char buf[RSC_TRACEPARENT_SIZE])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t r[24] = {0};
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t got = fd >= 0 ? read(fd, r, sizeof(r)) : -1;
	if (fd >= 0)
		close(fd);
	if (got != (ssize_t)sizeof(r)) { /* no /dev/urandom: time and address, still non-zero */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^
			     (uint64_t)(uintptr_t)buf;
		for (size_t i = 0; i < sizeof(r); i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			r[i] = (uint8_t)x;
		}
	}
	r[0] |= 1; /* W3C: an all-zero trace id or parent id is invalid */
	r[16] |= 1;
	char *p = buf;
	memcpy(p, "00-", 3);
	p += 3;
	for (int i = 0; i < 16; i++) {
		*p++ = hex[r[i] >> 4];
		*p++ = hex[r[i] & 15];
	}
	*p++ = '-';
	for (int i = 16; i < 24; i++) {
		*p++ = hex[r[i] >> 4];
		*p++ = hex[r[i] & 15];
	}
	memcpy(p, "-01", 4);
	return buf;
}

int rsc_create_readable_traced(rsc_client *c, const rsc_passive_args *a,
			       const rsc_descriptor_set *sets, size_t n_sets,
			       const char *traceparent, rsc_operation *out, rsc_status *st)
{
	return passive(c, M("CreateReadable"), a, sets, n_sets, traceparent, out, st);
}

int rsc_create_writable_traced(rsc_client *c, const rsc_passive_args *a,
			       const rsc_descriptor_set *sets, size_t n_sets,
			       const char *traceparent, rsc_operation *out, rsc_status *st)
{
	return passive(c, M("CreateWritable"), a, sets, n_sets, traceparent, out, st);
}

int rsc_begin_read_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			  size_t n_sets, const char *traceparent, rsc_operation *out,
			  rsc_status *st)
{
	return begin_sets(c, M("BeginRead"), a, sets, n_sets, 0, 0, traceparent, out, st);
}

int rsc_begin_write_traced(rsc_client *c, const rsc_transfer_args *a,
			   const rsc_descriptor_set *sets, size_t n_sets, const char *traceparent,
			   rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginWrite"), a, sets, n_sets, 0, 0, traceparent, out, st);
}

int rsc_read_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		    size_t n_sets, uint64_t timeout_ms, const char *traceparent, rsc_operation *out,
		    rsc_status *st)
{
	return begin_sets(c, M("BeginRead"), a, sets, n_sets, 1, timeout_ms ? timeout_ms : 30000,
			  traceparent, out, st);
}

int rsc_write_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		     size_t n_sets, uint64_t timeout_ms, const char *traceparent,
		     rsc_operation *out, rsc_status *st)
{
	return begin_sets(c, M("BeginWrite"), a, sets, n_sets, 1, timeout_ms ? timeout_ms : 30000,
			  traceparent, out, st);
}

int rsc_begin_read(rsc_client *c, const rsc_transfer_args *a, rsc_operation *out, rsc_status *st)
{
	return begin(c, M("BeginRead"), a, 0, 0, out, st);
}

int rsc_begin_write(rsc_client *c, const rsc_transfer_args *a, rsc_operation *out, rsc_status *st)
{
	return begin(c, M("BeginWrite"), a, 0, 0, out, st);
}

static int op_id_call(rsc_client *c, const char *method, const ProtobufCMessage *req,
		      rsc_operation *out, uint64_t timeout_ms, rsc_status *st)
{
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_unary(c, method, req, &rdma_sidecar__v1__operation__descriptor, &resp,
				timeout_ms, st);
	return op_answer(rc, resp, out);
}

int rsc_operation_get(rsc_client *c, const char *id, rsc_operation *out, rsc_status *st)
{
	RdmaSidecar__V1__GetOperationRequest req = RDMA_SIDECAR__V1__GET_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	return op_id_call(c, M("GetOperation"), PBM(&req), out, 0, st);
}

int rsc_operation_get_rails(rsc_client *c, const char *id, rsc_operation *out,
			    rsc_rail_usage_list *rails, rsc_status *st)
{
	if (!rails)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_operation_get_rails: rails is NULL");
	RdmaSidecar__V1__GetOperationRequest req = RDMA_SIDECAR__V1__GET_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_unary(c, M("GetOperation"), PBM(&req),
				&rdma_sidecar__v1__operation__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__Operation *m = (const void *)resp;
	memset(rails, 0, sizeof(*rails));
	rails->items = calloc(m->n_rails ? m->n_rails : 1, sizeof(*rails->items));
	if (rails->items) {
		rails->count = m->n_rails;
		for (size_t i = 0; i < m->n_rails; i++) {
			rails->items[i].rail = sdup(m->rails[i]->rail);
			rails->items[i].bytes = m->rails[i]->bytes;
		}
	}
	if (out)
		op_from(out, m);
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

void rsc_rail_usage_list_clear(rsc_rail_usage_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; l->items && i < l->count; i++)
		free(l->items[i].rail);
	free(l->items);
	memset(l, 0, sizeof(*l));
}

int rsc_operation_wait(rsc_client *c, const char *id, uint64_t timeout_ms, rsc_operation *out,
		       rsc_status *st)
{
	RdmaSidecar__V1__WaitOperationRequest req = RDMA_SIDECAR__V1__WAIT_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	req.timeout_ms = timeout_ms;
	/* The call's own deadline: the wait plus the usual call timeout. */
	return op_id_call(c, M("WaitOperation"), PBM(&req), out, timeout_ms + 30000, st);
}

int rsc_operation_cancel(rsc_client *c, const char *id, rsc_operation *out, rsc_status *st)
{
	RdmaSidecar__V1__CancelOperationRequest req =
	    RDMA_SIDECAR__V1__CANCEL_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	return op_id_call(c, M("CancelOperation"), PBM(&req), out, 0, st);
}

int rsc_operation_release(rsc_client *c, const char *id, rsc_status *st)
{
	RdmaSidecar__V1__ReleaseOperationRequest req =
	    RDMA_SIDECAR__V1__RELEASE_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, M("ReleaseOperation"), PBM(&req),
			   &rdma_sidecar__v1__release_operation_response__descriptor, &resp, 0, st);
	if (rc == RSC_OK)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}

int rsc_operation_list_get(rsc_client *c, rsc_operation_list *out, rsc_status *st)
{
	RdmaSidecar__V1__ListOperationsRequest req =
	    RDMA_SIDECAR__V1__LIST_OPERATIONS_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, M("ListOperations"), PBM(&req),
			   &rdma_sidecar__v1__list_operations_response__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__ListOperationsResponse *m = (const void *)resp;
	memset(out, 0, sizeof(*out));
	out->items = calloc(m->n_operations ? m->n_operations : 1, sizeof(*out->items));
	if (out->items) {
		out->count = m->n_operations;
		for (size_t i = 0; i < m->n_operations; i++)
			op_from(&out->items[i], m->operations[i]);
	}
	protobuf_c_message_free_unpacked(resp, NULL);
	return out->items ? RSC_OK : rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory");
}

struct watch_ctx {
	rsc_operation_cb cb;
	void *user;
};

static int watch_msg(const ProtobufCMessage *msg, void *user)
{
	struct watch_ctx *w = user;
	rsc_operation op;
	op_from(&op, (const RdmaSidecar__V1__Operation *)msg);
	int stop = w->cb(&op, w->user);
	rsc_operation_clear(&op);
	return stop;
}

int rsc_operation_watch(rsc_client *c, const char *id, rsc_operation_cb cb, void *user,
			uint64_t timeout_ms, rsc_status *st)
{
	if (!cb)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "watch: a callback is needed");
	RdmaSidecar__V1__WatchOperationRequest req =
	    RDMA_SIDECAR__V1__WATCH_OPERATION_REQUEST__INIT;
	req.operation_id = pbs(id);
	struct watch_ctx w = {.cb = cb, .user = user};
	int stopped;
	int rc = rsc_call_server_stream(c, M("WatchOperation"), PBM(&req),
					&rdma_sidecar__v1__operation__descriptor, watch_msg, NULL, &w,
					timeout_ms, &stopped, st);
	if (rc == RSC_OK && stopped)
		return rsc_fail(st, RSC_CANCELLED, "watch: stopped by the callback");
	return rc;
}

static int transfer(rsc_client *c, int write, const rsc_transfer_args *a, uint64_t timeout_ms,
		    rsc_operation *out, rsc_status *st)
{
	/* One round trip: the sidecar answers at the terminal state (BeginTransferRequest.wait). */
	return begin(c, write ? M("BeginWrite") : M("BeginRead"), a, 1,
		     timeout_ms ? timeout_ms : 30000, out, st);
}

int rsc_read(rsc_client *c, const rsc_transfer_args *a, uint64_t timeout_ms, rsc_operation *out,
	     rsc_status *st)
{
	return transfer(c, 0, a, timeout_ms, out, st);
}

int rsc_write(rsc_client *c, const rsc_transfer_args *a, uint64_t timeout_ms, rsc_operation *out,
	      rsc_status *st)
{
	return transfer(c, 1, a, timeout_ms, out, st);
}

/* ---- metadata ---------------------------------------------------------------------------------
 */

static int b64url_val(int ch)
{
	if (ch >= 'A' && ch <= 'Z')
		return ch - 'A';
	if (ch >= 'a' && ch <= 'z')
		return ch - 'a' + 26;
	if (ch >= '0' && ch <= '9')
		return ch - '0' + 52;
	if (ch == '-' || ch == '+')
		return 62;
	if (ch == '_' || ch == '/')
		return 63;
	return -1;
}

/* base64url without padding (padding tolerated) -> malloc'd bytes. */
static uint8_t *b64url_decode(const char *s, size_t *n)
{
	size_t len = strlen(s);
	while (len && s[len - 1] == '=')
		len--;
	uint8_t *out = malloc(len * 3 / 4 + 3);
	size_t o = 0;
	uint32_t acc = 0;
	int bits = 0;
	if (!out)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		int v = b64url_val((unsigned char)s[i]);
		if (v < 0) {
			free(out);
			return NULL;
		}
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[o++] = (uint8_t)(acc >> bits);
		}
	}
	*n = o;
	return out;
}

int rsc_metadata_lengths(const char *metadata, uint64_t **lengths, size_t *n, int *kind,
			 rsc_status *st)
{
	if (!metadata || strncmp(metadata, "rsm1.", 5) != 0)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"metadata must start with \"rsm1.\" (got %.16s...)",
				metadata ? metadata : "(null)");
	size_t len = 0;
	uint8_t *raw = b64url_decode(metadata + 5, &len);
	if (!raw)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"metadata is not base64url after \"rsm1.\"");
	RdmaSidecar__V1__SignedMetadata *sm =
	    rdma_sidecar__v1__signed_metadata__unpack(NULL, len, raw);
	free(raw);
	RdmaSidecar__V1__RdmaMetadata *md = NULL;
	if (sm)
		md = rdma_sidecar__v1__rdma_metadata__unpack(NULL, sm->payload.len,
							     sm->payload.data);
	int rc = RSC_OK;
	if (!md) {
		rc = rsc_fail(st, RSC_INVALID_ARGUMENT,
			      "metadata does not decode (truncated or not rsm1 text)");
		goto out;
	}
	/* Version 1 lists descriptors; version 2 runs of `count` descriptors of one length. */
	size_t total = md->n_descriptors;
	for (size_t r = 0; r < md->n_runs; r++) {
		total += md->runs[r]->count;
		if (total > (1u << 20)) {
			rc = rsc_fail(st, RSC_INVALID_ARGUMENT,
				      "metadata lists more than 1048576 descriptors");
			goto out;
		}
	}
	*lengths = calloc(total ? total : 1, sizeof(**lengths));
	if (!*lengths) {
		rc = rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < md->n_descriptors; i++)
		(*lengths)[i] = md->descriptors[i]->length;
	size_t at = md->n_descriptors;
	for (size_t r = 0; r < md->n_runs; r++)
		for (uint32_t k = 0; k < md->runs[r]->count; k++)
			(*lengths)[at++] = md->runs[r]->length;
	*n = total;
	if (kind)
		*kind = md->kind;
	rsc_ok(st);
out:
	if (md)
		rdma_sidecar__v1__rdma_metadata__free_unpacked(md, NULL);
	if (sm)
		rdma_sidecar__v1__signed_metadata__free_unpacked(sm, NULL);
	return rc;
}

/* ---- peers ------------------------------------------------------------------------------------
 */

int rsc_connect_peer(rsc_client *c, const char *metadata, uint64_t timeout_ms,
		     rsc_peer_connection *out, rsc_status *st)
{
	if (!out)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_connect_peer: out is NULL");
	if (!metadata || !metadata[0])
		return rsc_fail(
		    st, RSC_INVALID_ARGUMENT,
		    "rsc_connect_peer: no metadata (the \"rsm1.\" text the peer issued)");
	RdmaSidecar__V1__ConnectPeerRequest req = RDMA_SIDECAR__V1__CONNECT_PEER_REQUEST__INIT;
	req.metadata = (char *)metadata;
	req.timeout_ms = timeout_ms;
	ProtobufCMessage *resp = NULL;
	/* The call's own deadline: the setup's bound (the sidecar's 10 s when 0) plus the usual
	 * call timeout. */
	int rc = rsc_call_unary(c, M("ConnectPeer"), PBM(&req),
				&rdma_sidecar__v1__connect_peer_response__descriptor, &resp,
				(timeout_ms ? timeout_ms : 10000) + 30000, st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__ConnectPeerResponse *m = (const void *)resp;
	memset(out, 0, sizeof(*out));
	out->peer = sdup(m->peer);
	out->paths = calloc(m->n_paths ? m->n_paths : 1, sizeof(*out->paths));
	if (out->paths) {
		out->n_paths = m->n_paths;
		for (size_t i = 0; i < m->n_paths; i++) {
			out->paths[i].backend = m->paths[i]->backend;
			out->paths[i].ready = m->paths[i]->ready;
			out->paths[i].detail = sdup(m->paths[i]->detail);
			out->paths[i].elapsed_us = m->paths[i]->elapsed_us;
		}
	}
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}

void rsc_peer_connection_clear(rsc_peer_connection *p)
{
	if (!p)
		return;
	free(p->peer);
	for (size_t i = 0; p->paths && i < p->n_paths; i++)
		free(p->paths[i].detail);
	free(p->paths);
	memset(p, 0, sizeof(*p));
}

/* ---- NATS and progress ------------------------------------------------------------------------
 */

static int publish(rsc_client *c, const char *subject, const char *op_id, const char *metadata,
		   rsc_status *st)
{
	RdmaSidecar__V1__PublishMetadataRequest req =
	    RDMA_SIDECAR__V1__PUBLISH_METADATA_REQUEST__INIT;
	req.subject = pbs(subject);
	if (op_id) {
		req.source_case = RDMA_SIDECAR__V1__PUBLISH_METADATA_REQUEST__SOURCE_OPERATION_ID;
		req.operation_id = (char *)op_id;
	} else {
		req.source_case = RDMA_SIDECAR__V1__PUBLISH_METADATA_REQUEST__SOURCE_METADATA;
		req.metadata = pbs(metadata);
	}
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, M("PublishMetadata"), PBM(&req),
			   &rdma_sidecar__v1__publish_metadata_response__descriptor, &resp, 0, st);
	if (rc == RSC_OK)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}

int rsc_publish(rsc_client *c, const char *subject, const char *operation_id, rsc_status *st)
{
	return publish(c, subject, pbs(operation_id), NULL, st);
}

int rsc_publish_metadata(rsc_client *c, const char *subject, const char *metadata, rsc_status *st)
{
	return publish(c, subject, NULL, metadata, st);
}

struct sub_ctx {
	rsc_metadata_cb cb;
	void (*ready)(void *user);
	void *user;
};

static int sub_msg(const ProtobufCMessage *msg, void *user)
{
	const RdmaSidecar__V1__MetadataEvent *m = (const void *)msg;
	struct sub_ctx *s = user;
	rsc_metadata_event ev = {
	    .subject = pbs(m->subject),
	    .metadata = pbs(m->metadata),
	    .issuer = pbs(m->issuer),
	    .kind = m->kind,
	    .n_lengths = m->n_descriptor_lengths,
	    .descriptor_lengths = m->descriptor_lengths,
	    .expires_unix_ms = m->expires_unix_ms,
	};
	return s->cb(&ev, s->user);
}

static void sub_ready(void *user)
{
	struct sub_ctx *s = user;
	s->ready(s->user);
}

int rsc_subscribe(rsc_client *c, const char *subject, const char *queue_group, rsc_metadata_cb cb,
		  void *user, uint64_t timeout_ms, rsc_status *st)
{
	return rsc_subscribe_ready(c, subject, queue_group, NULL, cb, user, timeout_ms, st);
}

int rsc_subscribe_ready(rsc_client *c, const char *subject, const char *queue_group,
			void (*ready)(void *user), rsc_metadata_cb cb, void *user,
			uint64_t timeout_ms, rsc_status *st)
{
	if (!cb || !subject || !subject[0])
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"subscribe: a subject and a callback are needed");
	RdmaSidecar__V1__SubscribeMetadataRequest req =
	    RDMA_SIDECAR__V1__SUBSCRIBE_METADATA_REQUEST__INIT;
	req.subject = (char *)subject;
	req.queue_group = pbs(queue_group);
	struct sub_ctx s = {.cb = cb, .ready = ready, .user = user};
	int stopped;
	return rsc_call_server_stream(c, M("SubscribeMetadata"), PBM(&req),
				      &rdma_sidecar__v1__metadata_event__descriptor, sub_msg,
				      ready ? sub_ready : NULL, &s, timeout_ms, &stopped, st);
}

int rsc_wait_metadata(rsc_client *c, const char *subject, uint64_t timeout_ms,
		      rsc_metadata_event *out, rsc_status *st)
{
	if (!subject || !subject[0])
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "wait_metadata: a subject is needed");
	if (!out)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "wait_metadata: no output event");
	if (timeout_ms == 0)
		timeout_ms = 30000;
	RdmaSidecar__V1__WaitMetadataRequest req = RDMA_SIDECAR__V1__WAIT_METADATA_REQUEST__INIT;
	req.subject = (char *)subject;
	req.timeout_ms = timeout_ms;
	/* The sidecar answers DEADLINE_EXCEEDED itself at timeout_ms, with a message that says
	 * what was stored: the call's deadline leaves it room to. */
	ProtobufCMessage *resp = NULL;
	int rc = rsc_call_unary(c, M("WaitMetadata"), PBM(&req),
				&rdma_sidecar__v1__metadata_event__descriptor, &resp,
				timeout_ms + (c ? rsc_client_call_timeout(c) : 0), st);
	if (rc != RSC_OK)
		return rc;
	const RdmaSidecar__V1__MetadataEvent *m = (const void *)resp;
	rsc_metadata_event ev = {
	    .subject = sdup(m->subject),
	    .metadata = sdup(m->metadata),
	    .issuer = sdup(m->issuer),
	    .kind = m->kind,
	    .n_lengths = m->n_descriptor_lengths,
	    .expires_unix_ms = m->expires_unix_ms,
	};
	uint64_t *lens =
	    calloc(m->n_descriptor_lengths ? m->n_descriptor_lengths : 1, sizeof(uint64_t));
	if (lens && m->n_descriptor_lengths)
		memcpy(lens, m->descriptor_lengths, m->n_descriptor_lengths * sizeof(uint64_t));
	ev.descriptor_lengths = lens;
	protobuf_c_message_free_unpacked(resp, NULL);
	if (!ev.subject || !ev.metadata || !ev.issuer || !lens) {
		rsc_metadata_event_clear(&ev);
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "wait_metadata: out of memory");
	}
	*out = ev;
	return rsc_ok(st);
}

void rsc_metadata_event_clear(rsc_metadata_event *ev)
{
	if (!ev)
		return;
	free((void *)ev->subject);
	free((void *)ev->metadata);
	free((void *)ev->issuer);
	free((void *)ev->descriptor_lengths);
	memset(ev, 0, sizeof(*ev));
}

int rsc_report_progress(rsc_client *c, const char *request_id, uint64_t iteration, int has_layer,
			uint32_t layer, int iteration_complete, uint32_t *released, rsc_status *st)
{
	RdmaSidecar__V1__ReportProgressRequest req =
	    RDMA_SIDECAR__V1__REPORT_PROGRESS_REQUEST__INIT;
	req.request_id = pbs(request_id);
	req.iteration = iteration;
	req.has_layer = has_layer != 0;
	req.layer = layer;
	req.iteration_complete = iteration_complete != 0;
	ProtobufCMessage *resp = NULL;
	int rc =
	    rsc_call_unary(c, M("ReportProgress"), PBM(&req),
			   &rdma_sidecar__v1__report_progress_response__descriptor, &resp, 0, st);
	if (rc != RSC_OK)
		return rc;
	if (released)
		*released = ((RdmaSidecar__V1__ReportProgressResponse *)resp)->released;
	protobuf_c_message_free_unpacked(resp, NULL);
	return RSC_OK;
}
