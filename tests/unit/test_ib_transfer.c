/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_ib_transfer.c: the ibverbs data path end to end on a real RDMA device (Soft-RoCE in the VM:
 * tests/vm/run-in-vm.sh), through two engines in one process (A serves, B is active) that share a
 * key file and one device: READ and WRITE of random bytes over several descriptors at odd offsets
 * (1 B, 4095 B, 1 MiB + 7), with Operation.backend == IBVERBS on both sides; concurrent transfers
 * on one QP; cancel mid-transfer; the deadline; an unreachable peer (tombstone); a peer that
 * restarted behind an idle cached QP; the passive sidecar's process killed mid-READ (a forked
 * child); and the revoked
 * rkey: after a passive operation completes or is cancelled, an RDMA READ with its old rkey ends
 * with IBV_WC_REM_ACCESS_ERR.
 *
 * Exits 77 (skipped) when the build has no libibverbs or the host has no RDMA device.
 * Environment: RXE_DEV (device, else the first active one), RXE_IP (address of the device's
 * netdev, else 127.0.0.1), SC_TEST_SHM (region directory, else /dev/shm or $SC_TEST_TMP),
 * SC_TEST_LOG=debug|info shows the engines' logs.
 */
#include "build_config.h"

#if !SC_HAVE_IBVERBS
#include <stdio.h>
int main(void)
{
	fprintf(stderr, "built without libibverbs: skipping\n");
	return 77;
}
#else

#include "check.h"
#include "op_wait.h"

#include "engine/engine.h"
#include "engine/test.h"
#include "ib/test.h"
#include "meta/keys.h"
#include "base/log.h"
#include "meta/metadata.h"
#include "backend/passive.h"
#include "peer/server.h"
#include "base/timer.h"

#include <fcntl.h>
#include <glob.h>
#include <infiniband/verbs.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

static char g_dir[256];
static char g_keyfile[300];
static char g_shm[300];
static const char *g_dev;
static const char *g_ip = "127.0.0.1";
static char g_listen[80];

/* ---- fixture -----------------------------------------------------------------------------------
 */

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
	snprintf(g_dir, sizeof(g_dir), "%s/ib-transfer-XXXXXX", base);
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return -1;
	}
	const char *shm = getenv("SC_TEST_SHM");
	if (!shm || !shm[0])
		shm = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : g_dir;
	snprintf(g_shm, sizeof(g_shm), "%s", shm);

	unsigned char key[32], b64[64];
	char text[200];
	if (sc_random_bytes(key, sizeof(key)) != 0)
		return -1;
	EVP_EncodeBlock(b64, key, sizeof(key));
	snprintf(text, sizeof(text), "test-key:%s\n", b64);
	snprintf(g_keyfile, sizeof(g_keyfile), "%s/keys", g_dir);
	int fd = open(g_keyfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
		perror(g_keyfile);
		return -1;
	}
	close(fd);
	snprintf(g_listen, sizeof(g_listen), "%s:0", g_ip);

	const char *lvl = getenv("SC_TEST_LOG");
	enum sc_log_level level = SC_LOG_ERROR;
	if (lvl)
		sc_log_level_parse(lvl, &level);
	sc_log_configure(level, false);
	return 0;
}

