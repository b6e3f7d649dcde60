/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/backend.c: the libfabric backend's ops table and lifecycle, the top of ofi/. At create
 * (main thread, before the engine starts) it asks fi_getinfo (FI_VERSION(1, 17)) for FI_EP_RDM
 * endpoints with FI_RMA, chooses the provider (--ofi-provider, or the best one that is not
 * TCP-emulating: efa, cxi, opx, psm3, psm2, ...; tcp and sockets only when named, and then
 * reported as TCP-emulating; verbs only when named, since the ibverbs backend drives those
 * devices natively), and opens one rail per domain of that provider (EFA: one per
 * NIC; tcp: one per interface), in --ofi-domains order (ofi/rail.c). `detail` says exactly what
 * was chosen, or why nothing is usable.
 *
 * Threads: create, start, stop and destroy on the main thread; the ops on engine threads.
 * Owns: the rails (ofi/rail.c), the transfer runner (ofi/xfer.c).
 */
#include "ofi/internal.h"
#include "os/topology.h"

#include "base/log.h"
#include "peer/server.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The mr_mode bits this backend handles (ofi/access.c). */
#define OFI_MR_MODES                                                                               \
	(FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT |       \
	 FI_MR_HMEM)

/* Providers in order of preference when none is named (lower first). */
static int rank(const char *prov)
{
	static const char *const order[] = {"efa", "cxi", "opx", "psm3", "psm2"};
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		if (strcmp(prov, order[i]) == 0)
			return (int)i;
	return 100;
}

/* The core provider (the first of "tcp;ofi_rxm"). */
static void core_of(const char *prov, char *out, size_t cap)
{
	size_t n = strcspn(prov, ";");
	snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), prov);
}

/* Moves bytes over the kernel's TCP/UDP stack (no NIC offload), or only within the node. */
static bool tcp_emulating(const char *prov)
{
	char core[32];
	core_of(prov, core, sizeof(core));
	return strcmp(core, "tcp") == 0 || strcmp(core, "sockets") == 0 ||
	       strcmp(core, "udp") == 0 || strcmp(core, "net") == 0;
}

static bool node_local(const char *prov)
{
	char core[32];
	core_of(prov, core, sizeof(core));
	return strcmp(core, "shm") == 0 || strcmp(core, "sm2") == 0;
}

/* The verbs provider drives the same devices as the ibverbs backend, which does it natively: taken
 * only when named. */
static bool verbs_based(const char *prov)
{
	char core[32];
	core_of(prov, core, sizeof(core));
	return strcmp(core, "verbs") == 0;
}

static bool name_matches(const char *want, const char *prov)
{
	char core[32];
	core_of(prov, core, sizeof(core));
	return strcasecmp(want, prov) == 0 || strcasecmp(want, core) == 0;
}

/* Whether domain `dom` is in the comma list `list`; *pos its place. */
static bool in_list(const char *list, const char *dom, size_t *pos)
{
	size_t i = 0, dl = strlen(dom);
	for (const char *p = list; *p; i++) {
		size_t n = strcspn(p, ",");
		if (n == dl && strncmp(p, dom, n) == 0) {
			*pos = i;
			return true;
		}
		p += n;
		if (*p == ',')
			p++;
	}
	return false;
}

static struct fi_info *get_info(bool hmem, int *rc)
{
	struct fi_info *hints = ofi_fn.dupinfo(NULL);
	if (!hints) {
		*rc = -FI_ENOMEM;
		return NULL;
	}
	hints->caps =
	    FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = OFI_MR_MODES & ~(hmem ? 0 : FI_MR_HMEM);
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->tx_attr->op_flags = FI_COMPLETION;
	struct fi_info *list = NULL;
	*rc = ofi_fn.getinfo(OFI_API_VERSION, NULL, NULL, 0, hints, &list);
	ofi_fn.freeinfo(hints);
	return *rc ? NULL : list;
}

