/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/rails.c: the ibverbs backend's rails. At create (main thread) every port of every RDMA
 * device becomes a rail of base.rails, in the order --ib-devices lists them (else by device name,
 * mlx5_2 before mlx5_10, then port), each with what GetInfo shows: PCI address and NUMA node
 * (sysfs, under the device), netdev (the GID's interface), link rate (ibv_query_port's speed x
 * width), and its state: up (ACTIVE with a usable GID), down (port not ACTIVE), unusable (why),
 * excluded (--ib-devices, --ib-device, --ib-port). Port events on the open device (completion
 * thread) move its rails between up and down; every usable rail that opens is a lane and carries
 * data (ib/lanes.c), and a lane that fails is "cooling" (ib/stripe.c). Owns nothing: the devices
 * are opened only while they are looked at, except the lanes' (ib/device.c).
 */
#include "ib/internal.h"

#include "base/log.h"
#include "conf/rail_filter.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CANDIDATES 64 /* ports looked at; the first SC_MAX_RAILS become rails */

struct candidate {
	char dev[64];
	struct ib_pick pick;
	int rank; /* rail_filter's rank; INT_MAX excluded (listed after the others) */
	enum sc_rail_state state;
	char detail[200];
	char pci[32], netdev[32];
	int numa;
	uint64_t rate_mbps;
};

/* "mlx5_2" < "mlx5_10": digits compare as numbers. */
static int natural_cmp(const char *a, const char *b)
{
	while (*a && *b) {
		if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
			unsigned long x = strtoul(a, (char **)&a, 10);
			unsigned long y = strtoul(b, (char **)&b, 10);
			if (x != y)
				return x < y ? -1 : 1;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
		a++;
		b++;
	}
	return *a ? 1 : *b ? -1 : 0;
}

static int cmp_candidates(const void *pa, const void *pb)
{
	const struct candidate *a = pa, *b = pb;
	if (a->rank != b->rank)
		return a->rank < b->rank ? -1 : 1;
	int c = natural_cmp(a->dev, b->dev);
	if (c)
		return c;
	return (int)a->pick.port - (int)b->pick.port;
}

/* The PCI address and NUMA node of a device from sysfs ("" and -1 for a soft device). */
static void device_location(const char *dev, char *pci, size_t cap, int *numa)
{
	char path[256], target[PATH_MAX];
	pci[0] = 0;
	*numa = -1;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", dev);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n > 0) {
		target[n] = 0;
		const char *base = strrchr(target, '/');
		base = base ? base + 1 : target;
		unsigned d, bus, slot, fn;
		if (sscanf(base, "%x:%x:%x.%x", &d, &bus, &slot, &fn) == 4)
			snprintf(pci, cap, "%s", base);
	}
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/numa_node", dev);
	FILE *f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%d", numa) != 1 || *numa < 0)
			*numa = -1;
		fclose(f);
	}
}

/* Signalling rate of one lane, Mb/s, from ibv_port_attr.active_speed. */
static uint64_t lane_mbps(uint8_t speed)
{
	switch (speed) {
	case 1:
		return 2500; /* SDR */
	case 2:
		return 5000; /* DDR */
	case 4:
	case 8:
		return 10000; /* QDR, FDR10 */
	case 16:
		return 14000; /* FDR */
	case 32:
		return 25000; /* EDR */
	case 64:
		return 50000; /* HDR */
	case 128:
		return 100000; /* NDR */
	}
	return 0;
}

static uint64_t port_rate_mbps(const struct ibv_port_attr *pa)
{
	unsigned lanes = 0;
	switch (pa->active_width) {
	case 1:
		lanes = 1;
		break;
	case 2:
		lanes = 4;
		break;
	case 4:
		lanes = 8;
		break;
	case 8:
		lanes = 12;
		break;
	case 16:
		lanes = 2;
		break;
	}
	return lane_mbps(pa->active_speed) * lanes;
}

/* Where the filters put (dev, port): a rank, or INT_MAX with *why when left out. */
static int place(const struct sc_config *cfg, const struct sc_rail_filter *f, const char *dev,
		 uint8_t port, char *why, size_t cap)
{
	if (cfg->ib_port > 0 && port != cfg->ib_port) {
		snprintf(why, cap, "left out by --ib-port %d", cfg->ib_port);
		return INT_MAX;
	}
	int rank = sc_rail_filter_rank(f, dev, port);
	if (rank < 0) {
		snprintf(why, cap, "left out by %s", cfg->ib_device && cfg->ib_device[0]
							  ? "--ib-device"
							  : "--ib-devices");
		return INT_MAX;
	}
	return rank;
}

