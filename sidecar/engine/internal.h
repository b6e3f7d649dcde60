/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/internal.h: the engine's private structures and what its files share, for the engine's
 * own files (every .c file of sidecar/engine but backend_registry.c and metrics.c, which have
 * headers of their own) and tests/unit/test_rail_choice.c. Nothing below the engine
 * (backends, the peer layer) includes it; the gRPC layer and the fast path use engine/engine.h.
 *
 * Calls between the files form no loop: engine.c on top; then the region API (region.c,
 * region_gpu.c), the NATS bus (bus.c) and ConnectPeer (connect_peer.c); op_active.c and
 * op_passive.c; the lifecycle core operation.c; then the scheduler (which reaches operations only
 * through eng->sched_hooks), the region table, the keyring, the page ordering and the leaves
 * (rail_table.c, region_alloc.c, metrics.c, backend_registry.c).
 *
 * Locking: eng->mu guards the tables, every region and operation field except op->bytes_done
 * (atomic), and the scheduler's queues. Backends never hold it while doing I/O; they call back
 * through the passive interface (backend/passive.h) and struct sc_xfer's callbacks, which take it briefly.
 *
 * Lifetime: a region or operation is reference counted under eng->mu. The table holds one
 * reference; an operation holds one on each region it uses; a pending timer, an in-flight xfer and
 * every pinned span hold one on the operation. Memory is unmapped only when the last reference
 * goes, so no backend ever touches released memory.
 */
#ifndef SC_ENGINE_INTERNAL_H
#define SC_ENGINE_INTERNAL_H

#include "backend/backend.h"
#include "engine/engine.h"
#include "os/topology.h"
#include "gpu/gpu.h"
#include "base/idmap.h"
#include "meta/keys.h"
#include "base/list.h"
#include "meta/metadata.h"
#include "engine/metrics.h"
#include "backend/passive.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdatomic.h>

struct sc_nats_bus;
struct sc_nats_store;
struct sc_peer_pool;
struct sc_peer_server;
struct sc_peer_tls;

struct sc_region {
	char id[SC_ID_MAX];
	enum sc_device_kind kind;
	uint32_t device_index;
	uint64_t size;
	char path[512];
	uint64_t file_offset;
	char name[SC_NAME_MAX];
	uint8_t *base;   /* first byte of the region: a device address when gpu >= 0 (never
			  * dereference it: see gpu/gpu.h) */
	int gpu;         /* SC_GPU_HOST, or the CUDA device index of a GPU region */
	struct sc_gpu_mem gmem; /* GPU regions: the memory and how to give it back */
	const struct sc_gpu_device_info *gpu_info; /* GPU regions: their device (GetInfo's view) */
	uint8_t ipc_handle[SC_GPU_IPC_HANDLE_LEN]; /* sidecar-allocated GPU regions */
	bool has_ipc_handle;
	void *map_addr;  /* what mmap returned (page aligned) */
	size_t map_len;
	bool owned_file; /* created by the sidecar: unlink at release */
	bool counted;    /* in eng->region_bytes (--max-total-region-bytes) */
	bool in_table;
	int refs;
	uint32_t live_ops;                      /* non-terminal operations using it */
	void *backend_handle[SC_NUM_BACKENDS]; /* e.g. the ibverbs MR */
	/* GPU regions a backend could not register (e.g. ibverbs without dma-buf): why. */
	char backend_note[SC_NUM_BACKENDS][256];
};

struct sc_watch {
	uint64_t id;
	sc_op_watch_fn fn;
	void *ctx;
	struct sc_list node; /* op->watches */
};

/* One claimed use of a passive operation. */
struct sc_use {
	uint64_t xfer_id;
	char trace_id[SC_TRACE_ID_LEN]; /* the peer's, from its OPEN; "" = none */
	bool done;
	/* The code of the first request of this use that the passive span call refused (SC_OK: none): a
	 * DONE reporting success after it (pipelined behind that request) is refused. */
	enum sc_status refused;
};

