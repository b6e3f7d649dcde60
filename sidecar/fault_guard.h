/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_guard.h: copies that survive region memory losing its backing. A worker may truncate a
 * region file while the sidecar has it mapped; touching the lost pages raises SIGBUS. The guarded
 * copy catches that on the copying thread and fails the copy instead of the daemon.
 * Thread-safe: the guard is per thread; the SIGBUS handler is installed once per process.
 */
#ifndef SC_FAULT_GUARD_H
#define SC_FAULT_GUARD_H

#include "status.h"

#include <stddef.h>

/* Install the process-wide SIGBUS handler (idempotent). A SIGBUS outside a guarded copy still
 * kills the process as before. Returns 0, or -1 with err. */
int sc_fault_guard_install(struct sc_err *err);

/* memcpy(dst, src, n); returns 0, or -1 with err FAILED_PRECONDITION "region memory is no longer
 * backed (file truncated?)" when either side faulted (then dst holds a partial copy). */
int sc_guarded_memcpy(void *dst, const void *src, size_t n, struct sc_err *err);

#endif
