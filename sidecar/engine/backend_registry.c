/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/backend_registry.c: the table of data-plane backends (engine/backend_registry.h): one row
 * per backend, the completion of partial ops tables over the stubs of backend/backend.c, and the
 * data-driven choice of a backend for an active operation. Pure and read-only once an engine exists; any thread.
 */
#include "engine/backend_registry.h"
#include "conf/config.h"

#include <string.h>

/* ---- whether a backend can reach the metadata's issuer ----------------------------------------
 */

static bool local_can_reach(const struct sc_metadata *md, bool same_sidecar)
{
	(void)md;
	return same_sidecar;
}

static bool tcp_can_reach(const struct sc_metadata *md, bool same_sidecar)
{
	return !same_sidecar && (md->backends & SC_BACKEND_BIT_TCP) && md->n_endpoints > 0;
}

static bool ibverbs_can_reach(const struct sc_metadata *md, bool same_sidecar)
{
	return !same_sidecar && (md->backends & SC_BACKEND_BIT_IBVERBS) && md->ib.present;
}

static bool libfabric_can_reach(const struct sc_metadata *md, bool same_sidecar)
{
	return !same_sidecar && (md->backends & SC_BACKEND_BIT_LIBFABRIC) && md->ofi.present &&
	       md->n_endpoints > 0;
}

/* ---- the table: one row per backend, in GetInfo and metrics order ---------------------------- */

static struct sc_backend_class registry[SC_BACKEND_KIND_MAX - 1] = {
    {.name = "tcp",
     .kind = SC_BACKEND_TCP,
     .transport_level = 1,
     .peer_channel = true,
     .must_start = true,
     .create = sc_backend_tcp_create,
     .can_reach = tcp_can_reach,
     .chosen_because = "the only backend both sidecars offer"},
    {.name = "ibverbs",
     .kind = SC_BACKEND_IBVERBS,
     .transport_level = 2,
     .peer_channel = true,
     .create = sc_backend_ibverbs_create,
     .can_reach = ibverbs_can_reach,
     .chosen_because = "both sidecars offer ibverbs"},
    {.name = "libfabric",
     .kind = SC_BACKEND_LIBFABRIC,
     .transport_level = 2,
     .peer_channel = true,
     .create = sc_backend_libfabric_create,
     .can_reach = libfabric_can_reach,
     .chosen_because = "both sidecars offer libfabric"},
    {.name = "local",
     .kind = SC_BACKEND_LOCAL,
     .transport_level = 3,
     .create = sc_backend_local_create,
     .can_reach = local_can_reach,
     .chosen_because = "both ends on this sidecar"},
};
static size_t n_registry = 4;

size_t sc_backend_registry_count(void)
{
	return n_registry;
}

const struct sc_backend_class *sc_backend_registry_at(size_t i)
{
	return i < n_registry ? &registry[i] : NULL;
}

const struct sc_backend_class *sc_backend_registry_find(enum sc_backend_kind kind)
{
	for (size_t i = 0; i < n_registry; i++)
		if (registry[i].kind == kind)
			return &registry[i];
	return NULL;
}

const char *sc_backend_name(enum sc_backend_kind kind)
{
	const struct sc_backend_class *c = sc_backend_registry_find(kind);
	return c ? c->name : "none";
}

int sc_backend_registry_add(const struct sc_backend_class *c)
{
	if ((int)c->kind <= SC_BACKEND_NONE || (int)c->kind >= SC_BACKEND_KIND_MAX ||
	    sc_backend_registry_find(c->kind) || n_registry >= SC_BACKEND_KIND_MAX - 1 ||
	    !c->name || !c->create || !c->can_reach)
		return -1;
	registry[n_registry++] = *c;
	return 0;
}

/* ---- partial ops tables ---------------------------------------------------------------------- */

void sc_backend_ops_merge(struct sc_backend_ops *out, const struct sc_backend_ops *partial)
{
	*out = *partial;
	if (!out->start)
		out->start = sc_backend_start_unsupported;
	if (!out->stop)
		out->stop = sc_backend_noop;
	if (!out->destroy)
		out->destroy = sc_backend_noop;
	if (!out->register_region)
		out->register_region = sc_backend_register_unsupported;
	if (!out->deregister_region)
		out->deregister_region = sc_backend_deregister_noop;
	if (!out->expose)
		out->expose = sc_backend_expose_noop;
	if (!out->revoke)
		out->revoke = sc_backend_revoke_noop;
	if (!out->submit)
		out->submit = sc_backend_submit_unsupported;
	if (!out->cancel)
		out->cancel = sc_backend_cancel_noop;
	if (!out->connect)
		out->connect = sc_backend_connect_unsupported;
	if (!out->advertise)
		out->advertise = sc_backend_advertise_noop;
}

struct sc_backend *sc_backend_registry_create(const struct sc_backend_class *c,
					      const struct sc_backend_env *env)
{
	struct sc_backend *b = c->create(env);
	if (!b)
		return NULL;
	sc_backend_ops_merge(&b->own_ops, b->ops);
	b->own_ops.name = c->name;
	b->own_ops.kind = c->kind;
	b->own_ops.transport_level = c->transport_level;
	b->ops = &b->own_ops;
	return b;
}

/* ---- the choice ------------------------------------------------------------------------------ */

const struct sc_backend_class *sc_backend_registry_choose(struct sc_backend *const *backends,
							  const struct sc_metadata *md,
							  bool same_sidecar)
{
	const struct sc_backend_class *best = NULL;
	for (size_t i = 0; i < n_registry; i++) {
		const struct sc_backend_class *c = &registry[i];
		const struct sc_backend *b = backends[c->kind];
		if (!b || !b->available || !c->can_reach(md, same_sidecar))
			continue;
		if (!best || c->transport_level > best->transport_level)
			best = c;
	}
	return best;
}
