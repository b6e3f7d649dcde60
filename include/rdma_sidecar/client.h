/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rdma_sidecar/client.h: the C client of the rdma-sidecar gRPC service (librdma-sidecar-client).
 *
 * One function per RPC of rdma_sidecar.v1.Sidecar (and grpc.health.v1.Health Check), with C types.
 * Build with `pkg-config --cflags --libs rdma-sidecar-client`.
 *
 * Objects. rsc_client is opaque: one gRPC channel to one sidecar. Create it with
 * rsc_client_create(), destroy it with rsc_client_destroy() (NULL is accepted). Output structs
 * (rsc_region, rsc_operation, rsc_info, lists) are filled by the library and own their strings
 * and arrays; free them with the matching rsc_*_clear() (safe on a zeroed or already cleared
 * struct). They are filled only when the call returns RSC_OK. ABI: a released struct never
 * changes size or layout (callers allocate them and index their arrays); what the service adds
 * later comes in new structs and calls (rsc_get_info_rails, rsc_operation_get_rails,
 * rsc_begin_read_traced, rsc_wait_metadata).
 *
 * Threads. A client may be used from any number of threads at once: every call runs on its own
 * gRPC call and completion queue, and blocks the calling thread until the answer (or its deadline).
 * Callbacks (watch, subscribe) run on the calling thread, inside the call.
 *
 * Errors. Every call returns a gRPC status code (0 = RSC_OK) and, when `st` is not NULL, fills it
 * with the same code and a message saying what was wrong and what to do. The codes are those
 * documented in proto/rdma_sidecar/v1/sidecar.proto; the client adds UNAVAILABLE (14) when the
 * sidecar cannot be reached, DEADLINE_EXCEEDED (4) when the call's own deadline passed and
 * INVALID_ARGUMENT (3) for bad arguments it can see itself. An operation's own failure (a transfer
 * that ERRORED) is not a call failure: compare rsc_operation.status and read
 * .error_code/.error_message.
 */
#ifndef RDMA_SIDECAR_CLIENT_H
#define RDMA_SIDECAR_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* gRPC status codes the calls return (same values as grpc_status_code). */
enum rsc_code {
	RSC_OK = 0,
	RSC_CANCELLED = 1,
	RSC_UNKNOWN = 2,
	RSC_INVALID_ARGUMENT = 3,
	RSC_DEADLINE_EXCEEDED = 4,
	RSC_NOT_FOUND = 5,
	RSC_ALREADY_EXISTS = 6,
	RSC_PERMISSION_DENIED = 7,
	RSC_RESOURCE_EXHAUSTED = 8,
	RSC_FAILED_PRECONDITION = 9,
	RSC_ABORTED = 10,
	RSC_OUT_OF_RANGE = 11,
	RSC_UNIMPLEMENTED = 12,
	RSC_INTERNAL = 13,
	RSC_UNAVAILABLE = 14,
	RSC_DATA_LOSS = 15,
	RSC_UNAUTHENTICATED = 16,
};

/* The result of a call: a gRPC status code and a message (empty on success). */
typedef struct rsc_status {
	int code;
	char message[512];
} rsc_status;

/* "OK", "NOT_FOUND", ... for a status code; never NULL. */
const char *rsc_code_name(int code);

/* Enums with the proto's values. */
enum rsc_device_kind { RSC_DEVICE_UNSPECIFIED = 0, RSC_DEVICE_HOST = 1, RSC_DEVICE_CUDA = 2 };
enum rsc_op_kind {
	RSC_KIND_UNSPECIFIED = 0,
	RSC_KIND_READABLE = 1,
	RSC_KIND_WRITABLE = 2,
	RSC_KIND_READ = 3,
	RSC_KIND_WRITE = 4,
};
enum rsc_op_status {
	RSC_STATUS_UNSPECIFIED = 0,
	RSC_STATUS_INITIALIZED = 1,
	RSC_STATUS_IN_PROGRESS = 2,
	RSC_STATUS_COMPLETE = 3,
	RSC_STATUS_CANCELLED = 4,
	RSC_STATUS_ERRORED = 5,
	RSC_STATUS_SCHEDULED = 6,
};
enum rsc_backend {
	RSC_BACKEND_UNSPECIFIED = 0,
	RSC_BACKEND_TCP = 1,
	RSC_BACKEND_IBVERBS = 2,
	RSC_BACKEND_LOCAL = 3,
	RSC_BACKEND_LIBFABRIC = 4
};

