/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/metadata.c: signing and verifying the "rsm1." metadata text (format in meta/metadata.h), the
 * bridge between struct sc_metadata and the RdmaMetadata/SignedMetadata protobuf-c messages, and
 * sc_random_bytes. Pure functions over their arguments, run on whichever thread calls them (gRPC
 * workers, the NATS thread). Owns nothing beyond a call: every protobuf-c message and buffer is
 * freed before return. The text is capability material: it is never logged and never copied into
 * error messages.
 */
#include "meta/metadata.h"
#include "meta/runs.h"

#include "rdma_sidecar/v1/sidecar.pb-c.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define SC_META_DOMAIN "rsm1"
#define PREFIX_LEN (sizeof(SC_METADATA_PREFIX) - 1)

typedef RdmaSidecar__V1__RdmaMetadata pb_metadata;
typedef RdmaSidecar__V1__SignedMetadata pb_signed;
typedef RdmaSidecar__V1__RemoteDescriptor pb_desc;
typedef RdmaSidecar__V1__IbverbsEndpoint pb_ib;
typedef RdmaSidecar__V1__IbverbsRail pb_ib_rail;

static const struct {
	unsigned bit;
	RdmaSidecar__V1__Backend pb;
} backend_map[] = {
    {SC_BACKEND_BIT_TCP, RDMA_SIDECAR__V1__BACKEND__BACKEND_TCP},
    {SC_BACKEND_BIT_IBVERBS, RDMA_SIDECAR__V1__BACKEND__BACKEND_IBVERBS},
    {SC_BACKEND_BIT_LOCAL, RDMA_SIDECAR__V1__BACKEND__BACKEND_LOCAL},
    {SC_BACKEND_BIT_LIBFABRIC, RDMA_SIDECAR__V1__BACKEND__BACKEND_LIBFABRIC},
};
#define N_BACKENDS (sizeof(backend_map) / sizeof(backend_map[0]))

_Static_assert((int)SC_OP_READABLE == RDMA_SIDECAR__V1__OPERATION_KIND__OPERATION_KIND_READABLE &&
		   (int)SC_OP_WRITABLE == RDMA_SIDECAR__V1__OPERATION_KIND__OPERATION_KIND_WRITABLE,
	       "sc_op_kind must equal the proto OperationKind");
_Static_assert((int)SC_DEVICE_HOST == RDMA_SIDECAR__V1__DEVICE_KIND__DEVICE_KIND_HOST &&
		   (int)SC_DEVICE_CUDA == RDMA_SIDECAR__V1__DEVICE_KIND__DEVICE_KIND_CUDA,
	       "sc_device_kind must equal the proto DeviceKind");

/* True when the NUL-terminated string in a char[cap] field really ends inside the field. */
static bool field_terminated(const char *field, size_t cap)
{
	return memchr(field, '\0', cap) != NULL;
}

/* The MAC input: "rsm1" 0x00 key_id 0x00 payload. */
static bool metadata_mac(const struct sc_keyring *ring, const char *key_id, const uint8_t *payload,
			 size_t payload_len, uint8_t mac[SC_HMAC_LEN])
{
	static const char domain[] = SC_META_DOMAIN; /* sizeof includes the 0x00 separator */
	static const char zero = 0;
	const void *parts[] = {domain, key_id, &zero, payload};
	const size_t lens[] = {sizeof(domain), strlen(key_id), 1, payload_len};
	return sc_keyring_hmac(ring, key_id, parts, lens, 4, mac);
}

/* ---- sign ------------------------------------------------------------------------------------ */

