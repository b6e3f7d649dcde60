/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handlers.h: the method table and the handler entry points, one file per area (info.c,
 * health.c, regions.c, operations.c, metadata_bus.c), plus conversions between engine snapshots
 * and protobuf-c messages (convert.c). Handlers run on completion-queue worker threads.
 * Each handler gets the unpacked request (freed by the server after the handler returns; NULL for
 * client-streaming methods) and answers through call.h.
 */
#ifndef SC_HANDLERS_H
#define SC_HANDLERS_H

#include "call.h"
#include "engine/engine.h"

#include "grpc/health/v1/health.pb-c.h"
#include "rdma_sidecar/v1/sidecar.pb-c.h"

/* Client and bidirectional streams get no request at the start: the handler reads with
 * sc_call_recv (and, for a bidirectional stream, answers as it goes). */
enum sc_method_kind {
	SC_METHOD_UNARY,
	SC_METHOD_SERVER_STREAM,
	SC_METHOD_CLIENT_STREAM,
	SC_METHOD_BIDI_STREAM,
};

typedef void (*sc_handler_fn)(struct sc_call *c, ProtobufCMessage *req);

struct sc_method_def {
	const char *path;
	enum sc_method_kind kind;
	const ProtobufCMessageDescriptor *request;
	sc_handler_fn fn;
};

extern const struct sc_method_def sc_methods[];
extern const size_t sc_n_methods;

/* info.c */
void sc_h_get_info(struct sc_call *c, ProtobufCMessage *req);
/* peers.c */
void sc_h_connect_peer(struct sc_call *c, ProtobufCMessage *req);
/* health.c: state lives in the service; watchers are told of every change. */
struct sc_health;
struct sc_health *sc_health_create(void);
void sc_health_destroy(struct sc_health *h);
void sc_health_set(struct sc_health *h, bool serving);
struct sc_health *sc_service_health(struct sc_service *svc); /* call.c */
void sc_h_health_check(struct sc_call *c, ProtobufCMessage *req);
void sc_h_health_watch(struct sc_call *c, ProtobufCMessage *req);
/* regions.c */
void sc_h_create_region(struct sc_call *c, ProtobufCMessage *req);
void sc_h_register_region(struct sc_call *c, ProtobufCMessage *req);
void sc_h_deregister_region(struct sc_call *c, ProtobufCMessage *req);
void sc_h_list_regions(struct sc_call *c, ProtobufCMessage *req);
void sc_h_write_region(struct sc_call *c, ProtobufCMessage *req);
void sc_h_read_region(struct sc_call *c, ProtobufCMessage *req);
/* operations.c */
void sc_h_create_readable(struct sc_call *c, ProtobufCMessage *req);
void sc_h_create_writable(struct sc_call *c, ProtobufCMessage *req);
void sc_h_begin_read(struct sc_call *c, ProtobufCMessage *req);
void sc_h_begin_write(struct sc_call *c, ProtobufCMessage *req);
void sc_h_get_operation(struct sc_call *c, ProtobufCMessage *req);
void sc_h_wait_operation(struct sc_call *c, ProtobufCMessage *req);
void sc_h_watch_operation(struct sc_call *c, ProtobufCMessage *req);
void sc_h_cancel_operation(struct sc_call *c, ProtobufCMessage *req);
void sc_h_release_operation(struct sc_call *c, ProtobufCMessage *req);
void sc_h_list_operations(struct sc_call *c, ProtobufCMessage *req);
void sc_h_report_progress(struct sc_call *c, ProtobufCMessage *req);
/* reflection.c: grpc.reflection.v1 and v1alpha ServerReflectionInfo */
void sc_h_server_reflection(struct sc_call *c, ProtobufCMessage *req);
/* metadata_bus.c */
void sc_h_publish_metadata(struct sc_call *c, ProtobufCMessage *req);
void sc_h_subscribe_metadata(struct sc_call *c, ProtobufCMessage *req);
void sc_h_wait_metadata(struct sc_call *c, ProtobufCMessage *req);

/* convert.c: fill protobuf messages from engine snapshots. The message points into `info` for
 * strings, so keep info alive until the message is packed (sc_call_send packs at once); then
 * sc_pb_op_clear frees the arrays. */
struct sc_pb_op {
	RdmaSidecar__V1__Operation msg;
	RdmaSidecar__V1__OperationError error;
	RdmaSidecar__V1__Descriptor *descs;
	RdmaSidecar__V1__Descriptor **desc_ptrs;
	RdmaSidecar__V1__RailUsage rails[SC_MAX_RAILS];
	RdmaSidecar__V1__RailUsage *rail_ptrs[SC_MAX_RAILS];
};
void sc_pb_op_fill(struct sc_pb_op *p, const struct sc_op_info *info);
void sc_pb_op_clear(struct sc_pb_op *p);
void sc_pb_region_fill(RdmaSidecar__V1__Region *m, const struct sc_region_info *info);
/* Copy descriptors out of a request; *out malloc'd (free it). INVALID_ARGUMENT on bad ids. */
int sc_pb_descs(RdmaSidecar__V1__Descriptor **in, size_t n, struct sc_desc **out,
		struct sc_err *err);
/* desc_lists.c: `plain` then every compact set, expanded in order; *out malloc'd (free it).
 * RESOURCE_EXHAUSTED above `max` descriptors (checked before expanding), INVALID_ARGUMENT on a
 * malformed set. */
int sc_pb_desc_list(RdmaSidecar__V1__Descriptor **plain, size_t n_plain,
		    RdmaSidecar__V1__DescriptorSet **sets, size_t n_sets, uint32_t max,
		    struct sc_desc **out, size_t *n_out, struct sc_err *err);

#endif
