/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_util.c: the parts of sc-bench and sc-fast-bench that are the same (see bench_util.h):
 * option reading, the workers' start line and end time, the merge of their latencies into the
 * figures and the JSON line, and the client pair with its regions and passive operation.
 * bench_run() and bench_report() run on the main thread, the rest on each worker's thread. Owns
 * the start line (a barrier) and the latest end time, for the one bench_run() of the process.
 */
#include "bench_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_barrier_t start_line;
static double t_start, t_end_max;
static pthread_mutex_t end_mu = PTHREAD_MUTEX_INITIALIZER;

int bench_opts_take(struct bench_opts *o, int opt, const char *arg)
{
	switch (opt) {
	case 'p':
		o->passive_addr = arg;
		return 1;
	case 'a':
		o->active_addr = arg;
		return 1;
	case 'd':
		o->write = strcmp(arg, "write") == 0;
		return 1;
	case 's':
		o->size = strtoull(arg, NULL, 0);
		return 1;
	case 'c':
		o->clients = atoi(arg);
		return 1;
	case 'n':
		o->iters = atol(arg);
		return 1;
	case 't':
		o->seconds = atof(arg);
		return 1;
	default:
		return 0;
	}
}

int bench_opts_valid(const struct bench_opts *o, int need_addrs)
{
	return o->size > 0 && o->clients >= 1 && o->clients <= 256 && o->iters >= 1 &&
	       (!need_addrs || (o->passive_addr && o->active_addr));
}

double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int bench_worker_more(const struct bench_worker *w, long i)
{
	const struct bench_opts *o = w->o;
	return i < 0 || !(i >= o->iters ||
			  (o->seconds > 0 && bench_now() - w->start > o->seconds && i >= 3));
}

void bench_worker_start(struct bench_worker *w)
{
	pthread_barrier_wait(&start_line);
	w->start = bench_now();
	w->started = 1;
}

void bench_worker_fail(struct bench_worker *w, const rsc_status *st)
{
	snprintf(w->error, sizeof(w->error), "%s: %s", rsc_code_name(st->code), st->message);
}

