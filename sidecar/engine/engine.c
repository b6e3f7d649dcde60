/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine.c: the engine object, on top of the engine's other files: creation (keys,
 * backends, probes), start (data listener, timer, NATS), drain and teardown, GetInfo, the metrics
 * gauges and the test accessors (engine/test.h). It hands what it creates what that uses: the
 * scheduler its hooks into the operations, the peer server, the peer pool and the backends the
 * passive interface, the id, the keyring source and GPU access; none of them calls back into it.
 * Runs on the main thread (lifecycle, SIGHUP TLS reload) and on gRPC threads (info, timers).
 * Owns every table, the timer thread, the backends, the peer server and pool and the NATS bus.
 */
#include "engine/internal.h"
#include "engine/backend_registry.h"
#include "engine/test.h"
#include "os/fault_guard.h"
#include "os/heap_trim.h"
#include "base/log.h"
#include "nats/client.h"
#include "backend/passive.h"
#include "os/path_guard.h"
#include "peer/pool.h"
#include "peer/request.h"
#include "peer/server.h"
#include "peer/tls.h"

#include "build_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t sc_now_unix_ms(void)
{
	return sc_clock_unix_ms();
}

uint64_t sc_now_mono_ms(void)
{
	return sc_clock_mono_ms();
}

/* ---- test accessors (engine/test.h) and what the engine hands out ---------------------------- */

struct sc_backend *sc_engine_backend(struct sc_engine *eng, enum sc_backend_kind kind)
{
	return (int)kind > 0 && (int)kind < SC_NUM_BACKENDS ? eng->backends[kind] : NULL;
}

struct sc_peer_pool *sc_engine_peer_pool(struct sc_engine *eng)
{
	return eng->peer_pool;
}

struct sc_peer_server *sc_engine_peer_server(struct sc_engine *eng)
{
	return eng->peer_server;
}

struct sc_passive sc_engine_passive(struct sc_engine *eng)
{
	return sc_op_passive(eng);
}

static bool backend_enabled(const struct sc_config *cfg, unsigned bit)
{
	return cfg->backends == 0 || (cfg->backends & bit);
}

static void disable_backend(struct sc_backend *b, const char *why)
{
	if (!b)
		return;
	b->available = false;
	snprintf(b->detail, sizeof(b->detail), "%s", why);
}

_Static_assert(SC_INFO_MAX_RAILS == SC_METRICS_MAX_RAILS, "GetInfo and the metrics list the same rails");
_Static_assert(SC_INFO_MAX_ENDPOINTS == SC_MAX_ENDPOINTS, "GetInfo lists every data endpoint");

/* Every backend's rails, in engine/backend_registry.c order. Under eng->mu (the backends are fixed). */
static size_t collect_rails_locked(struct sc_engine *eng, struct sc_rail_entry *out, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		enum sc_backend_kind kind = sc_backend_registry_at(i)->kind;
		struct sc_backend *b = eng->backends[kind];
		for (size_t r = 0; b && r < b->n_rails && n < cap; r++) {
			out[n].backend = kind;
			out[n].index = (uint32_t)r;
			sc_rail_snapshot(b, r, &out[n].r);
			n++;
		}
	}
	return n;
}

/* Descriptors the sidecar keeps for itself beside its peer connections: listeners, the gRPC
 * core, NATS, devices, log and region files (a rough, generous figure). */
#define RESERVED_FDS 256

/* Raise the soft open-file limit to the hard one: every peer connection takes a descriptor, and
 * a distribution's default soft limit (1024) is below what a large cluster needs. Main thread, at
 * create. */
