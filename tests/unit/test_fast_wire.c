/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_fast_wire.c: the fast path's wire checks (sidecar/fast/wire.h). PREPARE decoded field by
 * field from an unaligned buffer (odd metadata length, so the padding before the descriptors
 * matters; several descriptors; the largest id and descriptor count), and every malformed PREPARE
 * refused with INVALID_ARGUMENT and a message naming the field, leaving *out alone; UNPREPARE and
 * the datagram type; submission entries; the ring layout and control block; take in order across
 * the wrap of the uint32 indices, limited by room, an impossible tail refused with nothing taken;
 * completion room with sane and impossible heads; post; and a completion's message cut to fit.
 * Single-threaded: the test plays the worker's side of the ring itself.
 */
#include "check.h"

#include "fast/wire.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------------------- */

/* Room for the largest PREPARE the tests write, plus one byte to misalign it. */
static uint8_t raw[1 + 70000];
static uint8_t *const buf = raw + 1;

static void put32(uint8_t *m, size_t off, uint32_t v)
{
	memcpy(m + off, &v, sizeof(v));
}

static void put64(uint8_t *m, size_t off, uint64_t v)
{
	memcpy(m + off, &v, sizeof(v));
}

static struct rsc_fast_desc desc(const char *id, uint64_t offset, uint64_t length)
{
	struct rsc_fast_desc d;
	memset(&d, 0, sizeof(d));
	memcpy(d.region_id, id, strnlen(id, sizeof(d.region_id)));
	d.offset = offset;
	d.length = length;
	return d;
}

/* A PREPARE as a worker writes it into m (the padding after the metadata is 0xaa: it is never
 * read); returns its length. */
static size_t encode_prepare(uint8_t *m, uint32_t kind, uint32_t backend, uint64_t timeout_ms,
			     const char *meta, uint32_t meta_len, const struct rsc_fast_desc *d,
			     uint32_t n)
{
	struct rsc_fast_prepare p;
	memset(&p, 0, sizeof(p));
	size_t descs_at = sizeof(p) + (meta_len + 7u) / 8u * 8u;
	size_t len = descs_at + (size_t)n * sizeof(*d);
	p.hdr.type = RSC_FAST_MSG_PREPARE;
	p.hdr.len = (uint32_t)len;
	p.hdr.token = 0x1122334455667788ull;
	p.kind = kind;
	p.backend = backend;
	p.timeout_ms = timeout_ms;
	p.metadata_len = meta_len;
	p.n_descs = n;
	memcpy(m, &p, sizeof(p));
	memcpy(m + sizeof(p), meta, meta_len);
	memset(m + sizeof(p) + meta_len, 0xaa, descs_at - sizeof(p) - meta_len);
	memcpy(m + descs_at, d, (size_t)n * sizeof(*d));
	return len;
}

static size_t encode_unprepare(uint8_t *m, uint32_t handle, uint32_t reserved)
{
	struct rsc_fast_unprepare u = {
		.hdr = {.type = RSC_FAST_MSG_UNPREPARE, .len = sizeof(u), .token = 7},
		.handle = handle,
		.reserved = reserved,
	};
	memcpy(m, &u, sizeof(u));
	return sizeof(u);
}

/* Ring memory as the sidecar maps it (page aligned), and the worker's view of its indices. */
static void *ring_new(struct sc_fast_ring *r, uint32_t sq_entries, uint32_t cq_entries)
{
	uint64_t size = 0;
	if (sc_fast_ring_layout(sq_entries, cq_entries, &size, NULL, NULL) != 0)
		return NULL;
	void *base = aligned_alloc(4096, size);
	if (!base)
		return NULL;
	memset(base, 0, size);
	sc_fast_ring_init(r, base, sq_entries, cq_entries);
	return base;
}

/* Both sides' indices moved to `at`, as if that many entries had gone through. */
static void ring_seek(struct sc_fast_ring *r, uint32_t sq_at, uint32_t cq_at)
{
	r->sq_head = sq_at;
	r->ctl->sq_head = sq_at;
	r->ctl->sq_tail = sq_at;
	r->cq_tail = cq_at;
	r->ctl->cq_tail = cq_at;
	r->ctl->cq_head = cq_at;
}