struct sc_op {
	struct sc_engine *eng;
	char id[SC_ID_MAX];
	enum sc_op_kind kind;
	enum sc_op_status status;
	enum sc_backend_kind backend;
	uint64_t bytes_total;
	atomic_uint_fast64_t bytes_done;
	char *metadata;
	enum sc_status err_code;
	char err_msg[SC_ERR_MSG_MAX];
	char peer[SC_NAME_MAX];
	char audience[SC_NAME_MAX];
	uint64_t created_unix_ms;
	uint64_t deadline_unix_ms;
	uint64_t deadline_mono_ms;
	uint64_t completed_unix_ms;
	uint64_t xfer_start_ns; /* sc_metrics_clock_ns() at the transfer's slot; 0 = never */
	char request_id[SC_NAME_MAX];
	char trace_id[SC_TRACE_ID_LEN]; /* W3C trace id; passive: "" until a creator's or first use's */
	struct sc_desc *descs;
	struct sc_region **regions; /* one per descriptor, each holding a reference */
	size_t n_descs;
	bool omit_descs; /* snapshots leave descs out (created from compact lists) */
	bool quiet;	 /* start and end logged at debug (sc_active_req.quiet) */
	char backend_reason[256];
	int refs;
	int pins; /* in-flight xfer + open spans: region memory in use */
	bool in_table;
	bool counted_live; /* counted in its regions' live_ops */
	uint64_t deadline_timer;
	uint64_t retention_timer;
	atomic_uint_fast64_t last_notify_mono_ms; /* read without mu to throttle progress */
	struct sc_list watches; /* struct sc_watch, newest first */

	/* passive */
	uint8_t token[SC_TOKEN_LEN];
	bool token_in_table;
	bool token_spent; /* in eng->spent_tokens */
	uint32_t max_uses;   /* UINT32_MAX with any_uses */
	bool any_uses;	     /* any number of uses until the deadline */
	uint64_t uses_begun; /* uses OPENed so far (checked against max_uses) */
	uint64_t uses_done;  /* uses whose DONE reported success */
	uint64_t uses_failed; /* any_uses: uses that failed or vanished (the others go on) */
	uint32_t n_uses;     /* records in uses: the uses in flight (a finished one is dropped) */
	struct sc_u64map uses; /* xfer_id -> struct sc_use (owned), at most SC_OP_MAX_OPEN_USES */
	atomic_uint_fast64_t bytes_served; /* passive: bytes every use moved, all together */
	void *exposure[SC_NUM_BACKENDS];

	/* active */
	struct sc_metadata meta;
	bool meta_valid;
	struct sc_xfer xfer;
	struct sc_backend *be;
	bool xfer_in_flight;
	/* A cancel, deadline or release ended the active operation while its transfer was in
	 * flight: the status it ends with (err_code/err_msg hold the reason) once the backend has
	 * stopped touching region memory (xfer_complete). SC_OPS_UNSPECIFIED: none. */
	enum sc_op_status finish_pending;
	bool slot_held;
	struct sc_requirement req;
	bool waiting_requirement; /* gated: on gate->waiters */
	struct sc_progress *gate; /* the progress record it waits for, while waiting_requirement */
	struct sc_list gate_node; /* on gate->waiters, in arrival order */
	bool queued;
	struct sc_list sched_node; /* on eng->sched while queued */
};

/* One request id's progress (ReportProgress), or a placeholder an operation gated on a request id
 * nobody reported yet waits on (reported false). Found by request id in eng->progress_ids. A
 * record some operation waits on is never dropped; one that none waits on sits on
 * eng->progress_idle, oldest first, until --progress-grace passes or --max-progress-records
 * pushes it out. */
struct sc_progress {
	char request_id[SC_NAME_MAX];
	/* Its map key: request_id itself, or when that is too long for the map, long_key (engine/scheduler.c
	 * progress_key); kept so that dropping the record needs no hashing. */
	unsigned char long_key[1 + 32];
	bool hashed;
	uint8_t key_len;
	bool reported;
	uint64_t iteration;
	bool has_layer;
	uint32_t layer;
	bool iteration_complete;
	uint64_t idle_since_mono_ms; /* when it joined eng->progress_idle (last report or waiter) */
	struct sc_list waiters;      /* struct sc_op (gate_node) gated on it, first come first */
	struct sc_list node;         /* on eng->progress_idle while no operation waits on it */
};

struct sc_bus_sub;

/* What the scheduler does to an operation, handed to it when the engine creates it
 * (sc_sched_init): start its transfer once it holds a slot (engine/op_active.c
 * sc_op_start_transfer), drop a reference the queue held (engine/operation.c sc_op_unref). Under
 * mu. */
