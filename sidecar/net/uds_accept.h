/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/uds_accept.h: a unix socket the sidecar accepts on itself, for --allowed-uids: each
 * connection's peer uid comes from SO_PEERCRED before the connection is handed on (server.c gives
 * it to gRPC with grpc_server_add_channel_from_fd, whose calls then name the peer "fd:N"). No gRPC types.
 *
 * create (main thread: binds, sets the mode, listens; the caller prepared the path with
 * sc_unix_socket_prepare) -> start (an accept thread calls on_conn for every connection) ->
 * destroy (stops the thread, closes and unlinks the socket). sc_uds_peer_uid may be called from
 * any thread.
 */
#ifndef SC_UDS_ACCEPT_H
#define SC_UDS_ACCEPT_H

#include "base/status.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct sc_uds_acceptor;

/* Called on the accept thread with a connected socket it now owns. */
typedef void (*sc_uds_conn_fn)(void *ctx, int fd);

int sc_uds_acceptor_create(const char *path, unsigned mode, struct sc_uds_acceptor **out,
			   struct sc_err *err);
int sc_uds_acceptor_start(struct sc_uds_acceptor *a, sc_uds_conn_fn on_conn, void *ctx,
			  struct sc_err *err);
void sc_uds_acceptor_destroy(struct sc_uds_acceptor *a); /* NULL ok */

/* The uid SO_PEERCRED gave for the connection accepted as fd (any acceptor); false if unknown. */
bool sc_uds_peer_uid(int fd, uid_t *uid);

#endif
