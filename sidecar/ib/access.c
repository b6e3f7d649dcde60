/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/access.c: memory registration and per-operation remote access for the ibverbs backend, one
 * lane at a time (ib/lanes.c repeats it on every lane). Regions: one MR per region with local
 * access only (register_region / deregister_region). Passive operations: one grant per
 * (operation, region), a type-1 memory window bound through a private RC QP connected to itself
 * where the device keeps a window's rkey inside the window, else an MR with remote access
 * (expose / revoke). How, and why: below.
 *
 * Threads: engine threads under the engine lock; ib_access_init / ib_access_fini with the lane's
 * device (ib/device.c: create and destroy, main thread).
 * Owns: the bind QP and its CQ (made at create, destroyed at destroy), the grants.
 */
#include "ib/internal.h"

#include "gpu/gpu.h"
#include "base/log.h"
#include "base/timer.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/*
 * Regions: one MR per region, made when the region is published (register_region, engine
 * threads under the engine lock) and deregistered with it (deregister_region, at the region's
 * last reference, after every operation on it has revoked its access). Its access is local write
 * plus, when memory windows are in use, MW_BIND; never remote access, so the region MR's own rkey
 * (never sent anywhere) grants nothing. The active side posts from and into it (its lkey).
 * GPU regions get the same one MR per region: a dma-buf MR, or an MR through nvidia_peermem.
 *
 * Passive operations (expose/revoke, engine threads under the engine lock): remote access to one
 * operation's bytes, one grant per (operation, region) over the operation's span inside that
 * region (lowest descriptor start to highest descriptor end); every descriptor of that region in
 * that operation carries the same rkey, and remote_addr is the descriptor's virtual address.
 *   - type-1 memory windows (the device has IBV_DEVICE_MEM_WINDOW, a type-1 window could be
 *     allocated, and a start-up self-test shows that the device keeps a window's rkey inside the
 *     window: rxe on Linux 6.1 does not, it checks window accesses against the MR only): one
 *     window per (operation, region), bound with ibv_bind_mw on the region's MR
 *     through a private RC QP connected to itself (binding is a work request, and a type-1 window
 *     is not tied to that QP: every QP of the protection domain honours it). revoke deallocates
 *     the windows, after which their rkeys fail with IBV_WC_REM_ACCESS_ERR. Type-2 windows are
 *     not used: a type-2 window only works through the QP it was bound on, and the QP a peer will
 *     use is not known when the metadata is issued (and may change: ib/retry.c);
 *   - otherwise one MR per (operation, region span) with REMOTE_READ or REMOTE_WRITE, deregistered
 *     by revoke.
 * GetInfo's detail says which, and why (ib->grant_why).
 */

#define BIND_DEPTH 64	  /* send queue of the bind QP: binds posted before a wait */
#define BIND_WAIT_MS 5000 /* a bind's completion never takes this long */

/* ---- the bind QP ----------------------------------------------------------------------------- */

static void bind_qp_destroy(struct ib_backend *ib)
{
	if (ib->bind_qp && ibv_destroy_qp(ib->bind_qp) != 0)
		SC_WARN("ibverbs", "destroying the bind QP: %s", strerror(errno));
	ib->bind_qp = NULL;
	if (ib->bind_cq && ibv_destroy_cq(ib->bind_cq) != 0)
		SC_WARN("ibverbs", "destroying the bind CQ: %s", strerror(errno));
	ib->bind_cq = NULL;
}

