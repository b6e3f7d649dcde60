/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib_backend.c: the ibverbs backend's ops table and what it owns per device. At create (main
 * thread, before the engine starts) it picks a device, port and GID (--ib-device / --ib-port /
 * --ib-gid-index, or the first ACTIVE port and its first RoCE v2 GID with an IPv4 address),
 * opens the device and allocates the protection domain; `detail` says exactly what was chosen or
 * why nothing is usable. Regions get a local-only MR each (register_region, engine threads under
 * the engine lock). A passive operation gets remote access to exactly its ranges: one MR per
 * descriptor with REMOTE_READ (READABLE) or REMOTE_WRITE (WRITABLE), whose rkeys go into the
 * metadata, deregistered by revoke() when the operation ends, after which the old rkeys fail with
 * a remote access error. (Memory windows would avoid the second pinning, but a type-2 window is
 * bound to one QP, which does not exist yet when the metadata is issued: MRs per operation it is.)
 *
 * Owns: the device context, the PD (and through ib_qp.c / ib_xfer.c, the CQ, QPs and threads).
 */
#include "ib_internal.h"

#include "log.h"
#include "passive.h"
#include "peer_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

uint32_t ib_mtu_bytes(enum ibv_mtu m)
{
	switch (m) {
	case IBV_MTU_256:
		return 256;
	case IBV_MTU_512:
		return 512;
	case IBV_MTU_1024:
		return 1024;
	case IBV_MTU_2048:
		return 2048;
	case IBV_MTU_4096:
		return 4096;
	}
	return 0;
}

enum ibv_mtu ib_mtu_from_bytes(uint32_t bytes)
{
	if (bytes >= 4096)
		return IBV_MTU_4096;
	if (bytes >= 2048)
		return IBV_MTU_2048;
	if (bytes >= 1024)
		return IBV_MTU_1024;
	if (bytes >= 512)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

static bool gid_v4mapped(const union ibv_gid *g)
{
	for (int i = 0; i < 10; i++)
		if (g->raw[i])
			return false;
	return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

static bool gid_zero(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return false;
	return true;
}

void ib_gid_text(const union ibv_gid *gid, char *out, size_t cap)
{
	char buf[INET6_ADDRSTRLEN] = "?";
	if (gid_v4mapped(gid)) {
		inet_ntop(AF_INET, gid->raw + 12, buf, sizeof(buf));
		snprintf(out, cap, "::ffff:%s", buf);
		return;
	}
	inet_ntop(AF_INET6, gid->raw, buf, sizeof(buf));
	snprintf(out, cap, "%s", buf);
}

static const char *gid_type_name(unsigned t)
{
	switch (t) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	}
	return "unknown";
}

/* ---- selection ------------------------------------------------------------------------------- */

struct pick {
	uint8_t port;
	struct ibv_port_attr pa;
	int gid_index;
	union ibv_gid gid;
	unsigned gid_type;
};

/* The GID of (ctx, port): --ib-gid-index, else the first RoCE v2 one with an IPv4 address
 * (Ethernet), else index 0 (InfiniBand). */
static int pick_gid(struct ibv_context *ctx, const char *dev, struct pick *p, int want, char *why,
		    size_t cap)
{
	struct ibv_gid_entry e;
	if (want >= 0) {
		if (want >= p->pa.gid_tbl_len ||
		    ibv_query_gid_ex(ctx, p->port, (uint32_t)want, &e, 0) != 0 ||
		    gid_zero(&e.gid)) {
			snprintf(why, cap,
				 "%s port %u has no GID at --ib-gid-index %d (table of %d)", dev,
				 p->port, want, p->pa.gid_tbl_len);
			return -1;
		}
		p->gid_index = want;
		p->gid = e.gid;
		p->gid_type = e.gid_type;
		return 0;
	}
	if (p->pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		for (int i = 0; i < p->pa.gid_tbl_len; i++) {
			if (ibv_query_gid_ex(ctx, p->port, (uint32_t)i, &e, 0) != 0)
				continue;
			if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_v4mapped(&e.gid)) {
				p->gid_index = i;
				p->gid = e.gid;
				p->gid_type = e.gid_type;
				return 0;
			}
		}
		snprintf(why, cap,
			 "%s port %u has no RoCE v2 GID with an IPv4 address (is an IPv4 address "
			 "on its netdev?) -- pass --ib-gid-index",
			 dev, p->port);
		return -1;
	}
	if (ibv_query_gid_ex(ctx, p->port, 0, &e, 0) != 0) {
		snprintf(why, cap, "%s port %u: cannot read GID 0: %s", dev, p->port,
			 strerror(errno));
		return -1;
	}
	p->gid_index = 0;
	p->gid = e.gid;
	p->gid_type = e.gid_type;
	return 0;
}

