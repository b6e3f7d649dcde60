/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/session.c: one worker's fast-path session (fast/session.h; the format is
 * rdma_sidecar/fast_ring.h). It makes the ring memory (a sealed memfd) and the two doorbells, hands
 * them over in HELLO, answers PREPARE and UNPREPARE on the socket, and turns each submission into
 * a transfer: sc_op_begin with the prepared metadata and descriptors, as BeginRead/BeginWrite do.
 *
 * Threads. The session's own thread reads the socket and the submission ring, begins every run,
 * writes every completion into the ring and rings the worker's doorbell; a small run on a warm
 * connection runs right on it (struct sc_run_here, sc_op_run_here), with no hand-off. A run ends on
 * whichever thread finishes it: the watch callback (engine lock held) only copies the completion
 * into the session's private outbox and wakes this thread through wake_fd (an eventfd nobody else
 * holds). Nothing that runs under the engine lock touches what the worker shares (ring memory,
 * doorbells, socket), and no system call on those may block: the doorbells are socketpairs whose
 * sidecar ends are this process's own (fast/bell.c), used with MSG_DONTWAIT, as is the socket.
 */
#include "fast/session.h"
#include "fast/bell.h"
#include "fast/wire.h"
#include "base/log.h"
#include "base/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * Flow: a submission is taken only when the completion ring has room for it and for every run
 * still in flight or in the outbox (pending), so posting never waits; a worker that does not read
 * its completions stops only its own submissions. While submissions wait for room the session
 * sets the ring's NEED_WAKEUP flag and sleeps until the worker rings (after reading completions),
 * or a back-off that doubles up to STALL_MAX_MS, for workers that never look at the flag.
 * Everything read from shared memory is read once and checked in a copy (fast/wire.c). A worker
 * that breaks the ring (an impossible sq_tail or cq_head) loses its session.
 */

#define MAX_HANDLES 256
/* A session whose submissions wait for room in the completion ring sleeps until the worker rings
 * (NEED_WAKEUP), or looks again after this back-off (doubling from STALL_FIRST_MS), for a worker
 * that does not know the flag. */
#define STALL_FIRST_MS 1
#define STALL_MAX_MS 1000
/* Doorbell datagrams taken per wake-up (poll comes back at once for the rest). */
#define BELL_DRAIN_MAX 256
/* Completions moved from the outbox into the ring per lock. */
#define FLUSH_BATCH 8

/* A run in flight: begun, its completion not yet released. */
struct run {
	struct sc_fast_session *s;
	bool used;
	atomic_bool done; /* its completion is posted: the session thread may release it */
	uint64_t user_data;
	char op_id[SC_ID_MAX];
	uint64_t watch_id;
	uint64_t taken_ns; /* sc_engine_clock_ns when its entry was taken (the run-time metric) */
};

/* A prepared transfer: what every run of it begins with. */
struct handle {
	uint32_t id; /* 0: free */
	enum sc_op_kind kind;
	struct sc_active_req req;
	char *metadata;
	struct sc_desc *descs;
	uint64_t bytes;
};

struct sc_fast_session {
	struct sc_fast_session_params p;
	int sock, mem_fd, sq_bell, cq_bell, wake_fd, stop_fd; /* bells: the sidecar's ends */
	int worker_sq, worker_cq; /* the worker's ends until HELLO carried them, then -1 */
	void *map;
	uint64_t map_size;
	struct sc_fast_ring ring;
	/* Completions not yet in the ring, oldest first: any thread adds (post), the session thread
	 * moves them into the ring (flush). Never more than cq_entries (they count in pending). */
	pthread_mutex_t out_mu;
	struct rsc_fast_cqe *outbox; /* cq_entries of them */
	uint32_t out_first, out_len; /* under out_mu */
	uint32_t pending;  /* session thread: runs taken whose completion is not yet in the ring */
	uint32_t stall_ms; /* session thread: the next back-off while submissions wait for room */
	struct run *runs;  /* ring.cq_entries of them; the session thread owns .used */
	struct handle handles[MAX_HANDLES];
	uint32_t next_handle;
	pthread_t thread;
	/* The run the session thread is running itself (sc_op_run_here), for the watcher
	 * (sc_fast_session_watch) to cancel while this thread cannot look at its ring or socket. */
	pthread_mutex_t busy_mu;
	struct run *busy;	  /* under busy_mu */
	atomic_bool stopping;	  /* sc_fast_session_stop was called */
	uint64_t watch_cancelled; /* under busy_mu: user_data the watcher cancelled (+1; 0 none) */
	uint8_t msg[RSC_FAST_MSG_MAX];
};

