/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast.c: the fast path of the C client (rsc_fast_*; the format is rdma_sidecar/fast_ring.h).
 *
 * Ring mode: a SOCK_SEQPACKET connection to the sidecar's fast-path socket carries HELLO (the ring
 * memfd and the two doorbells: datagram sockets, or eventfds from sidecars before them),
 * PREPARE/UNPREPARE and their RESULTs; runs are submission entries written into the shared ring,
 * and their ends come back as completion entries. After reading completions it rings the
 * submission doorbell when the sidecar asked for it (RSC_FAST_CQ_NEED_WAKEUP). grpc
 * mode, when the sidecar offers no fast-path socket: each run is one rsc_read/rsc_write with the
 * arguments PREPARE copied, done on the caller's thread, its operation released at once.
 *
 * Runs on the calling thread; a rsc_fast is for one thread at a time (no locks). It owns the
 * socket, the mapping, the doorbells, the copies of prepared arguments (grpc mode) and a queue of
 * completions taken from the ring while rsc_fast_run waited for its own, which rsc_fast_reap
 * returns first.
 */
#include "internal.h"

#include "rdma_sidecar/fast_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HELLO_WAIT_MS 5000
#define DEFAULT_SPIN_US 50
/* Polling needs a CPU of its own: with fewer than this many to run on, the poller takes one the
 * sidecar needs to finish the run (measured: 2-3x slower with 2 CPUs), so it sleeps at once. */
#define SPIN_MIN_CPUS 4
/* rsc_fast_run's own user_data values count up from here; a caller's submissions should not use
 * them (the top bit set). */
#define RUN_ID_BASE (1ull << 63)
/* How long rsc_fast_run waits past a run's own deadline for its completion (as
 * rsc_operation_wait does). */
#define RUN_GRACE_MS 30000

/* A prepared READ or WRITE. In ring mode only handle and timeout_ms are kept (the sidecar holds
 * the rest); in grpc mode, a deep copy of the arguments. */
struct prep {
	uint32_t handle;
	int kind;
	uint64_t timeout_ms;
	char *metadata;
	rsc_descriptor *descs;
	size_t n_descs;
	int backend;
	char *request_id;
};

struct rsc_fast {
	rsc_client *c;
	int ring; /* 1: ring mode, 0: grpc */
	uint32_t spin_us;
	int dead; /* the sidecar ended the session */

	int sock, sq_efd, cq_efd;
	int bells_are_sockets; /* 1: datagram doorbells; 0: eventfds (older sidecars) */
	void *map;
	size_t map_size;
	struct rsc_fast_ctl *ctl;
	struct rsc_fast_sqe *sq;
	struct rsc_fast_cqe *cq;
	uint32_t sq_entries, cq_entries;
	uint32_t sq_tail, cq_head; /* ours: the only writer */
	uint64_t next_token;

	struct prep *preps;
	size_t n_preps, cap_preps;
	uint32_t next_handle; /* grpc mode */
	uint64_t next_run_id;

	rsc_fast_completion *q; /* circular: q_len entries from q_first */
	size_t q_first, q_len, q_cap;
	uint64_t *abandoned; /* internal user_data whose completion is to be dropped */
	size_t n_abandoned, cap_abandoned;
};

/* ---- small helpers ----------------------------------------------------------------------------
 */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ms left until deadline (0 = none: -1, poll's infinity). */
static int ms_left(uint64_t deadline)
{
	if (!deadline)
		return -1;
	uint64_t now = now_ns();
	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now + 999999) / 1000000;
	return ms > 1000000000 ? 1000000000 : (int)ms;
}