static int side_up(struct side *s, const char *id)
{
	if (setup_dirs() != 0)
		return -1;
	char *argv[24];
	int argc = 0;
	argv[argc++] = "rdma-sidecar";
	argv[argc++] = "--id";
	argv[argc++] = (char *)id;
	argv[argc++] = "--data-listen";
	argv[argc++] = g_listen;
	argv[argc++] = "--advertise";
	argv[argc++] = (char *)g_ip;
	argv[argc++] = "--shm-dir";
	argv[argc++] = g_shm;
	argv[argc++] = "--backends";
	argv[argc++] = "ibverbs,tcp";
	argv[argc++] = "--key-file";
	argv[argc++] = g_keyfile;
	if (g_dev) {
		argv[argc++] = "--ib-device";
		argv[argc++] = (char *)g_dev;
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
	struct sc_info info;
	sc_engine_info(s->eng, &info);
	for (size_t i = 0; i < info.n_backends; i++) {
		if (info.backends[i].backend != SC_BACKEND_IBVERBS)
			continue;
		if (!info.backends[i].available) {
			fprintf(stderr, "engine %s: ibverbs unavailable: %s\n", id,
				info.backends[i].detail);
			sc_engine_destroy(s->eng);
			s->eng = NULL;
			sc_config_free(&s->cfg);
			return -1;
		}
		fprintf(stderr, "  %s: ibverbs %s\n", id, info.backends[i].detail);
	}
	return 0;
}

static void side_down(struct side *s)
{
	sc_engine_destroy(s->eng);
	s->eng = NULL;
	sc_config_free(&s->cfg);
}

static int pair_up(struct pair *p)
{
	if (side_up(&p->a, "sidecar-a") != 0)
		return -1;
	if (side_up(&p->b, "sidecar-b") != 0) {
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

/* Random bytes, cheaply (OpenSSL's generator is slow under TCG for tens of MiB). */
static int fill_random(struct side *s, const char *id, uint64_t size)
{
	uint64_t state;
	if (sc_random_bytes(&state, sizeof(state)) != 0)
		return -1;
	state |= 1;
	uint8_t *buf = malloc(MiB);
	int rc = buf ? 0 : -1;
	for (uint64_t off = 0; rc == 0 && off < size; off += MiB) {
		size_t n = size - off < MiB ? (size_t)(size - off) : MiB;
		for (size_t i = 0; i < n; i += 8) {
			state ^= state << 13;
			state ^= state >> 7;
			state ^= state << 17;
			memcpy(buf + i, &state, n - i < 8 ? n - i : 8);
		}
		struct sc_err err;
		rc = sc_region_write(s->eng, id, off, buf, n, &err);
	}
	free(buf);
	return rc;
}

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

static void drop_region(struct side *s, const char *id)
{
	struct sc_err err;
	sc_region_deregister(s->eng, id, true, &err);
}


/* Wait until op has moved at least `bytes` (or ended). */
static void wait_progress(struct sc_engine *eng, const char *id, uint64_t bytes,
			  uint64_t timeout_ms)
{
	uint64_t until = sc_clock_mono_ms() + timeout_ms;
	while (sc_clock_mono_ms() < until) {
		struct sc_op_info info;
		struct sc_err err;
		if (sc_op_get(eng, id, &info, &err) != 0)
			return;
		bool enough = info.bytes_done >= bytes || sc_op_status_terminal(info.status);
		sc_op_info_free(&info);
		if (enough)
			return;
		usleep(5000);
	}
}

/* ---- transfers ---------------------------------------------------------------------------------
 */

struct layout {
	size_t n;
	uint64_t len[4];
	uint64_t off_a[4]; /* in A's region (passive) */
	uint64_t off_b[4]; /* in B's region (active) */
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
	uint8_t *x = malloc(MiB), *y = malloc(MiB);
	bool same = x && y;
	for (uint64_t done = 0; same && done < len; done += MiB) {
		size_t n = len - done < MiB ? (size_t)(len - done) : MiB;
		struct sc_err err;
		if (sc_region_read(ea, ra, oa + done, x, n, &err) != 0 ||
		    sc_region_read(eb, rb, ob + done, y, n, &err) != 0 || memcmp(x, y, n) != 0)
			same = false;
	}
	free(x);
	free(y);
	return same;
}

static void descs_of(const struct layout *l, const char *ra, const char *rb, struct sc_desc *da,
		     struct sc_desc *db)
{
	for (size_t i = 0; i < l->n; i++) {
		da[i] = (struct sc_desc){.offset = l->off_a[i], .length = l->len[i]};
		db[i] = (struct sc_desc){.offset = l->off_b[i], .length = l->len[i]};
		snprintf(da[i].region_id, SC_ID_MAX, "%s", ra);
		snprintf(db[i].region_id, SC_ID_MAX, "%s", rb);
	}
}

/* Expose A's ranges, begin on B (timeouts in ms); the op infos go to pinfo/ainfo (freed by the
 * caller on success). */
static int begin(struct pair *p, enum sc_op_kind kind, const struct layout *l, const char *ra,
		 const char *rb, uint64_t passive_timeout, uint64_t active_timeout,
		 struct sc_op_info *pinfo, struct sc_op_info *ainfo)
{
	struct sc_desc da[4], db[4];
	descs_of(l, ra, rb, da, db);
	struct sc_passive_req preq = {.descs = da, .n_descs = l->n, .timeout_ms = passive_timeout};
	struct sc_err err;
	if (sc_op_create_passive(p->a.eng, kind == SC_OP_READ ? SC_OP_READABLE : SC_OP_WRITABLE,
				 &preq, pinfo, &err) != 0) {
		fprintf(stderr, "create passive: %s\n", err.msg);
		return -1;
	}
	struct sc_active_req areq = {.metadata = pinfo->metadata,
				     .descs = db,
				     .n_descs = l->n,
				     .timeout_ms = active_timeout};
	if (sc_op_begin(p->b.eng, kind, &areq, ainfo, &err) != 0) {
		fprintf(stderr, "begin: %s\n", err.msg);
		sc_op_info_free(pinfo);
		return -1;
	}
	return 0;
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

static void check_transfer(struct pair *p, enum sc_op_kind kind, const struct layout *l)
{
	CHECK(!overlaps(l, l->off_a) && !overlaps(l, l->off_b));
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p->a, layout_span(l, l->off_a) + 3, ra), 0);
	CHECK_INT_EQ(make_region(&p->b, layout_span(l, l->off_b) + 5, rb), 0);
	uint64_t total = 0;
	for (size_t i = 0; i < l->n; i++) {
		total += l->len[i];
		if (l->len[i] > 8)
			CHECK(!same_bytes(p->a.eng, ra, l->off_a[i], p->b.eng, rb, l->off_b[i],
					  l->len[i]));
	}
	struct sc_op_info pinfo, ainfo, pend, aend;
	uint64_t t0 = sc_clock_mono_ms();
	CHECK_INT_EQ(begin(p, kind, l, ra, rb, 60000, 60000, &pinfo, &ainfo), 0);
	int rc = wait_op(p->b.eng, ainfo.id, 90000, &aend);
	uint64_t ms = sc_clock_mono_ms() - t0;
	if (rc == 0)
		rc = wait_op(p->a.eng, pinfo.id, 10000, &pend);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	CHECK_INT_EQ(rc, 0);
	if (aend.status != SC_OPS_COMPLETE)
		fprintf(stderr, "  active: %s %s\n", sc_status_name(aend.err_code), aend.err_msg);
	if (pend.status != SC_OPS_COMPLETE)
		fprintf(stderr, "  passive: %s %s\n", sc_status_name(pend.err_code), pend.err_msg);
	CHECK_STR_EQ(sc_op_status_name(aend.status), "COMPLETE");
	CHECK_STR_EQ(sc_op_status_name(pend.status), "COMPLETE");
	CHECK_INT_EQ(aend.backend, SC_BACKEND_IBVERBS);
	CHECK_INT_EQ(pend.backend, SC_BACKEND_IBVERBS);
	CHECK_U64_EQ(aend.bytes_done, total);
	CHECK_U64_EQ(pend.bytes_done, total);
	CHECK_STR_EQ(pend.peer, "sidecar-b");
	for (size_t i = 0; i < l->n; i++)
		if (!same_bytes(p->a.eng, ra, l->off_a[i], p->b.eng, rb, l->off_b[i], l->len[i]))
			CHECK_FAIL_("descriptor %zu (%" PRIu64 " bytes) differs after %s", i,
				    l->len[i], sc_op_kind_name(kind));
	fprintf(stderr, "  %s of %" PRIu64 " bytes in %zu descriptor(s): %" PRIu64 " ms\n",
		sc_op_kind_name(kind), total, l->n, ms);
	sc_op_info_free(&aend);
	sc_op_info_free(&pend);
	drop_region(&p->a, ra);
	drop_region(&p->b, rb);
}

static const struct layout odd = {
    .n = 3,
    .len = {1, 4095, MiB + 7},
    .off_a = {3, 11, 8191},
    .off_b = {2 * MiB + 100, 17, 5 * 4096 + 333},
};

TEST(read_odd_descriptors)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	check_transfer(&p, SC_OP_READ, &odd);
	/* The QP is cached: a second read reuses it. */
	check_transfer(&p, SC_OP_READ, &odd);
	size_t out_b, in_b, out_a, in_a;
	sc_ib_test_qp_counts(sc_engine_backend(p.b.eng, SC_BACKEND_IBVERBS), &out_b, &in_b);
	sc_ib_test_qp_counts(sc_engine_backend(p.a.eng, SC_BACKEND_IBVERBS), &out_a, &in_a);
	CHECK_U64_EQ(out_b, 1);
	CHECK_U64_EQ(in_a, 1);
	CHECK_U64_EQ(out_a, 0);
	pair_down(&p);
}

TEST(write_odd_descriptors)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	check_transfer(&p, SC_OP_WRITE, &odd);
	struct layout one = {.n = 1, .len = {4 * MiB + 1}, .off_a = {5}, .off_b = {4097}};
	check_transfer(&p, SC_OP_WRITE, &one);
	check_transfer(&p, SC_OP_READ, &one);
	pair_down(&p);
}

