/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_topology.c: sidecar/os/topology.c with real hwloc on hand-described nodes (hwloc XML files in
 * tests/unit/topology/, written by gen_fixtures.py there), and this host's own topology.
 *
 * Fixtures (the expected values below are written out by hand from these layouts):
 *   dgx8.xml       8 GPUs / 8 NICs, 2 sockets (NUMA 0, 1), 4 PCIe switches of 2 GPUs + 2 NICs,
 *                  each switch under its own host bridge; switches 0, 1 on socket 0, 2, 3 on 1.
 *                  GPUs 13, 14 | 33, 34 | 93, 94 | b3, b4 (bus, 0000:bb:00.0); NICs mlx5_0..7
 *                  15, 16 | 35, 36 | 95, 96 | b5, b6.
 *   shared2.xml    per socket a switch whose downstream ports hold two sub-switches of 2 GPUs
 *                  and one NIC: GPUs 05, 06, 0a, 0b + mlx5_0 0d on socket 0; 85, 86, 8a, 8b +
 *                  mlx5_1 8d on socket 1.
 *   onesocket.xml  both NICs on socket 0: GPU 03 and mlx5_0 04 share a switch; GPU 10 and mlx5_1 20
 *                  sit on their own root ports of the same host bridge; GPUs 81, 82 on socket 1.
 */
#include "check.h"
#include "os/topology.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SC_TOPO_FIXTURES
#error "SC_TOPO_FIXTURES: the directory of the XML fixtures (tests/CMakeLists.txt sets it)"
#endif

static struct sc_topo *load_fixture(const char *name)
{
	char path[512];
	struct sc_topo *t = NULL;
	struct sc_err err = {0};

	snprintf(path, sizeof(path), "%s/%s", SC_TOPO_FIXTURES, name);
	if (sc_topo_load(path, &t, &err)) {
		fprintf(stderr, "  load %s: %s\n", path, err.msg);
		return NULL;
	}
	return t;
}

/* The topology's NICs as rails, in tree order. */
static size_t nic_rails(const struct sc_topo *t, struct sc_topo_rail *rails)
{
	struct sc_topo_nic nics[SC_TOPO_RAILS_MAX];
	size_t n = sc_topo_nics(t, nics, SC_TOPO_RAILS_MAX);

	for (size_t i = 0; i < n && i < SC_TOPO_RAILS_MAX; i++) {
		memset(&rails[i], 0, sizeof(rails[i]));
		snprintf(rails[i].name, sizeof(rails[i].name), "%s", nics[i].name);
		snprintf(rails[i].pci, sizeof(rails[i].pci), "%s", nics[i].pci);
		rails[i].numa = -1; /* the choice asks the topology */
	}
	return n;
}

/* "mlx5_2:PIX mlx5_3:PIX mlx5_0:NODE ..." */
static const char *ranked_str(const struct sc_topo_choice *c, const struct sc_topo_rail *rails,
			      char *buf, size_t cap)
{
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < c->n_ranked && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s:%s", i ? " " : "",
				      rails[c->ranked[i].rail].name,
				      sc_topo_class_name(c->ranked[i].cls));
	return buf;
}

/* "mlx5_2 mlx5_3" */
static const char *chosen_str(const struct sc_topo_choice *c, const struct sc_topo_rail *rails,
			      char *buf, size_t cap)
{
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < c->n_chosen && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? " " : "",
				      rails[c->chosen[i]].name);
	return buf;
}

/* The classes of one GPU against every NIC, in NIC order: "PIX PIX NODE NODE SYS ...". */
static const char *gpu_row(const struct sc_topo *t, const char *gpu, char *buf, size_t cap)
{
	struct sc_topo_nic nics[SC_TOPO_RAILS_MAX];
	size_t n = sc_topo_nics(t, nics, SC_TOPO_RAILS_MAX), o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? " " : "",
				      sc_topo_class_name(sc_topo_pci_class(t, gpu, nics[i].pci)));
	return buf;
}

struct expect_gpu {
	const char *pci;    /* as the driver gives it (some in the CUDA form) */
	const char *cls;    /* against mlx5_0, mlx5_1, ... */
	const char *chosen; /* the chosen rails */
	int numa;
};

struct expect_numa {
	int numa;
	const char *cls;
	const char *chosen;
};

/* Everything about one fixture: the NIC list, each GPU's classes, NUMA node and chosen rails, each
 * NUMA node's classes and chosen rails, through the queries, sc_topo_choose and the table. */
