/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/internal.h: the ibverbs backend's private structures and cross-file prototypes, shared by
 * the files of ib/ and nothing else (built only when libibverbs is found):
 *
 *   ib/backend.c  the ops tables (one rail, several lanes); create, start, stop, destroy
 *   ib/device.c   one rail's object (struct ib_backend): new (ops handed in), open a rail's
 *                 device (context, PD, port, GID, limits), free
 *   ib/port.c     a port's facts: MTU, GID choice and text, lane pairing (ib_lane_remote)
 *   ib/rails.c    the rails: every port of every device, their facts and state
 *   ib/lanes.c    one lane (a struct ib_backend of its own) per usable rail: opening the others,
 *                 registering regions and granting access on every lane, the metadata's rails
 *   ib/stripe.c   striped transfers: one OPEN/DONE, slices spread over the lane pairs, failover
 *   ib/access.c   region MRs (one per region) and per-operation remote access (expose/revoke):
 *                 type-1 memory windows, one per (operation, region), or MRs where there are none
 *   ib/qp.c       RC queue pairs per peer sidecar: the QP_CONNECT rendezvous on the peer control
 *                 channel (both sides), the cache of outgoing QPs, tombstones, incoming QPs
 *   ib/qp_wire.c  the QP_CONNECT body: encode, decode, this side's half
 *   ib/xfer.c     transfers: setup/finish on worker threads, RDMA READ/WRITE posting and the
 *                 completion thread (CQ, async events, deadlines, cancel)
 *   ib/retry.c    moving a transfer to a fresh QP when its shared QP failed for another's reason
 *   ib/notify.c   the completion notice: a SEND behind a transfer's last work request, the
 *                 receive buffers of incoming QPs, and what their receive completions complete
 *
 * Calls between them go one way (no loop): backend.c > stripe.c > lanes.c > xfer.c > retry.c >
 * qp.c > qp_wire.c, notify.c; lanes.c > device.c > access.c; xfer.c > rails.c; port.c, under
 * all of them, calls none. A lower file that needs a higher one's function gets it handed in (ib_backend_new's ops).
 *
 * Locking: one mutex, ib->mu, guards everything mutable here (peer table, QP lists and credits,
 * transfer list and states, task queue). It is never held while calling the engine (on_progress,
 * on_complete, backend/passive.h), doing socket I/O, or destroying a QP (ibv_destroy_qp waits for
 * the async-event thread, which takes ib->mu). The engine lock, when held (submit, cancel, expose,
 * revoke, register), always comes first.
 *
 * Lifetime: a struct ib_qp is reference counted under ib->mu: the cache holds one reference while
 * it names the QP, each transfer using it one more. A transfer keeps its reference until all of
 * its work requests have completed (or been flushed), so the QP (and the memory its work requests
 * touch) outlives every work request posted on it.
 */
#ifndef SC_IB_INTERNAL_H
#define SC_IB_INTERNAL_H

#include "backend/backend.h"
#include "conf/config.h"
#include "meta/metadata.h"
#include "peer/server.h"
#include "base/types.h"
#include "base/status.h"
#include "base/timer.h"
#include "backend/xfer_runner.h"

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct sc_peer_conn;
struct sc_peer_pool;
struct ib_xfer;

