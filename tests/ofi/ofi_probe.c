/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ofi/ofi_probe.c: a peer that holds a passive operation's metadata and uses its libfabric
 * key directly, with no OPEN on the control channel: what a peer that kept an old key could try.
 * test_ofi_revocation.py runs it while the operation is live (the key works: the bytes come back)
 * and after the operation ended (complete, cancel, deadline, release, forced deregistration: the
 * provider must refuse the key). One RMA of --len bytes at --offset of descriptor --desc.
 *
 *   ofi-probe --key-file F --metadata-file M --provider P --domain D --op read|write
 *             [--desc I] [--offset O] [--len N] [--fill BYTE] [--timeout-ms T]
 *
 * Prints "OK <hex of the bytes read>" (read) or "OK" (write) and exits 0; "REFUSED <fi_strerror>:
 * <fi_cq_strerror>" and exits 3 when the completion is an error; "TIMEOUT" and exits 4 when no
 * completion comes within --timeout-ms; exits 2 on a usage or set-up error. Single-threaded.
 */
#include "meta/keys.h"
#include "meta/metadata.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[SC_METADATA_MAX_TEXT + 1];
	size_t n = fread(buf, 1, SC_METADATA_MAX_TEXT, f);
	fclose(f);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		n--;
	buf[n] = 0;
	return buf;
}

#define DIE(...)                                                                                   \
	do {                                                                                       \
		fprintf(stderr, "ofi-probe: " __VA_ARGS__);                                        \
		fputc('\n', stderr);                                                               \
		return 2;                                                                          \
	} while (0)

