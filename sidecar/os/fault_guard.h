/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/fault_guard.h: copies that survive region memory losing its backing. A worker may truncate a
 * region file while the sidecar has it mapped; touching the lost pages raises SIGBUS (a CPU copy)
 * or EFAULT (a system call such as recv or sendmsg given that memory). The guarded copy catches
 * SIGBUS on the copying thread and fails the copy instead of the daemon; the I/O layers turn
 * EFAULT into the same failure. Either way the error names the region (sc_fault_guard_error).
 *
 * Rule: every byte the CPU moves between region memory and anything else goes through
 * sc_guarded_memcpy (or a buffer it fills or drains), and nothing longjmps out of a library:
 * code that hands region memory to a library that copies it (OpenSSL) bounces it through a
 * private buffer instead.
 *
 * Thread-safe: the guard and the last fault noted are per thread; the SIGBUS handler is
 * installed once per process; the table of watched ranges (which mapping is which region) is
 * process-wide, behind its own lock, and looked at only when a fault is reported.
 */
#ifndef SC_FAULT_GUARD_H
#define SC_FAULT_GUARD_H

#include "base/status.h"

#include <stddef.h>

/* Install the process-wide SIGBUS handler (idempotent). A SIGBUS outside a guarded copy still
 * kills the process as before. Returns 0, or -1 with err. */
int sc_fault_guard_install(struct sc_err *err);

/* memcpy(dst, src, n); returns 0, or -1 with err as sc_fault_guard_error("the copy") when either
 * side faulted (then dst holds a partial copy). err NULL: the fault stays noted for the caller's
 * own sc_fault_guard_error (a layer that reports it as EFAULT, as a system call would). */
int sc_guarded_memcpy(void *dst, const void *src, size_t n, struct sc_err *err);

/*
 * Is [addr, addr + len) backed? Reads its first and last byte under the guard. A file mapping
 * loses pages only at its end (the file shrank), so the last byte answers for the range. Cheap
 * (two loads): for the side that serves a range, before it commits to a reply it could not
 * finish; and for an I/O layer that got EFAULT, to find which of its buffers lost its backing.
 * len 0: 0. Returns 0, or -1 with err as sc_fault_guard_error("the request") (err NULL: the
 * fault stays noted, as with sc_guarded_memcpy).
 */
int sc_fault_guard_probe(const void *addr, size_t len, struct sc_err *err);

/*
 * The ranges of region memory and the regions they belong to, so that a fault names its region.
 * watch: [addr, addr + len) is region `region_id` (copied) from now on; -1 only when out of
 * memory (the fault is then reported without the region's name). unwatch: the range that starts
 * at addr is unmapped (call before munmap; an address never watched: nothing). Any thread.
 */
int sc_fault_guard_watch(const void *addr, size_t len, const char *region_id);
void sc_fault_guard_unwatch(const void *addr);

/* Record where this thread's last access to region memory failed: I/O layers call it when a
 * system call answers EFAULT for a buffer (the guarded copy notes the faulting address itself). */
void sc_fault_guard_note(const void *addr);

/*
 * Fill err for the fault this thread noted last (and forget it): FAILED_PRECONDITION
 *   region "rgn-..." was truncated by its owner: its memory at offset N is no longer backed
 *   (file truncated?), so <stopped> stopped; ...
 * or, for an address in no watched range, the same without the region. `stopped` says what
 * stopped ("the copy", "the transfer with peer sidecar a at 10.0.0.1:4000"). Returns -1.
 */
int sc_fault_guard_error(struct sc_err *err, const char *stopped);

#endif
