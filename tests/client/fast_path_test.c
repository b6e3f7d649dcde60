/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast_path_test.c: sc-fast-path-test, the client's fast path (rsc_fast_*) against two real
 * sidecars started by tests/integration/test_fast_path_c.py. B holds readables and writables that
 * accept many uses; A runs prepared READs and WRITEs by handle (1 B, 4097 B, 1 MiB + 3 and three
 * descriptors at odd offsets), with every destination byte compared after each run; 16 runs
 * submitted at once and reaped; 288 submitted without reaping (more than the completion ring
 * holds: the sidecar waits for room and is woken by the reaps); a run's completion that arrives while rsc_fast_run waits for
 * its own is kept for rsc_fast_reap; a cancel right behind its run; a cancel of nothing, an
 * unknown handle and an unprepared one are refused with a code and a message. Single-threaded.
 *
 *   sc-fast-path-test unix:A.sock unix:B.sock [--expect-mode ring|grpc | --session-end]
 * --session-end: run once, print "ready", wait for a line on stdin (the driver stops A
 * meanwhile), then expect every call to say the session ended.
 */
#include "client_check.h"

#include <rdma_sidecar/client.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DONE(cp, want_bytes)                                                                       \
	CHECK((cp)->code == 0 && (cp)->status == RSC_STATUS_COMPLETE &&                            \
		  (cp)->bytes == (want_bytes),                                                     \
	      "completion code %s status %s bytes %llu (want %llu): %s",                           \
	      rsc_code_name((cp)->code), rsc_op_status_name((cp)->status),                         \
	      (unsigned long long)(cp)->bytes, (unsigned long long)(want_bytes), (cp)->message)

#define REGION_SIZE (4 * MIB)
#define RUNS 3
#define MAX_DESCS 3

static uint32_t rng = 0x9e3779b9u;

static void fill_random(unsigned char *p, size_t n)
{
	check_fill_xorshift(p, n, &rng);
}

/* One shape of transfer: the same lengths on both sides, at different odd offsets. */
struct shape {
	const char *name;
	size_t n;
	uint64_t len[MAX_DESCS];
	uint64_t off_a[MAX_DESCS], off_b[MAX_DESCS];
};

static const struct shape shapes[] = {
    {"1 B", 1, {1}, {7}, {13}},
    {"4097 B", 1, {4097}, {4099}, {8195}},
    {"1 MiB + 3", 1, {MIB + 3}, {12345}, {2 * MIB + 1}},
    {"three descriptors", 3, {100, 5000, 77}, {3, 1001, 70001}, {50001, 9, 30003}},
};

struct env {
	rsc_client *a, *b;
	rsc_region ra, rb;
	rsc_fast *f;
	unsigned char *buf, *back;
};

static uint64_t total(const struct shape *s)
{
	uint64_t t = 0;
	for (size_t i = 0; i < s->n; i++)
		t += s->len[i];
	return t;
}

static void descs(const struct shape *s, const char *region_id, const uint64_t *off,
		  rsc_descriptor *out)
{
	for (size_t i = 0; i < s->n; i++)
		out[i] =
		    (rsc_descriptor){.region_id = region_id, .offset = off[i], .length = s->len[i]};
}

/* Writes fresh random bytes into every range of the source (kept in saved, in order). */
static void fresh(rsc_client *c, const char *id, const uint64_t *off, const struct shape *s,
		  unsigned char *saved)
{
	rsc_status st;
	size_t at = 0;
	for (size_t i = 0; i < s->n; i++) {
		fill_random(saved + at, s->len[i]);
		OK(rsc_region_write(c, id, off[i], saved + at, s->len[i], &st));
		at += s->len[i];
	}
}

/* Reads the destination's ranges back and compares them with what the source got. */
static void compare(rsc_client *c, const char *id, const uint64_t *off, const struct shape *s,
		    const unsigned char *want, unsigned char *back, const char *what, int run)
{
	rsc_status st;
	size_t at = 0;
	for (size_t i = 0; i < s->n; i++) {
		size_t got = 0;
		OK(rsc_region_read(c, id, off[i], back, s->len[i], &got, &st));
		CHECK(got == s->len[i] && memcmp(back, want + at, s->len[i]) == 0,
		      "%s %s run %d descriptor %zu: bytes differ (%zu read)", what, s->name, run, i,
		      got);
		at += s->len[i];
	}
}