/* The worker writes a RUN with user_data u at its tail and advances it. */
static void worker_submit(struct sc_fast_ring *r, uint64_t u)
{
	uint32_t tail = r->ctl->sq_tail;
	struct rsc_fast_sqe e;
	memset(&e, 0, sizeof(e));
	e.user_data = u;
	e.opcode = RSC_FAST_OP_RUN;
	e.handle = 1;
	r->sq[tail & (r->sq_entries - 1)] = e;
	__atomic_store_n(&r->ctl->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* ---- PREPARE --------------------------------------------------------------------------------- */

TEST(prepare_decoded)
{
	static const char meta[] = "rsm1.eyJhIjoxfQ.sig-7"; /* 21 bytes: 3 of padding */
	char id39[40];
	memset(id39, 'z', 39);
	id39[39] = '\0';
	struct rsc_fast_desc d[3] = {
		desc("region-a", 0, 4096),
		desc("r.b_2", 100, 1),
		desc(id39, UINT64_MAX - 1, 1), /* ends at UINT64_MAX exactly */
	};
	size_t len = encode_prepare(buf, 3, 2, 1234, meta, sizeof(meta) - 1, d, 3);
	CHECK_U64_EQ(len, 40 + 24 + 3 * 56);
	struct sc_fast_prepared out;
	memset(&out, 0, sizeof(out));
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_fast_parse_prepare(buf, len, &out, &err), 0);
	CHECK_INT_EQ(out.kind, 3);
	CHECK_INT_EQ(out.backend, 2);
	CHECK_U64_EQ(out.timeout_ms, 1234);
	CHECK_STR_EQ(out.metadata, meta);
	CHECK_U64_EQ(out.n_descs, 3);
	CHECK_STR_EQ(out.descs[0].region_id, "region-a");
	CHECK_U64_EQ(out.descs[0].offset, 0);
	CHECK_U64_EQ(out.descs[0].length, 4096);
	CHECK_STR_EQ(out.descs[1].region_id, "r.b_2");
	CHECK_U64_EQ(out.descs[1].offset, 100);
	CHECK_U64_EQ(out.descs[1].length, 1);
	CHECK_STR_EQ(out.descs[2].region_id, id39);
	CHECK_U64_EQ(out.descs[2].offset, UINT64_MAX - 1);
	CHECK_U64_EQ(out.descs[2].length, 1);
	sc_fast_prepared_free(&out);
	CHECK(out.metadata == NULL && out.descs == NULL && out.n_descs == 0);
	sc_fast_prepared_free(&out); /* a freed struct again */
	sc_fast_prepared_free(NULL);

	/* WRITE, backend 0, one byte of metadata (7 of padding), timeout 0. */
	len = encode_prepare(buf, 4, 0, 0, "x", 1, d, 1);
	CHECK_U64_EQ(len, 40 + 8 + 56);
	CHECK_INT_EQ(sc_fast_parse_prepare(buf, len, &out, &err), 0);
	CHECK_INT_EQ(out.kind, 4);
	CHECK_INT_EQ(out.backend, 0);
	CHECK_U64_EQ(out.timeout_ms, 0);
	CHECK_STR_EQ(out.metadata, "x");
	CHECK_U64_EQ(out.n_descs, 1);
	CHECK_STR_EQ(out.descs[0].region_id, "region-a");
	sc_fast_prepared_free(&out);

	/* Metadata a multiple of 8 (no padding) and every backend. */
	for (uint32_t be = 0; be <= 3; be++) {
		len = encode_prepare(buf, 3, be, 5, "rsm1.abc", 8, d, 2);
		CHECK_U64_EQ(len, 40 + 8 + 2 * 56);
		CHECK_INT_EQ(sc_fast_parse_prepare(buf, len, &out, &err), 0);
		CHECK_INT_EQ(out.backend, be);
		CHECK_STR_EQ(out.descs[1].region_id, "r.b_2");
		sc_fast_prepared_free(&out);
	}
}

TEST(prepare_most_descriptors)
{
	static struct rsc_fast_desc d[RSC_FAST_DESCS_MAX];
	char id[16];
	for (uint32_t i = 0; i < RSC_FAST_DESCS_MAX; i++) {
		snprintf(id, sizeof(id), "r%u", i);
		d[i] = desc(id, (uint64_t)i * 64, 64);
	}
	size_t len = encode_prepare(buf, 3, 1, 0, "rsm1.m", 6, d, RSC_FAST_DESCS_MAX);
	struct sc_fast_prepared out;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_fast_parse_prepare(buf, len, &out, &err), 0);
	CHECK_U64_EQ(out.n_descs, RSC_FAST_DESCS_MAX);
	CHECK_STR_EQ(out.descs[1023].region_id, "r1023");
	CHECK_U64_EQ(out.descs[1023].offset, 1023 * 64);
	sc_fast_prepared_free(&out);
}