int sc_metadata_sign(const struct sc_keyring *ring, const struct sc_metadata *md, char **text,
		     struct sc_err *err)
{
	*text = NULL;
	const char *key_id = sc_keyring_signing_id(ring);
	if (!key_id)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "no signing key: start the sidecar with --key-file to hand out "
				  "metadata that other sidecars accept");
	/* Sign only checks what it needs to read md safely; sc_metadata_verify is the gate. */
	if (!field_terminated(md->issuer, sizeof(md->issuer)) ||
	    !field_terminated(md->audience, sizeof(md->audience)))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata issuer/audience not terminated");
	if (md->n_endpoints > SC_MAX_ENDPOINTS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu data endpoints, at most %d", md->n_endpoints,
				  SC_MAX_ENDPOINTS);
	for (size_t i = 0; i < md->n_endpoints; i++) {
		if (!field_terminated(md->endpoints[i], sizeof(md->endpoints[i])))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata endpoint %zu not terminated", i);
	}
	if (md->ib.present && !field_terminated(md->ib.device, sizeof(md->ib.device)))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata ibverbs device not terminated");
	if (md->n_descs && !md->descs)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu descriptors but no array", md->n_descs);
	if (md->n_ib_rails > SC_MAX_IB_RAILS - 1 || (md->n_ib_rails && !md->ib_rkeys && md->n_ib_groups))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata has %zu ibverbs rails",
				  md->n_ib_rails);
	for (size_t j = 0; j < md->n_ib_rails; j++) {
		if (!field_terminated(md->ib_rails[j].ep.device, sizeof(md->ib_rails[j].ep.device)))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs rail device not terminated");
	}
	if (md->n_descs > SIZE_MAX / sizeof(pb_desc))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "too many descriptors");

	int rc = -1;
	struct sc_meta_runs runs = {0};
	pb_desc *descs = NULL;
	RdmaSidecar__V1__OfiKey *ofi_keys = NULL, **ofi_key_ptrs = NULL;
	pb_desc **desc_ptrs = NULL;
	uint8_t *payload = NULL, *envelope = NULL;
	size_t payload_len = 0;

	pb_metadata m = RDMA_SIDECAR__V1__RDMA_METADATA__INIT;
	m.version = md->version ? md->version : SC_METADATA_VERSION;
	m.issuer = (char *)md->issuer;
	m.audience = (char *)md->audience;
	m.kind = (RdmaSidecar__V1__OperationKind)md->kind;
	m.token.data = (uint8_t *)md->token;
	m.token.len = SC_TOKEN_LEN;
	char *endpoints[SC_MAX_ENDPOINTS];
	for (size_t i = 0; i < md->n_endpoints; i++)
		endpoints[i] = (char *)md->endpoints[i];
	m.n_data_endpoints = md->n_endpoints;
	m.data_endpoints = md->n_endpoints ? endpoints : NULL;
	RdmaSidecar__V1__Backend backends[N_BACKENDS];
	for (size_t i = 0; i < N_BACKENDS; i++) {
		if (md->backends & backend_map[i].bit)
			backends[m.n_backends++] = backend_map[i].pb;
	}
	m.backends = m.n_backends ? backends : NULL;
	pb_ib ib = RDMA_SIDECAR__V1__IBVERBS_ENDPOINT__INIT;
	if (md->ib.present) {
		ib.gid.data = (uint8_t *)md->ib.gid;
		ib.gid.len = sizeof(md->ib.gid);
		ib.lid = md->ib.lid;
		ib.port = md->ib.port;
		ib.mtu = md->ib.mtu;
		ib.device = (char *)md->ib.device;
		m.ibverbs = &ib;
	}
	pb_ib_rail rails[SC_MAX_IB_RAILS - 1];
	pb_ib rail_eps[SC_MAX_IB_RAILS - 1];
	pb_ib_rail *rail_ptrs[SC_MAX_IB_RAILS - 1];
	for (size_t j = 0; j < md->n_ib_rails; j++) {
		const struct sc_ib_rail *r = &md->ib_rails[j];
		pb_ib e = RDMA_SIDECAR__V1__IBVERBS_ENDPOINT__INIT;
		e.gid.data = (uint8_t *)r->ep.gid;
		e.gid.len = sizeof(r->ep.gid);
		e.lid = r->ep.lid;
		e.port = r->ep.port;
		e.mtu = r->ep.mtu;
		e.device = (char *)r->ep.device;
		rail_eps[j] = e;
		pb_ib_rail pr = RDMA_SIDECAR__V1__IBVERBS_RAIL__INIT;
		pr.index = r->index;
		pr.endpoint = &rail_eps[j];
		pr.n_rkeys = md->n_ib_groups;
		pr.rkeys = md->n_ib_groups ? md->ib_rkeys + j * md->n_ib_groups : NULL;
		rails[j] = pr;
		rail_ptrs[j] = &rails[j];
	}
	m.n_ib_rails = md->n_ib_rails;
	m.ib_rails = md->n_ib_rails ? rail_ptrs : NULL;
	RdmaSidecar__V1__OfiEndpoint ofi = RDMA_SIDECAR__V1__OFI_ENDPOINT__INIT;
	ProtobufCBinaryData ofi_addrs[SC_MAX_OFI_RAILS];
	if (md->ofi.present) {
		ofi.provider = (char *)md->ofi.provider;
		for (size_t j = 0; j < md->ofi.n_addrs && j < SC_MAX_OFI_RAILS; j++) {
			ofi_addrs[j].data = (uint8_t *)md->ofi.addr[j];
			ofi_addrs[j].len = md->ofi.addr_len[j];
		}
		ofi.n_addresses = md->ofi.n_addrs;
		ofi.addresses = ofi_addrs;
		ofi.virt_addr = md->ofi.virt_addr;
		if (md->ofi.n_keys) {
			ofi_keys = calloc(md->ofi.n_keys, sizeof(*ofi_keys));
			ofi_key_ptrs = calloc(md->ofi.n_keys, sizeof(*ofi_key_ptrs));
			if (!ofi_keys || !ofi_key_ptrs) {
				free(ofi_keys);
				free(ofi_key_ptrs);
				ofi_keys = NULL;
				ofi_key_ptrs = NULL;
				sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
				goto out;
			}
			for (size_t k = 0; k < md->ofi.n_keys; k++) {
				RdmaSidecar__V1__OfiKey pk = RDMA_SIDECAR__V1__OFI_KEY__INIT;
				pk.key = md->ofi.keys[k].key;
				pk.address = md->ofi.keys[k].base;
				pk.length = md->ofi.keys[k].length;
				ofi_keys[k] = pk;
				ofi_key_ptrs[k] = &ofi_keys[k];
			}
		}
		ofi.n_keys = md->ofi.n_keys;
		ofi.keys = ofi_key_ptrs;
		if (md->ofi.rail_keys && md->ofi.n_addrs > 1) {
			ofi.n_rail_keys = (md->ofi.n_addrs - 1) * md->ofi.n_keys;
			ofi.rail_keys = md->ofi.rail_keys;
		}
		m.ofi = &ofi;
	}
	if (m.version != 1) {
		/* version 2 and later: runs (meta/runs.c) */
		if (sc_meta_runs_encode(md->descs, md->n_descs, &runs, err) != 0)
			goto out;
		m.n_runs = runs.n;
		m.runs = runs.ptrs;
	} else if (md->n_descs) {
		descs = calloc(md->n_descs, sizeof(*descs));
		desc_ptrs = calloc(md->n_descs, sizeof(*desc_ptrs));
		if (!descs || !desc_ptrs) {
			sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
			goto out;
		}
		for (size_t i = 0; i < md->n_descs; i++) {
			pb_desc d = RDMA_SIDECAR__V1__REMOTE_DESCRIPTOR__INIT;
			d.length = md->descs[i].length;
			d.device_kind = (RdmaSidecar__V1__DeviceKind)md->descs[i].device_kind;
			d.remote_addr = md->descs[i].remote_addr;
			d.rkey = md->descs[i].rkey;
			descs[i] = d;
			desc_ptrs[i] = &descs[i];
		}
	}
	if (m.version == 1) {
		m.n_descriptors = md->n_descs;
		m.descriptors = desc_ptrs;
	}
	m.issued_unix_ms = md->issued_unix_ms;
	m.expires_unix_ms = md->expires_unix_ms;
	m.nonce.data = (uint8_t *)md->nonce;
	m.nonce.len = SC_TOKEN_LEN;
	m.max_uses = md->max_uses;
	m.peer_features = md->peer_features;

	payload_len = rdma_sidecar__v1__rdma_metadata__get_packed_size(&m);
	/* base64 grows by 4/3; the envelope adds the key id and MAC. */
	if (payload_len > SC_METADATA_MAX_TEXT / 4 * 3) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "metadata would be larger than %d bytes of text (%zu descriptors): use "
			   "fewer descriptors per operation",
			   SC_METADATA_MAX_TEXT, md->n_descs);
		goto out;
	}
	payload = malloc(payload_len ? payload_len : 1);
	if (!payload) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
		goto out;
	}
	rdma_sidecar__v1__rdma_metadata__pack(&m, payload);

	uint8_t mac[SC_HMAC_LEN];
	if (!metadata_mac(ring, key_id, payload, payload_len, mac)) {
		sc_err_set(err, SC_INTERNAL, "HMAC-SHA256 failed (OpenSSL)");
		goto out;
	}
	pb_signed s = RDMA_SIDECAR__V1__SIGNED_METADATA__INIT;
	s.key_id = (char *)key_id;
	s.payload.data = payload;
	s.payload.len = payload_len;
	s.mac.data = mac;
	s.mac.len = sizeof(mac);
	size_t env_len = rdma_sidecar__v1__signed_metadata__get_packed_size(&s);
	envelope = malloc(env_len);
	if (!envelope) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
		goto out;
	}
	rdma_sidecar__v1__signed_metadata__pack(&s, envelope);

	char *b64 = NULL;
	if (sc_base64url_encode(envelope, env_len, &b64) < 0) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
		goto out;
	}
	size_t b64_len = strlen(b64);
	if (PREFIX_LEN + b64_len > SC_METADATA_MAX_TEXT) {
		free(b64);
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "metadata would be %zu bytes of text, over the %d byte cap: use fewer "
			   "descriptors per operation",
			   PREFIX_LEN + b64_len, SC_METADATA_MAX_TEXT);
		goto out;
	}
	char *t = malloc(PREFIX_LEN + b64_len + 1);
	if (!t) {
		free(b64);
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory signing metadata");
		goto out;
	}
	memcpy(t, SC_METADATA_PREFIX, PREFIX_LEN);
	memcpy(t + PREFIX_LEN, b64, b64_len + 1);
	free(b64);
	*text = t;
	rc = 0;
