/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast_path_bench.c: sc-fast-bench, the latency and rate of one READ or WRITE size through three
 * paths, driven by bench/fast_path_bench.py: raw TCP ping-pong of the same bytes over loopback
 * (the floor: a server thread per client in this process, TCP_NODELAY, a 8-byte request or ack
 * beside the payload), the sidecar over gRPC (rsc_read/rsc_write, one round trip each) and the
 * sidecar's fast path (rsc_fast_run on a prepared handle). N client threads each own their
 * connection, clients, regions and rsc_fast; each transfer is timed from the call to its end as
 * the caller sees it. The passive side's metadata accepts 1,048,576 uses, made (and, on the fast
 * path, prepared) before the clock starts. Prints one JSON object on stdout.
 *
 *   sc-fast-bench --mode tcp|grpc|fast --direction read|write --size BYTES [--clients N]
 *                 [--iters N] [--seconds S] [--passive ADDR --active ADDR] [--spin-us US|none]
 * --spin-us: rsc_fast_options.spin_us (default 0: the library's 50 us; none: never poll).
 */
#include <rdma_sidecar/client.h>

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define USES 1048576u

enum mode { MODE_TCP, MODE_GRPC, MODE_FAST };

struct bench {
	enum mode mode;
	const char *passive_addr, *active_addr;
	int write;
	uint64_t size;
	int clients;
	long iters;
	double seconds;
	uint32_t spin_us; /* rsc_fast_options.spin_us */
};

struct worker {
	const struct bench *b;
	pthread_t thread;
	int index;
	double *lat; /* seconds, one per timed transfer */
	long n;
	int backend;
	char error[600];
	/* tcp */
	int listen_fd, srv_fd, cli_fd;
	pthread_t srv_thread;
	unsigned char *buf, *srv_buf;
	/* the sidecar */
	rsc_client *pc, *ac;
	rsc_region pr, ar;
	void *pmem, *amem;
	rsc_operation passive;
	rsc_fast *f;
	uint32_t handle;
	const char *fast_mode;
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

/* ---- raw TCP ---------------------------------------------------------------------------------
 */

static int send_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

static int recv_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n) {
		ssize_t k = recv(fd, c, n, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The server side of one client's connection: READ answers an 8-byte request with size bytes,
 * WRITE takes size bytes and answers 8. Ends when the client closes. */
static void *tcp_serve(void *arg)
{
	struct worker *w = arg;
	uint64_t word = 0;
	for (;;) {
		if (w->b->write) {
			if (recv_all(w->srv_fd, w->srv_buf, w->b->size) ||
			    send_all(w->srv_fd, &word, sizeof(word)))
				break;
		} else if (recv_all(w->srv_fd, &word, sizeof(word)) ||
			   send_all(w->srv_fd, w->srv_buf, w->b->size)) {
			break;
		}
	}
	return NULL;
}

static int tcp_setup(struct worker *w)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int one = 1;
	w->buf = malloc(w->b->size);
	w->srv_buf = malloc(w->b->size);
	if (!w->buf || !w->srv_buf)
		return -1;
	memset(w->srv_buf, 0x5a, w->b->size);
	memset(w->buf, 0xa5, w->b->size);
	w->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (w->listen_fd < 0 || bind(w->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(w->listen_fd, 1) || getsockname(w->listen_fd, (struct sockaddr *)&sa, &sl))
		return -1;
	w->cli_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (w->cli_fd < 0 || connect(w->cli_fd, (struct sockaddr *)&sa, sizeof(sa)))
		return -1;
	w->srv_fd = accept(w->listen_fd, NULL, NULL);
	if (w->srv_fd < 0)
		return -1;
	setsockopt(w->cli_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(w->srv_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return pthread_create(&w->srv_thread, NULL, tcp_serve, w) ? -1 : 0;
}

static int tcp_once(struct worker *w)
{
	uint64_t word = 1;
	if (w->b->write)
		return send_all(w->cli_fd, w->buf, w->b->size) ||
			       recv_all(w->cli_fd, &word, sizeof(word))
			   ? -1
			   : 0;
	return send_all(w->cli_fd, &word, sizeof(word)) || recv_all(w->cli_fd, w->buf, w->b->size)
		   ? -1
		   : 0;
}

/* ---- the sidecar -----------------------------------------------------------------------------
 */

static int sidecar_setup(struct worker *w, rsc_status *st)
{
	const struct bench *b = w->b;
	rsc_options po = {.target = b->passive_addr}, ao = {.target = b->active_addr};
	if (rsc_client_create(&po, &w->pc, st) || rsc_client_create(&ao, &w->ac, st) ||
	    rsc_region_create(w->pc, b->size, "fbench-passive", &w->pr, st) ||
	    rsc_region_create(w->ac, b->size, "fbench-active", &w->ar, st) ||
	    rsc_region_map(&w->pr, &w->pmem, st) || rsc_region_map(&w->ar, &w->amem, st))
		return -1;
	/* The holder of the data gets a pattern; the other side zeros. Checked after the warm-up.
	 */
	unsigned char *holder = b->write ? w->amem : w->pmem;
	for (uint64_t i = 0; i < b->size; i += 4096)
		holder[i] = (unsigned char)(i / 4096 * 31 + (uint64_t)w->index + 1);
	holder[b->size - 1] = 0x5a;
	rsc_descriptor pd = {.region_id = w->pr.region_id, .offset = 0, .length = b->size};
	rsc_passive_args pa = {
	    .descriptors = &pd, .n_descriptors = 1, .timeout_ms = 3600000, .max_uses = USES};
	if (b->write ? rsc_create_writable(w->pc, &pa, &w->passive, st)
		     : rsc_create_readable(w->pc, &pa, &w->passive, st))
		return -1;
	if (b->mode != MODE_FAST)
		return 0;
	rsc_descriptor ad = {.region_id = w->ar.region_id, .offset = 0, .length = b->size};
	rsc_transfer_args ta = {.metadata = w->passive.metadata,
				.descriptors = &ad,
				.n_descriptors = 1,
				.timeout_ms = 600000};
	rsc_fast_options fo = {.spin_us = b->spin_us};
	if (rsc_fast_open(w->ac, &fo, &w->f, st) ||
	    rsc_fast_prepare(w->f, b->write ? RSC_KIND_WRITE : RSC_KIND_READ, &ta, &w->handle, st))
		return -1;
	w->fast_mode = rsc_fast_mode(w->f);
	return 0;
}

static int sidecar_once(struct worker *w, rsc_status *st)
{
	const struct bench *b = w->b;
	if (b->mode == MODE_FAST) {
		rsc_fast_completion c;
		if (rsc_fast_run(w->f, w->handle, 0, &c, st))
			return -1;
		w->backend = c.backend;
		if (c.code) {
			snprintf(w->error, sizeof(w->error), "run: %s: %s", rsc_code_name(c.code),
				 c.message);
			return -1;
		}
		return 0;
	}
	rsc_descriptor ad = {.region_id = w->ar.region_id, .offset = 0, .length = b->size};
	rsc_transfer_args ta = {.metadata = w->passive.metadata,
				.descriptors = &ad,
				.n_descriptors = 1,
				.timeout_ms = 600000};
	rsc_operation op;
	if (b->write ? rsc_write(w->ac, &ta, 600000, &op, st)
		     : rsc_read(w->ac, &ta, 600000, &op, st))
		return -1;
	int ok = op.status == RSC_STATUS_COMPLETE;
	if (!ok)
		snprintf(w->error, sizeof(w->error), "transfer %s: %s",
			 rsc_op_status_name(op.status), op.error_message);
	w->backend = op.backend;
	rsc_operation_clear(&op);
	return ok ? 0 : -1;
}

static void teardown(struct worker *w)
{
	if (w->b->mode == MODE_TCP) {
		if (w->cli_fd > 0)
			close(w->cli_fd);
		if (w->srv_thread)
			pthread_join(w->srv_thread, NULL);
		if (w->srv_fd > 0)
			close(w->srv_fd);
		if (w->listen_fd > 0)
			close(w->listen_fd);
		free(w->buf);
		free(w->srv_buf);
		return;
	}
	rsc_fast_close(w->f);
	rsc_operation_clear(&w->passive);
	rsc_region_unmap(w->pmem, w->pr.size);
	rsc_region_unmap(w->amem, w->ar.size);
	if (w->pr.region_id)
		rsc_region_deregister(w->pc, w->pr.region_id, 1, NULL);
	if (w->ar.region_id)
		rsc_region_deregister(w->ac, w->ar.region_id, 1, NULL);
	rsc_region_clear(&w->pr);
	rsc_region_clear(&w->ar);
	rsc_client_destroy(w->pc);
	rsc_client_destroy(w->ac);
}

static void *run(void *arg)
{
	struct worker *w = arg;
	const struct bench *b = w->b;
	rsc_status st = {0};
	int ready = 0;
	double my_start = 0;

	if (b->mode == MODE_TCP ? tcp_setup(w) : sidecar_setup(w, &st)) {
		if (b->mode == MODE_TCP)
			snprintf(st.message, sizeof(st.message), "tcp setup: %s", strerror(errno));
		goto fail;
	}
	for (long i = -1;; i++) { /* i == -1: the warm-up, not timed */
		if (i >= 0 && (i >= b->iters ||
			       (b->seconds > 0 && now_s() - my_start > b->seconds && i >= 3)))
			break;
		double t0 = now_s();
		int r = b->mode == MODE_TCP ? tcp_once(w) : sidecar_once(w, &st);
		double dt = now_s() - t0;
		if (r != 0) {
			if (w->error[0])
				goto out;
			if (b->mode == MODE_TCP)
				snprintf(st.message, sizeof(st.message), "tcp: %s",
					 strerror(errno));
			goto fail;
		}
		if (i >= 0) {
			w->lat[w->n++] = dt;
			continue;
		}
		if (b->mode != MODE_TCP) {
			const void *holder = b->write ? w->amem : w->pmem;
			const void *other = b->write ? w->pmem : w->amem;
			if (memcmp(holder, other, b->size) != 0) {
				snprintf(w->error, sizeof(w->error),
					 "bytes differ after the warm-up transfer");
				goto out;
			}
		}
		pthread_barrier_wait(&start_line);
		my_start = now_s();
		ready = 2;
	}
	goto out;
fail:
	snprintf(w->error, sizeof(w->error), "%s: %s", rsc_code_name(st.code), st.message);
out:
	if (ready < 2) /* never let the others wait for a worker that failed before the start */
		pthread_barrier_wait(&start_line);
	pthread_mutex_lock(&end_mu);
	if (now_s() > t_end_max)
		t_end_max = now_s();
	pthread_mutex_unlock(&end_mu);
	teardown(w);
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

static const char *mode_name(enum mode m)
{
	return m == MODE_TCP ? "tcp" : m == MODE_GRPC ? "grpc" : "fast";
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"mode", required_argument, NULL, 'm'},
		{"passive", required_argument, NULL, 'p'},
		{"active", required_argument, NULL, 'a'},
		{"direction", required_argument, NULL, 'd'},
		{"size", required_argument, NULL, 's'},
		{"clients", required_argument, NULL, 'c'},
		{"iters", required_argument, NULL, 'n'},
		{"seconds", required_argument, NULL, 't'},
		{"spin-us", required_argument, NULL, 'u'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct bench b = {.mode = MODE_FAST, .clients = 1, .iters = 1000};
	int opt, bad_mode = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm':
			b.mode = strcmp(optarg, "tcp") == 0    ? MODE_TCP
				 : strcmp(optarg, "grpc") == 0 ? MODE_GRPC
							       : MODE_FAST;
			bad_mode = strcmp(optarg, mode_name(b.mode)) != 0;
			break;
		case 'p':
			b.passive_addr = optarg;
			break;
		case 'a':
			b.active_addr = optarg;
			break;
		case 'd':
			b.write = strcmp(optarg, "write") == 0;
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
		case 'u': /* "none": never poll (UINT32_MAX) */
			b.spin_us = strcmp(optarg, "none") == 0 ? UINT32_MAX
								 : (uint32_t)strtoul(optarg, NULL, 0);
			break;
		default:
			fprintf(stderr, "usage: sc-fast-bench --mode tcp|grpc|fast --direction "
					"read|write --size BYTES [--clients N] [--iters N] "
					"[--seconds S] [--passive ADDR --active ADDR] [--spin-us US|none]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (bad_mode || b.size == 0 || b.clients < 1 || b.clients > 256 || b.iters < 1 ||
	    (b.mode != MODE_TCP && (!b.passive_addr || !b.active_addr))) {
		fprintf(stderr, "sc-fast-bench: --mode tcp|grpc|fast, --size (> 0), --clients "
				"1..256, --iters >= 1, and --passive/--active for grpc and fast\n");
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
	const char *fast_mode = "";
	for (int i = 0; i < b.clients; i++) {
		pthread_join(ws[i].thread, NULL);
		total += ws[i].n;
		if (ws[i].error[0]) {
			fprintf(stderr, "sc-fast-bench: client %d: %s\n", i, ws[i].error);
			rc = 1;
		}
		backend = ws[i].backend;
		if (ws[i].fast_mode)
			fast_mode = ws[i].fast_mode;
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
		printf(
		    "{\"mode\":\"%s\",\"fast_mode\":\"%s\",\"direction\":\"%s\",\"size\":%" PRIu64
		    ",\"clients\":%d,\"ops\":%ld,\"backend\":\"%s\",\"seconds\":%.6f,"
		    "\"gb_per_s\":%.4f,\"ops_per_s\":%.1f,\"t_min_us\":%.1f,\"p50_us\":%.1f,"
		    "\"p99_us\":%.1f,\"p999_us\":%.1f,\"mean_us\":%.1f,\"ok\":%s}\n",
		    mode_name(b.mode), fast_mode, b.write ? "write" : "read", b.size, b.clients,
		    total, b.mode == MODE_TCP ? "none" : rsc_backend_name(backend), wall,
		    (double)b.size * (double)total / wall / 1e9, (double)total / wall, all[0] * 1e6,
		    pct(all, total, 50) * 1e6, pct(all, total, 99) * 1e6,
		    pct(all, total, 99.9) * 1e6, sum / (double)total * 1e6, rc ? "false" : "true");
	else
		rc = 1;
	for (int i = 0; i < b.clients; i++)
		free(ws[i].lat);
	free(ws);
	free(all);
	pthread_barrier_destroy(&start_line);
	return rc;
}