static void check_fixture(const char *file, const char *nics_expected, const struct expect_gpu *g,
			  size_t n_gpus, const struct expect_numa *nm, size_t n_numa)
{
	struct sc_topo *t = load_fixture(file);
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX];
	struct sc_topo_nic nics[SC_TOPO_RAILS_MAX];
	struct sc_topo_gpu gpus[SC_TOPO_GPUS_MAX];
	struct sc_err err = {0};
	char buf[1024], want[SC_TOPO_LABEL_MAX];
	int ids[8];

	CHECK(t != NULL);
	CHECK_STR_CONTAINS(sc_topo_source(t), file);
	/* NICs: "name pci numa" in tree order. */
	size_t n_nics = sc_topo_nics(t, nics, SC_TOPO_RAILS_MAX), o = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n_nics; i++)
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%s@%s/%d", i ? " " : "",
				      nics[i].name, nics[i].pci, nics[i].numa);
	CHECK_STR_EQ(buf, nics_expected);
	CHECK_INT_EQ(nic_rails(t, rails), n_nics);
	CHECK_INT_EQ(sc_topo_numa_nodes(t, ids, 8), n_numa);
	for (size_t k = 0; k < n_numa; k++)
		CHECK_INT_EQ(ids[k], nm[k].numa);
	/* The topology's own GPU list: the fixture's GPUs, in order. */
	CHECK_INT_EQ(sc_topo_gpus(t, gpus, SC_TOPO_GPUS_MAX), n_gpus);
	for (size_t i = 0; i < n_gpus; i++) {
		char norm[SC_TOPO_PCI_MAX];
		CHECK_INT_EQ(sc_topo_pci_normalize(g[i].pci, norm, sizeof(norm)), 0);
		CHECK_STR_EQ(gpus[i].pci, norm);
	}

	/* Each GPU: classes against every NIC, its NUMA node, its choice. */
	for (size_t i = 0; i < n_gpus; i++) {
		struct sc_topo_choice c;
		struct sc_topo_mem mem = {.kind = SC_TOPO_MEM_GPU, .gpu = (int)i, .numa = -1};
		snprintf(mem.pci, sizeof(mem.pci), "%s", g[i].pci);
		CHECK_STR_EQ(gpu_row(t, g[i].pci, buf, sizeof(buf)), g[i].cls);
		CHECK_INT_EQ(sc_topo_pci_numa(t, g[i].pci), g[i].numa);
		CHECK_INT_EQ(sc_topo_choose(t, rails, n_nics, &mem, &c, &err), 0);
		CHECK_STR_EQ(chosen_str(&c, rails, buf, sizeof(buf)), g[i].chosen);
		CHECK_INT_EQ(c.n_ranked, n_nics);
		for (size_t r = 1; r < c.n_ranked; r++)
			CHECK(c.ranked[r - 1].cls <= c.ranked[r].cls);
		CHECK_STR_EQ(sc_topo_class_name(c.best), sc_topo_class_name(c.ranked[0].cls));
		char norm[SC_TOPO_PCI_MAX];
		sc_topo_pci_normalize(g[i].pci, norm, sizeof(norm));
		snprintf(want, sizeof(want), "gpu%zu %s", i, norm);
		CHECK_STR_EQ(c.label, want);
	}
	/* Each NUMA node: classes (host memory against each NIC) and the choice. */
	for (size_t k = 0; k < n_numa; k++) {
		struct sc_topo_choice c;
		struct sc_topo_mem mem = {.kind = SC_TOPO_MEM_HOST, .gpu = -1, .numa = nm[k].numa};
		o = 0;
		buf[0] = '\0';
		for (size_t i = 0; i < n_nics; i++)
			o += (size_t)snprintf(
			    buf + o, sizeof(buf) - o, "%s%s", i ? " " : "",
			    sc_topo_class_name(sc_topo_numa_class(t, nm[k].numa, nics[i].pci)));
		CHECK_STR_EQ(buf, nm[k].cls);
		CHECK_INT_EQ(sc_topo_choose(t, rails, n_nics, &mem, &c, &err), 0);
		CHECK_STR_EQ(chosen_str(&c, rails, buf, sizeof(buf)), nm[k].chosen);
		snprintf(want, sizeof(want), "numa%d", nm[k].numa);
		CHECK_STR_EQ(c.label, want);
	}

	/* The whole table, as GetInfo will show it: GPU rows in the order given, then NUMA rows. */
	struct sc_topo_table *tab = malloc(sizeof(*tab));
	struct sc_topo_gpu in[SC_TOPO_GPUS_MAX];
	CHECK(tab != NULL);
	for (size_t i = 0; i < n_gpus; i++) {
		in[i].ordinal = (int)i;
		snprintf(in[i].pci, sizeof(in[i].pci), "%s", g[i].pci);
	}
	if (sc_topo_table_build(t, rails, n_nics, in, n_gpus, tab, &err)) {
		free(tab);
		CHECK_FAIL_("sc_topo_table_build: %s", err.msg);
	}
	bool ok = tab->n_rows == n_gpus + n_numa && tab->n_rails == n_nics &&
		  strstr(tab->source, file) != NULL;
	for (size_t i = 0; ok && i < n_nics; i++)
		ok = tab->rails[i].numa == nics[i].numa && !strcmp(tab->rails[i].pci, nics[i].pci);
	for (size_t i = 0; ok && i < n_gpus; i++)
		ok =
		    !strcmp(chosen_str(&tab->rows[i], tab->rails, buf, sizeof(buf)), g[i].chosen) &&
		    tab->rows[i].mem.kind == SC_TOPO_MEM_GPU && tab->rows[i].mem.gpu == (int)i;
	for (size_t k = 0; ok && k < n_numa; k++)
		ok = !strcmp(chosen_str(&tab->rows[n_gpus + k], tab->rails, buf, sizeof(buf)),
			     nm[k].chosen) &&
		     tab->rows[n_gpus + k].mem.numa == nm[k].numa;
	free(tab);
	sc_topo_destroy(t);
	CHECK(ok);
}