out:
	free(ofi_keys);
	free(ofi_key_ptrs);
	sc_meta_runs_free(&runs);
	free(envelope);
	free(payload);
	free(desc_ptrs);
	free(descs);
	return rc;
}

/* ---- verify ---------------------------------------------------------------------------------- */

/* Copy a proto string into a char[cap] field; false when it does not fit. */
static bool copy_field(char *dst, size_t cap, const char *src)
{
	size_t n = strlen(src);
	if (n >= cap)
		return false;
	memcpy(dst, src, n + 1);
	return true;
}

/* The issuer's other ibverbs rails (field 17): at most SC_MAX_IB_RAILS - 1, numbers 1..15 and
 * distinct, an endpoint with a 16-byte gid each, and one rkey per group of the descriptors. */
/* The issuer's libfabric endpoints and keys (field 18). */
static int ofi_from_pb(const pb_metadata *m, struct sc_metadata *out, struct sc_err *err)
{
	const RdmaSidecar__V1__OfiEndpoint *o = m->ofi;
	if (!o)
		return 0;
	if (!copy_field(out->ofi.provider, sizeof(out->ofi.provider), o->provider))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata libfabric provider name is longer than %zu",
				  sizeof(out->ofi.provider) - 1);
	if (o->n_addresses == 0 || o->n_addresses > SC_MAX_OFI_RAILS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu libfabric addresses (1..%d)", o->n_addresses,
				  SC_MAX_OFI_RAILS);
	for (size_t j = 0; j < o->n_addresses; j++) {
		if (o->addresses[j].len == 0 || o->addresses[j].len > SC_OFI_ADDR_MAX)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata libfabric address %zu is %zu bytes (1..%d)", j,
					  o->addresses[j].len, SC_OFI_ADDR_MAX);
		memcpy(out->ofi.addr[j], o->addresses[j].data, o->addresses[j].len);
		out->ofi.addr_len[j] = (uint32_t)o->addresses[j].len;
	}
	if (o->n_keys > SC_OFI_MAX_KEYS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu libfabric keys, at most %d", o->n_keys,
				  SC_OFI_MAX_KEYS);
	if (o->n_rail_keys && o->n_rail_keys != (o->n_addresses - 1) * o->n_keys)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu libfabric rail keys for %zu rails and %zu keys",
				  o->n_rail_keys, o->n_addresses, o->n_keys);
	if (o->n_keys) {
		out->ofi.keys = calloc(o->n_keys, sizeof(*out->ofi.keys));
		if (!out->ofi.keys)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "out of memory verifying metadata");
		for (size_t k = 0; k < o->n_keys; k++) {
			out->ofi.keys[k].key = o->keys[k]->key;
			out->ofi.keys[k].base = o->keys[k]->address;
			out->ofi.keys[k].length = o->keys[k]->length;
		}
	}
	if (o->n_rail_keys) {
		out->ofi.rail_keys = calloc(o->n_rail_keys, sizeof(uint64_t));
		if (!out->ofi.rail_keys)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "out of memory verifying metadata");
		memcpy(out->ofi.rail_keys, o->rail_keys, o->n_rail_keys * sizeof(uint64_t));
	}
	out->ofi.n_keys = o->n_keys;
	/* Rails without their own keys are not offered. */
	out->ofi.n_addrs = o->n_rail_keys || o->n_keys == 0 ? o->n_addresses : 1;
	out->ofi.virt_addr = o->virt_addr;
	out->ofi.present = true;
	return 0;
}

