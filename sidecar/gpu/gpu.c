/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu/gpu.c: the CUDA driver, loaded at run time, and the GPU memory that regions hold.
 *
 * sc_gpu_open (main thread, start-up) dlopens "libcuda.so.1" (or the test stand-in named by
 * SC_TEST_CUDA_DRIVER), resolves every entry point with cuGetProcAddress (so versioned symbols such
 * as cuMemAlloc_v2 are the right ones), runs cuInit, retains each device's primary context and
 * records what GetInfo reports about it: name, PCI bus id, memory, compute capability, dma-buf and
 * GPUDirect RDMA support, nvidia_peermem, and the nearest RDMA device by PCIe topology (sysfs).
 * The memory calls (alloc, IPC open, VMM import, release, dma-buf export) run on gRPC worker
 * threads and the engine's release path. Owns the library handle and the contexts; the regions own
 * their struct sc_gpu_mem. sc_gpu_close empties the stager pools through the hook gpu/stage.c set
 * (g->free_stager): this file never calls into stage.c.
 *
 * Built without cuda.h (no toolkit), every call reports "built without CUDA support".
 */
#include "build_config.h"
#include "os/fault_guard.h"
#include "gpu/gpu.h"
#include "base/log.h"

#include <stdio.h>
#include <string.h>

#if SC_HAVE_CUDA_H

#include "gpu/internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ALLOC_ALIGN (2ull << 20)

/* Errors after which the context is unusable until the process ends (cuda.h: "the process must
 * be terminated and relaunched"). */
static bool sticky(CUresult rc)
{
	switch (rc) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
		return true;
	default:
		return false;
	}
}

/* A sticky error poisoned the current context: mark its device unhealthy (once). */
static void mark_unhealthy(struct sc_gpu *g, CUresult rc, const char *call, const char *name)
{
	CUcontext cur = NULL;
	if (g->cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
		return;
	for (int i = 0; i < g->n; i++) {
		struct sc_gpu_dev *d = &g->dev[i];
		if (d->ctx != cur)
			continue;
		pthread_mutex_lock(&g->mu);
		if (!atomic_load(&d->unhealthy)) {
			snprintf(d->info.health_detail, sizeof(d->info.health_detail),
				 "%s returned %s (%d), a sticky error: the GPU context is unusable "
				 "until the sidecar restarts",
				 call, name, (int)rc);
			d->info.healthy = false;
			atomic_store(&d->unhealthy, true);
			SC_ERROR("gpu", "GPU %d (%s) is now unhealthy: %s", i, d->info.uuid,
				 d->info.health_detail);
		}
		pthread_mutex_unlock(&g->mu);
	}
}

int sc_gpu_unhealthy_count(const struct sc_gpu *g)
{
	int n = 0;
	for (int i = 0; g && i < g->n; i++)
		n += atomic_load(&g->dev[i].unhealthy) ? 1 : 0;
	return n;
}

int sc_gpu_fail(struct sc_gpu *g, CUresult rc, const char *call, struct sc_err *err)
{
	const char *name = NULL, *text = NULL;
	if (g->cu.cuGetErrorName(rc, &name) != CUDA_SUCCESS || !name)
		name = "CUDA_ERROR_UNKNOWN";
	if (g->cu.cuGetErrorString(rc, &text) != CUDA_SUCCESS || !text)
		text = "unknown error";
	enum sc_status code = SC_INTERNAL;
	if (rc == CUDA_ERROR_OUT_OF_MEMORY)
		code = SC_RESOURCE_EXHAUSTED;
	else if (rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_ERROR_INVALID_HANDLE ||
		 rc == CUDA_ERROR_INVALID_DEVICE)
		code = SC_INVALID_ARGUMENT;
	else if (rc == CUDA_ERROR_NOT_SUPPORTED)
		code = SC_FAILED_PRECONDITION;
	if (sticky(rc))
		mark_unhealthy(g, rc, call, name);
	return sc_err_set(err, code, "%s: %s (%s)", call, name, text);
}

int sc_gpu_use(struct sc_gpu *g, int device, struct sc_err *err)
{
	if (!g || device < 0 || device >= g->n)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "no GPU %d here", device);
	if (atomic_load(&g->dev[device].unhealthy))
		return sc_err_set(err, SC_UNAVAILABLE, "GPU %d is unhealthy (%s): restart the sidecar",
				  device, g->dev[device].info.health_detail);
	CUresult rc = g->cu.cuCtxSetCurrent(g->dev[device].ctx);
	return rc == CUDA_SUCCESS ? 0 : sc_gpu_fail(g, rc, "cuCtxSetCurrent", err);
}

