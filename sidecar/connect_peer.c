/* SPDX-License-Identifier: Apache-2.0 */
/*
 * connect_peer.c: ConnectPeer. A worker hands metadata a peer issued; once it verifies (as
 * BeginRead/BeginWrite verify it, without using it up), every backend that both sidecars offer
 * and that can reach the peer sets up what a first transfer would otherwise set up on its own
 * time (its connect op: TCP's authenticated data connections, ibverbs' queue pair), one after the
 * other, each bounded by the call's deadline. Runs on the calling gRPC worker thread; takes the
 * engine lock only to borrow the keyring.
 */
#include "engine_internal.h"

#include "backend_registry.h"
#include "log.h"
#include "metadata.h"
#include "metrics.h"
#include "timer.h"

#include <stdio.h>
#include <string.h>

#define CONNECT_DEFAULT_MS 10000

int sc_engine_connect_peer(struct sc_engine *eng, const char *text, uint64_t timeout_ms,
			   struct sc_peer_paths *out, struct sc_err *err)
{
	if (!text || !text[0])
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata is empty: pass \"rsm1.\" text the peer issued "
				  "(CreateReadable/CreateWritable)");
	uint64_t deadline = sc_clock_mono_after_ms(timeout_ms ? timeout_ms : CONNECT_DEFAULT_MS);
	pthread_mutex_lock(&eng->mu);
	struct sc_keyring *ring = sc_keyring_retain(eng->keys);
	pthread_mutex_unlock(&eng->mu);
	struct sc_metadata md;
	enum sc_md_reject why;
	int rc = sc_metadata_verify_why(ring, text, eng->id, sc_clock_unix_ms(), &md, &why, err);
	sc_keyring_release(ring);
	if (rc != 0) {
		sc_metrics_metadata_rejected(eng->metrics, SC_MD_SOURCE_BEGIN, why);
		return -1;
	}
	struct sc_peer_paths res;
	memset(&res, 0, sizeof(res));
	snprintf(res.peer, sizeof(res.peer), "%s", md.issuer);
	bool same = strcmp(md.issuer, eng->id) == 0;
	bool any = false;
	struct sc_err first = {0};
	for (size_t i = 0; i < sc_backend_registry_count() && res.n < SC_PEER_PATHS_MAX; i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		struct sc_backend *b = eng->backends[c->kind];
		if (!b || !b->available || !c->peer_channel || !c->can_reach(&md, same))
			continue;
		struct sc_peer_path *p = &res.paths[res.n++];
		p->backend = c->kind;
		uint64_t t0 = sc_clock_mono_us();
		struct sc_err e = {0};
		if (sc_backend_connect(b, &md, deadline, p->detail, sizeof(p->detail), &e) == 0) {
			p->ready = true;
			any = true;
		} else {
			snprintf(p->detail, sizeof(p->detail), "%s: %s", sc_status_name(e.code), e.msg);
			if (!first.code)
				first = e;
		}
		p->elapsed_us = sc_clock_mono_us() - t0;
		SC_INFO("peers", "ConnectPeer %s over %s: %s (%llu us)", md.issuer, c->name,
			p->detail, (unsigned long long)p->elapsed_us);
	}
	sc_metadata_free(&md);
	if (res.n == 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "no backend of this sidecar can reach sidecar %s (it offers none that "
				  "is available here: see GetInfo)",
				  res.peer);
	if (!any) {
		*err = first;
		return -1;
	}
	*out = res;
	return 0;
}