static int ib_rails_from_pb(const pb_metadata *m, struct sc_metadata *out, struct sc_err *err)
{
	if (m->n_ib_rails == 0)
		return 0;
	if (m->n_ib_rails > SC_MAX_IB_RAILS - 1)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu ibverbs rails, at most %d", m->n_ib_rails,
				  SC_MAX_IB_RAILS - 1);
	size_t groups = sc_metadata_rkey_groups(out->descs, out->n_descs, NULL);
	if (groups == (size_t)-1)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory verifying metadata");
	uint32_t seen = 0;
	for (size_t j = 0; j < m->n_ib_rails; j++) {
		const pb_ib_rail *r = m->ib_rails[j];
		if (r->index == 0 || r->index >= SC_MAX_IB_RAILS || (seen & (1u << r->index)))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs rail %zu has number %u (1..%d, each once)",
					  j, r->index, SC_MAX_IB_RAILS - 1);
		seen |= 1u << r->index;
		if (!r->endpoint || r->endpoint->gid.len != 16)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs rail %u has no endpoint with a 16-byte gid",
					  r->index);
		if (r->n_rkeys != groups)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs rail %u has %zu rkeys for %zu groups",
					  r->index, r->n_rkeys, groups);
	}
	out->ib_rkeys = calloc(m->n_ib_rails * (groups ? groups : 1), sizeof(uint32_t));
	if (!out->ib_rkeys)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory verifying metadata");
	out->n_ib_groups = groups;
	for (size_t j = 0; j < m->n_ib_rails; j++) {
		const pb_ib_rail *r = m->ib_rails[j];
		struct sc_ib_rail *o = &out->ib_rails[j];
		if (!copy_field(o->ep.device, sizeof(o->ep.device), r->endpoint->device))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs rail %u device name is longer than %zu",
					  r->index, sizeof(o->ep.device) - 1);
		o->index = r->index;
		o->ep.present = true;
		memcpy(o->ep.gid, r->endpoint->gid.data, 16);
		o->ep.lid = r->endpoint->lid;
		o->ep.port = r->endpoint->port;
		o->ep.mtu = r->endpoint->mtu;
		if (groups)
			memcpy(out->ib_rkeys + j * groups, r->rkeys, groups * sizeof(uint32_t));
	}
	out->n_ib_rails = m->n_ib_rails;
	return 0;
}