/* Queue pair parameters (DESIGN section 5; the brief of issue 4). */
#define IB_QP_TIMEOUT 14 /* 4.096 us * 2^14 = 67 ms per try */
#define IB_QP_RETRY_CNT 7
#define IB_QP_RNR_RETRY 7
#define IB_QP_MIN_RNR_TIMER 12
#define IB_MAX_RD_ATOMIC 16		/* capped to the device's limits */
#define IB_MAX_SGE 16			/* gathered local pieces per work request (capped) */
#define IB_SQ_DEPTH 128			/* send queue of an outgoing QP (capped to max_qp_wr) */
/* Overridable at build time (-DIB_CHUNK_MAX=...) for the Soft-RoCE bench's A/B runs. */
#ifndef IB_CHUNK_MAX
#define IB_CHUNK_MAX (1u << 20) /* one work request moves at most this (and max_msg_sz) */
#endif
#define IB_XFER_WINDOW 32 /* work requests one transfer keeps in flight... */
#ifndef IB_XFER_WINDOW_BYTES
#define IB_XFER_WINDOW_BYTES (8u << 20) /* ...and bytes */
#endif
#define IB_TOMBSTONE_MS 2000		/* a peer whose QP failed is refused this long */
#define IB_XFER_MOVES 2 /* a transfer moves to a fresh QP at most this often (ib/retry.c) */
#define IB_VERIFY_IDLE_MS 5000 /* a cached QP idle this long is checked with the peer first */
/* --ib-max-qps (ib->max_qps) caps outgoing QPs (one per peer sidecar) and incoming ones
 * (created for requesting peers), each, per lane. An incoming QP whose peer made no request for
 * this long expires (the peer server's idle time for connections, peer/server.h). */
#define IB_IN_IDLE_MS SC_PEER_SERVER_IDLE_MS
#define IB_IN_EXPIRE_CHECK_MS 1000 /* how often the completion thread looks for them */
#define IB_MAX_IN_PER_PEER 4   /* older incoming QPs of a peer beyond this are dropped */

/* One posted work request; wr_id points at it. Records live in an array per outgoing QP. */
struct ib_wr {
	struct ib_qp *qp;
	struct ib_xfer *xf;
	uint32_t len;
	bool read;
	bool notice; /* the completion notice (ib/notify.c), len 0 */
	struct ib_wr *next_free;
	struct ib_wr *posted_next; /* the QP's posted list, in posting order */
};

struct ib_notice_ring;

/* A GPU region's MR that the NIC driver would not register with window binding (ib/access.c). */
struct ib_nobind {
	const struct ibv_mr *mr;
	struct sc_list node; /* ib->nobind */
};

struct ib_qp {
	struct ib_backend *ib;
	struct ibv_qp *qp;
	struct ibv_cq *cq; /* the shared CQ, or a private one (test probe) */
	char peer[SC_NAME_MAX];
	bool incoming; /* created by the QP_CONNECT handler for a requesting peer */
	uint32_t remote_qpn;
	uint32_t path_mtu; /* bytes */
	uint64_t created_mono_ms;
	uint64_t last_used_mono_ms;
	uint64_t used_seq; /* incoming: ib->use_seq when last used (orders ties exactly) */
	uint64_t busy_round; /* incoming: the eviction round that found its peer busy */
	uint64_t last_ok_mono_ms; /* a work request completed (or the peer vouched for it) */
	int refs;		  /* under ib->mu */
	/* Outgoing only, under ib->mu. */
	uint32_t sq_depth, max_rd;
	uint32_t outstanding, reads_out;
	struct ib_wr *wrs; /* sq_depth records */
	struct ib_wr *free_wrs;
	/* Posted, not yet retired, in posting order. Only some work requests are signalled: a
	 * signalled completion retires every earlier one on the QP too (an RC send queue completes
	 * in order); a failed or flushed one has its own completion, signalled or not. */
	struct ib_wr *posted_head, *posted_tail;
	bool broken;   /* failed or flushed: never used for new work */
	bool flushing; /* moved to ERR to flush its work requests */
	char why[SC_ERR_MSG_MAX / 2];
	/* The completion notice (ib/notify.c): outgoing, send buffers, one per ib_wr; incoming,
	 * posted receive buffers. NULL: this QP carries no notices. */
	struct ib_notice_ring *nr;
	uint32_t gen;	  /* names the QP in receive wr_ids (never reused) */
	bool peer_notice; /* outgoing: the peer's QP_CONNECT reply said it takes notices */
	uint8_t remote_lane; /* outgoing: the peer's rail it is connected to (QP_CONNECT) */
	struct sc_list node; /* on ib->out_qps or ib->in_qps (newest first) */
};

