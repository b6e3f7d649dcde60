/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_cuda.c: a STAND-IN for the CUDA driver library (libcuda.so.1), for tests on machines without
 * a GPU. It is not a GPU and proves nothing about one. It implements, over host memory, the driver
 * entry points the sidecar uses, with CUDA's own types and CUresult codes (compiled against the
 * toolkit's cuda.h), so that the sidecar's CUDA module, its error paths and its control logic run on
 * CI. The tests select it with SC_TEST_CUDA_DRIVER=<path of this library>; see README.md beside it.
 *
 * What it models: devices and their attributes, primary contexts current per thread (calls without
 * a current context fail with CUDA_ERROR_INVALID_CONTEXT), device memory that host code can NOT
 * dereference (device addresses lie in a PROT_NONE window, so a host memcpy of a device pointer
 * crashes), bounds-checked copies, pinned and registered host memory, streams that really run
 * asynchronously (one worker thread per stream, in order), events, legacy IPC handles that work
 * across processes of one uid (the bytes live in files under /dev/shm), the virtual memory API with
 * real POSIX fds (memfd) that another process can take with pidfd_getfd, dma-buf export answering
 * "not supported", and injected copy failures.
 * What it cannot prove: anything about real DMA engines, PCIe, NVLink or GPUDirect RDMA, real IPC
 * semantics (one open per context, peer access), timing and bandwidth, memory ordering against
 * kernels, sticky context errors (an injected failure is reported once, then the stream goes on),
 * the legacy default stream's implicit synchronization (stream 0 here simply runs synchronously).
 *
 * Threads: any caller thread; one worker thread per stream (created by cuStreamCreate, joined by
 * cuStreamDestroy). All state lives under one mutex (g_mu) with one condition variable (g_cv,
 * broadcast on every change); bytes are copied outside the lock.
 * Owns: the address window, the allocation table, its backing files and mappings, streams, events.
 */
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FC_MAX_DEV 16
#define FC_GRAN ((size_t)2 << 20)		    /* allocation alignment and VMM granularity */
#define FC_TOTAL_MEM ((size_t)16 << 30)		    /* what cuDeviceTotalMem reports */
#define FC_IPC_MAGIC 0x31554346u		    /* "FCU1" */
#define FC_NAME_PREFIX "sc-fakecuda-"
#define FC_MEMFD_PREFIX "sc-fakecuda-vmm-dev"
#define FC_CTX_STACK 16

struct CUctx_st {
	int dev;
	int refs; /* primary context retain count; 0: inactive */
};

enum fc_kind { FC_DEV_ALLOC, FC_DEV_IPC, FC_DEV_VMM, FC_HOST_ALLOC, FC_HOST_REG };

/* One entry of the allocation table: a device range (in the window) or a pinned host range. */
struct fc_map {
	uintptr_t addr; /* device address in the window, or the host address itself */
	size_t size;	/* exact size asked for: copies are checked against it */
	char *host;	/* where the bytes are */
	size_t map_len; /* length of the host mapping (munmap), 0 for registered memory */
	enum fc_kind kind;
	int dev;
	bool accessible;      /* VMM: cuMemSetAccess done */
	char name[40];	      /* FC_DEV_ALLOC: backing file, unlinked at cuMemFree; FC_DEV_IPC: the handle's */
	int ipc_refs;	      /* FC_DEV_IPC: opens of the same handle in this context */
	int ipc_ctx_dev;      /* FC_DEV_IPC: the device of the context that opened it */
	struct fc_phys *phys; /* FC_DEV_VMM */
	struct fc_map *next;
};

/* A cuMemCreate (or imported) physical allocation: a memfd. */
struct fc_phys {
	CUmemGenericAllocationHandle id;
	int fd;
	size_t size;
	int dev;
	int refs; /* the handle (until cuMemRelease) + one per cuMemMap */
	bool released;
	CUmemAllocationHandleType types;
	bool gdr; /* allocFlags.gpuDirectRDMACapable */
	struct fc_phys *next;
};

struct fc_resv {
	uintptr_t addr;
	size_t size;
	struct fc_resv *next;
};

enum fc_task_kind { FC_T_COPY, FC_T_SET, FC_T_RECORD, FC_T_WAIT };

struct fc_task {
	enum fc_task_kind kind;
	char *dst;
	const char *src;
	size_t n;
	int val;
	bool fail;
	bool free_src; /* src is the stand-in's own staging copy (a late pageable copy) */
	struct CUevent_st *ev;
	unsigned long seq;
	struct fc_task *next;
};

struct CUstream_st {
	pthread_t th;
	struct fc_task *head, *tail;
	bool stop;
	CUresult err; /* an injected failure not yet reported */
	unsigned long queued, done; /* tasks ever queued / finished */
	struct CUctx_st *ctx;
	struct CUstream_st *next;
};

struct CUevent_st {
	unsigned long recorded, reached;
	CUresult err;
	struct CUstream_st *stream; /* where last recorded; cleared when it is destroyed */
	int pending;		    /* queued tasks naming this event */
	bool destroyed;
	unsigned flags; /* CU_EVENT_BLOCKING_SYNC: cuEventSynchronize sleeps; else it spins */
	struct CUevent_st *next;
};

enum fc_dir { FC_HTOD = 1, FC_DTOH, FC_DTOD, FC_HTOH };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static atomic_int g_inited;
static int g_ndev;
static struct CUctx_st g_ctx[FC_MAX_DEV];
static char *g_win;
static size_t g_win_size, g_win_next;
static struct fc_map *g_maps;
static struct fc_phys *g_phys;
static struct fc_resv *g_resv;
static struct CUstream_st *g_streams;
static struct CUstream_st *g_legacy[FC_MAX_DEV]; /* hidden: the DMA of pageable HtoD copies */
static struct CUevent_st *g_events;
static unsigned long g_inflight; /* queued stream tasks, all streams */
static unsigned long g_counter;
static CUmemGenericAllocationHandle g_phys_next = 0x5c000;
static unsigned long g_copies;
static long g_fail_at;
static int g_fail_dir;
static unsigned g_delay_us;
static char g_dir[256] = "/dev/shm";
static bool g_sticky_on = true;		     /* FAKE_CUDA_STICKY */
static CUresult g_fail_err = CUDA_ERROR_ILLEGAL_ADDRESS; /* FAKE_CUDA_FAIL_COPY_ERROR */
static CUresult g_sticky[FC_MAX_DEV];	     /* a device's context is poisoned by this error */
static bool g_dmabuf;			     /* FAKE_CUDA_DMA_BUF */
static bool g_gdr;			     /* FAKE_CUDA_GDR */
/* Each device's PCI address: FAKE_CUDA_PCI_BUS_IDS, else 0000:(N+1):00.0. */
static struct fc_pci {
	unsigned domain, bus, dev, func;
	char text[32]; /* what cuDeviceGetPCIBusId returns: the list's entry as written */
} g_pci[FC_MAX_DEV];
static unsigned long g_batch_calls;	     /* cuMemcpyBatchAsync calls: see FAKE_CUDA_STATS */
static unsigned long g_copy_calls;	     /* cuMemcpyHtoDAsync / cuMemcpyDtoHAsync calls */

static _Thread_local struct CUctx_st *tl_stack[FC_CTX_STACK];
static _Thread_local int tl_depth;

/* ---- helpers (callers hold g_mu unless said otherwise) ---------------------------------------- */

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

static struct CUctx_st *cur_ctx(void)
{
	return tl_depth > 0 ? tl_stack[tl_depth - 1] : NULL;
}