/* ---- loading --------------------------------------------------------------------------------- */

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
				CUdriverProcAddressQueryResult *);

static int resolve(void *lib, get_proc_fn get_proc, const char *name, void **out)
{
	*out = NULL;
	if (get_proc) {
		CUdriverProcAddressQueryResult st;
		if (get_proc(name, out, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS &&
		    *out)
			return 0;
	}
	/* A driver without cuGetProcAddress_v2: the plain symbol (fine for unversioned calls). */
	*out = dlsym(lib, name);
	return *out ? 0 : -1;
}

static int load_entry_points(struct sc_gpu *g, char *detail, size_t cap)
{
	get_proc_fn get_proc = (get_proc_fn)dlsym(g->lib, "cuGetProcAddress_v2");
	/* Without it (drivers before CUDA 12.0) dlsym hands out the legacy entry points (32-bit
	 * sizes, old semantics) under the plain names: refuse rather than call them wrongly. */
	if (!get_proc) {
		snprintf(detail, cap,
			 "the CUDA driver has no cuGetProcAddress_v2 (a driver older than CUDA 12.0): "
			 "GPU support needs driver 525 or newer");
		return -1;
	}
#define SC_CU_LOAD_REQ(name, params)                                                               \
	if (resolve(g->lib, get_proc, #name, (void **)&g->cu.name) != 0) {                         \
		snprintf(detail, cap, "the CUDA driver lacks %s (driver too old?)", #name);        \
		return -1;                                                                         \
	}
#define SC_CU_LOAD_OPT(name, params) resolve(g->lib, get_proc, #name, (void **)&g->cu.name);
	SC_CU_REQUIRED(SC_CU_LOAD_REQ)
	SC_CU_OPTIONAL(SC_CU_LOAD_OPT)
#undef SC_CU_LOAD_REQ
#undef SC_CU_LOAD_OPT
	/* cuMemcpyBatchAsync changed its signature in CUDA 13.0 (no failIdx): ask for the version
	 * the driver implements, so the pointer always matches the signature it is called with. */
	int version = 0;
	CUdriverProcAddressQueryResult st;
	g->cu.cuDriverGetVersion(&version);
	if (version >= 13000 &&
	    get_proc("cuMemcpyBatchAsync", (void **)&g->cu.memcpy_batch_13, 13000,
		     CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
		g->cu.memcpy_batch_13 = NULL;
	if (version >= 12080 && version < 13000 &&
	    get_proc("cuMemcpyBatchAsync", (void **)&g->cu.memcpy_batch_12, 12080,
		     CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
		g->cu.memcpy_batch_12 = NULL;
	return 0;
}

/* ---- PCIe topology --------------------------------------------------------------------------- */

/* Number of leading path components two sysfs device paths share. */
static int common_depth(const char *a, const char *b, char *last, size_t cap)
{
	int depth = 0;
	last[0] = 0;
	while (*a && *a == *b) {
		const char *sa = strchr(a + 1, '/'), *sb = strchr(b + 1, '/');
		size_t la = sa ? (size_t)(sa - a) : strlen(a), lb = sb ? (size_t)(sb - b) : strlen(b);
		if (la != lb || strncmp(a, b, la) != 0)
			break;
		depth++;
		snprintf(last, cap, "%.*s", (int)(la > 0 ? la - 1 : 0), a + 1);
		a += la;
		b += lb;
	}
	return depth;
}

static void nearest_rdma(struct sc_gpu_device_info *info)
{
	char bdf[32], gpu_path[PATH_MAX], sys[PATH_MAX];
	snprintf(bdf, sizeof(bdf), "%s", info->pci_bus_id);
	for (char *p = bdf; *p; p++)
		*p = (char)(*p >= 'A' && *p <= 'F' ? *p - 'A' + 'a' : *p);
	snprintf(sys, sizeof(sys), "/sys/bus/pci/devices/%s", bdf);
	bool gpu_known = realpath(sys, gpu_path) != NULL;
	DIR *d = opendir("/sys/class/infiniband");
	if (!d) {
		snprintf(info->nearest_detail, sizeof(info->nearest_detail),
			 "no RDMA devices (/sys/class/infiniband absent)");
		return;
	}
	int best = -1;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char link[PATH_MAX], dev_path[PATH_MAX], last[128];
		snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", e->d_name);
		if (!realpath(link, dev_path)) {
			if (best < 0 && !info->nearest_rdma[0]) {
				snprintf(info->nearest_rdma, sizeof(info->nearest_rdma), "%s",
					 e->d_name);
				snprintf(info->nearest_detail, sizeof(info->nearest_detail),
					 "%s is not a PCIe device (software RDMA: no GPUDirect)",
					 e->d_name);
			}
			continue;
		}
		int depth = gpu_known ? common_depth(gpu_path, dev_path, last, sizeof(last)) : 0;
		if (depth > best) {
			best = depth;
			snprintf(info->nearest_rdma, sizeof(info->nearest_rdma), "%s", e->d_name);
			if (!gpu_known)
				snprintf(info->nearest_detail, sizeof(info->nearest_detail),
					 "%s (GPU %s not found in sysfs)", e->d_name, bdf);
			else if (depth <= 2)
				snprintf(info->nearest_detail, sizeof(info->nearest_detail),
					 "%s: different PCIe root (traffic crosses the CPU)",
					 e->d_name);
			else
				snprintf(info->nearest_detail, sizeof(info->nearest_detail),
					 "%s: shares PCIe %s (%d levels)", e->d_name, last, depth);
		}
	}
	closedir(d);
	if (!info->nearest_rdma[0] && !info->nearest_detail[0])
		snprintf(info->nearest_detail, sizeof(info->nearest_detail), "no RDMA devices");
}

static void describe_device(struct sc_gpu *g, int i)
{
	struct sc_gpu_dev *d = &g->dev[i];
	struct sc_gpu_device_info *info = &d->info;
	info->index = i;
	info->healthy = true;
	if (g->cu.cuDeviceGetName(info->name, sizeof(info->name), d->dev) != CUDA_SUCCESS)
		snprintf(info->name, sizeof(info->name), "GPU %d", i);
	if (g->cu.cuDeviceGetPCIBusId(info->pci_bus_id, sizeof(info->pci_bus_id), d->dev) !=
	    CUDA_SUCCESS)
		info->pci_bus_id[0] = 0;
	size_t mem = 0;
	if (g->cu.cuDeviceTotalMem(&mem, d->dev) == CUDA_SUCCESS)
		info->total_memory = mem;
	int v = 0;
	if (g->cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev) ==
	    CUDA_SUCCESS)
		info->cc_major = v;
	if (g->cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev) ==
	    CUDA_SUCCESS)
		info->cc_minor = v;
	v = 0;
	info->dma_buf = g->cu.cuMemGetHandleForAddressRange &&
			g->cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
						   d->dev) == CUDA_SUCCESS &&
			v != 0;
	v = 0;
	info->vmm_gdr = g->cu.cuDeviceGetAttribute(
				&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
				d->dev) == CUDA_SUCCESS &&
			v != 0;
	v = 0;
	info->gdr = g->cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
					       d->dev) == CUDA_SUCCESS &&
		    v != 0;
	info->peermem = access("/sys/module/nvidia_peermem", F_OK) == 0;
	CUuuid u;
	if (g->cu.cuDeviceGetUuid && g->cu.cuDeviceGetUuid(&u, d->dev) == CUDA_SUCCESS) {
		const unsigned char *b = (const unsigned char *)u.bytes;
		snprintf(info->uuid, sizeof(info->uuid),
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
			 b[12], b[13], b[14], b[15]);
	}
	nearest_rdma(info);
	if (info->dma_buf)
		snprintf(info->rdma_path, sizeof(info->rdma_path),
			 "GPUDirect RDMA via dma-buf (ibv_reg_dmabuf_mr)");
	else if (info->peermem && info->gdr)
		snprintf(info->rdma_path, sizeof(info->rdma_path),
			 "GPUDirect RDMA via nvidia_peermem (ibv_reg_mr on device memory)");
	else
		snprintf(info->rdma_path, sizeof(info->rdma_path),
			 "staged through pinned host memory: %s and nvidia_peermem is not loaded",
			 info->gdr ? "dma-buf export is not supported by this GPU/driver"
				   : "the GPU does not support GPUDirect RDMA");
}

struct sc_gpu *sc_gpu_open(char *detail, size_t cap)
{
	const char *path = getenv("SC_TEST_CUDA_DRIVER");
	bool stand_in = path && path[0];
	if (!stand_in)
		path = "libcuda.so.1";
	struct sc_gpu *g = calloc(1, sizeof(*g));
	if (!g) {
		snprintf(detail, cap, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&g->mu, NULL);
	pthread_mutex_init(&g->gdr_mu, NULL);
	g->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!g->lib) {
		snprintf(detail, cap, "CUDA driver not found (dlopen %s: %s)", path, dlerror());
		goto fail;
	}
	if (load_entry_points(g, detail, cap) != 0)
		goto fail;
	CUresult rc = g->cu.cuInit(0);
	struct sc_err err;
	sc_err_clear(&err);
	if (rc != CUDA_SUCCESS) {
		sc_gpu_fail(g, rc, "cuInit", &err);
		snprintf(detail, cap, "%s (no usable GPU or driver)", err.msg);
		goto fail;
	}
	int count = 0, version = 0;
	rc = g->cu.cuDeviceGetCount(&count);
	if (rc != CUDA_SUCCESS || count <= 0) {
		snprintf(detail, cap, "CUDA driver found but no GPU (CUresult %d, %d devices)",
			 (int)rc, count);
		goto fail;
	}
	if (count > SC_GPU_MAX_DEVICES)
		count = SC_GPU_MAX_DEVICES;
	for (int i = 0; i < count; i++) {
		struct sc_gpu_dev *d = &g->dev[i];
		if ((rc = g->cu.cuDeviceGet(&d->dev, i)) != CUDA_SUCCESS ||
		    (rc = g->cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev)) != CUDA_SUCCESS) {
			sc_gpu_fail(g, rc, "cuDevicePrimaryCtxRetain", &err);
			snprintf(detail, cap, "GPU %d: %s", i, err.msg);
			goto fail;
		}
		g->n = i + 1;
		describe_device(g, i);
	}
	g->cu.cuDriverGetVersion(&version);
	snprintf(detail, cap, "CUDA driver %d.%d%s, %d GPU(s): %s%s", version / 1000,
		 (version % 1000) / 10, stand_in ? " (TEST STAND-IN driver from SC_TEST_CUDA_DRIVER)"
						 : "",
		 g->n, g->dev[0].info.name, g->n > 1 ? ", ..." : "");
	return g;
fail:
	sc_gpu_close(g);
	return NULL;
}

void sc_gpu_close(struct sc_gpu *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n; i++) {
		struct sc_gpu_dev *d = &g->dev[i];
		g->cu.cuCtxSetCurrent(d->ctx);
		while (d->free_stagers) {
			struct sc_stager *s = d->free_stagers;
			d->free_stagers = s->next;
			g->free_stager(g, s);
		}
		g->cu.cuCtxSetCurrent(NULL);
		g->cu.cuDevicePrimaryCtxRelease(d->dev);
	}
	/* The driver's own threads may outlive dlclose: keep the library mapped (as the CUDA
	 * runtime does) and only drop our reference when it never initialised. */
	if (g->lib && g->n == 0)
		dlclose(g->lib);
	while (g->gdr_ranges) {
		struct sc_gpu_gdr_range *r = g->gdr_ranges;
		g->gdr_ranges = r->next;
		free(r);
	}
	pthread_mutex_destroy(&g->gdr_mu);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

int sc_gpu_count(const struct sc_gpu *g)
{
	return g ? g->n : 0;
}

const struct sc_gpu_device_info *sc_gpu_device(const struct sc_gpu *g, int index)
{
	return g && index >= 0 && index < g->n ? &g->dev[index].info : NULL;
}

int sc_gpu_check_device(const struct sc_gpu *g, uint32_t index, struct sc_err *err)
{
	if (!g)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "this sidecar has no usable CUDA driver (see GetInfo cuda_detail)");
	if (index >= (uint32_t)g->n)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "device_index %u: this sidecar sees %d GPU(s) (0..%d, see GetInfo "
				  "gpus; are the same GPUs visible in both containers?)",
				  index, g->n, g->n - 1);
	return 0;
}

