/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reflection.c: gRPC server reflection, grpc.reflection.v1 and v1alpha ServerReflectionInfo (a
 * bidirectional stream): list_services, file_by_filename, file_containing_symbol (packages,
 * messages and their nested types, enums, services and their methods), and the two extension
 * requests, which find nothing (these protos declare no extensions). Answers come from the
 * FileDescriptorSet the build generates with protoc --descriptor_set_out --include_imports and
 * embeds (sc_descriptor_set, build/gen/descriptor_set.c); file answers carry the file and every
 * file it imports, transitively. v1alpha is wire-identical to v1, so both decode with v1's code.
 *
 * The set is read in place by a small protobuf wire reader (nothing allocated for it). Off with
 * --no-reflection (UNIMPLEMENTED, saying so); the probe port never serves it. The next request is
 * read only once the previous answer has left (sc_call_on_drained), so a client that sends
 * without reading holds at most one answer here.
 *
 * Threads: completion-queue workers. Owns nothing beyond each answer while it is built.
 */
#include "handlers.h"

#include "grpc/reflection/v1/reflection.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

extern const unsigned char sc_descriptor_set[];
extern const size_t sc_descriptor_set_len;

/* grpc::StatusCode values for ErrorResponse.error_code. */
#define RC_INVALID_ARGUMENT 3
#define RC_NOT_FOUND 5

/* The oneof cases of the request and the response, shorter. */
#define REQ_CASE(x) GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##x
#define RESP_CASE(x) GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##x

/* Files in the set; a few are expected, the cap only bounds the arrays below. */
#define MAX_FILES 64

/* ---- protobuf wire reading ------------------------------------------------------------------- */

struct span {
	const unsigned char *p;
	size_t len;
};

struct rd {
	const unsigned char *p, *end;
};