static CUresult ready(void)
{
	return atomic_load(&g_inited) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* The calling thread's current context, or why there is none. */
static CUresult need_ctx(struct CUctx_st **out)
{
	struct CUctx_st *c = cur_ctx();

	if (!atomic_load(&g_inited))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!c || c->refs <= 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (g_sticky[c->dev])
		return g_sticky[c->dev]; /* a poisoned context: every call fails until the process ends */
	if (out)
		*out = c;
	return CUDA_SUCCESS;
}

static bool in_window(uintptr_t p)
{
	return g_win && p >= (uintptr_t)g_win && p < (uintptr_t)g_win + g_win_size;
}

/* A fresh 2 MiB-aligned device range with a 2 MiB unmapped guard after it; never reused, so a
 * stale pointer stays invalid. 0 when the window is exhausted. */
static uintptr_t win_take(size_t size, size_t align)
{
	uintptr_t base = (uintptr_t)g_win;
	size_t off = round_up(base + g_win_next, align < FC_GRAN ? FC_GRAN : align) - base; /* absolute alignment */
	size_t len = round_up(size ? size : 1, FC_GRAN) + FC_GRAN;

	if (off > g_win_size || len > g_win_size - off)
		return 0;
	g_win_next = off + len;
	return base + off;
}

static struct fc_map *find_map(uintptr_t p)
{
	for (struct fc_map *m = g_maps; m; m = m->next)
		if (p >= m->addr && p - m->addr < m->size)
			return m;
	return NULL;
}

static bool is_dev(const struct fc_map *m)
{
	return m->kind == FC_DEV_ALLOC || m->kind == FC_DEV_IPC || m->kind == FC_DEV_VMM;
}

static void unlink_map(struct fc_map *m)
{
	for (struct fc_map **pp = &g_maps; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			return;
		}
}

/* Host bytes behind the device range [p, p+n): every copy goes through here. */
static CUresult dev_span(CUdeviceptr p, size_t n, char **host)
{
	struct fc_map *m = find_map((uintptr_t)p);

	if (!m || !is_dev(m))
		return CUDA_ERROR_INVALID_VALUE;
	if (n > m->size - ((uintptr_t)p - m->addr))
		return CUDA_ERROR_INVALID_VALUE;
	if (!m->accessible)
		return CUDA_ERROR_INVALID_VALUE;
	*host = m->host + ((uintptr_t)p - m->addr);
	return CUDA_SUCCESS;
}

/* Unified addressing: a device address is translated, anything else is taken as host memory. */
static CUresult any_span(CUdeviceptr p, size_t n, char **host, bool *dev)
{
	*dev = in_window((uintptr_t)p);
	if (*dev)
		return dev_span(p, n, host);
	*host = (char *)(uintptr_t)p;
	return CUDA_SUCCESS;
}

/* Is [p, p+n) pinned (cuMemHostAlloc) or registered (cuMemHostRegister) host memory? */
static bool host_pinned(const char *p, size_t n)
{
	struct fc_map *m = find_map((uintptr_t)p);

	return m && !is_dev(m) && n <= m->size - ((uintptr_t)p - m->addr);
}

/* Wait until no stream has queued work: frees must not pull memory from under a queued copy. */
static void wait_idle(void)
{
	while (g_inflight > 0)
		pthread_cond_wait(&g_cv, &g_mu);
}

/* Counts a copy for FAKE_CUDA_FAIL_COPY_AT; true when this one must fail. */
static bool copy_fails(enum fc_dir dir)
{
	if (g_fail_dir && g_fail_dir != (int)dir)
		return false;
	g_copies++;
	return g_fail_at > 0 && g_copies == (unsigned long)g_fail_at;
}

/* An illegal address poisons the context of that device (the real driver's sticky errors). */
static void poison(int dev)
{
	if (g_sticky_on && g_fail_err == CUDA_ERROR_ILLEGAL_ADDRESS && dev >= 0 && dev < FC_MAX_DEV &&
	    !g_sticky[dev])
		g_sticky[dev] = CUDA_ERROR_ILLEGAL_ADDRESS;
}

static bool sync_stream(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* An injected failure is reported once: clear it on the stream and on events recorded after it. */
static void clear_stream_err(struct CUstream_st *s)
{
	s->err = CUDA_SUCCESS;
	for (struct CUevent_st *e = g_events; e; e = e->next)
		if (e->stream == s)
			e->err = CUDA_SUCCESS;
}

static bool stream_known(CUstream s)
{
	for (struct CUstream_st *x = g_streams; x; x = x->next)
		if (x == s)
			return true;
	return false;
}

static bool event_known(CUevent e)
{
	for (struct CUevent_st *x = g_events; x; x = x->next)
		if (x == e && !x->destroyed)
			return true;
	return false;
}

static void event_unlink_free(struct CUevent_st *e)
{
	for (struct CUevent_st **pp = &g_events; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	free(e);
}

static void enqueue(struct CUstream_st *s, struct fc_task *t)
{
	t->next = NULL;
	if (s->tail)
		s->tail->next = t;
	else
		s->head = t;
	s->tail = t;
	s->queued++;
	g_inflight++;
	pthread_cond_broadcast(&g_cv);
}

static void *stream_main(void *arg)
{
	struct CUstream_st *s = arg;

	pthread_mutex_lock(&g_mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&g_cv, &g_mu);
		if (!s->head)
			break;
		struct fc_task *t = s->head;
		switch (t->kind) {
		case FC_T_WAIT:
			while (t->ev->reached < t->seq)
				pthread_cond_wait(&g_cv, &g_mu);
			break;
		case FC_T_RECORD:
			if (t->seq > t->ev->reached)
				t->ev->reached = t->seq;
			t->ev->err = s->err;
			break;
		case FC_T_COPY:
		case FC_T_SET:
			pthread_mutex_unlock(&g_mu);
			if (t->kind == FC_T_COPY && g_delay_us) {
				struct timespec d = {.tv_sec = g_delay_us / 1000000,
						     .tv_nsec = (long)(g_delay_us % 1000000) * 1000};
				nanosleep(&d, NULL);
			}
			if (!t->fail && t->n) {
				if (t->kind == FC_T_COPY)
					memmove(t->dst, t->src, t->n);
				else
					memset(t->dst, t->val, t->n);
			}
			if (t->free_src)
				free((void *)t->src);
			pthread_mutex_lock(&g_mu);
			if (t->fail && s->err == CUDA_SUCCESS)
				s->err = g_fail_err;
			if (t->fail)
				poison(s->ctx->dev);
			break;
		}
		if (t->ev && --t->ev->pending == 0 && t->ev->destroyed)
			event_unlink_free(t->ev);
		s->head = t->next;
		if (!s->head)
			s->tail = NULL;
		free(t);
		s->done++;
		g_inflight--;
		pthread_cond_broadcast(&g_cv);
	}
	pthread_mutex_unlock(&g_mu);
	return NULL;
}

static void *stream_main(void *arg);

/* The legacy stream's DMA queue of a context: where a synchronous HtoD copy from pageable memory
 * finishes after the call returned. Created on first use; lives until the process ends. */
static struct CUstream_st *legacy_queue(struct CUctx_st *c)
{
	struct CUstream_st *s = g_legacy[c->dev];

	if (s)
		return s;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->ctx = c;
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		free(s);
		return NULL;
	}
	pthread_detach(s->th);
	s->next = g_streams;
	g_streams = s;
	g_legacy[c->dev] = s;
	return s;
}

/* Later work on the legacy stream (every synchronous call) waits for the late copies before it. */
static void legacy_drain(struct CUctx_st *c)
{
	struct CUstream_st *s = c ? g_legacy[c->dev] : NULL;

	while (s && s->done < s->queued)
		pthread_cond_wait(&g_cv, &g_mu);
}

/* One copy, sync or async. dst_kind/src_kind: 1 device, 0 host, -1 either (unified). */
static CUresult submit_copy(uintptr_t dst, int dst_kind, uintptr_t src, int src_kind, size_t n, CUstream s,
			    bool async)
{
	char *d = NULL, *sp = NULL;
	bool dd = dst_kind == 1, sd = src_kind == 1;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	if (async && !sync_stream(s) && !stream_known(s)) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (n == 0)
		goto out;
	if (dst_kind < 0)
		r = any_span(dst, n, &d, &dd);
	else if (dst_kind == 1)
		r = dev_span(dst, n, &d);
	else
		d = (char *)dst;
	if (r)
		goto out;
	if (src_kind < 0)
		r = any_span(src, n, &sp, &sd);
	else if (src_kind == 1)
		r = dev_span(src, n, &sp);
	else
		sp = (char *)src;
	if (r)
		goto out;
	if (!d || !sp) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	enum fc_dir dir = dd ? (sd ? FC_DTOD : FC_HTOD) : (sd ? FC_DTOH : FC_HTOH);
	bool fail = copy_fails(dir);
	/* Pageable host memory, as with the real driver: the call returns only once the copy is done
	 * (in stream order), so the caller may reuse its buffer at once. Pinned memory: asynchronous. */
	bool pageable = (!dd && !host_pinned(d, n)) || (!sd && !host_pinned(sp, n));
	if (!async || sync_stream(s)) {
		legacy_drain(cur_ctx());
		/* The driver's documented synchronous behaviour: "for transfers from pageable host
		 * memory to device memory, ... the function returns once the pageable buffer has been
		 * copied to the staging memory for DMA transfer to device memory, but the DMA to final
		 * destination may not have completed". So: stage, return, land later. */
		struct CUstream_st *q = dd && !sd && pageable && n ? legacy_queue(cur_ctx()) : NULL;
		char *stage = q ? malloc(n) : NULL;
		struct fc_task *lt = stage ? calloc(1, sizeof(*lt)) : NULL;
		if (lt) {
			memcpy(stage, sp, n);
			lt->kind = FC_T_COPY;
			lt->dst = d;
			lt->src = stage;
			lt->free_src = true;
			lt->n = n;
			lt->fail = fail;
			enqueue(q, lt);
			pthread_mutex_unlock(&g_mu);
			return CUDA_SUCCESS; /* a failure shows at the next synchronisation */
		}
		free(stage);
		if (fail)
			poison(cur_ctx()->dev);
		pthread_mutex_unlock(&g_mu);
		if (fail)
			return g_fail_err;
		memmove(d, sp, n);
		return CUDA_SUCCESS;
	}
	struct fc_task *t = calloc(1, sizeof(*t));
	if (!t) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	t->kind = FC_T_COPY;
	t->dst = d;
	t->src = sp;
	t->n = n;
	t->fail = fail;
	enqueue(s, t);
	if (pageable) {
		unsigned long mine = s->queued;
		while (s->done < mine)
			pthread_cond_wait(&g_cv, &g_mu);
	}
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

static CUresult submit_set(CUdeviceptr dst, unsigned char v, size_t n, CUstream s, bool async)
{
	char *d;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (!r && async && !sync_stream(s) && !stream_known(s))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (!r && n)
		r = dev_span(dst, n, &d);
	if (r || !n)
		goto out;
	if (!async || sync_stream(s)) {
		pthread_mutex_unlock(&g_mu);
		memset(d, v, n);
		return CUDA_SUCCESS;
	}
	struct fc_task *t = calloc(1, sizeof(*t));
	if (!t) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	t->kind = FC_T_SET;
	t->dst = d;
	t->n = n;
	t->val = v;
	enqueue(s, t);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- errors ---------------------------------------------------------------------------------- */

#define FC_ERRORS(X)                                                                                      \
	X(CUDA_SUCCESS, "no error")                                                                      \
	X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                                  \
	X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                     \
	X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                            \
	X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                              \
	X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                    \
	X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                           \
	X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                          \
	X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                                 \
	X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                                      \
	X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                          \
	X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                          \
	X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                                \
	X(CUDA_ERROR_NOT_READY, "device not ready")                                                      \
	X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                        \
	X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                        \
	X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
	X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                       \
	X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                                     \
	  "part or all of the requested memory range is already mapped")                                \
	X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
	X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                           \
	X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                           \
	X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")           \
	X(CUDA_ERROR_ILLEGAL_STATE, "the operation is not permitted in the current state")               \
	X(CUDA_ERROR_UNKNOWN, "unknown error")

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
#define FC_NAME(code, text)                  \
	if (error == code) {                 \
		*pStr = #code;               \
		return CUDA_SUCCESS;         \
	}
	FC_ERRORS(FC_NAME)
#undef FC_NAME
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
#define FC_TEXT(code, text)                  \
	if (error == code) {                 \
		*pStr = text;                \
		return CUDA_SUCCESS;         \
	}
	FC_ERRORS(FC_TEXT)
#undef FC_TEXT
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---- initialization, devices ----------------------------------------------------------------- */

static long env_long(const char *name, long dflt)
{
	const char *v = getenv(name);
	char *end;

	if (!v || !*v)
		return dflt;
	errno = 0;
	long x = strtol(v, &end, 10);
	return errno || *end ? dflt : x;
}

/* FAKE_CUDA_PCI_BUS_IDS="0000:17:00.0,00000000:3a:00.0,...": device N takes entry N (so stand-in GPUs
 * can sit where a topology fixture's GPUs are); devices past the list keep the default. An entry
 * that is not "domain:bus:device.function" (hex) fails cuInit, loudly: the test is wrong. */
static int parse_pci_bus_ids(void)
{
	const char *v = getenv("FAKE_CUDA_PCI_BUS_IDS");

	for (int i = 0; i < FC_MAX_DEV; i++) {
		g_pci[i] = (struct fc_pci){.bus = (unsigned)i + 1};
		snprintf(g_pci[i].text, sizeof(g_pci[i].text), "0000:%02x:00.0", (unsigned)i + 1);
	}
	for (int i = 0; v && *v && i < FC_MAX_DEV; i++) {
		size_t len = strcspn(v, ",");
		char one[32];
		struct fc_pci p = {0};
		int used = 0;
		if (len == 0 || len >= sizeof(one))
			goto bad;
		memcpy(one, v, len);
		one[len] = '\0';
		if (sscanf(one, "%x:%x:%x.%x%n", &p.domain, &p.bus, &p.dev, &p.func, &used) != 4 ||
		    used != (int)len || p.bus > 0xff || p.dev > 0x1f || p.func > 7)
			goto bad;
		snprintf(p.text, sizeof(p.text), "%s", one);
		g_pci[i] = p;
		v += len + (v[len] == ',');
		continue;
bad:
		fprintf(stderr, "fake_cuda: FAKE_CUDA_PCI_BUS_IDS entry %d is not a PCI address "
				"(dddd:bb:dd.f): %.*s\n", i, (int)len, v);
		return -1;
	}
	return 0;
}

CUresult cuInit(unsigned int Flags)
{
	CUresult r = CUDA_SUCCESS;

	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_mu);
	if (atomic_load(&g_inited))
		goto out;
	long n = env_long("FAKE_CUDA_DEVICES", 2);
	if (n <= 0) {
		r = CUDA_ERROR_NO_DEVICE;
		goto out;
	}
	g_ndev = n > FC_MAX_DEV ? FC_MAX_DEV : (int)n;
	for (int i = 0; i < g_ndev; i++)
		g_ctx[i].dev = i;
	if (parse_pci_bus_ids()) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	g_fail_at = env_long("FAKE_CUDA_FAIL_COPY_AT", 0);
	g_delay_us = (unsigned)env_long("FAKE_CUDA_COPY_DELAY_US", 0);
	const char *dir = getenv("FAKE_CUDA_FAIL_COPY_DIR");
	g_fail_dir = !dir ? 0 : !strcmp(dir, "HtoD") ? FC_HTOD : !strcmp(dir, "DtoH") ? FC_DTOH
			       : !strcmp(dir, "DtoD") ? FC_DTOD : 0;
	g_sticky_on = env_long("FAKE_CUDA_STICKY", 1) != 0;
	g_fail_err = (CUresult)env_long("FAKE_CUDA_FAIL_COPY_ERROR", CUDA_ERROR_ILLEGAL_ADDRESS);
	g_dmabuf = env_long("FAKE_CUDA_DMA_BUF", 0) != 0;
	g_gdr = env_long("FAKE_CUDA_GDR", 0) != 0;
	const char *shm = getenv("FAKE_CUDA_SHM_DIR");
	if (shm && *shm)
		snprintf(g_dir, sizeof(g_dir), "%s", shm);
	/* The device address window: reserved, never readable from host code. */
	/* Smaller fallbacks for valgrind, which refuses huge reservations. */
	static const size_t sizes[] = {(size_t)1 << 40, (size_t)256 << 30, (size_t)64 << 30,
				       (size_t)8 << 30, (size_t)2 << 30};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		void *w = mmap(NULL, sizes[i], PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (w != MAP_FAILED) {
			g_win = w;
			g_win_size = sizes[i];
			g_win_next = 0;
			break;
		}
	}
	if (!g_win) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	atomic_store(&g_inited, 1);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
	CUresult r = ready();

	if (r)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = g_ndev;
	return CUDA_SUCCESS;
}

static CUresult check_dev(CUdevice dev)
{
	CUresult r = ready();

	if (r)
		return r;
	return dev >= 0 && dev < g_ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	CUresult r = check_dev(ordinal);

	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "Stand-in GPU %d (host memory)", dev);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(pciBusId, (size_t)len, "%s", g_pci[dev].text);
	return CUDA_SUCCESS;
}

