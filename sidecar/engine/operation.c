/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/operation.c: the operations' lifecycle core (DESIGN section 8): the table, references,
 * snapshots and watches, creation helpers shared by both kinds (sc_op_new, sc_op_publish), the
 * terminal transition (sc_op_finish_locked: metrics, log, watchers, retention), deadlines,
 * Get/Cancel/Release/Watch/List, engine-wide cancel and forget, and the probe that region memory
 * is still backed. Passive operations live in engine/op_passive.c, active ones in
 * engine/op_active.c; both build on this file, which calls neither.
 *
 * Threads: RPC handlers (gRPC threads), the timer thread (deadlines, retention), backend threads
 * and data-plane server threads through op_active.c and op_passive.c. Everything runs under
 * eng->mu; watchers are called under it too, so they see changes in order. Owns eng->ops and
 * eng->spent_tokens, and every struct sc_op's memory.
 */
#include "engine/internal.h"
#include "engine/backend_registry.h"
#include "os/fault_guard.h"
#include "base/log.h"
#include "backend/passive.h"
#include "peer/server.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long CancelOperation, ReleaseOperation and a forced deregistration wait for the data plane
 * to let go of a passive operation's memory (its connections are cut at once: this is a bound,
 * not a delay). */
#define UNPIN_WAIT_MS 2000

const char *sc_op_status_name(enum sc_op_status s)
{
	switch (s) {
	case SC_OPS_INITIALIZED:
		return "INITIALIZED";
	case SC_OPS_IN_PROGRESS:
		return "IN_PROGRESS";
	case SC_OPS_COMPLETE:
		return "COMPLETE";
	case SC_OPS_CANCELLED:
		return "CANCELLED";
	case SC_OPS_ERRORED:
		return "ERRORED";
	case SC_OPS_SCHEDULED:
		return "SCHEDULED";
	case SC_OPS_UNSPECIFIED:
		break;
	}
	return "UNSPECIFIED";
}

const char *sc_op_kind_name(enum sc_op_kind k)
{
	switch (k) {
	case SC_OP_READABLE:
		return "READABLE";
	case SC_OP_WRITABLE:
		return "WRITABLE";
	case SC_OP_READ:
		return "READ";
	case SC_OP_WRITE:
		return "WRITE";
	case SC_OP_NONE:
		break;
	}
	return "NONE";
}

/* ---- snapshots ------------------------------------------------------------------------------- */

void sc_op_info_free(struct sc_op_info *info)
{
	if (!info)
		return;
	free(info->metadata);
	free(info->descs);
	info->metadata = NULL;
	info->descs = NULL;
	info->n_descs = 0;
}

int sc_op_info_copy(struct sc_op_info *dst, const struct sc_op_info *src)
{
	*dst = *src;
	dst->metadata = NULL;
	dst->descs = NULL;
	if (src->metadata && !(dst->metadata = strdup(src->metadata)))
		return -1;
	if (src->n_descs) {
		dst->descs = malloc(src->n_descs * sizeof(*dst->descs));
		if (!dst->descs) {
			free(dst->metadata);
			dst->metadata = NULL;
			return -1;
		}
		memcpy(dst->descs, src->descs, src->n_descs * sizeof(*dst->descs));
	}
	return 0;
}

static uint32_t uses_left(const struct sc_op *op)
{
	if (op->any_uses)
		return UINT32_MAX;
	return op->max_uses > op->uses_begun ? (uint32_t)(op->max_uses - op->uses_begun) : 0;
}

/* Fill a snapshot. Under mu. Returns -1 only when out of memory (then info is still usable,
 * without metadata and descriptors). */
