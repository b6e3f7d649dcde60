/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/rail.c: one rail of the libfabric backend: a fabric, a domain, one FI_EP_RDM endpoint
 * bound to an address vector and a completion queue, the progress thread that reads that queue,
 * and the address-vector entries of the peers this sidecar reads from or writes to (one per peer
 * sidecar, inserted on first use, least recently used idle entries removed at --ofi-max-peers,
 * a failed peer's removed at once).
 *
 * Threads: open/close on the main thread; the progress thread (one per rail) reads completions
 * and drives the provider's progress (FI_PROGRESS_MANUAL providers such as tcp;ofi_rxm serve the
 * peers' RMA from it); ofi_peer_* on transfer workers under rl->av_mu.
 * Owns: the rail's libfabric objects, its thread and its peer table.
 */
#include "ofi/internal.h"

#include "base/log.h"
#include "base/timer.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CQ_BATCH 64
#define CQ_WAIT_MS 100

static void close_ep(struct fid_ep **ep, struct fid_av **av, struct fid_cq **cq);

/* One endpoint with its AV and CQ. The CQ has a wait fd (FI_WAIT_FD) where the provider offers
 * one, so the progress thread can sleep in poll(); a provider whose endpoint will not take such a
 * CQ (binding or enabling fails) gets a FI_WAIT_NONE one, which the progress thread polls in short
 * naps. With manual data progress (tcp;ofi_rxm) bytes move only inside fi_cq_read. `why` names
 * the call that failed. */
static int open_ep_wait(struct ofi_rail *rl, struct fid_ep **ep, struct fid_av **av,
			struct fid_cq **cq, enum fi_wait_obj wait, char *why, size_t cap)
{
	const char *dom = rl->info->domain_attr->name;
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 4096, .wait_obj = wait};
	int rc = fi_cq_open(rl->domain, &cq_attr, cq, NULL);
	if (rc && wait != FI_WAIT_NONE) {
		cq_attr.wait_obj = FI_WAIT_NONE;
		rc = fi_cq_open(rl->domain, &cq_attr, cq, NULL);
	}
	if (rc) {
		snprintf(why, cap, "fi_cq_open(%s): %s", dom, ofi_fn.strerror(-rc));
		return -1;
	}
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = rl->ob->max_peers};
	if (rl->info->domain_attr->av_type != FI_AV_UNSPEC)
		av_attr.type = rl->info->domain_attr->av_type;
	rc = fi_av_open(rl->domain, &av_attr, av, NULL);
	if (rc) {
		snprintf(why, cap, "fi_av_open(%s): %s", dom, ofi_fn.strerror(-rc));
		return -1;
	}
	rc = fi_endpoint(rl->domain, rl->info, ep, NULL);
	if (rc) {
		snprintf(why, cap, "fi_endpoint(%s): %s", dom, ofi_fn.strerror(-rc));
		return -1;
	}
	const char *step = "fi_ep_bind(address vector)";
	if (!(rc = fi_ep_bind(*ep, &(*av)->fid, 0))) {
		step = cq_attr.wait_obj == FI_WAIT_FD ? "fi_ep_bind(completion queue, FI_WAIT_FD)"
						      : "fi_ep_bind(completion queue)";
		if (!(rc = fi_ep_bind(*ep, &(*cq)->fid, FI_TRANSMIT | FI_RECV))) {
			step = "fi_enable";
			rc = fi_enable(*ep);
		}
	}
	if (rc) {
		snprintf(why, cap, "%s on an endpoint of %s: %s", step, dom, ofi_fn.strerror(-rc));
		return -1;
	}
	return 0;
}

static int open_ep(struct ofi_rail *rl, struct fid_ep **ep, struct fid_av **av, struct fid_cq **cq,
		   char *why, size_t cap)
{
	if (open_ep_wait(rl, ep, av, cq, FI_WAIT_FD, why, cap) == 0)
		return 0;
	char first[256];
	snprintf(first, sizeof(first), "%s", why);
	close_ep(ep, av, cq);
	if (open_ep_wait(rl, ep, av, cq, FI_WAIT_NONE, why, cap) == 0) {
		SC_INFO("libfabric", "%s: %s; polling a FI_WAIT_NONE completion queue instead",
			rl->info->domain_attr->name, first);
		return 0;
	}
	char second[256];
	snprintf(second, sizeof(second), "%s", why);
	snprintf(why, cap, "%s (and without a wait fd: %s)", first, second);
	return -1;
}