/* An RC QP connected to itself, in RTS, on its own CQ: what ibv_bind_mw posts on. */
static int bind_qp_create(struct ib_backend *ib, char *why, size_t cap)
{
	const char *step = "ibv_create_cq";
	int rc = 0;
	ib->bind_cq = ibv_create_cq(ib->ctx, BIND_DEPTH, NULL, NULL, 0);
	if (!ib->bind_cq) {
		rc = errno;
		goto fail;
	}
	struct ibv_qp_init_attr ia = {
	    .send_cq = ib->bind_cq,
	    .recv_cq = ib->bind_cq,
	    .cap = {.max_send_wr = BIND_DEPTH,
		    .max_recv_wr = 1,
		    .max_send_sge = 1,
		    .max_recv_sge = 1},
	    .qp_type = IBV_QPT_RC,
	    .sq_sig_all = 0,
	};
	step = "ibv_create_qp";
	ib->bind_qp = ibv_create_qp(ib->pd, &ia);
	if (!ib->bind_qp) {
		rc = errno;
		goto fail;
	}
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_INIT,
	    .pkey_index = 0,
	    .port_num = ib->port,
	    .qp_access_flags = IBV_ACCESS_REMOTE_READ, /* the bounds self-test reads from itself */
	};
	step = "ibv_modify_qp to INIT";
	rc = ibv_modify_qp(ib->bind_qp, &a,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc != 0)
		goto fail;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = ib->active_mtu;
	a.dest_qp_num = ib->bind_qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = IB_QP_MIN_RNR_TIMER;
	a.ah_attr.dlid = ib->lid;
	a.ah_attr.port_num = ib->port;
	if (ib->link_layer == IBV_LINK_LAYER_ETHERNET || ib->lid == 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = ib->gid;
		a.ah_attr.grh.sgid_index = (uint8_t)ib->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	step = "ibv_modify_qp to RTR";
	rc = ibv_modify_qp(ib->bind_qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc != 0)
		goto fail;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = IB_QP_TIMEOUT;
	a.retry_cnt = IB_QP_RETRY_CNT;
	a.rnr_retry = IB_QP_RNR_RETRY;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	step = "ibv_modify_qp to RTS";
	rc = ibv_modify_qp(ib->bind_qp, &a,
			   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc != 0)
		goto fail;
	return 0;
fail:
	snprintf(why, cap, "the QP that binds windows could not be set up: %s: %s", step,
		 strerror(rc ? rc : EINVAL));
	bind_qp_destroy(ib);
	return -1;
}

/* Poll the bind CQ for one completion, up to ms; its status, or -1 when none came. */
static int poll_one(struct ib_backend *ib, uint64_t ms)
{
	uint64_t until = sc_clock_mono_ms() + ms;
	struct ibv_wc wc;
	for (;;) {
		int got = ibv_poll_cq(ib->bind_cq, 1, &wc);
		if (got < 0)
			return -1;
		if (got == 1)
			return (int)wc.status;
		if (sc_clock_mono_ms() > until)
			return -1;
		sched_yield();
	}
}

/*
 * Does the device keep a window's rkey inside the window? Through the bind QP (connected to
 * itself): bind a window over the first 4 KiB of an 8 KiB buffer, RDMA READ 1 KiB inside it
 * (must succeed: the check itself works) and 1 KiB just past it (must fail). Soft-RoCE on Linux
 * 6.1 checks a window's accesses against its MR only, so the second READ succeeds there. Returns
 * 1 bounded, 0 not (why says so), -1 the check could not run (why). The bind QP is made anew
 * afterwards (a failed READ leaves it in the error state).
 */