int sc_gpu_find_uuid(const struct sc_gpu *g, const char *uuid, int *index, struct sc_err *err)
{
	if (!g)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "this sidecar has no usable CUDA driver (see GetInfo cuda_detail)");
	const char *want = strncasecmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid;
	char seen[SC_GPU_MAX_DEVICES * 50] = "";
	for (int i = 0; i < g->n; i++) {
		const char *have = g->dev[i].info.uuid;
		if (have[0] && strcasecmp(have + 4, want) == 0) {
			*index = i;
			return 0;
		}
		size_t at = strlen(seen);
		snprintf(seen + at, sizeof(seen) - at, "%s%d=%s", i ? ", " : "", i,
			 have[0] ? have : "(unknown)");
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "no GPU with uuid %s here (this sidecar sees %s): is that GPU visible in "
			  "the sidecar's container?",
			  uuid, seen);
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE of device memory (false when unknown). */
static bool rdma_capable(struct sc_gpu *g, uint64_t addr)
{
	int v = 0;
	return g->cu.cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
					   (CUdeviceptr)addr) == CUDA_SUCCESS &&
	       v != 0;
}

/* Whether addr lies in an imported allocation its worker declared capable. */
static bool declared_capable(struct sc_gpu *g, uint64_t addr)
{
	bool yes = false;
	pthread_mutex_lock(&g->gdr_mu);
	for (struct sc_gpu_gdr_range *r = g->gdr_ranges; r && !yes; r = r->next)
		yes = addr >= r->base && addr - r->base < r->size;
	pthread_mutex_unlock(&g->gdr_mu);
	return yes;
}

