/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine.h: the engine's public API, the only header the gRPC layer (service/) uses.
 *
 * The engine owns regions, operations, backends, the metadata keys, the NATS bus and a timer
 * thread. Ownership: engine > region > operation. Every call here is thread-safe (one engine lock
 * guards the tables; transfers run on backend threads). Calls that return information fill
 * caller-owned snapshot structs (free them with the matching *_free); ids are copied, never shared.
 * Errors: -1 with struct sc_err filled (code = gRPC status code, message for the client).
 */
#ifndef SC_ENGINE_H
#define SC_ENGINE_H

#include "conf/config.h"
#include "gpu/gpu.h"
#include "base/types.h"
#include "base/status.h"
#include "base/log.h"
#include "os/topology.h"
#include "backend/xfer_runner.h"

/* The data endpoints GetInfo lists: SC_MAX_ENDPOINTS (meta/metadata.h). */
#define SC_INFO_MAX_ENDPOINTS 4

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sc_engine;

/* The names of base/types.h's statuses, kinds and backends ("COMPLETE", "READ", "tcp"). */
const char *sc_op_status_name(enum sc_op_status s);
const char *sc_op_kind_name(enum sc_op_kind k);
const char *sc_backend_name(enum sc_backend_kind b); /* engine/backend_registry.c */

/* ---- lifecycle (main thread) --------------------------------------------------------------- */

/* Checks the shm dir, loads keys, probes backends and binds the data and metrics listeners
 * (so a busy port is a start-up error). Starts no thread. */
int sc_engine_create(const struct sc_config *cfg, struct sc_engine **out, struct sc_err *err);
/* Binds the data listener, starts the timer, data-plane and NATS threads. */
int sc_engine_start(struct sc_engine *eng, struct sc_err *err);
/* From now on new operations and regions are refused with UNAVAILABLE ("sidecar is draining"). */
void sc_engine_begin_drain(struct sc_engine *eng);
/* Waits up to timeout_ms for live transfers to end: active and scheduled ones, and passive ones a
 * peer has begun (INITIALIZED ones no peer has opened do not hold it). True when none is left. */
bool sc_engine_wait_idle(struct sc_engine *eng, uint64_t timeout_ms);
/* Cancels what is left, joins every thread, unmaps regions, removes files it created. NULL ok. */
void sc_engine_destroy(struct sc_engine *eng);
/* SIGHUP: reload the key file. The old keys stay on failure. */
int sc_engine_reload_keys(struct sc_engine *eng, struct sc_err *err);
/* The gRPC layer says which certificate its TCP listeners present (serial hex, notAfter unix
 * seconds; serial NULL or "": none), for the metrics. Any thread. */
void sc_engine_set_grpc_certificate(struct sc_engine *eng, const char *serial,
				    int64_t not_after);
/* SIGHUP: reload the peer TLS certificate, key and CA (nothing to do without peer TLS). The old
 * ones stay on failure (logged). New connections use the new certificate; live ones go on. */
int sc_engine_reload_tls(struct sc_engine *eng, struct sc_err *err);

/* The fast path counts what happens to its sessions and runs (metrics). Any thread, lock-free. */
void sc_engine_fast_path_note(struct sc_engine *eng, enum sc_fast_event ev);
/* A fast-path run that began a transfer ended ns after its entry was taken (metrics). Any
 * thread, lock-free. */
void sc_engine_fast_path_run_time(struct sc_engine *eng, uint64_t ns);
/* A monotonic clock in nanoseconds, for the timings reported here. */
uint64_t sc_engine_clock_ns(void);

/* The gRPC layer's calls, for the metrics (grpc_server_*). It names its methods once before
 * serving (paths[i] "/package.Service/Method" and types[i] "unary", "client_stream",
 * "server_stream" or "bidi_stream", strings that outlive the engine; index i below, any index
 * >= n: an unknown method), then reports each call's arrival and its end with its status and the
 * nanoseconds since arrival. Any thread, lock-free, except sc_engine_grpc_methods (main thread,
 * before the first call). */
void sc_engine_grpc_methods(struct sc_engine *eng, const char *const *paths,
			    const char *const *types, size_t n);
void sc_engine_grpc_call_started(struct sc_engine *eng, size_t method);
void sc_engine_grpc_call_done(struct sc_engine *eng, size_t method, enum sc_status code,
			      uint64_t ns);

