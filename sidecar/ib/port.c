/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/port.c: a port's facts, the leaves every ib file uses: MTU enum <-> bytes, GID choice on a
 * port (--ib-gid-index, else the first RoCE v2 GID with an IPv4 address on Ethernet, else index
 * 0 on InfiniBand), a GID's text and type name, and lane pairing (which of the issuer's rails a
 * lane of ours talks to). Pure functions of their arguments (ib_pick_gid reads the device's GID
 * table); any thread. Owns nothing. Calls no other ib file.
 */
#include "ib/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

uint32_t ib_mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256:
		return 256;
	case IBV_MTU_512:
		return 512;
	case IBV_MTU_1024:
		return 1024;
	case IBV_MTU_2048:
		return 2048;
	case IBV_MTU_4096:
		return 4096;
	}
	return 0;
}

enum ibv_mtu ib_mtu_from_bytes(uint32_t bytes)
{
	if (bytes >= 4096)
		return IBV_MTU_4096;
	if (bytes >= 2048)
		return IBV_MTU_2048;
	if (bytes >= 1024)
		return IBV_MTU_1024;
	if (bytes >= 512)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

static bool gid_v4mapped(const union ibv_gid *g)
{
	for (int i = 0; i < 10; i++)
		if (g->raw[i])
			return false;
	return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

static bool gid_zero(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

void ib_gid_text(const union ibv_gid *gid, char *out, size_t cap)
{
	char buf[INET6_ADDRSTRLEN] = "?";
	if (gid_v4mapped(gid)) {
		inet_ntop(AF_INET, gid->raw + 12, buf, sizeof(buf));
		snprintf(out, cap, "::ffff:%s", buf);
		return;
	}
	inet_ntop(AF_INET6, gid->raw, buf, sizeof(buf));
	snprintf(out, cap, "%s", buf);
}

const char *ib_gid_type_name(unsigned t)
{
	switch (t) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	}
	return "unknown";
}

/* ---- selection ------------------------------------------------------------------------------- */

int ib_pick_gid(struct ibv_context *ctx, const char *dev, struct ib_pick *p, int want, char *why,
		size_t cap)
{
	struct ibv_gid_entry e;
	if (want >= 0) {
		if (want >= p->pa.gid_tbl_len ||
		    ibv_query_gid_ex(ctx, p->port, (uint32_t)want, &e, 0) != 0 ||
		    gid_zero(&e.gid)) {
			snprintf(why, cap,
				 "%s port %u has no GID at --ib-gid-index %d (table of %d)", dev,
				 p->port, want, p->pa.gid_tbl_len);
			return -1;
		}
		p->gid_index = want;
		p->gid = e.gid;
		p->gid_type = e.gid_type;
		p->ndev_ifindex = e.ndev_ifindex;
		return 0;
	}
	if (p->pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		for (int i = 0; i < p->pa.gid_tbl_len; i++) {
			if (ibv_query_gid_ex(ctx, p->port, (uint32_t)i, &e, 0) != 0)
				continue;
			if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_v4mapped(&e.gid)) {
				p->gid_index = i;
				p->gid = e.gid;
				p->gid_type = e.gid_type;
				p->ndev_ifindex = e.ndev_ifindex;
				return 0;
			}
		}
		snprintf(why, cap,
			 "%s port %u has no RoCE v2 GID with an IPv4 address (is an IPv4 address "
			 "on its netdev?) -- pass --ib-gid-index",
			 dev, p->port);
		return -1;
	}
	if (ibv_query_gid_ex(ctx, p->port, 0, &e, 0) != 0) {
		snprintf(why, cap, "%s port %u: cannot read GID 0: %s", dev, p->port,
			 strerror(errno));
		return -1;
	}
	p->gid_index = 0;
	p->gid = e.gid;
	p->gid_type = e.gid_type;
	p->ndev_ifindex = e.ndev_ifindex;
	return 0;
}

unsigned ib_lane_remote(const struct ib_backend *ib, const struct sc_metadata *md)
{
	size_t rails = 1 + md->n_ib_rails;
	size_t i = ib->lane % rails;
	return i == 0 ? 0 : md->ib_rails[i - 1].index;
}