/* Four transfers at once share one QP and its send queue. */
TEST(concurrent_transfers_share_the_qp)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	enum { N = 4 };
	const uint64_t len = 3 * MiB + 333;
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, N * len + 64, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, N * len + 64, rb), 0);
	struct sc_op_info pinfo[N], ainfo[N];
	for (int i = 0; i < N; i++) {
		struct layout l = {
		    .n = 1, .len = {len}, .off_a = {i * len + 7}, .off_b = {i * len + 9}};
		CHECK_INT_EQ(begin(&p, i % 2 ? SC_OP_WRITE : SC_OP_READ, &l, ra, rb, 60000, 60000,
				   &pinfo[i], &ainfo[i]),
			     0);
	}
	for (int i = 0; i < N; i++) {
		struct sc_op_info a, pa;
		CHECK_INT_EQ(wait_op(p.b.eng, ainfo[i].id, 90000, &a), 0);
		CHECK_INT_EQ(wait_op(p.a.eng, pinfo[i].id, 10000, &pa), 0);
		if (a.status != SC_OPS_COMPLETE)
			fprintf(stderr, "  active %d: %s\n", i, a.err_msg);
		CHECK_STR_EQ(sc_op_status_name(a.status), "COMPLETE");
		CHECK_STR_EQ(sc_op_status_name(pa.status), "COMPLETE");
		CHECK(same_bytes(p.a.eng, ra, i * len + 7, p.b.eng, rb, i * len + 9, len));
		sc_op_info_free(&a);
		sc_op_info_free(&pa);
		sc_op_info_free(&ainfo[i]);
		sc_op_info_free(&pinfo[i]);
	}
	size_t out_b, in_b;
	sc_ib_test_qp_counts(sc_engine_backend(p.b.eng, SC_BACKEND_IBVERBS), &out_b, &in_b);
	CHECK_U64_EQ(out_b, 1);
	drop_region(&p.a, ra);
	drop_region(&p.b, rb);
	pair_down(&p);
}

