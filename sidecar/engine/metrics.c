/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/metrics.c: the engine's counters and the Prometheus text endpoint of --metrics-listen.
 *
 * Counters (operations created, operations finished, bytes moved, metadata refused by reason)
 * and the transfer histograms (duration, size; by direction and backend) are atomics bumped by
 * the operations (engine/operation.c, engine/op_active.c) and engine/keyring.c from whatever
 * thread ends an operation or verifies metadata; nothing here locks for them. Gauges are read at
 * scrape time through the source handed to sc_metrics_create (the engine copies its tables out
 * under its lock) and formatted afterwards. sc_metrics_create binds the listening socket (on the
 * main thread, so a port in use is a start-up error) and hands it to libmicrohttpd, whose one
 * internal thread runs every request; sc_metrics_stop joins it. Owns the socket, the daemon and
 * the counters.
 */
#include "engine/metrics.h"

#include "build_config.h"
#include "conf/config.h"
#include "engine/backend_registry.h"
#include "gpu/gpu.h"
#include "os/heap_trim.h"
#include "net/listen.h"
#include "base/log.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define N_KINDS 5 /* indexed by enum sc_op_kind; 0 (NONE) unused */
#define N_FINAL 3 /* COMPLETE, CANCELLED, ERRORED */
#define N_DIRS 2  /* read, write */
#define SCRAPE_CONNECTIONS 32
#define SCRAPE_TIMEOUT_S 10

/* Transfer duration buckets, seconds: 50 us (a small LOCAL copy) to 60 s (a deadline). */
static const double dur_bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
				    0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1,
				    2.5,     5,	     10,      30,     60};
#define N_DUR_BUCKETS (sizeof(dur_bounds) / sizeof(dur_bounds[0]))
/* Transfer size buckets, bytes: 1 KiB to 16 GiB, by 4. */
static const uint64_t size_bounds[] = {
    UINT64_C(1) << 10, UINT64_C(1) << 12, UINT64_C(1) << 14, UINT64_C(1) << 16, UINT64_C(1) << 18,
    UINT64_C(1) << 20, UINT64_C(1) << 22, UINT64_C(1) << 24, UINT64_C(1) << 26, UINT64_C(1) << 28,
    UINT64_C(1) << 30, UINT64_C(1) << 32, UINT64_C(1) << 34};
#define N_SIZE_BUCKETS (sizeof(size_bounds) / sizeof(size_bounds[0]))
static const char *const md_source_label[SC_MD_NUM_SOURCES] = {"begin", "bus"};

struct sc_metrics {
	struct sc_metrics_source src;
	int listen_fd;		   /* ours until the daemon starts, then the daemon's */
	struct MHD_Daemon *daemon; /* NULL: not serving */
	char url[300];		   /* "http://HOST:PORT/metrics", for the log */
	atomic_uint_fast64_t created[N_KINDS];
	atomic_uint_fast64_t finished[N_KINDS][N_FINAL][SC_NUM_BACKENDS];
	atomic_uint_fast64_t bytes[N_DIRS][SC_NUM_BACKENDS];
	/* Histograms: per-bucket (not cumulative) counts, the last bucket is +Inf; sums in ns and
	 * bytes. */
	atomic_uint_fast64_t dur_bucket[N_DIRS][SC_NUM_BACKENDS][N_DUR_BUCKETS + 1];
	atomic_uint_fast64_t dur_sum_ns[N_DIRS][SC_NUM_BACKENDS];
	atomic_uint_fast64_t size_bucket[N_DIRS][SC_NUM_BACKENDS][N_SIZE_BUCKETS + 1];
	atomic_uint_fast64_t size_sum[N_DIRS][SC_NUM_BACKENDS];
	atomic_uint_fast64_t md_rejected[SC_MD_NUM_SOURCES][SC_MD_NUM_REJECT];
};

