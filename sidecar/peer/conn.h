/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer/conn.h: a dialed peer connection, private to peer/pool.c (which dials, pools and closes it)
 * and peer/request.c (which runs requests on it). Everyone else holds it opaque.
 *
 * A connection is used by one thread at a time (the one that got it from the pool); only broken
 * may be set from another (sc_peer_conn_abort).
 */
#ifndef SC_PEER_CONN_H
#define SC_PEER_CONN_H

#include "base/list.h"
#include "peer/proto.h"
#include "base/types.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct sc_peer_conn {
	int fd;
	char endpoint[80];
	char peer_id[SC_NAME_MAX]; /* as its hello claimed it */
	char cert_id[SC_NAME_MAX]; /* as its verified certificate names it; "" when none */
	char what[SC_NAME_MAX + 120]; /* "peer sidecar \"id\" at H:P", for messages */
	atomic_bool broken;
	bool peer_closed; /* a call ended because the peer closed or reset the connection */
	bool reused; /* handed out from the idle list (not freshly dialled) */
	unsigned outstanding; /* requests sent whose reply has not been received */
	bool hold_next; /* sc_peer_conn_hold_next: the next request is sent with MSG_MORE */
	bool held;      /* the last request went out with MSG_MORE: part of it may wait in the kernel */
	uint32_t stall_ms; /* sc_peer_conn_set_stall: 0 none; cleared when put back */
	uint64_t idle_since_ms;
	struct sc_list idle_node; /* the pool's idle list (self-linked when handed out) */
	struct sc_list bucket_node; /* its endpoint's idle list in the pool */
	void *bucket;		    /* that endpoint's bucket (peer/pool.c) while idle */
	uint8_t buf[SC_PEER_HDR_LEN + SC_PEER_MAX_BODY];
};

#endif