TEST(cancel_mid_transfer)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	const uint64_t len = 24 * MiB;
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, len, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, len, rb), 0);
	struct layout l = {.n = 1, .len = {len}};
	struct sc_op_info pinfo, ainfo, a, pa;
	CHECK_INT_EQ(begin(&p, SC_OP_READ, &l, ra, rb, 60000, 60000, &pinfo, &ainfo), 0);
	wait_progress(p.b.eng, ainfo.id, 2 * MiB, 30000);
	struct sc_err err;
	struct sc_op_info c;
	uint64_t t0 = sc_clock_mono_ms();
	CHECK_INT_EQ(sc_op_cancel(p.b.eng, ainfo.id, &c, &err), 0);
	sc_op_info_free(&c);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 30000, &a), 0);
	CHECK_INT_EQ(wait_op(p.a.eng, pinfo.id, 30000, &pa), 0);
	uint64_t ms = sc_clock_mono_ms() - t0;
	fprintf(stderr,
		"  cancelled after %" PRIu64 " of %" PRIu64 " bytes; passive ended %" PRIu64
		" ms after the cancel: %s\n",
		a.bytes_done, len, ms, pa.err_msg);
	CHECK_STR_EQ(sc_op_status_name(a.status), "CANCELLED");
	CHECK_STR_EQ(sc_op_status_name(pa.status), "CANCELLED");
	CHECK(a.bytes_done < len);
	sc_op_info_free(&a);
	sc_op_info_free(&pa);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	/* A cancel is no connection failure: the next transfer works at once. */
	struct layout small = {.n = 1, .len = {MiB}, .off_a = {1}, .off_b = {2}};
	CHECK_INT_EQ(begin(&p, SC_OP_WRITE, &small, ra, rb, 60000, 60000, &pinfo, &ainfo), 0);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 30000, &a), 0);
	if (a.status != SC_OPS_COMPLETE)
		fprintf(stderr, "  after cancel: %s\n", a.err_msg);
	CHECK_STR_EQ(sc_op_status_name(a.status), "COMPLETE");
	CHECK(same_bytes(p.a.eng, ra, 1, p.b.eng, rb, 2, MiB));
	sc_op_info_free(&a);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	drop_region(&p.a, ra);
	drop_region(&p.b, rb);
	pair_down(&p);
}

TEST(deadline_ends_both_sides)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	const uint64_t len = 48 * MiB;
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, len, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, len, rb), 0);
	struct layout l = {.n = 1, .len = {len}};
	struct sc_op_info pinfo, ainfo, a, pa;
	CHECK_INT_EQ(begin(&p, SC_OP_WRITE, &l, ra, rb, 60000, 400, &pinfo, &ainfo), 0);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 30000, &a), 0);
	CHECK_INT_EQ(wait_op(p.a.eng, pinfo.id, 30000, &pa), 0);
	fprintf(stderr, "  active: %s: %s\n  passive: %s: %s\n", sc_status_name(a.err_code),
		a.err_msg, sc_status_name(pa.err_code), pa.err_msg);
	CHECK_STR_EQ(sc_op_status_name(a.status), "ERRORED");
	CHECK_STR_EQ(sc_status_name(a.err_code), "DEADLINE_EXCEEDED");
	CHECK_STR_EQ(sc_op_status_name(pa.status), "ERRORED");
	CHECK_STR_EQ(sc_status_name(pa.err_code), "DEADLINE_EXCEEDED");
	sc_op_info_free(&a);
	sc_op_info_free(&pa);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	drop_region(&p.a, ra);
	drop_region(&p.b, rb);
	pair_down(&p);
}

/* The rkey and address a passive operation's metadata hands out (descriptor 0). */
static int remote_of(struct pair *p, const char *metadata, uint64_t *addr, uint32_t *rkey)
{
	struct sc_keyring *ring = sc_engine_keyring(p->b.eng);
	struct sc_metadata md;
	struct sc_err err;
	int rc = sc_metadata_verify(ring, metadata, "sidecar-b", sc_now_unix_ms(), &md, &err);
	sc_keyring_release(ring);
	if (rc != 0) {
		fprintf(stderr, "verify: %s\n", err.msg);
		return -1;
	}
	*addr = md.descs[0].remote_addr;
	*rkey = md.descs[0].rkey;
	rc = md.ib.present ? 0 : -1;
	sc_metadata_free(&md);
	return rc;
}