static int declare_capable(struct sc_gpu *g, uint64_t base, uint64_t size)
{
	struct sc_gpu_gdr_range *r = malloc(sizeof(*r));
	if (!r)
		return -1;
	*r = (struct sc_gpu_gdr_range){.base = base, .size = size};
	pthread_mutex_lock(&g->gdr_mu);
	r->next = g->gdr_ranges;
	g->gdr_ranges = r;
	pthread_mutex_unlock(&g->gdr_mu);
	return 0;
}

static void forget_capable(struct sc_gpu *g, uint64_t base)
{
	pthread_mutex_lock(&g->gdr_mu);
	for (struct sc_gpu_gdr_range **p = &g->gdr_ranges; *p; p = &(*p)->next) {
		if ((*p)->base == base) {
			struct sc_gpu_gdr_range *r = *p;
			*p = r->next;
			free(r);
			break;
		}
	}
	pthread_mutex_unlock(&g->gdr_mu);
}

bool sc_gpu_rdma_capable(struct sc_gpu *g, int device, uint64_t addr)
{
	struct sc_err err;
	return sc_gpu_use(g, device, &err) == 0 &&
	       (rdma_capable(g, addr) || declared_capable(g, addr));
}

int sc_gpu_alloc(struct sc_gpu *g, int device, uint64_t size, struct sc_gpu_mem *out,
		 uint8_t ipc_handle[SC_GPU_IPC_HANDLE_LEN], struct sc_err *err)
{
	if (sc_gpu_use(g, device, err) != 0)
		return -1;
	uint64_t rounded = (size + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN;
	CUdeviceptr p = 0;
	CUresult rc = g->cu.cuMemAlloc(&p, (size_t)rounded);
	if (rc != CUDA_SUCCESS)
		return sc_gpu_fail(g, rc, "cuMemAlloc", err);
	CUipcMemHandle h;
	rc = g->cu.cuIpcGetMemHandle(&h, p);
	if (rc != CUDA_SUCCESS) {
		g->cu.cuMemFree(p);
		return sc_gpu_fail(g, rc, "cuIpcGetMemHandle", err);
	}
	memcpy(ipc_handle, h.reserved, SC_GPU_IPC_HANDLE_LEN);
	*out = (struct sc_gpu_mem){.device = device, .source = SC_GPU_MEM_OWNED, .addr = p,
				   .size = size, .map_base = p, .map_size = rounded};
	out->gdr_capable = rdma_capable(g, out->addr);
	return 0;
}

/* The range [offset, offset+size) must lie within the block [base, base+block). */
static int check_range(uint64_t offset, uint64_t size, uint64_t block, const char *what,
		       struct sc_err *err)
{
	if (size == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s: size must be > 0", what);
	if (offset > block || size > block - offset)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s: range [%" PRIu64 ", +%" PRIu64 ") lies outside the "
				  "allocation (%" PRIu64 " bytes)",
				  what, offset, size, block);
	return 0;
}

int sc_gpu_open_ipc(struct sc_gpu *g, int device, const uint8_t handle[SC_GPU_IPC_HANDLE_LEN],
		    uint64_t offset, uint64_t size, struct sc_gpu_mem *out, struct sc_err *err)
{
	if (sc_gpu_use(g, device, err) != 0)
		return -1;
	CUipcMemHandle h;
	memcpy(h.reserved, handle, SC_GPU_IPC_HANDLE_LEN);
	CUdeviceptr p = 0;
	CUresult rc = g->cu.cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (rc != CUDA_SUCCESS) {
		sc_gpu_fail(g, rc, "cuIpcOpenMemHandle", err);
		sc_err_prefix(err, "cannot open the CUDA IPC handle on GPU %d (is it the worker's "
				   "device, and is the allocation still alive?)",
			      device);
		return -1;
	}
	/* With CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS the driver opens another GPU's memory through
	 * peer access: a worker that numbers GPUs differently (CUDA_VISIBLE_DEVICES, device
	 * plugins) would silently get every copy across the bus. Refuse it. */
	int ordinal = -1;
	rc = g->cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	if (rc != CUDA_SUCCESS || ordinal != device) {
		g->cu.cuIpcCloseMemHandle(p);
		if (rc != CUDA_SUCCESS)
			return sc_gpu_fail(g, rc, "cuPointerGetAttribute(DEVICE_ORDINAL)", err);
		const struct sc_gpu_device_info *o = sc_gpu_device(g, ordinal);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "the CUDA IPC handle is memory of GPU %d (%s) as this sidecar "
				  "numbers them, not of GPU %d (%s): worker and sidecar number GPUs "
				  "differently (CUDA_VISIBLE_DEVICES, device plugins); name the GPU "
				  "by device_uuid",
				  ordinal, o && o->uuid[0] ? o->uuid : "?", device,
				  g->dev[device].info.uuid[0] ? g->dev[device].info.uuid : "?");
	}
	CUdeviceptr base = 0;
	size_t block = 0;
	rc = g->cu.cuMemGetAddressRange(&base, &block, p);
	if (rc != CUDA_SUCCESS) {
		g->cu.cuIpcCloseMemHandle(p);
		return sc_gpu_fail(g, rc, "cuMemGetAddressRange", err);
	}
	uint64_t usable = block - (p - base);
	if (check_range(offset, size, usable, "cuda_ipc", err) != 0) {
		g->cu.cuIpcCloseMemHandle(p);
		return -1;
	}
	*out = (struct sc_gpu_mem){.device = device, .source = SC_GPU_MEM_IPC, .addr = p + offset,
				   .size = size, .map_base = p, .map_size = usable};
	out->gdr_capable = rdma_capable(g, out->addr);
	return 0;
}

