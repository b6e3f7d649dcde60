/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/region_gpu.c: GPU regions. CreateRegion with DEVICE_KIND_CUDA allocates on a GPU
 * (cuMemAlloc, 2 MiB granules, so that the block can be shared by IPC and exported as dma-buf) and
 * hands back the IPC handle for the worker to open; RegisterRegion takes a worker's CUDA IPC handle
 * (only [offset, offset+size) of the block becomes the region: nothing else is ever exposed) or a
 * cuMemCreate file descriptor that the sidecar takes from the worker with pidfd_getfd.
 *
 * Runs on gRPC worker threads; the driver calls happen before the region is published, outside
 * the engine lock. The region owns its struct sc_gpu_mem and gives it back when its last
 * reference goes (engine/region_table.c region_free), so no backend ever touches released GPU memory.
 */
#include "engine/internal.h"
#include "base/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(struct sc_engine *eng, uint32_t device, uint64_t size, const char *name,
		 struct sc_err *err)
{
	if (sc_region_check_new(eng, size, name, err) != 0)
		return -1;
	return sc_gpu_check_device(eng->gpu, device, err);
}

/* Wrap GPU memory in a region and publish it; the memory is released on failure. */
static int add(struct sc_engine *eng, const struct sc_gpu_mem *m, const char *name,
	       const uint8_t *ipc_handle, struct sc_region_info *out, struct sc_err *err)
{
	struct sc_region *r = calloc(1, sizeof(*r));
	if (!r) {
		struct sc_gpu_mem copy = *m;
		sc_gpu_release(eng->gpu, &copy);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	sc_region_new_id(r->id);
	r->kind = SC_DEVICE_CUDA;
	r->device_index = (uint32_t)m->device;
	r->gpu = m->device;
	r->gmem = *m;
	r->gpu_info = sc_gpu_device(eng->gpu, m->device);
	r->size = m->size;
	r->base = (uint8_t *)(uintptr_t)m->addr;
	snprintf(r->name, sizeof(r->name), "%s", name ? name : "");
	if (ipc_handle) {
		memcpy(r->ipc_handle, ipc_handle, sizeof(r->ipc_handle));
		r->has_ipc_handle = true;
	}
	return sc_region_add(eng, r, out, err);
}

int sc_region_create_gpu(struct sc_engine *eng, uint64_t size, uint32_t device,
			 const char *name, struct sc_region_info *out, struct sc_err *err)
{
	if (check(eng, device, size, name, err) != 0)
		return -1;
	struct sc_gpu_mem m;
	uint8_t handle[SC_GPU_IPC_HANDLE_LEN];
	if (sc_gpu_alloc(eng->gpu, (int)device, size, &m, handle, err) != 0) {
		sc_err_prefix(err, "allocating %" PRIu64 " bytes on GPU %u", size, device);
		return -1;
	}
	if (add(eng, &m, name, handle, out, err) != 0)
		return -1;
	SC_INFO("region", "created %s: %" PRIu64 " bytes on GPU %u%s%s", out->id, size, device,
		out->name[0] ? " name=" : "", out->name);
	return 0;
}

bool sc_region_gpus_healthy(struct sc_engine *eng)
{
	return sc_gpu_count(eng->gpu) > 0 && sc_gpu_unhealthy_count(eng->gpu) == 0;
}

int sc_region_gpu_by_uuid(struct sc_engine *eng, const char *device_uuid, uint32_t *device_index,
			  struct sc_err *err)
{
	if (!device_uuid || !device_uuid[0])
		return 0;
	int index = -1;
	if (sc_gpu_find_uuid(eng->gpu, device_uuid, &index, err) != 0)
		return -1;
	*device_index = (uint32_t)index;
	return 0;
}

/*
 * PyTorch >= 2.5 hands out `untyped_storage()._share_cuda_()[1]` as a shareable handle of its
 * caching allocator: a version byte (1 or 2 so far), a type byte, then the payload. Type 'c' (a
 * cudaMalloc block) carries the 64-byte cudaIpcMemHandle_t: take it. Type 'e' (an expandable
 * segment, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) carries a pid and file descriptors of
 * cuMemCreate memory, not an IPC handle: refuse with what to do instead.
 */
#define SC_TORCH_HANDLE_LEN (2 + SC_GPU_IPC_HANDLE_LEN)

static int torch_handle(const uint8_t **handle, size_t *len, struct sc_err *err)
{
	const uint8_t *h = *handle;
	if (*len == SC_GPU_IPC_HANDLE_LEN)
		return 0;
	if (*len >= 2 && h[1] == 'e' && h[0] >= 1 && h[0] <= 2)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "cuda_ipc.handle is a PyTorch expandable-segment handle (type 'e'): "
				  "it holds cuMemCreate file descriptors, not a CUDA IPC handle. Turn "
				  "expandable segments off for memory the sidecar moves "
				  "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False), or register "
				  "cuMemCreate memory with cuda_fd");
	if (*len == SC_TORCH_HANDLE_LEN && h[1] == 'c') {
		if (h[0] < 1 || h[0] > 2)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "cuda_ipc.handle looks like a PyTorch shareable handle of "
					  "unknown version %u (known: 1, 2): send the 64-byte "
					  "cudaIpcMemHandle_t (cuIpcGetMemHandle of the block base)",
					  h[0]);
		*handle = h + 2;
		*len = SC_GPU_IPC_HANDLE_LEN;
		return 0;
	}
	return sc_err_set(err, SC_INVALID_ARGUMENT,
			  "cuda_ipc.handle must be the %d bytes of a cudaIpcMemHandle_t (or PyTorch's "
			  "%d-byte shareable handle: version, type 'c', then those 64 bytes), got %zu",
			  SC_GPU_IPC_HANDLE_LEN, SC_TORCH_HANDLE_LEN, *len);
}

