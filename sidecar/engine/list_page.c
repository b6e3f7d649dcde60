/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/list_page.c: the page ordering ListRegions (engine/region.c) and ListOperations
 * (engine/operation.c) share: the entries of a table whose id sorts after the page token, in id
 * order, so every entry comes exactly once while the set does not change. Runs on gRPC worker
 * threads under the engine lock; owns only the temporary arrays it hands back.
 */
#include "engine/internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct page_entry {
	const char *id;
	const void *item;
};

struct page_ctx {
	const char *after;
	size_t id_offset;
	struct page_entry *items;
	size_t n;
};

static void page_collect(void *ctx, void *value)
{
	struct page_ctx *c = ctx;
	const char *id = (const char *)value + c->id_offset;
	if (strcmp(id, c->after) > 0)
		c->items[c->n++] = (struct page_entry){id, value};
}

static int page_cmp(const void *a, const void *b)
{
	return strcmp(((const struct page_entry *)a)->id, ((const struct page_entry *)b)->id);
}

int sc_page_collect(struct sc_idmap *table, size_t id_offset, const char *after,
		    const void ***items, size_t *n, struct sc_err *err)
{
	size_t count = sc_idmap_count(table);
	struct page_ctx c = {after ? after : "", id_offset,
			     calloc(count ? count : 1, sizeof(struct page_entry)), 0};
	if (!c.items)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	sc_idmap_each(table, page_collect, &c);
	qsort(c.items, c.n, sizeof(*c.items), page_cmp);
	/* Hand back the items alone, in order, in the same allocation. */
	const void **out = (const void **)c.items;
	for (size_t i = 0; i < c.n; i++)
		out[i] = c.items[i].item;
	*items = out;
	*n = c.n;
	return 0;
}
