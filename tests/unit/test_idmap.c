/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_idmap.c: the hash map (sidecar/base/idmap.h): put, get, del, duplicate and over-long keys, a
 * prefix of a key, a key put again over its tombstone, and churn: 200,000 distinct keys through a
 * map that holds at most 4,096 at once (tombstones force rehashes), then a map that grows to 65,536
 * keys (its slot array past the size mapped on its own) and empties, every live key still found and
 * every deleted one gone; and sc_u64map against a reference array. Single-threaded.
 */
#include "check.h"
#include "base/idmap.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static size_t key(char *buf, size_t cap, unsigned long i)
{
	return (size_t)snprintf(buf, cap, "request-%lu", i);
}

TEST(put_get_del)
{
	struct sc_idmap *m = sc_idmap_create();
	CHECK(m != NULL);
	int a = 1, b = 2;
	CHECK_INT_EQ(sc_idmap_put(m, "abc", 3, &a), 0);
	CHECK_INT_EQ(sc_idmap_put(m, "abd", 3, &b), 0);
	CHECK_INT_EQ(sc_idmap_put(m, "abc", 3, &b), -1); /* present */
	CHECK(sc_idmap_get(m, "abc", 3) == &a);
	CHECK(sc_idmap_get(m, "abd", 3) == &b);
	CHECK(sc_idmap_get(m, "ab", 2) == NULL); /* a prefix is another key */
	CHECK_U64_EQ(sc_idmap_count(m), 2);
	CHECK(sc_idmap_del(m, "abc", 3) == &a);
	CHECK(sc_idmap_del(m, "abc", 3) == NULL);
	CHECK(sc_idmap_get(m, "abc", 3) == NULL);
	CHECK(sc_idmap_get(m, "abd", 3) == &b);
	CHECK_INT_EQ(sc_idmap_put(m, "abc", 3, &b), 0); /* over its tombstone */
	CHECK(sc_idmap_get(m, "abc", 3) == &b);
	char longest[SC_IDMAP_KEY_MAX + 1];
	memset(longest, 'k', sizeof(longest));
	CHECK_INT_EQ(sc_idmap_put(m, longest, SC_IDMAP_KEY_MAX, &a), 0);
	CHECK(sc_idmap_get(m, longest, SC_IDMAP_KEY_MAX) == &a);
	CHECK_INT_EQ(sc_idmap_put(m, longest, SC_IDMAP_KEY_MAX + 1, &a), -1);
	CHECK(sc_idmap_get(m, longest, SC_IDMAP_KEY_MAX + 1) == NULL);
	CHECK(sc_idmap_del(m, longest, SC_IDMAP_KEY_MAX + 1) == NULL);
	CHECK_U64_EQ(sc_idmap_count(m), 3);
	sc_idmap_destroy(m);
	sc_idmap_destroy(NULL);
}

static void count_value(void *ctx, void *value)
{
	(void)value;
	(*(size_t *)ctx)++;
}

TEST(churn_through_rehashes)
{
	enum { LIVE = 4096, TOTAL = 200000 };
	static uintptr_t vals[TOTAL];
	struct sc_idmap *m = sc_idmap_create();
	CHECK(m != NULL);
	char k[32];
	for (unsigned long i = 0; i < TOTAL; i++) {
		vals[i] = i + 1;
		size_t n = key(k, sizeof(k), i);
		if (sc_idmap_put(m, k, n, &vals[i]) != 0)
			CHECK_FAIL_("put %lu failed", i);
		if (i >= LIVE) {
			n = key(k, sizeof(k), i - LIVE);
			if (sc_idmap_del(m, k, n) != &vals[i - LIVE])
				CHECK_FAIL_("del %lu lost its value", i - LIVE);
		}
	}
	CHECK_U64_EQ(sc_idmap_count(m), LIVE);
	for (unsigned long i = 0; i < TOTAL; i++) {
		size_t n = key(k, sizeof(k), i);
		void *want = i >= TOTAL - LIVE ? &vals[i] : NULL;
		if (sc_idmap_get(m, k, n) != want)
			CHECK_FAIL_("get %lu: wrong value", i);
	}
	size_t seen = 0;
	sc_idmap_each(m, count_value, &seen);
	CHECK_U64_EQ(seen, LIVE);
	sc_idmap_destroy(m);

	/* A map that grows to 65,536 keys (its slot array then mapped on its own) and empties. */
	m = sc_idmap_create();
	CHECK(m != NULL);
	for (unsigned long i = 0; i < 65536; i++) {
		size_t n = key(k, sizeof(k), i);
		if (sc_idmap_put(m, k, n, &vals[i]) != 0)
			CHECK_FAIL_("put %lu failed", i);
	}
	for (unsigned long i = 0; i < 65536; i++) {
		size_t n = key(k, sizeof(k), i);
		if (sc_idmap_del(m, k, n) != &vals[i])
			CHECK_FAIL_("del %lu lost its value", i);
	}
	CHECK_U64_EQ(sc_idmap_count(m), 0);
	sc_idmap_destroy(m);
}


/* sc_u64map: random puts and deletes against a reference array (backward-shift deletion keeps
 * every key findable), keys that differ only in their high bits, and a map that empties. */
TEST(u64map_against_reference)
{
	enum { N = 4096 };
	static uint8_t present[N];
	static int vals[N];
	struct sc_u64map m = {0};
	uint64_t x = 88172645463325252ull;
	CHECK(sc_u64map_get(&m, 7) == NULL);
	CHECK(sc_u64map_del(&m, 7) == NULL);
	for (int step = 0; step < 400000; step++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		unsigned k = (unsigned)(x % N);
		uint64_t key = (uint64_t)k << 40 | 0x5a5a; /* the low bits alike: the mix spreads them */
		if (x & (1ull << 62)) {
			CHECK_INT_EQ(sc_u64map_put(&m, key, &vals[k]), present[k] ? -1 : 0);
			present[k] = 1;
		} else {
			CHECK(sc_u64map_del(&m, key) == (present[k] ? &vals[k] : NULL));
			present[k] = 0;
		}
		if (step % 50000 == 0) {
			size_t n = 0;
			for (unsigned i = 0; i < N; i++) {
				n += present[i];
				CHECK(sc_u64map_get(&m, (uint64_t)i << 40 | 0x5a5a) ==
				      (present[i] ? &vals[i] : NULL));
			}
			CHECK_U64_EQ(sc_u64map_count(&m), n);
		}
	}
	CHECK_INT_EQ(sc_u64map_put(&m, 1, NULL), -1);
	for (unsigned i = 0; i < N; i++)
		if (present[i])
			CHECK(sc_u64map_del(&m, (uint64_t)i << 40 | 0x5a5a) == &vals[i]);
	CHECK_U64_EQ(sc_u64map_count(&m), 0);
	CHECK(m.slots == NULL); /* empty: nothing held */
	sc_u64map_clear(&m);
}

RUN_TESTS(T(put_get_del), T(churn_through_rehashes), T(u64map_against_reference))
