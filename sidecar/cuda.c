/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda.c: finds the CUDA driver at run time (dlopen "libcuda.so.1"), so one binary runs on hosts
 * with and without GPUs, and reports what it found for GetInfo. Main thread, at start-up.
 * Holds no state: the probe closes the library again.
 */
#include "engine_internal.h"

#include <dlfcn.h>
#include <stdio.h>

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_version_fn)(int *);

void sc_cuda_probe(bool *available, char *detail, size_t cap)
{
	*available = false;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(detail, cap, "CUDA driver not found (dlopen libcuda.so.1: %s)", dlerror());
		return;
	}
	cu_init_fn cu_init = (cu_init_fn)dlsym(lib, "cuInit");
	cu_count_fn cu_count = (cu_count_fn)dlsym(lib, "cuDeviceGetCount");
	cu_version_fn cu_version = (cu_version_fn)dlsym(lib, "cuDriverGetVersion");
	int count = 0, version = 0, rc;
	if (!cu_init || !cu_count || !cu_version) {
		snprintf(detail, cap, "libcuda.so.1 lacks cuInit/cuDeviceGetCount");
	} else if ((rc = cu_init(0)) != 0) {
		snprintf(detail, cap, "cuInit failed with CUresult %d (no usable GPU or driver)", rc);
	} else if ((rc = cu_count(&count)) != 0 || count == 0) {
		snprintf(detail, cap, "CUDA driver found but no GPU (CUresult %d, %d devices)", rc,
			 count);
	} else {
		cu_version(&version);
		snprintf(detail, cap,
			 "CUDA driver %d.%d, %d device(s); GPU regions are not supported by this "
			 "build yet",
			 version / 1000, (version % 1000) / 10, count);
		*available = false;
	}
	dlclose(lib);
}