/* ---- info ------------------------------------------------------------------------------------ */

struct sc_backend_report {
	enum sc_backend_kind backend;
	bool available;
	char detail[256];
	char devices[4][64];
	size_t n_devices;
};

#define SC_INFO_MAX_BACKENDS 5 /* registered backends GetInfo reports, at most */
#define SC_INFO_MAX_RAILS 32   /* rails GetInfo and the metrics report, all backends together */
struct sc_info {
	char sidecar_id[SC_NAME_MAX];
	const char *version;
	struct sc_backend_report backends[SC_INFO_MAX_BACKENDS]; /* in engine/backend_registry.c order */
	size_t n_backends;
	char data_endpoints[SC_INFO_MAX_ENDPOINTS][80]; /* one per --data-listen entry */
	size_t n_data_endpoints;
	char nats_state[32];
	bool signing_enabled;
	char signing_key_id[64];
	bool cuda_available;
	char cuda_detail[256];
	struct sc_gpu_device_info gpus[SC_GPU_MAX_DEVICES];
	size_t n_gpus;
	/* The certificate new peer connections present (has_peer_cert: peer TLS is on). */
	bool has_peer_cert;
	char peer_cert_serial[80];
	char peer_cert_identity[SC_NAME_MAX]; /* "" when it names none */
	int64_t peer_cert_not_before, peer_cert_not_after; /* unix seconds */
	const char *peer_identity_source;                  /* "spiffe", "dns", "cn", "off" */
	struct sc_rail_entry rails[SC_INFO_MAX_RAILS]; /* in engine/backend_registry.c order */
	size_t n_rails;
	/* Which rails carry which memory (built at start; NULL before or without one), and where
	 * the topology came from ("sysfs", an XML path, or "none: why"). Both live as long as the
	 * engine. */
	const struct sc_topo_table *topo_table;
	const char *topology_source;
	uint64_t open_files_limit; /* the soft RLIMIT_NOFILE, raised to the hard one at start */
};
void sc_engine_info(struct sc_engine *eng, struct sc_info *out);

/* ---- peers (engine/connect_peer.c) ----------------------------------------------------------- */

#define SC_PEER_PATHS_MAX 4
struct sc_peer_paths {
	char peer[SC_NAME_MAX]; /* the metadata's issuer */
	struct sc_peer_path {
		enum sc_backend_kind backend;
		bool ready;
		char detail[400];
		uint64_t elapsed_us;
	} paths[SC_PEER_PATHS_MAX];
	size_t n;
};
/*
 * ConnectPeer: verify metadata text (any kind; not used up) and have every backend both sidecars
 * offer set up its connections to the issuer within timeout_ms (0: 10 s). Fills *out when at
 * least one is ready. Errors: the metadata's (INVALID_ARGUMENT, UNAUTHENTICATED, ...),
 * FAILED_PRECONDITION when no backend applies, else the first backend's failure (UNAVAILABLE,
 * DEADLINE_EXCEEDED, ...). Blocks; a gRPC worker thread.
 */
int sc_engine_connect_peer(struct sc_engine *eng, const char *text, uint64_t timeout_ms,
			   struct sc_peer_paths *out, struct sc_err *err);

/* ---- regions --------------------------------------------------------------------------------- */

struct sc_region_info {
	char id[SC_ID_MAX];
	enum sc_device_kind kind;
	uint32_t device_index;
	uint64_t size;
	char path[512];
	uint64_t file_offset;
	char name[SC_NAME_MAX];
	uint32_t live_ops;
	/* CUDA regions the sidecar allocated: the IPC handle for the worker to open. */
	bool has_cuda_ipc_handle;
	uint8_t cuda_ipc_handle[SC_GPU_IPC_HANDLE_LEN];
	/* CUDA regions: GPUDirect RDMA capable memory, and the path ibverbs transfers of it take. */
	bool gdr_capable;
	char gpu_path[400]; /* backend_note (256) and the words around it */
};

int sc_region_create(struct sc_engine *eng, uint64_t size, enum sc_device_kind kind,
		     uint32_t device_index, const char *name, struct sc_region_info *out,
		     struct sc_err *err);
int sc_region_register_host(struct sc_engine *eng, const char *path, uint64_t offset,
			    uint64_t size, const char *name, struct sc_region_info *out,
			    struct sc_err *err);
