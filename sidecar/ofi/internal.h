/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/internal.h: what the files of the libfabric backend share (only ofi/ includes it).
 *
 *   backend.c  the ops table and lifecycle: which provider, which rails, and why not
 *   rail.c     one rail: fabric, domain, endpoint (FI_EP_RDM), address vector, completion queue,
 *              the progress thread, and the AV entries of the peers (one per peer, evicted)
 *   access.c   regions (a local MR per rail) and grants (a remote key per operation span, closed
 *              when the operation ends)
 *   lib.c      libfabric itself, loaded at run time (dlopen)
 *   xfer.c     the active side: OPEN on the control channel, batched fi_readmsg/fi_writemsg with
 *              FI_MORE, completions, DONE
 *
 * Locking: ob->mu guards the transfer runner and the transfers' counters; a rail's av_mu its
 * peer table. Completions arrive on each rail's progress thread.
 */
#ifndef SC_OFI_INTERNAL_H
#define SC_OFI_INTERNAL_H

#include "backend/backend.h"
#include "backend/xfer_runner.h"
#include "meta/metadata.h"

#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdatomic.h>
#include <stdbool.h>

#define OFI_API_VERSION FI_VERSION(1, 17)

/* lib.c: the functions libfabric exports, looked up at run time (the binary does not link
 * libfabric). Valid once ofi_lib_load returned 0. */
struct ofi_lib {
	bool loaded;
	int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
		       const struct fi_info *hints, struct fi_info **info);
	void (*freeinfo)(struct fi_info *info);
	struct fi_info *(*dupinfo)(const struct fi_info *info);
	int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
	const char *(*strerror)(int errnum);
	uint32_t (*version)(void);
};
extern struct ofi_lib ofi_fn;
/* Loads libfabric.so.1 (RDMA_SIDECAR_LIBFABRIC names another) once; 0, or -1 with why. Any
 * thread. */
int ofi_lib_load(char *why, size_t cap);
/* The rails of one backend (SC_MAX_OFI_RAILS in metadata; SC_MAX_RAILS in GetInfo). */
#define OFI_MAX_RAILS (SC_MAX_OFI_RAILS < SC_MAX_RAILS ? SC_MAX_OFI_RAILS : SC_MAX_RAILS)

struct ofi_backend;

/* One peer's entry in a rail's address vector. */
struct ofi_peer {
	char id[SC_NAME_MAX];
	uint8_t addr[SC_OFI_ADDR_MAX];
	size_t addr_len;
	fi_addr_t fa;
	int refs;	    /* transfers using it now: never evicted while > 0 */
	uint64_t last_used; /* monotonic ms */
	struct ofi_peer *next;
};

struct ofi_rail {
	struct ofi_backend *ob;
	size_t index;
	struct fi_info *info; /* fi_dupinfo'd */
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep; /* the target endpoint: its address is advertised, grants bind to it */
	struct fid_av *av;
	struct fid_cq *cq;
	/* The initiator endpoint (this sidecar's READs and WRITEs), with its own AV and CQ, apart
	 * from the target one, so that dropping a peer's address or a path's connections never
	 * touches what peers do to this sidecar. The same objects as ep/av/cq when the provider
	 * binds local MRs to endpoints (FI_MR_ENDPOINT). */
	struct fid_ep *ep_out;
	struct fid_av *av_out;
	struct fid_cq *cq_out;
	bool split;
	atomic_bool cooling; /* a transfer gave up on it; the next completion on it clears it */
	/* Messages given up on (a stalled rail, a peer that never answered) whose completion has
	 * not come: while any is out, the initiator endpoint cannot be closed (libfabric 1.17's
	 * ofi_rxm crashes in fi_close with RMA outstanding), so ofi_rail_close leaves it open. */
	atomic_size_t abandoned;
	bool left_open;		   /* ofi_rail_close left it open for that reason */
	pthread_rwlock_t out_lock; /* read: posting, polling; write: none yet (kept for a reset) */
	uint8_t addr[SC_OFI_ADDR_MAX];
	size_t addr_len;
	uint64_t mr_mode;
	size_t iov_limit; /* min(tx iov_limit, rma_iov_limit) */
	uint64_t max_msg;
	size_t key_size;
	int fd_out, fd_in; /* the CQs' wait fds (FI_WAIT_FD), -1 without */
	bool waw; /* tx msg_order has FI_ORDER_WAW: writes land in the order they were posted */
	pthread_t thread;
	bool thread_started;
	atomic_bool thread_exit;
	pthread_mutex_t av_mu;
	struct ofi_peer *peers;
	size_t n_peers;
};

