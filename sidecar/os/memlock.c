/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/memlock.c: RLIMIT_MEMLOCK, CAP_IPC_LOCK and what the RDMA backends need (see memlock.h).
 * sc_memlock_raise runs on the main thread at start; sc_memlock_assess on any thread (GetInfo's
 * gRPC worker, the main thread's start-up check). Owns nothing.
 */
#include "os/memlock.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#define CAP_IPC_LOCK_BIT 14

static uint64_t lim(rlim_t v)
{
	return v == RLIM_INFINITY ? UINT64_MAX : (uint64_t)v;
}

static void fmt_bytes(uint64_t v, char *out, size_t cap)
{
	if (v == UINT64_MAX)
		snprintf(out, cap, "unlimited");
	else if (v >= (1ull << 30) && v % (1ull << 30) == 0)
		snprintf(out, cap, "%" PRIu64 " GiB", v >> 30);
	else if (v >= (1ull << 20))
		snprintf(out, cap, "%.1f MiB", (double)v / (1 << 20));
	else
		snprintf(out, cap, "%" PRIu64 " KiB", v >> 10);
}

static bool has_cap_ipc_lock(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return false;
	char line[256];
	uint64_t eff = 0;
	bool found = false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %" SCNx64, &eff) == 1) {
			found = true;
			break;
		}
	fclose(f);
	return found && (eff >> CAP_IPC_LOCK_BIT & 1);
}

void sc_memlock_raise(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_MEMLOCK, &rl);
	}
}

void sc_memlock_assess(bool rdma, uint64_t max_total_region_bytes, struct sc_memlock *out)
{
	memset(out, 0, sizeof(*out));
	struct rlimit rl = {0, 0};
	getrlimit(RLIMIT_MEMLOCK, &rl);
	out->limit = lim(rl.rlim_cur);
	out->hard = lim(rl.rlim_max);
	out->cap_ipc_lock = has_cap_ipc_lock();
	out->needed = !rdma			    ? 0
		      : max_total_region_bytes == 0 ? UINT64_MAX
						    : max_total_region_bytes + SC_MEMLOCK_OVERHEAD;
	char have[32], need[32];
	fmt_bytes(out->limit, have, sizeof(have));
	fmt_bytes(out->needed, need, sizeof(need));
	if (!rdma) {
		out->enough = true;
		snprintf(out->detail, sizeof(out->detail),
			 "memlock %s; no RDMA backend is enabled, so none is needed", have);
	} else if (out->limit >= out->needed) {
		out->enough = true;
		snprintf(out->detail, sizeof(out->detail), "memlock %s: enough for RDMA (needs %s)",
			 have, need);
	} else if (out->cap_ipc_lock) {
		out->enough = true;
		snprintf(out->detail, sizeof(out->detail),
			 "memlock %s, below the %s RDMA may pin, but CAP_IPC_LOCK is held: the "
			 "limit does not apply",
			 have, need);
	} else {
		snprintf(
		    out->detail, sizeof(out->detail),
		    "memlock %s is below the %s RDMA may pin (%s): registering regions will "
		    "fail with ENOMEM once they pass it; raise it (systemd LimitMEMLOCK=infinity, "
		    "the container runtime's memlock ulimit, docker --ulimit memlock=-1)",
		    have, need,
		    max_total_region_bytes ? "--max-total-region-bytes plus 64 MiB"
					   : "no --max-total-region-bytes cap");
	}
}