/* "GPU-5c0ffee0-0000-4000-8000-0000000000NN": stable per device number, as a real GPU's UUID is
 * per board (a test can tell devices apart whatever index a process gives them). */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	static const unsigned char head[10] = {0x5c, 0x0f, 0xfe, 0xe0, 0, 0, 0x40, 0, 0x80, 0};
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	memset(uuid->bytes, 0, sizeof(uuid->bytes));
	memcpy(uuid->bytes, head, sizeof(head));
	uuid->bytes[15] = (char)dev;
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = FC_TOTAL_MEM;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*pi = 9;
		break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*pi = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		*pi = (int)g_pci[dev].bus;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
		*pi = (int)g_pci[dev].dev;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		*pi = (int)g_pci[dev].domain;
		break;
	case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
		*pi = g_dmabuf;
		break;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
		*pi = g_gdr;
		break;
	default: /* COMPUTE_CAPABILITY_MINOR, DMA_BUF_SUPPORTED, GPU_DIRECT_RDMA_SUPPORTED, the rest */
		*pi = 0;
		break;
	}
	return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	CUresult r = need_ctx(NULL);

	if (r)
		return r;
	if (free_bytes)
		*free_bytes = FC_TOTAL_MEM;
	if (total)
		*total = FC_TOTAL_MEM;
	return CUDA_SUCCESS;
}

