/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/records.c: the transfers OPENed per connection, and orphans. A transfer (token, xfer_id)
 * opened on a connection is tracked (struct rec, peer/internal.h) until its DONE arrives (on any
 * connection, since the active side spreads one transfer over several) or its operation ends
 * (sc_peer_server_revoke). When the last connection that opened it ends without a DONE, the
 * transfer becomes an orphan (peer/conns.c): after ORPHAN_GRACE_MS (time for a DONE still on its
 * way on another connection, e.g. after the active side cancelled and cut its streams) the engine
 * is told through the interface's abandon. A connection holds at most SC_PEER_SERVER_MAX_OPEN of
 * them and they hold no slot: a connection with no request in hand may be closed for a new peer
 * whatever it has opened. The records are hashed, so nothing a peer OPENs makes another request,
 * a hello or a connection's end walk them.
 *
 * Threads: the pool threads (OPEN, DONE, the checks of READ and WRITE), the accept thread and
 * destroy (ps_expire_orphans), engine threads (the claim); every record under srv->mu.
 */
#include "peer/internal.h"

#include "base/log.h"
#include "base/timer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- transfer records (struct rec; all under srv->mu) ---------------------------------------- */

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* For one token a bijection of xfer_id, so only records of different tokens share a key. */
static uint64_t rec_key(const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	uint64_t t = rd64(token + 8);
	return xfer_id ^ rd64(token) ^ (t << 29 | t >> 35);
}

static struct rec **chain_next(struct rec *r, bool by_xfer)
{
	return by_xfer ? &r->xfer_next : &r->hash_next;
}

/* Add r to the chain at key (second when there is one: the map is not touched). */
static int chain_add(struct sc_u64map *m, uint64_t key, struct rec *r, bool by_xfer)
{
	struct rec *head = sc_u64map_get(m, key);
	if (!head) {
		*chain_next(r, by_xfer) = NULL;
		return sc_u64map_put(m, key, r);
	}
	*chain_next(r, by_xfer) = *chain_next(head, by_xfer);
	*chain_next(head, by_xfer) = r;
	return 0;
}

static void chain_del(struct sc_u64map *m, uint64_t key, struct rec *r, bool by_xfer)
{
	struct rec *head = sc_u64map_get(m, key);
	if (head == r) {
		struct rec *next = *chain_next(r, by_xfer);
		if (next)
			sc_u64map_replace(m, key, next);
		else
			sc_u64map_del(m, key);
		return;
	}
	for (struct rec *p = head; p; p = *chain_next(p, by_xfer)) {
		if (*chain_next(p, by_xfer) == r) {
			*chain_next(p, by_xfer) = *chain_next(r, by_xfer);
			return;
		}
	}
}

static struct rec *rec_find_locked(const struct sc_peer_server *srv,
				   const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id)
{
	for (struct rec *r = sc_u64map_get(&srv->recs, rec_key(token, xfer_id)); r; r = r->hash_next)
		if (r->xfer_id == xfer_id && memcmp(r->token, token, SC_TOKEN_LEN) == 0)
			return r;
	return NULL;
}

/* A new record, indexed three ways; NULL when out of memory. */
static struct rec *rec_new_locked(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN],
				  uint64_t xfer_id)
{
	struct rec *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	memcpy(r->token, token, SC_TOKEN_LEN);
	r->xfer_id = xfer_id;
	sc_list_init(&r->holds);
	struct tok *t = sc_idmap_get(srv->toks, token, SC_TOKEN_LEN);
	bool new_tok = !t;
	if (new_tok) {
		t = calloc(1, sizeof(*t));
		if (!t)
			goto fail;
		memcpy(t->token, token, SC_TOKEN_LEN);
		sc_list_init(&t->recs);
		if (sc_idmap_put(srv->toks, token, SC_TOKEN_LEN, t) != 0) {
			free(t);
			goto fail;
		}
	}
	if (chain_add(&srv->recs, rec_key(token, xfer_id), r, false) != 0)
		goto fail_tok;
	if (chain_add(&srv->by_xfer, xfer_id, r, true) != 0) {
		chain_del(&srv->recs, rec_key(token, xfer_id), r, false);
		goto fail_tok;
	}
	r->tok = t;
	sc_list_insert_tail(&t->recs, &r->tok_node);
	return r;
fail_tok:
	if (new_tok) {
		sc_idmap_del(srv->toks, token, SC_TOKEN_LEN);
		free(t);
	}
fail:
	free(r);
	return NULL;
}