static int mw_bounds_selftest(struct ib_backend *ib, char *why, size_t cap)
{
	int res = -1;
	uint8_t *buf = aligned_alloc(4096, 8192);
	struct ibv_mr *mr = NULL;
	struct ibv_mw *mw = NULL;
	if (!buf) {
		snprintf(why, cap, "window self-test: out of memory");
		return -1;
	}
	memset(buf, 0x5a, 8192);
	mr = ibv_reg_mr(ib->pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	mw = mr ? ibv_alloc_mw(ib->pd, IBV_MW_TYPE_1) : NULL;
	if (!mw) {
		snprintf(why, cap, "window self-test: %s: %s", mr ? "ibv_alloc_mw" : "ibv_reg_mr",
			 strerror(errno));
		goto out;
	}
	struct ibv_mw_bind mb = {
	    .wr_id = 1,
	    .send_flags = IBV_SEND_SIGNALED,
	    .bind_info = {.mr = mr,
			  .addr = (uintptr_t)buf,
			  .length = 4096,
			  .mw_access_flags = IBV_ACCESS_REMOTE_READ},
	};
	int e = ibv_bind_mw(ib->bind_qp, mw, &mb);
	int st = e == 0 ? poll_one(ib, 2000) : -1;
	if (st != IBV_WC_SUCCESS) {
		snprintf(why, cap, "window self-test: binding a window failed (%s)",
			 e	  ? strerror(e)
			 : st < 0 ? "no completion"
				  : ibv_wc_status_str(st));
		goto out;
	}
	for (int k = 0; k < 2; k++) {
		struct ibv_sge sge = {
		    .addr = (uintptr_t)(buf + 6144), .length = 1024, .lkey = mr->lkey};
		struct ibv_send_wr wr = {
		    .wr_id = 2,
		    .sg_list = &sge,
		    .num_sge = 1,
		    .opcode = IBV_WR_RDMA_READ,
		    .send_flags = IBV_SEND_SIGNALED,
		    .wr.rdma = {.remote_addr = (uintptr_t)buf + (k ? 4096 : 1024),
				.rkey = mw->rkey},
		};
		struct ibv_send_wr *bad = NULL;
		e = ibv_post_send(ib->bind_qp, &wr, &bad);
		st = e == 0 ? poll_one(ib, 2000) : -1;
		if (k == 0 && st != IBV_WC_SUCCESS) {
			snprintf(why, cap,
				 "window self-test: an RDMA READ inside a window failed (%s)",
				 e	  ? strerror(e)
				 : st < 0 ? "no completion"
					  : ibv_wc_status_str(st));
			goto out;
		}
		if (k == 1) {
			res = st == IBV_WC_SUCCESS ? 0 : 1;
			if (res == 0)
				snprintf(why, cap,
					 "%s does not keep a window's rkey inside the window (an "
					 "RDMA READ "
					 "past one succeeded in a self-test)",
					 ib->dev_name);
		}
	}
out:
	if (mw)
		ibv_dealloc_mw(mw);
	if (mr)
		ibv_dereg_mr(mr);
	free(buf);
	bind_qp_destroy(ib);
	char qwhy[160];
	if (res > 0 && bind_qp_create(ib, qwhy, sizeof(qwhy)) != 0) {
		snprintf(why, cap, "%s", qwhy);
		res = -1;
	}
	return res;
}

void ib_access_init(struct ib_backend *ib, const struct ibv_device_attr *da)
{
	pthread_mutex_init(&ib->bind_mu, NULL);
	ib->bind_mu_init = true;
	ib->grant_mw = false;
	bool type2 =
	    da->device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	if (getenv("SC_TEST_IB_NO_MW")) { /* tests and benches: the fallback on any device */
		snprintf(ib->grant_why, sizeof(ib->grant_why),
			 "one MR per operation and region (memory windows turned off by "
			 "SC_TEST_IB_NO_MW)");
		return;
	}
	if (!(da->device_cap_flags & IBV_DEVICE_MEM_WINDOW)) {
		snprintf(
		    ib->grant_why, sizeof(ib->grant_why),
		    "one MR per operation and region (the device has no type-1 memory windows%s)",
		    type2 ? "; its type-2 ones only work through the QP they are bound on" : "");
		return;
	}
	struct ibv_mw *probe = ibv_alloc_mw(ib->pd, IBV_MW_TYPE_1);
	if (!probe) {
		snprintf(ib->grant_why, sizeof(ib->grant_why),
			 "one MR per operation and region (ibv_alloc_mw type 1: %s)",
			 strerror(errno));
		return;
	}
	ibv_dealloc_mw(probe);
	char why[160];
	if (bind_qp_create(ib, why, sizeof(why)) != 0) {
		snprintf(ib->grant_why, sizeof(ib->grant_why),
			 "one MR per operation and region (%s)", why);
		return;
	}
	int bounded = mw_bounds_selftest(ib, why, sizeof(why));
	if (bounded < 0 || (bounded == 0 && !getenv("SC_TEST_IB_MW_UNBOUNDED"))) {
		snprintf(ib->grant_why, sizeof(ib->grant_why),
			 "one MR per operation and region (%s)", why);
		return;
	}
	if (bounded == 0 && !ib->bind_qp && bind_qp_create(ib, why, sizeof(why)) != 0) {
		snprintf(ib->grant_why, sizeof(ib->grant_why),
			 "one MR per operation and region (%s)", why);
		return;
	}
	ib->grant_mw = true;
	ib->mw_unbounded = bounded == 0;
	snprintf(ib->grant_why, sizeof(ib->grant_why),
		 "type-1 memory windows, one per operation and region (max_mw %d%s%s)", da->max_mw,
		 type2 ? "; not type 2: bound to one QP" : "",
		 bounded ? "" : "; NOT bounded here, forced by SC_TEST_IB_MW_UNBOUNDED");
}

void ib_access_fini(struct ib_backend *ib)
{
	bind_qp_destroy(ib);
	/* Regions that outlived the backend: their MRs die with the PD. */
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &ib->nobind) {
		sc_list_remove(pos);
		free(sc_list_entry(pos, struct ib_nobind, node));
	}
	if (ib->bind_mu_init)
		pthread_mutex_destroy(&ib->bind_mu);
	ib->bind_mu_init = false;
}