struct sc_sched_hooks {
	void (*start)(struct sc_engine *eng, struct sc_op *op);
	void (*drop)(struct sc_engine *eng, struct sc_op *op);
};

struct sc_engine {
	const struct sc_config *cfg;
	struct sc_warmer *warmer; /* --warm-peers with NATS; NULL otherwise */
	struct sc_topo *topo;	  /* NULL: none (topo_source says why) */
	char topo_source[256];
	struct sc_topo_table *topo_table; /* built at start, then immutable; NULL: none */
	size_t absent_rails[SC_TOPO_RAILS_MAX]; /* rows of topo_table->rails named by the file only */
	size_t n_absent_rails;
	uint64_t open_files_limit; /* RLIMIT_NOFILE after raising it (UINT64_MAX: unlimited) */
	pthread_mutex_t mu;
	pthread_cond_t idle_cv; /* signalled when an active transfer ends */
	struct sc_idmap *regions;
	struct sc_idmap *ops;
	struct sc_idmap *tokens;
	/* token -> terminal passive operation until it is forgotten (retention, release): an OPEN
	 * with such a token is a replay and gets FAILED_PRECONDITION naming how the operation
	 * ended, not NOT_FOUND (which stays for tokens this sidecar never held or forgot). */
	struct sc_idmap *spent_tokens;
	struct sc_timers *timers;
	struct sc_keyring *keys; /* swapped on SIGHUP under mu */
	struct sc_backend *backends[SC_NUM_BACKENDS];
	struct sc_peer_pool *peer_pool;
	struct sc_peer_server *peer_server;
	struct sc_peer_tls *peer_tls; /* NULL: peer data channel in clear text */
	char grpc_cert_serial[80];    /* under mu: the gRPC listeners' certificate ("" none) */
	int64_t grpc_cert_not_after;  /* under mu: its notAfter, unix seconds */
	atomic_uint_fast64_t fast_events[SC_FAST_EVENTS]; /* sc_engine_fast_path_note */
	struct sc_nats_bus *bus;
	struct sc_nats_store *store; /* JetStream hand-off (engine/bus.c); NULL: core or no NATS */
	bool store_closing;	     /* under mu: sc_bus_stop is destroying the store */
	struct sc_list stored;	     /* struct sc_bus_stored (engine/bus.c), under mu */
	struct sc_metrics *metrics; /* counters; the --metrics-listen server */
	struct sc_list subs; /* struct sc_bus_sub (engine/bus.c), newest first */
	uint64_t next_sub_id;
	char id[SC_NAME_MAX];
	uint64_t next_watch_id;
	uint64_t region_bytes; /* bytes of regions not yet freed, for --max-total-region-bytes */
	bool keys_ephemeral; /* no --key-file: a random local-only key */
	bool started;
	bool draining;
	bool stopping;
	/* scheduler */
	struct sc_sched_hooks sched_hooks;
	struct sc_list sched; /* struct sc_op waiting for a slot, first in first out */
	uint32_t active_transfers;
	uint64_t inflight_bytes;
	struct sc_idmap *progress_ids; /* request id key (see engine/scheduler.c) -> struct sc_progress */
	struct sc_list progress_idle;  /* struct sc_progress no operation waits on, oldest first */
	size_t n_progress;             /* records in progress_ids */
	/* the CUDA driver (NULL when unusable: cuda_detail says why) */
	struct sc_gpu *gpu;
	char cuda_detail[256];
};

/* ---- what the engine's files share, lowest first (each calls only the groups above its own) -- */

/* engine/list_page.c: entries of table (regions or operations; their id string at id_offset)
 * whose id sorts after `after`, ordered by id; *items is malloc'd, its pointers valid while mu is
 * held. Under mu. */
int sc_page_collect(struct sc_idmap *table, size_t id_offset, const char *after,
		    const void ***items, size_t *n, struct sc_err *err);

/* engine/keyring.c: verify metadata text with the current keyring (taken under mu, verified
 * outside it), counting a refusal in rdma_sidecar_metadata_rejected_total{source}. Fills *md on
 * success. */
int sc_engine_verify_metadata(struct sc_engine *eng, const char *text, const char *self_id,
			      enum sc_md_source source, struct sc_metadata *md, struct sc_err *err);
