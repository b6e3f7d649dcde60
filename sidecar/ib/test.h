/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/test.h: test-only hooks into the ibverbs backend (tests/unit/test_ib_*.c). Defined only in
 * builds with libibverbs (SC_HAVE_IBVERBS); free of verbs types so a test compiles either way.
 */
#ifndef SC_IB_TEST_H
#define SC_IB_TEST_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

struct sc_backend;

/*
 * From the engine's ibverbs backend `b` (sc_engine_backend(eng, SC_BACKEND_IBVERBS) of a started
 * engine, engine/test.h; ibverbs available), connect a fresh RC QP (not cached, with its own
 * CQ) to the sidecar `peer_id` at control endpoint `endpoint` through the normal QP_CONNECT
 * rendezvous, post one signalled RDMA READ of len bytes from (remote_addr, rkey) into a scratch
 * buffer, and wait (up to 10 s) for its completion. *wc_status receives the completion's
 * enum ibv_wc_status and status_text its ibv_wc_status_str. Returns 0 when a completion arrived
 * (whatever its status), -1 with err otherwise. The QP pair is torn down afterwards.
 */
int sc_ib_test_probe_read(struct sc_backend *b, const char *peer_id, const char *endpoint,
			  uint64_t remote_addr, uint32_t rkey, uint32_t len, int *wc_status,
			  char *status_text, size_t cap, struct sc_err *err);

/* Counts of the ibverbs backend b's QPs: cached outgoing (one per peer) and incoming. */
void sc_ib_test_qp_counts(struct sc_backend *b, size_t *out_qps, size_t *in_qps);

#endif
