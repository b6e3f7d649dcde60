/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/topology.c: the node's PCIe tree and NUMA nodes through hwloc, the distance class between a
 * piece of memory and each rail, and the choice of rails for GPU and host memory.
 *
 * sc_topo_load runs on the main thread at start-up: hwloc reads sysfs (or an XML file named by
 * RDMA_SIDECAR_TOPOLOGY_XML, for tests and for nodes described elsewhere) with every I/O object
 * kept (PCI bridges, PCI devices, OS devices). The loaded hwloc topology is never modified
 * afterwards, so the queries (hwloc lookups and tree walks, all read-only) run on any thread. The
 * choice (sc_topo_rank) is pure and sees only classes. Owns the hwloc topology and a copy of the
 * source name; the tables it fills are the caller's.
 */
#include "os/topology.h"
#include "base/parse.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hwloc.h>

struct sc_topo {
	hwloc_topology_t hw;
	bool from_sysfs;
	char source[256];
};

static const char *const class_names[] = {
    [SC_TOPO_PIX] = "PIX",   [SC_TOPO_PXB] = "PXB", [SC_TOPO_PHB] = "PHB",
    [SC_TOPO_NODE] = "NODE", [SC_TOPO_SYS] = "SYS", [SC_TOPO_UNKNOWN] = "UNKNOWN",
};

const char *sc_topo_class_name(enum sc_topo_class cls)
{
	if ((unsigned)cls >= sizeof(class_names) / sizeof(class_names[0]))
		return "UNKNOWN";
	return class_names[cls];
}

const char *sc_topo_xml_from_env(void)
{
	const char *v = getenv(SC_TOPO_XML_ENV);

	return v && *v ? v : NULL;
}

/* ---- loading --------------------------------------------------------------------------------- */

/* A file that cannot be opened gets errno's story before hwloc's terse "Invalid argument". */
static int check_file(const char *path, struct sc_err *err)
{
	FILE *f = fopen(path, "r");

	if (!f) {
		int e = errno;
		enum sc_status code = e == ENOENT   ? SC_NOT_FOUND
				      : e == EACCES ? SC_PERMISSION_DENIED
						    : SC_FAILED_PRECONDITION;
		return sc_err_set(
		    err, code, "topology XML %s: %s (%s names an hwloc XML file: lstopo --of xml)",
		    path, strerror(e), SC_TOPO_XML_ENV);
	}
	fclose(f);
	return 0;
}

int sc_topo_load(const char *xml_path, struct sc_topo **out, struct sc_err *err)
{
	struct sc_topo *t;

	if (!out)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "sc_topo_load: no out parameter");
	if (xml_path && check_file(xml_path, err))
		return -1;
	t = calloc(1, sizeof(*t));
	if (!t)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "topology: out of memory");
	snprintf(t->source, sizeof(t->source), "%s", xml_path ? xml_path : "sysfs");
	t->from_sysfs = !xml_path;
	if (hwloc_topology_init(&t->hw) < 0) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "hwloc_topology_init: %s", strerror(errno));
		goto err_free;
	}
	/* Bridges, PCI devices and OS devices: every one (IMPORTANT would drop bridges and devices
	 * hwloc deems dull, and a fixture's layout must come back as written). */
	if (hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_ALL) < 0) {
		sc_err_set(err, SC_INTERNAL, "hwloc_topology_set_io_types_filter: %s",
			   strerror(errno));
		goto err_hw;
	}
	/* The CPUs' own topology (x86 CPUID) is not needed for PCI distances and NUMA nodes; leaving
	 * that backend out also keeps hwloc quiet under valgrind, where it cannot run. */
	(void)hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
	if (xml_path && hwloc_topology_set_xml(t->hw, xml_path) < 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "topology XML %s: hwloc refuses it (%s): is it an hwloc XML file? "
			   "(check with hwloc-info --input %s)",
			   xml_path, strerror(errno), xml_path);
		goto err_hw;
	}
	if (hwloc_topology_load(t->hw) < 0) {
		int e = errno;
		if (xml_path)
			sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "topology XML %s: not a valid hwloc XML topology (%s); check it with "
			    "hwloc-info --input %s",
			    xml_path, strerror(e), xml_path);
		else
			sc_err_set(
			    err, SC_UNAVAILABLE,
			    "hwloc could not read this host's topology from sysfs (%s): without "
			    "it rails are chosen by NUMA node only; set %s to an XML file "
			    "(lstopo --of xml) to describe the node",
			    strerror(e), SC_TOPO_XML_ENV);
		goto err_hw;
	}
	/* hwloc itself loads HWLOC_XMLFILE instead of sysfs when it is set: say so. */
	if (!xml_path && !hwloc_topology_is_thissystem(t->hw)) {
		const char *env = getenv("HWLOC_XMLFILE");
		snprintf(t->source, sizeof(t->source), "%s (HWLOC_XMLFILE)", env ? env : "?");
		t->from_sysfs = false;
	}
	*out = t;
	return 0;