static void raise_open_files(struct sc_engine *eng)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
		SC_WARN("engine", "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
		return;
	}
	rlim_t before = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
			SC_WARN("engine", "cannot raise the open-file limit from %llu to %llu: %s",
				(unsigned long long)before, (unsigned long long)rl.rlim_max,
				strerror(errno));
			rl.rlim_cur = before;
		}
	}
	eng->open_files_limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
	uint64_t peers = eng->open_files_limit > RESERVED_FDS ? eng->open_files_limit - RESERVED_FDS
							       : 0;
	char was[64] = "";
	if (before != rl.rlim_cur)
		snprintf(was, sizeof(was), ", raised from %llu", (unsigned long long)before);
	if (peers < 1024)
		SC_WARN("engine", "open files: %llu%s; that leaves room for about %llu peer "
			"connections: raise the hard limit (ulimit -Hn, LimitNOFILE=) for a large cluster",
			(unsigned long long)eng->open_files_limit, was, (unsigned long long)peers);
	else
		SC_INFO("engine", "open files: %llu%s (room for about %llu peer connections)",
			(unsigned long long)eng->open_files_limit, was, (unsigned long long)peers);
}

/* ---- gauges for the metrics (scrape thread) ------------------------------------------------ */

/* Calls fn for every operation (struct sc_op *) in the table. Under mu. */
static void sc_engine_each_op(struct sc_engine *eng, void (*fn)(void *ctx, void *op), void *ctx)
{
	if (eng->ops)
		sc_idmap_each(eng->ops, fn, ctx);
}

static void count_op(void *ctx, void *value)
{
	struct sc_gauges *g = ctx;
	const struct sc_op *op = value;
	if (sc_op_status_terminal(op->status) || op->kind <= SC_OP_NONE || op->kind > SC_OP_WRITE)
		return;
	g->live[op->kind]++;
	if (op->status == SC_OPS_SCHEDULED && op->waiting_requirement)
		g->waiting_progress++;
}

static void count_region(void *ctx, void *value)
{
	struct sc_gauges *g = ctx;
	const struct sc_region *r = value;
	g->regions++;
	g->region_bytes += r->size;
}

static void read_gauges(void *ctx, struct sc_gauges *g)
{
	struct sc_engine *eng = ctx;
	memset(g, 0, sizeof(*g));
	pthread_mutex_lock(&eng->mu);
	sc_engine_each_op(eng, count_op, g);
	if (eng->regions)
		sc_idmap_each(eng->regions, count_region, g);
	g->queued = sc_sched_queued(eng);
	g->progress_records = sc_sched_progress_records(eng);
	g->active_transfers = eng->active_transfers;
	g->inflight_bytes = eng->inflight_bytes;
	g->draining = eng->draining;
	for (int b = 0; b < SC_NUM_BACKENDS; b++)
		g->available[b] = eng->backends[b] && eng->backends[b]->available;
	g->n_rails = collect_rails_locked(eng, g->rails, SC_INFO_MAX_RAILS);
	g->peers_evicted = sc_peer_server_evicted(eng->peer_server);
	sc_peer_server_load(eng->peer_server, &g->peer_load);
	const struct sc_backend *ibb = eng->backends[SC_BACKEND_IBVERBS];
	if (ibb) {
		g->ib_qps_evicted = atomic_load(&ibb->qps_evicted);
		g->ib_qps_expired = atomic_load(&ibb->qps_expired);
		g->ib_qps_refused = atomic_load(&ibb->qps_refused);
	}
	const struct sc_backend *ofb = eng->backends[SC_BACKEND_LIBFABRIC];
	if (ofb) {
		g->ofi_keys_granted = atomic_load(&ofb->keys_granted);
		g->ofi_keys_revoked = atomic_load(&ofb->keys_revoked);
		g->ofi_addrs_inserted = atomic_load(&ofb->addrs_inserted);
		g->ofi_addrs_evicted = atomic_load(&ofb->addrs_evicted);
	}
	for (int i = 0; i < SC_FAST_EVENTS; i++)
		g->fast_events[i] = atomic_load(&eng->fast_events[i]);
	if (eng->grpc_cert_serial[0]) {
		struct sc_cert_gauge *c = &g->certs[g->n_certs++];
		c->use = "grpc";
		snprintf(c->serial, sizeof(c->serial), "%s", eng->grpc_cert_serial);
		c->not_after = eng->grpc_cert_not_after;
	}
	pthread_mutex_unlock(&eng->mu);
	/* The bus exists from before the metrics serve until after they stop. */
	g->nats_state = eng->bus ? sc_nats_bus_state(eng->bus) : "disabled";
	sc_nats_bus_stats(eng->bus, &g->nats);
	if (eng->peer_tls) {
		struct sc_tls_cert_info ci;
		sc_peer_tls_info(eng->peer_tls, &ci);
		struct sc_cert_gauge *c = &g->certs[g->n_certs++];
		c->use = "peer";
		snprintf(c->serial, sizeof(c->serial), "%s", ci.serial);
		c->not_after = ci.not_after;
	}
}

