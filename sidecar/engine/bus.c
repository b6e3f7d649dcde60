/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/bus.c: metadata exchange over NATS for the PublishMetadata / SubscribeMetadata RPCs.
 * Publishing checks the text first (a local passive operation's own metadata, or verified text);
 * receiving verifies every message (signature, expiry, audience = this sidecar) and delivers only
 * what passes, logging the rest. With --nats-subject-prefix, workers may only publish and subscribe
 * beneath that prefix. RPC threads publish and subscribe; NATS delivery threads run
 * on_message. Owns the subscriber list (under eng->mu).
 *
 * Hand-off (--nats-handoff): jetstream (the default) keeps each published message in a JetStream
 * stream (nats/store.c) as the latest of its subject, and removes it when the operation behind it
 * ends (an operation watch) or, for metadata text published as is, when that metadata expires (a
 * timer); subscriptions get what is stored, then what comes. core publishes on the subject
 * itself: nothing is kept. The records of stored copies (struct sc_bus_stored) are on
 * eng->stored under eng->mu; the operation watch (engine lock held), the timer thread or
 * sc_bus_stop removes each, whoever takes it off the list frees it.
 */
#include "engine/internal.h"
#include "base/log.h"
#include "base/timer.h"
#include "engine/metrics.h"
#include "nats/client.h"
#include "nats/store.h"

#include <stdlib.h>
#include <string.h>

/* One stored copy to remove when its operation ends or its metadata expires. */
struct sc_bus_stored {
	struct sc_list node; /* eng->stored, under eng->mu */
	bool listed;	     /* under eng->mu */
	struct sc_engine *eng;
	uint64_t seq;
	uint64_t watch_id; /* an operation watch, or */
	uint64_t timer_id; /* a timer at the metadata's expiry */
};

struct sc_bus_sub {
	uint64_t id;
	uint64_t nats_id;
	struct sc_engine *eng;
	sc_bus_event_fn fn;
	void *ctx;
	struct sc_list node; /* eng->subs */
};

static int need_bus(struct sc_engine *eng, struct sc_err *err)
{
	if (!eng->bus)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "NATS is off on this sidecar: start it with --nats-url "
				  "nats://HOST:4222");
	return 0;
}

/*
 * --nats-subject-prefix: a subject must be the prefix's own tokens followed by more tokens (or be
 * the prefix itself when it does not end with '.'). The prefix tokens are compared literally, so a
 * wildcard can only stand after them: "team-a.>" stays inside, "*", ">" and "team-*.x" do not.
 */
static int check_subject(struct sc_engine *eng, const char *subject, struct sc_err *err)
{
	const char *prefix = eng->cfg->nats_subject_prefix;
	if (!prefix || !prefix[0])
		return 0;
	size_t n = strlen(prefix);
	bool inside = subject && strncmp(subject, prefix, n) == 0;
	if (inside && prefix[n - 1] == '.')
		inside = subject[n] != '\0';
	else if (inside)
		inside = subject[n] == '\0' || (subject[n] == '.' && subject[n + 1] != '\0');
	if (!inside)
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "subject \"%.200s\" is outside --nats-subject-prefix \"%s\": this "
				  "sidecar's workers may only use subjects that start with it "
				  "(wildcards after it, e.g. %s%s>)",
				  subject ? subject : "", prefix, prefix,
				  prefix[n - 1] == '.' ? "" : ".");
	return 0;
}

static int verify_text(struct sc_engine *eng, const char *text, const char *self_id,
		       struct sc_metadata *md, struct sc_err *err)
{
	return sc_engine_verify_metadata(eng, text, self_id, SC_MD_SOURCE_BUS, md, err);
}

/* Take rec off eng->stored; true when the caller now owns it. Under eng->mu. */
static bool unlist(struct sc_bus_stored *rec)
{
	if (!rec->listed)
		return false;
	rec->listed = false;
	sc_list_remove(&rec->node);
	return true;
}

/* Operation watch (engine lock held): the operation ended, so its stored copy goes. */
static bool on_op_change(void *ctx, const struct sc_op_info *info)
{
	struct sc_bus_stored *rec = ctx;
	if (!sc_op_status_terminal(info->status))
		return true;
	sc_nats_store_forget(rec->eng->store, rec->seq);
	if (unlist(rec))
		free(rec);
	return false;
}