static int take_fd(int pid, int fd, int *out, struct sc_err *err)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		return sc_err_set(err, errno == ESRCH ? SC_NOT_FOUND : SC_PERMISSION_DENIED,
				  "pidfd_open(%d): %s (is the worker's pid as the sidecar sees it? "
				  "the pod needs shareProcessNamespace: true)",
				  pid, strerror(errno));
	int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
	int e = errno;
	close(pidfd);
	if (got < 0)
		return sc_err_set(err, e == EBADF ? SC_INVALID_ARGUMENT : SC_PERMISSION_DENIED,
				  "pidfd_getfd(pid %d, fd %d): %s (%s)", pid, fd, strerror(e),
				  e == EPERM ? "the sidecar needs ptrace access to the worker: same "
					       "uid, shared PID namespace"
					     : "is the fd still open in the worker?");
	*out = got;
	return 0;
#else
	(void)pid;
	(void)fd;
	(void)out;
	return sc_err_set(err, SC_UNIMPLEMENTED, "pidfd_getfd is not available in this build");
#endif
}

int sc_gpu_import_fd(struct sc_gpu *g, int device, int pid, int fd, uint64_t offset,
		     uint64_t size, uint64_t alloc_size, bool declared_gdr, struct sc_gpu_mem *out,
		     struct sc_err *err)
{
	if (sc_gpu_use(g, device, err) != 0)
		return -1;
	if (!g->cu.cuMemImportFromShareableHandle || !g->cu.cuMemAddressReserve ||
	    !g->cu.cuMemMap || !g->cu.cuMemSetAccess || !g->cu.cuMemGetAllocationGranularity)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "the CUDA driver lacks the virtual memory API (cuMemMap...)");
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
	size_t gran = 0;
	CUresult rc = g->cu.cuMemGetAllocationGranularity(&gran, &prop,
							  CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (rc != CUDA_SUCCESS)
		return sc_gpu_fail(g, rc, "cuMemGetAllocationGranularity", err);
	if (size == 0 || offset + size < offset)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "cuda_fd: size must be > 0");
	if (alloc_size == 0)
		alloc_size = (offset + size + gran - 1) / gran * gran;
	if (alloc_size % gran != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "cuda_fd: allocation_size %" PRIu64
				  " is not a multiple of the granularity %zu",
				  alloc_size, gran);
	if (check_range(offset, size, alloc_size, "cuda_fd", err) != 0)
		return -1;
	int local_fd = -1;
	if (take_fd(pid, fd, &local_fd, err) != 0)
		return -1;
	CUmemGenericAllocationHandle h = 0;
	rc = g->cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)local_fd,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	close(local_fd);
	if (rc != CUDA_SUCCESS)
		return sc_gpu_fail(g, rc, "cuMemImportFromShareableHandle", err);
	CUdeviceptr va = 0;
	const char *call = "cuMemAddressReserve";
	rc = g->cu.cuMemAddressReserve(&va, alloc_size, 0, 0, 0);
	if (rc != CUDA_SUCCESS)
		goto release;
	call = "cuMemMap";
	rc = g->cu.cuMemMap(va, alloc_size, 0, h, 0);
	if (rc != CUDA_SUCCESS)
		goto free_va;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	call = "cuMemSetAccess";
	rc = g->cu.cuMemSetAccess(va, alloc_size, &acc, 1);
	if (rc != CUDA_SUCCESS)
		goto unmap;
	*out = (struct sc_gpu_mem){.device = device, .source = SC_GPU_MEM_VMM, .addr = va + offset,
				   .size = size, .map_base = va, .map_size = alloc_size,
				   .vmm_handle = h};
	/* The importer sees neither the flag nor the attribute (0 on a real H200 whatever the
	 * worker set): the worker's word, where this GPU takes GPUDirect RDMA on VMM memory. */
	out->gdr_capable = rdma_capable(g, out->addr);
	if (!out->gdr_capable && declared_gdr && g->dev[device].info.gdr &&
	    g->dev[device].info.vmm_gdr && declare_capable(g, va, alloc_size) == 0)
		out->gdr_capable = true;
	return 0;
