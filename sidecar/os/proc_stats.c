/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/proc_stats.c: this process's figures for the process_* metrics, read from /proc/self/stat
 * (CPU time, start time, virtual and resident memory, threads), /proc/stat (boot time),
 * /proc/self/fd and getrlimit. Runs on the caller's thread (the metrics' scrape thread); owns
 * nothing and keeps no state, so every call reads the files afresh.
 */
#include "os/proc_stats.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The boot time in unix seconds ("btime" of /proc/stat), 0 when unknown. */
static uint64_t boot_time(void)
{
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return 0;
	char line[256];
	unsigned long long bt = 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %llu", &bt) == 1)
			break;
	fclose(f);
	return bt;
}

static uint64_t count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	uint64_t n = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n > 0 ? n - 1 : 0; /* less the directory's own descriptor */
}

bool sc_proc_stats(struct sc_proc_stats *out)
{
	memset(out, 0, sizeof(*out));
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		out->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
	out->open_fds = count_fds();

	char buf[1024];
	FILE *f = fopen("/proc/self/stat", "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name (field 2) may hold spaces and parentheses: fields resume after the
	 * last ')'. Field 3 (state) is the first after it. */
	char *p = strrchr(buf, ')');
	if (!p)
		return false;
	p++;
	unsigned long long v[64] = {0};
	int field = 3;
	char *save = NULL;
	for (char *tok = strtok_r(p, " ", &save); tok && field < 64;
	     tok = strtok_r(NULL, " ", &save), field++)
		if (field > 3)
			v[field] = strtoull(tok, NULL, 10);
	long hz = sysconf(_SC_CLK_TCK);
	long page = sysconf(_SC_PAGESIZE);
	if (hz <= 0)
		hz = 100;
	out->cpu_seconds = (double)(v[14] + v[15]) / (double)hz; /* utime + stime */
	out->threads = v[20];
	uint64_t bt = boot_time();
	out->start_time_seconds = bt ? (double)bt + (double)v[22] / (double)hz : 0;
	out->virtual_bytes = v[23];
	out->resident_bytes = v[24] * (uint64_t)(page > 0 ? page : 4096);
	return true;
}