/* Timer thread: metadata published as text has expired. */
static void on_expired(void *ctx)
{
	struct sc_bus_stored *rec = ctx;
	struct sc_engine *eng = rec->eng;
	pthread_mutex_lock(&eng->mu);
	bool mine = unlist(rec);
	if (mine)
		sc_nats_store_forget(eng->store, rec->seq);
	pthread_mutex_unlock(&eng->mu);
	if (mine)
		free(rec);
}

/* Remember seq so it is removed when op_id ends, or (no op_id) at expires_unix_ms. */
static void track_stored(struct sc_engine *eng, const char *op_id, uint64_t expires_unix_ms,
			 uint64_t seq)
{
	struct sc_bus_stored *rec = calloc(1, sizeof(*rec));
	if (!rec) {
		SC_WARN("bus", "out of memory: stored metadata #%llu stays until the stream's max age",
			(unsigned long long)seq);
		return;
	}
	rec->eng = eng;
	rec->seq = seq;
	pthread_mutex_lock(&eng->mu);
	rec->listed = true;
	sc_list_insert_head(&eng->stored, &rec->node);
	pthread_mutex_unlock(&eng->mu);
	struct sc_err err;
	sc_err_clear(&err);
	if (op_id) {
		struct sc_op_info first;
		memset(&first, 0, sizeof(first));
		if (sc_op_watch(eng, op_id, on_op_change, rec, &rec->watch_id, &first, &err) == 0) {
			bool ended = sc_op_status_terminal(first.status);
			sc_op_info_free(&first);
			if (!ended)
				return;
		}
		/* Gone or ended meanwhile: remove the copy now. */
		pthread_mutex_lock(&eng->mu);
		bool mine = unlist(rec);
		pthread_mutex_unlock(&eng->mu);
		sc_nats_store_forget(eng->store, seq);
		if (mine)
			free(rec);
		return;
	}
	uint64_t now = sc_clock_unix_ms();
	uint64_t delay = expires_unix_ms > now ? expires_unix_ms - now : 0;
	pthread_mutex_lock(&eng->mu);
	rec->timer_id = sc_timers_add(eng->timers, sc_clock_mono_after_ms(delay), on_expired, rec);
	pthread_mutex_unlock(&eng->mu);
}

int sc_bus_start(struct sc_engine *eng, struct sc_err *err)
{
	const struct sc_config *c = eng->cfg;
	if (c->nats_handoff_core) {
		SC_INFO("bus",
			"metadata hand-off: core NATS (--nats-handoff core): metadata published "
			"before its reader subscribes is lost");
		return 0;
	}
	/* The stream's max age: the longest any metadata is valid, so a copy whose sidecar died
	 * before removing it never outlives its metadata. */
	struct sc_nats_store_opts so = {.stream = c->nats_stream,
					.replicas = (int)c->nats_stream_replicas,
					.max_age_ms = (int64_t)SC_OP_TIMEOUT_MAX_MS};
	if (sc_nats_store_create(eng->bus, &so, &eng->store, err) != 0) {
		sc_metrics_jetstream_error(eng->metrics, SC_JS_OP_SETUP);
		sc_err_prefix(err, "--nats-handoff jetstream");
		return -1;
	}
	SC_INFO("bus", "metadata hand-off: JetStream stream %s (--nats-handoff jetstream)",
		sc_nats_store_stream(eng->store));
	return 0;
}