/* Lower-case names ("readable", "complete", "tcp"); never NULL. */
const char *rsc_op_kind_name(int kind);
const char *rsc_op_status_name(int status);
const char *rsc_backend_name(int backend);
/* Whether a status is COMPLETE, CANCELLED or ERRORED. */
int rsc_op_status_terminal(int status);

/* ---- connecting ------------------------------------------------------------------------------ */

typedef struct rsc_client rsc_client;

typedef struct rsc_options {
	/* "unix:/path/to/sidecar.sock" or "host:port"; NULL =
	 * "unix:/tmp/rdma-sidecar/sidecar.sock". */
	const char *target;
	/* TLS: set tls_ca_file (PEM roots that sign the server's certificate) to use TLS; add
	 * tls_cert_file + tls_key_file for mutual TLS. tls_server_name overrides the name checked
	 * against the server's certificate. All NULL: plaintext (insecure credentials). */
	const char *tls_ca_file;
	const char *tls_cert_file;
	const char *tls_key_file;
	const char *tls_server_name;
	/* Deadline of each unary call, in ms; 0 = 30000. rsc_operation_wait's deadline is its own
	 * timeout plus 30 s; streams (watch, subscribe) use the timeout given to them. */
	uint32_t call_timeout_ms;
} rsc_options;

/* Creates a client (no connection is made yet: the first call or rsc_client_connect does).
 * *out is set only on RSC_OK. opts may be NULL (defaults). */
int rsc_client_create(const rsc_options *opts, rsc_client **out, rsc_status *st);
/* Waits up to timeout_ms (0 = 5000) for the connection to be ready; RSC_UNAVAILABLE (naming the
 * target) as soon as a connection attempt fails or the time is up. Optional: every call connects
 * by itself (and fails with RSC_UNAVAILABLE at once when it cannot). */
int rsc_client_connect(rsc_client *c, uint32_t timeout_ms, rsc_status *st);
/* Waits up to timeout_ms for a sidecar that may not be up yet (a worker that starts before its
 * sidecar): failed connection attempts are retried (at most 1 s apart) until the sidecar answers
 * or the time is up. RSC_OK once connected; RSC_UNAVAILABLE when the time passes, the message
 * naming the target and how long it waited. timeout_ms 0 checks once. Environment: the
 * library reads none; rdma-sidecar-ctl takes --wait or RDMA_SIDECAR_WAIT_FOR_READY (seconds). */
int rsc_client_wait_ready(rsc_client *c, uint32_t timeout_ms, rsc_status *st);
/* The target the client was created with (owned by the client). */
const char *rsc_client_target(const rsc_client *c);
/* Closes the channel. No call may be running on c. NULL is accepted. */
void rsc_client_destroy(rsc_client *c);

/* ---- info and health ------------------------------------------------------------------------- */

typedef struct rsc_backend_info {
	int backend; /* enum rsc_backend */
	int available;
	char *detail;
} rsc_backend_info;

typedef struct rsc_gpu_info {
	uint32_t index;
	char *name;
	char *pci_bus_id;
	uint64_t total_memory;
	char *rdma_path;
} rsc_gpu_info;

typedef struct rsc_info {
	char *sidecar_id;
	char *version;
	size_t n_backends;
	rsc_backend_info *backends;
	size_t n_data_endpoints;
	char **data_endpoints;
	char *nats_state;
	size_t n_grpc_listeners;
	char **grpc_listeners;
	int signing_enabled;
	char *signing_key_id;
	int cuda_available;
	char *cuda_detail;
	size_t n_gpus;
	rsc_gpu_info *gpus;
} rsc_info;

int rsc_get_info(rsc_client *c, rsc_info *out, rsc_status *st);
void rsc_info_clear(rsc_info *info);

/*
 * Rails and topology (SidecarInfo.rails, .topology, .topology_source). rsc_info keeps its size
 * (programs built against an earlier header still work), so they come in their own struct, from
 * the same GetInfo round trip.
 */

