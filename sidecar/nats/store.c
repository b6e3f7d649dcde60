/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/store.c: published metadata kept by JetStream (see nats/store.h). Looks up the stream
 * on first use, or creates it with limits (one message per subject, max age, max bytes, file
 * storage, R3 on a cluster); stores with a confirmed JetStream publish; watches with an ordered
 * push consumer (the latest message per subject, then new ones) behind the bus's handler gate
 * (nats/internal.h); removes forgotten copies on its own deleter thread. Turns JetStream's
 * refusals into messages that say what to enable.
 *
 * Threads: callers' threads (put, watch, forget, defer); the deleter thread (removals and deferred
 * calls); nats.c delivery threads (watch handlers). st->mu guards the stream's state and the
 * deleter's queue.
 */
#include "nats/store.h"
#include "nats/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"

#define AREA "nats"

enum {
	DEFAULT_TIMEOUT_MS = 2000,
	STREAM_NAME_MAX = 200,
	ROOT_MAX = 256,
	MAX_MSG_SIZE = 512 * 1024, /* metadata text is at most 256 KiB */
	DESTROY_DRAIN_MS = 2000,
	DEFAULT_FAILOVER_MS = 15000,
	RETRY_PAUSE_MS = 250,
};
#define DEFAULT_MAX_AGE_MS (7LL * 24 * 3600 * 1000)
#define MAX_BYTES (1LL << 30)
#define MAX_MSGS (1000000LL)

/* A call deferred to the deleter thread (sc_nats_store_defer). */
struct job {
	void (*fn)(void *ctx);
	void *ctx;
	struct job *next;
};

struct sc_nats_store {
	struct sc_nats_bus *bus;
	jsCtx *js;
	char stream[STREAM_NAME_MAX + 1];
	int replicas_opt;
	int64_t max_age_ms;
	int timeout_ms;
	int failover_ms;

	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cond;
	bool ready;	     /* the stream was found or created */
	char root[ROOT_MAX]; /* stream subject = root + caller's subject */
	int replicas;	     /* what the stream has */
	uint64_t *queue;     /* seqs to remove */
	size_t n_queue, cap_queue;
	struct job *jobs, **jobs_tail; /* sc_nats_store_defer's, in order */
	bool stopping;
	pthread_t deleter;
};

/* ---- errors ------------------------------------------------------------------------------- */

static const char *last_conn_error(struct sc_nats_store *st)
{
	const char *txt = NULL;
	natsConnection_GetLastError(sc_nats_bus_conn(st->bus), &txt);
	return txt ? txt : "";
}

static bool permission_violation(struct sc_nats_store *st)
{
	const char *t = last_conn_error(st);
	return strstr(t, "Permissions Violation") && strstr(t, "$JS.API");
}

/*
 * One refusal: "<what> <subject>: <stored>: <why and what to enable>". what: "publish to",
 * "wait on"...; stored: what was (not) stored.
 */
static int js_error(struct sc_nats_store *st, natsStatus s, jsErrCode jerr, const char *what,
		    const char *subject, const char *stored, struct sc_err *err)
{
	if (jerr == JSNotEnabledForAccountErr || jerr == JSNotEnabledErr || s == NATS_NO_RESPONDERS)
		return sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "%s %s: %s: the NATS server has no JetStream for this account (start "
		    "nats-server with -js, or `jetstream {}` in its configuration, on every node "
		    "of a cluster, and enable it for the account), or run this sidecar with "
		    "--nats-handoff core (then metadata published before its reader subscribes "
		    "is lost)",
		    what, subject, stored);
	if (s == NATS_NOT_PERMITTED ||
	    ((s == NATS_TIMEOUT || s == NATS_OK) && permission_violation(st)))
		return sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "%s %s: %s: the NATS account may not use the JetStream API (server said: "
		    "%.200s): allow this sidecar's NATS user to publish to $JS.API.> and to the "
		    "store's subjects (%s>), and to subscribe to _INBOX.>, or run it with "
		    "--nats-handoff core (then metadata published before its reader subscribes is "
		    "lost)",
		    what, subject, stored, last_conn_error(st), st->root[0] ? st->root : "STREAM.");
	if (s == NATS_TIMEOUT)
		return sc_err_set(
		    err, SC_UNAVAILABLE,
		    "%s %s: %s: JetStream did not answer within %d ms (on a cluster: has the "
		    "stream %s lost its quorum? is JetStream enabled on the server this sidecar "
		    "is connected to?)",
		    what, subject, stored, st->timeout_ms, st->stream);
	if (s == NATS_CONNECTION_CLOSED || s == NATS_CONNECTION_DISCONNECTED ||
	    s == NATS_NOT_YET_CONNECTED)
		return sc_err_set(err, SC_UNAVAILABLE, "%s %s: %s: not connected to NATS (%s)",
				  what, subject, stored, natsStatus_GetText(s));
	const char *detail = nats_GetLastError(NULL);
	return sc_err_set(err, SC_FAILED_PRECONDITION,
			  "%s %s: %s: JetStream stream %s: %s (JetStream error %d) %.200s", what,
			  subject, stored, st->stream, natsStatus_GetText(s), (int)jerr,
			  detail ? detail : "");
}

