/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/list_page.c: one page of ListRegions (and the ordering ListOperations shares): the entries of a
 * table whose id sorts after the page token, in id order, so every entry comes exactly once while
 * the set does not change. Runs on gRPC worker threads under the engine lock; owns only the
 * temporary arrays it hands back.
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

int sc_region_list_page(struct sc_engine *eng, const char *after, size_t limit,
			struct sc_region_info **out, size_t *n, bool *more, struct sc_err *err)
{
	const void **items = NULL;
	size_t found = 0;
	pthread_mutex_lock(&eng->mu);
	if (sc_page_collect(eng->regions, offsetof(struct sc_region, id), after, &items, &found, err) != 0) {
		pthread_mutex_unlock(&eng->mu);
		return -1;
	}
	size_t take = found < limit ? found : limit;
	struct sc_region_info *infos = calloc(take ? take : 1, sizeof(*infos));
	for (size_t i = 0; infos && i < take; i++)
		sc_region_fill_info(items[i], &infos[i]);
	pthread_mutex_unlock(&eng->mu);
	free(items);
	if (!infos)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	*out = infos;
	*n = take;
	*more = found > take;
	return 0;
}