/* Without --key-file: a random local-only signing key (eng->keys_ephemeral). Main thread, at
 * create. */
int sc_engine_ephemeral_keyring(struct sc_engine *eng, struct sc_err *err);
/* The keyring source handed to the peer server and pool (it follows the SIGHUP swap). */
struct sc_keyring_source sc_engine_keyring_source(struct sc_engine *eng);

/* UNAVAILABLE once the sidecar drains (new regions and operations are refused). Under mu. */
static inline int sc_engine_check_accepting(struct sc_engine *eng, struct sc_err *err)
{
	if (eng->draining)
		return sc_err_set(err, SC_UNAVAILABLE,
				  "sidecar is draining (shutting down): retry on another sidecar");
	return 0;
}

/* engine/region_table.c: the region table, beneath the operations. */
void sc_region_ref(struct sc_region *r);
void sc_region_unref(struct sc_engine *eng, struct sc_region *r); /* under mu */
struct sc_region *sc_region_lookup(struct sc_engine *eng, const char *id);
void sc_region_release_all(struct sc_engine *eng);
/* CUDA regions: out->gdr_capable and out->gpu_path. */
void sc_region_gpu_path(const struct sc_region *r, struct sc_region_info *out);
void sc_region_fill_info(const struct sc_region *r, struct sc_region_info *out);
/* Resolve a descriptor against the region table: bounds-checked, host memory only. */
int sc_region_resolve(struct sc_engine *eng, const struct sc_desc *d, struct sc_region **out,
		      struct sc_err *err);
void sc_region_new_id(char out[SC_ID_MAX]);
/* Draining, --max-regions, --max-total-region-bytes: may one more region of `size` bytes exist?
 * Takes mu. */
int sc_region_quota_precheck(struct sc_engine *eng, uint64_t size, struct sc_err *err);
/* Publish a region (backends register it) and describe it; on failure it is released. */
int sc_region_add(struct sc_engine *eng, struct sc_region *r, struct sc_region_info *out,
		  struct sc_err *err);
/* Checks shared by every kind of region: size and name. */
int sc_region_check_new(struct sc_engine *eng, uint64_t size, const char *name,
			struct sc_err *err);

/* engine/scheduler.c: slots and progress gates, beneath the operations (it reaches them only
 * through eng->sched_hooks). */
/* Store the hooks, empty the queues. Main thread, at create. */
void sc_sched_init(struct sc_engine *eng, const struct sc_sched_hooks *hooks);
/* Gate a new active operation on its requirement (op->req set): when ReportProgress has not met
 * it yet, the operation waits on its request id's record (created if none) and *waits is true.
 * RESOURCE_EXHAUSTED when out of memory. Under mu. */
int sc_sched_gate(struct sc_engine *eng, struct sc_op *op, bool *waits, struct sc_err *err);
/* Stop waiting on its record (the record may become idle). Harmless when not gated. Under mu. */
void sc_sched_ungate(struct sc_engine *eng, struct sc_op *op);
/* Progress records kept now, after dropping those past --progress-grace. Under mu. */
size_t sc_sched_progress_records(struct sc_engine *eng);
/* Start or queue an active op that is ready to take a slot. Under mu. */
void sc_sched_admit(struct sc_engine *eng, struct sc_op *op);
/* A transfer ended: give its slot back, start queued ones. Under mu. */
void sc_sched_release(struct sc_engine *eng, struct sc_op *op);
void sc_sched_remove(struct sc_engine *eng, struct sc_op *op);
void sc_sched_free_progress(struct sc_engine *eng);
/* Active operations waiting for a transfer slot (SCHEDULED, requirement met). Under mu. */
size_t sc_sched_queued(struct sc_engine *eng);

/* engine/operation.c: the lifecycle core both kinds of operation build on. */
/* Watchers hear of progress at most this often (ms); the last byte always notifies. */
#define SC_OP_PROGRESS_NOTIFY_MS 10
static inline bool sc_op_is_passive(const struct sc_op *op)
{
	return op->kind == SC_OP_READABLE || op->kind == SC_OP_WRITABLE;
}
/* Allocate an op with its descriptors resolved against the region table (each referenced).
 * Under mu. */
struct sc_op *sc_op_new(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_desc *descs,
			size_t n, uint64_t timeout_ms, const char *request_id, struct sc_err *err);
