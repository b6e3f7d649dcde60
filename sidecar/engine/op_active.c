/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/op_active.c: active operations (READ/WRITE): verify the remote metadata, choose a
 * backend, wait in the scheduler for a slot (and for worker progress when gated), then submit one
 * struct sc_xfer that the backend executes; its completion (or a fall back to tcp) ends the
 * operation. The scheduler starts each transfer when it takes a slot, through the start hook
 * the engine handed it (sc_op_start_transfer). Builds on engine/operation.c (lifecycle).
 *
 * Threads: RPC handlers (BeginRead/BeginWrite), whatever thread frees a slot (scheduler), backend
 * threads (progress, completion). Everything runs under eng->mu except the metadata check and
 * progress counting. Owns each active operation's struct sc_xfer.
 */
#include "engine/internal.h"
#include "engine/metrics.h"
#include "engine/backend_registry.h"
#include "base/log.h"
#include "base/trace.h"
#include "backend/xfer_runner.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>

/* ---- active operations ----------------------------------------------------------------------- */

static void xfer_progress(struct sc_xfer *x, uint64_t delta)
{
	struct sc_op *op = x->owner;
	uint64_t done = atomic_fetch_add(&op->bytes_done, delta) + delta;
	uint64_t now = sc_clock_mono_ms();
	if (done < op->bytes_total && now - op->last_notify_mono_ms < SC_OP_PROGRESS_NOTIFY_MS)
		return;
	pthread_mutex_lock(&op->eng->mu);
	if (!sc_op_status_terminal(op->status))
		sc_op_notify(op->eng, op);
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
	struct sc_log_fields lf = sc_op_log_fields(op);
	lf.backend = sc_backend_name(from);
	lf.code = sc_status_name(SC_ABORTED);
	SC_WARN_KV("op", &lf, "%s: %s path to %s failed, going on over tcp: %s", op->id,
		   sc_backend_name(from), op->meta.issuer, msg);
	op->backend = SC_BACKEND_TCP;
	op->be = tcp;
	x->fallback_ok = false;
	sc_metrics_fallback(eng->metrics, from, SC_BACKEND_TCP, SC_FALLBACK_FAILED_MID_TRANSFER);
	atomic_store(&x->committed, false);
	atomic_store(&op->bytes_done, 0);
	for (size_t i = 0; i < SC_XFER_MAX_RAILS; i++) /* rail_bytes name the new backend's rails */
		atomic_store(&x->rail_bytes[i], 0);
	struct sc_err err;
	sc_err_clear(&err);
	if (sc_backend_submit(tcp, x, &err) != 0) {
		struct sc_log_fields tf = sc_op_log_fields(op);
		tf.code = sc_status_name(err.code);
		SC_WARN_KV("op", &tf, "%s: tcp could not take it over: %s", op->id, err.msg);
		return -1;
	}
	sc_op_notify(eng, op);
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
	sc_op_release_regions(eng, op);
	pthread_cond_broadcast(&eng->idle_cv);
	sc_op_unref(eng, op); /* the transfer's */
	pthread_mutex_unlock(&eng->mu);
	sc_trace_set_current(0);
}

