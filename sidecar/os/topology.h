/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/topology.h: where the node's GPUs, NICs and NUMA nodes sit on the PCIe tree (hwloc), and which
 * rails (RDMA ports) should carry a piece of memory.
 *
 * Two parts:
 *  - A loaded topology (struct sc_topo, opaque): this host's, read by hwloc from sysfs (also inside
 *    a container, where /sys shows the host's PCI tree), or a node described by an hwloc XML file
 *    (`lstopo --of xml`, or written by hand: tests/unit/topology/). It answers the distance class
 *    between two PCI devices, the NUMA node of a device, the NUMA nodes and the OpenFabrics
 *    devices (NICs) it knows.
 *  - The choice: plain structs and fixed arrays (no pointers into the topology), so the gRPC layer
 *    can copy them into GetInfo. sc_topo_rank is a pure function over classes; sc_topo_choose and
 *    sc_topo_table_build classify with a topology first.
 *
 * Distance classes (NCCL's names; nearest first). For two PCI devices A and B, let L be their
 * lowest common ancestor in hwloc's tree (I/O objects included), and depth(X) the number
 * of PCI-to-PCI bridges strictly between X and L:
 *   PIX   L is a PCI-to-PCI bridge and depth(A) <= 1 and depth(B) <= 1: at most one PCIe switch
 *         (its upstream port and one downstream port on each side) or one bridge between them.
 *   PXB   L is a PCI-to-PCI bridge otherwise: several bridges (nested switches), without crossing
 *         the host bridge.
 *   PHB   L is a host bridge (hwloc bridge whose upstream side is the host): the path crosses the
 *         PCIe root complex, not any bridge shared below it.
 *   NODE  L is not an I/O object (the path leaves through different host bridges) and the two
 *         devices' nearest non-I/O ancestors share a NUMA node (their nodesets intersect).
 *   SYS   as NODE, but their nodesets are disjoint: the path crosses the SMP interconnect
 *         (QPI/UPI/Infinity Fabric) between NUMA nodes.
 *   UNKNOWN  a device is not in the topology (or no PCI address, or no topology).
 * For a NUMA node N and a device D (host memory and a NIC): NODE when N is in the nodeset of D's
 * nearest non-I/O ancestor, SYS otherwise, UNKNOWN when D or N is not in the topology.
 *
 * PCI addresses: "dddd:bb:dd.f" (hwloc's form, what sysfs shows) and the CUDA driver's
 * "dddddddd:bb:dd.f" (cuDeviceGetPCIBusId), any case, are accepted everywhere; results are written
 * in the first form, lower case.
 *
 * Threads: sc_topo_load runs on the main thread at start-up (it reads sysfs: tens of ms on a big
 * node); a loaded topology is immutable, and every other call is read-only and may run on any
 * thread concurrently. Everything without a struct sc_topo argument is pure.
 * Errors: sc_topo_load and sc_topo_table_build return -1 with struct sc_err; the queries answer
 * UNKNOWN, -1 or 0 for what they cannot find.
 */
#ifndef SC_TOPOLOGY_H
#define SC_TOPOLOGY_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

/* The hidden setting that names an hwloc XML file to load instead of this host's topology. */
#define SC_TOPO_XML_ENV "RDMA_SIDECAR_TOPOLOGY_XML"

#define SC_TOPO_PCI_MAX 32  /* a PCI address with its NUL ("0000:17:00.0" needs 13) */
#define SC_TOPO_NAME_MAX 64 /* a rail or NIC name with its NUL ("mlx5_0", "mlx5_0:1") */
#define SC_TOPO_LABEL_MAX 48
#define SC_TOPO_RAILS_MAX 32 /* rails a choice ranks */
#define SC_TOPO_GPUS_MAX 16  /* GPU rows of a table */
#define SC_TOPO_NUMA_MAX 16  /* NUMA rows of a table */
#define SC_TOPO_ROWS_MAX (SC_TOPO_GPUS_MAX + SC_TOPO_NUMA_MAX)

enum sc_topo_class {
	SC_TOPO_PIX,
	SC_TOPO_PXB,
	SC_TOPO_PHB,
	SC_TOPO_NODE,
	SC_TOPO_SYS,
	SC_TOPO_UNKNOWN,
};

struct sc_topo;

/* "PIX", "PXB", "PHB", "NODE", "SYS", "UNKNOWN" (also for values outside the enum). */
const char *sc_topo_class_name(enum sc_topo_class cls);

/* The value of RDMA_SIDECAR_TOPOLOGY_XML, or NULL when unset or empty: what the caller passes to
 * sc_topo_load. */
const char *sc_topo_xml_from_env(void);

/* Loads this host's topology (xml_path NULL: hwloc reads sysfs) or the hwloc XML file xml_path,
 * with PCI bridges, PCI devices and OS devices kept. *out is set only on success; the caller owns
 * it (sc_topo_destroy). Errors: NOT_FOUND / PERMISSION_DENIED when the file cannot be opened, and
 * INVALID_ARGUMENT when it is not an hwloc XML topology (the message names the file);
 * UNAVAILABLE when hwloc cannot read this host; RESOURCE_EXHAUSTED. */
int sc_topo_load(const char *xml_path, struct sc_topo **out, struct sc_err *err);
void sc_topo_destroy(struct sc_topo *topo); /* NULL ok */

/* "sysfs" or the XML path it was loaded from ("<path> (HWLOC_XMLFILE)" when hwloc's own variable
 * replaced sysfs). Valid while topo lives. */
const char *sc_topo_source(const struct sc_topo *topo);

/* Normalizes a PCI address (either accepted form, any case) into "dddd:bb:dd.f". Returns 0, or -1
 * when pci is not a PCI address (or its domain exceeds 16 bits, which hwloc does not model) or
 * cap is too small. Pure. */
int sc_topo_pci_normalize(const char *pci, char *out, size_t cap);
/* This host's NUMA node of PCI device pci (either form), from sysfs
 * (/sys/bus/pci/devices/<pci>/numa_node); -1 when unknown. Any thread. */
int sc_topo_sysfs_pci_numa(const char *pci);

/* The class between two PCI devices (see above). UNKNOWN when either is not in the topology, is
 * malformed or NULL, or topo is NULL. A device with itself: PIX. */
enum sc_topo_class sc_topo_pci_class(const struct sc_topo *topo, const char *pci_a,
				     const char *pci_b);
/* The NUMA node (OS index) of a PCI device: the single node of its nearest non-I/O ancestor's
 * nodeset; -1 when unknown (not found, or the ancestor spans several nodes). */
int sc_topo_pci_numa(const struct sc_topo *topo, const char *pci);
/* Host memory on NUMA node `numa` against PCI device pci: NODE, SYS or UNKNOWN (see above). */
enum sc_topo_class sc_topo_numa_class(const struct sc_topo *topo, int numa, const char *pci);
/* The NUMA nodes' OS indexes, ascending: writes min(n, cap) and returns n (0 for NULL topo). */
size_t sc_topo_numa_nodes(const struct sc_topo *topo, int *ids, size_t cap);

/* A NIC the topology knows: an OpenFabrics OS device ("mlx5_0") and the PCI device above it. */
struct sc_topo_nic {
	char name[SC_TOPO_NAME_MAX];
	char pci[SC_TOPO_PCI_MAX]; /* "" when hwloc shows no PCI device above it */
	int numa;		   /* -1 unknown */
};
/* The OpenFabrics devices in tree order: writes min(n, cap) and returns n. */
size_t sc_topo_nics(const struct sc_topo *topo, struct sc_topo_nic *out, size_t cap);
/* The PCI address of the ibverbs device `ibdev` ("mlx5_0"): from the topology, else (a topology
 * read from sysfs only) the /sys/class/infiniband/<ibdev>/device link. 0, or -1 when unknown. */
int sc_topo_nic_pci(const struct sc_topo *topo, const char *ibdev, char *pci, size_t cap);

/* A GPU the topology knows: an NVIDIA (vendor 0x10de) PCI device of class display (0x03xx). */
struct sc_topo_gpu {
	int ordinal;		   /* CUDA ordinal when the caller knows it, else its index here */
	char pci[SC_TOPO_PCI_MAX]; /* either accepted form */
};
/* NVIDIA display/3D PCI devices in tree order (ordinal = index): writes min(n, cap), returns n. */
size_t sc_topo_gpus(const struct sc_topo *topo, struct sc_topo_gpu *out, size_t cap);

/* ---- the choice ------------------------------------------------------------------------------ */

/* A rail as the choice sees it. */
struct sc_topo_rail {
	char name[SC_TOPO_NAME_MAX];
	char pci[SC_TOPO_PCI_MAX]; /* "" when unknown */
	int numa;		   /* -1 when unknown (sc_topo_choose then asks the topology) */
};

/* Where a piece of memory lives. */
enum sc_topo_mem_kind {
	SC_TOPO_MEM_GPU,  /* GPU memory: ordinal + PCI bus id */
	SC_TOPO_MEM_HOST, /* host memory on a NUMA node */
};
struct sc_topo_mem {
	enum sc_topo_mem_kind kind;
	int gpu;		   /* GPU: its ordinal (label only) */
	char pci[SC_TOPO_PCI_MAX]; /* GPU: its PCI bus id */
	int numa;		   /* HOST: the NUMA node (OS index) */
};

struct sc_topo_ranked {
	unsigned rail; /* index into the rails given */
	enum sc_topo_class cls;
	bool chosen;
};

/* One memory location's answer. ranked holds every rail given, nearest first (ties keep the
 * rails' order); chosen holds the chosen rails' indexes in the rails' order. */
struct sc_topo_choice {
	char label[SC_TOPO_LABEL_MAX]; /* "gpu0 0000:17:00.0" or "numa1" */
	struct sc_topo_mem mem;
	enum sc_topo_class best; /* the nearest class present (UNKNOWN without rails) */
	size_t n_ranked;
	struct sc_topo_ranked ranked[SC_TOPO_RAILS_MAX];
	size_t n_chosen;
	unsigned chosen[SC_TOPO_RAILS_MAX];
};

/* Pure. Ranks n rails (n <= SC_TOPO_RAILS_MAX) of classes cls[] for memory of `kind`, and fills
 * out's best, ranked and chosen (label and mem are left alone):
 *   GPU memory:  the chosen rails are all rails at the nearest class present (so with every rail
 *                UNKNOWN, or every rail SYS, all rails);
 *   host memory: the rails of class NODE (its NUMA node's; a nearer class given by the caller
 *                counts the same), or ALL rails when there is none.
 * Returns -1 (INVALID_ARGUMENT) when n exceeds SC_TOPO_RAILS_MAX. n == 0 gives an empty choice. */
int sc_topo_rank(const enum sc_topo_class *cls, size_t n, enum sc_topo_mem_kind kind,
		 struct sc_topo_choice *out, struct sc_err *err);

/* The class of each rail for `mem` (cls[n]). GPU memory: sc_topo_pci_class(gpu, rail), and where
 * that is UNKNOWN but both NUMA nodes are known (a rail without a PCI address), NODE or SYS by
 * NUMA node. Host memory: sc_topo_numa_class(numa, rail), or by the rail's NUMA node when the
 * topology does not know its PCI address. topo may be NULL (NUMA nodes only). */
void sc_topo_classify(const struct sc_topo *topo, const struct sc_topo_rail *rails, size_t n,
		      const struct sc_topo_mem *mem, enum sc_topo_class *cls);

/* sc_topo_classify + sc_topo_rank + the label. Errors as sc_topo_rank. */
int sc_topo_choose(const struct sc_topo *topo, const struct sc_topo_rail *rails, size_t n,
		   const struct sc_topo_mem *mem, struct sc_topo_choice *out, struct sc_err *err);

/* The GPU-to-rail and NUMA-to-rail table that GetInfo shows: the rails (with NUMA nodes the
 * topology knows filled in), then one row per GPU given (in the order given) and one per NUMA node
 * of the topology (ascending). About 24 KiB: allocate it, do not put it on a small stack. */
struct sc_topo_table {
	char source[256]; /* sc_topo_source, or "" without a topology */
	size_t n_rails;
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX];
	size_t n_rows;
	struct sc_topo_choice rows[SC_TOPO_ROWS_MAX];
};
/* topo may be NULL (no NUMA rows; GPU rows by NUMA node only, mostly UNKNOWN). Errors:
 * INVALID_ARGUMENT when there are more than SC_TOPO_RAILS_MAX rails or SC_TOPO_GPUS_MAX GPUs;
 * NUMA nodes beyond SC_TOPO_NUMA_MAX are left out. out is written only on success. */
int sc_topo_table_build(const struct sc_topo *topo, const struct sc_topo_rail *rails,
			size_t n_rails, const struct sc_topo_gpu *gpus, size_t n_gpus,
			struct sc_topo_table *out, struct sc_err *err);

#endif