/* The message prepare_rejected starts from: 8 bytes of metadata, three descriptors, 216 bytes. */
#define BASE_LEN (40 + 8 + 3 * 56)
#define DESC_AT(i, field) (48 + (i) * 56 + offsetof(struct rsc_fast_desc, field))
#define PREP_AT(field) offsetof(struct rsc_fast_prepare, field)

struct reject {
	const char *why;
	int len_delta;	/* the datagram's length changes by this (hdr.len follows) */
	size_t off;	/* then this field is overwritten ... */
	int width;	/* ... with value (1, 4 or 8 bytes), or with id_len bytes of id (0) */
	uint64_t value;
	const char *id;
	size_t id_len;
	const char *want; /* in the message */
};

static const char id40[] = "0123456789012345678901234567890123456789";

static const struct reject rejects[] = {
	{"shorter than the fixed part", 39 - BASE_LEN, 0, -1, 0, NULL, 0, "fixed part alone is 40"},
	{"type UNPREPARE", 0, PREP_AT(hdr.type), 4, 3, NULL, 0, "message type 3 is not PREPARE"},
	{"len field disagrees", 0, PREP_AT(hdr.len), 4, BASE_LEN + 8, NULL, 0,
	 "len field says 224 bytes but the message has 216"},
	{"one byte short", -1, 0, -1, 0, NULL, 0, "is 216 bytes, not 215"},
	{"8 bytes too many", 8, 0, -1, 0, NULL, 0, "is 216 bytes, not 224"},
	{"metadata_len 9 pads to 16", 0, PREP_AT(metadata_len), 4, 9, NULL, 0,
	 "metadata_len 9 and n_descs 3 is 224 bytes, not 216"},
	{"n_descs 2", 0, PREP_AT(n_descs), 4, 2, NULL, 0, "is 160 bytes, not 216"},
	{"kind READABLE", 0, PREP_AT(kind), 4, 1, NULL, 0, "kind 1 is neither"},
	{"kind 5", 0, PREP_AT(kind), 4, 5, NULL, 0, "kind 5 is neither 3 (READ) nor 4 (WRITE)"},
	{"backend 4", 0, PREP_AT(backend), 4, 4, NULL, 0, "backend 4 is not"},
	{"metadata_len 0", 0, PREP_AT(metadata_len), 4, 0, NULL, 0,
	 "metadata_len 0 is outside 1..65536"},
	{"metadata_len too big", 0, PREP_AT(metadata_len), 4, RSC_FAST_MSG_MAX + 1, NULL, 0,
	 "metadata_len 65537 is outside"},
	{"no descriptors", 0, PREP_AT(n_descs), 4, 0, NULL, 0, "n_descs 0 is outside 1..1024"},
	{"too many descriptors", 0, PREP_AT(n_descs), 4, RSC_FAST_DESCS_MAX + 1, NULL, 0,
	 "n_descs 1025 is outside"},
	{"NUL in metadata", 0, 40 + 4, 1, 0, NULL, 0, "metadata has a NUL byte at offset 4"},
	{"newline in metadata", 0, 40 + 2, 1, '\n', NULL, 0,
	 "metadata byte 2 (0x0a) is not printable ASCII"},
	{"high byte in metadata", 0, 40 + 7, 1, 0xc3, NULL, 0, "metadata byte 7 (0xc3)"},
	{"DEL in metadata", 0, 40 + 0, 1, 0x7f, NULL, 0, "metadata byte 0 (0x7f)"},
	{"empty id", 0, DESC_AT(2, region_id), 0, 0, "", 0, "descriptor 2: region_id is empty"},
	{"id starts with NUL, junk after", 0, DESC_AT(2, region_id), 0, 0, "\0abc", 4,
	 "descriptor 2: region_id is empty"},
	{"slash in id", 0, DESC_AT(1, region_id), 0, 0, "ab/c", 4,
	 "descriptor 1: region_id byte 2 (0x2f) is outside [A-Za-z0-9._-]"},
	{"space in id", 0, DESC_AT(0, region_id), 0, 0, " a", 2,
	 "descriptor 0: region_id byte 0 (0x20)"},
	{"40-character id", 0, DESC_AT(0, region_id), 0, 0, id40, 40,
	 "descriptor 0: region_id longer than 39 characters"},
	{"junk after the id's NUL", 0, DESC_AT(1, region_id), 0, 0, "ab\0x", 4,
	 "descriptor 1: region_id has byte 3 (0x78) after its NUL"},
	{"junk in the id's last byte", 0, DESC_AT(1, region_id) + 39, 1, 'q', NULL, 0,
	 "descriptor 1: region_id has byte 39"},
	{"length 0", 0, DESC_AT(2, length), 8, 0, NULL, 0, "descriptor 2: length is 0"},
	{"offset + length overflows", 0, DESC_AT(1, offset), 8, UINT64_MAX, NULL, 0,
	 "descriptor 1: offset 18446744073709551615 + length 1 overflows 64 bits"},
	{"offset 2 + length max", 0, DESC_AT(0, length), 8, UINT64_MAX - 1, NULL, 0,
	 "descriptor 0: offset 2 + length 18446744073709551614 overflows"},
};

