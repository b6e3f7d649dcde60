/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/operation.c: operations and their lifecycle (DESIGN section 8).
 *
 * Passive operations (READABLE/WRITABLE) expose ranges of local regions under a fresh 128-bit
 * token and hand out signed metadata; data-plane servers reach them through the backend/passive.h
 * interface this file implements (sc_op_passive, near the bottom), handed to them at creation.
 * Active operations (READ/WRITE) verify remote metadata, pick a backend, wait in the scheduler
 * for a slot (and for worker progress when gated), then become one struct sc_xfer that the
 * backend executes; its completion ends the operation.
 *
 * Threads: RPC handlers (gRPC threads), the timer thread (deadlines, retention), backend threads
 * (progress, completion) and data-plane server threads (backend/passive.h). Everything runs under eng->mu;
 * watchers are called under it too, so they see changes in order.
 */
#include "engine/internal.h"
#include "engine/backend_registry.h"
#include "os/fault_guard.h"
#include "base/log.h"
#include "backend/passive.h"
#include "peer/server.h"
#include "base/trace.h"
#include "backend/xfer_runner.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRESS_NOTIFY_MS 10
#define MAX_USES (1u << 20) /* counted uses; any_uses has no limit */
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
static int op_fill_info(const struct sc_op *op, struct sc_op_info *info)
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
static void op_notify(struct sc_engine *eng, struct sc_op *op)
{
	if (sc_list_empty(&op->watches))
		return;
	struct sc_op_info info;
	op_fill_info(op, &info);
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
static void op_release_regions(struct sc_engine *eng, struct sc_op *op)
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
		SC_DEBUG("op", "operation %s forgotten: --retention (%llu ms) passed since it ended; "
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

static void set_error(struct sc_op *op, enum sc_status code, const char *msg)
{
	op->err_code = code;
	snprintf(op->err_msg, sizeof(op->err_msg), "%s", msg ? msg : sc_status_text(code));
}

/* ---- terminal transition --------------------------------------------------------------------- */

static bool is_passive(const struct sc_op *op)
{
	return op->kind == SC_OP_READABLE || op->kind == SC_OP_WRITABLE;
}

static void op_deadline_cb(void *ctx);

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
		sc_engine_passive_revoked(eng, op->token);
}

/* Wait until no data-plane request holds a span of a passive operation that ended, so the caller
 * can tell the worker its memory is its own again. Bounded (the serving connections were cut);
 * past the bound it says so in the log. Under mu (released while waiting); the caller holds a
 * reference on op. */
static void passive_wait_unpinned_locked(struct sc_engine *eng, struct sc_op *op)
{
	if (!is_passive(op) || op->pins <= 0)
		return;
	uint64_t end = sc_clock_mono_after_ms(UNPIN_WAIT_MS);
	while (op->pins > 0 && sc_clock_mono_ms() < end)
		sc_cond_wait_until_mono(&eng->idle_cv, &eng->mu, end);
	if (op->pins > 0)
		SC_WARN("op", "%s ended but %d data-plane request(s) still hold its memory after %d "
			      "ms: their connections were cut; a wedged peer connection thread would "
			      "explain it",
			op->id, op->pins, UNPIN_WAIT_MS);
}

void sc_op_finish_locked(struct sc_engine *eng, struct sc_op *op, enum sc_op_status status,
			 enum sc_status code, const char *msg)
{
	if (sc_op_status_terminal(op->status))
		return;
	if (!is_passive(op) && op->xfer_in_flight && status != SC_OPS_COMPLETE) {
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
	if (status == SC_OPS_COMPLETE && op->backend == SC_BACKEND_IBVERBS &&
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

	if (is_passive(op)) {
		passive_close_locked(eng, op);
	} else if (was == SC_OPS_SCHEDULED) {
		sc_sched_remove(eng, op);
	}
	if (op->counted_live) {
		for (size_t i = 0; i < op->n_descs; i++)
			op->regions[i]->live_ops--;
		op->counted_live = false;
	}
	op_release_regions(eng, op);
	enum sc_log_level lvl = op->quiet ? SC_LOG_DEBUG : SC_LOG_INFO;
	if (status == SC_OPS_COMPLETE)
		sc_log(lvl, "op", "%s %s COMPLETE: %" PRIu64 " bytes via %s%s%s", op->id,
		       sc_op_kind_name(op->kind), op->bytes_total, sc_backend_name(op->backend),
		       op->peer[0] ? " peer " : "", op->peer);
	else
		sc_log(lvl, "op", "%s %s %s (%s): %s", op->id, sc_op_kind_name(op->kind),
		       sc_op_status_name(status), sc_status_name(code), op->err_msg);
	op_notify(eng, op);
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
		if (is_passive(op) && some_done && !in_flight) {
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

static int copy_str(char *dst, size_t cap, const char *src, const char *what, struct sc_err *err)
{
	if (!src)
		src = "";
	if (strlen(src) >= cap)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s longer than %zu bytes", what, cap - 1);
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}

/* Allocate an op with its descriptors resolved against the region table. Under mu. */
static struct sc_op *op_new(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_desc *descs,
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
	if (copy_str(op->request_id, sizeof(op->request_id), request_id, "request_id", err) != 0) {
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
static int op_publish(struct sc_engine *eng, struct sc_op *op, struct sc_err *err)
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

/* ---- passive operations ---------------------------------------------------------------------- */

int sc_op_create_passive(struct sc_engine *eng, enum sc_op_kind kind,
			 const struct sc_passive_req *req, struct sc_op_info *out, struct sc_err *err)
{
	if (kind != SC_OP_READABLE && kind != SC_OP_WRITABLE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "not a passive operation kind");
	if (req->max_uses > MAX_USES)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "max_uses %u: at most %u (any_uses: any number until the deadline)",
				  req->max_uses, MAX_USES);

	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_new(eng, kind, req->descs, req->n_descs, req->timeout_ms,
				  req->request_id, err);
	if (!op)
		goto fail_unlocked_op;
	if (copy_str(op->audience, sizeof(op->audience), req->audience, "audience", err) != 0)
		goto fail;
	op->omit_descs = req->omit_descs;
	op->any_uses = req->any_uses;
	op->max_uses = req->any_uses ? UINT32_MAX : req->max_uses ? req->max_uses : 1;
	op->status = SC_OPS_INITIALIZED;
	do {
		if (sc_random_bytes(op->token, SC_TOKEN_LEN) != 0) {
			sc_err_set(err, SC_INTERNAL, "no randomness for the operation token");
			goto fail;
		}
	} while (sc_idmap_get(eng->tokens, op->token, SC_TOKEN_LEN));

	/* The metadata: everything a peer needs, signed. */
	struct sc_metadata md;
	memset(&md, 0, sizeof(md));
	md.version = SC_METADATA_VERSION;
	snprintf(md.issuer, sizeof(md.issuer), "%s", eng->id);
	snprintf(md.audience, sizeof(md.audience), "%s", op->audience);
	md.kind = kind;
	memcpy(md.token, op->token, SC_TOKEN_LEN);
	if (eng->backends[SC_BACKEND_TCP] && eng->backends[SC_BACKEND_TCP]->available) {
		/* Every data endpoint: the tcp backend stripes over all that answer (its paths). */
		size_t n = eng->peer_server ? sc_peer_server_n_endpoints(eng->peer_server) : 0;
		for (size_t i = 0; i < n && i < SC_MAX_ENDPOINTS; i++)
			snprintf(md.endpoints[i], sizeof(md.endpoints[i]), "%s",
				 sc_peer_server_endpoint_at(eng->peer_server, i));
		md.n_endpoints = n < SC_MAX_ENDPOINTS ? n : SC_MAX_ENDPOINTS;
		if (md.n_endpoints == 0) {
			snprintf(md.endpoints[0], sizeof(md.endpoints[0]), "%s",
				 eng->backends[SC_BACKEND_TCP]->endpoint);
			md.n_endpoints = 1;
		}
		md.backends |= SC_BACKEND_BIT_TCP;
	} else if (eng->backends[SC_BACKEND_IBVERBS] &&
		   eng->backends[SC_BACKEND_IBVERBS]->available &&
		   eng->backends[SC_BACKEND_IBVERBS]->endpoint[0]) {
		snprintf(md.endpoints[0], sizeof(md.endpoints[0]), "%s",
			 eng->backends[SC_BACKEND_IBVERBS]->endpoint);
		md.n_endpoints = 1;
	}
	if (eng->backends[SC_BACKEND_LOCAL] && eng->backends[SC_BACKEND_LOCAL]->available)
		md.backends |= SC_BACKEND_BIT_LOCAL;
	md.descs = calloc(op->n_descs, sizeof(*md.descs));
	if (!md.descs) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	md.n_descs = op->n_descs;
	uint8_t **addrs = calloc(op->n_descs, sizeof(*addrs));
	void **handles = calloc(op->n_descs, sizeof(*handles));
	int *gpus = calloc(op->n_descs, sizeof(*gpus));
	if (!addrs || !handles || !gpus) {
		free(addrs);
		free(handles);
		free(gpus);
		free(md.descs);
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	bool any_gpu = false;
	for (size_t i = 0; i < op->n_descs; i++) {
		md.descs[i].length = op->descs[i].length;
		md.descs[i].device_kind = op->regions[i]->kind;
		addrs[i] = op->regions[i]->base + op->descs[i].offset;
		gpus[i] = op->regions[i]->gpu;
		any_gpu |= gpus[i] != SC_GPU_HOST;
	}
	struct sc_backend *ib = eng->backends[SC_BACKEND_IBVERBS];
	if (ib && ib->available) {
		for (size_t i = 0; i < op->n_descs; i++)
			handles[i] = op->regions[i]->backend_handle[SC_BACKEND_IBVERBS];
		struct sc_err ib_err;
		sc_err_clear(&ib_err);
		if (ib->ops->expose(ib, &md, addrs, gpus, handles, &op->exposure[SC_BACKEND_IBVERBS],
				    &ib_err) == 0) {
			md.backends |= SC_BACKEND_BIT_IBVERBS;
			if (any_gpu)
				snprintf(op->backend_reason, sizeof(op->backend_reason),
					 "GPU memory exposed to ibverbs peers (GPUDirect RDMA)");
		} else if (any_gpu) {
			SC_INFO("op", "%s: ibverbs cannot reach its GPU memory, peers will use tcp "
				      "(staged through pinned host buffers): %s",
				op->id, ib_err.msg);
			snprintf(op->backend_reason, sizeof(op->backend_reason),
				 "tcp, GPU memory staged through pinned host buffers (ibverbs: %s)",
				 ib_err.msg);
		} else {
			SC_WARN("op", "%s: ibverbs cannot expose it, peers will use tcp: %s", op->id,
				ib_err.msg);
			snprintf(op->backend_reason, sizeof(op->backend_reason),
				 "ibverbs expose failed: %s", ib_err.msg);
		}
	} else if (any_gpu) {
		snprintf(op->backend_reason, sizeof(op->backend_reason),
			 "GPU memory: tcp peers are served through pinned host buffers");
	}
	free(gpus);
	free(addrs);
	free(handles);
	md.issued_unix_ms = op->created_unix_ms;
	md.expires_unix_ms = op->deadline_unix_ms;
	md.max_uses = op->max_uses;
	if (sc_random_bytes(md.nonce, sizeof(md.nonce)) != 0) {
		sc_metadata_free(&md); /* descs, and the other rails' rkeys (ibverbs expose) */
		sc_err_set(err, SC_INTERNAL, "no randomness for the metadata nonce");
		goto fail;
	}
	int rc = sc_metadata_sign(eng->keys, &md, &op->metadata, err);
	sc_metadata_free(&md);
	if (rc != 0)
		goto fail;
	if (sc_idmap_put(eng->tokens, op->token, SC_TOKEN_LEN, op) != 0) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "token table full");
		goto fail;
	}
	op->token_in_table = true;
	if (op_publish(eng, op, err) != 0) {
		sc_idmap_del(eng->tokens, op->token, SC_TOKEN_LEN);
		op->token_in_table = false;
		goto fail;
	}
	op_fill_info(op, out);
	sc_op_unref(eng, op); /* creation reference; the table keeps it */
	pthread_mutex_unlock(&eng->mu);
	SC_INFO("op", "%s %s: %zu descriptor(s), %" PRIu64 " bytes, uses %u, deadline in %" PRIu64
		" ms%s%s",
		out->id, sc_op_kind_name(kind), out->n_descs, out->bytes_total, op->max_uses,
		out->deadline_unix_ms - out->created_unix_ms, req->audience && req->audience[0] ?
		", audience " : "", req->audience ? req->audience : "");
	return 0;
fail:
	for (int b = 0; b < SC_NUM_BACKENDS; b++)
		if (op->exposure[b] && eng->backends[b])
			eng->backends[b]->ops->revoke(eng->backends[b], op->exposure[b]);
	sc_op_unref(eng, op);
fail_unlocked_op:
	pthread_mutex_unlock(&eng->mu);
	return -1;
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

/* probe_host_ranges for an operation over more than PROBE_STACK_REGIONS regions: one extent per
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
static int probe_host_ranges(const struct sc_op *op, const char *stopped, struct sc_err *err)
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

/* ---- active operations ----------------------------------------------------------------------- */

static void xfer_progress(struct sc_xfer *x, uint64_t delta)
{
	struct sc_op *op = x->owner;
	uint64_t done = atomic_fetch_add(&op->bytes_done, delta) + delta;
	uint64_t now = sc_clock_mono_ms();
	if (done < op->bytes_total && now - op->last_notify_mono_ms < PROGRESS_NOTIFY_MS)
		return;
	pthread_mutex_lock(&op->eng->mu);
	if (!sc_op_status_terminal(op->status))
		op_notify(op->eng, op);
	pthread_mutex_unlock(&op->eng->mu);
}

static bool backend_usable(struct sc_engine *eng, enum sc_backend_kind b);

/*
 * The backend's path failed and the peer expects the same transfer on another path
 * (SC_ABORTED): go on over tcp, saying so. 0 when resubmitted; -1 (the operation then ends with
 * the backend's message) when a cancel or the deadline came first, or tcp cannot take it.
 * Under eng->mu, on the backend's thread.
 */
static int fall_back_locked(struct sc_engine *eng, struct sc_op *op, const char *msg)
{
	struct sc_backend *tcp = eng->backends[SC_BACKEND_TCP];
	struct sc_xfer *x = &op->xfer;
	if (op->finish_pending != SC_OPS_UNSPECIFIED || !tcp || !tcp->available ||
	    sc_clock_mono_ms() >= op->deadline_mono_ms || atomic_load(&x->cancel_requested))
		return -1;
	enum sc_backend_kind from = op->backend;
	snprintf(op->backend_reason, sizeof(op->backend_reason),
		 "tcp: %s failed mid-transfer, moved to tcp (%s)", sc_backend_name(from), msg);
	SC_WARN("op", "%s: %s path to %s failed, going on over tcp: %s", op->id,
		sc_backend_name(from), op->meta.issuer, msg);
	op->backend = SC_BACKEND_TCP;
	op->be = tcp;
	x->fallback_ok = false;
	atomic_store(&x->committed, false);
	atomic_store(&op->bytes_done, 0);
	for (size_t i = 0; i < SC_XFER_MAX_RAILS; i++) /* rail_bytes name the new backend's rails */
		atomic_store(&x->rail_bytes[i], 0);
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_backend_submit(tcp, x, &err) != 0) {
		SC_WARN("op", "%s: tcp could not take it over: %s", op->id, err.msg);
		return -1;
	}
	op_notify(eng, op);
	return 0;
}

static void xfer_complete(struct sc_xfer *x, enum sc_status status, const char *msg)
{
	struct sc_op *op = x->owner;
	struct sc_engine *eng = op->eng;
	sc_trace_mark(x->xfer_id, "engine_complete");
	sc_trace_set_current(x->xfer_id); /* the waiters answered below say which transfer */
	pthread_mutex_lock(&eng->mu);
	if (status == SC_ABORTED) {
		if (fall_back_locked(eng, op, msg) == 0) {
			pthread_mutex_unlock(&eng->mu);
			sc_trace_set_current(0);
			return; /* the same transfer, its pins and references, now on tcp */
		}
		status = SC_UNAVAILABLE;
	}
	op->xfer_in_flight = false;
	op->pins--;
	if (status == SC_OK) /* also after a late cancel: every byte moved, on both sides */
		sc_op_finish_locked(eng, op, SC_OPS_COMPLETE, SC_OK, NULL);
	else if (op->finish_pending != SC_OPS_UNSPECIFIED) { /* the cancel's or deadline's reason */
		char why[SC_ERR_MSG_MAX];
		snprintf(why, sizeof(why), "%s", op->err_msg);
		sc_op_finish_locked(eng, op, op->finish_pending, op->err_code, why);
	}
	else if (status == SC_CANCELLED)
		sc_op_finish_locked(eng, op, SC_OPS_CANCELLED, SC_CANCELLED, msg);
	else
		sc_op_finish_locked(eng, op, SC_OPS_ERRORED, status, msg);
	sc_sched_release(eng, op);
	op_release_regions(eng, op);
	pthread_cond_broadcast(&eng->idle_cv);
	sc_op_unref(eng, op); /* the transfer's */
	pthread_mutex_unlock(&eng->mu);
	sc_trace_set_current(0);
}

void sc_op_run_here_open(void)
{
	sc_xr_here_open();
}

void sc_op_run_here_close(void)
{
	sc_xr_here_close();
}

void sc_op_start_transfer(struct sc_engine *eng, struct sc_op *op)
{
	struct sc_xfer *x = &op->xfer;
	x->kind = op->kind;
	x->meta = &op->meta;
	x->total = op->bytes_total;
	x->deadline_mono_ms = op->deadline_mono_ms;
	atomic_store(&x->cancel_requested, false);
	x->on_progress = xfer_progress;
	x->on_complete = xfer_complete;
	x->owner = op;
	/* An ibverbs path that fails may hand the transfer to tcp when the issuer offers tcp. */
	x->fallback_ok = op->backend == SC_BACKEND_IBVERBS && backend_usable(eng, SC_BACKEND_TCP) &&
			 (op->meta.backends & SC_BACKEND_BIT_TCP) && op->meta.n_endpoints > 0;
	if (sc_random_bytes(&x->xfer_id, sizeof(x->xfer_id)) != 0)
		x->xfer_id = (uint64_t)(uintptr_t)op ^ sc_clock_mono_ms();
	if (sc_trace_on()) {
		uint64_t in_us = sc_trace_call_take();
		if (in_us)
			sc_trace_record(x->xfer_id, "grpc_in", in_us);
		sc_trace_record(x->xfer_id, "engine_submit", 0);
	}
	op->status = SC_OPS_IN_PROGRESS;
	struct sc_err err;
	sc_err_clear(&err);
	/* A local region whose file the worker truncated: end here, naming it, before a byte moves
	 * or the peer is asked (its passive operation stays usable). Every backend: tcp and LOCAL
	 * would fault half way (caught, but after the peer served or took bytes), ibverbs would
	 * move the stale pages the MR pins and complete. */
	if (probe_host_ranges(op, "the transfer", &err) != 0) {
		sc_op_finish_locked(eng, op, SC_OPS_ERRORED, err.code, err.msg);
		sc_sched_release(eng, op);
		return;
	}
	op->xfer_in_flight = true;
	op->pins++;
	op->refs++; /* the transfer's, dropped in xfer_complete */
	if (sc_backend_submit(op->be, x, &err) != 0) {
		op->xfer_in_flight = false;
		op->pins--;
		sc_op_finish_locked(eng, op, SC_OPS_ERRORED, err.code, err.msg);
		sc_sched_release(eng, op);
		sc_op_unref(eng, op);
		return;
	}
	op_notify(eng, op);
}

/* Say in backend_reason how GPU ranges move: "tcp, GPU memory staged through pinned host
 * buffers (...)", "ibverbs, GPU memory via GPUDirect RDMA (...)", "local, GPU copies by the CUDA
 * driver (...)". */
static void describe_gpu_path(struct sc_op *op)
{
	bool local_gpu = false, remote_gpu = false;
	for (size_t i = 0; i < op->n_descs; i++) {
		local_gpu |= op->regions[i]->gpu != SC_GPU_HOST;
		remote_gpu |= op->meta_valid && op->meta.descs[i].device_kind == SC_DEVICE_CUDA;
	}
	if (!local_gpu && !remote_gpu)
		return;
	const char *how = op->backend == SC_BACKEND_TCP ? "GPU memory staged through pinned host "
							  "buffers"
			  : op->backend == SC_BACKEND_IBVERBS ? "GPU memory via GPUDirect RDMA"
							      : "GPU copies by the CUDA driver";
	char reason[sizeof(op->backend_reason)];
	snprintf(reason, sizeof(reason), "%s, %s%s (%s)", sc_backend_name(op->backend), how,
		 local_gpu && remote_gpu ? " on both sides" : local_gpu ? " here" : " at the peer",
		 op->backend_reason);
	memcpy(op->backend_reason, reason, sizeof(reason));
}

static bool backend_usable(struct sc_engine *eng, enum sc_backend_kind b)
{
	return (int)b > SC_BACKEND_NONE && (int)b < SC_NUM_BACKENDS && eng->backends[b] &&
	       eng->backends[b]->available;
}

/* Why a slower backend was chosen: the first faster one that reaches other sidecars, usable here
 * but not offered by the issuer, or not usable here. */
static const char *explain_slower(struct sc_engine *eng, struct sc_op *op,
				  const struct sc_backend_class *pick, char *buf, size_t cap)
{
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		const struct sc_backend_class *c = sc_backend_registry_at(i);
		if (!c->peer_channel || c->transport_level <= pick->transport_level ||
		    !eng->backends[c->kind])
			continue;
		if (backend_usable(eng, c->kind)) {
			snprintf(buf, cap, "%s is available here but the issuing sidecar %s does not "
					   "offer it for this operation",
				 c->name, op->meta.issuer);
			SC_WARN("op", "%s uses %s although %s is configured: %s", op->id,
				pick->kind == SC_BACKEND_TCP ? "TCP" : pick->name, c->name, buf);
		} else {
			snprintf(buf, cap, "%s unavailable here: %s", c->name,
				 eng->backends[c->kind]->detail);
		}
		return buf;
	}
	return pick->chosen_because;
}

/* Pick the backend for an active op; fills op->be, op->backend and op->backend_reason. */
static int choose_backend(struct sc_engine *eng, struct sc_op *op, enum sc_backend_kind want,
			  struct sc_err *err)
{
	const struct sc_metadata *md = &op->meta;
	bool same_sidecar = strcmp(md->issuer, eng->id) == 0;
	bool peer_tcp = sc_backend_registry_find(SC_BACKEND_TCP) &&
			sc_backend_registry_find(SC_BACKEND_TCP)->can_reach(md, same_sidecar);
	enum sc_backend_kind pick = SC_BACKEND_NONE;
	const char *why = "";
	char buf[256];

	if (want != SC_BACKEND_NONE) {
		const struct sc_backend_class *c = sc_backend_registry_find(want);
		bool ok = c && backend_usable(eng, want) && c->can_reach(md, same_sidecar);
		if (!ok)
			return sc_err_set(err, SC_FAILED_PRECONDITION,
					  "backend %s was required but %s", sc_backend_name(want),
					  !backend_usable(eng, want)
						  ? "it is not available on this sidecar (see GetInfo)"
					  : same_sidecar ? "the metadata was issued by this same sidecar "
							   "(only LOCAL applies)"
							 : "the issuing sidecar does not offer it");
		pick = want;
		why = "required by the request";
	} else {
		const struct sc_backend_class *c =
		    sc_backend_registry_choose(eng->backends, md, same_sidecar);
		if (!c && same_sidecar)
			return sc_err_set(err, SC_FAILED_PRECONDITION,
					  "the metadata was issued by this sidecar but the local "
					  "backend is disabled (--backends)");
		if (!c) {
			char offers[128] = "";
			for (size_t i = 0; i < sc_backend_registry_count(); i++) {
				const struct sc_backend_class *o = sc_backend_registry_at(i);
				if (o->peer_channel ? o->can_reach(md, false)
						    : (md->backends & SC_BACKEND_BIT(o->kind)) != 0) {
					size_t used = strlen(offers);
					snprintf(offers + used, sizeof(offers) - used, " %s",
						 o->name);
				}
			}
			return sc_err_set(err, SC_FAILED_PRECONDITION,
					  "no backend in common with sidecar %s (it offers:%s; see "
					  "GetInfo on both)",
					  md->issuer, offers);
		}
		pick = c->kind;
		why = explain_slower(eng, op, c, buf, sizeof(buf));
	}
	if (pick == SC_BACKEND_IBVERBS && want == SC_BACKEND_NONE && peer_tcp &&
	    backend_usable(eng, SC_BACKEND_TCP)) {
		/* A local GPU range the NIC cannot reach: stage over TCP instead. */
		for (size_t i = 0; i < op->n_descs; i++) {
			const struct sc_region *r = op->regions[i];
			if (r->gpu != SC_GPU_HOST && !r->backend_handle[SC_BACKEND_IBVERBS]) {
				snprintf(buf, sizeof(buf), "ibverbs cannot reach local GPU %d "
							   "memory (%s)",
					 r->gpu, r->backend_note[SC_BACKEND_IBVERBS]);
				why = buf;
				pick = SC_BACKEND_TCP;
				break;
			}
		}
	} else if (pick == SC_BACKEND_IBVERBS) {
		for (size_t i = 0; i < op->n_descs; i++) {
			const struct sc_region *r = op->regions[i];
			if (r->gpu != SC_GPU_HOST && !r->backend_handle[SC_BACKEND_IBVERBS])
				return sc_err_set(err, SC_FAILED_PRECONDITION,
						  "ibverbs cannot reach local GPU %d memory (%s) "
						  "and tcp is not possible with sidecar %s",
						  r->gpu, r->backend_note[SC_BACKEND_IBVERBS],
						  md->issuer);
		}
	}
	op->backend = pick;
	op->be = eng->backends[pick];
	if (why != op->backend_reason)
		snprintf(op->backend_reason, sizeof(op->backend_reason), "%s", why);
	describe_gpu_path(op);
	return 0;
}

/* What BeginRead/BeginWrite check before an operation exists: the kind, the metadata (signature,
 * audience, expiry, kind) and the descriptors against it. *md is filled on 0. */
static int check_active(struct sc_engine *eng, enum sc_op_kind kind,
			const struct sc_active_req *req, struct sc_metadata *md_out, struct sc_err *err)
{
	if (kind != SC_OP_READ && kind != SC_OP_WRITE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "not an active operation kind");
	if (!req->metadata || !req->metadata[0])
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata is empty: pass the \"rsm1.\" text from the remote "
				  "CreateReadable/CreateWritable");

	struct sc_metadata md;
	if (sc_engine_verify_metadata(eng, req->metadata, eng->id, SC_MD_SOURCE_BEGIN, &md, err) != 0)
		return -1;

	enum sc_op_kind need = kind == SC_OP_READ ? SC_OP_READABLE : SC_OP_WRITABLE;
	if (md.kind != need) {
		sc_metrics_metadata_rejected(eng->metrics, SC_MD_SOURCE_BEGIN, SC_MD_WRONG_KIND);
		sc_metadata_free(&md);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s needs metadata from %s, but this metadata is %s",
				  kind == SC_OP_READ ? "BeginRead" : "BeginWrite",
				  kind == SC_OP_READ ? "CreateReadable" : "CreateWritable",
				  sc_op_kind_name(md.kind));
	}
	if (md.n_descs != req->n_descs) {
		size_t remote = md.n_descs;
		sc_metadata_free(&md);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "descriptor count mismatch: metadata has %zu, request has %zu", remote,
				  req->n_descs);
	}
	for (size_t i = 0; i < req->n_descs; i++) {
		if (md.descs[i].length != req->descs[i].length) {
			uint64_t remote = md.descs[i].length;
			sc_metadata_free(&md);
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "descriptor %zu length mismatch: metadata has %" PRIu64
					  ", request has %" PRIu64,
					  i, remote, req->descs[i].length);
		}
	}

	*md_out = md;
	return 0;
}

