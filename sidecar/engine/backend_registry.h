/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/backend_registry.h: the one table of data-plane backends, in the shape of redis'
 * connTypeRegister and rdma-core's verbs_set_ops over dummy_ops. Each row says what a backend is
 * called, which proto Backend value it reports, how fast it is (transport_level), how to create it
 * and whether it can reach a given peer. The engine creates every registered backend by walking
 * the table, chooses one for an active operation by data (the fastest usable one that can reach the
 * metadata's issuer), and every name (--backends, logs, metrics labels, GetInfo order) comes from
 * here.
 *
 * Adding a backend: write backend_<name>.c with its partial ops table and constructor, and add one
 * row to the table in engine/backend_registry.c (README "Adding a backend").
 *
 * The table is read-only once an engine exists; sc_backend_registry_add is for tests, called
 * before the first sc_engine_create. Every other call is thread-safe and pure.
 */
#ifndef SC_BACKEND_REGISTRY_H
#define SC_BACKEND_REGISTRY_H

#include "backend/backend.h"

#include <stdbool.h>
#include <stddef.h>

/* The --backends / metadata bit of a backend kind (SC_BACKEND_BIT_* in conf/config.h). */
#define SC_BACKEND_BIT(kind) (1u << ((unsigned)(kind)-1u))

struct sc_backend_class {
	const char *name;	   /* "tcp": --backends, logs, metrics labels */
	enum sc_backend_kind kind; /* the proto's Backend value it reports; < SC_BACKEND_KIND_MAX */
	int transport_level;	   /* tcp 1 < nic 2 < local 3: the choice tries the highest first */
	/* Moves bytes to other sidecars over the peer control channel (whose server and pool the
	 * engine creates when such a backend is enabled). */
	bool peer_channel;
	/* When --backends names it, a failed start stops the sidecar instead of disabling it. */
	bool must_start;
	/* Returns a backend even when unusable (available=false, detail says why); NULL only when
	 * out of memory. Its ops table may be partial: sc_backend_registry_create fills the rest.
	 */
	struct sc_backend *(*create)(const struct sc_backend_env *env);
	/* Whether it can move the bytes of metadata md (issued by this sidecar: same_sidecar). */
	bool (*can_reach)(const struct sc_metadata *md, bool same_sidecar);
	/* Why it was chosen, for Operation.backend_reason. */
	const char *chosen_because;
};

/* The registered backends, in GetInfo and metrics order. i < sc_backend_registry_count(). */
size_t sc_backend_registry_count(void);
const struct sc_backend_class *sc_backend_registry_at(size_t i);
/* The class of a kind, or NULL when none is registered. */
const struct sc_backend_class *sc_backend_registry_find(enum sc_backend_kind kind);
/* Its name; "none" for SC_BACKEND_NONE and unregistered kinds. */
const char *sc_backend_name(enum sc_backend_kind kind);

/* Tests only, before any engine exists: register one more backend. -1 when its kind is taken,
 * out of range, or the table is full. */
int sc_backend_registry_add(const struct sc_backend_class *c);

/* Create c's backend and complete its ops: a copy of the backend's (partial) table with every
 * NULL op pointing at the "not supported" / no-op stubs of backend/backend.h, named and levelled
 * from c. NULL when out of memory. */
struct sc_backend *sc_backend_registry_create(const struct sc_backend_class *c,
					      const struct sc_backend_env *env);
/* Fill out from partial (which may be NULL-laden) and the stubs. */
void sc_backend_ops_merge(struct sc_backend_ops *out, const struct sc_backend_ops *partial);

/*
 * The fastest class, by transport_level, whose backend (backends[kind]) is available and can
 * reach md; NULL when none can. backends is indexed by kind (SC_BACKEND_KIND_MAX entries).
 */
const struct sc_backend_class *sc_backend_registry_choose(struct sc_backend *const *backends,
							  const struct sc_metadata *md,
							  bool same_sidecar);

#endif
