/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/rail_table.c: which rails carry which memory (GetInfo's topology table). At create (main
 * thread) the engine loads the node's topology with hwloc (os/topology.h: sysfs, or the XML file
 * RDMA_SIDECAR_TOPOLOGY_XML names); at start, once every backend's rails are known, it ranks the
 * rails for every GPU (by the PCI bus id the CUDA driver reports) and every NUMA node and keeps
 * the table, immutable from then on, for GetInfo to read from any thread. The topology file's
 * NICs that are no rail here (a fixture of another node) join the table as rails of state
 * "absent", so a node layout can be checked on a machine without it. Owns the topology and the
 * table.
 */
#include "engine/internal.h"

#include "engine/backend_registry.h"
#include "base/log.h"
#include "os/topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sc_engine_topology_load(struct sc_engine *eng)
{
	const char *xml = sc_topo_xml_from_env();
	struct sc_err err = {0};
	if (sc_topo_load(xml, &eng->topo, &err) != 0) {
		snprintf(eng->topo_source, sizeof(eng->topo_source), "none: %s", err.msg);
		if (xml)
			SC_WARN("topology", "no PCIe topology: %s (rails are ranked by NUMA node only)",
				err.msg);
		else
			SC_INFO("topology", "no PCIe topology: %s (rails are ranked by NUMA node only)",
				err.msg);
		return;
	}
	snprintf(eng->topo_source, sizeof(eng->topo_source), "%s", sc_topo_source(eng->topo));
	if (xml)
		SC_INFO("topology", "topology from %s (%s): the node it describes, not this host",
			xml, "RDMA_SIDECAR_TOPOLOGY_XML");
}

/* The rails to rank: every backend's, then the topology's NICs that are none of them. */
static size_t table_rails(struct sc_engine *eng, struct sc_topo_rail *out, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < sc_backend_registry_count(); i++) {
		struct sc_backend *b = eng->backends[sc_backend_registry_at(i)->kind];
		for (size_t r = 0; b && r < b->n_rails && n < cap; r++) {
			snprintf(out[n].name, sizeof(out[n].name), "%s", b->rails[r].name);
			snprintf(out[n].pci, sizeof(out[n].pci), "%s", b->rails[r].pci);
			out[n].numa = b->rails[r].numa;
			n++;
		}
	}
	struct sc_topo_nic nics[SC_TOPO_RAILS_MAX];
	size_t nn = sc_topo_nics(eng->topo, nics, SC_TOPO_RAILS_MAX);
	for (size_t k = 0; k < nn && k < SC_TOPO_RAILS_MAX && n < cap; k++) {
		bool known = false;
		size_t len = strlen(nics[k].name);
		for (size_t r = 0; r < n && !known; r++)
			known = strncmp(out[r].name, nics[k].name, len) == 0 &&
				(out[r].name[len] == ':' || out[r].name[len] == 0);
		if (known)
			continue;
		snprintf(out[n].name, sizeof(out[n].name), "%s", nics[k].name);
		snprintf(out[n].pci, sizeof(out[n].pci), "%s", nics[k].pci);
		out[n].numa = nics[k].numa;
		eng->absent_rails[eng->n_absent_rails++] = n;
		n++;
	}
	return n;
}

void sc_engine_topology_build(struct sc_engine *eng)
{
	struct sc_topo_table *t = calloc(1, sizeof(*t));
	if (!t)
		return;
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX];
	eng->n_absent_rails = 0;
	size_t n = table_rails(eng, rails, SC_TOPO_RAILS_MAX);
	struct sc_topo_gpu gpus[SC_TOPO_GPUS_MAX];
	size_t ng = 0;
	for (int i = 0; i < sc_gpu_count(eng->gpu) && ng < SC_TOPO_GPUS_MAX; i++) {
		const struct sc_gpu_device_info *g = sc_gpu_device(eng->gpu, i);
		gpus[ng].ordinal = i;
		snprintf(gpus[ng].pci, sizeof(gpus[ng].pci), "%s", g->pci_bus_id);
		ng++;
	}
	struct sc_err err = {0};
	if (sc_topo_table_build(eng->topo, rails, n, gpus, ng, t, &err) != 0) {
		SC_WARN("topology", "cannot build the rail table: %s", err.msg);
		free(t);
		return;
	}
	for (size_t r = 0; r < t->n_rows; r++) {
		struct sc_topo_choice *c = &t->rows[r];
		if (c->mem.kind == SC_TOPO_MEM_GPU) /* mem.numa is the host rows'; say the GPU's */
			c->mem.numa = sc_topo_pci_numa(eng->topo, c->mem.pci);
		char chosen[256] = "";
		size_t used = 0;
		for (size_t k = 0; k < c->n_chosen && used < sizeof(chosen); k++)
			used += (size_t)snprintf(chosen + used, sizeof(chosen) - used, "%s%s",
						 k ? ", " : "", t->rails[c->chosen[k]].name);
		SC_INFO("topology", "%s: rails %s (%s)", c->label, n ? chosen : "(none)",
			sc_topo_class_name(c->best));
	}
	eng->topo_table = t;
}

void sc_engine_topology_free(struct sc_engine *eng)
{
	free(eng->topo_table);
	eng->topo_table = NULL;
	sc_topo_destroy(eng->topo);
	eng->topo = NULL;
}

bool sc_engine_rail_choice(void *ctx, const struct sc_backend *b, int gpu, bool *allow)
{
	const struct sc_engine *eng = ctx;
	const struct sc_topo_table *t = eng->topo_table;
	if (!t || gpu < 0 || !b->n_rails)
		return false; /* host memory: its NUMA node is not known here; any rail */
	const struct sc_topo_choice *row = NULL;
	for (size_t r = 0; r < t->n_rows && !row; r++)
		if (t->rows[r].mem.kind == SC_TOPO_MEM_GPU && t->rows[r].mem.gpu == gpu)
			row = &t->rows[r];
	if (!row || row->best == SC_TOPO_UNKNOWN)
		return false;
	bool any = false;
	for (size_t i = 0; i < b->n_rails; i++) {
		allow[i] = false;
		for (size_t k = 0; k < row->n_chosen && !allow[i]; k++)
			allow[i] = strcmp(t->rails[row->chosen[k]].name, b->rails[i].name) == 0;
		any |= allow[i];
	}
	return any; /* none of b's rails chosen (another backend's are): no opinion for b */
}
