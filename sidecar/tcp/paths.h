/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/paths.h: what the tcp backend knows about its paths, apart from moving bytes.
 *
 *   - A TCP rail's fixed facts: the interface that carries a data endpoint's address (getifaddrs),
 *     its PCI address and NUMA node (/sys/class/net/IF/device) and link speed
 *     (/sys/class/net/IF/speed), each left unknown ("" / -1 / 0) when the host does not say.
 *   - The health of each peer data endpoint the backend has dialled (a path): a path that failed
 *     cools down for SC_TCP_COOL_FIRST_MS, doubling after each failure up to SC_TCP_COOL_MAX_MS;
 *     once the cool-down ends the next transfer's dial to it is the probe, and a path that opens
 *     a stream again is healthy (its back-off starts over).
 *
 * Thread safety: sc_tcp_rail_facts any thread. A struct sc_tcp_health has no lock of its own:
 * the backend calls it under its mutex.
 */
#ifndef SC_BACKEND_TCP_PATHS_H
#define SC_BACKEND_TCP_PATHS_H

#include "backend/backend.h"

#include <stdbool.h>
#include <stdint.h>

/* A failed path is not used for this long, doubled after each further failure up to the max. */
#define SC_TCP_COOL_FIRST_MS 2000u
#define SC_TCP_COOL_MAX_MS 60000u
/* Peer endpoints whose health is remembered; the one looked at least recently is forgotten. */
#define SC_TCP_HEALTH_SLOTS 32

/* Fill r's name (endpoint), netdev, pci, numa and rate_mbps for the data endpoint "host:port"
 * (an address of one of this host's interfaces, else only the name). */
void sc_tcp_rail_facts(struct sc_rail *r, const char *endpoint);

struct sc_tcp_path_health {
	char endpoint[80];	/* "" free */
	uint64_t cool_until_ms; /* 0: healthy */
	uint32_t backoff_ms;	/* the next cool-down's length */
	uint64_t seen_ms;	/* last looked at */
};

struct sc_tcp_health {
	struct sc_tcp_path_health slot[SC_TCP_HEALTH_SLOTS];
};

/* Whether endpoint may be used now: healthy, or its cool-down has ended (the use is its probe).
 * *cooling_ms: how long it still cools (0 when usable). */
bool sc_tcp_health_usable(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms,
			  uint64_t *cooling_ms);
/* endpoint failed: cool it down; returns the cool-down's length (ms). */
uint32_t sc_tcp_health_failed(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms);
/* endpoint carried a stream again; true when it was cooling or probing (it recovered). */
bool sc_tcp_health_ok(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms);

#endif
