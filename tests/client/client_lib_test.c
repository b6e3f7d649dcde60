/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client_lib_test.c: sc-client-test, librdma-sidecar-client against two real sidecars and a real
 * nats-server started by tests/integration/test_client_lib.py. Every RPC wrapper once, with the
 * bytes moved compared, the error codes and messages checked, callbacks that stop streams, and
 * NULL-safe teardown. Single-threaded except the publisher thread of the subscribe check.
 *
 *   sc-client-test unix:A.sock unix:B.sock FILE_FOR_B B_METRICS_PORT
 * (FILE_FOR_B: an existing 1 MiB file B can open read-write, registered as a host-file region;
 * A runs with RDMA_SIDECAR_TOPOLOGY_XML=tests/unit/topology/dgx8.xml, B on this host's sysfs;
 * B_METRICS_PORT: B's --metrics-listen port on 127.0.0.1, whose gRPC call counts order the
 * "waiter first" hand-off by construction)
 */
#include "client_check.h"

#include <rdma_sidecar/client.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	check_fill_xorshift(p, n, &x);
}

struct watch_log {
	int n, last_status, stop_after;
};

static int on_op(const rsc_operation *op, void *user)
{
	struct watch_log *w = user;
	w->n++;
	w->last_status = op->status;
	return w->stop_after && w->n >= w->stop_after;
}

/* Publishes the operation's metadata exactly once, as soon as the subscriber says its
 * subscription is in place (rsc_subscribe_ready's ready callback): proves the signal means it. */
struct publisher {
	const char *addr, *op_id;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int ready, published, readies;
};

static void *publish_once(void *arg)
{
	struct publisher *p = arg;
	rsc_client *c = NULL;
	rsc_status st;
	if (rsc_client_create(&(rsc_options){.target = p->addr}, &c, &st) != RSC_OK)
		return NULL;
	pthread_mutex_lock(&p->mu);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 20;
	while (!p->ready && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0)
		;
	int go = p->ready;
	pthread_mutex_unlock(&p->mu);
	if (go && rsc_publish(c, "lib.test", p->op_id, &st) == RSC_OK)
		p->published = 1;
	rsc_client_destroy(c);
	return NULL;
}