void bench_worker_end(struct bench_worker *w)
{
	if (!w->started)
		pthread_barrier_wait(&start_line);
	pthread_mutex_lock(&end_mu);
	if (bench_now() > t_end_max)
		t_end_max = bench_now();
	pthread_mutex_unlock(&end_mu);
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

static struct bench_worker *worker_at(void *workers, size_t worker_size, int i)
{
	return (struct bench_worker *)((char *)workers + (size_t)i * worker_size);
}

void *bench_run(const struct bench_opts *o, const char *prog, size_t worker_size,
		void *(*run)(void *), struct bench_stats *s)
{
	*s = (struct bench_stats){.ok = 1};
	void *workers = calloc((size_t)o->clients, worker_size);
	if (!workers)
		return NULL;
	pthread_barrier_init(&start_line, NULL, (unsigned)o->clients + 1);
	for (int i = 0; i < o->clients; i++) {
		struct bench_worker *w = worker_at(workers, worker_size, i);
		w->o = o;
		w->index = i;
		w->lat = calloc((size_t)o->iters, sizeof(double));
		if (!w->lat || pthread_create(&w->thread, NULL, run, w) != 0)
			return NULL;
	}
	pthread_barrier_wait(&start_line);
	t_start = bench_now();
	for (int i = 0; i < o->clients; i++) {
		struct bench_worker *w = worker_at(workers, worker_size, i);
		pthread_join(w->thread, NULL);
		s->ops += w->n;
		if (w->error[0]) {
			fprintf(stderr, "%s: client %d: %s\n", prog, i, w->error);
			s->ok = 0;
		}
		s->backend = w->backend;
	}
	pthread_barrier_destroy(&start_line);
	s->wall = t_end_max - t_start;
	double *all = calloc((size_t)(s->ops ? s->ops : 1), sizeof(double));
	if (!all)
		return NULL;
	long k = 0;
	double sum = 0;
	for (int i = 0; i < o->clients; i++) {
		struct bench_worker *w = worker_at(workers, worker_size, i);
		for (long j = 0; j < w->n; j++) {
			all[k++] = w->lat[j];
			sum += w->lat[j];
		}
		free(w->lat);
		w->lat = NULL;
	}
	qsort(all, (size_t)s->ops, sizeof(double), cmp);
	if (s->ops > 0) {
		s->t_min_us = all[0] * 1e6;
		s->p50_us = pct(all, s->ops, 50) * 1e6;
		s->p99_us = pct(all, s->ops, 99) * 1e6;
		s->p999_us = pct(all, s->ops, 99.9) * 1e6;
		s->mean_us = sum / (double)s->ops * 1e6;
	}
	free(all);
	return workers;
}

int bench_report(const struct bench_opts *o, const struct bench_stats *s, const char *head,
		 const char *backend)
{
	if (s->ops == 0)
		return 1;
	printf("{%s,\"size\":%" PRIu64 ",\"clients\":%d,\"ops\":%ld,\"backend\":\"%s\","
	       "\"seconds\":%.6f,\"gb_per_s\":%.4f,\"ops_per_s\":%.1f,\"t_min_us\":%.1f,"
	       "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"mean_us\":%.1f,\"ok\":%s}\n",
	       head, o->size, o->clients, s->ops, backend, s->wall,
	       (double)o->size * (double)s->ops / s->wall / 1e9, (double)s->ops / s->wall,
	       s->t_min_us, s->p50_us, s->p99_us, s->p999_us, s->mean_us, s->ok ? "true" : "false");
	return s->ok ? 0 : 1;
}

int bench_pair_open(struct bench_pair *p, const struct bench_opts *o, int index, const char *name,
		    rsc_status *st)
{
	rsc_options po = {.target = o->passive_addr}, ao = {.target = o->active_addr};
	char pname[64], aname[64];
	snprintf(pname, sizeof(pname), "%s-passive", name);
	snprintf(aname, sizeof(aname), "%s-active", name);
	if (rsc_client_create(&po, &p->pc, st) || rsc_client_create(&ao, &p->ac, st) ||
	    rsc_region_create(p->pc, o->size, pname, &p->pr, st) ||
	    rsc_region_create(p->ac, o->size, aname, &p->ar, st) ||
	    rsc_region_map(&p->pr, &p->pmem, st) || rsc_region_map(&p->ar, &p->amem, st))
		return -1;
	unsigned char *holder = o->write ? p->amem : p->pmem;
	for (uint64_t i = 0; i < o->size; i += 4096)
		holder[i] = (unsigned char)(i / 4096 * 31 + (uint64_t)index + 1);
	holder[o->size - 1] = 0x5a;
	p->ad = (rsc_descriptor){.region_id = p->ar.region_id, .offset = 0, .length = o->size};
	return 0;
}

int bench_pair_passive(struct bench_pair *p, const struct bench_opts *o, uint64_t timeout_ms,
		       uint32_t max_uses, rsc_status *st)
{
	rsc_descriptor pd = {.region_id = p->pr.region_id, .offset = 0, .length = o->size};
	rsc_passive_args pa = {
	    .descriptors = &pd, .n_descriptors = 1, .timeout_ms = timeout_ms, .max_uses = max_uses};
	rsc_operation_clear(&p->passive);
	return o->write ? rsc_create_writable(p->pc, &pa, &p->passive, st)
			: rsc_create_readable(p->pc, &pa, &p->passive, st);
}

rsc_transfer_args bench_pair_args(struct bench_pair *p)
{
	return (rsc_transfer_args){.metadata = p->passive.metadata,
				   .descriptors = &p->ad,
				   .n_descriptors = 1,
				   .timeout_ms = 600000};
}

int bench_pair_transfer(struct bench_pair *p, int write, rsc_operation *op, rsc_status *st)
{
	rsc_transfer_args ta = bench_pair_args(p);
	return write ? rsc_write(p->ac, &ta, 600000, op, st) : rsc_read(p->ac, &ta, 600000, op, st);
}

int bench_op_done(struct bench_worker *w, rsc_operation *op, int probe)
{
	int ok = op->status == RSC_STATUS_COMPLETE || probe;
	if (!ok)
		snprintf(w->error, sizeof(w->error), "transfer %s: %s",
			 rsc_op_status_name(op->status), op->error_message);
	if (!probe)
		w->backend = op->backend;
	rsc_operation_clear(op);
	return ok;
}

int bench_pair_check(const struct bench_pair *p, const struct bench_opts *o, struct bench_worker *w)
{
	const void *holder = o->write ? p->amem : p->pmem;
	const void *other = o->write ? p->pmem : p->amem;
	if (memcmp(holder, other, o->size) == 0)
		return 0;
	snprintf(w->error, sizeof(w->error), "bytes differ after the warm-up transfer");
	return -1;
}

void bench_pair_close(struct bench_pair *p)
{
	rsc_operation_clear(&p->passive);
	rsc_region_unmap(p->pmem, p->pr.size);
	rsc_region_unmap(p->amem, p->ar.size);
	if (p->pr.region_id)
		rsc_region_deregister(p->pc, p->pr.region_id, 1, NULL);
	if (p->ar.region_id)
		rsc_region_deregister(p->ac, p->ar.region_id, 1, NULL);
	rsc_region_clear(&p->pr);
	rsc_region_clear(&p->ar);
	rsc_client_destroy(p->pc);
	rsc_client_destroy(p->ac);
}