int sc_op_check_active(struct sc_engine *eng, enum sc_op_kind kind,
		       const struct sc_active_req *req, struct sc_err *err)
{
	struct sc_metadata md;
	if (check_active(eng, kind, req, &md, err) != 0)
		return -1;
	sc_metadata_free(&md);
	pthread_mutex_lock(&eng->mu);
	int rc = 0;
	for (size_t i = 0; i < req->n_descs && rc == 0; i++) {
		struct sc_region *r;
		rc = sc_region_resolve(eng, &req->descs[i], &r, err);
		if (rc != 0)
			sc_err_prefix(err, "descriptor %zu", i);
	}
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

int sc_op_begin(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_active_req *req,
		struct sc_op_info *out, struct sc_err *err)
{
	struct sc_metadata md;
	if (check_active(eng, kind, req, &md, err) != 0)
		return -1;

	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = op_new(eng, kind, req->descs, req->n_descs, req->timeout_ms,
				  req->request_id, err);
	if (!op) {
		pthread_mutex_unlock(&eng->mu);
		sc_metadata_free(&md);
		return -1;
	}
	op->omit_descs = req->omit_descs;
	op->quiet = req->quiet;
	op->meta = md;
	op->meta_valid = true;
	snprintf(op->peer, sizeof(op->peer), "%s", md.issuer);
	if (choose_backend(eng, op, req->backend, err) != 0)
		goto fail;
	op->xfer.segs = calloc(op->n_descs, sizeof(*op->xfer.segs));
	if (!op->xfer.segs) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	op->xfer.n_segs = op->n_descs;
	for (size_t i = 0; i < op->n_descs; i++) {
		struct sc_xfer_seg *s = &op->xfer.segs[i];
		s->local = op->regions[i]->base + op->descs[i].offset;
		s->local_gpu = op->regions[i]->gpu;
		s->remote_gpu = md.descs[i].device_kind == SC_DEVICE_CUDA;
		s->len = op->descs[i].length;
		s->remote_desc = (uint32_t)i;
		s->remote_addr = md.descs[i].remote_addr;
		s->rkey = md.descs[i].rkey;
		s->local_mr = op->regions[i]->backend_handle[op->backend];
	}
	if (req->requirement.set)
		op->req = req->requirement;
	op->status = SC_OPS_SCHEDULED;
	bool gated;
	if (sc_sched_gate(eng, op, &gated, err) != 0 || op_publish(eng, op, err) != 0)
		goto fail; /* op_free ungates it */
	if (!gated)
		sc_sched_admit(eng, op);
	op_fill_info(op, out);
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
	sc_log(req->quiet ? SC_LOG_DEBUG : SC_LOG_INFO, "op",
	       "%s %s %s %s: %zu descriptor(s), %" PRIu64 " bytes, backend %s (%s)%s", out->id,
	       sc_op_kind_name(kind), kind == SC_OP_READ ? "from" : "to", out->peer, out->n_descs,
	       out->bytes_total, sc_backend_name(out->backend), out->backend_reason,
	       out->status == SC_OPS_SCHEDULED ? ", scheduled" : "");
	return 0;
fail:
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
	return -1;
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
		op_fill_info(op, out);
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
		op_fill_info(op, out);
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
	op_fill_info(op, first);
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

static void count_passive_busy(void *ctx, void *value)
{
	const struct sc_op *op = value;
	uint32_t *n = ctx;
	if (!is_passive(op) || sc_op_status_terminal(op->status))
		return;
	if (op->n_uses)
		(*n)++;
}

uint32_t sc_engine_passive_busy_count(struct sc_engine *eng)
{
	uint32_t n = 0;
	if (eng->ops)
		sc_idmap_each(eng->ops, count_passive_busy, &n);
	return n;
}

/* ---- passive side of the data plane (backend/passive.h) ---------------------------------------------- */

static struct sc_op *token_lookup(struct sc_engine *eng, const uint8_t *token, struct sc_err *err)
{
	struct sc_op *op = sc_idmap_get(eng->tokens, token, SC_TOKEN_LEN);
	if (!op)
		sc_err_set(err, SC_NOT_FOUND,
			   "metadata does not name a live operation on sidecar %s (it completed, "
			   "was cancelled, expired or the sidecar restarted): ask for fresh metadata",
			   eng->id);
	return op;
}

/* An OPEN's lookup: a live operation, or why not. A token of an operation that ended (and is
 * still remembered) is a replay: FAILED_PRECONDITION, saying how it ended, so the active side's
 * operation ends with the code the proto documents for used, cancelled and expired metadata. */
static struct sc_op *open_lookup(struct sc_engine *eng, const uint8_t *token, struct sc_err *err)
{
	struct sc_op *op = sc_idmap_get(eng->tokens, token, SC_TOKEN_LEN);
	if (op)
		return op;
	const struct sc_op *spent = sc_idmap_get(eng->spent_tokens, token, SC_TOKEN_LEN);
	if (!spent)
		return token_lookup(eng, token, err);
	if (spent->status == SC_OPS_COMPLETE)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "metadata already used: operation %s on sidecar %s completed (%" PRIu64
			   " of %u use(s)); a passive operation serves each use once: ask for fresh "
			   "metadata",
			   spent->id, eng->id, spent->uses_begun, spent->max_uses);
	else if (spent->status == SC_OPS_CANCELLED)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "metadata of a cancelled operation: %s on sidecar %s was cancelled (%s): ask "
			   "for fresh metadata",
			   spent->id, eng->id, spent->err_msg);
	else if (spent->err_code == SC_DEADLINE_EXCEEDED)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "expired metadata: operation %s on sidecar %s reached its deadline: ask for "
			   "fresh metadata",
			   spent->id, eng->id);
	else
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "metadata of an operation that ended: %s on sidecar %s is %s (%s): ask for "
			   "fresh metadata",
			   spent->id, eng->id, sc_op_status_name(spent->status), spent->err_msg);
	return NULL;
}