/*
 * Step 9 of verification: everything the struct needs. Fills *out (descs malloc'd) or returns -1.
 * Strings from here on are authenticated (a key holder wrote them), but are still bounded in
 * messages.
 */
static int metadata_from_pb(const pb_metadata *m, const char *key_id, struct sc_metadata *out,
			    struct sc_err *err)
{
	memset(out, 0, sizeof(*out));
	out->version = m->version;
	if (m->kind != RDMA_SIDECAR__V1__OPERATION_KIND__OPERATION_KIND_READABLE &&
	    m->kind != RDMA_SIDECAR__V1__OPERATION_KIND__OPERATION_KIND_WRITABLE)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "metadata kind %d is not READABLE or WRITABLE: it does not describe "
		    "a passive operation",
		    (int)m->kind);
	out->kind = (enum sc_op_kind)m->kind;
	if (m->token.len != SC_TOKEN_LEN)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata operation token is %zu bytes, want %d", m->token.len,
				  SC_TOKEN_LEN);
	memcpy(out->token, m->token.data, SC_TOKEN_LEN);
	if (m->nonce.len != 0 && m->nonce.len != SC_TOKEN_LEN)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata nonce is %zu bytes, want %d",
				  m->nonce.len, SC_TOKEN_LEN);
	if (m->nonce.len)
		memcpy(out->nonce, m->nonce.data, SC_TOKEN_LEN);
	if (m->version >= 2 && m->n_descriptors)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata version %u has plain descriptors: it carries runs",
				  m->version);
	if (m->version == 1 && m->n_runs)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata version 1 has runs: they need version 2");
	if (m->version == 1 && m->n_descriptors == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has no descriptors: nothing to transfer");
	if (m->n_descriptors > SC_METADATA_MAX_DESCS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu descriptors, at most %d are allowed",
				  m->n_descriptors, SC_METADATA_MAX_DESCS);
	uint64_t total = 0;
	for (size_t i = 0; i < m->n_descriptors; i++) {
		const pb_desc *d = m->descriptors[i];
		if (d->length == 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata descriptor %zu has length 0", i);
		if (d->length > UINT64_MAX - total)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata descriptor lengths overflow 64 bits at "
					  "descriptor %zu",
					  i);
		total += d->length;
		if ((int)d->device_kind < SC_DEVICE_UNSPECIFIED ||
		    (int)d->device_kind > SC_DEVICE_CUDA)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata descriptor %zu has unknown device kind %d", i,
					  (int)d->device_kind);
	}
	if (!copy_field(out->issuer, sizeof(out->issuer), m->issuer))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata issuer id is longer than %zu",
				  sizeof(out->issuer) - 1);
	if (!copy_field(out->audience, sizeof(out->audience), m->audience))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "metadata audience is longer than %zu",
				  sizeof(out->audience) - 1);
	if (m->n_data_endpoints > SC_MAX_ENDPOINTS)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata has %zu data endpoints, at most %d are allowed",
				  m->n_data_endpoints, SC_MAX_ENDPOINTS);
	for (size_t i = 0; i < m->n_data_endpoints; i++) {
		if (!copy_field(out->endpoints[i], sizeof(out->endpoints[i]), m->data_endpoints[i]))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata data endpoint %zu is longer than %zu", i,
					  sizeof(out->endpoints[i]) - 1);
	}
	out->n_endpoints = m->n_data_endpoints;
	for (size_t i = 0; i < m->n_backends; i++) {
		for (size_t j = 0; j < N_BACKENDS; j++) {
			if (m->backends[i] == backend_map[j].pb)
				out->backends |= backend_map[j].bit;
		}
		/* Backends this sidecar does not know (a newer issuer) are ignored. */
	}
	if (m->ibverbs) {
		if (m->ibverbs->gid.len != sizeof(out->ib.gid))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs gid is %zu bytes, want %zu",
					  m->ibverbs->gid.len, sizeof(out->ib.gid));
		if (!copy_field(out->ib.device, sizeof(out->ib.device), m->ibverbs->device))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "metadata ibverbs device name is longer than %zu",
					  sizeof(out->ib.device) - 1);
		out->ib.present = true;
		memcpy(out->ib.gid, m->ibverbs->gid.data, sizeof(out->ib.gid));
		out->ib.lid = m->ibverbs->lid;
		out->ib.port = m->ibverbs->port;
		out->ib.mtu = m->ibverbs->mtu;
	}
	out->issued_unix_ms = m->issued_unix_ms;
	out->expires_unix_ms = m->expires_unix_ms;
	out->max_uses = m->max_uses;
	out->peer_features = m->peer_features;
	memcpy(out->key_id, key_id, strlen(key_id) + 1); /* sc_key_id_valid: fits */

	if (m->version >= 2) {
		if (sc_meta_runs_decode(m->runs, m->n_runs, SC_METADATA_MAX_DESCS, &out->descs,
					&out->n_descs, err) != 0)
			return -1;
	} else {
		out->descs = calloc(m->n_descriptors, sizeof(*out->descs));
		if (!out->descs)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "out of memory verifying metadata");
		for (size_t i = 0; i < m->n_descriptors; i++) {
			out->descs[i].length = m->descriptors[i]->length;
			out->descs[i].device_kind =
			    (enum sc_device_kind)m->descriptors[i]->device_kind;
			out->descs[i].remote_addr = m->descriptors[i]->remote_addr;
			out->descs[i].rkey = m->descriptors[i]->rkey;
		}
		out->n_descs = m->n_descriptors;
	}
	if (ofi_from_pb(m, out, err) != 0)
		return -1;
	return ib_rails_from_pb(m, out, err);
}