/* GPU memory of a worker: a CUDA IPC handle (the allocation block; [offset, offset+size) of it
 * becomes the region), or a cuMemCreate file descriptor taken from process pid (pidfd_getfd). */
/* device_uuid non-empty: *device_index <- the index of that GPU here (INVALID_ARGUMENT when none
 * has it); empty: *device_index stays. */
/* Readiness for GPU work: CUDA is usable, with at least one GPU, none of them unhealthy. */
bool sc_region_gpus_healthy(struct sc_engine *eng);
int sc_region_gpu_by_uuid(struct sc_engine *eng, const char *device_uuid, uint32_t *device_index,
			  struct sc_err *err);
int sc_region_register_cuda_ipc(struct sc_engine *eng, uint32_t device_index,
				const uint8_t *handle, size_t handle_len, uint64_t offset,
				uint64_t size, const char *name, struct sc_region_info *out,
				struct sc_err *err);
/* declared_gdr: the worker says it allocated with allocFlags.gpuDirectRDMACapable = 1 (the
 * driver does not tell an importing process). */
int sc_region_register_cuda_fd(struct sc_engine *eng, uint32_t device_index, int pid, int fd,
			       uint64_t offset, uint64_t size, uint64_t allocation_size,
			       bool declared_gdr, const char *name, struct sc_region_info *out,
			       struct sc_err *err);
int sc_region_deregister(struct sc_engine *eng, const char *id, bool force, struct sc_err *err);
/* Copy bytes in or out of a region (WriteRegion / ReadRegion); GPU regions through pinned
 * staging. Bounds-checked. */
int sc_region_write(struct sc_engine *eng, const char *id, uint64_t offset, const void *data,
		    size_t len, struct sc_err *err);
int sc_region_read(struct sc_engine *eng, const char *id, uint64_t offset, void *buf, size_t len,
		   struct sc_err *err);
int sc_region_get(struct sc_engine *eng, const char *id, struct sc_region_info *out,
		  struct sc_err *err);

/* ---- operations ------------------------------------------------------------------------------ */

struct sc_desc {
	char region_id[SC_ID_MAX];
	uint64_t offset;
	uint64_t length;
};

struct sc_op_info {
	char id[SC_ID_MAX];
	enum sc_op_kind kind;
	enum sc_op_status status;
	enum sc_backend_kind backend;
	uint64_t bytes_total;
	uint64_t bytes_done;
	char *metadata; /* owned; passive operations: "rsm1." text; else NULL */
	enum sc_status err_code;
	char err_msg[SC_ERR_MSG_MAX];
	char peer[SC_NAME_MAX];
	uint64_t created_unix_ms;
	uint64_t deadline_unix_ms;
	uint64_t completed_unix_ms;
	char request_id[SC_NAME_MAX];
	char trace_id[SC_TRACE_ID_LEN]; /* W3C trace id (Operation.trace_id); "" when none yet */
	struct sc_desc *descs; /* owned; none for an operation created with omit_descs */
	size_t n_descs;
	char backend_reason[256];
	uint32_t uses_left; /* UINT32_MAX: any number until the deadline */
	uint64_t uses_done; /* passive: uses that completed */
	uint64_t bytes_served; /* passive: bytes all its uses moved together */
	/* Active and moving: the backend committed the transfer (struct sc_xfer.committed), so a
	 * cancel no longer cuts it; it ends COMPLETE, or ERRORED by its deadline. */
	bool committed;
	size_t desc_count; /* the operation's (expanded) descriptors, also when descs is omitted */
	/* Active operations: the rails that moved bytes, with how many (Operation.rails). */
	struct sc_op_rail {
		char rail[64];
		uint64_t bytes;
	} rails[SC_MAX_RAILS];
	size_t n_rails;
};
void sc_op_info_free(struct sc_op_info *info);
/* Deep copy; returns -1 on allocation failure. */
int sc_op_info_copy(struct sc_op_info *dst, const struct sc_op_info *src);

/* An operation's timeout_ms (passive or active) above this is clamped to it, not refused: an
 * operation lives at most 7 days, and a client's 2^64-1 ("forever") means that. */
#define SC_OP_TIMEOUT_MAX_MS (7ull * 24 * 3600 * 1000)

/* ListOperations: a page ends before its operations list more descriptors than this. */
#define SC_LIST_PAGE_DESCS 131072

