/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region.c: memory regions. A HOST region is a file mapped MAP_SHARED: either created by the
 * sidecar under --shm-dir (mode 0600, unique name, space reserved with posix_fallocate and
 * pre-faulted in chunks that a shutdown interrupts, unlinked when released) or a range
 * of a worker's own file. Runs on gRPC worker threads (the RPC handlers) under the engine lock,
 * except the allocation and mapping of a new region, which happen before it is published.
 * Owns the mappings and, for sidecar-created regions, the files. Backends register each region
 * (ibverbs: an MR) when it is published and deregister it at the last reference. Each host mapping
 * is watched by the fault guard from its mmap to its munmap, so that a worker truncating the file
 * gets copies and transfers that fail naming the region (os/fault_guard.h), never a SIGBUS; ReadRegion
 * and WriteRegion copy with the guarded copy (sc_gpu_copy).
 */
#include "engine/internal.h"
#include "os/fault_guard.h"
#include "base/log.h"
#include "os/path_guard.h"
#include "engine/region_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

static int region_quota_precheck(struct sc_engine *eng, uint64_t size, struct sc_err *err)
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
	return region_quota_precheck(eng, size, err);
}

int sc_region_create(struct sc_engine *eng, uint64_t size, enum sc_device_kind kind,
		     uint32_t device_index, const char *name, struct sc_region_info *out,
		     struct sc_err *err)
{
	if (kind == SC_DEVICE_UNSPECIFIED)
		kind = SC_DEVICE_HOST;
	if (kind == SC_DEVICE_CUDA)
		return sc_region_create_gpu(eng, size, device_index, name, out, err);
	if (kind != SC_DEVICE_HOST)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "unknown device_kind %d", (int)kind);
	if (sc_region_check_new(eng, size, name, err) != 0)
		return -1;
	struct sc_region *r = calloc(1, sizeof(*r));
	if (!r)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	new_id("rgn", r->id);
	r->kind = SC_DEVICE_HOST;
	r->gpu = SC_GPU_HOST;
	r->device_index = device_index;
	r->size = size;
	r->owned_file = true;
	snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
	int n = snprintf(r->path, sizeof(r->path), "%s/rdma-sidecar-%s-%s", eng->cfg->shm_dir,
			 eng->id, r->id);
	if (n < 0 || (size_t)n >= sizeof(r->path)) {
		free(r);
		return sc_err_set(err, SC_INVALID_ARGUMENT, "--shm-dir path too long");
	}
	int fd = open(r->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		int e = errno;
		free(r);
		return sc_err_set(err, e == ENOSPC ? SC_RESOURCE_EXHAUSTED : SC_INTERNAL,
				  "cannot create %s/...: %s (check --shm-dir)", eng->cfg->shm_dir,
				  strerror(e));
	}
	/* Reserve the pages now (ENOSPC here, not SIGBUS later), then pre-fault them so the first
	 * transfer does not pay for page faults; both in chunks, so shutdown is not held up. */
	if (sc_region_reserve(eng, fd, size, err) != 0) {
		close(fd);
		unlink(r->path);
		free(r);
		return -1;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		unlink(r->path);
		free(r);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "cannot map region: %s", strerror(e));
	}
	if (sc_region_prefault(eng, p, size, err) != 0) {
		munmap(p, size);
		unlink(r->path);
		free(r);
		return -1;
	}
	r->base = p;
	r->map_addr = p;
	r->map_len = size;
	sc_fault_guard_watch(p, size, r->id); /* a fault in it names it (os/fault_guard.h) */

	if (sc_region_add(eng, r, out, err) != 0)
		return -1;
	SC_INFO("region", "created %s: %" PRIu64 " bytes at %s%s%s", out->id, size, out->path,
		out->name[0] ? " name=" : "", out->name);
	return 0;
}

