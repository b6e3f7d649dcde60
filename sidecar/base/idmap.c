/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/idmap.c: open-addressing hash map (FNV-1a) used for the engine's operation and region
 * tables. Callers serialise access (the engine lock). Owns its slot array and key copies, not the
 * values. A slot array of SLOTS_MMAP_MIN bytes or more is mapped on its own (mmap) rather than
 * taken from the heap: a busy map rehashes every so many inserts (tombstones), and large arrays
 * freed back to the heap leave holes that small allocations fragment, so the heap would grow with
 * every rehash even though the map does not.
 *
 * sc_u64map (the transfer ids of passive uses and peer OPENs) hashes with a seeded mix instead:
 * its keys come from peers, and an unkeyed hash would let one pick keys that all probe one run.
 */
#include "base/idmap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

/* ---- sc_u64map ------------------------------------------------------------------------------- */

struct sc_u64slot {
	uint64_t key;
	void *value; /* NULL: empty */
};

#define U64MAP_MIN 8

static uint64_t u64_seed;
static pthread_once_t u64_seed_once = PTHREAD_ONCE_INIT;

static void u64_seed_init(void)
{
	uint64_t s = 0;
	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != (ssize_t)sizeof(s)) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^
		    (uint64_t)(uintptr_t)&s;
	}
	u64_seed = s | 1;
}

/* splitmix64's finalizer over the seeded key: a bijection, so distinct keys differ somewhere. */
static size_t u64_slot(uint64_t key, size_t mask)
{
	uint64_t z = key ^ u64_seed;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (size_t)(z ^ (z >> 31)) & mask;
}

static int u64_resize(struct sc_u64map *m, size_t ncap)
{
	struct sc_u64slot *ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return -1;
	for (size_t i = 0; i < m->cap; i++) {
		if (!m->slots[i].value)
			continue;
		size_t j = u64_slot(m->slots[i].key, ncap - 1);
		while (ns[j].value)
			j = (j + 1) & (ncap - 1);
		ns[j] = m->slots[i];
	}
	free(m->slots);
	m->slots = ns;
	m->cap = ncap;
	return 0;
}

static struct sc_u64slot *u64_find(const struct sc_u64map *m, uint64_t key)
{
	if (!m->cap)
		return NULL;
	size_t mask = m->cap - 1;
	for (size_t i = u64_slot(key, mask);; i = (i + 1) & mask) {
		struct sc_u64slot *s = &m->slots[i];
		if (!s->value)
			return NULL;
		if (s->key == key)
			return s;
	}
}

int sc_u64map_put(struct sc_u64map *m, uint64_t key, void *value)
{
	pthread_once(&u64_seed_once, u64_seed_init);
	if (!value || u64_find(m, key))
		return -1;
	if ((m->used + 1) * 2 > m->cap && u64_resize(m, m->cap ? m->cap * 2 : U64MAP_MIN) != 0)
		return -1;
	size_t mask = m->cap - 1;
	size_t i = u64_slot(key, mask);
	while (m->slots[i].value)
		i = (i + 1) & mask;
	m->slots[i] = (struct sc_u64slot){.key = key, .value = value};
	m->used++;
	return 0;
}

void *sc_u64map_get(const struct sc_u64map *m, uint64_t key)
{
	struct sc_u64slot *s = u64_find(m, key);
	return s ? s->value : NULL;
}

void *sc_u64map_del(struct sc_u64map *m, uint64_t key)
{
	struct sc_u64slot *s = u64_find(m, key);
	if (!s)
		return NULL;
	void *v = s->value;
	/* Backward shift: move up every later entry of the run that may sit at the hole. */
	size_t mask = m->cap - 1;
	size_t hole = (size_t)(s - m->slots);
	for (size_t j = (hole + 1) & mask; m->slots[j].value; j = (j + 1) & mask) {
		size_t home = u64_slot(m->slots[j].key, mask);
		/* j's entry may fill the hole unless its home lies cyclically in (hole, j]. */
		bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
		if (stays)
			continue;
		m->slots[hole] = m->slots[j];
		hole = j;
	}
	m->slots[hole] = (struct sc_u64slot){0};
	m->used--;
	if (m->used == 0)
		sc_u64map_clear(m);
	else if (m->cap > U64MAP_MIN && m->used * 8 < m->cap)
		(void)u64_resize(m, m->cap / 2); /* out of memory: stays as large, still correct */
	return v;
}

int sc_u64map_replace(struct sc_u64map *m, uint64_t key, void *value)
{
	struct sc_u64slot *s = u64_find(m, key);
	if (!s || !value)
		return -1;
	s->value = value;
	return 0;
}

void sc_u64map_each(const struct sc_u64map *m, void (*fn)(void *ctx, void *value), void *ctx)
{
	for (size_t i = 0; i < m->cap; i++)
		if (m->slots[i].value)
			fn(ctx, m->slots[i].value);
}

void sc_u64map_clear(struct sc_u64map *m)
{
	free(m->slots);
	*m = (struct sc_u64map){0};
}
