/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/metrics.h: the engine's counters and the Prometheus endpoint of --metrics-listen.
 *
 * The engine owns one struct sc_metrics (eng->metrics). Counters are C11 atomics: the
 * sc_metrics_op_* calls are lock-free and safe from any thread, with or without eng->mu held.
 * Gauges (live operations, regions, scheduler) are not stored here: a scrape reads them from the
 * engine's tables under eng->mu, so it must never be called with eng->mu held (it is not: scrapes
 * run on libmicrohttpd's own thread).
 *
 * The HTTP server answers GET (and HEAD) /metrics with the text exposition format 0.0.4 and
 * /healthz with 200 "ok" (503 "draining" once sc_engine_begin_drain ran); other paths 404, other
 * methods 405. Errors: -1 with struct sc_err filled.
 */
#ifndef SC_METRICS_H
#define SC_METRICS_H

#include "meta/metadata.h"
#include "nats/client.h"
#include "peer/server.h"
#include "base/types.h"
#include "base/status.h"

#include <stdint.h>

struct sc_gpu;
struct sc_metrics;

/* The gauges, read at scrape time: a snapshot the source fills. */
#define SC_METRICS_MAX_RAILS 32 /* = SC_INFO_MAX_RAILS */
struct sc_gauges {
	uint64_t live[SC_OP_WRITE + 1]; /* by enum sc_op_kind: operations not yet terminal */
	uint64_t waiting_progress;      /* scheduled, waiting for another operation's progress */
	uint64_t queued;
	uint64_t progress_records; /* ReportProgress records kept (--max-progress-records) */
	uint64_t regions;
	uint64_t region_bytes;
	uint64_t active_transfers;
	uint64_t inflight_bytes;
	bool draining;
	bool available[SC_NUM_BACKENDS];
	/* The certificates this sidecar presents: use "peer" (--peer-tls-cert) or "grpc"
	 * (--grpc-tls-cert), serial in hex, notAfter in unix seconds. */
	struct sc_cert_gauge {
		const char *use;
		char serial[80];
		int64_t not_after;
	} certs[2];
	size_t n_certs;
	uint64_t peers_evicted; /* idle peer connections closed to admit a new peer (a counter) */
	struct sc_peer_server_load peer_load; /* peer connections and the pool's threads now */
	/* ibverbs incoming QPs (counters): destroyed to admit a new peer at --ib-max-qps, expired
	 * after idling, peers refused because every QP was in use. */
	uint64_t ib_qps_evicted, ib_qps_expired, ib_qps_refused;
	uint64_t ofi_keys_granted, ofi_keys_revoked, ofi_addrs_inserted, ofi_addrs_evicted;
	uint64_t fast_events[SC_FAST_EVENTS]; /* the fast path's counters (enum sc_fast_event) */
	struct sc_rail_entry rails[SC_METRICS_MAX_RAILS]; /* every backend's rails */
	size_t n_rails;
	/* NATS: "disabled" (no --nats-url), else sc_nats_bus_state's; the connection's counters. */
	const char *nats_state;
	struct sc_nats_bus_stats nats;
};

/* What the metrics read from their owner (the engine), handed in at creation: the sidecar id
 * and GPUs for the info labels, and the gauges. Both callbacks run on the scrape thread. */
struct sc_metrics_source {
	const char *id;
	struct sc_gpu *gpu;
	void (*read_gauges)(void *ctx, struct sc_gauges *g);
	bool (*draining)(void *ctx);
	void *ctx;
};

/*
 * Allocate the counters. When listen is a HOST:PORT (IPv4, a hostname or [V6]; port 0 picks one)
 * the socket is bound and listening when this returns, so a port in use fails here, with a message
 * naming --metrics-listen. listen NULL or "" serves nothing. *out is set only on success.
 */
int sc_metrics_create(const struct sc_metrics_source *src, const char *listen,
		      struct sc_metrics **out, struct sc_err *err);
/* Start serving on libmicrohttpd's internal thread (nothing to do when not listening). */
int sc_metrics_start(struct sc_metrics *m, struct sc_err *err);
/* Stop serving: when it returns no scrape runs or will run. Idempotent; NULL ok. Never call it
 * with a lock the source's callbacks take. */
void sc_metrics_stop(struct sc_metrics *m);
/* Stops serving if needed, closes the socket, frees the counters. NULL ok. */
void sc_metrics_destroy(struct sc_metrics *m);

