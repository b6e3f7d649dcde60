/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/retry.c: moving a transfer to a fresh QP when the QP it shares with other transfers failed
 * for a reason that is not its own (issue 12): it waits until its posted work requests have all
 * completed or been flushed, gets a fresh QP to the same peer (ib_qp_get) and posts again from
 * its first byte not known to be complete (why that is safe: below). A transfer moves at most
 * IB_XFER_MOVES times; the transfer whose work request failed ends ERRORED with its own message
 * as before.
 *
 * Threads: the *_locked calls run on the completion thread under ib->mu; ib_retry_fresh_qp runs
 * on a worker thread (it may connect: socket I/O), without ib->mu. Owns nothing: the QP
 * references it takes and drops are the transfer's (see ib/internal.h, Lifetime).
 */
#include "ib/internal.h"

#include "base/log.h"
#include "base/timer.h"

#include <inttypes.h>

/*
 * An RC QP goes to the error state on the first failed work request, whoever posted it (a peer
 * revoking one operation's rkey, say), and every other work request on it then comes back
 * flushed (IBV_WC_WR_FLUSH_ERR). Those transfers did nothing wrong: each waits until its posted
 * work requests have all completed or been flushed (the memory they touch is then quiet), gets a
 * fresh QP to the same peer (ib_qp_get: the failed one has left the cache, so the first mover
 * connects a new one and the others share it), and posts again from its first byte not known to
 * be complete. Completions of one send queue come back in posting order, so a transfer's
 * successful ones form a prefix of its chunks, and bytes_acked says where to go on; a flushed
 * chunk may or may not have landed, and moving it again is harmless (RDMA READ/WRITE of the same
 * bytes to the same place).
 */

int ib_retry_begin_locked(struct ib_xfer *xf)
{
	if (ib_xfer_stopped(xf))
		return 0; /* cancelled, expired or failed for its own reason: that stands */
	if (xf->moving || xf->bytes_acked >= xf->xr.x->total)
		return 1; /* waiting already, or nothing left to move */
	if (xf->moves >= IB_XFER_MOVES)
		return -1;
	xf->moving = true;
	xf->moving_mono_ms = sc_clock_mono_ms();
	/* Work requests of a QP that failed without reaching the error state (a post failure)
	 * might stay out: flush them, the transfer waits for all of its own. */
	if (!xf->qp->flushing)
		ib_qp_flush(xf->qp);
	return 1;
}

int ib_retry_fresh_qp(struct ib_xfer *xf, struct ib_qp **out, struct sc_err *err)
{
	struct sc_xfer *x = xf->xr.x;
	if (ib_qp_get(xf->ib, x->meta, x->deadline_mono_ms, &x->cancel_requested, out, NULL, NULL,
		      err) != 0)
		return -1;
	if (*out == xf->qp || (*out)->broken) { /* cannot be: the failed QP left the cache */
		ib_qp_put(xf->ib, *out);
		*out = NULL;
		return sc_err_set(err, SC_UNAVAILABLE, "no fresh QP to peer %s came up",
				  x->meta->issuer);
	}
	return 0;
}

void ib_retry_resume_locked(struct ib_xfer *xf, struct ib_qp *fresh, struct ib_qp **old)
{
	struct sc_xfer *x = xf->xr.x;
	*old = xf->qp;
	xf->qp = fresh;
	xf->moving = false;
	xf->moves++;
	/* Rewind to the first byte not known complete (all of its work requests are back). */
	sc_xr_cursor_seek(&xf->cur, x, xf->bytes_acked);
	xf->notice = IB_NOTICE_NONE; /* posted again behind the last chunk, on the fresh QP */
	SC_INFO_KV("ibverbs", IB_XFER_FIELDS(x),
		"transfer %016" PRIx64 ": QP %u to peer %s failed under it (%s); continuing at "
		"byte %" PRIu64 " of %" PRIu64 " on QP %u (move %u of %d, %" PRIu64 " ms)",
		x->xfer_id, (*old)->qp->qp_num, (*old)->peer,
		(*old)->why[0] ? (*old)->why : "moved to the error state", xf->bytes_acked, x->total,
		fresh->qp->qp_num, xf->moves, IB_XFER_MOVES,
		sc_clock_mono_ms() - xf->moving_mono_ms);
}
