/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.c: the client's gRPC C-core layer. Owns the channel (insecure or TLS credentials) and runs
 * unary, server-streaming and client-streaming calls. Each call gets its own pluck completion
 * queue and runs entirely on the calling thread, so any number of threads may share one client.
 * The only file of the library that includes gRPC headers. Also the status helpers every file
 * uses (rsc_fail, rsc_ok, rsc_code_name).
 */
#include "internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RSC_DEFAULT_TARGET "unix:/tmp/rdma-sidecar/sidecar.sock"

struct rsc_client {
	grpc_channel *channel;
	char *target;
	uint32_t call_timeout_ms;
};

/* The gRPC status code names (also the fallback message of a failed call). */
const char *rsc_code_name(int code)
{
	static const char *const names[] = {"OK",
					    "CANCELLED",
					    "UNKNOWN",
					    "INVALID_ARGUMENT",
					    "DEADLINE_EXCEEDED",
					    "NOT_FOUND",
					    "ALREADY_EXISTS",
					    "PERMISSION_DENIED",
					    "RESOURCE_EXHAUSTED",
					    "FAILED_PRECONDITION",
					    "ABORTED",
					    "OUT_OF_RANGE",
					    "UNIMPLEMENTED",
					    "INTERNAL",
					    "UNAVAILABLE",
					    "DATA_LOSS",
					    "UNAUTHENTICATED"};
	return code >= 0 && code <= 16 ? names[code] : "UNKNOWN";
}

int rsc_fail(rsc_status *st, int code, const char *fmt, ...)
{
	if (st) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(st->message, sizeof(st->message), fmt, ap);
		va_end(ap);
		st->code = code;
	}
	return code;
}

int rsc_ok(rsc_status *st)
{
	if (st) {
		st->code = RSC_OK;
		st->message[0] = '\0';
	}
	return RSC_OK;
}

static char *read_pem(const char *path, rsc_status *st)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	if (!f) {
		rsc_fail(st, RSC_INVALID_ARGUMENT, "cannot open TLS file %s: %s", path,
			 strerror(errno));
		return NULL;
	}
	if (fseek(f, 0, SEEK_END) != 0)
		goto fail;
	long n = ftell(f);
	if (n < 0 || n > (16 << 20) || fseek(f, 0, SEEK_SET) != 0)
		goto fail;
	buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
		goto fail;
	buf[n] = '\0';
	fclose(f);
	return buf;
fail:
	rsc_fail(st, RSC_INVALID_ARGUMENT, "cannot read TLS file %s", path);
	free(buf);
	fclose(f);
	return NULL;
}

static grpc_channel_credentials *make_creds(const rsc_options *o, rsc_status *st)
{
	if (!o->tls_ca_file && !o->tls_cert_file && !o->tls_key_file)
		return grpc_insecure_credentials_create();
	if (!o->tls_ca_file || (!o->tls_cert_file) != (!o->tls_key_file)) {
		rsc_fail(
		    st, RSC_INVALID_ARGUMENT,
		    "TLS needs a CA file, and a client certificate and key together (or neither)");
		return NULL;
	}
	grpc_channel_credentials *creds = NULL;
	char *ca = read_pem(o->tls_ca_file, st), *cert = NULL, *key = NULL;
	if (!ca)
		goto out;
	if (o->tls_cert_file) {
		cert = read_pem(o->tls_cert_file, st);
		key = cert ? read_pem(o->tls_key_file, st) : NULL;
		if (!key)
			goto out;
		grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
		creds = grpc_ssl_credentials_create(ca, &pair, NULL, NULL);
	} else {
		creds = grpc_ssl_credentials_create(ca, NULL, NULL, NULL);
	}
	if (!creds)
		rsc_fail(st, RSC_INVALID_ARGUMENT,
			 "gRPC refused the TLS files (check they are PEM)");
out:
	free(ca);
	free(cert);
	free(key);
	return creds;
}

