/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region.c: the region API above the operations: Create/Register (host), Deregister (a
 * forced one cancels the operations using the region), Get, List, Read and Write. A HOST region
 * is a file mapped MAP_SHARED: either created by the sidecar under --shm-dir (mode 0600, unique
 * name, space reserved with posix_fallocate and pre-faulted in chunks that a shutdown interrupts,
 * unlinked when released) or a range of a worker's own file. Each host mapping is watched by the
 * fault guard from its mmap to its munmap, so a worker truncating the file gets copies and
 * transfers that fail naming the region (os/fault_guard.h), never a SIGBUS; ReadRegion and
 * WriteRegion copy with the guarded copy (sc_gpu_copy). GPU regions: engine/region_gpu.c; the
 * table, references and release: engine/region_table.c. Runs on gRPC worker threads under the
 * engine lock, except the allocation and mapping of a new region (before it is published).
 */
#include "engine/internal.h"
#include "os/fault_guard.h"
#include "base/log.h"
#include "os/path_guard.h"
#include "engine/region_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
	sc_region_new_id(r->id);
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
	if (sc_region_quota_precheck(eng, size, err) != 0)
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
	sc_region_new_id(r->id);
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

int sc_region_list_page(struct sc_engine *eng, const char *after, size_t limit,
			struct sc_region_info **out, size_t *n, bool *more, struct sc_err *err)
{
	const void **items = NULL;
	size_t found = 0;
	pthread_mutex_lock(&eng->mu);
	if (sc_page_collect(eng->regions, offsetof(struct sc_region, id), after, &items, &found, err) != 0) {
		pthread_mutex_unlock(&eng->mu);
		return -1;
	}
	size_t take = found < limit ? found : limit;
	struct sc_region_info *infos = calloc(take ? take : 1, sizeof(*infos));
	for (size_t i = 0; infos && i < take; i++)
		sc_region_fill_info(items[i], &infos[i]);
	pthread_mutex_unlock(&eng->mu);
	free(items);
	if (!infos)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	*out = infos;
	*n = take;
	*more = found > take;
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