/* A rail: one path of the data plane (an RDMA port "device:port", or a TCP data endpoint). */
typedef struct rsc_rail_info {
	uint32_t index; /* among its backend's rails; metadata names rails by it */
	int backend;	/* enum rsc_backend */
	char *name;
	char *pci_address;  /* "0000:17:00.0"; "" when unknown */
	int32_t numa_node;  /* -1: unknown */
	uint64_t rate_mbps; /* link rate, Mb/s; 0: unknown */
	char *state;	    /* "up", "down", "cooling", "unusable", "excluded", "absent" */
	char *detail;	    /* what it is, or why it is not up */
	char *netdev;	    /* the network interface under it, "" when unknown */
	uint64_t bytes;
	uint64_t operations;
	uint64_t errors;
	uint64_t failovers;
} rsc_rail_info;

/* How one rail stands from a piece of memory: distance is NCCL's class ("PIX", "PXB", "PHB",
 * "NODE", "SYS", "UNKNOWN"). */
typedef struct rsc_rail_distance {
	char *rail;
	char *distance;
} rsc_rail_distance;

/* The rails that carry one GPU's memory ("gpu 0") or one NUMA node's host memory ("numa 1"). */
typedef struct rsc_memory_rails {
	char *memory;
	int32_t gpu_index; /* -1 for host memory rows */
	char *pci_address; /* the GPU's PCI bus id; "" for host memory rows */
	int32_t numa_node; /* -1: unknown */
	size_t n_rails;	   /* every rail, nearest first */
	rsc_rail_distance *rails;
	size_t n_chosen; /* the rails this memory goes through */
	char **chosen;
} rsc_memory_rails;

typedef struct rsc_info_rails {
	size_t n_rails;
	rsc_rail_info *rails;
	size_t n_topology;
	rsc_memory_rails *topology;
	char *topology_source; /* "sysfs", an XML file's path, or why there is none */
} rsc_info_rails;

/* GetInfo, keeping its rails and topology in *rails and, when info is not NULL, the rest in
 * *info (as rsc_get_info). Both are filled only on RSC_OK; clear each with its own function. */
int rsc_get_info_rails(rsc_client *c, rsc_info *info, rsc_info_rails *rails, rsc_status *st);
void rsc_info_rails_clear(rsc_info_rails *rails);

/* The sidecar's process limits (SidecarInfo.open_files_limit, .memlock_*), in their own struct
 * for the same reason. Limits of 2^64-1 mean unlimited. */
typedef struct rsc_info_limits {
	uint64_t open_files_limit;
	uint64_t memlock_limit;	 /* soft RLIMIT_MEMLOCK, bytes */
	uint64_t memlock_needed; /* what RDMA may pin; 0: no RDMA backend available */
	int memlock_enough;	 /* the limit covers it (or CAP_IPC_LOCK lifts it) */
	char *memlock_detail;	 /* one line: the figures, and what to raise when not enough */
} rsc_info_limits;

/* GetInfo's limits into *out (filled only on RSC_OK; rsc_info_limits_clear frees it). */
int rsc_get_info_limits(rsc_client *c, rsc_info_limits *out, rsc_status *st);
void rsc_info_limits_clear(rsc_info_limits *out);

/* grpc.health.v1.Health/Check. service: NULL or "" for the whole server. *serving gets the
 * HealthCheckResponse status (1 = SERVING, 2 = NOT_SERVING). */
int rsc_health_check(rsc_client *c, const char *service, int *serving, rsc_status *st);

/* ---- regions --------------------------------------------------------------------------------- */

typedef struct rsc_region {
	char *region_id;
	int device_kind; /* enum rsc_device_kind */
	uint32_t device_index;
	uint64_t size;
	char *path; /* HOST: the file to map (see rsc_region_map) */
	uint64_t file_offset;
	char *name;
	uint32_t live_operations;
} rsc_region;

typedef struct rsc_region_list {
	size_t count;
	rsc_region *items;
} rsc_region_list;

/* A HOST region of `size` bytes allocated by the sidecar (a file under its --shm-dir). */
int rsc_region_create(rsc_client *c, uint64_t size, const char *name, rsc_region *out,
		      rsc_status *st);
/* A HOST region over [offset, offset+size) of a file the sidecar can open read-write. */
int rsc_region_register_host_file(rsc_client *c, const char *path, uint64_t offset, uint64_t size,
				  const char *name, rsc_region *out, rsc_status *st);
