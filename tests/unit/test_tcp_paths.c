/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tcp_paths.c: what the tcp backend knows about its paths (sidecar/tcp/paths.c),
 * driven directly with a clock of the test's own: a failed path cools down 2 s, doubling after
 * each failure up to 60 s; its use after the cool-down is the probe, and a probe that works makes
 * it healthy with the back-off started over; a failure seen twice cools once; the table forgets
 * the endpoint looked at least recently. A rail's facts from an address of this host (loopback:
 * netdev "lo", no PCI address) and from an address of none. Striping and failover over real
 * links: tests/integration/test_tcp_paths.py.
 */
#include "tcp/paths.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TEST(cool_down_doubles_then_probe_recovers)
{
	struct sc_tcp_health *h = calloc(1, sizeof(*h));
	uint64_t now = 1000000, cooling;
	CHECK(sc_tcp_health_usable(h, "10.0.0.1:7000", now, &cooling));
	CHECK_U64_EQ(cooling, 0);
	CHECK_U64_EQ(sc_tcp_health_failed(h, "10.0.0.1:7000", now), SC_TCP_COOL_FIRST_MS);
	CHECK(!sc_tcp_health_usable(h, "10.0.0.1:7000", now + 1, &cooling));
	CHECK_U64_EQ(cooling, SC_TCP_COOL_FIRST_MS - 1);
	/* another stream saw the same failure: no second cool-down */
	CHECK_U64_EQ(sc_tcp_health_failed(h, "10.0.0.1:7000", now + 500),
		     SC_TCP_COOL_FIRST_MS - 500);
	/* a stream opened before the failure does not make it healthy while it cools */
	CHECK(!sc_tcp_health_ok(h, "10.0.0.1:7000", now + 10));
	CHECK(sc_tcp_health_usable(h, "10.0.0.2:7000", now, &cooling)); /* another path */
	now += SC_TCP_COOL_FIRST_MS;
	CHECK(sc_tcp_health_usable(h, "10.0.0.1:7000", now, &cooling)); /* probe time */
	/* the probe fails: twice as long, then doubling up to the max */
	uint32_t want = 2 * SC_TCP_COOL_FIRST_MS;
	for (int i = 0; i < 8; i++) {
		CHECK_U64_EQ(sc_tcp_health_failed(h, "10.0.0.1:7000", now), want);
		now += want;
		want = want * 2 > SC_TCP_COOL_MAX_MS ? SC_TCP_COOL_MAX_MS : want * 2;
	}
	/* the probe works: healthy, and the next failure cools for the first length again */
	CHECK(sc_tcp_health_ok(h, "10.0.0.1:7000", now));
	CHECK(!sc_tcp_health_ok(h, "10.0.0.1:7000", now)); /* already healthy */
	CHECK_U64_EQ(sc_tcp_health_failed(h, "10.0.0.1:7000", now), SC_TCP_COOL_FIRST_MS);
	free(h);
}

TEST(table_forgets_least_recently_seen)
{
	struct sc_tcp_health *h = calloc(1, sizeof(*h));
	uint64_t now = 5000, cooling;
	char ep[32];
	for (int i = 0; i <= SC_TCP_HEALTH_SLOTS; i++) {
		snprintf(ep, sizeof(ep), "10.0.1.%d:7000", i);
		sc_tcp_health_failed(h, ep, now + (uint64_t)i);
	}
	/* the first was forgotten (usable again), the last is cooling */
	CHECK(sc_tcp_health_usable(h, "10.0.1.0:7000", now + 100, &cooling));
	snprintf(ep, sizeof(ep), "10.0.1.%d:7000", SC_TCP_HEALTH_SLOTS);
	CHECK(!sc_tcp_health_usable(h, ep, now + 100, &cooling));
	free(h);
}

TEST(rail_facts)
{
	struct sc_rail r;
	memset(&r, 0, sizeof(r));
	sc_tcp_rail_facts(&r, "127.0.0.1:7000");
	CHECK_STR_EQ(r.name, "127.0.0.1:7000");
	CHECK_STR_EQ(r.netdev, "lo");
	CHECK_STR_EQ(r.pci, "");
	CHECK_INT_EQ(r.numa, -1);
	memset(&r, 0, sizeof(r));
	sc_tcp_rail_facts(&r, "[2001:db8::77]:7000"); /* nobody's address */
	CHECK_STR_EQ(r.name, "[2001:db8::77]:7000");
	CHECK_STR_EQ(r.netdev, "");
	CHECK_INT_EQ(r.numa, -1);
	CHECK_U64_EQ(r.rate_mbps, 0);
	memset(&r, 0, sizeof(r));
	sc_tcp_rail_facts(&r, "node1.example:7000"); /* a name: not looked up */
	CHECK_STR_EQ(r.netdev, "");
}

RUN_TESTS(T(cool_down_doubles_then_probe_recovers), T(table_forgets_least_recently_seen),
	  T(rail_facts))