static bool is_draining(void *ctx)
{
	struct sc_engine *eng = ctx;
	pthread_mutex_lock(&eng->mu);
	bool d = eng->draining;
	pthread_mutex_unlock(&eng->mu);
	return d;
}

/* The scheduler starts an operation's transfer once it holds a slot, and drops the references
 * its queue held, through these. */
static const struct sc_sched_hooks sched_hooks = {.start = sc_op_start_transfer,
						  .drop = sc_op_unref};

int sc_engine_create(const struct sc_config *cfg, struct sc_engine **out, struct sc_err *err)
{
	struct sc_engine *eng = calloc(1, sizeof(*eng));
	if (!eng)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	eng->cfg = cfg;
	pthread_mutex_init(&eng->mu, NULL);
	pthread_cond_init(&eng->idle_cv, NULL);
	sc_sched_init(eng, &sched_hooks);
	sc_list_init(&eng->subs);
	sc_list_init(&eng->stored);
	snprintf(eng->id, sizeof(eng->id), "%s", cfg->id);
	eng->regions = sc_idmap_create();
	eng->ops = sc_idmap_create();
	eng->tokens = sc_idmap_create();
	eng->spent_tokens = sc_idmap_create();
	eng->progress_ids = sc_idmap_create();
	if (!eng->regions || !eng->ops || !eng->tokens || !eng->spent_tokens ||
	    !eng->progress_ids) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}

	struct stat st;
	if (stat(cfg->shm_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--shm-dir %s is not a directory: %s",
			   cfg->shm_dir, errno ? strerror(errno) : "not a directory");
		goto fail;
	}
	if (access(cfg->shm_dir, W_OK) != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--shm-dir %s is not writable: %s",
			   cfg->shm_dir, strerror(errno));
		goto fail;
	}
	if (sc_path_guard_check_dirs(cfg, err) != 0)
		goto fail;
	if (sc_fault_guard_install(err) != 0)
		goto fail;

	if (cfg->key_file && cfg->key_file[0]) {
		if (sc_keyring_load(cfg->key_file, &eng->keys, err) != 0) {
			sc_err_prefix(err, "--key-file");
			goto fail;
		}
		SC_INFO_KV("keys",
			   (&(struct sc_log_fields){.key_id = sc_keyring_signing_id(eng->keys)}),
			   "loaded %zu key(s) from %s; signing with \"%s\"",
			sc_keyring_count(eng->keys), cfg->key_file,
			sc_keyring_signing_id(eng->keys));
	} else {
		if (sc_engine_ephemeral_keyring(eng, err) != 0)
			goto fail;
		SC_WARN("keys", "no --key-file: metadata is signed with a throw-away key, so only "
				"transfers inside this sidecar work; give every sidecar the same "
				"--key-file for cross-sidecar transfers");
	}

	raise_open_files(eng);
	eng->gpu = sc_gpu_open(eng->cuda_detail, sizeof(eng->cuda_detail));
	sc_engine_topology_load(eng);

	/* The peer channel carries the TCP data plane and the ibverbs rendezvous. */
	bool peer_channel = false;
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		peer_channel |= c->peer_channel && backend_enabled(cfg, SC_BACKEND_BIT(c->kind));
	}
	const struct sc_keyring_source keys = sc_engine_keyring_source(eng);
	if (peer_channel) {
		if (sc_peer_tls_create(cfg, &eng->peer_tls, err) != 0)
			goto fail;
		const struct sc_peer_server_env senv = {.self_id = eng->id, .keys = keys,
							.gpu = eng->gpu,
							.passive = sc_op_passive(eng)};
		if (sc_peer_server_create(&senv, cfg, &eng->peer_server, err) != 0)
			goto fail;
		if (sc_peer_pool_create(eng->id, &keys, &eng->peer_pool, err) != 0)
			goto fail;
		sc_peer_server_set_tls(eng->peer_server, eng->peer_tls);
		sc_peer_pool_set_tls(eng->peer_pool, eng->peer_tls);
		sc_peer_pool_set_admit(eng->peer_pool, sc_peer_ping);
	}
	/* Backends talk to passive operations only through the interface handed here; those on the
	 * peer channel get it through the peer server, which adds the claim of completion notices
	 * (ibverbs). */
	const struct sc_backend_env env = {.cfg = cfg, .self_id = eng->id,
					   .passive = sc_op_passive(eng), .pool = eng->peer_pool,
					   .server = eng->peer_server, .gpu = eng->gpu,
					   .rail_choice = sc_engine_rail_choice,
					   .rail_choice_ctx = eng};
	struct sc_backend_env peer_env = env;
	if (eng->peer_server)
		peer_env.passive = sc_peer_server_passive(eng->peer_server);
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		struct sc_backend *b = sc_backend_registry_create(c, c->peer_channel ? &peer_env : &env);
		if (!b) {
			sc_err_set(err, SC_RESOURCE_EXHAUSTED, "cannot create backend %s", c->name);
			goto fail;
		}
		eng->backends[c->kind] = b;
		if (!backend_enabled(cfg, SC_BACKEND_BIT(c->kind)))
			disable_backend(b, "disabled by --backends");
		else if ((cfg->backends & SC_BACKEND_BIT(c->kind)) && !b->available)
			SC_WARN(c->name, "--backends asks for %s but it is unavailable: %s", c->name,
				b->detail);
	}
	const struct sc_metrics_source msrc = {.id = eng->id, .gpu = eng->gpu,
					       .read_gauges = read_gauges, .draining = is_draining,
					       .ctx = eng};
	if (sc_metrics_create(&msrc, cfg->metrics_listen, &eng->metrics, err) != 0)
		goto fail;
	*out = eng;
	return 0;