/* ---- the stream ----------------------------------------------------------------------------- */

static int replicas_wanted(struct sc_nats_store *st)
{
	if (st->replicas_opt > 0)
		return st->replicas_opt;
	char **servers = NULL;
	int n = 0;
	if (natsConnection_GetServers(sc_nats_bus_conn(st->bus), &servers, &n) != NATS_OK)
		return 1;
	for (int i = 0; i < n; i++)
		free(servers[i]);
	free(servers);
	return n >= 3 ? 3 : 1;
}

/* Take the root from an existing stream: one subject "ROOT.>". */
static int adopt(struct sc_nats_store *st, jsStreamInfo *si, const char *what, const char *subject,
		 const char *stored, struct sc_err *err)
{
	jsStreamConfig *c = si->Config;
	const char *s0 = c && c->SubjectsLen == 1 ? c->Subjects[0] : NULL;
	size_t n = s0 ? strlen(s0) : 0;
	if (!s0 || n < 3 || n >= ROOT_MAX || strcmp(s0 + n - 2, ".>") != 0)
		return sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "%s %s: %s: the existing JetStream stream %s does not have one "
		    "subject of the form ROOT.> (it has %d, the first \"%s\"); give "
		    "it subjects [\"%s.>\"] or name another stream with --nats-stream",
		    what, subject, stored, st->stream, c ? c->SubjectsLen : 0, s0 ? s0 : "",
		    st->stream);
	memcpy(st->root, s0, n - 1); /* keep the '.' */
	st->root[n - 1] = '\0';
	st->replicas = c ? (int)c->Replicas : 0;
	if (c && c->MaxMsgsPerSubject != 1)
		SC_WARN(AREA,
			"JetStream stream %s keeps %lld messages per subject; 1 is enough for the "
			"metadata hand-off (older copies are kept for nothing)",
			st->stream, (long long)c->MaxMsgsPerSubject);
	return 0;
}