TEST(prepare_rejected)
{
	struct rsc_fast_desc d[3] = {desc("a", 2, 8), desc("b", 0, 1), desc("c", 0, 16)};
	for (size_t i = 0; i < sizeof(rejects) / sizeof(rejects[0]); i++) {
		const struct reject *c = &rejects[i];
		memset(raw, 0, sizeof(raw));
		size_t len = encode_prepare(buf, 3, 1, 0, "rsm1.abc", 8, d, 3);
		CHECK_U64_EQ(len, BASE_LEN);
		len = (size_t)((long)len + c->len_delta);
		put32(buf, PREP_AT(hdr.len), (uint32_t)len);
		if (c->width == 1)
			buf[c->off] = (uint8_t)c->value;
		else if (c->width == 4)
			put32(buf, c->off, (uint32_t)c->value);
		else if (c->width == 8)
			put64(buf, c->off, c->value);
		else if (c->width == 0) {
			memset(buf + c->off, 0, RSC_FAST_ID_MAX);
			memcpy(buf + c->off, c->id, c->id_len);
		}
		struct sc_fast_prepared out;
		memset(&out, 0, sizeof(out));
		out.kind = 99;
		struct sc_err err = {0};
		int rc = sc_fast_parse_prepare(buf, len, &out, &err);
		if (rc != -1)
			CHECK_FAIL_("%s: accepted (rc %d)", c->why, rc);
		if (err.code != SC_INVALID_ARGUMENT)
			CHECK_FAIL_("%s: code %s", c->why, sc_status_name(err.code));
		if (!strstr(err.msg, c->want))
			CHECK_FAIL_("%s: message \"%s\" lacks \"%s\"", c->why, err.msg, c->want);
		if (out.kind != 99 || out.metadata || out.descs || out.n_descs)
			CHECK_FAIL_("%s: *out written on failure", c->why);
		/* Without an err, the same answer. */
		CHECK_INT_EQ(sc_fast_parse_prepare(buf, len, &out, NULL), -1);
	}
	struct sc_err err = {0};
	struct sc_fast_prepared out;
	CHECK_INT_EQ(sc_fast_parse_prepare(NULL, 0, &out, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
}

/* ---- UNPREPARE and the datagram type -------------------------------------------------------- */

TEST(unprepare)
{
	struct sc_err err = {0};
	uint32_t h = 0;
	size_t len = encode_unprepare(buf, 42, 0);
	CHECK_U64_EQ(len, 24);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len, &h, &err), 0);
	CHECK_INT_EQ(h, 42);

	h = 5;
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len - 1, &h, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "UNPREPARE is 23 bytes, not 24");
	CHECK_INT_EQ(h, 5);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len + 8, &h, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "UNPREPARE is 32 bytes");

	encode_unprepare(buf, 42, 0);
	put32(buf, offsetof(struct rsc_fast_msg_hdr, type), RSC_FAST_MSG_PREPARE);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len, &h, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "message type 2 is not UNPREPARE (3)");

	encode_unprepare(buf, 42, 0);
	put32(buf, offsetof(struct rsc_fast_msg_hdr, len), 25);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len, &h, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "len field says 25 bytes but the message has 24");

	encode_unprepare(buf, 0, 0);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len, &h, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "handle is 0");

	encode_unprepare(buf, 42, 1);
	CHECK_INT_EQ(sc_fast_parse_unprepare(buf, len, &h, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "reserved is 1");
	CHECK_INT_EQ(h, 5);
}

