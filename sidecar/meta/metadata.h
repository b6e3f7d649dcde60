/* SPDX-License-Identifier: Apache-2.0 */
/*
 * meta/metadata.h: the signed RDMA metadata that a passive operation hands out ("rsm1." text).
 *
 * text    = "rsm1." + base64url_nopad(SignedMetadata{key_id, payload, mac})
 * payload = serialized RdmaMetadata (proto/rdma_sidecar/v1/sidecar.proto)
 * mac     = HMAC-SHA256(key[key_id], "rsm1" 0x00 key_id 0x00 payload)
 *
 * Verification, in this order, each failure with its own code and message: size cap, "rsm1."
 * prefix and base64url (INVALID_ARGUMENT), envelope parse (INVALID_ARGUMENT), known key id
 * (UNAUTHENTICATED), constant-time MAC check (UNAUTHENTICATED), payload parse and version
 * (INVALID_ARGUMENT), expiry with SC_METADATA_SKEW_MS allowance (FAILED_PRECONDITION), audience
 * (PERMISSION_DENIED), descriptor sanity (INVALID_ARGUMENT: count 1..SC_METADATA_MAX_DESCS, every
 * length > 0, sum without overflow, token 16 bytes, kind READABLE or WRITABLE).
 * Pure functions over their arguments; any thread.
 */
#ifndef SC_METADATA_H
#define SC_METADATA_H

#include "base/base64.h"
#include "conf/config.h" /* SC_BACKEND_BIT_* */
#include "meta/keys.h"
#include "meta/desc.h"
#include "base/types.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Written: 2 (descriptors as runs); read: 1 and 2. md->version 1 writes the plain form. */
#define SC_METADATA_VERSION 2
#define SC_METADATA_PREFIX "rsm1."
#define SC_METADATA_MAX_TEXT (256 * 1024)
#define SC_METADATA_MAX_DESCS 1048576 /* = SC_MAX_DESCRIPTORS */
#define SC_METADATA_SKEW_MS 5000
/* RdmaMetadata.peer_features: the issuer reads OPEN frames with extensions (peer/proto.h). */
#define SC_MD_FEATURE_OPEN_EXT 0x1u
#define SC_TOKEN_LEN 16
#define SC_MAX_ENDPOINTS 4
_Static_assert(SC_MAX_ENDPOINTS == SC_CONFIG_MAX_DATA_ENDPOINTS, "--data-listen fits the metadata");

struct sc_ib_endpoint {
	bool present;
	uint8_t gid[16];
	uint32_t lid;
	uint32_t port;
	uint32_t mtu;
	char device[64];
};

/* One more ibverbs rail of the issuer (IbverbsRail): its number (1..SC_MAX_IB_RAILS-1) and
 * endpoint; its rkeys are in sc_metadata.ib_rkeys. */
#define SC_MAX_IB_RAILS 16
struct sc_ib_rail {
	uint32_t index;
	struct sc_ib_endpoint ep;
};

/* The issuer's libfabric part (OfiEndpoint): its provider, one fabric address per rail, and the
 * keys of this operation's exposed ranges (rail 0's in keys; rail j >= 1's key k is
 * rail_keys[(j - 1) * n_keys + k]). keys and rail_keys are owned (sc_metadata_free). */
#define SC_MAX_OFI_RAILS 16
#define SC_OFI_ADDR_MAX 64
#define SC_OFI_MAX_KEYS 65536
struct sc_ofi_key {
	uint64_t key, base, length;
};
struct sc_ofi_endpoint {
	bool present;
	char provider[64];
	uint8_t addr[SC_MAX_OFI_RAILS][SC_OFI_ADDR_MAX];
	uint32_t addr_len[SC_MAX_OFI_RAILS];
	size_t n_addrs;
	bool virt_addr;
	struct sc_ofi_key *keys;
	size_t n_keys;
	uint64_t *rail_keys; /* (n_addrs - 1) * n_keys, or NULL */
};

