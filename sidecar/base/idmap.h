/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/idmap.h: a hash map from byte-string keys (ids, tokens) to pointers; open addressing with
 * linear probing and tombstones, grows at 50% load. Not thread-safe: the engine guards it with its
 * lock. Keys are copied (at most SC_IDMAP_KEY_MAX bytes). And sc_u64map, for 64-bit keys a peer
 * chooses (below).
 */
#ifndef SC_IDMAP_H
#define SC_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SC_IDMAP_KEY_MAX 48

struct sc_idmap;

struct sc_idmap *sc_idmap_create(void);
void sc_idmap_destroy(struct sc_idmap *m); /* values are not freed; NULL ok */
/* Returns 0, or -1 (out of memory, key too long, key present). */
int sc_idmap_put(struct sc_idmap *m, const void *key, size_t klen, void *value);
void *sc_idmap_get(const struct sc_idmap *m, const void *key, size_t klen);
/* Returns the removed value or NULL. */
void *sc_idmap_del(struct sc_idmap *m, const void *key, size_t klen);
size_t sc_idmap_count(const struct sc_idmap *m);
/* Visit every value (do not modify the map from fn). */
void sc_idmap_each(const struct sc_idmap *m, void (*fn)(void *ctx, void *value), void *ctx);

/*
 * sc_u64map: a map from 64-bit keys that a peer may choose (transfer ids) to non-NULL pointers.
 * Open addressing, linear probing, deletion by backward shift (no tombstones, so a map with many
 * puts and deletes never degrades), grows at 50% load from 8 slots and shrinks with its contents.
 * The slot comes from a keyed mix of the key (a random seed per process), so a peer cannot pick
 * keys that share a probe run: every call is O(1) expected whatever the keys. Embed it zeroed
 * (an empty map, nothing allocated); not thread-safe (its owner's lock guards it).
 */
struct sc_u64map {
	struct sc_u64slot *slots;
	size_t cap; /* 0 or a power of two */
	size_t used;
};
/* 0; -1 when out of memory or the key is present (value NULL: -1). */
int sc_u64map_put(struct sc_u64map *m, uint64_t key, void *value);
void *sc_u64map_get(const struct sc_u64map *m, uint64_t key);
/* The removed value, or NULL. */
void *sc_u64map_del(struct sc_u64map *m, uint64_t key);
/* Give a present key another (non-NULL) value in place, never allocating: 0, or -1 when absent. */
int sc_u64map_replace(struct sc_u64map *m, uint64_t key, void *value);
static inline size_t sc_u64map_count(const struct sc_u64map *m)
{
	return m->used;
}
/* Visit every value (do not modify the map from fn). */
void sc_u64map_each(const struct sc_u64map *m, void (*fn)(void *ctx, void *value), void *ctx);
/* Frees the slots (not the values); the map is empty and usable again. */
void sc_u64map_clear(struct sc_u64map *m);

#endif
