/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_rail_choice.c: the rails a backend is told to use for GPU memory (engine/rail_table.c,
 * sc_engine_rail_choice), over a rail table built from the dgx8 fixture (tests/unit/topology):
 * GPU 2's memory goes through mlx5_2 and mlx5_3 (its PCIe switch), GPU 5's through mlx5_4 and
 * mlx5_5; host memory, an unknown GPU, a table whose choice names none of the backend's rails, and
 * no table at all give no opinion (every rail may carry it).
 */
#include "check.h"
#include "engine/internal.h"
#include "os/topology.h"

#include <stdlib.h>
#include <string.h>

#ifndef SC_TOPO_FIXTURES
#define SC_TOPO_FIXTURES "tests/unit/topology"
#endif

static struct sc_topo_table *dgx8_table(void)
{
	struct sc_topo *t = NULL;
	struct sc_err err = {0};
	struct sc_topo_nic nics[8];
	if (sc_topo_load(SC_TOPO_FIXTURES "/dgx8.xml", &t, &err) != 0)
		return NULL;
	if (sc_topo_nics(t, nics, 8) != 8) {
		sc_topo_destroy(t);
		return NULL;
	}
	struct sc_topo_rail rails[8];
	for (int i = 0; i < 8; i++) {
		snprintf(rails[i].name, sizeof(rails[i].name), "%s:1", nics[i].name);
		snprintf(rails[i].pci, sizeof(rails[i].pci), "%s", nics[i].pci);
		rails[i].numa = -1;
	}
	static const char *bus[] = {"0000:13:00.0", "0000:14:00.0", "0000:33:00.0", "0000:34:00.0",
				    "0000:93:00.0", "0000:94:00.0", "0000:b3:00.0", "0000:b4:00.0"};
	struct sc_topo_gpu gpus[8];
	for (int i = 0; i < 8; i++) {
		gpus[i].ordinal = i;
		snprintf(gpus[i].pci, sizeof(gpus[i].pci), "%s", bus[i]);
	}
	struct sc_topo_table *tab = calloc(1, sizeof(*tab));
	if (tab && sc_topo_table_build(t, rails, 8, gpus, 8, tab, &err) != 0) {
		free(tab);
		tab = NULL;
	}
	sc_topo_destroy(t);
	return tab;
}

/* A backend whose rails are mlx5_0:1 .. mlx5_7:1. */
static void backend_rails(struct sc_backend *b)
{
	memset(b, 0, sizeof(*b));
	for (int i = 0; i < 8; i++)
		snprintf(b->rails[i].name, sizeof(b->rails[i].name), "mlx5_%d:1", i);
	b->n_rails = 8;
}

static const char *allowed(const bool *allow, char *buf, size_t cap)
{
	buf[0] = 0;
	for (int i = 0; i < 8; i++)
		if (allow[i])
			snprintf(buf + strlen(buf), cap - strlen(buf), "%s%d", buf[0] ? "," : "", i);
	return buf;
}

TEST(gpu_memory_goes_through_its_switch)
{
	struct sc_engine *eng = calloc(1, sizeof(*eng));
	eng->topo_table = dgx8_table();
	CHECK(eng->topo_table != NULL);
	struct sc_backend *b = calloc(1, sizeof(*b));
	backend_rails(b);
	bool allow[SC_MAX_RAILS];
	char buf[64];
	CHECK(sc_engine_rail_choice(eng, b, 2, allow));
	CHECK_STR_EQ(allowed(allow, buf, sizeof(buf)), "2,3");
	CHECK(sc_engine_rail_choice(eng, b, 5, allow));
	CHECK_STR_EQ(allowed(allow, buf, sizeof(buf)), "4,5");
	CHECK(sc_engine_rail_choice(eng, b, 0, allow));
	CHECK_STR_EQ(allowed(allow, buf, sizeof(buf)), "0,1");
	/* No opinion: host memory, a GPU the table does not know. */
	CHECK(!sc_engine_rail_choice(eng, b, -1, allow));
	CHECK(!sc_engine_rail_choice(eng, b, 9, allow));
	/* A backend none of whose rails the table chose for that GPU. */
	for (int i = 0; i < 8; i++)
		snprintf(b->rails[i].name, sizeof(b->rails[i].name), "rxe%d:1", i);
	CHECK(!sc_engine_rail_choice(eng, b, 2, allow));
	free(eng->topo_table);
	eng->topo_table = NULL;
	backend_rails(b);
	CHECK(!sc_engine_rail_choice(eng, b, 2, allow)); /* no table */
	free(b);
	free(eng);
}

RUN_TESTS(T(gpu_memory_goes_through_its_switch))
