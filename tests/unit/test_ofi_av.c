/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_ofi_av.c: the libfabric backend's address-vector entries (ofi/rail.c), on a real rail of
 * libfabric's tcp;ofi_rxm provider over loopback: 1,000 peers through a table of 256 entries
 * (--ofi-max-peers), the least recently used idle entry evicted for each new peer, entries in use
 * never evicted (RESOURCE_EXHAUSTED with the flag to raise when all are), a restarted peer's new
 * address replacing its old entry, and a failed peer's entry removed. Skipped (77) when the
 * provider is not there. Single-threaded (the rail's progress thread is not started).
 */
#include "check.h"
#include "ofi/internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>

static struct ofi_backend *ob;

static void addr_of(int i, uint8_t *out, size_t *len)
{
	struct sockaddr_in sin;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)(20000 + i));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	memcpy(out, &sin, sizeof(sin));
	*len = sizeof(sin);
}

static int get(int i, int port_shift, struct sc_err *err)
{
	char id[32];
	uint8_t a[SC_OFI_ADDR_MAX];
	size_t len;
	snprintf(id, sizeof(id), "peer-%d", i);
	addr_of(i + port_shift, a, &len);
	fi_addr_t fa;
	return ofi_peer_get(&ob->rails[0], id, a, len, &fa, err);
}

static void put(int i)
{
	char id[32];
	snprintf(id, sizeof(id), "peer-%d", i);
	ofi_peer_put(&ob->rails[0], id);
}

TEST(thousand_peers_through_256_entries)
{
	struct sc_err err;
	for (int i = 0; i < 1000; i++) {
		sc_err_clear(&err);
		CHECK_INT_EQ(get(i, 0, &err), 0);
		put(i);
	}
	CHECK_INT_EQ(ob->rails[0].n_peers, 256);
	CHECK_U64_EQ(atomic_load(&ob->base.addrs_inserted), 1000);
	CHECK_U64_EQ(atomic_load(&ob->base.addrs_evicted), 744);
	/* The newest 256 are the ones kept: peer-999 again is no insertion. */
	CHECK_INT_EQ(get(999, 0, &err), 0);
	put(999);
	CHECK_U64_EQ(atomic_load(&ob->base.addrs_inserted), 1000);
}

TEST(entries_in_use_are_never_evicted)
{
	struct sc_err err;
	/* Hold every entry (peers 744..999, all in the table). */
	for (int i = 744; i < 1000; i++)
		CHECK_INT_EQ(get(i, 0, &err), 0);
	sc_err_clear(&err);
	CHECK_INT_EQ(get(5000, 0, &err), -1);
	CHECK_INT_EQ(err.code, SC_RESOURCE_EXHAUSTED);
	CHECK_STR_CONTAINS(err.msg, "--ofi-max-peers");
	/* One let go: the new peer takes its place. */
	put(800);
	sc_err_clear(&err);
	CHECK_INT_EQ(get(5000, 0, &err), 0);
	for (int i = 744; i < 1000; i++)
		if (i != 800)
			put(i);
	put(5000);
	CHECK_INT_EQ(ob->rails[0].n_peers, 256);
}

TEST(a_new_address_replaces_an_idle_entry)
{
	struct sc_err err;
	uint64_t ev = atomic_load(&ob->base.addrs_evicted);
	CHECK_INT_EQ(get(900, 0, &err), 0);
	put(900);
	CHECK_INT_EQ(get(900, 7, &err), 0); /* restarted on another port */
	CHECK_U64_EQ(atomic_load(&ob->base.addrs_evicted), ev + 1);
	/* In use at the old address, a new one is refused until it is let go. */
	sc_err_clear(&err);
	CHECK_INT_EQ(get(900, 9, &err), -1);
	CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(err.msg, "changed its address");
	put(900);
}

TEST(a_failed_peer_is_evicted)
{
	struct sc_err err;
	size_t n = ob->rails[0].n_peers;
	CHECK_INT_EQ(get(950, 0, &err), 0);
	put(950);
	n = ob->rails[0].n_peers;
	ofi_peer_evict(&ob->rails[0], "peer-950");
	CHECK_INT_EQ(ob->rails[0].n_peers, n - 1);
}

/* First: a real rail on lo (skips the whole program when the provider is absent). */
TEST(open_rail)
{
	char why[256];
	if (ofi_lib_load(why, sizeof(why)) != 0) {
		printf("skipped: %s\n", why);
		exit(77);
	}
	struct fi_info *hints = ofi_fn.dupinfo(NULL), *info = NULL;
	hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
	hints->domain_attr->name = strdup("lo");
	if (ofi_fn.getinfo(OFI_API_VERSION, NULL, NULL, 0, hints, &info) != 0) {
		printf("skipped: libfabric's tcp;ofi_rxm provider on lo is not available\n");
		exit(77);
	}
	ob = calloc(1, sizeof(*ob));
	ob->max_peers = 256;
	int rc = ofi_rail_open(ob, 0, info, why, sizeof(why));
	ofi_fn.freeinfo(info);
	ofi_fn.freeinfo(hints);
	if (rc != 0)
		CHECK_FAIL_("rail: %s", why);
	ob->n_rails = 1;
}

TEST(close_rail)
{
	ofi_rail_close(&ob->rails[0]);
	free(ob);
}

RUN_TESTS(T(open_rail), T(thousand_peers_through_256_entries), T(entries_in_use_are_never_evicted),
	  T(a_new_address_replaces_an_idle_entry), T(a_failed_peer_is_evicted), T(close_rail))
