/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h: what server.c (the servers, arrival, admission) and call.c (one call's batches)
 * share: the completion-queue tag, the send queue's entries, the servers, the call and the
 * service. gRPC C-core types live here and in those two files only; handlers see call.h.
 */
#ifndef SC_SERVICE_INTERNAL_H
#define SC_SERVICE_INTERNAL_H

#include "call.h"
#include "handlers.h"
#include "net/api_listen.h"
#include "net/uds_accept.h"
#include "service.h"

#include <grpc/grpc.h>

#include <pthread.h>
#include <stdatomic.h>

struct tag {
	void (*cb)(struct tag *t, bool ok);
};

struct out_msg {
	grpc_byte_buffer *bb; /* NULL: the status, unless md_only */
	bool md_only;         /* only the initial metadata (headers) */
	struct out_msg *next;
};

/* One grpc_server: the API server or the health-only probe server. */
struct srv {
	struct sc_service *svc;
	grpc_server *server;
	void **method_handles;
	bool probe; /* --health-listen: grpc.health.v1 only */
	struct tag t_shutdown;
	atomic_bool shutdown_done;
};

struct sc_call {
	struct sc_service *svc;
	struct srv *srv;
	const struct sc_method_def *method; /* NULL for the generic (unknown method) call */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array req_md;
	grpc_byte_buffer *payload;
	grpc_call_details details; /* generic calls only */
	atomic_int refs;
	pthread_mutex_t mu;
	struct tag t_start, t_close, t_send, t_recv;
	int cancelled_flag;
	atomic_bool cancelled;
	bool initial_md_sent;
	bool send_in_flight;
	bool answered; /* status queued or sent */
	struct out_msg *q_head, *q_tail;
	enum sc_status final_code;
	grpc_slice final_details;
	bool have_details;
	grpc_byte_buffer *sending;
	grpc_byte_buffer *recv_bb;
	const ProtobufCMessageDescriptor *recv_desc;
	sc_call_recv_fn recv_fn;
	void *state;
	void (*state_free)(void *);
	void (*cancel_fn)(struct sc_call *c);
	void (*drained_fn)(struct sc_call *c);
	bool cancel_fired;
	uint64_t trace_xfer; /* the hand-off trace (base/trace.h): the transfer this call answers */
	uint64_t arrived_ns; /* sc_engine_clock_ns at arrival; 0: never arrived (armed only) */
	size_t method_index; /* sc_methods index, sc_n_methods for an unknown method (metrics) */
};

struct sc_service {
	struct sc_engine *eng;
	const struct sc_config *cfg;
	struct srv api, probe;
	bool have_probe;
	struct sc_token_store *tokens; /* --grpc-token-file; NULL = none */
	struct sc_grpc_certs *certs;   /* --grpc-tls-*; NULL = none */
	grpc_completion_queue *cq;
	pthread_t *threads;
	size_t n_threads;
	bool started;
	bool shutting_down;
	struct sc_health *health;
	char *listeners[SC_MAX_GRPC_LISTENERS];
	const char *listener_view[SC_MAX_GRPC_LISTENERS];
	size_t n_listeners;
	char *probe_addr; /* --health-listen as bound */
	/* --allowed-uids: the unix sockets the sidecar accepts on itself (SO_PEERCRED). */
	struct sc_uds_acceptor *uds[SC_MAX_GRPC_LISTENERS];
	size_t n_uds;
	atomic_int live_calls;
	/* Set once shutdown is over: a call freed later (the engine, and its metrics, may be gone)
	 * is not counted. */
	atomic_bool calls_uncounted;
	/* Batches start under the read side; closing the queue takes the write side, so no batch
	 * can start on a queue that is shut down (gRPC asserts on that). */
	pthread_rwlock_t batch_lock;
	bool cq_closed;
};

/* call.c: a new call for server s and method m (NULL: the generic request), holding one reference
 * (the arrival's); counted in the service's live calls until its last reference goes. */
struct sc_call *sc_call_new(struct srv *s, const struct sc_method_def *m);
/* call.c: the call arrived (its request is in): counted under method_index (its sc_methods index,
 * sc_n_methods for an unknown method), and timed until its last reference goes (grpc_server_*
 * metrics). */
void sc_call_arrived(struct sc_call *c, size_t method_index);
/* call.c: start the RECV_CLOSE_ON_SERVER batch that learns of the client's cancellation (and runs
 * on_cancel). */
void sc_call_watch_close(struct sc_call *c);
/* call.c: a message of type desc from a received byte buffer; NULL when it does not decode. */
ProtobufCMessage *sc_call_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb);

#endif
