/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_proc_stats.c: sidecar/os/proc_stats.c, the figures behind the process_* metrics, against
 * what this test process knows of itself: a descriptor opened is counted, the limit is
 * getrlimit's, the start time is before now and after the process could have started, memory
 * touched shows in the resident size, CPU time burnt shows in the CPU seconds, a thread started
 * shows in the thread count.
 */
#include "check.h"
#include "os/proc_stats.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

TEST(fds_counted_and_limit)
{
	struct sc_proc_stats a, b;
	CHECK(sc_proc_stats(&a));
	int fd = open("/dev/null", O_RDONLY);
	CHECK(fd >= 0);
	CHECK(sc_proc_stats(&b));
	CHECK_U64_EQ(b.open_fds, a.open_fds + 1);
	close(fd);
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	CHECK_U64_EQ(b.max_fds, (uint64_t)rl.rlim_cur);
}

TEST(start_time_memory_cpu)
{
	struct sc_proc_stats a, b;
	CHECK(sc_proc_stats(&a));
	double now = now_s();
	/* Started before now (btime is whole seconds: one of slack), and not an hour ago. */
	CHECK(a.start_time_seconds <= now + 1);
	CHECK(a.start_time_seconds > now - 3600);
	CHECK(a.virtual_bytes >= a.resident_bytes);
	CHECK(a.resident_bytes > 0);
	/* 64 MiB touched: resident grows by most of it. */
	size_t n = 64u << 20;
	char *p = malloc(n);
	CHECK(p != NULL);
	memset(p, 1, n);
	/* CPU: spin until the process's clock moved 0.2 s (bounded by 30 s of wall time). */
	struct timespec c0, c1;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
	double w0 = now_s();
	volatile unsigned long x = 0;
	do {
		for (int i = 0; i < 1000000; i++)
			x += (unsigned long)i;
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
	} while ((double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9 < 0.2 &&
		 now_s() - w0 < 30);
	CHECK(sc_proc_stats(&b));
	CHECK(b.resident_bytes >= a.resident_bytes + n / 2);
	CHECK(b.cpu_seconds >= a.cpu_seconds + 0.15);
	free(p);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int go;

static void *waiter(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	while (!go)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return NULL;
}

TEST(threads_counted)
{
	struct sc_proc_stats a, b;
	CHECK(sc_proc_stats(&a));
	CHECK(a.threads >= 1);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, waiter, NULL) == 0);
	CHECK(sc_proc_stats(&b));
	CHECK_U64_EQ(b.threads, a.threads + 1);
	pthread_mutex_lock(&mu);
	go = 1;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(t, NULL);
}

RUN_TESTS(T(fds_counted_and_limit), T(start_time_memory_cpu), T(threads_counted))
