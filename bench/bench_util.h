/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_util.h: what sc-bench (c_bench.c) and sc-fast-bench (fast_path_bench.c) share. The options
 * both take; N worker threads that warm up, wait at one start line and record one latency per
 * timed transfer; a worker's pair of clients (passive and active sidecar) with a region on each
 * and the passive operation; and the JSON line of figures both print. Each program keeps its own
 * options, its own transfer loop and the head of its JSON line.
 *
 * Threads: bench_run() runs on the main thread; the bench_worker_* and bench_pair_* calls on the
 * worker's own thread. One bench_run() per process (the start line is file state in bench_util.c).
 */
#ifndef SC_BENCH_UTIL_H
#define SC_BENCH_UTIL_H

#include <rdma_sidecar/client.h>

#include <getopt.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define bench_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* The long options both programs take, for their struct option table (each adds its own and the
 * {NULL, 0, NULL, 0} end). bench_opts_take() reads them. */
/* clang-format off */
#define BENCH_LONG_OPTIONS                              \
	{"passive", required_argument, NULL, 'p'},      \
	{"active", required_argument, NULL, 'a'},       \
	{"direction", required_argument, NULL, 'd'},    \
	{"size", required_argument, NULL, 's'},         \
	{"clients", required_argument, NULL, 'c'},      \
	{"iters", required_argument, NULL, 'n'},        \
	{"seconds", required_argument, NULL, 't'},      \
	{"help", no_argument, NULL, 'h'}
/* clang-format on */

struct bench_opts {
	const char *passive_addr, *active_addr;
	int write; /* --direction write (anything else: read) */
	uint64_t size;
	int clients;
	long iters;
	double seconds; /* 0: no time limit, --iters only */
};

/* Takes one option of BENCH_LONG_OPTIONS as getopt_long() returned it (opt, optarg): 1 when it
 * was one of them, 0 for --help, '?' and anything else (the caller prints its usage). */
int bench_opts_take(struct bench_opts *o, int opt, const char *arg);

/* 1 when --size > 0, --clients 1..256, --iters >= 1 and, where need_addrs, --passive and --active
 * are given; 0 otherwise (the caller says what is needed). */
int bench_opts_valid(const struct bench_opts *o, int need_addrs);

/* One worker thread. A program's own worker struct embeds this as its first member. */
struct bench_worker {
	const struct bench_opts *o;
	pthread_t thread;
	int index;
	double *lat; /* seconds, one per timed transfer */
	long n;
	int backend;
	int started; /* past the start line */
	double start;
	char error[600];
};

double bench_now(void); /* CLOCK_MONOTONIC, seconds */

/* Whether transfer i runs (i == -1: the warm-up, always): below --iters and, with --seconds,
 * within that time of the start (at least 3 timed transfers). */
int bench_worker_more(const struct bench_worker *w, long i);

/* After a good warm-up: waits at the start line for the others and starts the clock. */
void bench_worker_start(struct bench_worker *w);

/* Sets the worker's error from a failed call's status. */
void bench_worker_fail(struct bench_worker *w, const rsc_status *st);

/* The worker's last call before its teardown: passes the start line if it never got there (so
 * the others never wait for a worker that failed) and marks the end of the wall time. */
void bench_worker_end(struct bench_worker *w);

struct bench_stats {
	long ops;
	double wall; /* seconds, start line to the last worker's end */
	int backend; /* the last worker's */
	int ok;	     /* no worker reported an error */
	double t_min_us, p50_us, p99_us, p999_us, mean_us;
};

/* Runs o->clients workers: an array of o->clients structs of worker_size bytes each, zeroed, each
 * beginning with its struct bench_worker, which this fills before starting run() on it. Returns
 * the array (the caller frees it) after every worker ended, each error printed on stderr as
 * "prog: client I: ...", with the figures in *s; NULL when the array, a thread or its memory
 * could not be had (workers may still run: exit). */
void *bench_run(const struct bench_opts *o, const char *prog, size_t worker_size,
		void *(*run)(void *), struct bench_stats *s);

/* Prints the JSON line of figures: {head,"size":...,"backend":"backend",...,"ok":...}. Returns
 * the exit status: 0, or 1 when a worker failed or no transfer was timed (then prints nothing). */
int bench_report(const struct bench_opts *o, const struct bench_stats *s, const char *head,
		 const char *backend);

/* One worker's two clients (pc: the passive sidecar, ac: the active one), a region of o->size
 * bytes on each, mapped, and the passive operation (readable or writable) on pr. */
struct bench_pair {
	rsc_client *pc, *ac;
	rsc_region pr, ar;
	void *pmem, *amem;
	rsc_descriptor ad; /* all of ar */
	rsc_operation passive;
};

/* Connects, creates and maps the regions ("NAME-passive", "NAME-active") and writes the worker's
 * pattern into the one that holds the data (the active region for WRITE, the passive for READ);
 * the other stays zero until bench_pair_check(). p zeroed first; bench_pair_close() after, even
 * on failure. */
int bench_pair_open(struct bench_pair *p, const struct bench_opts *o, int index, const char *name,
		    rsc_status *st);

/* Makes a new passive operation over all of pr (replacing any earlier one). */
int bench_pair_passive(struct bench_pair *p, const struct bench_opts *o, uint64_t timeout_ms,
		       uint32_t max_uses, rsc_status *st);

/* The active side's transfer over all of ar against the passive operation (valid while p is). */
rsc_transfer_args bench_pair_args(struct bench_pair *p);

/* One gRPC transfer (rsc_write or rsc_read, waited for): op filled when it returns RSC_OK. */
int bench_pair_transfer(struct bench_pair *p, int write, rsc_operation *op, rsc_status *st);

/* 1 when op is COMPLETE (or, with probe, any status: a GetOperation that says nothing of the
 * backend), else 0 with the worker's error set; keeps op's backend; clears op. */
int bench_op_done(struct bench_worker *w, rsc_operation *op, int probe);

/* After the warm-up: 0 when both regions hold the same bytes, else -1 with the worker's error. */
int bench_pair_check(const struct bench_pair *p, const struct bench_opts *o,
		     struct bench_worker *w);

/* Releases everything bench_pair_open() and bench_pair_passive() made. */
void bench_pair_close(struct bench_pair *p);

#endif