/* A usable port of an open device: --ib-port, else the first ACTIVE one; then its GID. */
static int pick_port(struct ibv_context *ctx, const char *dev, const struct sc_config *cfg,
		     struct pick *p, char *why, size_t cap)
{
	struct ibv_device_attr da;
	if (ibv_query_device(ctx, &da) != 0) {
		snprintf(why, cap, "%s: ibv_query_device: %s", dev, strerror(errno));
		return -1;
	}
	if (cfg->ib_port > 0) {
		if (cfg->ib_port > da.phys_port_cnt) {
			snprintf(why, cap, "%s has no port %d (it has %u)", dev, cfg->ib_port,
				 da.phys_port_cnt);
			return -1;
		}
		p->port = (uint8_t)cfg->ib_port;
		if (ibv_query_port(ctx, p->port, &p->pa) != 0) {
			snprintf(why, cap, "%s port %u: ibv_query_port: %s", dev, p->port,
				 strerror(errno));
			return -1;
		}
		if (p->pa.state != IBV_PORT_ACTIVE) {
			snprintf(why, cap,
				 "%s port %u is %s, not ACTIVE (check the link / rdma link)", dev,
				 p->port, ibv_port_state_str(p->pa.state));
			return -1;
		}
		return pick_gid(ctx, dev, p, cfg->ib_gid_index, why, cap);
	}
	char states[128] = "";
	size_t used = 0;
	for (uint8_t port = 1; port <= da.phys_port_cnt; port++) {
		p->port = port;
		if (ibv_query_port(ctx, port, &p->pa) != 0)
			continue;
		if (p->pa.state == IBV_PORT_ACTIVE)
			return pick_gid(ctx, dev, p, cfg->ib_gid_index, why, cap);
		if (used < sizeof(states))
			used += (size_t)snprintf(states + used, sizeof(states) - used,
						 "%sport %u %s", used ? ", " : "", port,
						 ibv_port_state_str(p->pa.state));
	}
	snprintf(why, cap, "%s has no ACTIVE port (%s)", dev, used ? states : "no ports");
	return -1;
}

/* Choose and open the device. Fills ib's device fields or `detail` with the reason. */
static void choose_device(struct ib_backend *ib, const struct sc_config *cfg)
{
	struct sc_backend *b = &ib->base;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		snprintf(
		    b->detail, sizeof(b->detail),
		    "no RDMA devices found (ibv_get_device_list: %s; check /dev/infiniband and "
		    "the NIC driver, or add Soft-RoCE with: rdma link add rxe0 type rxe netdev "
		    "ETH)",
		    list ? "0 devices" : strerror(errno));
		if (list)
			ibv_free_device_list(list);
		return;
	}
	char names[160] = "";
	size_t used = 0;
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (b->n_devices < 4)
			snprintf(b->devices[b->n_devices++], sizeof(b->devices[0]), "%s", name);
		if (used < sizeof(names))
			used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
						 i ? ", " : "", name);
	}
	char why[256] = "";
	bool found = false;
	for (int i = 0; i < n && !found; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (cfg->ib_device && cfg->ib_device[0] && strcmp(cfg->ib_device, name) != 0)
			continue;
		struct ibv_context *ctx = ibv_open_device(list[i]);
		if (!ctx) {
			snprintf(why, sizeof(why), "%s: ibv_open_device: %s", name,
				 strerror(errno));
			continue;
		}
		struct pick p;
		memset(&p, 0, sizeof(p));
		char reason[256];
		if (pick_port(ctx, name, cfg, &p, reason, sizeof(reason)) != 0) {
			if (!why[0] || (cfg->ib_device && cfg->ib_device[0]))
				snprintf(why, sizeof(why), "%s", reason);
			ibv_close_device(ctx);
			continue;
		}
		struct ibv_device_attr da;
		struct ibv_pd *pd = NULL;
		if (ibv_query_device(ctx, &da) != 0 || !(pd = ibv_alloc_pd(ctx))) {
			snprintf(why, sizeof(why), "%s: cannot allocate a protection domain: %s",
				 name, strerror(errno));
			ibv_close_device(ctx);
			continue;
		}
		found = true;
		ib->ctx = ctx;
		ib->pd = pd;
		snprintf(ib->dev_name, sizeof(ib->dev_name), "%s", name);
		ib->port = p.port;
		ib->gid_index = p.gid_index;
		ib->gid = p.gid;
		ib->lid = p.pa.lid;
		ib->active_mtu = p.pa.active_mtu;
		ib->link_layer = p.pa.link_layer;
		uint32_t max_msg = p.pa.max_msg_sz ? p.pa.max_msg_sz : IB_CHUNK_MAX;
		ib->max_msg = max_msg < IB_CHUNK_MAX ? max_msg : IB_CHUNK_MAX;
		ib->max_qp_wr = da.max_qp_wr > 0 ? (uint32_t)da.max_qp_wr : 1;
		uint32_t init_rd =
		    da.max_qp_init_rd_atom > 0 ? (uint32_t)da.max_qp_init_rd_atom : 1;
		uint32_t dest_rd = da.max_qp_rd_atom > 0 ? (uint32_t)da.max_qp_rd_atom : 1;
		ib->max_init_rd = init_rd < IB_MAX_RD_ATOMIC ? init_rd : IB_MAX_RD_ATOMIC;
		ib->max_dest_rd = dest_rd < IB_MAX_RD_ATOMIC ? dest_rd : IB_MAX_RD_ATOMIC;
		char gid[64];
		ib_gid_text(&p.gid, gid, sizeof(gid));
		snprintf(b->detail, sizeof(b->detail), "%s port %u ACTIVE, %s gid[%d] %s, mtu %u",
			 name, p.port, gid_type_name(p.gid_type), p.gid_index, gid,
			 ib_mtu_bytes(p.pa.active_mtu));
	}
	if (!found) {
		if (cfg->ib_device && cfg->ib_device[0] && !why[0])
			snprintf(b->detail, sizeof(b->detail),
				 "--ib-device %s not found (have: %s)", cfg->ib_device, names);
		else
			snprintf(b->detail, sizeof(b->detail), "%s", why);
	}
	ibv_free_device_list(list);
}