struct ofi_xfer;

struct ofi_backend {
	struct sc_backend base;
	pthread_mutex_t mu;
	struct sc_xr xr;
	struct sc_peer_pool *pool;
	struct sc_peer_server *srv;
	char provider[64];
	bool tcp_emulating;
	bool hmem; /* the provider registers CUDA memory (FI_HMEM) and --ofi-hmem allows it */
	char hmem_reason[160]; /* why not, when !hmem */
	struct ofi_rail rails[OFI_MAX_RAILS];
	size_t n_rails;
	uint32_t max_peers;
	uint64_t stripe_min;
	uint64_t stall_ms; /* --ofi-stall-timeout; 0 = never */
	/* Where the progress threads hand completions (ofi_xfer_completed, set by backend.c): a
	 * pointer, so rail.c never calls up into xfer.c. */
	void (*on_completion)(struct ofi_rail *rl, void *op_context,
			      const struct fi_cq_err_entry *err);
	atomic_uint_fast64_t next_key;
	atomic_uint_fast64_t eagain;
	/* Transfers that ended with messages the provider never completed (under mu): their
	 * records must outlive the rails' endpoints, so ofi_xfer_free_kept frees them once the
	 * rails are closed. */
	struct ofi_xfer *kept;
	size_t n_kept;
};

static inline struct ofi_backend *to_ofi(struct sc_backend *b)
{
	return container_of(b, struct ofi_backend, base);
}

/* rail.c */
/* Opens rail r from info (fabric, domain, endpoint, AV, CQ); why on failure. Main thread. */
int ofi_rail_open(struct ofi_backend *ob, size_t r, const struct fi_info *info, char *why,
		  size_t cap);
int ofi_rail_start(struct ofi_rail *rl, struct sc_err *err);
void ofi_rail_stop(struct ofi_rail *rl);
void ofi_rail_close(struct ofi_rail *rl);
/* The AV entry of peer `id` at addr (inserted, or the cached one; a changed address replaces
 * it), with a reference; ofi_peer_put drops it. At max_peers an idle entry is evicted first;
 * RESOURCE_EXHAUSTED when every one is in use. */
int ofi_peer_get(struct ofi_rail *rl, const char *id, const uint8_t *addr, size_t len,
		 fi_addr_t *fa, struct sc_err *err);
void ofi_peer_put(struct ofi_rail *rl, const char *id);
/* Drops peer id's entry from the table without fi_av_remove (the caller removed its address
 * already): the next transfer inserts it afresh. */
void ofi_peer_forget(struct ofi_rail *rl, const char *id);
/* Removes peer id's entry (fi_av_remove) when idle: a peer that failed. */
void ofi_peer_evict(struct ofi_rail *rl, const char *id);
/* The libfabric error text of a CQ error entry. */
const char *ofi_cq_errtext(struct ofi_rail *rl, const struct fi_cq_err_entry *e, char *buf,
			   size_t cap);

/* access.c */
int ofi_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		 struct sc_err *err);
void ofi_deregister(struct sc_backend *b, void *handle);
int ofi_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs, const int *gpus,
	       void *const *region_handles, void **handle, struct sc_err *err);
void ofi_revoke(struct sc_backend *b, void *handle);
/* The local descriptor of a region's MR on rail r (NULL when the provider needs none). */
void *ofi_region_desc(void *region_handle, size_t r);

/* xfer.c */
int ofi_xfer_start(struct ofi_backend *ob, struct sc_err *err);
void ofi_xfer_stop(struct ofi_backend *ob);
int ofi_xfer_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err);
void ofi_xfer_cancel(struct sc_backend *b, struct sc_xfer *x);
/* Frees the kept transfers' records: after every rail is closed (no completion can come). */
void ofi_xfer_free_kept(struct ofi_backend *ob);
/* A completion (err NULL) or an error entry for one posted request: the progress thread. */
void ofi_xfer_completed(struct ofi_rail *rl, void *op_context, const struct fi_cq_err_entry *err);

#endif
