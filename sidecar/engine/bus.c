/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/bus.c: metadata exchange over NATS for the PublishMetadata / SubscribeMetadata RPCs.
 * Publishing checks the text first (a local passive operation's own metadata, or verified text);
 * receiving verifies every message (signature, expiry, audience = this sidecar) and delivers only
 * what passes, logging the rest. With --nats-subject-prefix, workers may only publish and subscribe
 * beneath that prefix. RPC threads publish and subscribe; NATS delivery threads run
 * on_message. Owns the subscriber list (under eng->mu).
 */
#include "engine/internal.h"
#include "base/log.h"
#include "engine/metrics.h"
#include "nats/client.h"

#include <stdlib.h>
#include <string.h>

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

int sc_bus_publish(struct sc_engine *eng, const char *subject, const char *op_id,
		   const char *metadata, struct sc_err *err)
{
	if (need_bus(eng, err) != 0 || check_subject(eng, subject, err) != 0)
		return -1;
	char *text = NULL;
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
		sc_metadata_free(&md);
		text = strdup(metadata);
		if (!text)
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	} else {
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "give operation_id or metadata to publish");
	}
	int rc = sc_nats_bus_publish(eng->bus, subject, text, strlen(text), err);
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
		/* Anyone who may publish on the subject can send these: rate-limited. */
		SC_WARN_LIMITED("bus", "bus-bad-metadata", "dropped metadata on %s: %s (%s)", subject,
				err.msg, sc_status_name(err.code));
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
	if (sc_nats_bus_subscribe(eng->bus, subject, queue_group, on_message, s, &s->nats_id,
				  err) != 0) {
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

void sc_bus_stop(struct sc_engine *eng)
{
	for (;;) {
		pthread_mutex_lock(&eng->mu);
		struct sc_list *first = sc_list_first(&eng->subs);
		uint64_t id = first ? sc_list_entry(first, struct sc_bus_sub, node)->id : 0;
		pthread_mutex_unlock(&eng->mu);
		if (!first)
			break;
		sc_bus_unsubscribe(eng, id);
	}
}