/* ---- completions (the watch callback queues, the session thread posts) ----------------------- */

/* Queues a completion (any thread, the engine lock possibly held): private memory only. */
static void post(struct sc_fast_session *s, const struct rsc_fast_cqe *c)
{
	pthread_mutex_lock(&s->out_mu);
	uint32_t cap = s->ring.cq_entries;
	if (s->out_len < cap) { /* always: pending bounds it */
		s->outbox[(s->out_first + s->out_len) % cap] = *c;
		s->out_len++;
	}
	pthread_mutex_unlock(&s->out_mu);
}

static void wake(struct sc_fast_session *s)
{
	uint64_t one = 1;
	(void)!write(s->wake_fd, &one, sizeof(one)); /* EAGAIN: the counter is full, still awake */
}

/* The session thread: moves the outbox into the ring, then rings the worker's doorbell once. The
 * ring had room for every pending completion when their submissions were taken; a worker that
 * moved its cq_head back since only overwrites its own unread entries. */
static void flush(struct sc_fast_session *s)
{
	uint32_t moved = 0;
	for (;;) {
		struct rsc_fast_cqe batch[FLUSH_BATCH];
		uint32_t n = 0;
		pthread_mutex_lock(&s->out_mu);
		uint32_t cap = s->ring.cq_entries;
		while (n < FLUSH_BATCH && s->out_len) {
			batch[n++] = s->outbox[s->out_first];
			s->out_first = (s->out_first + 1) % cap;
			s->out_len--;
		}
		pthread_mutex_unlock(&s->out_mu);
		if (!n)
			break;
		for (uint32_t i = 0; i < n; i++)
			sc_fast_ring_post(&s->ring, &batch[i]);
		moved += n;
	}
	if (!moved)
		return;
	s->pending -= moved < s->pending ? moved : s->pending;
	sc_trace_mark(sc_trace_current(), "fast_cqe_posted");
	sc_fast_bell_ring_once(s->cq_bell); /* not sent: a ring is unread still, or the worker left */
}

static void post_error(struct sc_fast_session *s, uint64_t user_data, const struct sc_err *err)
{
	struct rsc_fast_cqe c;
	sc_fast_cqe_fill(&c, user_data, (int)err->code, 0, 0, 0, err->msg);
	post(s, &c);
	sc_engine_fast_path_note(s->p.eng, SC_FAST_RUN_REFUSED);
}

/* The run's end: its completion into the outbox, then a wake-up for the session thread to write
 * it into the ring and release the run. Once done is set the slot may be released and reused (the
 * release takes the engine lock, which a watch callback holds until it returns), so nothing below
 * reads r. */
static void post_end(struct run *r, const struct sc_op_info *info)
{
	struct sc_fast_session *s = r->s;
	struct rsc_fast_cqe c;
	bool ok = info->status == SC_OPS_COMPLETE;
	sc_fast_cqe_fill(&c, r->user_data,
			 ok ? 0 : (int)(info->err_code ? info->err_code : SC_INTERNAL),
			 (uint32_t)info->status, info->bytes_done, (uint32_t)info->backend,
			 ok ? "" : info->err_msg);
	post(s, &c);
	sc_engine_fast_path_run_time(s->p.eng, sc_engine_clock_ns() - r->taken_ns);
	atomic_store(&r->done, true);
	sc_engine_fast_path_note(s->p.eng, ok ? SC_FAST_RUN_COMPLETE : SC_FAST_RUN_FAILED);
	wake(s);
}

