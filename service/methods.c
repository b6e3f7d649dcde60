/* SPDX-License-Identifier: Apache-2.0 */
/*
 * methods.c: the method table: every RPC of rdma_sidecar.v1.Sidecar, grpc.health.v1.Health and
 * grpc.reflection.v1{,alpha}.ServerReflection, its kind and request type, and its handler.
 * server.c registers and arms one request per entry. Constant data; no code.
 */
#include "handlers.h"

#define SIDECAR(name) "/rdma_sidecar.v1.Sidecar/" name
#define REQ(type) &rdma_sidecar__v1__##type##__descriptor

const struct sc_method_def sc_methods[] = {
	{SIDECAR("GetInfo"), SC_METHOD_UNARY, REQ(get_info_request), sc_h_get_info},
	{SIDECAR("CreateRegion"), SC_METHOD_UNARY, REQ(create_region_request), sc_h_create_region},
	{SIDECAR("RegisterRegion"), SC_METHOD_UNARY, REQ(register_region_request),
	 sc_h_register_region},
	{SIDECAR("DeregisterRegion"), SC_METHOD_UNARY, REQ(deregister_region_request),
	 sc_h_deregister_region},
	{SIDECAR("ListRegions"), SC_METHOD_UNARY, REQ(list_regions_request), sc_h_list_regions},
	{SIDECAR("WriteRegion"), SC_METHOD_CLIENT_STREAM, REQ(write_region_request),
	 sc_h_write_region},
	{SIDECAR("ReadRegion"), SC_METHOD_SERVER_STREAM, REQ(read_region_request),
	 sc_h_read_region},
	{SIDECAR("CreateReadable"), SC_METHOD_UNARY, REQ(create_passive_request),
	 sc_h_create_readable},
	{SIDECAR("CreateWritable"), SC_METHOD_UNARY, REQ(create_passive_request),
	 sc_h_create_writable},
	{SIDECAR("BeginRead"), SC_METHOD_UNARY, REQ(begin_transfer_request), sc_h_begin_read},
	{SIDECAR("BeginWrite"), SC_METHOD_UNARY, REQ(begin_transfer_request), sc_h_begin_write},
	{SIDECAR("ConnectPeer"), SC_METHOD_UNARY, REQ(connect_peer_request), sc_h_connect_peer},
	{SIDECAR("GetOperation"), SC_METHOD_UNARY, REQ(get_operation_request),
	 sc_h_get_operation},
	{SIDECAR("WaitOperation"), SC_METHOD_UNARY, REQ(wait_operation_request),
	 sc_h_wait_operation},
	{SIDECAR("WatchOperation"), SC_METHOD_SERVER_STREAM, REQ(watch_operation_request),
	 sc_h_watch_operation},
	{SIDECAR("CancelOperation"), SC_METHOD_UNARY, REQ(cancel_operation_request),
	 sc_h_cancel_operation},
	{SIDECAR("ReleaseOperation"), SC_METHOD_UNARY, REQ(release_operation_request),
	 sc_h_release_operation},
	{SIDECAR("ListOperations"), SC_METHOD_UNARY, REQ(list_operations_request),
	 sc_h_list_operations},
	{SIDECAR("PublishMetadata"), SC_METHOD_UNARY, REQ(publish_metadata_request),
	 sc_h_publish_metadata},
	{SIDECAR("SubscribeMetadata"), SC_METHOD_SERVER_STREAM, REQ(subscribe_metadata_request),
	 sc_h_subscribe_metadata},
	{SIDECAR("WaitMetadata"), SC_METHOD_UNARY, REQ(wait_metadata_request), sc_h_wait_metadata},
	{SIDECAR("ReportProgress"), SC_METHOD_UNARY, REQ(report_progress_request),
	 sc_h_report_progress},
	{"/grpc.health.v1.Health/Check", SC_METHOD_UNARY,
	 &grpc__health__v1__health_check_request__descriptor, sc_h_health_check},
	{"/grpc.health.v1.Health/Watch", SC_METHOD_SERVER_STREAM,
	 &grpc__health__v1__health_check_request__descriptor, sc_h_health_watch},
	{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", SC_METHOD_BIDI_STREAM, NULL,
	 sc_h_server_reflection},
	{"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", SC_METHOD_BIDI_STREAM,
	 NULL, sc_h_server_reflection},
};

const size_t sc_n_methods = sizeof(sc_methods) / sizeof(sc_methods[0]);