int rsc_client_create(const rsc_options *opts, rsc_client **out, rsc_status *st)
{
	rsc_options def = {0};
	const rsc_options *o = opts ? opts : &def;
	const char *target = o->target && o->target[0] ? o->target : RSC_DEFAULT_TARGET;
	rsc_client *c = calloc(1, sizeof(*c));
	if (!c || !(c->target = strdup(target))) {
		free(c);
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory creating the client");
	}
	c->call_timeout_ms = o->call_timeout_ms ? o->call_timeout_ms : 30000;
	grpc_init();
	grpc_channel_credentials *creds = make_creds(o, st);
	if (!creds) {
		grpc_shutdown();
		free(c->target);
		free(c);
		return st ? st->code : RSC_INVALID_ARGUMENT;
	}
	grpc_arg args[5];
	size_t nargs = 0;
	args[nargs].type = GRPC_ARG_INTEGER;
	args[nargs].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[nargs].value.integer = -1;
	nargs++;
	/* Reconnect soon after a failed attempt (gRPC's default backs off from 1 s to 120 s): the
	 * sidecar is local, an attempt is cheap, and rsc_client_wait_ready should see a sidecar
	 * that came up within a fraction of a second, not after the next long back-off. */
	static const struct {
		const char *key;
		int value;
	} backoff[] = {{GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100},
		       {GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100},
		       {GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000}};
	for (size_t i = 0; i < sizeof(backoff) / sizeof(backoff[0]); i++) {
		args[nargs].type = GRPC_ARG_INTEGER;
		args[nargs].key = (char *)backoff[i].key;
		args[nargs].value.integer = backoff[i].value;
		nargs++;
	}
	if (o->tls_server_name) {
		args[nargs].type = GRPC_ARG_STRING;
		args[nargs].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
		args[nargs].value.string = (char *)o->tls_server_name;
		nargs++;
	}
	grpc_channel_args cargs = {.num_args = nargs, .args = args};
	c->channel = grpc_channel_create(c->target, creds, &cargs);
	grpc_channel_credentials_release(creds);
	*out = c;
	return rsc_ok(st);
}

const char *rsc_client_target(const rsc_client *c)
{
	return c ? c->target : "";
}

uint32_t rsc_client_call_timeout(const rsc_client *c)
{
	return c->call_timeout_ms;
}

void rsc_client_destroy(rsc_client *c)
{
	if (!c)
		return;
	grpc_channel_destroy(c->channel);
	free(c->target);
	free(c);
	grpc_shutdown();
}

static gpr_timespec deadline_in(uint64_t ms)
{
	if (ms == 0)
		return gpr_inf_future(GPR_CLOCK_MONOTONIC);
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			    gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

static void destroy_cq(grpc_completion_queue *cq)
{
	grpc_completion_queue_shutdown(cq);
	grpc_event ev;
	do
		ev =
		    grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	while (ev.type != GRPC_QUEUE_SHUTDOWN);
	grpc_completion_queue_destroy(cq);
}

int rsc_client_connect(rsc_client *c, uint32_t timeout_ms, rsc_status *st)
{
	if (!c)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "no client");
	grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
	gpr_timespec deadline = deadline_in(timeout_ms ? timeout_ms : 5000);
	grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->channel, 1);
	int rc = RSC_OK;
	while (s != GRPC_CHANNEL_READY) {
		if (s == GRPC_CHANNEL_TRANSIENT_FAILURE || s == GRPC_CHANNEL_SHUTDOWN) {
			rc = rsc_fail(st, RSC_UNAVAILABLE,
				      "cannot reach the sidecar at %s: the connection failed (is "
				      "it running, and is "
				      "the address right? use --sidecar or RDMA_SIDECAR_ADDR)",
				      c->target);
			break;
		}
		grpc_channel_watch_connectivity_state(c->channel, s, deadline, cq, c);
		grpc_event ev =
		    grpc_completion_queue_pluck(cq, c, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
		if (!ev.success) {
			rc = rsc_fail(st, RSC_UNAVAILABLE,
				      "cannot reach the sidecar at %s: not connected within %u ms "
				      "(is it running?)",
				      c->target, timeout_ms ? timeout_ms : 5000);
			break;
		}
		s = grpc_channel_check_connectivity_state(c->channel, 1);
	}
	destroy_cq(cq);
	return rc == RSC_OK ? rsc_ok(st) : rc;
}