int main(int argc, char **argv)
{
	const char *key_file = NULL, *md_file = NULL, *prov = NULL, *dom = NULL, *op = "read";
	unsigned long desc = 0, fill = 0x5a;
	unsigned long long offset = 0, len = 16, timeout = 3000;
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--key-file"))
			key_file = v;
		else if (!strcmp(k, "--metadata-file"))
			md_file = v;
		else if (!strcmp(k, "--provider"))
			prov = v;
		else if (!strcmp(k, "--domain"))
			dom = v;
		else if (!strcmp(k, "--op"))
			op = v;
		else if (!strcmp(k, "--desc"))
			desc = strtoul(v, NULL, 0);
		else if (!strcmp(k, "--offset"))
			offset = strtoull(v, NULL, 0);
		else if (!strcmp(k, "--len"))
			len = strtoull(v, NULL, 0);
		else if (!strcmp(k, "--fill"))
			fill = strtoul(v, NULL, 0);
		else if (!strcmp(k, "--timeout-ms"))
			timeout = strtoull(v, NULL, 0);
		else
			DIE("unknown option %s", k);
	}
	if (!key_file || !md_file || !prov || !dom)
		DIE("usage: --key-file F --metadata-file M --provider P --domain D [--op "
		    "read|write] "
		    "[--desc I] [--offset O] [--len N] [--fill B] [--timeout-ms T]");
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_keyring *ring = NULL;
	if (sc_keyring_load(key_file, &ring, &err) != 0)
		DIE("%s", err.msg);
	const char *text = slurp(md_file);
	if (!text)
		DIE("cannot read %s", md_file);
	struct sc_metadata md;
	/* Verified as it was issued: the clock of its issue, so an expired one still parses. */
	if (sc_metadata_verify(ring, text, "ofi-probe", 0, &md, &err) != 0)
		DIE("metadata: %s", err.msg);
	if (!md.ofi.present || md.ofi.n_keys == 0)
		DIE("the metadata carries no libfabric keys");
	if (desc >= md.n_descs || offset + len > md.descs[desc].length)
		DIE("descriptor %lu has %llu bytes", desc,
		    desc < md.n_descs ? (unsigned long long)md.descs[desc].length : 0ULL);

	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->caps = FI_RMA | FI_READ | FI_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode =
	    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT;
	hints->fabric_attr->prov_name = strdup(prov);
	hints->domain_attr->name = strdup(dom);
	int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	if (rc)
		DIE("fi_getinfo(%s, %s): %s", prov, dom, fi_strerror(-rc));
	struct fid_fabric *fab;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fi_cq_attr cqa = {
	    .format = FI_CQ_FORMAT_CONTEXT, .size = 16, .wait_obj = FI_WAIT_NONE};
	struct fi_av_attr ava = {.type = FI_AV_TABLE, .count = 4};
	if ((rc = fi_fabric(info->fabric_attr, &fab, NULL)) ||
	    (rc = fi_domain(fab, info, &domain, NULL)) ||
	    (rc = fi_cq_open(domain, &cqa, &cq, NULL)) ||
	    (rc = fi_av_open(domain, &ava, &av, NULL)) ||
	    (rc = fi_endpoint(domain, info, &ep, NULL)) || (rc = fi_ep_bind(ep, &av->fid, 0)) ||
	    (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) || (rc = fi_enable(ep)))
		DIE("opening %s on %s: %s", prov, dom, fi_strerror(-rc));
	fi_addr_t peer;
	if (fi_av_insert(av, md.ofi.addr[0], 1, &peer, 0, NULL) != 1)
		DIE("fi_av_insert failed");
	uint8_t *buf = malloc(len ? len : 1);
	memset(buf, (int)fill, len);
	struct fid_mr *mr = NULL;
	void *ldesc = NULL;
	if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
		if ((rc = fi_mr_reg(domain, buf, len, FI_READ | FI_WRITE, 0, 1, 0, &mr, NULL)))
			DIE("fi_mr_reg: %s", fi_strerror(-rc));
		ldesc = fi_mr_desc(mr);
	}
	uint64_t va = md.descs[desc].remote_addr + offset, key = 0, addr = 0;
	size_t k = 0;
	for (; k < md.ofi.n_keys; k++)
		if (va >= md.ofi.keys[k].base && va - md.ofi.keys[k].base < md.ofi.keys[k].length)
			break;
	if (k == md.ofi.n_keys)
		DIE("no key covers descriptor %lu", desc);
	key = md.ofi.keys[k].key;
	addr = md.ofi.virt_addr ? va : va - md.ofi.keys[k].base;
	struct fi_context2 ctx;
	bool is_read = strcmp(op, "read") == 0;
	long long until = now_ms() + (long long)timeout;
	for (;;) {
		/* A write completes once the peer placed it (or refused it): FI_DELIVERY_COMPLETE.
		 */
		struct iovec iov = {.iov_base = buf, .iov_len = len};
		struct fi_rma_iov rma = {.addr = addr, .len = len, .key = key};
		struct fi_msg_rma msg = {.msg_iov = &iov,
					 .desc = &ldesc,
					 .iov_count = 1,
					 .addr = peer,
					 .rma_iov = &rma,
					 .rma_iov_count = 1,
					 .context = &ctx};
		ssize_t r = is_read ? fi_read(ep, buf, len, ldesc, peer, addr, key, &ctx)
				    : fi_writemsg(ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
		if (r == 0)
			break;
		if (r != -FI_EAGAIN)
			DIE("posting: %s", fi_strerror((int)-r));
		struct fi_cq_entry e;
		fi_cq_read(cq, &e, 1);
		if (now_ms() > until) {
			printf("TIMEOUT\n");
			return 4;
		}
	}
	int status = 4;
	while (now_ms() < until) {
		struct fi_cq_entry e;
		ssize_t n = fi_cq_read(cq, &e, 1);
		if (n == 1) {
			printf("OK");
			if (is_read) {
				printf(" ");
				for (unsigned long long i = 0; i < len; i++)
					printf("%02x", buf[i]);
			}
			printf("\n");
			status = 0;
			break;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof(ee));
			fi_cq_readerr(cq, &ee, 0);
			char txt[256];
			const char *t =
			    fi_cq_strerror(cq, ee.prov_errno, ee.err_data, txt, sizeof(txt));
			printf("REFUSED %s: %s\n", fi_strerror(ee.err), t ? t : "");
			status = 3;
			break;
		}
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	if (status == 4)
		printf("TIMEOUT\n");
	fflush(stdout);
	/* The libfabric objects go with the process (an RMA may still be outstanding). */
	_exit(status);
}