static void close_ep(struct fid_ep **ep, struct fid_av **av, struct fid_cq **cq)
{
	if (*ep)
		fi_close(&(*ep)->fid);
	if (*av)
		fi_close(&(*av)->fid);
	if (*cq)
		fi_close(&(*cq)->fid);
	*ep = NULL;
	*av = NULL;
	*cq = NULL;
}

int ofi_rail_open(struct ofi_backend *ob, size_t r, const struct fi_info *info, char *why,
		  size_t cap)
{
	struct ofi_rail *rl = &ob->rails[r];
	rl->ob = ob;
	rl->index = r;
	pthread_mutex_init(&rl->av_mu, NULL);
	pthread_rwlock_init(&rl->out_lock, NULL);
	atomic_init(&rl->thread_exit, false);
	rl->info = ofi_fn.dupinfo(info);
	if (!rl->info) {
		snprintf(why, cap, "out of memory");
		return -1;
	}
	const char *dom = info->domain_attr->name;
	int rc = ofi_fn.fabric(rl->info->fabric_attr, &rl->fabric, NULL);
	if (rc) {
		snprintf(why, cap, "fi_fabric(%s): %s", dom, ofi_fn.strerror(-rc));
		return -1;
	}
	rc = fi_domain(rl->fabric, rl->info, &rl->domain, NULL);
	if (rc) {
		snprintf(why, cap, "fi_domain(%s): %s", dom, ofi_fn.strerror(-rc));
		return -1;
	}
	rc = open_ep(rl, &rl->ep, &rl->av, &rl->cq, why, cap);
	if (rc)
		return -1;
	rl->addr_len = sizeof(rl->addr);
	rc = fi_getname(&rl->ep->fid, rl->addr, &rl->addr_len);
	if (rc) {
		snprintf(why, cap, "fi_getname(%s): %s (address longer than %d bytes?)", dom,
			 ofi_fn.strerror(-rc), SC_OFI_ADDR_MAX);
		return -1;
	}
	rl->split = !(rl->info->domain_attr->mr_mode & FI_MR_ENDPOINT);
	if (rl->split) {
		if (open_ep(rl, &rl->ep_out, &rl->av_out, &rl->cq_out, why, cap))
			return -1;
	} else {
		rl->ep_out = rl->ep;
		rl->av_out = rl->av;
		rl->cq_out = rl->cq;
	}
	rl->fd_out = rl->fd_in = -1;
	if (fi_control(&rl->cq_out->fid, FI_GETWAIT, &rl->fd_out) != 0)
		rl->fd_out = -1;
	if (rl->split && fi_control(&rl->cq->fid, FI_GETWAIT, &rl->fd_in) != 0)
		rl->fd_in = -1;
	rl->mr_mode = rl->info->domain_attr->mr_mode;
	size_t iov = rl->info->tx_attr->iov_limit;
	size_t rma_iov = rl->info->tx_attr->rma_iov_limit;
	rl->iov_limit = iov < rma_iov ? iov : rma_iov;
	if (rl->iov_limit == 0)
		rl->iov_limit = 1;
	if (rl->iov_limit > 16)
		rl->iov_limit = 16;
	/* For experiments: fewer pieces per message than the provider allows. */
	const char *lim = getenv("RDMA_SIDECAR_OFI_IOV_LIMIT");
	if (lim && atoi(lim) > 0 && (size_t)atoi(lim) < rl->iov_limit)
		rl->iov_limit = (size_t)atoi(lim);
	rl->max_msg = rl->info->ep_attr->max_msg_size;
	if (rl->max_msg == 0)
		rl->max_msg = 1u << 20;
	rl->key_size = rl->info->domain_attr->mr_key_size;
	rl->waw = (rl->info->tx_attr->msg_order & FI_ORDER_WAW) != 0;
	return 0;
}

/* ---- progress -------------------------------------------------------------------------------- */

const char *ofi_cq_errtext(struct ofi_rail *rl, const struct fi_cq_err_entry *e, char *buf,
			   size_t cap)
{
	const char *t = fi_cq_strerror(rl->cq_out, e->prov_errno, e->err_data, buf, cap);
	if (t && t != buf)
		snprintf(buf, cap, "%s", t);
	else if (!t)
		snprintf(buf, cap, "%s", ofi_fn.strerror(e->err));
	return buf;
}