/* force: cancel the live operations that use it instead of failing with FAILED_PRECONDITION. */
int rsc_region_deregister(rsc_client *c, const char *region_id, int force, rsc_status *st);
int rsc_region_list_get(rsc_client *c, rsc_region_list *out, rsc_status *st);
/* Streams len bytes into the region at offset (WriteRegion), for callers that cannot map it. */
int rsc_region_write(rsc_client *c, const char *region_id, uint64_t offset, const void *data,
		     size_t len, rsc_status *st);
/* Reads len bytes from offset into buf (ReadRegion); *got = the bytes received. */
int rsc_region_read(rsc_client *c, const char *region_id, uint64_t offset, void *buf, size_t len,
		    size_t *got, rsc_status *st);
void rsc_region_clear(rsc_region *r);
void rsc_region_list_clear(rsc_region_list *l);

/* Maps a HOST region's file into this process (MAP_SHARED, read-write): *addr covers the
 * region's `size` bytes. Needs the region's path to be visible here (the shared /dev/shm).
 * Unmap with rsc_region_unmap(addr, region->size). */
int rsc_region_map(const rsc_region *r, void **addr, rsc_status *st);
void rsc_region_unmap(void *addr, uint64_t size);

/* ---- operations ------------------------------------------------------------------------------ */

/* A range of a region. In outputs, region_id is owned by the enclosing struct. */
typedef struct rsc_descriptor {
	const char *region_id;
	uint64_t offset;
	uint64_t length;
} rsc_descriptor;

typedef struct rsc_operation {
	char *operation_id;
	int kind;    /* enum rsc_op_kind */
	int status;  /* enum rsc_op_status */
	int backend; /* enum rsc_backend */
	uint64_t bytes_total;
	uint64_t bytes_done;
	char *metadata; /* passive operations: the "rsm1." text to hand to the peer */
	int error_code; /* gRPC code of the failure when ERRORED or CANCELLED, else 0 */
	char *error_message;
	char *peer;
	uint64_t created_unix_ms;
	uint64_t deadline_unix_ms;
	uint64_t completed_unix_ms;
	char *request_id;
	size_t n_descriptors;
	rsc_descriptor *descriptors;
	char *backend_reason;
	uint32_t uses_left;
	/* The W3C trace id (32 hex digits) that ties the operation's log lines on both sidecars
	 * together; "" when it has none (yet). */
	char *trace_id;
} rsc_operation;

typedef struct rsc_operation_list {
	size_t count;
	rsc_operation *items;
} rsc_operation_list;

/* CreateReadable / CreateWritable. */
typedef struct rsc_passive_args {
	const rsc_descriptor *descriptors;
	size_t n_descriptors;
	uint64_t timeout_ms;  /* lifetime; 0 = the sidecar's --default-timeout */
	const char *audience; /* NULL: any sidecar holding a cluster key */
	uint32_t max_uses;    /* 0 = 1 */
	const char *request_id;
} rsc_passive_args;

/* BeginRead / BeginWrite. */
typedef struct rsc_transfer_args {
	const char *metadata; /* "rsm1." text from the remote passive operation */
	const rsc_descriptor *descriptors;
	size_t n_descriptors;
	uint64_t timeout_ms; /* 0 = the sidecar's --default-timeout */
	int backend;	     /* enum rsc_backend; 0 = the fastest both sides offer */
	const char *request_id;
	/* Optional gate (ReportProgress): set has_requirement. */
	int has_requirement;
	const char *req_request_id;
	uint64_t req_iteration;
	int req_has_layer;
	uint32_t req_layer;
} rsc_transfer_args;

int rsc_create_readable(rsc_client *c, const rsc_passive_args *a, rsc_operation *out,
			rsc_status *st);
int rsc_create_writable(rsc_client *c, const rsc_passive_args *a, rsc_operation *out,
			rsc_status *st);
/* Return at once (SCHEDULED or IN_PROGRESS); wait with rsc_operation_wait. */
int rsc_begin_read(rsc_client *c, const rsc_transfer_args *a, rsc_operation *out, rsc_status *st);
int rsc_begin_write(rsc_client *c, const rsc_transfer_args *a, rsc_operation *out, rsc_status *st);

