/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/fault_guard.c: guarded copies of region memory. Region memory is a MAP_SHARED file mapping
 * that a worker can shrink behind the sidecar's back (ftruncate), after which reading or writing
 * the lost pages raises SIGBUS. sc_guarded_memcpy arms a per-thread sigjmp_buf around the copy; the
 * SIGBUS handler notes the faulting address and jumps back to it when the fault happened inside
 * such a copy, and otherwise puts back the default action and re-raises, so an unexpected SIGBUS
 * still ends the process with a core as before. The handler is installed with SA_NODEFER, so
 * SIGBUS is not left blocked after the jump and a later fault on the same thread is caught the
 * same way. The handler only stores two thread-local words: naming the region (a look-up in the
 * table of watched ranges, under a mutex) happens afterwards, in sc_fault_guard_error.
 *
 * Runs on whichever thread copies region memory (gRPC workers for Read/WriteRegion, the local
 * backend's worker, peer connection threads: read-ahead and the TLS bounce buffers). Owns the
 * process's SIGBUS disposition once installed, and the table of watched ranges.
 */
#include "os/fault_guard.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local sigjmp_buf *volatile guard_env;
/* Where this thread's last access to region memory failed (the handler's si_addr, or an address
 * an I/O layer noted for EFAULT); NULL once reported. */
static _Thread_local const void *volatile noted_fault;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_errno;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	(void)uctx;
	sigjmp_buf *env = guard_env;
	if (env) {
		guard_env = NULL;
		noted_fault = si ? si->si_addr : NULL;
		siglongjmp(*env, 1);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) != 0)
		install_errno = errno;
}

int sc_fault_guard_install(struct sc_err *err)
{
	pthread_once(&install_once, install);
	if (install_errno)
		return sc_err_set(err, SC_INTERNAL, "cannot install the SIGBUS handler: %s",
				  strerror(install_errno));
	return 0;
}

int sc_guarded_memcpy(void *dst, const void *src, size_t n, struct sc_err *err)
{
	sigjmp_buf env;
	if (sigsetjmp(env, 0) != 0)
		return err ? sc_fault_guard_error(err, "the copy") : -1;
	guard_env = &env;
	memcpy(dst, src, n);
	guard_env = NULL;
	return 0;
}

int sc_fault_guard_probe(const void *addr, size_t len, struct sc_err *err)
{
	if (len == 0)
		return 0;
	const volatile uint8_t *p = addr;
	volatile uint8_t sink; /* the loads feed a store: no emulator (valgrind) drops them as dead */
	sigjmp_buf env;
	if (sigsetjmp(env, 0) != 0)
		return err ? sc_fault_guard_error(err, "the request") : -1;
	guard_env = &env;
	sink = p[0];
	sink = p[len - 1];
	guard_env = NULL;
	(void)sink;
	return 0;
}

/* ---- which region a fault is in -------------------------------------------------------------- */

#define LABEL_MAX 48

struct watched {
	uintptr_t lo, hi; /* [lo, hi) */
	char id[LABEL_MAX];
};

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct watched *watch_tab; /* unordered; under watch_mu */
static size_t watch_n, watch_cap;

int sc_fault_guard_watch(const void *addr, size_t len, const char *region_id)
{
	if (!addr || len == 0)
		return 0;
	pthread_mutex_lock(&watch_mu);
	if (watch_n == watch_cap) {
		size_t cap = watch_cap ? 2 * watch_cap : 64;
		struct watched *t = realloc(watch_tab, cap * sizeof(*t));
		if (!t) {
			pthread_mutex_unlock(&watch_mu);
			return -1;
		}
		watch_tab = t;
		watch_cap = cap;
	}
	struct watched *w = &watch_tab[watch_n++];
	w->lo = (uintptr_t)addr;
	w->hi = (uintptr_t)addr + len;
	snprintf(w->id, sizeof(w->id), "%s", region_id ? region_id : "");
	pthread_mutex_unlock(&watch_mu);
	return 0;
}

void sc_fault_guard_unwatch(const void *addr)
{
	pthread_mutex_lock(&watch_mu);
	for (size_t i = 0; i < watch_n; i++) {
		if (watch_tab[i].lo == (uintptr_t)addr) {
			watch_tab[i] = watch_tab[--watch_n];
			break;
		}
	}
	if (watch_n == 0) { /* nothing mapped: give the table back */
		free(watch_tab);
		watch_tab = NULL;
		watch_cap = 0;
	}
	pthread_mutex_unlock(&watch_mu);
}

void sc_fault_guard_note(const void *addr)
{
	noted_fault = addr;
}

int sc_fault_guard_error(struct sc_err *err, const char *stopped)
{
	const void *addr = noted_fault;
	noted_fault = NULL;
	char id[LABEL_MAX] = "";
	uint64_t off = 0, size = 0;
	bool found = false;
	if (addr) {
		pthread_mutex_lock(&watch_mu);
		for (size_t i = 0; i < watch_n && !found; i++) {
			const struct watched *w = &watch_tab[i];
			if ((uintptr_t)addr >= w->lo && (uintptr_t)addr < w->hi) {
				found = true;
				memcpy(id, w->id, sizeof(id));
				off = (uint64_t)((uintptr_t)addr - w->lo);
				size = (uint64_t)(w->hi - w->lo);
			}
		}
		pthread_mutex_unlock(&watch_mu);
	}
	if (found)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "region \"%s\" was truncated by its owner: its memory at offset "
				  "%" PRIu64 " of %" PRIu64 " is no longer backed (file truncated?), so "
				  "%s stopped; a worker must not shrink the file of a region in use: "
				  "deregister the region, or re-create it",
				  id, off, size, stopped);
	return sc_err_set(err, SC_FAILED_PRECONDITION,
			  "region memory is no longer backed (file truncated?), so %s stopped; a "
			  "worker must not shrink the file of a region in use: deregister the region, "
			  "or re-create it",
			  stopped);
}