/* A use that finished leaves the records. Under mu; O(1). */
static void drop_use(struct sc_op *op, struct sc_use *use)
{
	sc_u64map_del(&op->uses, use->xfer_id);
	op->n_uses--;
	free(use);
}

/* One use of an any_uses operation failed: the others go on (a reader that fails or vanishes
 * does not end the broadcast for everyone). Under mu. */
static void use_failed_locked(struct sc_engine *eng, struct sc_op *op, uint64_t xfer_id,
			      const char *why)
{
	op->uses_failed++;
	/* A peer can fail uses at will (DONE with an error, a cut connection): rate-limited. */
	sc_log_limited(SC_LOG_INFO, "op", "op-use-failed",
		       "%s: use by transfer %016" PRIx64 " failed (%" PRIu64 " failed, %" PRIu64
		       " done so far; the operation goes on): %s",
		       op->id, xfer_id, op->uses_failed, op->uses_done, why);
	op_notify(eng, op);
}

/* The use transfer xfer_id holds, or NULL. Under mu; O(1) (a hash, whatever the uses in
 * flight). */
static struct sc_use *find_use(struct sc_op *op, uint64_t xfer_id)
{
	return sc_u64map_get(&op->uses, xfer_id);
}

static int passive_open(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			enum sc_op_kind peer_kind, const char *peer_id, uint64_t total_bytes,
			struct sc_err *err)
{
	struct sc_engine *eng = ctx;
	int rc = -1;
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = open_lookup(eng, token, err);
	if (!op)
		goto out;
	enum sc_op_kind need = peer_kind == SC_OP_READ ? SC_OP_READABLE : SC_OP_WRITABLE;
	if (op->kind != need) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "operation %s is %s, not %s", op->id,
			   sc_op_kind_name(op->kind), sc_op_kind_name(need));
		goto out;
	}
	if (sc_clock_mono_ms() >= op->deadline_mono_ms) {
		sc_err_set(err, SC_FAILED_PRECONDITION, "operation %s expired", op->id);
		goto out;
	}
	if (op->audience[0] && strcmp(op->audience, peer_id ? peer_id : "") != 0) {
		sc_err_set(err, SC_PERMISSION_DENIED, "operation %s is for sidecar %s, not %s",
			   op->id, op->audience, peer_id ? peer_id : "");
		goto out;
	}
	if (total_bytes != op->bytes_total) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "transfer of %" PRIu64 " bytes does not match operation %s (%" PRIu64
			   " bytes)",
			   total_bytes, op->id, op->bytes_total);
		goto out;
	}
	if (!find_use(op, xfer_id)) {
		/* Its memory must still be backed: an ibverbs peer moves the bytes without this
		 * side seeing them (no span is asked for); tcp and LOCAL learn it before a
		 * request. */
		char what[SC_NAME_MAX + 48];
		snprintf(what, sizeof(what), "the %s by peer sidecar %s",
			 peer_kind == SC_OP_READ ? "READ" : "WRITE", peer_id ? peer_id : "");
		if (probe_host_ranges(op, what, err) != 0) {
			sc_op_finish_locked(eng, op, SC_OPS_ERRORED, err->code, err->msg);
			goto out;
		}
		if (!op->any_uses && op->uses_begun >= op->max_uses) {
			sc_err_set(err, SC_FAILED_PRECONDITION,
				   "metadata already used (%" PRIu64 " of %u use(s)): a passive "
				   "operation serves each use once; ask for fresh metadata",
				   op->uses_begun, op->max_uses);
			goto out;
		}
		if (op->n_uses >= SC_OP_MAX_OPEN_USES) {
			sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				   "operation %s on sidecar %s already has %u transfers open at once "
				   "(the most a passive operation serves at once): finish some (DONE) "
				   "and retry",
				   op->id, eng->id, op->n_uses);
			goto out;
		}
		struct sc_use *use = calloc(1, sizeof(*use));
		if (!use || sc_u64map_put(&op->uses, xfer_id, use) != 0) {
			free(use);
			sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				   "sidecar out of memory for another use of operation %s", op->id);
			goto out;
		}
		use->xfer_id = xfer_id;
		use->refused = SC_OK;
		op->n_uses++;
		op->uses_begun++;
		snprintf(op->peer, sizeof(op->peer), "%s", peer_id ? peer_id : "");
		if (op->backend == SC_BACKEND_NONE)
			op->backend = strcmp(op->peer, eng->id) == 0 ? SC_BACKEND_LOCAL
								     : SC_BACKEND_TCP;
		if (op->status == SC_OPS_INITIALIZED) {
			op->status = SC_OPS_IN_PROGRESS;
			op_notify(eng, op);
		}
	}
	rc = 0;