/* ---- regions --------------------------------------------------------------------------------- */

static int reg_error(struct sc_err *err, int e, uint64_t len, const char *what)
{
	if (e == ENOMEM || e == EPERM || e == EAGAIN) {
		struct rlimit rl;
		char lim[48] = "unknown";
		if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
			if (rl.rlim_cur == RLIM_INFINITY)
				snprintf(lim, sizeof(lim), "unlimited");
			else
				snprintf(lim, sizeof(lim), "%llu KiB",
					 (unsigned long long)rl.rlim_cur / 1024);
		}
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "ibv_reg_mr of %" PRIu64 " bytes (%s) failed: %s; the memlock "
				  "limit is %s: raise it (ulimit -l unlimited; in containers the "
				  "IPC_LOCK capability and a memlock ulimit)",
				  len, what, strerror(e), lim);
	}
	return sc_err_set(err, SC_INTERNAL, "ibv_reg_mr of %" PRIu64 " bytes (%s) failed: %s", len,
			  what, strerror(e));
}

/*
 * One MR over host or GPU memory. GPU memory: a dma-buf MR when the GPU exports dma-buf (the NIC
 * reads and writes GPU memory directly: GPUDirect RDMA), else ibv_reg_mr on the device address
 * when nvidia_peermem is loaded, else FAILED_PRECONDITION saying why (the caller stages). Called
 * once per region, and per (operation, region) only where there are no memory windows.
 */