/* ---- regions and exposure -------------------------------------------------------------------- */

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
 * when nvidia_peermem is loaded, else FAILED_PRECONDITION saying why (the caller stages).
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
			   "GPU %d memory is not GPUDirect RDMA capable (cuMemCreate memory needs "
			   "allocFlags.gpuDirectRDMACapable = 1)",
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

static int ib_register(struct sc_backend *b, void *addr, uint64_t len, int gpu, void **handle,
		       struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	*handle = reg_any(ib, addr, len, gpu, IBV_ACCESS_LOCAL_WRITE, "region, local access", err);
	return *handle ? 0 : -1;
}

static void ib_deregister(struct sc_backend *b, void *handle)
{
	struct ibv_mr *mr = handle;
	if (!mr)
		return;
	int rc = ibv_dereg_mr(mr);
	if (rc != 0)
		SC_WARN("ibverbs", "ibv_dereg_mr of a region failed: %s", strerror(rc));
}

/* One passive operation's remote access: an MR per descriptor. */
struct ib_grant {
	size_t n;
	struct ibv_mr *mrs[];
};

static void grant_free(struct ib_backend *ib, struct ib_grant *g)
{
	for (size_t i = 0; i < g->n; i++) {
		int rc = ibv_dereg_mr(g->mrs[i]);
		if (rc != 0)
			SC_WARN("ibverbs", "revoking remote access (ibv_dereg_mr rkey 0x%x): %s",
				g->mrs[i]->rkey, strerror(rc));
	}
	free(g);
	atomic_fetch_sub(&ib->n_grants, 1);
}

static int ib_expose(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		     const int *gpus, void *const *region_handles, void **handle,
		     struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	*handle = NULL;
	if (md->kind != SC_OP_READABLE && md->kind != SC_OP_WRITABLE)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "ibverbs expose: not a passive kind");
	int access = md->kind == SC_OP_READABLE ? IBV_ACCESS_REMOTE_READ
						: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	struct ib_grant *g = calloc(1, sizeof(*g) + md->n_descs * sizeof(g->mrs[0]));
	if (!g)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	atomic_fetch_add(&ib->n_grants, 1);
	for (size_t i = 0; i < md->n_descs; i++) {
		char what[64];
		snprintf(what, sizeof(what), "descriptor %zu, remote %s", i,
			 md->kind == SC_OP_READABLE ? "read" : "write");
		struct ibv_mr *mr = reg_any(ib, addrs[i], md->descs[i].length, gpus[i], access, what,
					    err);
		if (!mr) {
			grant_free(ib, g);
			return -1;
		}
		g->mrs[g->n++] = mr;
		md->descs[i].remote_addr = (uint64_t)(uintptr_t)addrs[i];
		md->descs[i].rkey = mr->rkey;
	}
	md->ib.present = true;
	memcpy(md->ib.gid, ib->gid.raw, sizeof(md->ib.gid));
	md->ib.lid = ib->lid;
	md->ib.port = ib->port;
	md->ib.mtu = ib_mtu_bytes(ib->active_mtu);
	snprintf(md->ib.device, sizeof(md->ib.device), "%s", ib->dev_name);
	*handle = g;
	return 0;
}