int sc_region_register_cuda_ipc(struct sc_engine *eng, uint32_t device_index,
				const uint8_t *handle, size_t handle_len, uint64_t offset,
				uint64_t size, const char *name, struct sc_region_info *out,
				struct sc_err *err)
{
	if (torch_handle(&handle, &handle_len, err) != 0)
		return -1;
	if (check(eng, device_index, size, name, err) != 0)
		return -1;
	struct sc_gpu_mem m;
	if (sc_gpu_open_ipc(eng->gpu, (int)device_index, handle, offset, size, &m, err) != 0)
		return -1;
	if (add(eng, &m, name, NULL, out, err) != 0)
		return -1;
	SC_INFO("region", "registered %s: CUDA IPC memory on GPU %u, offset %" PRIu64
		" size %" PRIu64,
		out->id, device_index, offset, size);
	return 0;
}

int sc_region_register_cuda_fd(struct sc_engine *eng, uint32_t device_index, int pid, int fd,
			       uint64_t offset, uint64_t size, uint64_t allocation_size,
			       bool declared_gdr, const char *name, struct sc_region_info *out,
			       struct sc_err *err)
{
	if (pid <= 0 || fd < 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "cuda_fd needs the worker's pid (> 0) and fd (>= 0), got pid %d "
				  "fd %d",
				  pid, fd);
	if (check(eng, device_index, size, name, err) != 0)
		return -1;
	struct sc_gpu_mem m;
	if (sc_gpu_import_fd(eng->gpu, (int)device_index, pid, fd, offset, size, allocation_size,
			     declared_gdr, &m, err) != 0)
		return -1;
	if (add(eng, &m, name, NULL, out, err) != 0)
		return -1;
	SC_INFO("region", "registered %s: cuMemCreate memory of pid %d fd %d on GPU %u, offset "
			  "%" PRIu64 " size %" PRIu64,
		out->id, pid, fd, device_index, offset, size);
	return 0;
}