/* Label values, lower case as Prometheus labels usually are. */
static const char *const kind_label[N_KINDS] = {
    [SC_OP_NONE] = "none", [SC_OP_READABLE] = "readable", [SC_OP_WRITABLE] = "writable",
    [SC_OP_READ] = "read", [SC_OP_WRITE] = "write",
};
static const enum sc_op_status final_status[N_FINAL] = {SC_OPS_COMPLETE, SC_OPS_CANCELLED,
							SC_OPS_ERRORED};
static const char *const final_label[N_FINAL] = {"complete", "cancelled", "errored"};
static const char *const dir_label[N_DIRS] = {"read", "write"};
/* The backends every scrape lists, even at zero, are the registered ones (engine/backend_registry.h);
 * BACKEND_NONE rows appear once non-zero. */
#define N_REAL_BACKENDS sc_backend_registry_count()
static enum sc_backend_kind real_backend(size_t i)
{
	return sc_backend_registry_at(i)->kind;
}

/* ---- counters -------------------------------------------------------------------------------- */

static int final_index(enum sc_op_status s)
{
	for (int i = 0; i < N_FINAL; i++)
		if (final_status[i] == s)
			return i;
	return -1;
}

static bool kind_ok(enum sc_op_kind k)
{
	return (int)k > SC_OP_NONE && (int)k < N_KINDS;
}

static bool backend_ok(enum sc_backend_kind b)
{
	return (int)b >= SC_BACKEND_NONE && (int)b < SC_NUM_BACKENDS;
}

void sc_metrics_op_created(struct sc_metrics *m, enum sc_op_kind kind)
{
	if (m && kind_ok(kind))
		atomic_fetch_add_explicit(&m->created[kind], 1, memory_order_relaxed);
}

void sc_metrics_op_finished(struct sc_metrics *m, enum sc_op_kind kind, enum sc_op_status status,
			    enum sc_backend_kind backend, uint64_t bytes)
{
	int fi = final_index(status);
	if (!m || !kind_ok(kind) || fi < 0 || !backend_ok(backend))
		return;
	atomic_fetch_add_explicit(&m->finished[kind][fi][backend], 1, memory_order_relaxed);
	if (status == SC_OPS_COMPLETE && (kind == SC_OP_READ || kind == SC_OP_WRITE))
		atomic_fetch_add_explicit(&m->bytes[kind == SC_OP_READ ? 0 : 1][backend], bytes,
					  memory_order_relaxed);
}

