/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_backend_registry.c: the backend registry (engine/backend_registry.h). Adding a backend is one file
 * plus one registry line: this file is that file for a test-only backend ("shm", shared memory
 * between sidecars on one host), registered with sc_backend_registry_add instead of a line in the
 * table. Checks the names, the partial ops table completed over the stubs, the choice by transport
 * level, and an engine that creates, reports, starts and destroys the test backend like the real
 * ones.
 */
#include "engine/backend_registry.h"
#include "conf/config.h"
#include "engine/engine.h"
#include "engine/test.h"
#include "ib/test.h" /* sc_engine_backend */
#include "meta/metadata.h"

#include "check.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_KIND ((enum sc_backend_kind)5)

/* ---- the test-only backend: a partial ops table and a constructor -----------------------------
 */

struct shm_backend {
	struct sc_backend base;
};

static atomic_int shm_started, shm_stopped, shm_destroyed;

static int shm_start(struct sc_backend *b, struct sc_err *err)
{
	(void)b;
	(void)err;
	atomic_fetch_add(&shm_started, 1);
	return 0;
}

static void shm_stop(struct sc_backend *b)
{
	(void)b;
	atomic_fetch_add(&shm_stopped, 1);
}

static void shm_destroy(struct sc_backend *b)
{
	atomic_fetch_add(&shm_destroyed, 1);
	free(container_of(b, struct shm_backend, base));
}

/* Leaves out name, level and every op it does not need: the registry fills them. */
static const struct sc_backend_ops shm_ops = {
    .kind = SHM_KIND,
    .start = shm_start,
    .stop = shm_stop,
    .destroy = shm_destroy,
};

static struct sc_backend *shm_create(const struct sc_backend_env *env)
{
	struct shm_backend *sb = calloc(1, sizeof(*sb));
	if (!sb)
		return NULL;
	sb->base.ops = &shm_ops;
	sb->base.env = *env;
	sb->base.available = true;
	snprintf(sb->base.detail, sizeof(sb->base.detail), "test-only shared memory backend");
	return &sb->base;
}

static bool shm_can_reach(const struct sc_metadata *md, bool same_sidecar)
{
	return !same_sidecar && (md->backends & SC_BACKEND_BIT(SHM_KIND));
}

/* The one registry line. */
static const struct sc_backend_class shm_class = {.name = "shm",
						  .kind = SHM_KIND,
						  .transport_level = 4,
						  .create = shm_create,
						  .can_reach = shm_can_reach,
						  .chosen_because = "both sidecars share a host"};

/* ---- tests ----------------------------------------------------------------------------------- */

TEST(registers_once_and_refuses_bad_rows)
{
	CHECK_INT_EQ(sc_backend_registry_count(), 4);
	CHECK_INT_EQ(sc_backend_registry_add(&shm_class), 0);
	CHECK_INT_EQ(sc_backend_registry_count(), 5);
	CHECK_INT_EQ(sc_backend_registry_add(&shm_class), -1); /* kind taken */
	struct sc_backend_class bad = shm_class;
	bad.kind = (enum sc_backend_kind)SC_BACKEND_KIND_MAX;
	CHECK_INT_EQ(sc_backend_registry_add(&bad), -1);
	bad.kind = SC_BACKEND_NONE;
	CHECK_INT_EQ(sc_backend_registry_add(&bad), -1);
	CHECK_INT_EQ(sc_backend_registry_count(), 5);
}