/*
 * Compact descriptor lists (KV-cache layouts; sidecar.proto BlockList / StridedRun). The *_sets
 * calls take the same arguments plus `sets`, expanded in order after a->descriptors (which may be
 * empty); the two sides of a transfer may use different forms as long as the expanded counts and
 * lengths match. An operation created with sets reports no descriptors (n_descriptors 0): its list
 * is what the sets expand to.
 */
typedef struct rsc_block_list {
	const char *const *region_ids; /* one per layer tensor, in order */
	size_t n_region_ids;
	uint64_t block_length;
	/* Exactly one of: byte offsets in each region, or block ids with
	 * offset = base_offset + id * block_stride (block_stride 0 = block_length). */
	const uint64_t *offsets;
	size_t n_offsets;
	const uint64_t *block_ids;
	size_t n_block_ids;
	uint64_t block_stride;
	uint64_t base_offset;
} rsc_block_list;

typedef struct rsc_strided_run {
	const char *region_id;
	uint64_t offset;
	uint64_t stride;
	uint32_t count;
	uint64_t length;
} rsc_strided_run;

enum rsc_set_kind { RSC_SET_DESCRIPTOR = 1, RSC_SET_BLOCK_LIST = 2, RSC_SET_STRIDED_RUN = 3 };

typedef struct rsc_descriptor_set {
	int kind; /* enum rsc_set_kind: which member is used */
	rsc_descriptor descriptor;
	rsc_block_list block_list;
	rsc_strided_run strided_run;
} rsc_descriptor_set;

int rsc_create_readable_sets(rsc_client *c, const rsc_passive_args *a,
			     const rsc_descriptor_set *sets, size_t n_sets, rsc_operation *out,
			     rsc_status *st);
int rsc_create_writable_sets(rsc_client *c, const rsc_passive_args *a,
			     const rsc_descriptor_set *sets, size_t n_sets, rsc_operation *out,
			     rsc_status *st);
int rsc_begin_read_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			size_t n_sets, rsc_operation *out, rsc_status *st);
int rsc_begin_write_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			 size_t n_sets, rsc_operation *out, rsc_status *st);
/* One round trip to the final state (as rsc_read / rsc_write), with sets. */
int rsc_read_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		  size_t n_sets, uint64_t timeout_ms, rsc_operation *out, rsc_status *st);
int rsc_write_sets(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		   size_t n_sets, uint64_t timeout_ms, rsc_operation *out, rsc_status *st);

int rsc_operation_get(rsc_client *c, const char *operation_id, rsc_operation *out, rsc_status *st);
/* Returns when the operation is terminal or after timeout_ms (then still RSC_OK: compare status).
 */
int rsc_operation_wait(rsc_client *c, const char *operation_id, uint64_t timeout_ms,
		       rsc_operation *out, rsc_status *st);
/* WatchOperation: cb gets the current state, then every change, until the terminal state (then
 * RSC_OK). cb returns 0 to go on, non-zero to stop (then RSC_CANCELLED). timeout_ms bounds the
 * whole stream (0 = no bound; at the bound RSC_DEADLINE_EXCEEDED). The rsc_operation passed to cb
 * lives only during the callback. */
typedef int (*rsc_operation_cb)(const rsc_operation *op, void *user);
int rsc_operation_watch(rsc_client *c, const char *operation_id, rsc_operation_cb cb, void *user,
			uint64_t timeout_ms, rsc_status *st);
/* CancelOperation: answers once the operation is terminal, i.e. once the sidecar no longer touches
 * its memory; *out is then its final state (COMPLETE when the cancel came too late). Answers
 * within the sidecar's --cancel-wait (1 s): a committed transfer (the peer was told it succeeded),
 * or one whose backend has not stopped by then, gives RSC_FAILED_PRECONDITION with a message
 * saying how and by when it ends (rsc_operation_wait tells when). */
int rsc_operation_cancel(rsc_client *c, const char *operation_id, rsc_operation *out,
			 rsc_status *st);
int rsc_operation_release(rsc_client *c, const char *operation_id, rsc_status *st);
int rsc_operation_list_get(rsc_client *c, rsc_operation_list *out, rsc_status *st);
void rsc_operation_clear(rsc_operation *op);
void rsc_operation_list_clear(rsc_operation_list *l);

