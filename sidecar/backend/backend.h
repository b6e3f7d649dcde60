/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend/backend.h: the interface every data-plane backend implements (tcp, ibverbs, local), in
 * the shape of Monarch's RdmaBackend: a const ops table with named initializers, called through the
 * inline wrappers below; a backend's object embeds struct sc_backend and downcasts with
 * container_of. Ops a backend lacks point at the sc_backend_*_unsupported stubs, so callers never
 * test for NULL.
 *
 * An active operation becomes one struct sc_xfer, submitted to one backend. The backend moves the
 * bytes on its own threads, reports progress, and calls on_complete exactly once (from any of its
 * threads, never from inside submit), after it has told the passive side (DONE / CANCEL).
 */
#ifndef SC_BACKEND_H
#define SC_BACKEND_H

#include "gpu/gpu.h"
#include "meta/metadata.h"
#include "backend/passive.h"
#include "base/types.h"
#include "base/log.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

struct sc_backend;
struct sc_region;
struct sc_peer_pool;
struct sc_peer_server;

/*
 * What a backend is given when it is created: everything it may use. A backend never reaches back
 * into the engine; it talks to passive operations only through the interface `passive`
 * (backend/passive.h) and to peers only through the pool and the server it was given.
 */
struct sc_xr_here; /* backend/xfer_runner.h */

struct sc_backend_env {
	const struct sc_config *cfg;
	const char *self_id;           /* this sidecar's id */
	struct sc_passive passive;     /* the passive-operation interface (backend/passive.h) */
	struct sc_peer_pool *pool;     /* authenticated peer connections; NULL: tcp and ibverbs off */
	struct sc_peer_server *server; /* the peer control channel's server; NULL likewise */
	struct sc_gpu *gpu;            /* GPU memory access (gpu/gpu.h); NULL without CUDA */
	/* The node's topology (engine/rail_table.c): which of backend b's rails should carry memory of GPU
	 * `gpu` (SC_GPU_HOST: host memory whose NUMA node is unknown). Fills allow[i] for each of
	 * b's rails and returns true, or returns false when it has no opinion (every rail may).
	 * NULL: none. Any thread, once the engine has started. */
	bool (*rail_choice)(void *ctx, const struct sc_backend *b, int gpu, bool *allow);
	void *rail_choice_ctx;
};

/* One contiguous piece of an active transfer: local memory <-> remote descriptor remote_desc. */
struct sc_xfer_seg {
	uint8_t *local; /* a device address when local_gpu >= 0 (never dereference it: gpu/gpu.h) */
	int local_gpu;  /* SC_GPU_HOST or the CUDA device of the local range */
	bool remote_gpu; /* the remote descriptor is GPU memory (informational) */
	uint64_t len;
	uint32_t remote_desc;
	uint64_t remote_addr; /* ibverbs: from the metadata */
	uint32_t rkey;        /* ibverbs: from the metadata */
	void *local_mr;       /* ibverbs: the local region's registration (struct ibv_mr *) */
};

/*
 * A rail: one path a backend moves bytes over (an RDMA port, a TCP data endpoint). A backend
 * fills its rails when it is created (name, pci, numa, rate: fixed from then on) and keeps their
 * state and counters current; GetInfo and the metrics read them from any thread. state and detail
 * change together under one lock in backend/backend.c (sc_rail_set_state, sc_rail_snapshot);
 * counters are atomics.
 */
/* SC_MAX_RAILS, enum sc_rail_state and struct sc_rail_report: base/types.h. */

struct sc_rail {
	char name[64];	 /* "mlx5_0:1", "10.0.0.1:7001" */
	char pci[32];	 /* "0000:17:00.0"; "" unknown */
	char netdev[32]; /* "" unknown */
	int numa;	 /* -1 unknown */
	uint64_t rate_mbps;
	enum sc_rail_state state; /* sc_rail_set_state / sc_rail_snapshot */
	char detail[200];	  /* likewise */
	atomic_uint_fast64_t bytes, operations, errors, failovers;
};

/* The most rails one transfer reports bytes for (struct sc_xfer.rail_bytes). */
#define SC_XFER_MAX_RAILS SC_MAX_RAILS