struct sc_passive_req {
	const struct sc_desc *descs;
	size_t n_descs;
	uint64_t timeout_ms; /* 0 = --default-timeout; clamped to SC_OP_TIMEOUT_MAX_MS */
	const char *audience;
	uint32_t max_uses; /* 0 = 1 */
	bool any_uses;	   /* any number of uses until the deadline (max_uses ignored) */
	const char *request_id;
	/* The W3C trace id (32 hex digits) the caller's traceparent named; NULL/"": none, and the
	 * operation takes the trace id of the first transfer that uses it (the reader's). */
	const char *trace_id;
	/* Created from compact lists: snapshots (GetOperation, Wait, Watch, List) carry desc_count
	 * but not the expanded descriptors, which would repeat in every reply and progress update. */
	bool omit_descs;
};

struct sc_requirement {
	bool set;
	char request_id[SC_NAME_MAX];
	uint64_t iteration;
	bool has_layer;
	uint32_t layer;
};

/*
 * Running a small transfer on the calling thread. A caller that answers or waits for the
 * operation itself (the gRPC BeginRead/BeginWrite handler, a fast-path session) zeroes one on its
 * stack and passes it in sc_active_req.here; while sc_op_begin submits the transfer, a backend
 * may park in it the first task of a transfer that fits one request on an idle pooled connection
 * instead of handing it to a worker thread. Once the caller has answered (or before it waits for
 * the end) it calls sc_op_run_here(h), which runs that task on its thread (blocking for the
 * transfer: one round trip to the peer, at worst until its deadline). Every sc_op_begin given one
 * is followed by sc_op_run_here, whatever it returned.
 */
struct sc_run_here {
	struct sc_xr_here xr; /* backend/xfer_runner.h */
};

struct sc_active_req {
	const char *metadata;
	const struct sc_desc *descs;
	size_t n_descs;
	uint64_t timeout_ms;
	struct sc_requirement requirement;
	enum sc_backend_kind backend; /* NONE = fastest both sides have */
	const char *request_id;
	bool omit_descs; /* as in sc_passive_req */
	bool quiet;	 /* its start and end logged at debug, not info (the fast path's runs) */
	/* The W3C trace id (32 hex digits) the caller's traceparent named; NULL/"": a new one. It
	 * travels to the peer with the transfer (peer/proto.h OPEN). */
	const char *trace_id;
	/* The caller's offer to run a small transfer on its own thread (struct sc_run_here); NULL:
	 * none, every transfer goes to a backend's worker threads. */
	struct sc_run_here *here;
};

/* kind: SC_OP_READABLE or SC_OP_WRITABLE. */
int sc_op_create_passive(struct sc_engine *eng, enum sc_op_kind kind,
			 const struct sc_passive_req *req, struct sc_op_info *out, struct sc_err *err);
/* What sc_op_begin checks before the operation exists (kind, metadata, descriptors against it,
 * their regions and bounds), without creating one or using the metadata up: the fast path's
 * PREPARE. 0, or -1 with the same err as sc_op_begin would give. */
int sc_op_check_active(struct sc_engine *eng, enum sc_op_kind kind,
		       const struct sc_active_req *req, struct sc_err *err);
/* kind: SC_OP_READ or SC_OP_WRITE. Returns once the operation exists (SCHEDULED/IN_PROGRESS). */
int sc_op_begin(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_active_req *req,
		struct sc_op_info *out, struct sc_err *err);
/* Runs the transfer parked in h (struct sc_run_here, above), if any, on this thread, blocking
 * for it; with no engine lock held (never from inside a watcher). */
void sc_op_run_here(struct sc_run_here *h);
int sc_op_get(struct sc_engine *eng, const char *id, struct sc_op_info *out, struct sc_err *err);
int sc_op_cancel(struct sc_engine *eng, const char *id, struct sc_op_info *out,
		 struct sc_err *err);
int sc_op_release(struct sc_engine *eng, const char *id, struct sc_err *err);
/*
 * One page of ListOperations / ListRegions, ordered by id: up to `limit` entries whose id sorts
 * after `after` ("" = from the start). *more says whether entries remain past the page. *out is
 * malloc'd: free() it (operations: sc_op_info_free() each first); *n may be 0.
 */
int sc_op_list_page(struct sc_engine *eng, const char *after, size_t limit,
		    struct sc_op_info **out, size_t *n, bool *more, struct sc_err *err);