static void ib_revoke(struct sc_backend *b, void *handle)
{
	if (handle)
		grant_free(to_ib(b), handle);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static int ib_start(struct sc_backend *b, struct sc_err *err)
{
	struct ib_backend *ib = to_ib(b);
	if (!ib->pd)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "%s", b->detail);
	if (!ib->pool || !ib->srv)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "no peer control channel (--data-listen) for the QP rendezvous");
	if (ib_xfer_start(ib, err) != 0)
		return -1; /* stop() undoes what started */
	if (ib_qp_start(ib, err) != 0)
		return -1;
	SC_INFO("ibverbs", "using %s (%u KiB per work request, %u READs in flight per QP)",
		b->detail, ib->max_msg >> 10, ib->max_init_rd);
	return 0;
}

static void ib_stop(struct sc_backend *b)
{
	struct ib_backend *ib = to_ib(b);
	ib_qp_stop_handler(ib);
	ib_xfer_stop(ib);
	ib_qp_drop_all(ib);
}

static void ib_destroy(struct sc_backend *b)
{
	struct ib_backend *ib = to_ib(b);
	ib_stop(b);
	if (ib->cq && ibv_destroy_cq(ib->cq) != 0)
		SC_WARN("ibverbs", "ibv_destroy_cq: %s", strerror(errno));
	if (ib->chan && ibv_destroy_comp_channel(ib->chan) != 0)
		SC_WARN("ibverbs", "ibv_destroy_comp_channel: %s", strerror(errno));
	if (ib->wake_fd >= 0)
		close(ib->wake_fd);
	if (atomic_load(&ib->n_grants))
		SC_WARN("ibverbs", "%" PRIu64 " operation grant(s) still registered at destroy",
			(uint64_t)atomic_load(&ib->n_grants));
	if (ib->pd) {
		int rc = ibv_dealloc_pd(ib->pd);
		if (rc != 0)
			SC_WARN("ibverbs", "ibv_dealloc_pd: %s (memory regions still registered)",
				strerror(rc));
	}
	if (ib->ctx)
		ibv_close_device(ib->ctx);
	pthread_cond_destroy(&ib->cv);
	pthread_mutex_destroy(&ib->mu);
	free(ib);
}

static const struct sc_backend_ops ib_ops = {
    .name = "ibverbs",
    .kind = SC_BACKEND_IBVERBS,
    .transport_level = 2,
    .start = ib_start,
    .stop = ib_stop,
    .destroy = ib_destroy,
    .register_region = ib_register,
    .deregister_region = ib_deregister,
    .expose = ib_expose,
    .revoke = ib_revoke,
    .submit = ib_xfer_submit,
    .cancel = ib_xfer_cancel,
};

struct sc_backend *sc_backend_ibverbs_create(const struct sc_backend_env *env)
{
	const struct sc_config *cfg = env->cfg;
	struct ib_backend *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return NULL;
	ib->base.ops = &ib_ops;
	ib->base.env = *env;
	ib->wake_fd = -1;
	pthread_mutex_init(&ib->mu, NULL);
	pthread_cond_init(&ib->cv, NULL);
	atomic_init(&ib->cq_stop, false);
	atomic_init(&ib->n_grants, 0);
	snprintf(ib->self_id, sizeof(ib->self_id), "%s", env->self_id);
	ib->pool = env->pool;
	ib->srv = env->server;
	if (cfg->backends && !(cfg->backends & SC_BACKEND_BIT_IBVERBS)) {
		snprintf(ib->base.detail, sizeof(ib->base.detail), "disabled by --backends");
		return &ib->base;
	}
	choose_device(ib, cfg);
	if (!ib->pd) {
		SC_DEBUG("ibverbs", "unavailable: %s", ib->base.detail);
		return &ib->base;
	}
	if (!ib->pool || !ib->srv) {
		snprintf(ib->base.detail, sizeof(ib->base.detail),
			 "no peer control channel (--data-listen) for the QP rendezvous");
		return &ib->base;
	}
	/* Peers reach the rendezvous (and OPEN/DONE) on the control channel's endpoint. */
	snprintf(ib->base.endpoint, sizeof(ib->base.endpoint), "%s",
		 sc_peer_server_endpoint(ib->srv));
	ib->base.available = true;
	SC_INFO("ibverbs", "chose %s", ib->base.detail);
	return &ib->base;
}
