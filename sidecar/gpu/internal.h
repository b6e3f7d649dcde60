/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu/internal.h: the loaded CUDA driver (its entry points, resolved with cuGetProcAddress), the
 * devices and the stager pools, shared by gpu/gpu.c and gpu/stage.c only. Compiled only with the
 * CUDA toolkit's cuda.h (SC_HAVE_CUDA_H); the types and enum values are the driver's own.
 */
#ifndef SC_GPU_INTERNAL_H
#define SC_GPU_INTERNAL_H

#include "gpu/gpu.h"

#include <stdatomic.h>

#include <cuda.h>
#include <pthread.h>

/* X(name, parameter list): every driver entry point the sidecar uses. Optional ones (absent from
 * older drivers or stand-ins) are marked by being checked for NULL where used. */
#define SC_CU_REQUIRED(X)                                                                          \
	X(cuInit, (unsigned int))                                                                  \
	X(cuDriverGetVersion, (int *))                                                             \
	X(cuDeviceGetCount, (int *))                                                               \
	X(cuDeviceGet, (CUdevice *, int))                                                          \
	X(cuDeviceGetName, (char *, int, CUdevice))                                                \
	X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                            \
	X(cuDeviceTotalMem, (size_t *, CUdevice))                                                  \
	X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                             \
	X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                       \
	X(cuDevicePrimaryCtxRelease, (CUdevice))                                                   \
	X(cuCtxSetCurrent, (CUcontext))                                                            \
	X(cuMemAlloc, (CUdeviceptr *, size_t))                                                     \
	X(cuMemFree, (CUdeviceptr))                                                                \
	X(cuMemGetAddressRange, (CUdeviceptr *, size_t *, CUdeviceptr))                            \
	X(cuMemHostAlloc, (void **, size_t, unsigned int))                                         \
	X(cuMemFreeHost, (void *))                                                                 \
	X(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr))                                      \
	X(cuIpcOpenMemHandle, (CUdeviceptr *, CUipcMemHandle, unsigned int))                       \
	X(cuIpcCloseMemHandle, (CUdeviceptr))                                                      \
	X(cuStreamCreate, (CUstream *, unsigned int))                                              \
	X(cuStreamDestroy, (CUstream))                                                             \
	X(cuStreamSynchronize, (CUstream))                                                         \
	X(cuEventCreate, (CUevent *, unsigned int))                                                \
	X(cuEventDestroy, (CUevent))                                                               \
	X(cuEventRecord, (CUevent, CUstream))                                                      \
	X(cuEventSynchronize, (CUevent))                                                           \
	X(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream))                        \
	X(cuMemcpyDtoHAsync, (void *, CUdeviceptr, size_t, CUstream))                              \
	X(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                         \
	X(cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream))   \
	X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr))                       \
	X(cuCtxGetCurrent, (CUcontext *))                                                          \
	X(cuGetErrorName, (CUresult, const char **))                                               \
	X(cuGetErrorString, (CUresult, const char **))

#define SC_CU_OPTIONAL(X)                                                                          \
	X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                   \
	X(cuMemGetHandleForAddressRange,                                                           \
	  (void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long))                 \
	X(cuMemImportFromShareableHandle,                                                          \
	  (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))                     \
	X(cuMemGetAllocationGranularity,                                                           \
	  (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))               \
	X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))   \
	X(cuMemAddressFree, (CUdeviceptr, size_t))                                                 \
	X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
	X(cuMemUnmap, (CUdeviceptr, size_t))                                                       \
	X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                  \
	X(cuMemRelease, (CUmemGenericAllocationHandle))                                            \
	X(cuFlushGPUDirectRDMAWrites, (CUflushGPUDirectRDMAWritesTarget,                           \
				       CUflushGPUDirectRDMAWritesScope))

struct sc_cu {
#define SC_CU_MEMBER(name, params) CUresult (*name) params;
	SC_CU_REQUIRED(SC_CU_MEMBER)
	SC_CU_OPTIONAL(SC_CU_MEMBER)
#undef SC_CU_MEMBER
	/* cuMemcpyBatchAsync: CUDA 13's signature (driver 13.0 and later), or CUDA 12.8's, which
	 * also reports the failing copy's index; NULL when the driver has neither (gpu/gpu.c). */
	CUresult (*memcpy_batch_13)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
				    CUmemcpyAttributes *, size_t *, size_t, CUstream);
	CUresult (*memcpy_batch_12)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
				    CUmemcpyAttributes *, size_t *, size_t, size_t *, CUstream);
};

struct sc_stager {
	struct sc_stager *next; /* pool free list */
	struct sc_gpu *g;
	int device;
	CUstream stream;
	uint8_t *buf[2];   /* pinned host memory, SC_GPU_STAGE_BYTES each */
	CUevent done[2];   /* the last copy from/into buf[i] finished */
	bool pending[2];   /* done[i] recorded and not yet waited for */
	/* One batch of copies between a pinned buffer and many GPU pieces (gpu/stage.c). */
	CUdeviceptr *bdst, *bsrc;
	size_t *bsize, bn, bcap;
};

struct sc_gpu_dev {
	CUdevice dev;
	CUcontext ctx;
	struct sc_gpu_device_info info;
	struct sc_stager *free_stagers;
	int n_stagers;
	atomic_bool unhealthy; /* info.healthy is false and info.health_detail set before this */
};

struct sc_gpu {
	void *lib;
	struct sc_cu cu;
	int n;
	struct sc_gpu_dev dev[SC_GPU_MAX_DEVICES];
	pthread_mutex_t mu; /* the stager pools */
	/* Frees one pooled stager: set (under mu) by gpu/stage.c when it first pools one, called by
	 * sc_gpu_close for each stager left in the pools; NULL while the pools are empty. */
	void (*free_stager)(struct sc_gpu *g, struct sc_stager *s);
	/* cuMemCreate allocations imported by fd whose worker declared
	 * allocFlags.gpuDirectRDMACapable: the driver tells an importing process neither the flag
	 * nor CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE (both 0 on an H200, driver 13.0), so
	 * sc_gpu_rdma_capable looks here too. Under gdr_mu. */
	pthread_mutex_t gdr_mu;
	struct sc_gpu_gdr_range {
		uint64_t base, size;
		struct sc_gpu_gdr_range *next;
	} *gdr_ranges;
};

/* Make device's primary context current on this thread. */
int sc_gpu_use(struct sc_gpu *g, int device, struct sc_err *err);
/* err <- "<call>: <CUDA_ERROR_NAME> (<text>)" with code (INTERNAL unless the result says better). */
int sc_gpu_fail(struct sc_gpu *g, CUresult rc, const char *call, struct sc_err *err);

#endif