unmap:
	g->cu.cuMemUnmap(va, alloc_size);
free_va:
	g->cu.cuMemAddressFree(va, alloc_size);
release:
	g->cu.cuMemRelease(h);
	return sc_gpu_fail(g, rc, call, err);
}

void sc_gpu_release(struct sc_gpu *g, struct sc_gpu_mem *m)
{
	struct sc_err err;
	sc_err_clear(&err);
	if (!g || !m->map_base || sc_gpu_use(g, m->device, &err) != 0)
		return;
	CUresult rc = CUDA_SUCCESS;
	const char *call = "";
	switch (m->source) {
	case SC_GPU_MEM_OWNED:
		call = "cuMemFree";
		rc = g->cu.cuMemFree(m->map_base);
		break;
	case SC_GPU_MEM_IPC:
		call = "cuIpcCloseMemHandle";
		rc = g->cu.cuIpcCloseMemHandle(m->map_base);
		break;
	case SC_GPU_MEM_VMM:
		call = "cuMemUnmap";
		forget_capable(g, m->map_base);
		rc = g->cu.cuMemUnmap(m->map_base, m->map_size);
		if (g->cu.cuMemAddressFree)
			g->cu.cuMemAddressFree(m->map_base, m->map_size);
		if (g->cu.cuMemRelease)
			g->cu.cuMemRelease(m->vmm_handle);
		break;
	}
	if (rc != CUDA_SUCCESS) {
		sc_gpu_fail(g, rc, call, &err);
		SC_WARN("gpu", "releasing GPU %d memory: %s", m->device, err.msg);
	}
	m->map_base = 0;
}

