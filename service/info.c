/* SPDX-License-Identifier: Apache-2.0 */
/*
 * info.c: GetInfo: identity, version, listeners, backends (and why one is unavailable), data
 * endpoints, rails, NATS state, signing, CUDA, the memlock limit. A gRPC worker thread.
 */
#include "handlers.h"
#include "internal.h"
#include "service.h"

#include "os/memlock.h"

#include <stdio.h>
#include <stdlib.h>

/* Whether an RDMA backend (ibverbs) is available: it pins registered memory (os/memlock.h). */
static bool info_has_rdma(const struct sc_info *info)
{
	for (size_t i = 0; i < info->n_backends; i++)
		if (info->backends[i].backend == SC_BACKEND_IBVERBS && info->backends[i].available)
			return true;
	return false;
}

/* The topology rows as messages: allocated together (a table has up to 32 rows of 32 rails). */
struct topo_msgs {
	RdmaSidecar__V1__MemoryRails rows[SC_TOPO_ROWS_MAX];
	RdmaSidecar__V1__MemoryRails *row_ptrs[SC_TOPO_ROWS_MAX];
	RdmaSidecar__V1__RailDistance dist[SC_TOPO_ROWS_MAX][SC_TOPO_RAILS_MAX];
	RdmaSidecar__V1__RailDistance *dist_ptrs[SC_TOPO_ROWS_MAX][SC_TOPO_RAILS_MAX];
	char *chosen[SC_TOPO_ROWS_MAX][SC_TOPO_RAILS_MAX];
	char memory[SC_TOPO_ROWS_MAX][32];
};

static struct topo_msgs *topology_fill(const struct sc_topo_table *t,
				       RdmaSidecar__V1__SidecarInfo *m)
{
	if (!t || t->n_rows == 0)
		return NULL;
	struct topo_msgs *tm = calloc(1, sizeof(*tm));
	if (!tm)
		return NULL;
	for (size_t r = 0; r < t->n_rows; r++) {
		const struct sc_topo_choice *c = &t->rows[r];
		RdmaSidecar__V1__MemoryRails *row = &tm->rows[r];
		rdma_sidecar__v1__memory_rails__init(row);
		bool gpu = c->mem.kind == SC_TOPO_MEM_GPU;
		snprintf(tm->memory[r], sizeof(tm->memory[r]), "%s %d", gpu ? "gpu" : "numa",
			 gpu ? c->mem.gpu : c->mem.numa);
		row->memory = tm->memory[r];
		row->gpu_index = gpu ? c->mem.gpu : -1;
		row->pci_address = (char *)(gpu ? c->mem.pci : "");
		row->numa_node = c->mem.numa;
		for (size_t k = 0; k < c->n_ranked; k++) {
			RdmaSidecar__V1__RailDistance *d = &tm->dist[r][k];
			rdma_sidecar__v1__rail_distance__init(d);
			d->rail = (char *)t->rails[c->ranked[k].rail].name;
			d->distance = (char *)sc_topo_class_name(c->ranked[k].cls);
			tm->dist_ptrs[r][k] = d;
		}
		row->n_rails = c->n_ranked;
		row->rails = tm->dist_ptrs[r];
		for (size_t k = 0; k < c->n_chosen; k++)
			tm->chosen[r][k] = (char *)t->rails[c->chosen[k]].name;
		row->n_chosen = c->n_chosen;
		row->chosen = tm->chosen[r];
		tm->row_ptrs[r] = row;
	}
	m->n_topology = t->n_rows;
	m->topology = tm->row_ptrs;
	return tm;
}