TEST(msg_type)
{
	size_t len = encode_unprepare(buf, 1, 0);
	CHECK_INT_EQ(sc_fast_msg_type(buf, len), RSC_FAST_MSG_UNPREPARE);
	CHECK_INT_EQ(sc_fast_msg_type(buf, len - 1), 0); /* len field disagrees */
	CHECK_INT_EQ(sc_fast_msg_type(buf, 15), 0);	 /* shorter than a header */
	CHECK_INT_EQ(sc_fast_msg_type(buf, 0), 0);
	CHECK_INT_EQ(sc_fast_msg_type(NULL, 0), 0);
	struct rsc_fast_desc d = desc("r", 0, 1);
	len = encode_prepare(buf, 3, 0, 0, "abc", 3, &d, 1);
	CHECK_INT_EQ(sc_fast_msg_type(buf, len), RSC_FAST_MSG_PREPARE);
	/* A bare header of an unknown type: the type, for the caller to refuse. */
	struct rsc_fast_msg_hdr h = {.type = 77, .len = sizeof(h)};
	memcpy(buf, &h, sizeof(h));
	CHECK_INT_EQ(sc_fast_msg_type(buf, sizeof(h)), 77);
}

/* ---- submission entries ---------------------------------------------------------------------- */

static int check_sqe(const struct rsc_fast_sqe *e, struct sc_err *err)
{
	memset(err, 0, sizeof(*err));
	return sc_fast_check_sqe(e, err);
}

