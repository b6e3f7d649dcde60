// SPDX-License-Identifier: Apache-2.0
/*
 * absl_tune.cc: the only C++ in the sidecar: the Abseil settings of absl_tune.h, which have no C
 * API. Called on the main thread before gRPC starts; owns nothing.
 *
 * Why (issue 12, the soak's heap creep): with Debian's Abseil (built without NDEBUG) every
 * absl::Mutex::Lock under gRPC ran the deadlock detector, whose lock graph gained about one
 * 512-byte node a second under the soak's load (GraphCycles::GetId found no free node to reuse)
 * in LowLevelAlloc pages that are never given back: RssAnon rose ~25-50 KB a minute while
 * malloc's live set (heaptrack) stayed flat.
 */
#include "absl_tune.h"

#include <absl/synchronization/mutex.h>

void sc_absl_tune(void)
{
	absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void sc_absl_lock_order_probe(void)
{
	absl::Mutex a, b;
	a.Lock();
	b.Lock();
	b.Unlock();
	a.Unlock();
	b.Lock();
	a.Lock(); /* the reverse order: a "potential deadlock" to the detector */
	a.Unlock();
	b.Unlock();
}