out:
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

static void passive_set_backend(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
				enum sc_backend_kind backend)
{
	struct sc_engine *eng = ctx;
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = sc_idmap_get(eng->tokens, token, SC_TOKEN_LEN);
	if (op && find_use(op, xfer_id))
		op->backend = backend;
	pthread_mutex_unlock(&eng->mu);
}

static int passive_span(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			enum sc_op_kind peer_kind, uint32_t desc_index, uint64_t offset, uint64_t len,
			struct sc_span *out, struct sc_err *err)
{
	struct sc_engine *eng = ctx;
	int rc = -1;
	struct sc_use *use = NULL;
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = token_lookup(eng, token, err);
	if (!op)
		goto out;
	use = find_use(op, xfer_id);
	if (!use || use->done) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "transfer %016" PRIx64 " has not opened operation %s", xfer_id, op->id);
		goto out;
	}
	if (op->status != SC_OPS_IN_PROGRESS) {
		sc_err_set(err, SC_FAILED_PRECONDITION, "operation %s is %s", op->id,
			   sc_op_status_name(op->status));
		goto out;
	}
	if (op->kind != (peer_kind == SC_OP_WRITE ? SC_OP_WRITABLE : SC_OP_READABLE)) {
		sc_err_set(err, SC_PERMISSION_DENIED, "operation %s is %s: the peer may not %s it",
			   op->id, sc_op_kind_name(op->kind),
			   peer_kind == SC_OP_WRITE ? "write" : "read");
		goto out;
	}
	if (sc_clock_mono_ms() >= op->deadline_mono_ms) {
		sc_err_set(err, SC_DEADLINE_EXCEEDED, "operation %s passed its deadline", op->id);
		goto out;
	}
	if (desc_index >= op->n_descs) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "descriptor %u out of range (operation %s has %zu)",
			   desc_index, op->id, op->n_descs);
		goto out;
	}
	const struct sc_desc *d = &op->descs[desc_index];
	if (len == 0 || offset > d->length || len > d->length - offset) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "range [%" PRIu64 ", +%" PRIu64 ") outside descriptor %u (%" PRIu64
			   " bytes)",
			   offset, len, desc_index, d->length);
		goto out;
	}
	out->addr = op->regions[desc_index]->base + d->offset + offset;
	out->gpu = op->regions[desc_index]->gpu;
	out->len = len;
	out->deadline_mono_ms = op->deadline_mono_ms;
	out->op = op;
	if (out->gpu == SC_GPU_HOST && sc_fault_guard_probe(out->addr, len, err) != 0)
		goto out; /* its file was truncated: refused, named, before a byte moves */
	op->refs++;
	op->pins++;
	rc = 0;