TEST(sqe_checked)
{
	struct sc_err err;
	struct rsc_fast_sqe run = {.user_data = 9, .opcode = RSC_FAST_OP_RUN, .handle = 3,
				   .timeout_ms = 500};
	struct rsc_fast_sqe cancel = {.user_data = 10, .opcode = RSC_FAST_OP_CANCEL, .target = 9};
	CHECK_INT_EQ(check_sqe(&run, &err), 0);
	CHECK_INT_EQ(check_sqe(&cancel, &err), 0);

	struct rsc_fast_sqe e = run;
	e.handle = 0;
	CHECK_INT_EQ(check_sqe(&e, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "RUN needs a handle");

	e = cancel;
	e.handle = 4;
	CHECK_INT_EQ(check_sqe(&e, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "CANCEL takes no handle (handle is 4)");

	e = cancel;
	e.timeout_ms = 7;
	CHECK_INT_EQ(check_sqe(&e, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "CANCEL takes no timeout_ms (it is 7)");

	e = run;
	e.opcode = 7;
	CHECK_INT_EQ(check_sqe(&e, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "unknown opcode 7");
	e.opcode = 0;
	CHECK_INT_EQ(check_sqe(&e, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "unknown opcode 0");

	for (size_t k = 0; k < sizeof(e.reserved); k++) {
		e = (k & 1) ? cancel : run;
		e.reserved[k] = 0x80;
		if (check_sqe(&e, &err) != -1)
			CHECK_FAIL_("reserved byte %zu set: accepted", k);
		char want[64];
		snprintf(want, sizeof(want), "reserved byte %zu is 0x80", k);
		CHECK_STR_CONTAINS(err.msg, want);
	}
}

/* ---- ring layout and control block ----------------------------------------------------------- */

TEST(ring_layout)
{
	uint64_t size = 0, sq = 0, cq = 0;
	CHECK_INT_EQ(sc_fast_ring_layout(1, 1, &size, &sq, &cq), 0);
	CHECK_U64_EQ(sq, 4096);
	CHECK_U64_EQ(cq, 8192);
	CHECK_U64_EQ(size, 12288);
	/* 4 KiB of SQEs, 16 KiB of CQEs */
	CHECK_INT_EQ(sc_fast_ring_layout(64, 128, &size, &sq, &cq), 0);
	CHECK_U64_EQ(sq, 4096);
	CHECK_U64_EQ(cq, 8192);
	CHECK_U64_EQ(size, 8192 + 16384);
	CHECK_INT_EQ(sc_fast_ring_layout(128, 2, &size, &sq, &cq), 0);
	CHECK_U64_EQ(cq, 4096 + 8192);
	CHECK_U64_EQ(size, 4096 + 8192 + 4096);
	CHECK_INT_EQ(sc_fast_ring_layout(65536, 65536, &size, &sq, &cq), 0);
	CHECK_U64_EQ(sq, 4096);
	CHECK_U64_EQ(cq, 4096 + 65536ull * 64);
	CHECK_U64_EQ(size, 4096 + 65536ull * 64 + 65536ull * 128);

	static const uint32_t bad[] = {0, 3, 6, 100, 65537, 131072, 1u << 31, UINT32_MAX};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size = sq = cq = 1;
		if (sc_fast_ring_layout(bad[i], 8, &size, &sq, &cq) != -1 ||
		    sc_fast_ring_layout(8, bad[i], &size, &sq, &cq) != -1)
			CHECK_FAIL_("entry count %u accepted", bad[i]);
		if (size != 1 || sq != 1 || cq != 1)
			CHECK_FAIL_("entry count %u: outputs written on failure", bad[i]);
	}
}

TEST(ring_init)
{
	uint64_t size = 0, sq = 0, cq = 0;
	CHECK_INT_EQ(sc_fast_ring_layout(8, 16, &size, &sq, &cq), 0);
	uint8_t *base = aligned_alloc(4096, size);
	CHECK(base != NULL);
	memset(base, 0xff, 4096); /* the control block is written whole, pads included */
	memset(base + 4096, 0, size - 4096);
	struct sc_fast_ring r;
	memset(&r, 0x5a, sizeof(r));
	sc_fast_ring_init(&r, base, 8, 16);
	struct rsc_fast_ctl ctl;
	memcpy(&ctl, base, sizeof(ctl));
	CHECK_INT_EQ(ctl.magic, RSC_FAST_MAGIC);
	CHECK_INT_EQ(ctl.version, RSC_FAST_VERSION);
	CHECK_INT_EQ(ctl.sq_entries, 8);
	CHECK_INT_EQ(ctl.cq_entries, 16);
	CHECK_INT_EQ(ctl.sq_head, 0);
	CHECK_INT_EQ(ctl.sq_tail, 0);
	CHECK_INT_EQ(ctl.cq_head, 0);
	CHECK_INT_EQ(ctl.cq_tail, 0);
	for (size_t k = 0; k < sizeof(ctl.pad0); k++)
		CHECK_INT_EQ(ctl.pad0[k], 0);
	for (size_t k = 0; k < sizeof(ctl.pad4); k++)
		CHECK_INT_EQ(ctl.pad4[k], 0);
	CHECK(r.ctl == (struct rsc_fast_ctl *)base);
	CHECK((uint8_t *)r.sq == base + sq);
	CHECK((uint8_t *)r.cq == base + cq);
	CHECK_INT_EQ(r.sq_entries, 8);
	CHECK_INT_EQ(r.cq_entries, 16);
	CHECK_INT_EQ(r.sq_head, 0);
	CHECK_INT_EQ(r.cq_tail, 0);
	free(base);
}

/* ---- taking submissions ---------------------------------------------------------------------- */

TEST(take_in_order_across_wrap)
{
	struct sc_fast_ring r;
	void *base = ring_new(&r, 4, 4);
	CHECK(base != NULL);
	ring_seek(&r, UINT32_MAX - 5, 0);
	struct sc_err err = {0};
	struct rsc_fast_sqe e;
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), 0); /* empty */
	uint64_t next_in = 1, next_out = 1;
	/* Batches of 3, 4 (a full ring), 1, 2, ... through the wrap at 2^32. */
	for (int round = 0; round < 12; round++) {
		uint32_t batch = (uint32_t)(round % 4) + 1;
		for (uint32_t k = 0; k < batch; k++)
			worker_submit(&r, next_in++);
		for (uint32_t k = 0; k < batch; k++) {
			memset(&e, 0, sizeof(e));
			int rc = sc_fast_ring_take(&r, 8, &e, &err);
			if (rc != 1)
				CHECK_FAIL_("round %d: take %u returned %d (%s)", round, k, rc,
					    err.msg);
			if (e.user_data != next_out)
				CHECK_FAIL_("round %d: took %" PRIu64 ", expected %" PRIu64, round,
					    e.user_data, next_out);
			next_out++;
			CHECK_INT_EQ(__atomic_load_n(&r.ctl->sq_head, __ATOMIC_ACQUIRE), r.sq_head);
			CHECK_INT_EQ(sc_fast_check_sqe(&e, &err), 0);
		}
		CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), 0);
	}
	CHECK_U64_EQ(next_out, next_in);
	CHECK_INT_EQ(r.sq_head, (uint32_t)(UINT32_MAX - 5 + (next_out - 1)));
	CHECK(r.sq_head < 100); /* it did wrap */
	free(base);
}