static int probe(struct pair *p, uint64_t addr, uint32_t rkey, int *status)
{
	char text[64] = "";
	struct sc_err err;
	sc_err_clear(&err);
	int rc = sc_ib_test_probe_read(sc_engine_backend(p->b.eng, SC_BACKEND_IBVERBS), "sidecar-a", endpoint_of(&p->a), addr, rkey, 4096,
				       status, text, sizeof(text), &err);
	if (rc != 0)
		fprintf(stderr, "  probe: %s\n", err.msg);
	else
		fprintf(stderr, "  probe READ rkey 0x%x: %s\n", rkey, text);
	return rc;
}

/* Old rkeys are refused after completion, cancel, release, forced deregistration of the region
 * and deadline; within a live operation the
 * grant covers the operation's span in the region (gaps between its descriptors included) and
 * nothing beyond it. Run with memory windows (where the device has them) and with the
 * MR-per-span fallback. */
static void revocation_checks(const char *want)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	char detail[512] = "";
	struct sc_info info;
	sc_engine_info(p.a.eng, &info);
	for (size_t i = 0; i < info.n_backends; i++)
		if (info.backends[i].backend == SC_BACKEND_IBVERBS)
			snprintf(detail, sizeof(detail), "%s", info.backends[i].detail);
	if (want && !strstr(detail, want) && strstr(detail, "no type-1 memory windows")) {
		fprintf(stderr, "  this device has no memory windows (%s): nothing to check\n", detail);
		pair_down(&p);
		return;
	}
	if (want)
		CHECK_STR_CONTAINS(detail, want);
	bool check_outside = !strstr(detail, "NOT bounded");
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, 64 * 1024, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, 64 * 1024, rb), 0);
	struct layout l = {.n = 1, .len = {8192}, .off_a = {4096}, .off_b = {0}};
	struct sc_op_info pinfo, ainfo, a, pa;
	uint64_t addr;
	uint32_t rkey;
	int st = -1;

	/* While live, the rkey works (the probe is sound). */
	CHECK_INT_EQ(begin(&p, SC_OP_READ, &l, ra, rb, 60000, 60000, &pinfo, &ainfo), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 30000, &a), 0);
	CHECK_INT_EQ(wait_op(p.a.eng, pinfo.id, 10000, &pa), 0);
	CHECK_STR_EQ(sc_op_status_name(pa.status), "COMPLETE");
	sc_op_info_free(&a);
	sc_op_info_free(&pa);
	sc_op_info_free(&ainfo);
	sc_op_info_free(&pinfo);
	/* Completed: the old rkey is refused. */
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);

	/* A live readable that nobody used yet: readable by its rkey... */
	struct sc_desc d = {.offset = 100, .length = 8192};
	snprintf(d.region_id, SC_ID_MAX, "%s", ra);
	struct sc_passive_req preq = {.descs = &d, .n_descs = 1, .timeout_ms = 60000};
	struct sc_err err;
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo, &err), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_SUCCESS);
	/* ...and no longer once cancelled. */
	struct sc_op_info c;
	CHECK_INT_EQ(sc_op_cancel(p.a.eng, pinfo.id, &c, &err), 0);
	sc_op_info_free(&c);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);
	sc_op_info_free(&pinfo);


	/* A readable whose deadline passed: refused once it expired. (Its rkey was live like the
	 * one above; probing it live too would race the short deadline.) */
	preq.timeout_ms = 300;
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo, &err), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	CHECK_INT_EQ(wait_op(p.a.eng, pinfo.id, 30000, &pa), 0);
	CHECK_STR_EQ(sc_op_status_name(pa.status), "ERRORED");
	CHECK_INT_EQ(pa.err_code, SC_DEADLINE_EXCEEDED);
	sc_op_info_free(&pa);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);
	sc_op_info_free(&pinfo);

	/* Two descriptors [100, 200) and [8192, 12288) of one region: one grant over [100, 12288).
	 * A probe (4 KiB) in the gap between them is served; one just past the span is refused. */
	struct sc_desc two[2] = {{.offset = 100, .length = 100}, {.offset = 8192, .length = 4096}};
	snprintf(two[0].region_id, SC_ID_MAX, "%s", ra);
	snprintf(two[1].region_id, SC_ID_MAX, "%s", ra);
	struct sc_passive_req preq2 = {.descs = two, .n_descs = 2, .timeout_ms = 60000};
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq2, &pinfo, &err), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	uint64_t base = addr - 100;
	CHECK_INT_EQ(probe(&p, base + 4096, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_SUCCESS);
	if (check_outside) {
		CHECK_INT_EQ(probe(&p, base + 12288, rkey, &st), 0);
		CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);
	}
	CHECK_INT_EQ(sc_op_cancel(p.a.eng, pinfo.id, &c, &err), 0);
	sc_op_info_free(&c);
	sc_op_info_free(&pinfo);

	/* The probes' QPs were their own: the cached one still works. */
	check_transfer(&p, SC_OP_READ, &odd);

	/* After the transfer check: each probe leaves an incoming QP on the passive side, and
	 * enough of them evict the cached pair's (a cap of its own, issue 25). */
	/* Released (ReleaseOperation without a cancel first): refused. */
	preq.timeout_ms = 60000;
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo, &err), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_SUCCESS);
	CHECK_INT_EQ(sc_op_release(p.a.eng, pinfo.id, &err), 0);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);
	sc_op_info_free(&pinfo);

	/* Its region deregistered with force: refused. */
	char rc_id[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, 64 * 1024, rc_id), 0);
	struct sc_desc dc = {.offset = 100, .length = 8192};
	snprintf(dc.region_id, SC_ID_MAX, "%s", rc_id);
	struct sc_passive_req preqc = {.descs = &dc, .n_descs = 1, .timeout_ms = 60000};
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preqc, &pinfo, &err), 0);
	CHECK_INT_EQ(remote_of(&p, pinfo.metadata, &addr, &rkey), 0);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_SUCCESS);
	CHECK_INT_EQ(sc_region_deregister(p.a.eng, rc_id, true, &err), 0);
	CHECK_INT_EQ(probe(&p, addr, rkey, &st), 0);
	CHECK_INT_EQ(st, IBV_WC_REM_ACCESS_ERR);
	sc_op_info_free(&pinfo);
	drop_region(&p.a, ra);
	drop_region(&p.b, rb);
	pair_down(&p);
}