/* Operation.rails: the bytes each rail moved for an active operation (empty until bytes move,
 * and for LOCAL). rsc_operation keeps its size, so they come from their own call:
 * rsc_operation_get_rails is rsc_operation_get (out may be NULL) that also fills *rails. */
typedef struct rsc_rail_usage {
	char *rail;
	uint64_t bytes;
} rsc_rail_usage;

typedef struct rsc_rail_usage_list {
	size_t count;
	rsc_rail_usage *items;
} rsc_rail_usage_list;

int rsc_operation_get_rails(rsc_client *c, const char *operation_id, rsc_operation *out,
			    rsc_rail_usage_list *rails, rsc_status *st);
void rsc_rail_usage_list_clear(rsc_rail_usage_list *l);

/* Begin and wait in one round trip (BeginTransferRequest.wait): *out is the final state
 * (COMPLETE, CANCELLED or ERRORED: a failed transfer is RSC_OK with out->status ERRORED). When
 * timeout_ms (0 = 30000) passes first the call fails with RSC_DEADLINE_EXCEEDED and the operation
 * goes on in the sidecar (find it with rsc_operation_list_get). */
int rsc_read(rsc_client *c, const rsc_transfer_args *a, uint64_t timeout_ms, rsc_operation *out,
	     rsc_status *st);
int rsc_write(rsc_client *c, const rsc_transfer_args *a, uint64_t timeout_ms, rsc_operation *out,
	      rsc_status *st);

/*
 * Trace context (docs/operations/logs.md). An operation's trace id ties its log lines on both
 * sidecars together; it comes from a W3C traceparent "00-<32 hex trace id>-<16 hex parent id>-
 * <2 hex flags>" given by the caller (sent as CreatePassiveRequest/BeginTransferRequest
 * .traceparent), else BeginRead/BeginWrite make a new one. The *_traced calls are the calls above
 * with sets (NULL, 0 for none) and a traceparent (NULL or "": none); the argument structs keep
 * their size. A malformed traceparent fails with RSC_INVALID_ARGUMENT (the sidecar's message).
 * rsc_operation.trace_id says which trace id the operation carries.
 */
#define RSC_TRACEPARENT_SIZE 56 /* 55 characters and the NUL */
/* A new traceparent (random trace and parent ids, flags 01) into buf; returns buf. */
char *rsc_traceparent_new(char buf[RSC_TRACEPARENT_SIZE]);
int rsc_create_readable_traced(rsc_client *c, const rsc_passive_args *a,
			       const rsc_descriptor_set *sets, size_t n_sets,
			       const char *traceparent, rsc_operation *out, rsc_status *st);
int rsc_create_writable_traced(rsc_client *c, const rsc_passive_args *a,
			       const rsc_descriptor_set *sets, size_t n_sets,
			       const char *traceparent, rsc_operation *out, rsc_status *st);
int rsc_begin_read_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
			  size_t n_sets, const char *traceparent, rsc_operation *out,
			  rsc_status *st);
int rsc_begin_write_traced(rsc_client *c, const rsc_transfer_args *a,
			   const rsc_descriptor_set *sets, size_t n_sets, const char *traceparent,
			   rsc_operation *out, rsc_status *st);
/* One round trip to the final state, as rsc_read / rsc_write (timeout_ms 0 = 30000). */
int rsc_read_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		    size_t n_sets, uint64_t timeout_ms, const char *traceparent, rsc_operation *out,
		    rsc_status *st);
int rsc_write_traced(rsc_client *c, const rsc_transfer_args *a, const rsc_descriptor_set *sets,
		     size_t n_sets, uint64_t timeout_ms, const char *traceparent,
		     rsc_operation *out, rsc_status *st);

/* Lengths of the descriptors a "rsm1." text carries (what a reader must allocate), decoded
 * locally without checking the signature (the sidecar checks it). *lengths is malloc'd: free(). */
int rsc_metadata_lengths(const char *metadata, uint64_t **lengths, size_t *n, int *kind,
			 rsc_status *st);

/* ---- peers ----------------------------------------------------------------------------------- */

/* One data path to a peer, as ConnectPeer set it up. */
typedef struct rsc_peer_path {
	int backend; /* enum rsc_backend */
	int ready;
	char *detail;	     /* what was set up, or why not */
	uint64_t elapsed_us; /* how long it took (0 when it was warm already) */
} rsc_peer_path;

