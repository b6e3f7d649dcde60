/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/wire.c: the fast path's wire format on the sidecar's side (rdma_sidecar/fast_ring.h):
 * PREPARE and UNPREPARE decoded and checked field by field, submission entries checked, and the
 * ring indices of one session taken and published (see fast/wire.h).
 * Runs on whichever thread calls it (the fast path's session thread); a struct sc_fast_ring is used
 * by one thread at a time. It owns nothing but the copies sc_fast_parse_prepare hands back. Every
 * byte a worker wrote is read once, into a private copy (memcpy or an acquire load), and checked
 * there: the worker may rewrite the shared memory at any moment.
 */
#include "fast/wire.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "fast_ring.h is little-endian");
_Static_assert(RSC_FAST_ID_MAX == SC_ID_MAX, "a region id on the wire is an engine region id");
_Static_assert(RSC_FAST_MSG_PREPARE == 2 && RSC_FAST_MSG_UNPREPARE == 3, "message types");
_Static_assert(SC_OP_READ == 3 && SC_OP_WRITE == 4, "PREPARE's kind is rsc_op_kind");
_Static_assert(SC_BACKEND_LOCAL == 3, "PREPARE's backend is rsc_backend, 0..3");

#define PAGE 4096u
#define ENTRIES_MAX 65536u

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

/* ---- socket messages ------------------------------------------------------------------------- */

uint32_t sc_fast_msg_type(const void *msg, size_t len)
{
	struct rsc_fast_msg_hdr h;
	if (!msg || len < sizeof(h))
		return 0;
	memcpy(&h, msg, sizeof(h));
	if (h.len != len)
		return 0;
	return h.type;
}

/* The header of a message of `type` (its name in `what`): the type and len fields agree with the
 * datagram. */
static int check_hdr(const struct rsc_fast_msg_hdr *h, size_t len, uint32_t type, const char *what,
		     struct sc_err *err)
{
	if (h->type != type)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "message type %" PRIu32 " is not %s (%" PRIu32 ")", h->type, what,
				  type);
	if (h->len != len)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s: its len field says %" PRIu32
				  " bytes but the message has %zu",
				  what, h->len, len);
	return 0;
}

static bool id_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

/* Descriptor i's region_id (wire: RSC_FAST_ID_MAX bytes, NUL-padded) into out (NUL-terminated). */
static int take_region_id(const char *id, size_t i, char out[SC_ID_MAX], struct sc_err *err)
{
	size_t n = strnlen(id, RSC_FAST_ID_MAX);
	if (n == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "descriptor %zu: region_id is empty",
				  i);
	if (n >= SC_ID_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor %zu: region_id longer than %d characters", i,
				  SC_ID_MAX - 1);
	for (size_t k = 0; k < n; k++) {
		unsigned char c = (unsigned char)id[k];
		if (!id_char(c))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor %zu: region_id byte %zu (0x%02x) is outside "
					  "[A-Za-z0-9._-]",
					  i, k, c);
	}
	for (size_t k = n + 1; k < RSC_FAST_ID_MAX; k++) {
		if (id[k] != '\0')
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor %zu: region_id has byte %zu (0x%02x) after "
					  "its NUL; pad it with NULs",
					  i, k, (unsigned char)id[k]);
	}
	memcpy(out, id, n);
	out[n] = '\0';
	return 0;
}

/* The metadata text: printable ASCII, no NUL. */
static int check_metadata(const unsigned char *m, uint32_t n, struct sc_err *err)
{
	for (uint32_t k = 0; k < n; k++) {
		if (m[k] == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata has a NUL byte at offset %" PRIu32
					  " (of %" PRIu32 ")",
					  k, n);
		if (m[k] < 0x20 || m[k] > 0x7e)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata byte %" PRIu32 " (0x%02x) is not printable "
					  "ASCII",
					  k, m[k]);
	}
	return 0;
}