static uint64_t deadline_after(uint64_t ms)
{
	return ms ? now_ns() + ms * 1000000ull : 0;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int session_ended(rsc_fast *f, rsc_status *st)
{
	f->dead = 1;
	return rsc_fail(st, RSC_UNAVAILABLE,
			"the sidecar closed the fast path session: open a new one (rsc_fast_open)");
}

static void completion_set(rsc_fast_completion *out, uint64_t user_data, int code, int status,
			   int backend, uint64_t bytes, const char *message)
{
	out->user_data = user_data;
	out->code = code;
	out->status = status;
	out->backend = backend;
	out->bytes = bytes;
	snprintf(out->message, sizeof(out->message), "%s", message ? message : "");
}

static void completion_from_cqe(rsc_fast_completion *out, const struct rsc_fast_cqe *e)
{
	char msg[sizeof(e->message) + 1];
	memcpy(msg, e->message, sizeof(e->message));
	msg[sizeof(e->message)] = '\0';
	completion_set(out, e->user_data, e->code, (int)e->status, (int)e->backend, e->bytes, msg);
}

/* ---- the completion queue and the prepared list -----------------------------------------------
 */

static int queue_push(rsc_fast *f, const rsc_fast_completion *c)
{
	if (f->q_len == f->q_cap) {
		size_t cap = f->q_cap ? 2 * f->q_cap : 16;
		rsc_fast_completion *q = malloc(cap * sizeof(*q));
		if (!q)
			return -1;
		for (size_t i = 0; i < f->q_len; i++)
			q[i] = f->q[(f->q_first + i) % f->q_cap];
		free(f->q);
		f->q = q;
		f->q_cap = cap;
		f->q_first = 0;
	}
	f->q[(f->q_first + f->q_len) % f->q_cap] = *c;
	f->q_len++;
	return 0;
}

static size_t queue_pop(rsc_fast *f, rsc_fast_completion *out, size_t max)
{
	size_t n = 0;
	while (n < max && f->q_len) {
		out[n++] = f->q[f->q_first];
		f->q_first = (f->q_first + 1) % f->q_cap;
		f->q_len--;
	}
	return n;
}

static int abandon(rsc_fast *f, uint64_t user_data)
{
	if (f->n_abandoned == f->cap_abandoned) {
		size_t cap = f->cap_abandoned ? 2 * f->cap_abandoned : 8;
		uint64_t *a = realloc(f->abandoned, cap * sizeof(*a));
		if (!a)
			return -1;
		f->abandoned = a;
		f->cap_abandoned = cap;
	}
	f->abandoned[f->n_abandoned++] = user_data;
	return 0;
}

/* 1 (and forgotten) when user_data's completion is to be dropped. */
static int take_abandoned(rsc_fast *f, uint64_t user_data)
{
	for (size_t i = 0; i < f->n_abandoned; i++) {
		if (f->abandoned[i] == user_data) {
			f->abandoned[i] = f->abandoned[--f->n_abandoned];
			return 1;
		}
	}
	return 0;
}

static struct prep *prep_find(rsc_fast *f, uint32_t handle)
{
	for (size_t i = 0; i < f->n_preps; i++)
		if (f->preps[i].handle == handle)
			return &f->preps[i];
	return NULL;
}

static void prep_free(struct prep *p)
{
	for (size_t i = 0; i < p->n_descs; i++)
		free((char *)p->descs[i].region_id);
	free(p->descs);
	free(p->metadata);
	free(p->request_id);
	memset(p, 0, sizeof(*p));
}

static int prep_add(rsc_fast *f, const struct prep *p)
{
	if (f->n_preps == f->cap_preps) {
		size_t cap = f->cap_preps ? 2 * f->cap_preps : 8;
		struct prep *a = realloc(f->preps, cap * sizeof(*a));
		if (!a)
			return -1;
		f->preps = a;
		f->cap_preps = cap;
	}
	f->preps[f->n_preps++] = *p;
	return 0;
}

static void prep_remove(rsc_fast *f, struct prep *p)
{
	prep_free(p);
	*p = f->preps[--f->n_preps];
}

/* ---- ring mode: the socket ----------------------------------------------------------------------
 */

/* The fast-path socket's path: opts->socket_path, or the client's "unix:PATH" target + ".fast".
 * 0, or -1 when there is none (a TCP target). */
static int socket_path(rsc_client *c, const rsc_fast_options *o, char *out, size_t cap)
{
	if (o && o->socket_path && o->socket_path[0])
		return snprintf(out, cap, "%s", o->socket_path) < (int)cap ? 0 : -1;
	const char *t = rsc_client_target(c);
	if (strncmp(t, "unix://", 7) == 0)
		t += 7;
	else if (strncmp(t, "unix:", 5) == 0)
		t += 5;
	else
		return -1;
	return snprintf(out, cap, "%s.fast", t) < (int)cap ? 0 : -1;
}

/* Receives HELLO and its three fds within HELLO_WAIT_MS. */
static int recv_hello(rsc_fast *f, struct rsc_fast_hello *h, int fds[3], rsc_status *st)
{
	struct pollfd p = {.fd = f->sock, .events = POLLIN};
	int pr;
	while ((pr = poll(&p, 1, HELLO_WAIT_MS)) < 0 && errno == EINTR)
		;
	if (pr == 0)
		return rsc_fail(st, RSC_UNAVAILABLE,
				"the sidecar's fast path sent no HELLO within %d ms",
				HELLO_WAIT_MS);
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(3 * sizeof(int))];
	} cm;
	union {
		struct rsc_fast_hello h;
		struct rsc_fast_result r; /* a refusal in place of HELLO */
		char buf[1024];
	} u;
	struct iovec iov = {.iov_base = &u, .iov_len = sizeof(u)};
	struct msghdr m = {.msg_iov = &iov,
			   .msg_iovlen = 1,
			   .msg_control = cm.buf,
			   .msg_controllen = sizeof(cm.buf)};
	ssize_t n;
	while ((n = recvmsg(f->sock, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	if (n < 0)
		return rsc_fail(st, RSC_UNAVAILABLE, "fast path: receiving HELLO: %s",
				strerror(errno));
	size_t got_fds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (got_fds < 3)
				fds[got_fds++] = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return rsc_fail(
		    st, RSC_UNAVAILABLE,
		    "the sidecar closed the fast path socket before HELLO (is this uid in "
		    "its --allowed-uids?)");
	if ((size_t)n == sizeof(u.r) && u.r.hdr.type == RSC_FAST_MSG_RESULT && u.r.code != 0) {
		u.r.message[sizeof(u.r.message) - 1] = '\0';
		return rsc_fail(st, u.r.code, "the sidecar refused the fast path session: %s",
				u.r.message);
	}
	memcpy(h, &u.h, sizeof(*h));
	if (got_fds != 3 || (m.msg_flags & MSG_CTRUNC))
		return rsc_fail(
		    st, RSC_INTERNAL,
		    "fast path HELLO came with %zu file descriptors, not 3 (or was cut)", got_fds);
	if ((size_t)n != sizeof(*h) || (m.msg_flags & MSG_TRUNC) ||
	    h->hdr.type != RSC_FAST_MSG_HELLO || h->hdr.len != sizeof(*h) ||
	    h->magic != RSC_FAST_MAGIC)
		return rsc_fail(st, RSC_INTERNAL,
				"fast path: the first message is not a HELLO (%zd bytes, type %u)",
				n, n >= 4 ? h->hdr.type : 0);
	if (h->version != RSC_FAST_VERSION)
		return rsc_fail(st, RSC_UNIMPLEMENTED,
				"the sidecar's fast path speaks version %u, this library %u: use a "
				"matching client library",
				h->version, RSC_FAST_VERSION);
	return RSC_OK;
}

static int pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* Checks the HELLO's sizes against each other and the memfd, then maps the ring. */
static int map_ring(rsc_fast *f, const struct rsc_fast_hello *h, int memfd, rsc_status *st)
{
	uint64_t sq_end = h->sq_offset + (uint64_t)h->sq_entries * sizeof(struct rsc_fast_sqe);
	uint64_t cq_end = h->cq_offset + (uint64_t)h->cq_entries * sizeof(struct rsc_fast_cqe);
	if (!pow2(h->sq_entries) || !pow2(h->cq_entries) || h->sq_offset > h->map_size ||
	    h->cq_offset > h->map_size || sq_end > h->map_size || cq_end > h->map_size ||
	    h->map_size < sizeof(struct rsc_fast_ctl) || h->sq_offset % 64 || h->cq_offset % 64 ||
	    h->map_size > ((uint64_t)1 << 40))
		return rsc_fail(
		    st, RSC_INTERNAL,
		    "fast path HELLO sizes do not fit: map_size %llu, sq %u at %llu, cq %u "
		    "at %llu",
		    (unsigned long long)h->map_size, h->sq_entries,
		    (unsigned long long)h->sq_offset, h->cq_entries,
		    (unsigned long long)h->cq_offset);
	struct stat sb;
	if (fstat(memfd, &sb) != 0 || (uint64_t)sb.st_size < h->map_size)
		return rsc_fail(
		    st, RSC_INTERNAL,
		    "fast path ring memory is smaller (%lld bytes) than HELLO says (%llu)",
		    (long long)sb.st_size, (unsigned long long)h->map_size);
	void *m = mmap(NULL, h->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (m == MAP_FAILED)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "fast path: mapping the ring: %s",
				strerror(errno));
	f->map = m;
	f->map_size = h->map_size;
	f->ctl = m;
	f->sq = (struct rsc_fast_sqe *)((char *)m + h->sq_offset);
	f->cq = (struct rsc_fast_cqe *)((char *)m + h->cq_offset);
	f->sq_entries = h->sq_entries;
	f->cq_entries = h->cq_entries;
	if (f->ctl->magic != RSC_FAST_MAGIC || f->ctl->sq_entries != h->sq_entries ||
	    f->ctl->cq_entries != h->cq_entries)
		return rsc_fail(st, RSC_INTERNAL,
				"fast path ring memory does not match its HELLO (magic or sizes)");
	f->sq_tail = __atomic_load_n(&f->ctl->sq_tail, __ATOMIC_ACQUIRE);
	f->cq_head = __atomic_load_n(&f->ctl->cq_head, __ATOMIC_ACQUIRE);
	return RSC_OK;
}

/* Connects and maps. 1: no fast-path socket there (grpc mode may take over), RSC_OK, or an
 * error code with st filled. */
static int ring_open(rsc_fast *f, const rsc_fast_options *o, rsc_status *st)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (socket_path(f->c, o, sa.sun_path, sizeof(sa.sun_path)) != 0) {
		rsc_fail(st, RSC_UNAVAILABLE,
			 "no fast-path socket: the target %s is not a unix socket and "
			 "socket_path is not set (or the path is too long)",
			 rsc_client_target(f->c));
		return 1;
	}
	f->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->sock < 0)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "fast path: socket: %s",
				strerror(errno));
	int r;
	while ((r = connect(f->sock, (struct sockaddr *)&sa, sizeof(sa))) < 0 && errno == EINTR)
		;
	if (r < 0) {
		int e = errno;
		rsc_fail(st, RSC_UNAVAILABLE, "cannot connect to the fast-path socket %s: %s",
			 sa.sun_path, strerror(e));
		return e == ENOENT || e == ECONNREFUSED ? 1 : RSC_UNAVAILABLE;
	}
	struct rsc_fast_hello h = {0};
	int fds[3] = {-1, -1, -1};
	int rc = recv_hello(f, &h, fds, st);
	f->sq_efd = fds[1];
	f->cq_efd = fds[2];
	struct stat sb;
	f->bells_are_sockets = fds[1] >= 0 && fstat(fds[1], &sb) == 0 && S_ISSOCK(sb.st_mode);
	if (rc == RSC_OK)
		rc = map_ring(f, &h, fds[0], st);
	if (fds[0] >= 0)
		close(fds[0]); /* the mapping keeps the memory */
	return rc;
}