uint64_t sc_metrics_clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sc_metrics_transfer_done(struct sc_metrics *m, enum sc_op_kind kind,
			      enum sc_backend_kind backend, uint64_t bytes, uint64_t ns)
{
	if (!m || (kind != SC_OP_READ && kind != SC_OP_WRITE) || !backend_ok(backend))
		return;
	int d = kind == SC_OP_READ ? 0 : 1;
	double secs = (double)ns / 1e9;
	size_t i = 0;
	while (i < N_DUR_BUCKETS && secs > dur_bounds[i])
		i++;
	atomic_fetch_add_explicit(&m->dur_bucket[d][backend][i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->dur_sum_ns[d][backend], ns, memory_order_relaxed);
	for (i = 0; i < N_SIZE_BUCKETS && bytes > size_bounds[i];)
		i++;
	atomic_fetch_add_explicit(&m->size_bucket[d][backend][i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->size_sum[d][backend], bytes, memory_order_relaxed);
}

void sc_metrics_metadata_rejected(struct sc_metrics *m, enum sc_md_source source,
				  enum sc_md_reject why)
{
	if (!m || (int)source < 0 || source >= SC_MD_NUM_SOURCES || why <= SC_MD_ACCEPTED ||
	    why >= SC_MD_NUM_REJECT)
		return;
	atomic_fetch_add_explicit(&m->md_rejected[source][why], 1, memory_order_relaxed);
}

static uint64_t get(atomic_uint_fast64_t *a)
{
	return (uint64_t)atomic_load_explicit(a, memory_order_relaxed);
}

/* ---- exposition text ------------------------------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped, as the format requires. */
static void label_value(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fprintf(f, "\\%c", *v);
		else if (*v == '\n')
			fputs("\\n", f);
		else
			fputc(*v, f);
	}
}

/* The le label of a bucket bound: Prometheus' shortest float form ("0.0001", "2.5", "60"). */
static void le_text(char *buf, size_t cap, double v)
{
	snprintf(buf, cap, "%.17g", v);
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

static void histogram_rows(FILE *f, const char *name, const char *labels,
			   atomic_uint_fast64_t *buckets, size_t n_bounds, const double *dbl,
			   const uint64_t *u64, double sum)
{
	uint64_t cum = 0;
	char le[40];
	for (size_t i = 0; i <= n_bounds; i++) {
		cum += get(&buckets[i]);
		if (i == n_bounds)
			snprintf(le, sizeof(le), "+Inf");
		else if (dbl)
			le_text(le, sizeof(le), dbl[i]);
		else
			snprintf(le, sizeof(le), "%llu", (unsigned long long)u64[i]);
		fprintf(f, "%s_bucket{%s,le=\"%s\"} %llu\n", name, labels, le,
			(unsigned long long)cum);
	}
	if (dbl) /* seconds from nanoseconds: nine decimals are exact */
		fprintf(f, "%s_sum{%s} %.9f\n", name, labels, sum);
	else /* bytes: integral, exact below 2^53 */
		fprintf(f, "%s_sum{%s} %.17g\n", name, labels, sum);
	fprintf(f, "%s_count{%s} %llu\n", name, labels, (unsigned long long)cum);
}

static void render_histograms(FILE *f, struct sc_metrics *m)
{
	char labels[80];
	family(f, "rdma_sidecar_transfer_duration_seconds", "histogram",
	       "Time completed active transfers held their slot, from admission to COMPLETE, by "
	       "direction and backend.");
	for (int d = 0; d < N_DIRS; d++)
		for (size_t i = 0; i < N_REAL_BACKENDS; i++) {
			enum sc_backend_kind b = real_backend(i);
			snprintf(labels, sizeof(labels), "direction=\"%s\",backend=\"%s\"",
				 dir_label[d], sc_backend_name(b));
			histogram_rows(f, "rdma_sidecar_transfer_duration_seconds", labels,
				       m->dur_bucket[d][b], N_DUR_BUCKETS, dur_bounds, NULL,
				       (double)get(&m->dur_sum_ns[d][b]) / 1e9);
		}
	family(f, "rdma_sidecar_transfer_size_bytes", "histogram",
	       "Bytes of each completed active transfer, by direction and backend.");
	for (int d = 0; d < N_DIRS; d++)
		for (size_t i = 0; i < N_REAL_BACKENDS; i++) {
			enum sc_backend_kind b = real_backend(i);
			snprintf(labels, sizeof(labels), "direction=\"%s\",backend=\"%s\"",
				 dir_label[d], sc_backend_name(b));
			histogram_rows(f, "rdma_sidecar_transfer_size_bytes", labels,
				       m->size_bucket[d][b], N_SIZE_BUCKETS, NULL, size_bounds,
				       (double)get(&m->size_sum[d][b]));
		}
}

char *sc_metrics_render(struct sc_metrics *m, size_t *len)
{
	struct sc_gauges g;
	m->src.read_gauges(m->src.ctx, &g);

	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return NULL;

	family(f, "rdma_sidecar_build_info", "gauge", "Version and id of this sidecar (always 1).");
	fputs("rdma_sidecar_build_info{version=\"", f);
	label_value(f, SC_VERSION);
	fputs("\",sidecar_id=\"", f);
	label_value(f, m->src.id);
	fputs("\"} 1\n", f);

	family(f, "rdma_sidecar_backend_available", "gauge",
	       "1 when the backend can move bytes (see GetInfo for why not).");
	for (size_t i = 0; i < N_REAL_BACKENDS; i++)
		fprintf(f, "rdma_sidecar_backend_available{backend=\"%s\"} %d\n",
			sc_backend_name(real_backend(i)), g.available[real_backend(i)] ? 1 : 0);

	static const struct {
		const char *name, *type, *help;
		size_t off;
	} rail_families[] = {
		{"rdma_sidecar_rail_bytes_total", "counter",
		 "Bytes this sidecar's transfers moved on the rail (both directions).",
		 offsetof(struct sc_rail_report, bytes)},
		{"rdma_sidecar_rail_operations_total", "counter", "Transfers that used the rail.",
		 offsetof(struct sc_rail_report, operations)},
		{"rdma_sidecar_rail_errors_total", "counter",
		 "Transfers or slices that failed on the rail.", offsetof(struct sc_rail_report, errors)},
		{"rdma_sidecar_rail_failovers_total", "counter",
		 "Times the rail's work moved to another rail (or to TCP).",
		 offsetof(struct sc_rail_report, failovers)},
	};
	family(f, "rdma_sidecar_peer_connections", "gauge",
	       "Peer data connections now: authenticated and parked (idle), authenticated with a "
	       "request in hand (busy), before their hello (hello).");
	fprintf(f, "rdma_sidecar_peer_connections{state=\"idle\"} %u\n", g.peer_load.idle);
	fprintf(f, "rdma_sidecar_peer_connections{state=\"busy\"} %u\n", g.peer_load.busy);
	fprintf(f, "rdma_sidecar_peer_connections{state=\"hello\"} %u\n", g.peer_load.hello);
	family(f, "rdma_sidecar_peer_io_threads", "gauge",
	       "Threads of the peer connection pool: waiting for a request, or serving one.");
	fprintf(f, "rdma_sidecar_peer_io_threads{state=\"waiting\"} %u\n",
		g.peer_load.threads_waiting);
	fprintf(f, "rdma_sidecar_peer_io_threads{state=\"busy\"} %u\n",
		g.peer_load.threads - g.peer_load.threads_waiting);
	family(f, "rdma_sidecar_peer_connections_evicted_total", "counter",
	       "Idle peer connections closed to admit a new peer at --data-max-peers.");
	fprintf(f, "rdma_sidecar_peer_connections_evicted_total %llu\n",
		(unsigned long long)g.peers_evicted);
	family(f, "rdma_sidecar_ib_qps_evicted_total", "counter",
	       "Idle incoming ibverbs QPs destroyed to admit a new peer at --ib-max-qps.");
	fprintf(f, "rdma_sidecar_ib_qps_evicted_total %llu\n", (unsigned long long)g.ib_qps_evicted);
	family(f, "rdma_sidecar_ib_qps_expired_total", "counter",
	       "Incoming ibverbs QPs destroyed after their peer made no request for 180 s.");
	fprintf(f, "rdma_sidecar_ib_qps_expired_total %llu\n", (unsigned long long)g.ib_qps_expired);
	family(f, "rdma_sidecar_ib_qps_refused_total", "counter",
	       "Peers refused a QP because every one of --ib-max-qps was in use.");
	fprintf(f, "rdma_sidecar_ib_qps_refused_total %llu\n", (unsigned long long)g.ib_qps_refused);
	family(f, "rdma_sidecar_ofi_keys_total", "counter",
	       "libfabric remote keys (one per passive operation's region span and rail): granted, "
	       "and closed when the operation ended (revoked).");
	fprintf(f, "rdma_sidecar_ofi_keys_total{event=\"granted\"} %llu\n",
		(unsigned long long)g.ofi_keys_granted);
	fprintf(f, "rdma_sidecar_ofi_keys_total{event=\"revoked\"} %llu\n",
		(unsigned long long)g.ofi_keys_revoked);
	family(f, "rdma_sidecar_ofi_av_entries_total", "counter",
	       "libfabric address-vector entries of peer sidecars: inserted, and removed (least "
	       "recently used at --ofi-max-peers, or a failed peer's).");
	fprintf(f, "rdma_sidecar_ofi_av_entries_total{event=\"inserted\"} %llu\n",
		(unsigned long long)g.ofi_addrs_inserted);
	fprintf(f, "rdma_sidecar_ofi_av_entries_total{event=\"evicted\"} %llu\n",
		(unsigned long long)g.ofi_addrs_evicted);

	const uint64_t *fe = g.fast_events;
	family(f, "rdma_sidecar_fast_path_sessions", "gauge",
	       "Fast-path sessions open now (workers connected to --fast-path-socket).");
	fprintf(f, "rdma_sidecar_fast_path_sessions %llu\n",
		(unsigned long long)(fe[SC_FAST_SESSION_OPENED] - fe[SC_FAST_SESSION_CLOSED]));
	family(f, "rdma_sidecar_fast_path_sessions_total", "counter",
	       "Fast-path connections: opened, or refused (--allowed-uids, "
	       "--fast-path-max-sessions).");
	fprintf(f, "rdma_sidecar_fast_path_sessions_total{result=\"opened\"} %llu\n",
		(unsigned long long)fe[SC_FAST_SESSION_OPENED]);
	fprintf(f, "rdma_sidecar_fast_path_sessions_total{result=\"refused\"} %llu\n",
		(unsigned long long)fe[SC_FAST_SESSION_REFUSED]);
	family(f, "rdma_sidecar_fast_path_runs_total", "counter",
	       "Fast-path runs by how they ended: complete, failed (cancelled or errored), or "
	       "refused before a transfer began (a bad entry, an unknown handle).");
	fprintf(f, "rdma_sidecar_fast_path_runs_total{result=\"complete\"} %llu\n",
		(unsigned long long)fe[SC_FAST_RUN_COMPLETE]);
	fprintf(f, "rdma_sidecar_fast_path_runs_total{result=\"failed\"} %llu\n",
		(unsigned long long)fe[SC_FAST_RUN_FAILED]);
	fprintf(f, "rdma_sidecar_fast_path_runs_total{result=\"refused\"} %llu\n",
		(unsigned long long)fe[SC_FAST_RUN_REFUSED]);

	family(f, "rdma_sidecar_rail_up", "gauge",
	       "1 while the rail can carry data (GetInfo rails says why not), by backend and rail.");
	for (size_t i = 0; i < g.n_rails; i++) {
		fprintf(f, "rdma_sidecar_rail_up{backend=\"%s\",rail=\"",
			sc_backend_name(g.rails[i].backend));
		label_value(f, g.rails[i].r.name);
		fprintf(f, "\",state=\"%s\"} %d\n", sc_rail_state_name(g.rails[i].r.state),
			g.rails[i].r.state == SC_RAIL_UP ? 1 : 0);
	}
	for (size_t k = 0; k < sizeof(rail_families) / sizeof(rail_families[0]); k++) {
		family(f, rail_families[k].name, rail_families[k].type, rail_families[k].help);
		for (size_t i = 0; i < g.n_rails; i++) {
			uint64_t v;
			memcpy(&v, (const char *)&g.rails[i].r + rail_families[k].off, sizeof(v));
			fprintf(f, "%s{backend=\"%s\",rail=\"", rail_families[k].name,
				sc_backend_name(g.rails[i].backend));
			label_value(f, g.rails[i].r.name);
			fprintf(f, "\"} %llu\n", (unsigned long long)v);
		}
	}

	family(f, "rdma_sidecar_gpu_healthy", "gauge",
	       "0 once a sticky CUDA error poisoned the GPU's context (see GetInfo gpus).");
	for (int i = 0; i < sc_gpu_count(m->src.gpu); i++) {
		const struct sc_gpu_device_info *gi = sc_gpu_device(m->src.gpu, i);
		fprintf(f, "rdma_sidecar_gpu_healthy{gpu=\"%d\",uuid=\"", i);
		label_value(f, gi->uuid);
		fprintf(f, "\"} %d\n", gi->healthy ? 1 : 0);
	}

	family(f, "rdma_sidecar_draining", "gauge",
	       "1 once the sidecar is shutting down and refuses new work.");
	fprintf(f, "rdma_sidecar_draining %d\n", g.draining ? 1 : 0);

	family(f, "rdma_sidecar_operations_created_total", "counter",
	       "Operations created, by kind.");
	for (int k = 1; k < N_KINDS; k++)
		fprintf(f, "rdma_sidecar_operations_created_total{kind=\"%s\"} %llu\n",
			kind_label[k], (unsigned long long)get(&m->created[k]));

	family(f, "rdma_sidecar_operations_total", "counter",
	       "Operations that reached a final status, by kind, status and backend "
	       "(backend \"none\": a passive operation no peer used).");
	for (int k = 1; k < N_KINDS; k++) {
		for (int s = 0; s < N_FINAL; s++) {
			for (int b = 0; b < SC_NUM_BACKENDS; b++) {
				uint64_t v = get(&m->finished[k][s][b]);
				if (b == SC_BACKEND_NONE ? v == 0
							 : !sc_backend_registry_find((enum sc_backend_kind)b))
					continue;
				fprintf(f,
					"rdma_sidecar_operations_total{kind=\"%s\",status=\"%s\","
					"backend=\"%s\"} %llu\n",
					kind_label[k], final_label[s],
					sc_backend_name((enum sc_backend_kind)b),
					(unsigned long long)v);
			}
		}
	}

	family(f, "rdma_sidecar_bytes_total", "counter",
	       "Bytes moved by completed active operations (read: into this sidecar, write: out "
	       "of it), by direction and backend.");
	for (int d = 0; d < N_DIRS; d++)
		for (size_t i = 0; i < N_REAL_BACKENDS; i++)
			fprintf(f,
				"rdma_sidecar_bytes_total{direction=\"%s\",backend=\"%s\"} %llu\n",
				dir_label[d], sc_backend_name(real_backend(i)),
				(unsigned long long)get(&m->bytes[d][real_backend(i)]));

	render_histograms(f, m);

	family(f, "rdma_sidecar_metadata_rejected_total", "counter",
	       "Metadata refused by verification, by where it came from (begin: BeginRead/"
	       "BeginWrite; bus: NATS publish or receive) and why.");
	for (int src = 0; src < SC_MD_NUM_SOURCES; src++)
		for (int r = SC_MD_MALFORMED; r < SC_MD_NUM_REJECT; r++)
			fprintf(f,
				"rdma_sidecar_metadata_rejected_total{source=\"%s\",reason=\"%s\"} "
				"%llu\n",
				md_source_label[src], sc_md_reject_name((enum sc_md_reject)r),
				(unsigned long long)get(&m->md_rejected[src][r]));

	family(f, "rdma_sidecar_live_operations", "gauge",
	       "Operations not yet in a final status, by kind.");
	for (int k = 1; k < N_KINDS; k++)
		fprintf(f, "rdma_sidecar_live_operations{kind=\"%s\"} %llu\n", kind_label[k],
			(unsigned long long)g.live[k]);

	family(f, "rdma_sidecar_regions", "gauge", "Registered memory regions.");
	fprintf(f, "rdma_sidecar_regions %llu\n", (unsigned long long)g.regions);
	family(f, "rdma_sidecar_region_bytes", "gauge", "Bytes in registered memory regions.");
	fprintf(f, "rdma_sidecar_region_bytes %llu\n", (unsigned long long)g.region_bytes);

	family(f, "rdma_sidecar_scheduler_queued_operations", "gauge",
	       "Active operations waiting for a transfer slot.");
	fprintf(f, "rdma_sidecar_scheduler_queued_operations %llu\n", (unsigned long long)g.queued);
	family(f, "rdma_sidecar_scheduler_waiting_progress_operations", "gauge",
	       "Active operations waiting for worker progress (ReportProgress).");
	fprintf(f, "rdma_sidecar_scheduler_waiting_progress_operations %llu\n",
		(unsigned long long)g.waiting_progress);
	family(f, "rdma_sidecar_scheduler_progress_records", "gauge",
	       "ReportProgress records kept: request ids in use or within --progress-grace "
	       "(--max-progress-records, beside those operations wait on).");
	fprintf(f, "rdma_sidecar_scheduler_progress_records %llu\n",
		(unsigned long long)g.progress_records);
	family(f, "rdma_sidecar_active_transfers", "gauge",
	       "Transfers holding a slot (at most --max-concurrent-transfers).");
	fprintf(f, "rdma_sidecar_active_transfers %llu\n", (unsigned long long)g.active_transfers);
	family(f, "rdma_sidecar_inflight_bytes", "gauge",
	       "Bytes of the transfers holding a slot (budget --max-inflight-bytes).");
	fprintf(f, "rdma_sidecar_inflight_bytes %llu\n", (unsigned long long)g.inflight_bytes);

	if (g.n_certs) {
		family(
		    f, "rdma_sidecar_certificate_expiry_timestamp_seconds", "gauge",
		    "notAfter of each certificate this sidecar presents, unix seconds, by use "
		    "(peer: --peer-tls-cert, grpc: --grpc-tls-cert) and serial (hex); it changes "
		    "when the files are reloaded.");
		for (size_t i = 0; i < g.n_certs && i < sizeof(g.certs) / sizeof(g.certs[0]); i++) {
			fprintf(f,
				"rdma_sidecar_certificate_expiry_timestamp_seconds{use=\"%s\","
				"serial=\"",
				g.certs[i].use);
			label_value(f, g.certs[i].serial);
			fprintf(f, "\"} %lld\n", (long long)g.certs[i].not_after);
		}
	}

	/* malloc's own figures, read now (mallinfo2 visits every arena under its lock). */
	struct sc_heap_stats hs;
	sc_heap_stats(&hs);
	family(f, "rdma_sidecar_heap_bytes", "gauge",
	       "glibc malloc summed over its arenas, by state: in_use (allocated chunks, incl. "
	       "thread caches), free (free chunks), arena (obtained from the system outside "
	       "mmapped chunks), mmapped (chunks mmapped on their own).");
	fprintf(f, "rdma_sidecar_heap_bytes{state=\"in_use\"} %llu\n", (unsigned long long)hs.in_use);
	fprintf(f, "rdma_sidecar_heap_bytes{state=\"free\"} %llu\n", (unsigned long long)hs.free);
	fprintf(f, "rdma_sidecar_heap_bytes{state=\"arena\"} %llu\n", (unsigned long long)hs.arena);
	fprintf(f, "rdma_sidecar_heap_bytes{state=\"mmapped\"} %llu\n",
		(unsigned long long)hs.mmapped);

	bool failed = ferror(f) != 0;
	if (fclose(f) != 0 || failed) {
		free(buf);
		return NULL;
	}
	if (len)
		*len = n;
	return buf;
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

static enum MHD_Result respond(struct MHD_Connection *c, unsigned int code, const char *type,
			       void *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
	struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
	if (!resp) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	enum MHD_Result rc = MHD_queue_response(c, code, resp);
	MHD_destroy_response(resp);
	return rc;
}

static enum MHD_Result respond_text(struct MHD_Connection *c, unsigned int code, const char *text)
{
	return respond(c, code, "text/plain; charset=utf-8", (void *)text, strlen(text),
		       MHD_RESPMEM_PERSISTENT);
}

/*
 * libmicrohttpd's thread. It calls once with the headers, then again per chunk of body, then once
 * more with none left. Requests this server refuses are answered at the first call (the daemon
 * then closes the connection rather than read a body nobody wants); GET and HEAD are answered at
 * the last, so the connection stays alive for the next scrape.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *http_version,
				  const char *upload_data, size_t *upload_data_size, void **req_cls)
{
	struct sc_metrics *m = cls;
	(void)http_version;
	(void)upload_data;
	bool metrics = strcmp(url, "/metrics") == 0;
	bool healthz = strcmp(url, "/healthz") == 0;
	if (!*req_cls) {
		if (!metrics && !healthz)
			return respond_text(c, MHD_HTTP_NOT_FOUND,
					    "not found: try /metrics or /healthz\n");
		if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
		    strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
			return respond_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
					    "method not allowed: use GET\n");
		*req_cls = m;
		return MHD_YES;
	}
	if (*upload_data_size) {
		*upload_data_size = 0; /* a GET with a body: ignore it */
		return MHD_YES;
	}
	if (healthz)
		return m->src.draining(m->src.ctx)
			   ? respond_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "draining\n")
			   : respond_text(c, MHD_HTTP_OK, "ok\n");
	size_t len = 0;
	char *body = sc_metrics_render(m, &len);
	if (!body)
		return respond_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
	return respond(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
		       MHD_RESPMEM_MUST_FREE);
}

