/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_gpu_dmabuf.c: sidecar/gpu/gpu.c's dma-buf export on the stand-in driver (tests/fake_cuda, NOT a
 * GPU) with FAKE_CUDA_DMA_BUF=1, whose cuMemGetHandleForAddressRange enforces the driver's rules
 * (host-page-aligned address and size inside one allocation). The sidecar must export the
 * page-rounded range that covers what is registered, not the whole block, and hand back the
 * registered bytes' offset inside it (the offset ibv_reg_dmabuf_mr gets). Skipped (77) when the
 * stand-in was not built beside this test (no cuda.h at build time).
 */
#include "build_config.h"
#include "check.h"
#include "gpu/gpu.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

static struct sc_gpu *g;
static uint64_t pg;

struct want {
	uint64_t at, len; /* the registered range, from the block's base */
	uint64_t offset, size;
};

TEST(page_rounded_ranges_and_offsets)
{
	struct sc_gpu_mem m;
	uint8_t h[SC_GPU_IPC_HANDLE_LEN];
	struct sc_err err;
	sc_err_clear(&err);
	CHECK(sc_gpu_alloc(g, 0, 3u << 20, &m, h, &err) == 0);
	const struct want cases[] = {
		{5000, 10000, 5000 - pg, ((5000 + 10000 + pg - 1) / pg - 1) * pg}, /* odd, odd */
		{2u << 20, 1u << 20, 0, 1u << 20},				     /* aligned */
		{0, 1, 0, pg},							     /* one byte */
		{(3u << 20) - 100, 100, pg - 100, pg},				     /* the end */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct want *w = &cases[i];
		int fd = -1;
		uint64_t off = 99;
		CHECK(sc_gpu_dmabuf(g, 0, m.addr + w->at, w->len, &fd, &off, &err) == 0);
		CHECK(fd >= 0);
		struct stat st;
		CHECK(fstat(fd, &st) == 0);
		char link[64], target[PATH_MAX] = "";
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		CHECK(readlink(link, target, sizeof(target) - 1) > 0);
		close(fd);
		CHECK_STR_CONTAINS(target, "sc-fakecuda-dmabuf-dev0");
		CHECK_U64_EQ(off, w->offset);
		CHECK_U64_EQ((uint64_t)st.st_size, w->size);
	}
	/* Past the allocation: refused before the driver is asked. */
	int fd = -1;
	uint64_t off = 0;
	CHECK(sc_gpu_dmabuf(g, 0, m.addr + (4u << 20) - 10, 100, &fd, &off, &err) != 0);
	CHECK_STR_CONTAINS(err.msg, "crosses its allocation's end");
	sc_gpu_release(g, &m);
}

int main(void)
{
	char self[PATH_MAX], lib[PATH_MAX + 32];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return 1;
	self[n] = 0;
	*strrchr(self, '/') = 0;
	snprintf(lib, sizeof(lib), "%s/libsc_fake_cuda.so", self);
	if (!SC_HAVE_CUDA_H || access(lib, R_OK) != 0) {
		printf("skipped: the stand-in CUDA driver %s was not built (no cuda.h)\n", lib);
		return 77;
	}
	char shm[] = "/dev/shm/sc-dmabuf-test-XXXXXX";
	if (!mkdtemp(shm))
		return 1;
	setenv("SC_TEST_CUDA_DRIVER", lib, 1);
	setenv("FAKE_CUDA_SHM_DIR", shm, 1);
	setenv("FAKE_CUDA_DMA_BUF", "1", 1);
	pg = (uint64_t)sysconf(_SC_PAGESIZE);
	char detail[512];
	g = sc_gpu_open(detail, sizeof(detail));
	if (!g) {
		fprintf(stderr, "sc_gpu_open: %s\n", detail);
		rmdir(shm);
		return 1;
	}
	check_failed_ = 0;
	test_page_rounded_ranges_and_offsets();
	int failed = check_failed_;
	fprintf(stderr, "%s page_rounded_ranges_and_offsets\n", failed ? "not ok" : "ok");
	printf("%d passed, %d failed\n", !failed, failed);
	sc_gpu_close(g);
	rmdir(shm);
	return failed;
}