int sc_op_fill_info(const struct sc_op *op, struct sc_op_info *info)
{
	memset(info, 0, sizeof(*info));
	memcpy(info->id, op->id, sizeof(info->id));
	info->kind = op->kind;
	info->status = op->status;
	info->backend = op->backend;
	info->bytes_total = op->bytes_total;
	info->bytes_done = atomic_load(&op->bytes_done);
	/* COMPLETE means every byte arrived; the last span's count may land a moment later. */
	if (info->bytes_done > info->bytes_total || op->status == SC_OPS_COMPLETE)
		info->bytes_done = info->bytes_total;
	if (sc_op_status_terminal(op->status)) { /* a pending reason shows once it is final */
		info->err_code = op->err_code;
		memcpy(info->err_msg, op->err_msg, sizeof(info->err_msg));
	}
	memcpy(info->peer, op->peer, sizeof(info->peer));
	info->created_unix_ms = op->created_unix_ms;
	info->deadline_unix_ms = op->deadline_unix_ms;
	info->completed_unix_ms = op->completed_unix_ms;
	memcpy(info->request_id, op->request_id, sizeof(info->request_id));
	memcpy(info->trace_id, op->trace_id, sizeof(info->trace_id));
	memcpy(info->backend_reason, op->backend_reason, sizeof(info->backend_reason));
	info->uses_left = (op->kind == SC_OP_READABLE || op->kind == SC_OP_WRITABLE) ? uses_left(op)
										    : 0;
	info->uses_done = op->uses_done;
	info->bytes_served = atomic_load_explicit(&op->bytes_served, memory_order_relaxed);
	info->committed = !sc_op_status_terminal(op->status) && op->xfer_in_flight &&
			  atomic_load(&op->xfer.committed);
	if ((op->kind == SC_OP_READ || op->kind == SC_OP_WRITE) && op->be) {
		for (size_t i = 0; i < op->be->n_rails && i < SC_XFER_MAX_RAILS; i++) {
			uint64_t n = atomic_load_explicit(&op->xfer.rail_bytes[i],
							  memory_order_relaxed);
			if (!n)
				continue;
			struct sc_op_rail *r = &info->rails[info->n_rails++];
			memcpy(r->rail, op->be->rails[i].name, sizeof(r->rail));
			r->bytes = n;
		}
	}
	int rc = 0;
	if (op->metadata && !(info->metadata = strdup(op->metadata)))
		rc = -1;
	info->desc_count = op->n_descs;
	if (op->n_descs && !op->omit_descs) {
		info->descs = malloc(op->n_descs * sizeof(*info->descs));
		if (info->descs) {
			memcpy(info->descs, op->descs, op->n_descs * sizeof(*info->descs));
			info->n_descs = op->n_descs;
		} else {
			rc = -1;
		}
	}
	return rc;
}

/* Tell every watcher. Under mu. */
void sc_op_notify(struct sc_engine *eng, struct sc_op *op)
{
	if (sc_list_empty(&op->watches))
		return;
	struct sc_op_info info;
	sc_op_fill_info(op, &info);
	bool terminal = sc_op_status_terminal(op->status);
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &op->watches) {
		struct sc_watch *w = sc_list_entry(pos, struct sc_watch, node);
		bool keep = w->fn(w->ctx, &info);
		if (!keep || terminal) {
			sc_list_remove(pos);
			free(w);
		}
	}
	sc_op_info_free(&info);
	op->last_notify_mono_ms = sc_clock_mono_ms();
}

/* ---- lifetime -------------------------------------------------------------------------------- */

static void free_use(void *ctx, void *use)
{
	(void)ctx;
	free(use);
}

static void op_free(struct sc_engine *eng, struct sc_op *op)
{
	sc_sched_ungate(eng, op); /* one that failed before it was published */
	for (size_t i = 0; i < op->n_descs; i++)
		if (op->regions && op->regions[i])
			sc_region_unref(eng, op->regions[i]);
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &op->watches) {
		sc_list_remove(pos);
		free(sc_list_entry(pos, struct sc_watch, node));
	}
	if (op->meta_valid)
		sc_metadata_free(&op->meta);
	free(op->xfer.segs);
	sc_u64map_each(&op->uses, free_use, NULL);
	sc_u64map_clear(&op->uses);
	free(op->regions);
	free(op->descs);
	free(op->metadata);
	free(op);
}

void sc_op_unref(struct sc_engine *eng, struct sc_op *op)
{
	if (--op->refs == 0)
		op_free(eng, op);
}

/* A terminal operation that nothing pins gives its regions back at once (not at retention), so
 * a deregistered region is unmapped and its file removed as soon as no transfer can touch it. */
void sc_op_release_regions(struct sc_engine *eng, struct sc_op *op)
{
	if (!sc_op_status_terminal(op->status) || op->pins > 0 || !op->regions)
		return;
	for (size_t i = 0; i < op->n_descs; i++) {
		if (op->regions[i])
			sc_region_unref(eng, op->regions[i]);
		op->regions[i] = NULL;
	}
}