/* A peer sidecar as seen by the outgoing side: its cached QP or its tombstone. */
struct ib_peer {
	char id[SC_NAME_MAX];
	struct ib_qp *qp;	 /* cached, healthy; holds a reference */
	bool connecting;	 /* one thread is running the rendezvous */
	uint64_t failed_mono_ms; /* tombstone: when the last attempt failed (0: none) */
	uint64_t retry_mono_ms;	 /* refused until then */
	char why[SC_ERR_MSG_MAX / 2];
	uint32_t prev_qpn; /* our last QP to it, so its side can drop the partner */
	struct sc_list node; /* on ib->peers (newest first) */
};

enum ib_task {
	IB_TASK_NONE = 0,
	IB_TASK_SETUP,	/* get a QP, OPEN on the control channel, then hand over to posting */
	IB_TASK_PING,	/* keep the control connection (which holds the OPEN) alive */
	IB_TASK_FINISH, /* DONE to the passive side, then on_complete */
	IB_TASK_MOVE,	/* its QP failed under it, its work requests are back: a fresh QP */
};

/* A transfer's completion notice (ib/notify.c). */
enum ib_notice {
	IB_NOTICE_NONE = 0, /* not posted yet */
	IB_NOTICE_POSTED,   /* posted behind the last data work request */
	IB_NOTICE_UNUSED,   /* the QP or peer takes none: DONE goes on the control connection */
};

enum ib_xstate {
	IB_XS_SETUP,
	IB_XS_RUNNING,
	IB_XS_FINISHING,
};

struct ib_xfer {
	/* The transfer (xr.x), stop flag and first failure (under ib->mu); live in ib->xr. */
	struct sc_xr_xfer xr;
	struct sc_xr_task run; /* task is what it runs */
	struct ib_backend *ib;
	struct ib_qp *qp;	   /* reference held from setup to finish */
	struct sc_peer_conn *conn; /* the control connection the OPEN went over */
	int endpoint;		   /* index into x->meta->endpoints that answered; -1 before */
	bool opened;
	bool data_only; /* a slice of a striped transfer (ib/stripe.c): no OPEN, notice or DONE */
	enum ib_xstate state;
	/* Under ib->mu. */
	struct sc_xr_cursor cur; /* next chunk to post */
	uint32_t outstanding;
	uint64_t bytes_out; /* in flight */
	uint64_t bytes_acked;
	uint64_t progress; /* acked but not yet reported */
	enum ib_task task; /* queued or running on a worker (NONE: neither) */
	bool want_finish; /* finish once the running task returns */
	enum ib_notice notice;
	uint64_t last_ping_mono_ms;
	uint64_t last_progress_mono_ms; /* a work request of it completed, or it began posting */
	bool moving;		 /* its QP failed under it: drain, then move (ib/retry.c) */
	unsigned moves;		 /* moves to a fresh QP so far */
	uint64_t moving_mono_ms; /* when the current move began */
	uint64_t t_submit_us, t_opened_us, t_posted_us, t_acked_us; /* for the debug log */
};

/* A port and GID chosen on an open device. */
struct ib_pick {
	uint8_t port;
	struct ibv_port_attr pa;
	int gid_index;
	union ibv_gid gid;
	unsigned gid_type;
	uint32_t ndev_ifindex; /* the GID's netdev (RoCE), 0 unknown */
};

/* What a rail of the backend is (ib/rails.c): the device and port behind base.rails[i]. */
struct ib_rail_port {
	char dev[64];
	struct ib_pick pick; /* port, attributes, GID (when usable) */
	bool usable;	     /* port ACTIVE with a GID, not excluded */
};

struct ib_lane_regs;
struct ib_stripe;