int sc_gpu_dmabuf(struct sc_gpu *g, int device, uint64_t addr, uint64_t len, int *fd,
		  uint64_t *offset, struct sc_err *err)
{
	if (sc_gpu_use(g, device, err) != 0)
		return -1;
	if (!g->dev[device].info.dma_buf)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "GPU %d cannot export dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED "
				  "is 0: needs the NVIDIA open kernel modules or a recent driver)",
				  device);
	CUdeviceptr base = 0;
	size_t block = 0;
	CUresult rc = g->cu.cuMemGetAddressRange(&base, &block, addr);
	if (rc != CUDA_SUCCESS)
		return sc_gpu_fail(g, rc, "cuMemGetAddressRange", err);
	if (addr + len > base + block)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "range crosses its allocation's end");
	/* The driver wants a host-page-aligned address and size: export the page-rounded range that
	 * covers what is registered (not the whole block: BAR1 space is scarce), and the offset of
	 * addr inside it. An odd-sized cuMemAlloc block may be rounded up to its last page. */
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t start = addr & ~(pg - 1), end = (addr + len + pg - 1) & ~(pg - 1);
	if (start < base)
		start = base;
	int dfd = -1;
	rc = g->cu.cuMemGetHandleForAddressRange(&dfd, start, (size_t)(end - start),
						 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (rc != CUDA_SUCCESS) {
		sc_gpu_fail(g, rc, "cuMemGetHandleForAddressRange(DMA_BUF_FD)", err);
		return sc_err_prefix(err, "exporting [0x%" PRIx64 ", +%" PRIu64 ") of GPU %d",
				     start, end - start, device);
	}
	*fd = dfd;
	*offset = addr - start;
	return 0;
}

