/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/metrics.c: the engine's counters and the Prometheus text endpoint of --metrics-listen.
 *
 * Counters (operations created, operations finished, bytes moved, metadata refused by reason,
 * gRPC calls by method and code, JetStream errors) and the histograms (transfer duration and
 * size by direction and backend, gRPC handling time by method, fast-path run time) are atomics
 * bumped by the operations (engine/operation.c, engine/op_active.c), engine/keyring.c, the gRPC
 * layer and the fast path (through engine/engine.h) from whatever thread ends an operation, a
 * call or a run, or verifies metadata; nothing here locks for them. The process_* family comes
 * from /proc at scrape time (os/proc_stats.c). Gauges are read at
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
#include "os/proc_stats.h"
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
/* gRPC handling time buckets, seconds: 100 us (GetInfo) to 5 min (a long WaitOperation). */
static const double grpc_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
				     0.025,  0.05,    0.1,    0.25,  0.5,    1,	    2.5,
				     5,	     10,      30,     60,    300};
#define N_GRPC_BUCKETS (sizeof(grpc_bounds) / sizeof(grpc_bounds[0]))
/* Fast-path run buckets, seconds: 5 us (a small LOCAL copy run on the session thread) to 10 s. */
static const double fast_bounds[] = {0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
				     0.0005,   0.001,	0.0025,	  0.005,   0.01,   0.025,
				     0.05,     0.1,	0.25,	  0.5,	   1,	   10};