struct ib_backend {
	struct sc_backend base;
	struct ib_rail_port rail_port[SC_MAX_RAILS]; /* base.rails[i]'s device and port */
	int rail; /* the rail data moves on (its device is ctx); -1 none */
	/*
	 * Lanes (ib/lanes.c): the backend the registry holds is lane 0, on the first usable rail;
	 * every other usable rail is a lane of its own, a struct ib_backend made by lane 0 with its
	 * own device, PD, CQ, threads and QP cache, never seen by the registry. Rails, their state
	 * and counters live on lane 0's base (top). Fixed after create.
	 */
	struct ib_backend *primary; /* lane 0 (itself there) */
	struct sc_backend *top;	    /* &primary->base */
	unsigned lane;		    /* this one's number; the metadata's IbverbsRail.index */
	struct ib_backend *lanes[SC_MAX_IB_RAILS]; /* lane 0 only: [0] itself */
	size_t n_lanes;				   /* lane 0 only */
	struct ib_lane_regs *regs; /* lane 0 with n_lanes > 1: per-lane MRs of each region */
	pthread_mutex_t regs_mu;
	uint64_t stripe_min, slice_bytes; /* --ib-stripe-min, --ib-slice-size */
	struct ib_stripe *stripe;	  /* lane 0: lane-pair health, striped transfers */
	struct sc_peer_pool *pool;
	struct sc_peer_server *srv;
	char self_id[SC_NAME_MAX];

	/* The chosen device and port (fixed after create). */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	char dev_name[64];
	uint8_t port;
	int gid_index;
	union ibv_gid gid;
	uint16_t lid;
	enum ibv_mtu active_mtu;
	uint8_t link_layer;
	uint32_t max_msg; /* chunk size: min(max_msg_sz, IB_CHUNK_MAX) */
	uint32_t max_qp_wr;
	uint32_t max_init_rd; /* min(IB_MAX_RD_ATOMIC, max_qp_init_rd_atom) */
	uint32_t max_dest_rd; /* min(IB_MAX_RD_ATOMIC, max_qp_rd_atom) */
	uint32_t max_sge;     /* scatter/gather entries per work request (capped) */
	uint32_t max_sge_rd;  /* ... per RDMA READ */
	uint64_t stall_ms;    /* --ib-stall-timeout: no completion this long stops a transfer */

	/* Remote access (ib/access.c), fixed after create except the bind QP. */
	bool grant_mw;	      /* type-1 memory windows; else an MR per (operation, region) */
	bool mw_unbounded;    /* tests only: windows used although the device does not bound them */
	char grant_why[200];  /* which, and why: part of GetInfo's detail */
	pthread_mutex_t bind_mu; /* the bind QP */
	bool bind_mu_init;
	struct ibv_cq *bind_cq;
	struct ibv_qp *bind_qp; /* RC, connected to itself; NULL after a failed bind */
	struct sc_list nobind; /* struct ib_nobind: GPU region MRs without window binding (bind_mu) */

	/* Started by start(). */
	struct ibv_comp_channel *chan;
	struct ibv_cq *cq;
	int wake_fd; /* eventfd: wakes the completion thread */
	pthread_t cq_thread;
	bool cq_thread_running;
	bool handler_set;
	uint32_t cq_cap; /* CQ entries: work requests in flight, all QPs together */

	pthread_mutex_t mu;
	pthread_cond_t cv; /* connects ended */
	/* The transfer runner (worker threads, task queue, transfers in flight), under mu. */
	struct sc_xr xr;
	atomic_bool cq_stop;
	uint32_t cq_out; /* work requests in flight on the shared CQ */
	struct sc_list peers;		/* struct ib_peer */
	struct sc_list out_qps, in_qps; /* struct ib_qp */
	size_t n_out, n_in;
	uint32_t max_qps;   /* --ib-max-qps: n_out and n_in each stay within it */
	uint64_t in_idle_ms; /* IB_IN_IDLE_MS (tests: SC_TEST_IB_QP_IDLE_MS) */
	uint64_t use_seq;   /* orders uses of incoming QPs (LRU) */
	uint64_t evict_round;
	uint64_t last_expire_mono_ms; /* the completion thread's alone (ib_qp_expire_idle) */
	atomic_uint_fast64_t n_grants; /* live exposures, for the destroy check */