/* The checks, in order; *why is set where a failure is not SC_MD_MALFORMED. */
static int verify(const struct sc_keyring *ring, const char *text, const char *self_id,
		  uint64_t now_unix_ms, struct sc_metadata *out, enum sc_md_reject *why,
		  struct sc_err *err)
{
	int rc = -1;
	uint8_t *env_bytes = NULL;
	size_t env_len = 0;
	pb_signed *s = NULL;
	pb_metadata *m = NULL;

	/* 1. size cap, before looking at anything else */
	if (!text || !*text)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "no metadata given: pass the producer's operation.metadata text");
	size_t len = strnlen(text, (size_t)SC_METADATA_MAX_TEXT + 1);
	if (len > SC_METADATA_MAX_TEXT)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "metadata text is longer than the %d byte cap: it is not metadata "
		    "from a sidecar",
		    SC_METADATA_MAX_TEXT);

	/* 2. prefix and base64url */
	if (len < PREFIX_LEN || memcmp(text, SC_METADATA_PREFIX, PREFIX_LEN) != 0) {
		if (len >= PREFIX_LEN && memcmp(text, "rsm", 3) == 0 && text[3] >= '0' &&
		    text[3] <= '9' && text[4] == '.') {
			*why = SC_MD_UNSUPPORTED_VERSION;
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "metadata format 'rsm%c' is not supported by this sidecar "
			    "(it reads rsm1): upgrade this sidecar",
			    text[3]);
		}
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata does not start with '" SC_METADATA_PREFIX
				  "': pass the producer's operation.metadata text unchanged");
	}
	if (!sc_base64url_decode(text + PREFIX_LEN, len - PREFIX_LEN, &env_bytes, &env_len))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "metadata is not valid base64url after '" SC_METADATA_PREFIX
				  "': it was truncated or altered on the way; pass it unchanged");

	/* 3. envelope */
	s = rdma_sidecar__v1__signed_metadata__unpack(NULL, env_len, env_bytes);
	if (!s) {
		sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "metadata envelope does not parse: it was truncated or altered on the way");
		goto out;
	}
	if (!sc_key_id_valid(s->key_id, strlen(s->key_id))) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "metadata envelope names no valid key id: it was altered on the way");
		goto out;
	}
	if (s->mac.len != SC_HMAC_LEN) {
		sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "metadata envelope has a %zu byte MAC, want %d: it was altered on the way",
		    s->mac.len, SC_HMAC_LEN);
		goto out;
	}

	/* 4. known key id, 5. MAC in constant time */
	uint8_t mac[SC_HMAC_LEN];
	if (!ring) {
		*why = SC_MD_NO_KEYS;
		sc_err_set(
		    err, SC_UNAUTHENTICATED,
		    "metadata signed with key id '%s' but this sidecar has no keys: start it "
		    "with --key-file holding that key",
		    s->key_id);
		goto out;
	}
	if (!metadata_mac(ring, s->key_id, s->payload.data, s->payload.len, mac)) {
		*why = SC_MD_UNKNOWN_KEY;
		sc_err_set(err, SC_UNAUTHENTICATED,
			   "metadata signed with unknown key id '%s': add it to --key-file on this "
			   "sidecar",
			   s->key_id);
		goto out;
	}
	if (CRYPTO_memcmp(mac, s->mac.data, SC_HMAC_LEN) != 0) {
		*why = SC_MD_BAD_SIGNATURE;
		sc_err_set(
		    err, SC_UNAUTHENTICATED,
		    "metadata signature does not verify with key '%s': the text was altered, "
		    "or key '%s' differs between the producer's and this sidecar's --key-file",
		    s->key_id, s->key_id);
		goto out;
	}

	/* 6. payload and version */
	m = rdma_sidecar__v1__rdma_metadata__unpack(NULL, s->payload.len, s->payload.data);
	if (!m) {
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "signed metadata payload does not parse: the producer's sidecar is "
			   "incompatible with this one");
		goto out;
	}
	if (m->version < 1 || m->version > SC_METADATA_VERSION) {
		*why = SC_MD_UNSUPPORTED_VERSION;
		sc_err_set(err, SC_INVALID_ARGUMENT,
			   "metadata version %u is not supported (this sidecar reads versions 1 to "
			   "%d): run the same sidecar version on both ends",
			   m->version, SC_METADATA_VERSION);
		goto out;
	}

	/* 7. expiry */
	if (m->expires_unix_ms == 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "metadata has no expiry time");
		goto out;
	}
	if (now_unix_ms > m->expires_unix_ms &&
	    now_unix_ms - m->expires_unix_ms > SC_METADATA_SKEW_MS) {
		*why = SC_MD_EXPIRED;
		sc_err_set(err, SC_FAILED_PRECONDITION,
			   "metadata expired %.1f s ago (issued by %.128s): ask the producer for "
			   "fresh metadata",
			   (double)(now_unix_ms - m->expires_unix_ms) / 1000.0, m->issuer);
		goto out;
	}

	/* 8. audience */
	if (m->audience[0] && (!self_id || strcmp(m->audience, self_id) != 0)) {
		*why = SC_MD_WRONG_AUDIENCE;
		sc_err_set(err, SC_PERMISSION_DENIED,
			   "metadata is for sidecar '%.128s' but this is '%.128s': use it on the "
			   "sidecar it was issued for",
			   m->audience, self_id ? self_id : "");
		goto out;
	}

	/* 9. descriptor sanity and the struct's limits */
	struct sc_metadata md;
	if (metadata_from_pb(m, s->key_id, &md, err) < 0) {
		sc_metadata_free(&md);
		goto out;
	}
	if (out)
		*out = md;
	else
		sc_metadata_free(&md);
	rc = 0;