int sc_fast_parse_prepare(const void *msg, size_t len, struct sc_fast_prepared *out,
			  struct sc_err *err)
{
	const unsigned char *b = msg;
	struct rsc_fast_prepare p;
	if (!msg || len < sizeof(p))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "PREPARE is %zu bytes; its fixed part alone is %zu", len,
				  sizeof(p));
	memcpy(&p, b, sizeof(p));
	if (check_hdr(&p.hdr, len, RSC_FAST_MSG_PREPARE, "PREPARE", err) != 0)
		return -1;
	if (p.kind != SC_OP_READ && p.kind != SC_OP_WRITE)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "kind %" PRIu32 " is neither 3 (READ) nor 4 (WRITE)", p.kind);
	if (p.backend > SC_BACKEND_LOCAL)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "backend %" PRIu32 " is not 0 (the fastest both sides offer), "
				  "1 (tcp), 2 (ibverbs) or 3 (local)",
				  p.backend);
	if (p.metadata_len < 1 || p.metadata_len > RSC_FAST_MSG_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata_len %" PRIu32 " is outside 1..%u", p.metadata_len,
				  RSC_FAST_MSG_MAX);
	if (p.n_descs < 1 || p.n_descs > RSC_FAST_DESCS_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "n_descs %" PRIu32 " is outside 1..%u",
				  p.n_descs, RSC_FAST_DESCS_MAX);
	/* Both counts are bounded above: no overflow in 64 bits. */
	uint64_t descs_at = sizeof(p) + round_up(p.metadata_len, 8);
	uint64_t want = descs_at + (uint64_t)p.n_descs * sizeof(struct rsc_fast_desc);
	if (want != len)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "PREPARE with metadata_len %" PRIu32 " and n_descs %" PRIu32
				  " is %" PRIu64 " bytes, not %zu",
				  p.metadata_len, p.n_descs, want, len);
	if (check_metadata(b + sizeof(p), p.metadata_len, err) != 0)
		return -1;

	struct sc_fast_prepared r = {
		.kind = p.kind,
		.backend = p.backend,
		.timeout_ms = p.timeout_ms,
		.n_descs = p.n_descs,
	};
	r.metadata = malloc((size_t)p.metadata_len + 1);
	r.descs = calloc(p.n_descs, sizeof(*r.descs));
	if (!r.metadata || !r.descs) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	memcpy(r.metadata, b + sizeof(p), p.metadata_len);
	r.metadata[p.metadata_len] = '\0';
	for (size_t i = 0; i < r.n_descs; i++) {
		struct rsc_fast_desc d;
		memcpy(&d, b + descs_at + i * sizeof(d), sizeof(d));
		if (take_region_id(d.region_id, i, r.descs[i].region_id, err) != 0)
			goto fail;
		if (d.length == 0) {
			sc_err_set(err, SC_INVALID_ARGUMENT, "descriptor %zu: length is 0", i);
			goto fail;
		}
		if (d.offset > UINT64_MAX - d.length) {
			sc_err_set(err, SC_INVALID_ARGUMENT,
				   "descriptor %zu: offset %" PRIu64 " + length %" PRIu64
				   " overflows 64 bits",
				   i, d.offset, d.length);
			goto fail;
		}
		r.descs[i].offset = d.offset;
		r.descs[i].length = d.length;
	}
	*out = r;
	return 0;
fail:
	sc_fast_prepared_free(&r);
	return -1;
}

void sc_fast_prepared_free(struct sc_fast_prepared *p)
{
	if (!p)
		return;
	free(p->metadata);
	free(p->descs);
	memset(p, 0, sizeof(*p));
}

int sc_fast_parse_unprepare(const void *msg, size_t len, uint32_t *handle, struct sc_err *err)
{
	struct rsc_fast_unprepare u;
	if (!msg || len != sizeof(u))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "UNPREPARE is %zu bytes, not %zu", len,
				  sizeof(u));
	memcpy(&u, msg, sizeof(u));
	if (check_hdr(&u.hdr, len, RSC_FAST_MSG_UNPREPARE, "UNPREPARE", err) != 0)
		return -1;
	if (u.handle == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "UNPREPARE: handle is 0 (PREPARE never hands out 0)");
	if (u.reserved != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "UNPREPARE: reserved is %" PRIu32 ", not 0", u.reserved);
	*handle = u.handle;
	return 0;
}

/* ---- submission entries ---------------------------------------------------------------------- */

int sc_fast_check_sqe(const struct rsc_fast_sqe *e, struct sc_err *err)
{
	if (e->opcode != RSC_FAST_OP_RUN && e->opcode != RSC_FAST_OP_CANCEL)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "unknown opcode %" PRIu32 " (1 = RUN, 2 = CANCEL)", e->opcode);
	for (size_t k = 0; k < sizeof(e->reserved); k++) {
		if (e->reserved[k] != 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "reserved byte %zu is 0x%02x; reserved bytes must be "
					  "zero",
					  k, e->reserved[k]);
	}
	if (e->opcode == RSC_FAST_OP_RUN) {
		if (e->handle == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "RUN needs a handle from PREPARE; handle is 0");
		return 0;
	}
	if (e->handle != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "CANCEL takes no handle (handle is %" PRIu32
				  "); it names its run by target",
				  e->handle);
	if (e->timeout_ms != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "CANCEL takes no timeout_ms (it is %" PRIu64 ")", e->timeout_ms);
	return 0;
}

/* ---- rings ----------------------------------------------------------------------------------- */

static bool entries_ok(uint32_t n)
{
	return n >= 1 && n <= ENTRIES_MAX && (n & (n - 1)) == 0;
}