static void op_forget_spent_token(struct sc_engine *eng, struct sc_op *op)
{
	if (op->token_spent) {
		sc_idmap_del(eng->spent_tokens, op->token, SC_TOKEN_LEN);
		op->token_spent = false;
	}
}

static void op_forget_locked(struct sc_engine *eng, struct sc_op *op)
{
	if (!op->in_table)
		return;
	op_forget_spent_token(eng, op);
	sc_idmap_del(eng->ops, op->id, strlen(op->id));
	op->in_table = false;
	sc_op_unref(eng, op);
}

static void op_retention_cb(void *ctx)
{
	struct sc_op *op = ctx;
	struct sc_engine *eng = op->eng;
	pthread_mutex_lock(&eng->mu);
	op->retention_timer = 0;
	if (op->in_table)
		SC_DEBUG_KV("op", SC_OP_FIELDS(op),
			    "operation %s forgotten: --retention (%llu ms) passed since it ended; "
			 "GetOperation/WaitOperation/ReleaseOperation now answer NOT_FOUND",
			 op->id, (unsigned long long)eng->cfg->retention_ms);
	op_forget_locked(eng, op);
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
}

/* Arm a timer that holds a reference on op. Under mu. */
static uint64_t op_timer_add(struct sc_engine *eng, struct sc_op *op, uint64_t deadline_mono,
			     sc_timer_cb cb)
{
	op->refs++;
	uint64_t id = sc_timers_add(eng->timers, deadline_mono, cb, op);
	if (!id)
		op->refs--;
	return id;
}

/* Cancel an op timer without waiting (we hold mu and the callback takes mu). If it was still
 * pending, its reference is dropped here; otherwise the running callback drops it. */
static void op_timer_drop(struct sc_engine *eng, struct sc_op *op, uint64_t *timer_id)
{
	if (*timer_id && sc_timers_try_cancel(eng->timers, *timer_id))
		op->refs--;
	*timer_id = 0;
}

struct sc_log_fields sc_op_log_fields(const struct sc_op *op)
{
	return (struct sc_log_fields){
	    .op = op->id,
	    .peer = op->peer,
	    .backend = op->backend != SC_BACKEND_NONE ? sc_backend_name(op->backend) : NULL,
	    .bytes = op->bytes_total,
	    .has_bytes = true,
	    .trace_id = op->trace_id,
	};
}

static void set_error(struct sc_op *op, enum sc_status code, const char *msg)
{
	op->err_code = code;
	snprintf(op->err_msg, sizeof(op->err_msg), "%s", msg ? msg : sc_status_text(code));
}

/* ---- terminal transition --------------------------------------------------------------------- */

static void op_deadline_cb(void *ctx);

/* A passive operation with token ended while data-plane requests held its memory: the peer server
 * cuts the connections serving them (sc_peer_server_revoke). Under mu. */
static void passive_revoked(struct sc_engine *eng, const uint8_t token[SC_TOKEN_LEN])
{
	if (eng->peer_server)
		sc_peer_server_revoke(eng->peer_server, token);
}

/* No new access to a passive operation: its token leaves the table (no new OPEN or span) and
 * every backend revokes its exposure (ibverbs: the MR, so the NIC stops). */
static void passive_close_locked(struct sc_engine *eng, struct sc_op *op)
{
	if (op->token_in_table) {
		sc_idmap_del(eng->tokens, op->token, SC_TOKEN_LEN);
		op->token_in_table = false;
		/* Remembered while the operation is (so a replay is told what happened); a failed
		 * put only makes a replay's answer NOT_FOUND. */
		if (op->in_table && sc_idmap_put(eng->spent_tokens, op->token, SC_TOKEN_LEN, op) == 0)
			op->token_spent = true;
	}
	for (int b = 0; b < SC_NUM_BACKENDS; b++) {
		if (op->exposure[b] && eng->backends[b]) {
			eng->backends[b]->ops->revoke(eng->backends[b], op->exposure[b]);
			op->exposure[b] = NULL;
		}
	}
	/* A request already past its checks may still be moving bytes (a peer that trickles
	 * keeps a READ or WRITE going): cut the connections serving it, so access ends now. And
	 * once a peer OPENed it, the data plane drops its records of the operation's transfers
	 * (a connection that only OPENed it keeps nothing of it). */
	if (op->pins > 0 || op->uses_begun > 0)
		passive_revoked(eng, op->token);
}