err_hw:
	hwloc_topology_destroy(t->hw);
err_free:
	free(t);
	return -1;
}

void sc_topo_destroy(struct sc_topo *topo)
{
	if (!topo)
		return;
	hwloc_topology_destroy(topo->hw);
	free(topo);
}

const char *sc_topo_source(const struct sc_topo *topo)
{
	return topo ? topo->source : "";
}

/* ---- PCI addresses --------------------------------------------------------------------------- */

struct pci_addr {
	unsigned domain, bus, dev, func;
};

/* Exactly `digits` hex digits (min..max) at *p, then the separator sep (or the end for '\0'). */
static int hex_field(const char **p, size_t min, size_t max, char sep, unsigned *val)
{
	size_t n = 0;
	unsigned v = 0;
	int h;

	while (n < max && (h = sc_parse_hex_digit((*p)[n])) >= 0) {
		v = v * 16 + (unsigned)h;
		n++;
	}
	if (n < min || (*p)[n] != sep)
		return -1;
	*p += n + (sep ? 1 : 0);
	*val = v;
	return 0;
}

static int pci_parse(const char *s, struct pci_addr *a)
{
	const char *p = s;

	if (!s)
		return -1;
	if (hex_field(&p, 4, 8, ':', &a->domain) || hex_field(&p, 2, 2, ':', &a->bus) ||
	    hex_field(&p, 2, 2, '.', &a->dev) || hex_field(&p, 1, 1, '\0', &a->func))
		return -1;
	/* hwloc 2 models 16-bit PCI domains (its ABI's default); a device number is 5 bits. */
	if (a->domain > 0xffff || a->dev > 0x1f || a->func > 7)
		return -1;
	return 0;
}

static void pci_format(const struct pci_addr *a, char *out, size_t cap)
{
	snprintf(out, cap, "%04x:%02x:%02x.%x", a->domain, a->bus, a->dev, a->func);
}

int sc_topo_pci_normalize(const char *pci, char *out, size_t cap)
{
	struct pci_addr a;

	if (pci_parse(pci, &a) || !out || cap < 13)
		return -1;
	pci_format(&a, out, cap);
	return 0;
}

int sc_topo_sysfs_pci_numa(const char *pci)
{
	char norm[32], path[96];
	if (!pci || sc_topo_pci_normalize(pci, norm, sizeof(norm)) != 0)
		return -1;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", norm);
	FILE *f = fopen(path, "r");
	int numa = -1;
	if (f) {
		if (fscanf(f, "%d", &numa) != 1 || numa < 0)
			numa = -1;
		fclose(f);
	}
	return numa;
}

static void obj_pci(hwloc_obj_t o, char *out, size_t cap)
{
	struct pci_addr a = {o->attr->pcidev.domain, o->attr->pcidev.bus, o->attr->pcidev.dev,
			     o->attr->pcidev.func};
	pci_format(&a, out, cap);
}

static hwloc_obj_t find_pci(const struct sc_topo *topo, const char *pci)
{
	struct pci_addr a;

	if (!topo || pci_parse(pci, &a))
		return NULL;
	return hwloc_get_pcidev_by_busid(topo->hw, a.domain, a.bus, a.dev, a.func);
}

/* ---- classes --------------------------------------------------------------------------------- */

static bool is_host_bridge(hwloc_obj_t o)
{
	return o->type == HWLOC_OBJ_BRIDGE &&
	       o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

static bool is_pci_bridge(hwloc_obj_t o)
{
	return o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI;
}

/* PCI-to-PCI bridges strictly between o and its ancestor top. */
static unsigned bridges_between(hwloc_obj_t o, hwloc_obj_t top)
{
	unsigned n = 0;

	for (hwloc_obj_t p = o->parent; p && p != top; p = p->parent)
		if (is_pci_bridge(p))
			n++;
	return n;
}

/* The lowest common ancestor. Not hwloc_get_common_ancestor_obj: it compares depths, and I/O
 * objects all have virtual (negative) depths, so on a PCI tree it walks off the root. Trees are a
 * dozen levels deep: the quadratic walk is nothing. */
static hwloc_obj_t common_ancestor(hwloc_obj_t a, hwloc_obj_t b)
{
	for (hwloc_obj_t x = a; x; x = x->parent)
		for (hwloc_obj_t y = b; y; y = y->parent)
			if (x == y)
				return x;
	return NULL;
}

static hwloc_const_nodeset_t locality(const struct sc_topo *topo, hwloc_obj_t o)
{
	hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo->hw, o);

	return anc ? anc->nodeset : NULL;
}