TEST(dgx8_rail_per_gpu)
{
	static const struct expect_gpu g[] = {
	    {"0000:13:00.0", "PIX PIX NODE NODE SYS SYS SYS SYS", "mlx5_0 mlx5_1", 0},
	    {"00000000:14:00.0", "PIX PIX NODE NODE SYS SYS SYS SYS", "mlx5_0 mlx5_1", 0},
	    {"0000:33:00.0", "NODE NODE PIX PIX SYS SYS SYS SYS", "mlx5_2 mlx5_3", 0},
	    {"0000:34:00.0", "NODE NODE PIX PIX SYS SYS SYS SYS", "mlx5_2 mlx5_3", 0},
	    {"00000000:93:00.0", "SYS SYS SYS SYS PIX PIX NODE NODE", "mlx5_4 mlx5_5", 1},
	    {"0000:94:00.0", "SYS SYS SYS SYS PIX PIX NODE NODE", "mlx5_4 mlx5_5", 1},
	    {"0000:B3:00.0", "SYS SYS SYS SYS NODE NODE PIX PIX", "mlx5_6 mlx5_7", 1},
	    {"00000000:B4:00.0", "SYS SYS SYS SYS NODE NODE PIX PIX", "mlx5_6 mlx5_7", 1},
	};
	static const struct expect_numa nm[] = {
	    {0, "NODE NODE NODE NODE SYS SYS SYS SYS", "mlx5_0 mlx5_1 mlx5_2 mlx5_3"},
	    {1, "SYS SYS SYS SYS NODE NODE NODE NODE", "mlx5_4 mlx5_5 mlx5_6 mlx5_7"},
	};
	check_fixture("dgx8.xml",
		      "mlx5_0@0000:15:00.0/0 mlx5_1@0000:16:00.0/0 mlx5_2@0000:35:00.0/0 "
		      "mlx5_3@0000:36:00.0/0 mlx5_4@0000:95:00.0/1 mlx5_5@0000:96:00.0/1 "
		      "mlx5_6@0000:b5:00.0/1 mlx5_7@0000:b6:00.0/1",
		      g, 8, nm, 2);
}