/* Wait until no data-plane request holds a span of a passive operation that ended, so the caller
 * can tell the worker its memory is its own again. Bounded (the serving connections were cut);
 * past the bound it says so in the log. Under mu (released while waiting); the caller holds a
 * reference on op. */
static void passive_wait_unpinned_locked(struct sc_engine *eng, struct sc_op *op)
{
	if (!sc_op_is_passive(op) || op->pins <= 0)
		return;
	uint64_t end = sc_clock_mono_after_ms(UNPIN_WAIT_MS);
	while (op->pins > 0 && sc_clock_mono_ms() < end)
		sc_cond_wait_until_mono(&eng->idle_cv, &eng->mu, end);
	if (op->pins > 0)
		SC_WARN_KV("op", SC_OP_FIELDS(op),
			"%s ended but %d data-plane request(s) still hold its memory after %d "
			      "ms: their connections were cut; a wedged peer connection thread would "
			      "explain it",
			op->id, op->pins, UNPIN_WAIT_MS);
}

void sc_op_finish_locked(struct sc_engine *eng, struct sc_op *op, enum sc_op_status status,
			 enum sc_status code, const char *msg)
{
	if (sc_op_status_terminal(op->status))
		return;
	if (!sc_op_is_passive(op) && op->xfer_in_flight && status != SC_OPS_COMPLETE) {
		/* The backend may still be moving bytes into or out of the worker's memory: stop
		 * it, and end only when it says it stopped (xfer_complete), so a terminal status
		 * means the memory is quiet and the worker may reuse it. The first reason stands. */
		if (op->finish_pending == SC_OPS_UNSPECIFIED) {
			op->finish_pending = status;
			set_error(op, code, msg);
			atomic_store(&op->xfer.cancel_requested, true);
			sc_backend_cancel(op->be, &op->xfer);
		}
		return;
	}
	enum sc_op_status was = op->status;
	if (status == SC_OPS_COMPLETE &&
	    (op->backend == SC_BACKEND_IBVERBS || op->backend == SC_BACKEND_LIBFABRIC) &&
	    (op->kind == SC_OP_READ || op->kind == SC_OP_WRITABLE)) {
		/* The NIC wrote these ranges: make GPU writes visible before COMPLETE. */
		for (size_t i = 0; i < op->n_descs; i++)
			if (op->regions[i] && op->regions[i]->gpu != SC_GPU_HOST)
				sc_gpu_flush_rdma_writes(eng->gpu, op->regions[i]->gpu);
	}
	op->status = status;
	op->completed_unix_ms = sc_clock_unix_ms();
	sc_metrics_op_finished(eng->metrics, op->kind, status, op->backend, op->bytes_total);
	if (status == SC_OPS_COMPLETE && op->xfer_start_ns)
		sc_metrics_transfer_done(eng->metrics, op->kind, op->backend, op->bytes_total,
					 sc_metrics_clock_ns() - op->xfer_start_ns);
	if (status != SC_OPS_COMPLETE)
		set_error(op, code, msg);
	op_timer_drop(eng, op, &op->deadline_timer);

	if (sc_op_is_passive(op)) {
		passive_close_locked(eng, op);
	} else if (was == SC_OPS_SCHEDULED) {
		sc_sched_remove(eng, op);
	}
	if (op->counted_live) {
		for (size_t i = 0; i < op->n_descs; i++)
			op->regions[i]->live_ops--;
		op->counted_live = false;
	}
	sc_op_release_regions(eng, op);
	enum sc_log_level lvl = op->quiet ? SC_LOG_DEBUG : SC_LOG_INFO;
	struct sc_log_fields lf = sc_op_log_fields(op);
	if (status == SC_OPS_COMPLETE) {
		lf.code = sc_status_name(SC_OK);
		sc_log_kv(lvl, "op", &lf, "%s %s COMPLETE: %" PRIu64 " bytes via %s%s%s", op->id,
			  sc_op_kind_name(op->kind), op->bytes_total, sc_backend_name(op->backend),
			  op->peer[0] ? " peer " : "", op->peer);
	} else {
		lf.code = sc_status_name(code);
		sc_log_kv(lvl, "op", &lf, "%s %s %s (%s): %s", op->id, sc_op_kind_name(op->kind),
			  sc_op_status_name(status), sc_status_name(code), op->err_msg);
	}
	sc_op_notify(eng, op);
	if (op->in_table && !op->retention_timer)
		op->retention_timer = op_timer_add(eng, op,
						   sc_clock_mono_after_ms(eng->cfg->retention_ms),
						   op_retention_cb);
	pthread_cond_broadcast(&eng->idle_cv);
}

