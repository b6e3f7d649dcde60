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
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USES_PER_PASSIVE 64

struct bench {
	struct bench_opts o;
	int rtt; /* --direction rtt: time GetOperation round trips to the passive sidecar instead */
};

static void *run(void *arg)
{
	struct bench_worker *w = arg;
	const struct bench *b = bench_container_of(w->o, struct bench, o);
	struct bench_pair p = {0};
	rsc_status st;
	int uses_left = 0;

	if (bench_pair_open(&p, &b->o, w->index, "bench", &st))
		goto fail;
	for (long i = -1; bench_worker_more(w, i); i++) { /* i == -1: the warm-up, not timed */
		if (uses_left == 0) {
			if (bench_pair_passive(&p, &b->o, 600000, USES_PER_PASSIVE, &st) != RSC_OK)
				goto fail;
			uses_left = USES_PER_PASSIVE;
		}
		/* rtt: the passive operation stays INITIALIZED (uses left), a live one to fetch. */
		int probe = b->rtt && i >= 0;
		rsc_operation op;
		double t0 = bench_now();
		int r = probe ? rsc_operation_get(p.pc, p.passive.operation_id, &op, &st)
			      : bench_pair_transfer(&p, b->o.write, &op, &st);
		double dt = bench_now() - t0;
		if (!probe)
			uses_left--;
		if (r != RSC_OK)
			goto fail;
		if (!bench_op_done(w, &op, probe))
			goto out;
		if (i >= 0) {
			w->lat[w->n++] = dt;
			continue;
		}
		if (bench_pair_check(&p, &b->o, w))
			goto out;
		bench_worker_start(w);
	}
	goto out;
fail:
	bench_worker_fail(w, &st);
out:
	bench_worker_end(w);
	bench_pair_close(&p);
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {BENCH_LONG_OPTIONS, {NULL, 0, NULL, 0}};
	struct bench b = {.o = {.clients = 1, .iters = 1000, .seconds = 0}};
	struct bench_stats s;
	int opt;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (opt == 'd')
			b.rtt = strcmp(optarg, "rtt") == 0;
		if (!bench_opts_take(&b.o, opt, optarg)) {
			fprintf(stderr, "usage: sc-bench --passive ADDR --active ADDR --direction "
					"read|write|rtt --size BYTES "
					"[--clients N] [--iters N] [--seconds S]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (!bench_opts_valid(&b.o, 1)) {
		fprintf(stderr, "sc-bench: --passive, --active, --size (> 0), --clients 1..256, "
				"--iters >= 1 needed\n");
		return 2;
	}
	struct bench_worker *ws = bench_run(&b.o, "sc-bench", sizeof(*ws), run, &s);
	if (!ws)
		return 1;
	char head[64];
	snprintf(head, sizeof(head), "\"direction\":\"%s\"",
		 b.rtt	     ? "rtt"
		 : b.o.write ? "write"
			     : "read");
	int rc = bench_report(&b.o, &s, head, rsc_backend_name(s.backend));
	free(ws);
	return rc;
}