/* A passive operation on b over the shape's b ranges that accepts many uses. */
static int passive(struct env *e, int readable, const struct shape *s, rsc_operation *op)
{
	rsc_status st;
	rsc_descriptor d[MAX_DESCS];
	descs(s, e->rb.region_id, s->off_b, d);
	rsc_passive_args pa = {
	    .descriptors = d, .n_descriptors = s->n, .timeout_ms = 600000, .max_uses = 1000};
	int rc = readable ? rsc_create_readable(e->b, &pa, op, &st)
			  : rsc_create_writable(e->b, &pa, op, &st);
	CHECK(rc == RSC_OK, "create %s %s: %s", readable ? "readable" : "writable", s->name,
	      st.message);
	return rc;
}

static int prepare(struct env *e, int kind, const struct shape *s, const char *metadata,
		   uint32_t *h)
{
	rsc_status st;
	rsc_descriptor d[MAX_DESCS];
	descs(s, e->ra.region_id, s->off_a, d);
	rsc_transfer_args ta = {.metadata = metadata, .descriptors = d, .n_descriptors = s->n};
	int rc = rsc_fast_prepare(e->f, kind, &ta, h, &st);
	CHECK(rc == RSC_OK && *h != 0, "prepare %s %s: %s %s", rsc_op_kind_name(kind), s->name,
	      rsc_code_name(rc), st.message);
	return rc;
}

/* READ and WRITE of one shape, RUNS times each, bytes compared. *read_h keeps the READ's handle
 * (not unprepared) for the checks that follow. */
static void shape_runs(struct env *e, const struct shape *s, uint32_t *read_h, uint32_t *write_h)
{
	rsc_status st;
	rsc_operation ro = {0}, wo = {0};
	rsc_fast_completion c;
	if (passive(e, 1, s, &ro) || passive(e, 0, s, &wo))
		goto out;
	if (prepare(e, RSC_KIND_READ, s, ro.metadata, read_h) ||
	    prepare(e, RSC_KIND_WRITE, s, wo.metadata, write_h))
		goto out;
	for (int r = 0; r < RUNS; r++) {
		fresh(e->b, e->rb.region_id, s->off_b, s, e->buf);
		OK(rsc_fast_run(e->f, *read_h, 0, &c, &st));
		DONE(&c, total(s));
		compare(e->a, e->ra.region_id, s->off_a, s, e->buf, e->back, "READ", r);

		fresh(e->a, e->ra.region_id, s->off_a, s, e->buf);
		OK(rsc_fast_run(e->f, *write_h, 10000, &c, &st));
		DONE(&c, total(s));
		compare(e->b, e->rb.region_id, s->off_b, s, e->buf, e->back, "WRITE", r);
	}
	printf("%s: %d READs and %d WRITEs, bytes compared\n", s->name, RUNS, RUNS);
out:
	rsc_operation_clear(&ro);
	rsc_operation_clear(&wo);
}

/* 16 runs in the ring at once, reaped; each user_data once. */
static void burst(struct env *e, uint32_t h, uint64_t bytes)
{
	rsc_status st;
	int seen[16] = {0}, got = 0, submitted = 0;
	rsc_fast_completion c[16];
	while (submitted < 16) {
		int rc = rsc_fast_submit(e->f, h, 100 + (uint64_t)submitted, 0, &st);
		if (rc == RSC_RESOURCE_EXHAUSTED) {
			size_t n = 0;
			OK(rsc_fast_reap(e->f, c, 16, &n, 10000, &st));
			for (size_t i = 0; i < n; i++, got++) {
				DONE(&c[i], bytes);
				if (c[i].user_data >= 100 && c[i].user_data < 116)
					seen[c[i].user_data - 100]++;
			}
			continue;
		}
		CHECK(rc == RSC_OK, "submit %d: %s", submitted, st.message);
		if (rc != RSC_OK)
			return;
		submitted++;
	}
	for (int tries = 0; got < 16 && tries < 100; tries++) {
		size_t n = 0;
		OK(rsc_fast_reap(e->f, c, 16, &n, 10000, &st));
		for (size_t i = 0; i < n; i++, got++) {
			DONE(&c[i], bytes);
			CHECK(c[i].user_data >= 100 && c[i].user_data < 116, "user_data %llu",
			      (unsigned long long)c[i].user_data);
			if (c[i].user_data >= 100 && c[i].user_data < 116)
				seen[c[i].user_data - 100]++;
		}
	}
	CHECK(got == 16, "reaped %d of 16", got);
	for (int i = 0; i < 16; i++)
		CHECK(seen[i] == 1, "user_data %d seen %d times", 100 + i, seen[i]);
	size_t n = 9;
	OK(rsc_fast_reap(e->f, c, 16, &n, 0, &st));
	CHECK(n == 0, "an empty reap returned %zu", n);
	printf("16 submitted at once, all reaped\n");
}

