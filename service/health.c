/* SPDX-License-Identifier: Apache-2.0 */
/*
 * health.c: grpc.health.v1.Health, so Kubernetes' native gRPC probes work. SERVING once the
 * service started, NOT_SERVING while draining. Known service names: "" (the whole server) and
 * "rdma_sidecar.v1.Sidecar". Watch streams the current status, then every change, until the client
 * cancels. Check also knows "rdma_sidecar.v1.Sidecar/gpu", readiness for GPU work: SERVING only
 * while serving with at least one GPU and none poisoned by a sticky CUDA error (Check only: Watch
 * answers SERVICE_UNKNOWN for it). Handlers run on gRPC worker threads; sc_health_set on the main
 * thread. Owns the list of watching calls (each holding a call reference), under its own mutex.
 */
#include "handlers.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct watcher {
	struct sc_call *call;
	bool known;
	struct watcher *next;
};

struct sc_health {
	pthread_mutex_t mu;
	bool serving;
	struct watcher *watchers;
};

struct sc_health *sc_health_create(void)
{
	struct sc_health *h = calloc(1, sizeof(*h));
	if (h)
		pthread_mutex_init(&h->mu, NULL);
	return h;
}

void sc_health_destroy(struct sc_health *h)
{
	if (!h)
		return;
	while (h->watchers) {
		struct watcher *w = h->watchers;
		h->watchers = w->next;
		sc_call_unref(w->call);
		free(w);
	}
	pthread_mutex_destroy(&h->mu);
	free(h);
}

static bool known_service(const char *name)
{
	return !name || !name[0] || strcmp(name, "rdma_sidecar.v1.Sidecar") == 0;
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus status_of(bool serving, bool known)
{
	if (!known)
		return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
	return serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
		       : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void send_status(struct sc_call *c, bool serving, bool known)
{
	Grpc__Health__V1__HealthCheckResponse m = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	m.status = status_of(serving, known);
	sc_call_send(c, &m.base);
}

void sc_health_set(struct sc_health *h, bool serving)
{
	pthread_mutex_lock(&h->mu);
	bool changed = h->serving != serving;
	h->serving = serving;
	if (changed)
		for (struct watcher *w = h->watchers; w; w = w->next)
			if (w->known)
				send_status(w->call, serving, true);
	pthread_mutex_unlock(&h->mu);
}

#define SC_HEALTH_GPU "rdma_sidecar.v1.Sidecar/gpu"

void sc_h_health_check(struct sc_call *c, ProtobufCMessage *req)
{
	Grpc__Health__V1__HealthCheckRequest *r = (Grpc__Health__V1__HealthCheckRequest *)req;
	struct sc_health *h = sc_service_health(sc_call_service(c));
	bool gpu = r->service && strcmp(r->service, SC_HEALTH_GPU) == 0;
	if (!gpu && !known_service(r->service)) {
		sc_call_fail(c, SC_NOT_FOUND, "unknown service name: use \"\" or "
					     "\"rdma_sidecar.v1.Sidecar\"");
		return;
	}
	pthread_mutex_lock(&h->mu);
	bool serving = h->serving;
	pthread_mutex_unlock(&h->mu);
	if (gpu && serving)
		serving = sc_region_gpus_healthy(sc_call_engine(c));
	Grpc__Health__V1__HealthCheckResponse m = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	m.status = status_of(serving, true);
	sc_call_reply(c, &m.base);
}

static void watch_cancelled(struct sc_call *c)
{
	struct sc_health *h = sc_service_health(sc_call_service(c));
	struct watcher *found = NULL;
	pthread_mutex_lock(&h->mu);
	for (struct watcher **pp = &h->watchers; *pp; pp = &(*pp)->next) {
		if ((*pp)->call == c) {
			found = *pp;
			*pp = found->next;
			break;
		}
	}
	pthread_mutex_unlock(&h->mu);
	sc_call_finish(c, SC_CANCELLED, "watch cancelled");
	if (found) {
		sc_call_unref(found->call);
		free(found);
	}
}

void sc_h_health_watch(struct sc_call *c, ProtobufCMessage *req)
{
	Grpc__Health__V1__HealthCheckRequest *r = (Grpc__Health__V1__HealthCheckRequest *)req;
	struct sc_health *h = sc_service_health(sc_call_service(c));
	struct watcher *w = calloc(1, sizeof(*w));
	if (!w) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	w->call = c;
	w->known = known_service(r->service);
	sc_call_ref(c);
	pthread_mutex_lock(&h->mu);
	send_status(c, h->serving, w->known);
	w->next = h->watchers;
	h->watchers = w;
	pthread_mutex_unlock(&h->mu);
	sc_call_on_cancel(c, watch_cancelled);
}
