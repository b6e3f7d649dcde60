/* SPDX-License-Identifier: Apache-2.0 */
/*
 * c_bench.c: sc-bench, the latency and rate driver on librdma-sidecar-client. N client threads,
 * each with its own clients of the passive and the active sidecar and its own two regions, run
 * READ or WRITE transfers of one size back to back. Each transfer is timed from the call that
 * begins it to the moment the caller sees COMPLETE (BeginRead/BeginWrite + WaitOperation, as a
 * worker does). The passive side's metadata is made ahead of time, as a producer would: one
 * readable/writable serves up to 64 transfers (max_uses), and making the next one is inside the
 * wall time but outside the per-transfer times. Prints one JSON object on stdout.
 *
 *   sc-bench --passive ADDR --active ADDR --direction read|write|rtt --size BYTES
 *            [--clients N] [--iters N] [--seconds S]
 * --direction rtt times one GetOperation round trip to the passive sidecar instead (the floor of
 * any call), fetching the readable that its warm-up READ used.
 */
#include <rdma_sidecar/client.h>

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define USES_PER_PASSIVE 64

struct bench {
	const char *passive_addr, *active_addr;
	int write;
	int rtt; /* --direction rtt: time GetOperation round trips to the passive sidecar instead */
	uint64_t size;
	int clients;
	long iters;
	double seconds;
};

