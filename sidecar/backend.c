/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend.c: the "not supported" and no-op stubs that backends point missing ops at, so callers
 * never test an op for NULL. Pure; any thread.
 */
#include "backend.h"
#include "build_config.h"

#include <stdio.h>
#include <stdlib.h>

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

#if !SC_HAVE_IBVERBS
static void noverbs_destroy(struct sc_backend *b)
{
	free(b);
}

static const struct sc_backend_ops noverbs_ops = {
	.kind = SC_BACKEND_IBVERBS, /* name and level: backend_registry.c */
	.start = sc_backend_start_unsupported,
	.stop = sc_backend_noop,
	.destroy = noverbs_destroy,
	.register_region = sc_backend_register_unsupported,
	.deregister_region = sc_backend_deregister_noop,
	.expose = sc_backend_expose_noop,
	.revoke = sc_backend_revoke_noop,
	.submit = sc_backend_submit_unsupported,
	.cancel = sc_backend_cancel_noop,
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