int sc_bus_publish(struct sc_engine *eng, const char *subject, const char *op_id,
		   const char *metadata, struct sc_err *err)
{
	if (need_bus(eng, err) != 0 || check_subject(eng, subject, err) != 0)
		return -1;
	char *text = NULL;
	uint64_t expires = 0;
	if (op_id && op_id[0]) {
		struct sc_op_info info;
		if (sc_op_get(eng, op_id, &info, err) != 0)
			return -1;
		if (!info.metadata || sc_op_status_terminal(info.status)) {
			enum sc_op_status st = info.status;
			sc_op_info_free(&info);
			return sc_err_set(err, SC_FAILED_PRECONDITION,
					  "operation %s is %s: only a live readable or writable "
					  "operation has metadata to publish",
					  op_id, sc_op_status_name(st));
		}
		text = info.metadata;
		info.metadata = NULL;
		sc_op_info_free(&info);
	} else if (metadata && metadata[0]) {
		/* Verify before spreading it (the audience is the consumer's business). */
		struct sc_metadata md;
		if (verify_text(eng, metadata, NULL, &md, err) != 0)
			return -1;
		expires = md.expires_unix_ms;
		sc_metadata_free(&md);
		text = strdup(metadata);
		if (!text)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	} else {
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "give operation_id or metadata to publish");
	}
	int rc;
	if (eng->store) {
		uint64_t seq = 0;
		rc = sc_nats_store_put(eng->store, subject, text, strlen(text), &seq, err);
		if (rc == 0)
			track_stored(eng, op_id && op_id[0] ? op_id : NULL, expires, seq);
		else
			sc_metrics_jetstream_error(eng->metrics, SC_JS_OP_STORE);
	} else {
		rc = sc_nats_bus_publish(eng->bus, subject, text, strlen(text), err);
	}
	free(text);
	return rc;
}

static void on_message(void *ctx, const char *subject, const void *data, size_t len)
{
	struct sc_bus_sub *s = ctx;
	struct sc_engine *eng = s->eng;
	if (len == 0 || len > SC_METADATA_MAX_TEXT) {
		SC_WARN_LIMITED("bus", "bus-not-metadata",
				"dropped a %zu-byte message on %s: not metadata", len, subject);
		return;
	}
	char *text = malloc(len + 1);
	if (!text)
		return;
	memcpy(text, data, len);
	text[len] = '\0';
	struct sc_metadata md;
	struct sc_err err;
	sc_err_clear(&err);
	if (verify_text(eng, text, eng->id, &md, &err) != 0) {
		/* Anyone who may publish on the subject can send these: rate-limited. The key id
		 * it claims (unverified) says which signer, or which stale key, to look at. */
		char key_id[SC_KEY_ID_MAX] = "";
		sc_metadata_peek_key_id(text, key_id);
		struct sc_log_fields lf = {.code = sc_status_name(err.code),
					   .key_id = key_id[0] ? key_id : NULL};
		sc_log_kv_limited(SC_LOG_WARN, "bus", "bus-bad-metadata", &lf,
				  "dropped metadata on %s: %s (%s)", subject, err.msg,
				  sc_status_name(err.code));
		struct sc_bus_event bad = {.subject = subject, .refused = err.msg,
					   .refused_code = err.code};
		s->fn(s->ctx, &bad);
		free(text);
		return;
	}
	uint64_t *lengths = calloc(md.n_descs ? md.n_descs : 1, sizeof(*lengths));
	if (lengths) {
		for (size_t i = 0; i < md.n_descs; i++)
			lengths[i] = md.descs[i].length;
		struct sc_bus_event ev = {
			.subject = subject,
			.metadata = text,
			.issuer = md.issuer,
			.kind = md.kind,
			.descriptor_lengths = lengths,
			.n_descriptors = md.n_descs,
			.expires_unix_ms = md.expires_unix_ms,
		};
		s->fn(s->ctx, &ev);
		free(lengths);
	}
	if (strcmp(md.issuer, eng->id) != 0)
		sc_warmer_offer(eng->warmer, text, md.issuer);
	sc_metadata_free(&md);
	free(text);
}

static void on_stored(void *ctx, const char *subject, const void *data, size_t len, uint64_t seq)
{
	(void)seq;
	on_message(ctx, subject, data, len);
}

int sc_bus_subscribe(struct sc_engine *eng, const char *subject, const char *queue_group,
		     sc_bus_event_fn fn, void *ctx, uint64_t *sub_id, struct sc_err *err)
{
	if (need_bus(eng, err) != 0 || check_subject(eng, subject, err) != 0)
		return -1;
	struct sc_bus_sub *s = calloc(1, sizeof(*s));
	if (!s)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	s->eng = eng;
	s->fn = fn;
	s->ctx = ctx;
	int rc;
	if (!eng->store)
		rc = sc_nats_bus_subscribe(eng->bus, subject, queue_group, on_message, s,
					   &s->nats_id, err);
	else if (queue_group && queue_group[0])
		rc = sc_nats_store_queue_subscribe(eng->store, subject, queue_group, on_stored, s,
						   &s->nats_id, err);
	else
		rc = sc_nats_store_watch(eng->store, subject, on_stored, s, &s->nats_id, err);
	if (rc != 0) {
		if (eng->store)
			sc_metrics_jetstream_error(eng->metrics, SC_JS_OP_READ);
		free(s);
		return -1;
	}
	pthread_mutex_lock(&eng->mu);
	s->id = ++eng->next_sub_id;
	sc_list_insert_head(&eng->subs, &s->node);
	*sub_id = s->id;
	pthread_mutex_unlock(&eng->mu);
	return 0;
}

