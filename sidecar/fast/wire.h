/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/wire.h: what a worker writes on the fast path, checked and decoded (rdma_sidecar/fast_ring.h
 * is the format): PREPARE and UNPREPARE messages, submission entries, and the ring indices the
 * worker owns. Pure functions over memory the caller hands in; no I/O, no engine, no locks.
 *
 * The ring memory is shared with a worker that may write anything at any time: every value the
 * sidecar acts on is read once (an acquire load, or a copy of the whole entry) and checked in its
 * copy, so the worker cannot change it between the check and the use.
 */
#ifndef SC_FAST_WIRE_H
#define SC_FAST_WIRE_H

#include "base/types.h"
#include "base/status.h"

#include <rdma_sidecar/fast_ring.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A PREPARE, decoded: owned copies. */
struct sc_fast_prepared {
	uint32_t kind; /* 3 = READ, 4 = WRITE */
	uint32_t backend;
	uint64_t timeout_ms;
	char *metadata; /* NUL-terminated copy */
	struct sc_fast_prepared_desc {
		char region_id[SC_ID_MAX]; /* NUL-terminated */
		uint64_t offset;
		uint64_t length;
	} *descs;
	size_t n_descs;
};

/* Checks and copies msg[0..len) (the whole datagram). 0, or -1 with err (INVALID_ARGUMENT saying
 * which field is wrong); *out is filled only on 0. */
int sc_fast_parse_prepare(const void *msg, size_t len, struct sc_fast_prepared *out,
			  struct sc_err *err);
void sc_fast_prepared_free(struct sc_fast_prepared *p); /* zeroed or freed struct ok */
int sc_fast_parse_unprepare(const void *msg, size_t len, uint32_t *handle, struct sc_err *err);
/* The type of a datagram from the worker, 0 when it is too short or its len field disagrees. */
uint32_t sc_fast_msg_type(const void *msg, size_t len);

/* A RUN or CANCEL entry that makes sense on its own (opcode known, reserved bytes zero, RUN with a
 * handle). Whether the handle exists is the session's business. 0, or -1 with err. */
int sc_fast_check_sqe(const struct rsc_fast_sqe *e, struct sc_err *err);

/* The sidecar's view of one session's rings. base is the mapping (fast_ring.h layout); the private
 * indices are the sidecar's own and never read back from shared memory. */
struct sc_fast_ring {
	struct rsc_fast_ctl *ctl;
	struct rsc_fast_sqe *sq;
	struct rsc_fast_cqe *cq;
	uint32_t sq_entries, cq_entries; /* powers of two */
	uint32_t sq_head;		 /* next entry to take */
	uint32_t cq_tail;		 /* next completion to write */
	bool need_wakeup;		 /* what the sidecar last stored in cq_flags */
};

/* The memfd's size and the entry arrays' offsets for these entry counts (powers of two, 1..65536):
 * 0, or -1 when a count is not allowed. */
int sc_fast_ring_layout(uint32_t sq_entries, uint32_t cq_entries, uint64_t *map_size,
			uint64_t *sq_offset, uint64_t *cq_offset);
/* Writes the control block (magic, version, counts, zero indices) into fresh memory of
 * sc_fast_ring_layout's map_size and sets up r. */
void sc_fast_ring_init(struct sc_fast_ring *r, void *base, uint32_t sq_entries,
		       uint32_t cq_entries);
/*
 * Takes the next submission into *out (a copy) when one is there and `room` > 0: 1 taken (sq_head
 * advanced and published), 0 none, -1 when the worker's sq_tail is impossible (more entries than
 * the ring holds ahead of sq_head: err says so, and nothing is taken).
 */
int sc_fast_ring_take(struct sc_fast_ring *r, uint32_t room, struct rsc_fast_sqe *out,
		      struct sc_err *err);
/* Completions the ring can take now as the worker's cq_head says: cq_entries - (cq_tail - head),
 * 0 when its head is impossible (ahead of cq_tail, or further behind than the ring holds). */
uint32_t sc_fast_ring_cq_room(const struct sc_fast_ring *r);
/* The same, as the session uses it: *room, or -1 with err (INVALID_ARGUMENT saying what the
 * impossible head is; the session ends) when the head is ahead of cq_tail or further behind than
 * the ring holds. Reads cq_head sequentially consistent (the wake-up handshake below). */
int sc_fast_ring_cq_space(const struct sc_fast_ring *r, uint32_t *room, struct sc_err *err);
/* Sets (on) or clears RSC_FAST_CQ_NEED_WAKEUP in cq_flags. Set it, then look at the room again
 * with sc_fast_ring_cq_space before sleeping: the worker stores cq_head, then loads cq_flags, so
 * one of the two sides sees the other's store. Stores only when the flag changes. */
void sc_fast_ring_need_wakeup(struct sc_fast_ring *r, bool on);
/* Writes c at cq_tail and publishes it (release). The caller keeps to sc_fast_ring_cq_room. */
void sc_fast_ring_post(struct sc_fast_ring *r, const struct rsc_fast_cqe *c);
/* A CQE from its parts; message truncated to fit, always NUL-terminated. */
void sc_fast_cqe_fill(struct rsc_fast_cqe *c, uint64_t user_data, int code, uint32_t status,
		      uint64_t bytes, uint32_t backend, const char *message);

#endif
