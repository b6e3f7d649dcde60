/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idmap.h: a hash map from byte-string keys (ids, tokens) to pointers; open addressing with
 * linear probing and tombstones, grows at 50% load. Not thread-safe: the engine guards it with its
 * lock. Keys are copied (at most SC_IDMAP_KEY_MAX bytes).
 */
#ifndef SC_IDMAP_H
#define SC_IDMAP_H

#include <stdbool.h>
#include <stddef.h>

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

#endif