static void on_ready(void *user)
{
	struct publisher *p = user;
	pthread_mutex_lock(&p->mu);
	p->ready = 1;
	p->readies++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

struct sub_log {
	int n;
	char metadata[4096];
	uint64_t len0;
	struct publisher *pub; /* told when the subscription is in place */
};

/* rsc_subscribe_ready's ready callback: the same user pointer as the event callback's. */
static void sub_log_ready(void *user)
{
	struct sub_log *s = user;
	on_ready(s->pub);
}

static int on_event(const rsc_metadata_event *ev, void *user)
{
	struct sub_log *s = user;
	s->n++;
	snprintf(s->metadata, sizeof(s->metadata), "%s", ev->metadata);
	s->len0 = ev->n_lengths ? ev->descriptor_lengths[0] : 0;
	return 1; /* one is enough: stop */
}

/* The sidecar's grpc_server_started_total of one method, read from its /metrics on
 * 127.0.0.1:port (-1 when it cannot be read): a call counts there once the sidecar has it. */
static long calls_started(int port, const char *method)
{
	static char buf[1 << 20];
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct timeval tv = {5, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	size_t n = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
		close(fd);
		return -1;
	}
	for (ssize_t r; n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0;)
		n += (size_t)r;
	close(fd);
	buf[n] = '\0';
	char want[128];
	snprintf(want, sizeof(want), "grpc_method=\"%s\"", method);
	for (char *line = buf; line && *line;
	     line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		char *eol = strchr(line, '\n'), *close_brace;
		if (strncmp(line, "grpc_server_started_total{", 26) != 0)
			continue;
		if (eol)
			*eol = '\0';
		close_brace = strchr(line, '}');
		long v = strstr(line, want) && close_brace ? strtol(close_brace + 1, NULL, 10) : -1;
		if (eol)
			*eol = '\n';
		if (v >= 0)
			return v;
	}
	return 0; /* not called yet: no row */
}

/* A WaitMetadata on its own thread (the waiter of a "waiter first" hand-off). */
struct waiter {
	rsc_client *c;
	const char *subject;
	uint64_t timeout_ms;
	int rc;
	rsc_status st;
	rsc_metadata_event ev;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	w->rc = rsc_wait_metadata(w->c, w->subject, w->timeout_ms, &w->ev, &w->st);
	return NULL;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s unix:A.sock unix:B.sock FILE_FOR_B B_METRICS_PORT\n",
			argv[0]);
		return 2;
	}
	int b_metrics = atoi(argv[4]);
	rsc_status st;
	rsc_client *a = NULL, *b = NULL, *gone = NULL;
	rsc_region ra = {0}, rb = {0};
	rsc_operation op = {0}, act = {0};
	void *ma = NULL, *mb = NULL;
	unsigned char *pattern = malloc(MIB), *back = malloc(MIB);
	if (!pattern || !back)
		return 1;

	/* NULL-safe teardown. */
	rsc_client_destroy(NULL);
	rsc_operation_clear(NULL);
	rsc_region_clear(NULL);
	rsc_info_clear(NULL);
	rsc_region_list_clear(NULL);
	rsc_operation_list_clear(NULL);
	rsc_info_rails_clear(NULL);
	rsc_rail_usage_list_clear(NULL);
	rsc_peer_connection_clear(NULL);

	OK(rsc_client_create(&(rsc_options){.target = argv[1]}, &a, &st));
	OK(rsc_client_create(&(rsc_options){.target = argv[2]}, &b, &st));
	OK(rsc_client_connect(a, 5000, &st));

	/* Info and health. */
	rsc_info info;
	OK(rsc_get_info(a, &info, &st));
	CHECK(strcmp(info.sidecar_id, "a") == 0, "sidecar_id %s", info.sidecar_id);
	CHECK(info.n_backends >= 2 && info.signing_enabled, "backends %zu", info.n_backends);
	CHECK(strcmp(info.nats_state, "connected") == 0, "nats_state %s", info.nats_state);
	rsc_info_clear(&info);
	rsc_info_clear(&info); /* twice: safe */

	/* Rails and topology: A's come from the dgx8 fixture (its 8 NICs are no rails here:
	 * absent), B's from this host. */
	rsc_info_rails rails;
	OK(rsc_get_info_rails(a, &info, &rails, &st));
	CHECK(strcmp(info.sidecar_id, "a") == 0, "sidecar_id with rails %s", info.sidecar_id);
	size_t len = strlen(rails.topology_source);
	CHECK(len >= 8 && strcmp(rails.topology_source + len - 8, "dgx8.xml") == 0,
	      "topology_source %s", rails.topology_source);
	int absent = 0;
	for (size_t i = 0; i < rails.n_rails; i++) {
		const rsc_rail_info *r = &rails.rails[i];
		if (strcmp(r->state, "absent") != 0)
			continue;
		char want[16];
		snprintf(want, sizeof(want), "mlx5_%d", absent);
		CHECK(strcmp(r->name, want) == 0 && r->backend == RSC_BACKEND_IBVERBS &&
			  r->numa_node == (absent < 4 ? 0 : 1) && strlen(r->pci_address) == 12,
		      "absent rail %d: %s %s %s numa %d", absent, r->name,
		      rsc_backend_name(r->backend), r->pci_address, (int)r->numa_node);
		absent++;
	}
	CHECK(absent == 8, "absent rails %d of %zu", absent, rails.n_rails);
	const rsc_memory_rails *numa0 = NULL;
	for (size_t i = 0; i < rails.n_topology; i++)
		if (strcmp(rails.topology[i].memory, "numa 0") == 0)
			numa0 = &rails.topology[i];
	CHECK(numa0 != NULL, "no \"numa 0\" row among %zu", rails.n_topology);
	if (numa0) {
		CHECK(numa0->gpu_index == -1 && numa0->numa_node == 0 && numa0->pci_address[0] == 0,
		      "numa 0 row: gpu %d node %d", (int)numa0->gpu_index, (int)numa0->numa_node);
		CHECK(numa0->n_chosen == 4, "numa 0 chose %zu rails", numa0->n_chosen);
		for (size_t i = 0; i < numa0->n_chosen && i < 4; i++) {
			char want[16];
			snprintf(want, sizeof(want), "mlx5_%zu", i);
			CHECK(strcmp(numa0->chosen[i], want) == 0, "numa 0 chosen[%zu] %s", i,
			      numa0->chosen[i]);
		}
		CHECK(numa0->n_rails >= 8 && numa0->rails[0].distance[0], "numa 0 ranks %zu rails",
		      numa0->n_rails);
	}
	rsc_info_rails_clear(&rails);
	rsc_info_rails_clear(&rails); /* twice: safe */
	rsc_info_clear(&info);
	OK(rsc_get_info_rails(b, NULL, &rails, &st)); /* info may be NULL */
	CHECK(strcmp(rails.topology_source, "sysfs") == 0, "b's topology_source %s",
	      rails.topology_source);
	int numa_rows = 0;
	for (size_t i = 0; i < rails.n_topology; i++)
		numa_rows += strncmp(rails.topology[i].memory, "numa ", 5) == 0;
	CHECK(numa_rows >= 1, "b: no NUMA rows among %zu", rails.n_topology);
	rsc_info_rails_clear(&rails);
	CODE(rsc_get_info_rails(a, NULL, NULL, &st), RSC_INVALID_ARGUMENT, "rails is NULL");
	int serving = 0;
	OK(rsc_health_check(b, NULL, &serving, &st));
	CHECK(serving == 1, "health %d", serving);

	/* Regions: create, stream bytes in and out, map, register a host file, list. */
	OK(rsc_region_create(a, MIB, "lib-a", &ra, &st));
	CHECK(ra.size == MIB && ra.path[0] == '/', "region %s %llu", ra.path,
	      (unsigned long long)ra.size);
	fill(pattern, MIB, 1);
	OK(rsc_region_write(a, ra.region_id, 0, pattern, MIB, &st));
	size_t got = 0;
	memset(back, 0, MIB);
	OK(rsc_region_read(a, ra.region_id, 0, back, MIB, &got, &st));
	CHECK(got == MIB && memcmp(back, pattern, MIB) == 0,
	      "ReadRegion returned other bytes (%zu)", got);
	OK(rsc_region_map(&ra, &ma, &st));
	CHECK(ma && memcmp(ma, pattern, MIB) == 0,
	      "the mapped region differs from what WriteRegion wrote");
	CODE(rsc_region_write(a, "rgn-nope", 0, pattern, 16, &st), RSC_NOT_FOUND, "rgn-nope");
	CODE(rsc_region_write(a, ra.region_id, MIB - 8, pattern, 16, &st), RSC_INVALID_ARGUMENT,
	     "");
	OK(rsc_region_register_host_file(b, argv[3], 0, MIB, "lib-b", &rb, &st));
	CHECK(strcmp(rb.path, argv[3]) == 0, "registered path %s", rb.path);
	OK(rsc_region_map(&rb, &mb, &st));
	memset(mb, 0, MIB);
	rsc_region_list rl;
	OK(rsc_region_list_get(b, &rl, &st));
	CHECK(rl.count == 1 && strcmp(rl.items[0].region_id, rb.region_id) == 0, "list %zu",
	      rl.count);
	rsc_region_list_clear(&rl);

	/* READ: a readable of two ranges on a, pulled into b's host-file region, watched to the
	 * end. */
	rsc_descriptor src[2] = {{ra.region_id, 100, 300000}, {ra.region_id, 500000, 4096}};
	rsc_descriptor dst[2] = {{rb.region_id, 7, 300000}, {rb.region_id, 400000, 4096}};
	OK(rsc_create_readable(
	    a, &(rsc_passive_args){.descriptors = src, .n_descriptors = 2, .timeout_ms = 30000},
	    &op, &st));
	CHECK(op.status == RSC_STATUS_INITIALIZED && strncmp(op.metadata, "rsm1.", 5) == 0,
	      "readable %s", rsc_op_status_name(op.status));
	uint64_t *lens = NULL;
	size_t nlens = 0;
	int kind = 0;
	OK(rsc_metadata_lengths(op.metadata, &lens, &nlens, &kind, &st));
	CHECK(nlens == 2 && lens[0] == 300000 && lens[1] == 4096 && kind == RSC_KIND_READABLE,
	      "lengths %zu", nlens);
	free(lens);
	CODE(rsc_metadata_lengths("rsm1.!!!", &lens, &nlens, &kind, &st), RSC_INVALID_ARGUMENT,
	     "base64url");
	rsc_transfer_args ta = {
	    .metadata = op.metadata, .descriptors = dst, .n_descriptors = 2, .timeout_ms = 30000};
	OK(rsc_begin_read(b, &ta, &act, &st));
	struct watch_log wl = {0};
	OK(rsc_operation_watch(b, act.operation_id, on_op, &wl, 30000, &st));
	CHECK(wl.n >= 1 && wl.last_status == RSC_STATUS_COMPLETE, "watch saw %d, last %s", wl.n,
	      rsc_op_status_name(wl.last_status));
	CHECK(memcmp((char *)mb + 7, pattern + 100, 300000) == 0 &&
		  memcmp((char *)mb + 400000, pattern + 500000, 4096) == 0,
	      "bytes read differ");
	CHECK(((char *)mb)[6] == 0 && ((char *)mb)[300007] == 0,
	      "bytes outside the ranges changed");
	/* Watch stopped by its callback: CANCELLED. */
	wl = (struct watch_log){.stop_after = 1};
	CODE(rsc_operation_watch(b, act.operation_id, on_op, &wl, 30000, &st), RSC_CANCELLED,
	     "stopped");
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* WRITE with rsc_write (begin + wait): b's bytes into a writable on a. */
	fill((unsigned char *)mb, MIB, 2);
	rsc_descriptor wsrc = {rb.region_id, 0, 65536}, wdst = {ra.region_id, 65536 * 3, 65536};
	OK(rsc_create_writable(
	    a, &(rsc_passive_args){.descriptors = &wdst, .n_descriptors = 1, .timeout_ms = 30000},
	    &op, &st));
	ta = (rsc_transfer_args){
	    .metadata = op.metadata, .descriptors = &wsrc, .n_descriptors = 1, .timeout_ms = 30000};
	OK(rsc_write(b, &ta, 30000, &act, &st));
	CHECK(act.status == RSC_STATUS_COMPLETE && act.backend == RSC_BACKEND_TCP &&
		  act.bytes_done == 65536,
	      "write %s %s", rsc_op_status_name(act.status), act.error_message);
	CHECK(memcmp((char *)ma + 65536 * 3, mb, 65536) == 0, "bytes written differ");
	CHECK(memcmp(ma, pattern, 65536 * 3) == 0, "bytes before the writable changed");
	/* The rails it used (none may be named yet where TCP reports no rails): each names one and
	 * the bytes add up to no more than the transfer's. */
	rsc_rail_usage_list used;
	rsc_operation same;
	OK(rsc_operation_get_rails(b, act.operation_id, &same, &used, &st));
	CHECK(strcmp(same.operation_id, act.operation_id) == 0 &&
		  same.status == RSC_STATUS_COMPLETE,
	      "get_rails: %s %s", same.operation_id, rsc_op_status_name(same.status));
	uint64_t rail_bytes = 0;
	for (size_t i = 0; i < used.count; i++) {
		CHECK(used.items[i].rail[0], "rail usage %zu has no rail name", i);
		rail_bytes += used.items[i].bytes;
	}
	CHECK(rail_bytes <= 65536 && (used.count == 0 || rail_bytes == 65536),
	      "rails moved %llu bytes over %zu rails", (unsigned long long)rail_bytes, used.count);
	rsc_operation_clear(&same);
	rsc_rail_usage_list_clear(&used);
	OK(rsc_operation_get_rails(b, act.operation_id, NULL, &used, &st)); /* out may be NULL */
	rsc_rail_usage_list_clear(&used);
	CODE(rsc_operation_get_rails(b, "op-nope", NULL, &used, &st), RSC_NOT_FOUND, "op-nope");
	/* The metadata is used up: the next use errors (an operation failure, not a call failure).
	 */
	rsc_operation again;
	OK(rsc_write(b, &ta, 30000, &again, &st));
	CHECK(again.status == RSC_STATUS_ERRORED && again.error_code != 0 && again.error_message[0],
	      "reuse: %s", rsc_op_status_name(again.status));
	rsc_operation_clear(&again);
	rsc_operation_list ol;
	OK(rsc_operation_list_get(b, &ol, &st));
	CHECK(ol.count >= 2, "ops on b: %zu", ol.count);
	rsc_operation_list_clear(&ol);
	OK(rsc_operation_release(b, act.operation_id, &st));
	CODE(rsc_operation_get(b, act.operation_id, &again, &st), RSC_NOT_FOUND, act.operation_id);
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* Compact lists: a block list (block ids 9, 2, 5 of 1,000 bytes, 4,096 apart, from offset
	 * 11) on a, read with one strided run on b; then bad sets refused with the set's index. */
	fill((unsigned char *)ma, MIB, 3);
	memset(mb, 0, MIB);
	const char *rids[] = {ra.region_id};
	const uint64_t ids[] = {9, 2, 5};
	rsc_descriptor_set bl = {.kind = RSC_SET_BLOCK_LIST,
				 .block_list = {.region_ids = rids,
						.n_region_ids = 1,
						.block_length = 1000,
						.block_ids = ids,
						.n_block_ids = 3,
						.block_stride = 4096,
						.base_offset = 11}};
	OK(rsc_create_readable_sets(a, &(rsc_passive_args){.timeout_ms = 30000}, &bl, 1, &op, &st));
	CHECK(op.n_descriptors == 0 && op.bytes_total == 3000, "compact op: %zu descriptors, %llu",
	      op.n_descriptors, (unsigned long long)op.bytes_total);
	OK(rsc_metadata_lengths(op.metadata, &lens, &nlens, &kind, &st));
	CHECK(nlens == 3 && lens[0] == 1000 && lens[2] == 1000, "compact lengths %zu", nlens);
	free(lens);
	rsc_descriptor_set run = {.kind = RSC_SET_STRIDED_RUN,
				  .strided_run = {rb.region_id, 5, 1001, 3, 1000}};
	ta = (rsc_transfer_args){.metadata = op.metadata, .timeout_ms = 30000};
	OK(rsc_read_sets(b, &ta, &run, 1, 30000, &act, &st));
	CHECK(act.status == RSC_STATUS_COMPLETE && act.bytes_done == 3000, "compact read %s %s",
	      rsc_op_status_name(act.status), act.error_message);
	for (int k = 0; k < 3; k++)
		CHECK(memcmp((char *)mb + 5 + 1001 * k, (char *)ma + 11 + ids[k] * 4096, 1000) == 0,
		      "compact read: block %d differs", k);
	CHECK(((char *)mb)[4] == 0 && ((char *)mb)[1005] == 0, "bytes between the blocks changed");
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);
	rsc_descriptor_set bad[2] = {run, {.kind = 7}};
	CODE(rsc_create_readable_sets(a, &(rsc_passive_args){0}, bad, 2, &op, &st),
	     RSC_INVALID_ARGUMENT, "sets[1]: kind 7");
	bad[1] = (rsc_descriptor_set){.kind = RSC_SET_STRIDED_RUN,
				      .strided_run = {ra.region_id, 0, 8, 0, 8}};
	bad[0].strided_run.region_id = ra.region_id;
	CODE(rsc_create_readable_sets(a, &(rsc_passive_args){0}, bad, 2, &op, &st),
	     RSC_INVALID_ARGUMENT, "descriptor_sets[1]: strided_run.count is 0");

	/* Cancel, a deregister refused while an operation is live, and forced. */
	OK(rsc_create_readable(a, &(rsc_passive_args){.descriptors = src, .n_descriptors = 1}, &op,
			       &st));
	CODE(rsc_region_deregister(a, ra.region_id, 0, &st), RSC_FAILED_PRECONDITION, "");
	OK(rsc_operation_cancel(a, op.operation_id, &act, &st));
	CHECK(act.status == RSC_STATUS_CANCELLED && act.error_code == RSC_CANCELLED, "cancel: %s",
	      rsc_op_status_name(act.status));
	rsc_operation_clear(&act);
	OK(rsc_operation_get(a, op.operation_id, &act, &st));
	CHECK(act.status == RSC_STATUS_CANCELLED, "get after cancel: %s",
	      rsc_op_status_name(act.status));
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* Progress gates a scheduled read; ReportProgress releases it. */
	OK(rsc_create_readable(
	    a, &(rsc_passive_args){.descriptors = src, .n_descriptors = 1, .timeout_ms = 30000},
	    &op, &st));
	ta = (rsc_transfer_args){.metadata = op.metadata,
				 .descriptors = dst,
				 .n_descriptors = 1,
				 .timeout_ms = 30000,
				 .has_requirement = 1,
				 .req_request_id = "req-1",
				 .req_iteration = 3};
	OK(rsc_begin_read(b, &ta, &act, &st));
	CHECK(act.status == RSC_STATUS_SCHEDULED, "gated read is %s",
	      rsc_op_status_name(act.status));
	uint32_t released = 0;
	OK(rsc_report_progress(b, "req-1", 3, 0, 0, 1, &released, &st));
	CHECK(released == 1, "released %u", released);
	rsc_operation done;
	OK(rsc_operation_wait(b, act.operation_id, 30000, &done, &st));
	CHECK(done.status == RSC_STATUS_COMPLETE, "released read: %s %s",
	      rsc_op_status_name(done.status), done.error_message);
	rsc_operation_clear(&done);
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* ConnectPeer: b opens its connections to a from a readable's metadata, which stays
	 * usable; bad metadata changes nothing and says why. */
	OK(rsc_create_readable(
	    a, &(rsc_passive_args){.descriptors = src, .n_descriptors = 1, .timeout_ms = 60000},
	    &op, &st));
	rsc_peer_connection pc;
	OK(rsc_connect_peer(b, op.metadata, 10000, &pc, &st));
	CHECK(pc.peer && strcmp(pc.peer, "a") == 0, "connect_peer peer %s", pc.peer);
	CHECK(pc.n_paths >= 1, "connect_peer: %zu paths", pc.n_paths);
	int tcp_ready = 0;
	for (size_t i = 0; i < pc.n_paths; i++)
		if (pc.paths[i].backend == RSC_BACKEND_TCP && pc.paths[i].ready &&
		    strstr(pc.paths[i].detail, "connection(s) to a at "))
			tcp_ready = 1;
	CHECK(tcp_ready, "no ready TCP path (first: %s %d %s)",
	      pc.n_paths ? rsc_backend_name(pc.paths[0].backend) : "-",
	      pc.n_paths ? pc.paths[0].ready : 0, pc.n_paths ? pc.paths[0].detail : "");
	rsc_peer_connection_clear(&pc);
	rsc_peer_connection_clear(&pc); /* twice: safe */
	OK(rsc_operation_get(a, op.operation_id, &again, &st));
	CHECK(again.uses_left == 1, "connect_peer used the metadata up (%u left)", again.uses_left);
	rsc_operation_clear(&again);
	CODE(rsc_connect_peer(b, "rsm1.garbage", 5000, &pc, &st), RSC_INVALID_ARGUMENT, "metadata");
	CODE(rsc_connect_peer(b, "", 5000, &pc, &st), RSC_INVALID_ARGUMENT, "no metadata");
	CODE(rsc_connect_peer(b, NULL, 5000, &pc, &st), RSC_INVALID_ARGUMENT, "no metadata");
	CODE(rsc_connect_peer(NULL, op.metadata, 5000, &pc, &st), RSC_INVALID_ARGUMENT,
	     "no client");
	rsc_operation_clear(&op);

	/* Publish / subscribe over NATS: the callback stops the stream at the first event. */
	OK(rsc_create_readable(
	    a, &(rsc_passive_args){.descriptors = src, .n_descriptors = 1, .timeout_ms = 60000},
	    &op, &st));
	struct publisher pub = {.addr = argv[1],
				.op_id = op.operation_id,
				.mu = PTHREAD_MUTEX_INITIALIZER,
				.cv = PTHREAD_COND_INITIALIZER};
	pthread_t th;
	pthread_create(&th, NULL, publish_once, &pub);
	struct sub_log sl = {.pub = &pub};
	OK(rsc_subscribe_ready(b, "lib.>", NULL, sub_log_ready, on_event, &sl, 20000, &st));
	on_ready(&pub); /* let the publisher go if ready never came (the checks below then fail) */
	pthread_join(th, NULL);
	CHECK(pub.readies == 2 && pub.published, "ready ran %d time(s), published %d",
	      pub.readies - 1, pub.published);
	CHECK(sl.n == 1 && strcmp(sl.metadata, op.metadata) == 0 && sl.len0 == 300000,
	      "subscribe got %d", sl.n);
	/* A subscription the sidecar refuses never says ready. */
	pub.readies = 0;
	CODE(rsc_subscribe_ready(b, "bad subject", NULL, sub_log_ready, on_event, &sl, 3000, &st),
	     RSC_INVALID_ARGUMENT, "");
	CHECK(pub.readies == 0, "ready ran for a refused subscription");
	CODE(rsc_subscribe(b, "nobody.here", NULL, on_event, &sl, 300, &st), RSC_DEADLINE_EXCEEDED,
	     "");
	CODE(rsc_publish(a, "lib.x", "op-nope", &st), RSC_NOT_FOUND, "op-nope");
	OK(rsc_publish_metadata(a, "lib.x", op.metadata, &st));
	rsc_operation_clear(&op);

	/* WaitMetadata, the JetStream hand-off: publisher first, then waiter first (the wait is
	 * seen in b's call counts before the publish), then a deadline that passes. The metadata
	 * got is used by a traced read; each side's operation carries the trace id it was given. */
	fill((unsigned char *)ma, MIB, 7);
	memset(mb, 0, MIB);
	rsc_descriptor hs = {ra.region_id, 12345, 77777}, hd = {rb.region_id, 3, 77777};
	char tp_a[RSC_TRACEPARENT_SIZE], tp_b[RSC_TRACEPARENT_SIZE];
	rsc_traceparent_new(tp_a);
	rsc_traceparent_new(tp_b);
	CHECK(strlen(tp_a) == 55 && strncmp(tp_a, "00-", 3) == 0 && tp_a[35] == '-' &&
		  strcmp(tp_a + 52, "-01") == 0 && strspn(tp_a + 3, "0123456789abcdef") == 32 &&
		  strcmp(tp_a, tp_b) != 0,
	      "traceparents %s %s", tp_a, tp_b);
	OK(rsc_create_readable_traced(
	    a, &(rsc_passive_args){.descriptors = &hs, .n_descriptors = 1, .timeout_ms = 60000},
	    NULL, 0, tp_a, &op, &st));
	CHECK(op.trace_id && strncmp(op.trace_id, tp_a + 3, 32) == 0 && strlen(op.trace_id) == 32,
	      "readable's trace id %s, sent %s", op.trace_id, tp_a);
	OK(rsc_publish(a, "lib.wm.first", op.operation_id, &st));
	rsc_metadata_event ev = {0};
	OK(rsc_wait_metadata(b, "lib.wm.first", 10000, &ev, &st));
	CHECK(ev.metadata && strcmp(ev.metadata, op.metadata) == 0 &&
		  strcmp(ev.subject, "lib.wm.first") == 0 && strcmp(ev.issuer, "a") == 0 &&
		  ev.kind == RSC_KIND_READABLE && ev.n_lengths == 1 &&
		  ev.descriptor_lengths[0] == 77777 && ev.expires_unix_ms > 0,
	      "wait_metadata (publisher first) got %s from %s, %zu lengths", ev.subject, ev.issuer,
	      ev.n_lengths);
	ta = (rsc_transfer_args){
	    .metadata = ev.metadata, .descriptors = &hd, .n_descriptors = 1, .timeout_ms = 30000};
	/* A malformed traceparent is refused before anything moves (the metadata stays usable). */
	CODE(rsc_begin_read_traced(b, &ta, NULL, 0, "00-not-a-trace", &act, &st),
	     RSC_INVALID_ARGUMENT, "traceparent is not a W3C traceparent");
	OK(rsc_read_traced(b, &ta, NULL, 0, 30000, tp_b, &act, &st));
	CHECK(act.status == RSC_STATUS_COMPLETE && act.bytes_done == 77777, "traced read: %s %s",
	      rsc_op_status_name(act.status), act.error_message);
	CHECK(act.trace_id && strncmp(act.trace_id, tp_b + 3, 32) == 0,
	      "read's trace id %s, sent %s", act.trace_id, tp_b);
	CHECK(memcmp((char *)mb + 3, (char *)ma + 12345, 77777) == 0, "handed-off bytes differ");
	CHECK(((char *)mb)[2] == 0 && ((char *)mb)[3 + 77777] == 0,
	      "bytes outside the handed-off range changed");
	rsc_metadata_event_clear(&ev);
	rsc_metadata_event_clear(&ev); /* twice: safe */
	rsc_metadata_event_clear(NULL);
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* Waiter first: the write side waits for a writable that does not exist yet. */
	long before = calls_started(b_metrics, "WaitMetadata");
	CHECK(before >= 1, "b's /metrics on port %d: WaitMetadata calls %ld", b_metrics, before);
	struct waiter wt = {.c = b, .subject = "lib.wm.later", .timeout_ms = 20000};
	pthread_t wth;
	pthread_create(&wth, NULL, wait_thread, &wt);
	double until = mono_s() + 20;
	while (calls_started(b_metrics, "WaitMetadata") <= before && mono_s() < until)
		usleep(20000);
	CHECK(calls_started(b_metrics, "WaitMetadata") > before, "the wait never reached b");
	fill((unsigned char *)mb, MIB, 8);
	rsc_descriptor ws = {rb.region_id, 999, 5001}, wd = {ra.region_id, 70001, 5001};
	OK(rsc_create_writable(
	    a, &(rsc_passive_args){.descriptors = &wd, .n_descriptors = 1, .timeout_ms = 60000},
	    &op, &st));
	OK(rsc_publish_metadata(a, "lib.wm.later", op.metadata, &st));
	pthread_join(wth, NULL);
	CHECK(wt.rc == RSC_OK && wt.ev.metadata && strcmp(wt.ev.metadata, op.metadata) == 0 &&
		  wt.ev.kind == RSC_KIND_WRITABLE && wt.ev.n_lengths == 1 &&
		  wt.ev.descriptor_lengths[0] == 5001,
	      "wait_metadata (waiter first): %s %s", rsc_code_name(wt.rc), wt.st.message);
	if (wt.rc == RSC_OK) {
		ta = (rsc_transfer_args){.metadata = wt.ev.metadata,
					 .descriptors = &ws,
					 .n_descriptors = 1,
					 .timeout_ms = 30000};
		OK(rsc_write(b, &ta, 30000, &act, &st));
		CHECK(act.status == RSC_STATUS_COMPLETE &&
			  memcmp((char *)ma + 70001, (char *)mb + 999, 5001) == 0,
		      "write after waiter-first hand-off: %s", rsc_op_status_name(act.status));
		CHECK(act.trace_id && strlen(act.trace_id) == 32, "untraced write got trace id %s",
		      act.trace_id);
	}
	rsc_metadata_event_clear(&wt.ev);
	rsc_operation_clear(&act);
	rsc_operation_clear(&op);

	/* A deadline that passes: DEADLINE_EXCEEDED from the sidecar, naming the subject and what
	 * was stored, after the wait and not long after. */
	double t0 = mono_s();
	CODE(rsc_wait_metadata(b, "lib.wm.nobody", 400, &ev, &st), RSC_DEADLINE_EXCEEDED,
	     "WaitMetadata on lib.wm.nobody: no metadata within 400 ms: nothing is stored");
	double took = mono_s() - t0;
	CHECK(took >= 0.39 && took < 15, "the 400 ms wait took %.3f s", took);
	CHECK(ev.metadata == NULL, "a failed wait filled the event");
	CODE(rsc_wait_metadata(b, "", 400, &ev, &st), RSC_INVALID_ARGUMENT, "subject");
	CODE(rsc_wait_metadata(b, "lib.x", 400, NULL, &st), RSC_INVALID_ARGUMENT, "output");
	CODE(rsc_wait_metadata(NULL, "lib.x", 400, &ev, &st), RSC_INVALID_ARGUMENT, "no client");
	CODE(rsc_wait_metadata(b, "bad subject", 400, &ev, &st), RSC_INVALID_ARGUMENT, "");

	/* Errors the client sees itself, and an unreachable sidecar. */
	CODE(rsc_get_info(NULL, &info, &st), RSC_INVALID_ARGUMENT, "no client");
	CODE(rsc_subscribe(NULL, "x", NULL, on_event, &sl, 100, &st), RSC_INVALID_ARGUMENT,
	     "no client");
	CODE(rsc_begin_read(b, &(rsc_transfer_args){0}, &act, &st), RSC_INVALID_ARGUMENT,
	     "metadata");
	CODE(rsc_operation_get(a, "op-nope", &act, &st), RSC_NOT_FOUND, "op-nope");
	OK(rsc_client_create(
	    &(rsc_options){.target = "unix:/nonexistent/sc.sock", .call_timeout_ms = 3000}, &gone,
	    &st));
	CODE(rsc_client_connect(gone, 2000, &st), RSC_UNAVAILABLE,
	     "cannot reach the sidecar at unix:/nonexistent");
	CODE(rsc_health_check(gone, NULL, &serving, &st), RSC_UNAVAILABLE,
	     "unix:/nonexistent/sc.sock");
	CODE(rsc_client_create(&(rsc_options){.tls_ca_file = "/nonexistent.pem"}, &gone, &st),
	     RSC_INVALID_ARGUMENT, "/nonexistent.pem");

	/* Teardown; force deregisters whatever is left. */
	rsc_region_unmap(ma, ra.size);
	rsc_region_unmap(mb, rb.size);
	OK(rsc_region_deregister(a, ra.region_id, 1, &st));
	OK(rsc_region_deregister(b, rb.region_id, 1, &st));
	CODE(rsc_region_deregister(b, rb.region_id, 0, &st), RSC_NOT_FOUND, "");
	rsc_region_clear(&ra);
	rsc_region_clear(&rb);
	rsc_client_destroy(gone);
	rsc_client_destroy(a);
	rsc_client_destroy(b);
	free(pattern);
	free(back);
	if (failures)
		fprintf(stderr, "%d check(s) failed\n", failures);
	else
		printf("all checks passed\n");
	return failures ? 1 : 0;
}
