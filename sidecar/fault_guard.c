/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_guard.c: guarded copies of region memory. Region memory is a MAP_SHARED file mapping that
 * a worker can shrink behind the sidecar's back (ftruncate), after which reading or writing the
 * lost pages raises SIGBUS. sc_guarded_memcpy arms a per-thread sigjmp_buf around the copy; the
 * SIGBUS handler jumps back to it when the fault happened inside such a copy, and otherwise puts
 * back the default action and re-raises, so an unexpected SIGBUS still ends the process with a
 * core as before. The handler is installed with SA_NODEFER, so SIGBUS is not left blocked after
 * the jump and a later fault on the same thread is caught the same way.
 *
 * Runs on whichever thread copies region memory (gRPC workers for Read/WriteRegion, the local
 * backend's worker). Owns the process's SIGBUS disposition once installed; nothing else.
 */
#include "fault_guard.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

static _Thread_local sigjmp_buf *volatile guard_env;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_errno;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	(void)si;
	(void)uctx;
	sigjmp_buf *env = guard_env;
	if (env) {
		guard_env = NULL;
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
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "region memory is no longer backed (file truncated?): the copy "
				  "stopped; re-create the region");
	guard_env = &env;
	memcpy(dst, src, n);
	guard_env = NULL;
	return 0;
}