static struct ibv_mr *reg_any(struct ib_backend *ib, void *addr, uint64_t len, int gpu, int access,
			      const char *what, struct sc_err *err)
{
	struct ibv_mr *mr;
	if (gpu == SC_GPU_HOST) {
		if (!(mr = ibv_reg_mr(ib->pd, addr, (size_t)len, access)))
			reg_error(err, errno, len, what);
		return mr;
	}
	const struct sc_gpu_device_info *d = sc_gpu_device(ib->base.env.gpu, gpu);
	if (!d) {
		sc_err_set(err, SC_FAILED_PRECONDITION, "GPU %d is not usable here", gpu);
		return NULL;
	}
	/* cuMemCreate memory without allocFlags.gpuDirectRDMACapable: no NIC may touch it. */
	if (d->gdr && !sc_gpu_rdma_capable(ib->base.env.gpu, gpu, (uint64_t)(uintptr_t)addr)) {
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "GPU %d memory is not GPUDirect RDMA capable (memory opened from a CUDA "
			   "IPC handle never is; cuMemCreate memory needs "
			   "allocFlags.gpuDirectRDMACapable = 1, declared by "
			   "cuda_fd.gpudirect_rdma_capable)",
			   gpu);
		return NULL;
	}
	char dmabuf_err[SC_ERR_MSG_MAX] = "";
	if (d->dma_buf) {
		int fd = -1;
		uint64_t off = 0;
		mr = NULL;
		if (sc_gpu_dmabuf(ib->base.env.gpu, gpu, (uint64_t)(uintptr_t)addr, len, &fd, &off,
				  err) == 0) {
			mr = ibv_reg_dmabuf_mr(ib->pd, off, (size_t)len,
					       (uint64_t)(uintptr_t)addr, fd, access);
			int e = errno;
			close(fd);
			if (!mr)
				sc_err_set(err, SC_FAILED_PRECONDITION,
					   "ibv_reg_dmabuf_mr of %" PRIu64 " bytes of GPU %d (%s) "
					   "failed: %s (the NIC driver needs dma-buf support: mlx5 "
					   "has it, rxe does not)",
					   len, gpu, what, strerror(e));
		}
		if (mr || !(d->peermem && d->gdr))
			return mr;
		/* dma-buf failed but nvidia_peermem is loaded: try it, and say both. */
		snprintf(dmabuf_err, sizeof(dmabuf_err), "%s", err->msg);
		SC_INFO("ibverbs", "GPU %d: %s; trying nvidia_peermem", gpu, dmabuf_err);
	}
	if (d->peermem && d->gdr) {
		if (!(mr = ibv_reg_mr(ib->pd, addr, (size_t)len, access)))
			sc_err_set(err, SC_FAILED_PRECONDITION,
				   "ibv_reg_mr of %" PRIu64 " bytes of GPU %d memory through "
				   "nvidia_peermem (%s) failed: %s%s%s",
				   len, gpu, what, strerror(errno), dmabuf_err[0] ? "; before: " : "",
				   dmabuf_err);
		return mr;
	}
	sc_err_set(err, SC_FAILED_PRECONDITION, "the NIC cannot reach GPU %d memory: %s", gpu,
		   d->rdma_path);
	return NULL;
}

/* Is mr one of the GPU region MRs registered without window binding? Under bind_mu. */
static bool nobind_has(const struct ib_backend *ib, const struct ibv_mr *mr)
{
	const struct sc_list *pos;
	sc_list_foreach(pos, &ib->nobind) {
		if (sc_list_entry(pos, const struct ib_nobind, node)->mr == mr)
			return true;
	}
	return false;
}

int ib_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	int access = IBV_ACCESS_LOCAL_WRITE | (ib->grant_mw ? IBV_ACCESS_MW_BIND : 0);
	*handle = reg_any(
	    ib, addr, len, gpu, access,
	    ib->grant_mw ? "region, local access and window binding" : "region, local access", err);
	if (*handle || gpu == SC_GPU_HOST || !ib->grant_mw)
		return *handle ? 0 : -1;
	/* A NIC driver may refuse window binding on GPU memory: register it without, and give its
	 * operations an MR per span instead of a window. */
	struct ib_nobind *n = calloc(1, sizeof(*n));
	struct sc_err err2;
	sc_err_clear(&err2);
	struct ibv_mr *mr =
	    n ? reg_any(ib, addr, len, gpu, IBV_ACCESS_LOCAL_WRITE, "region, local access", &err2)
	      : NULL;
	if (!mr) {
		free(n);
		return -1; /* err: the first attempt's reason */
	}
	SC_INFO("ibverbs",
		"GPU %d region: no window binding on it (%s): its operations get an MR per span",
		gpu, err->msg);
	sc_err_clear(err);
	n->mr = mr;
	pthread_mutex_lock(&ib->bind_mu);
	sc_list_insert_head(&ib->nobind, &n->node);
	pthread_mutex_unlock(&ib->bind_mu);
	*handle = mr;
	return 0;
}