	/* The completion notice (ib/notify.c). */
	uint32_t notice_recvs;		/* receives posted per incoming QP (0: notices off) */
	atomic_uint_fast32_t notice_gen; /* the last ib_qp.gen handed out */
	struct ib_notice_msg *notes;	/* received, to deliver outside ib->mu (CQ thread) */
	size_t n_notes, cap_notes;
	atomic_uint_fast64_t n_notice_sent, n_notice_done; /* acked by the peer / completed here */
};

static inline struct ib_backend *to_ib(struct sc_backend *b)
{
	return container_of(b, struct ib_backend, base);
}

/* ib/port.c */
/* The GID of (ctx, p->port, p->pa): index `want` (>= 0), else the first RoCE v2 one with an IPv4
 * address (Ethernet), else index 0 (InfiniBand). -1 with why filled when there is none. */
int ib_pick_gid(struct ibv_context *ctx, const char *dev, struct ib_pick *p, int want, char *why,
		size_t cap);
const char *ib_gid_type_name(unsigned t);
uint32_t ib_mtu_bytes(enum ibv_mtu m);
enum ibv_mtu ib_mtu_from_bytes(uint32_t bytes);
void ib_gid_text(const union ibv_gid *gid, char *out, size_t cap);
/* The issuer's rail (its lane number) that lane ib pairs with for md: rail i to rail i modulo
 * the issuer's rail count (0 when md lists no other rails). */
unsigned ib_lane_remote(const struct ib_backend *ib, const struct sc_metadata *md);

/* ib/device.c */
/* A backend object with its locks and lists, no device yet (lane 0 or another lane); its
 * base.ops is `ops` (the caller's table: ib/backend.c's). */
struct ib_backend *ib_backend_new(const struct sc_backend_env *env,
				  const struct sc_backend_ops *ops);
/* Open rail r's device into ib (ctx, PD, port, GID, limits, remote access). 0 or -1 with why. */
int ib_open_rail(struct ib_backend *ib, struct ibv_device **list, int n, size_t r, char *why,
		 size_t cap);
/* Free a stopped lane: CQ, channel, bind QP, PD, device, the object. */
void ib_backend_free(struct ib_backend *ib);

/* ib/rails.c */
/* Fill ib->base.rails and ib->rail_port from the devices in list: every port, in --ib-devices
 * (or --ib-device / --ib-port) order, with state and facts. why receives the first reason a
 * rail is not usable (for detail when none is). Main thread, at create. */
void ib_rails_discover(struct ib_backend *ib, const struct sc_config *cfg,
		       struct ibv_device **list, int n, char *why, size_t cap);
/* After the data rail is open: say on the other usable rails that they carry no data yet. */
void ib_rails_mark_data_rail(struct ib_backend *ib);
/* A port event of the open device (IBV_EVENT_PORT_ERR / PORT_ACTIVE). Completion thread. */
void ib_rails_port_event(struct ib_backend *ib, uint8_t port, bool active, const char *what);

/* ib/lanes.c */
/* Open a lane on every usable rail after the first (lane 0, ib, is open), each with lane_ops
 * (the one-rail table). Main thread, create. */
void ib_lanes_open(struct ib_backend *ib, const struct sc_backend_ops *lane_ops,
		   struct ibv_device **list, int n);
int ib_lanes_start(struct ib_backend *ib, struct sc_err *err);
void ib_lanes_stop(struct ib_backend *ib);
void ib_lanes_destroy(struct ib_backend *ib);
/* The lane-k MR of the region whose lane-0 registration is mr0 (NULL: none). Any thread. */
struct ibv_mr *ib_lane_mr(struct ib_backend *ib, const void *mr0, unsigned k);
/* Whether lane 0 holds the region of lane-0 MR mr0 only for the handle: the topology (or, in
 * tests, SC_TEST_IB_HOST_RAILS) puts its memory nearer other rails, so transfers of it leave
 * lane 0 out. Any thread. */
bool ib_lane_far0(struct ib_backend *ib, const void *mr0);
/* The registry's ops when there are several lanes (else ib_register & co directly). */
int ib_lanes_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		      struct sc_err *err);
void ib_lanes_deregister(struct sc_backend *b, void *handle);
int ib_lanes_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		    const int *gpus, void *const *region_handles, void **handle,
		    struct sc_err *err);