void sc_op_run_here(struct sc_run_here *h)
{
	if (h)
		sc_xr_here_run(&h->xr);
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
	x->op_id = op->id;
	memcpy(x->trace_id, op->trace_id, sizeof(x->trace_id));
	/* An RDMA path (ibverbs, libfabric) that fails may hand the transfer to tcp when the
	 * issuer offers tcp. */
	x->fallback_ok =
	    (op->backend == SC_BACKEND_IBVERBS || op->backend == SC_BACKEND_LIBFABRIC) &&
	    backend_usable(eng, SC_BACKEND_TCP) && (op->meta.backends & SC_BACKEND_BIT_TCP) &&
	    op->meta.n_endpoints > 0;
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
	if (sc_op_probe_host_ranges(op, "the transfer", &err) != 0) {
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
	sc_op_notify(eng, op);
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
			  : op->backend == SC_BACKEND_LIBFABRIC
			      ? "GPU memory registered with libfabric (FI_HMEM_CUDA)"
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
			SC_WARN_KV("op",
				   (&(struct sc_log_fields){.op = op->id, .peer = op->meta.issuer,
							    .backend = pick->name,
							    .trace_id = op->trace_id}),
				   "%s uses %s although %s is configured: %s", op->id,
				   pick->kind == SC_BACKEND_TCP ? "TCP" : pick->name, c->name, buf);
			sc_metrics_fallback(eng->metrics, c->kind, pick->kind,
					    SC_FALLBACK_PEER_LACKS);
		} else {
			snprintf(buf, cap, "%s unavailable here: %s", c->name,
				 eng->backends[c->kind]->detail);
			/* A fall back only where --backends asked for it: by default a
			 * backend this host cannot use is not expected (a TCP-only host). */
			if (c->kind == SC_BACKEND_IBVERBS &&
			    (eng->cfg->backends & SC_BACKEND_BIT_IBVERBS))
				sc_metrics_fallback(eng->metrics, c->kind, pick->kind,
						    SC_FALLBACK_UNAVAILABLE);
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
	bool nic = pick == SC_BACKEND_IBVERBS || pick == SC_BACKEND_LIBFABRIC;
	if (nic && want == SC_BACKEND_NONE && peer_tcp && backend_usable(eng, SC_BACKEND_TCP)) {
		/* A local GPU range the NIC cannot reach: stage over TCP instead. */
		for (size_t i = 0; i < op->n_descs; i++) {
			const struct sc_region *r = op->regions[i];
			if (r->gpu != SC_GPU_HOST && !r->backend_handle[pick]) {
				snprintf(buf, sizeof(buf), "%s cannot reach local GPU %d "
							   "memory (%s)",
					 sc_backend_name(pick), r->gpu, r->backend_note[pick]);
				why = buf;
				pick = SC_BACKEND_TCP;
				sc_metrics_fallback(eng->metrics, SC_BACKEND_IBVERBS,
						    SC_BACKEND_TCP, SC_FALLBACK_GPU_UNREACHABLE);
				break;
			}
		}
	} else if (nic) {
		for (size_t i = 0; i < op->n_descs; i++) {
			const struct sc_region *r = op->regions[i];
			if (r->gpu != SC_GPU_HOST && !r->backend_handle[pick])
				return sc_err_set(err, SC_FAILED_PRECONDITION,
						  "%s cannot reach local GPU %d memory (%s) "
						  "and tcp is not possible with sidecar %s",
						  sc_backend_name(pick), r->gpu, r->backend_note[pick],
						  md->issuer);
		}
	}
	op->backend = pick;
	op->be = eng->backends[pick];
	if (why != op->backend_reason)
		snprintf(op->backend_reason, sizeof(op->backend_reason), "%s", why);
	if (pick == SC_BACKEND_LIBFABRIC && op->be->n_rails) {
		/* Which provider and rails: "..., over tcp;ofi_rxm:eth0,tcp;ofi_rxm:eth1". */
		size_t used = strlen(op->backend_reason);
		for (size_t r = 0; r < op->be->n_rails && used + 2 < sizeof(op->backend_reason); r++) {
			snprintf(op->backend_reason + used, sizeof(op->backend_reason) - used, "%s%s",
				 r ? "," : ", over ", op->be->rails[r].name);
			used = strlen(op->backend_reason);
		}
	}
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

/* A refused BeginRead/BeginWrite, at INFO with its reason: anyone holding metadata can cause
 * them at will, so rate-limited (one line a second per direction, then "N similar suppressed"). */
static void log_refused(enum sc_op_kind kind, const struct sc_active_req *req,
			const struct sc_err *err)
{
	if (!sc_log_enabled(SC_LOG_INFO))
		return;
	char key_id[SC_KEY_ID_MAX];
	sc_metadata_peek_key_id(req->metadata, key_id);
	struct sc_log_fields lf = {
	    .code = sc_status_name(err->code),
	    .key_id = key_id,
	    .trace_id = req->trace_id && sc_trace_id_valid(req->trace_id) ? req->trace_id : NULL,
	};
	const char *what = kind == SC_OP_READ ? "BeginRead" : "BeginWrite";
	sc_log_kv_limited(SC_LOG_INFO, "op", kind == SC_OP_READ ? "begin-read-refused"
							       : "begin-write-refused",
			  &lf, "%s refused (%s): %s", what, sc_status_name(err->code), err->msg);
}

int sc_op_begin(struct sc_engine *eng, enum sc_op_kind kind, const struct sc_active_req *req,
		struct sc_op_info *out, struct sc_err *err)
{
	struct sc_metadata md;
	if (check_active(eng, kind, req, &md, err) != 0) {
		log_refused(kind, req, err);
		return -1;
	}
	char md_key_id[SC_KEY_ID_MAX] = "";

	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = sc_op_new(eng, kind, req->descs, req->n_descs, req->timeout_ms,
				  req->request_id, err);
	if (!op) {
		pthread_mutex_unlock(&eng->mu);
		sc_metadata_free(&md);
		log_refused(kind, req, err);
		return -1;
	}
	op->omit_descs = req->omit_descs;
	op->quiet = req->quiet;
	if (req->trace_id && sc_trace_id_valid(req->trace_id))
		for (size_t i = 0; i < sizeof(op->trace_id); i++) /* lowercase, as W3C writes it */
			op->trace_id[i] = (char)tolower((unsigned char)req->trace_id[i]);
	else
		sc_trace_id_new(op->trace_id);
	op->meta = md;
	op->meta_valid = true;
	snprintf(md_key_id, sizeof(md_key_id), "%s", md.key_id);
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
	if (sc_sched_gate(eng, op, &gated, err) != 0 || sc_op_publish(eng, op, err) != 0)
		goto fail; /* op_free ungates it */
	/* The caller's offer holds only while this call submits (a transfer the scheduler queues
	 * starts later on another thread, without it). */
	op->xfer.here = req->here ? &req->here->xr : NULL;
	if (!gated)
		sc_sched_admit(eng, op);
	op->xfer.here = NULL;
	sc_op_fill_info(op, out);
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
	sc_log_kv(req->quiet ? SC_LOG_DEBUG : SC_LOG_INFO, "op",
		  &(struct sc_log_fields){.op = out->id, .peer = out->peer,
					  .backend = sc_backend_name(out->backend),
					  .bytes = out->bytes_total, .has_bytes = true,
					  .key_id = md_key_id, .trace_id = out->trace_id},
		  "%s %s %s %s: %zu descriptor(s), %" PRIu64 " bytes, backend %s (%s)%s", out->id,
		  sc_op_kind_name(kind), kind == SC_OP_READ ? "from" : "to", out->peer, out->n_descs,
		  out->bytes_total, sc_backend_name(out->backend), out->backend_reason,
		  out->status == SC_OPS_SCHEDULED ? ", scheduled" : "");
	return 0;
fail:
	sc_op_unref(eng, op);
	pthread_mutex_unlock(&eng->mu);
	log_refused(kind, req, err);
	return -1;
}