void ib_deregister(struct sc_backend *b, void *handle)
{
	struct ib_backend *ib = to_ib(b);
	struct ibv_mr *mr = handle;
	if (!mr)
		return;
	if (ib->bind_mu_init) {
		pthread_mutex_lock(&ib->bind_mu);
		struct sc_list *pos;
		sc_list_foreach(pos, &ib->nobind) {
			struct ib_nobind *n = sc_list_entry(pos, struct ib_nobind, node);
			if (n->mr == mr) {
				sc_list_remove(pos);
				free(n);
				break;
			}
		}
		pthread_mutex_unlock(&ib->bind_mu);
	}
	int rc = ibv_dereg_mr(mr);
	if (rc != 0)
		SC_WARN("ibverbs", "ibv_dereg_mr of a region failed: %s", strerror(rc));
}

/* ---- passive operations ---------------------------------------------------------------------- */

/* One (operation, region) grant: a window on the region's MR, or an MR of its own. */
struct ib_span {
	struct ibv_mw *mw;
	struct ibv_mr *mr; /* the fallback's own MR (NULL with a window) */
};

struct ib_grant {
	size_t n;
	struct ib_span spans[];
};

static void grant_free(struct ib_backend *ib, struct ib_grant *g)
{
	for (size_t i = 0; i < g->n; i++) {
		struct ib_span *s = &g->spans[i];
		if (s->mw) {
			int rc = ibv_dealloc_mw(s->mw);
			if (rc != 0)
				SC_WARN("ibverbs",
					"revoking remote access (ibv_dealloc_mw rkey 0x%x): %s",
					s->mw->rkey, strerror(rc));
		}
		if (s->mr) {
			int rc = ibv_dereg_mr(s->mr);
			if (rc != 0)
				SC_WARN("ibverbs",
					"revoking remote access (ibv_dereg_mr rkey 0x%x): %s",
					s->mr->rkey, strerror(rc));
		}
	}
	free(g);
	atomic_fetch_sub(&ib->n_grants, 1);
}

/* A descriptor's place in its operation, sorted by region. */
struct by_region {
	const void *handle;
	size_t index;
};

static int by_region_cmp(const void *pa, const void *pb)
{
	const struct by_region *a = pa, *b = pb;
	if ((uintptr_t)a->handle != (uintptr_t)b->handle)
		return (uintptr_t)a->handle < (uintptr_t)b->handle ? -1 : 1;
	return a->index < b->index ? -1 : a->index > b->index;
}

/* Wait for n signalled bind completions on the bind CQ. Under bind_mu. */
static int bind_wait(struct ib_backend *ib, int n, struct sc_err *err)
{
	uint64_t until = sc_clock_mono_ms() + BIND_WAIT_MS;
	int bad = 0, spins = 0;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	while (n > 0) {
		struct ibv_wc wc[16];
		int got = ibv_poll_cq(ib->bind_cq, 16, wc);
		if (got < 0)
			return sc_err_set(err, SC_INTERNAL, "ibv_poll_cq on the bind CQ failed");
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS && !bad++)
				st = wc[i].status;
		}
		n -= got;
		if (n > 0 && got == 0) {
			if (sc_clock_mono_ms() > until)
				return sc_err_set(
				    err, SC_INTERNAL,
				    "binding memory windows: no completion within %d ms",
				    BIND_WAIT_MS);
			/* A bind completes in microseconds: spin briefly, then let the CPU go (on a
			 * software device the CPU is what completes it). */
			if (++spins > 64)
				usleep(20);
			else
				sched_yield();
		}
	}
	if (bad)
		return sc_err_set(err, SC_INTERNAL, "binding a memory window failed: %s",
				  ibv_wc_status_str(st));
	return 0;
}

/* Bind one window per span; spans[i].mw allocated here. On failure the bind QP is rebuilt (a
 * failed work request leaves it in the error state) and err says why. Under the engine lock. */
