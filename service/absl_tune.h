/* SPDX-License-Identifier: Apache-2.0 */
/*
 * absl_tune.h: settings of the Abseil runtime under gRPC C core, made from C.
 *
 * Debian builds Abseil without NDEBUG, so its absl::Mutex runs the debug-only deadlock detector:
 * every lock taken while another is held records an edge in one process-wide lock graph whose
 * nodes (512 bytes each, from absl's LowLevelAlloc, mmap'd 64 KiB at a time, never returned, and
 * invisible to malloc statistics, heaptrack and LeakSanitizer) grow with the mutexes gRPC creates,
 * and every lock of every gRPC mutex takes the graph's global lock. A release build of Abseil
 * has it off; the sidecar turns it off too.
 */
#ifndef SC_ABSL_TUNE_H
#define SC_ABSL_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Turn off absl's Mutex deadlock detection (absl::OnDeadlockCycle::kIgnore). Call once, before
 * grpc_init and before any thread that may lock an absl::Mutex starts. Cannot fail. */
void sc_absl_tune(void);

/* For tests: lock two absl::Mutexes in one order, then in the other, on this thread. With the
 * deadlock detector on (Debian's default, kAbort) this aborts the process ("dying due to
 * potential deadlock"); with sc_absl_tune applied it returns. */
void sc_absl_lock_order_probe(void);

#ifdef __cplusplus
}
#endif

#endif