static int create_stream(struct sc_nats_store *st, jsOptions *jo, const char *what,
			 const char *subject, const char *stored, struct sc_err *err)
{
	char subj[ROOT_MAX + 2];
	snprintf(subj, sizeof(subj), "%s.>", st->stream);
	const char *subjects[1] = {subj};
	jsStreamConfig cfg;
	jsStreamConfig_Init(&cfg);
	cfg.Name = st->stream;
	cfg.Description = "rdma-sidecar: published RDMA metadata, the latest per subject, kept "
			  "until its operation ends (created by the sidecar)";
	cfg.Subjects = subjects;
	cfg.SubjectsLen = 1;
	cfg.Retention = js_LimitsPolicy;
	cfg.MaxMsgs = MAX_MSGS;
	cfg.MaxBytes = MAX_BYTES;
	cfg.MaxAge = st->max_age_ms * 1000000LL; /* nanoseconds */
	cfg.MaxMsgsPerSubject = 1;
	cfg.MaxMsgSize = MAX_MSG_SIZE;
	cfg.Discard = js_DiscardOld;
	cfg.Storage = js_FileStorage;
	int replicas = replicas_wanted(st);
	for (;;) {
		cfg.Replicas = replicas;
		jsStreamInfo *si = NULL;
		jsErrCode jerr = 0;
		natsStatus s = js_AddStream(&si, st->js, &cfg, jo, &jerr);
		if (s == NATS_OK) {
			int rc = adopt(st, si, what, subject, stored, err);
			jsStreamInfo_Destroy(si);
			if (rc == 0)
				SC_INFO(AREA,
					"created JetStream stream %s (subjects %s>, R%d, max age "
					"%lld s) for published metadata",
					st->stream, st->root, replicas,
					(long long)(st->max_age_ms / 1000));
			return rc;
		}
		if (jerr == JSStreamReplicasNotSupportedErr && replicas > 1) {
			replicas = 1; /* not a cluster after all */
			continue;
		}
		if (jerr == JSStreamNameExistErr) {
			/* Another sidecar created it meanwhile, with other settings: use it. */
			s = js_GetStreamInfo(&si, st->js, st->stream, jo, &jerr);
			if (s == NATS_OK) {
				int rc = adopt(st, si, what, subject, stored, err);
				jsStreamInfo_Destroy(si);
				return rc;
			}
		}
		if (jerr == JSInsufficientResourcesErr)
			return sc_err_set(
			    err, SC_FAILED_PRECONDITION,
			    "%s %s: %s: JetStream has no room for the stream %s (R%d, %lld MiB): "
			    "raise the server's or the account's JetStream limits, lower "
			    "--nats-stream-replicas (a cluster of fewer than %d nodes?), or "
			    "pre-create the stream with smaller limits and name it with "
			    "--nats-stream",
			    what, subject, stored, st->stream, replicas,
			    (long long)(MAX_BYTES >> 20), replicas);
		return js_error(st, s, jerr, what, subject, stored, err);
	}
}

/* The stream is known (found or created) after this returns 0. */
static int ensure(struct sc_nats_store *st, const char *what, const char *subject,
		  const char *stored, struct sc_err *err)
{
	pthread_mutex_lock(&st->mu);
	if (st->ready) {
		pthread_mutex_unlock(&st->mu);
		return 0;
	}
	int rc = 0;
	natsConnection *nc = sc_nats_bus_conn(st->bus);
	if (natsConnection_Status(nc) != NATS_CONN_STATUS_CONNECTED) {
		rc = sc_err_set(err, SC_UNAVAILABLE,
				"%s %s: %s: not connected to NATS (state %s); retry once connected",
				what, subject, stored, sc_nats_bus_state(st->bus));
		goto out;
	}
	jsOptions jo;
	jsOptions_Init(&jo);
	jo.Wait = st->timeout_ms;
	jsStreamInfo *si = NULL;
	jsErrCode jerr = 0;
	natsStatus s = js_GetStreamInfo(&si, st->js, st->stream, &jo, &jerr);
	if (s == NATS_OK) {
		rc = adopt(st, si, what, subject, stored, err);
		jsStreamInfo_Destroy(si);
		if (rc == 0)
			SC_INFO(AREA, "using JetStream stream %s (subjects %s>, R%d) for metadata",
				st->stream, st->root, st->replicas);
	} else if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
		rc = create_stream(st, &jo, what, subject, stored, err);
	} else {
		rc = js_error(st, s, jerr, what, subject, stored, err);
	}
	if (rc == 0)
		st->ready = true;
out:
	pthread_mutex_unlock(&st->mu);
	return rc;
}

/* ---- the deleter ---------------------------------------------------------------------------- */

static void delete_one(struct sc_nats_store *st, uint64_t seq)
{
	jsOptions jo;
	jsOptions_Init(&jo);
	jo.Wait = st->timeout_ms;
	jsErrCode jerr = 0;
	/* js_DeleteMsg marks it deleted (no erase): the copy is gone for every reader. */
	natsStatus s = js_DeleteMsg(st->js, st->stream, seq, &jo, &jerr);
	if (s == NATS_OK)
		SC_DEBUG(AREA, "removed stored metadata #%llu from %s", (unsigned long long)seq,
			 st->stream);
	else if (jerr != JSSequenceNotFoundErr && jerr != JSNoMessageFoundErr &&
		 s != NATS_NOT_FOUND)
		SC_WARN_LIMITED(AREA, "store-delete",
				"could not remove stored metadata #%llu from JetStream stream %s: "
				"%s (JetStream error %d); it expires with the stream's max age",
				(unsigned long long)seq, st->stream, natsStatus_GetText(s),
				(int)jerr);
}

