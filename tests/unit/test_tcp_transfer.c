/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tcp_transfer.c: the TCP data plane end to end, in one process, through two real engines
 * (A serves, B is active) that share a key file and talk over 127.0.0.1: reads and writes of
 * random bytes over many descriptors at odd offsets (1 B .. 64 MiB), concurrent transfers, cancel,
 * replay, a dropped connection, forged requests on an authenticated connection, a sidecar without
 * keys, and garbage on the data port. Every transfer compares bytes.
 *
 * SC_BENCH=1 also measures a 256 MiB read (GB/s) and 4 KiB reads (p50/p99 latency, BeginRead to
 * COMPLETE) and prints them; regions then live in /dev/shm (SC_BENCH_SHM overrides).
 * SC_TEST_LOG=debug|info shows the engines' logs.
 */
#include "check.h"
#include "op_wait.h"

#include "engine/engine.h"
#include "engine/test.h"
#include "meta/keys.h"
#include "base/log.h"
#include "meta/metadata.h"
#include "backend/passive.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"
#include "peer/server.h"
#include "base/timer.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

static char g_dir[256];
static char g_keyfile[300];
static char g_keytext[200];
static char g_shm[300];

/* ---- fixture --------------------------------------------------------------------------------- */

struct side {
	struct sc_config cfg;
	struct sc_engine *eng;
};

struct pair {
	struct side a, b; /* a: passive (serves), b: active */
};

static int setup_dirs(void)
{
	if (g_dir[0])
		return 0;
	const char *base = getenv("SC_TEST_TMP");
	if (!base || !base[0])
		base = "/tmp";
	mkdir(base, 0700);
	snprintf(g_dir, sizeof(g_dir), "%s/tcp-transfer-XXXXXX", base);
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return -1;
	}
	const char *shm = getenv("SC_BENCH") && getenv("SC_BENCH")[0] == '1' ? "/dev/shm" : g_dir;
	if (getenv("SC_BENCH_SHM"))
		shm = getenv("SC_BENCH_SHM");
	snprintf(g_shm, sizeof(g_shm), "%s", shm);

	unsigned char key[32], b64[64];
	if (sc_random_bytes(key, sizeof(key)) != 0)
		return -1;
	EVP_EncodeBlock(b64, key, sizeof(key));
	snprintf(g_keytext, sizeof(g_keytext), "test-key:%s\n", b64);
	snprintf(g_keyfile, sizeof(g_keyfile), "%s/keys", g_dir);
	int fd = open(g_keyfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, g_keytext, strlen(g_keytext)) != (ssize_t)strlen(g_keytext)) {
		perror(g_keyfile);
		return -1;
	}
	close(fd);

	const char *lvl = getenv("SC_TEST_LOG");
	enum sc_log_level level = SC_LOG_ERROR;
	if (lvl)
		sc_log_level_parse(lvl, &level);
	sc_log_configure(level, false);
	return 0;
}

/* Start a sidecar engine with the test key file (or none), tcp only, on 127.0.0.1:0. */
static int side_up(struct side *s, const char *id, bool with_keys, const char *extra_flag,
		   const char *extra_value)
{
	if (setup_dirs() != 0)
		return -1;
	char *argv[16];
	int argc = 0;
	argv[argc++] = "rdma-sidecar";
	argv[argc++] = "--id";
	argv[argc++] = (char *)id;
	argv[argc++] = "--data-listen";
	argv[argc++] = "127.0.0.1:0";
	argv[argc++] = "--shm-dir";
	argv[argc++] = g_shm;
	argv[argc++] = "--backends";
	argv[argc++] = "tcp";
	if (with_keys) {
		argv[argc++] = "--key-file";
		argv[argc++] = g_keyfile;
	}
	if (extra_flag) {
		argv[argc++] = (char *)extra_flag;
		argv[argc++] = (char *)extra_value;
	}
	argv[argc] = NULL;
	char *envp[] = {NULL};
	struct sc_err err;
	sc_err_clear(&err);
	memset(s, 0, sizeof(*s));
	if (sc_config_parse(&s->cfg, argc, argv, envp, &err) != SC_CONFIG_OK) {
		fprintf(stderr, "config: %s\n", err.msg);
		sc_config_free(&s->cfg);
		return -1;
	}
	if (sc_engine_create(&s->cfg, &s->eng, &err) != 0 || sc_engine_start(s->eng, &err) != 0) {
		fprintf(stderr, "engine %s: %s\n", id, err.msg);
		sc_engine_destroy(s->eng);
		s->eng = NULL;
		sc_config_free(&s->cfg);
		return -1;
	}
	return 0;
}

static void side_down(struct side *s)
{
	sc_engine_destroy(s->eng);
	s->eng = NULL;
	sc_config_free(&s->cfg);
}

static int pair_up(struct pair *p, const char *streams)
{
	if (side_up(&p->a, "sidecar-a", true, streams ? "--tcp-streams" : NULL, streams) != 0)
		return -1;
	if (side_up(&p->b, "sidecar-b", true, streams ? "--tcp-streams" : NULL, streams) != 0) {
		side_down(&p->a);
		return -1;
	}
	return 0;
}

static void pair_down(struct pair *p)
{
	side_down(&p->b);
	side_down(&p->a);
}

static const char *endpoint_of(struct side *s)
{
	return sc_peer_server_endpoint(sc_engine_peer_server(s->eng));
}

/* Random bytes from xorshift64* seeded by the system RNG: cheap (also under valgrind), and never
 * the same twice. */
static int fill_random(struct side *s, const char *id, uint64_t size)
{
	struct sc_err err;
	uint64_t x;
	sc_random_bytes(&x, sizeof(x));
	x |= 1;
	uint64_t *buf = malloc(4 * MiB);
	int rc = buf ? 0 : -1;
	for (uint64_t off = 0; rc == 0 && off < size; off += 4 * MiB) {
		size_t n = size - off < 4 * MiB ? (size_t)(size - off) : 4 * MiB;
		for (size_t i = 0; i < (n + 7) / 8; i++) {
			x ^= x >> 12;
			x ^= x << 25;
			x ^= x >> 27;
			buf[i] = x * 0x2545f4914f6cdd1dull;
		}
		rc = sc_region_write(s->eng, id, off, buf, n, &err);
	}
	free(buf);
	return rc;
}