enum sc_topo_class sc_topo_pci_class(const struct sc_topo *topo, const char *pci_a,
				     const char *pci_b)
{
	hwloc_obj_t a = find_pci(topo, pci_a), b = find_pci(topo, pci_b);

	if (!a || !b)
		return SC_TOPO_UNKNOWN;
	if (a == b)
		return SC_TOPO_PIX;
	hwloc_obj_t l = common_ancestor(a, b);
	if (!l)
		return SC_TOPO_UNKNOWN;
	if (is_pci_bridge(l))
		return bridges_between(a, l) <= 1 && bridges_between(b, l) <= 1 ? SC_TOPO_PIX
										: SC_TOPO_PXB;
	if (is_host_bridge(l))
		return SC_TOPO_PHB;
	if (l->type == HWLOC_OBJ_PCI_DEVICE) /* one is a function below the other: not in PCIe */
		return SC_TOPO_PIX;
	hwloc_const_nodeset_t na = locality(topo, a), nb = locality(topo, b);
	if (!na || !nb || hwloc_bitmap_iszero(na) || hwloc_bitmap_iszero(nb))
		return SC_TOPO_UNKNOWN;
	return hwloc_bitmap_intersects(na, nb) ? SC_TOPO_NODE : SC_TOPO_SYS;
}

static int obj_numa(const struct sc_topo *topo, hwloc_obj_t o)
{
	hwloc_const_nodeset_t ns = locality(topo, o);

	if (!ns || hwloc_bitmap_weight(ns) != 1)
		return -1;
	return hwloc_bitmap_first(ns);
}

int sc_topo_pci_numa(const struct sc_topo *topo, const char *pci)
{
	hwloc_obj_t o = find_pci(topo, pci);

	return o ? obj_numa(topo, o) : -1;
}

static bool numa_known(const struct sc_topo *topo, int numa)
{
	return numa >= 0 && hwloc_get_numanode_obj_by_os_index(topo->hw, (unsigned)numa) != NULL;
}

enum sc_topo_class sc_topo_numa_class(const struct sc_topo *topo, int numa, const char *pci)
{
	hwloc_obj_t o = find_pci(topo, pci);

	if (!o || !numa_known(topo, numa))
		return SC_TOPO_UNKNOWN;
	hwloc_const_nodeset_t ns = locality(topo, o);
	if (!ns || hwloc_bitmap_iszero(ns))
		return SC_TOPO_UNKNOWN;
	return hwloc_bitmap_isset(ns, (unsigned)numa) ? SC_TOPO_NODE : SC_TOPO_SYS;
}

size_t sc_topo_numa_nodes(const struct sc_topo *topo, int *ids, size_t cap)
{
	size_t n = 0;
	unsigned idx;

	if (!topo)
		return 0;
	/* The root's nodeset holds every NUMA node's OS index, ascending when iterated. */
	hwloc_bitmap_foreach_begin(idx, hwloc_get_root_obj(topo->hw)->nodeset)
	{
		if (n < cap && ids)
			ids[n] = (int)idx;
		n++;
	}
	hwloc_bitmap_foreach_end();
	return n;
}

/* ---- devices --------------------------------------------------------------------------------- */

static hwloc_obj_t pci_above(hwloc_obj_t o)
{
	for (hwloc_obj_t p = o->parent; p; p = p->parent)
		if (p->type == HWLOC_OBJ_PCI_DEVICE)
			return p;
	return NULL;
}

size_t sc_topo_nics(const struct sc_topo *topo, struct sc_topo_nic *out, size_t cap)
{
	size_t n = 0;
	hwloc_obj_t o = NULL;

	if (!topo)
		return 0;
	while ((o = hwloc_get_next_osdev(topo->hw, o)) != NULL) {
		if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || !o->name)
			continue;
		if (n < cap && out) {
			struct sc_topo_nic *nic = &out[n];
			hwloc_obj_t pci = pci_above(o);
			memset(nic, 0, sizeof(*nic));
			snprintf(nic->name, sizeof(nic->name), "%s", o->name);
			nic->numa = -1;
			if (pci) {
				obj_pci(pci, nic->pci, sizeof(nic->pci));
				nic->numa = obj_numa(topo, pci);
			}
		}
		n++;
	}
	return n;
}