static bool rd_varint(struct rd *r, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
		unsigned char b = *r->p++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

/*
 * The next field: its number, and for length-delimited fields (wire type 2) the bytes. Other wire
 * types are skipped over (val.p NULL). False at the end or on malformed input.
 */
static bool rd_field(struct rd *r, uint32_t *num, struct span *val)
{
	uint64_t key, n;
	if (r->p >= r->end || !rd_varint(r, &key))
		return false;
	*num = (uint32_t)(key >> 3);
	val->p = NULL;
	val->len = 0;
	switch (key & 7) {
	case 0:
		return rd_varint(r, &n);
	case 1:
		if ((size_t)(r->end - r->p) < 8)
			return false;
		r->p += 8;
		return true;
	case 5:
		if ((size_t)(r->end - r->p) < 4)
			return false;
		r->p += 4;
		return true;
	case 2:
		if (!rd_varint(r, &n) || n > (uint64_t)(r->end - r->p))
			return false;
		val->p = r->p;
		val->len = (size_t)n;
		r->p += n;
		return true;
	default:
		return false;
	}
}

static struct rd rd_of(struct span s)
{
	return (struct rd){s.p, s.p + s.len};
}

/* The first length-delimited field `num` of a message (e.g. a name), or an empty span. */
static struct span field_str(struct span msg, uint32_t want)
{
	struct rd r = rd_of(msg);
	uint32_t num;
	struct span v;
	while (rd_field(&r, &num, &v))
		if (num == want && v.p)
			return v;
	return (struct span){(const unsigned char *)"", 0};
}

static bool span_eq(struct span s, const char *str, size_t len)
{
	return s.len == len && memcmp(s.p, str, len) == 0;
}

/* The files of the embedded set (FileDescriptorSet.file = 1), in order. */
static size_t set_files(struct span *files, size_t cap)
{
	struct rd r = {sc_descriptor_set, sc_descriptor_set + sc_descriptor_set_len};
	uint32_t num;
	struct span v;
	size_t n = 0;
	while (n < cap && rd_field(&r, &num, &v))
		if (num == 1 && v.p)
			files[n++] = v;
	return n;
}

/* ---- symbol lookup --------------------------------------------------------------------------- */

/* Does `name` (no package, e.g. "Outer.Inner" or "Field") name something inside DescriptorProto
 * msg: a nested message (3) or an enum (4), at any depth? Fields are not symbols here. */
static bool in_message(struct span msg, const char *name, size_t len)
{
	const char *dot = memchr(name, '.', len);
	size_t seg = dot ? (size_t)(dot - name) : len;
	struct rd r = rd_of(msg);
	uint32_t num;
	struct span v;
	while (rd_field(&r, &num, &v)) {
		if (!v.p || (num != 3 && num != 4) || !span_eq(field_str(v, 1), name, seg))
			continue;
		if (!dot)
			return true;
		if (num == 3 && in_message(v, dot + 1, len - seg - 1))
			return true;
	}
	return false;
}

/* Does FileDescriptorProto f declare the fully qualified symbol? Top-level messages (4), enums
 * (5), services (6) and their methods, nested types below messages. */
static bool file_declares(struct span f, const char *sym, size_t len)
{
	struct span pkg = field_str(f, 2);
	if (pkg.len) {
		if (len <= pkg.len + 1 || memcmp(sym, pkg.p, pkg.len) != 0 || sym[pkg.len] != '.')
			return false;
		sym += pkg.len + 1;
		len -= pkg.len + 1;
	}
	const char *dot = memchr(sym, '.', len);
	size_t seg = dot ? (size_t)(dot - sym) : len;
	struct rd r = rd_of(f);
	uint32_t num;
	struct span v;
	while (rd_field(&r, &num, &v)) {
		if (!v.p || num < 4 || num > 6 || !span_eq(field_str(v, 1), sym, seg))
			continue;
		if (!dot)
			return true;
		const char *rest = dot + 1;
		size_t rest_len = len - seg - 1;
		if (num == 4 && in_message(v, rest, rest_len))
			return true;
		if (num == 6) { /* Service.Method */
			struct rd mr = rd_of(v);
			uint32_t mnum;
			struct span m;
			while (rd_field(&mr, &mnum, &m))
				if (mnum == 2 && m.p && span_eq(field_str(m, 1), rest, rest_len))
					return true;
		}
	}
	return false;
}

/* The package itself counts as a symbol (grpcurl describes packages). */
static bool file_in_package(struct span f, const char *sym, size_t len)
{
	return span_eq(field_str(f, 2), sym, len);
}

/* ---- answers --------------------------------------------------------------------------------- */

static ssize_t find_file(const struct span *files, size_t n, struct span name)
{
	for (size_t i = 0; i < n; i++)
		if (span_eq(field_str(files[i], 1), (const char *)name.p, name.len))
			return (ssize_t)i;
	return -1;
}

/* files[i] and, depth first, every file it imports (dependency = 3), each once. */
static void add_with_deps(const struct span *files, size_t n, size_t i, bool *seen,
			  ProtobufCBinaryData *out, size_t *n_out)
{
	if (seen[i])
		return;
	seen[i] = true;
	out[(*n_out)++] = (ProtobufCBinaryData){files[i].len, (uint8_t *)files[i].p};
	struct rd r = rd_of(files[i]);
	uint32_t num;
	struct span v;
	while (rd_field(&r, &num, &v)) {
		if (num != 3 || !v.p)
			continue;
		ssize_t d = find_file(files, n, v);
		if (d >= 0)
			add_with_deps(files, n, (size_t)d, seen, out, n_out);
	}
}

/* Build the answer to one request into resp; *scratch collects what to free after sending. */
struct answer {
	Grpc__Reflection__V1__ServerReflectionResponse resp;
	Grpc__Reflection__V1__FileDescriptorResponse fdr;
	Grpc__Reflection__V1__ListServiceResponse lsr;
	Grpc__Reflection__V1__ExtensionNumberResponse enr;
	Grpc__Reflection__V1__ErrorResponse er;
	ProtobufCBinaryData fds[MAX_FILES];
	Grpc__Reflection__V1__ServiceResponse svcs[MAX_FILES * 4];
	Grpc__Reflection__V1__ServiceResponse *svc_ptrs[MAX_FILES * 4];
	char names[MAX_FILES * 4][160];
	char msg[320];
};

__attribute__((format(printf, 3, 4))) static void answer_error(struct answer *a, int32_t code,
							       const char *fmt, ...)
{
	a->er = (Grpc__Reflection__V1__ErrorResponse)GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
	a->er.error_code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->msg, sizeof(a->msg), fmt, ap);
	va_end(ap);
	a->er.error_message = a->msg;
	a->resp.message_response_case = RESP_CASE(ERROR_RESPONSE);
	a->resp.error_response = &a->er;
}

static void answer_files(struct answer *a, const struct span *files, size_t n, size_t i)
{
	bool seen[MAX_FILES] = {false};
	a->fdr = (Grpc__Reflection__V1__FileDescriptorResponse)
	    GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
	add_with_deps(files, n, i, seen, a->fds, &a->fdr.n_file_descriptor_proto);
	a->fdr.file_descriptor_proto = a->fds;
	a->resp.message_response_case = RESP_CASE(FILE_DESCRIPTOR_RESPONSE);
	a->resp.file_descriptor_response = &a->fdr;
}

static void answer_services(struct answer *a, const struct span *files, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		struct span pkg = field_str(files[i], 2);
		struct rd r = rd_of(files[i]);
		uint32_t num;
		struct span v;
		while (k < MAX_FILES * 4 && rd_field(&r, &num, &v)) {
			if (num != 6 || !v.p)
				continue;
			struct span name = field_str(v, 1);
			snprintf(a->names[k], sizeof(a->names[k]), "%.*s%s%.*s", (int)pkg.len,
				 (const char *)pkg.p, pkg.len ? "." : "", (int)name.len,
				 (const char *)name.p);
			a->svcs[k] = (Grpc__Reflection__V1__ServiceResponse)
			    GRPC__REFLECTION__V1__SERVICE_RESPONSE__INIT;
			a->svcs[k].name = a->names[k];
			a->svc_ptrs[k] = &a->svcs[k];
			k++;
		}
	}
	a->lsr = (Grpc__Reflection__V1__ListServiceResponse)
	    GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
	a->lsr.n_service = k;
	a->lsr.service = a->svc_ptrs;
	a->resp.message_response_case = RESP_CASE(LIST_SERVICES_RESPONSE);
	a->resp.list_services_response = &a->lsr;
}