TEST(take_limited_by_room)
{
	struct sc_fast_ring r;
	void *base = ring_new(&r, 8, 8);
	CHECK(base != NULL);
	ring_seek(&r, UINT32_MAX, 0);
	worker_submit(&r, 1);
	worker_submit(&r, 2);
	struct sc_err err = {0};
	struct rsc_fast_sqe e = {.user_data = 77};
	CHECK_INT_EQ(sc_fast_ring_take(&r, 0, &e, &err), 0);
	CHECK_U64_EQ(e.user_data, 77); /* not written */
	CHECK_INT_EQ(r.sq_head, UINT32_MAX);
	CHECK_INT_EQ(r.ctl->sq_head, UINT32_MAX);
	CHECK_INT_EQ(sc_fast_ring_take(&r, 1, &e, &err), 1);
	CHECK_U64_EQ(e.user_data, 1);
	CHECK_INT_EQ(r.ctl->sq_head, 0);
	CHECK_INT_EQ(sc_fast_ring_take(&r, 0, &e, &err), 0);
	CHECK_INT_EQ(sc_fast_ring_take(&r, 1, &e, &err), 1);
	CHECK_U64_EQ(e.user_data, 2);
	CHECK_INT_EQ(r.ctl->sq_head, 1);
	free(base);
}

TEST(take_refuses_impossible_tail)
{
	struct sc_fast_ring r;
	void *base = ring_new(&r, 4, 4);
	CHECK(base != NULL);
	ring_seek(&r, 10, 0);
	struct sc_err err = {0};
	struct rsc_fast_sqe e = {.user_data = 77};
	r.ctl->sq_tail = 15; /* 5 ahead of a ring of 4 */
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_EQ(err.msg,
		     "submission ring tail 15 is 5 entries ahead of head 10; the ring holds 4");
	CHECK_U64_EQ(e.user_data, 77);
	CHECK_INT_EQ(r.sq_head, 10);
	CHECK_INT_EQ(r.ctl->sq_head, 10);
	/* Refused even with no room to take anything. */
	CHECK_INT_EQ(sc_fast_ring_take(&r, 0, &e, &err), -1);
	/* Behind the head: as far ahead as uint32 goes. */
	r.ctl->sq_tail = 9;
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "is 4294967295 entries ahead of head 10");
	CHECK_INT_EQ(r.sq_head, 10);
	/* Exactly full is fine. */
	r.ctl->sq_tail = 14;
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), 1);
	CHECK_INT_EQ(r.sq_head, 11);
	/* The shared sq_head is the sidecar's: what the worker writes there is never read back. */
	r.ctl->sq_head = 1000;
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), 1);
	CHECK_INT_EQ(r.sq_head, 12);
	CHECK_INT_EQ(r.ctl->sq_head, 12);
	/* Nor are the counts in the control block. */
	r.ctl->sq_entries = 1u << 30;
	r.ctl->sq_tail = 12 + 100;
	CHECK_INT_EQ(sc_fast_ring_take(&r, 8, &e, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "the ring holds 4");
	free(base);
}

/* ---- completions ----------------------------------------------------------------------------- */

TEST(cq_room)
{
	struct sc_fast_ring r;
	void *base = ring_new(&r, 4, 8);
	CHECK(base != NULL);
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 8);
	ring_seek(&r, 0, 3);
	r.ctl->cq_head = 0;
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 5);
	r.ctl->cq_head = 3;
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 8);
	r.ctl->cq_head = 4; /* ahead of cq_tail */
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 0);
	r.ctl->cq_head = UINT32_MAX - 4; /* 8 behind, across the wrap: full */
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 0);
	r.ctl->cq_head = UINT32_MAX - 3; /* 7 behind */
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 1);
	r.ctl->cq_head = UINT32_MAX - 5; /* 9 behind: more than the ring holds */
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 0);
	r.ctl->cq_entries = 1u << 20; /* never read */
	r.ctl->cq_head = 1;
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 6);
	free(base);
}

