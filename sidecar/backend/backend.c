/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/backend.c: the "not supported" and no-op stubs that backends point missing ops at, so
 * callers never test an op for NULL, and the rails' state (one lock for the rails of every backend:
 * a state changes rarely and GetInfo reads it rarely). Any thread.
 */
#include "backend/backend.h"
#include "build_config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sc_backend_start_unsupported(struct sc_backend *b, struct sc_err *err)
{
	return sc_err_set(err, SC_UNIMPLEMENTED, "backend %s cannot start", b->ops->name);
}

void sc_backend_noop(struct sc_backend *b)
{
	(void)b;
}

int sc_backend_register_unsupported(struct sc_backend *b, void *addr, uint64_t len, int gpu,
				    void **handle, struct sc_err *err)
{
	*handle = NULL;
	return 0;
}

void sc_backend_deregister_noop(struct sc_backend *b, void *handle)
{
}

int sc_backend_expose_noop(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
			   const int *gpus, void *const *region_handles, void **handle,
			   struct sc_err *err)
{
	*handle = NULL;
	return 0;
}

void sc_backend_revoke_noop(struct sc_backend *b, void *handle)
{
}

int sc_backend_submit_unsupported(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	return sc_err_set(err, SC_UNIMPLEMENTED, "backend %s cannot move bytes", b->ops->name);
}

void sc_backend_cancel_noop(struct sc_backend *b, struct sc_xfer *x)
{
}

int sc_backend_connect_unsupported(struct sc_backend *b, const struct sc_metadata *md,
				   uint64_t deadline_mono_ms, char *detail, size_t cap,
				   struct sc_err *err)
{
	snprintf(detail, cap, "nothing to set up");
	return 0;
}

void sc_backend_advertise_noop(struct sc_backend *b, struct sc_metadata *md)
{
}

/* ---- rails ----------------------------------------------------------------------------------- */

static pthread_mutex_t rails_mu = PTHREAD_MUTEX_INITIALIZER;

void sc_rail_set_state(struct sc_backend *b, size_t i, enum sc_rail_state st, const char *fmt, ...)
{
	if (i >= b->n_rails)
		return;
	struct sc_rail *r = &b->rails[i];
	pthread_mutex_lock(&rails_mu);
	r->state = st;
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->detail, sizeof(r->detail), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&rails_mu);
}

void sc_rail_snapshot(struct sc_backend *b, size_t i, struct sc_rail_report *out)
{
	memset(out, 0, sizeof(*out));
	if (i >= b->n_rails)
		return;
	const struct sc_rail *r = &b->rails[i];
	memcpy(out->name, r->name, sizeof(out->name));
	memcpy(out->pci, r->pci, sizeof(out->pci));
	memcpy(out->netdev, r->netdev, sizeof(out->netdev));
	out->numa = r->numa;
	out->rate_mbps = r->rate_mbps;
	pthread_mutex_lock(&rails_mu);
	out->state = r->state;
	memcpy(out->detail, r->detail, sizeof(out->detail));
	pthread_mutex_unlock(&rails_mu);
	out->bytes = atomic_load_explicit(&r->bytes, memory_order_relaxed);
	out->operations = atomic_load_explicit(&r->operations, memory_order_relaxed);
	out->errors = atomic_load_explicit(&r->errors, memory_order_relaxed);
	out->failovers = atomic_load_explicit(&r->failovers, memory_order_relaxed);
}

static bool in_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

bool sc_rail_choice(const struct sc_backend *b, int gpu, const char *test_env, bool *allow)
{
	const struct sc_backend_env *env = &b->env;
	if (gpu != SC_GPU_HOST)
		return env->rail_choice && env->rail_choice(env->rail_choice_ctx, b, gpu, allow);
	const char *test = test_env ? getenv(test_env) : NULL;
	if (!test || !*test)
		return false;
	bool any = false;
	for (size_t i = 0; i < b->n_rails && i < SC_MAX_RAILS; i++)
		any |= allow[i] = in_list(test, b->rails[i].name);
	return any;
}

#if !SC_HAVE_IBVERBS
static void noverbs_destroy(struct sc_backend *b)
{
	free(b);
}

static const struct sc_backend_ops noverbs_ops = {
	.kind = SC_BACKEND_IBVERBS, /* name and level: engine/backend_registry.c */
	.start = sc_backend_start_unsupported,
	.stop = sc_backend_noop,
	.destroy = noverbs_destroy,
	.register_region = sc_backend_register_unsupported,
	.deregister_region = sc_backend_deregister_noop,
	.expose = sc_backend_expose_noop,
	.revoke = sc_backend_revoke_noop,
	.submit = sc_backend_submit_unsupported,
	.cancel = sc_backend_cancel_noop,
	.advertise = sc_backend_advertise_noop,
};

/* Built without libibverbs: the backend exists only to say so. */
struct sc_backend *sc_backend_ibverbs_create(const struct sc_backend_env *env)
{
	struct sc_backend *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->ops = &noverbs_ops;
	b->env = *env;
	snprintf(b->detail, sizeof(b->detail), "built without libibverbs (install libibverbs-dev "
					       "and rebuild)");
	return b;
}
#endif