void ib_lanes_revoke(struct sc_backend *b, void *handle);

/* ib/stripe.c */
int ib_stripe_init(struct ib_backend *ib);
void ib_stripe_fini(struct ib_backend *ib);
/* submit/cancel of lane 0: striped when large enough and two lane pairs are usable, else the
 * whole transfer on lane 0 exactly as ib_xfer_submit. */
int ib_stripe_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err);
void ib_stripe_cancel(struct sc_backend *b, struct sc_xfer *x);
/* Cancel every striped transfer (stop). */
void ib_stripe_stop(struct ib_backend *ib);

/* ib/access.c */
/* Choose how passive operations get remote access (sets grant_mw, grant_why; makes the bind QP).
 * After the PD and port are chosen. */
void ib_access_init(struct ib_backend *ib, const struct ibv_device_attr *da);
/* Destroy the bind QP (every grant revoked before). */
void ib_access_fini(struct ib_backend *ib);
int ib_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		struct sc_err *err);
void ib_deregister(struct sc_backend *b, void *handle);
int ib_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
	      const int *gpus, void *const *region_handles, void **handle, struct sc_err *err);
void ib_revoke(struct sc_backend *b, void *handle);

/* ib/qp.c */
/* Register / remove the QP_CONNECT handler on the engine's peer server. */
int ib_qp_start(struct ib_backend *ib, struct sc_err *err);
void ib_qp_stop_handler(struct ib_backend *ib);
/*
 * A healthy RC QP to the issuer of md (cached, or set up now over the control channel), with a
 * reference for the caller (ib_qp_put it). When conn is not NULL, *conn receives an authenticated
 * control connection to the peer (the caller puts it back) and *endpoint its index in
 * md->endpoints: the one the QP was connected over, or for a cached QP one from the pool; a cached
 * QP is checked with the peer first when that one had to be dialled anew (the peer may have
 * restarted). Errors: UNAVAILABLE (peer unreachable, tombstoned, its ibverbs not running),
 * RESOURCE_EXHAUSTED (QP cap), DEADLINE_EXCEEDED, CANCELLED, UNAUTHENTICATED, INTERNAL (verbs).
 * Worker threads.
 */
int ib_qp_get(struct ib_backend *ib, const struct sc_metadata *md, uint64_t deadline_mono_ms,
	      const atomic_bool *cancel, struct ib_qp **out, struct sc_peer_conn **conn,
	      int *endpoint, struct sc_err *err);
/* ConnectPeer: a QP to md's issuer (cached, or set up now) and a pooled control connection, so
 * that its first transfer finds both. The backend's connect op. gRPC worker thread. */
int ib_connect(struct sc_backend *b, const struct sc_metadata *md, uint64_t deadline_mono_ms,
	       char *detail, size_t cap, struct sc_err *err);
/* Drop a reference; the last one destroys the QP. Never under ib->mu. */
void ib_qp_put(struct ib_backend *ib, struct ib_qp *qp);
/* The QP failed (a work completion error, an async event, a post failure): no new work goes to
 * it, the cache forgets it (dropping the cache's reference into *drop, for the caller to put
 * after unlocking), and, when `tombstone`, the peer is refused for IB_TOMBSTONE_MS. Under ib->mu.
 */
void ib_qp_fail_locked(struct ib_backend *ib, struct ib_qp *qp, bool tombstone, const char *why,
		       struct ib_qp **drop);
/* Move a QP to ERR so that its outstanding work requests are flushed. Any thread. */
void ib_qp_flush(struct ib_qp *qp);
/* An async event named this QP (IBV_EVENT_QP_FATAL & co). Completion thread. */
void ib_qp_async_error(struct ib_backend *ib, struct ibv_qp *qp, const char *what);
/* Drop every cached and incoming QP (stop/destroy): cached ones once their transfers are done. */
void ib_qp_drop_all(struct ib_backend *ib);
/* Destroy the incoming QPs whose peer has been idle for IB_IN_IDLE_MS (checked at most every
 * IB_IN_EXPIRE_CHECK_MS). Completion thread, not under ib->mu. */