static int send_msg(rsc_fast *f, const void *msg, size_t len, rsc_status *st)
{
	ssize_t n;
	while ((n = send(f->sock, msg, len, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (n == (ssize_t)len)
		return RSC_OK;
	if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
		return session_ended(f, st);
	return rsc_fail(st, RSC_UNAVAILABLE, "fast path: sending to the sidecar: %s",
			n < 0 ? strerror(errno) : "short send");
}

/* Waits for the RESULT echoing token (older RESULTs, of requests given up on, are dropped). */
static int wait_result(rsc_fast *f, uint64_t token, struct rsc_fast_result *res, rsc_status *st)
{
	uint64_t deadline = deadline_after(rsc_client_call_timeout(f->c));
	for (;;) {
		struct pollfd p = {.fd = f->sock, .events = POLLIN};
		int pr = poll(&p, 1, ms_left(deadline));
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr == 0)
			return rsc_fail(st, RSC_DEADLINE_EXCEEDED,
					"the sidecar did not answer on the fast path within %u ms",
					rsc_client_call_timeout(f->c));
		union {
			struct rsc_fast_result r;
			char buf[RSC_FAST_MSG_MAX];
		} u;
		ssize_t n = recv(f->sock, u.buf, sizeof(u.buf), MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return session_ended(f, st);
		if ((size_t)n != sizeof(u.r) || u.r.hdr.type != RSC_FAST_MSG_RESULT ||
		    u.r.hdr.token != token)
			continue;
		*res = u.r;
		res->message[sizeof(res->message) - 1] = '\0';
		return RSC_OK;
	}
}

static int ring_unprepare(rsc_fast *f, uint32_t handle, rsc_status *st);

static int ring_prepare(rsc_fast *f, int kind, const rsc_transfer_args *a, uint32_t *handle,
			rsc_status *st)
{
	size_t mlen = strlen(a->metadata);
	size_t descs_at = (sizeof(struct rsc_fast_prepare) + mlen + 7) & ~(size_t)7;
	size_t len = descs_at + a->n_descriptors * sizeof(struct rsc_fast_desc);
	if (len > RSC_FAST_MSG_MAX)
		return rsc_fail(
		    st, RSC_INVALID_ARGUMENT,
		    "the PREPARE would be %zu bytes, over the fast path's %u: use fewer "
		    "descriptors or shorter metadata",
		    len, RSC_FAST_MSG_MAX);
	char *msg = calloc(1, len);
	if (!msg)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory building PREPARE");
	struct rsc_fast_prepare *p = (struct rsc_fast_prepare *)msg;
	uint64_t token = ++f->next_token;
	p->hdr.type = RSC_FAST_MSG_PREPARE;
	p->hdr.len = (uint32_t)len;
	p->hdr.token = token;
	p->kind = (uint32_t)kind;
	p->backend = (uint32_t)a->backend;
	p->timeout_ms = a->timeout_ms;
	p->metadata_len = (uint32_t)mlen;
	p->n_descs = (uint32_t)a->n_descriptors;
	memcpy(msg + sizeof(*p), a->metadata, mlen);
	for (size_t i = 0; i < a->n_descriptors; i++) {
		struct rsc_fast_desc d = {.offset = a->descriptors[i].offset,
					  .length = a->descriptors[i].length};
		memcpy(d.region_id, a->descriptors[i].region_id,
		       strlen(a->descriptors[i].region_id)); /* checked: < RSC_FAST_ID_MAX */
		memcpy(msg + descs_at + i * sizeof(d), &d, sizeof(d));
	}
	int rc = send_msg(f, msg, len, st);
	free(msg);
	struct rsc_fast_result res;
	if (rc == RSC_OK)
		rc = wait_result(f, token, &res, st);
	if (rc != RSC_OK)
		return rc;
	if (res.code != 0)
		return rsc_fail(st, res.code, "%s", res.message);
	if (res.handle == 0)
		return rsc_fail(st, RSC_INTERNAL, "the sidecar answered PREPARE with handle 0");
	struct prep pr = {.handle = res.handle, .kind = kind, .timeout_ms = a->timeout_ms};
	if (prep_add(f, &pr) != 0) {
		ring_unprepare(f, res.handle, NULL); /* nobody would know its handle */
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory recording a handle");
	}
	*handle = res.handle;
	return rsc_ok(st);
}

static int ring_unprepare(rsc_fast *f, uint32_t handle, rsc_status *st)
{
	struct rsc_fast_unprepare u = {
	    .hdr = {.type = RSC_FAST_MSG_UNPREPARE, .len = sizeof(u), .token = ++f->next_token},
	    .handle = handle};
	struct rsc_fast_result res;
	int rc = send_msg(f, &u, sizeof(u), st);
	if (rc == RSC_OK)
		rc = wait_result(f, u.hdr.token, &res, st);
	if (rc != RSC_OK)
		return rc;
	struct prep *p = prep_find(f, handle);
	if (res.code != 0)
		return rsc_fail(st, res.code, "%s", res.message);
	if (p)
		prep_remove(f, p);
	return rsc_ok(st);
}

/* ---- ring mode: entries -------------------------------------------------------------------------
 */

/* Rings the submission doorbell without ever blocking: 0, or -1 with errno. EAGAIN (rings pending
 * already) and a sidecar gone (the socket says so) are not errors. */
static int ring_bell(rsc_fast *f)
{
	uint64_t one = 1;
	ssize_t n;
	if (f->bells_are_sockets)
		while ((n = send(f->sq_efd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 &&
		       errno == EINTR)
			;
	else
		while ((n = write(f->sq_efd, &one, sizeof(one))) < 0 && errno == EINTR)
			;
	if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNREFUSED &&
	    errno != EPIPE)
		return -1;
	return 0;
}

/* Takes every ring waiting on the completion doorbell (one datagram per read), never blocking.
 * 0, or -1 with errno. */
static int clear_bell(rsc_fast *f)
{
	uint64_t v;
	if (f->bells_are_sockets) {
		for (;;) {
			ssize_t n = recv(f->cq_efd, &v, sizeof(v), MSG_DONTWAIT | MSG_TRUNC);
			if (n >= 0 || errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		}
	}
	/* An eventfd: one read clears it; poll first, the fd's flags are the sidecar's. */
	struct pollfd p = {.fd = f->cq_efd, .events = POLLIN};
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN) && read(f->cq_efd, &v, sizeof(v)) < 0 &&
	    errno != EAGAIN && errno != EINTR)
		return -1;
	return 0;
}

static int ring_submit(rsc_fast *f, uint32_t opcode, uint32_t handle, uint64_t user_data,
		       uint64_t timeout_ms, uint64_t target, rsc_status *st)
{
	uint32_t head = __atomic_load_n(&f->ctl->sq_head, __ATOMIC_ACQUIRE);
	if (f->sq_tail - head >= f->sq_entries)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED,
				"the fast path's submission ring is full (%u entries): reap "
				"completions first",
				f->sq_entries);
	struct rsc_fast_sqe *e = &f->sq[f->sq_tail & (f->sq_entries - 1)];
	memset(e, 0, sizeof(*e));
	e->user_data = user_data;
	e->opcode = opcode;
	e->handle = handle;
	e->timeout_ms = timeout_ms;
	e->target = target;
	f->sq_tail++;
	__atomic_store_n(&f->ctl->sq_tail, f->sq_tail, __ATOMIC_RELEASE);
	if (ring_bell(f) != 0)
		return rsc_fail(st, RSC_INTERNAL, "fast path: ringing the doorbell: %s",
				strerror(errno));
	return rsc_ok(st);
}

/* Copies every completion in the ring out (to *want when its user_data is want_id and want is
 * not NULL, else to the queue unless abandoned) and frees their slots. How many were taken, or
 * -1 when out of memory. */
static int ring_drain(rsc_fast *f, uint64_t want_id, rsc_fast_completion *want, int *found)
{
	uint32_t tail = __atomic_load_n(&f->ctl->cq_tail, __ATOMIC_ACQUIRE);
	int n = 0;
	while (f->cq_head != tail) {
		const struct rsc_fast_cqe *e = &f->cq[f->cq_head & (f->cq_entries - 1)];
		rsc_fast_completion c;
		completion_from_cqe(&c, e);
		if (want && c.user_data == want_id) {
			*want = c;
			*found = 1;
		} else if (!take_abandoned(f, c.user_data) && queue_push(f, &c) != 0) {
			n = -1;
			break;
		}
		f->cq_head++;
		n++;
	}
	if (n == 0)
		return 0;
	/* Store the head, then look at the flag (both sequentially consistent, as the sidecar sets
	 * the flag and then looks at the head): a sidecar waiting for this room is woken. */
	__atomic_store_n(&f->ctl->cq_head, f->cq_head, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&f->ctl->cq_flags, __ATOMIC_SEQ_CST) & RSC_FAST_CQ_NEED_WAKEUP)
		ring_bell(f);
	return n;
}

static int cq_ready(rsc_fast *f)
{
	return __atomic_load_n(&f->ctl->cq_tail, __ATOMIC_ACQUIRE) != f->cq_head;
}

/* Returns when the completion ring has entries (RSC_OK), at the deadline (RSC_DEADLINE_EXCEEDED,
 * st untouched) or when the session ended (RSC_UNAVAILABLE). Polls spin_us, then clears the
 * doorbell, looks again and sleeps on it and on the socket. */
static int ring_wait(rsc_fast *f, uint64_t deadline, rsc_status *st)
{
	if (cq_ready(f))
		return RSC_OK;
	if (f->spin_us != UINT32_MAX) {
		uint64_t end = now_ns() + (uint64_t)f->spin_us * 1000;
		if (deadline && deadline < end)
			end = deadline;
		do {
			for (int i = 0; i < 32; i++) {
				if (cq_ready(f))
					return RSC_OK;
				cpu_relax();
			}
		} while (now_ns() < end);
	}
	for (;;) {
		/* Clear the doorbell without a blocking read, then look before sleeping. */
		struct pollfd p[2] = {{.fd = f->cq_efd, .events = POLLIN},
				      {.fd = f->sock, .events = POLLIN}};
		if (clear_bell(f) != 0)
			return rsc_fail(st, RSC_INTERNAL, "fast path: reading the doorbell: %s",
					strerror(errno));
		if (cq_ready(f))
			return RSC_OK;
		int pr = poll(p, 2, ms_left(deadline));
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return rsc_fail(st, RSC_INTERNAL, "fast path: poll: %s", strerror(errno));
		if (cq_ready(f)) /* what the sidecar posted before it went */
			return RSC_OK;
		if (p[1].revents & (POLLHUP | POLLERR | POLLNVAL))
			return session_ended(f, st);
		if (p[1].revents & POLLIN) {
			char buf[RSC_FAST_MSG_MAX];
			ssize_t n = recv(f->sock, buf, sizeof(buf), MSG_DONTWAIT);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
				return session_ended(f, st);
			/* else a late RESULT of a request given up on: dropped */
		}
		if (cq_ready(f))
			return RSC_OK;
		if (pr == 0 || (deadline && now_ns() >= deadline))
			return RSC_DEADLINE_EXCEEDED;
	}
}

static int ring_run(rsc_fast *f, uint32_t handle, uint64_t timeout_ms, rsc_fast_completion *out,
		    rsc_status *st)
{
	const struct prep *p = prep_find(f, handle);
	uint64_t t = timeout_ms ? timeout_ms : p ? p->timeout_ms : 0;
	uint64_t deadline = t ? deadline_after(t + RUN_GRACE_MS) : 0;
	uint64_t id = f->next_run_id++;
	int rc, found = 0;
	while ((rc = ring_submit(f, RSC_FAST_OP_RUN, handle, id, timeout_ms, 0, st)) ==
	       RSC_RESOURCE_EXHAUSTED) {
		/* Room comes as the sidecar takes entries; completions it could not post are in
		 * our way only while unread. */
		struct pollfd sp = {.fd = f->sock, .events = 0};
		if (poll(&sp, 1, 0) == 1 && (sp.revents & (POLLHUP | POLLERR)))
			return session_ended(f, st);
		if (ring_drain(f, 0, NULL, NULL) < 0 || (deadline && now_ns() >= deadline))
			return rc;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	if (rc != RSC_OK)
		return rc;
	for (;;) {
		if (ring_drain(f, id, out, &found) < 0)
			return rsc_fail(st, RSC_RESOURCE_EXHAUSTED,
					"out of memory queueing completions");
		if (found)
			return rsc_ok(st);
		rc = ring_wait(f, deadline, st);
		if (rc == RSC_DEADLINE_EXCEEDED) {
			uint64_t cid = f->next_run_id++;
			if (abandon(f, id) == 0 && abandon(f, cid) == 0)
				ring_submit(f, RSC_FAST_OP_CANCEL, 0, cid, 0, id, NULL);
			return rsc_fail(st, RSC_DEADLINE_EXCEEDED,
					"no completion of the run within %llu ms: it was cancelled",
					(unsigned long long)(t + RUN_GRACE_MS));
		}
		if (rc != RSC_OK)
			return rc;
	}
}

/* ---- grpc mode --------------------------------------------------------------------------------
 */

static int grpc_prepare(rsc_fast *f, int kind, const rsc_transfer_args *a, uint32_t *handle,
			rsc_status *st)
{
	struct prep p = {.handle = ++f->next_handle,
			 .kind = kind,
			 .timeout_ms = a->timeout_ms,
			 .backend = a->backend};
	p.metadata = strdup(a->metadata);
	p.request_id = a->request_id ? strdup(a->request_id) : NULL;
	p.descs = calloc(a->n_descriptors, sizeof(*p.descs));
	int bad = !p.metadata || (a->request_id && !p.request_id) || !p.descs;
	for (size_t i = 0; !bad && i < a->n_descriptors; i++) {
		p.descs[i] = a->descriptors[i];
		p.descs[i].region_id = strdup(a->descriptors[i].region_id);
		p.n_descs = i + 1;
		bad = !p.descs[i].region_id;
	}
	if (bad || prep_add(f, &p) != 0) {
		prep_free(&p);
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory copying the arguments");
	}
	*handle = p.handle;
	return rsc_ok(st);
}

static int grpc_run(rsc_fast *f, uint32_t handle, uint64_t user_data, uint64_t timeout_ms,
		    rsc_fast_completion *out, rsc_status *st)
{
	const struct prep *p = prep_find(f, handle);
	if (!p) {
		completion_set(out, user_data, RSC_NOT_FOUND, 0, 0, 0,
			       "no prepared transfer has this handle (unprepared, or never "
			       "prepared on this rsc_fast)");
		return rsc_ok(st);
	}
	uint64_t t = timeout_ms ? timeout_ms : p->timeout_ms;
	rsc_transfer_args a = {.metadata = p->metadata,
			       .descriptors = p->descs,
			       .n_descriptors = p->n_descs,
			       .timeout_ms = t,
			       .backend = p->backend,
			       .request_id = p->request_id};
	rsc_operation op = {0};
	rsc_status cst;
	uint64_t wait = t ? t + RUN_GRACE_MS : 0;
	int rc = p->kind == RSC_KIND_WRITE ? rsc_write(f->c, &a, wait, &op, &cst)
					   : rsc_read(f->c, &a, wait, &op, &cst);
	if (rc == RSC_UNAVAILABLE)
		return rsc_fail(st, rc, "%s", cst.message);
	if (rc != RSC_OK) {
		/* Refused before a transfer began, as the ring's sidecar says it in a CQE. */
		completion_set(out, user_data, rc, 0, 0, 0, cst.message);
		return rsc_ok(st);
	}
	int done = op.status == RSC_STATUS_COMPLETE;
	completion_set(out, user_data,
		       done	       ? 0
		       : op.error_code ? op.error_code
				       : RSC_UNKNOWN,
		       op.status, op.backend, op.bytes_done, done ? "" : op.error_message);
	if (rsc_op_status_terminal(op.status) && op.operation_id)
		rsc_operation_release(f->c, op.operation_id, NULL);
	rsc_operation_clear(&op);
	return rsc_ok(st);
}

/* Closes the socket (the sidecar cancels what is in flight), the mapping and the doorbells. */
static void ring_close(rsc_fast *f)
{
	if (f->sock >= 0)
		close(f->sock);
	if (f->map)
		munmap(f->map, f->map_size);
	if (f->sq_efd >= 0)
		close(f->sq_efd);
	if (f->cq_efd >= 0)
		close(f->cq_efd);
	f->sock = f->sq_efd = f->cq_efd = -1;
	f->map = NULL;
	f->ctl = NULL;
}

/* ---- the API ----------------------------------------------------------------------------------
 */

/* spin_us 0: poll only where this process may run on SPIN_MIN_CPUS CPUs or more. */
static uint32_t default_spin_us(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < SPIN_MIN_CPUS)
		return UINT32_MAX;
	return DEFAULT_SPIN_US;
}

int rsc_fast_open(rsc_client *c, const rsc_fast_options *opts, rsc_fast **out, rsc_status *st)
{
	if (!c || !out)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"rsc_fast_open: client and out are needed");
	rsc_fast *f = calloc(1, sizeof(*f));
	if (!f)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory opening the fast path");
	f->c = c;
	f->sock = f->sq_efd = f->cq_efd = -1;
	f->spin_us = opts && opts->spin_us ? opts->spin_us : default_spin_us();
	f->next_run_id = RUN_ID_BASE;
	int rc = ring_open(f, opts, st);
	if (rc == 1 && !(opts && opts->require_ring)) {
		ring_close(f);
		rc = RSC_OK;
	} else if (rc == 1) {
		rc = RSC_UNAVAILABLE; /* st says why; require_ring */
	} else if (rc == RSC_OK) {
		f->ring = 1;
	}
	if (rc != RSC_OK) {
		rsc_fast_close(f);
		return rc;
	}
	*out = f;
	return rsc_ok(st);
}