/* /sys/class/infiniband/<dev>/device -> ../../../0000:17:00.0 */
static int sysfs_nic_pci(const char *ibdev, char *pci, size_t cap)
{
	char path[PATH_MAX], link[PATH_MAX];

	if (strchr(ibdev, '/') || snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device",
					   ibdev) >= (int)sizeof(path))
		return -1;
	ssize_t len = readlink(path, link, sizeof(link) - 1);
	if (len <= 0)
		return -1;
	link[len] = '\0';
	const char *base = strrchr(link, '/');
	return sc_topo_pci_normalize(base ? base + 1 : link, pci, cap);
}

int sc_topo_nic_pci(const struct sc_topo *topo, const char *ibdev, char *pci, size_t cap)
{
	hwloc_obj_t o = NULL;

	if (!ibdev || !*ibdev || !pci || cap < 13)
		return -1;
	if (topo) {
		while ((o = hwloc_get_next_osdev(topo->hw, o)) != NULL) {
			if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || !o->name ||
			    strcmp(o->name, ibdev) != 0)
				continue;
			hwloc_obj_t p = pci_above(o);
			if (!p)
				break;
			obj_pci(p, pci, cap);
			return 0;
		}
	}
	/* A fixture describes another node: this host's sysfs says nothing about it. */
	if (topo && !topo->from_sysfs)
		return -1;
	return sysfs_nic_pci(ibdev, pci, cap);
}

size_t sc_topo_gpus(const struct sc_topo *topo, struct sc_topo_gpu *out, size_t cap)
{
	size_t n = 0;
	hwloc_obj_t o = NULL;

	if (!topo)
		return 0;
	while ((o = hwloc_get_next_pcidev(topo->hw, o)) != NULL) {
		if (o->attr->pcidev.vendor_id != 0x10de || (o->attr->pcidev.class_id >> 8) != 0x03)
			continue;
		if (n < cap && out) {
			memset(&out[n], 0, sizeof(out[n]));
			out[n].ordinal = (int)n;
			obj_pci(o, out[n].pci, sizeof(out[n].pci));
		}
		n++;
	}
	return n;
}

/* ---- the choice ------------------------------------------------------------------------------ */

int sc_topo_rank(const enum sc_topo_class *cls, size_t n, enum sc_topo_mem_kind kind,
		 struct sc_topo_choice *out, struct sc_err *err)
{
	if (n > SC_TOPO_RAILS_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%zu rails: at most %d are ranked", n,
				  SC_TOPO_RAILS_MAX);
	out->n_ranked = 0;
	out->n_chosen = 0;
	out->best = SC_TOPO_UNKNOWN;
	/* Counting sort by class: nearest first, ties in the rails' order. */
	for (int c = SC_TOPO_PIX; c <= SC_TOPO_UNKNOWN; c++)
		for (size_t i = 0; i < n; i++) {
			enum sc_topo_class ci = cls[i] > SC_TOPO_UNKNOWN ? SC_TOPO_UNKNOWN : cls[i];
			if ((int)ci != c)
				continue;
			out->ranked[out->n_ranked++] =
			    (struct sc_topo_ranked){.rail = (unsigned)i, .cls = ci};
		}
	if (n == 0)
		return 0;
	/* GPU memory: the rails at the nearest class present. Host memory: the same when that is
	 * its own node (NODE, or nearer from a caller's own classes), else every rail. */
	enum sc_topo_class best = out->ranked[0].cls;
	bool all = kind == SC_TOPO_MEM_HOST ? best > SC_TOPO_NODE : best == SC_TOPO_UNKNOWN;
	out->best = best;
	for (size_t r = 0; r < out->n_ranked; r++)
		out->ranked[r].chosen = all || out->ranked[r].cls == best;
	for (size_t i = 0; i < n; i++)
		for (size_t r = 0; r < out->n_ranked; r++)
			if (out->ranked[r].rail == i && out->ranked[r].chosen)
				out->chosen[out->n_chosen++] = (unsigned)i;
	return 0;
}

static int rail_numa(const struct sc_topo *topo, const struct sc_topo_rail *r)
{
	if (r->numa >= 0)
		return r->numa;
	return r->pci[0] ? sc_topo_pci_numa(topo, r->pci) : -1;
}