fail:
	sc_engine_destroy(eng);
	return -1;
}

int sc_engine_start(struct sc_engine *eng, struct sc_err *err)
{
	if (sc_timers_create(&eng->timers) != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot start the timer thread");
	if (!sc_heap_trim_start(eng->timers))
		SC_WARN("engine", "cannot arm the periodic heap trim (out of memory)");
	if (eng->peer_server && sc_peer_server_start(eng->peer_server, err) != 0)
		return -1;
	/* cert-manager and SPIRE rewrite the files: new connections take the new certificate. */
	if (sc_peer_tls_watch(eng->peer_tls, eng->cfg->tls_reload_interval_ms, err) != 0)
		return -1;
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		struct sc_backend *be = eng->backends[c->kind];
		if (!be->available)
			continue;
		struct sc_err berr;
		sc_err_clear(&berr);
		if (sc_backend_start(be, &berr) != 0) {
			if (c->must_start && (eng->cfg->backends & SC_BACKEND_BIT(c->kind)))
				return sc_err_set(err, berr.code, "%s backend: %s", c->name, berr.msg);
			SC_WARN("engine", "backend %s failed to start, disabled: %s", c->name,
				berr.msg);
			disable_backend(be, berr.msg);
		}
	}
	if (eng->cfg->nats_url && eng->cfg->nats_url[0]) {
		const struct sc_config *c = eng->cfg;
		struct sc_nats_bus_opts no = {.tls_ca = c->nats_tls_ca,
					      .tls_cert = c->nats_tls_cert,
					      .tls_key = c->nats_tls_key,
					      .creds_file = c->nats_creds,
					      .nkey_seed_file = c->nats_nkey_seed};
		if (sc_nats_bus_create_ex(c->nats_url, eng->id, &no, &eng->bus, err) != 0) {
			sc_err_prefix(err, "--nats-url");
			return -1;
		}
		if (sc_bus_start(eng, err) != 0)
			return -1;
		if (c->warm_peers && eng->peer_pool && sc_warmer_start(eng, &eng->warmer, err) != 0)
			return -1;
	}
	if (sc_metrics_start(eng->metrics, err) != 0)
		return -1;
	sc_engine_topology_build(eng);
	eng->started = true;
	for (int b = 1; b < SC_NUM_BACKENDS; b++)
		if (eng->backends[b])
			SC_INFO("engine", "backend %-7s %s: %s",
				sc_backend_name((enum sc_backend_kind)b),
				eng->backends[b]->available ? "available  " : "unavailable",
				eng->backends[b]->detail);
	SC_INFO("engine", "cuda: %s", eng->cuda_detail);
	for (int i = 0; i < sc_gpu_count(eng->gpu); i++) {
		const struct sc_gpu_device_info *g = sc_gpu_device(eng->gpu, i);
		SC_INFO("engine", "gpu %d: %s (%s), nearest RDMA device: %s; ibverbs path: %s", i,
			g->name, g->pci_bus_id, g->nearest_detail, g->rdma_path);
	}
	return 0;
}