/* Watch callback: an engine thread, engine lock held. Private memory and wake_fd only. */
static bool on_change(void *ctx, const struct sc_op_info *info)
{
	if (!sc_op_status_terminal(info->status))
		return true;
	post_end(ctx, info);
	return false;
}

/* ---- runs (the session's thread) ------------------------------------------------------------- */

static struct handle *handle_find(struct sc_fast_session *s, uint32_t id)
{
	for (size_t i = 0; id && i < MAX_HANDLES; i++)
		if (s->handles[i].id == id)
			return &s->handles[i];
	return NULL;
}

static struct run *run_slot(struct sc_fast_session *s)
{
	for (uint32_t i = 0; i < s->ring.cq_entries; i++)
		if (!s->runs[i].used)
			return &s->runs[i];
	return NULL;
}

/* Releases every run whose completion is posted: its operation goes. Its watch is over (it saw
 * the terminal state, and post_end reads nothing of the run after setting done), so there is
 * nothing to unwatch. */
static void reap(struct sc_fast_session *s)
{
	for (uint32_t i = 0; i < s->ring.cq_entries; i++) {
		struct run *r = &s->runs[i];
		if (!r->used || !atomic_load(&r->done))
			continue;
		struct sc_err err;
		sc_err_clear(&err);
		sc_op_release(s->p.eng, r->op_id, &err); /* NOT_FOUND: already forgotten */
		r->used = false;
	}
}

static void run_begin(struct sc_fast_session *s, const struct rsc_fast_sqe *e)
{
	struct sc_err err;
	sc_err_clear(&err);
	uint64_t taken_ns = sc_engine_clock_ns();
	struct handle *h = handle_find(s, e->handle);
	if (!h) {
		sc_err_set(&err, SC_NOT_FOUND,
			   "no prepared transfer with handle %u in this session (PREPARE it first)",
			   e->handle);
		post_error(s, e->user_data, &err);
		return;
	}
	struct run *r = run_slot(s);
	if (!r) {
		reap(s); /* runs that ended but are not released yet; the room bounds the others */
		r = run_slot(s);
	}
	if (!r) {
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "every run slot of this session is in use");
		post_error(s, e->user_data, &err);
		return;
	}
	struct sc_active_req req = h->req;
	if (e->timeout_ms)
		req.timeout_ms = e->timeout_ms;
	struct sc_op_info info;
	sc_trace_call_in(); /* the hand-off trace's first stage: the entry was taken now */
	struct sc_run_here here = {0};
	req.here = &here;
	if (sc_op_begin(s->p.eng, h->kind, &req, &info, &err) != 0) {
		sc_op_run_here(&here);
		post_error(s, e->user_data, &err);
		return;
	}
	r->used = true;
	r->s = s;
	r->user_data = e->user_data;
	r->taken_ns = taken_ns;
	atomic_store(&r->done, false);
	memcpy(r->op_id, info.id, sizeof(r->op_id));
	sc_op_info_free(&info);
	struct sc_op_info first;
	if (sc_op_watch(s->p.eng, r->op_id, on_change, r, &r->watch_id, &first, &err) != 0) {
		/* Forgotten already (released by someone holding its id): say so. */
		sc_op_run_here(&here);
		sc_op_release(s->p.eng, r->op_id, NULL);
		r->used = false;
		post_error(s, e->user_data, &err);
		return;
	}
	bool ended = sc_op_status_terminal(first.status);
	if (ended)
		post_end(r, &first); /* ended before the watch: the watch is over already */
	sc_op_info_free(&first);
	/* A small transfer runs here now (its end comes through on_change). Meanwhile this thread
	 * sees neither the ring nor the socket: the watcher cancels it for a CANCEL entry or a
	 * closed socket. */
	pthread_mutex_lock(&s->busy_mu);
	s->busy = ended ? NULL : r;
	if (s->busy && atomic_load(&s->stopping)) {
		struct sc_op_info ci;
		if (sc_op_cancel(s->p.eng, r->op_id, &ci, NULL) == 0)
			sc_op_info_free(&ci);
		s->busy = NULL;
	}
	pthread_mutex_unlock(&s->busy_mu);
	sc_op_run_here(&here);
	pthread_mutex_lock(&s->busy_mu);
	s->busy = NULL;
	pthread_mutex_unlock(&s->busy_mu);
}