struct sc_xfer {
	enum sc_op_kind kind; /* SC_OP_READ (remote -> local) or SC_OP_WRITE (local -> remote) */
	const struct sc_metadata *meta; /* verified: endpoints, token, ibverbs endpoint */
	uint64_t xfer_id;
	/* Set by the engine: the operation's id and W3C trace id (32 hex digits, "" = none), for
	 * log lines (base/log.h fields) and for the OPEN that tells the peer (sc_peer_open_xfer). */
	const char *op_id;
	char trace_id[SC_TRACE_ID_LEN];
	struct sc_xfer_seg *segs;
	size_t n_segs;
	uint64_t total;
	uint64_t deadline_mono_ms;
	atomic_bool cancel_requested;
	/* Set by the backend once the transfer can no longer be cut: the peer was told it succeeded
	 * (TCP's pipelined DONE), so stopping now would make the two sides disagree. Cleared if the
	 * transfer starts over. CancelOperation reports it instead of waiting. */
	atomic_bool committed;
	/* Set by the engine: another backend (tcp) can carry this transfer if this one's path fails.
	 * A backend whose path fails (UNAVAILABLE, not the operation's own error, before the
	 * deadline and without a cancel) then tells the peer ABORTED and completes with SC_ABORTED;
	 * the engine resubmits the same transfer (same xfer_id) to the other backend. */
	bool fallback_ok;
	/* The beginning caller's offer to run the first task on its own thread (backend/
	 * xfer_runner.h, sc_xr_admit_here): set by the engine only while it submits the transfer
	 * from that caller's sc_op_begin, NULL otherwise (a scheduled start, a fall-back). */
	struct sc_xr_here *here;
	/* Called from backend threads. on_progress may run concurrently from several threads. */
	void (*on_progress)(struct sc_xfer *x, uint64_t delta);
	void (*on_complete)(struct sc_xfer *x, enum sc_status status, const char *msg);
	void *owner; /* the engine's operation */
	void *priv;  /* the backend's */
	/* Bytes moved per rail of the backend (index into its rails), added by the backend as
	 * they complete; Operation.rails reports the non-zero ones. */
	atomic_uint_fast64_t rail_bytes[SC_XFER_MAX_RAILS];
};

/*
 * A backend thread's log scope for one transfer (base/log.h sc_log_scope_enter): while it runs a
 * task of x, every line it logs (its own, the peer channel's) carries x's op, peer, backend and
 * trace_id. The strings are copied, so the scope outlives nothing it points to. On the caller's
 * stack; enter and leave on the same thread.
 */
struct sc_xfer_log_scope {
	char op[SC_ID_MAX];
	char peer[SC_NAME_MAX];
	char trace_id[SC_TRACE_ID_LEN];
	struct sc_log_fields fields;
	const struct sc_log_fields *prev;
};
static inline void sc_xfer_log_scope_enter(struct sc_xfer_log_scope *s, const struct sc_xfer *x,
					   const char *backend)
{
	snprintf(s->op, sizeof(s->op), "%s", x->op_id ? x->op_id : "");
	snprintf(s->peer, sizeof(s->peer), "%s", x->meta ? x->meta->issuer : "");
	memcpy(s->trace_id, x->trace_id, sizeof(s->trace_id));
	s->fields = (struct sc_log_fields){
	    .op = s->op, .peer = s->peer, .backend = backend, .trace_id = s->trace_id};
	s->prev = sc_log_scope_enter(&s->fields);
}
static inline void sc_xfer_log_scope_leave(const struct sc_xfer_log_scope *s)
{
	sc_log_scope_leave(s->prev);
}

/* A backend's table may leave ops (and name, transport_level) out: engine/backend_registry.c completes
 * it from the registry row and the stubs below. */
struct sc_backend_ops {
	const char *name;
	enum sc_backend_kind kind;
	int transport_level; /* tcp 1 < nic 2 < local 3 */
	/* Bind/start threads. Called once by sc_engine_start. */
	int (*start)(struct sc_backend *b, struct sc_err *err);
	/* Stop accepting and cancel what is in flight; join threads. */
	void (*stop)(struct sc_backend *b);
	void (*destroy)(struct sc_backend *b);
	/* Make a region usable by this backend (ibverbs: ibv_reg_mr, or a dma-buf MR for GPU
	 * memory). gpu: SC_GPU_HOST or the CUDA device of addr. *handle is stored with it. A GPU
	 * region this fails for stays usable by the other backends (staged). */
	int (*register_region)(struct sc_backend *b, void *addr, uint64_t len, int gpu,
			       void **handle, struct sc_err *err);
	void (*deregister_region)(struct sc_backend *b, void *handle);
	/* Grant remote access to one passive operation's ranges (addrs[i] on device gpus[i], or
	 * host memory for SC_GPU_HOST); fill md->descs' addr/rkey and md->ib. *handle identifies
	 * the grant for revoke. */
	int (*expose)(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		      const int *gpus, void *const *region_handles, void **handle,
		      struct sc_err *err);
	void (*revoke)(struct sc_backend *b, void *handle);
	int (*submit)(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err);
	/* Ask the transfer to end early (CANCELLED); on_complete still runs exactly once. */
	void (*cancel)(struct sc_backend *b, struct sc_xfer *x);
	/* Set up what a first transfer to md's issuer would (connections, queue pairs) and keep it
	 * for the transfers that follow; detail says what (or err why not). Blocks up to the
	 * deadline; a gRPC worker thread. */
	int (*connect)(struct sc_backend *b, const struct sc_metadata *md, uint64_t deadline_mono_ms,
		       char *detail, size_t cap, struct sc_err *err);
	/* Write this backend's part of a new passive operation's metadata, before expose: how
	 * peers reach it (md->endpoints, where no backend before it wrote any) and, when a peer
	 * may use it on the token alone, its bit in md->backends. The engine calls every
	 * available backend's in kind order (tcp first). Under the engine lock: no blocking. */
	void (*advertise)(struct sc_backend *b, struct sc_metadata *md);
};