static int bind_all(struct ib_backend *ib, struct ib_span *spans, struct ibv_mr *const *mrs,
		    const uint64_t *lo, const uint64_t *hi, size_t n, int access,
		    struct sc_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&ib->bind_mu);
	if (!ib->bind_qp) {
		char why[160];
		if (bind_qp_create(ib, why, sizeof(why)) != 0) {
			pthread_mutex_unlock(&ib->bind_mu);
			return sc_err_set(err, SC_INTERNAL, "%s", why);
		}
	}
	size_t i = 0;
	while (i < n && rc == 0) {
		int posted = 0;
		for (; i < n && posted < BIND_DEPTH; i++) {
			spans[i].mw = ibv_alloc_mw(ib->pd, IBV_MW_TYPE_1);
			if (!spans[i].mw) {
				rc = sc_err_set(
				    err, errno == ENOMEM ? SC_RESOURCE_EXHAUSTED : SC_INTERNAL,
				    "ibv_alloc_mw: %s", strerror(errno));
				break;
			}
			struct ibv_mw_bind mb = {
			    .wr_id = i,
			    .send_flags = IBV_SEND_SIGNALED,
			    .bind_info = {.mr = mrs[i],
					  .addr = lo[i],
					  .length = hi[i] - lo[i],
					  .mw_access_flags = (unsigned)access},
			};
			int e = ibv_bind_mw(ib->bind_qp, spans[i].mw, &mb);
			if (e != 0) {
				rc = sc_err_set(err, SC_INTERNAL,
						"ibv_bind_mw of %" PRIu64 " bytes: %s",
						hi[i] - lo[i], strerror(e));
				i++; /* its window is freed with the others */
				break;
			}
			posted++;
		}
		struct sc_err werr;
		sc_err_clear(&werr);
		if (posted && bind_wait(ib, posted, &werr) != 0 && rc == 0) {
			*err = werr;
			rc = -1;
		}
	}
	if (rc != 0) {
		bind_qp_destroy(ib); /* made anew by the next bind */
	}
	pthread_mutex_unlock(&ib->bind_mu);
	return rc;
}

