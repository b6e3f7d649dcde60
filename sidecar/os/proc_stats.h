/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/proc_stats.h: this process's own figures from /proc (CPU time, memory, file descriptors,
 * start time), the facts behind the standard process_* metrics. Any thread; reads files only.
 */
#ifndef SC_PROC_STATS_H
#define SC_PROC_STATS_H

#include <stdbool.h>
#include <stdint.h>

struct sc_proc_stats {
	double cpu_seconds;	   /* user + system CPU time */
	uint64_t resident_bytes;   /* resident set size */
	uint64_t virtual_bytes;	   /* virtual memory size */
	uint64_t open_fds;	   /* entries of /proc/self/fd */
	uint64_t max_fds;	   /* soft RLIMIT_NOFILE */
	double start_time_seconds; /* unix seconds the process started at */
	uint64_t threads;	   /* threads of the process now */
};

/* Fills *out; false when /proc/self/stat cannot be read (then *out holds what could be read,
 * the rest zero). */
bool sc_proc_stats(struct sc_proc_stats *out);

#endif