void sc_topo_classify(const struct sc_topo *topo, const struct sc_topo_rail *rails, size_t n,
		      const struct sc_topo_mem *mem, enum sc_topo_class *cls)
{
	int gpu_numa = mem->kind == SC_TOPO_MEM_GPU ? sc_topo_pci_numa(topo, mem->pci) : -1;

	for (size_t i = 0; i < n; i++) {
		const struct sc_topo_rail *r = &rails[i];
		enum sc_topo_class c = SC_TOPO_UNKNOWN;
		int rn = rail_numa(topo, r);

		if (mem->kind == SC_TOPO_MEM_GPU) {
			c = sc_topo_pci_class(topo, mem->pci, r->pci);
			if (c == SC_TOPO_UNKNOWN && gpu_numa >= 0 && rn >= 0)
				c = gpu_numa == rn ? SC_TOPO_NODE : SC_TOPO_SYS;
		} else {
			c = topo ? sc_topo_numa_class(topo, mem->numa, r->pci) : SC_TOPO_UNKNOWN;
			if (c == SC_TOPO_UNKNOWN && mem->numa >= 0 && rn >= 0)
				c = mem->numa == rn ? SC_TOPO_NODE : SC_TOPO_SYS;
		}
		cls[i] = c;
	}
}

static void choice_label(struct sc_topo_choice *out, const struct sc_topo_mem *mem)
{
	char pci[SC_TOPO_PCI_MAX];

	if (mem->kind == SC_TOPO_MEM_HOST) {
		snprintf(out->label, sizeof(out->label), "numa%d", mem->numa);
		return;
	}
	if (sc_topo_pci_normalize(mem->pci, pci, sizeof(pci)))
		snprintf(pci, sizeof(pci), "%s", mem->pci);
	snprintf(out->label, sizeof(out->label), "gpu%d %s", mem->gpu, pci);
}

int sc_topo_choose(const struct sc_topo *topo, const struct sc_topo_rail *rails, size_t n,
		   const struct sc_topo_mem *mem, struct sc_topo_choice *out, struct sc_err *err)
{
	enum sc_topo_class cls[SC_TOPO_RAILS_MAX];

	if (n > SC_TOPO_RAILS_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%zu rails: at most %d are ranked", n,
				  SC_TOPO_RAILS_MAX);
	sc_topo_classify(topo, rails, n, mem, cls);
	if (sc_topo_rank(cls, n, mem->kind, out, err))
		return -1;
	out->mem = *mem;
	choice_label(out, mem);
	return 0;
}

int sc_topo_table_build(const struct sc_topo *topo, const struct sc_topo_rail *rails,
			size_t n_rails, const struct sc_topo_gpu *gpus, size_t n_gpus,
			struct sc_topo_table *out, struct sc_err *err)
{
	int numa[SC_TOPO_NUMA_MAX];

	if (n_rails > SC_TOPO_RAILS_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%zu rails: at most %d are ranked",
				  n_rails, SC_TOPO_RAILS_MAX);
	if (n_gpus > SC_TOPO_GPUS_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%zu GPUs: the table holds at most %d",
				  n_gpus, SC_TOPO_GPUS_MAX);
	memset(out, 0, sizeof(*out));
	snprintf(out->source, sizeof(out->source), "%s", sc_topo_source(topo));
	out->n_rails = n_rails;
	for (size_t i = 0; i < n_rails; i++) {
		out->rails[i] = rails[i];
		out->rails[i].numa = rail_numa(topo, &rails[i]);
	}
	for (size_t g = 0; g < n_gpus; g++) {
		struct sc_topo_mem mem = {
		    .kind = SC_TOPO_MEM_GPU, .gpu = gpus[g].ordinal, .numa = -1};
		if (sc_topo_pci_normalize(gpus[g].pci, mem.pci, sizeof(mem.pci)))
			snprintf(mem.pci, sizeof(mem.pci), "%s", gpus[g].pci);
		/* Cannot fail: n_rails was checked. */
		sc_topo_choose(topo, out->rails, n_rails, &mem, &out->rows[out->n_rows++], err);
	}
	size_t n_numa = sc_topo_numa_nodes(topo, numa, SC_TOPO_NUMA_MAX);
	if (n_numa > SC_TOPO_NUMA_MAX)
		n_numa = SC_TOPO_NUMA_MAX;
	for (size_t k = 0; k < n_numa; k++) {
		struct sc_topo_mem mem = {.kind = SC_TOPO_MEM_HOST, .gpu = -1, .numa = numa[k]};
		sc_topo_choose(topo, out->rails, n_rails, &mem, &out->rows[out->n_rows++], err);
	}
	return 0;
}