TEST(dgx8_ranking_and_gpu_pairs)
{
	struct sc_topo *t = load_fixture("dgx8.xml");
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX];
	struct sc_topo_choice c;
	struct sc_err err = {0};
	char buf[1024];

	CHECK(t != NULL);
	size_t n = nic_rails(t, rails);
	struct sc_topo_mem mem = {.kind = SC_TOPO_MEM_GPU, .gpu = 2, .pci = "0000:33:00.0"};
	int rc = sc_topo_choose(t, rails, n, &mem, &c, &err);
	ranked_str(&c, rails, buf, sizeof(buf));
	/* GPU pairs: same switch, other switch of the socket, other socket. */
	enum sc_topo_class same = sc_topo_pci_class(t, "0000:13:00.0", "0000:14:00.0");
	enum sc_topo_class node = sc_topo_pci_class(t, "0000:13:00.0", "0000:33:00.0");
	enum sc_topo_class sys = sc_topo_pci_class(t, "0000:13:00.0", "0000:b4:00.0");
	enum sc_topo_class self = sc_topo_pci_class(t, "0000:13:00.0", "00000000:13:00.0");
	/* Two NICs of one switch. */
	enum sc_topo_class nic_nic = sc_topo_pci_class(t, "0000:15:00.0", "0000:16:00.0");
	sc_topo_destroy(t);
	CHECK_INT_EQ(rc, 0);
	CHECK_STR_EQ(buf, "mlx5_2:PIX mlx5_3:PIX mlx5_0:NODE mlx5_1:NODE mlx5_4:SYS mlx5_5:SYS "
			  "mlx5_6:SYS mlx5_7:SYS");
	CHECK_STR_EQ(sc_topo_class_name(c.best), "PIX");
	CHECK_STR_EQ(sc_topo_class_name(same), "PIX");
	CHECK_STR_EQ(sc_topo_class_name(node), "NODE");
	CHECK_STR_EQ(sc_topo_class_name(sys), "SYS");
	CHECK_STR_EQ(sc_topo_class_name(self), "PIX");
	CHECK_STR_EQ(sc_topo_class_name(nic_nic), "PIX");
}

TEST(shared2_four_gpus_per_nic)
{
	static const struct expect_gpu g[] = {
	    {"0000:05:00.0", "PXB SYS", "mlx5_0", 0},	  {"0000:06:00.0", "PXB SYS", "mlx5_0", 0},
	    {"00000000:0A:00.0", "PXB SYS", "mlx5_0", 0}, {"0000:0b:00.0", "PXB SYS", "mlx5_0", 0},
	    {"0000:85:00.0", "SYS PXB", "mlx5_1", 1},	  {"0000:86:00.0", "SYS PXB", "mlx5_1", 1},
	    {"0000:8a:00.0", "SYS PXB", "mlx5_1", 1},	  {"0000:8b:00.0", "SYS PXB", "mlx5_1", 1},
	};
	static const struct expect_numa nm[] = {
	    {0, "NODE SYS", "mlx5_0"},
	    {1, "SYS NODE", "mlx5_1"},
	};
	check_fixture("shared2.xml", "mlx5_0@0000:0d:00.0/0 mlx5_1@0000:8d:00.0/1", g, 8, nm, 2);

	/* GPU pairs: one sub-switch (PIX), two sub-switches under the top switch (PXB). */
	struct sc_topo *t = load_fixture("shared2.xml");
	CHECK(t != NULL);
	enum sc_topo_class pix = sc_topo_pci_class(t, "0000:05:00.0", "0000:06:00.0");
	enum sc_topo_class pxb = sc_topo_pci_class(t, "0000:05:00.0", "0000:0b:00.0");
	enum sc_topo_class sys = sc_topo_pci_class(t, "0000:05:00.0", "0000:85:00.0");
	sc_topo_destroy(t);
	CHECK_STR_EQ(sc_topo_class_name(pix), "PIX");
	CHECK_STR_EQ(sc_topo_class_name(pxb), "PXB");
	CHECK_STR_EQ(sc_topo_class_name(sys), "SYS");
}

TEST(onesocket_nics_on_socket0)
{
	static const struct expect_gpu g[] = {
	    {"0000:03:00.0", "PIX PHB", "mlx5_0", 0},
	    {"0000:10:00.0", "PHB PHB", "mlx5_0 mlx5_1", 0},
	    {"0000:81:00.0", "SYS SYS", "mlx5_0 mlx5_1", 1},
	    {"0000:82:00.0", "SYS SYS", "mlx5_0 mlx5_1", 1},
	};
	static const struct expect_numa nm[] = {
	    {0, "NODE NODE", "mlx5_0 mlx5_1"},
	    {1, "SYS SYS", "mlx5_0 mlx5_1"}, /* no NIC on its node: every rail */
	};
	check_fixture("onesocket.xml", "mlx5_0@0000:04:00.0/0 mlx5_1@0000:20:00.0/0", g, 4, nm, 2);

	struct sc_topo *t = load_fixture("onesocket.xml");
	CHECK(t != NULL);
	enum sc_topo_class phb = sc_topo_pci_class(t, "0000:81:00.0", "0000:82:00.0");
	sc_topo_destroy(t);
	CHECK_STR_EQ(sc_topo_class_name(phb), "PHB");
}

