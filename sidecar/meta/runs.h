/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/runs.h: the compact descriptor form of metadata version 2 (RemoteRun in sidecar.proto).
 * Encoding groups consecutive descriptors sharing length, device kind and rkey into runs and
 * factors their addresses as base + stride * k; decoding expands runs back to exactly the
 * sc_meta_desc array that was encoded. Pure; any thread.
 */
#ifndef SC_METADATA_RUNS_H
#define SC_METADATA_RUNS_H

#include "meta/desc.h"
#include "base/status.h"

#include <stddef.h>

#include "rdma_sidecar/v1/sidecar.pb-c.h"

struct sc_meta_runs {
	RdmaSidecar__V1__RemoteRun *runs;
	RdmaSidecar__V1__RemoteRun **ptrs;
	size_t n;
	uint64_t *k; /* every run's indices, one array (runs point into it) */
	int64_t *deltas;
};

/* Fill *out (free with sc_meta_runs_free, also after a failure). */
int sc_meta_runs_encode(const struct sc_meta_desc *d, size_t n, struct sc_meta_runs *out,
			struct sc_err *err);
void sc_meta_runs_free(struct sc_meta_runs *r);
/* Expand runs; *out calloc'd. INVALID_ARGUMENT on zero counts or lengths, more than `max`
 * descriptors, a bad same_indices_as, index counts that differ from count, address overflow. */
int sc_meta_runs_decode(RdmaSidecar__V1__RemoteRun *const *runs, size_t n, size_t max,
			struct sc_meta_desc **out, size_t *n_out, struct sc_err *err);

#endif
