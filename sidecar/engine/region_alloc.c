/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region_alloc.c: the memory behind a new sidecar-created region. posix_fallocate reserves
 * the file's pages on the --shm-dir file system up front, so a region that does not fit fails
 * CreateRegion with RESOURCE_EXHAUSTED (and the free space) instead of killing the daemon with
 * SIGBUS on first use; MADV_POPULATE_WRITE then maps the pages in. Both go 256 MiB at a time and
 * stop when the sidecar starts draining, so a huge CreateRegion neither holds up SIGTERM nor the
 * engine lock (taken only for a moment to read the draining flag).
 *
 * Runs on the gRPC worker thread of CreateRegion, before the region is published. Owns nothing:
 * the caller owns the file descriptor and the mapping.
 */
#include "engine/region_alloc.h"

#include "engine/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>

#define RESERVE_CHUNK (256ull << 20)

static bool draining(struct sc_engine *eng)
{
	pthread_mutex_lock(&eng->mu);
	bool d = eng->draining;
	pthread_mutex_unlock(&eng->mu);
	return d;
}

static uint64_t fs_free_bytes(int fd)
{
	struct statvfs vfs;
	if (fstatvfs(fd, &vfs) != 0)
		return UINT64_MAX;
	return (uint64_t)vfs.f_bavail * vfs.f_frsize;
}

/* Allocate the file's blocks with posix_fallocate, RESERVE_CHUNK at a time, checking for
 * shutdown between chunks. Outside mu. */
int sc_region_reserve(struct sc_engine *eng, int fd, uint64_t size, struct sc_err *err)
{
	uint64_t avail = fs_free_bytes(fd);
	if (size > avail)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "region of %" PRIu64 " bytes does not fit: the file system of "
				  "--shm-dir %s has %" PRIu64 " bytes free; ask for less or free space",
				  size, eng->cfg->shm_dir, avail);
	for (uint64_t off = 0; off < size; off += RESERVE_CHUNK) {
		if (draining(eng))
			return sc_err_set(err, SC_UNAVAILABLE,
					  "sidecar is draining (shutting down): retry on another "
					  "sidecar");
		uint64_t n = size - off < RESERVE_CHUNK ? size - off : RESERVE_CHUNK;
		int e = posix_fallocate(fd, (off_t)off, (off_t)n);
		if (e == ENOSPC || e == EFBIG || e == EDQUOT)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "region of %" PRIu64 " bytes does not fit: the file system "
					  "of --shm-dir %s has %" PRIu64 " bytes free (%s); ask for less "
					  "or free space",
					  size, eng->cfg->shm_dir, avail, strerror(e));
		if (e != 0)
			return sc_err_set(err, SC_INTERNAL, "cannot reserve %" PRIu64
					  " bytes for the region file: %s", size, strerror(e));
	}
	return 0;
}

/* Map the reserved pages in, RESERVE_CHUNK at a time, checking for shutdown. Kernels without
 * MADV_POPULATE_WRITE (before 5.14) skip the pre-fault. Outside mu. */
int sc_region_prefault(struct sc_engine *eng, void *p, uint64_t size, struct sc_err *err)
{
#ifdef MADV_POPULATE_WRITE
	for (uint64_t off = 0; off < size; off += RESERVE_CHUNK) {
		if (draining(eng))
			return sc_err_set(err, SC_UNAVAILABLE,
					  "sidecar is draining (shutting down): retry on another "
					  "sidecar");
		uint64_t n = size - off < RESERVE_CHUNK ? size - off : RESERVE_CHUNK;
		if (madvise((uint8_t *)p + off, n, MADV_POPULATE_WRITE) != 0) {
			if (errno == EINVAL)
				return 0; /* not supported here: fault on first use */
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "cannot pre-fault the region: %s", strerror(errno));
		}
	}
#else
	(void)eng;
	(void)p;
	(void)size;
	(void)err;
#endif
	return 0;
}