void rsc_fast_close(rsc_fast *f)
{
	if (!f)
		return;
	ring_close(f);
	for (size_t i = 0; i < f->n_preps; i++)
		prep_free(&f->preps[i]);
	free(f->preps);
	free(f->q);
	free(f->abandoned);
	free(f);
}

const char *rsc_fast_mode(const rsc_fast *f)
{
	return f && f->ring ? "ring" : "grpc";
}

int rsc_fast_prepare(rsc_fast *f, int kind, const rsc_transfer_args *a, uint32_t *handle,
		     rsc_status *st)
{
	if (!f || !a || !handle)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"rsc_fast_prepare: f, a and handle are needed");
	if (kind != RSC_KIND_READ && kind != RSC_KIND_WRITE)
		return rsc_fail(
		    st, RSC_INVALID_ARGUMENT,
		    "rsc_fast_prepare: kind must be RSC_KIND_READ or RSC_KIND_WRITE, not %d", kind);
	if (!a->metadata || !a->metadata[0])
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"rsc_fast_prepare: metadata (the peer's \"rsm1.\" text) is needed");
	if (a->has_requirement)
		return rsc_fail(
		    st, RSC_INVALID_ARGUMENT,
		    "rsc_fast_prepare: the fast path takes no requirement (ReportProgress "
		    "gate): use rsc_begin_read/rsc_begin_write for gated transfers");
	if (a->n_descriptors < 1 || a->n_descriptors > RSC_FAST_DESCS_MAX || !a->descriptors)
		return rsc_fail(st, RSC_INVALID_ARGUMENT,
				"rsc_fast_prepare: 1 to %u descriptors, not %zu",
				RSC_FAST_DESCS_MAX, a->n_descriptors);
	for (size_t i = 0; i < a->n_descriptors; i++) {
		const char *id = a->descriptors[i].region_id;
		if (!id || !id[0] || strlen(id) >= RSC_FAST_ID_MAX)
			return rsc_fail(st, RSC_INVALID_ARGUMENT,
					"descriptor %zu: region id must be 1 to %u characters", i,
					RSC_FAST_ID_MAX - 1);
	}
	if (f->dead)
		return session_ended(f, st);
	return f->ring ? ring_prepare(f, kind, a, handle, st)
		       : grpc_prepare(f, kind, a, handle, st);
}

