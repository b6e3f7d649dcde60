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

/* The exposition text a scrape returns, NUL-terminated; malloc'd (free() it), NULL when out of
 * memory. Takes eng->mu briefly. */
char *sc_metrics_render(struct sc_metrics *m, size_t *len);

#endif