static void *deleter_main(void *arg)
{
	struct sc_nats_store *st = arg;
	pthread_mutex_lock(&st->mu);
	for (;;) {
		while (!st->n_queue && !st->jobs && !st->stopping)
			pthread_cond_wait(&st->cond, &st->mu);
		/* Deferred calls first, and every one even when stopping: each caller counts on it. */
		if (st->jobs) {
			struct job *j = st->jobs;
			st->jobs = j->next;
			if (!st->jobs)
				st->jobs_tail = &st->jobs;
			pthread_mutex_unlock(&st->mu);
			j->fn(j->ctx);
			free(j);
			pthread_mutex_lock(&st->mu);
			continue;
		}
		if (!st->n_queue)
			break;
		uint64_t seq = st->queue[--st->n_queue];
		bool ready = st->ready;
		pthread_mutex_unlock(&st->mu);
		if (ready &&
		    natsConnection_Status(sc_nats_bus_conn(st->bus)) == NATS_CONN_STATUS_CONNECTED)
			delete_one(st, seq);
		pthread_mutex_lock(&st->mu);
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

void sc_nats_store_forget(struct sc_nats_store *st, uint64_t seq)
{
	if (!st || !seq)
		return;
	pthread_mutex_lock(&st->mu);
	if (!st->stopping && st->n_queue == st->cap_queue) {
		size_t cap = st->cap_queue ? st->cap_queue * 2 : 64;
		uint64_t *q = realloc(st->queue, cap * sizeof(*q));
		if (q) {
			st->queue = q;
			st->cap_queue = cap;
		}
	}
	if (!st->stopping && st->n_queue < st->cap_queue) {
		st->queue[st->n_queue++] = seq;
		pthread_cond_signal(&st->cond);
	}
	pthread_mutex_unlock(&st->mu);
}

bool sc_nats_store_defer(struct sc_nats_store *st, void (*fn)(void *ctx), void *ctx)
{
	struct job *j = st ? malloc(sizeof(*j)) : NULL;
	if (!j)
		return false;
	*j = (struct job){fn, ctx, NULL};
	pthread_mutex_lock(&st->mu);
	bool ok = !st->stopping;
	if (ok) {
		*st->jobs_tail = j;
		st->jobs_tail = &j->next;
		pthread_cond_signal(&st->cond);
	}
	pthread_mutex_unlock(&st->mu);
	if (!ok)
		free(j);
	return ok;
}

/* ---- public --------------------------------------------------------------------------------- */

int sc_nats_store_create(struct sc_nats_bus *bus, const struct sc_nats_store_opts *opts,
			 struct sc_nats_store **out, struct sc_err *err)
{
	static const struct sc_nats_store_opts none;
	if (!opts)
		opts = &none;
	if (!bus || !out)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "NATS store: bus and out are required");
	const char *name =
	    opts->stream && opts->stream[0] ? opts->stream : SC_NATS_STORE_DEFAULT_STREAM;
	size_t n = strlen(name);
	if (n > STREAM_NAME_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--nats-stream \"%.40s...\" is %zu bytes; the limit is %d", name,
				  n, STREAM_NAME_MAX);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] <= ' ' || name[i] == 0x7f || strchr(".*>/\\", name[i]))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "--nats-stream \"%s\": a JetStream stream name may not "
					  "hold '.', '*', '>', '/', '\\\\', whitespace or control "
					  "bytes (offset %zu)",
					  name, i);
	if (opts->replicas < 0 || opts->replicas > 5 || opts->max_age_ms < 0 ||
	    opts->timeout_ms < 0 || opts->failover_ms < 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "NATS store: replicas 0-5, max age and timeout not negative");
	struct sc_nats_store *st = calloc(1, sizeof(*st));
	if (!st)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	st->bus = bus;
	memcpy(st->stream, name, n + 1);
	st->replicas_opt = opts->replicas;
	st->max_age_ms = opts->max_age_ms ? opts->max_age_ms : DEFAULT_MAX_AGE_MS;
	st->timeout_ms = opts->timeout_ms ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
	st->failover_ms = opts->failover_ms ? opts->failover_ms : DEFAULT_FAILOVER_MS;
	jsOptions jo;
	jsOptions_Init(&jo);
	jo.Wait = st->timeout_ms;
	natsStatus s = natsConnection_JetStream(&st->js, sc_nats_bus_conn(bus), &jo);
	if (s != NATS_OK) {
		free(st);
		return sc_err_set(err, SC_INTERNAL, "NATS JetStream context: %s",
				  natsStatus_GetText(s));
	}
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cond, NULL);
	st->jobs_tail = &st->jobs;
	if (pthread_create(&st->deleter, NULL, deleter_main, st) != 0) {
		pthread_cond_destroy(&st->cond);
		pthread_mutex_destroy(&st->mu);
		jsCtx_Destroy(st->js);
		free(st);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "NATS store: cannot start its thread");
	}
	*out = st;
	return 0;
}