int sc_region_register_host(struct sc_engine *eng, const char *path, uint64_t offset,
			    uint64_t size, const char *name, struct sc_region_info *out,
			    struct sc_err *err)
{
	long page = sysconf(_SC_PAGESIZE);
	if (!path || path[0] != '/')
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "host_file.path must be an absolute path, got \"%s\"",
				  path ? path : "");
	if (strlen(path) >= sizeof(((struct sc_region *)0)->path))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "host_file.path too long");
	if (size == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "host_file.size must be > 0");
	if (offset % (uint64_t)page != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "host_file.offset %" PRIu64 " must be a multiple of the page size %ld",
				  offset, page);
	if (size > eng->cfg->max_region_bytes)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "size %" PRIu64 " exceeds --max-region-size", size);
	if (name && strlen(name) >= SC_NAME_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "name longer than %d bytes",
				  SC_NAME_MAX - 1);
	if (region_quota_precheck(eng, size, err) != 0)
		return -1;
	int fd = sc_path_guard_open(eng->cfg, path, err);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s is not a regular file", path);
	}
	if (offset > (uint64_t)st.st_size || size > (uint64_t)st.st_size - offset) {
		close(fd);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "range [%" PRIu64 ", %" PRIu64 ") lies outside %s (%lld bytes)",
				  offset, offset + size, path, (long long)st.st_size);
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED)
		return sc_err_set(err, SC_INTERNAL, "cannot map %s: %s", path, strerror(e));

	struct sc_region *r = calloc(1, sizeof(*r));
	if (!r) {
		munmap(p, size);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	new_id("rgn", r->id);
	r->kind = SC_DEVICE_HOST;
	r->gpu = SC_GPU_HOST;
	r->size = size;
	r->file_offset = offset;
	snprintf(r->path, sizeof(r->path), "%s", path);
	snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
	r->base = p;
	r->map_addr = p;
	r->map_len = size;
	sc_fault_guard_watch(p, size, r->id);

	int rc = sc_region_add(eng, r, out, err);
	if (rc == 0)
		SC_INFO("region", "registered %s: %s offset %" PRIu64 " size %" PRIu64, out->id,
			path, offset, size);
	return rc;
}

int sc_region_deregister(struct sc_engine *eng, const char *id, bool force, struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_region *r = sc_region_lookup(eng, id);
	if (!r) {
		pthread_mutex_unlock(&eng->mu);
		return sc_err_set(err, SC_NOT_FOUND, "no region \"%s\" (see ListRegions)", id);
	}
	if (r->live_ops > 0 && !force) {
		uint32_t n = r->live_ops;
		pthread_mutex_unlock(&eng->mu);
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "region %s is used by %u live operation(s): wait for them, cancel "
				  "them, or deregister with force=true",
				  id, n);
	}
	/* Cancelling waits (mu released) until no peer request holds the region's memory: r is
	 * referenced across it, and another DeregisterRegion may have taken it out meanwhile. */
	bool held = r->live_ops > 0;
	if (held) {
		sc_region_ref(r);
		sc_op_cancel_region_locked(eng, r, "its region was deregistered with force");
	}
	if (r->in_table) {
		sc_idmap_del(eng->regions, r->id, strlen(r->id));
		r->in_table = false;
		SC_INFO("region", "deregistered %s%s", r->id, force ? " (force)" : "");
		sc_region_unref(eng, r);
	}
	if (held)
		sc_region_unref(eng, r);
	pthread_mutex_unlock(&eng->mu);
	return 0;
}

int sc_region_get(struct sc_engine *eng, const char *id, struct sc_region_info *out,
		  struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_region *r = sc_region_lookup(eng, id);
	if (r)
		sc_region_fill_info(r, out);
	pthread_mutex_unlock(&eng->mu);
	if (!r)
		return sc_err_set(err, SC_NOT_FOUND, "no region \"%s\" (see ListRegions)", id);
	return 0;
}

/* Pin a host region range for a copy done outside the lock. */
static struct sc_region *pin_range(struct sc_engine *eng, const char *id, uint64_t offset,
				   uint64_t len, struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_region *r = sc_region_lookup(eng, id);
	if (!r) {
		pthread_mutex_unlock(&eng->mu);
		sc_err_set(err, SC_NOT_FOUND, "no region \"%s\" (see ListRegions)", id);
		return NULL;
	}
	if (offset > r->size || len > r->size - offset) {
		uint64_t size = r->size;
		pthread_mutex_unlock(&eng->mu);
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "range [%" PRIu64 ", +%" PRIu64 ") is outside region %s (%" PRIu64
			   " bytes)",
			   offset, len, id, size);
		return NULL;
	}
	sc_region_ref(r);
	pthread_mutex_unlock(&eng->mu);
	return r;
}

static void unpin(struct sc_engine *eng, struct sc_region *r)
{
	pthread_mutex_lock(&eng->mu);
	sc_region_unref(eng, r);
	pthread_mutex_unlock(&eng->mu);
}

int sc_region_write(struct sc_engine *eng, const char *id, uint64_t offset, const void *data,
		    size_t len, struct sc_err *err)
{
	struct sc_region *r = pin_range(eng, id, offset, len, err);
	if (!r)
		return -1;
	int rc = sc_gpu_copy(eng->gpu, r->base + offset, r->gpu, data, SC_GPU_HOST, len, err);
	unpin(eng, r);
	return rc;
}

int sc_region_read(struct sc_engine *eng, const char *id, uint64_t offset, void *buf, size_t len,
		   struct sc_err *err)
{
	struct sc_region *r = pin_range(eng, id, offset, len, err);
	if (!r)
		return -1;
	int rc = sc_gpu_copy(eng->gpu, buf, SC_GPU_HOST, r->base + offset, r->gpu, len, err);
	unpin(eng, r);
	return rc;
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