/* A host region of `size` bytes filled with random bytes. */
static int make_region(struct side *s, uint64_t size, char id[SC_ID_MAX])
{
	struct sc_region_info info;
	struct sc_err err;
	if (sc_region_create(s->eng, size, SC_DEVICE_HOST, 0, "test", &info, &err) != 0) {
		fprintf(stderr, "region: %s\n", err.msg);
		return -1;
	}
	snprintf(id, SC_ID_MAX, "%s", info.id);
	return fill_random(s, id, size);
}


/* ---- transfers ------------------------------------------------------------------------------- */

struct layout {
	size_t n;
	uint64_t len[8];
	uint64_t off_a[8]; /* in A's region (passive) */
	uint64_t off_b[8]; /* in B's region (active) */
};

static uint64_t layout_span(const struct layout *l, const uint64_t *offs)
{
	uint64_t end = 0;
	for (size_t i = 0; i < l->n; i++)
		if (offs[i] + l->len[i] > end)
			end = offs[i] + l->len[i];
	return end;
}

static bool same_bytes(struct sc_engine *ea, const char *ra, uint64_t oa, struct sc_engine *eb,
		       const char *rb, uint64_t ob, uint64_t len)
{
	uint8_t *x = malloc(4 * MiB), *y = malloc(4 * MiB);
	bool same = true;
	for (uint64_t done = 0; same && done < len; done += 4 * MiB) {
		size_t n = len - done < 4 * MiB ? (size_t)(len - done) : 4 * MiB;
		struct sc_err err;
		if (sc_region_read(ea, ra, oa + done, x, n, &err) != 0 ||
		    sc_region_read(eb, rb, ob + done, y, n, &err) != 0 || memcmp(x, y, n) != 0)
			same = false;
	}
	free(x);
	free(y);
	return same;
}

struct run {
	struct sc_op_info passive, active;
	uint64_t begin_to_done_us;
};

/*
 * Expose A's ranges (READABLE for a read, WRITABLE for a write), begin the active operation on
 * B, wait for both. Regions must exist. Fills r (caller frees the infos).
 */
static int transfer(struct pair *p, enum sc_op_kind kind, const struct layout *l, const char *ra,
		    const char *rb, struct run *r)
{
	struct sc_desc da[8], db[8];
	for (size_t i = 0; i < l->n; i++) {
		da[i] = (struct sc_desc){.offset = l->off_a[i], .length = l->len[i]};
		db[i] = (struct sc_desc){.offset = l->off_b[i], .length = l->len[i]};
		snprintf(da[i].region_id, SC_ID_MAX, "%s", ra);
		snprintf(db[i].region_id, SC_ID_MAX, "%s", rb);
	}
	struct sc_passive_req preq = {.descs = da, .n_descs = l->n, .timeout_ms = 60000};
	struct sc_op_info pinfo;
	struct sc_err err;
	if (sc_op_create_passive(p->a.eng, kind == SC_OP_READ ? SC_OP_READABLE : SC_OP_WRITABLE,
				 &preq, &pinfo, &err) != 0) {
		fprintf(stderr, "create passive: %s\n", err.msg);
		return -1;
	}
	struct sc_active_req areq = {.metadata = pinfo.metadata, .descs = db, .n_descs = l->n,
				     .timeout_ms = 60000};
	struct sc_op_info ainfo;
	struct timespec ts0, ts1;
	clock_gettime(CLOCK_MONOTONIC, &ts0);
	if (sc_op_begin(p->b.eng, kind, &areq, &ainfo, &err) != 0) {
		fprintf(stderr, "begin: %s\n", err.msg);
		sc_op_info_free(&pinfo);
		return -1;
	}
	int rc = wait_op(p->b.eng, ainfo.id, 120000, &r->active);
	clock_gettime(CLOCK_MONOTONIC, &ts1);
	r->begin_to_done_us = (uint64_t)(((int64_t)ts1.tv_sec - ts0.tv_sec) * 1000000 +
					 ((int64_t)ts1.tv_nsec - ts0.tv_nsec) / 1000);
	if (rc == 0)
		rc = wait_op(p->a.eng, pinfo.id, 10000, &r->passive);
	sc_op_info_free(&pinfo);
	sc_op_info_free(&ainfo);
	return rc;
}

/* Ranges of one side must not overlap, or the bytes compared depend on the order of chunks. */
static bool overlaps(const struct layout *l, const uint64_t *offs)
{
	for (size_t i = 0; i < l->n; i++)
		for (size_t j = i + 1; j < l->n; j++)
			if (offs[i] < offs[j] + l->len[j] && offs[j] < offs[i] + l->len[i])
				return true;
	return false;
}

static void check_layout(struct pair *p, enum sc_op_kind kind, const struct layout *l)
{
	CHECK(!overlaps(l, l->off_a) && !overlaps(l, l->off_b));
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p->a, layout_span(l, l->off_a) + 3, ra), 0);
	CHECK_INT_EQ(make_region(&p->b, layout_span(l, l->off_b) + 5, rb), 0);
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++) {
		total += l->len[i];
		/* random fills differ: nothing matches before the transfer */
		if (l->len[i] > 8)
			CHECK(!same_bytes(p->a.eng, ra, l->off_a[i], p->b.eng, rb, l->off_b[i],
					  l->len[i]));
	}
	struct run r;
	CHECK_INT_EQ(transfer(p, kind, l, ra, rb, &r), 0);
	if (r.active.status != SC_OPS_COMPLETE)
		fprintf(stderr, "  active: %s %s\n", sc_status_name(r.active.err_code),
			r.active.err_msg);
	CHECK_STR_EQ(sc_op_status_name(r.active.status), "COMPLETE");
	CHECK_STR_EQ(sc_op_status_name(r.passive.status), "COMPLETE");
	CHECK_INT_EQ(r.active.backend, SC_BACKEND_TCP);
	CHECK_U64_EQ(r.active.bytes_done, total);
	/* The passive side counts a chunk when its serving thread returns from send(), which may be
	 * a moment after the active side received it and sent DONE. */
	for (int i = 0; i < 200 && r.passive.bytes_done != total; i++) {
		struct sc_op_info again;
		struct sc_err e;
		usleep(10 * 1000);
		if (sc_op_get(p->a.eng, r.passive.id, &again, &e) == 0) {
			sc_op_info_free(&r.passive);
			r.passive = again;
		}
	}
	CHECK_U64_EQ(r.passive.bytes_done, total);
	CHECK_STR_EQ(r.passive.peer, "sidecar-b");
	for (size_t i = 0; i < l->n; i++)
		if (!same_bytes(p->a.eng, ra, l->off_a[i], p->b.eng, rb, l->off_b[i], l->len[i]))
			CHECK_FAIL_("descriptor %zu (%" PRIu64 " bytes) differs after %s", i,
				    l->len[i], sc_op_kind_name(kind));
	sc_op_info_free(&r.active);
	sc_op_info_free(&r.passive);
	struct sc_err err;
	CHECK_INT_EQ(sc_region_deregister(p->a.eng, ra, true, &err), 0);
	CHECK_INT_EQ(sc_region_deregister(p->b.eng, rb, true, &err), 0);
}