void sc_h_get_info(struct sc_call *c, ProtobufCMessage *req)
{
	struct sc_info info;
	sc_engine_info(sc_call_engine(c), &info);

	RdmaSidecar__V1__SidecarInfo m = RDMA_SIDECAR__V1__SIDECAR_INFO__INIT;
	m.sidecar_id = info.sidecar_id;
	m.version = (char *)info.version;
	RdmaSidecar__V1__BackendInfo b[SC_INFO_MAX_BACKENDS];
	RdmaSidecar__V1__BackendInfo *bp[SC_INFO_MAX_BACKENDS];
	char *devs[SC_INFO_MAX_BACKENDS][4];
	for (size_t i = 0; i < info.n_backends && i < SC_INFO_MAX_BACKENDS; i++) {
		rdma_sidecar__v1__backend_info__init(&b[i]);
		b[i].backend = (RdmaSidecar__V1__Backend)info.backends[i].backend;
		b[i].available = info.backends[i].available;
		b[i].detail = info.backends[i].detail;
		for (size_t d = 0; d < info.backends[i].n_devices; d++)
			devs[i][d] = info.backends[i].devices[d];
		b[i].n_devices = info.backends[i].n_devices;
		b[i].devices = devs[i];
		bp[i] = &b[i];
	}
	m.n_backends = info.n_backends;
	m.backends = bp;
	char *eps[SC_INFO_MAX_ENDPOINTS];
	for (size_t i = 0; i < info.n_data_endpoints; i++)
		eps[i] = info.data_endpoints[i];
	m.n_data_endpoints = info.n_data_endpoints;
	m.data_endpoints = eps;
	m.nats_state = info.nats_state;
	const char **listeners;
	m.n_grpc_listeners = sc_service_listeners(sc_call_service(c), &listeners);
	m.grpc_listeners = (char **)listeners;
	m.signing_enabled = info.signing_enabled;
	m.signing_key_id = info.signing_key_id;
	m.cuda_available = info.cuda_available;
	m.cuda_detail = info.cuda_detail;
	RdmaSidecar__V1__GpuInfo g[SC_GPU_MAX_DEVICES];
	RdmaSidecar__V1__GpuInfo *gp[SC_GPU_MAX_DEVICES];
	char cc[SC_GPU_MAX_DEVICES][16];
	for (size_t i = 0; i < info.n_gpus; i++) {
		const struct sc_gpu_device_info *d = &info.gpus[i];
		rdma_sidecar__v1__gpu_info__init(&g[i]);
		g[i].index = (uint32_t)d->index;
		g[i].name = (char *)d->name;
		g[i].pci_bus_id = (char *)d->pci_bus_id;
		g[i].total_memory = d->total_memory;
		snprintf(cc[i], sizeof(cc[i]), "%d.%d", d->cc_major, d->cc_minor);
		g[i].compute_capability = cc[i];
		g[i].dma_buf_supported = d->dma_buf;
		g[i].gpudirect_rdma_supported = d->gdr;
		g[i].nvidia_peermem_loaded = d->peermem;
		g[i].nearest_rdma_device = (char *)d->nearest_rdma;
		g[i].nearest_rdma_detail = (char *)d->nearest_detail;
		g[i].rdma_path = (char *)d->rdma_path;
		g[i].uuid = (char *)d->uuid;
		g[i].healthy = d->healthy;
		g[i].health_detail = (char *)d->health_detail;
		g[i].vmm_gpudirect_rdma_supported = d->vmm_gdr;
		gp[i] = &g[i];
	}
	m.n_gpus = info.n_gpus;
	m.gpus = gp;
	RdmaSidecar__V1__CertificateInfo pc = RDMA_SIDECAR__V1__CERTIFICATE_INFO__INIT;
	if (info.has_peer_cert) {
		pc.serial = info.peer_cert_serial;
		pc.identity = info.peer_cert_identity;
		pc.not_before_unix_s = info.peer_cert_not_before;
		pc.not_after_unix_s = info.peer_cert_not_after;
		pc.identity_source = (char *)info.peer_identity_source;
		m.peer_certificate = &pc;
	}
	RdmaSidecar__V1__RailInfo r[SC_INFO_MAX_RAILS];
	RdmaSidecar__V1__RailInfo *rp[SC_INFO_MAX_RAILS];
	for (size_t i = 0; i < info.n_rails; i++) {
		const struct sc_rail_entry *e = &info.rails[i];
		rdma_sidecar__v1__rail_info__init(&r[i]);
		r[i].index = e->index;
		r[i].backend = (RdmaSidecar__V1__Backend)e->backend;
		r[i].name = (char *)e->r.name;
		r[i].pci_address = (char *)e->r.pci;
		r[i].numa_node = e->r.numa;
		r[i].rate_mbps = e->r.rate_mbps;
		r[i].state = (char *)sc_rail_state_name(e->r.state);
		r[i].detail = (char *)e->r.detail;
		r[i].netdev = (char *)e->r.netdev;
		r[i].bytes = e->r.bytes;
		r[i].operations = e->r.operations;
		r[i].errors = e->r.errors;
		r[i].failovers = e->r.failovers;
		rp[i] = &r[i];
	}
	m.n_rails = info.n_rails;
	m.rails = rp;
	m.topology_source = (char *)(info.topology_source ? info.topology_source : "");
	m.open_files_limit = info.open_files_limit;
	struct sc_memlock ml;
	sc_memlock_assess(info_has_rdma(&info), sc_call_service(c)->cfg->max_total_region_bytes,
			  &ml);
	m.memlock_limit = ml.limit;
	m.memlock_needed = ml.needed;
	m.memlock_enough = ml.enough;
	m.memlock_detail = ml.detail;
	struct topo_msgs *tm = topology_fill(info.topo_table, &m);
	sc_call_reply(c, &m.base);
	free(tm);
}