#define N_FAST_BUCKETS (sizeof(fast_bounds) / sizeof(fast_bounds[0]))
#define N_GRPC_CODES 17 /* OK (0) .. UNAUTHENTICATED (16) */
static const char *const grpc_code_name[N_GRPC_CODES] = {
    "OK",	 "CANCELLED",	   "UNKNOWN",		"INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",	 "OUT_OF_RANGE",   "UNIMPLEMENTED",	"INTERNAL",	      "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
/* Method slots: the registered ones, then one for every unknown method. */
#define N_METHOD_SLOTS (SC_METRICS_MAX_METHODS + 1)
static const char *const js_op_label[SC_JS_NUM_OPS] = {"setup", "store", "read"};
static const char *const fallback_label[SC_FALLBACK_NUM_REASONS] = {
    [SC_FALLBACK_PEER_LACKS] = "peer_lacks",
    [SC_FALLBACK_UNAVAILABLE] = "unavailable",
    [SC_FALLBACK_GPU_UNREACHABLE] = "gpu_unreachable",
    [SC_FALLBACK_FAILED_MID_TRANSFER] = "failed_mid_transfer"};
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
	/* gRPC: the methods named by sc_metrics_grpc_methods (n_methods of them), then "unknown".
	 */
	const char *method_path[SC_METRICS_MAX_METHODS];
	const char *method_type[SC_METRICS_MAX_METHODS];
	size_t n_methods;
	atomic_uint_fast64_t grpc_started[N_METHOD_SLOTS];
	atomic_uint_fast64_t grpc_handled[N_METHOD_SLOTS][N_GRPC_CODES];
	atomic_uint_fast64_t grpc_bucket[N_METHOD_SLOTS][N_GRPC_BUCKETS + 1];
	atomic_uint_fast64_t grpc_sum_ns[N_METHOD_SLOTS];
	atomic_uint_fast64_t fast_bucket[N_FAST_BUCKETS + 1];
	atomic_uint_fast64_t fast_sum_ns;
	atomic_uint_fast64_t js_errors[SC_JS_NUM_OPS];
	atomic_uint_fast64_t fallbacks[SC_NUM_BACKENDS][SC_NUM_BACKENDS][SC_FALLBACK_NUM_REASONS];
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

/* The bucket (index into bounds, n = +Inf) of secs. */
static size_t bucket_of(const double *bounds, size_t n, double secs)
{
	size_t i = 0;
	while (i < n && secs > bounds[i])
		i++;
	return i;
}

static size_t method_slot(struct sc_metrics *m, size_t method)
{
	return method < m->n_methods ? method : SC_METRICS_MAX_METHODS;
}

void sc_metrics_grpc_methods(struct sc_metrics *m, const char *const *paths,
			     const char *const *types, size_t n)
{
	if (!m)
		return;
	if (n > SC_METRICS_MAX_METHODS) {
		SC_WARN("metrics",
			"%zu gRPC methods, %d counted by name; raise "
			"SC_METRICS_MAX_METHODS",
			n, SC_METRICS_MAX_METHODS);
		n = SC_METRICS_MAX_METHODS;
	}
	for (size_t i = 0; i < n; i++) {
		m->method_path[i] = paths[i];
		m->method_type[i] = types[i];
	}
	m->n_methods = n;
}

void sc_metrics_grpc_started(struct sc_metrics *m, size_t method)
{
	if (m)
		atomic_fetch_add_explicit(&m->grpc_started[method_slot(m, method)], 1,
					  memory_order_relaxed);
}

void sc_metrics_grpc_handled(struct sc_metrics *m, size_t method, int code, uint64_t ns)
{
	if (!m)
		return;
	size_t slot = method_slot(m, method);
	if (code < 0 || code >= N_GRPC_CODES)
		code = 2; /* UNKNOWN */
	atomic_fetch_add_explicit(&m->grpc_handled[slot][code], 1, memory_order_relaxed);
	size_t b = bucket_of(grpc_bounds, N_GRPC_BUCKETS, (double)ns / 1e9);
	atomic_fetch_add_explicit(&m->grpc_bucket[slot][b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->grpc_sum_ns[slot], ns, memory_order_relaxed);
}

void sc_metrics_fast_run_time(struct sc_metrics *m, uint64_t ns)
{
	if (!m)
		return;
	size_t b = bucket_of(fast_bounds, N_FAST_BUCKETS, (double)ns / 1e9);
	atomic_fetch_add_explicit(&m->fast_bucket[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->fast_sum_ns, ns, memory_order_relaxed);
}

void sc_metrics_fallback(struct sc_metrics *m, enum sc_backend_kind from, enum sc_backend_kind to,
			 enum sc_fallback_reason why)
{
	if (m && backend_ok(from) && backend_ok(to) && (int)why >= 0 &&
	    why < SC_FALLBACK_NUM_REASONS)
		atomic_fetch_add_explicit(&m->fallbacks[from][to][why], 1, memory_order_relaxed);
}

void sc_metrics_jetstream_error(struct sc_metrics *m, enum sc_js_op op)
{
	if (m && (int)op >= 0 && op < SC_JS_NUM_OPS)
		atomic_fetch_add_explicit(&m->js_errors[op], 1, memory_order_relaxed);
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

/* The le label of a bucket bound: the shortest plain decimal that reads back as the bound
 * ("0.00005", "2.5", "10", "60"), never an exponent ("1e+01"), so that a selector such as
 * {le="10"} or {le="0.005"} finds the bucket. */
static void le_text(char *buf, size_t cap, double v)
{
	for (int prec = 0; prec <= 20; prec++) {
		snprintf(buf, cap, "%.*f", prec, v);
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
		fprintf(f, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels ? labels : "",
			labels ? "," : "", le, (unsigned long long)cum);
	}
	const char *open = labels ? "{" : "", *l = labels ? labels : "", *close = labels ? "}" : "";
	if (dbl) /* seconds from nanoseconds: nine decimals are exact */
		fprintf(f, "%s_sum%s%s%s %.9f\n", name, open, l, close, sum);
	else /* bytes: integral, exact below 2^53 */
		fprintf(f, "%s_sum%s%s%s %.17g\n", name, open, l, close, sum);
	fprintf(f, "%s_count%s%s%s %llu\n", name, open, l, close, (unsigned long long)cum);
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
	family(f, "rdma_sidecar_fast_path_run_duration_seconds", "histogram",
	       "Fast-path runs that began a transfer (complete or failed): from taking the entry "
	       "off the ring to posting its completion.");
	histogram_rows(f, "rdma_sidecar_fast_path_run_duration_seconds", NULL, m->fast_bucket,
		       N_FAST_BUCKETS, fast_bounds, NULL, (double)get(&m->fast_sum_ns) / 1e9);
}

/* The grpc_service, grpc_method and grpc_type labels of a method slot. */
static void method_labels(struct sc_metrics *m, size_t slot, char *out, size_t cap)
{
	if (slot >= m->n_methods) {
		snprintf(out, cap,
			 "grpc_service=\"unknown\",grpc_method=\"unknown\","
			 "grpc_type=\"unknown\"");
		return;
	}
	const char *path = m->method_path[slot];
	const char *svc = path[0] == '/' ? path + 1 : path;
	const char *slash = strrchr(svc, '/');
	int svc_len = slash ? (int)(slash - svc) : (int)strlen(svc);
	snprintf(out, cap, "grpc_service=\"%.*s\",grpc_method=\"%s\",grpc_type=\"%s\"", svc_len,
		 svc, slash ? slash + 1 : svc, m->method_type[slot]);
}

/* The families go-grpc-prometheus defines, so that dashboards made for gRPC servers work:
 * calls started (every method listed from the start), calls handled by code and the handling
 * time (the methods called so far; the unknown-method row once one was called). */
static void render_grpc(FILE *f, struct sc_metrics *m)
{
	char labels[300];
	family(f, "grpc_server_started_total", "counter",
	       "gRPC calls that arrived, by service, method and type (unknown: a method this "
	       "server does not have).");
	for (size_t i = 0; i < N_METHOD_SLOTS; i++) {
		uint64_t v = get(&m->grpc_started[i]);
		if (i >= m->n_methods && (i != SC_METRICS_MAX_METHODS || v == 0))
			continue;
		method_labels(m, i, labels, sizeof(labels));
		fprintf(f, "grpc_server_started_total{%s} %llu\n", labels, (unsigned long long)v);
	}
	family(f, "grpc_server_handled_total", "counter",
	       "gRPC calls that ended, by service, method, type and status code (grpc_code).");
	for (size_t i = 0; i < N_METHOD_SLOTS; i++) {
		if (i >= m->n_methods && i != SC_METRICS_MAX_METHODS)
			continue;
		method_labels(m, i, labels, sizeof(labels));
		for (int c = 0; c < N_GRPC_CODES; c++) {
			uint64_t v = get(&m->grpc_handled[i][c]);
			if (v)
				fprintf(f, "grpc_server_handled_total{%s,grpc_code=\"%s\"} %llu\n",
					labels, grpc_code_name[c], (unsigned long long)v);
		}
	}
	family(f, "grpc_server_handling_seconds", "histogram",
	       "Time from a gRPC call's arrival to its end (status sent, or the client gone), by "
	       "service, method and type.");
	for (size_t i = 0; i < N_METHOD_SLOTS; i++) {
		if (i >= m->n_methods && i != SC_METRICS_MAX_METHODS)
			continue;
		uint64_t n = 0;
		for (size_t b = 0; b <= N_GRPC_BUCKETS; b++)
			n += get(&m->grpc_bucket[i][b]);
		if (!n)
			continue;
		method_labels(m, i, labels, sizeof(labels));
		histogram_rows(f, "grpc_server_handling_seconds", labels, m->grpc_bucket[i],
			       N_GRPC_BUCKETS, grpc_bounds, NULL,
			       (double)get(&m->grpc_sum_ns[i]) / 1e9);
	}
}

/* The process_* families every Prometheus client library exports. */
static void render_process(FILE *f)
{
	struct sc_proc_stats ps;
	sc_proc_stats(&ps);
	family(f, "process_cpu_seconds_total", "counter",
	       "Total user and system CPU time spent in "
	       "seconds.");
	fprintf(f, "process_cpu_seconds_total %.2f\n", ps.cpu_seconds);
	family(f, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
	fprintf(f, "process_resident_memory_bytes %llu\n", (unsigned long long)ps.resident_bytes);
	family(f, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
	fprintf(f, "process_virtual_memory_bytes %llu\n", (unsigned long long)ps.virtual_bytes);
	family(f, "process_open_fds", "gauge", "Number of open file descriptors.");
	fprintf(f, "process_open_fds %llu\n", (unsigned long long)ps.open_fds);
	family(f, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
	if (ps.max_fds == UINT64_MAX)
		fputs("process_max_fds +Inf\n", f);
	else
		fprintf(f, "process_max_fds %llu\n", (unsigned long long)ps.max_fds);
	family(f, "process_start_time_seconds", "gauge",
	       "Start time of the process since unix epoch in seconds.");
	fprintf(f, "process_start_time_seconds %.2f\n", ps.start_time_seconds);
	family(f, "process_threads", "gauge", "Number of OS threads in the process.");
	fprintf(f, "process_threads %llu\n", (unsigned long long)ps.threads);
}

/* NATS: the connection's state (one row per state, 1 for the current one), its counters and the
 * JetStream errors. */
static void render_nats(FILE *f, struct sc_metrics *m, const struct sc_gauges *g)
{
	static const char *const states[] = {"disabled", "connecting", "connected", "reconnecting",
					     "closed"};
	const char *now = g->nats_state ? g->nats_state : "disabled";
	family(f, "rdma_sidecar_nats_connection_state", "gauge",
	       "1 for the NATS connection's state now, 0 for the others (disabled: no "
	       "--nats-url).");
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		fprintf(f, "rdma_sidecar_nats_connection_state{state=\"%s\"} %d\n", states[i],
			strcmp(now, states[i]) == 0 ? 1 : 0);
	family(f, "rdma_sidecar_nats_reconnects_total", "counter",
	       "Times the NATS connection was re-established after it dropped.");
	fprintf(f, "rdma_sidecar_nats_reconnects_total %llu\n",
		(unsigned long long)g->nats.reconnects);
	family(f, "rdma_sidecar_nats_messages_total", "counter",
	       "NATS messages this sidecar received (in) and sent (out).");
	fprintf(f, "rdma_sidecar_nats_messages_total{direction=\"in\"} %llu\n",
		(unsigned long long)g->nats.in_msgs);
	fprintf(f, "rdma_sidecar_nats_messages_total{direction=\"out\"} %llu\n",
		(unsigned long long)g->nats.out_msgs);
	family(f, "rdma_sidecar_nats_bytes_total", "counter",
	       "NATS payload bytes this sidecar received (in) and sent (out).");
	fprintf(f, "rdma_sidecar_nats_bytes_total{direction=\"in\"} %llu\n",
		(unsigned long long)g->nats.in_bytes);
	fprintf(f, "rdma_sidecar_nats_bytes_total{direction=\"out\"} %llu\n",
		(unsigned long long)g->nats.out_bytes);
	family(f, "rdma_sidecar_nats_jetstream_errors_total", "counter",
	       "JetStream calls that failed, by what they did: setup (create or find the stream "
	       "or bucket), store (publish, put), read (get, fetch, watch).");
	for (int i = 0; i < SC_JS_NUM_OPS; i++)
		fprintf(f, "rdma_sidecar_nats_jetstream_errors_total{op=\"%s\"} %llu\n",
			js_op_label[i], (unsigned long long)get(&m->js_errors[i]));
}

/*
 * A rail's label: stable across restarts. An ibverbs rail's name (device:port) already is; a TCP
 * rail is named by its endpoint, whose port may be ephemeral, so it goes by its interface (netdev)
 * or else its address without the port. Two rails of one backend that would share a label get
 * their index appended ("eth0#1").
 */
static void rail_label(const struct sc_gauges *g, size_t i, char *out, size_t cap)
{
	const struct sc_rail_entry *e = &g->rails[i];
	if (e->backend != SC_BACKEND_TCP) {
		snprintf(out, cap, "%s", e->r.name);
		return;
	}
	char base[SC_METRICS_MAX_RAILS][80];
	size_t same = 0;
	for (size_t j = 0; j < g->n_rails; j++) {
		const struct sc_rail_entry *o = &g->rails[j];
		if (o->backend != e->backend) {
			base[j][0] = '\0';
			continue;
		}
		if (o->r.netdev[0]) {
			snprintf(base[j], sizeof(base[j]), "%s", o->r.netdev);
		} else {
			const char *n = o->r.name, *colon = strrchr(n, ':');
			size_t len = colon ? (size_t)(colon - n) : strlen(n);
			if (n[0] == '[' && len >= 2 && n[len - 1] == ']') { /* "[v6]:port" */
				n++;
				len -= 2;
			}
			snprintf(base[j], sizeof(base[j]), "%.*s", (int)len, n);
		}
	}
	for (size_t j = 0; j < g->n_rails; j++)
		if (base[j][0] && strcmp(base[j], base[i]) == 0)
			same++;
	if (same > 1)
		snprintf(out, cap, "%s#%u", base[i], e->index);
	else
		snprintf(out, cap, "%s", base[i]);
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

	char rails[SC_METRICS_MAX_RAILS][80];
	for (size_t i = 0; i < g.n_rails; i++)
		rail_label(&g, i, rails[i], sizeof(rails[i]));
	family(f, "rdma_sidecar_rail_info", "gauge",
	       "1 for every rail, with its facts: endpoint (TCP: the data listener's address; "
	       "ibverbs: device:port), netdev, pci, numa.");
	for (size_t i = 0; i < g.n_rails; i++) {
		const struct sc_rail_report *r = &g.rails[i].r;
		fprintf(f, "rdma_sidecar_rail_info{backend=\"%s\",rail=\"",
			sc_backend_name(g.rails[i].backend));
		label_value(f, rails[i]);
		fputs("\",endpoint=\"", f);
		label_value(f, r->name);
		fputs("\",netdev=\"", f);
		label_value(f, r->netdev);
		fputs("\",pci=\"", f);
		label_value(f, r->pci);
		fprintf(f, "\",numa=\"%d\"} 1\n", r->numa);
	}
	family(f, "rdma_sidecar_rail_up", "gauge",
	       "1 while the rail can carry data (GetInfo rails says why not), by backend and rail.");
	for (size_t i = 0; i < g.n_rails; i++) {
		fprintf(f, "rdma_sidecar_rail_up{backend=\"%s\",rail=\"",
			sc_backend_name(g.rails[i].backend));
		label_value(f, rails[i]);
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
			label_value(f, rails[i]);
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

	/* Every reason from each faster backend to TCP at zero from the start (the alert and the
	 * dashboard need the series); other pairs once they happen. */
	family(f, "rdma_sidecar_backend_fallbacks_total", "counter",
	       "Active operations that moved to a slower backend than a configured faster one, by "
	       "from, to and reason: peer_lacks (the issuer does not offer it), unavailable (not "
	       "usable here), gpu_unreachable (the NIC cannot reach the GPU memory), "
	       "failed_mid_transfer.");
	for (int from = 0; from < SC_NUM_BACKENDS; from++)
		for (int to = 0; to < SC_NUM_BACKENDS; to++)
			for (int r = 0; r < SC_FALLBACK_NUM_REASONS; r++) {
				uint64_t v = get(&m->fallbacks[from][to][r]);
				bool listed = to == SC_BACKEND_TCP && from == SC_BACKEND_IBVERBS &&
					      sc_backend_registry_find(SC_BACKEND_IBVERBS);
				if (!v && !listed)
					continue;
				fprintf(
				    f,
				    "rdma_sidecar_backend_fallbacks_total{from=\"%s\",to=\"%s\","
				    "reason=\"%s\"} %llu\n",
				    sc_backend_name((enum sc_backend_kind)from),
				    sc_backend_name((enum sc_backend_kind)to), fallback_label[r],
				    (unsigned long long)v);
			}

	render_histograms(f, m);
	render_grpc(f, m);
	render_nats(f, m, &g);

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

	render_process(f);

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