void sc_nats_store_destroy(struct sc_nats_store *st)
{
	if (!st)
		return;
	pthread_mutex_lock(&st->mu);
	if (st->n_queue &&
	    natsConnection_Status(sc_nats_bus_conn(st->bus)) == NATS_CONN_STATUS_CONNECTED) {
		/* Give the deleter a bounded time for what is queued (operations ended at exit). */
		uint64_t until = sc_clock_mono_after_ms(DESTROY_DRAIN_MS);
		while (st->n_queue && sc_clock_mono_ms() < until) {
			pthread_mutex_unlock(&st->mu);
			struct timespec ts = {0, 20 * 1000 * 1000};
			nanosleep(&ts, NULL);
			pthread_mutex_lock(&st->mu);
		}
	}
	st->n_queue = 0;
	st->stopping = true;
	pthread_cond_broadcast(&st->cond);
	pthread_mutex_unlock(&st->mu);
	pthread_join(st->deleter, NULL);
	jsCtx_Destroy(st->js);
	pthread_cond_destroy(&st->cond);
	pthread_mutex_destroy(&st->mu);
	free(st->queue);
	free(st);
}

const char *sc_nats_store_stream(const struct sc_nats_store *st)
{
	return st ? st->stream : "";
}

/* root + subject into buf; false when too long. */
static bool full_subject(struct sc_nats_store *st, const char *subject, char *buf, size_t len)
{
	pthread_mutex_lock(&st->mu);
	int n = snprintf(buf, len, "%s%s", st->root, subject);
	pthread_mutex_unlock(&st->mu);
	return n > 0 && (size_t)n < len;
}

static int put_once(struct sc_nats_store *st, const char *subject, const void *data, size_t len,
		    uint64_t *seq, struct sc_err *err)
{
	static const char what[] = "publish to";
	static const char nothing[] = "nothing was stored";
	if (sc_nats_check_subject(subject, false, "publish", err) != 0)
		return -1;
	if (len > MAX_MSG_SIZE)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s %s: %s: %zu bytes is over the stream's limit of %d", what,
				  subject, nothing, len, MAX_MSG_SIZE);
	if (ensure(st, what, subject, nothing, err) != 0)
		return -1;
	char full[SC_NATS_SUBJECT_MAX + ROOT_MAX + 1];
	if (!full_subject(st, subject, full, sizeof(full)))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: %s: subject too long", what,
				  subject, nothing);
	jsPubAck *pa = NULL;
	jsErrCode jerr = 0;
	jsPubOptions po;
	jsPubOptions_Init(&po);
	po.MaxWait = st->timeout_ms;
	po.ExpectStream = st->stream;
	natsStatus s = js_Publish(&pa, st->js, full, data, (int)len, &po, &jerr);
	if (s != NATS_OK) {
		if (s == NATS_TIMEOUT && !permission_violation(st))
			return sc_err_set(err, SC_UNAVAILABLE,
					  "%s %s: JetStream did not confirm within %d ms (the "
					  "message may or may not have been stored); publish again",
					  what, subject, st->timeout_ms);
		/* The stream may have been deleted by an operator: look it up (or create it) again;
		 * UNAVAILABLE makes the caller's loop retry at once through ensure, which says "no
		 * JetStream" if that is what it is. */
		pthread_mutex_lock(&st->mu);
		st->ready = false;
		pthread_mutex_unlock(&st->mu);
		if (s == NATS_NO_RESPONDERS || jerr == JSStreamNotFoundErr || s == NATS_NOT_FOUND)
			return sc_err_set(err, SC_UNAVAILABLE,
					  "%s %s: %s: the JetStream stream %s is gone (deleted?)",
					  what, subject, nothing, st->stream);
		return js_error(st, s, jerr, what, subject, nothing, err);
	}
	if (seq)
		*seq = pa->Sequence;
	jsPubAck_Destroy(pa);
	return 0;
}

