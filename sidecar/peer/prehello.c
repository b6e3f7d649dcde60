/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/prehello.c: the room connections have before their hello, against floods of idle or silent
 * connections. A full room never turns the newcomer away (a flood that reopens what is closed
 * would keep every honest peer out): the oldest silent connection in the narrowest scope that is
 * full is closed instead (ps_prehello_make_room_locked). The scopes: one address
 * (--data-max-unauth-per-ip), its /24 or /64, the general room (--data-max-unauth), and the room
 * kept for addresses whose hello succeeded within RECENT_AUTH_MS (peer/internal.h).
 *
 * Threads: the accept thread (making room), the pool threads (a hello that succeeded, a connection
 * that ended); always under srv->mu. Owns nothing: the lists and counts are the server's.
 */
#include "peer/internal.h"

#include "base/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

static bool net_is_v4(const uint8_t n[16])
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(n, mapped, sizeof(mapped)) == 0;
}

/* In the same /24 (IPv4) or /64 (IPv6)? */
static bool same_prefix(const uint8_t a[16], const uint8_t b[16])
{
	bool v4 = net_is_v4(a);
	return v4 == net_is_v4(b) && memcmp(a, b, v4 ? 15 : 8) == 0;
}

/* "10.1.2.0/24" or "2001:db8::/64". */
static void format_prefix(const uint8_t n[16], char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	if (net_is_v4(n)) {
		uint8_t v4[4] = {n[12], n[13], n[14], 0};
		inet_ntop(AF_INET, v4, host, sizeof(host));
		snprintf(out, cap, "%s/24", host);
	} else {
		uint8_t v6[16] = {0};
		memcpy(v6, n, 8);
		inet_ntop(AF_INET6, v6, host, sizeof(host));
		snprintf(out, cap, "%s/64", host);
	}
}

/* Did a hello from this address succeed within RECENT_AUTH_MS? Under mu. */
static bool recent_auth_has_locked(const struct sc_peer_server *srv, const uint8_t net[16],
				   uint64_t now)
{
	for (size_t i = 0; i < RECENT_AUTH_SLOTS; i++) {
		const struct recent_auth *r = &srv->recent_auth[i];
		if (r->mono_ms && now - r->mono_ms < RECENT_AUTH_MS && memcmp(r->net, net, 16) == 0)
			return true;
	}
	return false;
}

/* A hello from this address succeeded; the table full, the longest-silent address gives way.
 * Under mu. */
void ps_recent_auth_note_locked(struct sc_peer_server *srv, const uint8_t net[16], uint64_t now)
{
	struct recent_auth *slot = &srv->recent_auth[0];
	for (size_t i = 0; i < RECENT_AUTH_SLOTS; i++) {
		struct recent_auth *r = &srv->recent_auth[i];
		if (r->mono_ms && memcmp(r->net, net, 16) == 0) {
			slot = r;
			break;
		}
		if (r->mono_ms < slot->mono_ms)
			slot = r;
	}
	memcpy(slot->net, net, 16);
	slot->mono_ms = now ? now : 1;
}

/* The connection no longer holds room before the hello (authenticated, ended, or dropped for a
 * newer one). Under mu. */
void ps_prehello_leave_locked(struct sc_peer_server *srv, struct conn *c)
{
	if (!sc_list_linked(&c->wait_node))
		return;
	sc_list_remove(&c->wait_node);
	srv->n_waiting_room[c->reserved]--;
}

/* Parked, and not a byte arrived: a silent connection (a dialing sidecar speaks at once). */
static bool prehello_silent(const struct conn *c)
{
	int n = 0;
	return atomic_load(&c->state) == CONN_IDLE && ioctl(c->fd, FIONREAD, &n) == 0 && n == 0;
}

enum room_scope { ROOM_ADDR, ROOM_PREFIX, ROOM_GENERAL };

static bool in_room_scope(const struct conn *o, enum room_scope scope, const uint8_t net[16])
{
	switch (scope) {
	case ROOM_ADDR:
		return memcmp(o->net, net, 16) == 0;
	case ROOM_PREFIX:
		return !o->reserved && same_prefix(o->net, net);
	case ROOM_GENERAL:
		return !o->reserved;
	}
	return false;
}

/* Whom to close for room in a scope: the oldest silent connection; without one, the oldest in
 * its handshake (it sent a byte and stalled); else the oldest. Under mu. */