/* More runs than the completion ring holds, submitted without reaping: the sidecar takes what fits
 * and waits (NEED_WAKEUP); the reaps that follow read completions, ring, and get every run, each
 * once. (A client that did not ring would still get them, later: the sidecar's back-off.) */
#define FLOOD 288 /* the ring's 256 entries and 32 more */
static void flood(struct env *e, uint32_t h, uint64_t bytes)
{
	rsc_status st;
	static unsigned char seen[FLOOD];
	memset(seen, 0, sizeof(seen));
	int submitted = 0, got = 0;
	for (int waits = 0; submitted < FLOOD && waits < 20000;) {
		int rc = rsc_fast_submit(e->f, h, 1000 + (uint64_t)submitted, 0, &st);
		if (rc == RSC_RESOURCE_EXHAUSTED) { /* not taken yet: wait, reading nothing */
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
			waits++;
			continue;
		}
		CHECK(rc == RSC_OK, "flood submit %d: %s", submitted, st.message);
		if (rc != RSC_OK)
			return;
		submitted++;
	}
	CHECK(submitted == FLOOD, "submitted %d of %d without reaping", submitted, FLOOD);
	rsc_fast_completion c[64];
	for (int tries = 0; got < submitted && tries < 1000; tries++) {
		size_t n = 0;
		OK(rsc_fast_reap(e->f, c, 64, &n, 10000, &st));
		for (size_t i = 0; i < n; i++, got++) {
			DONE(&c[i], bytes);
			uint64_t k = c[i].user_data - 1000;
			CHECK(k < FLOOD, "user_data %llu", (unsigned long long)c[i].user_data);
			if (k < FLOOD)
				seen[k]++;
		}
	}
	CHECK(got == submitted, "reaped %d of %d", got, submitted);
	for (int i = 0; i < submitted; i++)
		CHECK(seen[i] == 1, "user_data %d seen %d times", 1000 + i, seen[i]);
	printf("%d submitted past the completion ring's room, all reaped\n", submitted);
}

/* A submitted run whose completion lands while rsc_fast_run waits for another is kept. */
static void interleave(struct env *e, uint32_t h1, uint32_t h2, uint64_t bytes2)
{
	rsc_status st;
	rsc_fast_completion c, r[4];
	OK(rsc_fast_submit(e->f, h1, 7, 0, &st));
	OK(rsc_fast_run(e->f, h2, 0, &c, &st));
	DONE(&c, bytes2);
	CHECK(c.user_data != 7, "rsc_fast_run returned the submitted run's completion");
	size_t n = 0;
	OK(rsc_fast_reap(e->f, r, 4, &n, 10000, &st));
	CHECK(n == 1 && r[0].user_data == 7 && r[0].code == 0, "reaped %zu, user_data %llu code %d",
	      n, n ? (unsigned long long)r[0].user_data : 0ull, n ? r[0].code : -1);
	printf("a submitted run's completion kept while rsc_fast_run waited\n");
}

/* A cancel right behind its run: either it was delivered (the run ends CANCELLED, or COMPLETE
 * when too late to stop) or the run had ended (NOT_FOUND, and the run COMPLETE). Both
 * completions come, once each. */