void ps_hold_free_locked(struct hold *h)
{
	sc_list_remove(&h->conn_node);
	sc_list_remove(&h->rec_node);
	h->c->n_opened--;
	free(h);
}

/* The transfer ended (its DONE, its claim, its operation's end, or as an orphan told): forget it
 * everywhere. */
void ps_rec_drop_locked(struct sc_peer_server *srv, struct rec *r)
{
	while (!sc_list_empty(&r->holds))
		ps_hold_free_locked(sc_list_entry(sc_list_first(&r->holds), struct hold, rec_node));
	if (r->orphan) {
		sc_list_remove(&r->orphan->node);
		free(r->orphan);
	}
	chain_del(&srv->recs, rec_key(r->token, r->xfer_id), r, false);
	chain_del(&srv->by_xfer, r->xfer_id, r, true);
	sc_list_remove(&r->tok_node);
	if (sc_list_empty(&r->tok->recs)) {
		sc_idmap_del(srv->toks, r->token, SC_TOKEN_LEN);
		free(r->tok);
	}
	free(r);
}

static struct hold *hold_of(const struct rec *r, const struct conn *c)
{
	const struct sc_list *pos;
	sc_list_foreach(pos, &r->holds) {
		struct hold *h = sc_list_entry(pos, struct hold, rec_node);
		if (h->c == c)
			return h;
	}
	return NULL;
}

/* May this connection OPEN (token, xfer_id)? Not past SC_PEER_SERVER_MAX_OPEN open transfers,
 * unless it holds this one already (another OPEN of it). Asked before the engine, so a refused
 * OPEN claims no use. Only the connection's own thread adds to its records, so the room is still
 * there when it tracks the transfer. */
bool ps_open_room(struct conn *c, const struct sc_peer_msg *m, struct sc_err *err)
{
	struct sc_peer_server *srv = c->srv;
	pthread_mutex_lock(&srv->mu);
	bool ok = c->n_opened < SC_PEER_SERVER_MAX_OPEN;
	if (!ok) {
		const struct rec *r = rec_find_locked(srv, m->token, m->xfer_id);
		ok = r && hold_of(r, c);
	}
	size_t n = c->n_opened;
	pthread_mutex_unlock(&srv->mu);
	if (ok)
		return true;
	sc_err_set(err, SC_RESOURCE_EXHAUSTED,
		   "this connection already has %zu transfers open on sidecar %s (the most one "
		   "peer connection may hold): send their DONE, or OPEN on another connection",
		   n, srv->self_id);
	SC_WARN_LIMITED("peer", "peer-open-cap", "refused an OPEN from %s: %s", c->what, err->msg);
	return false;
}

/* Track a transfer this connection opened. Returns -1 when out of memory. */
int ps_track(struct conn *c, const uint8_t token[SC_TOKEN_LEN], uint64_t xfer_id,
	     enum sc_op_kind kind, enum sc_backend_kind via)
{
	struct sc_peer_server *srv = c->srv;
	int rc = 0;
	pthread_mutex_lock(&srv->mu);
	struct rec *r = rec_find_locked(srv, token, xfer_id);
	if (!r && !(r = rec_new_locked(srv, token, xfer_id))) {
		rc = -1;
		goto out;
	}
	if (r->orphan) { /* OPENed again: no longer an orphan */
		sc_list_remove(&r->orphan->node);
		free(r->orphan);
		r->orphan = NULL;
	}
	if (hold_of(r, c))
		goto out;
	struct hold *h = calloc(1, sizeof(*h));
	if (!h) {
		if (sc_list_empty(&r->holds))
			ps_rec_drop_locked(srv, r);
		rc = -1;
		goto out;
	}
	h->rec = r;
	h->c = c;
	h->kind = kind;
	h->via = via;
	sc_list_insert_tail(&r->holds, &h->rec_node);
	sc_list_insert_tail(&c->opened, &h->conn_node);
	c->n_opened++;
out:
	pthread_mutex_unlock(&srv->mu);
	return rc;
}