typedef struct rsc_peer_connection {
	char *peer; /* the issuer's sidecar id */
	size_t n_paths;
	rsc_peer_path *paths;
} rsc_peer_connection;

/* ConnectPeer: opens the connections to the sidecar that issued `metadata` ("rsm1." text, checked
 * but not used up) before the first transfer, on every backend both sides offer. timeout_ms
 * bounds the setup (0 = the sidecar's 10 s). A backend that could not connect is RSC_OK with
 * ready 0 and its detail; bad, expired or foreign metadata fails the call (INVALID_ARGUMENT,
 * FAILED_PRECONDITION, ...) with the sidecar's message. Free *out with
 * rsc_peer_connection_clear. */
int rsc_connect_peer(rsc_client *c, const char *metadata, uint64_t timeout_ms,
		     rsc_peer_connection *out, rsc_status *st);
void rsc_peer_connection_clear(rsc_peer_connection *p);

/* ---- NATS metadata exchange and progress ----------------------------------------------------- */

/* Publishes a passive operation's metadata on a NATS subject. */
int rsc_publish(rsc_client *c, const char *subject, const char *operation_id, rsc_status *st);
/* Publishes "rsm1." text as is (the sidecar verifies it first). */
int rsc_publish_metadata(rsc_client *c, const char *subject, const char *metadata, rsc_status *st);

typedef struct rsc_metadata_event {
	const char *subject;
	const char *metadata;
	const char *issuer;
	int kind; /* enum rsc_op_kind */
	size_t n_lengths;
	const uint64_t *descriptor_lengths;
	uint64_t expires_unix_ms;
} rsc_metadata_event;

/* SubscribeMetadata: cb gets each verified event (valid only during the callback) and returns 0
 * to go on or non-zero to stop; stopping returns RSC_OK. timeout_ms bounds the subscription
 * (0 = until cb stops it or the sidecar ends it); reaching it returns RSC_DEADLINE_EXCEEDED.
 * queue_group may be NULL. */
typedef int (*rsc_metadata_cb)(const rsc_metadata_event *ev, void *user);
int rsc_subscribe(rsc_client *c, const char *subject, const char *queue_group, rsc_metadata_cb cb,
		  void *user, uint64_t timeout_ms, rsc_status *st);
/* rsc_subscribe, and ready(user) runs once (on this thread, before any event) when the sidecar's
 * NATS subscription is in place: from then on, a publish on the subject is delivered. It does not
 * run when the subscription fails. ready may be NULL. */
int rsc_subscribe_ready(rsc_client *c, const char *subject, const char *queue_group,
			void (*ready)(void *user), rsc_metadata_cb cb, void *user,
			uint64_t timeout_ms, rsc_status *st);

/* WaitMetadata: the first verified metadata on `subject` (wildcards allowed), whether it was
 * published before this call (the JetStream hand-off keeps it until the operation ends or expires)
 * or during it, so the two workers of a hand-off may start in any order. timeout_ms 0 = 30000
 * (at most 24 h); the call's own deadline is timeout_ms plus the client's call timeout.
 * *out (filled only on RSC_OK) owns its strings and lengths: free it with
 * rsc_metadata_event_clear. Errors: RSC_DEADLINE_EXCEEDED when nothing valid came in time (the
 * message names the subject and whether anything was stored); the refusal's own code
 * (RSC_UNAUTHENTICATED, RSC_FAILED_PRECONDITION, ...) when only refused metadata came (tampered or
 * expired); RSC_PERMISSION_DENIED outside the sidecar's --nats-subject-prefix;
 * RSC_FAILED_PRECONDITION when the sidecar has no NATS (or no JetStream). */
int rsc_wait_metadata(rsc_client *c, const char *subject, uint64_t timeout_ms,
		      rsc_metadata_event *out, rsc_status *st);
/* Frees what rsc_wait_metadata put in *ev and zeroes it (safe on a zeroed or cleared struct;
 * never on the events subscribe callbacks get). */
void rsc_metadata_event_clear(rsc_metadata_event *ev);

/* ReportProgress; *released (may be NULL) = scheduled operations released. */
int rsc_report_progress(rsc_client *c, const char *request_id, uint64_t iteration, int has_layer,
			uint32_t layer, int iteration_complete, uint32_t *released, rsc_status *st);