static void run_cancel(struct sc_fast_session *s, const struct rsc_fast_sqe *e)
{
	struct sc_err err;
	sc_err_clear(&err);
	for (uint32_t i = 0; i < s->ring.cq_entries; i++) {
		struct run *r = &s->runs[i];
		if (!r->used || atomic_load(&r->done) || r->user_data != e->target)
			continue;
		struct sc_op_info info;
		if (sc_op_cancel(s->p.eng, r->op_id, &info, &err) == 0)
			sc_op_info_free(&info);
		struct rsc_fast_cqe c;
		sc_fast_cqe_fill(&c, e->user_data, 0, 0, 0, 0, "");
		post(s, &c);
		return;
	}
	pthread_mutex_lock(&s->busy_mu);
	bool by_watcher = s->watch_cancelled == e->target + 1;
	if (by_watcher)
		s->watch_cancelled = 0;
	pthread_mutex_unlock(&s->busy_mu);
	if (by_watcher) { /* delivered while the run ran on this thread */
		struct rsc_fast_cqe c;
		sc_fast_cqe_fill(&c, e->user_data, 0, 0, 0, 0, "");
		post(s, &c);
		return;
	}
	/* Not a refused run: the cancel's own answer, not counted in the runs' metrics. */
	struct rsc_fast_cqe c;
	char msg[96];
	snprintf(msg, sizeof(msg), "no run with user_data %llu in flight in this session",
		 (unsigned long long)e->target);
	sc_fast_cqe_fill(&c, e->user_data, SC_NOT_FOUND, 0, 0, 0, msg);
	post(s, &c);
}

/* Whether the worker queued a CANCEL of user_data behind what was taken: a look at the entries
 * between the published head and the worker's tail, copies only, nothing taken. */
static bool cancel_queued(struct sc_fast_session *s, uint64_t user_data)
{
	uint32_t head = __atomic_load_n(&s->ring.ctl->sq_head, __ATOMIC_ACQUIRE);
	uint32_t tail = __atomic_load_n(&s->ring.ctl->sq_tail, __ATOMIC_ACQUIRE);
	uint32_t n = tail - head;
	if (n > s->ring.sq_entries)
		return false;
	for (uint32_t i = 0; i < n; i++) {
		struct rsc_fast_sqe e;
		memcpy(&e, &s->ring.sq[(head + i) & (s->ring.sq_entries - 1)], sizeof(e));
		if (e.opcode == RSC_FAST_OP_CANCEL && e.target == user_data)
			return true;
	}
	return false;
}