void sc_gpu_flush_rdma_writes(struct sc_gpu *g, int device)
{
	struct sc_err err;
	if (!g || !g->cu.cuFlushGPUDirectRDMAWrites || sc_gpu_use(g, device, &err) != 0)
		return;
	/* TO_ALL_DEVICES: the reader is the worker, another process (another context), not only
	 * this context (TO_OWNER). */
	g->cu.cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
					 CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES);
}

#else /* !SC_HAVE_CUDA_H: built without the CUDA toolkit */

#define NO_CUDA "this sidecar was built without CUDA support (no cuda.h at build time)"

struct sc_gpu *sc_gpu_open(char *detail, size_t cap)
{
	snprintf(detail, cap, "%s", NO_CUDA);
	return NULL;
}
void sc_gpu_close(struct sc_gpu *g)
{
	(void)g;
}
int sc_gpu_count(const struct sc_gpu *g)
{
	(void)g;
	return 0;
}
const struct sc_gpu_device_info *sc_gpu_device(const struct sc_gpu *g, int index)
{
	(void)g;
	(void)index;
	return NULL;
}
int sc_gpu_check_device(const struct sc_gpu *g, uint32_t index, struct sc_err *err)
{
	(void)g;
	(void)index;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_gpu_unhealthy_count(const struct sc_gpu *g)
{
	(void)g;
	return 0;
}
bool sc_gpu_rdma_capable(struct sc_gpu *g, int device, uint64_t addr)
{
	(void)g, (void)device, (void)addr;
	return false;
}
int sc_gpu_find_uuid(const struct sc_gpu *g, const char *uuid, int *index, struct sc_err *err)
{
	(void)g, (void)uuid, (void)index;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_gpu_alloc(struct sc_gpu *g, int device, uint64_t size, struct sc_gpu_mem *out,
		 uint8_t ipc_handle[SC_GPU_IPC_HANDLE_LEN], struct sc_err *err)
{
	(void)g, (void)device, (void)size, (void)out, (void)ipc_handle;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_gpu_open_ipc(struct sc_gpu *g, int device, const uint8_t handle[SC_GPU_IPC_HANDLE_LEN],
		    uint64_t offset, uint64_t size, struct sc_gpu_mem *out, struct sc_err *err)
{
	(void)g, (void)device, (void)handle, (void)offset, (void)size, (void)out;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_gpu_import_fd(struct sc_gpu *g, int device, int pid, int fd, uint64_t offset,
		     uint64_t size, uint64_t alloc_size, bool declared_gdr, struct sc_gpu_mem *out,
		     struct sc_err *err)
{
	(void)g, (void)device, (void)pid, (void)fd, (void)offset, (void)size, (void)alloc_size;
	(void)declared_gdr;
	(void)out;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
void sc_gpu_release(struct sc_gpu *g, struct sc_gpu_mem *m)
{
	(void)g, (void)m;
}
int sc_gpu_dmabuf(struct sc_gpu *g, int device, uint64_t addr, uint64_t len, int *fd,
		  uint64_t *offset, struct sc_err *err)
{
	(void)g, (void)device, (void)addr, (void)len, (void)fd, (void)offset;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
void sc_gpu_flush_rdma_writes(struct sc_gpu *g, int device)
{
	(void)g, (void)device;
}
int sc_stager_get(struct sc_gpu *g, int device, struct sc_stager **out, struct sc_err *err)
{
	(void)g, (void)device, (void)out;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
void sc_stager_put(struct sc_gpu *g, struct sc_stager *s)
{
	(void)g, (void)s;
}
int sc_stager_send_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err)
{
	(void)s, (void)p, (void)n, (void)fn, (void)ctx;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_stager_recv_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err)
{
	(void)s, (void)p, (void)n, (void)fn, (void)ctx;
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}
int sc_gpu_copy(struct sc_gpu *g, uint8_t *dst, int dst_gpu, const uint8_t *src, int src_gpu,
		uint64_t n, struct sc_err *err)
{
	(void)g;
	if (dst_gpu == SC_GPU_HOST && src_gpu == SC_GPU_HOST)
		return sc_guarded_memcpy(dst, src, n, err);
	return sc_err_set(err, SC_FAILED_PRECONDITION, NO_CUDA);
}

#endif
