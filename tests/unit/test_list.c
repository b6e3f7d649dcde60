/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_list.c: the intrusive list (sidecar/base/list.h): FIFO and LIFO order, remove from the ends and
 * the middle, a second remove that changes nothing, safe iteration that removes every other node
 * and the last one, moving a whole list, and an element found again from its node.
 */
#include "check.h"
#include "base/list.h"

struct item {
	int tag;
	struct sc_list node;
};

/* Writes the tags of head in order into out (at most max), returns how many there are. */
static size_t tags(const struct sc_list *head, int *out, size_t max)
{
	size_t n = 0;
	struct sc_list *pos;
	sc_list_foreach(pos, head) {
		if (n < max)
			out[n] = sc_list_entry(pos, struct item, node)->tag;
		n++;
	}
	return n;
}

static void fill(struct item *it, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		it[i].tag = (int)i;
		sc_list_init(&it[i].node);
	}
}

TEST(empty)
{
	struct sc_list head;
	sc_list_init(&head);
	CHECK(sc_list_empty(&head));
	CHECK(sc_list_first(&head) == NULL);
	int out[1];
	CHECK_INT_EQ(tags(&head, out, 1), 0);

	struct sc_list st = SC_LIST_INIT(st);
	CHECK(sc_list_empty(&st));
	CHECK(!sc_list_linked(&st));
}

TEST(insert_tail_is_fifo)
{
	struct sc_list head = SC_LIST_INIT(head);
	struct item it[4];
	fill(it, 4);
	for (int i = 0; i < 4; i++)
		sc_list_insert_tail(&head, &it[i].node);
	CHECK(!sc_list_empty(&head));
	int out[4];
	CHECK_INT_EQ(tags(&head, out, 4), 4);
	for (int i = 0; i < 4; i++)
		CHECK_INT_EQ(out[i], i);
	CHECK(sc_list_first(&head) == &it[0].node);
	CHECK_INT_EQ(sc_list_entry(sc_list_first(&head), struct item, node)->tag, 0);
}

TEST(insert_head_is_lifo)
{
	struct sc_list head = SC_LIST_INIT(head);
	struct item it[4];
	fill(it, 4);
	for (int i = 0; i < 4; i++)
		sc_list_insert_head(&head, &it[i].node);
	int out[4];
	CHECK_INT_EQ(tags(&head, out, 4), 4);
	for (int i = 0; i < 4; i++)
		CHECK_INT_EQ(out[i], 3 - i);
	CHECK(sc_list_first(&head) == &it[3].node);
}

TEST(remove_ends_and_middle)
{
	struct sc_list head = SC_LIST_INIT(head);
	struct item it[5];
	fill(it, 5);
	for (int i = 0; i < 5; i++)
		sc_list_insert_tail(&head, &it[i].node);
	sc_list_remove(&it[0].node); /* first */
	sc_list_remove(&it[4].node); /* last */
	sc_list_remove(&it[2].node); /* middle */
	CHECK(!sc_list_linked(&it[0].node));
	CHECK(!sc_list_linked(&it[2].node));
	CHECK(sc_list_linked(&it[1].node));
	int out[5];
	CHECK_INT_EQ(tags(&head, out, 5), 2);
	CHECK_INT_EQ(out[0], 1);
	CHECK_INT_EQ(out[1], 3);
	/* Backwards links hold too. */
	CHECK(head.prev == &it[3].node);
	CHECK(it[3].node.prev == &it[1].node);
	CHECK(it[1].node.prev == &head);
	sc_list_remove(&it[1].node);
	sc_list_remove(&it[3].node);
	CHECK(sc_list_empty(&head));
	CHECK(head.next == &head && head.prev == &head);
}

TEST(double_remove_is_harmless)
{
	struct sc_list head = SC_LIST_INIT(head);
	struct item it[3];
	fill(it, 3);
	for (int i = 0; i < 3; i++)
		sc_list_insert_tail(&head, &it[i].node);
	sc_list_remove(&it[1].node);
	sc_list_remove(&it[1].node);
	CHECK(it[1].node.next == &it[1].node && it[1].node.prev == &it[1].node);
	int out[3];
	CHECK_INT_EQ(tags(&head, out, 3), 2);
	CHECK_INT_EQ(out[0], 0);
	CHECK_INT_EQ(out[1], 2);
	/* A node that was never inserted: remove is a no-op too. */
	struct item lone = {.tag = 9};
	sc_list_init(&lone.node);
	sc_list_remove(&lone.node);
	CHECK(!sc_list_linked(&lone.node));
	CHECK_INT_EQ(tags(&head, out, 3), 2);
	/* A removed node can be inserted again. */
	sc_list_insert_head(&head, &it[1].node);
	CHECK_INT_EQ(tags(&head, out, 3), 3);
	CHECK_INT_EQ(out[0], 1);
}

TEST(safe_iteration_removes_current)
{
	struct sc_list head = SC_LIST_INIT(head);
	struct item it[7];
	fill(it, 7);
	for (int i = 0; i < 7; i++)
		sc_list_insert_tail(&head, &it[i].node);
	/* Remove the even tags (the first and the last among them) while walking. */
	int seen = 0;
	struct sc_list *pos, *tmp;
	sc_list_foreach_safe(pos, tmp, &head) {
		struct item *e = sc_list_entry(pos, struct item, node);
		CHECK_INT_EQ(e->tag, seen);
		seen++;
		if (e->tag % 2 == 0) {
			sc_list_remove(pos);
			e->node.next = e->node.prev = NULL; /* as if freed: never read again */
		}
	}
	CHECK_INT_EQ(seen, 7);
	int out[7];
	CHECK_INT_EQ(tags(&head, out, 7), 3);
	CHECK_INT_EQ(out[0], 1);
	CHECK_INT_EQ(out[1], 3);
	CHECK_INT_EQ(out[2], 5);
	/* Drain the rest the same way. */
	sc_list_foreach_safe(pos, tmp, &head)
		sc_list_remove(pos);
	CHECK(sc_list_empty(&head));
}

TEST(move_all_keeps_order)
{
	struct sc_list a = SC_LIST_INIT(a), b = SC_LIST_INIT(b);
	struct item it[5];
	fill(it, 5);
	sc_list_move_all(&a, &b); /* empty into empty */
	CHECK(sc_list_empty(&a) && sc_list_empty(&b));
	sc_list_insert_tail(&b, &it[0].node);
	for (int i = 1; i < 5; i++)
		sc_list_insert_tail(&a, &it[i].node);
	sc_list_move_all(&a, &b);
	CHECK(sc_list_empty(&a));
	int out[5];
	CHECK_INT_EQ(tags(&b, out, 5), 5);
	for (int i = 0; i < 5; i++)
		CHECK_INT_EQ(out[i], i);
	CHECK(b.prev == &it[4].node);
	CHECK(it[4].node.next == &b);
}

RUN_TESTS(T(empty), T(insert_tail_is_fifo), T(insert_head_is_lifo), T(remove_ends_and_middle),
	  T(double_remove_is_harmless), T(safe_iteration_removes_current), T(move_all_keeps_order))
