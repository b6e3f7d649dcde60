/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region_table.c: the region table beneath the operations: references and the last one's
 * release (backends deregister, GPU memory is given back, the mapping goes, a sidecar-created file
 * is removed), lookup and descriptor resolution, ids, the quotas (--max-regions,
 * --max-total-region-bytes), publishing a new region (every backend registers it), snapshots
 * (sc_region_fill_info, sc_region_gpu_path) and the release of them all at shutdown. The region
 * API above it (engine/region.c, engine/region_gpu.c) creates and removes regions; operations
 * reference them. Runs on whatever thread calls it, under eng->mu (sc_region_add, the quota
 * precheck and sc_region_release_all take it). Owns eng->regions and eng->region_bytes.
 */
#include "engine/internal.h"
#include "os/fault_guard.h"
#include "base/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void sc_region_ref(struct sc_region *r)
{
	r->refs++;
}

static void region_free(struct sc_engine *eng, struct sc_region *r)
{
	for (int b = 0; b < SC_NUM_BACKENDS; b++) {
		if (r->backend_handle[b] && eng->backends[b])
			eng->backends[b]->ops->deregister_region(eng->backends[b], r->backend_handle[b]);
	}
	if (r->gpu != SC_GPU_HOST)
		sc_gpu_release(eng->gpu, &r->gmem);
	if (r->counted)
		eng->region_bytes -= r->size;
	if (r->map_addr) {
		sc_fault_guard_unwatch(r->map_addr);
		munmap(r->map_addr, r->map_len);
	}
	if (r->owned_file && unlink(r->path) != 0 && errno != ENOENT)
		SC_WARN("region", "cannot remove %s: %s", r->path, strerror(errno));
	SC_DEBUG("region", "released %s (%" PRIu64 " bytes)", r->id, r->size);
	free(r);
}

void sc_region_unref(struct sc_engine *eng, struct sc_region *r)
{
	if (--r->refs == 0)
		region_free(eng, r);
}

struct sc_region *sc_region_lookup(struct sc_engine *eng, const char *id)
{
	return sc_idmap_get(eng->regions, id, strlen(id));
}

void sc_region_fill_info(const struct sc_region *r, struct sc_region_info *out)
{
	memset(out, 0, sizeof(*out));
	memcpy(out->id, r->id, sizeof(out->id));
	out->kind = r->kind;
	out->device_index = r->device_index;
	out->size = r->size;
	memcpy(out->path, r->path, sizeof(out->path));
	out->file_offset = r->file_offset;
	memcpy(out->name, r->name, sizeof(out->name));
	out->live_ops = r->live_ops;
	out->has_cuda_ipc_handle = r->has_ipc_handle;
	if (r->has_ipc_handle)
		memcpy(out->cuda_ipc_handle, r->ipc_handle, sizeof(out->cuda_ipc_handle));
	if (r->kind == SC_DEVICE_CUDA)
		sc_region_gpu_path(r, out);
}

void sc_region_gpu_path(const struct sc_region *r, struct sc_region_info *out)
{
	const struct sc_gpu_device_info *d = r->gpu_info;
	const char *ib_note = r->backend_note[SC_BACKEND_IBVERBS];
	out->gdr_capable = r->gmem.gdr_capable;
	if (r->backend_handle[SC_BACKEND_IBVERBS])
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "GPUDirect RDMA: registered with ibverbs (%s)", d ? d->rdma_path : "?");
	else if (ib_note[0])
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "staged through pinned host memory: ibverbs cannot reach it (%s)", ib_note);
	else if (!r->gmem.gdr_capable && r->gmem.source == SC_GPU_MEM_VMM && d && d->gdr &&
		 !d->vmm_gdr)
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "staged through pinned host memory: cuMemCreate memory, and this "
			 "GPU/driver takes no GPUDirect RDMA on it "
			 "(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0)");
	else if (!r->gmem.gdr_capable && r->gmem.source == SC_GPU_MEM_VMM && d && d->gdr)
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "staged through pinned host memory: cuMemCreate memory not declared "
			 "allocated with allocFlags.gpuDirectRDMACapable = 1 (the driver does not "
			 "tell an importing process: when the worker set it, say so with "
			 "cuda_fd.gpudirect_rdma_capable)");
	else if (!r->gmem.gdr_capable && r->gmem.source == SC_GPU_MEM_IPC && d && d->gdr)
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "staged through pinned host memory: memory opened from a CUDA IPC handle "
			 "is not GPUDirect RDMA capable in the importing process (the driver "
			 "exports no dma-buf for it); for GPUDirect RDMA register cuMemCreate "
			 "memory with allocFlags.gpuDirectRDMACapable = 1 by cuda_fd");
	else if (!r->gmem.gdr_capable)
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "staged through pinned host memory: not GPUDirect RDMA capable (%s)",
			 d ? d->rdma_path : "unknown GPU");
	else
		snprintf(out->gpu_path, sizeof(out->gpu_path),
			 "GPUDirect RDMA capable; no ibverbs backend here, so tcp transfers stage "
			 "through pinned host memory");
}