int sc_fast_ring_layout(uint32_t sq_entries, uint32_t cq_entries, uint64_t *map_size,
			uint64_t *sq_offset, uint64_t *cq_offset)
{
	if (!entries_ok(sq_entries) || !entries_ok(cq_entries))
		return -1;
	uint64_t sq = PAGE; /* the control block fills the first page */
	uint64_t cq = sq + round_up((uint64_t)sq_entries * sizeof(struct rsc_fast_sqe), PAGE);
	uint64_t size = round_up(cq + (uint64_t)cq_entries * sizeof(struct rsc_fast_cqe), PAGE);
	if (map_size)
		*map_size = size;
	if (sq_offset)
		*sq_offset = sq;
	if (cq_offset)
		*cq_offset = cq;
	return 0;
}

void sc_fast_ring_init(struct sc_fast_ring *r, void *base, uint32_t sq_entries,
		       uint32_t cq_entries)
{
	uint64_t size = 0, sq_off = 0, cq_off = 0;
	if (sc_fast_ring_layout(sq_entries, cq_entries, &size, &sq_off, &cq_off) != 0)
		abort(); /* the caller's bug: it sized the memory with the same counts */
	struct rsc_fast_ctl *ctl = base;
	memset(ctl, 0, sizeof(*ctl));
	ctl->magic = RSC_FAST_MAGIC;
	ctl->version = RSC_FAST_VERSION;
	ctl->sq_entries = sq_entries;
	ctl->cq_entries = cq_entries;
	*r = (struct sc_fast_ring){
		.ctl = ctl,
		.sq = (struct rsc_fast_sqe *)((char *)base + sq_off),
		.cq = (struct rsc_fast_cqe *)((char *)base + cq_off),
		.sq_entries = sq_entries,
		.cq_entries = cq_entries,
	};
	/* Publishes the block: whoever sees a zero index through an acquire load sees it all. */
	__atomic_store_n(&ctl->sq_head, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&ctl->cq_tail, 0, __ATOMIC_RELEASE);
}

int sc_fast_ring_take(struct sc_fast_ring *r, uint32_t room, struct rsc_fast_sqe *out,
		      struct sc_err *err)
{
	uint32_t tail = __atomic_load_n(&r->ctl->sq_tail, __ATOMIC_ACQUIRE);
	uint32_t n = tail - r->sq_head;
	if (n > r->sq_entries)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "submission ring tail %" PRIu32 " is %" PRIu32
				  " entries ahead of head %" PRIu32 "; the ring holds %" PRIu32,
				  tail, n, r->sq_head, r->sq_entries);
	if (n == 0 || room == 0)
		return 0;
	memcpy(out, &r->sq[r->sq_head & (r->sq_entries - 1)], sizeof(*out));
	r->sq_head++;
	/* After the copy: the worker may reuse the slot once it sees the new head. */
	__atomic_store_n(&r->ctl->sq_head, r->sq_head, __ATOMIC_RELEASE);
	return 1;
}

uint32_t sc_fast_ring_cq_room(const struct sc_fast_ring *r)
{
	uint32_t head = __atomic_load_n(&r->ctl->cq_head, __ATOMIC_ACQUIRE);
	/* Ahead of cq_tail wraps to more than the ring holds, as does too far behind. */
	uint32_t used = r->cq_tail - head;
	if (used > r->cq_entries)
		return 0;
	return r->cq_entries - used;
}

int sc_fast_ring_cq_space(const struct sc_fast_ring *r, uint32_t *room, struct sc_err *err)
{
	uint32_t head = __atomic_load_n(&r->ctl->cq_head, __ATOMIC_SEQ_CST);
	uint32_t used = r->cq_tail - head;
	if (used > r->cq_entries)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "completion ring head %" PRIu32 " is %s tail %" PRIu32
				  " (the ring holds %" PRIu32 ")",
				  head, (int32_t)used < 0 ? "ahead of" : "too far behind",
				  r->cq_tail, r->cq_entries);
	*room = r->cq_entries - used;
	return 0;
}

void sc_fast_ring_need_wakeup(struct sc_fast_ring *r, bool on)
{
	if (r->need_wakeup == on)
		return;
	r->need_wakeup = on;
	__atomic_store_n(&r->ctl->cq_flags, on ? RSC_FAST_CQ_NEED_WAKEUP : 0u, __ATOMIC_SEQ_CST);
}

void sc_fast_ring_post(struct sc_fast_ring *r, const struct rsc_fast_cqe *c)
{
	memcpy(&r->cq[r->cq_tail & (r->cq_entries - 1)], c, sizeof(*c));
	r->cq_tail++;
	__atomic_store_n(&r->ctl->cq_tail, r->cq_tail, __ATOMIC_RELEASE);
}

void sc_fast_cqe_fill(struct rsc_fast_cqe *c, uint64_t user_data, int code, uint32_t status,
		      uint64_t bytes, uint32_t backend, const char *message)
{
	memset(c, 0, sizeof(*c));
	c->user_data = user_data;
	c->code = (int32_t)code;
	c->status = status;
	c->bytes = bytes;
	c->backend = backend;
	if (message) {
		size_t n = strnlen(message, sizeof(c->message) - 1);
		memcpy(c->message, message, n);
		/* memset above: c->message[n] is already NUL */
	}
}