int ib_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs, const int *gpus,
	      void *const *region_handles, void **handle, struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	*handle = NULL;
	if (md->kind != SC_OP_READABLE && md->kind != SC_OP_WRITABLE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "ibverbs expose: not a passive kind");
	bool readable = md->kind == SC_OP_READABLE;
	size_t nd = md->n_descs;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct by_region *ord = malloc((nd ? nd : 1) * sizeof(*ord));
	if (!ord)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	for (size_t i = 0; i < nd; i++) {
		ord[i].handle = region_handles[i];
		ord[i].index = i;
		if (!region_handles[i]) { /* a GPU region ibverbs could not register */
			const struct sc_gpu_device_info *d =
			    sc_gpu_device(ib->base.env.gpu, gpus[i]);
			sc_err_set(err, SC_FAILED_PRECONDITION,
				   "the NIC cannot reach GPU %d memory: %s", gpus[i],
				   d ? d->rdma_path : "the GPU is not usable here");
			free(ord);
			return -1;
		}
	}
	qsort(ord, nd, sizeof(*ord), by_region_cmp);
	size_t ns = 0;
	for (size_t i = 0; i < nd; i++)
		ns += i == 0 || ord[i].handle != ord[i - 1].handle;
	struct ib_grant *g = calloc(1, sizeof(*g) + ns * sizeof(g->spans[0]));
	struct ibv_mr **mrs = calloc(ns ? ns : 1, sizeof(*mrs));
	uint64_t *lo = calloc(ns ? ns : 1, sizeof(*lo));
	uint64_t *hi = calloc(ns ? ns : 1, sizeof(*hi));
	size_t *first = calloc(ns + 1, sizeof(*first)); /* span s: ord[first[s]..first[s+1]) */
	if (!g || !mrs || !lo || !hi || !first) {
		free(g);
		g = NULL;
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	atomic_fetch_add(&ib->n_grants, 1);
	g->n = ns;
	size_t s = (size_t)-1;
	for (size_t k = 0; k < nd; k++) {
		size_t i = ord[k].index;
		uint64_t a = (uint64_t)(uintptr_t)addrs[i], e = a + md->descs[i].length;
		if (k == 0 || ord[k].handle != ord[k - 1].handle) {
			s++;
			first[s] = k;
			mrs[s] = (struct ibv_mr *)ord[k].handle;
			lo[s] = a;
			hi[s] = e;
		}
		lo[s] = a < lo[s] ? a : lo[s];
		hi[s] = e > hi[s] ? e : hi[s];
	}
	first[ns] = nd;
	/* Windows where the region's MR takes them, else an MR over the span. */
	int rc = 0;
	size_t nw = 0;
	struct ib_span *wsp = calloc(ns ? ns : 1, sizeof(*wsp));
	size_t *widx = calloc(ns ? ns : 1, sizeof(*widx));
	if (!wsp || !widx) {
		rc = sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto spans_done;
	}
	if (ib->grant_mw) {
		pthread_mutex_lock(&ib->bind_mu);
		for (s = 0; s < ns; s++) {
			if (!nobind_has(ib, mrs[s])) {
				mrs[nw] = mrs[s]; /* compacted in place: nw <= s */
				lo[nw] = lo[s];
				hi[nw] = hi[s];
				widx[nw++] = s;
			}
		}
		pthread_mutex_unlock(&ib->bind_mu);
		if (nw)
			rc = bind_all(ib, wsp, mrs, lo, hi, nw,
				      readable ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE,
				      err);
		for (size_t k = 0; k < nw; k++)
			g->spans[widx[k]].mw =
			    wsp[k].mw; /* freed with the grant, also on failure */
	}
	int access =
	    readable ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	for (s = 0; s < ns && rc == 0; s++) {
		if (g->spans[s].mw)
			continue;
		/* lo/hi were compacted for the windows: recompute this span */
		uint64_t a = UINT64_MAX, e = 0;
		for (size_t k = first[s]; k < first[s + 1]; k++) {
			size_t i = ord[k].index;
			uint64_t da = (uint64_t)(uintptr_t)addrs[i];
			a = da < a ? da : a;
			e = da + md->descs[i].length > e ? da + md->descs[i].length : e;
		}
		int gpu = gpus[ord[first[s]].index];
		g->spans[s].mr = reg_any(
		    ib, (void *)(uintptr_t)a, e - a, gpu, access,
		    readable ? "operation span, remote read" : "operation span, remote write", err);
		rc = g->spans[s].mr ? 0 : -1;
	}
spans_done:
	free(wsp);
	free(widx);
	if (rc != 0) {
		grant_free(ib, g);
		g = NULL;
		goto out;
	}
	for (s = 0; s < ns; s++) {
		uint32_t rkey = g->spans[s].mw ? g->spans[s].mw->rkey : g->spans[s].mr->rkey;
		for (size_t k = first[s]; k < first[s + 1]; k++) {
			size_t i = ord[k].index;
			md->descs[i].remote_addr = (uint64_t)(uintptr_t)addrs[i];
			md->descs[i].rkey = rkey;
		}
	}
	md->ib.present = true;
	memcpy(md->ib.gid, ib->gid.raw, sizeof(md->ib.gid));
	md->ib.lid = ib->lid;
	md->ib.port = ib->port;
	md->ib.mtu = ib_mtu_bytes(ib->active_mtu);
	snprintf(md->ib.device, sizeof(md->ib.device), "%s", ib->dev_name);
	*handle = g;
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	SC_DEBUG("ibverbs", "exposed %zu descriptor(s) in %zu region(s) with %s in %" PRIu64 " us",
		 nd, ns, ib->grant_mw ? "memory windows" : "MRs",
		 (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
out:
	free(ord);
	free(mrs);
	free(lo);
	free(hi);
	free(first);
	return *handle ? 0 : -1;
}

void ib_revoke(struct sc_backend *b, void *handle)
{
	if (handle)
		grant_free(to_ib(b), handle);
}