struct sc_backend {
	const struct sc_backend_ops *ops; /* &own_ops once created through the registry */
	struct sc_backend_ops own_ops;    /* the completed table (engine/backend_registry.h) */
	struct sc_backend_env env; /* given at creation */
	bool available;
	char detail[256];
	char devices[4][64];
	size_t n_devices;
	char endpoint[80]; /* tcp: "host:port" peers dial, once started */
	/* Its rails (see struct sc_rail). n_rails is fixed once the backend is created. */
	struct sc_rail rails[SC_MAX_RAILS];
	size_t n_rails;
	/* ibverbs (every lane counts on the first's): incoming QPs destroyed to admit a new peer,
	 * destroyed after idling, and peers refused because every QP was in use. Any thread. */
	atomic_uint_fast64_t qps_evicted, qps_expired, qps_refused;
	/* libfabric: remote keys granted and closed (one per operation span and rail), peers'
	 * address-vector entries inserted and removed. Any thread. */
	atomic_uint_fast64_t keys_granted, keys_revoked, addrs_inserted, addrs_evicted;
};

/* Set rail i's state and detail (printf-style; NULL keeps the detail). Any thread. */
void sc_rail_set_state(struct sc_backend *b, size_t i, enum sc_rail_state st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* A copy of rail i with its state and detail read together. Any thread. */
void sc_rail_snapshot(struct sc_backend *b, size_t i, struct sc_rail_report *out);
/* Which of b's rails should carry memory of `gpu` (allow[i] for each rail, up to SC_MAX_RAILS):
 * the node's topology for GPU memory (struct sc_backend_env.rail_choice). Host memory has no
 * known NUMA node here, so no choice, except in tests: the environment variable test_env (a
 * comma-separated list of rail names) names the rails host memory is near. false: no choice,
 * every rail may. Any thread, once the engine has started. */
bool sc_rail_choice(const struct sc_backend *b, int gpu, const char *test_env, bool *allow);
/* Count bytes moved on rail i for transfer x (x may be NULL). Any thread. */
static inline void sc_rail_add_bytes(struct sc_backend *b, struct sc_xfer *x, size_t i,
				     uint64_t n)
{
	if (i >= b->n_rails)
		return;
	atomic_fetch_add_explicit(&b->rails[i].bytes, n, memory_order_relaxed);
	if (x && i < SC_XFER_MAX_RAILS)
		atomic_fetch_add_explicit(&x->rail_bytes[i], n, memory_order_relaxed);
}

int sc_backend_start_unsupported(struct sc_backend *b, struct sc_err *err);
void sc_backend_noop(struct sc_backend *b);
int sc_backend_register_unsupported(struct sc_backend *b, void *addr, uint64_t len, int gpu,
				    void **handle, struct sc_err *err);
void sc_backend_deregister_noop(struct sc_backend *b, void *handle);
int sc_backend_expose_noop(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
			   const int *gpus, void *const *region_handles, void **handle,
			   struct sc_err *err);
void sc_backend_revoke_noop(struct sc_backend *b, void *handle);
int sc_backend_submit_unsupported(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err);
void sc_backend_cancel_noop(struct sc_backend *b, struct sc_xfer *x);
int sc_backend_connect_unsupported(struct sc_backend *b, const struct sc_metadata *md,
				   uint64_t deadline_mono_ms, char *detail, size_t cap,
				   struct sc_err *err);
void sc_backend_advertise_noop(struct sc_backend *b, struct sc_metadata *md);

static inline int sc_backend_start(struct sc_backend *b, struct sc_err *err)
{
	return b->ops->start(b, err);
}
static inline void sc_backend_stop(struct sc_backend *b)
{
	b->ops->stop(b);
}
static inline void sc_backend_destroy(struct sc_backend *b)
{
	if (b)
		b->ops->destroy(b);
}
static inline int sc_backend_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	return b->ops->submit(b, x, err);
}
static inline void sc_backend_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	b->ops->cancel(b, x);
}
static inline int sc_backend_connect(struct sc_backend *b, const struct sc_metadata *md,
				     uint64_t deadline_mono_ms, char *detail, size_t cap,
				     struct sc_err *err)
{
	return b->ops->connect(b, md, deadline_mono_ms, detail, cap, err);
}

/* Constructors. Each returns a backend even when unusable (available=false, detail says why). */
struct sc_backend *sc_backend_tcp_create(const struct sc_backend_env *env);
struct sc_backend *sc_backend_local_create(const struct sc_backend_env *env);
struct sc_backend *sc_backend_ibverbs_create(const struct sc_backend_env *env);
struct sc_backend *sc_backend_libfabric_create(const struct sc_backend_env *env);

#endif