/* Was the transfer OPENed on this connection, for this direction? READ and WRITE must be, so a
 * peer can never write into memory it opened for reading (or read what it may only write). */
bool ps_opened_here(struct conn *c, const struct sc_peer_msg *m, enum sc_op_kind kind,
		    struct sc_err *err)
{
	bool found = false, ok = false;
	pthread_mutex_lock(&c->srv->mu);
	const struct rec *r = rec_find_locked(c->srv, m->token, m->xfer_id);
	const struct hold *h = r ? hold_of(r, c) : NULL;
	if (h) {
		found = true;
		ok = h->kind == kind;
	}
	pthread_mutex_unlock(&c->srv->mu);
	if (!found)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "%s of transfer %016" PRIx64 " before its OPEN on this connection (or "
			   "after its DONE, or after its operation ended)",
			   sc_frame_type_name(m->type), m->xfer_id);
	else if (!ok)
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "%s of transfer %016" PRIx64 ", which was opened for %s",
			   sc_frame_type_name(m->type), m->xfer_id,
			   kind == SC_OP_READ ? "WRITE" : "READ");
	return ok;
}

/* DONE arrived: no connection is responsible for the transfer any more. */
void ps_untrack_everywhere(struct sc_peer_server *srv, const uint8_t token[SC_TOKEN_LEN],
			   uint64_t xfer_id)
{
	pthread_mutex_lock(&srv->mu);
	struct rec *r = rec_find_locked(srv, token, xfer_id);
	if (r)
		ps_rec_drop_locked(srv, r);
	pthread_mutex_unlock(&srv->mu);
}

/* The passive interface's claim (backend/passive.h): a transfer that peer_id OPENed here via `via`. */
int ps_claim(struct sc_peer_server *srv, const char *peer_id, uint64_t xfer_id,
	     enum sc_backend_kind via, uint8_t token[SC_TOKEN_LEN])
{
	struct rec *found = NULL;
	if (via == SC_BACKEND_NONE)
		return -1;
	pthread_mutex_lock(&srv->mu);
	for (struct rec *r = sc_u64map_get(&srv->by_xfer, xfer_id); r && !found; r = r->xfer_next) {
		if (r->xfer_id != xfer_id)
			continue;
		if (r->orphan && r->orphan->via == via && strcmp(r->orphan->peer_id, peer_id) == 0)
			found = r;
		const struct sc_list *pos;
		sc_list_foreach(pos, &r->holds) {
			const struct hold *h = sc_list_entry(pos, struct hold, rec_node);
			if (h->via == via && h->c->authed && strcmp(h->c->peer_id, peer_id) == 0)
				found = r;
		}
	}
	if (found) {
		memcpy(token, found->token, SC_TOKEN_LEN);
		ps_rec_drop_locked(srv, found);
	}
	pthread_mutex_unlock(&srv->mu);
	return found ? 0 : -1;
}

/* Tell the engine about orphans that are due (all of them when `all`). Accept thread or destroy.
 * The orphans are in the order they fall due (each is due ORPHAN_GRACE_MS after its making). */
uint64_t ps_expire_orphans(struct sc_peer_server *srv, bool all)
{
	uint64_t now = sc_clock_mono_ms();
	uint64_t next_due = 0;
	struct sc_list due = SC_LIST_INIT(due);
	struct sc_list *pos, *tmp;
	pthread_mutex_lock(&srv->mu);
	while (!sc_list_empty(&srv->orphans)) {
		struct orphan *o = sc_list_entry(sc_list_first(&srv->orphans), struct orphan, node);
		if (!all && o->due_mono_ms > now) {
			next_due = o->due_mono_ms;
			break;
		}
		sc_list_remove(&o->node);
		sc_list_insert_tail(&due, &o->node);
		o->rec->orphan = NULL;
		ps_rec_drop_locked(srv, o->rec);
		o->rec = NULL;
	}
	pthread_mutex_unlock(&srv->mu);
	sc_list_foreach_safe(pos, tmp, &due) {
		struct orphan *o = sc_list_entry(pos, struct orphan, node);
		sc_passive_abandon(&srv->passive, o->token, o->xfer_id, o->why);
		free(o);
	}
	return next_due;
}