/* ---- contexts -------------------------------------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_mu);
	g_ctx[dev].refs++;
	*pctx = &g_ctx[dev];
	pthread_mutex_unlock(&g_mu);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = check_dev(dev);

	if (r)
		return r;
	pthread_mutex_lock(&g_mu);
	if (g_ctx[dev].refs <= 0)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		g_ctx[dev].refs--;
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	CUresult r = ready();

	if (r)
		return r;
	if (ctx && (ctx < &g_ctx[0] || ctx >= &g_ctx[g_ndev]))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!ctx) {
		if (tl_depth > 0)
			tl_depth--;
	} else if (tl_depth == 0) {
		tl_stack[tl_depth++] = ctx;
	} else {
		tl_stack[tl_depth - 1] = ctx;
	}
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	CUresult r = ready();

	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = cur_ctx();
	return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	CUresult r = ready();

	if (r)
		return r;
	if (!ctx || ctx < &g_ctx[0] || ctx >= &g_ctx[g_ndev])
		return CUDA_ERROR_INVALID_CONTEXT;
	if (tl_depth >= FC_CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	tl_stack[tl_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	CUresult r = ready();

	if (r)
		return r;
	if (tl_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	tl_depth--;
	if (pctx)
		*pctx = tl_stack[tl_depth];
	return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
	struct CUctx_st *c;
	CUresult r = need_ctx(&c);

	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = c->dev;
	return CUDA_SUCCESS;
}

/* Waits for every stream; reports (and clears) an injected failure not yet reported. */
CUresult cuCtxSynchronize(void)
{
	CUresult r = need_ctx(NULL);

	if (r)
		return r;
	pthread_mutex_lock(&g_mu);
	wait_idle();
	for (struct CUstream_st *s = g_streams; s; s = s->next)
		if (s->err && !r) {
			r = s->err;
			clear_stream_err(s);
		}
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- device memory --------------------------------------------------------------------------- */

/* A backing file under g_dir, mapped shared; the fd is closed. */
static CUresult backing_create(size_t size, char name[40], char **host, size_t *map_len)
{
	char path[320];
	uint32_t rnd = 0;
	int fd;

	if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		rnd = (uint32_t)time(NULL);
	snprintf(name, 40, FC_NAME_PREFIX "%d-%lu-%08" PRIx32, (int)getpid(), ++g_counter, rnd);
	snprintf(path, sizeof(path), "%s/%s", g_dir, name);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*map_len = round_up(size, (size_t)sysconf(_SC_PAGESIZE));
	if (ftruncate(fd, (off_t)*map_len) != 0)
		goto fail;
	*host = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*host == MAP_FAILED)
		goto fail;
	close(fd);
	return CUDA_SUCCESS;
fail:
	close(fd);
	unlink(path);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

static void backing_unlink(const char *name)
{
	char path[320];

	snprintf(path, sizeof(path), "%s/%s", g_dir, name);
	unlink(path);
}

/* At exit the real driver frees a process's device memory: unlink the backing files this process
 * still owns (not those of a parent it was forked from). A crash leaves them behind.
 * FAKE_CUDA_STATS=FILE: append "copy_calls=N batch_calls=N" (host<->device async copy calls and
 * cuMemcpyBatchAsync calls of this process), so a test can see how many driver calls a transfer
 * took. */
__attribute__((destructor)) static void fc_at_exit(void)
{
	char own[24];
	const char *stats = getenv("FAKE_CUDA_STATS");
	if (stats && *stats) {
		FILE *f = fopen(stats, "a");
		if (f) {
			fprintf(f, "copy_calls=%lu batch_calls=%lu\n",
				__atomic_load_n(&g_copy_calls, __ATOMIC_RELAXED),
				__atomic_load_n(&g_batch_calls, __ATOMIC_RELAXED));
			fclose(f);
		}
	}
	bool locked = pthread_mutex_trylock(&g_mu) == 0;

	snprintf(own, sizeof(own), FC_NAME_PREFIX "%d-", (int)getpid());
	for (struct fc_map *m = g_maps; m; m = m->next)
		if (m->kind == FC_DEV_ALLOC && !strncmp(m->name, own, strlen(own)))
			backing_unlink(m->name);
	if (locked)
		pthread_mutex_unlock(&g_mu);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	struct CUctx_st *c;
	struct fc_map *m = NULL;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(&c);
	if (r)
		goto out;
	if (!dptr || bytesize == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (bytesize > FC_TOTAL_MEM) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->addr = win_take(bytesize, FC_GRAN);
	if (!m->addr) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	r = backing_create(bytesize, m->name, &m->host, &m->map_len);
	if (r)
		goto out;
	m->size = bytesize;
	m->kind = FC_DEV_ALLOC;
	m->dev = c->dev;
	m->accessible = true;
	m->next = g_maps;
	g_maps = m;
	*dptr = (CUdeviceptr)m->addr;
	m = NULL;
out:
	free(m);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r || dptr == 0)
		goto out;
	wait_idle(); /* like the real cuMemFree, which synchronizes */
	m = find_map((uintptr_t)dptr);
	if (!m || m->kind != FC_DEV_ALLOC || m->addr != (uintptr_t)dptr) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	unlink_map(m);
	munmap(m->host, m->map_len);
	backing_unlink(m->name);
	free(m);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	m = find_map((uintptr_t)dptr);
	if (!m || !is_dev(m)) {
		r = CUDA_ERROR_NOT_FOUND;
		goto out;
	}
	if (pbase)
		*pbase = (CUdeviceptr)m->addr;
	if (psize)
		*psize = m->size;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	struct fc_map *m;
	CUresult r = ready();

	if (r)
		return r;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_mu);
	m = find_map((uintptr_t)ptr);
	if (!m) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = m->dev;
		break;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = &g_ctx[m->dev];
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = is_dev(m) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: /* unified addressing: the same address */
		*(CUdeviceptr *)data = ptr;
		break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (is_dev(m))
			r = CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
		else
			*(void **)data = (void *)(uintptr_t)ptr;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(unsigned int *)data = 0;
		break;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		/* IPC-opened memory reads 0 in the importer on a real H200 (driver 13.0), as does
		 * imported VMM memory (its phys->gdr is false). */
		*(int *)data = is_dev(m) && g_gdr && m->kind != FC_DEV_IPC &&
			       (m->kind != FC_DEV_VMM || (m->phys && m->phys->gdr));
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)m->addr;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = m->size;
		break;
	default:
		r = CUDA_ERROR_INVALID_VALUE;
		break;
	}
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	return submit_set(dstDevice, uc, N, NULL, false);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	return submit_set(dstDevice, uc, N, hStream, true);
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType handleType,
				       unsigned long long flags)
{
	uintptr_t a = (uintptr_t)dptr, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	char name[48];
	struct fc_map *m;
	int fd;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	if (!g_dmabuf) {
		r = CUDA_ERROR_NOT_SUPPORTED; /* DMA_BUF_SUPPORTED is 0 */
		goto out;
	}
	/* Host-page-aligned address and size, inside one allocation (its size rounded up to a page). */
	if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD ||
	    (flags != 0 && flags != CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) || size == 0 || a % pg ||
	    size % pg) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	m = find_map(a);
	if (!m || !is_dev(m) || a + size > m->addr + round_up(m->size, pg)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* Documented for cuMemAlloc memory and fully mapped (accessible) cuMemCreate ranges only. */
	if (m->kind == FC_DEV_IPC || (m->kind == FC_DEV_VMM && !m->accessible)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	snprintf(name, sizeof(name), "sc-fakecuda-dmabuf-dev%d", m->dev);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		if (fd >= 0)
			close(fd);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*(int *)handle = fd;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuFlushGPUDirectRDMAWrites(CUflushGPUDirectRDMAWritesTarget target, CUflushGPUDirectRDMAWritesScope scope)
{
	return ready();
}

/* ---- pinned host memory ---------------------------------------------------------------------- */

static CUresult host_alloc(void **pp, size_t bytesize)
{
	struct CUctx_st *c;
	struct fc_map *m = NULL;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(&c);
	if (r)
		goto out;
	if (!pp || bytesize == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->map_len = round_up(bytesize, (size_t)sysconf(_SC_PAGESIZE));
	m->host = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m->host == MAP_FAILED) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->addr = (uintptr_t)m->host;
	m->size = bytesize;
	m->kind = FC_HOST_ALLOC;
	m->dev = c->dev;
	m->accessible = true;
	m->next = g_maps;
	g_maps = m;
	*pp = m->host;
	m = NULL;
out:
	free(m);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	return host_alloc(pp, bytesize);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return host_alloc(pp, bytesize);
}

CUresult cuMemFreeHost(void *p)
{
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	wait_idle();
	m = find_map((uintptr_t)p);
	if (!m || m->kind != FC_HOST_ALLOC || m->addr != (uintptr_t)p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	unlink_map(m);
	munmap(m->host, m->map_len);
	free(m);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	struct CUctx_st *c;
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(&c);
	if (r)
		goto out;
	if (!p || bytesize == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	for (m = g_maps; m; m = m->next)
		if (!is_dev(m) && (uintptr_t)p < m->addr + m->size && m->addr < (uintptr_t)p + bytesize) {
			r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
			goto out;
		}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->addr = (uintptr_t)p;
	m->host = p;
	m->size = bytesize;
	m->kind = FC_HOST_REG;
	m->dev = c->dev;
	m->accessible = true;
	m->next = g_maps;
	g_maps = m;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemHostUnregister(void *p)
{
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	wait_idle();
	m = find_map((uintptr_t)p);
	if (!m || m->kind != FC_HOST_REG || m->addr != (uintptr_t)p) {
		r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
		goto out;
	}
	unlink_map(m);
	free(m);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- copies ---------------------------------------------------------------------------------- */

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return submit_copy(dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount, NULL, false);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return submit_copy((uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, NULL, false);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	return submit_copy(dstDevice, 1, srcDevice, 1, ByteCount, NULL, false);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return submit_copy(dst, -1, src, -1, ByteCount, NULL, false);
}

CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
		      size_t ByteCount)
{
	if (!dstContext || !srcContext)
		return CUDA_ERROR_INVALID_CONTEXT;
	return submit_copy(dstDevice, 1, srcDevice, 1, ByteCount, NULL, false);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	__atomic_add_fetch(&g_copy_calls, 1, __ATOMIC_RELAXED);
	return submit_copy(dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount, hStream, true);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	__atomic_add_fetch(&g_copy_calls, 1, __ATOMIC_RELAXED);
	return submit_copy((uintptr_t)dstHost, 0, srcDevice, 1, ByteCount, hStream, true);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return submit_copy(dstDevice, 1, srcDevice, 1, ByteCount, hStream, true);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return submit_copy(dst, -1, src, -1, ByteCount, hStream, true);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			   CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	if (!dstContext || !srcContext)
		return CUDA_ERROR_INVALID_CONTEXT;
	return submit_copy(dstDevice, 1, srcDevice, 1, ByteCount, hStream, true);
}

/* cuMemcpyBatchAsync, as documented: every copy in stream order on a stream other than the legacy
 * default one, attributes indexed from 0 in ascending order, a valid source access order. The
 * CUDA 12.8 form reports the failing copy's index. FAKE_CUDA_NO_BATCH=1 hides it (an older
 * driver). */
static CUresult batch_copy(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
			   CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
			   size_t *failIdx, CUstream s)
{
	if (failIdx)
		*failIdx = SIZE_MAX;
	if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attrsIdxs || numAttrs == 0 ||
	    numAttrs > count || attrsIdxs[0] != 0 || sync_stream(s))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t a = 0; a < numAttrs; a++) {
		if ((a && attrsIdxs[a] <= attrsIdxs[a - 1]) || attrsIdxs[a] >= count)
			return CUDA_ERROR_INVALID_VALUE;
		if (attrs[a].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
		    attrs[a].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
			return CUDA_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; i < count; i++)
		if (sizes[i] == 0)
			return CUDA_ERROR_INVALID_VALUE;
	__atomic_add_fetch(&g_batch_calls, 1, __ATOMIC_RELAXED);
	for (size_t i = 0; i < count; i++) {
		CUresult r = submit_copy(dsts[i], -1, srcs[i], -1, sizes[i], s, true);
		if (r) {
			if (failIdx)
				*failIdx = i;
			return r;
		}
	}
	return CUDA_SUCCESS;
}

static CUresult cuMemcpyBatchAsync_13(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				      size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				      size_t numAttrs, CUstream s)
{
	return batch_copy(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, s);
}

static CUresult cuMemcpyBatchAsync_12(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				      size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				      size_t numAttrs, size_t *failIdx, CUstream s)
{
	return batch_copy(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, s);
}

/* ---- streams and events ---------------------------------------------------------------------- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	struct CUctx_st *c;
	struct CUstream_st *s = NULL;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(&c);
	if (r)
		goto out;
	if (!phStream) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	s->ctx = c;
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	s->next = g_streams;
	g_streams = s;
	*phStream = s;
	s = NULL;
out:
	free(s);
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* Drains the stream's queue, then joins its thread (the real driver returns at once and finishes
 * the work later; the observable result is the same). */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (sync_stream(hStream) || !stream_known(hStream)) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
		if (*pp == hStream) {
			*pp = hStream->next;
			break;
		}
	hStream->stop = true;
	pthread_cond_broadcast(&g_cv);
	pthread_mutex_unlock(&g_mu);
	pthread_join(hStream->th, NULL);
	pthread_mutex_lock(&g_mu);
	for (struct CUevent_st *e = g_events; e; e = e->next)
		if (e->stream == hStream)
			e->stream = NULL;
	free(hStream);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

static CUresult stream_sync_locked(CUstream s, bool wait)
{
	if (sync_stream(s)) {
		if (!wait)
			return g_inflight ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
		wait_idle();
		return CUDA_SUCCESS;
	}
	if (!stream_known(s))
		return CUDA_ERROR_INVALID_HANDLE;
	if (!wait && s->head)
		return CUDA_ERROR_NOT_READY;
	while (s->head)
		pthread_cond_wait(&g_cv, &g_mu);
	CUresult r = s->err;
	clear_stream_err(s);
	return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (!r)
		r = stream_sync_locked(hStream, true);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuStreamQuery(CUstream hStream)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (!r)
		r = stream_sync_locked(hStream, false);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	struct CUevent_st *e;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	if (!phEvent) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	e->flags = Flags;
	e->next = g_events;
	g_events = e;
	*phEvent = e;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* Like the real driver, destroying an event whose record is still queued is allowed: it is freed
 * when the stream has passed it. */
CUresult cuEventDestroy_v2(CUevent hEvent)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!event_known(hEvent)) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	hEvent->destroyed = true;
	if (hEvent->pending == 0)
		event_unlink_free(hEvent);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	if (!event_known(hEvent) || (!sync_stream(hStream) && !stream_known(hStream))) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	hEvent->recorded++;
	if (sync_stream(hStream)) { /* stream 0 runs synchronously: everything before is done */
		hEvent->reached = hEvent->recorded;
		hEvent->stream = NULL;
		goto out;
	}
	struct fc_task *t = calloc(1, sizeof(*t));
	if (!t) {
		hEvent->recorded--;
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	t->kind = FC_T_RECORD;
	t->ev = hEvent;
	t->seq = hEvent->recorded;
	hEvent->pending++;
	hEvent->stream = hStream;
	enqueue(hStream, t);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* An injected failure before the event is reported once: by the event, then cleared on its stream. */
static CUresult event_result(CUevent e)
{
	CUresult r = e->err;

	e->err = CUDA_SUCCESS;
	if (r && e->stream && e->stream->err == r)
		clear_stream_err(e->stream);
	return r;
}

CUresult cuEventQuery(CUevent hEvent)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!event_known(hEvent)) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	r = hEvent->reached < hEvent->recorded ? CUDA_ERROR_NOT_READY : event_result(hEvent);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* Test hook, not a driver entry point: how many times a cuEventSynchronize has polled an event
 * without CU_EVENT_BLOCKING_SYNC (a sleeping wait polls never). Counting polls, not CPU time,
 * tells spinning from sleeping whatever else loads the machine. Under g_mu. */
unsigned long fake_cuda_event_spins;

CUresult cuEventSynchronize(CUevent hEvent)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!event_known(hEvent)) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	unsigned long target = hEvent->recorded;
	hEvent->pending++; /* keep it alive while we wait */
	/* As the driver under its default scheduling: without CU_EVENT_BLOCKING_SYNC the waiting
	 * thread spins (a core busy for as long as it waits); with it, the thread sleeps. */
	while (hEvent->reached < target) {
		if (hEvent->flags & CU_EVENT_BLOCKING_SYNC) {
			pthread_cond_wait(&g_cv, &g_mu);
			continue;
		}
		fake_cuda_event_spins++;
		pthread_mutex_unlock(&g_mu);
		sched_yield();
		pthread_mutex_lock(&g_mu);
	}
	hEvent->pending--;
	r = event_result(hEvent);
	if (hEvent->destroyed && hEvent->pending == 0)
		event_unlink_free(hEvent);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	if (!event_known(hEvent) || (!sync_stream(hStream) && !stream_known(hStream))) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	unsigned long target = hEvent->recorded;
	if (hEvent->reached >= target)
		goto out;
	if (sync_stream(hStream)) {
		hEvent->pending++;
		while (hEvent->reached < target)
			pthread_cond_wait(&g_cv, &g_mu);
		if (--hEvent->pending == 0 && hEvent->destroyed)
			event_unlink_free(hEvent);
		goto out;
	}
	struct fc_task *t = calloc(1, sizeof(*t));
	if (!t) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	t->kind = FC_T_WAIT;
	t->ev = hEvent;
	t->seq = target;
	hEvent->pending++;
	enqueue(hStream, t);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- legacy IPC ------------------------------------------------------------------------------ */

/* The 64-byte handle: what another process needs to map the backing file. */
struct fc_ipc {
	uint32_t magic;
	int32_t dev;
	uint64_t size;
	uint32_t pid;
	uint32_t check;
	char name[40];
};
_Static_assert(sizeof(struct fc_ipc) == CU_IPC_HANDLE_SIZE, "IPC handle layout");

static uint32_t ipc_check(const struct fc_ipc *h)
{
	uint32_t x = 2166136261u; /* FNV-1a over everything before the check, then the name */
	const unsigned char *p = (const unsigned char *)h;

	for (size_t i = 0; i < offsetof(struct fc_ipc, check); i++)
		x = (x ^ p[i]) * 16777619u;
	for (size_t i = 0; i < sizeof(h->name); i++)
		x = (x ^ (unsigned char)h->name[i]) * 16777619u;
	return x;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct fc_ipc h;
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	m = find_map((uintptr_t)dptr);
	if (!pHandle || !m || m->kind != FC_DEV_ALLOC) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	memset(&h, 0, sizeof(h));
	h.magic = FC_IPC_MAGIC;
	h.dev = m->dev;
	h.size = m->size;
	h.pid = (uint32_t)getpid();
	snprintf(h.name, sizeof(h.name), "%s", m->name);
	h.check = ipc_check(&h);
	memcpy(pHandle->reserved, &h, sizeof(h));
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	struct CUctx_st *c;
	struct fc_ipc h;
	struct fc_map *m = NULL;
	char path[320];
	struct stat st;
	int fd = -1;
	CUresult r;

	memcpy(&h, handle.reserved, sizeof(h));
	pthread_mutex_lock(&g_mu);
	r = need_ctx(&c);
	if (r)
		goto out;
	if (!pdptr || h.magic != FC_IPC_MAGIC || h.check != ipc_check(&h) || h.dev < 0 || h.dev >= g_ndev ||
	    h.size == 0 || memchr(h.name, 0, sizeof(h.name)) == NULL ||
	    strncmp(h.name, FC_NAME_PREFIX, strlen(FC_NAME_PREFIX)) != 0 || strchr(h.name, '/')) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (h.pid == (uint32_t)getpid()) {
		r = CUDA_ERROR_INVALID_CONTEXT; /* "exported from another process" only */
		goto out;
	}
	if (h.dev != c->dev && !(Flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) {
		r = CUDA_ERROR_INVALID_DEVICE; /* another device's memory needs peer access */
		goto out;
	}
	/* Already open in this context: the same pointer, one more reference. */
	for (struct fc_map *o = g_maps; o; o = o->next)
		if (o->kind == FC_DEV_IPC && o->ipc_ctx_dev == c->dev && !strcmp(o->name, h.name)) {
			o->ipc_refs++;
			*pdptr = (CUdeviceptr)o->addr;
			goto out;
		}
	snprintf(path, sizeof(path), "%s/%s", g_dir, h.name);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < h.size) {
		r = CUDA_ERROR_INVALID_VALUE; /* freed by its owner, or not ours */
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->map_len = (size_t)st.st_size;
	m->host = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m->host == MAP_FAILED) {
		r = CUDA_ERROR_MAP_FAILED;
		goto out;
	}
	m->addr = win_take(h.size, FC_GRAN);
	if (!m->addr) {
		munmap(m->host, m->map_len);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->size = h.size;
	m->kind = FC_DEV_IPC;
	m->dev = h.dev; /* the memory's device: another one's is reached through peer access */
	m->ipc_ctx_dev = c->dev;
	m->ipc_refs = 1;
	snprintf(m->name, sizeof(m->name), "%s", h.name);
	m->accessible = true;
	m->next = g_maps;
	g_maps = m;
	*pdptr = (CUdeviceptr)m->addr;
	m = NULL;
out:
	free(m);
	if (fd >= 0)
		close(fd);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct fc_map *m;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = need_ctx(NULL);
	if (r)
		goto out;
	wait_idle();
	m = find_map((uintptr_t)dptr);
	if (!m || m->kind != FC_DEV_IPC || m->addr != (uintptr_t)dptr) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (--m->ipc_refs > 0)
		goto out; /* other opens of the same handle still use the mapping */
	unlink_map(m);
	munmap(m->host, m->map_len);
	free(m);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- virtual memory management --------------------------------------------------------------- */

static struct fc_phys *find_phys(CUmemGenericAllocationHandle id)
{
	for (struct fc_phys *p = g_phys; p; p = p->next)
		if (p->id == id)
			return p;
	return NULL;
}

static void phys_put(struct fc_phys *p)
{
	if (--p->refs > 0)
		return;
	for (struct fc_phys **pp = &g_phys; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	close(p->fd);
	free(p);
}

static CUresult phys_add(int fd, size_t size, int dev, CUmemAllocationHandleType types,
			 CUmemGenericAllocationHandle *out)
{
	struct fc_phys *p = calloc(1, sizeof(*p));

	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->id = ++g_phys_next;
	p->fd = fd;
	p->size = size;
	p->dev = dev;
	p->refs = 1;
	p->types = types;
	p->next = g_phys;
	g_phys = p;
	*out = p->id;
	return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags option)
{
	CUresult r = ready();

	if (r)
		return r;
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	*granularity = FC_GRAN;
	return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	char name[48];
	int fd = -1;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!handle || !prop || size == 0 || size % FC_GRAN || size > FC_TOTAL_MEM ||
	    prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (prop->location.id < 0 || prop->location.id >= g_ndev) {
		r = CUDA_ERROR_INVALID_DEVICE;
		goto out;
	}
	if (prop->allocFlags.gpuDirectRDMACapable && !g_gdr) {
		r = CUDA_ERROR_INVALID_VALUE; /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0 */
		goto out;
	}
	snprintf(name, sizeof(name), FC_MEMFD_PREFIX "%d", prop->location.id);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	r = phys_add(fd, size, prop->location.id, prop->requestedHandleTypes, handle);
	if (!r) {
		fd = -1;
		find_phys(*handle)->gdr = prop->allocFlags.gpuDirectRDMACapable != 0;
	}
out:
	if (fd >= 0)
		close(fd);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
				      CUmemAllocationHandleType handleType, unsigned long long flags)
{
	struct fc_phys *p;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	p = find_phys(handle);
	if (!p || p->released) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (!shareableHandle || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
	    !(p->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	*(int *)shareableHandle = fd; /* the caller owns it */
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* The fd stays the caller's (the driver keeps its own duplicate). Only memfds made by the stand-in
 * are accepted: their name carries the device. */
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
					CUmemAllocationHandleType shHandleType)
{
	char link[64], target[256];
	struct stat st;
	int fd = (int)(intptr_t)osHandle, dup_fd = -1, dev;
	ssize_t n;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	target[n] = 0;
	if (sscanf(target, "/memfd:" FC_MEMFD_PREFIX "%d", &dev) != 1 || dev < 0 || dev >= g_ndev ||
	    fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % FC_GRAN) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0) {
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	r = phys_add(dup_fd, (size_t)st.st_size, dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, handle);
	if (!r) {
		dup_fd = -1;
		/* The real driver tells an importer neither allocFlags.gpuDirectRDMACapable nor
		 * IS_GPU_DIRECT_RDMA_CAPABLE, whatever the exporter set (both 0 on an H200,
		 * driver 13.0): the importer cannot know, so neither does the stand-in's. */
		find_phys(*handle)->gdr = false;
	}
out:
	if (dup_fd >= 0)
		close(dup_fd);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	struct fc_resv *v;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!ptr || size == 0 || size % FC_GRAN || (alignment & (alignment - 1))) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	v = calloc(1, sizeof(*v));
	if (!v) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	v->addr = win_take(size, alignment);
	if (!v->addr) {
		free(v);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	v->size = size;
	v->next = g_resv;
	g_resv = v;
	*ptr = (CUdeviceptr)v->addr;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	for (struct fc_map *m = g_maps; m; m = m->next)
		if (m->kind == FC_DEV_VMM && m->addr >= (uintptr_t)ptr && m->addr - (uintptr_t)ptr < size) {
			r = CUDA_ERROR_INVALID_VALUE; /* still mapped: cuMemUnmap first */
			goto out;
		}
	r = CUDA_ERROR_INVALID_VALUE;
	for (struct fc_resv **pp = &g_resv; *pp; pp = &(*pp)->next)
		if ((*pp)->addr == (uintptr_t)ptr && (*pp)->size == size) {
			struct fc_resv *v = *pp;
			*pp = v->next;
			free(v);
			r = CUDA_SUCCESS;
			break;
		}
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	struct fc_phys *p;
	struct fc_map *m = NULL;
	bool inside = false;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	p = find_phys(handle);
	if (!p || p->released) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	for (struct fc_resv *v = g_resv; v; v = v->next)
		if ((uintptr_t)ptr >= v->addr && (uintptr_t)ptr - v->addr <= v->size &&
		    size <= v->size - ((uintptr_t)ptr - v->addr))
			inside = true;
	if (!inside || size == 0 || size % FC_GRAN || offset % FC_GRAN || offset > p->size ||
	    size > p->size - offset) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	for (struct fc_map *x = g_maps; x; x = x->next)
		if ((uintptr_t)ptr < x->addr + x->size && x->addr < (uintptr_t)ptr + size) {
			r = CUDA_ERROR_ALREADY_MAPPED;
			goto out;
		}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	m->host = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, (off_t)offset);
	if (m->host == MAP_FAILED) {
		r = CUDA_ERROR_MAP_FAILED;
		goto out;
	}
	m->map_len = size;
	m->addr = (uintptr_t)ptr;
	m->size = size;
	m->kind = FC_DEV_VMM;
	m->dev = p->dev;
	m->phys = p;
	p->refs++;
	m->next = g_maps;
	g_maps = m;
	m = NULL;
out:
	free(m);
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	bool rw = false, any = false;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	if (!desc || count == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
		    desc[i].location.id >= g_ndev) {
			r = CUDA_ERROR_INVALID_DEVICE;
			goto out;
		}
		if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			rw = true;
	}
	for (struct fc_map *m = g_maps; m; m = m->next)
		if (m->kind == FC_DEV_VMM && m->addr >= (uintptr_t)ptr && m->addr - (uintptr_t)ptr < size) {
			m->accessible = rw;
			any = true;
		}
	if (!any)
		r = CUDA_ERROR_INVALID_VALUE;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	bool any = false;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	wait_idle();
	for (struct fc_map **pp = &g_maps; *pp;) {
		struct fc_map *m = *pp;
		if (m->kind == FC_DEV_VMM && m->addr >= (uintptr_t)ptr && m->addr - (uintptr_t)ptr < size) {
			*pp = m->next;
			munmap(m->host, m->map_len);
			phys_put(m->phys);
			free(m);
			any = true;
		} else {
			pp = &m->next;
		}
	}
	if (!any)
		r = CUDA_ERROR_INVALID_VALUE;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* The memory lives on while it is mapped, as in the real driver. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct fc_phys *p;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	p = find_phys(handle);
	if (!p || p->released) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	p->released = true;
	phys_put(p);
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
	struct fc_phys *p;
	CUresult r;

	pthread_mutex_lock(&g_mu);
	r = ready();
	if (r)
		goto out;
	p = find_phys(handle);
	if (!p || p->released) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (!prop) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = p->types;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = p->dev;
out:
	pthread_mutex_unlock(&g_mu);
	return r;
}

/* ---- entry point lookup ---------------------------------------------------------------------- */

/* Plain (unversioned) names: the same implementations. The real driver's plain names are older ABIs
 * (32-bit sizes); a program that links them against the stand-in gets today's signatures. */
#undef cuDeviceGetUuid
#undef cuDeviceTotalMem
#undef cuMemGetInfo
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetAddressRange
#undef cuMemsetD8
#undef cuMemAllocHost
#undef cuMemHostRegister
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuMemcpyDtoD
#undef cuMemcpyHtoDAsync
#undef cuMemcpyDtoHAsync
#undef cuMemcpyDtoDAsync
#undef cuStreamDestroy
#undef cuEventDestroy
#undef cuIpcOpenMemHandle
#undef cuGetProcAddress

#define FC_ALIAS(ret, plain, impl, args) ret plain args __attribute__((alias(#impl)))
FC_ALIAS(CUresult, cuDeviceTotalMem, cuDeviceTotalMem_v2, (size_t *, CUdevice));
FC_ALIAS(CUresult, cuDeviceGetUuid, cuDeviceGetUuid_v2, (CUuuid *, CUdevice));
FC_ALIAS(CUresult, cuMemGetInfo, cuMemGetInfo_v2, (size_t *, size_t *));
FC_ALIAS(CUresult, cuCtxPushCurrent, cuCtxPushCurrent_v2, (CUcontext));
FC_ALIAS(CUresult, cuCtxPopCurrent, cuCtxPopCurrent_v2, (CUcontext *));
FC_ALIAS(CUresult, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, (CUdevice));
FC_ALIAS(CUresult, cuMemAlloc, cuMemAlloc_v2, (CUdeviceptr *, size_t));
FC_ALIAS(CUresult, cuMemFree, cuMemFree_v2, (CUdeviceptr));
FC_ALIAS(CUresult, cuMemGetAddressRange, cuMemGetAddressRange_v2, (CUdeviceptr *, size_t *, CUdeviceptr));
FC_ALIAS(CUresult, cuMemsetD8, cuMemsetD8_v2, (CUdeviceptr, unsigned char, size_t));
FC_ALIAS(CUresult, cuMemAllocHost, cuMemAllocHost_v2, (void **, size_t));
FC_ALIAS(CUresult, cuMemHostRegister, cuMemHostRegister_v2, (void *, size_t, unsigned int));
FC_ALIAS(CUresult, cuMemcpyHtoD, cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t));
FC_ALIAS(CUresult, cuMemcpyDtoH, cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t));
FC_ALIAS(CUresult, cuMemcpyDtoD, cuMemcpyDtoD_v2, (CUdeviceptr, CUdeviceptr, size_t));
FC_ALIAS(CUresult, cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void *, size_t, CUstream));
FC_ALIAS(CUresult, cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream));
FC_ALIAS(CUresult, cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream));
FC_ALIAS(CUresult, cuStreamDestroy, cuStreamDestroy_v2, (CUstream));
FC_ALIAS(CUresult, cuEventDestroy, cuEventDestroy_v2, (CUevent));
FC_ALIAS(CUresult, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, (CUdeviceptr *, CUipcMemHandle, unsigned int));

struct fc_sym {
	const char *name; /* the base name, as cuGetProcAddress is asked */
	void *fn;	  /* the current version of it */
};

#define FC_SYM(base, impl) {#base, (void *)impl}
static const struct fc_sym fc_syms[] = {
	FC_SYM(cuInit, cuInit),
	FC_SYM(cuDriverGetVersion, cuDriverGetVersion),
	FC_SYM(cuDeviceGetCount, cuDeviceGetCount),
	FC_SYM(cuDeviceGet, cuDeviceGet),
	FC_SYM(cuDeviceGetName, cuDeviceGetName),
	FC_SYM(cuDeviceGetUuid, cuDeviceGetUuid_v2),
	FC_SYM(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId),
	FC_SYM(cuDeviceTotalMem, cuDeviceTotalMem_v2),
	FC_SYM(cuDeviceGetAttribute, cuDeviceGetAttribute),
	FC_SYM(cuGetErrorName, cuGetErrorName),
	FC_SYM(cuGetErrorString, cuGetErrorString),
	FC_SYM(cuMemGetInfo, cuMemGetInfo_v2),
	FC_SYM(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain),
	FC_SYM(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2),
	FC_SYM(cuCtxSetCurrent, cuCtxSetCurrent),
	FC_SYM(cuCtxGetCurrent, cuCtxGetCurrent),
	FC_SYM(cuCtxPushCurrent, cuCtxPushCurrent_v2),
	FC_SYM(cuCtxPopCurrent, cuCtxPopCurrent_v2),
	FC_SYM(cuCtxGetDevice, cuCtxGetDevice),
	FC_SYM(cuCtxSynchronize, cuCtxSynchronize),
	FC_SYM(cuMemAlloc, cuMemAlloc_v2),
	FC_SYM(cuMemFree, cuMemFree_v2),
	FC_SYM(cuMemGetAddressRange, cuMemGetAddressRange_v2),
	FC_SYM(cuPointerGetAttribute, cuPointerGetAttribute),
	FC_SYM(cuMemsetD8, cuMemsetD8_v2),
	FC_SYM(cuMemsetD8Async, cuMemsetD8Async),
	FC_SYM(cuMemGetHandleForAddressRange, cuMemGetHandleForAddressRange),
	FC_SYM(cuFlushGPUDirectRDMAWrites, cuFlushGPUDirectRDMAWrites),
	FC_SYM(cuMemHostAlloc, cuMemHostAlloc),
	FC_SYM(cuMemAllocHost, cuMemAllocHost_v2),
	FC_SYM(cuMemFreeHost, cuMemFreeHost),
	FC_SYM(cuMemHostRegister, cuMemHostRegister_v2),
	FC_SYM(cuMemHostUnregister, cuMemHostUnregister),
	FC_SYM(cuMemcpyHtoD, cuMemcpyHtoD_v2),
	FC_SYM(cuMemcpyDtoH, cuMemcpyDtoH_v2),
	FC_SYM(cuMemcpyDtoD, cuMemcpyDtoD_v2),
	FC_SYM(cuMemcpy, cuMemcpy),
	FC_SYM(cuMemcpyPeer, cuMemcpyPeer),
	FC_SYM(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2),
	FC_SYM(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2),
	FC_SYM(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2),
	FC_SYM(cuMemcpyAsync, cuMemcpyAsync),
	FC_SYM(cuMemcpyPeerAsync, cuMemcpyPeerAsync),
	FC_SYM(cuStreamCreate, cuStreamCreate),
	FC_SYM(cuStreamDestroy, cuStreamDestroy_v2),
	FC_SYM(cuStreamSynchronize, cuStreamSynchronize),
	FC_SYM(cuStreamQuery, cuStreamQuery),
	FC_SYM(cuStreamWaitEvent, cuStreamWaitEvent),
	FC_SYM(cuEventCreate, cuEventCreate),
	FC_SYM(cuEventDestroy, cuEventDestroy_v2),
	FC_SYM(cuEventRecord, cuEventRecord),
	FC_SYM(cuEventSynchronize, cuEventSynchronize),
	FC_SYM(cuEventQuery, cuEventQuery),
	FC_SYM(cuIpcGetMemHandle, cuIpcGetMemHandle),
	FC_SYM(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2),
	FC_SYM(cuIpcCloseMemHandle, cuIpcCloseMemHandle),
	FC_SYM(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity),
	FC_SYM(cuMemCreate, cuMemCreate),
	FC_SYM(cuMemExportToShareableHandle, cuMemExportToShareableHandle),
	FC_SYM(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle),
	FC_SYM(cuMemAddressReserve, cuMemAddressReserve),
	FC_SYM(cuMemAddressFree, cuMemAddressFree),
	FC_SYM(cuMemMap, cuMemMap),
	FC_SYM(cuMemUnmap, cuMemUnmap),
	FC_SYM(cuMemSetAccess, cuMemSetAccess),
	FC_SYM(cuMemRelease, cuMemRelease),
	FC_SYM(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle),
#ifndef FC_LEGACY_DRIVER
	FC_SYM(cuGetProcAddress, cuGetProcAddress_v2),
#endif
};

/* Base name -> implementation, whatever cudaVersion and flags (per-thread default stream variants
 * are the same functions here). Needs no cuInit, like the real one. */
static CUresult get_proc(const char *symbol, void **pfn, int cudaVersion,
			 CUdriverProcAddressQueryResult *symbolStatus)
{
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	/* The one versioned entry point the sidecar asks for by version: CUDA 13 changed its
	 * signature. */
	if (!strcmp(symbol, "cuMemcpyBatchAsync") && cudaVersion >= 12080 &&
	    getenv("FAKE_CUDA_NO_BATCH") == NULL) {
		*pfn = cudaVersion >= 13000 ? (void *)cuMemcpyBatchAsync_13
					    : (void *)cuMemcpyBatchAsync_12;
		if (symbolStatus)
			*symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
		return CUDA_SUCCESS;
	}
	for (size_t i = 0; i < sizeof(fc_syms) / sizeof(fc_syms[0]); i++)
		if (!strcmp(fc_syms[i].name, symbol)) {
			*pfn = fc_syms[i].fn;
			if (symbolStatus)
				*symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
			return CUDA_SUCCESS;
		}
	*pfn = NULL;
	if (symbolStatus)
		*symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

/* FC_LEGACY_DRIVER (libsc_fake_cuda_legacy.so): a driver before CUDA 12.0, which has no
 * cuGetProcAddress_v2. */
#ifndef FC_LEGACY_DRIVER
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	return get_proc(symbol, pfn, cudaVersion, symbolStatus);
}
#endif

/* The CUDA 11 signature, without symbolStatus. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	return get_proc(symbol, pfn, cudaVersion, NULL);
}