/* Transient failures (UNAVAILABLE: not connected, no answer while a cluster elects a new stream
 * leader or the client moves to another node) are retried for failover_ms. */
static bool retry_after(struct sc_nats_store *st, const struct sc_err *err, uint64_t until)
{
	if (!err || err->code != SC_UNAVAILABLE || sc_clock_mono_ms() + RETRY_PAUSE_MS > until)
		return false;
	SC_DEBUG(AREA, "retrying after: %s", err->msg);
	struct timespec ts = {0, RETRY_PAUSE_MS * 1000 * 1000};
	nanosleep(&ts, NULL);
	(void)st;
	return true;
}

/* Calls once(arg) until it succeeds, or fails in a way retry_after does not retry, or the
 * store's fail-over time (failover_ms) has passed. */
static int with_failover(struct sc_nats_store *st, int (*once)(void *arg, struct sc_err *err),
			 void *arg, struct sc_err *err)
{
	struct sc_err local;
	if (!err)
		err = &local;
	uint64_t until = sc_clock_mono_after_ms((uint64_t)st->failover_ms);
	for (;;) {
		sc_err_clear(err);
		if (once(arg, err) == 0)
			return 0;
		if (!retry_after(st, err, until))
			return -1;
	}
}

struct put_args {
	struct sc_nats_store *st;
	const char *subject;
	const void *data;
	size_t len;
	uint64_t *seq;
};

static int put_try(void *arg, struct sc_err *err)
{
	struct put_args *a = arg;
	return put_once(a->st, a->subject, a->data, a->len, a->seq, err);
}

int sc_nats_store_put(struct sc_nats_store *st, const char *subject, const void *data, size_t len,
		      uint64_t *seq, struct sc_err *err)
{
	struct put_args a = {st, subject, data, len, seq};
	return with_failover(st, put_try, &a, err);
}

struct watch {
	struct sc_nats_store *st;
	sc_nats_store_fn fn;
	void *ctx;
	size_t root_len;
	const char *full;
	const char *queue; /* queue subscriptions: the group */
};

static void on_stored(void *ctx, natsMsg *msg)
{
	struct watch *w = ctx;
	const char *subj = natsMsg_GetSubject(msg);
	if (!subj || strlen(subj) <= w->root_len)
		return;
	uint64_t seq = 0;
	jsMsgMetaData *meta = NULL;
	if (natsMsg_GetMetaData(&meta, msg) == NATS_OK) {
		seq = meta->Sequence.Stream;
		jsMsgMetaData_Destroy(meta);
	}
	w->fn(w->ctx, subj + w->root_len, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg),
	      seq);
}

static void free_watch(void *ctx)
{
	struct watch *w = ctx;
	free((char *)w->full);
	free((char *)w->queue);
	free(w);
}

