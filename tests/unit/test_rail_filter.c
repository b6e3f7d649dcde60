/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_rail_filter.c: --ib-devices (sidecar/conf/rail_filter.c): auto, an include list whose order is
 * the rails' order, device:port entries, an exclude list, and each malformed form refused with a
 * message that says what is wrong, leaving the output untouched.
 */
#include "check.h"
#include "conf/rail_filter.h"

#include <string.h>

TEST(auto_keeps_every_port)
{
	struct sc_rail_filter f;
	struct sc_err err = {0};
	for (int i = 0; i < 3; i++) {
		const char *text = i == 0 ? NULL : i == 1 ? "" : "auto";
		CHECK_INT_EQ(sc_rail_filter_parse(text, &f, &err), 0);
		CHECK_INT_EQ(f.n, 0);
		CHECK(!f.exclude);
		CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_0", 1), 0);
		CHECK_INT_EQ(sc_rail_filter_rank(&f, "rxe3", 2), 0);
	}
}

TEST(include_list_orders_the_rails)
{
	struct sc_rail_filter f;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_rail_filter_parse("mlx5_3,mlx5_0:2,rxe-a.b", &f, &err), 0);
	CHECK_INT_EQ(f.n, 3);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_3", 1), 0);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_3", 2), 0);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_0", 2), 1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_0", 1), -1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "rxe-a.b", 1), 2);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_1", 1), -1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_30", 1), -1);
	CHECK(sc_rail_filter_names(&f, "mlx5_0"));
	CHECK(!sc_rail_filter_names(&f, "mlx5_1"));
}

TEST(exclude_list_keeps_the_rest)
{
	struct sc_rail_filter f;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_rail_filter_parse("^mlx5_1,mlx5_2:2", &f, &err), 0);
	CHECK(f.exclude);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_1", 1), -1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_1", 2), -1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_2", 2), -1);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_2", 1), 0);
	CHECK_INT_EQ(sc_rail_filter_rank(&f, "mlx5_0", 1), 0);
}

TEST(malformed_lists_are_refused)
{
	static const struct {
		const char *text, *says;
	} bad[] = {
	    {"^", "needs the devices to leave out"},
	    {"mlx5_0,", "trailing ','"},
	    {",mlx5_0", "expected a device name"},
	    {"mlx5_0,,mlx5_1", "expected a device name"},
	    {"mlx5 0", "only A-Z a-z 0-9"},
	    {"mlx5_0:0", "port after ':' is 1-255"},
	    {"mlx5_0:256", "port after ':' is 1-255"},
	    {"mlx5_0:", "port after ':' is 1-255"},
	    {"mlx5_0:1x", "port after ':' is 1-255"},
	    {":1", "expected a device name"},
	    {"mlx5_0,mlx5_0", "listed twice"},
	    {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "1-63"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct sc_rail_filter f;
		memset(&f, 0x5a, sizeof(f));
		struct sc_err err = {0};
		CHECK_INT_EQ(sc_rail_filter_parse(bad[i].text, &f, &err), -1);
		CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
		CHECK_STR_CONTAINS(err.msg, bad[i].says);
		CHECK_INT_EQ(f.n, 0x5a5a5a5a5a5a5a5a);
	}
	char many[512] = "";
	for (int i = 0; i < 33; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sd%d", i ? "," : "", i);
	struct sc_rail_filter f;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_rail_filter_parse(many, &f, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "more than 32 devices");
}

RUN_TESTS(T(auto_keeps_every_port), T(include_list_orders_the_rails), T(exclude_list_keeps_the_rest),
	  T(malformed_lists_are_refused))