out:
	if (m)
		rdma_sidecar__v1__rdma_metadata__free_unpacked(m, NULL);
	if (s)
		rdma_sidecar__v1__signed_metadata__free_unpacked(s, NULL);
	free(env_bytes);
	return rc;
}

bool sc_metadata_peek_key_id(const char *text, char out[SC_KEY_ID_MAX])
{
	out[0] = '\0';
	size_t len = text ? strnlen(text, SC_METADATA_MAX_TEXT + 1) : 0;
	if (len < PREFIX_LEN || len > SC_METADATA_MAX_TEXT ||
	    memcmp(text, SC_METADATA_PREFIX, PREFIX_LEN) != 0)
		return false;
	uint8_t *env_bytes = NULL;
	size_t env_len = 0;
	if (!sc_base64url_decode(text + PREFIX_LEN, len - PREFIX_LEN, &env_bytes, &env_len))
		return false;
	RdmaSidecar__V1__SignedMetadata *s =
	    rdma_sidecar__v1__signed_metadata__unpack(NULL, env_len, env_bytes);
	bool ok = s && s->key_id && sc_key_id_valid(s->key_id, strlen(s->key_id)) &&
		  strlen(s->key_id) < SC_KEY_ID_MAX;
	if (ok)
		memcpy(out, s->key_id, strlen(s->key_id) + 1);
	if (s)
		rdma_sidecar__v1__signed_metadata__free_unpacked(s, NULL);
	free(env_bytes);
	return ok;
}