/* An operation entered the table (one per created operation). NULL ok. */
void sc_metrics_op_created(struct sc_metrics *m, enum sc_op_kind kind);
/*
 * An operation reached its terminal status (exactly once per operation). Completed READ/WRITE
 * operations also add bytes to the bytes moved by their direction and backend. NULL ok.
 */
void sc_metrics_op_finished(struct sc_metrics *m, enum sc_op_kind kind, enum sc_op_status status,
			    enum sc_backend_kind backend, uint64_t bytes);

/* A monotonic clock in nanoseconds, for transfer timings. */
uint64_t sc_metrics_clock_ns(void);
/* A READ or WRITE completed: observe its size and how long it held its transfer slot in the
 * rdma_sidecar_transfer_{duration_seconds,size_bytes} histograms. NULL ok. */
void sc_metrics_transfer_done(struct sc_metrics *m, enum sc_op_kind kind,
			      enum sc_backend_kind backend, uint64_t bytes, uint64_t ns);

/* Where refused metadata came from: BeginRead/BeginWrite, or the NATS bus (publish/receive). */
enum sc_md_source { SC_MD_SOURCE_BEGIN, SC_MD_SOURCE_BUS, SC_MD_NUM_SOURCES };
/* Metadata verification refused metadata (rdma_sidecar_metadata_rejected_total). NULL ok. */
void sc_metrics_metadata_rejected(struct sc_metrics *m, enum sc_md_source source,
				  enum sc_md_reject why);

/* ---- the gRPC layer's calls (grpc_server_* families) ---------------------------------------- */

#define SC_METRICS_MAX_METHODS 48
/* Name the methods once, before serving: paths[i] ("/package.Service/Method", a string that lives
 * as long as the metrics) of kind types[i] ("unary", "client_stream", "server_stream",
 * "bidi_stream") is method index i below; indexes >= n (an unknown method) count as
 * grpc_service="unknown". At most SC_METRICS_MAX_METHODS are kept. Main thread. */
void sc_metrics_grpc_methods(struct sc_metrics *m, const char *const *paths,
			     const char *const *types, size_t n);
/* A call of method index `method` arrived (grpc_server_started_total). Any thread; NULL ok. */
void sc_metrics_grpc_started(struct sc_metrics *m, size_t method);
/* It ended with gRPC status `code` (0-16) after ns since its arrival
 * (grpc_server_handled_total, grpc_server_handling_seconds). Any thread; NULL ok. */
void sc_metrics_grpc_handled(struct sc_metrics *m, size_t method, int code, uint64_t ns);

/* Why an active operation moved to a slower backend than a configured faster one
 * (rdma_sidecar_backend_fallbacks_total{from,to,reason}): the faster one is usable here but the
 * issuer does not offer it (peer_lacks), is configured but unusable here (unavailable), cannot
 * reach the local GPU memory (gpu_unreachable), or failed during the transfer
 * (failed_mid_transfer). */
enum sc_fallback_reason {
	SC_FALLBACK_PEER_LACKS,
	SC_FALLBACK_UNAVAILABLE,
	SC_FALLBACK_GPU_UNREACHABLE,
	SC_FALLBACK_FAILED_MID_TRANSFER,
	SC_FALLBACK_NUM_REASONS
};
/* An operation fell back from backend `from` to `to`. Any thread, lock-free; NULL ok. */
void sc_metrics_fallback(struct sc_metrics *m, enum sc_backend_kind from, enum sc_backend_kind to,
			 enum sc_fallback_reason why);

/* ---- the fast path and NATS ------------------------------------------------------------------ */

/* A fast-path run ended (complete or failed) ns after its entry was taken from the ring
 * (rdma_sidecar_fast_path_run_duration_seconds). Any thread; NULL ok. */
void sc_metrics_fast_run_time(struct sc_metrics *m, uint64_t ns);

/* What a JetStream call was doing when it failed (rdma_sidecar_nats_jetstream_errors_total
 * {op}): setting up the store (stream or bucket: create, look up, bind), storing a message
 * (publish, put), reading one (get, fetch, watch). */
enum sc_js_op { SC_JS_OP_SETUP, SC_JS_OP_STORE, SC_JS_OP_READ, SC_JS_NUM_OPS };
/* A JetStream call failed. Any thread, lock-free; NULL ok. */
void sc_metrics_jetstream_error(struct sc_metrics *m, enum sc_js_op op);

/* The exposition text a scrape returns, NUL-terminated; malloc'd (free() it), NULL when out of
 * memory. Takes eng->mu briefly. */
char *sc_metrics_render(struct sc_metrics *m, size_t *len);

#endif