static void op_deadline_cb(void *ctx)
{
	struct sc_op *op = ctx;
	struct sc_engine *eng = op->eng;
	pthread_mutex_lock(&eng->mu);
	op->deadline_timer = 0;
	if (!sc_op_status_terminal(op->status)) {
		bool some_done = op->uses_done > 0, in_flight = op->n_uses > 0;
		if (sc_op_is_passive(op) && some_done && !in_flight) {
			sc_op_finish_locked(eng, op, SC_OPS_COMPLETE, SC_OK, NULL);
		} else {
			char msg[200];
			snprintf(msg, sizeof(msg),
				 "operation deadline passed while %s (%" PRIu64 " of %" PRIu64
				 " bytes moved): raise timeout_ms or check the peer",
				 sc_op_status_name(op->status), atomic_load(&op->bytes_done),
				 op->bytes_total);
			sc_op_finish_locked(eng, op, SC_OPS_ERRORED, SC_DEADLINE_EXCEEDED, msg);
		}
	}
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
}

/* ---- creation helpers ------------------------------------------------------------------------ */

static void new_op_id(char out[SC_ID_MAX])
{
	uint8_t rnd[8];
	if (sc_random_bytes(rnd, sizeof(rnd)) != 0)
		memset(rnd, 0, sizeof(rnd));
	snprintf(out, SC_ID_MAX, "op-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
		 rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
}

int sc_op_copy_str(char *dst, size_t cap, const char *src, const char *what, struct sc_err *err)
{
	if (!src)
		src = "";
	if (strlen(src) >= cap)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s longer than %zu bytes", what, cap - 1);
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}

/* Allocate an op with its descriptors resolved against the region table. Under mu. */
struct sc_op *sc_op_new(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_desc *descs,
			 size_t n, uint64_t timeout_ms, const char *request_id, struct sc_err *err)
{
	if (sc_engine_check_accepting(eng, err) != 0)
		return NULL;
	if (n == 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "at least one descriptor is required");
		return NULL;
	}
	if (n > eng->cfg->max_descriptors) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED,
			   "%zu descriptors: at most %u per operation (--max-descriptors); merge "
			   "adjacent ranges or split the transfer",
			   n, eng->cfg->max_descriptors);
		return NULL;
	}
	if (sc_idmap_count(eng->ops) >= eng->cfg->max_operations) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED,
			   "--max-operations %u reached (live and retained operations): release "
			   "finished operations with ReleaseOperation, or wait for --retention",
			   eng->cfg->max_operations);
		return NULL;
	}
	struct sc_op *op = calloc(1, sizeof(*op));
	if (op) {
		sc_list_init(&op->watches);
		sc_list_init(&op->gate_node);
	}
	if (!op || !(op->descs = calloc(n, sizeof(*op->descs))) ||
	    !(op->regions = calloc(n, sizeof(*op->regions)))) {
		if (op) {
			free(op->descs);
			free(op);
		}
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		return NULL;
	}
	op->refs = 1;
	op->eng = eng;
	op->kind = kind;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		struct sc_region *r;
		if (sc_region_resolve(eng, &descs[i], &r, err) != 0) {
			sc_err_prefix(err, "descriptor %zu", i);
			op->n_descs = i;
			op_free(eng, op);
			return NULL;
		}
		if (total + descs[i].length < total) {
			sc_err_set(err, SC_INVALID_ARGUMENT, "descriptor lengths overflow");
			op->n_descs = i;
			op_free(eng, op);
			return NULL;
		}
		total += descs[i].length;
		op->descs[i] = descs[i];
		op->regions[i] = r;
		sc_region_ref(r);
	}
	op->n_descs = n;
	op->bytes_total = total;
	if (sc_op_copy_str(op->request_id, sizeof(op->request_id), request_id, "request_id", err) != 0) {
		op_free(eng, op);
		return NULL;
	}
	new_op_id(op->id);
	op->created_unix_ms = sc_clock_unix_ms();
	uint64_t timeout = timeout_ms ? timeout_ms : eng->cfg->default_timeout_ms;
	if (timeout > SC_OP_TIMEOUT_MAX_MS) /* clamped, not refused: see engine/engine.h */
		timeout = SC_OP_TIMEOUT_MAX_MS;
	op->deadline_unix_ms = sc_deadline_add_ms(op->created_unix_ms, timeout);
	op->deadline_mono_ms = sc_clock_mono_after_ms(timeout);
	return op;
}

