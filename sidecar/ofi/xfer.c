/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/xfer.c: the libfabric data path's active side. A transfer is one task of the shared
 * transfer runner (backend/xfer_runner.h), run start to end by one worker thread:
 *
 *   1. setup: an authenticated control connection to the issuer (peer/pool.h), OPEN flagged "via
 *      libfabric" (the passive side checks token, uses, deadline and audience and reports backend
 *      LIBFABRIC), and the issuer's address in each rail's address vector (ofi/rail.c);
 *   2. moving: the segments are cut (the runner's cursor) into messages of up to iov_limit
 *      pieces and min(max_msg_size, 1 MiB) bytes, each an fi_readmsg (SC_OP_READ) or
 *      fi_writemsg with one local iov and one remote rma_iov per piece, posted in batches with
 *      FI_MORE on all but the batch's last; up to OFI_WINDOW messages in flight. Large transfers
 *      are striped: message k goes out on rail k mod n (rail i to the issuer's rail i), each
 *      with that rail's key. Completions come back on each rail's progress thread
 *      (ofi_xfer_completed); error entries end the transfer with the provider's reason
 *      (fi_cq_strerror);
 *   3. finish: once nothing is in flight, DONE with the verdict on the control connection
 *      (sc_peer_tell_verdict), then on_complete, exactly once.
 *
 * Cancel, the deadline and a failure stop the posting; the transfer then waits for what is in
 * flight (region memory must not be released while the provider may still touch it). A peer that
 * does not answer (SIGSTOPped) holds its messages: after OFI_DRAIN_MS its address-vector entry is
 * removed, which makes the provider fail them, and the transfer ends.
 *
 * Threads: submit/cancel on engine threads (queue, flag, wake); OFI_WORKERS runner workers;
 * completions on the rails' progress threads. ob->mu guards every transfer's counters.
 */
#include "ofi/internal.h"

#include "base/log.h"
#include "base/timer.h"
#include "peer/pool.h"
#include "peer/proto.h"
#include "peer/request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OFI_WORKERS 8
#define OFI_WINDOW 64
#define OFI_CHUNK (1u << 20)
#define OFI_MAX_IOV 16
#define OFI_DRAIN_MS 1000

struct ofi_xfer;

/* One posted message; its fi_context2 is the op_context the CQ hands back. */
struct ofi_req {
	struct fi_context2 ctx; /* first: FI_CONTEXT / FI_CONTEXT2 providers write into it */
	struct ofi_xfer *xf;
	uint64_t bytes;
	size_t rail;
	bool busy;
	/* Its pieces, to post again on another rail when its rail fails. */
	struct sc_xr_piece pieces[OFI_MAX_IOV];
	size_t n_pieces;
	bool gone;  /* abandoned on a stalled rail: never reused by this transfer */
	bool came_late; /* gone, and its completion came after all (rail.abandoned counted down) */
	bool fence; /* the last WRITE again, with FI_DELIVERY_COMPLETE: moves no new bytes */
};

struct ofi_xfer {
	struct sc_xr_xfer xr;
	struct sc_xr_task run;
	struct ofi_backend *ob;
	struct sc_xr_cursor cur;
	struct sc_peer_conn *conn;
	int endpoint;
	bool opened;
	size_t n_rails; /* rails this transfer uses: 0..n_rails-1, but those marked dead at setup */
	size_t first_rail; /* the first live one at setup (a one-rail transfer's) */
	fi_addr_t fa[OFI_MAX_RAILS];
	bool have_peer[OFI_MAX_RAILS];
	bool rail_used[OFI_MAX_RAILS]; /* carried this transfer (its peer's address was found) */
	uint64_t bytes_done;
	size_t inflight;
	size_t next_rail;
	/* One-rail WRITEs on a rail that keeps write order: every message but a final fence goes
	 * with FI_TRANSMIT_COMPLETE; the fence (the last piece written again, with
	 * FI_DELIVERY_COMPLETE) lands after all of them, so its completion says they all landed. */
	bool use_fence, fenced;
	struct sc_xr_piece last_piece;
	bool leaked; /* messages given up on may still complete: kept until the rails close */
	struct ofi_xfer *kept_next; /* on ob->kept */
	/* Completion handlers still reporting bytes to the operation (x->on_progress) after they
	 * let go of ob->mu: the transfer must not end (nor x be freed) until they return. */
	unsigned in_cb;
	size_t rail_inflight[OFI_MAX_RAILS];
	uint64_t rail_last_ms[OFI_MAX_RAILS]; /* a completion, or the first post after none */
	bool rail_dead[OFI_MAX_RAILS];	      /* failed or stalled: nothing more goes on it */
	uint64_t rail_dead_ms[OFI_MAX_RAILS];
	size_t n_dead;
	/* Pieces of failed messages, posted again (one message each) on a live rail. */
	struct sc_xr_piece *redo;
	size_t n_redo, cap_redo;
	pthread_cond_t cv;
	struct ofi_req reqs[OFI_WINDOW];
};

static void wait_us(struct ofi_xfer *xf, unsigned us)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += (long)us * 1000L;
	while (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(&xf->cv, &xf->ob->mu, &ts);
}

/* ---- completions (progress threads) ---------------------------------------------------------- */

static enum sc_status map_err(int e)
{
	switch (e) {
	case FI_ECANCELED:
		return SC_CANCELLED;
	case FI_EACCES:
	case FI_EPERM:
	case FI_EKEYREJECTED:
	case FI_EINVAL:
	case FI_EFAULT:
	case FI_ENOKEY:
	case FI_EBADF:
		return SC_FAILED_PRECONDITION;
	case FI_ETIMEDOUT:
	case FI_ECONNRESET:
	case FI_ECONNREFUSED:
	case FI_ECONNABORTED:
	case FI_EHOSTUNREACH:
	case FI_ENOTCONN:
	case FI_ESHUTDOWN:
	case FI_EIO:
	case FI_ENETDOWN:
	case FI_ENETUNREACH:
	case FI_EAGAIN:
		return SC_UNAVAILABLE;
	default:
		return SC_INTERNAL;
	}
}

/* Rail r failed for this transfer: nothing more goes on it; the others carry the rest. Under
 * ob->mu. */
static void rail_dead_locked(struct ofi_xfer *xf, size_t r, const char *why)
{
	struct ofi_backend *ob = xf->ob;
	if (xf->rail_dead[r])
		return;
	xf->rail_dead[r] = true;
	xf->rail_dead_ms[r] = sc_clock_mono_ms();
	xf->n_dead++;
	atomic_fetch_add(&ob->base.rails[r].failovers, 1);
	atomic_store(&ob->rails[r].cooling, true);
	sc_rail_set_state(&ob->base, r, SC_RAIL_COOLING, "rail %zu to peer %s failed: %s", r,
			  xf->xr.x->meta->issuer, why);
	SC_WARN("libfabric",
		"transfer %016" PRIx64 ": rail %zu (%s) to %s failed (%s); %zu other rail(s) carry "
		"the rest",
		xf->xr.x->xfer_id, r, ob->rails[r].info->domain_attr->name, xf->xr.x->meta->issuer,
		why, xf->n_rails - xf->n_dead);
}

/* Queue a failed message's pieces to be posted again. Under ob->mu. */
static bool redo_locked(struct ofi_xfer *xf, const struct ofi_req *rq)
{
	if (xf->n_redo + rq->n_pieces > xf->cap_redo) {
		size_t cap = (xf->cap_redo ? 2 * xf->cap_redo : 64) + rq->n_pieces;
		struct sc_xr_piece *n = realloc(xf->redo, cap * sizeof(*n));
		if (!n)
			return false;
		xf->redo = n;
		xf->cap_redo = cap;
	}
	memcpy(xf->redo + xf->n_redo, rq->pieces, rq->n_pieces * sizeof(*rq->pieces));
	xf->n_redo += rq->n_pieces;
	return true;
}

void ofi_xfer_completed(struct ofi_rail *rl, void *op_context, const struct fi_cq_err_entry *e)
{
	struct ofi_req *rq = op_context;
	if (!rq)
		return;
	struct ofi_xfer *xf = rq->xf;
	struct ofi_backend *ob = xf->ob;
	uint64_t moved = 0;
	pthread_mutex_lock(&ob->mu);
	if (!rq->busy) { /* already given up on (a stalled rail): its pieces went elsewhere, or
			  * its transfer ended and is kept (ob->kept, xr.x NULL) */
		if (rq->gone && !rq->came_late) {
			rq->came_late = true;
			atomic_fetch_sub(&ob->rails[rq->rail].abandoned, 1);
		}
		pthread_mutex_unlock(&ob->mu);
		return;
	}
	struct sc_xfer *x = xf->xr.x;
	xf->rail_last_ms[rq->rail] = sc_clock_mono_ms();
	if (!e) {
		moved = rq->fence ? 0 : rq->bytes;
		xf->bytes_done += moved;
	} else {
		char txt[256];
		ofi_cq_errtext(rl, e, txt, sizeof(txt));
		enum sc_status st = map_err(e->err);
		/* FI_ECANCELED that nobody here asked for: the provider dropped the message with
		 * its connection (tcp;ofi_rxm when the peer dies): a path failure. */
		if (st == SC_CANCELLED && !atomic_load(&x->cancel_requested))
			st = SC_UNAVAILABLE;
		bool access = st == SC_FAILED_PRECONDITION;
		atomic_fetch_add(&ob->base.rails[rl->index].errors, 1);
		/* A path failure with another rail left: post the pieces again there. */
		if (st == SC_UNAVAILABLE && !rq->fence && !sc_xr_should_stop(&xf->xr) &&
		    (xf->rail_dead[rq->rail] || xf->n_dead + 1 < xf->n_rails) &&
		    redo_locked(xf, rq)) {
			char why[300];
			snprintf(why, sizeof(why), "%s: %s", ofi_fn.strerror(e->err), txt);
			rail_dead_locked(xf, rq->rail, why);
		} else {
			sc_xr_fail_locked(
			    &xf->xr, false, st,
			    "libfabric RDMA %s of %" PRIu64 " bytes with peer %s on rail %zu "
			    "(%s, %s) failed: %s%s: %s (provider error %d)",
			    x->kind == SC_OP_READ ? "READ" : "WRITE", rq->bytes, x->meta->issuer,
			    rl->index, ob->provider, rl->info->domain_attr->name,
			    ofi_fn.strerror(e->err),
			    access ? " (remote access refused: the key was revoked or the range "
				     "is outside the grant)"
				   : "",
			    txt, e->prov_errno);
		}
	}
	rq->busy = false;
	xf->inflight--;
	xf->rail_inflight[rq->rail]--;
	if (moved)
		xf->in_cb++; /* x stays alive until the report below is done (run_task waits) */
	pthread_cond_broadcast(&xf->cv);
	pthread_mutex_unlock(&ob->mu);
	if (!moved)
		return;
	if (atomic_load(&rl->cooling) && atomic_exchange(&rl->cooling, false))
		sc_rail_set_state(&ob->base, rl->index, SC_RAIL_UP,
				  "libfabric provider %s, domain %s: carrying bytes again",
				  ob->provider, rl->info->domain_attr->name);
	sc_rail_add_bytes(&ob->base, x, rl->index, moved);
	x->on_progress(x, moved);
	pthread_mutex_lock(&ob->mu);
	xf->in_cb--;
	pthread_cond_broadcast(&xf->cv);
	pthread_mutex_unlock(&ob->mu);
}

/* ---- setup ------------------------------------------------------------------------------------
 */

/* Whether the transfer's local memory is one GPU's (or, in tests, host memory named near some
 * rails by SC_TEST_OFI_HOST_RAILS) that the node's topology puts nearer some rails: allow[] says
 * which, as for ibverbs (backend/backend.h, sc_rail_choice). */
static bool near_rails(struct ofi_xfer *xf, bool *allow)
{
	const struct sc_xfer *x = xf->xr.x;
	if (x->n_segs == 0)
		return false;
	int gpu = x->segs[0].local_gpu;
	for (size_t i = 1; i < x->n_segs; i++)
		if (x->segs[i].local_gpu != gpu)
			return false; /* memory of several devices: any rail */
	return sc_rail_choice(&xf->ob->base, gpu, "SC_TEST_OFI_HOST_RAILS", allow);
}

static int setup(struct ofi_xfer *xf, struct sc_err *err)
{
	struct ofi_backend *ob = xf->ob;
	struct sc_xfer *x = xf->xr.x;
	const struct sc_metadata *md = x->meta;
	/* Rails: rail i to the issuer's rail i; large transfers use every common one. */
	size_t common = ob->n_rails < md->ofi.n_addrs ? ob->n_rails : md->ofi.n_addrs;
	bool stripe = ob->stripe_min && x->total >= ob->stripe_min;
	xf->n_rails = stripe ? common : 1;
	/* Local memory the topology puts nearer some rails (GPU memory): only those, a small
	 * transfer on the first of them; the others are out of this transfer from the start. */
	bool allow[SC_MAX_RAILS];
	size_t near = 0;
	if (common > 1 && near_rails(xf, allow)) {
		for (size_t i = 0; i < common; i++)
			near += allow[i];
		if (near) {
			xf->n_rails = common;
			size_t kept = 0;
			for (size_t i = 0; i < common; i++) {
				bool use = allow[i] && (stripe || kept == 0);
				kept += use;
				if (!use) {
					xf->rail_dead[i] = true;
					xf->n_dead++;
				}
			}
		}
	}
	for (xf->first_rail = 0; xf->rail_dead[xf->first_rail];)
		xf->first_rail++;
	/* Several rails: every WRITE delivery-complete, so a cut rail's messages can go again on
	 * another without losing any that only left the socket. */
	xf->use_fence =
	    x->kind != SC_OP_READ && xf->n_rails - xf->n_dead == 1 && ob->rails[xf->first_rail].waw;
	for (size_t i = 0; i < xf->n_rails; i++) {
		if (xf->rail_dead[i])
			continue;
		if (ofi_peer_get(&ob->rails[i], md->issuer, md->ofi.addr[i], md->ofi.addr_len[i],
				 &xf->fa[i], err) != 0)
			return -1;
		xf->have_peer[i] = xf->rail_used[i] = true;
		atomic_fetch_add(&ob->base.rails[i].operations, 1);
	}
	struct sc_peer_conn *c = sc_peer_pool_get_issuer(ob->pool, md, x->deadline_mono_ms,
							 &x->cancel_requested, &xf->endpoint, err);
	if (!c)
		return -1;
	/* The OPEN carries the transfer's trace id where the issuer reads it. */
	if (sc_peer_open_xfer(c, x, SC_BACKEND_LIBFABRIC, err) != 0) {
		sc_peer_pool_put(ob->pool, c, sc_peer_conn_usable(c));
		return -1;
	}
	xf->conn = c;
	xf->opened = true;
	return 0;
}

/* ---- moving -----------------------------------------------------------------------------------
 */

/* The key of the grant holding remote address va, and the RMA address to use on rail r. */
static int remote_of(const struct sc_metadata *md, size_t r, uint64_t va, uint64_t len,
		     uint64_t *addr, uint64_t *key)
{
	size_t lo = 0, hi = md->ofi.n_keys;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (md->ofi.keys[mid].base <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	const struct sc_ofi_key *k = &md->ofi.keys[lo - 1];
	if (va - k->base > k->length || len > k->length - (va - k->base))
		return -1;
	*key = r == 0 ? k->key : md->ofi.rail_keys[(r - 1) * md->ofi.n_keys + (lo - 1)];
	*addr = md->ofi.virt_addr ? va : va - k->base;
	return 0;
}

/* Whether GPU and host pieces may share a message: never (one iface per message). */
static bool joins(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
		  const struct sc_xfer_seg *next)
{
	(void)prev;
	return first->local_gpu == next->local_gpu;
}

/* Posts one message of pieces p[0..n) on its rail. Under ob->mu, which it drops around the
 * post. 0, or -1 with the transfer failed. */
static int post_one(struct ofi_xfer *xf, struct ofi_req *rq, const struct sc_xr_piece *p, size_t n,
		    bool more)
{
	struct ofi_backend *ob = xf->ob;
	struct sc_xfer *x = xf->xr.x;
	struct ofi_rail *rl = &ob->rails[rq->rail];
	struct iovec iov[OFI_MAX_IOV];
	void *desc[OFI_MAX_IOV];
	struct fi_rma_iov rma[OFI_MAX_IOV];
	uint64_t bytes = 0;
	for (size_t i = 0; i < n; i++) {
		const struct sc_xfer_seg *s = p[i].seg;
		iov[i].iov_base = s->local + p[i].off;
		iov[i].iov_len = p[i].len;
		desc[i] = ofi_region_desc(s->local_mr, rq->rail);
		uint64_t va = s->remote_addr + p[i].off;
		if (remote_of(x->meta, rq->rail, va, p[i].len, &rma[i].addr, &rma[i].key) != 0) {
			sc_xr_fail_locked(&xf->xr, false, SC_INVALID_ARGUMENT,
					  "libfabric: remote descriptor %u (address 0x%" PRIx64
					  ") is outside every key the metadata carries",
					  s->remote_desc, va);
			return -1;
		}
		rma[i].len = p[i].len;
		bytes += p[i].len;
	}
	struct fi_msg_rma msg = {.msg_iov = iov,
				 .desc = desc,
				 .iov_count = n,
				 .addr = xf->fa[rq->rail],
				 .rma_iov = rma,
				 .rma_iov_count = n,
				 .context = &rq->ctx};
	rq->bytes = bytes;
	rq->busy = true;
	memcpy(rq->pieces, p, n * sizeof(*p));
	rq->n_pieces = n;
	if (xf->rail_inflight[rq->rail] == 0)
		xf->rail_last_ms[rq->rail] = sc_clock_mono_ms();
	xf->inflight++;
	xf->rail_inflight[rq->rail]++;
	/* A WRITE completes only once its bytes are in the peer's memory (FI_DELIVERY_COMPLETE):
	 * the DONE that follows must not overtake them (tcp;ofi_rxm otherwise completes a write
	 * when it leaves the socket). */
	uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
	if (x->kind != SC_OP_READ)
		flags |= xf->use_fence && !rq->fence ? FI_TRANSMIT_COMPLETE : FI_DELIVERY_COMPLETE;
	for (;;) {
		pthread_mutex_unlock(&ob->mu);
		pthread_rwlock_rdlock(&rl->out_lock);
		ssize_t rc = x->kind == SC_OP_READ ? fi_readmsg(rl->ep_out, &msg, flags)
						   : fi_writemsg(rl->ep_out, &msg, flags);
		pthread_rwlock_unlock(&rl->out_lock);
		pthread_mutex_lock(&ob->mu);
		if (rc == 0) {
			if (x->kind != SC_OP_READ && !rq->fence)
				xf->last_piece = p[n - 1];
			return 0;
		}
		if (rc == -FI_EAGAIN && !sc_xr_should_stop(&xf->xr)) {
			/* Queue full: the progress thread frees room (and wakes us). */
			atomic_fetch_add(&ob->eagain, 1);
			wait_us(xf, 50);
			continue;
		}
		rq->busy = false;
		xf->inflight--;
		xf->rail_inflight[rq->rail]--;
		if (rc != -FI_EAGAIN)
			sc_xr_fail_locked(&xf->xr, false, map_err((int)-rc),
					  "libfabric: %s on rail %zu (%s) failed: %s",
					  x->kind == SC_OP_READ ? "fi_readmsg" : "fi_writemsg",
					  rq->rail, rl->info->domain_attr->name,
					  ofi_fn.strerror((int)-rc));
		return -1;
	}
}

static struct ofi_req *free_req(struct ofi_xfer *xf)
{
	for (size_t i = 0; i < OFI_WINDOW; i++)
		if (!xf->reqs[i].busy && !xf->reqs[i].gone)
			return &xf->reqs[i];
	return NULL;
}

/* The live rail with the most room (the per-rail window is OFI_WINDOW / rails, so a faster
 * rail, completing sooner, carries more); OFI_MAX_RAILS when none has room. */
static size_t pick_rail(const struct ofi_xfer *xf)
{
	size_t live = xf->n_rails - xf->n_dead, per = live ? OFI_WINDOW / live : 0,
	       best = OFI_MAX_RAILS;
	for (size_t r = 0; r < xf->n_rails; r++) {
		size_t k = (xf->next_rail + r) % xf->n_rails;
		if (xf->rail_dead[k] || xf->rail_inflight[k] >= per)
			continue;
		if (best == OFI_MAX_RAILS || xf->rail_inflight[k] < xf->rail_inflight[best])
			best = k;
	}
	return best;
}

/*
 * A rail of this transfer none of whose messages completed for stall_ms (a cut link) is given up
 * on: its messages' pieces go again on the transfer's other rails, and the peer's address on that
 * rail is removed (fi_av_remove), so the provider drops the connection. Their slots are never
 * reused and the transfer's records are kept for ever, since their completions may still come.
 *
 * What this cannot promise on tcp;ofi_rxm: a READ message given up on may still land in local
 * memory if the link comes back within the kernel's TCP retransmission time and the provider had
 * not dropped it. Closing the initiator endpoint would rule that out, but libfabric 1.17's
 * ofi_rxm crashes in fi_close of an endpoint with RMA outstanding (seen here), so it is not done.
 * (WRITE messages are safe: the passive side closes its keys at DONE.) Under ob->mu.
 */
static void check_stalls(struct ofi_xfer *xf, uint64_t now)
{
	struct ofi_backend *ob = xf->ob;
	struct sc_xfer *x = xf->xr.x;
	if (!ob->stall_ms)
		return;
	for (size_t r = 0; r < xf->n_rails; r++) {
		if (xf->rail_dead[r] || xf->rail_inflight[r] == 0 ||
		    now - xf->rail_last_ms[r] < ob->stall_ms)
			continue;
		char why[96];
		snprintf(why, sizeof(why), "no completion for %" PRIu64 " ms",
			 now - xf->rail_last_ms[r]);
		if (xf->n_dead + 1 >= xf->n_rails) {
			/* The last rail: the transfer ends UNAVAILABLE, saying so, rather than
			 * wait for its deadline. Its messages are failed by dropping the peer's
			 * address (move's drain) and awaited; when every one is accounted for, tcp
			 * may take the transfer over (run_task, the engine's fall-back), since none
			 * can land after tcp moved the bytes. */
			if (!sc_xr_should_stop(&xf->xr)) {
				atomic_store(&ob->rails[r].cooling, true);
				sc_rail_set_state(&ob->base, r, SC_RAIL_COOLING,
						  "rail %zu to peer %s failed: %s", r,
						  x->meta->issuer, why);
				sc_xr_fail_locked(
				    &xf->xr, false, SC_UNAVAILABLE,
				    "libfabric rail %zu (%s, %s) to peer %s stalled: %s", r,
				    ob->provider, ob->rails[r].info->domain_attr->name,
				    x->meta->issuer, why);
			}
			continue;
		}
		for (size_t i = 0; i < OFI_WINDOW; i++) {
			struct ofi_req *rq = &xf->reqs[i];
			if (!rq->busy || rq->rail != r)
				continue;
			if (!redo_locked(xf, rq))
				sc_xr_fail_locked(&xf->xr, false, SC_RESOURCE_EXHAUSTED,
						  "out of memory moving rail %zu's messages", r);
			rq->busy = false;
			rq->gone = true;
			atomic_fetch_add(&ob->rails[r].abandoned, 1);
			xf->inflight--;
			xf->rail_inflight[r]--;
			xf->leaked = true;
		}
		rail_dead_locked(xf, r, why);
		if (xf->have_peer[r]) {
			fi_addr_t fa = xf->fa[r];
			xf->have_peer[r] = false;
			pthread_rwlock_rdlock(&ob->rails[r].out_lock);
			fi_av_remove(ob->rails[r].av_out, &fa, 1, 0);
			pthread_rwlock_unlock(&ob->rails[r].out_lock);
			ofi_peer_forget(&ob->rails[r], xf->xr.x->meta->issuer);
		}
	}
}

/* Moves the bytes; returns once nothing is in flight. Under ob->mu. */
static void move(struct ofi_xfer *xf)
{
	struct ofi_backend *ob = xf->ob;
	struct sc_xfer *x = xf->xr.x;
	uint64_t stopped_at = 0;
	unsigned drains = 0;
	for (;;) {
		uint64_t now = sc_clock_mono_ms();
		if (sc_xr_deadline_passed(x, now) && !sc_xr_should_stop(&xf->xr))
			sc_xr_fail_locked(&xf->xr, false, SC_DEADLINE_EXCEEDED,
					  "the transfer's deadline passed with %" PRIu64
					  " of %" PRIu64 " bytes moved over libfabric",
					  xf->bytes_done, x->total);
		if (!sc_xr_should_stop(&xf->xr))
			check_stalls(xf, now);
		bool stop = sc_xr_should_stop(&xf->xr) || ob->xr.stopping;
		if (stop && !stopped_at)
			stopped_at = now;
		if (!stop) {
			/* One batch: as many messages as the rails' windows have room for, FI_MORE
			 * on all but the last of each rail's. */
			struct sc_xr_piece batch[OFI_WINDOW][OFI_MAX_IOV];
			size_t counts[OFI_WINDOW];
			size_t rails[OFI_WINDOW];
			size_t nb = 0;
			size_t planned[OFI_MAX_RAILS] = {0};
			while (nb < OFI_WINDOW) {
				/* Count what this batch adds, so pick_rail sees it. */
				for (size_t r = 0; r < xf->n_rails; r++)
					xf->rail_inflight[r] += planned[r];
				size_t r = pick_rail(xf);
				for (size_t k = 0; k < xf->n_rails; k++)
					xf->rail_inflight[k] -= planned[k];
				if (r == OFI_MAX_RAILS)
					break;
				struct ofi_rail *rl = &ob->rails[r];
				size_t k = 0;
				if (xf->n_redo) {
					batch[nb][0] = xf->redo[--xf->n_redo];
					k = 1;
				} else {
					uint64_t maxb =
					    rl->max_msg < OFI_CHUNK ? rl->max_msg : OFI_CHUNK;
					k = sc_xr_cursor_take(&xf->cur, x, maxb, rl->iov_limit,
							      joins, batch[nb]);
				}
				if (k == 0)
					break;
				counts[nb] = k;
				rails[nb] = r;
				planned[r]++;
				xf->next_rail++;
				nb++;
			}
			for (size_t i = 0; i < nb; i++) {
				struct ofi_req *rq = free_req(xf);
				if (!rq) { /* slots held by abandoned messages: post later */
					for (size_t j = i; j < nb; j++)
						for (size_t q = 0; q < counts[j]; q++) {
							struct ofi_req tmp = {.n_pieces = 1};
							tmp.pieces[0] = batch[j][q];
							redo_locked(xf, &tmp);
						}
					break;
				}
				rq->xf = xf;
				rq->rail = rails[i];
				rq->fence = false;
				bool more = false;
				for (size_t j = i + 1; j < nb && !more; j++)
					more = rails[j] == rails[i];
				if (post_one(xf, rq, batch[i], counts[i], more) != 0)
					break;
			}
		}
		bool all_posted = sc_xr_cursor_done(&xf->cur, x) && xf->n_redo == 0;
		if (xf->inflight == 0 && all_posted && !stop && xf->use_fence && !xf->fenced &&
		    x->total > 0) {
			xf->fenced = true;
			struct ofi_req *rq = free_req(xf);
			if (rq) {
				rq->xf = xf;
				rq->rail = xf->first_rail;
				rq->fence = true;
				post_one(xf, rq, &xf->last_piece, 1, false);
				continue;
			}
		}
		if (xf->inflight == 0 && (stop || all_posted))
			return;
		if (stop && now - stopped_at > OFI_DRAIN_MS) {
			/* A peer that does not answer holds our messages: drop its address so the
			 * provider fails them (tcp;ofi_rxm closes the connection). */
			for (size_t i = 0; i < xf->n_rails; i++) {
				if (!xf->have_peer[i] || xf->rail_inflight[i] == 0)
					continue;
				fi_addr_t fa = xf->fa[i];
				xf->have_peer[i] = false;
				SC_WARN(
				    "libfabric",
				    "transfer %016" PRIx64 ": %zu message(s) to %s still out "
				    "%d ms after it stopped: removing the peer's address on rail "
				    "%zu",
				    x->xfer_id, xf->rail_inflight[i], x->meta->issuer, OFI_DRAIN_MS,
				    i);
				pthread_rwlock_rdlock(&ob->rails[i].out_lock);
				fi_av_remove(ob->rails[i].av_out, &fa, 1, 0);
				pthread_rwlock_unlock(&ob->rails[i].out_lock);
				ofi_peer_forget(&ob->rails[i], x->meta->issuer);
			}
			if (++drains >= 3) {
				/* Still held: give up on them, and keep this transfer's records for
				 * ever (their completions may come). */
				SC_ERROR("libfabric",
					 "transfer %016" PRIx64
					 ": %zu message(s) to %s never completed; "
					 "ending it without them",
					 x->xfer_id, xf->inflight, x->meta->issuer);
				for (size_t i = 0; i < OFI_WINDOW; i++)
					if (xf->reqs[i].busy) {
						xf->reqs[i].busy = false;
						xf->reqs[i].gone = true;
						atomic_fetch_add(
						    &ob->rails[xf->reqs[i].rail].abandoned, 1);
						xf->rail_inflight[xf->reqs[i].rail]--;
					}
				xf->inflight = 0;
				xf->leaked = true;
			}
			stopped_at = now; /* again after another OFI_DRAIN_MS */
		}
		wait_us(xf, 20000);
	}
}

/* ---- the task ---------------------------------------------------------------------------------
 */

static void free_xfer(struct ofi_xfer *xf)
{
	pthread_cond_destroy(&xf->cv);
	free(xf->redo);
	free(xf);
}

static void run_task(struct sc_xr_task *t)
{
	struct ofi_xfer *xf = container_of(t, struct ofi_xfer, run);
	struct ofi_backend *ob = xf->ob;
	struct sc_xfer *x = xf->xr.x;
	struct sc_err err;
	sc_err_clear(&err);
	int rc = atomic_load(&x->cancel_requested) ? -1 : setup(xf, &err);
	pthread_mutex_lock(&ob->mu);
	if (rc != 0) {
		if (err.code != SC_OK && !atomic_load(&x->cancel_requested))
			sc_xr_fail_locked(&xf->xr, false, err.code, "%s", err.msg);
		sc_xr_stop_locked(&xf->xr);
	} else {
		move(xf);
	}
	/* The last completion's handler may still be reporting its bytes (x->on_progress): the
	 * operation's byte count must include them, and x must outlive them. It takes no lock
	 * that is held while waiting for this worker, so the wait is short. */
	while (xf->in_cb)
		wait_us(xf, 1000);
	uint64_t moved = xf->bytes_done;
	bool lost_peer = xf->inflight > 0 || xf->leaked;
	pthread_mutex_unlock(&ob->mu);
	char msg[SC_ERR_MSG_MAX];
	enum sc_status status = sc_xr_verdict(&ob->xr, &xf->xr, moved, true, msg, sizeof(msg));

	struct sc_peer_conn *c = xf->conn;
	xf->conn = NULL;
	/* The path failed with every message accounted for (completed or failed: none can land
	 * later) and the control connection still answers: tcp goes on with it (SC_ABORTED). */
	bool to_tcp = status == SC_UNAVAILABLE && !lost_peer &&
		      sc_peer_take_back(c, x, xf->opened, msg, "libfabric");
	if (to_tcp) {
		status = SC_ABORTED;
		for (size_t i = 0; i < xf->n_rails; i++)
			if (xf->rail_used[i])
				atomic_fetch_add(&ob->base.rails[i].failovers, 1);
	} else if (xf->opened) {
		sc_peer_tell_verdict(ob->pool, &c, x->meta->endpoints[xf->endpoint], x->meta->token,
				     x->xfer_id, x->deadline_mono_ms, &status, msg, sizeof(msg),
				     "libfabric");
	}
	if (c)
		sc_peer_pool_put(ob->pool, c, sc_peer_conn_usable(c));
	for (size_t i = 0; i < xf->n_rails; i++)
		if (xf->have_peer[i]) {
			ofi_peer_put(&ob->rails[i], x->meta->issuer);
			/* A peer whose path failed gets a fresh address-vector entry next time. */
			if (status == SC_UNAVAILABLE || status == SC_DEADLINE_EXCEEDED)
				ofi_peer_evict(&ob->rails[i], x->meta->issuer);
		}
	if (status != SC_OK && status != SC_CANCELLED)
		SC_INFO("libfabric", "transfer %016" PRIx64 " with %s ended %s: %s", x->xfer_id,
			x->meta->issuer, sc_status_name(status), msg);
	pthread_mutex_lock(&ob->mu);
	sc_xr_retire_locked(&ob->xr, &xf->xr);
	pthread_mutex_unlock(&ob->mu);
	uint64_t xfer_id = x->xfer_id;
	sc_xr_complete(x, status, msg);
	if (lost_peer) {
		/* Messages the provider never completed: their contexts must outlive its endpoints
		 * (a late completion still finds its request); freed when the rails close. */
		pthread_mutex_lock(&ob->mu);
		xf->xr.x = NULL; /* x belongs to the operation, which may go now */
		xf->kept_next = ob->kept;
		ob->kept = xf;
		size_t n = ++ob->n_kept;
		pthread_mutex_unlock(&ob->mu);
		SC_WARN("libfabric",
			"transfer %016" PRIx64 ": messages never completed; keeping its records "
			"(%zu KiB) until the backend stops (%zu transfer(s) kept)",
			xfer_id, sizeof(*xf) >> 10, n);
	} else {
		free_xfer(xf);
	}
}

void ofi_xfer_free_kept(struct ofi_backend *ob)
{
	pthread_mutex_lock(&ob->mu);
	struct ofi_xfer *xf = ob->kept;
	ob->kept = NULL;
	ob->n_kept = 0;
	pthread_mutex_unlock(&ob->mu);
	while (xf) {
		struct ofi_xfer *next = xf->kept_next;
		free_xfer(xf);
		xf = next;
	}
}

int ofi_xfer_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err)
{
	struct ofi_backend *ob = to_ofi(b);
	struct ofi_xfer *xf = calloc(1, sizeof(*xf));
	if (!xf)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	xf->ob = ob;
	xf->run.run = run_task;
	xf->endpoint = 0;
	pthread_cond_init(&xf->cv, NULL);
	{
		/* CLOCK_MONOTONIC for wait_ms. */
		pthread_condattr_t a;
		pthread_condattr_init(&a);
		pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
		pthread_cond_destroy(&xf->cv);
		pthread_cond_init(&xf->cv, &a);
		pthread_condattr_destroy(&a);
	}
	x->priv = xf;
	if (sc_xr_admit(&ob->xr, &xf->xr, x, &xf->run, err) != 0) {
		x->priv = NULL;
		pthread_cond_destroy(&xf->cv);
		free(xf);
		return -1;
	}
	return 0;
}

void ofi_xfer_cancel(struct sc_backend *b, struct sc_xfer *x)
{
	struct ofi_backend *ob = to_ofi(b);
	atomic_store(&x->cancel_requested, true);
	pthread_mutex_lock(&ob->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &ob->xr.live) {
		struct sc_xr_xfer *t = sc_list_entry(pos, struct sc_xr_xfer, node);
		if (t->x == x) {
			struct ofi_xfer *xf = container_of(t, struct ofi_xfer, xr);
			sc_xr_stop_locked(t);
			pthread_cond_broadcast(&xf->cv);
		}
	}
	pthread_mutex_unlock(&ob->mu);
}

int ofi_xfer_start(struct ofi_backend *ob, struct sc_err *err)
{
	return sc_xr_start(&ob->xr, OFI_WORKERS, err);
}

static void stop_one(struct sc_xr_xfer *t)
{
	struct ofi_xfer *xf = container_of(t, struct ofi_xfer, xr);
	pthread_cond_broadcast(&xf->cv);
}

void ofi_xfer_stop(struct ofi_backend *ob)
{
	pthread_mutex_lock(&ob->mu);
	bool workers = ob->xr.n_workers > 0;
	pthread_mutex_unlock(&ob->mu);
	if (!workers)
		return;
	sc_xr_begin_stop(&ob->xr, stop_one);
	pthread_mutex_lock(&ob->mu);
	if (!sc_xr_wait_idle_locked(&ob->xr, sc_clock_mono_ms() + 10000))
		SC_ERROR("libfabric", "%zu transfer(s) still running 10 s after stop",
			 ob->xr.n_live);
	pthread_mutex_unlock(&ob->mu);
	sc_xr_stop_workers(&ob->xr);
}