TEST(names_come_from_the_table)
{
	CHECK_STR_EQ(sc_backend_name(SC_BACKEND_TCP), "tcp");
	CHECK_STR_EQ(sc_backend_name(SC_BACKEND_IBVERBS), "ibverbs");
	CHECK_STR_EQ(sc_backend_name(SC_BACKEND_LOCAL), "local");
	CHECK_STR_EQ(sc_backend_name(SHM_KIND), "shm");
	CHECK_STR_EQ(sc_backend_name(SC_BACKEND_NONE), "none");
	CHECK_STR_EQ(sc_backend_name(SC_BACKEND_LIBFABRIC), "libfabric");
	CHECK_STR_EQ(sc_backend_name((enum sc_backend_kind)SC_BACKEND_KIND_MAX), "none");
	/* GetInfo and metrics order */
	CHECK_INT_EQ(sc_backend_registry_at(0)->kind, SC_BACKEND_TCP);
	CHECK_INT_EQ(sc_backend_registry_at(1)->kind, SC_BACKEND_IBVERBS);
	CHECK_INT_EQ(sc_backend_registry_at(2)->kind, SC_BACKEND_LIBFABRIC);
	CHECK_INT_EQ(sc_backend_registry_at(3)->kind, SC_BACKEND_LOCAL);
	CHECK_INT_EQ(sc_backend_registry_at(4)->kind, SHM_KIND);
	CHECK(sc_backend_registry_at(5) == NULL);
	CHECK(sc_backend_registry_find(SHM_KIND) == sc_backend_registry_at(4));
}

TEST(config_names_match_the_registry)
{
	/* conf/config.c sits below the backends and keeps its own list of --backends names: it must
	 * agree with the table, name for name and bit for bit. */
	for (size_t i = 0; i < 3; i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		char *argv[] = {"rdma-sidecar", "--backends", (char *)c->name, NULL};
		char *envp[] = {NULL};
		struct sc_config cfg;
		struct sc_err err;
		sc_err_clear(&err);
		CHECK_INT_EQ(sc_config_parse(&cfg, 3, argv, envp, &err), SC_CONFIG_OK);
		CHECK_INT_EQ(cfg.backends, SC_BACKEND_BIT(c->kind));
		sc_config_free(&cfg);
	}
}

TEST(partial_ops_are_completed_with_stubs)
{
	struct sc_backend_env env = {0};
	struct sc_backend *b = sc_backend_registry_create(&shm_class, &env);
	CHECK(b != NULL);
	CHECK(b->ops == &b->own_ops);
	CHECK_STR_EQ(b->ops->name, "shm");
	CHECK_INT_EQ(b->ops->transport_level, 4);
	CHECK(b->ops->start == shm_start);
	CHECK(b->ops->submit == sc_backend_submit_unsupported);
	CHECK(b->ops->register_region == sc_backend_register_unsupported);
	CHECK(b->ops->expose == sc_backend_expose_noop);
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_xfer x;
	memset(&x, 0, sizeof(x));
	CHECK_INT_EQ(sc_backend_submit(b, &x, &err), -1);
	CHECK_INT_EQ(err.code, SC_UNIMPLEMENTED);
	CHECK_STR_EQ(err.msg, "backend shm cannot move bytes");
	void *handle = (void *)1;
	CHECK_INT_EQ(b->ops->register_region(b, NULL, 0, SC_GPU_HOST, &handle, &err), 0);
	CHECK(handle == NULL);
	sc_backend_cancel(b, &x); /* a no-op, never NULL */
	b->ops->revoke(b, NULL);
	b->ops->deregister_region(b, NULL);
	int destroyed = atomic_load(&shm_destroyed);
	sc_backend_destroy(b);
	CHECK_INT_EQ(atomic_load(&shm_destroyed), destroyed + 1);
}

/* A backend of kind k, available or not, in an array indexed by kind. */
static struct sc_backend fake[SC_BACKEND_KIND_MAX];

static struct sc_backend *const *backends(bool tcp, bool ib, bool local, bool shm)
{
	static struct sc_backend *arr[SC_BACKEND_KIND_MAX];
	bool on[SC_BACKEND_KIND_MAX] = {false, tcp, ib, local, false, shm};
	for (int k = 1; k < SC_BACKEND_KIND_MAX; k++) {
		fake[k].available = on[k];
		arr[k] = k <= 5 ? &fake[k] : NULL;
	}
	return arr;
}