static const struct layout many = {
	.n = 4,
	.len = {1, 4095, MiB + 7, 64 * MiB},
	.off_a = {3, 11, 8191, 3 * MiB + 1},
	.off_b = {2 * MiB + 100, 17, 2 * MiB + 333, 4 * MiB + 1001},
};

TEST(read_many_descriptors_odd_offsets)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	check_layout(&p, SC_OP_READ, &many);
	pair_down(&p);
}

TEST(write_many_descriptors_odd_offsets)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	check_layout(&p, SC_OP_WRITE, &many);
	pair_down(&p);
}

TEST(each_size_alone_both_directions_and_stream_counts)
{
	/* 64 MiB runs in the two tests above; 9 MiB + 3 is several chunks on several streams. */
	static const uint64_t sizes[] = {1, 4095, MiB + 7, 9 * MiB + 3};
	static const char *const streams[] = {"1", "4"};
	for (size_t s = 0; s < 2; s++) {
		struct pair p;
		CHECK_INT_EQ(pair_up(&p, streams[s]), 0);
		for (size_t i = 0; i < 4; i++) {
			struct layout l = {.n = 1, .len = {sizes[i]}, .off_a = {7}, .off_b = {13}};
			check_layout(&p, SC_OP_READ, &l);
			check_layout(&p, SC_OP_WRITE, &l);
			if (check_failed_)
				return;
		}
		pair_down(&p);
	}
}

struct concurrent {
	struct pair *p;
	enum sc_op_kind kind;
	int failed;
};

static void *concurrent_main(void *arg)
{
	struct concurrent *c = arg;
	struct layout l = {.n = 2, .len = {MiB + 1, 2 * MiB + 3}, .off_a = {1, 2 * MiB},
			   .off_b = {2 * MiB + 16, 3}};
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	struct run r;
	if (make_region(&c->p->a, 4 * MiB + 8, ra) != 0 ||
	    make_region(&c->p->b, 4 * MiB + 8, rb) != 0 ||
	    transfer(c->p, c->kind, &l, ra, rb, &r) != 0) {
		c->failed = 1;
		return NULL;
	}
	c->failed = r.active.status != SC_OPS_COMPLETE || r.passive.status != SC_OPS_COMPLETE;
	if (c->failed)
		fprintf(stderr, "  %s: active %s (%s), passive %s (%s)\n", sc_op_kind_name(c->kind),
			sc_op_status_name(r.active.status), r.active.err_msg,
			sc_op_status_name(r.passive.status), r.passive.err_msg);
	for (size_t i = 0; i < l.n; i++)
		if (!same_bytes(c->p->a.eng, ra, l.off_a[i], c->p->b.eng, rb, l.off_b[i], l.len[i]))
			c->failed = 1;
	sc_op_info_free(&r.active);
	sc_op_info_free(&r.passive);
	return NULL;
}

TEST(concurrent_transfers_share_workers_and_connections)
{
	/* 256 KiB chunks: every transfer wants helper streams, more than there are workers. */
	struct pair p;
	CHECK_INT_EQ(side_up(&p.a, "sidecar-a", true, NULL, NULL), 0);
	CHECK_INT_EQ(side_up(&p.b, "sidecar-b", true, "--tcp-chunk-size", "256k"), 0);
	enum { N = 8 };
	pthread_t t[N];
	struct concurrent c[N];
	for (int i = 0; i < N; i++) {
		c[i] = (struct concurrent){.p = &p, .kind = i % 2 ? SC_OP_WRITE : SC_OP_READ};
		pthread_create(&t[i], NULL, concurrent_main, &c[i]);
	}
	int failed = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		failed += c[i].failed;
	}
	CHECK_INT_EQ(failed, 0);
	pair_down(&p);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* The token and a READABLE op on A over a fresh region; for raw client calls. */
struct exposed {
	char region[SC_ID_MAX];
	struct sc_op_info op;
	struct sc_metadata md;
};

static int expose(struct side *a, enum sc_op_kind kind, uint64_t len, struct exposed *e)
{
	if (make_region(a, len, e->region) != 0)
		return -1;
	struct sc_desc d = {.offset = 0, .length = len};
	snprintf(d.region_id, SC_ID_MAX, "%s", e->region);
	struct sc_passive_req req = {.descs = &d, .n_descs = 1, .timeout_ms = 60000};
	struct sc_err err;
	if (sc_op_create_passive(a->eng, kind, &req, &e->op, &err) != 0)
		return -1;
	struct sc_keyring *ring;
	if (sc_keyring_parse(g_keytext, strlen(g_keytext), &ring, &err) != 0)
		return -1;
	int rc = sc_metadata_verify(ring, e->op.metadata, NULL, sc_now_unix_ms(), &e->md, &err);
	sc_keyring_release(ring);
	return rc;
}

static void unexpose(struct side *a, struct exposed *e)
{
	sc_metadata_free(&e->md);
	sc_op_info_free(&e->op);
	sc_region_deregister(a->eng, e->region, true, NULL);
}