/* Put a new op in the table, count it live, arm its deadline. Under mu. */
int sc_op_publish(struct sc_engine *eng, struct sc_op *op, struct sc_err *err);
/* Copy src (NULL: "") into dst, INVALID_ARGUMENT naming `what` when it does not fit. */
int sc_op_copy_str(char *dst, size_t cap, const char *src, const char *what, struct sc_err *err);
/* Fill a snapshot. Under mu. -1 only when out of memory (info still usable, without metadata
 * and descriptors). */
int sc_op_fill_info(const struct sc_op *op, struct sc_op_info *info);
/* The log fields (base/log.h) of op: op, peer, backend, bytes (its total), trace_id. The strings
 * point into op: log before mu is released (or before op can go). */
struct sc_log_fields sc_op_log_fields(const struct sc_op *op);
/* The same as a pointer for a log call: SC_INFO_KV("op", SC_OP_FIELDS(op), "..."). */
#define SC_OP_FIELDS(o) ((const struct sc_log_fields[]){sc_op_log_fields(o)})
/* Tell every watcher. Under mu. */
void sc_op_notify(struct sc_engine *eng, struct sc_op *op);
/* A terminal operation nothing pins gives its regions back at once. Under mu. */
void sc_op_release_regions(struct sc_engine *eng, struct sc_op *op);
/* Is the host memory of op's ranges still backed (a worker may truncate a region's file)? 0, or
 * -1 with err FAILED_PRECONDITION naming the region and saying `stopped` stopped. Under mu. */
int sc_op_probe_host_ranges(const struct sc_op *op, const char *stopped, struct sc_err *err);
void sc_op_finish_locked(struct sc_engine *eng, struct sc_op *op, enum sc_op_status status,
			 enum sc_status code, const char *msg);
void sc_op_unref(struct sc_engine *eng, struct sc_op *op); /* under mu */
void sc_op_cancel_all(struct sc_engine *eng, const char *why);
/* End every live operation using region r as CANCELLED. Under mu. */
void sc_op_cancel_region_locked(struct sc_engine *eng, struct sc_region *r, const char *why);
void sc_op_forget_all(struct sc_engine *eng);

/* engine/op_active.c: really start moving bytes (slot held): the scheduler's start hook. Under
 * mu. */
void sc_op_start_transfer(struct sc_engine *eng, struct sc_op *op);

/* engine/op_passive.c */
/* The passive-operation interface (backend/passive.h) over this engine, for the peer server and
 * the backends; ctx is eng. */
struct sc_passive sc_op_passive(struct sc_engine *eng);
/* Passive operations with a use a peer has opened and not finished (bytes may be moving);
 * INITIALIZED ones no peer has begun do not count. Under mu. */
uint32_t sc_engine_passive_busy_count(struct sc_engine *eng);

/* engine/connect_peer.c: background warm-up of the issuers of metadata received over NATS. */
struct sc_warmer;
int sc_warmer_start(struct sc_engine *eng, struct sc_warmer **out, struct sc_err *err);
/* Queue a warm-up for metadata text (verified) from issuer; dropped when the queue is full or
 * the issuer was warmed recently. w NULL: nothing. Any thread. */
void sc_warmer_offer(struct sc_warmer *w, const char *text, const char *issuer);
/* Join the thread, drop what is queued. NULL ok. */
void sc_warmer_stop(struct sc_warmer *w);

/* engine/region_gpu.c */
int sc_region_create_gpu(struct sc_engine *eng, uint64_t size, uint32_t device,
			 const char *name, struct sc_region_info *out, struct sc_err *err);

/* engine/bus.c */
int sc_bus_start(struct sc_engine *eng, struct sc_err *err); /* after eng->bus is created */
void sc_bus_stop(struct sc_engine *eng);

/* engine/rail_table.c: the PCIe topology and the rail table (GetInfo topology). */
void sc_engine_topology_load(struct sc_engine *eng);  /* create, main thread */
void sc_engine_topology_build(struct sc_engine *eng); /* start, after the backends */
void sc_engine_topology_free(struct sc_engine *eng);
/* struct sc_backend_env.rail_choice over the engine's rail table (ctx: the engine). */
bool sc_engine_rail_choice(void *ctx, const struct sc_backend *b, int gpu, bool *allow);

#endif