static struct conn *prehello_victim_locked(struct sc_peer_server *srv, enum room_scope scope,
					   const uint8_t net[16])
{
	struct conn *busy = NULL, *any = NULL;
	struct sc_list *pos;
	sc_list_foreach(pos, &srv->prehello) { /* oldest first */
		struct conn *o = sc_list_entry(pos, struct conn, wait_node);
		if (!in_room_scope(o, scope, net))
			continue;
		if (prehello_silent(o))
			return o;
		if (!busy && atomic_load(&o->state) == CONN_BUSY)
			busy = o;
		if (!any)
			any = o;
	}
	return busy ? busy : any;
}

/*
 * Room for a new connection from `net` (addr: for messages) to wait for its hello. A full room
 * never turns the newcomer away (a flood that reopens what is closed would keep every honest peer
 * out): the oldest silent connection in the narrowest scope that is full is closed instead, at
 * once, its room free. The scopes: the address (--data-max-unauth-per-ip, both rooms); for the
 * general room, its /24 or /64 (max_unauth_per_prefix) and the room itself (--data-max-unauth
 * less reserved_room); for an address whose hello succeeded lately, the reserved room, which the
 * others never take (full, such a newcomer takes the general room). *reserved: which room it
 * takes. False only when no room could be made. Accept thread, under mu.
 */
bool ps_prehello_make_room_locked(struct sc_peer_server *srv, const uint8_t net[16],
				  const char *addr, uint64_t now, bool *reserved)
{
	*reserved = srv->n_waiting_room[1] < srv->reserved_room &&
		    recent_auth_has_locked(srv, net, now);
	for (int round = 0; round < 4; round++) {
		size_t same_addr = 0, same_net = 0;
		struct sc_list *pos;
		sc_list_foreach(pos, &srv->prehello) {
			const struct conn *o = sc_list_entry(pos, struct conn, wait_node);
			same_addr += memcmp(o->net, net, 16) == 0;
			same_net += !o->reserved && same_prefix(o->net, net);
		}
		char reason[320], where[INET6_ADDRSTRLEN + 8];
		enum room_scope scope;
		const char *key;
		size_t general = srv->max_unauth - srv->reserved_room;
		if (same_addr >= srv->max_unauth_per_ip) {
			scope = ROOM_ADDR;
			key = "peer-prehello-drop-addr";
			snprintf(reason, sizeof(reason),
				 "%zu connections from its address are waiting for their hello "
				 "(--data-max-unauth-per-ip %u)",
				 same_addr, srv->max_unauth_per_ip);
		} else if (!*reserved && same_net >= srv->max_unauth_per_prefix) {
			scope = ROOM_PREFIX;
			key = "peer-prehello-drop-prefix";
			format_prefix(net, where, sizeof(where));
			snprintf(reason, sizeof(reason),
				 "%zu connections from %s are waiting for their hello (a share of "
				 "%u per /24 or /64: a quarter of --data-max-unauth %u less the room "
				 "kept for recent peers, at least --data-max-unauth-per-ip)",
				 same_net, where, srv->max_unauth_per_prefix, srv->max_unauth);
		} else if (!*reserved && srv->n_waiting_room[0] >= general) {
			scope = ROOM_GENERAL;
			key = "peer-prehello-drop-room";
			snprintf(reason, sizeof(reason),
				 "%zu connections are waiting for their hello (--data-max-unauth %u, "
				 "%u of it kept for addresses that authenticated recently)",
				 srv->n_waiting_room[0], srv->max_unauth, srv->reserved_room);
		} else { /* room in every scope (a reserved newcomer: its room has space) */
			return true;
		}
		struct conn *v = round < 3 ? prehello_victim_locked(srv, scope, net) : NULL;
		if (!v)
			break;
		bool silent = prehello_silent(v);
		ps_prehello_leave_locked(srv, v);
		v->displaced = true;
		int idle = CONN_IDLE; /* parked: its pool thread ends it at once */
		atomic_compare_exchange_strong(&v->state, &idle, CONN_EXPIRED);
		shutdown(v->fd, SHUT_RDWR); /* in its handshake: its next read fails */
		SC_WARN_LIMITED("peer", key,
				"dropped connection from %s (%s for %llu ms) to admit %s: %s",
				v->addr, silent ? "silent" : "without its hello",
				(unsigned long long)(now - v->accepted_mono_ms), addr, reason);
	}
	return false;
}