/* Reads one CQ: completions to their transfers. Returns how many entries it handled. */
static int poll_cq(struct ofi_rail *rl, struct fid_cq *cq)
{
	struct fi_cq_entry ent[CQ_BATCH];
	ssize_t n = fi_cq_read(cq, ent, CQ_BATCH);
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++)
			rl->ob->on_completion(rl, ent[i].op_context, NULL);
		return (int)n;
	}
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry e;
		memset(&e, 0, sizeof(e));
		if (fi_cq_readerr(cq, &e, 0) > 0)
			rl->ob->on_completion(rl, e.op_context, &e);
		return 1;
	}
	if (n != -FI_EAGAIN && n != -FI_EINTR) {
		SC_ERROR("libfabric", "rail %zu (%s): fi_cq_read failed: %s", rl->index,
			 rl->info->domain_attr->name, ofi_fn.strerror((int)-n));
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	return 0;
}

/* Polls the initiator's CQ (this sidecar's transfers) and the target's (which, with manual
 * progress, is what serves the peers' RMA): busy while there is work, then sleeping up to 1 ms. */
static void *progress_main(void *arg)
{
	struct ofi_rail *rl = arg;
	unsigned idle = 0;
	while (!atomic_load(&rl->thread_exit)) {
		int n = 0;
		/* Both under the lock: the provider's progress engine is per domain, so polling the
		 * target's CQ may touch the initiator endpoint that a reset is closing. */
		pthread_rwlock_rdlock(&rl->out_lock);
		n += poll_cq(rl, rl->cq_out);
		if (rl->split)
			n += poll_cq(rl, rl->cq);
		pthread_rwlock_unlock(&rl->out_lock);
		if (n > 0) {
			idle = 0;
			continue;
		}
		if (rl->fd_out >= 0 && (!rl->split || rl->fd_in >= 0)) {
			/* Sleep until there is work, when the provider says nothing is pending. */
			struct fid *fids[2] = {&rl->cq_out->fid, &rl->cq->fid};
			pthread_rwlock_rdlock(&rl->out_lock);
			int tw = fi_trywait(rl->fabric, fids, rl->split ? 2 : 1);
			pthread_rwlock_unlock(&rl->out_lock);
			if (tw == FI_SUCCESS) {
				struct pollfd pf[2] = {{.fd = rl->fd_out, .events = POLLIN},
						       {.fd = rl->fd_in, .events = POLLIN}};
				poll(pf, rl->split ? 2 : 1, 50);
			}
			continue;
		}
		struct timespec ts = {0, idle++ < 2000 ? 5000 : 1000000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

int ofi_rail_start(struct ofi_rail *rl, struct sc_err *err)
{
	atomic_store(&rl->thread_exit, false);
	int rc = pthread_create(&rl->thread, NULL, progress_main, rl);
	if (rc)
		return sc_err_set(err, SC_INTERNAL, "starting the libfabric progress thread: %s",
				  strerror(rc));
	rl->thread_started = true;
	return 0;
}

void ofi_rail_stop(struct ofi_rail *rl)
{
	if (!rl->thread_started)
		return;
	atomic_store(&rl->thread_exit, true);
	pthread_join(rl->thread, NULL);
	rl->thread_started = false;
}

void ofi_rail_close(struct ofi_rail *rl)
{
	ofi_rail_stop(rl);
	while (rl->peers) {
		struct ofi_peer *p = rl->peers;
		rl->peers = p->next;
		free(p);
	}
	size_t out = atomic_load(&rl->abandoned);
	if (out && rl->ep_out) {
		/* The provider may still touch those messages' contexts and memory: all of this
		 * rail stays as it is until the process ends (ofi_destroy keeps the backend). */
		SC_WARN("libfabric",
			"rail %zu (%s): %zu message(s) given up on never completed; leaving its "
			"endpoint open (libfabric cannot close an endpoint with RMA outstanding)",
			rl->index, rl->info->domain_attr->name, out);
		rl->left_open = true;
		return;
	}
	if (rl->split)
		close_ep(&rl->ep_out, &rl->av_out, &rl->cq_out);
	close_ep(&rl->ep, &rl->av, &rl->cq);
	if (rl->domain)
		fi_close(&rl->domain->fid);
	if (rl->fabric)
		fi_close(&rl->fabric->fid);
	if (rl->info)
		ofi_fn.freeinfo(rl->info);
	rl->domain = NULL;
	rl->fabric = NULL;
	rl->info = NULL;
	if (rl->ob) {
		pthread_mutex_destroy(&rl->av_mu);
		pthread_rwlock_destroy(&rl->out_lock);
	}
	rl->ob = NULL;
}

/* ---- the peers' address-vector entries --------------------------------------------------------
 */

static void remove_locked(struct ofi_rail *rl, struct ofi_peer **link)
{
	struct ofi_peer *p = *link;
	fi_addr_t fa = p->fa;
	int rc = fi_av_remove(rl->av_out, &fa, 1, 0);
	if (rc)
		SC_WARN("libfabric", "rail %zu: fi_av_remove of peer %s: %s", rl->index, p->id,
			ofi_fn.strerror(-rc));
	*link = p->next;
	free(p);
	rl->n_peers--;
	atomic_fetch_add(&rl->ob->base.addrs_evicted, 1);
}

int ofi_peer_get(struct ofi_rail *rl, const char *id, const uint8_t *addr, size_t len,
		 fi_addr_t *fa, struct sc_err *err)
{
	pthread_mutex_lock(&rl->av_mu);
	struct ofi_peer **link = &rl->peers;
	for (; *link; link = &(*link)->next) {
		struct ofi_peer *p = *link;
		if (strcmp(p->id, id) != 0)
			continue;
		if (p->addr_len == len && memcmp(p->addr, addr, len) == 0) {
			p->refs++;
			p->last_used = sc_clock_mono_ms();
			*fa = p->fa;
			pthread_mutex_unlock(&rl->av_mu);
			return 0;
		}
		if (p->refs == 0) { /* restarted peer: a new address */
			remove_locked(rl, link);
			break;
		}
		pthread_mutex_unlock(&rl->av_mu);
		return sc_err_set(err, SC_UNAVAILABLE,
				  "libfabric: peer %s changed its address while transfers to its "
				  "old one are running; retry when they end",
				  id);
	}
	if (rl->n_peers >= rl->ob->max_peers) {
		struct ofi_peer **lru = NULL;
		for (struct ofi_peer **l = &rl->peers; *l; l = &(*l)->next)
			if ((*l)->refs == 0 && (!lru || (*l)->last_used < (*lru)->last_used))
				lru = l;
		if (!lru) {
			pthread_mutex_unlock(&rl->av_mu);
			return sc_err_set(
			    err, SC_RESOURCE_EXHAUSTED,
			    "libfabric: all %u address-vector entries of rail %zu are "
			    "in use by running transfers (--ofi-max-peers); retry when "
			    "some end",
			    rl->ob->max_peers, rl->index);
		}
		remove_locked(rl, lru);
	}
	struct ofi_peer *p = calloc(1, sizeof(*p));
	if (!p) {
		pthread_mutex_unlock(&rl->av_mu);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	snprintf(p->id, sizeof(p->id), "%s", id);
	memcpy(p->addr, addr, len);
	p->addr_len = len;
	int n = fi_av_insert(rl->av_out, addr, 1, &p->fa, 0, NULL);
	if (n != 1) {
		pthread_mutex_unlock(&rl->av_mu);
		free(p);
		return sc_err_set(err, SC_UNAVAILABLE,
				  "libfabric: fi_av_insert of peer %s's address on rail %zu "
				  "failed: %s",
				  id, rl->index, n < 0 ? ofi_fn.strerror(-n) : "not inserted");
	}
	p->refs = 1;
	p->last_used = sc_clock_mono_ms();
	p->next = rl->peers;
	rl->peers = p;
	rl->n_peers++;
	atomic_fetch_add(&rl->ob->base.addrs_inserted, 1);
	*fa = p->fa;
	pthread_mutex_unlock(&rl->av_mu);
	return 0;
}

void ofi_peer_put(struct ofi_rail *rl, const char *id)
{
	pthread_mutex_lock(&rl->av_mu);
	for (struct ofi_peer *p = rl->peers; p; p = p->next)
		if (strcmp(p->id, id) == 0 && p->refs > 0) {
			p->refs--;
			p->last_used = sc_clock_mono_ms();
			break;
		}
	pthread_mutex_unlock(&rl->av_mu);
}

void ofi_peer_evict(struct ofi_rail *rl, const char *id)
{
	pthread_mutex_lock(&rl->av_mu);
	for (struct ofi_peer **l = &rl->peers; *l; l = &(*l)->next)
		if (strcmp((*l)->id, id) == 0) {
			if ((*l)->refs == 0)
				remove_locked(rl, l);
			break;
		}
	pthread_mutex_unlock(&rl->av_mu);
}

void ofi_peer_forget(struct ofi_rail *rl, const char *id)
{
	pthread_mutex_lock(&rl->av_mu);
	for (struct ofi_peer **l = &rl->peers; *l; l = &(*l)->next)
		if (strcmp((*l)->id, id) == 0) {
			struct ofi_peer *p = *l;
			*l = p->next;
			free(p);
			rl->n_peers--;
			atomic_fetch_add(&rl->ob->base.addrs_evicted, 1);
			break;
		}
	pthread_mutex_unlock(&rl->av_mu);
}
