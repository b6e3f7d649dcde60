/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.c: ConnectPeer: connections to a peer sidecar set up ahead of the first transfer
 * (sc_engine_connect_peer). A gRPC worker thread, which it blocks up to the request's timeout.
 */
#include "handlers.h"
#include "service.h"

void sc_h_connect_peer(struct sc_call *c, ProtobufCMessage *req)
{
	const RdmaSidecar__V1__ConnectPeerRequest *r = (const void *)req;
	struct sc_peer_paths res;
	struct sc_err err = {0};
	if (sc_engine_connect_peer(sc_call_engine(c), r->metadata, r->timeout_ms, &res, &err) != 0) {
		sc_call_fail_err(c, &err);
		return;
	}
	RdmaSidecar__V1__ConnectPeerResponse m = RDMA_SIDECAR__V1__CONNECT_PEER_RESPONSE__INIT;
	RdmaSidecar__V1__PeerPath p[SC_PEER_PATHS_MAX];
	RdmaSidecar__V1__PeerPath *pp[SC_PEER_PATHS_MAX];
	for (size_t i = 0; i < res.n; i++) {
		rdma_sidecar__v1__peer_path__init(&p[i]);
		p[i].backend = (RdmaSidecar__V1__Backend)res.paths[i].backend;
		p[i].ready = res.paths[i].ready;
		p[i].detail = res.paths[i].detail;
		p[i].elapsed_us = res.paths[i].elapsed_us;
		pp[i] = &p[i];
	}
	m.peer = res.peer;
	m.n_paths = res.n;
	m.paths = pp;
	sc_call_reply(c, &m.base);
}
