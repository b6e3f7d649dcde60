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
#include "bench_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define USES 1048576u

enum mode { MODE_TCP, MODE_GRPC, MODE_FAST };

struct bench {
	struct bench_opts o;
	enum mode mode;
	uint32_t spin_us; /* rsc_fast_options.spin_us */
};

struct worker {
	struct bench_worker base; /* first: bench_run() fills it */
	const struct bench *b;
	/* tcp */
	int listen_fd, srv_fd, cli_fd;
	pthread_t srv_thread;
	unsigned char *buf, *srv_buf;
	/* the sidecar */
	struct bench_pair pair;
	rsc_fast *f;
	uint32_t handle;
	const char *fast_mode;
};
_Static_assert(offsetof(struct worker, base) == 0, "bench_run() sees a worker as its base");

/* ---- raw TCP ---------------------------------------------------------------------------------
 */

/* Sends or receives all n bytes at p, again after EINTR. */
static int io_all(int fd, void *p, size_t n, int sending)
{
	char *c = p;
	while (n) {
		ssize_t k = sending ? send(fd, c, n, MSG_NOSIGNAL) : recv(fd, c, n, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

static int send_all(int fd, const void *p, size_t n)
{
	return io_all(fd, (void *)p, n, 1); /* send() only reads it */
}

static int recv_all(int fd, void *p, size_t n)
{
	return io_all(fd, p, n, 0);
}

/* The server side of one client's connection: READ answers an 8-byte request with size bytes,
 * WRITE takes size bytes and answers 8. Ends when the client closes. */
static void *tcp_serve(void *arg)
{
	struct worker *w = arg;
	uint64_t word = 0;
	for (;;) {
		if (w->b->o.write) {
			if (recv_all(w->srv_fd, w->srv_buf, w->b->o.size) ||
			    send_all(w->srv_fd, &word, sizeof(word)))
				break;
		} else if (recv_all(w->srv_fd, &word, sizeof(word)) ||
			   send_all(w->srv_fd, w->srv_buf, w->b->o.size)) {
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
	w->buf = malloc(w->b->o.size);
	w->srv_buf = malloc(w->b->o.size);
	if (!w->buf || !w->srv_buf)
		return -1;
	memset(w->srv_buf, 0x5a, w->b->o.size);
	memset(w->buf, 0xa5, w->b->o.size);
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
	if (w->b->o.write)
		return send_all(w->cli_fd, w->buf, w->b->o.size) ||
			       recv_all(w->cli_fd, &word, sizeof(word))
			   ? -1
			   : 0;
	return send_all(w->cli_fd, &word, sizeof(word)) || recv_all(w->cli_fd, w->buf, w->b->o.size)
		   ? -1
		   : 0;
}

/* ---- the sidecar -----------------------------------------------------------------------------
 */

static int sidecar_setup(struct worker *w, rsc_status *st)
{
	const struct bench *b = w->b;
	if (bench_pair_open(&w->pair, &b->o, w->base.index, "fbench", st) ||
	    bench_pair_passive(&w->pair, &b->o, 3600000, USES, st))
		return -1;
	if (b->mode != MODE_FAST)
		return 0;
	rsc_transfer_args ta = bench_pair_args(&w->pair);
	rsc_fast_options fo = {.spin_us = b->spin_us};
	if (rsc_fast_open(w->pair.ac, &fo, &w->f, st) ||
	    rsc_fast_prepare(w->f, b->o.write ? RSC_KIND_WRITE : RSC_KIND_READ, &ta, &w->handle,
			     st))
		return -1;
	w->fast_mode = rsc_fast_mode(w->f);
	return 0;
}

static int sidecar_once(struct worker *w, rsc_status *st)
{
	if (w->b->mode == MODE_FAST) {
		rsc_fast_completion c;
		if (rsc_fast_run(w->f, w->handle, 0, &c, st))
			return -1;
		w->base.backend = c.backend;
		if (c.code) {
			snprintf(w->base.error, sizeof(w->base.error), "run: %s: %s",
				 rsc_code_name(c.code), c.message);
			return -1;
		}
		return 0;
	}
	rsc_operation op;
	if (bench_pair_transfer(&w->pair, w->b->o.write, &op, st))
		return -1;
	return bench_op_done(&w->base, &op, 0) ? 0 : -1;
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
	bench_pair_close(&w->pair);
}

static void *run(void *arg)
{
	struct worker *w = bench_container_of(arg, struct worker, base);
	const struct bench *b = w->b = bench_container_of(w->base.o, struct bench, o);
	rsc_status st = {0};

	if (b->mode == MODE_TCP ? tcp_setup(w) : sidecar_setup(w, &st)) {
		if (b->mode == MODE_TCP)
			snprintf(st.message, sizeof(st.message), "tcp setup: %s", strerror(errno));
		goto fail;
	}
	for (long i = -1; bench_worker_more(&w->base, i); i++) { /* i == -1: the warm-up */
		double t0 = bench_now();
		int r = b->mode == MODE_TCP ? tcp_once(w) : sidecar_once(w, &st);
		double dt = bench_now() - t0;
		if (r != 0) {
			if (w->base.error[0])
				goto out;
			if (b->mode == MODE_TCP)
				snprintf(st.message, sizeof(st.message), "tcp: %s",
					 strerror(errno));
			goto fail;
		}
		if (i >= 0) {
			w->base.lat[w->base.n++] = dt;
			continue;
		}
		if (b->mode != MODE_TCP && bench_pair_check(&w->pair, &b->o, &w->base))
			goto out;
		bench_worker_start(&w->base);
	}
	goto out;
fail:
	bench_worker_fail(&w->base, &st);
out:
	bench_worker_end(&w->base);
	teardown(w);
	return NULL;
}

static const char *mode_name(enum mode m)
{
	return m == MODE_TCP ? "tcp" : m == MODE_GRPC ? "grpc" : "fast";
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"mode", required_argument, NULL, 'm'},
	    BENCH_LONG_OPTIONS,
	    {"spin-us", required_argument, NULL, 'u'},
	    {NULL, 0, NULL, 0},
	};
	struct bench b = {.o = {.clients = 1, .iters = 1000}, .mode = MODE_FAST};
	struct bench_stats s;
	int opt, bad_mode = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (opt == 'm') {
			b.mode = strcmp(optarg, "tcp") == 0    ? MODE_TCP
				 : strcmp(optarg, "grpc") == 0 ? MODE_GRPC
							       : MODE_FAST;
			bad_mode = strcmp(optarg, mode_name(b.mode)) != 0;
		} else if (opt == 'u') { /* "none": never poll (UINT32_MAX) */
			b.spin_us = strcmp(optarg, "none") == 0
					? UINT32_MAX
					: (uint32_t)strtoul(optarg, NULL, 0);
		} else if (!bench_opts_take(&b.o, opt, optarg)) {
			fprintf(
			    stderr,
			    "usage: sc-fast-bench --mode tcp|grpc|fast --direction "
			    "read|write --size BYTES [--clients N] [--iters N] "
			    "[--seconds S] [--passive ADDR --active ADDR] [--spin-us US|none]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (bad_mode || !bench_opts_valid(&b.o, b.mode != MODE_TCP)) {
		fprintf(stderr, "sc-fast-bench: --mode tcp|grpc|fast, --size (> 0), --clients "
				"1..256, --iters >= 1, and --passive/--active for grpc and fast\n");
		return 2;
	}
	struct worker *ws = bench_run(&b.o, "sc-fast-bench", sizeof(*ws), run, &s);
	if (!ws)
		return 1;
	const char *fast_mode = "";
	for (int i = 0; i < b.o.clients; i++)
		if (ws[i].fast_mode)
			fast_mode = ws[i].fast_mode;
	char head[128];
	snprintf(head, sizeof(head), "\"mode\":\"%s\",\"fast_mode\":\"%s\",\"direction\":\"%s\"",
		 mode_name(b.mode), fast_mode, b.o.write ? "write" : "read");
	int rc =
	    bench_report(&b.o, &s, head, b.mode == MODE_TCP ? "none" : rsc_backend_name(s.backend));
	free(ws);
	return rc;
}