static const char *state_name(grpc_connectivity_state s)
{
	switch (s) {
	case GRPC_CHANNEL_IDLE:
		return "idle";
	case GRPC_CHANNEL_CONNECTING:
		return "connecting";
	case GRPC_CHANNEL_READY:
		return "ready";
	case GRPC_CHANNEL_TRANSIENT_FAILURE:
		return "the last connection attempt failed";
	case GRPC_CHANNEL_SHUTDOWN:
		return "shut down";
	}
	return "unknown";
}

int rsc_client_wait_ready(rsc_client *c, uint32_t timeout_ms, rsc_status *st)
{
	if (!c)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "no client");
	grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
	gpr_timespec start = gpr_now(GPR_CLOCK_MONOTONIC);
	gpr_timespec deadline = deadline_in(timeout_ms ? timeout_ms : 1);
	grpc_connectivity_state s = grpc_channel_check_connectivity_state(c->channel, 1);
	int rc = RSC_OK;
	/* Unlike rsc_client_connect, a failed attempt is no reason to stop: the channel tries again
	 * (after at most 1 s, see rsc_client_create) until the sidecar answers or the time is up.
	 */
	while (s != GRPC_CHANNEL_READY) {
		if (s == GRPC_CHANNEL_SHUTDOWN) {
			rc = rsc_fail(st, RSC_UNAVAILABLE, "the channel to %s was shut down",
				      c->target);
			break;
		}
		grpc_channel_watch_connectivity_state(c->channel, s, deadline, cq, c);
		grpc_event ev =
		    grpc_completion_queue_pluck(cq, c, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
		if (!ev.success) {
			double waited = gpr_timespec_to_micros(
					    gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), start)) /
					1e6;
			rc = rsc_fail(
			    st, RSC_UNAVAILABLE,
			    "the sidecar at %s was not ready after waiting %.1f s (%s): is "
			    "it running, and is the address right? (--sidecar or "
			    "RDMA_SIDECAR_ADDR; wait longer with --wait or "
			    "RDMA_SIDECAR_WAIT_FOR_READY)",
			    c->target, waited, state_name(s));
			break;
		}
		s = grpc_channel_check_connectivity_state(c->channel, 1);
	}
	destroy_cq(cq);
	return rc == RSC_OK ? rsc_ok(st) : rc;
}

static grpc_byte_buffer *pack(const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	grpc_slice s = grpc_slice_malloc(n);
	protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
	grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	return bb;
}

static ProtobufCMessage *unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d)
{
	grpc_byte_buffer_reader r;
	if (!grpc_byte_buffer_reader_init(&r, bb))
		return NULL;
	grpc_slice s = grpc_byte_buffer_reader_readall(&r);
	grpc_byte_buffer_reader_destroy(&r);
	ProtobufCMessage *m =
	    protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
	grpc_slice_unref(s);
	return m;
}

/* The state every call kind shares: the call, its queue and what RECV_STATUS fills. */
struct call {
	rsc_client *c;
	grpc_completion_queue *cq;
	grpc_call *call;
	grpc_metadata_array initial, trailing;
	grpc_status_code status;
	grpc_slice details;
};

static int call_start(struct call *k, rsc_client *c, const char *method, uint64_t timeout_ms,
		      rsc_status *st)
{
	memset(k, 0, sizeof(*k));
	if (!c)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "no client (NULL)");
	k->c = c;
	k->cq = grpc_completion_queue_create_for_pluck(NULL);
	k->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq,
					   grpc_slice_from_static_string(method), NULL,
					   deadline_in(timeout_ms), NULL);
	grpc_metadata_array_init(&k->initial);
	grpc_metadata_array_init(&k->trailing);
	k->details = grpc_empty_slice();
	return RSC_OK;
}

