/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctl.c: rdma-sidecar-ctl, the operator's command line on librdma-sidecar-client. One command per
 * run (info, health, ping, regions, ops, op, wait, watch, cancel, publish, subscribe,
 * wait-metadata, read, write, connect), text or --json output on stdout, errors on stderr. Exit
 * codes: 0 ok, 1 the operation failed (connect: no path ready), 2 usage, 3 cannot reach the
 * sidecar. Single-threaded; owns one client for the run.
 */
#include <rdma_sidecar/client.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define EXIT_UNREACHABLE 3
#define DEFAULT_ADDR "unix:/tmp/rdma-sidecar/sidecar.sock"

struct ctl {
	rsc_client *c;
	int json;
	double timeout_s; /* waits and transfers; < 0 = not given */
	long count;	  /* subscribe: stop after N events (0 = no limit); ping: calls */
	long interval_ms; /* ping: pause between calls; < 0 = not given */
	const char *queue;
	const char *target;
	const char *traceparent; /* read/write: --traceparent */
};

struct command {
	const char *name;
	const char *args;
	int nargs;
	const char *help;
	int (*run)(struct ctl *x, char **argv);
};

/* ---- output -----------------------------------------------------------------------------------
 */

static void jstr(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", stdout);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void jkey(const char *k, int *first)
{
	if (!*first)
		putchar(',');
	*first = 0;
	jstr(k);
	putchar(':');
}

static void jkv_s(const char *k, const char *v, int *first)
{
	jkey(k, first);
	jstr(v);
}

static void jkv_u(const char *k, uint64_t v, int *first)
{
	jkey(k, first);
	printf("%" PRIu64, v);
}

static void jkv_i(const char *k, int64_t v, int *first)
{
	jkey(k, first);
	printf("%" PRId64, v);
}

static void jkv_b(const char *k, int v, int *first)
{
	jkey(k, first);
	fputs(v ? "true" : "false", stdout);
}

static void jstrv(const char *k, char **v, size_t n, int *first)
{
	jkey(k, first);
	putchar('[');
	for (size_t i = 0; i < n; i++) {
		if (i)
			putchar(',');
		jstr(v[i]);
	}
	putchar(']');
}

/* rails: the operation's rail usage, or NULL to leave the key out. */
static void op_json(const rsc_operation *o, const rsc_rail_usage_list *rails)
{
	int f = 1;
	putchar('{');
	jkv_s("operation_id", o->operation_id, &f);
	jkv_s("kind", rsc_op_kind_name(o->kind), &f);
	jkv_s("status", rsc_op_status_name(o->status), &f);
	jkv_s("backend", rsc_backend_name(o->backend), &f);
	jkv_u("bytes_total", o->bytes_total, &f);
	jkv_u("bytes_done", o->bytes_done, &f);
	jkv_s("metadata", o->metadata, &f);
	jkey("error", &f);
	if (o->error_code || (o->error_message && o->error_message[0])) {
		int e = 1;
		putchar('{');
		jkv_u("code", (uint64_t)o->error_code, &e);
		jkv_s("code_name", rsc_code_name(o->error_code), &e);
		jkv_s("message", o->error_message, &e);
		putchar('}');
	} else {
		fputs("null", stdout);
	}
	jkv_s("peer", o->peer, &f);
	jkv_u("created_unix_ms", o->created_unix_ms, &f);
	jkv_u("deadline_unix_ms", o->deadline_unix_ms, &f);
	jkv_u("completed_unix_ms", o->completed_unix_ms, &f);
	jkv_s("request_id", o->request_id, &f);
	jkey("descriptors", &f);
	putchar('[');
	for (size_t i = 0; i < o->n_descriptors; i++) {
		int d = 1;
		printf("%s{", i ? "," : "");
		jkv_s("region_id", o->descriptors[i].region_id, &d);
		jkv_u("offset", o->descriptors[i].offset, &d);
		jkv_u("length", o->descriptors[i].length, &d);
		putchar('}');
	}
	putchar(']');
	jkv_s("backend_reason", o->backend_reason, &f);
	jkv_u("uses_left", o->uses_left, &f);
	jkv_s("trace_id", o->trace_id, &f);
	if (rails) {
		jkey("rails", &f);
		putchar('[');
		for (size_t i = 0; i < rails->count; i++) {
			int r = 1;
			printf("%s{", i ? "," : "");
			jkv_s("rail", rails->items[i].rail, &r);
			jkv_u("bytes", rails->items[i].bytes, &r);
			putchar('}');
		}
		putchar(']');
	}
	putchar('}');
}

static void op_text_trace(const rsc_operation *o, bool trace)
{
	printf("%s  %s  %s  %s  %" PRIu64 "/%" PRIu64 " bytes", o->operation_id,
	       rsc_op_kind_name(o->kind), rsc_op_status_name(o->status),
	       rsc_backend_name(o->backend), o->bytes_done, o->bytes_total);
	if (o->peer && o->peer[0])
		printf("  peer %s", o->peer);
	if (o->error_code || (o->error_message && o->error_message[0]))
		printf("  error %s: %s", rsc_code_name(o->error_code), o->error_message);
	if (trace && o->trace_id && o->trace_id[0])
		printf("  trace %s", o->trace_id);
	putchar('\n');
}

static void op_text(const rsc_operation *o)
{
	op_text_trace(o, false);
}

/* rails: the operation's rail usage (op ID), or NULL. */
static void op_print_rails(const struct ctl *x, const rsc_operation *o,
			   const rsc_rail_usage_list *rails)
{
	if (x->json) {
		op_json(o, rails);
		putchar('\n');
		return;
	}
	op_text(o);
	if (o->metadata && o->metadata[0])
		printf("metadata %s\n", o->metadata);
	for (size_t i = 0; rails && i < rails->count; i++)
		printf("rail     %s  %" PRIu64 " bytes\n", rails->items[i].rail,
		       rails->items[i].bytes);
}

static void op_print(const struct ctl *x, const rsc_operation *o)
{
	op_print_rails(x, o, NULL);
}

static int fail(const rsc_status *st, const char *what)
{
	fprintf(stderr, "rdma-sidecar-ctl: %s: %s: %s\n", what, rsc_code_name(st->code),
		st->message);
	return EXIT_FAILED;
}

static uint64_t timeout_ms(const struct ctl *x, double def_s)
{
	double s = x->timeout_s >= 0 ? x->timeout_s : def_s;
	return (uint64_t)(s * 1000.0);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* info's rails, topology and topology_source as JSON keys of the enclosing object. */
static void rails_json(const rsc_info_rails *rl, int *f)
{
	jkey("rails", f);
	putchar('[');
	for (size_t i = 0; i < rl->n_rails; i++) {
		const rsc_rail_info *r = &rl->rails[i];
		int k = 1;
		printf("%s{", i ? "," : "");
		jkv_u("index", r->index, &k);
		jkv_s("backend", rsc_backend_name(r->backend), &k);
		jkv_s("name", r->name, &k);
		jkv_s("pci_address", r->pci_address, &k);
		jkv_i("numa_node", r->numa_node, &k);
		jkv_u("rate_mbps", r->rate_mbps, &k);
		jkv_s("state", r->state, &k);
		jkv_s("detail", r->detail, &k);
		jkv_s("netdev", r->netdev, &k);
		jkv_u("bytes", r->bytes, &k);
		jkv_u("operations", r->operations, &k);
		jkv_u("errors", r->errors, &k);
		jkv_u("failovers", r->failovers, &k);
		putchar('}');
	}
	putchar(']');
	jkey("topology", f);
	putchar('[');
	for (size_t i = 0; i < rl->n_topology; i++) {
		const rsc_memory_rails *t = &rl->topology[i];
		int k = 1;
		printf("%s{", i ? "," : "");
		jkv_s("memory", t->memory, &k);
		jkv_i("gpu_index", t->gpu_index, &k);
		jkv_s("pci_address", t->pci_address, &k);
		jkv_i("numa_node", t->numa_node, &k);
		jkey("rails", &k);
		putchar('[');
		for (size_t j = 0; j < t->n_rails; j++) {
			int d = 1;
			printf("%s{", j ? "," : "");
			jkv_s("rail", t->rails[j].rail, &d);
			jkv_s("distance", t->rails[j].distance, &d);
			putchar('}');
		}
		putchar(']');
		jstrv("chosen", t->chosen, t->n_chosen, &k);
		putchar('}');
	}
	putchar(']');
	jkv_s("topology_source", rl->topology_source, f);
}

/* The distance class of a rail from a memory row ("?" when the row does not rank it). */
static const char *rail_class(const rsc_memory_rails *t, const char *rail)
{
	for (size_t j = 0; j < t->n_rails; j++)
		if (strcmp(t->rails[j].rail, rail) == 0)
			return t->rails[j].distance;
	return "?";
}

/* info's rails, one line each, then the topology table: memory -> chosen rails (class). */
static void rails_text(const rsc_info_rails *rl)
{
	for (size_t i = 0; i < rl->n_rails; i++) {
		const rsc_rail_info *r = &rl->rails[i];
		char numa[16] = "?", rate[32] = "?";
		if (r->numa_node >= 0)
			snprintf(numa, sizeof(numa), "%d", (int)r->numa_node);
		if (r->rate_mbps)
			snprintf(rate, sizeof(rate), "%" PRIu64 " Mb/s", r->rate_mbps);
		printf("rail     %-16s %-8s %-9s pci %-12s numa %-2s rate %-12s %s\n", r->name,
		       rsc_backend_name(r->backend), r->state,
		       r->pci_address[0] ? r->pci_address : "-", numa, rate, r->detail);
	}
	printf("topology %s\n", rl->topology_source);
	for (size_t i = 0; i < rl->n_topology; i++) {
		const rsc_memory_rails *t = &rl->topology[i];
		printf("  %-8s ->", t->memory);
		if (!t->n_chosen)
			fputs(" (no rail)", stdout);
		for (size_t j = 0; j < t->n_chosen; j++)
			printf("%s %s (%s)", j ? "," : "", t->chosen[j],
			       rail_class(t, t->chosen[j]));
		putchar('\n');
	}
}

/* ---- commands ---------------------------------------------------------------------------------
 */

static int cmd_info(struct ctl *x, char **argv)
{
	rsc_info in;
	rsc_info_rails rl;
	rsc_status st;
	rsc_info_limits lim;
	if (rsc_get_info_rails(x->c, &in, &rl, &st) != RSC_OK)
		return fail(&st, "info");
	if (rsc_get_info_limits(x->c, &lim, &st) != RSC_OK) {
		rsc_info_rails_clear(&rl);
		rsc_info_clear(&in);
		return fail(&st, "info");
	}
	if (x->json) {
		int f = 1;
		putchar('{');
		jkv_s("sidecar_id", in.sidecar_id, &f);
		jkv_s("version", in.version, &f);
		jkey("backends", &f);
		putchar('[');
		for (size_t i = 0; i < in.n_backends; i++) {
			int b = 1;
			printf("%s{", i ? "," : "");
			jkv_s("backend", rsc_backend_name(in.backends[i].backend), &b);
			jkv_b("available", in.backends[i].available, &b);
			jkv_s("detail", in.backends[i].detail, &b);
			putchar('}');
		}
		putchar(']');
		jstrv("data_endpoints", in.data_endpoints, in.n_data_endpoints, &f);
		jstrv("grpc_listeners", in.grpc_listeners, in.n_grpc_listeners, &f);
		jkv_s("nats_state", in.nats_state, &f);
		jkv_b("signing_enabled", in.signing_enabled, &f);
		jkv_s("signing_key_id", in.signing_key_id, &f);
		jkv_b("cuda_available", in.cuda_available, &f);
		jkv_s("cuda_detail", in.cuda_detail, &f);
		jkey("gpus", &f);
		putchar('[');
		for (size_t i = 0; i < in.n_gpus; i++) {
			int g = 1;
			printf("%s{", i ? "," : "");
			jkv_u("index", in.gpus[i].index, &g);
			jkv_s("name", in.gpus[i].name, &g);
			jkv_s("pci_bus_id", in.gpus[i].pci_bus_id, &g);
			jkv_u("total_memory", in.gpus[i].total_memory, &g);
			jkv_s("rdma_path", in.gpus[i].rdma_path, &g);
			putchar('}');
		}
		putchar(']');
		jkv_u("open_files_limit", lim.open_files_limit, &f);
		jkv_u("memlock_limit", lim.memlock_limit, &f);
		jkv_u("memlock_needed", lim.memlock_needed, &f);
		jkv_b("memlock_enough", lim.memlock_enough, &f);
		jkv_s("memlock_detail", lim.memlock_detail, &f);
		rails_json(&rl, &f);
		puts("}");
	} else {
		printf("sidecar  %s (version %s)\n", in.sidecar_id, in.version);
		for (size_t i = 0; i < in.n_backends; i++)
			printf("backend  %-8s %s  %s\n", rsc_backend_name(in.backends[i].backend),
			       in.backends[i].available ? "available  " : "unavailable",
			       in.backends[i].detail);
		for (size_t i = 0; i < in.n_grpc_listeners; i++)
			printf("grpc     %s\n", in.grpc_listeners[i]);
		for (size_t i = 0; i < in.n_data_endpoints; i++)
			printf("data     %s\n", in.data_endpoints[i]);
		printf("nats     %s\n", in.nats_state);
		printf("signing  %s\n",
		       in.signing_enabled ? in.signing_key_id : "disabled (no --key-file)");
		printf("cuda     %s\n", in.cuda_available ? "available" : in.cuda_detail);
		for (size_t i = 0; i < in.n_gpus; i++)
			printf("gpu %u    %s %s (%s)\n", in.gpus[i].index, in.gpus[i].name,
			       in.gpus[i].pci_bus_id, in.gpus[i].rdma_path);
		printf("memlock  %s%s\n",
		       lim.memlock_enough ? "" : "TOO LOW: ", lim.memlock_detail);
		rails_text(&rl);
	}
	rsc_info_limits_clear(&lim);
	rsc_info_rails_clear(&rl);
	rsc_info_clear(&in);
	return 0;
}

static int cmd_health(struct ctl *x, char **argv)
{
	static const char *const names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
	rsc_status st;
	int s = 0;
	if (rsc_health_check(x->c, argv[0], &s, &st) != RSC_OK)
		return fail(&st, "health");
	const char *name = s >= 0 && s <= 3 ? names[s] : "UNKNOWN";
	if (x->json) {
		int f = 1;
		putchar('{');
		jkv_s("status", name, &f);
		jkv_b("serving", s == 1, &f);
		puts("}");
	} else {
		puts(name);
	}
	return s == 1 ? 0 : EXIT_FAILED;
}

static double mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The nearest-rank percentile p (0..100) of n sorted values. */
static double percentile(const double *v, size_t n, double p)
{
	size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	return v[rank ? (rank > n ? n : rank) - 1 : 0];
}

/* ping: the gRPC round trip, timed: --count N grpc.health.v1 Check calls (the cheapest call the
 * sidecar answers), --interval-ms M apart; a summary like ping(8)'s. Exit 1 when any call
 * failed. */
static int cmd_ping(struct ctl *x, char **argv)
{
	(void)argv;
	long n = x->count > 0 ? x->count : 10,
	     interval = x->interval_ms >= 0 ? x->interval_ms : 100;
	double *rtt = calloc((size_t)n, sizeof(*rtt));
	if (!rtt) {
		fprintf(stderr, "rdma-sidecar-ctl: ping: out of memory for %ld calls\n", n);
		return EXIT_FAILED;
	}
	size_t ok = 0;
	long failed = 0;
	double t_begin = mono_us();
	if (!x->json)
		printf("PING %s: grpc.health.v1 Check, %ld calls, %ld ms apart\n", x->target, n,
		       interval);
	for (long i = 0; i < n; i++) {
		if (i && interval) {
			struct timespec ts = {.tv_sec = interval / 1000,
					      .tv_nsec = (interval % 1000) * 1000000L};
			nanosleep(&ts, NULL);
		}
		rsc_status st;
		int serving = 0;
		double t0 = mono_us();
		int r = rsc_health_check(x->c, NULL, &serving, &st);
		double dt = mono_us() - t0;
		if (r != RSC_OK) {
			failed++;
			if (!x->json)
				printf("seq=%ld failed: %s\n", i + 1, st.message);
			continue;
		}
		rtt[ok++] = dt;
		if (!x->json)
			printf("seq=%ld time=%.1f us%s\n", i + 1, dt,
			       serving == 1 ? "" : " (not serving)");
	}
	double total_ms = (mono_us() - t_begin) / 1e3;
	qsort(rtt, ok, sizeof(*rtt), cmp_double);
	double mn = ok ? rtt[0] : 0, p50 = ok ? percentile(rtt, ok, 50) : 0,
	       p99 = ok ? percentile(rtt, ok, 99) : 0, mx = ok ? rtt[ok - 1] : 0;
	if (x->json) {
		int f = 1;
		putchar('{');
		jkv_s("target", x->target, &f);
		jkv_u("calls", (uint64_t)n, &f);
		jkv_u("answered", ok, &f);
		jkv_u("failed", (uint64_t)failed, &f);
		printf(",\"min_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f}\n", mn,
		       p50, p99, mx);
	} else {
		printf("\n--- %s ping statistics ---\n", x->target);
		printf("%ld calls, %zu answered, %.0f%% failed, time %.0f ms\n", n, ok,
		       100.0 * (double)failed / (double)n, total_ms);
		if (ok)
			printf("rtt min/p50/p99/max = %.1f/%.1f/%.1f/%.1f us\n", mn, p50, p99, mx);
	}
	free(rtt);
	return failed ? EXIT_FAILED : 0;
}

static int cmd_regions(struct ctl *x, char **argv)
{
	rsc_region_list l;
	rsc_status st;
	if (rsc_region_list_get(x->c, &l, &st) != RSC_OK)
		return fail(&st, "regions");
	if (x->json)
		fputs("{\"regions\":[", stdout);
	for (size_t i = 0; i < l.count; i++) {
		const rsc_region *r = &l.items[i];
		if (x->json) {
			int f = 1;
			printf("%s{", i ? "," : "");
			jkv_s("region_id", r->region_id, &f);
			jkv_s("device_kind", r->device_kind == RSC_DEVICE_CUDA ? "cuda" : "host",
			      &f);
			jkv_u("device_index", r->device_index, &f);
			jkv_u("size", r->size, &f);
			jkv_s("path", r->path, &f);
			jkv_u("file_offset", r->file_offset, &f);
			jkv_s("name", r->name, &f);
			jkv_u("live_operations", r->live_operations, &f);
			putchar('}');
		} else {
			printf("%s  %s  %" PRIu64 " bytes  %u live  %s  %s\n", r->region_id,
			       r->device_kind == RSC_DEVICE_CUDA ? "cuda" : "host", r->size,
			       r->live_operations, r->name && r->name[0] ? r->name : "-", r->path);
		}
	}
	if (x->json)
		puts("]}");
	else if (l.count == 0)
		puts("no regions");
	rsc_region_list_clear(&l);
	return 0;
}

static int cmd_ops(struct ctl *x, char **argv)
{
	rsc_operation_list l;
	rsc_status st;
	if (rsc_operation_list_get(x->c, &l, &st) != RSC_OK)
		return fail(&st, "ops");
	if (x->json)
		fputs("{\"operations\":[", stdout);
	for (size_t i = 0; i < l.count; i++) {
		if (x->json) {
			if (i)
				putchar(',');
			op_json(&l.items[i], NULL);
		} else {
			op_text(&l.items[i]);
		}
	}
	if (x->json)
		puts("]}");
	else if (l.count == 0)
		puts("no operations");
	rsc_operation_list_clear(&l);
	return 0;
}

static int cmd_op(struct ctl *x, char **argv)
{
	rsc_operation o;
	rsc_rail_usage_list rails;
	rsc_status st;
	if (rsc_operation_get_rails(x->c, argv[0], &o, &rails, &st) != RSC_OK)
		return fail(&st, "op");
	op_print_rails(x, &o, &rails);
	rsc_rail_usage_list_clear(&rails);
	rsc_operation_clear(&o);
	return 0;
}

static int cmd_wait(struct ctl *x, char **argv)
{
	rsc_operation o;
	rsc_status st;
	if (rsc_operation_wait(x->c, argv[0], timeout_ms(x, 30), &o, &st) != RSC_OK)
		return fail(&st, "wait");
	op_print(x, &o);
	int rc = o.status == RSC_STATUS_COMPLETE ? 0 : EXIT_FAILED;
	if (!rsc_op_status_terminal(o.status))
		fprintf(stderr, "rdma-sidecar-ctl: wait: %s is still %s after %.1f s\n", argv[0],
			rsc_op_status_name(o.status), (double)timeout_ms(x, 30) / 1000.0);
	rsc_operation_clear(&o);
	return rc;
}

struct watch_state {
	const struct ctl *x;
	int last_status;
};

static int on_watch(const rsc_operation *o, void *user)
{
	struct watch_state *w = user;
	if (w->x->json) {
		op_print(w->x, o);
	} else {
		/* Each update with its trace id, the key to both sidecars' log lines of it. */
		op_text_trace(o, true);
		if (o->metadata && o->metadata[0])
			printf("metadata %s\n", o->metadata);
	}
	fflush(stdout);
	w->last_status = o->status;
	return 0;
}

static int cmd_watch(struct ctl *x, char **argv)
{
	rsc_status st;
	struct watch_state w = {.x = x};
	int rc = rsc_operation_watch(x->c, argv[0], on_watch, &w, timeout_ms(x, 0), &st);
	if (rc == RSC_DEADLINE_EXCEEDED && w.last_status) {
		fprintf(stderr, "rdma-sidecar-ctl: watch: %s still %s after %.1f s\n", argv[0],
			rsc_op_status_name(w.last_status), x->timeout_s);
		return EXIT_FAILED;
	}
	if (rc != RSC_OK)
		return fail(&st, "watch");
	/* The stream ended after the terminal state: its outcome decides the exit code. */
	return w.last_status == RSC_STATUS_COMPLETE ? 0 : EXIT_FAILED;
}

static int cmd_cancel(struct ctl *x, char **argv)
{
	rsc_operation o;
	rsc_status st;
	if (rsc_operation_cancel(x->c, argv[0], &o, &st) != RSC_OK)
		return fail(&st, "cancel");
	op_print(x, &o);
	rsc_operation_clear(&o);
	return 0;
}

static char *metadata_arg(const char *arg);

/* OPID, or the metadata itself: "rsm1." text or @file holding it. */
static int cmd_publish(struct ctl *x, char **argv)
{
	rsc_status st;
	const char *src = argv[1];
	bool text = strncmp(src, "rsm1.", 5) == 0 || src[0] == '@';
	char *md = text ? metadata_arg(src) : NULL;
	if (text && !md)
		return EXIT_USAGE;
	int r = text ? rsc_publish_metadata(x->c, argv[0], md, &st)
		     : rsc_publish(x->c, argv[0], src, &st);
	if (r != RSC_OK) {
		free(md);
		return fail(&st, "publish");
	}
	if (x->json) {
		int f = 1;
		putchar('{');
		jkv_b("published", 1, &f);
		jkv_s("subject", argv[0], &f);
		if (text)
			jkv_s("metadata", md, &f);
		else
			jkv_s("operation_id", src, &f);
		puts("}");
	} else if (text) {
		printf("published metadata (%zu characters) on %s\n", strlen(md), argv[0]);
	} else {
		printf("published %s on %s\n", src, argv[0]);
	}
	free(md);
	return 0;
}

static void event_json(const rsc_metadata_event *ev)
{
	int f = 1;
	putchar('{');
	jkv_s("subject", ev->subject, &f);
	jkv_s("issuer", ev->issuer, &f);
	jkv_s("kind", rsc_op_kind_name(ev->kind), &f);
	jkey("descriptor_lengths", &f);
	putchar('[');
	for (size_t i = 0; i < ev->n_lengths; i++)
		printf("%s%" PRIu64, i ? "," : "", ev->descriptor_lengths[i]);
	putchar(']');
	jkv_u("expires_unix_ms", ev->expires_unix_ms, &f);
	jkv_s("metadata", ev->metadata, &f);
	puts("}");
}

/* One-shot wait (WaitMetadata): the metadata text alone on stdout, for `md=$(... wait-metadata)`.
 */
static int cmd_wait_metadata(struct ctl *x, char **argv)
{
	rsc_status st;
	rsc_metadata_event ev = {0};
	if (rsc_wait_metadata(x->c, argv[0], timeout_ms(x, 30), &ev, &st) != RSC_OK)
		return fail(&st, "wait-metadata");
	if (x->json)
		event_json(&ev);
	else
		puts(ev.metadata);
	rsc_metadata_event_clear(&ev);
	return 0;
}

struct sub_state {
	const struct ctl *x;
	long seen;
};

static int on_event(const rsc_metadata_event *ev, void *user)
{
	struct sub_state *s = user;
	if (s->x->json) {
		event_json(ev);
	} else {
		uint64_t total = 0;
		for (size_t i = 0; i < ev->n_lengths; i++)
			total += ev->descriptor_lengths[i];
		printf("%s  %s from %s  %zu descriptors  %" PRIu64 " bytes  %s\n", ev->subject,
		       rsc_op_kind_name(ev->kind), ev->issuer, ev->n_lengths, total, ev->metadata);
	}
	fflush(stdout);
	s->seen++;
	return s->x->count > 0 && s->seen >= s->x->count;
}

static int cmd_subscribe(struct ctl *x, char **argv)
{
	rsc_status st;
	struct sub_state s = {.x = x};
	uint64_t t = x->timeout_s >= 0 ? timeout_ms(x, 0) : 0;
	int rc = rsc_subscribe(x->c, argv[0], x->queue, on_event, &s, t, &st);
	if (rc == RSC_DEADLINE_EXCEEDED && t) {
		if (x->count > 0 && s.seen < x->count) {
			fprintf(stderr,
				"rdma-sidecar-ctl: subscribe: %ld of %ld events within %.1f s\n",
				s.seen, x->count, x->timeout_s);
			return EXIT_FAILED;
		}
		return 0;
	}
	return rc == RSC_OK ? 0 : fail(&st, "subscribe");
}

static char *metadata_arg(const char *arg)
{
	if (arg[0] != '@')
		return strdup(arg);
	FILE *f = fopen(arg + 1, "rb");
	if (!f) {
		fprintf(stderr, "rdma-sidecar-ctl: cannot open %s: %s\n", arg + 1, strerror(errno));
		return NULL;
	}
	char *buf = calloc(1, 1 << 20);
	size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
	fclose(f);
	while (buf && n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return buf;
}

/* read and write: a fresh region laid out like the metadata's descriptors, one transfer. */
static int transfer(struct ctl *x, char **argv, int write)
{
	const char *what = write ? "write" : "read";
	rsc_status st;
	rsc_region region = {0};
	rsc_operation op = {0};
	rsc_descriptor_set *sets = NULL;
	uint64_t *lengths = NULL, total = 0;
	size_t n = 0;
	int kind = 0, rc = EXIT_FAILED;
	void *mem = NULL;
	FILE *f = NULL;
	char *md = metadata_arg(argv[0]);
	if (!md)
		return EXIT_USAGE;
	if (rsc_metadata_lengths(md, &lengths, &n, &kind, &st) != RSC_OK) {
		fail(&st, what);
		goto out;
	}
	if (kind != (write ? RSC_KIND_WRITABLE : RSC_KIND_READABLE)) {
		fprintf(stderr,
			"rdma-sidecar-ctl: %s: the metadata is for a %s operation; use `%s`\n",
			what, rsc_op_kind_name(kind), write ? "read" : "write");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		total += lengths[i];
	if (write) {
		struct stat sb;
		f = fopen(argv[1], "rb");
		if (!f || fstat(fileno(f), &sb) != 0) {
			fprintf(stderr, "rdma-sidecar-ctl: write: cannot open %s: %s\n", argv[1],
				strerror(errno));
			goto out;
		}
		if ((uint64_t)sb.st_size != total) {
			fprintf(stderr,
				"rdma-sidecar-ctl: write: %s has %lld bytes but the writable takes "
				"%" PRIu64 " (in %zu descriptors)\n",
				argv[1], (long long)sb.st_size, total, n);
			goto out;
		}
	}
	if (rsc_region_create(x->c, total, write ? "ctl-write" : "ctl-read", &region, &st) !=
	    RSC_OK) {
		fail(&st, what);
		goto out;
	}
	int mapped =
	    rsc_region_map(&region, &mem, &st) == RSC_OK; /* else: Read/WriteRegion streams */
	if (write) {
		char *buf = mapped ? mem : malloc(total);
		if (!buf || fread(buf, 1, total, f) != total) {
			fprintf(stderr, "rdma-sidecar-ctl: write: cannot read %s\n", argv[1]);
			if (!mapped)
				free(buf);
			goto out;
		}
		int r =
		    mapped ? RSC_OK : rsc_region_write(x->c, region.region_id, 0, buf, total, &st);
		if (!mapped)
			free(buf);
		if (r != RSC_OK) {
			fail(&st, what);
			goto out;
		}
	}
	/* The local side back to back in the fresh region, as compact strided runs: one per stretch
	 * of equal lengths (a KV-cache list of 16,384 blocks is one run). */
	sets = calloc(n ? n : 1, sizeof(*sets));
	if (!sets)
		goto out;
	size_t n_sets = 0;
	for (size_t i = 0, off = 0; i < n;) {
		size_t j = i + 1;
		while (j < n && lengths[j] == lengths[i] && j - i < UINT32_MAX)
			j++;
		sets[n_sets++] =
		    (rsc_descriptor_set){.kind = RSC_SET_STRIDED_RUN,
					 .strided_run = {region.region_id, off, lengths[i],
							 (uint32_t)(j - i), lengths[i]}};
		off += lengths[i] * (j - i);
		i = j;
	}
	uint64_t t = timeout_ms(x, 60);
	rsc_transfer_args a = {.metadata = md, .timeout_ms = t};
	double t0 = now_s();
	int r = write ? rsc_write_traced(x->c, &a, sets, n_sets, t, x->traceparent, &op, &st)
		      : rsc_read_traced(x->c, &a, sets, n_sets, t, x->traceparent, &op, &st);
	double secs = now_s() - t0;
	if (r != RSC_OK) {
		fail(&st, what);
		goto out;
	}
	if (op.status == RSC_STATUS_COMPLETE && !write) {
		FILE *o = fopen(argv[1], "wb");
		char *buf = mapped ? mem : malloc(total);
		size_t got = 0;
		int ok = o && buf;
		if (ok && !mapped &&
		    rsc_region_read(x->c, region.region_id, 0, buf, total, &got, &st) != RSC_OK) {
			fail(&st, what);
			ok = 0;
		}
		if (ok && fwrite(buf, 1, total, o) != total)
			ok = 0;
		if (o && fclose(o) != 0)
			ok = 0;
		if (!mapped)
			free(buf);
		if (!ok) {
			fprintf(stderr, "rdma-sidecar-ctl: read: cannot write %s: %s\n", argv[1],
				strerror(errno));
			goto out;
		}
	}
	if (x->json) {
		int fj = 1;
		putchar('{');
		jkv_s("direction", what, &fj);
		jkv_s("file", argv[1], &fj);
		jkv_u("bytes", total, &fj);
		jkv_u("descriptors", n, &fj);
		jkey("seconds", &fj);
		printf("%.6f", secs);
		jkey("gb_per_s", &fj);
		printf("%.3f", secs > 0 ? (double)total / secs / 1e9 : 0.0);
		jkey("operation", &fj);
		op_json(&op, NULL);
		puts("}");
	} else {
		printf("%s %" PRIu64 " bytes %s %s: %s over %s in %.3f ms (%.3f GB/s)\n", what,
		       total, write ? "from" : "into", argv[1], rsc_op_status_name(op.status),
		       rsc_backend_name(op.backend), secs * 1e3,
		       secs > 0 ? (double)total / secs / 1e9 : 0.0);
		if (op.status != RSC_STATUS_COMPLETE)
			printf("error %s: %s\n", rsc_code_name(op.error_code), op.error_message);
		if (x->traceparent && op.trace_id && op.trace_id[0])
			printf("trace %s\n", op.trace_id);
	}
	rc = op.status == RSC_STATUS_COMPLETE ? 0 : EXIT_FAILED;
out:
	if (f)
		fclose(f);
	rsc_region_unmap(mem, region.size);
	if (op.operation_id)
		rsc_operation_release(x->c, op.operation_id, NULL);
	if (region.region_id)
		rsc_region_deregister(x->c, region.region_id, 1, NULL);
	rsc_operation_clear(&op);
	rsc_region_clear(&region);
	free(lengths);
	free(sets);
	free(md);
	return rc;
}

static int cmd_read(struct ctl *x, char **argv)
{
	return transfer(x, argv, 0);
}

static int cmd_write(struct ctl *x, char **argv)
{
	return transfer(x, argv, 1);
}

/* connect: ConnectPeer to the issuer of METADATA; exit 0 when any path is ready. */
static int cmd_connect(struct ctl *x, char **argv)
{
	char *md = metadata_arg(argv[0]);
	if (!md)
		return EXIT_USAGE;
	rsc_peer_connection pc;
	rsc_status st;
	uint64_t t = x->timeout_s >= 0 ? timeout_ms(x, 0) : 0;
	int rc = rsc_connect_peer(x->c, md, t, &pc, &st);
	free(md);
	if (rc != RSC_OK)
		return fail(&st, "connect");
	int ready = 0;
	for (size_t i = 0; i < pc.n_paths; i++)
		ready |= pc.paths[i].ready;
	if (x->json) {
		int f = 1;
		putchar('{');
		jkv_s("peer", pc.peer, &f);
		jkv_b("ready", ready, &f);
		jkey("paths", &f);
		putchar('[');
		for (size_t i = 0; i < pc.n_paths; i++) {
			int p = 1;
			printf("%s{", i ? "," : "");
			jkv_s("backend", rsc_backend_name(pc.paths[i].backend), &p);
			jkv_b("ready", pc.paths[i].ready, &p);
			jkv_s("detail", pc.paths[i].detail, &p);
			jkv_u("elapsed_us", pc.paths[i].elapsed_us, &p);
			putchar('}');
		}
		puts("]}");
	} else {
		printf("peer     %s\n", pc.peer);
		for (size_t i = 0; i < pc.n_paths; i++)
			printf("path     %-8s %-9s %8.3f ms  %s\n",
			       rsc_backend_name(pc.paths[i].backend),
			       pc.paths[i].ready ? "ready" : "not ready",
			       (double)pc.paths[i].elapsed_us / 1000.0, pc.paths[i].detail);
		if (!pc.n_paths)
			puts("path     none (no backend both sides offer)");
	}
	rsc_peer_connection_clear(&pc);
	return ready ? 0 : EXIT_FAILED;
}

static const struct command commands[] = {
    {"info", "", 0,
     "identity, version, listeners, backends (and why one is unavailable), NATS, signing, GPUs, "
     "rails (name, backend, state, PCI address, NUMA node, rate, detail) and the topology table "
     "(each GPU's and NUMA node's memory -> the rails it goes through, with their PCIe distance "
     "class)",
     cmd_info},
    {"health", "", 0, "grpc.health.v1 Check of the whole server; exit 1 unless SERVING",
     cmd_health},
    {"ping", "", 0,
     "time the gRPC round trip to the sidecar: --count N calls (default 10), --interval-ms M "
     "apart (default 100), each a grpc.health.v1 Check (the cheapest call it answers); prints each "
     "call's time and a summary (min/p50/p99/max microseconds) like ping(8); exit 1 when any "
     "call failed",
     cmd_ping},
    {"regions", "", 0, "the registered regions", cmd_regions},
    {"ops", "", 0, "the operations the sidecar knows", cmd_ops},
    {"op", "ID", 1, "one operation, with the bytes each rail moved for it (NOT_FOUND: exit 1)",
     cmd_op},
    {"wait", "ID", 1,
     "wait until the operation is terminal (--timeout S, default 30); exit 0 only when COMPLETE",
     cmd_wait},
    {"watch", "ID", 1,
     "print the operation's state, then every change and progress update until it is terminal "
     "(--timeout S bounds it), each with the operation's trace id (\"trace <id>\"; --json: "
     "trace_id), the key to both sidecars' log lines of the transfer; exit 0 only when COMPLETE",
     cmd_watch},
    {"cancel", "ID", 1, "cancel an operation (the peer's ends too); prints its state", cmd_cancel},
    {"publish", "SUBJECT OPID|METADATA", 2,
     "publish a passive operation's metadata on a NATS subject: its operation id, or the "
     "\"rsm1.\" text itself (METADATA: rsm1. text or @file holding it; the sidecar verifies it "
     "first); with --nats-handoff jetstream the sidecar keeps it until the operation ends or "
     "expires, so a waiter that starts later still gets it",
     cmd_publish},
    {"wait-metadata", "SUBJECT", 1,
     "wait for the first verified metadata on SUBJECT (wildcards allowed), published before "
     "this call (kept by JetStream) or during it, and print its \"rsm1.\" text (--json: the "
     "event: subject, issuer, kind, descriptor_lengths, expires_unix_ms, metadata); --timeout S "
     "(default 30); exit 1 when nothing valid came in time (DEADLINE_EXCEEDED, saying whether "
     "anything was stored) or the sidecar refused the wait",
     cmd_wait_metadata},
    {"subscribe", "SUBJECT", 1,
     "print verified metadata published on SUBJECT (wildcards allowed), one line each; --count N "
     "stops "
     "after N (exit 1 when --timeout S passes first), --queue G joins a queue group",
     cmd_subscribe},
    {"read", "METADATA FILE", 2,
     "pull a remote readable into a fresh region and save its bytes to FILE (METADATA: rsm1. text "
     "or @file "
     "holding it); --timeout S (default 60); --traceparent TP tags the transfer's log lines",
     cmd_read},
    {"write", "METADATA FILE", 2,
     "push FILE's bytes (exactly the writable's size) into a remote writable; --timeout S (default "
     "60); --traceparent TP tags the transfer's log lines",
     cmd_write},
    {"connect", "METADATA", 1,
     "set up the connections to the sidecar that issued METADATA (rsm1. text or @file holding "
     "it; checked, not used up) before the first transfer, on every backend both sides offer; "
     "prints each path (backend, ready, time taken, detail); --timeout S bounds the setup "
     "(default: the sidecar's 10 s); exit 0 when any path is ready, 1 otherwise",
     cmd_connect},
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: rdma-sidecar-ctl [options] COMMAND [ARGS]\n\n"
		     "Talks to an rdma-sidecar over gRPC (librdma-sidecar-client).\n\ncommands:\n");
	for (size_t i = 0; i < N_COMMANDS; i++)
		fprintf(out, "  %-13s %-21s %s\n", commands[i].name, commands[i].args,
			commands[i].help);
	fprintf(
	    out,
	    "\noptions:\n"
	    "  --sidecar ADDR     unix:/path or host:port (env RDMA_SIDECAR_ADDR; "
	    "default " DEFAULT_ADDR ")\n"
	    "  --json             machine-readable output (one JSON object per line)\n"
	    "  --timeout S        seconds: wait/wait-metadata/read/write/connect bound, subscribe\n"
	    "                     duration\n"
	    "  --traceparent TP   read/write: a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>) "
	    "whose\n"
	    "                     trace id tags the transfer's log lines on both sidecars and is\n"
	    "                     printed (\"trace <id>\"; --json: operation.trace_id); default: a "
	    "new\n"
	    "                     one the sidecar makes\n"
	    "  --count N          subscribe: stop after N events; ping: calls (default 10)\n"
	    "  --interval-ms M    ping: milliseconds between calls (default 100)\n"
	    "  --queue G          subscribe: NATS queue group\n"
	    "  --connect-timeout S  seconds to reach the sidecar (default 5)\n"
	    "  --wait S           wait up to S seconds for a sidecar that is not up yet, retrying\n"
	    "                     failed connections (env RDMA_SIDECAR_WAIT_FOR_READY; default 0:\n"
	    "                     fail at once, after --connect-timeout)\n"
	    "  --tls-ca FILE      TLS: PEM roots of the sidecar's certificate (env "
	    "RDMA_SIDECAR_TLS_CA)\n"
	    "  --tls-cert FILE, --tls-key FILE   mutual TLS client certificate and key\n"
	    "  --tls-server-name NAME   name to check in the sidecar's certificate\n"
	    "  -h, --help         this text; `rdma-sidecar-ctl help COMMAND` or `COMMAND --help` "
	    "for one command\n"
	    "\nexit codes: 0 ok, 1 the operation failed, 2 usage, 3 cannot reach the sidecar\n");
}

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; name && i < N_COMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static void command_help(const struct command *c)
{
	printf("usage: rdma-sidecar-ctl [options] %s %s\n\n%s\n\n(see rdma-sidecar-ctl --help for "
	       "the options)\n",
	       c->name, c->args, c->help);
}

static int parse_seconds(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || v < 0 || v > 1e7)
		return -1;
	*out = v;
	return 0;
}

/* --wait: one quick look first; when the sidecar is not there, say so (on stderr, once) and wait
 * for it up to wait_s in all. */
static int wait_ready(rsc_client *c, double wait_s, rsc_status *st)
{
	uint32_t total_ms = wait_s * 1000 > 4e9 ? 4000000000u : (uint32_t)(wait_s * 1000);
	if (total_ms == 0)
		total_ms = 1;
	uint32_t first_ms = total_ms < 200 ? total_ms : 200;
	if (rsc_client_connect(c, first_ms, st) == RSC_OK)
		return RSC_OK;
	fprintf(stderr, "rdma-sidecar-ctl: waiting up to %.1f s for the sidecar at %s\n", wait_s,
		rsc_client_target(c));
	return rsc_client_wait_ready(c, total_ms, st);
}

int main(int argc, char **argv)
{
	enum {
		O_SIDECAR = 256,
		O_JSON,
		O_TIMEOUT,
		O_COUNT,
		O_INTERVAL,
		O_QUEUE,
		O_CONNECT,
		O_CA,
		O_CERT,
		O_KEY,
		O_NAME,
		O_WAIT,
		O_TRACEPARENT
	};
	static const struct option longopts[] = {
	    {"sidecar", required_argument, NULL, O_SIDECAR},
	    {"json", no_argument, NULL, O_JSON},
	    {"timeout", required_argument, NULL, O_TIMEOUT},
	    {"count", required_argument, NULL, O_COUNT},
	    {"interval-ms", required_argument, NULL, O_INTERVAL},
	    {"queue", required_argument, NULL, O_QUEUE},
	    {"connect-timeout", required_argument, NULL, O_CONNECT},
	    {"tls-ca", required_argument, NULL, O_CA},
	    {"tls-cert", required_argument, NULL, O_CERT},
	    {"tls-key", required_argument, NULL, O_KEY},
	    {"tls-server-name", required_argument, NULL, O_NAME},
	    {"wait", required_argument, NULL, O_WAIT},
	    {"traceparent", required_argument, NULL, O_TRACEPARENT},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct ctl x = {.timeout_s = -1, .interval_ms = -1};
	rsc_options o = {.target = getenv("RDMA_SIDECAR_ADDR"),
			 .tls_ca_file = getenv("RDMA_SIDECAR_TLS_CA")};
	double connect_s = 5, wait_s = 0;
	int help = 0, opt, li = -1;
	const char *wait_env = getenv("RDMA_SIDECAR_WAIT_FOR_READY");
	if (wait_env && wait_env[0] && parse_seconds(wait_env, &wait_s) != 0) {
		fprintf(stderr,
			"rdma-sidecar-ctl: bad value %s for RDMA_SIDECAR_WAIT_FOR_READY (seconds, "
			"e.g. 30)\n",
			wait_env);
		return EXIT_USAGE;
	}
	while ((opt = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
		switch (opt) {
		case O_SIDECAR:
			o.target = optarg;
			break;
		case O_JSON:
			x.json = 1;
			break;
		case O_TIMEOUT:
			if (parse_seconds(optarg, &x.timeout_s) != 0)
				goto bad_value;
			break;
		case O_CONNECT:
			if (parse_seconds(optarg, &connect_s) != 0)
				goto bad_value;
			break;
		case O_WAIT:
			if (parse_seconds(optarg, &wait_s) != 0)
				goto bad_value;
			break;
		case O_COUNT: {
			char *end;
			x.count = strtol(optarg, &end, 10);
			if (*end || end == optarg || x.count <= 0)
				goto bad_value;
			break;
		}
		case O_INTERVAL: {
			char *end;
			errno = 0;
			x.interval_ms = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || x.interval_ms < 0 ||
			    x.interval_ms > 3600000)
				goto bad_value;
			break;
		}
		case O_QUEUE:
			x.queue = optarg;
			break;
		case O_TRACEPARENT:
			x.traceparent = optarg;
			break;
		case O_CA:
			o.tls_ca_file = optarg;
			break;
		case O_CERT:
			o.tls_cert_file = optarg;
			break;
		case O_KEY:
			o.tls_key_file = optarg;
			break;
		case O_NAME:
			o.tls_server_name = optarg;
			break;
		case 'h':
			help = 1;
			break;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	const char *name = optind < argc ? argv[optind] : NULL;
	if (name && strcmp(name, "help") == 0) {
		const struct command *c = find_command(optind + 1 < argc ? argv[optind + 1] : NULL);
		if (optind + 1 < argc && !c) {
			fprintf(stderr, "rdma-sidecar-ctl: no command %s\n", argv[optind + 1]);
			return EXIT_USAGE;
		}
		if (c)
			command_help(c);
		else
			usage(stdout);
		return 0;
	}
	const struct command *cmd = find_command(name);
	if (help) {
		if (cmd)
			command_help(cmd);
		else
			usage(stdout);
		return 0;
	}
	if (!name) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!cmd) {
		fprintf(stderr, "rdma-sidecar-ctl: unknown command %s (see --help)\n", name);
		return EXIT_USAGE;
	}
	int nargs = argc - optind - 1;
	if (nargs != cmd->nargs) {
		fprintf(stderr, "rdma-sidecar-ctl: %s takes %d argument%s (%s), got %d\n",
			cmd->name, cmd->nargs, cmd->nargs == 1 ? "" : "s",
			cmd->nargs ? cmd->args : "none", nargs);
		return EXIT_USAGE;
	}
	rsc_status st;
	if (rsc_client_create(&o, &x.c, &st) != RSC_OK) {
		fprintf(stderr, "rdma-sidecar-ctl: %s\n", st.message);
		return EXIT_USAGE;
	}
	x.target = rsc_client_target(x.c);
	int rc;
	if (wait_s > 0 ? wait_ready(x.c, wait_s, &st) != RSC_OK
		       : rsc_client_connect(x.c, (uint32_t)(connect_s * 1000), &st) != RSC_OK) {
		fprintf(stderr, "rdma-sidecar-ctl: %s\n", st.message);
		rc = EXIT_UNREACHABLE;
	} else {
		rc = cmd->run(&x, argv + optind + 1);
	}
	fflush(stdout);
	rsc_client_destroy(x.c);
	return rc;
bad_value:
	fprintf(stderr, "rdma-sidecar-ctl: bad value %s for --%s (see --help)\n", optarg,
		li >= 0 ? longopts[li].name : "an option");
	return EXIT_USAGE;
}