static void cancel_race(struct env *e, uint32_t h, uint64_t bytes)
{
	rsc_status st;
	rsc_fast_completion c[2], run = {0}, cancel = {0};
	int got_run = 0, got_cancel = 0;
	OK(rsc_fast_submit(e->f, h, 900, 0, &st));
	OK(rsc_fast_cancel(e->f, 900, 901, &st));
	for (int tries = 0; tries < 20 && got_run + got_cancel < 2; tries++) {
		size_t n = 0;
		OK(rsc_fast_reap(e->f, c, 2, &n, 10000, &st));
		for (size_t i = 0; i < n; i++) {
			if (c[i].user_data == 900) {
				run = c[i];
				got_run++;
			} else if (c[i].user_data == 901) {
				cancel = c[i];
				got_cancel++;
			} else {
				CHECK(0, "unexpected completion %llu",
				      (unsigned long long)c[i].user_data);
			}
		}
	}
	CHECK(got_run == 1 && got_cancel == 1, "run completions %d, cancel completions %d", got_run,
	      got_cancel);
	CHECK(cancel.code == 0 || cancel.code == RSC_NOT_FOUND, "cancel: %s %s",
	      rsc_code_name(cancel.code), cancel.message);
	if (cancel.code == RSC_NOT_FOUND)
		DONE(&run, bytes);
	else
		CHECK((run.code == 0 && run.status == RSC_STATUS_COMPLETE) ||
			  (run.code != 0 && run.status == RSC_STATUS_CANCELLED),
		      "cancelled run: %s %s: %s", rsc_code_name(run.code),
		      rsc_op_status_name(run.status), run.message);
	printf("cancel behind its run: cancel %s, run %s\n", rsc_code_name(cancel.code),
	       rsc_op_status_name(run.status));
}

static void refusals(struct env *e, uint32_t h)
{
	rsc_status st;
	rsc_fast_completion c;
	/* A handle that never existed: a completion with a code, or a call error. */
	int rc = rsc_fast_run(e->f, 0x7fffff01u, 0, &c, &st);
	if (rc == RSC_OK) {
		CHECK(c.code != 0 && c.message[0] && c.status == 0,
		      "unknown handle: code %d status %d message \"%s\"", c.code, c.status,
		      c.message);
		printf("unknown handle: %s: %s\n", rsc_code_name(c.code), c.message);
	} else {
		CHECK(st.message[0], "unknown handle: %s with no message", rsc_code_name(rc));
		printf("unknown handle (call error): %s: %s\n", rsc_code_name(rc), st.message);
	}
	/* Cancel of nothing: its own completion says NOT_FOUND. */
	OK(rsc_fast_cancel(e->f, 0x12345678u, 555, &st));
	size_t n = 0;
	OK(rsc_fast_reap(e->f, &c, 1, &n, 10000, &st));
	CHECK(n == 1 && c.user_data == 555 && c.code == RSC_NOT_FOUND && c.message[0],
	      "cancel of nothing: n %zu user_data %llu code %s \"%s\"", n,
	      (unsigned long long)c.user_data, rsc_code_name(c.code), c.message);
	/* Unprepared: refused. */
	OK(rsc_fast_unprepare(e->f, h, &st));
	rc = rsc_fast_run(e->f, h, 0, &c, &st);
	CHECK((rc == RSC_OK && c.code != 0 && c.message[0]) || (rc != RSC_OK && st.message[0]),
	      "run after unprepare: rc %s code %s", rsc_code_name(rc), rsc_code_name(c.code));
	printf("run after unprepare: %s\n", rc == RSC_OK ? c.message : st.message);
	rc = rsc_fast_unprepare(e->f, h, &st);
	CHECK(rc != RSC_OK && st.message[0], "unprepare twice: %s", rsc_code_name(rc));
	/* A region id of 40 characters never leaves the process. */
	rsc_descriptor d = {.region_id = "0123456789012345678901234567890123456789", .length = 1};
	rsc_transfer_args ta = {.metadata = "rsm1.x", .descriptors = &d, .n_descriptors = 1};
	uint32_t h2 = 0;
	rc = rsc_fast_prepare(e->f, RSC_KIND_READ, &ta, &h2, &st);
	CHECK(rc == RSC_INVALID_ARGUMENT && strstr(st.message, "region id"), "long id: %s %s",
	      rsc_code_name(rc), st.message);
	rc = rsc_fast_prepare(e->f, RSC_KIND_READABLE, &ta, &h2, &st);
	CHECK(rc == RSC_INVALID_ARGUMENT, "kind READABLE: %s", rsc_code_name(rc));
}

/* --session-end: one run, then "ready" and a wait for a line on stdin while the driver stops
 * sidecar A; the next calls must say the session ended (RSC_UNAVAILABLE), with no hang. */