struct worker {
	const struct bench *b;
	pthread_t thread;
	int index;
	double *lat; /* seconds, one per timed transfer */
	long n;
	int backend;
	char error[600];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static pthread_barrier_t start_line;
static double t_start, t_end_max;
static pthread_mutex_t end_mu = PTHREAD_MUTEX_INITIALIZER;

static void *run(void *arg)
{
	struct worker *w = arg;
	const struct bench *b = w->b;
	rsc_client *pc = NULL, *ac = NULL;
	rsc_region pr = {0}, ar = {0};
	rsc_operation passive = {0};
	void *pmem = NULL, *amem = NULL;
	rsc_status st;
	int uses_left = 0, ready = 0;
	double my_start = 0;
	rsc_options po = {.target = b->passive_addr}, ao = {.target = b->active_addr};

	if (rsc_client_create(&po, &pc, &st) || rsc_client_create(&ao, &ac, &st) ||
	    rsc_region_create(pc, b->size, "bench-passive", &pr, &st) ||
	    rsc_region_create(ac, b->size, "bench-active", &ar, &st) ||
	    rsc_region_map(&pr, &pmem, &st) || rsc_region_map(&ar, &amem, &st))
		goto fail;
	/* The holder of the data gets a pattern; the other side zeros. Checked after the warm-up.
	 */
	unsigned char *holder = b->write ? amem : pmem, *other = b->write ? pmem : amem;
	for (uint64_t i = 0; i < b->size; i += 4096)
		holder[i] = (unsigned char)(i / 4096 * 31 + (uint64_t)w->index + 1);
	holder[b->size - 1] = 0x5a;
	rsc_descriptor pd = {.region_id = pr.region_id, .offset = 0, .length = b->size};
	rsc_descriptor ad = {.region_id = ar.region_id, .offset = 0, .length = b->size};
	rsc_passive_args pa = {.descriptors = &pd,
			       .n_descriptors = 1,
			       .timeout_ms = 600000,
			       .max_uses = USES_PER_PASSIVE};
	ready = 1;
	for (long i = -1;; i++) { /* i == -1: the warm-up, not timed */
		if (i >= 0 && (i >= b->iters ||
			       (b->seconds > 0 && now_s() - my_start > b->seconds && i >= 3)))
			break;
		if (uses_left == 0) {
			rsc_operation_clear(&passive);
			int r = b->write ? rsc_create_writable(pc, &pa, &passive, &st)
					 : rsc_create_readable(pc, &pa, &passive, &st);
			if (r != RSC_OK)
				goto fail;
			uses_left = USES_PER_PASSIVE;
		}
		rsc_transfer_args ta = {.metadata = passive.metadata,
					.descriptors = &ad,
					.n_descriptors = 1,
					.timeout_ms = 600000};
		rsc_operation op;
		double t0 = now_s();
		int r;
		if (b->rtt && i >= 0)
			r = rsc_operation_get(pc, passive.operation_id, &op, &st);
		else if (b->write)
			r = rsc_write(ac, &ta, 600000, &op, &st);
		else
			r = rsc_read(ac, &ta, 600000, &op, &st);
		double dt = now_s() - t0;
		if (!(b->rtt && i >= 0))
			uses_left--;
		if (r != RSC_OK)
			goto fail;
		/* rtt: the passive operation stays INITIALIZED (uses left), a live one to fetch. */
		int ok = op.status == RSC_STATUS_COMPLETE || (b->rtt && i >= 0);
		if (!ok)
			snprintf(w->error, sizeof(w->error), "transfer %s: %s",
				 rsc_op_status_name(op.status), op.error_message);
		if (!(b->rtt && i >= 0))
			w->backend = op.backend;
		rsc_operation_clear(&op);
		if (!ok)
			goto out;
		if (i >= 0) {
			w->lat[w->n++] = dt;
		} else {
			if (memcmp(holder, other, b->size) != 0) {
				snprintf(w->error, sizeof(w->error),
					 "bytes differ after the warm-up transfer");
				goto out;
			}
			pthread_barrier_wait(&start_line);
			my_start = now_s();
			ready = 2;
		}
	}
	goto out;
fail:
	snprintf(w->error, sizeof(w->error), "%s: %s", rsc_code_name(st.code), st.message);
out:
	if (ready <
	    2) /* never let the others wait for a worker that failed before the start line */
		pthread_barrier_wait(&start_line);
	pthread_mutex_lock(&end_mu);
	if (now_s() > t_end_max)
		t_end_max = now_s();
	pthread_mutex_unlock(&end_mu);
	rsc_operation_clear(&passive);
	rsc_region_unmap(pmem, pr.size);
	rsc_region_unmap(amem, ar.size);
	if (pr.region_id)
		rsc_region_deregister(pc, pr.region_id, 1, NULL);
	if (ar.region_id)
		rsc_region_deregister(ac, ar.region_id, 1, NULL);
	rsc_region_clear(&pr);
	rsc_region_clear(&ar);
	rsc_client_destroy(pc);
	rsc_client_destroy(ac);
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(const double *v, long n, double p)
{
	long i = (long)(p / 100.0 * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"passive", required_argument, NULL, 'p'},
	    {"active", required_argument, NULL, 'a'},
	    {"direction", required_argument, NULL, 'd'},
	    {"size", required_argument, NULL, 's'},
	    {"clients", required_argument, NULL, 'c'},
	    {"iters", required_argument, NULL, 'n'},
	    {"seconds", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct bench b = {.clients = 1, .iters = 1000, .seconds = 0};
	int opt;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'p':
			b.passive_addr = optarg;
			break;
		case 'a':
			b.active_addr = optarg;
			break;
		case 'd':
			b.write = strcmp(optarg, "write") == 0;
			b.rtt = strcmp(optarg, "rtt") == 0;
			break;
		case 's':
			b.size = strtoull(optarg, NULL, 0);
			break;
		case 'c':
			b.clients = atoi(optarg);
			break;
		case 'n':
			b.iters = atol(optarg);
			break;
		case 't':
			b.seconds = atof(optarg);
			break;
		default:
			fprintf(stderr, "usage: sc-bench --passive ADDR --active ADDR --direction "
					"read|write|rtt --size BYTES "
					"[--clients N] [--iters N] [--seconds S]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (!b.passive_addr || !b.active_addr || b.size == 0 || b.clients < 1 || b.clients > 256 ||
	    b.iters < 1) {
		fprintf(stderr, "sc-bench: --passive, --active, --size (> 0), --clients 1..256, "
				"--iters >= 1 needed\n");
		return 2;
	}
	struct worker *ws = calloc((size_t)b.clients, sizeof(*ws));
	if (!ws)
		return 1;
	pthread_barrier_init(&start_line, NULL, (unsigned)b.clients + 1);
	for (int i = 0; i < b.clients; i++) {
		ws[i] = (struct worker){
		    .b = &b, .index = i, .lat = calloc((size_t)b.iters, sizeof(double))};
		if (!ws[i].lat || pthread_create(&ws[i].thread, NULL, run, &ws[i]) != 0)
			return 1;
	}
	pthread_barrier_wait(&start_line);
	t_start = now_s();
	long total = 0;
	int rc = 0, backend = 0;
	for (int i = 0; i < b.clients; i++) {
		pthread_join(ws[i].thread, NULL);
		total += ws[i].n;
		if (ws[i].error[0]) {
			fprintf(stderr, "sc-bench: client %d: %s\n", i, ws[i].error);
			rc = 1;
		}
		backend = ws[i].backend;
	}
	double wall = t_end_max - t_start;
	double *all = calloc((size_t)(total ? total : 1), sizeof(double));
	long k = 0;
	double sum = 0;
	for (int i = 0; i < b.clients; i++)
		for (long j = 0; j < ws[i].n; j++) {
			all[k++] = ws[i].lat[j];
			sum += ws[i].lat[j];
		}
	qsort(all, (size_t)total, sizeof(double), cmp);
	if (total > 0)
		printf("{\"direction\":\"%s\",\"size\":%" PRIu64
		       ",\"clients\":%d,\"ops\":%ld,\"backend\":\"%s\","
		       "\"seconds\":%.6f,\"gb_per_s\":%.4f,\"ops_per_s\":%.1f,\"t_min_us\":%.1f,"
		       "\"p50_us\":%.1f,"
		       "\"p99_us\":%.1f,\"p999_us\":%.1f,\"mean_us\":%.1f,\"ok\":%s}\n",
		       b.rtt	 ? "rtt"
		       : b.write ? "write"
				 : "read",
		       b.size, b.clients, total, rsc_backend_name(backend), wall,
		       (double)b.size * (double)total / wall / 1e9, (double)total / wall,
		       all[0] * 1e6, pct(all, total, 50) * 1e6, pct(all, total, 99) * 1e6,
		       pct(all, total, 99.9) * 1e6, sum / (double)total * 1e6,
		       rc ? "false" : "true");
	else
		rc = 1;
	for (int i = 0; i < b.clients; i++)
		free(ws[i].lat);
	free(ws);
	free(all);
	pthread_barrier_destroy(&start_line);
	return rc;
}
