/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conf/rail_filter.h: which RDMA ports may be rails, as --ib-devices says (NCCL_IB_HCA's shape):
 *
 *   auto                     every port of every device (the default)
 *   mlx5_0,mlx5_3:1          only these devices (every port) or device ports, rails in this order
 *   ^mlx5_1,mlx5_2:2         every port except these
 *
 * Names are 1-63 of A-Z a-z 0-9 _ . -; a port is 1-255. Up to SC_RAIL_FILTER_MAX entries. Pure;
 * any thread.
 */
#ifndef SC_RAIL_FILTER_H
#define SC_RAIL_FILTER_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

#define SC_RAIL_FILTER_MAX 32

struct sc_rail_filter {
	bool exclude; /* "^": entries are left out; else only entries are used */
	size_t n;     /* 0 with exclude false: auto */
	struct sc_rail_filter_entry {
		char device[64];
		int port; /* 0: every port */
	} e[SC_RAIL_FILTER_MAX];
};

/* Parse `text` (NULL or "" or "auto": every port). INVALID_ARGUMENT with what is wrong. */
int sc_rail_filter_parse(const char *text, struct sc_rail_filter *out, struct sc_err *err);
/* The order a port takes among the rails: -1 when the filter leaves it out, else a rank (lower
 * first: an include list's position; every port 0 under auto and exclude lists, where the
 * caller keeps the devices' own order). */
int sc_rail_filter_rank(const struct sc_rail_filter *f, const char *device, int port);
/* Whether the filter names `device` at all (for "--ib-devices names mlx9_0, not found"). */
bool sc_rail_filter_names(const struct sc_rail_filter *f, const char *device);

#endif