int rsc_fast_unprepare(rsc_fast *f, uint32_t handle, rsc_status *st)
{
	if (!f)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_fast_unprepare: f is NULL");
	if (f->dead)
		return session_ended(f, st);
	if (f->ring)
		return ring_unprepare(f, handle, st);
	struct prep *p = prep_find(f, handle);
	if (!p)
		return rsc_fail(st, RSC_NOT_FOUND, "no prepared transfer has handle %u", handle);
	prep_remove(f, p);
	return rsc_ok(st);
}

int rsc_fast_run(rsc_fast *f, uint32_t handle, uint64_t timeout_ms, rsc_fast_completion *out,
		 rsc_status *st)
{
	if (!f || !out)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_fast_run: f and out are needed");
	if (f->dead)
		return session_ended(f, st);
	if (f->ring)
		return ring_run(f, handle, timeout_ms, out, st);
	return grpc_run(f, handle, f->next_run_id++, timeout_ms, out, st);
}

int rsc_fast_submit(rsc_fast *f, uint32_t handle, uint64_t user_data, uint64_t timeout_ms,
		    rsc_status *st)
{
	if (!f)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_fast_submit: f is NULL");
	if (f->dead)
		return session_ended(f, st);
	if (f->ring)
		return ring_submit(f, RSC_FAST_OP_RUN, handle, user_data, timeout_ms, 0, st);
	rsc_fast_completion c;
	int rc = grpc_run(f, handle, user_data, timeout_ms, &c, st);
	if (rc == RSC_OK && queue_push(f, &c) != 0)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory queueing a completion");
	return rc;
}