/* Every port of list[i] into c[*nc...]. */
static void look_at_device(struct ibv_device *d, const struct sc_config *cfg,
			   const struct sc_rail_filter *f, struct candidate *c, size_t *nc)
{
	const char *dev = ibv_get_device_name(d);
	char pci[32];
	int numa;
	device_location(dev, pci, sizeof(pci), &numa);
	struct ibv_context *ctx = ibv_open_device(d);
	struct ibv_device_attr da;
	if (!ctx || ibv_query_device(ctx, &da) != 0) {
		if (*nc < MAX_CANDIDATES) {
			struct candidate *k = &c[(*nc)++];
			memset(k, 0, sizeof(*k));
			snprintf(k->dev, sizeof(k->dev), "%s", dev);
			k->pick.port = 1;
			char why[160];
			k->rank = place(cfg, f, dev, 1, why, sizeof(why));
			k->state = SC_RAIL_UNUSABLE;
			snprintf(k->detail, sizeof(k->detail), "%s: %s: %s", dev,
				 ctx ? "ibv_query_device" : "ibv_open_device", strerror(errno));
			snprintf(k->pci, sizeof(k->pci), "%s", pci);
			k->numa = numa;
		}
		if (ctx)
			ibv_close_device(ctx);
		return;
	}
	for (uint8_t port = 1; port <= da.phys_port_cnt && *nc < MAX_CANDIDATES; port++) {
		struct candidate *k = &c[(*nc)++];
		memset(k, 0, sizeof(*k));
		snprintf(k->dev, sizeof(k->dev), "%s", dev);
		snprintf(k->pci, sizeof(k->pci), "%s", pci);
		k->numa = numa;
		k->pick.port = port;
		char why[160];
		k->rank = place(cfg, f, dev, port, why, sizeof(why));
		if (ibv_query_port(ctx, port, &k->pick.pa) != 0) {
			k->state = SC_RAIL_UNUSABLE;
			snprintf(k->detail, sizeof(k->detail), "%s port %u: ibv_query_port: %s", dev,
				 port, strerror(errno));
			continue;
		}
		k->rate_mbps = port_rate_mbps(&k->pick.pa);
		const char *layer =
		    k->pick.pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
		if (k->rank == INT_MAX) {
			k->state = SC_RAIL_EXCLUDED;
			snprintf(k->detail, sizeof(k->detail), "%s", why);
		} else if (k->pick.pa.state != IBV_PORT_ACTIVE) {
			k->state = SC_RAIL_DOWN;
			snprintf(k->detail, sizeof(k->detail),
				 "port %u is %s, not ACTIVE (check the link / rdma link)", port,
				 ibv_port_state_str(k->pick.pa.state));
		} else if (ib_pick_gid(ctx, dev, &k->pick, cfg->ib_gid_index, why, sizeof(why)) !=
			   0) {
			k->state = SC_RAIL_UNUSABLE;
			snprintf(k->detail, sizeof(k->detail), "%s", why);
		} else {
			k->state = SC_RAIL_UP;
			char gid[64];
			ib_gid_text(&k->pick.gid, gid, sizeof(gid));
			snprintf(k->detail, sizeof(k->detail), "%s, %s gid[%d] %s, mtu %u", layer,
				 ib_gid_type_name(k->pick.gid_type), k->pick.gid_index, gid,
				 ib_mtu_bytes(k->pick.pa.active_mtu));
			char ifname[IF_NAMESIZE];
			if (k->pick.ndev_ifindex && if_indextoname(k->pick.ndev_ifindex, ifname))
				snprintf(k->netdev, sizeof(k->netdev), "%s", ifname);
		}
	}
	ibv_close_device(ctx);
}

