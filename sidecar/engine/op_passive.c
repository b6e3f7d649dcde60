/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/op_passive.c: passive operations (READABLE/WRITABLE): create, expose, and the
 * backend/passive.h interface the data plane calls. CreateReadable/CreateWritable expose ranges of
 * local regions under a fresh 128-bit token (ibverbs: an exposure per backend) and hand out signed
 * metadata; data-plane servers reach the operation through the interface sc_op_passive returns,
 * handed to them at creation: OPEN claims a use, span pins a range for a request, DONE and abandon
 * end a use. Builds on engine/operation.c (lifecycle); the data plane reaches it only through
 * that interface, the engine (drain) through sc_engine_passive_busy_count.
 *
 * Threads: RPC handlers (create) and data-plane server threads (the interface), all under eng->mu.
 * Owns eng->tokens and each operation's use records.
 */
#include "engine/internal.h"
#include "os/fault_guard.h"
#include "base/log.h"
#include "backend/passive.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>

#define MAX_USES (1u << 20) /* counted uses; any_uses has no limit */

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

	char signing_key[SC_KEY_ID_MAX] = "";
	pthread_mutex_lock(&eng->mu);
	struct sc_op *op = sc_op_new(eng, kind, req->descs, req->n_descs, req->timeout_ms,
				  req->request_id, err);
	if (!op)
		goto fail_unlocked_op;
	if (sc_op_copy_str(op->audience, sizeof(op->audience), req->audience, "audience", err) != 0)
		goto fail;
	op->omit_descs = req->omit_descs;
	op->any_uses = req->any_uses;
	if (req->trace_id && sc_trace_id_valid(req->trace_id))
		for (size_t i = 0; i < sizeof(op->trace_id); i++)
			op->trace_id[i] = (char)tolower((unsigned char)req->trace_id[i]);
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
	/* Where and how peers reach it: each available backend writes its part (endpoints where
	 * none are yet, its bit), in kind order (tcp's data endpoints first). */
	for (int b = 0; b < SC_NUM_BACKENDS; b++)
		if (eng->backends[b] && eng->backends[b]->available)
			eng->backends[b]->ops->advertise(eng->backends[b], &md);
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
	/* What each backend grants: a NIC backend registers the ranges and writes their keys and
	 * its bit into md (a grant, kept in op->exposure[b] for the revoke); the others grant on
	 * the token alone and keep nothing. */
	bool granted = false, refused = false;
	for (int b = 0; b < SC_NUM_BACKENDS; b++) {
		struct sc_backend *be = eng->backends[b];
		if (!be || !be->available)
			continue;
		for (size_t i = 0; i < op->n_descs; i++)
			handles[i] = op->regions[i]->backend_handle[b];
		struct sc_err berr;
		sc_err_clear(&berr);
		if (be->ops->expose(be, &md, addrs, gpus, handles, &op->exposure[b], &berr) == 0) {
			if (op->exposure[b] && any_gpu && !granted)
				snprintf(op->backend_reason, sizeof(op->backend_reason),
					 "GPU memory exposed to %s peers (GPUDirect RDMA)",
					 be->ops->name);
			granted |= op->exposure[b] != NULL;
		} else if (any_gpu) {
			SC_INFO_KV("op", (&(struct sc_log_fields){.op = op->id,
							     .backend = be->ops->name,
							     .code = sc_status_name(berr.code),
							     .trace_id = op->trace_id}),
				   "%s: %s cannot reach its GPU memory, peers will use tcp "
				   "(staged through pinned host buffers): %s",
				   op->id, be->ops->name, berr.msg);
			snprintf(op->backend_reason, sizeof(op->backend_reason),
				 "tcp, GPU memory staged through pinned host buffers (%s: %s)",
				 be->ops->name, berr.msg);
			refused = true;
		} else {
			SC_WARN_KV("op", (&(struct sc_log_fields){.op = op->id,
							     .backend = be->ops->name,
							     .code = sc_status_name(berr.code),
							     .trace_id = op->trace_id}),
				   "%s: %s cannot expose it, peers will use tcp: %s", op->id,
				   be->ops->name, berr.msg);
			snprintf(op->backend_reason, sizeof(op->backend_reason),
				 "%s expose failed: %s", be->ops->name, berr.msg);
			refused = true;
		}
	}
	if (any_gpu && !granted && !refused)
		snprintf(op->backend_reason, sizeof(op->backend_reason),
			 "GPU memory: tcp peers are served through pinned host buffers");
	free(gpus);
	free(addrs);
	free(handles);
	md.issued_unix_ms = op->created_unix_ms;
	md.expires_unix_ms = op->deadline_unix_ms;
	md.max_uses = op->max_uses;
	md.peer_features = SC_MD_FEATURE_OPEN_EXT;
	if (sc_random_bytes(md.nonce, sizeof(md.nonce)) != 0) {
		sc_metadata_free(&md); /* descs, and the other rails' rkeys (ibverbs expose) */
		sc_err_set(err, SC_INTERNAL, "no randomness for the metadata nonce");
		goto fail;
	}
	int rc = sc_metadata_sign(eng->keys, &md, &op->metadata, err);
	const char *kid = sc_keyring_signing_id(eng->keys);
	snprintf(signing_key, sizeof(signing_key), "%s", kid ? kid : "");
	sc_metadata_free(&md);
	if (rc != 0)
		goto fail;
	if (sc_idmap_put(eng->tokens, op->token, SC_TOKEN_LEN, op) != 0) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "token table full");
		goto fail;
	}
	op->token_in_table = true;
	if (sc_op_publish(eng, op, err) != 0) {
		sc_idmap_del(eng->tokens, op->token, SC_TOKEN_LEN);
		op->token_in_table = false;
		goto fail;
	}
	sc_op_fill_info(op, out);
	sc_op_unref(eng, op); /* creation reference; the table keeps it */
	pthread_mutex_unlock(&eng->mu);
	SC_INFO_KV("op",
		   (&(struct sc_log_fields){.op = out->id, .bytes = out->bytes_total,
					    .has_bytes = true, .key_id = signing_key,
					    .trace_id = out->trace_id}),
		   "%s %s: %zu descriptor(s), %" PRIu64 " bytes, uses %u, deadline in %" PRIu64
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

static void count_passive_busy(void *ctx, void *value)
{
	const struct sc_op *op = value;
	uint32_t *n = ctx;
	if (!sc_op_is_passive(op) || sc_op_status_terminal(op->status))
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

/* ---- passive side of the data plane (backend/passive.h) -------------------------------------- */

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
			      const char *trace_id, const char *why)
{
	op->uses_failed++;
	/* A peer can fail uses at will (DONE with an error, a cut connection): rate-limited. */
	struct sc_log_fields lf = sc_op_log_fields(op);
	if (trace_id && trace_id[0]) /* the use's, from its OPEN */
		lf.trace_id = trace_id;
	sc_log_kv_limited(SC_LOG_INFO, "op", "op-use-failed", &lf,
			  "%s: use by transfer %016" PRIx64 " failed (%" PRIu64 " failed, %" PRIu64
			  " done so far; the operation goes on): %s",
			  op->id, xfer_id, op->uses_failed, op->uses_done, why);
	sc_op_notify(eng, op);
}

/* The use transfer xfer_id holds, or NULL. Under mu; O(1) (a hash, whatever the uses in
 * flight). */
static struct sc_use *find_use(struct sc_op *op, uint64_t xfer_id)
{
	return sc_u64map_get(&op->uses, xfer_id);
}

static int passive_open(void *ctx, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
			enum sc_op_kind peer_kind, const char *peer_id, uint64_t total_bytes,
			const char *trace_id, struct sc_err *err)
{
	struct sc_engine *eng = ctx;
	int rc = -1;
	bool first = false;
	char op_id[SC_ID_MAX] = "", op_trace[SC_TRACE_ID_LEN] = "";
	uint64_t begun = 0;
	uint32_t max_uses = 0;
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
		if (sc_op_probe_host_ranges(op, what, err) != 0) {
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
		if (trace_id && sc_trace_id_valid(trace_id)) {
			snprintf(use->trace_id, sizeof(use->trace_id), "%s", trace_id);
			if (!op->trace_id[0]) /* one transfer, one trace: the reader's */
				snprintf(op->trace_id, sizeof(op->trace_id), "%s", trace_id);
		}
		op->n_uses++;
		op->uses_begun++;
		first = true;
		begun = op->uses_begun;
		max_uses = op->max_uses;
		snprintf(op_id, sizeof(op_id), "%s", op->id);
		snprintf(op_trace, sizeof(op_trace), "%s", op->trace_id);
		snprintf(op->peer, sizeof(op->peer), "%s", peer_id ? peer_id : "");
		if (op->backend == SC_BACKEND_NONE)
			op->backend = strcmp(op->peer, eng->id) == 0 ? SC_BACKEND_LOCAL
								     : SC_BACKEND_TCP;
		if (op->status == SC_OPS_INITIALIZED) {
			op->status = SC_OPS_IN_PROGRESS;
			sc_op_notify(eng, op);
		}
	}
	rc = 0;
out:
	pthread_mutex_unlock(&eng->mu);
	if (first) {
		char of[16];
		snprintf(of, sizeof(of), max_uses == UINT32_MAX ? "any" : "%u", max_uses);
		sc_log_kv(begun == 1 ? SC_LOG_INFO : SC_LOG_DEBUG, "op",
			  &(struct sc_log_fields){.op = op_id, .peer = peer_id,
						  .bytes = total_bytes, .has_bytes = true,
						  .trace_id = trace_id && trace_id[0] ? trace_id
										 : op_trace},
			  "%s: transfer %016" PRIx64 " of peer %s opened (use %" PRIu64 " of %s)",
			  op_id, xfer_id, peer_id ? peer_id : "", begun, of);
	}
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
	    sc_clock_mono_ms() - op->last_notify_mono_ms >= SC_OP_PROGRESS_NOTIFY_MS)
		sc_op_notify(eng, op);
	op->pins--;
	sc_op_release_regions(eng, op);
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
		struct sc_log_fields lf = sc_op_log_fields(op);
		lf.code = sc_status_name(SC_ABORTED);
		if (use->trace_id[0])
			lf.trace_id = use->trace_id;
		sc_log_kv_limited(SC_LOG_INFO, "op", "op-path-moved", &lf,
				  "%s: peer %s moves transfer %016" PRIx64 " to another path: %s",
				  op->id, op->peer, xfer_id,
				  msg && msg[0] ? msg : "its path failed");
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
	char use_trace[SC_TRACE_ID_LEN];
	memcpy(use_trace, use->trace_id, sizeof(use_trace));
	drop_use(op, use); /* finished: only the uses in flight keep a record */
	if (status == SC_OK && refused != SC_OK) {
		/* A success pipelined behind a request this side refused: the bytes did not all
		 * move. */
		char text[SC_ERR_MSG_MAX];
		snprintf(text, sizeof(text),
			 "peer %s reported success after this side refused one of its requests (%s)",
			 op->peer, sc_status_name(refused));
		if (op->any_uses)
			use_failed_locked(eng, op, xfer_id, use_trace, text);
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
		if (op->backend == SC_BACKEND_IBVERBS || op->backend == SC_BACKEND_LIBFABRIC) {
			/* The NIC moved them to or from the pages its MR pins: if the worker
			 * truncated the file meanwhile, those pages are no longer the file's, so
			 * the use did not move the region's bytes. ERRORED, naming the region;
			 * a peer that sent DONE is told in its reply. */
			char what[SC_NAME_MAX + 48];
			snprintf(what, sizeof(what), "the %s transfer with peer sidecar %s",
				 sc_backend_name(op->backend), op->peer);
			struct sc_err lost;
			sc_err_clear(&lost);
			if (sc_op_probe_host_ranges(op, what, &lost) != 0) {
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
			sc_op_notify(eng, op);
	} else {
		char text[SC_ERR_MSG_MAX];
		snprintf(text, sizeof(text), "peer %s: %s", op->peer,
			 msg && msg[0] ? msg : sc_status_text(status));
		if (op->any_uses)
			use_failed_locked(eng, op, xfer_id, use_trace, text);
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
			char use_trace[SC_TRACE_ID_LEN];
			memcpy(use_trace, use->trace_id, sizeof(use_trace));
			drop_use(op, use);
			use_failed_locked(eng, op, xfer_id, use_trace, text);
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