void sc_engine_begin_drain(struct sc_engine *eng)
{
	pthread_mutex_lock(&eng->mu);
	eng->draining = true;
	pthread_mutex_unlock(&eng->mu);
}

static uint32_t sc_engine_active_count(struct sc_engine *eng)
{
	return eng->active_transfers;
}

/* Transfers this sidecar runs (active, scheduled) or serves to a peer (passive, begun). */
static bool engine_busy(struct sc_engine *eng)
{
	return sc_engine_active_count(eng) > 0 || sc_sched_queued(eng) > 0 ||
	       sc_engine_passive_busy_count(eng) > 0;
}

bool sc_engine_wait_idle(struct sc_engine *eng, uint64_t timeout_ms)
{
	uint64_t end = sc_clock_mono_after_ms(timeout_ms);
	pthread_mutex_lock(&eng->mu);
	while (engine_busy(eng)) {
		uint64_t now = sc_clock_mono_ms();
		if (now >= end)
			break;
		sc_cond_wait_ms(&eng->idle_cv, &eng->mu, end - now < 100 ? end - now : 100);
	}
	bool idle = !engine_busy(eng);
	pthread_mutex_unlock(&eng->mu);
	return idle;
}

void sc_engine_destroy(struct sc_engine *eng)
{
	if (!eng)
		return;
	sc_metrics_stop(eng->metrics); /* no scrape reads the tables while they go */
	sc_engine_begin_drain(eng);
	if (eng->ops)
		sc_op_cancel_all(eng, "sidecar is shutting down");
	/* Wait (briefly) for backends to report the cancelled transfers. */
	if (eng->started)
		sc_engine_wait_idle(eng, 5000);
	sc_bus_stop(eng);
	sc_warmer_stop(eng->warmer); /* before the backends: it uses them */
	eng->warmer = NULL;
	sc_nats_bus_destroy(eng->bus);
	eng->bus = NULL;
	for (int b = 1; b < SC_NUM_BACKENDS; b++)
		if (eng->backends[b] && eng->started)
			sc_backend_stop(eng->backends[b]);
	sc_peer_server_destroy(eng->peer_server);
	eng->peer_server = NULL;
	if (eng->ops)
		sc_op_forget_all(eng);
	sc_timers_destroy(eng->timers);
	eng->timers = NULL;
	if (eng->regions)
		sc_region_release_all(eng);
	for (int b = 1; b < SC_NUM_BACKENDS; b++)
		sc_backend_destroy(eng->backends[b]);
	sc_peer_pool_destroy(eng->peer_pool);
	sc_gpu_close(eng->gpu); /* after the regions: they hold GPU memory */
	sc_engine_topology_free(eng);
	sc_peer_tls_destroy(eng->peer_tls);
	sc_sched_free_progress(eng);
	sc_idmap_destroy(eng->regions);
	sc_idmap_destroy(eng->ops);
	sc_idmap_destroy(eng->tokens);
	sc_idmap_destroy(eng->spent_tokens);
	sc_metrics_destroy(eng->metrics);
	sc_keyring_release(eng->keys);
	pthread_cond_destroy(&eng->idle_cv);
	pthread_mutex_destroy(&eng->mu);
	free(eng);
}

