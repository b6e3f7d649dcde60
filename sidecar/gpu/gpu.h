/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu/gpu.h: GPU memory through the CUDA driver API, loaded at run time (dlopen "libcuda.so.1",
 * entry points resolved with cuGetProcAddress), so one binary runs on hosts with and without GPUs.
 *
 * Two parts:
 *  - gpu/gpu.c: the driver, its devices (what GetInfo reports), GPU memory that regions hold (allocated
 *    by the sidecar, opened from a worker's CUDA IPC handle, or imported from a worker's
 *    cuMemCreate file descriptor taken with pidfd_getfd), and dma-buf export for GPUDirect RDMA.
 *  - gpu/stage.c: staging for every path where the NIC or the CPU cannot touch GPU memory: a pool
 *    of "stagers" (a CUDA stream and two pinned host buffers each), and pipelined copies that
 *    overlap the copy of piece k+1 with the network I/O (or memcpy) of piece k.
 *
 * Addresses: GPU memory is named by its device address (CUdeviceptr) carried in a uint8_t * (so the
 * offset arithmetic of host ranges applies) together with a device index `gpu` (>= 0); host memory
 * has gpu == SC_GPU_HOST. A device address is NEVER dereferenced by host code: every access goes
 * through the functions here.
 *
 * Threads: every call is thread-safe and may run on any thread (each call makes the device's
 * primary context current on the calling thread first). A stager is used by one thread at a time.
 * Errors: -1 with struct sc_err (message names the driver call and the CUresult, e.g.
 * "cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)").
 *
 * Tests: SC_TEST_CUDA_DRIVER=/path/lib.so makes the sidecar load that library instead of
 * libcuda.so.1 (the test suite's stand-in driver, tests/fake_cuda/). Not for production use.
 */
#ifndef SC_GPU_H
#define SC_GPU_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SC_GPU_HOST (-1)
#define SC_GPU_IPC_HANDLE_LEN 64
#define SC_GPU_MAX_DEVICES 16

struct sc_gpu;

struct sc_gpu_device_info {
	int index;
	char name[128];
	char pci_bus_id[32];
	uint64_t total_memory;
	int cc_major, cc_minor;
	bool dma_buf;	/* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
	bool gdr;	/* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	bool vmm_gdr;	/* ..._GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: cuMemCreate memory can be */
	bool peermem;	/* /sys/module/nvidia_peermem */
	char nearest_rdma[64];
	char nearest_detail[160];
	char rdma_path[200];
	char uuid[48];	/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it; "" unknown */
	/* false once a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS...) poisoned the device's context:
	 * every later call on it fails until the process restarts. health_detail says which. */
	bool healthy;
	char health_detail[200];
};

enum sc_gpu_mem_source { SC_GPU_MEM_OWNED = 1, SC_GPU_MEM_IPC = 2, SC_GPU_MEM_VMM = 3 };

/* One range of GPU memory that a region holds, and how to give it back. */
struct sc_gpu_mem {
	int device;
	enum sc_gpu_mem_source source;
	uint64_t addr;	     /* first byte of the region (device address) */
	uint64_t size;	     /* bytes of the region */
	uint64_t map_base;   /* what was allocated / opened / mapped */
	uint64_t map_size;
	uint64_t vmm_handle; /* CUmemGenericAllocationHandle (VMM) */
	/* CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: a NIC may reach it (cuMemCreate memory
	 * only when allocated with allocFlags.gpuDirectRDMACapable; imported by fd, when the worker
	 * declares it: cuda_fd.gpudirect_rdma_capable) */
	bool gdr_capable;
};

/* Loads the driver and enumerates devices. Returns NULL when CUDA is unusable here, with `detail`
 * saying why ("CUDA driver not found (...)", "cuInit: CUDA_ERROR_NO_DEVICE ...", "built without
 * CUDA headers"); else `detail` summarises the driver and devices. Main thread, at start-up. */
struct sc_gpu *sc_gpu_open(char *detail, size_t cap);
/* Frees the pooled stagers, releases the contexts, closes the library. NULL ok. Call only when no
 * region or transfer uses GPU memory any more. */
void sc_gpu_close(struct sc_gpu *g);
int sc_gpu_count(const struct sc_gpu *g); /* 0 for NULL */
const struct sc_gpu_device_info *sc_gpu_device(const struct sc_gpu *g, int index);
/* Devices whose context a sticky error poisoned (0 without CUDA). */
int sc_gpu_unhealthy_count(const struct sc_gpu *g);
/* INVALID_ARGUMENT when the index is not a device here (or FAILED_PRECONDITION without CUDA). */
int sc_gpu_check_device(const struct sc_gpu *g, uint32_t index, struct sc_err *err);
/* The index of the GPU with this UUID ("GPU-..." or the bare hex form, any case);
 * INVALID_ARGUMENT naming the UUIDs this sidecar sees when there is none. */
int sc_gpu_find_uuid(const struct sc_gpu *g, const char *uuid, int *index, struct sc_err *err);

/* Allocate size bytes on device (cuMemAlloc, rounded up to 2 MiB so that the block can be shared
 * by IPC and exported as dma-buf without exposing neighbours) and return its IPC handle. */
int sc_gpu_alloc(struct sc_gpu *g, int device, uint64_t size, struct sc_gpu_mem *out,
		 uint8_t ipc_handle[SC_GPU_IPC_HANDLE_LEN], struct sc_err *err);
/* Open a worker's CUDA IPC handle (cuIpcOpenMemHandle) and select [offset, offset+size) of the
 * allocation block; the range must lie within the block (cuMemGetAddressRange). */
int sc_gpu_open_ipc(struct sc_gpu *g, int device, const uint8_t handle[SC_GPU_IPC_HANDLE_LEN],
		    uint64_t offset, uint64_t size, struct sc_gpu_mem *out, struct sc_err *err);
/* Import a worker's cuMemCreate allocation: the fd is taken from process pid with pidfd_open +
 * pidfd_getfd, imported, mapped and made accessible on device. alloc_size 0: offset+size rounded
 * up to the allocation granularity. */
int sc_gpu_import_fd(struct sc_gpu *g, int device, int pid, int fd, uint64_t offset,
		     uint64_t size, uint64_t alloc_size, bool declared_gdr, struct sc_gpu_mem *out,
		     struct sc_err *err);
/* Give the memory back (free / close the IPC mapping / unmap). Logs failures. */
void sc_gpu_release(struct sc_gpu *g, struct sc_gpu_mem *m);

/* Whether device memory at addr is GPUDirect RDMA capable (CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_
 * RDMA_CAPABLE); false when unknown. */
bool sc_gpu_rdma_capable(struct sc_gpu *g, int device, uint64_t addr);
/* dma-buf for [addr, addr+len) on device (GPUDirect RDMA): *fd covers the host-page-rounded range
 * around it (the driver's alignment rule; not the whole block), *offset is addr's offset inside it.
 * The caller closes *fd. FAILED_PRECONDITION when the device or driver has no dma-buf support. */
int sc_gpu_dmabuf(struct sc_gpu *g, int device, uint64_t addr, uint64_t len, int *fd,
		  uint64_t *offset, struct sc_err *err);
/* After a NIC wrote GPU memory: make those writes visible to later GPU work (no-op when the driver
 * lacks cuFlushGPUDirectRDMAWrites). */
void sc_gpu_flush_rdma_writes(struct sc_gpu *g, int device);

/* ---- staging (gpu/stage.c) ------------------------------------------------------------------- */

/* Bytes of one pinned staging buffer; a stager has two. */
#define SC_GPU_STAGE_BYTES (4u << 20)

struct sc_stager;

/* Moves exactly n bytes between buf and the network (or memory); 0 or -1 with err set. */
typedef int (*sc_stage_io_fn)(void *ctx, uint8_t *buf, size_t n, struct sc_err *err);

/* Take a stager for device from the pool (creating one when none is free, at most 64 per device:
 * RESOURCE_EXHAUSTED beyond). Give it back with sc_stager_put (NULL ok). */
int sc_stager_get(struct sc_gpu *g, int device, struct sc_stager **out, struct sc_err *err);
void sc_stager_put(struct sc_gpu *g, struct sc_stager *s);
/* One piece of a list: memory on the host (gpu SC_GPU_HOST) or on the stager's GPU. */
struct sc_stage_piece {
	uint8_t *addr;
	uint64_t len;
	int gpu;
};
/* Move a list of pieces, taken in order as one stream of bytes, through the stager's two pinned
 * buffers. Send (device -> out): the pieces are copied into a buffer, which is handed to fn while
 * the next buffer fills. Receive (in -> device): fn fills a buffer, which is copied out to the
 * pieces while fn fills the other; returns only when every copy has finished (the bytes are in
 * GPU memory). Each pinned buffer carries as many pieces as fit, GPU pieces copied in one batch
 * per buffer (cuMemcpyBatchAsync where the driver has it, else one async copy each), host pieces
 * with memcpy. A GPU piece on another device than the stager's is INVALID_ARGUMENT. */
int sc_stager_send_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err);
int sc_stager_recv_pieces(struct sc_stager *s, const struct sc_stage_piece *p, size_t n,
			  sc_stage_io_fn fn, void *ctx, struct sc_err *err);
/* Any copy that involves GPU memory: device to device on the same GPU (cuMemcpyDtoDAsync), across
 * GPUs (cuMemcpyPeerAsync), host to device and device to host (through pinned buffers, pipelined).
 * Returns when the bytes are in place. Host to host is a plain memcpy. */
int sc_gpu_copy(struct sc_gpu *g, uint8_t *dst, int dst_gpu, const uint8_t *src, int src_gpu,
		uint64_t n, struct sc_err *err);

#endif
