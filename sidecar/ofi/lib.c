/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ofi/lib.c: libfabric loaded at run time (ofi_lib_load). The binary does not link it, so it runs
 * where libfabric is not installed, and libfabric's library constructors do not run in every
 * process: Debian's libfabric1 pulls in libpsm_infinipath/libinfinipath, whose constructor
 * installs handlers for SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV and SIGTERM that print a
 * backtrace and exit (a crash then leaves no core and no signal status, and a sanitizer's own
 * handler is replaced). Before the dlopen, IPATH_NO_BACKTRACE and HFI_NO_BACKTRACE turn those
 * handlers off (unless the operator set them). Only the few functions libfabric exports are
 * looked up: the rest of its API is inline calls through the objects' ops tables.
 * Threads: the first ofi_lib_load (the main thread, when the backend is created) loads; the
 * table is read-only afterwards and never unloaded.
 */
#include "ofi/internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct ofi_lib ofi_fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[256];

static void load(void)
{
	setenv("IPATH_NO_BACKTRACE", "1", 0);
	setenv("HFI_NO_BACKTRACE", "1", 0);
	const char *path = getenv("RDMA_SIDECAR_LIBFABRIC");
	if (!path || !path[0])
		path = "libfabric.so.1";
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(load_error, sizeof(load_error),
			 "libfabric not found (dlopen %s: %s; Debian: apt-get install libfabric1)",
			 path, dlerror());
		return;
	}
	struct {
		const char *name;
		void **slot;
	} syms[] = {
	    {"fi_getinfo", (void **)&ofi_fn.getinfo},
	    {"fi_freeinfo", (void **)&ofi_fn.freeinfo},
	    {"fi_dupinfo", (void **)&ofi_fn.dupinfo},
	    {"fi_fabric", (void **)&ofi_fn.fabric},
	    {"fi_strerror", (void **)&ofi_fn.strerror},
	    {"fi_version", (void **)&ofi_fn.version},
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (!*syms[i].slot) {
			snprintf(load_error, sizeof(load_error), "%s lacks %s: not a libfabric 1.x",
				 path, syms[i].name);
			ofi_fn.getinfo = NULL;
			dlclose(h);
			return;
		}
	}
	if (FI_MAJOR(ofi_fn.version()) != 1 || ofi_fn.version() < OFI_API_VERSION) {
		snprintf(load_error, sizeof(load_error),
			 "%s is libfabric %u.%u: this backend needs 1.%u or newer in the 1.x line",
			 path, FI_MAJOR(ofi_fn.version()), FI_MINOR(ofi_fn.version()),
			 FI_MINOR(OFI_API_VERSION));
		ofi_fn.getinfo = NULL;
		dlclose(h);
		return;
	}
	ofi_fn.loaded = true;
}

int ofi_lib_load(char *why, size_t cap)
{
	pthread_once(&once, load);
	if (ofi_fn.loaded)
		return 0;
	snprintf(why, cap, "%s", load_error);
	return -1;
}