void sc_engine_fast_path_note(struct sc_engine *eng, enum sc_fast_event ev)
{
	if (eng && ev < SC_FAST_EVENTS)
		atomic_fetch_add(&eng->fast_events[ev], 1);
}

void sc_engine_fast_path_run_time(struct sc_engine *eng, uint64_t ns)
{
	if (eng)
		sc_metrics_fast_run_time(eng->metrics, ns);
}

void sc_engine_grpc_methods(struct sc_engine *eng, const char *const *paths,
			    const char *const *types, size_t n)
{
	sc_metrics_grpc_methods(eng->metrics, paths, types, n);
}

void sc_engine_grpc_call_started(struct sc_engine *eng, size_t method)
{
	sc_metrics_grpc_started(eng->metrics, method);
}

void sc_engine_grpc_call_done(struct sc_engine *eng, size_t method, enum sc_status code,
			      uint64_t ns)
{
	sc_metrics_grpc_handled(eng->metrics, method, (int)code, ns);
}

uint64_t sc_engine_clock_ns(void)
{
	return sc_metrics_clock_ns();
}

void sc_engine_set_grpc_certificate(struct sc_engine *eng, const char *serial, int64_t not_after)
{
	pthread_mutex_lock(&eng->mu);
	snprintf(eng->grpc_cert_serial, sizeof(eng->grpc_cert_serial), "%s", serial ? serial : "");
	eng->grpc_cert_not_after = not_after;
	pthread_mutex_unlock(&eng->mu);
}

int sc_engine_reload_tls(struct sc_engine *eng, struct sc_err *err)
{
	if (!eng->peer_tls)
		return 0;
	return sc_peer_tls_reload(eng->peer_tls, true, err) < 0 ? -1 : 0;
}