TEST(choice_is_the_fastest_that_reaches)
{
	struct sc_metadata md;
	memset(&md, 0, sizeof(md));
	md.backends = SC_BACKEND_BIT_TCP | SC_BACKEND_BIT_IBVERBS | SC_BACKEND_BIT(SHM_KIND);
	md.n_endpoints = 1;
	md.ib.present = true;
	const struct sc_backend_class *c;
	c = sc_backend_registry_choose(backends(true, true, true, true), &md, false);
	CHECK(c && c->kind == SHM_KIND); /* level 4 beats ibverbs 2 and tcp 1 */
	c = sc_backend_registry_choose(backends(true, true, true, false), &md, false);
	CHECK(c && c->kind == SC_BACKEND_IBVERBS);
	c = sc_backend_registry_choose(backends(true, false, true, false), &md, false);
	CHECK(c && c->kind == SC_BACKEND_TCP);
	c = sc_backend_registry_choose(backends(true, true, true, true), &md, true);
	CHECK(c && c->kind == SC_BACKEND_LOCAL); /* only local reaches this same sidecar */
	CHECK(sc_backend_registry_choose(backends(true, true, false, true), &md, true) == NULL);
	md.ib.present = false; /* the issuer offers ibverbs without an endpoint: tcp */
	md.backends &= ~SC_BACKEND_BIT(SHM_KIND);
	c = sc_backend_registry_choose(backends(true, true, true, true), &md, false);
	CHECK(c && c->kind == SC_BACKEND_TCP);
	md.n_endpoints = 0;
	CHECK(sc_backend_registry_choose(backends(true, true, true, true), &md, false) == NULL);
}

TEST(engine_creates_reports_and_destroys_the_test_backend)
{
	const char *base = getenv("SC_TEST_TMP");
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/registry-XXXXXX", base && base[0] ? base : "/tmp");
	if (base && base[0])
		(void)mkdir(base, 0700);
	CHECK(mkdtemp(dir) != NULL);
	char *argv[] = {
	    "rdma-sidecar",	"--id", "reg-a", "--shm-dir", dir, "--data-listen", "127.0.0.1:0",
	    "--metrics-listen", "",	NULL};
	char *envp[] = {NULL};
	struct sc_config cfg;
	struct sc_err err;
	sc_err_clear(&err);
	CHECK_INT_EQ(sc_config_parse(&cfg, 9, argv, envp, &err), SC_CONFIG_OK);
	struct sc_engine *eng = NULL;
	int started = atomic_load(&shm_started), stopped = atomic_load(&shm_stopped);
	int destroyed = atomic_load(&shm_destroyed);
	if (sc_engine_create(&cfg, &eng, &err) != 0 || sc_engine_start(eng, &err) != 0) {
		sc_engine_destroy(eng);
		sc_config_free(&cfg);
		CHECK_FAIL_("engine: %s", err.msg);
	}
	struct sc_backend *b = sc_engine_backend(eng, SHM_KIND);
	CHECK(b != NULL);
	CHECK_STR_EQ(b->ops->name, "shm");
	CHECK_INT_EQ(atomic_load(&shm_started), started + 1);
	struct sc_info *info = calloc(1, sizeof(*info));
	sc_engine_info(eng, info);
	CHECK_INT_EQ(info->n_backends, 5);
	CHECK_INT_EQ(info->backends[0].backend, SC_BACKEND_TCP);
	CHECK_INT_EQ(info->backends[4].backend, SHM_KIND);
	CHECK(info->backends[4].available);
	CHECK_STR_EQ(info->backends[4].detail, "test-only shared memory backend");
	free(info);
	sc_engine_destroy(eng);
	sc_config_free(&cfg);
	CHECK_INT_EQ(atomic_load(&shm_stopped), stopped + 1);
	CHECK_INT_EQ(atomic_load(&shm_destroyed), destroyed + 1);
	rmdir(dir);
}

RUN_TESTS(T(registers_once_and_refuses_bad_rows), T(names_come_from_the_table),
	  T(config_names_match_the_registry), T(partial_ops_are_completed_with_stubs),
	  T(choice_is_the_fastest_that_reaches),
	  T(engine_creates_reports_and_destroys_the_test_backend))