static natsStatus open_watch(void *arg, natsConnection *nc, natsMsgHandler cb, void *closure,
			     natsSubscription **out, struct sc_err *err)
{
	struct watch *w = arg;
	(void)nc;
	jsSubOptions so;
	jsSubOptions_Init(&so);
	so.Stream = w->st->stream;
	so.Ordered = true;
	so.Config.DeliverPolicy = js_DeliverLastPerSubject;
	so.Config.FilterSubject = w->full;
	jsOptions jo;
	jsOptions_Init(&jo);
	jo.Wait = w->st->timeout_ms;
	jsErrCode jerr = 0;
	natsStatus s = js_Subscribe(out, w->st->js, w->full, cb, closure, &jo, &so, &jerr);
	if (s != NATS_OK && (jerr == JSStreamNotFoundErr || s == NATS_NOT_FOUND)) {
		pthread_mutex_lock(&w->st->mu);
		w->st->ready = false; /* deleted meanwhile: look it up (or create it) again */
		pthread_mutex_unlock(&w->st->mu);
		sc_err_set(err, SC_UNAVAILABLE, "wait on %s: the JetStream stream %s is gone",
			   w->full + w->root_len, w->st->stream);
	} else if (s != NATS_OK)
		js_error(w->st, s, jerr, "wait on", w->full + w->root_len,
			 "nothing can be received", err);
	return s;
}

/* A new watch of subject (under the store's root) for fn/ctx; queue_group NULL for none. NULL on
 * failure (err set; what: "wait on", "subscribe to"). */
static struct watch *watch_new(struct sc_nats_store *st, const char *subject,
			       const char *queue_group, sc_nats_store_fn fn, void *ctx,
			       const char *what, struct sc_err *err)
{
	struct watch *w = calloc(1, sizeof(*w));
	char *full = malloc(SC_NATS_SUBJECT_MAX + ROOT_MAX + 1);
	char *q = queue_group ? strdup(queue_group) : NULL;
	if (!w || !full || (queue_group && !q)) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	if (!full_subject(st, subject, full, SC_NATS_SUBJECT_MAX + ROOT_MAX + 1)) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: subject too long", what, subject);
		goto fail;
	}
	w->st = st;
	w->fn = fn;
	w->ctx = ctx;
	w->full = full;
	w->queue = q;
	pthread_mutex_lock(&st->mu);
	w->root_len = strlen(st->root);
	pthread_mutex_unlock(&st->mu);
	return w;
fail:
	free(w);
	free(full);
	free(q);
	return NULL;
}

static int watch_once(struct sc_nats_store *st, const char *subject, sc_nats_store_fn fn, void *ctx,
		      uint64_t *sub_id, struct sc_err *err)
{
	if (!fn || !sub_id)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "watch: fn and sub_id are required");
	if (sc_nats_check_subject(subject, true, "subscribe", err) != 0)
		return -1;
	if (ensure(st, "wait on", subject, "nothing can be received", err) != 0)
		return -1;
	struct watch *w = watch_new(st, subject, NULL, fn, ctx, "wait on", err);
	if (!w)
		return -1;
	return sc_nats_sub_open(st->bus, subject, open_watch, w, on_stored, w, free_watch, sub_id,
				err);
}

struct watch_args {
	struct sc_nats_store *st;
	const char *subject;
	sc_nats_store_fn fn;
	void *ctx;
	uint64_t *sub_id;
};

static int watch_try(void *arg, struct sc_err *err)
{
	struct watch_args *a = arg;
	return watch_once(a->st, a->subject, a->fn, a->ctx, a->sub_id, err);
}

int sc_nats_store_watch(struct sc_nats_store *st, const char *subject, sc_nats_store_fn fn,
			void *ctx, uint64_t *sub_id, struct sc_err *err)
{
	struct watch_args a = {st, subject, fn, ctx, sub_id};
	return with_failover(st, watch_try, &a, err);
}

/* The durable consumer a queue group shares on a subject: the same name on every sidecar (a
 * 128-bit FNV-1a of group and stream subject, two seeds), a valid consumer name. */
static void queue_durable(const struct watch *w, char *out, size_t cap)
{
	uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
	for (int k = 0; k < 2; k++) {
		for (const char *p = w->queue; *p; p++)
			h[k] = (h[k] ^ (unsigned char)*p) * 0x100000001b3ull;
		h[k] = (h[k] ^ 0xff) * 0x100000001b3ull; /* between group and subject */
		for (const char *p = w->full; *p; p++)
			h[k] = (h[k] ^ (unsigned char)*p) * 0x100000001b3ull;
	}
	snprintf(out, cap, "rdma-sidecar-q-%016llx%016llx", (unsigned long long)h[0],
		 (unsigned long long)h[1]);
}