__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	char text[512];
	vsnprintf(text, sizeof(text), fmt, ap);
	size_t n = strlen(text);
	while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
		text[--n] = '\0';
	SC_WARN("metrics", "%s", text);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static int bind_listener(struct sc_metrics *m, const char *listen_text, struct sc_err *err)
{
	char host[256];
	uint16_t port;
	if (sc_parse_hostport(listen_text, host, sizeof(host), &port, err) != 0)
		return sc_err_prefix(err, "--metrics-listen");
	uint16_t bound;
	if (sc_listen_tcp("--metrics-listen", listen_text, host, port, 64, " port", &m->listen_fd,
			  &bound, err) != 0)
		return -1;
	bool v6 = strchr(host, ':') != NULL;
	snprintf(m->url, sizeof(m->url), "http://%s%s%s:%u/metrics", v6 ? "[" : "", host,
		 v6 ? "]" : "", bound);
	return 0;
}

int sc_metrics_create(const struct sc_metrics_source *source, const char *listen_text,
		      struct sc_metrics **out, struct sc_err *err)
{
	struct sc_metrics *m = calloc(1, sizeof(*m));
	if (!m)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	m->src = *source;
	m->listen_fd = -1;
	for (int k = 0; k < N_KINDS; k++) {
		atomic_init(&m->created[k], 0);
		for (int s = 0; s < N_FINAL; s++)
			for (int b = 0; b < SC_NUM_BACKENDS; b++)
				atomic_init(&m->finished[k][s][b], 0);
	}
	for (int d = 0; d < N_DIRS; d++)
		for (int b = 0; b < SC_NUM_BACKENDS; b++) {
			atomic_init(&m->bytes[d][b], 0);
			atomic_init(&m->dur_sum_ns[d][b], 0);
			atomic_init(&m->size_sum[d][b], 0);
			for (size_t i = 0; i <= N_DUR_BUCKETS; i++)
				atomic_init(&m->dur_bucket[d][b][i], 0);
			for (size_t i = 0; i <= N_SIZE_BUCKETS; i++)
				atomic_init(&m->size_bucket[d][b][i], 0);
		}
	for (int src = 0; src < SC_MD_NUM_SOURCES; src++)
		for (int r = 0; r < SC_MD_NUM_REJECT; r++)
			atomic_init(&m->md_rejected[src][r], 0);
	if (listen_text && listen_text[0] && bind_listener(m, listen_text, err) != 0) {
		sc_metrics_destroy(m);
		return -1;
	}
	*out = m;
	return 0;
}

int sc_metrics_start(struct sc_metrics *m, struct sc_err *err)
{
	if (!m || m->listen_fd < 0 || m->daemon)
		return 0;
	m->daemon = MHD_start_daemon(
	    MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
	    on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, (void *)m,
	    MHD_OPTION_LISTEN_SOCKET, (MHD_socket)m->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned int)SCRAPE_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int)SCRAPE_TIMEOUT_S, MHD_OPTION_END);
	if (!m->daemon)
		return sc_err_set(err, SC_INTERNAL,
				  "--metrics-listen: cannot start the HTTP server (libmicrohttpd) "
				  "for %s",
				  m->url);
	m->listen_fd = -1; /* the daemon closes it when it stops */
	SC_INFO("metrics", "metrics on %s", m->url);
	return 0;
}

void sc_metrics_stop(struct sc_metrics *m)
{
	if (!m || !m->daemon)
		return;
	MHD_stop_daemon(m->daemon);
	m->daemon = NULL;
}

void sc_metrics_destroy(struct sc_metrics *m)
{
	if (!m)
		return;
	sc_metrics_stop(m);
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	free(m);
}