/* Put a new op in the table, count it live, arm its deadline. Under mu. */
int sc_op_publish(struct sc_engine *eng, struct sc_op *op, struct sc_err *err)
{
	if (sc_idmap_put(eng->ops, op->id, strlen(op->id), op) != 0)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "operation table full");
	op->in_table = true;
	op->refs++; /* the table's */
	for (size_t i = 0; i < op->n_descs; i++)
		op->regions[i]->live_ops++;
	op->counted_live = true;
	op->deadline_timer = op_timer_add(eng, op, op->deadline_mono_ms, op_deadline_cb);
	sc_metrics_op_created(eng->metrics, op->kind);
	return 0;
}

/* ---- region memory still backed? ------------------------------------------------------------ */

/* The part of one host region an operation uses: [lo, hi) from the region's base. */
struct host_extent {
	const struct sc_region *r;
	uint64_t lo, hi;
};

/* Widen e to cover [lo, hi). */
static void extent_widen(struct host_extent *e, uint64_t lo, uint64_t hi)
{
	e->lo = lo < e->lo ? lo : e->lo;
	e->hi = hi > e->hi ? hi : e->hi;
}

/* Extents held on the stack; an operation over more distinct regions sorts a heap copy. */
#define PROBE_STACK_REGIONS 8

static int extent_cmp(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)((const struct host_extent *)a)->r;
	uintptr_t y = (uintptr_t)((const struct host_extent *)b)->r;
	return (x > y) - (x < y);
}

static int probe_extents(const struct host_extent *ext, size_t n, const char *stopped,
			 struct sc_err *err)
{
	for (size_t k = 0; k < n; k++)
		if (sc_fault_guard_probe(ext[k].r->base + ext[k].lo, ext[k].hi - ext[k].lo,
					 NULL) != 0)
			return sc_fault_guard_error(err, stopped);
	return 0;
}

/* sc_op_probe_host_ranges for an operation over more than PROBE_STACK_REGIONS regions: one extent per
 * descriptor (neighbours on one region merged), sorted by region, merged, probed. */
static int probe_many_regions(const struct sc_op *op, const char *stopped, struct sc_err *err)
{
	struct host_extent *ext = malloc(op->n_descs * sizeof(*ext));
	size_t n = 0;
	for (size_t i = 0; i < op->n_descs; i++) {
		const struct sc_region *r = op->regions[i];
		const struct sc_desc *d = &op->descs[i];
		if (!r || r->gpu != SC_GPU_HOST || d->length == 0)
			continue;
		struct host_extent e = {.r = r, .lo = d->offset, .hi = d->offset + d->length};
		if (!ext) { /* out of memory: probe each range, slower but as sure */
			if (probe_extents(&e, 1, stopped, err) != 0)
				return -1;
		} else if (n > 0 && ext[n - 1].r == r) {
			extent_widen(&ext[n - 1], e.lo, e.hi);
		} else {
			ext[n++] = e;
		}
	}
	if (!ext)
		return 0;
	qsort(ext, n, sizeof(*ext), extent_cmp);
	size_t m = 0;
	for (size_t k = 0; k < n; k++) {
		if (m > 0 && ext[m - 1].r == ext[k].r) {
			extent_widen(&ext[m - 1], ext[k].lo, ext[k].hi);
		} else {
			ext[m++] = ext[k];
		}
	}
	int rc = probe_extents(ext, m, stopped, err);
	free(ext);
	return rc;
}

/*
 * Is the host memory of op's ranges still backed? A worker may truncate a region's file behind
 * the sidecar's back; a file loses pages only at its end, so one probe per distinct host region,
 * of the lowest and the highest byte op uses in it (sc_fault_guard_probe: two guarded loads),
 * answers for all its descriptors: O(distinct regions) probes whatever the descriptor count
 * (16,384 is normal), one pass of arithmetic over the descriptors. GPU ranges are no file
 * mappings: skipped. 0, or -1 with err FAILED_PRECONDITION naming the region
 * (sc_fault_guard_error: "... so <stopped> stopped; ..."). Under mu; op holds its regions.
 */