/* What the device chose (windows, or an MR per span where it has none or does not bound them:
 * rxe on Linux 6.1), whatever it is, holds all of the above. */
TEST(revoked_rkey_after_complete_and_cancel)
{
	revocation_checks(NULL);
}

/* Windows forced on (SC_TEST_IB_MW_UNBOUNDED: also where the device does not bound them, so
 * that the window path runs on rxe): revocation after completion, cancel and deadline. The
 * span's upper bound is checked only where the device enforces it. */
TEST(revoked_rkey_with_windows)
{
	setenv("SC_TEST_IB_MW_UNBOUNDED", "1", 1);
	revocation_checks("type-1 memory windows");
	unsetenv("SC_TEST_IB_MW_UNBOUNDED");
}

/* Without memory windows: one MR per (operation, region) span. */
TEST(revoked_rkey_without_windows)
{
	setenv("SC_TEST_IB_NO_MW", "1", 1);
	revocation_checks("one MR per operation and region");
	unsetenv("SC_TEST_IB_NO_MW");
}

/* A peer that vanished: the connection fails, the peer is tombstoned, and the next transfer to it
 * fails at once with the reason instead of waiting. */
TEST(unreachable_peer_is_tombstoned)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	char ra[SC_ID_MAX], rb[SC_ID_MAX];
	CHECK_INT_EQ(make_region(&p.a, 64 * 1024, ra), 0);
	CHECK_INT_EQ(make_region(&p.b, 64 * 1024, rb), 0);
	struct layout l = {.n = 1, .len = {4096}, .off_a = {0}, .off_b = {0}};
	struct sc_op_info pinfo[2], ainfo, a;
	struct sc_desc da[1], db[1];
	descs_of(&l, ra, rb, da, db);
	struct sc_passive_req preq = {.descs = da, .n_descs = 1, .timeout_ms = 60000};
	struct sc_err err;
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo[0], &err), 0);
	CHECK_INT_EQ(sc_op_create_passive(p.a.eng, SC_OP_READABLE, &preq, &pinfo[1], &err), 0);
	side_down(&p.a);
	for (int i = 0; i < 2; i++) {
		struct sc_active_req areq = {
		    .metadata = pinfo[i].metadata, .descs = db, .n_descs = 1, .timeout_ms = 20000};
		uint64_t t0 = sc_clock_mono_ms();
		CHECK_INT_EQ(sc_op_begin(p.b.eng, SC_OP_READ, &areq, &ainfo, &err), 0);
		CHECK_INT_EQ(wait_op(p.b.eng, ainfo.id, 30000, &a), 0);
		uint64_t ms = sc_clock_mono_ms() - t0;
		fprintf(stderr, "  attempt %d after %" PRIu64 " ms: %s: %s\n", i, ms,
			sc_status_name(a.err_code), a.err_msg);
		CHECK_STR_EQ(sc_op_status_name(a.status), "ERRORED");
		CHECK_STR_EQ(sc_status_name(a.err_code), "UNAVAILABLE");
		CHECK_STR_CONTAINS(a.err_msg, "ibverbs connection to peer sidecar-a");
		if (i == 1) {
			CHECK_STR_CONTAINS(a.err_msg, "ms ago");
			CHECK(ms < 1000);
		}
		sc_op_info_free(&a);
		sc_op_info_free(&ainfo);
	}
	sc_op_info_free(&pinfo[0]);
	sc_op_info_free(&pinfo[1]);
	drop_region(&p.b, rb);
	side_down(&p.b);
}

