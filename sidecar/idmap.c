/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idmap.c: open-addressing hash map (FNV-1a) used for the engine's operation and region tables.
 * Callers serialise access (the engine lock). Owns its slot array and key copies, not the values.
 * A slot array of SLOTS_MMAP_MIN bytes or more is mapped on its own (mmap) rather than taken from
 * the heap: a busy map rehashes every so many inserts (tombstones), and large arrays freed back to
 * the heap leave holes that small allocations fragment, so the heap would grow with every rehash
 * even though the map does not.
 */
#include "idmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct slot {
	uint8_t state; /* 0 empty, 1 used, 2 tombstone */
	uint8_t klen;
	unsigned char key[SC_IDMAP_KEY_MAX];
	void *value;
};

struct sc_idmap {
	struct slot *slots;
	size_t cap;  /* power of two */
	size_t used; /* live entries */
	size_t fill; /* live + tombstones */
};

#define SLOTS_MMAP_MIN ((size_t)256 << 10)

/* A zeroed array of n slots, or NULL. */
static struct slot *slots_alloc(size_t n)
{
	size_t bytes = n * sizeof(struct slot);
	if (bytes < SLOTS_MMAP_MIN)
		return calloc(n, sizeof(struct slot));
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void slots_free(struct slot *slots, size_t n)
{
	size_t bytes = n * sizeof(struct slot);
	if (bytes < SLOTS_MMAP_MIN)
		free(slots);
	else if (slots)
		munmap(slots, bytes);
}

static uint64_t hash(const void *key, size_t klen)
{
	const unsigned char *p = key;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < klen; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return h;
}

struct sc_idmap *sc_idmap_create(void)
{
	struct sc_idmap *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->cap = 64;
	m->slots = slots_alloc(m->cap);
	if (!m->slots) {
		free(m);
		return NULL;
	}
	return m;
}

void sc_idmap_destroy(struct sc_idmap *m)
{
	if (!m)
		return;
	slots_free(m->slots, m->cap);
	free(m);
}

static struct slot *find(const struct sc_idmap *m, const void *key, size_t klen)
{
	size_t mask = m->cap - 1;
	for (size_t i = hash(key, klen) & mask, n = 0; n < m->cap; i = (i + 1) & mask, n++) {
		struct slot *s = &m->slots[i];
		if (s->state == 0)
			return NULL;
		if (s->state == 1 && s->klen == klen && memcmp(s->key, key, klen) == 0)
			return s;
	}
	return NULL;
}

static int grow(struct sc_idmap *m)
{
	size_t ncap = m->used * 4 > m->cap ? m->cap * 2 : m->cap;
	struct slot *ns = slots_alloc(ncap);
	if (!ns)
		return -1;
	for (size_t i = 0; i < m->cap; i++) {
		struct slot *s = &m->slots[i];
		if (s->state != 1)
			continue;
		size_t j = hash(s->key, s->klen) & (ncap - 1);
		while (ns[j].state)
			j = (j + 1) & (ncap - 1);
		ns[j] = *s;
	}
	slots_free(m->slots, m->cap);
	m->slots = ns;
	m->cap = ncap;
	m->fill = m->used;
	return 0;
}

int sc_idmap_put(struct sc_idmap *m, const void *key, size_t klen, void *value)
{
	if (klen > SC_IDMAP_KEY_MAX || find(m, key, klen))
		return -1;
	if ((m->fill + 1) * 2 > m->cap && grow(m) != 0)
		return -1;
	size_t mask = m->cap - 1;
	size_t i = hash(key, klen) & mask;
	while (m->slots[i].state == 1)
		i = (i + 1) & mask;
	struct slot *s = &m->slots[i];
	if (s->state == 0)
		m->fill++;
	s->state = 1;
	s->klen = (uint8_t)klen;
	memcpy(s->key, key, klen);
	s->value = value;
	m->used++;
	return 0;
}

void *sc_idmap_get(const struct sc_idmap *m, const void *key, size_t klen)
{
	if (klen > SC_IDMAP_KEY_MAX)
		return NULL;
	struct slot *s = find(m, key, klen);
	return s ? s->value : NULL;
}

void *sc_idmap_del(struct sc_idmap *m, const void *key, size_t klen)
{
	if (klen > SC_IDMAP_KEY_MAX)
		return NULL;
	struct slot *s = find(m, key, klen);
	if (!s)
		return NULL;
	void *v = s->value;
	s->state = 2;
	s->value = NULL;
	m->used--;
	return v;
}

size_t sc_idmap_count(const struct sc_idmap *m)
{
	return m->used;
}

void sc_idmap_each(const struct sc_idmap *m, void (*fn)(void *ctx, void *value), void *ctx)
{
	for (size_t i = 0; i < m->cap; i++)
		if (m->slots[i].state == 1)
			fn(ctx, m->slots[i].value);
}