int sc_region_list_page(struct sc_engine *eng, const char *after, size_t limit,
			struct sc_region_info **out, size_t *n, bool *more, struct sc_err *err);

/*
 * Watch an operation. `fn` runs on an engine thread with the engine lock held, at every status
 * change and progress update: it must not block and must not call into the engine. It returns
 * false to stop watching. After it has seen a terminal status it is never called again (the
 * watch ends by itself). `first` receives the current state, taken atomically with registration.
 * *watch_id identifies the watch for sc_op_unwatch.
 */
typedef bool (*sc_op_watch_fn)(void *ctx, const struct sc_op_info *info);
int sc_op_watch(struct sc_engine *eng, const char *id, sc_op_watch_fn fn, void *ctx,
		uint64_t *watch_id, struct sc_op_info *first, struct sc_err *err);
/* Synchronous: when it returns, fn is not running and will not run again. Returns true if the
 * watch was still registered (false: it had already ended). Not from inside fn. */
bool sc_op_unwatch(struct sc_engine *eng, uint64_t watch_id);

/* ReportProgress: releases scheduled operations whose requirement is now met. */
int sc_progress_report(struct sc_engine *eng, const char *request_id, uint64_t iteration,
		       bool has_layer, uint32_t layer, bool iteration_complete, uint32_t *released,
		       struct sc_err *err);

/* ---- metadata bus (NATS) -------------------------------------------------------------------- */

struct sc_bus_event {
	const char *subject;
	const char *metadata;
	const char *issuer;
	enum sc_op_kind kind;
	const uint64_t *descriptor_lengths;
	size_t n_descriptors;
	uint64_t expires_unix_ms;
	/* Non-NULL: a message arrived on subject and was refused (why, with refused_code); the
	 * fields above but subject are unset. Handlers that only want metadata skip these. */
	const char *refused;
	enum sc_status refused_code;
};
/* Either op_id (a local passive operation) or metadata ("rsm1." text, verified first). */
int sc_bus_publish(struct sc_engine *eng, const char *subject, const char *op_id,
		   const char *metadata, struct sc_err *err);
/* fn runs on a NATS thread; it must not block. Only verified metadata reaches it as metadata;
 * refused messages come as events with `refused` set. With the JetStream hand-off the latest
 * stored message of every matching subject comes first (not for a queue group). */
typedef void (*sc_bus_event_fn)(void *ctx, const struct sc_bus_event *ev);
int sc_bus_subscribe(struct sc_engine *eng, const char *subject, const char *queue_group,
		     sc_bus_event_fn fn, void *ctx, uint64_t *sub_id, struct sc_err *err);
/* Synchronous: when it returns fn will not run again (from fn itself: returns at once). */
void sc_bus_unsubscribe(struct sc_engine *eng, uint64_t sub_id);
/* Unsubscribes soon, off the calling thread when that may take a NATS request (removing a
 * JetStream consumer waits up to the store's timeout while NATS does not answer), then calls
 * then(ctx) (may be NULL) on the thread that did. For the timer thread, which must not wait. */
void sc_bus_unsubscribe_later(struct sc_engine *eng, uint64_t sub_id, void (*then)(void *ctx),
			      void *ctx);
/* The JetStream stream that keeps published metadata; NULL with --nats-handoff core or no NATS. */
const char *sc_bus_store_name(struct sc_engine *eng);

/* ---- timers ---------------------------------------------------------------------------------- */

/* fn runs on the timer thread after delay_ms unless cancelled first. */
typedef void (*sc_timer_fn)(void *ctx);
uint64_t sc_engine_timer_add(struct sc_engine *eng, uint64_t delay_ms, sc_timer_fn fn, void *ctx);
/* Synchronous: when it returns fn is not running and will not run. Returns true if it was
 * cancelled before running. Not from inside fn. */
bool sc_engine_timer_cancel(struct sc_engine *eng, uint64_t timer_id);
/* Non-blocking: true if the timer was removed before it ran (fn will never run); usable
 * anywhere, including engine watcher callbacks. */
bool sc_engine_timer_try_cancel(struct sc_engine *eng, uint64_t timer_id);

/* Wall clock in unix ms, and a monotonic clock in ms (for deadlines). */
uint64_t sc_now_unix_ms(void);
uint64_t sc_now_mono_ms(void);

#endif