int sc_op_probe_host_ranges(const struct sc_op *op, const char *stopped, struct sc_err *err)
{
	struct host_extent ext[PROBE_STACK_REGIONS];
	size_t n = 0, k = 0;
	for (size_t i = 0; i < op->n_descs; i++) {
		const struct sc_region *r = op->regions[i];
		const struct sc_desc *d = &op->descs[i];
		if (!r || r->gpu != SC_GPU_HOST || d->length == 0)
			continue;
		if (n == 0 || ext[k].r != r) { /* not the previous descriptor's region */
			for (k = 0; k < n && ext[k].r != r; k++)
				;
			if (k == n) {
				if (n == PROBE_STACK_REGIONS)
					return probe_many_regions(op, stopped, err);
				ext[n++] = (struct host_extent){
				    .r = r, .lo = d->offset, .hi = d->offset};
			}
		}
		extent_widen(&ext[k], d->offset, d->offset + d->length);
	}
	return probe_extents(ext, n, stopped, err);
}

/* ---- queries and control --------------------------------------------------------------------- */

static struct sc_op *op_lookup(struct sc_engine *eng, const char *id, struct sc_err *err)
{
	struct sc_op *op = id ? sc_idmap_get(eng->ops, id, strlen(id)) : NULL;
	if (!op)
		sc_err_set(err, SC_NOT_FOUND,
			   "no operation \"%s\" (unknown, released, or forgotten after retention)",
			   id ? id : "");
	return op;
}

int sc_op_get(struct sc_engine *eng, const char *id, struct sc_op_info *out, struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_lookup(eng, id, err);
	if (op)
		sc_op_fill_info(op, out);
	pthread_mutex_unlock(&eng->mu);
	return op ? 0 : -1;
}

int sc_op_cancel(struct sc_engine *eng, const char *id, struct sc_op_info *out,
		 struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_lookup(eng, id, err);
	if (op) {
		sc_op_finish_locked(eng, op, SC_OPS_CANCELLED, SC_CANCELLED,
				    "cancelled by CancelOperation");
		op->refs++;
		passive_wait_unpinned_locked(eng, op);
		sc_op_fill_info(op, out);
		sc_op_unref(eng, op);
	}
	pthread_mutex_unlock(&eng->mu);
	return op ? 0 : -1;
}

int sc_op_release(struct sc_engine *eng, const char *id, struct sc_err *err)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_lookup(eng, id, err);
	if (op) {
		sc_op_finish_locked(eng, op, SC_OPS_CANCELLED, SC_CANCELLED,
				    "released by ReleaseOperation");
		op->refs++;
		passive_wait_unpinned_locked(eng, op);
		op_timer_drop(eng, op, &op->retention_timer);
		op_forget_locked(eng, op);
		sc_op_unref(eng, op);
	}
	pthread_mutex_unlock(&eng->mu);
	return op ? 0 : -1;
}

int sc_op_watch(struct sc_engine *eng, const char *id, sc_op_watch_fn fn, void *ctx,
		uint64_t *watch_id, struct sc_op_info *first, struct sc_err *err)
{
	struct sc_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_lookup(eng, id, err);
	if (!op) {
		pthread_mutex_unlock(&eng->mu);
		free(w);
		return -1;
	}
	sc_op_fill_info(op, first);
	w->id = ++eng->next_watch_id;
	*watch_id = w->id;
	if (sc_op_status_terminal(op->status)) {
		/* Nothing will change any more: the watch has ended already. */
		free(w);
	} else {
		w->fn = fn;
		w->ctx = ctx;
		sc_list_insert_head(&op->watches, &w->node);
	}
	pthread_mutex_unlock(&eng->mu);
	return 0;
}

struct unwatch_ctx {
	uint64_t id;
	bool found;
};

static void unwatch_one(void *ctx, void *value)
{
	struct unwatch_ctx *c = ctx;
	struct sc_op *op = value;
	if (c->found)
		return;
	struct sc_list *pos;
	sc_list_foreach(pos, &op->watches) {
		struct sc_watch *w = sc_list_entry(pos, struct sc_watch, node);
		if (w->id == c->id) {
			sc_list_remove(pos);
			free(w);
			c->found = true;
			return;
		}
	}
}

bool sc_op_unwatch(struct sc_engine *eng, uint64_t watch_id)
{
	struct unwatch_ctx c = {watch_id, false};
	pthread_mutex_lock(&eng->mu);
	sc_idmap_each(eng->ops, unwatch_one, &c);
	pthread_mutex_unlock(&eng->mu);
	return c.found;
}

