/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_memlock.c: the locked-memory report (sidecar/os/memlock.c) and the interface lookup of
 * --advertise if:NAME (sidecar/net/ifaddr.c). The process lowers its own RLIMIT_MEMLOCK and, when
 * it holds CAP_IPC_LOCK (root), drops that capability from its effective set, so the "too low"
 * verdict is seen for real. Single-threaded.
 */
#include "check.h"
#include "net/ifaddr.h"
#include "os/memlock.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Drops CAP_IPC_LOCK from the effective set (kept in the permitted one). */
static void drop_ipc_lock(void)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) != 0)
		return;
	d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	(void)syscall(SYS_capset, &h, d);
}

TEST(no_rdma_needs_nothing)
{
	struct sc_memlock m;
	sc_memlock_assess(false, 0, &m);
	CHECK_U64_EQ(m.needed, 0);
	CHECK(m.enough);
	CHECK_STR_CONTAINS(m.detail, "no RDMA backend is enabled");
}

TEST(too_low_for_rdma_is_said_with_what_to_raise)
{
	struct rlimit rl;
	CHECK_INT_EQ(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	rl.rlim_cur = 8 << 20;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < rl.rlim_cur)
		rl.rlim_cur = rl.rlim_max;
	CHECK_INT_EQ(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	drop_ipc_lock();
	struct sc_memlock m;
	sc_memlock_assess(true, 0, &m);
	CHECK_U64_EQ(m.limit, rl.rlim_cur);
	CHECK_U64_EQ(m.needed, UINT64_MAX);
	CHECK(!m.cap_ipc_lock);
	CHECK(!m.enough);
	CHECK_STR_CONTAINS(m.detail, "memlock 8.0 MiB is below the unlimited RDMA may pin");
	CHECK_STR_CONTAINS(m.detail, "LimitMEMLOCK=infinity");
	/* A cap on the regions: needed is that plus the overhead. */
	sc_memlock_assess(true, 1ull << 30, &m);
	CHECK_U64_EQ(m.needed, (1ull << 30) + SC_MEMLOCK_OVERHEAD);
	CHECK(!m.enough);
	/* Raised to the hard limit (as the sidecar does at start): enough when the hard one is. */
	sc_memlock_raise();
	sc_memlock_assess(true, 1ull << 20, &m);
	CHECK_U64_EQ(m.limit, rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max);
	CHECK_INT_EQ(m.enough, m.limit >= m.needed);
}

TEST(interface_lookup)
{
	char host[64];
	struct sc_err err;
	sc_err_clear(&err);
	CHECK_INT_EQ(sc_ifaddr_lookup("lo", host, sizeof(host), &err), 0);
	CHECK_STR_EQ(host, "127.0.0.1");
	CHECK_INT_EQ(sc_ifaddr_lookup("nosuch0", host, sizeof(host), &err), -1);
	CHECK_INT_EQ(err.code, SC_NOT_FOUND);
	CHECK_STR_CONTAINS(err.msg,
			   "there is no network interface \"nosuch0\" here (there are: lo");
	CHECK(sc_ifname_valid("net1"));
	CHECK(!sc_ifname_valid(""));
	CHECK(!sc_ifname_valid("a/b"));
	CHECK(!sc_ifname_valid("sixteen-chars-xx"));
	CHECK(!sc_ifname_valid(".."));
}

RUN_TESTS(T(no_rdma_needs_nothing), T(too_low_for_rdma_is_said_with_what_to_raise),
	  T(interface_lookup))
