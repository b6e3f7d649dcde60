/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/memlock.h: the locked-memory limit (RLIMIT_MEMLOCK) and what the RDMA backends need of it.
 * ibverbs pins every registered region (ibv_reg_mr), and the kernel counts pinned pages against
 * this limit unless the process holds CAP_IPC_LOCK; container runtimes and systemd default to a
 * few MiB, so a node set up for RDMA raises it (LimitMEMLOCK=infinity, the runtime's ulimits).
 * The sidecar reports it in GetInfo and warns at start when it is too low. Any thread.
 */
#ifndef SC_OS_MEMLOCK_H
#define SC_OS_MEMLOCK_H

#include <stdbool.h>
#include <stdint.h>

/* Overhead pinned beside the regions: queue pairs, completion queues, bounce buffers. */
#define SC_MEMLOCK_OVERHEAD (64ull << 20)

struct sc_memlock {
	uint64_t limit;	   /* the soft RLIMIT_MEMLOCK in bytes; UINT64_MAX: unlimited */
	uint64_t hard;	   /* the hard one */
	uint64_t needed;   /* what the RDMA backends need; UINT64_MAX: unlimited; 0: no RDMA */
	bool cap_ipc_lock; /* the process may pin beyond the limit (CAP_IPC_LOCK effective) */
	bool enough;	   /* limit >= needed, or cap_ipc_lock, or no RDMA backend */
	char detail[320];  /* one line saying so, and what to do when it is not enough */
};

/* Raises the soft limit to the hard one (as the open-file limit is). Main thread, at start. */
void sc_memlock_raise(void);

/* The figures now. rdma: an RDMA backend (ibverbs) is enabled; max_total_region_bytes: the
 * --max-total-region-bytes cap (0: none, so any amount may be pinned). */
void sc_memlock_assess(bool rdma, uint64_t max_total_region_bytes, struct sc_memlock *out);

#endif