void ib_qp_expire_idle(struct ib_backend *ib);
/* An incoming QP was used (a completion notice arrived on it). Under ib->mu. */
static inline void ib_qp_touch_in_locked(struct ib_backend *ib, struct ib_qp *q)
{
	q->last_used_mono_ms = sc_clock_mono_ms();
	q->used_seq = ++ib->use_seq;
}

/* ib/qp_wire.c: the QP_CONNECT body (its wire format is described there). */
#define QPC_VERSION 1
#define QPC_REQUEST 1
#define QPC_REPLY 2
#define QPC_VERIFY 3
#define QPC_VERIFY_REPLY 4
#define QPC_F_NOTICE 1
#define QPC_FIXED 48
#define QPC_MAX (QPC_FIXED + 2 + SC_NAME_MAX + 1)

struct ib_qpc {
	uint8_t op;
	uint16_t status;
	uint32_t qpn, psn;
	uint8_t gid[16];
	uint16_t lid;
	uint8_t link_layer;
	uint8_t flags;
	uint32_t mtu;
	uint32_t max_rd, max_dest_rd;
	uint32_t prev_qpn;
	char id[SC_NAME_MAX];
	uint8_t lane; /* the responder's rail asked for (0: the first) */
};
/* Encode m into out: its length, 0 when cap is too small or the id too long. */
size_t ib_qpc_encode(const struct ib_qpc *m, uint8_t *out, size_t cap);
/* Decode and check a body of op want_op into m. 0, or -1 with err (INVALID_ARGUMENT). */
int ib_qpc_decode(const uint8_t *in, size_t len, uint8_t want_op, struct ib_qpc *m,
		  struct sc_err *err);
/* This side's half for QP q of lane ib: op, qpn, psn, GID, LID, MTU, RDMA READ depths, self id. */
void ib_qpc_fill_local(struct ib_backend *ib, struct ib_qp *q, uint8_t op, uint32_t psn,
		       struct ib_qpc *m);

/* ib/xfer.c */
/* A transfer whose RDMA path failed (UNAVAILABLE, its own rails' fault): when the engine may move
 * it to tcp (x->fallback_ok), it was OPENed, and the peer still answers on the control connection
 * c and takes this attempt back (DONE ABORTED, its use stays open), count the failover on `rails`
 * and return true: the caller completes with SC_ABORTED and tells no verdict. Else false: tell the
 * verdict as usual. Worker threads. */
bool ib_hand_to_tcp(struct ib_backend *ib, struct sc_xfer *x, struct sc_peer_conn *c, bool opened,
		    const char *msg, size_t n_rails, const int *rails);
int ib_xfer_start(struct ib_backend *ib, struct sc_err *err);
/* Whether every chunk of the transfer has been posted. Under ib->mu. */
static inline bool ib_xfer_all_posted(const struct ib_xfer *xf)
{
	return sc_xr_cursor_done(&xf->cur, xf->xr.x);
}
/* Post nothing more (cancelled, failed, stopping). Under ib->mu. */
static inline bool ib_xfer_stopped(const struct ib_xfer *xf)
{
	return atomic_load_explicit(&xf->xr.stop, memory_order_relaxed);
}
/* The transfers in flight. */
#define IB_FOR_EACH_XFER(ib, xf)                                                                   \
	for (struct sc_list *xr_ = (ib)->xr.live.next;                                             \
	     xr_ != &(ib)->xr.live && ((xf) = container_of(xr_, struct ib_xfer, xr.node), 1);      \
	     xr_ = xr_->next)
void ib_xfer_stop(struct ib_backend *ib);
int ib_xfer_submit(struct sc_backend *b, struct sc_xfer *x, struct sc_err *err);
/* A slice of a striped transfer on lane ib: data only (no OPEN, no completion notice, no DONE:
 * the striped transfer does those once). x->meta's endpoints reach the issuer. */