static int session_end(struct env *e)
{
	rsc_status st;
	rsc_operation ro = {0};
	rsc_fast_completion c;
	uint32_t h = 0;
	const struct shape *s = &shapes[1];
	if (passive(e, 1, s, &ro) || prepare(e, RSC_KIND_READ, s, ro.metadata, &h))
		return 1;
	OK(rsc_fast_run(e->f, h, 0, &c, &st));
	DONE(&c, total(s));
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	int rc = rsc_fast_run(e->f, h, 0, &c, &st);
	CHECK(rc == RSC_UNAVAILABLE && strstr(st.message, "closed the fast path session"),
	      "run after the sidecar stopped: %s: %s", rsc_code_name(rc), st.message);
	size_t n = 0;
	rc = rsc_fast_reap(e->f, &c, 1, &n, 1000, &st);
	CHECK(rc == RSC_UNAVAILABLE && n == 0, "reap after the end: %s, %zu", rsc_code_name(rc), n);
	rc = rsc_fast_submit(e->f, h, 1, 0, &st);
	CHECK(rc == RSC_UNAVAILABLE, "submit after the end: %s", rsc_code_name(rc));
	rsc_fast_close(e->f);
	rsc_operation_clear(&ro);
	rsc_region_deregister(e->b, e->rb.region_id, 1, NULL);
	rsc_region_clear(&e->ra);
	rsc_region_clear(&e->rb);
	rsc_client_destroy(e->a);
	rsc_client_destroy(e->b);
	free(e->buf);
	free(e->back);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("all checks passed\n");
	return 0;
}

int main(int argc, char **argv)
{
	const char *expect = NULL;
	int end = 0;
	if (argc == 5 && strcmp(argv[3], "--expect-mode") == 0)
		expect = argv[4];
	else if (argc == 4 && strcmp(argv[3], "--session-end") == 0)
		end = 1;
	else if (argc != 3) {
		fprintf(stderr,
			"usage: %s unix:A.sock unix:B.sock [--expect-mode ring|grpc | "
			"--session-end]\n",
			argv[0]);
		return 2;
	}
	rsc_status st;
	struct env e = {0};
	e.buf = malloc(2 * MIB);
	e.back = malloc(2 * MIB);
	if (!e.buf || !e.back)
		return 1;
	rsc_fast_close(NULL);
	OK(rsc_client_create(&(rsc_options){.target = argv[1]}, &e.a, &st));
	OK(rsc_client_create(&(rsc_options){.target = argv[2]}, &e.b, &st));
	if (failures)
		return 1;
	OK(rsc_region_create(e.a, REGION_SIZE, "fast-a", &e.ra, &st));
	OK(rsc_region_create(e.b, REGION_SIZE, "fast-b", &e.rb, &st));
	OK(rsc_fast_open(e.a, NULL, &e.f, &st));
	if (failures)
		return 1;
	printf("mode %s\n", rsc_fast_mode(e.f));
	if (end)
		return session_end(&e);
	if (expect)
		CHECK(strcmp(rsc_fast_mode(e.f), expect) == 0, "mode %s, expected %s",
		      rsc_fast_mode(e.f), expect);
	if (expect && strcmp(expect, "grpc") == 0) {
		rsc_fast *r = NULL;
		int rc = rsc_fast_open(e.a, &(rsc_fast_options){.require_ring = 1}, &r, &st);
		CHECK(rc == RSC_UNAVAILABLE && r == NULL && st.message[0], "require_ring: %s",
		      rsc_code_name(rc));
	}

	uint32_t rh[4] = {0}, wh[4] = {0};
	for (size_t i = 0; i < 4; i++)
		shape_runs(&e, &shapes[i], &rh[i], &wh[i]);
	if (rh[1])
		burst(&e, rh[1], total(&shapes[1]));
	if (rh[0])
		flood(&e, rh[0], total(&shapes[0]));
	if (rh[0] && wh[3])
		interleave(&e, rh[0], wh[3], total(&shapes[3]));
	if (rh[2])
		cancel_race(&e, rh[2], total(&shapes[2]));
	if (wh[0])
		refusals(&e, wh[0]);

	rsc_fast_close(e.f);
	OK(rsc_region_deregister(e.a, e.ra.region_id, 1, &st));
	OK(rsc_region_deregister(e.b, e.rb.region_id, 1, &st));
	rsc_region_clear(&e.ra);
	rsc_region_clear(&e.rb);
	rsc_client_destroy(e.a);
	rsc_client_destroy(e.b);
	free(e.buf);
	free(e.back);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("all checks passed\n");
	return 0;
}
