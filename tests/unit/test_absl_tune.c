/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_absl_tune.c: service/absl_tune.h. Debian's Abseil runs absl::Mutex's debug deadlock
 * detector (its lock graph grew the soak's heap, issue 12); sc_absl_tune must turn it off. Each
 * case runs in a forked child, because the detector's verdict on a lock-order inversion is
 * abort(). Every wait has a deadline.
 */
#include "absl_tune.h"
#include "check.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHILD_DEADLINE_S 20

/* Run fn in a child; its wait status, or -1 when it did not end within the deadline. */
static int in_child(void (*fn)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		fn();
		_exit(0);
	}
	for (int i = 0; i < CHILD_DEADLINE_S * 100; i++) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		if (r < 0)
			return -1;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

static void probe_untuned(void)
{
	sc_absl_lock_order_probe();
}

static void probe_tuned(void)
{
	sc_absl_tune();
	sc_absl_lock_order_probe();
}

/* What the fix is for: this Abseil's detector is on and aborts on the inversion. Informational
 * where Abseil was built with NDEBUG (detector off): then nothing needs turning off. */
TEST(untuned_abseil_detects_lock_order_inversion)
{
	int st = in_child(probe_untuned);
	CHECK(st != -1);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		printf("  note: this Abseil has the Mutex deadlock detector off already (NDEBUG "
		       "build)\n");
		return;
	}
	CHECK(WIFSIGNALED(st));
	CHECK_INT_EQ(WTERMSIG(st), SIGABRT);
}

/* The fix: after sc_absl_tune the same inversion passes, so the detector (and its lock graph,
 * which only grows) is off. Fails (SIGABRT in the child) where sc_absl_tune does nothing. */
TEST(tuned_abseil_ignores_lock_order)
{
	int st = in_child(probe_tuned);
	CHECK(st != -1);
	if (WIFSIGNALED(st))
		CHECK_FAIL_("child died of signal %d: the deadlock detector is still on",
			    WTERMSIG(st));
	CHECK(WIFEXITED(st));
	CHECK_INT_EQ(WEXITSTATUS(st), 0);
}

RUN_TESTS(T(untuned_abseil_detects_lock_order_inversion), T(tuned_abseil_ignores_lock_order))
