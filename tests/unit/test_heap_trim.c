/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_heap_trim.c: sidecar/os/heap_trim.c. Free pages in the middle of the heap stay resident until
 * a trim (the soak's creep, issue 12), a trim gives them back, and the periodic trim runs on the
 * timer thread and stops with it. Every wait has a deadline.
 */
#include "check.h"
#include "os/heap_trim.h"
#include "base/timer.h"

#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* AddressSanitizer's allocator replaces glibc's: malloc_trim then has nothing to trim. */
#if defined(__SANITIZE_ADDRESS__)
#define GLIBC_MALLOC 0
#else
#define GLIBC_MALLOC 1
#endif

#define N_BLOCKS 2048
#define BLOCK 4096
#define KEEP_EVERY 32

static long rss_anon_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -1;
	char line[256];
	long kb = -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* 8 MiB in 4 KiB blocks, all touched; free all but every 32nd, so the free space lies between
 * live blocks (not at the top, where free() alone would give it back). */
TEST(trim_gives_back_free_pages_inside_the_heap)
{
	if (!GLIBC_MALLOC) {
		printf("  skipped: AddressSanitizer's allocator replaces glibc's\n");
		return;
	}
	const char *preload = getenv("LD_PRELOAD");
	if (preload && strstr(preload, "vgpreload")) {
		printf("  skipped: valgrind's allocator replaces glibc's\n");
		return;
	}
	static char *blocks[N_BLOCKS];
	for (int i = 0; i < N_BLOCKS; i++) {
		blocks[i] = malloc(BLOCK);
		CHECK(blocks[i] != NULL);
		memset(blocks[i], 0x5a, BLOCK);
	}
	for (int i = 0; i < N_BLOCKS; i++)
		if (i % KEEP_EVERY != 0) {
			free(blocks[i]);
			blocks[i] = NULL;
		}
	long after_free = rss_anon_kb();
	uint64_t before = sc_heap_trim_count();
	sc_heap_trim_now();
	long after_trim = rss_anon_kb();
	printf("  RssAnon after free %ld kB, after trim %ld kB\n", after_free, after_trim);
	CHECK_U64_EQ(sc_heap_trim_count(), before + 1);
	/* 7.75 MiB were freed; without the trim all of it stays resident. */
	CHECK(after_free - after_trim >= 6 * 1024);
	for (int i = 0; i < N_BLOCKS; i++)
		free(blocks[i]);
}

TEST(periodic_trim_runs_on_the_timer_thread_until_it_stops)
{
	struct sc_timers *t = NULL;
	CHECK_INT_EQ(sc_timers_create(&t), 0);
	sc_heap_trim_set_period(20);
	uint64_t before = sc_heap_trim_count();
	CHECK(sc_heap_trim_start(t));
	for (int i = 0; i < 500 && sc_heap_trim_count() < before + 3; i++)
		sleep_ms(10);
	uint64_t seen = sc_heap_trim_count();
	sc_timers_destroy(t);
	sc_heap_trim_set_period(0);
	CHECK(seen >= before + 3);
	/* Destroyed: the chain ended (at most the one running during destroy finished). */
	uint64_t at_stop = sc_heap_trim_count();
	sleep_ms(100);
	CHECK_U64_EQ(sc_heap_trim_count(), at_stop);
}

RUN_TESTS(T(trim_gives_back_free_pages_inside_the_heap),
	  T(periodic_trim_runs_on_the_timer_thread_until_it_stops))