/* Chooses the provider and opens its rails. Fills ob or base.detail. */
static void choose(struct ofi_backend *ob, const struct sc_config *cfg)
{
	struct sc_backend *b = &ob->base;
	const char *want = cfg->ofi_provider && cfg->ofi_provider[0] ? cfg->ofi_provider : NULL;
	bool hmem_allowed = !(cfg->ofi_hmem && strcasecmp(cfg->ofi_hmem, "off") == 0);
	int rc = 0;
	bool hmem = false;
	if (ofi_lib_load(b->detail, sizeof(b->detail)) != 0)
		return;
	struct fi_info *list = get_info(false, &rc);
	if (!list) {
		snprintf(b->detail, sizeof(b->detail),
			 "libfabric %u.%u: no provider offers FI_EP_RDM endpoints with FI_RMA "
			 "(fi_getinfo: %s); check fi_info -t FI_EP_RDM -c FI_RMA",
			 FI_MAJOR(ofi_fn.version()), FI_MINOR(ofi_fn.version()), ofi_fn.strerror(-rc));
		return;
	}
	/* The provider: the named one, or the best-ranked that is a real fabric. */
	char seen[200] = "";
	const char *prov = NULL;
	for (struct fi_info *i = list; i; i = i->next) {
		const char *p = i->fabric_attr->prov_name;
		if (!strstr(seen, p) && strlen(seen) + strlen(p) + 3 < sizeof(seen)) {
			if (seen[0])
				strcat(seen, ", ");
			strcat(seen, p);
		}
		if (want) {
			if (name_matches(want, p) && (!prov || strcasecmp(want, p) == 0))
				prov = p;
		} else if (!tcp_emulating(p) && !node_local(p) && !verbs_based(p) &&
			   (!prov || rank(p) < rank(prov))) {
			prov = p;
		}
	}
	if (!prov) {
		if (want)
			snprintf(b->detail, sizeof(b->detail),
				 "--ofi-provider %s: no such provider offers FI_EP_RDM with FI_RMA "
				 "here (found: %s)",
				 want, seen);
		else
			snprintf(b->detail, sizeof(b->detail),
				 "only TCP-emulating, node-local or verbs libfabric providers here "
				 "(%s); the tcp and ibverbs backends serve those. Name one with "
				 "--ofi-provider (e.g. tcp) to use it anyway",
				 seen);
		ofi_fn.freeinfo(list);
		return;
	}
	snprintf(ob->provider, sizeof(ob->provider), "%s", prov);
	prov = ob->provider; /* list is freed below */
	/* GPU memory: the same provider asked again with FI_HMEM; when it answers, its rails come
	 * from that answer (their MRs then take FI_HMEM_CUDA registrations). */
	if (hmem_allowed && b->env.gpu) {
		int hrc = 0;
		struct fi_info *hl = get_info(true, &hrc);
		for (struct fi_info *i = hl; i && !hmem; i = i->next)
			hmem = strcmp(i->fabric_attr->prov_name, prov) == 0;
		if (hmem) {
			ofi_fn.freeinfo(list);
			list = hl;
		} else if (hl) {
			ofi_fn.freeinfo(hl);
		}
	}
	ob->tcp_emulating = tcp_emulating(prov);
	/* The rails: the first info of each domain of that provider, in --ofi-domains order. */
	const char *domains = cfg->ofi_domains && cfg->ofi_domains[0] ? cfg->ofi_domains : NULL;
	const struct fi_info *pick[OFI_MAX_RAILS] = {0};
	size_t n = 0, skipped_lo = 0;
	char why[256] = "";
	for (struct fi_info *i = list; i; i = i->next) {
		if (strcmp(i->fabric_attr->prov_name, prov) != 0)
			continue;
		const char *dom = i->domain_attr->name;
		if ((i->domain_attr->mr_mode & ~OFI_MR_MODES) & (FI_MR_RAW | FI_MR_MMU_NOTIFY)) {
			snprintf(why, sizeof(why),
				 "domain %s needs mr_mode bits this backend lacks "
				 "(FI_MR_RAW/FI_MR_MMU_NOTIFY)",
				 dom);
			continue;
		}
		size_t pos = n;
		if (domains) {
			if (!in_list(domains, dom, &pos) || pos >= OFI_MAX_RAILS)
				continue;
		} else if (strcmp(dom, "lo") == 0) {
			skipped_lo++;
			continue;
		}
		bool dup = false;
		for (size_t k = 0; k < OFI_MAX_RAILS; k++)
			if (pick[k] && strcmp(pick[k]->domain_attr->name, dom) == 0)
				dup = true;
		if (dup)
			continue;
		if (!domains) {
			if (n >= OFI_MAX_RAILS)
				continue;
			pos = n;
		}
		pick[pos] = i;
		n++;
	}
	/* Compact (a named domain that does not exist leaves a hole). */
	const struct fi_info *rails[OFI_MAX_RAILS];
	size_t nr = 0;
	for (size_t k = 0; k < OFI_MAX_RAILS; k++)
		if (pick[k])
			rails[nr++] = pick[k];
	if (nr == 0) {
		snprintf(b->detail, sizeof(b->detail),
			 "libfabric provider %s: no usable domain%s%s%s%s", prov,
			 domains ? " among --ofi-domains " : "", domains ? domains : "",
			 skipped_lo ? " (lo is a rail only when --ofi-domains names it)" : "",
			 why[0] ? why : "");
		ofi_fn.freeinfo(list);
		return;
	}
	for (size_t k = 0; k < nr; k++) {
		char reason[256];
		if (ofi_rail_open(ob, ob->n_rails, rails[k], reason, sizeof(reason)) != 0) {
			ofi_rail_close(&ob->rails[ob->n_rails]);
			SC_WARN("libfabric", "domain %s unusable: %s", rails[k]->domain_attr->name,
				reason);
			snprintf(why, sizeof(why), "%s", reason);
			continue;
		}
		struct sc_rail *r = &b->rails[b->n_rails];
		snprintf(r->name, sizeof(r->name), "%s:%s", prov, rails[k]->domain_attr->name);
		snprintf(r->netdev, sizeof(r->netdev), "%s", rails[k]->domain_attr->name);
		r->numa = -1;
		if (rails[k]->nic && rails[k]->nic->link_attr && rails[k]->nic->link_attr->speed)
			r->rate_mbps = rails[k]->nic->link_attr->speed / 1000000u;
		if (rails[k]->nic && rails[k]->nic->bus_attr &&
		    rails[k]->nic->bus_attr->bus_type == FI_BUS_PCI) {
			const struct fi_pci_attr *pa = &rails[k]->nic->bus_attr->attr.pci;
			snprintf(r->pci, sizeof(r->pci), "%04x:%02x:%02x.%x", pa->domain_id,
				 pa->bus_id, pa->device_id, pa->function_id);
			/* Its NUMA node, for GetInfo's rail table (GPU and NUMA rows rank the
			 * rails by PCI distance through the engine's topology). */
			r->numa = sc_topo_sysfs_pci_numa(r->pci);
		}
		if (b->n_devices < 4)
			memcpy(b->devices[b->n_devices++], r->name, sizeof(b->devices[0]) - 1);
		b->n_rails++;
		ob->n_rails++;
		struct ofi_rail *rl = &ob->rails[ob->n_rails - 1];
		sc_rail_set_state(b, b->n_rails - 1, SC_RAIL_UP,
				  "libfabric provider %s%s, domain %s, fabric %s, %zu-byte address",
				  prov, ob->tcp_emulating ? " (TCP-emulating)" : "",
				  rails[k]->domain_attr->name, rails[k]->fabric_attr->name,
				  rl->addr_len);
	}
	ob->hmem = false;
	if (!hmem_allowed)
		snprintf(ob->hmem_reason, sizeof(ob->hmem_reason),
			 "--ofi-hmem off: GPU memory is staged through host buffers over tcp");
	else if (!b->env.gpu)
		snprintf(ob->hmem_reason, sizeof(ob->hmem_reason), "no CUDA driver on this host");
	else if (!hmem)
		snprintf(ob->hmem_reason, sizeof(ob->hmem_reason),
			 "provider %s does not offer FI_HMEM: GPU memory is staged over tcp", prov);
	else if (ob->n_rails && !(ob->rails[0].info->caps & FI_HMEM))
		snprintf(ob->hmem_reason, sizeof(ob->hmem_reason),
			 "libfabric provider %s domain %s lacks FI_HMEM: GPU memory is staged",
			 prov, ob->rails[0].info->domain_attr->name);
	else
		ob->hmem = true;
	ofi_fn.freeinfo(list);
	if (ob->n_rails == 0) {
		snprintf(b->detail, sizeof(b->detail), "libfabric provider %s: %s", prov, why);
		return;
	}
	char names[160] = "";
	for (size_t k = 0; k < ob->n_rails; k++) {
		size_t used = strlen(names);
		snprintf(names + used, sizeof(names) - used, "%s%s", k ? "," : "",
			 ob->rails[k].info->domain_attr->name);
	}
	snprintf(b->detail, sizeof(b->detail),
		 "libfabric %u.%u provider %s%s, %zu rail(s): %s; mr_mode 0x%" PRIx64
		 ", %zu iov/msg; GPU memory: %s",
		 FI_MAJOR(ofi_fn.version()), FI_MINOR(ofi_fn.version()), prov,
		 ob->tcp_emulating ? " (TCP-emulating)" : "", ob->n_rails, names,
		 ob->rails[0].mr_mode, ob->rails[0].iov_limit,
		 ob->hmem ? "FI_HMEM_CUDA registration" : ob->hmem_reason);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static int ofi_start(struct sc_backend *b, struct sc_err *err)
{
	struct ofi_backend *ob = to_ofi(b);
	if (ob->n_rails == 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "%s", b->detail);
	for (size_t i = 0; i < ob->n_rails; i++)
		if (ofi_rail_start(&ob->rails[i], err) != 0)
			return -1;
	if (ofi_xfer_start(ob, err) != 0)
		return -1;
	SC_INFO("libfabric", "using %s", b->detail);
	return 0;
}

static void ofi_stop(struct sc_backend *b)
{
	struct ofi_backend *ob = to_ofi(b);
	ofi_xfer_stop(ob);
	for (size_t i = 0; i < ob->n_rails; i++)
		ofi_rail_stop(&ob->rails[i]);
}

/* A backend with a rail left open (ofi_rail_close): the provider may still hold pointers into it
 * and its kept transfers, so it stays, reachable, until the process ends. */
static struct ofi_backend *left_open;

static void ofi_destroy(struct sc_backend *b)
{
	struct ofi_backend *ob = to_ofi(b);
	ofi_stop(b);
	bool open = false;
	for (size_t i = 0; i < ob->n_rails; i++) {
		ofi_rail_close(&ob->rails[i]);
		open |= ob->rails[i].left_open;
	}
	if (open) {
		left_open = ob;
		return;
	}
	ofi_xfer_free_kept(ob); /* no completion can come now */
	sc_xr_destroy(&ob->xr);
	pthread_mutex_destroy(&ob->mu);
	free(ob);
}

/* The control channel's endpoint where no backend before it wrote one, and the rails'
 * addresses. The bit comes with a grant (the keys are what a peer needs). */
static void ofi_advertise(struct sc_backend *b, struct sc_metadata *md)
{
	struct ofi_backend *ob = to_ofi(b);
	if (md->n_endpoints == 0 && b->endpoint[0]) {
		snprintf(md->endpoints[0], sizeof(md->endpoints[0]), "%s", b->endpoint);
		md->n_endpoints = 1;
	}
	md->ofi.present = true;
	snprintf(md->ofi.provider, sizeof(md->ofi.provider), "%s", ob->provider);
	for (size_t i = 0; i < ob->n_rails; i++) {
		memcpy(md->ofi.addr[i], ob->rails[i].addr, ob->rails[i].addr_len);
		md->ofi.addr_len[i] = (uint32_t)ob->rails[i].addr_len;
	}
	md->ofi.n_addrs = ob->n_rails;
}

static int ofi_grant(struct sc_backend *b, struct sc_metadata *md, uint8_t *const *addrs,
		     const int *gpus, void *const *region_handles, void **handle,
		     struct sc_err *err)
{
	if (ofi_expose(b, md, addrs, gpus, region_handles, handle, err) != 0) {
		md->ofi.present = false;
		return -1;
	}
	md->backends |= SC_BACKEND_BIT_LIBFABRIC;
	return 0;
}

static const struct sc_backend_ops ofi_ops = {
    .kind = SC_BACKEND_LIBFABRIC, /* name and level: engine/backend_registry.c */
    .start = ofi_start,
    .stop = ofi_stop,
    .destroy = ofi_destroy,
    .register_region = ofi_register,
    .deregister_region = ofi_deregister,
    .expose = ofi_grant,
    .revoke = ofi_revoke,
    .submit = ofi_xfer_submit,
    .cancel = ofi_xfer_cancel,
    .advertise = ofi_advertise,
};

struct sc_backend *sc_backend_libfabric_create(const struct sc_backend_env *env)
{
	const struct sc_config *cfg = env->cfg;
	struct ofi_backend *ob = calloc(1, sizeof(*ob));
	if (!ob)
		return NULL;
	ob->base.ops = &ofi_ops;
	ob->base.env = *env;
	ob->pool = env->pool;
	ob->srv = env->server;
	ob->max_peers = cfg->ofi_max_peers ? cfg->ofi_max_peers : 1024;
	ob->stripe_min = cfg->ofi_stripe_min_bytes;
	ob->stall_ms = cfg->ofi_stall_ms;
	ob->on_completion = ofi_xfer_completed;
	pthread_mutex_init(&ob->mu, NULL);
	sc_xr_init(&ob->xr, "libfabric", &ob->mu);
	uint64_t seed = 0;
	sc_random_bytes(&seed, sizeof(seed));
	atomic_init(&ob->next_key, (seed >> 16) | 1u);
	if (cfg->backends && !(cfg->backends & SC_BACKEND_BIT_LIBFABRIC)) {
		snprintf(ob->base.detail, sizeof(ob->base.detail), "disabled by --backends");
		return &ob->base;
	}
	if (!ob->pool || !ob->srv) {
		snprintf(ob->base.detail, sizeof(ob->base.detail),
			 "no peer control channel (--data-listen) for OPEN and DONE");
		return &ob->base;
	}
	choose(ob, cfg);
	if (ob->n_rails == 0) {
		SC_INFO("libfabric", "unavailable: %s", ob->base.detail);
		return &ob->base;
	}
	snprintf(ob->base.endpoint, sizeof(ob->base.endpoint), "%s",
		 sc_peer_server_endpoint(ob->srv));
	ob->base.available = true;
	SC_INFO("libfabric", "chose %s", ob->base.detail);
	return &ob->base;
}