/* ---- fast path (shared-memory rings beside gRPC; rdma_sidecar/fast_ring.h) ---------------------
 *
 * For a small READ or WRITE repeated many times: prepare it once (the peer's metadata, whose
 * passive operation accepts many uses, and the local descriptors), then run it by handle. A run
 * is a 64-byte entry in a ring the sidecar shares with this process and a doorbell, not a gRPC
 * call; no operation id is kept (the sidecar releases each run's operation when it ends).
 *
 * rsc_fast_open connects to the sidecar's fast-path socket. When the sidecar offers none (it runs
 * with --fast-path-socket off, an older version, or the client's target is not a unix socket),
 * the handle still works in "grpc" mode: each run is one rsc_read/rsc_write, with the same
 * results. rsc_fast_mode says which. A rsc_fast is for one thread at a time.
 */
typedef struct rsc_fast rsc_fast;

typedef struct rsc_fast_options {
	/* The fast-path socket; NULL = the client's unix target + ".fast". */
	const char *socket_path;
	/* Poll for a completion this long before sleeping on the doorbell. 0: 50 us where the
	 * process may run on 4 CPUs or more, else none (a poller with fewer CPUs takes the one the
	 * sidecar needs to finish the run). UINT32_MAX: never poll. */
	uint32_t spin_us;
	/* 1: fail with RSC_UNAVAILABLE instead of falling back to gRPC. */
	int require_ring;
} rsc_fast_options;

/* The end of one run. code 0: COMPLETE; otherwise the gRPC code of the failure (the run was
 * refused, or the transfer ended CANCELLED or ERRORED: see status) and message says why. */
typedef struct rsc_fast_completion {
	uint64_t user_data;
	int code;
	int status;  /* enum rsc_op_status; 0: refused before a transfer began */
	int backend; /* enum rsc_backend */
	uint64_t bytes;
	char message[512];
} rsc_fast_completion;

/* *out is set only on RSC_OK. opts may be NULL (defaults). */
int rsc_fast_open(rsc_client *c, const rsc_fast_options *opts, rsc_fast **out, rsc_status *st);
/* Ends the session: runs still in flight are cancelled. NULL is accepted. */
void rsc_fast_close(rsc_fast *f);
/* "ring" or "grpc". */
const char *rsc_fast_mode(const rsc_fast *f);
/* kind: RSC_KIND_READ or RSC_KIND_WRITE; a: as rsc_read/rsc_write take (no requirement, no
 * sets). *handle (never 0) names it until rsc_fast_unprepare or close. Checks the descriptors
 * against the metadata once, here. */
int rsc_fast_prepare(rsc_fast *f, int kind, const rsc_transfer_args *a, uint32_t *handle,
		     rsc_status *st);
int rsc_fast_unprepare(rsc_fast *f, uint32_t handle, rsc_status *st);
/* Runs handle once and waits for its end (timeout_ms 0: the handle's). RSC_OK when the run ended
 * (compare out->code); a call failure (RSC_UNAVAILABLE: the session ended) otherwise. */
int rsc_fast_run(rsc_fast *f, uint32_t handle, uint64_t timeout_ms, rsc_fast_completion *out,
		 rsc_status *st);
/* Queues a run without waiting (RSC_RESOURCE_EXHAUSTED while the ring is full: reap first). */
int rsc_fast_submit(rsc_fast *f, uint32_t handle, uint64_t user_data, uint64_t timeout_ms,
		    rsc_status *st);
/* Asks the sidecar to cancel the run submitted with user_data; its completion says how it ended.
 * The cancel's own completion (code 0, or NOT_FOUND when no such run is in flight) carries
 * cancel_user_data. */
int rsc_fast_cancel(rsc_fast *f, uint64_t user_data, uint64_t cancel_user_data, rsc_status *st);
/* Waits up to timeout_ms for at least one completion and returns up to max of them in out[];
 * *n = how many (0 at the timeout, still RSC_OK). */
int rsc_fast_reap(rsc_fast *f, rsc_fast_completion *out, size_t max, size_t *n,
		  uint64_t timeout_ms, rsc_status *st);

#ifdef __cplusplus
}
#endif
#endif