int sc_metadata_verify_why(const struct sc_keyring *ring, const char *text, const char *self_id,
			   uint64_t now_unix_ms, struct sc_metadata *out, enum sc_md_reject *why,
			   struct sc_err *err)
{
	enum sc_md_reject r = SC_MD_MALFORMED;
	int rc = verify(ring, text, self_id, now_unix_ms, out, &r, err);
	if (why)
		*why = rc == 0 ? SC_MD_ACCEPTED : r;
	return rc;
}

int sc_metadata_verify(const struct sc_keyring *ring, const char *text, const char *self_id,
		       uint64_t now_unix_ms, struct sc_metadata *out, struct sc_err *err)
{
	return sc_metadata_verify_why(ring, text, self_id, now_unix_ms, out, NULL, err);
}

const char *sc_md_reject_name(enum sc_md_reject r)
{
	static const char *const names[SC_MD_NUM_REJECT] = {
	    [SC_MD_ACCEPTED] = "accepted",
	    [SC_MD_MALFORMED] = "malformed",
	    [SC_MD_UNSUPPORTED_VERSION] = "unsupported_version",
	    [SC_MD_NO_KEYS] = "no_keys",
	    [SC_MD_UNKNOWN_KEY] = "unknown_key",
	    [SC_MD_BAD_SIGNATURE] = "bad_signature",
	    [SC_MD_EXPIRED] = "expired",
	    [SC_MD_WRONG_AUDIENCE] = "wrong_audience",
	    [SC_MD_WRONG_KIND] = "wrong_kind",
	};
	return (int)r >= 0 && r < SC_MD_NUM_REJECT ? names[r] : "unknown";
}

void sc_metadata_free(struct sc_metadata *md)
{
	if (!md)
		return;
	free(md->descs);
	md->descs = NULL;
	md->n_descs = 0;
	free(md->ib_rkeys);
	md->ib_rkeys = NULL;
	free(md->ofi.keys);
	md->ofi.keys = NULL;
	free(md->ofi.rail_keys);
	md->ofi.rail_keys = NULL;
	md->ofi.n_keys = 0;
	md->n_ib_rails = 0;
	md->n_ib_groups = 0;
}

struct rkey_at {
	uint32_t rkey;
	size_t at;
};

static int rkey_at_cmp(const void *pa, const void *pb)
{
	const struct rkey_at *a = pa, *b = pb;
	if (a->rkey != b->rkey)
		return a->rkey < b->rkey ? -1 : 1;
	return a->at < b->at ? -1 : a->at > b->at;
}

static int at_cmp(const void *pa, const void *pb)
{
	const struct rkey_at *a = pa, *b = pb;
	return a->at < b->at ? -1 : a->at > b->at;
}

size_t sc_metadata_rkey_groups(const struct sc_meta_desc *descs, size_t n, uint32_t *out)
{
	/* Runs of one rkey are the common case (a window per region): collapse them first. */
	struct rkey_at *v = malloc((n ? n : 1) * sizeof(*v));
	if (!v)
		return (size_t)-1;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (i == 0 || descs[i].rkey != descs[i - 1].rkey)
			v[k++] = (struct rkey_at){descs[i].rkey, i};
	qsort(v, k, sizeof(*v), rkey_at_cmp);
	size_t u = 0;
	for (size_t i = 0; i < k; i++)
		if (i == 0 || v[i].rkey != v[i - 1].rkey)
			v[u++] = v[i]; /* the first appearance of each rkey */
	qsort(v, u, sizeof(*v), at_cmp);
	if (out)
		for (size_t i = 0; i < u; i++)
			out[i] = v[i].rkey;
	free(v);
	return u;
}

int sc_random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		int chunk = len > INT_MAX ? INT_MAX : (int)len;
		if (RAND_bytes(p, chunk) != 1)
			return -1;
		p += chunk;
		len -= (size_t)chunk;
	}
	return 0;
}
