/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region_alloc.h: reserving and pre-faulting the file of a new sidecar-created region, in
 * chunks that a shutdown interrupts. Called outside the engine lock; thread-safe.
 */
#ifndef SC_REGION_ALLOC_H
#define SC_REGION_ALLOC_H

#include "base/status.h"

#include <stdint.h>

struct sc_engine;

/* Reserve size bytes of fd's file (posix_fallocate). RESOURCE_EXHAUSTED with the file system's
 * free space when it does not fit; UNAVAILABLE once the sidecar drains. */
int sc_region_reserve(struct sc_engine *eng, int fd, uint64_t size, struct sc_err *err);
/* Fault in a fresh MAP_SHARED mapping of size bytes (skipped where MADV_POPULATE_WRITE is
 * missing). UNAVAILABLE once the sidecar drains. */
int sc_region_prefault(struct sc_engine *eng, void *p, uint64_t size, struct sc_err *err);

#endif