TEST(forged_requests_get_errors_and_touch_nothing)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct exposed e;
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &e), 0);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	CHECK_STR_EQ(sc_peer_conn_peer_id(c), "sidecar-a");
	uint8_t buf[8192];

	/* an unknown token */
	uint8_t bogus[SC_TOKEN_LEN];
	sc_random_bytes(bogus, sizeof(bogus));
	CHECK_INT_EQ(sc_peer_open(c, bogus, 1, SC_OP_READ, 4096, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_NOT_FOUND);
	CHECK_STR_CONTAINS(err.msg, "peer sidecar-a: ");
	CHECK(sc_peer_conn_usable(c));
	/* READ without OPEN */
	CHECK_INT_EQ(sc_peer_read_into(c, e.md.token, 7, 0, 0, 16, buf, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK(sc_peer_conn_usable(c));
	/* wrong direction, wrong total */
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 7, SC_OP_WRITE, 4096, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 7, SC_OP_READ, 4097, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	/* opened: out-of-bounds and wrong-descriptor reads refused, in-bounds works */
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 7, SC_OP_READ, 4096, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_peer_read_into(c, e.md.token, 7, 0, 4000, 97, buf, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_peer_read_into(c, e.md.token, 7, 1, 0, 1, buf, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_peer_read_into(c, e.md.token, 7, 0, UINT64_MAX, 2, buf, dl, NULL, &err),
		     -1);
	CHECK_INT_EQ(sc_peer_read_into(c, e.md.token, 7, 0, 4000, 96, buf, dl, NULL, &err), 0);
	uint8_t want[96];
	CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, 4000, want, 96, &err), 0);
	CHECK(memcmp(buf, want, 96) == 0);
	/* a WRITE into the READABLE it opened for reading: refused, the server closes rather
	 * than read the bytes, and the memory is untouched */
	uint8_t before[4096], after_write[4096], junk[4096];
	CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, 0, before, sizeof(before), &err), 0);
	sc_random_bytes(junk, sizeof(junk));
	CHECK_INT_EQ(sc_peer_write_from(c, e.md.token, 7, 0, 0, 4096, junk, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "peer sidecar-a: ");
	CHECK_STR_CONTAINS(err.msg, "opened for READ");
	CHECK(!sc_peer_conn_usable(c));
	sc_peer_pool_put(pool, c, true); /* closed anyway: broken */
	CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, 0, after_write, sizeof(after_write), &err),
		     0);
	CHECK(memcmp(before, after_write, sizeof(before)) == 0);

	/* A DONE reporting success after refused requests is refused (the bytes did not all move)
	 * and ends the operation ERRORED; a second OPEN of the used metadata is refused */
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	CHECK_INT_EQ(sc_peer_done(c, e.md.token, 7, SC_OK, NULL, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "had a request refused (INVALID_ARGUMENT)");
	struct sc_op_info after;
	CHECK_INT_EQ(wait_op(p.a.eng, e.op.id, 2000, &after), 0);
	CHECK_STR_EQ(sc_op_status_name(after.status), "ERRORED");
	CHECK_STR_CONTAINS(after.err_msg, "reported success after this side refused one of its "
					  "requests (INVALID_ARGUMENT)");
	sc_op_info_free(&after);
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 8, SC_OP_READ, 4096, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION); /* the ended operation's token: a replay */
	CHECK_STR_CONTAINS(err.msg, "ERRORED");
	CHECK_INT_EQ(sc_peer_ping(c, dl, NULL, &err), 0);
	/* no ibverbs handler registered: QP_CONNECT is UNIMPLEMENTED, the connection lives on */
	uint8_t reply[64];
	size_t reply_len;
	CHECK_INT_EQ(sc_peer_call(c, SC_FRAME_QP_CONNECT, "hi", 2, reply, sizeof(reply), &reply_len,
				  dl, NULL, &err),
		     -1);
	CHECK_INT_EQ(err.code, SC_UNIMPLEMENTED);
	CHECK_INT_EQ(sc_peer_ping(c, dl, NULL, &err), 0);
	sc_peer_pool_put(pool, c, true);
	unexpose(&p.a, &e);
	pair_down(&p);
}

/* The OPEN carries the transfer's trace id (its extension) only to an issuer whose metadata says
 * it reads OPEN extensions: older sidecars refuse trailing bytes. The passive operation, created
 * without a trace id, takes the one that came; from an OPEN without it, none. */
TEST(open_sends_the_trace_id_only_to_issuers_that_read_it)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct exposed e1, e2;
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &e1), 0);
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &e2), 0);
	CHECK(e1.md.peer_features & SC_MD_FEATURE_OPEN_EXT);
	CHECK_STR_EQ(e1.op.trace_id, "");
	e2.md.peer_features = 0; /* as an older issuer's metadata */
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	struct sc_exposed_pair {
		struct exposed *e;
		const char *expect;
	} cases[] = {{&e1, "4bf92f3577b34da6a3ce929d0e0e4736"}, {&e2, ""}};
	for (size_t i = 0; i < 2; i++) {
		struct sc_xfer x = {.kind = SC_OP_READ, .meta = &cases[i].e->md, .xfer_id = 21 + i,
				    .total = 4096, .deadline_mono_ms = dl};
		snprintf(x.trace_id, sizeof(x.trace_id), "%s", "4bf92f3577b34da6a3ce929d0e0e4736");
		CHECK_INT_EQ(sc_peer_open_xfer(c, &x, SC_BACKEND_NONE, &err), 0);
		struct sc_op_info info;
		CHECK_INT_EQ(sc_op_get(p.a.eng, cases[i].e->op.id, &info, &err), 0);
		CHECK_STR_EQ(info.trace_id, cases[i].expect);
		CHECK_INT_EQ(info.status, SC_OPS_IN_PROGRESS);
		sc_op_info_free(&info);
	}
	CHECK_INT_EQ(sc_peer_ping(c, dl, NULL, &err), 0);
	sc_peer_pool_put(pool, c, true);
	unexpose(&p.a, &e1);
	unexpose(&p.a, &e2);
	pair_down(&p);
}

/* READV / WRITEV from a forged client: pieces out of bounds or on a descriptor the operation
 * lacks are refused (naming the piece) with nothing sent; scattered pieces come back in order; a
 * WRITEV into a READABLE is refused and touches nothing. */