/* ---- engine-wide ----------------------------------------------------------------------------- */

struct cancel_ctx {
	struct sc_engine *eng;
	struct sc_region *region; /* NULL: every operation */
	const char *why;
	struct sc_op **ops;
	size_t n;
};

static void collect_live(void *ctx, void *value)
{
	struct cancel_ctx *c = ctx;
	struct sc_op *op = value;
	if (sc_op_status_terminal(op->status))
		return;
	if (c->region) {
		bool uses = false;
		for (size_t i = 0; i < op->n_descs; i++)
			uses |= op->regions[i] == c->region;
		if (!uses)
			return;
	}
	c->ops[c->n++] = op;
}

static void cancel_matching_locked(struct sc_engine *eng, struct sc_region *r, const char *why)
{
	size_t count = sc_idmap_count(eng->ops);
	struct cancel_ctx c = {eng, r, why, calloc(count ? count : 1, sizeof(struct sc_op *)), 0};
	if (!c.ops)
		return;
	sc_idmap_each(eng->ops, collect_live, &c);
	for (size_t i = 0; i < c.n; i++) {
		c.ops[i]->refs++;
		sc_op_finish_locked(eng, c.ops[i], SC_OPS_CANCELLED, SC_CANCELLED, why);
	}
	for (size_t i = 0; i < c.n; i++) {
		if (r) /* the caller hands the memory back: no request may still hold it */
			passive_wait_unpinned_locked(eng, c.ops[i]);
		sc_op_unref(eng, c.ops[i]);
	}
	free(c.ops);
}

void sc_op_cancel_region_locked(struct sc_engine *eng, struct sc_region *r, const char *why)
{
	cancel_matching_locked(eng, r, why);
}

void sc_op_cancel_all(struct sc_engine *eng, const char *why)
{
	pthread_mutex_lock(&eng->mu);
	cancel_matching_locked(eng, NULL, why);
	pthread_mutex_unlock(&eng->mu);
}

static void forget_one(void *ctx, void *value)
{
	struct sc_engine *eng = ctx;
	struct sc_op *op = value;
	op_timer_drop(eng, op, &op->retention_timer);
	op_timer_drop(eng, op, &op->deadline_timer);
	op->in_table = false;
	op->token_spent = false; /* the whole map goes below */
	sc_op_unref(eng, op);
}

void sc_op_forget_all(struct sc_engine *eng)
{
	pthread_mutex_lock(&eng->mu);
	sc_idmap_each(eng->ops, forget_one, eng);
	sc_idmap_destroy(eng->ops);
	eng->ops = sc_idmap_create();
	sc_idmap_destroy(eng->spent_tokens);
	eng->spent_tokens = sc_idmap_create();
	pthread_mutex_unlock(&eng->mu);
}

int sc_op_list_page(struct sc_engine *eng, const char *after, size_t limit,
		    struct sc_op_info **out, size_t *n, bool *more, struct sc_err *err)
{
	const void **items = NULL;
	size_t found = 0;
	pthread_mutex_lock(&eng->mu);
	if (sc_page_collect(eng->ops, offsetof(struct sc_op, id), after, &items, &found, err) != 0) {
		pthread_mutex_unlock(&eng->mu);
		return -1;
	}
	size_t take = found < limit ? found : limit;
	/* A page also ends before its operations' descriptors pass SC_LIST_PAGE_DESCS (each is ~35
	 * bytes on the wire: pages stay well under --max-message-size with 65,536-descriptor
	 * operations); it always holds at least one operation. */
	size_t descs = 0;
	for (size_t i = 0; i < take; i++) {
		const struct sc_op *o = items[i];
		size_t d = o->omit_descs ? 0 : o->n_descs;
		if (i > 0 && descs + d > SC_LIST_PAGE_DESCS) {
			take = i;
			break;
		}
		descs += d;
	}
	struct sc_op_info *infos = calloc(take ? take : 1, sizeof(*infos));
	for (size_t i = 0; infos && i < take; i++)
		(void)sc_op_fill_info(items[i], &infos[i]); /* -1: usable, without metadata */
	pthread_mutex_unlock(&eng->mu);
	free(items);
	if (!infos)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	*out = infos;
	*n = take;
	*more = found > take;
	return 0;
}