out:
	if (rc != 0 && use && !use->done && use->refused == SC_OK)
		use->refused = err->code == SC_OK ? SC_INTERNAL : err->code;
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

static void passive_span_release(void *ctx, struct sc_span *span, uint64_t bytes_moved)
{
	struct sc_engine *eng = ctx;
	struct sc_op *op = span->op;
	if (!op)
		return;
	atomic_fetch_add(&op->bytes_done, bytes_moved);
	atomic_fetch_add_explicit(&op->bytes_served, bytes_moved, memory_order_relaxed);
	pthread_mutex_lock(&eng->mu);
	if (!sc_op_status_terminal(op->status) &&
	    sc_clock_mono_ms() - op->last_notify_mono_ms >= PROGRESS_NOTIFY_MS)
		op_notify(eng, op);
	op->pins--;
	op_release_regions(eng, op);
	if (op->pins == 0 && sc_op_status_terminal(op->status))
		pthread_cond_broadcast(&eng->idle_cv); /* passive_wait_unpinned_locked */
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
	span->op = NULL;
}

static int passive_done(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			enum sc_status status, const char *msg, struct sc_err *err)
{
	struct sc_engine *eng = ctx;
	int rc = -1;
	pthread_mutex_lock(&eng->mu);
	/* An operation that ended (cancelled, released, past its deadline) says how: the active
	 * side reports that instead of a bare cut connection. */
	struct sc_op *op = open_lookup(eng, token, err);
	if (!op)
		goto out;
	struct sc_use *use = find_use(op, xfer_id);
	if (!use) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "transfer %016" PRIx64 " has not opened operation %s", xfer_id, op->id);
		goto out;
	}
	if (status == SC_ABORTED) {
		/* The active side's path failed; the same transfer comes back on another one (an
		 * ibverbs transfer going on over tcp): the use stays open. */
		sc_log_limited(SC_LOG_INFO, "op", "op-path-moved",
			       "%s: peer %s moves transfer %016" PRIx64 " to another path: %s",
			       op->id, op->peer, xfer_id, msg && msg[0] ? msg : "its path failed");
		if (op->max_uses == 1)
			atomic_store(&op->bytes_done, 0);
		op->backend = SC_BACKEND_TCP; /* the only path a transfer moves to today */
		snprintf(op->backend_reason, sizeof(op->backend_reason),
			 "peer %s moved the transfer to tcp: %s", op->peer,
			 msg && msg[0] ? msg : "its path failed");
		rc = 0;
		goto out;
	}
	enum sc_status refused = use->refused;
	drop_use(op, use); /* finished: only the uses in flight keep a record */
	if (status == SC_OK && refused != SC_OK) {
		/* A success pipelined behind a request this side refused: the bytes did not all
		 * move. */
		char text[SC_ERR_MSG_MAX];
		snprintf(text, sizeof(text),
			 "peer %s reported success after this side refused one of its requests (%s)",
			 op->peer, sc_status_name(refused));
		if (op->any_uses)
			use_failed_locked(eng, op, xfer_id, text);
		else
			sc_op_finish_locked(eng, op, SC_OPS_ERRORED, refused, text);
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "transfer %016" PRIx64 " had a request refused (%s): operation %s is not "
			   "complete",
			   xfer_id, sc_status_name(refused), op->id);
		goto out;
	} else if (status == SC_OK) {
		/* RDMA moves the bytes without this side seeing them: a use confirmed by DONE moved
		 * them all (info caps bytes_done at bytes_total). */
		if (op->backend == SC_BACKEND_IBVERBS) {
			/* The NIC moved them to or from the pages its MR pins: if the worker
			 * truncated the file meanwhile, those pages are no longer the file's, so
			 * the use did not move the region's bytes. ERRORED, naming the region;
			 * a peer that sent DONE is told in its reply. */
			char what[SC_NAME_MAX + 48];
			snprintf(what, sizeof(what), "the ibverbs transfer with peer sidecar %s",
				 op->peer);
			struct sc_err lost;
			sc_err_clear(&lost);
			if (probe_host_ranges(op, what, &lost) != 0) {
				sc_op_finish_locked(eng, op, SC_OPS_ERRORED, lost.code, lost.msg);
				if (err)
					*err = lost;
				goto out;
			}
			atomic_fetch_add(&op->bytes_done, op->bytes_total);
			atomic_fetch_add_explicit(&op->bytes_served, op->bytes_total,
						  memory_order_relaxed);
		}
		op->uses_done++;
		if (!op->any_uses && op->uses_done == op->max_uses)
			sc_op_finish_locked(eng, op, SC_OPS_COMPLETE, SC_OK, NULL);
		else
			op_notify(eng, op);
	} else {
		char text[SC_ERR_MSG_MAX];
		snprintf(text, sizeof(text), "peer %s: %s", op->peer,
			 msg && msg[0] ? msg : sc_status_text(status));
		if (op->any_uses)
			use_failed_locked(eng, op, xfer_id, text);
		else
			sc_op_finish_locked(eng, op,
					    status == SC_CANCELLED ? SC_OPS_CANCELLED : SC_OPS_ERRORED,
					    status, text);
	}
	rc = 0;