TEST(forged_multi_piece_requests)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct exposed e;
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &e), 0);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	struct sc_peer_piece bad[2] = {{0, 0, 10}, {0, 4090, 7}};
	CHECK_INT_EQ(sc_peer_readv_send(c, e.md.token, 9, bad, 2, dl, NULL, &err), 0);
	uint8_t buf[4096];
	struct iovec iov[3] = {{buf, 10}, {buf + 10, 7}};
	CHECK_INT_EQ(sc_peer_readv_recv(c, 17, iov, 2, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION); /* not opened yet */
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 9, SC_OP_READ, 4096, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_peer_readv_send(c, e.md.token, 9, bad, 2, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_peer_readv_recv(c, 17, iov, 2, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "piece 1");
	CHECK(sc_peer_conn_usable(c));
	bad[1] = (struct sc_peer_piece){1, 0, 1}; /* descriptor 1 does not exist */
	CHECK_INT_EQ(sc_peer_readv_send(c, e.md.token, 9, bad, 2, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_peer_readv_recv(c, 11, iov, 2, dl, NULL, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK(sc_peer_conn_usable(c));
	/* three scattered pieces, out of order, into three places of buf */
	struct sc_peer_piece good[3] = {{0, 4000, 96}, {0, 1, 333}, {0, 2048, 1}};
	iov[0] = (struct iovec){buf + 1000, 96};
	iov[1] = (struct iovec){buf + 7, 333};
	iov[2] = (struct iovec){buf + 3000, 1};
	memset(buf, 0, sizeof(buf));
	CHECK_INT_EQ(sc_peer_readv_send(c, e.md.token, 9, good, 3, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_peer_readv_recv(c, 430, iov, 3, dl, NULL, &err), 0);
	uint8_t want[4096];
	CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, 0, want, sizeof(want), &err), 0);
	CHECK(memcmp(buf + 1000, want + 4000, 96) == 0);
	CHECK(memcmp(buf + 7, want + 1, 333) == 0);
	CHECK(buf[3000] == want[2048] && buf[6] == 0 && buf[340] == 0);
	/* WRITEV into the READABLE: refused, the server closes, the memory is untouched */
	uint8_t junk[100];
	sc_random_bytes(junk, sizeof(junk));
	struct iovec src[1] = {{junk, 100}};
	struct sc_peer_piece w[1] = {{0, 0, 100}};
	int rc = sc_peer_writev_send(c, e.md.token, 9, w, 1, src, dl, NULL, &err);
	if (rc == 0)
		rc = sc_peer_write_recv(c, dl, NULL, &err);
	CHECK_INT_EQ(rc, -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "opened for READ");
	CHECK(!sc_peer_conn_usable(c));
	sc_peer_pool_put(pool, c, true);
	uint8_t after[4096];
	CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, 0, after, sizeof(after), &err), 0);
	CHECK(memcmp(want, after, sizeof(after)) == 0);
	unexpose(&p.a, &e);
	pair_down(&p);
}

/* OPEN, READ and DONE {OK} sent back to back, as a single-stream transfer does: the server judges
 * them in order; the bytes arrive and the operation is COMPLETE. The same with an out-of-bounds
 * READ: the DONE is refused and the operation ends ERRORED, never COMPLETE. */
TEST(done_pipelined_behind_the_last_request)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	for (int bad = 0; bad <= 1; bad++) {
		struct exposed e;
		CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 5000, &e), 0);
		struct sc_peer_conn *c;
		CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
		uint64_t off = bad ? 4990 : 1001, len = 3333;
		CHECK_INT_EQ(sc_peer_open_send(c, e.md.token, 9, SC_OP_READ, 5000, 0, dl, NULL, &err),
			     0);
		CHECK_INT_EQ(sc_peer_read_send(c, e.md.token, 9, 0, off, len, dl, NULL, &err), 0);
		CHECK_INT_EQ(sc_peer_done_send(c, e.md.token, 9, SC_OK, NULL, dl, NULL, &err), 0);
		CHECK_INT_EQ(sc_peer_open_recv(c, dl, NULL, NULL, &err), 0);
		uint8_t got[3333], want[3333];
		struct sc_op_info after;
		if (!bad) {
			CHECK_INT_EQ(sc_peer_read_recv(c, len, got, dl, NULL, &err), 0);
			CHECK_INT_EQ(sc_peer_done_recv(c, dl, NULL, &err), 0);
			CHECK_INT_EQ(sc_region_read(p.a.eng, e.region, off, want, len, &err), 0);
			CHECK(memcmp(got, want, len) == 0);
			CHECK_INT_EQ(wait_op(p.a.eng, e.op.id, 2000, &after), 0);
			CHECK_STR_EQ(sc_op_status_name(after.status), "COMPLETE");
		} else {
			CHECK_INT_EQ(sc_peer_read_recv(c, len, got, dl, NULL, &err), -1);
			CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
			CHECK_STR_CONTAINS(err.msg, "outside descriptor 0");
			CHECK_INT_EQ(wait_op(p.a.eng, e.op.id, 2000, &after), 0);
			CHECK_STR_EQ(sc_op_status_name(after.status), "ERRORED");
			CHECK_STR_CONTAINS(after.err_msg, "refused one of its requests");
		}
		sc_op_info_free(&after);
		sc_peer_pool_put(pool, c, !bad);
		unexpose(&p.a, &e);
	}
	pair_down(&p);
}

/* The ibverbs completion notice's check (peer/server.c, used by ib/notify.c): a notice received
 * on a QP of peer P for transfer X ends X only if a connection authenticated as P OPENed X flagged
 * "via ibverbs", and only once. Needs no RDMA device: the claim is the peer server's bookkeeping.
 */
TEST(ib_completion_notice_claim_checks_peer_and_flag)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct exposed plain, viaib, later;
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &plain), 0);
	CHECK_INT_EQ(expose(&p.a, SC_OP_WRITABLE, 4096, &viaib), 0);
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &later), 0);
	struct sc_peer_server *srv = sc_engine_peer_server(p.a.eng);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_passive sv = sc_peer_server_passive(srv); /* what ib/notify.c is handed */
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	uint8_t tok[SC_TOKEN_LEN];
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	/* never opened: refused */
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 7, SC_BACKEND_IBVERBS, tok), -1);
	/* opened over TCP (no ibverbs flag): a notice cannot end it */
	CHECK_INT_EQ(sc_peer_open(c, plain.md.token, 7, SC_OP_READ, 4096, dl, NULL, &err), 0);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 7, SC_BACKEND_IBVERBS, tok), -1);
	/* opened via ibverbs by sidecar-b: another peer's notice, or another transfer id, cannot */
	CHECK_INT_EQ(sc_peer_open_via(c, viaib.md.token, 8, SC_OP_WRITE, 4096,
				      SC_BACKEND_IBVERBS, dl, NULL, &err),
		     0);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-c", 8, SC_BACKEND_IBVERBS, tok), -1);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 9, SC_BACKEND_IBVERBS, tok), -1);
	/* a claim for another backend cannot either */
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 8, SC_BACKEND_TCP, tok), -1);
	/* its own peer's notice ends it, once, and hands back the token */
	memset(tok, 0, sizeof(tok));
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 8, SC_BACKEND_IBVERBS, tok), 0);
	CHECK(memcmp(tok, viaib.md.token, SC_TOKEN_LEN) == 0);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 8, SC_BACKEND_IBVERBS, tok), -1);
	CHECK_INT_EQ(sc_passive_done(&sv, tok, 8, SC_OK, "", &err), 0);
	struct sc_op_info info;
	CHECK_INT_EQ(wait_op(p.a.eng, viaib.op.id, 2000, &info), 0);
	CHECK_STR_EQ(sc_op_status_name(info.status), "COMPLETE");
	sc_op_info_free(&info);
	/* the refused claims left the TCP-opened transfer alone */
	CHECK_INT_EQ(sc_op_get(p.a.eng, plain.op.id, &info, &err), 0);
	CHECK_STR_EQ(sc_op_status_name(info.status), "IN_PROGRESS");
	sc_op_info_free(&info);
	/* a transfer whose control connection closed (an orphan, within its grace) is still
	 * claimed by its own peer only */
	CHECK_INT_EQ(sc_peer_open_via(c, later.md.token, 10, SC_OP_READ, 4096,
				      SC_BACKEND_IBVERBS, dl, NULL, &err),
		     0);
	sc_peer_pool_put(pool, c, false);
	usleep(100 * 1000);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-c", 10, SC_BACKEND_IBVERBS, tok), -1);
	CHECK_INT_EQ(sc_passive_claim(&sv, "sidecar-b", 10, SC_BACKEND_IBVERBS, tok), 0);
	CHECK(memcmp(tok, later.md.token, SC_TOKEN_LEN) == 0);
	unexpose(&p.a, &plain);
	unexpose(&p.a, &viaib);
	unexpose(&p.a, &later);
	pair_down(&p);
}