void ib_rails_discover(struct ib_backend *ib, const struct sc_config *cfg,
		       struct ibv_device **list, int n, char *why, size_t cap)
{
	struct sc_backend *b = &ib->base;
	struct sc_rail_filter f;
	struct sc_err err = {0};
	const char *text = cfg->ib_device && cfg->ib_device[0] ? cfg->ib_device : cfg->ib_devices;
	if (sc_rail_filter_parse(text, &f, &err) != 0) { /* conf/config.c checked it; be safe */
		snprintf(why, cap, "--ib-devices: %s", err.msg);
		return;
	}
	struct candidate *c = calloc(MAX_CANDIDATES, sizeof(*c));
	if (!c) {
		snprintf(why, cap, "out of memory looking at the RDMA devices");
		return;
	}
	size_t nc = 0;
	for (int i = 0; i < n; i++)
		look_at_device(list[i], cfg, &f, c, &nc);
	qsort(c, nc, sizeof(*c), cmp_candidates);
	for (size_t i = 0; i < nc && b->n_rails < SC_MAX_RAILS; i++) {
		size_t r = b->n_rails++;
		struct sc_rail *rail = &b->rails[r];
		snprintf(rail->name, sizeof(rail->name), "%s:%u", c[i].dev, c[i].pick.port);
		snprintf(rail->pci, sizeof(rail->pci), "%s", c[i].pci);
		snprintf(rail->netdev, sizeof(rail->netdev), "%s", c[i].netdev);
		rail->numa = c[i].numa;
		rail->rate_mbps = c[i].rate_mbps;
		sc_rail_set_state(b, r, c[i].state, "%s", c[i].detail);
		snprintf(ib->rail_port[r].dev, sizeof(ib->rail_port[r].dev), "%s", c[i].dev);
		ib->rail_port[r].pick = c[i].pick;
		ib->rail_port[r].usable = c[i].state == SC_RAIL_UP;
		if (c[i].state != SC_RAIL_UP && c[i].state != SC_RAIL_EXCLUDED && !why[0])
			snprintf(why, cap, "%s: %s", rail->name, c[i].detail);
	}
	if (nc > SC_MAX_RAILS)
		SC_WARN("ibverbs", "%zu RDMA ports found; only the first %d are rails "
			"(choose with --ib-devices)", nc, SC_MAX_RAILS);
	/* Named but not found: say so rather than "no usable port". */
	for (size_t i = 0; i < f.n && !f.exclude; i++) {
		bool seen = false;
		for (size_t k = 0; k < nc && !seen; k++)
			seen = strcmp(c[k].dev, f.e[i].device) == 0;
		if (!seen) {
			char have[160] = "";
			size_t used = 0;
			for (int d = 0; d < n && used < sizeof(have); d++)
				used += (size_t)snprintf(have + used, sizeof(have) - used, "%s%s",
							 d ? ", " : "", ibv_get_device_name(list[d]));
			SC_WARN("ibverbs", "%s names %s, which is not an RDMA device here (have: %s)",
				cfg->ib_device && cfg->ib_device[0] ? "--ib-device" : "--ib-devices",
				f.e[i].device, have);
			if (!why[0] || b->n_rails == 0 || !ib->rail_port[0].usable)
				snprintf(why, cap, "%s %s not found (have: %s)",
					 cfg->ib_device && cfg->ib_device[0] ? "--ib-device"
									     : "--ib-devices",
					 f.e[i].device, have);
		}
	}
	if (!why[0]) {
		bool any = false;
		for (size_t r = 0; r < b->n_rails; r++)
			any = any || ib->rail_port[r].usable;
		if (!any)
			snprintf(why, cap, "every RDMA port is left out by %s",
				 cfg->ib_port > 0 ? "--ib-port" : "--ib-devices");
	}
	free(c);
}

void ib_rails_mark_data_rail(struct ib_backend *ib)
{
	struct sc_backend *b = &ib->base;
	for (size_t r = 0; r < b->n_rails; r++) {
		if (!ib->rail_port[r].usable)
			continue;
		int lane = -1;
		for (size_t k = 0; k < ib->n_lanes; k++)
			if (ib->lanes[k] && ib->lanes[k]->rail == (int)r)
				lane = (int)k;
		struct sc_rail_report rep;
		sc_rail_snapshot(b, r, &rep);
		if (lane < 0)
			sc_rail_set_state(b, r, SC_RAIL_UNUSABLE,
					  "%.120s; could not be opened as a lane (see the log)",
					  rep.detail);
		else if (ib->n_lanes > 1)
			sc_rail_set_state(b, r, SC_RAIL_UP, "%.150s; lane %d of %zu", rep.detail,
					  lane, ib->n_lanes);
	}
}

void ib_rails_port_event(struct ib_backend *ib, uint8_t port, bool active, const char *what)
{
	struct ib_backend *p = ib->primary;
	struct sc_backend *b = ib->top;
	for (size_t r = 0; r < b->n_rails; r++) {
		if (strcmp(p->rail_port[r].dev, ib->dev_name) != 0 ||
		    p->rail_port[r].pick.port != port || !p->rail_port[r].usable)
			continue;
		if (active)
			sc_rail_set_state(b, r, SC_RAIL_UP, "port %u ACTIVE again", port);
		else
			sc_rail_set_state(b, r, SC_RAIL_DOWN, "port %u went down (%s)", port, what);
	}
}
