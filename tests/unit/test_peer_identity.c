/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_peer_identity.c: which name in a certificate is a sidecar id (sc_tls_cert_identity,
 * peer/tls.c) under --peer-identity spiffe, dns, cn and off. Certificates are built in memory
 * with OpenSSL's X509 API (unsigned: only their names are read). Single-threaded.
 */
#include "check.h"
#include "conf/config.h"
#include "peer/tls.h"

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

/* A certificate with subject CN cn (NULL: none) and subjectAltName san (NULL: none), e.g.
 * "URI:spiffe://td/a/B,DNS:localhost". */
static X509 *make_cert(const char *cn, const char *san)
{
	X509 *x = X509_new();
	if (!x)
		return NULL;
	X509_set_version(x, 2);
	if (cn)
		X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
					   (const unsigned char *)cn, -1, -1, 0);
	if (san) {
		X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, NULL, NID_subject_alt_name, san);
		if (!ext || X509_add_ext(x, ext, -1) != 1) {
			X509_EXTENSION_free(ext);
			X509_free(x);
			return NULL;
		}
		X509_EXTENSION_free(ext);
	}
	return x;
}

/* sc_tls_cert_identity on a fresh certificate: its result, and out/td/why. */
static int identity(const char *cn, const char *san, enum sc_peer_identity source, const char *want,
		    char out[SC_NAME_MAX], char td[SC_TLS_TRUST_DOMAIN_MAX], char why[200])
{
	X509 *x = make_cert(cn, san);
	if (!x)
		return -2;
	int rc = sc_tls_cert_identity(x, source, want, out, td, why, 200);
	X509_free(x);
	return rc;
}

TEST(spiffe_last_segment_and_trust_domain)
{
	char out[SC_NAME_MAX], td[SC_TLS_TRUST_DOMAIN_MAX], why[200];
	CHECK_INT_EQ(identity("x", "URI:spiffe://test.example/ns/default/sidecar/A",
			      SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why),
		     1);
	CHECK_STR_EQ(out, "A");
	CHECK_STR_EQ(td, "test.example");
	/* one segment, ids with . _ - */
	CHECK_INT_EQ(identity(NULL, "URI:spiffe://td/pod-7.a_b", SC_PEER_IDENTITY_SPIFFE, NULL, out,
			      td, why),
		     1);
	CHECK_STR_EQ(out, "pod-7.a_b");
	CHECK_STR_EQ(td, "td");
	/* other URIs are skipped; the SPIFFE one counts wherever it is */
	CHECK_INT_EQ(identity(NULL, "URI:https://example.com/x/Z,DNS:B,URI:spiffe://td/w/M",
			      SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why),
		     1);
	CHECK_STR_EQ(out, "M");
}

TEST(spiffe_without_an_id)
{
	char out[SC_NAME_MAX], td[SC_TLS_TRUST_DOMAIN_MAX], why[200];
	static const char *const bad[] = {
	    "URI:spiffe://td/ns/default/",   /* empty last segment */
	    "URI:spiffe://td",		     /* no path */
	    "URI:spiffe:///A",		     /* no trust domain */
	    "URI:spiffe://td/a/B?x=1",	     /* query */
	    "URI:spiffe://td/a/B#f",	     /* fragment */
	    "URI:spiffe://TD/a/B",	     /* trust domains are lower case */
	    "URI:spiffe://td/a/has%20space", /* not a sidecar id */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_INT_EQ(identity("A", bad[i], SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why), 0);
		CHECK_STR_EQ(out, "");
		CHECK_STR_CONTAINS(why, "does not end in a sidecar id");
	}
	/* 101 characters: longer than any sidecar id */
	char uri[200];
	snprintf(uri, sizeof(uri), "URI:spiffe://td/a/%0101d", 0);
	CHECK_INT_EQ(identity(NULL, uri, SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why), 0);
	/* no SPIFFE ID at all: the CN and DNS names do not count */
	CHECK_INT_EQ(
	    identity("A", "DNS:A,URI:https://x/A", SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why), 0);
	CHECK_STR_CONTAINS(why, "it has no SPIFFE ID");
	CHECK_INT_EQ(identity("A", NULL, SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why), 0);
}

TEST(dns_names)
{
	char out[SC_NAME_MAX], td[SC_TLS_TRUST_DOMAIN_MAX], why[200];
	/* the one equal to the id looked for, any of them */
	CHECK_INT_EQ(identity("x", "DNS:localhost,DNS:B,IP:127.0.0.1", SC_PEER_IDENTITY_DNS, "B",
			      out, td, why),
		     1);
	CHECK_STR_EQ(out, "B");
	/* none equal: the first that is a sidecar id (so a mismatch names it) */
	CHECK_INT_EQ(
	    identity("x", "DNS:*.example.com,DNS:M,DNS:N", SC_PEER_IDENTITY_DNS, "B", out, td, why),
	    1);
	CHECK_STR_EQ(out, "M");
	CHECK_INT_EQ(identity("x", "DNS:*.example.com", SC_PEER_IDENTITY_DNS, "B", out, td, why),
		     0);
	CHECK_STR_CONTAINS(why, "none of its DNS names is a sidecar id");
	CHECK_INT_EQ(identity("B", "URI:spiffe://td/B", SC_PEER_IDENTITY_DNS, "B", out, td, why),
		     0);
	CHECK_STR_CONTAINS(why, "no DNS subject alternative name");
}

TEST(common_name)
{
	char out[SC_NAME_MAX], td[SC_TLS_TRUST_DOMAIN_MAX], why[200];
	CHECK_INT_EQ(identity("sidecar-7", "DNS:other", SC_PEER_IDENTITY_CN, NULL, out, td, why),
		     1);
	CHECK_STR_EQ(out, "sidecar-7");
	CHECK_INT_EQ(identity("has space", NULL, SC_PEER_IDENTITY_CN, NULL, out, td, why), 0);
	CHECK_STR_CONTAINS(why, "is not a sidecar id");
	CHECK_INT_EQ(identity(NULL, "DNS:A", SC_PEER_IDENTITY_CN, NULL, out, td, why), 0);
	CHECK_STR_CONTAINS(why, "no CN");
}

TEST(off_and_no_certificate)
{
	char out[SC_NAME_MAX], td[SC_TLS_TRUST_DOMAIN_MAX], why[200];
	CHECK_INT_EQ(identity("A", "URI:spiffe://td/A", SC_PEER_IDENTITY_OFF, NULL, out, td, why),
		     0);
	CHECK_STR_EQ(out, "");
	CHECK_INT_EQ(
	    sc_tls_cert_identity(NULL, SC_PEER_IDENTITY_SPIFFE, NULL, out, td, why, sizeof(why)),
	    0);
	CHECK_STR_EQ(why, "no certificate");
}

RUN_TESTS(T(spiffe_last_segment_and_trust_domain), T(spiffe_without_an_id), T(dns_names),
	  T(common_name), T(off_and_no_certificate))