void sc_engine_info(struct sc_engine *eng, struct sc_info *out)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->sidecar_id, sizeof(out->sidecar_id), "%s", eng->id);
	out->version = SC_VERSION;
	pthread_mutex_lock(&eng->mu);
	for (size_t i = 0; i < sc_backend_registry_count() && i < SC_INFO_MAX_BACKENDS; i++) {
		enum sc_backend_kind kind = sc_backend_registry_at(i)->kind;
		struct sc_backend *b = eng->backends[kind];
		struct sc_backend_report *r = &out->backends[out->n_backends++];
		r->backend = kind;
		r->available = b && b->available;
		snprintf(r->detail, sizeof(r->detail), "%s", b ? b->detail : "not built");
		for (size_t d = 0; b && d < b->n_devices && d < 4; d++)
			snprintf(r->devices[r->n_devices++], sizeof(r->devices[0]), "%s",
				 b->devices[d]);
	}
	out->n_rails = collect_rails_locked(eng, out->rails, SC_INFO_MAX_RAILS);
	out->topology_source = eng->topo_source;
	out->open_files_limit = eng->open_files_limit;
	out->topo_table = eng->topo_table;
	for (size_t k = 0; eng->topo_table && k < eng->n_absent_rails &&
			   out->n_rails < SC_INFO_MAX_RAILS; k++) {
		const struct sc_topo_rail *tr = &eng->topo_table->rails[eng->absent_rails[k]];
		struct sc_rail_entry *e = &out->rails[out->n_rails++];
		memset(e, 0, sizeof(*e));
		e->backend = SC_BACKEND_IBVERBS;
		e->index = (uint32_t)k;
		snprintf(e->r.name, sizeof(e->r.name), "%s", tr->name);
		snprintf(e->r.pci, sizeof(e->r.pci), "%s", tr->pci);
		e->r.numa = tr->numa;
		e->r.state = SC_RAIL_ABSENT;
		snprintf(e->r.detail, sizeof(e->r.detail),
			 "named by the topology file %s only: no such RDMA device here", eng->topo_source);
	}
	struct sc_backend *tcp = eng->backends[SC_BACKEND_TCP];
	if (eng->peer_server) {
		size_t n = sc_peer_server_n_endpoints(eng->peer_server);
		for (size_t i = 0; i < n && i < SC_INFO_MAX_ENDPOINTS; i++) {
			snprintf(out->data_endpoints[i], sizeof(out->data_endpoints[i]), "%s",
				 sc_peer_server_endpoint_at(eng->peer_server, i));
			if (out->data_endpoints[i][0])
				out->n_data_endpoints = i + 1;
		}
	}
	(void)tcp;
	if (eng->peer_tls) { /* say how the peer channel is protected, on the tcp backend's line */
		struct sc_backend_report *r = &out->backends[0];
		size_t used = strlen(r->detail);
		snprintf(r->detail + used, sizeof(r->detail) - used, "; peer TLS: %s",
			 sc_peer_tls_mode(eng->peer_tls));
	}
	snprintf(out->nats_state, sizeof(out->nats_state), "%s",
		 eng->bus ? sc_nats_bus_state(eng->bus) : "disabled");
	out->signing_enabled = !eng->keys_ephemeral;
	if (!eng->keys_ephemeral)
		snprintf(out->signing_key_id, sizeof(out->signing_key_id), "%s",
			 sc_keyring_signing_id(eng->keys));
	pthread_mutex_unlock(&eng->mu);
	if (eng->peer_tls) {
		struct sc_tls_cert_info ci;
		sc_peer_tls_info(eng->peer_tls, &ci);
		out->has_peer_cert = true;
		snprintf(out->peer_cert_serial, sizeof(out->peer_cert_serial), "%s", ci.serial);
		snprintf(out->peer_cert_identity, sizeof(out->peer_cert_identity), "%s",
			 ci.has_identity ? ci.identity : "");
		out->peer_cert_not_before = ci.not_before;
		out->peer_cert_not_after = ci.not_after;
		out->peer_identity_source = sc_peer_identity_name(eng->cfg->peer_identity);
	}
	out->cuda_available = eng->gpu != NULL;
	snprintf(out->cuda_detail, sizeof(out->cuda_detail), "%s", eng->cuda_detail);
	out->n_gpus = (size_t)sc_gpu_count(eng->gpu);
	for (size_t i = 0; i < out->n_gpus; i++)
		out->gpus[i] = *sc_gpu_device(eng->gpu, (int)i);
}

uint64_t sc_engine_timer_add(struct sc_engine *eng, uint64_t delay_ms, sc_timer_fn fn, void *ctx)
{
	return sc_timers_add(eng->timers, sc_clock_mono_after_ms(delay_ms), fn, ctx);
}

bool sc_engine_timer_cancel(struct sc_engine *eng, uint64_t timer_id)
{
	return sc_timers_cancel(eng->timers, timer_id);
}

bool sc_engine_timer_try_cancel(struct sc_engine *eng, uint64_t timer_id)
{
	return sc_timers_try_cancel(eng->timers, timer_id);
}
