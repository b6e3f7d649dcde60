/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/cursor.c: the shared chunk cursor of a transfer. Its streams pull chunks of at most
 * --tcp-chunk-size, never across a segment (a batch of up to SC_PEER_MAX_PIECES pieces when the
 * peer reads them, metadata version 2), from the runner's cursor (backend/xfer_runner.h), so a
 * slower stream takes fewer. A stream whose path fails gives its unfinished chunks back (whole: a
 * chunk is known complete only when its reply is in) to a queue the other streams take from
 * first.
 *
 * Threads: the transfer's streams (runner workers, or the thread that began it), under
 * tx->cursor_mu. Owns the chunks given back (struct given_back) until they are taken again.
 */
#include "tcp/internal.h"

#include "base/timer.h"

#include <stdlib.h>
#include <string.h>

/* A stream waiting for chunks that other streams may give back looks at its stop flag this
 * often. */
#define GIVEN_BACK_WAIT_MS 100

/* One request, one kind of local memory: host, or one GPU's (staged and packed). */
static bool same_local_memory(const struct sc_xfer_seg *first, const struct sc_xfer_seg *prev,
			      const struct sc_xfer_seg *next)
{
	(void)prev;
	return next->local_gpu == first->local_gpu;
}

bool tcp_should_stop(struct tcp_xfer *tx)
{
	return sc_xr_should_stop(&tx->xr);
}

/* The next chunk: one given back by a failed stream, else the cursor's. wait: when neither has
 * one but other streams hold chunks, wait for those to complete or come back. Counts the chunk
 * in flight until tcp_piece_done or give_back. */
bool tcp_next_piece(struct tcp_xfer *tx, struct piece *p, bool wait)
{
	uint64_t chunk = tx->tb->chunk;
	size_t n = 0;
	pthread_mutex_lock(&tx->cursor_mu);
	for (;;) {
		struct sc_list *first = sc_list_first(&tx->given);
		if (first) {
			struct given_back *g = sc_list_entry(first, struct given_back, node);
			sc_list_remove(first);
			n = g->n;
			memcpy(p->cut, g->cut, n * sizeof(g->cut[0]));
			free(g);
			break;
		}
		/* A batch: up to SC_PEER_MAX_PIECES pieces and --tcp-chunk-size bytes, in list
		 * order. */
		n = tx->batch ? sc_xr_cursor_take(&tx->cur, tx->xr.x, chunk, tx->max_pieces,
						  same_local_memory, p->cut)
			      : sc_xr_cursor_take(&tx->cur, tx->xr.x, chunk, 1, NULL, p->cut);
		if (n || !wait || tx->in_flight == 0 || tcp_should_stop(tx))
			break;
		sc_cond_wait_ms(&tx->work_cv, &tx->cursor_mu, GIVEN_BACK_WAIT_MS);
	}
	if (n)
		tx->in_flight++;
	pthread_mutex_unlock(&tx->cursor_mu);
	if (n == 0)
		return false;
	p->n_cut = n;
	p->n = 0;
	p->seg = p->cut[0].seg;
	p->off = p->cut[0].off;
	p->len = p->cut[0].len;
	if (!tx->batch)
		return true;
	p->gpu = p->seg->local_gpu;
	p->len = 0;
	for (size_t i = 0; i < n; i++) {
		const struct sc_xr_piece *c = &p->cut[i];
		p->pp[i] = (struct sc_peer_piece){
		    .desc = c->seg->remote_desc, .offset = c->off, .len = c->len};
		p->iov[i] = (struct iovec){.iov_base = c->seg->local + c->off, .iov_len = (size_t)c->len};
		p->len += c->len;
	}
	p->n = (uint32_t)n;
	return true;
}

/* Under cursor_mu: nothing is left to take nor in flight. */
bool tcp_all_done_locked(struct tcp_xfer *tx)
{
	return tx->in_flight == 0 && sc_list_empty(&tx->given) &&
	       sc_xr_cursor_done(&tx->cur, tx->xr.x);
}

/* A chunk's reply is in. The last one tells streams still dialing to give up. */
void tcp_piece_done(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	tx->in_flight--;
	if (tx->in_flight == 0)
		pthread_cond_broadcast(&tx->work_cv);
	if (tcp_all_done_locked(tx))
		atomic_store(&tx->quit, true);
	pthread_mutex_unlock(&tx->cursor_mu);
}

/* A chunk that will not complete on this stream: back to the queue (requeue), or only out of
 * flight (the transfer is failing anyway). False when out of memory. */
bool tcp_give_back(struct tcp_xfer *tx, const struct piece *p, bool requeue)
{
	struct given_back *g = NULL;
	if (requeue) {
		g = malloc(sizeof(*g) + p->n_cut * sizeof(g->cut[0]));
		if (g) {
			g->n = p->n_cut;
			memcpy(g->cut, p->cut, p->n_cut * sizeof(g->cut[0]));
		}
	}
	pthread_mutex_lock(&tx->cursor_mu);
	if (g)
		sc_list_insert_tail(&tx->given, &g->node);
	tx->in_flight--;
	pthread_cond_broadcast(&tx->work_cv);
	pthread_mutex_unlock(&tx->cursor_mu);
	return g || !requeue;
}

/* Whether a chunk is left to take (the leader of a single stream owns them: nobody else moves
 * the cursor). */
bool tcp_pieces_left(struct tcp_xfer *tx)
{
	pthread_mutex_lock(&tx->cursor_mu);
	bool left = !sc_list_empty(&tx->given) || sc_xr_cursor_more(&tx->cur, tx->xr.x);
	pthread_mutex_unlock(&tx->cursor_mu);
	return left;
}

uint64_t tcp_count_chunks(const struct tcp_xfer *tx, uint64_t chunk)
{
	const struct sc_xfer *x = tx->xr.x;
	if (tx->batch) { /* requests: by bytes, and by pieces */
		uint64_t by_bytes = (x->total + chunk - 1) / chunk;
		uint64_t by_pieces = (x->n_segs + SC_PEER_MAX_PIECES - 1) / SC_PEER_MAX_PIECES;
		return by_bytes > by_pieces ? by_bytes : by_pieces;
	}
	uint64_t n = 0;
	for (size_t i = 0; i < x->n_segs; i++)
		n += (x->segs[i].len + chunk - 1) / chunk;
	return n;
}