/* The peer sidecar restarts (same id, its QPs gone) while this side's cached QP to it sits idle:
 * the next transfer finds out (VERIFY) and connects a new QP instead of sending RDMA into a QP
 * number that no longer exists (which Soft-RoCE never times out). */
TEST(restarted_peer_gets_a_new_qp)
{
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	struct layout l = {.n = 1, .len = {MiB + 3}, .off_a = {1}, .off_b = {5}};
	check_transfer(&p, SC_OP_READ, &l);
	side_down(&p.a);
	CHECK_INT_EQ(side_up(&p.a, "sidecar-a"), 0);
	usleep(5500 * 1000); /* IB_VERIFY_IDLE_MS */
	check_transfer(&p, SC_OP_READ, &l);
	check_transfer(&p, SC_OP_WRITE, &l);
	size_t out_b, in_b;
	sc_ib_test_qp_counts(sc_engine_backend(p.b.eng, SC_BACKEND_IBVERBS), &out_b, &in_b);
	CHECK_U64_EQ(out_b, 1);
	pair_down(&p);
}

/* The child: a passive sidecar that exposes `len` bytes for reading, hands the metadata to the
 * parent over fd, and waits to be killed. Never returns. */
static void serve_until_killed(int fd, uint64_t len)
{
	struct side a;
	char ra[SC_ID_MAX];
	if (side_up(&a, "sidecar-killed") != 0 || make_region(&a, len, ra) != 0)
		_exit(2);
	struct sc_desc d = {.offset = 0, .length = len};
	snprintf(d.region_id, SC_ID_MAX, "%s", ra);
	struct sc_passive_req preq = {.descs = &d, .n_descs = 1, .timeout_ms = 120000};
	struct sc_op_info pinfo;
	struct sc_err err;
	if (sc_op_create_passive(a.eng, SC_OP_READABLE, &preq, &pinfo, &err) != 0)
		_exit(3);
	size_t n = strlen(pinfo.metadata) + 1;
	if (write(fd, pinfo.metadata, n) != (ssize_t)n)
		_exit(4);
	close(fd);
	for (;;)
		pause();
}

/* The passive sidecar process dies (SIGKILL) mid-READ: the active side errors UNAVAILABLE within
 * seconds (its control connection closes), not at its deadline, and its memory is safe. */
TEST(passive_sidecar_killed_mid_read)
{
	const uint64_t len = 48 * MiB;
	CHECK_INT_EQ(setup_dirs(), 0);
	int pfd[2];
	CHECK_INT_EQ(pipe(pfd), 0);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork(); /* before this process starts any engine thread */
	CHECK(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		serve_until_killed(pfd[1], len);
	}
	close(pfd[1]);
	char *md = calloc(1, SC_METADATA_MAX_TEXT + 1);
	size_t got = 0;
	ssize_t r;
	while (md && got < SC_METADATA_MAX_TEXT && (r = read(pfd[0], md + got, 4096)) > 0)
		got += (size_t)r;
	close(pfd[0]);
	struct side b;
	char rb[SC_ID_MAX];
	struct sc_op_info ainfo, a;
	struct sc_err err;
	bool up = md && got > 0 && side_up(&b, "sidecar-b") == 0;
	if (!up || make_region(&b, len, rb) != 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		free(md);
		if (up)
			side_down(&b);
		CHECK_FAIL_("no passive sidecar or no active side (metadata %zu bytes)", got);
	}
	struct sc_desc db = {.offset = 0, .length = len};
	snprintf(db.region_id, SC_ID_MAX, "%s", rb);
	struct sc_active_req areq = {
	    .metadata = md, .descs = &db, .n_descs = 1, .timeout_ms = 120000};
	int rc = sc_op_begin(b.eng, SC_OP_READ, &areq, &ainfo, &err);
	if (rc == 0)
		wait_progress(b.eng, ainfo.id, 2 * MiB, 30000);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	uint64_t t0 = sc_clock_mono_ms();
	if (rc == 0) {
		CHECK_INT_EQ(wait_op(b.eng, ainfo.id, 60000, &a), 0);
		uint64_t ms = sc_clock_mono_ms() - t0;
		fprintf(stderr,
			"  active ended %" PRIu64 " ms after the kill, %" PRIu64 " of %" PRIu64
			" bytes: %s: %s\n",
			ms, a.bytes_done, len, sc_status_name(a.err_code), a.err_msg);
		CHECK_STR_EQ(sc_op_status_name(a.status), "ERRORED");
		CHECK_STR_EQ(sc_status_name(a.err_code), "UNAVAILABLE");
		CHECK(ms < 10000);
		sc_op_info_free(&a);
		sc_op_info_free(&ainfo);
	} else {
		fprintf(stderr, "  begin: %s\n", err.msg);
		CHECK_INT_EQ(rc, 0);
	}
	free(md);
	drop_region(&b, rb);
	side_down(&b);
	/* The killed sidecar could not remove its region files. */
	char pattern[400];
	glob_t g;
	snprintf(pattern, sizeof(pattern), "%s/rdma-sidecar-sidecar-killed-*", g_shm);
	if (glob(pattern, 0, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc; i++)
			unlink(g.gl_pathv[i]);
		globfree(&g);
	}
}