out:
	pthread_mutex_unlock(&eng->mu);
	return rc;
}

static void passive_abandon(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			    const char *why)
{
	struct sc_engine *eng = ctx;
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = sc_idmap_get(eng->tokens, token, SC_TOKEN_LEN);
	struct sc_use *use = op ? find_use(op, xfer_id) : NULL;
	if (use && !use->done && !sc_op_status_terminal(op->status)) {
		char text[SC_ERR_MSG_MAX];
		snprintf(text, sizeof(text), "peer %s disconnected mid-transfer: %s", op->peer,
			 why ? why : "connection lost");
		if (op->any_uses) {
			drop_use(op, use);
			use_failed_locked(eng, op, xfer_id, text);
		} else {
			sc_op_finish_locked(eng, op, SC_OPS_ERRORED, SC_UNAVAILABLE, text);
		}
	}
	pthread_mutex_unlock(&eng->mu);
}

/* The engine tracks no OPENs: the peer server does, and wraps this interface to add the claim. */
static int passive_claim_none(void *ctx, const char *peer_id, uint64_t xfer_id,
			      enum sc_backend_kind via, uint8_t token[SC_TOKEN_LEN])
{
	(void)ctx, (void)peer_id, (void)xfer_id, (void)via, (void)token;
	return -1;
}

static const struct sc_passive_ops op_passive_ops = {
	.open = passive_open,
	.set_backend = passive_set_backend,
	.span = passive_span,
	.span_release = passive_span_release,
	.done = passive_done,
	.abandon = passive_abandon,
	.claim = passive_claim_none,
};

struct sc_passive sc_op_passive(struct sc_engine *eng)
{
	return (struct sc_passive){.ops = &op_passive_ops, .ctx = eng};
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
		(void)op_fill_info(items[i], &infos[i]); /* -1: usable, without metadata */
	pthread_mutex_unlock(&eng->mu);
	free(items);
	if (!infos)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	*out = infos;
	*n = take;
	*more = found > take;
	return 0;
}