static int echo_handler(void *ctx, const char *peer_id, const uint8_t *body, size_t len,
			uint8_t *reply, size_t cap, size_t *reply_len, struct sc_err *err)
{
	if (len == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "empty rendezvous");
	int n = snprintf((char *)reply, cap, "%s:%.*s", peer_id, (int)len, (const char *)body);
	*reply_len = (size_t)n;
	++*(int *)ctx;
	return 0;
}

TEST(qp_connect_handler_round_trip)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	int calls = 0;
	struct sc_peer_server *srv = sc_engine_peer_server(p.a.eng);
	CHECK_INT_EQ(sc_peer_server_set_handler(srv, SC_FRAME_QP_CONNECT, echo_handler, &calls), 0);
	CHECK_INT_EQ(sc_peer_server_set_handler(srv, SC_FRAME_READ, echo_handler, &calls), -1);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	uint8_t reply[128];
	size_t n = 0;
	CHECK_INT_EQ(sc_peer_call(c, SC_FRAME_QP_CONNECT, "qpn=17", 6, reply, sizeof(reply), &n, dl,
				  NULL, &err),
		     0);
	CHECK_U64_EQ(n, strlen("sidecar-b:qpn=17"));
	CHECK(memcmp(reply, "sidecar-b:qpn=17", n) == 0);
	CHECK_INT_EQ(sc_peer_call(c, SC_FRAME_QP_CONNECT, "", 0, reply, sizeof(reply), &n, dl, NULL,
				  &err),
		     -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "empty rendezvous");
	CHECK_INT_EQ(calls, 1);
	CHECK_INT_EQ(sc_peer_server_set_handler(srv, SC_FRAME_QP_CONNECT, NULL, NULL), 0);
	CHECK_INT_EQ(sc_peer_call(c, SC_FRAME_QP_CONNECT, "x", 1, reply, sizeof(reply), &n, dl,
				  NULL, &err),
		     -1);
	CHECK_INT_EQ(err.code, SC_UNIMPLEMENTED);
	sc_peer_pool_put(pool, c, true);
	pair_down(&p);
}

TEST(dropped_connection_errors_the_passive_side)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	struct exposed e;
	CHECK_INT_EQ(expose(&p.a, SC_OP_READABLE, 4096, &e), 0);
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	struct sc_peer_conn *c;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	CHECK_INT_EQ(sc_peer_pool_get(pool, endpoint_of(&p.a), dl, &c, &err), 0);
	CHECK_INT_EQ(sc_peer_open(c, e.md.token, 42, SC_OP_READ, 4096, dl, NULL, &err), 0);
	uint64_t t0 = sc_clock_mono_ms();
	sc_peer_pool_put(pool, c, false); /* the "active side" vanishes without DONE */
	struct sc_op_info after;
	CHECK_INT_EQ(wait_op(p.a.eng, e.op.id, 5000, &after), 0);
	uint64_t took = sc_clock_mono_ms() - t0;
	CHECK_STR_EQ(sc_op_status_name(after.status), "ERRORED");
	CHECK_INT_EQ(after.err_code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(after.err_msg, "DONE");
	CHECK(took < 3000);
	sc_op_info_free(&after);
	unexpose(&p.a, &e);
	pair_down(&p);
}

TEST(cancel_mid_transfer_ends_both_sides)
{
	/* Small chunks so the transfer is surely mid-way when the cancel lands. */
	struct pair p;
	CHECK_INT_EQ(side_up(&p.a, "sidecar-a", true, NULL, NULL), 0);
	CHECK_INT_EQ(side_up(&p.b, "sidecar-b", true, "--tcp-chunk-size", "64k"), 0);
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, 32 * MiB, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, 32 * MiB, rb), 0);
	struct sc_desc da = {.offset = 0, .length = 32 * MiB}, db = da;
	snprintf(da.region_id, SC_ID_MAX, "%s", ra);
	snprintf(db.region_id, SC_ID_MAX, "%s", rb);
	struct sc_passive_req preq = {.descs = &da, .n_descs = 1, .timeout_ms = 60000};
	struct sc_op_info pinfo, ainfo, pa, aa;
	struct sc_err err;
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo, &err), 0);
	struct sc_active_req areq = {.metadata = pinfo.metadata, .descs = &db, .n_descs = 1,
				     .timeout_ms = 60000};
	CHECK_INT_EQ(sc_op_begin(p.b.eng, SC_OP_READ, &areq, &ainfo, &err), 0);
	/* wait for some progress, then cancel */
	for (int i = 0; i < 2000; i++) {
		struct sc_op_info now;
		sc_op_get(p.b.eng, ainfo.id, &now, &err);
		bool moving = now.bytes_done > 0 || sc_op_status_terminal(now.status);
		sc_op_info_free(&now);
		if (moving)
			break;
		usleep(1000);
	}
	uint64_t t0 = sc_clock_mono_ms();
	struct sc_op_info cancelled;
	CHECK_INT_EQ(sc_op_cancel(p.b.eng, ainfo.id, &cancelled, &err), 0);
	sc_op_info_free(&cancelled);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 5000, &aa), 0);
	CHECK_INT_EQ(wait_op(p.a.eng, pinfo.id, 5000, &pa), 0);
	uint64_t took = sc_clock_mono_ms() - t0;
	CHECK_STR_EQ(sc_op_status_name(aa.status), "CANCELLED");
	if (pa.status != SC_OPS_CANCELLED)
		fprintf(stderr, "  passive: %s %s\n", sc_op_status_name(pa.status), pa.err_msg);
	CHECK_STR_EQ(sc_op_status_name(pa.status), "CANCELLED");
	CHECK(aa.bytes_done < 32 * MiB);
	CHECK(took < 3000);
	sc_op_info_free(&pa);
	sc_op_info_free(&aa);

	/* the metadata of the cancelled operation cannot be used again: FAILED_PRECONDITION */
	sc_op_info_free(&ainfo);
	CHECK_INT_EQ(sc_op_begin(p.b.eng, SC_OP_READ, &areq, &ainfo, &err), 0);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 5000, &aa), 0);
	CHECK_STR_EQ(sc_op_status_name(aa.status), "ERRORED");
	CHECK_INT_EQ(aa.err_code, SC_FAILED_PRECONDITION);
	CHECK(strstr(aa.err_msg, "cancelled") != NULL);
	CHECK_U64_EQ(aa.bytes_done, 0);
	sc_op_info_free(&aa);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	pair_down(&p);
}

