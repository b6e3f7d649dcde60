/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/ofi_rma_baseline.c: the provider's own RMA speed, for bench/ofi_bench.py to hold the
 * sidecar's libfabric backend against (fabtests' fi_rma_bw is not packaged in Debian bookworm).
 * One process, two endpoints of the same provider and domain (the "target" registers a buffer
 * with FI_REMOTE_READ | FI_REMOTE_WRITE, the "initiator" reaches it through its address vector),
 * raw fi_read / fi_write (writes with FI_DELIVERY_COMPLETE, as the sidecar's), one operation of
 * SIZE bytes at a time, ITERS times, each timed from post to completion. A progress thread polls
 * the target's CQ (providers with manual progress serve RMA only from there).
 *
 *   ofi-rma-baseline PROVIDER DOMAIN read|write SIZE ITERS
 *
 * Prints one line: "size=N op=read iters=N gbps=X p50_us=X p99_us=X" (GB/s = 1e9 bytes/s, over
 * the sum of the operations' times). Build: cc -O2 -o ofi-rma-baseline ofi_rma_baseline.c
 * $(pkg-config --cflags --libs libfabric) -lpthread (bench/ofi_bench.py does it).
 */
#include <poll.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		int rc_ = (int)(call);                                                             \
		if (rc_) {                                                                         \
			fprintf(stderr, "%s: %s\n", #call, fi_strerror(-rc_));                     \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)

struct side {
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
};

static atomic_bool stop;
static struct side target;

static struct fid_fabric *fab;

static void open_side(struct fid_domain *dom, struct fi_info *info, struct side *s, bool waits)
{
	struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT,
				 .size = 64,
				 .wait_obj = waits ? FI_WAIT_FD : FI_WAIT_NONE};
	struct fi_av_attr ava = {.type = FI_AV_TABLE, .count = 4};
	CHECK(fi_cq_open(dom, &cqa, &s->cq, NULL));
	CHECK(fi_av_open(dom, &ava, &s->av, NULL));
	CHECK(fi_endpoint(dom, info, &s->ep, NULL));
	CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_enable(s->ep));
}

/* The target's progress (manual-progress providers serve RMA only from here): sleeping in poll()
 * on the CQ's wait fd while the provider says nothing is pending, as the sidecar does, so the
 * baseline does not spin two threads on a small machine. */
static void *progress(void *arg)
{
	(void)arg;
	struct fi_cq_entry e;
	int fd = -1;
	if (fi_control(&target.cq->fid, FI_GETWAIT, &fd) != 0)
		fd = -1;
	while (!atomic_load(&stop)) {
		if (fi_cq_read(target.cq, &e, 1) > 0 || fd < 0)
			continue;
		struct fid *f = &target.cq->fid;
		if (fi_trywait(fab, &f, 1) == FI_SUCCESS) {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			poll(&p, 1, 10);
		}
	}
	return NULL;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s PROVIDER DOMAIN read|write SIZE ITERS\n", argv[0]);
		return 2;
	}
	size_t size = strtoull(argv[4], NULL, 0);
	int iters = atoi(argv[5]);
	int is_read = strcmp(argv[3], "read") == 0;
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode =
	    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->fabric_attr->prov_name = strdup(argv[1]);
	hints->domain_attr->name = strdup(argv[2]);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	struct fid_domain *dom;
	CHECK(fi_fabric(info->fabric_attr, &fab, NULL));
	CHECK(fi_domain(fab, info, &dom, NULL));
	struct side init;
	open_side(dom, info, &target, true);
	open_side(dom, info, &init, false);
	char addr[64];
	size_t alen = sizeof(addr);
	CHECK(fi_getname(&target.ep->fid, addr, &alen));
	fi_addr_t peer;
	if (fi_av_insert(init.av, addr, 1, &peer, 0, NULL) != 1)
		return 2;
	char *rbuf = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
	char *lbuf = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
	memset(rbuf, 1, size);
	memset(lbuf, 2, size);
	struct fid_mr *rmr, *lmr;
	CHECK(fi_mr_reg(dom, rbuf, size, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 7, 0, &rmr, NULL));
	CHECK(fi_mr_reg(dom, lbuf, size, FI_READ | FI_WRITE, 0, 8, 0, &lmr, NULL));
	if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		CHECK(fi_mr_bind(rmr, &target.ep->fid, 0));
		CHECK(fi_mr_enable(rmr));
		CHECK(fi_mr_bind(lmr, &init.ep->fid, 0));
		CHECK(fi_mr_enable(lmr));
	}
	uint64_t key = fi_mr_key(rmr);
	uint64_t raddr =
	    info->domain_attr->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)rbuf : 0;
	void *desc = fi_mr_desc(lmr);
	pthread_t th;
	pthread_create(&th, NULL, progress, NULL);
	double *lat = calloc((size_t)iters, sizeof(double));
	struct fi_context2 ctx;
	for (int i = -1; i < iters; i++) { /* -1: a warm-up (connection set-up) */
		double t0 = now_us();
		struct iovec iov = {.iov_base = lbuf, .iov_len = size};
		struct fi_rma_iov rma = {.addr = raddr, .len = size, .key = key};
		struct fi_msg_rma msg = {.msg_iov = &iov,
					 .desc = &desc,
					 .iov_count = 1,
					 .addr = peer,
					 .rma_iov = &rma,
					 .rma_iov_count = 1,
					 .context = &ctx};
		ssize_t rc;
		do {
			rc = is_read
				 ? fi_readmsg(init.ep, &msg, FI_COMPLETION)
				 : fi_writemsg(init.ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
			if (rc == -FI_EAGAIN) {
				struct fi_cq_entry e;
				fi_cq_read(init.cq, &e, 0);
			}
		} while (rc == -FI_EAGAIN);
		CHECK(rc);
		for (;;) {
			struct fi_cq_entry e;
			ssize_t n = fi_cq_read(init.cq, &e, 1);
			if (n == 1)
				break;
			if (n == -FI_EAVAIL) {
				struct fi_cq_err_entry ee = {0};
				fi_cq_readerr(init.cq, &ee, 0);
				fprintf(stderr, "completion error: %s\n", fi_strerror(ee.err));
				return 3;
			}
		}
		if (i >= 0)
			lat[i] = now_us() - t0;
	}
	atomic_store(&stop, true);
	pthread_join(th, NULL);
	double sum = 0;
	for (int i = 0; i < iters; i++)
		sum += lat[i];
	qsort(lat, (size_t)iters, sizeof(double), cmp);
	printf("size=%zu op=%s iters=%d gbps=%.3f p50_us=%.1f p99_us=%.1f\n", size, argv[3], iters,
	       (double)size * iters / (sum * 1e3), lat[iters / 2], lat[(int)((iters - 1) * 0.99)]);
	return 0;
}