int ib_xfer_submit_slice(struct ib_backend *ib, struct sc_xfer *x, struct sc_err *err);
void ib_xfer_cancel(struct sc_backend *b, struct sc_xfer *x);

/* ib/retry.c */
/* xf's QP failed for a reason that is not xf's own: 1 it moves to a fresh QP once its work
 * requests are back (xf->moving; also when nothing is left to move), 0 it is stopping anyway
 * (keep its reason), -1 it has moved IB_XFER_MOVES times already (fail it). Under ib->mu. */
int ib_retry_begin_locked(struct ib_xfer *xf);
/* A fresh QP to xf's peer with a reference for xf, within its deadline. Worker, not under ib->mu. */
int ib_retry_fresh_qp(struct ib_xfer *xf, struct ib_qp **out, struct sc_err *err);
/* Put xf on the fresh QP and rewind it to its first byte not known complete; *old receives the
 * failed QP's reference (put it after unlocking). Under ib->mu. */
void ib_retry_resume_locked(struct ib_xfer *xf, struct ib_qp *fresh, struct ib_qp **old);
/* A work request was posted on its QP: append it to the QP's posted list. Under ib->mu. */
static inline void ib_wr_posted_locked(struct ib_qp *qp, struct ib_wr *w)
{
	w->posted_next = NULL;
	if (qp->posted_tail)
		qp->posted_tail->posted_next = w;
	else
		qp->posted_head = w;
	qp->posted_tail = w;
}

/* ib/notify.c */
/* CQ entries to reserve for the receives of incoming QPs; sets ib->notice_recvs (0 when the
 * device's max_cqe leaves no room: notices off). Called once before the CQ is created. */
uint32_t ib_notice_cq_reserve(struct ib_backend *ib, uint32_t max_cqe, uint32_t send_cqe);
/* max_recv_wr for a new QP (incoming: ib->notice_recvs). */
uint32_t ib_notice_recv_wr(const struct ib_backend *ib, bool incoming);
/* A new QP: its notice buffers (registered). Failing leaves q->nr NULL (no notices), logged. */
void ib_notice_qp_init(struct ib_backend *ib, struct ib_qp *q);
/* After ibv_destroy_qp: deregister and free the buffers. */
void ib_notice_qp_fini(struct ib_qp *q);
/* Incoming QP in INIT or later: post every receive buffer. True when the QP takes notices (the
 * QP_CONNECT reply says so). Before the QP is linked into ib->in_qps. */
bool ib_notice_post_recvs(struct ib_backend *ib, struct ib_qp *q);
/* Active side, after posting data: when every chunk is out, post the notice (or mark it
 * unused). Under ib->mu. */
void ib_notice_maybe_post_locked(struct ib_backend *ib, struct ib_xfer *xf);
/* A work completion that is a receive (a notice arrived, or a flushed receive): handled here,
 * true. Anything else: false. Under ib->mu, completion thread. */
bool ib_notice_wc_locked(struct ib_backend *ib, const struct ibv_wc *wc);
/* Hand the notices received to the engine. Completion thread, not under ib->mu. */
void ib_notice_deliver(struct ib_backend *ib);
/* Free what the completion thread kept (after it ended). */
void ib_notice_stop(struct ib_backend *ib);

/* Little-endian fields of the QP_CONNECT message and the completion notice. */
static inline void ib_put_le(uint8_t *p, uint64_t v, size_t width)
{
	for (size_t i = 0; i < width; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t ib_get_le(const uint8_t *p, size_t width)
{
	uint64_t v = 0;
	for (size_t i = 0; i < width; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* The log fields (base/log.h) of transfer x on ibverbs, for SC_*_KV. */
#define IB_XFER_FIELDS(x)                                                                          \
	(&(struct sc_log_fields){.op = (x)->op_id, .peer = (x)->meta->issuer,                      \
				 .backend = "ibverbs", .trace_id = (x)->trace_id})

#endif
