/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/types.h: the vocabulary every layer shares: device, operation and backend kinds, operation
 * statuses, and the sizes of ids and names. Values equal the proto enums of rdma_sidecar.v1.
 *
 * Types and constants only, so a file that needs an operation kind or SC_NAME_MAX includes this,
 * not the engine's API (engine/engine.h). Their names (sc_op_kind_name and friends) are in engine/engine.h.
 */
#ifndef SC_TYPES_H
#define SC_TYPES_H

#include <stdbool.h>
#include <stdint.h>

enum sc_device_kind { SC_DEVICE_UNSPECIFIED = 0, SC_DEVICE_HOST = 1, SC_DEVICE_CUDA = 2 };
enum sc_op_kind { SC_OP_NONE = 0, SC_OP_READABLE = 1, SC_OP_WRITABLE = 2, SC_OP_READ = 3, SC_OP_WRITE = 4 };
enum sc_op_status {
	SC_OPS_UNSPECIFIED = 0,
	SC_OPS_INITIALIZED = 1,
	SC_OPS_IN_PROGRESS = 2,
	SC_OPS_COMPLETE = 3,
	SC_OPS_CANCELLED = 4,
	SC_OPS_ERRORED = 5,
	SC_OPS_SCHEDULED = 6,
};
enum sc_backend_kind { SC_BACKEND_NONE = 0, SC_BACKEND_TCP = 1, SC_BACKEND_IBVERBS = 2, SC_BACKEND_LOCAL = 3,
		       SC_BACKEND_LIBFABRIC = 4 };
/* Backend kinds are below this: the proto's Backend values, and room for test-only backends. */
#define SC_BACKEND_KIND_MAX 6
#define SC_NUM_BACKENDS SC_BACKEND_KIND_MAX /* arrays indexed by enum sc_backend_kind */

#define SC_ID_MAX 40
#define SC_NAME_MAX 128

static inline bool sc_op_status_terminal(enum sc_op_status s)
{
	return s == SC_OPS_COMPLETE || s == SC_OPS_CANCELLED || s == SC_OPS_ERRORED;
}

/* A rail: one path of the data plane (an RDMA port, a TCP data endpoint); backend/backend.h has the live
 * object, these are its states and the plain copy GetInfo and the metrics report. */
#define SC_MAX_RAILS 16 /* per backend */
enum sc_rail_state {
	SC_RAIL_UP = 0,
	SC_RAIL_DOWN,	  /* link or port down, or it failed (detail says which) */
	SC_RAIL_COOLING,  /* failed; not used again before its cool-down ends */
	SC_RAIL_UNUSABLE, /* found, but cannot carry data (detail says why) */
	SC_RAIL_EXCLUDED, /* left out by configuration */
	SC_RAIL_ABSENT,	  /* named by the topology file only */
};

struct sc_rail_report {
	char name[64];
	char pci[32];
	char netdev[32];
	int numa; /* -1 unknown */
	uint64_t rate_mbps;
	enum sc_rail_state state;
	char detail[200];
	uint64_t bytes, operations, errors, failovers;
};

/* A rail named with its backend, as GetInfo and the metrics list them. */
struct sc_rail_entry {
	enum sc_backend_kind backend;
	uint32_t index; /* among its backend's rails */
	struct sc_rail_report r;
};

static inline const char *sc_rail_state_name(enum sc_rail_state s)
{
	switch (s) {
	case SC_RAIL_UP:
		return "up";
	case SC_RAIL_DOWN:
		return "down";
	case SC_RAIL_COOLING:
		return "cooling";
	case SC_RAIL_UNUSABLE:
		return "unusable";
	case SC_RAIL_EXCLUDED:
		return "excluded";
	case SC_RAIL_ABSENT:
		return "absent";
	}
	return "unknown";
}

/* What the fast path (fast/socket.c, fast/session.c) counts, for the metrics. */
enum sc_fast_event {
	SC_FAST_SESSION_OPENED,
	SC_FAST_SESSION_CLOSED,
	SC_FAST_SESSION_REFUSED, /* --allowed-uids, --fast-path-max-sessions */
	SC_FAST_RUN_COMPLETE,
	SC_FAST_RUN_FAILED,  /* the transfer ended CANCELLED or ERRORED */
	SC_FAST_RUN_REFUSED, /* a bad entry, an unknown handle, or sc_op_begin refused it */
	SC_FAST_EVENTS,
};

#endif