TEST(sidecar_without_keys_is_refused_clearly)
{
	struct pair p;
	CHECK_INT_EQ(side_up(&p.a, "sidecar-a", true, NULL, NULL), 0);
	CHECK_INT_EQ(side_up(&p.b, "sidecar-nokeys", false, NULL, NULL), 0);
	struct sc_peer_conn *c = NULL;
	struct sc_err err;
	uint64_t dl = sc_clock_mono_ms() + 5000;
	/* B has no keys: it cannot prove anything to A */
	struct sc_peer_pool *pool_a = sc_engine_peer_pool(p.a.eng);
	struct sc_peer_pool *pool_b = sc_engine_peer_pool(p.b.eng);
	CHECK_INT_EQ(sc_peer_pool_get(pool_b, endpoint_of(&p.a), dl, &c, &err), -1);
	CHECK_INT_EQ(err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(err.msg, "--key-file on both sidecars");
	/* A dialing B: B refuses */
	CHECK_INT_EQ(sc_peer_pool_get(pool_a, endpoint_of(&p.b), dl, &c, &err), -1);
	CHECK_INT_EQ(err.code, SC_UNAUTHENTICATED);
	CHECK_STR_CONTAINS(err.msg, "--key-file on both sidecars");
	CHECK_STR_CONTAINS(err.msg, "sidecar-nokeys");
	pair_down(&p);
}

TEST(unreachable_endpoint_is_unavailable)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	/* a port nobody listens on */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	socklen_t sl = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	char ep[64];
	snprintf(ep, sizeof(ep), "127.0.0.1:%u", ntohs(sa.sin_port));
	close(fd);
	struct sc_peer_conn *c;
	struct sc_err err;
	CHECK_INT_EQ(sc_peer_pool_get(sc_engine_peer_pool(p.b.eng), ep, sc_clock_mono_ms() + 3000,
				      &c, &err),
		     -1);
	CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(err.msg, "cannot reach peer sidecar at 127.0.0.1:");
	CHECK_STR_CONTAINS(err.msg, "refused");
	CHECK_INT_EQ(sc_peer_pool_get(sc_engine_peer_pool(p.b.eng), "no-port", 0, &c, &err), -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	pair_down(&p);
}

TEST(data_port_in_use_fails_at_start)
{
	struct side a, b;
	CHECK_INT_EQ(side_up(&a, "sidecar-a", true, NULL, NULL), 0);
	char listen[64];
	snprintf(listen, sizeof(listen), "%s", endpoint_of(&a));
	CHECK_INT_EQ(side_up(&b, "sidecar-b", true, "--data-listen", listen), -1);
	side_down(&a);
}

static int raw_connect(const char *endpoint)
{
	unsigned port = (unsigned)atoi(strrchr(endpoint, ':') + 1);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	struct timeval tv = {.tv_sec = 3};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Bytes until EOF (or -1 on timeout). */
static ssize_t drain(int fd)
{
	uint8_t b[4096];
	ssize_t total = 0;
	for (;;) {
		ssize_t n = recv(fd, b, sizeof(b), 0);
		if (n == 0)
			return total;
		if (n < 0)
			return errno == ECONNRESET ? total : -1;
		total += n;
	}
}

TEST(garbage_on_the_data_port_is_rejected_and_a_still_serves)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, NULL), 0);
	const char *ep = endpoint_of(&p.a);
	/* 1: random bytes; 2: a valid-looking header announcing a 4 GiB body; 3: a READ before any
	 * hello; 4: silence then close (a port probe); 5: a WRITE with a huge bulk pre-hello */
	for (int round = 1; round <= 5; round++) {
		int fd = raw_connect(ep);
		CHECK(fd >= 0);
		uint8_t buf[512];
		size_t n = 0;
		if (round == 1) {
			sc_random_bytes(buf, sizeof(buf));
			buf[0] = 0x77; /* not version 1 */
			n = sizeof(buf);
		} else if (round == 2) {
			uint8_t h[8] = {1, SC_FRAME_HELLO, 0, 0, 0xff, 0xff, 0xff, 0xff};
			memcpy(buf, h, 8);
			n = 8;
		} else if (round == 3) {
			struct sc_peer_msg m = {.type = SC_FRAME_READ, .len = 4096};
			n = sc_peer_encode(&m, buf, sizeof(buf));
		} else if (round == 5) {
			struct sc_peer_msg m = {.type = SC_FRAME_WRITE, .len = SC_PEER_MAX_BULK};
			n = sc_peer_encode(&m, buf, sizeof(buf));
		}
		if (n)
			CHECK_INT_EQ(send(fd, buf, n, MSG_NOSIGNAL), (long long)n);
		else
			shutdown(fd, SHUT_WR);
		/* the server closes without sending anything back but, at most, an ERROR */
		ssize_t got = drain(fd);
		CHECK(got >= 0);
		CHECK(got < 600);
		close(fd);
	}
	/* after a good hello: a frame a client never sends, and a READ over 1 GiB, each close that
	 * connection (and only that one) */
	struct sc_peer_pool *pool = sc_engine_peer_pool(p.b.eng);
	uint64_t dl = sc_clock_mono_ms() + 5000;
	struct sc_peer_conn *good, *bad;
	struct sc_err err;
	CHECK_INT_EQ(sc_peer_pool_get(pool, ep, dl, &good, &err), 0);
	for (int round = 0; round < 2; round++) {
		CHECK_INT_EQ(sc_peer_pool_get(pool, ep, dl, &bad, &err), 0);
		uint8_t frame[128];
		struct sc_peer_msg m = {.type = round ? SC_FRAME_READ : SC_FRAME_HELLO_ACK,
					.len = 4096};
		size_t n = sc_peer_encode(&m, frame, sizeof(frame));
		for (int k = 0; round && k < 8; k++) /* READ.len, the last 8 bytes: 1 GiB + 1 */
			frame[n - 8 + k] = (uint8_t)((SC_PEER_MAX_BULK + 1) >> (8 * k));
		CHECK_INT_EQ(send(sc_peer_conn_fd(bad), frame, n, MSG_NOSIGNAL), (long long)n);
		struct timeval tv = {.tv_sec = 3};
		setsockopt(sc_peer_conn_fd(bad), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		CHECK_INT_EQ(drain(sc_peer_conn_fd(bad)), 0);
		sc_peer_pool_put(pool, bad, false);
		CHECK_INT_EQ(sc_peer_ping(good, dl, NULL, &err), 0);
	}
	sc_peer_pool_put(pool, good, true);

	/* many idle connections do not stop a real transfer */
	int idle[20];
	for (int i = 0; i < 20; i++)
		idle[i] = raw_connect(ep);
	struct layout l = {.n = 2, .len = {4096, 5 * MiB + 1}, .off_a = {1, 8192},
			   .off_b = {3, 1 * MiB}};
	check_layout(&p, SC_OP_READ, &l);
	for (int i = 0; i < 20; i++)
		close(idle[i]);
	pair_down(&p);
}