static int pluck(struct call *k, void *tag)
{
	grpc_event ev =
	    grpc_completion_queue_pluck(k->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* The call's final status into st (with the method and target for context). */
static int call_status(struct call *k, const char *method, rsc_status *st)
{
	if (k->status == GRPC_STATUS_OK)
		return rsc_ok(st);
	char *d = grpc_slice_to_c_string(k->details);
	int rc;
	if (k->status == GRPC_STATUS_UNAVAILABLE)
		rc = rsc_fail(st, k->status, "%s (sidecar at %s)", d[0] ? d : "unavailable",
			      k->c->target);
	else if (k->status == GRPC_STATUS_DEADLINE_EXCEEDED && !d[0])
		rc = rsc_fail(st, k->status, "%s: no answer before the call's deadline", method);
	else
		rc = rsc_fail(st, k->status, "%s", d[0] ? d : rsc_code_name(k->status));
	gpr_free(d);
	return rc;
}

static void call_end(struct call *k)
{
	if (k->call)
		grpc_call_unref(k->call);
	if (k->cq)
		destroy_cq(k->cq);
	grpc_metadata_array_destroy(&k->initial);
	grpc_metadata_array_destroy(&k->trailing);
	grpc_slice_unref(k->details);
}

static void op_recv_status(grpc_op *op, struct call *k)
{
	memset(op, 0, sizeof(*op));
	op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	op->data.recv_status_on_client.trailing_metadata = &k->trailing;
	op->data.recv_status_on_client.status = &k->status;
	op->data.recv_status_on_client.status_details = &k->details;
}

int rsc_call_unary(rsc_client *c, const char *method, const ProtobufCMessage *req,
		   const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
		   uint64_t timeout_ms, rsc_status *st)
{
	struct call k;
	if (!c)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "%s: no client (NULL)", method);
	if (call_start(&k, c, method, timeout_ms ? timeout_ms : c->call_timeout_ms, st) != RSC_OK)
		return st ? st->code : RSC_INVALID_ARGUMENT;
	grpc_byte_buffer *out = pack(req), *in = NULL;
	grpc_op ops[6];
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = out;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.initial;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &in;
	op_recv_status(&ops[5], &k);
	int rc;
	if (grpc_call_start_batch(k.call, ops, 6, &k, NULL) != GRPC_CALL_OK) {
		rc = rsc_fail(st, RSC_INTERNAL, "%s: gRPC refused to start the call", method);
		goto out;
	}
	pluck(&k, &k);
	rc = call_status(&k, method, st);
	if (rc != RSC_OK)
		goto out;
	if (!in || !(*resp = unpack(in, resp_desc)))
		rc = rsc_fail(st, RSC_INTERNAL, "%s: the sidecar's answer is missing or malformed",
			      method);
out:
	grpc_byte_buffer_destroy(out);
	if (in)
		grpc_byte_buffer_destroy(in);
	call_end(&k);
	return rc;
}

int rsc_call_server_stream(rsc_client *c, const char *method, const ProtobufCMessage *req,
			   const ProtobufCMessageDescriptor *resp_desc, rsc_stream_cb on_msg,
			   void (*on_ready)(void *user), void *user, uint64_t timeout_ms,
			   int *stopped, rsc_status *st)
{
	struct call k;
	*stopped = 0;
	if (call_start(&k, c, method, timeout_ms, st) != RSC_OK)
		return st ? st->code : RSC_INVALID_ARGUMENT;
	grpc_byte_buffer *out = pack(req);
	grpc_op ops[4];
	int rc = RSC_OK, tag_start, tag_status, tag_msg;
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = out;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.initial;
	if (grpc_call_start_batch(k.call, ops, 4, &tag_start, NULL) != GRPC_CALL_OK)
		goto refused;
	op_recv_status(&ops[0], &k);
	if (grpc_call_start_batch(k.call, ops, 1, &tag_status, NULL) != GRPC_CALL_OK) {
		grpc_call_cancel(k.call, NULL);
		pluck(&k, &tag_start);
		goto refused;
	}
	pluck(&k, &tag_start);
	/* The server's "ready" header (SubscribeMetadata sends it once its NATS subscription is in
	 * place); a failed call's empty headers do not carry it. */
	if (on_ready) {
		for (size_t i = 0; i < k.initial.count; i++) {
			if (grpc_slice_str_cmp(k.initial.metadata[i].key, "rdma-sidecar-ready") == 0) {
				on_ready(user);
				break;
			}
		}
	}
	for (;;) {
		grpc_byte_buffer *in = NULL;
		memset(ops, 0, sizeof(ops));
		ops[0].op = GRPC_OP_RECV_MESSAGE;
		ops[0].data.recv_message.recv_message = &in;
		if (grpc_call_start_batch(k.call, ops, 1, &tag_msg, NULL) != GRPC_CALL_OK)
			break;
		pluck(&k, &tag_msg);
		if (!in)
			break; /* end of stream (or failure: the status says) */
		ProtobufCMessage *m = unpack(in, resp_desc);
		grpc_byte_buffer_destroy(in);
		if (!m) {
			rc = rsc_fail(st, RSC_INTERNAL, "%s: a malformed message from the sidecar",
				      method);
			grpc_call_cancel(k.call, NULL);
			continue;
		}
		int stop = rc == RSC_OK && !*stopped ? on_msg(m, user) : 0;
		protobuf_c_message_free_unpacked(m, NULL);
		if (stop) {
			*stopped = 1;
			grpc_call_cancel(k.call, NULL);
		}
	}
	pluck(&k, &tag_status);
	if (rc == RSC_OK)
		rc = *stopped ? rsc_ok(st) : call_status(&k, method, st);
	goto out;
refused:
	rc = rsc_fail(st, RSC_INTERNAL, "%s: gRPC refused to start the call", method);
out:
	grpc_byte_buffer_destroy(out);
	call_end(&k);
	return rc;
}

int rsc_call_client_stream(rsc_client *c, const char *method, rsc_stream_next next, void *user,
			   const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
			   uint64_t timeout_ms, rsc_status *st)
{
	struct call k;
	if (!c)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "%s: no client (NULL)", method);
	if (call_start(&k, c, method, timeout_ms ? timeout_ms : c->call_timeout_ms, st) != RSC_OK)
		return st ? st->code : RSC_INVALID_ARGUMENT;
	grpc_byte_buffer *in = NULL;
	grpc_op ops[4];
	int rc = RSC_OK, tag, failed = 0;
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (grpc_call_start_batch(k.call, ops, 1, &tag, NULL) != GRPC_CALL_OK) {
		rc = rsc_fail(st, RSC_INTERNAL, "%s: gRPC refused to start the call", method);
		goto out;
	}
	pluck(&k, &tag);
	for (;;) {
		const ProtobufCMessage *m = NULL;
		int more = next(user, &m, st);
		if (more < 0) {
			failed = 1;
			rc = st ? st->code : RSC_INVALID_ARGUMENT;
			grpc_call_cancel(k.call, NULL);
			break;
		}
		if (more == 0)
			break;
		grpc_byte_buffer *bb = pack(m);
		memset(ops, 0, sizeof(ops));
		ops[0].op = GRPC_OP_SEND_MESSAGE;
		ops[0].data.send_message.send_message = bb;
		int ok = grpc_call_start_batch(k.call, ops, 1, &tag, NULL) == GRPC_CALL_OK &&
			 pluck(&k, &tag);
		grpc_byte_buffer_destroy(bb);
		if (!ok)
			break; /* the server ended the call: its status says why */
	}
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[1].data.recv_initial_metadata.recv_initial_metadata = &k.initial;
	ops[2].op = GRPC_OP_RECV_MESSAGE;
	ops[2].data.recv_message.recv_message = &in;
	op_recv_status(&ops[3], &k);
	if (grpc_call_start_batch(k.call, ops, 4, &tag, NULL) != GRPC_CALL_OK) {
		if (!failed)
			rc = rsc_fail(st, RSC_INTERNAL, "%s: gRPC refused to finish the call",
				      method);
		goto out;
	}
	pluck(&k, &tag);
	if (failed)
		goto out;
	rc = call_status(&k, method, st);
	if (rc == RSC_OK && (!in || !(*resp = unpack(in, resp_desc))))
		rc = rsc_fail(st, RSC_INTERNAL, "%s: the sidecar's answer is missing or malformed",
			      method);
out:
	if (in)
		grpc_byte_buffer_destroy(in);
	call_end(&k);
	return rc;
}
