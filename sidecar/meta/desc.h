/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/desc.h: one remote descriptor as signed metadata carries it (struct sc_meta_desc), on its
 * own so that meta/metadata.h (the whole metadata) and meta/runs.h (its compact v2 form) share it
 * without including each other. Plain data.
 */
#ifndef SC_META_DESC_H
#define SC_META_DESC_H

#include "base/types.h"

#include <stdbool.h>
#include <stdint.h>

struct sc_meta_desc {
	uint64_t length;
	enum sc_device_kind device_kind;
	uint64_t remote_addr; /* ibverbs only */
	uint32_t rkey;        /* ibverbs only */
	/* Version 2: a run starts here (set by verify, honoured by sign, so that a list keeps the
	 * runs it was read with; otherwise runs follow the addresses alone). */
	bool run_start;
};

#endif