#define SERVED_FILES                                                                               \
	"this sidecar describes rdma_sidecar/v1/sidecar.proto, grpc/health/v1/health.proto and "   \
	"grpc/reflection/v1{,alpha}/reflection.proto"

static void answer(struct answer *a, Grpc__Reflection__V1__ServerReflectionRequest *req)
{
	struct span files[MAX_FILES];
	size_t n = set_files(files, MAX_FILES);
	a->resp = (Grpc__Reflection__V1__ServerReflectionResponse)
	    GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
	a->resp.valid_host = req->host;
	a->resp.original_request = req;
	switch (req->message_request_case) {
	case REQ_CASE(LIST_SERVICES):
		answer_services(a, files, n);
		return;
	case REQ_CASE(FILE_BY_FILENAME): {
		const char *fn = req->file_by_filename;
		ssize_t i =
		    find_file(files, n, (struct span){(const unsigned char *)fn, strlen(fn)});
		if (i < 0)
			answer_error(a, RC_NOT_FOUND, "file \"%.100s\" not found: " SERVED_FILES,
				     fn);
		else
			answer_files(a, files, n, (size_t)i);
		return;
	}
	case REQ_CASE(FILE_CONTAINING_SYMBOL): {
		const char *sym = req->file_containing_symbol;
		size_t len = strlen(sym);
		for (size_t i = 0; i < n; i++)
			if (file_declares(files[i], sym, len)) {
				answer_files(a, files, n, i);
				return;
			}
		for (size_t i = 0; i < n; i++)
			if (file_in_package(files[i], sym, len)) {
				answer_files(a, files, n, i);
				return;
			}
		answer_error(
		    a, RC_NOT_FOUND,
		    "symbol \"%.100s\" not found: give a fully qualified name, e.g. "
		    "rdma_sidecar.v1.Sidecar or rdma_sidecar.v1.GetInfoRequest; " SERVED_FILES,
		    sym);
		return;
	}
	case REQ_CASE(FILE_CONTAINING_EXTENSION):
		answer_error(a, RC_NOT_FOUND,
			     "no extension of \"%.100s\": these protos declare none",
			     req->file_containing_extension &&
				     req->file_containing_extension->containing_type
				 ? req->file_containing_extension->containing_type
				 : "");
		return;
	case REQ_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE): {
		const char *t = req->all_extension_numbers_of_type;
		for (size_t i = 0; i < n; i++)
			if (file_declares(files[i], t, strlen(t))) {
				a->enr = (Grpc__Reflection__V1__ExtensionNumberResponse)
				    GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
				a->enr.base_type_name = (char *)t;
				a->resp.message_response_case =
				    RESP_CASE(ALL_EXTENSION_NUMBERS_RESPONSE);
				a->resp.all_extension_numbers_response = &a->enr;
				return;
			}
		answer_error(a, RC_NOT_FOUND, "type \"%.100s\" not found: " SERVED_FILES, t);
		return;
	}
	default:
		answer_error(
		    a, RC_INVALID_ARGUMENT,
		    "empty ServerReflectionRequest: set one of list_services, "
		    "file_by_filename, file_containing_symbol, file_containing_extension or "
		    "all_extension_numbers_of_type");
		return;
	}
}

/* ---- the stream ------------------------------------------------------------------------------ */

static void on_request(struct sc_call *c, ProtobufCMessage *msg, bool end);

/* The last answer has left: read the next request. */
static void on_drained(struct sc_call *c)
{
	sc_call_recv(c, &grpc__reflection__v1__server_reflection_request__descriptor, on_request);
}

static void on_request(struct sc_call *c, ProtobufCMessage *msg, bool end)
{
	if (end || !msg) {
		/* The client closed its side (or the call is gone): end the stream OK. */
		sc_call_finish(c, SC_OK, NULL);
		return;
	}
	struct answer *a = malloc(sizeof(*a));
	if (!a) {
		sc_call_fail(c, SC_RESOURCE_EXHAUSTED,
			     "out of memory answering a reflection request");
		return;
	}
	answer(a, (Grpc__Reflection__V1__ServerReflectionRequest *)msg);
	sc_call_send(c, &a->resp.base); /* packs at once; on_drained reads the next request */
	free(a);
}

void sc_h_server_reflection(struct sc_call *c, ProtobufCMessage *req)
{
	(void)req;
	if (!sc_call_config(c)->reflection) {
		sc_call_fail(
		    c, SC_UNIMPLEMENTED,
		    "server reflection is off on this sidecar (--no-reflection): the API is "
		    "proto/rdma_sidecar/v1/sidecar.proto");
		return;
	}
	sc_call_on_drained(c, on_drained);
	sc_call_recv(c, &grpc__reflection__v1__server_reflection_request__descriptor, on_request);
}