TEST(nic_pci_by_name)
{
	struct sc_topo *t = load_fixture("dgx8.xml");
	char pci[SC_TOPO_PCI_MAX] = "";
	char small[8];

	CHECK(t != NULL);
	int found = sc_topo_nic_pci(t, "mlx5_3", pci, sizeof(pci));
	/* A fixture describes another node: no fallback to this host's sysfs. */
	int missing = sc_topo_nic_pci(t, "mlx5_99", small, sizeof(small));
	int tiny = sc_topo_nic_pci(t, "mlx5_3", small, sizeof(small));
	int numa = sc_topo_pci_numa(t, "0000:b6:00.0");
	sc_topo_destroy(t);
	CHECK_INT_EQ(found, 0);
	CHECK_STR_EQ(pci, "0000:36:00.0");
	CHECK_INT_EQ(missing, -1);
	CHECK_INT_EQ(tiny, -1);
	CHECK_INT_EQ(numa, 1);
}

TEST(unknown_devices)
{
	struct sc_topo *t = load_fixture("dgx8.xml");
	static const char *const bad[] = {"0000:ee:00.0",  "17:00.0",	  "0000:13:00",
					  "0000:13:00.0x", "zz",	  "",
					  "10000:13:00.0", "0000:13:20.0"};

	CHECK(t != NULL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		enum sc_topo_class c = sc_topo_pci_class(t, "0000:13:00.0", bad[i]);
		enum sc_topo_class r = sc_topo_pci_class(t, bad[i], "0000:15:00.0");
		int numa = sc_topo_pci_numa(t, bad[i]);
		enum sc_topo_class h = sc_topo_numa_class(t, 0, bad[i]);
		if (c != SC_TOPO_UNKNOWN || r != SC_TOPO_UNKNOWN || numa != -1 ||
		    h != SC_TOPO_UNKNOWN) {
			sc_topo_destroy(t);
			CHECK_FAIL_("\"%s\": %s %s numa %d host %s, want UNKNOWN", bad[i],
				    sc_topo_class_name(c), sc_topo_class_name(r), numa,
				    sc_topo_class_name(h));
		}
	}
	enum sc_topo_class null_a = sc_topo_pci_class(t, NULL, "0000:15:00.0");
	enum sc_topo_class no_numa = sc_topo_numa_class(t, 7, "0000:15:00.0");
	enum sc_topo_class neg_numa = sc_topo_numa_class(t, -1, "0000:15:00.0");

	/* A GPU the topology does not know, rails with and without PCI addresses. */
	struct sc_topo_rail rails[3] = {
	    {.name = "mlx5_0", .pci = "0000:15:00.0", .numa = -1},
	    {.name = "roce_nopci", .pci = "", .numa = 1},
	    {.name = "eth_unknown", .pci = "", .numa = -1},
	};
	enum sc_topo_class cls[3];
	struct sc_topo_mem ghost = {.kind = SC_TOPO_MEM_GPU, .gpu = 9, .pci = "0000:ee:00.0"};
	sc_topo_classify(t, rails, 3, &ghost, cls);
	char g0[16], g1[16], g2[16];
	snprintf(g0, sizeof(g0), "%s", sc_topo_class_name(cls[0]));
	snprintf(g1, sizeof(g1), "%s", sc_topo_class_name(cls[1]));
	snprintf(g2, sizeof(g2), "%s", sc_topo_class_name(cls[2]));
	/* A known GPU against a rail known only by its NUMA node: NODE or SYS by NUMA node. */
	struct sc_topo_mem gpu0 = {.kind = SC_TOPO_MEM_GPU, .gpu = 0, .pci = "0000:13:00.0"};
	sc_topo_classify(t, rails, 3, &gpu0, cls);
	enum sc_topo_class k0 = cls[0], k1 = cls[1], k2 = cls[2];
	struct sc_topo_mem host1 = {.kind = SC_TOPO_MEM_HOST, .gpu = -1, .numa = 1};
	sc_topo_classify(t, rails, 3, &host1, cls);
	sc_topo_destroy(t);

	CHECK_STR_EQ(sc_topo_class_name(null_a), "UNKNOWN");
	CHECK_STR_EQ(sc_topo_class_name(no_numa), "UNKNOWN");
	CHECK_STR_EQ(sc_topo_class_name(neg_numa), "UNKNOWN");
	CHECK_STR_EQ(g0, "UNKNOWN");
	CHECK_STR_EQ(g1, "UNKNOWN");
	CHECK_STR_EQ(g2, "UNKNOWN");
	CHECK_STR_EQ(sc_topo_class_name(k0), "PIX");
	CHECK_STR_EQ(sc_topo_class_name(k1), "SYS");
	CHECK_STR_EQ(sc_topo_class_name(k2), "UNKNOWN");
	CHECK_STR_EQ(sc_topo_class_name(cls[0]), "SYS");
	CHECK_STR_EQ(sc_topo_class_name(cls[1]), "NODE");
	CHECK_STR_EQ(sc_topo_class_name(cls[2]), "UNKNOWN");
	CHECK_INT_EQ(sc_topo_pci_numa(NULL, "0000:13:00.0"), -1);
	CHECK_INT_EQ(sc_topo_nics(NULL, NULL, 0), 0);
	CHECK_INT_EQ(sc_topo_numa_nodes(NULL, NULL, 0), 0);
	CHECK_STR_EQ(sc_topo_class_name(sc_topo_pci_class(NULL, "0000:13:00.0", "0000:13:00.0")),
		     "UNKNOWN");
	sc_topo_destroy(NULL);
}