TEST(post_publishes)
{
	struct sc_fast_ring r;
	void *base = ring_new(&r, 4, 8);
	CHECK(base != NULL);
	ring_seek(&r, 0, UINT32_MAX - 1);
	struct rsc_fast_cqe c;
	for (uint32_t k = 0; k < 4; k++) {
		sc_fast_cqe_fill(&c, 100 + k, 0, SC_OPS_COMPLETE, 4096, 1, NULL);
		CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 8 - k);
		sc_fast_ring_post(&r, &c);
		uint32_t tail = (uint32_t)(UINT32_MAX - 1 + k + 1);
		CHECK_INT_EQ(r.cq_tail, tail);
		CHECK_INT_EQ(__atomic_load_n(&r.ctl->cq_tail, __ATOMIC_ACQUIRE), tail);
		const struct rsc_fast_cqe *w = &r.cq[(tail - 1) & 7];
		CHECK_U64_EQ(w->user_data, 100 + k);
		CHECK_INT_EQ(w->status, SC_OPS_COMPLETE);
		CHECK_U64_EQ(w->bytes, 4096);
	}
	/* Slots 6, 7, 0, 1: the wrap of the index is the wrap of the array. */
	CHECK_U64_EQ(r.cq[6].user_data, 100);
	CHECK_U64_EQ(r.cq[7].user_data, 101);
	CHECK_U64_EQ(r.cq[0].user_data, 102);
	CHECK_U64_EQ(r.cq[1].user_data, 103);
	CHECK_U64_EQ(r.cq[2].user_data, 0);
	CHECK_INT_EQ(r.ctl->cq_tail, 2);
	r.ctl->cq_head = 1;
	CHECK_INT_EQ(sc_fast_ring_cq_room(&r), 7);
	free(base);
}

TEST(cqe_fill)
{
	struct rsc_fast_cqe c;
	memset(&c, 0xee, sizeof(c));
	sc_fast_cqe_fill(&c, 0xfeedull, SC_NOT_FOUND, 0, 0, 0, "handle 9 is not prepared");
	CHECK_U64_EQ(c.user_data, 0xfeed);
	CHECK_INT_EQ(c.code, SC_NOT_FOUND);
	CHECK_INT_EQ(c.status, 0);
	CHECK_U64_EQ(c.bytes, 0);
	CHECK_INT_EQ(c.backend, 0);
	CHECK_INT_EQ(c.reserved, 0);
	CHECK_STR_EQ(c.message, "handle 9 is not prepared");
	CHECK_INT_EQ(c.message[sizeof(c.message) - 1], 0);

	char longmsg[300];
	memset(longmsg, 'm', sizeof(longmsg) - 1);
	longmsg[sizeof(longmsg) - 1] = '\0';
	memset(&c, 0xee, sizeof(c));
	sc_fast_cqe_fill(&c, 1, -5, SC_OPS_ERRORED, UINT64_MAX, 3, longmsg);
	CHECK_INT_EQ(c.code, -5);
	CHECK_INT_EQ(c.status, SC_OPS_ERRORED);
	CHECK_U64_EQ(c.bytes, UINT64_MAX);
	CHECK_INT_EQ(c.backend, 3);
	CHECK_U64_EQ(strlen(c.message), sizeof(c.message) - 1);
	CHECK_INT_EQ(c.message[sizeof(c.message) - 1], 0);
	CHECK(strncmp(c.message, longmsg, sizeof(c.message) - 1) == 0);

	/* Exactly 95 characters fits whole; 96 loses one. */
	longmsg[95] = '\0';
	sc_fast_cqe_fill(&c, 1, 0, 0, 0, 0, longmsg);
	CHECK_U64_EQ(strlen(c.message), 95);
	longmsg[95] = 'm';
	longmsg[96] = '\0';
	sc_fast_cqe_fill(&c, 1, 0, 0, 0, 0, longmsg);
	CHECK_U64_EQ(strlen(c.message), 95);

	memset(&c, 0xee, sizeof(c));
	sc_fast_cqe_fill(&c, 2, 0, SC_OPS_COMPLETE, 10, 1, NULL);
	CHECK_STR_EQ(c.message, "");
	for (size_t k = 0; k < sizeof(c.message); k++)
		CHECK_INT_EQ(c.message[k], 0);
}

RUN_TESTS(T(prepare_decoded), T(prepare_most_descriptors), T(prepare_rejected), T(unprepare),
	  T(msg_type), T(sqe_checked), T(ring_layout), T(ring_init), T(take_in_order_across_wrap),
	  T(take_limited_by_room), T(take_refuses_impossible_tail), T(cq_room), T(post_publishes),
	  T(cqe_fill))
