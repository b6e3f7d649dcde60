/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/connect_peer.c: ConnectPeer. A worker hands metadata a peer issued; once it verifies (as
 * BeginRead/BeginWrite verify it, without using it up), every backend that both sidecars offer
 * and that can reach the peer sets up what a first transfer would otherwise set up on its own
 * time (its connect op: TCP's authenticated data connections, ibverbs' queue pair), one after the
 * other, each bounded by the call's deadline. Runs on the calling gRPC worker thread; takes the
 * engine lock only to borrow the keyring.
 *
 * With --warm-peers, metadata that arrives on a NATS subscription (engine/bus.c, a NATS delivery
 * thread) is offered to the warmer: its one thread does the same for the issuer in the background,
 * once per issuer per WARM_AGAIN_MS, so that the worker's first transfer finds the connections
 * open. Owns the warmer thread and its queue of metadata texts.
 */
#include "engine/internal.h"

#include "engine/backend_registry.h"
#include "base/log.h"
#include "meta/metadata.h"
#include "engine/metrics.h"
#include "base/timer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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
	struct sc_metadata md;
	if (sc_engine_verify_metadata(eng, text, eng->id, SC_MD_SOURCE_BEGIN, &md, err) != 0)
		return -1;
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

/* ---- in the background, for metadata received over NATS (--warm-peers) ---------------------- */

#define WARM_QUEUE 16	       /* pending warm-ups; more are dropped (the first transfer dials) */
#define WARM_RECENT 64	       /* issuers remembered, so a burst of metadata warms each once */
#define WARM_AGAIN_MS 30000    /* an issuer is warmed again after this long */
#define WARM_TIMEOUT_MS 5000

struct sc_warmer {
	struct sc_engine *eng;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	char *queue[WARM_QUEUE]; /* metadata texts, owned */
	size_t head, n;
	struct {
		char issuer[SC_NAME_MAX];
		uint64_t at_ms;
	} recent[WARM_RECENT];
	size_t next_recent;
};

static void *warmer_main(void *arg)
{
	struct sc_warmer *w = arg;
	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (!w->stop && w->n == 0)
			pthread_cond_wait(&w->cv, &w->mu);
		if (w->stop)
			break;
		char *text = w->queue[w->head];
		w->head = (w->head + 1) % WARM_QUEUE;
		w->n--;
		pthread_mutex_unlock(&w->mu);
		struct sc_peer_paths res;
		struct sc_err err = {0};
		if (sc_engine_connect_peer(w->eng, text, WARM_TIMEOUT_MS, &res, &err) != 0)
			SC_INFO("peers", "background warm-up for metadata received over NATS failed "
				"(the first transfer will connect itself): %s", err.msg);
		free(text);
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int sc_warmer_start(struct sc_engine *eng, struct sc_warmer **out, struct sc_err *err)
{
	struct sc_warmer *w = calloc(1, sizeof(*w));
	if (!w)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	w->eng = eng;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	int rc = pthread_create(&w->thread, NULL, warmer_main, w);
	if (rc != 0) {
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		free(w);
		return sc_err_set(err, SC_INTERNAL, "cannot start the warm-up thread: %s",
				  strerror(rc));
	}
	*out = w;
	return 0;
}

void sc_warmer_offer(struct sc_warmer *w, const char *text, const char *issuer)
{
	if (!w)
		return;
	uint64_t now = sc_clock_mono_ms();
	pthread_mutex_lock(&w->mu);
	for (size_t i = 0; i < WARM_RECENT; i++) {
		if (w->recent[i].at_ms && strcmp(w->recent[i].issuer, issuer) == 0 &&
		    now - w->recent[i].at_ms < WARM_AGAIN_MS) {
			pthread_mutex_unlock(&w->mu);
			return;
		}
	}
	char *copy = w->n < WARM_QUEUE && !w->stop ? strdup(text) : NULL;
	if (copy) {
		w->queue[(w->head + w->n) % WARM_QUEUE] = copy;
		w->n++;
		snprintf(w->recent[w->next_recent].issuer, sizeof(w->recent[0].issuer), "%s", issuer);
		w->recent[w->next_recent].at_ms = now;
		w->next_recent = (w->next_recent + 1) % WARM_RECENT;
		pthread_cond_signal(&w->cv);
	}
	pthread_mutex_unlock(&w->mu);
}

void sc_warmer_stop(struct sc_warmer *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	for (size_t i = 0; i < w->n; i++)
		free(w->queue[(w->head + i) % WARM_QUEUE]);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