struct sc_metadata {
	uint32_t version;
	char issuer[SC_NAME_MAX];
	char audience[SC_NAME_MAX];
	enum sc_op_kind kind; /* SC_OP_READABLE or SC_OP_WRITABLE */
	uint8_t token[SC_TOKEN_LEN];
	char endpoints[SC_MAX_ENDPOINTS][80];
	size_t n_endpoints;
	unsigned backends; /* SC_BACKEND_BIT_* the issuer can serve with */
	struct sc_ib_endpoint ib;
	/* The issuer's other ibverbs rails. Rail ib_rails[j]'s rkey for group g (the g-th distinct
	 * rkey of the descriptors, in order of first appearance) is ib_rkeys[j * n_ib_groups + g].
	 * ib_rkeys is owned (freed by sc_metadata_free). */
	struct sc_ib_rail ib_rails[SC_MAX_IB_RAILS - 1];
	size_t n_ib_rails;
	uint32_t *ib_rkeys;
	size_t n_ib_groups;
	struct sc_ofi_endpoint ofi; /* libfabric; ofi.present when offered */
	struct sc_meta_desc *descs; /* owned */
	size_t n_descs;
	uint64_t issued_unix_ms;
	uint64_t expires_unix_ms;
	uint8_t nonce[SC_TOKEN_LEN];
	uint32_t max_uses;
	uint32_t peer_features;     /* SC_MD_FEATURE_* the issuer's peer server reads */
	char key_id[SC_KEY_ID_MAX]; /* filled by verify: which key signed it */
};

/* Sign with the ring's signing key. *text is malloc'd. FAILED_PRECONDITION without a key. */
int sc_metadata_sign(const struct sc_keyring *ring, const struct sc_metadata *md, char **text,
		     struct sc_err *err);
/*
 * Verify `text` and fill *out (sc_metadata_free it on success; untouched on failure).
 * self_id: this sidecar's id, checked against a non-empty audience. now_unix_ms: the clock.
 */
int sc_metadata_verify(const struct sc_keyring *ring, const char *text, const char *self_id,
		       uint64_t now_unix_ms, struct sc_metadata *out, struct sc_err *err);
/* Why verification refused metadata, for rdma_sidecar_metadata_rejected_total{reason}. */
enum sc_md_reject {
	SC_MD_ACCEPTED = 0,
	SC_MD_MALFORMED,	    /* empty, too long, not rsm1./base64url, envelope or payload */
	SC_MD_UNSUPPORTED_VERSION, /* rsmN with N != 1, or a payload version it does not read */
	SC_MD_NO_KEYS,		    /* signed, but this sidecar has no --key-file */
	SC_MD_UNKNOWN_KEY,	    /* signed with a key id this sidecar does not hold */
	SC_MD_BAD_SIGNATURE,	    /* the MAC does not verify */
	SC_MD_EXPIRED,
	SC_MD_WRONG_AUDIENCE, /* issued for another sidecar */
	SC_MD_WRONG_KIND,     /* verified, but readable metadata to BeginWrite or the reverse */
	SC_MD_NUM_REJECT
};
const char *sc_md_reject_name(enum sc_md_reject r);
/* sc_metadata_verify, telling *why (SC_MD_ACCEPTED on success; why may be NULL). */
int sc_metadata_verify_why(const struct sc_keyring *ring, const char *text, const char *self_id,
			   uint64_t now_unix_ms, struct sc_metadata *out, enum sc_md_reject *why,
			   struct sc_err *err);
void sc_metadata_free(struct sc_metadata *md);
/* The key id the envelope of `text` names, unverified (for a log line about refused metadata):
 * true with out filled when it parses and the id is a valid key id; else false, out "". */
bool sc_metadata_peek_key_id(const char *text, char out[SC_KEY_ID_MAX]);
/* The distinct rkeys of descs in order of first appearance into out[] (NULL: count only); returns
 * how many. (size_t)-1 when out of memory. */
size_t sc_metadata_rkey_groups(const struct sc_meta_desc *descs, size_t n, uint32_t *out);


/* Fill buf with cryptographically random bytes (OpenSSL RAND_bytes). Returns 0 or -1. */
int sc_random_bytes(void *buf, size_t len);

#endif