void sc_bus_unsubscribe(struct sc_engine *eng, uint64_t sub_id)
{
	pthread_mutex_lock(&eng->mu);
	struct sc_bus_sub *s = NULL;
	struct sc_list *pos;
	sc_list_foreach(pos, &eng->subs) {
		struct sc_bus_sub *it = sc_list_entry(pos, struct sc_bus_sub, node);
		if (it->id == sub_id) {
			s = it;
			sc_list_remove(&s->node);
			break;
		}
	}
	pthread_mutex_unlock(&eng->mu);
	if (!s)
		return;
	sc_nats_bus_unsubscribe(eng->bus, s->nats_id); /* synchronous */
	free(s);
}

struct unsub_job {
	struct sc_engine *eng;
	uint64_t sub_id;
	void (*then)(void *ctx);
	void *ctx;
};

static void unsub_job_run(void *p)
{
	struct unsub_job *j = p;
	sc_bus_unsubscribe(j->eng, j->sub_id);
	if (j->then)
		j->then(j->ctx);
	free(j);
}

void sc_bus_unsubscribe_later(struct sc_engine *eng, uint64_t sub_id, void (*then)(void *ctx),
			      void *ctx)
{
	struct unsub_job *j = malloc(sizeof(*j));
	if (!j) {
		sc_bus_unsubscribe(eng, sub_id);
		if (then)
			then(ctx);
		return;
	}
	*j = (struct unsub_job){eng, sub_id, then, ctx};
	/* Core NATS unsubscribes locally (no request): the store (JetStream) defers it to its
	 * deleter thread, or runs it here once it is being destroyed. Under eng->mu, so that
	 * sc_bus_stop cannot free the store meanwhile. */
	pthread_mutex_lock(&eng->mu);
	bool queued = !eng->store_closing && sc_nats_store_defer(eng->store, unsub_job_run, j);
	pthread_mutex_unlock(&eng->mu);
	if (!queued)
		unsub_job_run(j);
}

void sc_bus_stop(struct sc_engine *eng)
{
	/* Stored copies of operations still live (none after the drain, usually): removed now. */
	for (;;) {
		pthread_mutex_lock(&eng->mu);
		struct sc_list *first = sc_list_first(&eng->stored);
		struct sc_bus_stored *rec =
		    first ? sc_list_entry(first, struct sc_bus_stored, node) : NULL;
		if (rec)
			unlist(rec);
		pthread_mutex_unlock(&eng->mu);
		if (!rec)
			break;
		if (rec->watch_id)
			sc_op_unwatch(eng, rec->watch_id);
		if (rec->timer_id)
			sc_timers_cancel(eng->timers, rec->timer_id);
		sc_nats_store_forget(eng->store, rec->seq);
		free(rec);
	}
	for (;;) {
		pthread_mutex_lock(&eng->mu);
		struct sc_list *first = sc_list_first(&eng->subs);
		uint64_t id = first ? sc_list_entry(first, struct sc_bus_sub, node)->id : 0;
		pthread_mutex_unlock(&eng->mu);
		if (!first)
			break;
		sc_bus_unsubscribe(eng, id);
	}
	pthread_mutex_lock(&eng->mu);
	eng->store_closing = true; /* sc_bus_unsubscribe_later defers nothing more to it */
	pthread_mutex_unlock(&eng->mu);
	sc_nats_store_destroy(eng->store); /* runs the removals queued above (bounded), and what
					    * was deferred to it */
	eng->store = NULL;
}

const char *sc_bus_store_name(struct sc_engine *eng)
{
	return eng->store ? sc_nats_store_stream(eng->store) : NULL;
}