TEST(endpoint_is_advertised_or_derived)
{
	struct side s;
	CHECK_INT_EQ(side_up(&s, "sidecar-x", true, "--advertise", "10.1.2.3"), 0);
	CHECK(strncmp(endpoint_of(&s), "10.1.2.3:", 9) == 0);
	struct sc_info info;
	sc_engine_info(s.eng, &info);
	CHECK_STR_CONTAINS(info.backends[0].detail, "tcp data plane on 10.1.2.3:");
	CHECK(info.backends[0].available);
	side_down(&s);
	CHECK_INT_EQ(side_up(&s, "sidecar-y", true, "--data-listen", "0.0.0.0:0"), 0);
	CHECK(strncmp(endpoint_of(&s), "127.0.0.1:", 10) == 0);
	side_down(&s);
}

/* ---- benchmark (SC_BENCH=1) ------------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

TEST(bench)
{
	const char *on = getenv("SC_BENCH");
	if (!on || on[0] != '1') {
		fprintf(stderr, "  (SC_BENCH=1 to measure)\n");
		return;
	}
	const char *streams = getenv("SC_BENCH_STREAMS");
	struct pair p;
	CHECK_INT_EQ(pair_up(&p, streams), 0);
	printf("bench: shm %s, tcp streams %s\n", g_shm, streams ? streams : "default");

	uint64_t big = 256 * MiB;
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, big, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, big, rb), 0);
	struct layout l = {.n = 1, .len = {big}};
	enum { REPS = 7 };
	static const enum sc_op_kind kinds[] = {SC_OP_READ, SC_OP_WRITE};
	for (size_t k = 0; k < 2; k++) {
		uint64_t us[REPS];
		if (k == 1) /* new bytes to write, so the comparison below means something */
			CHECK_INT_EQ(fill_random(&p.b, rb, big), 0);
		for (int i = 0; i < REPS; i++) {
			struct run r;
			CHECK_INT_EQ(transfer(&p, kinds[k], &l, ra, rb, &r), 0);
			CHECK_INT_EQ(r.active.status, SC_OPS_COMPLETE);
			us[i] = r.begin_to_done_us;
			sc_op_info_free(&r.active);
			sc_op_info_free(&r.passive);
		}
		CHECK(same_bytes(p.a.eng, ra, 0, p.b.eng, rb, 0, big));
		qsort(us, REPS, sizeof(us[0]), cmp_u64);
		printf("bench: 256 MiB %s: best %.2f GB/s, median %.2f GB/s, worst %.2f GB/s\n",
		       k ? "write" : "read", (double)big / (double)us[0] / 1e3,
		       (double)big / (double)us[REPS / 2] / 1e3,
		       (double)big / (double)us[REPS - 1] / 1e3);
	}

	enum { N = 2000 };
	static uint64_t lat[N];
	struct layout s = {.n = 1, .len = {4096}, .off_a = {4096}, .off_b = {8192}};
	for (int i = 0; i < N + 100; i++) {
		struct run r;
		CHECK_INT_EQ(transfer(&p, SC_OP_READ, &s, ra, rb, &r), 0);
		CHECK_INT_EQ(r.active.status, SC_OPS_COMPLETE);
		if (i >= 100)
			lat[i - 100] = r.begin_to_done_us;
		sc_op_info_free(&r.active);
		sc_op_info_free(&r.passive);
	}
	qsort(lat, N, sizeof(lat[0]), cmp_u64);
	printf("bench: 4 KiB read, BeginRead to COMPLETE, %d runs: p50 %" PRIu64 " us, p90 %" PRIu64
	       " us, p99 %" PRIu64 " us, max %" PRIu64 " us\n",
	       N, lat[N / 2], lat[N * 9 / 10], lat[N * 99 / 100], lat[N - 1]);
	pair_down(&p);
}

RUN_TESTS(T(read_many_descriptors_odd_offsets), T(write_many_descriptors_odd_offsets),
	  T(each_size_alone_both_directions_and_stream_counts),
	  T(concurrent_transfers_share_workers_and_connections),
	  T(forged_requests_get_errors_and_touch_nothing),
	  T(open_sends_the_trace_id_only_to_issuers_that_read_it), T(forged_multi_piece_requests),
	  T(done_pipelined_behind_the_last_request),
	  T(qp_connect_handler_round_trip),
	  T(dropped_connection_errors_the_passive_side), T(cancel_mid_transfer_ends_both_sides),
	  T(sidecar_without_keys_is_refused_clearly), T(unreachable_endpoint_is_unavailable),
	  T(data_port_in_use_fails_at_start),
	  T(garbage_on_the_data_port_is_rejected_and_a_still_serves),
	  T(endpoint_is_advertised_or_derived), T(ib_completion_notice_claim_checks_peer_and_flag),
	  T(bench))