/* SC_IB_BENCH="1M:20,16M:3": for each SIZE:COUNT, COUNT READs then COUNT WRITEs of SIZE bytes
 * (one descriptor), one after another, timed from BeginRead/BeginWrite to COMPLETE; prints the
 * throughput (10^6 bytes/s) over all of them and the best single transfer. */
static void bench_one(struct pair *p, enum sc_op_kind kind, uint64_t size, unsigned count,
		      const char *ra, const char *rb)
{
	struct layout l = {.n = 1, .len = {size}};
	uint64_t sum_us = 0, best_us = UINT64_MAX;
	for (unsigned i = 0; i < count; i++) {
		struct sc_op_info pinfo, ainfo, a, pa;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		CHECK_INT_EQ(begin(p, kind, &l, ra, rb, 120000, 120000, &pinfo, &ainfo), 0);
		CHECK_INT_EQ(wait_op(p->b.eng, ainfo.id, 120000, &a), 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		CHECK_INT_EQ(wait_op(p->a.eng, pinfo.id, 10000, &pa), 0);
		CHECK_STR_EQ(sc_op_status_name(a.status), "COMPLETE");
		CHECK_INT_EQ(a.backend, SC_BACKEND_IBVERBS);
		uint64_t us = (uint64_t)(((int64_t)t1.tv_sec - t0.tv_sec) * 1000000 +
					 ((int64_t)t1.tv_nsec - t0.tv_nsec) / 1000);
		sum_us += us;
		if (us < best_us)
			best_us = us;
		sc_op_info_free(&a);
		sc_op_info_free(&pa);
		sc_op_info_free(&ainfo);
		sc_op_info_free(&pinfo);
	}
	CHECK(same_bytes(p->a.eng, ra, 0, p->b.eng, rb, 0, size));
	printf("bench ibverbs %-5s size %10" PRIu64 " x%-3u avg %8.2f MB/s  best %8.2f MB/s  "
	       "(%.1f ms per transfer)\n",
	       kind == SC_OP_READ ? "READ" : "WRITE", size, count,
	       (double)size * count / (double)sum_us, (double)size / (double)best_us,
	       (double)sum_us / count / 1000.0);
	fflush(stdout);
}

TEST(bench)
{
	const char *spec = getenv("SC_IB_BENCH");
	if (!spec || !spec[0])
		return;
	struct pair p;
	CHECK_INT_EQ(pair_up(&p), 0);
	char *copy = strdup(spec), *save = NULL;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		uint64_t size = strtoull(tok, &end, 10);
		if (*end == 'K' || *end == 'k')
			size <<= 10, end++;
		else if (*end == 'M' || *end == 'm')
			size <<= 20, end++;
		unsigned count = *end == ':' ? (unsigned)strtoul(end + 1, NULL, 10) : 5;
		if (!size || !count)
			continue;
		char ra[SC_ID_MAX], rb[SC_ID_MAX];
		CHECK_INT_EQ(make_region(&p.a, size, ra), 0);
		CHECK_INT_EQ(make_region(&p.b, size, rb), 0);
		bench_one(&p, SC_OP_READ, size, count, ra, rb);
		bench_one(&p, SC_OP_WRITE, size, count, ra, rb);
		drop_region(&p.a, ra);
		drop_region(&p.b, rb);
	}
	free(copy);
	pair_down(&p);
}

static int has_rdma_device(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (list)
		ibv_free_device_list(list);
	return list && n > 0;
}

/* RUN_TESTS defines main(); rename it, so the real main can skip first. */
int ib_tests_main(void);
#define main ib_tests_main
RUN_TESTS(T(read_odd_descriptors), T(write_odd_descriptors), T(concurrent_transfers_share_the_qp),
	  T(cancel_mid_transfer), T(deadline_ends_both_sides),
	  T(revoked_rkey_after_complete_and_cancel), T(revoked_rkey_with_windows),
	  T(revoked_rkey_without_windows),
	  T(unreachable_peer_is_tombstoned),
	  T(restarted_peer_gets_a_new_qp), T(passive_sidecar_killed_mid_read), T(bench))
#undef main

int main(void)
{
	if (!has_rdma_device()) {
		fprintf(stderr,
			"no RDMA device (run it in the Soft-RoCE VM: tests/vm/run-in-vm.sh): "
			"skipping\n");
		return 77;
	}
	if (getenv("RXE_DEV") && getenv("RXE_DEV")[0])
		g_dev = getenv("RXE_DEV");
	if (getenv("RXE_IP") && getenv("RXE_IP")[0])
		g_ip = getenv("RXE_IP");
	if (getenv("SC_IB_BENCH") && getenv("SC_IB_BENCH")[0]) {
		test_bench(); /* the benchmark alone */
		return check_failed_;
	}
	return ib_tests_main();
}

#endif