static void new_id(const char *prefix, char out[SC_ID_MAX])
{
	uint8_t rnd[8];
	if (sc_random_bytes(rnd, sizeof(rnd)) != 0)
		memset(rnd, 0, sizeof(rnd));
	snprintf(out, SC_ID_MAX, "%s-%02x%02x%02x%02x%02x%02x%02x%02x", prefix, rnd[0], rnd[1],
		 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
}

void sc_region_new_id(char out[SC_ID_MAX])
{
	new_id("rgn", out);
}

/* --max-regions and --max-total-region-bytes: may one more region of `size` bytes exist? Under mu. */
static int region_quota_check(struct sc_engine *eng, uint64_t size, struct sc_err *err)
{
	const struct sc_config *cfg = eng->cfg;
	if (sc_idmap_count(eng->regions) >= cfg->max_regions)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "--max-regions %u reached: deregister regions you no longer need "
				  "(or ask the operator to raise --max-regions)",
				  cfg->max_regions);
	if (cfg->max_total_region_bytes &&
	    (size > cfg->max_total_region_bytes ||
	     eng->region_bytes > cfg->max_total_region_bytes - size))
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "--max-total-region-bytes %" PRIu64 " reached: %" PRIu64
				  " bytes in regions, %" PRIu64 " more asked; deregister regions you "
				  "no longer need",
				  cfg->max_total_region_bytes, eng->region_bytes, size);
	return 0;
}

int sc_region_quota_precheck(struct sc_engine *eng, uint64_t size, struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	int rc = sc_engine_check_accepting(eng, err);
	if (rc == 0)
		rc = region_quota_check(eng, size, err);
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

/* Register with every started backend, then publish in the table. A GPU region that a backend
 * cannot register (ibverbs without GPUDirect) stays usable by the others: the note says why.
 * Under mu. */
static int region_publish(struct sc_engine *eng, struct sc_region *r, struct sc_err *err)
{
	if (region_quota_check(eng, r->size, err) != 0)
		return -1;
	for (int b = 0; b < SC_NUM_BACKENDS; b++) {
		struct sc_backend *be = eng->backends[b];
		if (!be || !be->available)
			continue;
		struct sc_err berr;
		sc_err_clear(&berr);
		if (be->ops->register_region(be, r->base, r->size, r->gpu, &r->backend_handle[b],
					     &berr) == 0)
			continue;
		if (r->gpu == SC_GPU_HOST) {
			*err = berr;
			sc_err_prefix(err, "registering region with %s", be->ops->name);
			return -1;
		}
		r->backend_handle[b] = NULL;
		snprintf(r->backend_note[b], sizeof(r->backend_note[b]), "%s", berr.msg);
		SC_INFO("region", "%s (GPU %d): %s cannot reach it, transfers stage through host "
				  "memory: %s",
			r->id, r->gpu, be->ops->name, berr.msg);
	}
	if (sc_idmap_put(eng->regions, r->id, strlen(r->id), r) != 0)
		return sc_err_set(err, SC_INTERNAL, "region table full (out of memory)");
	r->in_table = true;
	r->refs = 1;
	r->counted = true;
	eng->region_bytes += r->size;
	return 0;
}

/* Publish a mapped region and describe it; on failure the region is released (unmapped, and
 * its file removed if the sidecar created it). */
int sc_region_add(struct sc_engine *eng, struct sc_region *r, struct sc_region_info *out,
		  struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	int rc = sc_engine_check_accepting(eng, err);
	if (rc == 0)
		rc = region_publish(eng, r, err);
	if (rc == 0) {
		sc_region_fill_info(r, out);
	} else {
		r->refs = 1;
		sc_region_unref(eng, r);
	}
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

int sc_region_check_new(struct sc_engine *eng, uint64_t size, const char *name,
			struct sc_err *err)
{
	if (size == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "size must be > 0");
	if (size > eng->cfg->max_region_bytes)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "size %" PRIu64 " exceeds --max-region-size %" PRIu64, size,
				  eng->cfg->max_region_bytes);
	if (name && strlen(name) >= SC_NAME_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "name longer than %d bytes",
				  SC_NAME_MAX - 1);
	return sc_region_quota_precheck(eng, size, err);
}

int sc_region_resolve(struct sc_engine *eng, const struct sc_desc *d, struct sc_region **out,
		      struct sc_err *err)
{
	struct sc_region *r = sc_region_lookup(eng, d->region_id);
	if (!r)
		return sc_err_set(err, SC_NOT_FOUND, "no region \"%s\" (see ListRegions)",
				  d->region_id);
	if (d->length == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor on region %s has length 0", d->region_id);
	if (d->offset > r->size || d->length > r->size - d->offset)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor [%" PRIu64 ", +%" PRIu64 ") is outside region %s (%" PRIu64
				  " bytes)",
				  d->offset, d->length, d->region_id, r->size);
	*out = r;
	return 0;
}

static void unref_one(void *ctx, void *value)
{
	struct sc_engine *eng = ctx;
	struct sc_region *r = value;
	r->in_table = false;
	sc_region_unref(eng, r);
}

void sc_region_release_all(struct sc_engine *eng)
{
	pthread_mutex_lock(&eng->mu);
	sc_idmap_each(eng->regions, unref_one, eng);
	sc_idmap_destroy(eng->regions);
	eng->regions = sc_idmap_create();
	pthread_mutex_unlock(&eng->mu);
}