/*
 * A queue group on the stream: one durable push consumer per (group, subject) that every member
 * binds to, delivering what is stored (the latest per subject) and then each new message, each
 * to one member; a message a member took but did not acknowledge goes to another after the ack
 * wait. The consumer is created here (idempotent: the same configuration from every member) and
 * bound, not created by nats.c, which would delete it when its creator leaves the group; it
 * outlives its members, so what is published while none is subscribed reaches the next one, and
 * the server removes it after the stream's max age without members.
 */
static natsStatus open_queue(void *arg, natsConnection *nc, natsMsgHandler cb, void *closure,
			     natsSubscription **out, struct sc_err *err)
{
	struct watch *w = arg;
	(void)nc;
	char durable[64], deliver[96];
	queue_durable(w, durable, sizeof(durable));
	snprintf(deliver, sizeof(deliver), "_RDMA_SIDECAR_Q.%s", durable);
	jsOptions jo;
	jsOptions_Init(&jo);
	jo.Wait = w->st->timeout_ms;
	jsConsumerConfig cc;
	jsConsumerConfig_Init(&cc);
	cc.Durable = durable;
	cc.DeliverSubject = deliver;
	cc.DeliverGroup = w->queue;
	cc.DeliverPolicy = js_DeliverLastPerSubject;
	cc.AckPolicy = js_AckExplicit;
	cc.FilterSubject = w->full;
	cc.InactiveThreshold = w->st->max_age_ms * 1000000LL; /* nanoseconds */
	jsConsumerInfo *ci = NULL;
	jsErrCode jerr = 0;
	natsStatus s = js_AddConsumer(&ci, w->st->js, w->st->stream, &cc, &jo, &jerr);
	jsConsumerInfo_Destroy(ci);
	if (s == NATS_OK) {
		jsSubOptions so;
		jsSubOptions_Init(&so);
		so.Stream = w->st->stream;
		so.Consumer = durable;
		so.Queue = w->queue;
		s = js_Subscribe(out, w->st->js, w->full, cb, closure, &jo, &so, &jerr);
	}
	if (s != NATS_OK && (jerr == JSStreamNotFoundErr || s == NATS_NOT_FOUND)) {
		pthread_mutex_lock(&w->st->mu);
		w->st->ready = false; /* deleted meanwhile: look it up (or create it) again */
		pthread_mutex_unlock(&w->st->mu);
		sc_err_set(err, SC_UNAVAILABLE,
			   "subscribe to %s (queue group %s): the JetStream "
			   "stream %s is gone",
			   w->full + w->root_len, w->queue, w->st->stream);
	} else if (s != NATS_OK) {
		js_error(w->st, s, jerr, "subscribe to", w->full + w->root_len,
			 "nothing can be received", err);
	}
	return s;
}

int sc_nats_store_queue_subscribe(struct sc_nats_store *st, const char *subject,
				  const char *queue_group, sc_nats_store_fn fn, void *ctx,
				  uint64_t *sub_id, struct sc_err *err)
{
	if (!fn || !sub_id || !queue_group || !queue_group[0])
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "queue subscribe: fn, queue group and sub_id are required");
	if (sc_nats_check_subject(subject, true, "subscribe", err) != 0)
		return -1;
	for (const char *p = queue_group; *p; p++)
		if ((unsigned char)*p <= ' ' || *p == 0x7f)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "queue group \"%.64s\" contains whitespace or a control "
					  "byte",
					  queue_group);
	if (ensure(st, "subscribe to", subject, "nothing can be received", err) != 0)
		return -1;
	struct watch *w = watch_new(st, subject, queue_group, fn, ctx, "subscribe to", err);
	if (!w)
		return -1;
	return sc_nats_sub_open(st->bus, subject, open_queue, w, on_stored, w, free_watch, sub_id,
				err);
}
