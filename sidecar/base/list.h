/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base/list.h: an intrusive circular doubly linked list, in the manner of libuv's queue.h and the
 * Linux kernel's base/list.h. A list is a struct sc_list head; an element embeds a struct sc_list
 * node and is found again from it with sc_list_entry(). An empty list, and a node on no list, point
 * at themselves, so insert and remove never test for NULL or for the ends.
 *
 * No allocation and no locking: the owner of a list guards it as it guards the rest of its state.
 * Heads and nodes must be initialized (sc_list_init or SC_LIST_INIT) before first use. Removing a
 * node leaves it self-linked, so a second remove is harmless and sc_list_linked() tells whether a
 * node is on a list. Everything here is O(1) except the iteration macros.
 */
#ifndef SC_LIST_H
#define SC_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct sc_list {
	struct sc_list *prev, *next;
};

/* Static initializer of a head or node named `name`: SC_LIST_INIT(srv.live). */
#define SC_LIST_INIT(name)                                                                         \
	{                                                                                          \
		&(name), &(name)                                                                   \
	}

/* The element of type `type` whose member `member` is the node at ptr. */
#define sc_list_entry(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void sc_list_init(struct sc_list *l)
{
	l->prev = l;
	l->next = l;
}

static inline bool sc_list_empty(const struct sc_list *head)
{
	return head->next == head;
}

/* Whether a node is on some list (false after sc_list_init or sc_list_remove). */
static inline bool sc_list_linked(const struct sc_list *node)
{
	return node->next != node;
}

/* Links node in between prev and next (both already adjacent). */
static inline void sc_list_link_(struct sc_list *node, struct sc_list *prev, struct sc_list *next)
{
	node->prev = prev;
	node->next = next;
	prev->next = node;
	next->prev = node;
}

/* Appends node at the tail (FIFO with sc_list_first). node must not be on a list. */
static inline void sc_list_insert_tail(struct sc_list *head, struct sc_list *node)
{
	sc_list_link_(node, head->prev, head);
}

/* Pushes node at the head (LIFO with sc_list_first). node must not be on a list. */
static inline void sc_list_insert_head(struct sc_list *head, struct sc_list *node)
{
	sc_list_link_(node, head, head->next);
}

/* Unlinks node from its list and leaves it self-linked; harmless on a node on no list. */
static inline void sc_list_remove(struct sc_list *node)
{
	node->prev->next = node->next;
	node->next->prev = node->prev;
	sc_list_init(node);
}

/* The first node, or NULL when the list is empty. */
static inline struct sc_list *sc_list_first(const struct sc_list *head)
{
	return head->next == head ? NULL : head->next;
}

/* Moves every node of from to the tail of to, in order; from is left empty. */
static inline void sc_list_move_all(struct sc_list *from, struct sc_list *to)
{
	if (sc_list_empty(from))
		return;
	struct sc_list *first = from->next, *last = from->prev;
	first->prev = to->prev;
	to->prev->next = first;
	last->next = to;
	to->prev = last;
	sc_list_init(from);
}

/* Visits each node of head, first to last, as `struct sc_list *pos`. The body must not remove
 * pos (use sc_list_foreach_safe for that). */
#define sc_list_foreach(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

/* As sc_list_foreach, but the body may remove (and free) pos; tmp holds the next node. The body
 * must not remove the node after pos. */
#define sc_list_foreach_safe(pos, tmp, head)                                                       \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                           \
	     (pos) = (tmp), (tmp) = (pos)->next)

#endif