int rsc_fast_cancel(rsc_fast *f, uint64_t user_data, uint64_t cancel_user_data, rsc_status *st)
{
	if (!f)
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_fast_cancel: f is NULL");
	if (f->dead)
		return session_ended(f, st);
	if (f->ring)
		return ring_submit(f, RSC_FAST_OP_CANCEL, 0, cancel_user_data, 0, user_data, st);
	/* grpc mode runs each submission to its end at once: nothing is ever in flight. */
	rsc_fast_completion c;
	completion_set(&c, cancel_user_data, RSC_NOT_FOUND, 0, 0, 0,
		       "no run with this user_data is in flight (in grpc mode every run has "
		       "ended when rsc_fast_submit returns)");
	if (queue_push(f, &c) != 0)
		return rsc_fail(st, RSC_RESOURCE_EXHAUSTED, "out of memory queueing a completion");
	return rsc_ok(st);
}

int rsc_fast_reap(rsc_fast *f, rsc_fast_completion *out, size_t max, size_t *n, uint64_t timeout_ms,
		  rsc_status *st)
{
	if (!f || !n || (max && !out))
		return rsc_fail(st, RSC_INVALID_ARGUMENT, "rsc_fast_reap: f, out and n are needed");
	*n = 0;
	if (!max)
		return rsc_ok(st);
	uint64_t deadline = timeout_ms ? deadline_after(timeout_ms) : 0;
	for (;;) {
		if (f->ring && ring_drain(f, 0, NULL, NULL) < 0 && !f->q_len)
			return rsc_fail(st, RSC_RESOURCE_EXHAUSTED,
					"out of memory queueing completions");
		if ((*n = queue_pop(f, out, max)) > 0 || !f->ring || !timeout_ms)
			return rsc_ok(st);
		if (f->dead)
			return session_ended(f, st);
		int rc = ring_wait(f, deadline, st);
		if (rc == RSC_DEADLINE_EXCEEDED)
			return rsc_ok(st);
		if (rc != RSC_OK)
			return rc;
	}
}