void sc_fast_session_watch(struct sc_fast_session *s)
{
	pthread_mutex_lock(&s->busy_mu);
	struct run *r = s->busy;
	if (r && !atomic_load(&r->done)) {
		struct pollfd p = {.fd = s->sock, .events = POLLIN};
		char c;
		bool closed = poll(&p, 1, 0) == 1 &&
			      ((p.revents & (POLLHUP | POLLERR)) ||
			       recv(s->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
		bool cancel = cancel_queued(s, r->user_data);
		if (closed || cancel) {
			struct sc_op_info info;
			if (sc_op_cancel(s->p.eng, r->op_id, &info, NULL) == 0)
				sc_op_info_free(&info);
			if (cancel)
				s->watch_cancelled = r->user_data + 1;
			s->busy = NULL;
		}
	}
	pthread_mutex_unlock(&s->busy_mu);
}

/* Takes and runs what the worker submitted, moving completions into the ring as they come. -1:
 * the worker broke its submission ring, -2 its completion ring (err says how; end the session); 1:
 * entries wait for room in the completion ring (NEED_WAKEUP is set: the worker rings once it reads
 * completions); 0: none left. */
static int drain(struct sc_fast_session *s, struct sc_err *err)
{
	unsigned taken = 0;
	for (;;) {
		flush(s);
		if (atomic_load(&s->stopping))
			return 0;
		uint32_t room;
		if (sc_fast_ring_cq_space(&s->ring, &room, err) != 0)
			return -2;
		if (room <= s->pending) {
			uint32_t tail = __atomic_load_n(&s->ring.ctl->sq_tail, __ATOMIC_ACQUIRE);
			if (tail == s->ring.sq_head) {
				sc_fast_ring_need_wakeup(&s->ring, false);
				return 0;
			}
			if (!s->ring.need_wakeup) {
				/* Ask, then look once more: a worker that read its completions
				 * before it could see the flag has made room already. */
				sc_fast_ring_need_wakeup(&s->ring, true);
				continue;
			}
			if (taken)
				s->stall_ms = STALL_FIRST_MS;
			return 1;
		}
		sc_fast_ring_need_wakeup(&s->ring, false);
		struct rsc_fast_sqe e;
		int rc = sc_fast_ring_take(&s->ring, 1, &e, err);
		if (rc <= 0)
			return rc;
		taken++;
		s->pending++;
		struct sc_err cerr;
		sc_err_clear(&cerr);
		if (sc_fast_check_sqe(&e, &cerr) != 0)
			post_error(s, e.user_data, &cerr);
		else if (e.opcode == RSC_FAST_OP_RUN)
			run_begin(s, &e);
		else
			run_cancel(s, &e);
	}
}

/* ---- socket messages (the session's thread) -------------------------------------------------- */

static void answer(struct sc_fast_session *s, uint64_t token, const struct sc_err *err,
		   uint32_t handle, uint64_t bytes)
{
	struct rsc_fast_result m;
	memset(&m, 0, sizeof(m));
	m.hdr.type = RSC_FAST_MSG_RESULT;
	m.hdr.len = sizeof(m);
	m.hdr.token = token;
	m.code = err ? (int32_t)err->code : 0;
	m.handle = handle;
	m.bytes = bytes;
	if (err)
		snprintf(m.message, sizeof(m.message), "%s", err->msg);
	/* The socket buffer holds many answers; a worker that never reads them loses the session. */
	if (send(s->sock, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(m))
		shutdown(s->sock, SHUT_RDWR);
}

static void handle_clear(struct handle *h)
{
	free(h->metadata);
	free(h->descs);
	memset(h, 0, sizeof(*h));
}

static void prepare(struct sc_fast_session *s, size_t len)
{
	struct sc_err err;
	sc_err_clear(&err);
	uint64_t token;
	memcpy(&token, s->msg + offsetof(struct rsc_fast_msg_hdr, token), sizeof(token));
	struct sc_fast_prepared pr;
	if (sc_fast_parse_prepare(s->msg, len, &pr, &err) != 0) {
		answer(s, token, &err, 0, 0);
		return;
	}
	struct handle *h = NULL;
	for (size_t i = 0; i < MAX_HANDLES && !h; i++)
		if (!s->handles[i].id)
			h = &s->handles[i];
	if (!h) {
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED,
			   "this session holds %d prepared transfers already: UNPREPARE one",
			   MAX_HANDLES);
		goto fail;
	}
	h->descs = calloc(pr.n_descs, sizeof(*h->descs));
	if (!h->descs) {
		sc_err_set(&err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < pr.n_descs; i++) {
		const struct sc_fast_prepared_desc *d = &pr.descs[i];
		memcpy(h->descs[i].region_id, d->region_id, SC_ID_MAX);
		h->descs[i].offset = d->offset;
		h->descs[i].length = d->length;
		h->bytes += d->length;
	}
	h->kind = pr.kind == 3 ? SC_OP_READ : SC_OP_WRITE;
	h->metadata = pr.metadata;
	pr.metadata = NULL;
	h->req = (struct sc_active_req){
	    .metadata = h->metadata,
	    .descs = h->descs,
	    .n_descs = pr.n_descs,
	    .timeout_ms = pr.timeout_ms,
	    .backend = (enum sc_backend_kind)pr.backend,
	    .request_id = "",
	    .quiet = true, /* a worker runs thousands a second: the metrics count them */
	};
	/* Checked once here as BeginRead/BeginWrite check it (metadata, descriptors against it,
	 * regions and bounds), without using the metadata up; each run checks the metadata again
	 * (it may expire, or its passive operation run out of uses). */
	if (sc_op_check_active(s->p.eng, h->kind, &h->req, &err) != 0)
		goto fail_descs;
	if (++s->next_handle == 0)
		s->next_handle = 1;
	h->id = s->next_handle;
	sc_fast_prepared_free(&pr);
	answer(s, token, NULL, h->id, h->bytes);
	return;
fail_descs:
	handle_clear(h);
fail:
	sc_fast_prepared_free(&pr);
	answer(s, token, &err, 0, 0);
}

static void unprepare(struct sc_fast_session *s, size_t len)
{
	struct sc_err err;
	sc_err_clear(&err);
	uint64_t token;
	memcpy(&token, s->msg + offsetof(struct rsc_fast_msg_hdr, token), sizeof(token));
	uint32_t id;
	if (sc_fast_parse_unprepare(s->msg, len, &id, &err) != 0) {
		answer(s, token, &err, 0, 0);
		return;
	}
	struct handle *h = handle_find(s, id);
	if (!h) {
		sc_err_set(&err, SC_NOT_FOUND, "no prepared transfer with handle %u in this session",
			   id);
		answer(s, token, &err, 0, 0);
		return;
	}
	/* Runs in flight keep their own copy of nothing: sc_op_begin copied what it needs. */
	handle_clear(h);
	answer(s, token, NULL, id, 0);
}

/* One datagram from the worker. -1: the socket is closed or broken (end the session). */
static int read_message(struct sc_fast_session *s)
{
	ssize_t n = recv(s->sock, s->msg, sizeof(s->msg), MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	if (n == 0)
		return -1;
	struct sc_err err;
	sc_err_clear(&err);
	if ((size_t)n > sizeof(s->msg)) {
		sc_err_set(&err, SC_INVALID_ARGUMENT,
			   "message of %zd bytes: the fast path takes at most %u", n, RSC_FAST_MSG_MAX);
		answer(s, 0, &err, 0, 0);
		return 0;
	}
	switch (sc_fast_msg_type(s->msg, (size_t)n)) {
	case RSC_FAST_MSG_PREPARE:
		prepare(s, (size_t)n);
		break;
	case RSC_FAST_MSG_UNPREPARE:
		unprepare(s, (size_t)n);
		break;
	default:
		sc_err_set(&err, SC_INVALID_ARGUMENT,
			   "message of %zd bytes is neither PREPARE nor UNPREPARE (rdma_sidecar/"
			   "fast_ring.h: type, then len equal to the datagram's size)",
			   n);
		answer(s, 0, &err, 0, 0);
	}
	return 0;
}

/* Ends every run still in flight and releases its operation; the worker's memory is its own. */
static void end_runs(struct sc_fast_session *s)
{
	for (uint32_t i = 0; i < s->ring.cq_entries; i++) {
		struct run *r = &s->runs[i];
		if (!r->used)
			continue;
		sc_op_unwatch(s->p.eng, r->watch_id);
		struct sc_err err;
		sc_err_clear(&err);
		sc_op_release(s->p.eng, r->op_id, &err);
		r->used = false;
	}
}

static void *session_main(void *arg)
{
	struct sc_fast_session *s = arg;
	struct pollfd pfd[4] = {{.fd = s->sock, .events = POLLIN},
				{.fd = s->sq_bell, .events = POLLIN},
				{.fd = s->wake_fd, .events = POLLIN},
				{.fd = s->stop_fd, .events = POLLIN}};
	const char *why = "the worker closed the socket";
	struct sc_err err;
	sc_err_clear(&err);
	int wait_ms = -1;
	s->stall_ms = STALL_FIRST_MS;
	for (;;) {
		if (poll(pfd, 4, wait_ms) < 0) {
			if (errno == EINTR)
				continue;
			why = "poll failed";
			break;
		}
		if (pfd[3].revents) {
			why = "the sidecar is stopping";
			break;
		}
		if (pfd[2].revents) {
			uint64_t v;
			(void)!read(s->wake_fd, &v, sizeof(v)); /* ours alone: non-blocking */
			flush(s);
			reap(s);
		}
		if ((pfd[0].revents & POLLIN) && read_message(s) != 0)
			break;
		if (pfd[0].revents & (POLLHUP | POLLERR | POLLNVAL))
			break;
		if (pfd[1].revents)
			sc_fast_bell_drain(s->sq_bell, BELL_DRAIN_MAX);
		int rc = drain(s, &err);
		if (rc < 0) {
			SC_WARN_LIMITED("fast", "fast.broken-ring",
					"session of pid %d: %s; ending the session", (int)s->p.pid,
					err.msg);
			why = rc == -1 ? "the worker broke its submission ring"
				       : "the worker broke its completion ring";
			break;
		}
		if (rc == 0) {
			wait_ms = -1;
			s->stall_ms = STALL_FIRST_MS;
		} else { /* stalled: the worker rings when it makes room; else look again later */
			wait_ms = (int)s->stall_ms;
			s->stall_ms =
			    s->stall_ms * 2 > STALL_MAX_MS ? STALL_MAX_MS : s->stall_ms * 2;
		}
	}
	end_runs(s);
	flush(s); /* what ended meanwhile: the worker may still read it */
	sc_log_limited(SC_LOG_INFO, "fast", "fast.session-ended",
		       "fast-path session of pid %d (uid %u) ended: %s", (int)s->p.pid,
		       (unsigned)s->p.uid, why);
	s->p.on_exit(s->p.ctx, s);
	return NULL;
}

/* ---- set-up and teardown --------------------------------------------------------------------- */

static void session_free(struct sc_fast_session *s)
{
	for (size_t i = 0; i < MAX_HANDLES; i++)
		handle_clear(&s->handles[i]);
	if (s->map)
		munmap(s->map, s->map_size);
	int fds[] = {s->sock,	 s->mem_fd,  s->sq_bell,   s->cq_bell,
		     s->wake_fd, s->stop_fd, s->worker_sq, s->worker_cq};
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
	pthread_mutex_destroy(&s->out_mu);
	pthread_mutex_destroy(&s->busy_mu);
	free(s->outbox);
	free(s->runs);
	free(s);
}

/* The ring memory: a memfd sealed against shrinking (a worker's ftruncate would turn the sidecar's
 * next access into SIGBUS) and growing. */
static int make_rings(struct sc_fast_session *s, struct sc_err *err)
{
	uint64_t sq_off, cq_off;
	if (sc_fast_ring_layout(s->p.entries, s->p.entries, &s->map_size, &sq_off, &cq_off) != 0)
		return sc_err_set(err, SC_INTERNAL, "bad ring size %u", s->p.entries);
	s->mem_fd = memfd_create("rdma-sidecar-fast", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->mem_fd < 0 || ftruncate(s->mem_fd, (off_t)s->map_size) != 0 ||
	    fcntl(s->mem_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path ring memory: %s",
				  strerror(errno));
	s->map = mmap(NULL, s->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->mem_fd, 0);
	if (s->map == MAP_FAILED) {
		s->map = NULL;
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path ring memory: mmap: %s",
				  strerror(errno));
	}
	sc_fast_ring_init(&s->ring, s->map, s->p.entries, s->p.entries);
	s->runs = calloc(s->p.entries, sizeof(*s->runs));
	s->outbox = calloc(s->p.entries, sizeof(*s->outbox));
	if (!s->runs || !s->outbox)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path session: out of memory");
	if (sc_fast_bell_pair(&s->sq_bell, &s->worker_sq, err) != 0 ||
	    sc_fast_bell_pair(&s->cq_bell, &s->worker_cq, err) != 0)
		return -1;
	/* Private to the sidecar: their flags are its own. */
	s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake_fd < 0 || s->stop_fd < 0)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path session: eventfd: %s",
				  strerror(errno));
	return 0;
}

static int send_hello(struct sc_fast_session *s, struct sc_err *err)
{
	struct rsc_fast_hello h;
	memset(&h, 0, sizeof(h));
	h.hdr.type = RSC_FAST_MSG_HELLO;
	h.hdr.len = sizeof(h);
	h.magic = RSC_FAST_MAGIC;
	h.version = RSC_FAST_VERSION;
	h.sq_entries = s->ring.sq_entries;
	h.cq_entries = s->ring.cq_entries;
	h.map_size = s->map_size;
	h.sq_offset = (uint64_t)((uint8_t *)s->ring.sq - (uint8_t *)s->map);
	h.cq_offset = (uint64_t)((uint8_t *)s->ring.cq - (uint8_t *)s->map);
	h.max_handles = MAX_HANDLES;
	struct sc_info info;
	sc_engine_info(s->p.eng, &info);
	snprintf(h.sidecar_id, sizeof(h.sidecar_id), "%s", info.sidecar_id);

	int fds[3] = {s->mem_fd, s->worker_sq, s->worker_cq};
	union {
		char buf[CMSG_SPACE(sizeof(fds))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	if (sendmsg(s->sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(h))
		return sc_err_set(err, SC_UNAVAILABLE, "fast-path HELLO: %s", strerror(errno));
	return 0;
}

int sc_fast_session_start(const struct sc_fast_session_params *p, struct sc_fast_session **out,
			  struct sc_err *err)
{
	struct sc_fast_session *s = calloc(1, sizeof(*s));
	if (!s) {
		close(p->sock);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	}
	s->p = *p;
	s->sock = p->sock;
	s->mem_fd = s->sq_bell = s->cq_bell = s->wake_fd = s->stop_fd = -1;
	s->worker_sq = s->worker_cq = -1;
	pthread_mutex_init(&s->out_mu, NULL);
	pthread_mutex_init(&s->busy_mu, NULL);
	if (make_rings(s, err) != 0 || send_hello(s, err) != 0)
		goto fail;
	/* The worker holds them now; the mapping keeps the ring memory. */
	close(s->worker_sq);
	close(s->worker_cq);
	close(s->mem_fd);
	s->worker_sq = s->worker_cq = s->mem_fd = -1;
	int rc = pthread_create(&s->thread, NULL, session_main, s);
	if (rc != 0) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path session thread: %s", strerror(rc));
		goto fail;
	}
	*out = s;
	return 0;
fail:
	session_free(s);
	return -1;
}

void sc_fast_session_stop(struct sc_fast_session *s)
{
	uint64_t one = 1;
	(void)!write(s->stop_fd, &one, sizeof(one));
	/* A run on the session's own thread would hold the stop until its deadline: cancel it (and
	 * any the thread is about to run: run_begin looks at stopping under busy_mu). */
	pthread_mutex_lock(&s->busy_mu);
	atomic_store(&s->stopping, true);
	if (s->busy && !atomic_load(&s->busy->done)) {
		struct sc_op_info info;
		if (sc_op_cancel(s->p.eng, s->busy->op_id, &info, NULL) == 0)
			sc_op_info_free(&info);
		s->busy = NULL;
	}
	pthread_mutex_unlock(&s->busy_mu);
}

void sc_fast_session_join_free(struct sc_fast_session *s)
{
	pthread_join(s->thread, NULL);
	session_free(s);
}