TEST(pci_forms)
{
	char out[SC_TOPO_PCI_MAX];
	char small[12];

	CHECK_INT_EQ(sc_topo_pci_normalize("00000000:17:00.0", out, sizeof(out)), 0);
	CHECK_STR_EQ(out, "0000:17:00.0");
	CHECK_INT_EQ(sc_topo_pci_normalize("0000:3A:1f.7", out, sizeof(out)), 0);
	CHECK_STR_EQ(out, "0000:3a:1f.7");
	CHECK_INT_EQ(sc_topo_pci_normalize("0001:17:00.1", out, sizeof(out)), 0);
	CHECK_STR_EQ(out, "0001:17:00.1");
	CHECK_INT_EQ(sc_topo_pci_normalize("00010000:17:00.0", out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize("0000:17:00", out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize("000:17:00.0", out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize("0000:17:00.8", out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize(" 0000:17:00.0", out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize(NULL, out, sizeof(out)), -1);
	CHECK_INT_EQ(sc_topo_pci_normalize("0000:17:00.0", small, sizeof(small)), -1);
}

static const char *rank_str(const enum sc_topo_class *cls, size_t n, enum sc_topo_mem_kind kind,
			    char *buf, size_t cap)
{
	struct sc_topo_choice c;
	struct sc_err err = {0};
	size_t o = 0;

	if (sc_topo_rank(cls, n, kind, &c, &err)) {
		snprintf(buf, cap, "%s", err.msg);
		return buf;
	}
	o += (size_t)snprintf(buf, cap, "best %s ranked", sc_topo_class_name(c.best));
	for (size_t i = 0; i < c.n_ranked && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, " %u%s", c.ranked[i].rail,
				      c.ranked[i].chosen ? "*" : "");
	o += (size_t)snprintf(buf + o, cap - o, " chosen");
	for (size_t i = 0; i < c.n_chosen && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, " %u", c.chosen[i]);
	return buf;
}

/* The pure choice over classes. */
TEST(rank_pure)
{
	static const enum sc_topo_class a[] = {SC_TOPO_SYS, SC_TOPO_PXB, SC_TOPO_UNKNOWN,
					       SC_TOPO_PXB, SC_TOPO_NODE};
	static const enum sc_topo_class far[] = {SC_TOPO_SYS, SC_TOPO_UNKNOWN, SC_TOPO_SYS};
	static const enum sc_topo_class host[] = {SC_TOPO_SYS, SC_TOPO_NODE, SC_TOPO_UNKNOWN,
						  SC_TOPO_NODE};
	static const enum sc_topo_class unk[] = {SC_TOPO_UNKNOWN, SC_TOPO_UNKNOWN};
	enum sc_topo_class many[SC_TOPO_RAILS_MAX + 1] = {0};
	char buf[512];

	CHECK_STR_EQ(rank_str(a, 5, SC_TOPO_MEM_GPU, buf, sizeof(buf)),
		     "best PXB ranked 1* 3* 4 0 2 chosen 1 3");
	CHECK_STR_EQ(rank_str(far, 3, SC_TOPO_MEM_GPU, buf, sizeof(buf)),
		     "best SYS ranked 0* 2* 1 chosen 0 2");
	CHECK_STR_EQ(rank_str(unk, 2, SC_TOPO_MEM_GPU, buf, sizeof(buf)),
		     "best UNKNOWN ranked 0* 1* chosen 0 1");
	CHECK_STR_EQ(rank_str(host, 4, SC_TOPO_MEM_HOST, buf, sizeof(buf)),
		     "best NODE ranked 1* 3* 0 2 chosen 1 3");
	/* Host memory whose node has no rail: every rail, unknown ones too. */
	CHECK_STR_EQ(rank_str(far, 3, SC_TOPO_MEM_HOST, buf, sizeof(buf)),
		     "best SYS ranked 0* 2* 1* chosen 0 1 2");
	CHECK_STR_EQ(rank_str(a, 0, SC_TOPO_MEM_GPU, buf, sizeof(buf)),
		     "best UNKNOWN ranked chosen");
	CHECK_STR_CONTAINS(rank_str(many, SC_TOPO_RAILS_MAX + 1, SC_TOPO_MEM_GPU, buf, sizeof(buf)),
			   "at most 32");
	CHECK_STR_EQ(sc_topo_class_name((enum sc_topo_class)42), "UNKNOWN");
	CHECK_STR_EQ(sc_topo_class_name(SC_TOPO_PHB), "PHB");
}

TEST(table_limits_and_no_topology)
{
	struct sc_topo_table *tab = calloc(1, sizeof(*tab));
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX + 1];
	struct sc_topo_gpu gpus[SC_TOPO_GPUS_MAX + 1];
	struct sc_err err = {0};
	char buf[256];

	CHECK(tab != NULL);
	memset(rails, 0, sizeof(rails));
	memset(gpus, 0, sizeof(gpus));
	for (int i = 0; i < 2; i++) {
		snprintf(rails[i].name, sizeof(rails[i].name), "rxe%d", i);
		rails[i].numa = i;
	}
	snprintf(gpus[0].pci, sizeof(gpus[0].pci), "0000:01:00.0");
	int too_many_rails =
	    sc_topo_table_build(NULL, rails, SC_TOPO_RAILS_MAX + 1, gpus, 1, tab, &err);
	char msg1[SC_ERR_MSG_MAX];
	snprintf(msg1, sizeof(msg1), "%s", err.msg);
	int too_many_gpus =
	    sc_topo_table_build(NULL, rails, 2, gpus, SC_TOPO_GPUS_MAX + 1, tab, &err);
	char msg2[SC_ERR_MSG_MAX];
	snprintf(msg2, sizeof(msg2), "%s", err.msg);
	/* No topology: a GPU row of UNKNOWN rails (all chosen), no NUMA rows. */
	int rc = sc_topo_table_build(NULL, rails, 2, gpus, 1, tab, &err);
	size_t rows = tab->n_rows;
	const char *chosen = chosen_str(&tab->rows[0], tab->rails, buf, sizeof(buf));
	char label[SC_TOPO_LABEL_MAX];
	snprintf(label, sizeof(label), "%s", tab->rows[0].label);
	free(tab);
	CHECK_INT_EQ(too_many_rails, -1);
	CHECK_STR_CONTAINS(msg1, "at most 32");
	CHECK_INT_EQ(too_many_gpus, -1);
	CHECK_STR_CONTAINS(msg2, "at most 16");
	CHECK_INT_EQ(rc, 0);
	CHECK_INT_EQ(rows, 1);
	CHECK_STR_EQ(chosen, "rxe0 rxe1");
	CHECK_STR_EQ(label, "gpu0 0000:01:00.0");
}

TEST(load_errors_name_the_file)
{
	struct sc_topo *t = (struct sc_topo *)0x1;
	struct sc_err err = {0};
	char path[256];
	const char *tmp = getenv("SC_TEST_TMP");

	int missing = sc_topo_load("/nonexistent/topo.xml", &t, &err);
	CHECK_INT_EQ(missing, -1);
	CHECK_INT_EQ(err.code, SC_NOT_FOUND);
	CHECK_STR_CONTAINS(err.msg, "/nonexistent/topo.xml");
	CHECK(t == (struct sc_topo *)0x1); /* untouched on failure */

	snprintf(path, sizeof(path), "%s/sc-topo-bad-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (tmp && *tmp && mkdir(tmp, 0700) != 0 && errno != EEXIST)
		CHECK_FAIL_("mkdir %s: %s", tmp, strerror(errno));
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	static const char junk[] = "<topology version=\"2.0\"><object type=\"Machine\"";
	ssize_t w = write(fd, junk, sizeof(junk) - 1);
	close(fd);
	CHECK_INT_EQ(w, (ssize_t)sizeof(junk) - 1);
	sc_err_clear(&err);
	int bad = sc_topo_load(path, &t, &err);
	unlink(path);
	CHECK_INT_EQ(bad, -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, path);
	CHECK_STR_CONTAINS(err.msg, "not a valid hwloc XML topology");
	CHECK(t == (struct sc_topo *)0x1);
}

TEST(xml_from_env)
{
	const char *old = getenv(SC_TOPO_XML_ENV);
	char saved[512] = "";

	if (old)
		snprintf(saved, sizeof(saved), "%s", old);
	setenv(SC_TOPO_XML_ENV, SC_TOPO_FIXTURES "/dgx8.xml", 1);
	const char *v = sc_topo_xml_from_env();
	char got[512];
	snprintf(got, sizeof(got), "%s", v ? v : "(null)");
	setenv(SC_TOPO_XML_ENV, "", 1);
	const char *empty = sc_topo_xml_from_env();
	unsetenv(SC_TOPO_XML_ENV);
	const char *unset = sc_topo_xml_from_env();
	if (old)
		setenv(SC_TOPO_XML_ENV, saved, 1);
	CHECK_STR_EQ(got, SC_TOPO_FIXTURES "/dgx8.xml");
	CHECK(empty == NULL);
	CHECK(unset == NULL);
}

/* This host, from sysfs: it loads, or fails saying why and what to do. */
TEST(this_host)
{
	struct sc_topo *t = NULL;
	struct sc_err err = {0};
	struct sc_topo_rail rails[SC_TOPO_RAILS_MAX];
	int ids[SC_TOPO_NUMA_MAX];

	if (sc_topo_load(NULL, &t, &err)) {
		fprintf(stderr, "  this host: %s\n", err.msg);
		CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
		CHECK_STR_CONTAINS(err.msg, "sysfs");
		CHECK_STR_CONTAINS(err.msg, SC_TOPO_XML_ENV);
		return;
	}
	size_t n_numa = sc_topo_numa_nodes(t, ids, SC_TOPO_NUMA_MAX);
	size_t n_rails = nic_rails(t, rails);
	struct sc_topo_gpu gpus[SC_TOPO_GPUS_MAX];
	size_t n_gpus = sc_topo_gpus(t, gpus, SC_TOPO_GPUS_MAX);
	fprintf(
	    stderr,
	    "  this host (%s): %zu NUMA node(s), %zu OpenFabrics device(s), %zu NVIDIA GPU(s)\n",
	    sc_topo_source(t), n_numa, n_rails, n_gpus);
	struct sc_topo_table *tab = malloc(sizeof(*tab));
	int rc = tab ? sc_topo_table_build(
			   t, rails, n_rails > SC_TOPO_RAILS_MAX ? SC_TOPO_RAILS_MAX : n_rails,
			   gpus, n_gpus > SC_TOPO_GPUS_MAX ? SC_TOPO_GPUS_MAX : n_gpus, tab, &err)
		     : -1;
	for (size_t r = 0; rc == 0 && r < tab->n_rows; r++) {
		char buf[1024];
		fprintf(stderr, "    %s: %s\n", tab->rows[r].label,
			ranked_str(&tab->rows[r], tab->rails, buf, sizeof(buf)));
	}
	free(tab);
	char src[64];
	snprintf(src, sizeof(src), "%s", sc_topo_source(t));
	sc_topo_destroy(t);
	if (!getenv("HWLOC_XMLFILE"))
		CHECK_STR_EQ(src, "sysfs");
	CHECK(n_numa >= 1);
	CHECK_INT_EQ(rc, 0);
}

/* sc_topo_sysfs_pci_numa: what sysfs says for this host's PCI devices, -1 for a non-address or
 * a device that does not exist. */
TEST(sysfs_pci_numa)
{
	CHECK_INT_EQ(sc_topo_sysfs_pci_numa(NULL), -1);
	CHECK_INT_EQ(sc_topo_sysfs_pci_numa("not-a-pci-address"), -1);
	CHECK_INT_EQ(sc_topo_sysfs_pci_numa("ffff:ff:1f.7"), -1);
	DIR *d = opendir("/sys/bus/pci/devices");
	if (!d)
		return; /* no PCI bus here */
	struct dirent *e;
	size_t seen = 0;
	while ((e = readdir(d)) && seen < 8) {
		if (e->d_name[0] == '.')
			continue;
		char path[320];
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", e->d_name);
		FILE *f = fopen(path, "r");
		int want = -1;
		if (f) {
			if (fscanf(f, "%d", &want) != 1 || want < 0)
				want = -1;
			fclose(f);
		}
		CHECK_INT_EQ(sc_topo_sysfs_pci_numa(e->d_name), want);
		seen++;
	}
	closedir(d);
}

RUN_TESTS(T(dgx8_rail_per_gpu), T(dgx8_ranking_and_gpu_pairs), T(shared2_four_gpus_per_nic),
	  T(onesocket_nics_on_socket0), T(nic_pci_by_name), T(unknown_devices), T(pci_forms),
	  T(rank_pure), T(table_limits_and_no_topology), T(load_errors_name_the_file),
	  T(xml_from_env), T(sysfs_pci_numa), T(this_host))
