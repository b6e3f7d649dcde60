/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nats/client.c: the NATS bus. Wraps one nats.c connection (retry on failed connect, reconnect
 * forever with jitter, bounded reconnect buffer) and its async subscriptions; validates subjects
 * and sizes before nats.c sees them; turns nats.c statuses into sc_err; logs connection events
 * once each under area "nats".
 *
 * Threads: the public calls run on the caller's thread. on_msg/on_complete run on each
 * subscription's nats.c delivery thread; on_connected/on_disconnected/on_reconnected/on_closed/
 * on_error run on nats.c's single process-wide connection-callback thread, which serialises them.
 *
 */
#include "nats/client.h"
#include "nats/internal.h"
#include "nats/nkey.h"

#include <openssl/crypto.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <nats/nats.h>

#include "base/list.h"
#include "base/log.h"
#include "base/timer.h"

/*
 * Owns: the natsConnection, one struct nats_sub per subscription and a copy of the url and name.
 * A nats_sub is reference counted: one reference for the bus's list (dropped by unsubscribe) and
 * one for nats.c (dropped by on_complete, which nats.c calls after the last handler call).
 * The handler gate (closed + in_cb under nats_sub.mu) is what makes unsubscribe synchronous;
 * the references only keep the closure alive. Destroy waits for nats.c's closed callback and for
 * every on_complete, so no nats.c thread touches the bus after it is freed.
 * Lock order: bus.state_mu > nc's lock (via nats.c getters); bus.mu and nats_sub.mu are leaves.
 */

#define AREA "nats"

enum {
	DEFAULT_RECONNECT_WAIT_MS = 1000,
	DEFAULT_RECONNECT_JITTER_MS = 1000,
	DEFAULT_RECONNECT_BUF = 8 * 1024 * 1024,
	DEFAULT_FLUSH_TIMEOUT_MS = 1000,
	PING_INTERVAL_MS = 10 * 1000, /* with 2 pings out: a dead peer is noticed in 20-30 s */
	MAX_PINGS_OUT = 2,
	WRITE_DEADLINE_MS = 10 * 1000,	   /* a write stuck this long drops the connection */
	ASSUMED_MAX_PAYLOAD = 1024 * 1024, /* the NATS default, until the server tells us */
	PUB_OVERHEAD = 64,		   /* "PUB <subject> <len>\r\n...\r\n" beside the subject */
	MAX_SERVERS = 64,
	NAME_MAX_LEN = 256,
	DESTROY_WAIT_MS = 10 * 1000,
	ERROR_LOG_INTERVAL_MS = 10 * 1000,
	LIB_CLOSE_WAIT_MS = 5000,
};

enum bus_state { ST_CONNECTING, ST_CONNECTED, ST_RECONNECTING, ST_CLOSED };
static const char *const state_names[] = {"connecting", "connected", "reconnecting", "closed"};

struct nats_sub {
	struct sc_nats_bus *bus;
	struct sc_list node;   /* bus->subs, under bus->mu; self-linked when on none */
	uint64_t id;	       /* set under bus->mu */
	natsSubscription *nsub;
	sc_nats_msg_fn fn;
	sc_nats_raw_fn raw; /* instead of fn: nats/store.c's JetStream handlers */
	void *ctx;
	void (*free_ctx)(void *ctx); /* with raw: frees ctx with the subscription */
	char *subject;
	atomic_int refs;
	pthread_mutex_t mu; /* guards closed and in_cb */
	pthread_cond_t cond;
	bool closed;
	int in_cb;
};

struct sc_nats_bus {
	natsConnection *nc; /* set once in create */
	char *url;
	char *name;
	sc_nats_state_fn on_state;
	void *on_state_ctx;
	int reconnect_buf;
	int flush_timeout_ms;
	atomic_int state;
	atomic_bool closing;

	pthread_mutex_t state_mu; /* serialises transitions and observer calls; guards last_url */
	char last_url[256];

	pthread_mutex_t mu; /* guards the fields below */
	pthread_cond_t cond;
	struct sc_list subs; /* struct nats_sub, newest first */
	uint64_t next_id;
	int nats_live;	  /* subscriptions whose on_complete has not run */
	bool closed_seen; /* nats.c's closed callback has run */

	/* Connection-callback thread only. */
	int64_t disconnected_at_ns;
	int64_t err_last_log_ns;
	unsigned err_suppressed;
};

/* Depth of our NATS callbacks on this thread, and the subscription whose handler runs here. */
static _Thread_local int tl_cb_depth;
static _Thread_local struct nats_sub *tl_sub;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static natsStatus g_open_status = NATS_NOT_INITIALIZED;
static atomic_bool g_opened;
static atomic_bool g_shutdown;

/* ---- helpers --------------------------------------------------------------------------------- */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* nats.c keeps a per-thread text for the last failure; "" when there is none. */
static const char *nats_detail(void)
{
	const char *t = nats_GetLastError(NULL);
	return t ? t : "";
}

/* A printable excerpt of s for messages: at most 64 bytes, control bytes as '?'. */
static const char *shown(const char *s, char buf[80])
{
	size_t i = 0;
	if (!s)
		s = "(null)";
	for (; s[i] && i < 64; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (s[i]) {
		memcpy(buf + i, "...", 4);
	} else {
		buf[i] = '\0';
	}
	return buf;
}

static bool bad_byte(unsigned char c)
{
	return c <= 0x20 || c == 0x7f;
}

static int check_subject(const char *subject, bool wildcards, const char *what, struct sc_err *err)
{
	char b[80];
	if (!subject || !*subject)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s subject is empty", what);
	size_t n = strlen(subject);
	if (n > SC_NATS_SUBJECT_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s subject \"%s\" is %zu bytes long; the limit is %d", what,
				  shown(subject, b), n, SC_NATS_SUBJECT_MAX);
	size_t tok = 0;
	for (size_t i = 0; i <= n; i++) {
		unsigned char c = (unsigned char)subject[i];
		if (i == n || c == '.') {
			if (i == tok)
				return sc_err_set(err, SC_INVALID_ARGUMENT,
						  "%s subject \"%s\" has an empty token (leading, "
						  "trailing or double '.')",
						  what, shown(subject, b));
			tok = i + 1;
			continue;
		}
		if (bad_byte(c))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "%s subject \"%s\" contains whitespace or a control byte at "
			    "offset %zu",
			    what, shown(subject, b), i);
		if (c != '*' && c != '>')
			continue;
		if (!wildcards)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s subject \"%s\": wildcards ('*', '>') are not allowed "
					  "when publishing",
					  what, shown(subject, b));
		bool whole = i == tok && (i + 1 == n || subject[i + 1] == '.');
		if (!whole)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s subject \"%s\": '%c' must be a whole token", what,
					  shown(subject, b), c);
		if (c == '>' && i + 1 != n)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s subject \"%s\": '>' must be the last token", what,
					  shown(subject, b));
	}
	return 0;
}

static int check_queue_group(const char *q, struct sc_err *err)
{
	char b[80];
	size_t n = strlen(q);
	if (n > SC_NATS_SUBJECT_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "queue group \"%s\" is %zu bytes long; the limit is %d",
				  shown(q, b), n, SC_NATS_SUBJECT_MAX);
	for (size_t i = 0; i < n; i++)
		if (bad_byte((unsigned char)q[i]))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "queue group \"%s\" contains whitespace or a control byte "
			    "at offset %zu",
			    shown(q, b), i);
	return 0;
}

/* One "nats://host[:port]" entry, already trimmed. */
static int check_server_url(const char *u, int index, struct sc_err *err)
{
	static const char scheme[] = "nats://";
	const char *what = "expected nats://host:port[,nats://host:port...]";
	char b[80];
	if (strncasecmp(u, scheme, sizeof(scheme) - 1) != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "NATS url entry %d \"%s\" does not start with nats:// (%s)",
				  index, shown(u, b), what);
	const char *h = u + sizeof(scheme) - 1;
	if (strchr(h, '@'))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "NATS url entry %d has credentials in it; they are not supported "
				  "in the url (they would be logged)",
				  index);
	for (const char *p = h; *p; p++)
		if (bad_byte((unsigned char)*p) || *p == '/' || *p == '?' || *p == '#')
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "NATS url entry %d \"%s\" has a path, space or control byte "
			    "(%s)",
			    index, shown(u, b), what);
	const char *host_end;
	const char *port = NULL;
	if (*h == '[') {
		host_end = strchr(h, ']');
		if (!host_end || host_end == h + 1)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS url entry %d \"%s\" has a malformed [IPv6] host",
					  index, shown(u, b));
		if (host_end[1] == ':')
			port = host_end + 2;
		else if (host_end[1] != '\0')
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS url entry %d \"%s\": unexpected text after ']'",
					  index, shown(u, b));
	} else {
		const char *colon = strchr(h, ':');
		if (colon && strchr(colon + 1, ':'))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "NATS url entry %d \"%s\": put an IPv6 address in brackets", index,
			    shown(u, b));
		host_end = colon ? colon : h + strlen(h);
		if (host_end == h)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS url entry %d \"%s\" has no host (%s)", index,
					  shown(u, b), what);
		if (colon)
			port = colon + 1;
	}
	if (port) {
		char *end = NULL;
		errno = 0;
		long v = strtol(port, &end, 10);
		if (!*port || *end || errno || v < 1 || v > 65535 || *port == '+' || *port == '-')
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS url entry %d \"%s\" has a bad port (1-65535)",
					  index, shown(u, b));
	}
	return 0;
}

static void free_list(char **list, int n)
{
	for (int i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

/* Split, trim and check "nats://a:1, nats://b:2" into *out (count *n). */
static int parse_urls(const char *url, char ***out, int *n, struct sc_err *err)
{
	if (!url || !*url)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "NATS url is empty; expected nats://host:port[,nats://host:port...]");
	char **list = calloc(MAX_SERVERS, sizeof(*list));
	if (!list)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory parsing the NATS url");
	int count = 0;
	const char *p = url;
	for (;;) {
		const char *comma = strchr(p, ',');
		const char *end = comma ? comma : p + strlen(p);
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (end == p) {
			free_list(list, count);
			return sc_err_set(err, SC_INVALID_ARGUMENT, "NATS url entry %d is empty",
					  count + 1);
		}
		if (count == MAX_SERVERS) {
			free_list(list, count);
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS url lists more than %d servers", MAX_SERVERS);
		}
		list[count] = strndup(p, (size_t)(end - p));
		if (!list[count]) {
			free_list(list, count);
			return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
					  "out of memory parsing the NATS url");
		}
		count++;
		if (check_server_url(list[count - 1], count, err) != 0) {
			free_list(list, count);
			return -1;
		}
		if (!comma)
			break;
		p = comma + 1;
	}
	*out = list;
	*n = count;
	return 0;
}

static void lib_open(void)
{
	g_open_status = nats_Open(-1);
	if (g_open_status == NATS_OK)
		atomic_store(&g_opened, true);
}

/* ---- subscriptions ------------------------------------------------------------------------------
 */

static void sub_unref(struct nats_sub *s)
{
	if (atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->mu);
	if (s->free_ctx)
		s->free_ctx(s->ctx);
	free(s->subject);
	free(s);
}

/* nats.c delivery thread: one message. The gate makes unsubscribe synchronous. */
static void on_msg(natsConnection *nc, natsSubscription *nsub, natsMsg *msg, void *closure)
{
	struct nats_sub *s = closure;
	(void)nc;
	(void)nsub;
	if (!msg)
		return;
	pthread_mutex_lock(&s->mu);
	bool run = !s->closed;
	if (run)
		s->in_cb++;
	pthread_mutex_unlock(&s->mu);
	if (run) {
		struct nats_sub *prev = tl_sub;
		tl_sub = s;
		tl_cb_depth++;
		if (s->raw)
			s->raw(s->ctx, msg);
		else
			s->fn(s->ctx, natsMsg_GetSubject(msg), natsMsg_GetData(msg),
			      (size_t)natsMsg_GetDataLength(msg));
		tl_cb_depth--;
		tl_sub = prev;
	}
	natsMsg_Destroy(msg);
	if (run) {
		pthread_mutex_lock(&s->mu);
		s->in_cb--;
		if (s->closed)
			pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->mu);
	}
}

/* nats.c delivery thread, once, after the last on_msg of a closed subscription. */
static void on_complete(void *closure)
{
	struct nats_sub *s = closure;
	struct sc_nats_bus *bus = s->bus;
	sub_unref(s);
	pthread_mutex_lock(&bus->mu);
	bus->nats_live--;
	pthread_cond_broadcast(&bus->cond);
	pthread_mutex_unlock(&bus->mu);
	/* bus may be freed from here on */
}

/* Close the gate, wait for a running handler (not our own), then drop the nats.c subscription. */
static void sub_close(struct sc_nats_bus *bus, struct nats_sub *s)
{
	bool self = tl_sub == s;
	pthread_mutex_lock(&s->mu);
	bool first = !s->closed;
	s->closed = true;
	while (s->in_cb > (self ? 1 : 0))
		pthread_cond_wait(&s->cond, &s->mu);
	pthread_mutex_unlock(&s->mu);
	if (!first)
		return;

	natsStatus st = natsSubscription_Unsubscribe(s->nsub);
	if (st != NATS_OK && st != NATS_CONNECTION_CLOSED && st != NATS_INVALID_SUBSCRIPTION)
		SC_WARN(AREA, "\"%s\": unsubscribe from %s: %s %s", bus->name, s->subject,
			natsStatus_GetText(st), nats_detail());
	natsSubscription_Destroy(s->nsub);

	pthread_mutex_lock(&bus->mu);
	sc_list_remove(&s->node); /* harmless when already off the list */
	pthread_mutex_unlock(&bus->mu);
	sub_unref(s); /* the list's reference */
}

/* ---- connection events (nats.c's connection-callback thread) ------------------------------------
 */

/*
 * Move to state st and tell the observer. only_from_connecting: the caller is create, which must
 * not overwrite a state a callback has already set. Fills url (may be NULL) with the connected
 * server's url, or the last one known. Returns false when nothing changed.
 */
static bool transition(struct sc_nats_bus *bus, natsConnection *nc, enum bus_state st,
		       bool only_from_connecting, char *url, size_t url_len)
{
	bool changed = false;
	pthread_mutex_lock(&bus->state_mu);
	int cur = atomic_load(&bus->state);
	if (cur != ST_CLOSED && cur != (int)st && (!only_from_connecting || cur == ST_CONNECTING)) {
		if (st == ST_CONNECTED && natsConnection_GetConnectedUrl(
					      nc, bus->last_url, sizeof(bus->last_url)) != NATS_OK)
			snprintf(bus->last_url, sizeof(bus->last_url), "%s", bus->url);
		atomic_store(&bus->state, (int)st);
		changed = true;
		if (bus->on_state) {
			tl_cb_depth++;
			bus->on_state(bus->on_state_ctx, state_names[st]);
			tl_cb_depth--;
		}
	}
	if (url)
		snprintf(url, url_len, "%s", bus->last_url[0] ? bus->last_url : bus->url);
	pthread_mutex_unlock(&bus->state_mu);
	return changed;
}

static void on_connected(natsConnection *nc, void *closure)
{
	struct sc_nats_bus *bus = closure;
	char url[256];
	tl_cb_depth++;
	if (transition(bus, nc, ST_CONNECTED, false, url, sizeof(url)))
		SC_INFO(AREA, "\"%s\" connected to %s", bus->name, url);
	tl_cb_depth--;
}

static void on_disconnected(natsConnection *nc, void *closure)
{
	struct sc_nats_bus *bus = closure;
	char url[256];
	if (atomic_load(&bus->closing))
		return;
	tl_cb_depth++;
	bus->disconnected_at_ns = now_ns();
	if (transition(bus, nc, ST_RECONNECTING, false, url, sizeof(url)))
		SC_WARN(AREA,
			"\"%s\" disconnected from %s; reconnecting in the background "
			"(publishes are buffered up to %d bytes meanwhile)",
			bus->name, url, bus->reconnect_buf);
	tl_cb_depth--;
}

static void on_reconnected(natsConnection *nc, void *closure)
{
	struct sc_nats_bus *bus = closure;
	char url[256];
	tl_cb_depth++;
	if (transition(bus, nc, ST_CONNECTED, false, url, sizeof(url))) {
		double down = bus->disconnected_at_ns
				  ? (double)(now_ns() - bus->disconnected_at_ns) / 1e9
				  : 0.0;
		SC_INFO(AREA, "\"%s\" reconnected to %s after %.1f s; subscriptions restored",
			bus->name, url, down);
	}
	tl_cb_depth--;
}

static void on_closed(natsConnection *nc, void *closure)
{
	struct sc_nats_bus *bus = closure;
	tl_cb_depth++;
	bool asked = atomic_load(&bus->closing);
	bool never_connected = atomic_load(&bus->state) == ST_CONNECTING;
	if (transition(bus, nc, ST_CLOSED, false, NULL, 0)) {
		if (asked)
			SC_DEBUG(AREA, "\"%s\" closed", bus->name);
		else {
			/* The connection's own last error says why (TLS, authentication); the
			 * thread-local one is empty on this callback thread. */
			const char *why = NULL;
			natsStatus st = nc ? natsConnection_GetLastError(nc, &why) : NATS_OK;
			bool security = never_connected || st == NATS_SSL_ERROR ||
					st == NATS_CONNECTION_AUTH_FAILED ||
					st == NATS_NOT_PERMITTED ||
					st == NATS_SECURE_CONNECTION_REQUIRED ||
					st == NATS_SECURE_CONNECTION_WANTED;
			SC_ERROR(AREA,
				 "\"%s\": nats.c closed the connection to %s (%s%s%s); this bus is "
				 "unusable%s",
				 bus->name, bus->url, st != NATS_OK ? natsStatus_GetText(st) : "",
				 why && why[0] ? ": " : "", why && why[0] ? why : nats_detail(),
				 security ? ": it never connected; a server that requires TLS or "
					    "authentication closes such clients: check --nats-tls-ca, "
					    "--nats-tls-cert/--nats-tls-key, --nats-creds and "
					    "--nats-nkey-seed against the server's TLS and "
					    "authorization settings"
					  : "");
		}
	}
	pthread_mutex_lock(&bus->mu);
	bus->closed_seen = true;
	pthread_cond_broadcast(&bus->cond);
	pthread_mutex_unlock(&bus->mu);
	tl_cb_depth--;
	/* bus may be freed from here on */
}

/* Asynchronous errors (slow consumer, permissions). At most one line per interval. */
static void on_error(natsConnection *nc, natsSubscription *nsub, natsStatus st, void *closure)
{
	struct sc_nats_bus *bus = closure;
	(void)nc;
	int64_t now = now_ns();
	if (bus->err_last_log_ns &&
	    now - bus->err_last_log_ns < (int64_t)ERROR_LOG_INTERVAL_MS * 1000000) {
		bus->err_suppressed++;
		return;
	}
	/* nats.c does not hold a reference on nsub here: compare the pointer, never dereference. */
	char subject[80] = "";
	if (nsub) {
		pthread_mutex_lock(&bus->mu);
		struct sc_list *pos;
		sc_list_foreach(pos, &bus->subs) {
			struct nats_sub *s = sc_list_entry(pos, struct nats_sub, node);
			if (s->nsub == nsub) {
				shown(s->subject, subject);
				break;
			}
		}
		pthread_mutex_unlock(&bus->mu);
	}
	if (st == NATS_SLOW_CONSUMER)
		SC_WARN(AREA,
			"\"%s\": subscription %s is a slow consumer: messages were dropped "
			"because its handler does not keep up (%u earlier errors not logged)",
			bus->name, subject[0] ? subject : "(unknown)", bus->err_suppressed);
	else
		SC_WARN(AREA,
			"\"%s\": asynchronous error%s%s: %s %s (%u earlier errors not logged)",
			bus->name, subject[0] ? " on " : "", subject, natsStatus_GetText(st),
			nats_detail(), bus->err_suppressed);
	bus->err_last_log_ns = now;
	bus->err_suppressed = 0;
}

/* ---- public API ------------------------------------------------------------------------------ */

int sc_nats_bus_create(const char *url, const char *name, struct sc_nats_bus **out,
		       struct sc_err *err)
{
	return sc_nats_bus_create_ex(url, name, NULL, out, err);
}

static void bus_free(struct sc_nats_bus *bus)
{
	pthread_cond_destroy(&bus->cond);
	pthread_mutex_destroy(&bus->mu);
	pthread_mutex_destroy(&bus->state_mu);
	free(bus->url);
	free(bus->name);
	free(bus);
}

static int opts_error(natsStatus st, const char *what, struct sc_err *err)
{
	if (st == NATS_NO_MEMORY)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "NATS options (%s): out of memory",
				  what);
	return sc_err_set(err, SC_INVALID_ARGUMENT, "NATS options (%s): %s %s", what,
			  natsStatus_GetText(st), nats_detail());
}

static bool set_(const char *s)
{
	return s && s[0];
}

/* TLS, credentials file and NKey options from opts. */
static int set_security(natsOptions *no, const struct sc_nats_bus_opts *opts, struct sc_err *err)
{
	natsStatus st = NATS_OK;
	if (set_(opts->tls_cert) != set_(opts->tls_key))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--nats-tls-cert and --nats-tls-key go together: %s is missing",
				  set_(opts->tls_cert) ? "--nats-tls-key" : "--nats-tls-cert");
	if (set_(opts->creds_file) && set_(opts->nkey_seed_file))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--nats-creds and --nats-nkey-seed are exclusive: a .creds file "
				  "already holds the user's NKey seed");
	if (set_(opts->tls_ca) || set_(opts->tls_cert)) {
		if ((st = natsOptions_SetSecure(no, true)) != NATS_OK)
			return opts_error(st, "TLS", err);
	}
	if (set_(opts->tls_ca) &&
	    (st = natsOptions_LoadCATrustedCertificates(no, opts->tls_ca)) != NATS_OK)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "--nats-tls-ca %s: %s %s",
				  opts->tls_ca, natsStatus_GetText(st), nats_detail());
	if (set_(opts->tls_cert) &&
	    (st = natsOptions_LoadCertificatesChain(no, opts->tls_cert, opts->tls_key)) != NATS_OK)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "--nats-tls-cert %s / --nats-tls-key %s: %s %s", opts->tls_cert,
				  opts->tls_key, natsStatus_GetText(st), nats_detail());
	if (set_(opts->creds_file) &&
	    (st = natsOptions_SetUserCredentialsFromFiles(no, opts->creds_file, NULL)) != NATS_OK)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "--nats-creds %s: %s %s",
				  opts->creds_file, natsStatus_GetText(st), nats_detail());
	if (set_(opts->nkey_seed_file)) {
		char pub[SC_NKEY_PUBLIC_LEN];
		if (sc_nkey_public_from_seed_file(opts->nkey_seed_file, pub, err) != 0)
			return -1;
		if ((st = natsOptions_SetNKeyFromSeed(no, pub, opts->nkey_seed_file)) != NATS_OK)
			return sc_err_set(err, SC_FAILED_PRECONDITION, "--nats-nkey-seed %s: %s %s",
					  opts->nkey_seed_file, natsStatus_GetText(st),
					  nats_detail());
		SC_INFO(AREA, "NATS authentication with NKey %s", pub);
	}
	return 0;
}

int sc_nats_bus_create_ex(const char *url, const char *name, const struct sc_nats_bus_opts *opts,
			  struct sc_nats_bus **out, struct sc_err *err)
{
	static const struct sc_nats_bus_opts no_opts;
	if (!opts)
		opts = &no_opts;
	if (!out)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "sc_nats_bus_create: out is NULL");
	if (opts->reconnect_wait_ms < 0 || opts->reconnect_jitter_ms < 0 ||
	    opts->reconnect_buf_bytes < 0 || opts->flush_timeout_ms < 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "NATS bus options must not be negative (0 means the default)");
	if (name) {
		size_t n = strlen(name);
		if (n > NAME_MAX_LEN)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "NATS connection name is %zu bytes; the limit is %d", n,
					  NAME_MAX_LEN);
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
				return sc_err_set(err, SC_INVALID_ARGUMENT,
						  "NATS connection name has a control byte at "
						  "offset %zu",
						  i);
	}
	char **servers = NULL;
	int nservers = 0;
	if (parse_urls(url, &servers, &nservers, err) != 0)
		return -1;

	if (atomic_load(&g_shutdown)) {
		free_list(servers, nservers);
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "the NATS library has been shut down in this process");
	}
	pthread_once(&g_once, lib_open);
	if (g_open_status != NATS_OK) {
		free_list(servers, nservers);
		return sc_err_set(err, SC_INTERNAL, "nats_Open failed: %s",
				  natsStatus_GetText(g_open_status));
	}

	struct sc_nats_bus *bus = calloc(1, sizeof(*bus));
	natsOptions *no = NULL;
	natsStatus st;
	if (!bus) {
		free_list(servers, nservers);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED,
				  "out of memory creating the NATS bus");
	}
	sc_cond_init_mono(&bus->cond);
	sc_list_init(&bus->subs);
	pthread_mutex_init(&bus->mu, NULL);
	pthread_mutex_init(&bus->state_mu, NULL);
	atomic_init(&bus->state, ST_CONNECTING);
	atomic_init(&bus->closing, false);
	bus->on_state = opts->on_state;
	bus->on_state_ctx = opts->on_state_ctx;
	bus->reconnect_buf =
	    opts->reconnect_buf_bytes ? opts->reconnect_buf_bytes : DEFAULT_RECONNECT_BUF;
	bus->flush_timeout_ms =
	    opts->flush_timeout_ms ? opts->flush_timeout_ms : DEFAULT_FLUSH_TIMEOUT_MS;
	int wait_ms = opts->reconnect_wait_ms ? opts->reconnect_wait_ms : DEFAULT_RECONNECT_WAIT_MS;
	int jitter_ms =
	    opts->reconnect_jitter_ms ? opts->reconnect_jitter_ms : DEFAULT_RECONNECT_JITTER_MS;
	bus->url = strdup(url);
	bus->name = strdup(name ? name : "");
	if (!bus->url || !bus->name) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory creating the NATS bus");
		goto fail;
	}

	st = natsOptions_Create(&no);
	if (st != NATS_OK) {
		opts_error(st, "create", err);
		goto fail;
	}
#define SET_OPT(call, what)                                                                        \
	do {                                                                                       \
		st = (call);                                                                       \
		if (st != NATS_OK) {                                                               \
			opts_error(st, what, err);                                                 \
			goto fail;                                                                 \
		}                                                                                  \
	} while (0)
	SET_OPT(natsOptions_SetServers(no, (const char **)servers, nservers), "servers");
	if (name && *name)
		SET_OPT(natsOptions_SetName(no, name), "name");
	SET_OPT(natsOptions_SetAllowReconnect(no, true), "allow reconnect");
	SET_OPT(natsOptions_SetMaxReconnect(no, -1), "max reconnect");
	SET_OPT(natsOptions_SetReconnectWait(no, wait_ms), "reconnect wait");
	SET_OPT(natsOptions_SetReconnectJitter(no, jitter_ms, jitter_ms), "reconnect jitter");
	SET_OPT(natsOptions_SetReconnectBufSize(no, bus->reconnect_buf), "reconnect buffer");
	SET_OPT(natsOptions_SetPingInterval(no, PING_INTERVAL_MS), "ping interval");
	SET_OPT(natsOptions_SetMaxPingsOut(no, MAX_PINGS_OUT), "max pings out");
	SET_OPT(natsOptions_SetWriteDeadline(no, WRITE_DEADLINE_MS), "write deadline");
	SET_OPT(natsOptions_SetDisconnectedCB(no, on_disconnected, bus), "disconnected callback");
	SET_OPT(natsOptions_SetReconnectedCB(no, on_reconnected, bus), "reconnected callback");
	SET_OPT(natsOptions_SetClosedCB(no, on_closed, bus), "closed callback");
	SET_OPT(natsOptions_SetErrorHandler(no, on_error, bus), "error handler");
	if (set_security(no, opts, err) != 0)
		goto fail;
	/* A non-NULL connected callback is what makes the retry asynchronous. */
	SET_OPT(natsOptions_SetRetryOnFailedConnect(no, true, on_connected, bus), "retry");
#undef SET_OPT

	st = natsConnection_Connect(&bus->nc, no);
	natsOptions_Destroy(no);
	no = NULL;
	if (st == NATS_OK) {
		char u[256];
		if (transition(bus, bus->nc, ST_CONNECTED, true, u, sizeof(u)))
			SC_INFO(AREA, "\"%s\" connected to %s", bus->name, u);
	} else if (st == NATS_NOT_YET_CONNECTED) {
		SC_INFO(AREA,
			"\"%s\": no NATS server reachable yet at %s; connecting in the "
			"background",
			bus->name, bus->url);
	} else {
		bus->nc = NULL;
		sc_err_set(err, st == NATS_NO_MEMORY ? SC_RESOURCE_EXHAUSTED : SC_INTERNAL,
			   "connecting to NATS at %s: %s %s", bus->url, natsStatus_GetText(st),
			   nats_detail());
		goto fail;
	}
	free_list(servers, nservers);
	*out = bus;
	return 0;

fail:
	natsOptions_Destroy(no);
	free_list(servers, nservers);
	bus_free(bus);
	return -1;
}

/* How many times nats.c has reconnected nc (0 when it cannot say). */
static uint64_t reconnects_of(natsConnection *nc)
{
	natsStatistics *st = NULL;
	uint64_t n = 0;
	if (natsStatistics_Create(&st) == NATS_OK && natsConnection_GetStats(nc, st) == NATS_OK)
		(void)natsStatistics_GetCounts(st, NULL, NULL, NULL, NULL, &n);
	natsStatistics_Destroy(st);
	return n;
}

const char *sc_nats_bus_state(struct sc_nats_bus *bus)
{
	if (!bus)
		return state_names[ST_CLOSED];
	return state_names[atomic_load(&bus->state)];
}

int sc_nats_bus_publish(struct sc_nats_bus *bus, const char *subject, const void *data, size_t len,
			struct sc_err *err)
{
	char b[80];
	if (!bus)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "publish: bus is NULL");
	if (check_subject(subject, false, "publish", err) != 0)
		return -1;
	if (!data && len)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "publish to %s: data is NULL",
				  shown(subject, b));
	natsConnection *nc = bus->nc;
	/* Read before the publish: whether it goes to a live connection (then only a PONG on that
	 * same connection confirms it) or to the reconnect buffer. */
	uint64_t reconnects = reconnects_of(nc);
	natsConnStatus cs = natsConnection_Status(nc);
	if (cs == NATS_CONN_STATUS_CLOSED || atomic_load(&bus->closing))
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s: the NATS connection is closed",
				  shown(subject, b));
	int64_t max = natsConnection_GetMaxPayload(nc);
	bool known = max > 0;
	if (!known)
		max = ASSUMED_MAX_PAYLOAD;
	if (len > (size_t)max || len > (size_t)INT_MAX)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "publish to %s: payload of %zu bytes exceeds the NATS server's "
				  "max_payload of %lld bytes%s",
				  shown(subject, b), len, (long long)max,
				  known ? "" : " (the NATS default, assumed until connected)");
	bool connected = cs == NATS_CONN_STATUS_CONNECTED;
	if (!connected && len + strlen(subject) + PUB_OVERHEAD > (size_t)bus->reconnect_buf)
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s: not connected to NATS (state %s) and a message "
				  "of %zu bytes does not fit in the reconnect buffer of %d bytes",
				  shown(subject, b), sc_nats_bus_state(bus), len,
				  bus->reconnect_buf);

	natsStatus st = natsConnection_Publish(nc, subject, data, (int)len);
	switch (st) {
	case NATS_OK:
		break;
	case NATS_INSUFFICIENT_BUFFER:
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s: not connected to NATS (state %s) and the "
				  "reconnect buffer (%d bytes) is full; retry once reconnected",
				  shown(subject, b), sc_nats_bus_state(bus), bus->reconnect_buf);
	case NATS_MAX_PAYLOAD:
	case NATS_INVALID_SUBJECT:
	case NATS_INVALID_ARG:
		return sc_err_set(err, SC_INVALID_ARGUMENT, "publish to %s: %s %s",
				  shown(subject, b), natsStatus_GetText(st), nats_detail());
	case NATS_CONNECTION_CLOSED:
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s: the NATS connection is closed",
				  shown(subject, b));
	default:
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s failed: %s %s (the message may not have been "
				  "delivered)",
				  shown(subject, b), natsStatus_GetText(st), nats_detail());
	}
	if (!connected) {
		/* Buffered while not connected: nats.c sends it after the subscriptions on
		 * reconnect. Reconnected meanwhile: confirmed below, on this connection. */
		if (natsConnection_Status(nc) != NATS_CONN_STATUS_CONNECTED)
			return 0;
		reconnects = reconnects_of(nc);
	}
	/* Sent on a live connection. If that connection is lost now, nats.c writes what it holds
	 * to the dead socket and a flush begun after that is answered by the next server: only a
	 * PONG from the connection the message went to, with no reconnect between, confirms it. */
	st = natsConnection_FlushTimeout(nc, bus->flush_timeout_ms);
	if (st != NATS_OK)
		return sc_err_set(
		    err, SC_UNAVAILABLE,
		    "publish to %s was not confirmed by the NATS server within %d ms: "
		    "%s (the message may or may not have been delivered)",
		    shown(subject, b), bus->flush_timeout_ms, natsStatus_GetText(st));
	if (reconnects_of(nc) != reconnects)
		return sc_err_set(err, SC_UNAVAILABLE,
				  "publish to %s: the connection to the NATS server was lost and "
				  "re-established while it was sent (the message may or may not "
				  "have been delivered)",
				  shown(subject, b));
	return 0;
}

/* Both kinds of subscription: open calls nats.c; fn or raw is the handler behind the gate. */
static int sub_open(struct sc_nats_bus *bus, const char *subject, sc_nats_open_fn open, void *arg,
		    sc_nats_msg_fn fn, sc_nats_raw_fn raw, void *ctx, void (*free_ctx)(void *ctx),
		    uint64_t *sub_id, struct sc_err *err)
{
	char b[80];
	natsConnection *nc = bus->nc;
	if (atomic_load(&bus->closing) || natsConnection_Status(nc) == NATS_CONN_STATUS_CLOSED) {
		if (free_ctx)
			free_ctx(ctx);
		return sc_err_set(err, SC_UNAVAILABLE,
				  "subscribe to %s: the NATS connection is closed",
				  shown(subject, b));
	}

	struct nats_sub *s = calloc(1, sizeof(*s));
	if (!s || !(s->subject = strdup(subject))) {
		free(s);
		if (free_ctx)
			free_ctx(ctx);
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "subscribe to %s: out of memory",
				  shown(subject, b));
	}
	s->bus = bus;
	sc_list_init(&s->node);
	s->fn = fn;
	s->raw = raw;
	s->ctx = ctx;
	s->free_ctx = free_ctx;
	atomic_init(&s->refs, 2); /* the bus's list and nats.c's on_complete */
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cond, NULL);

	pthread_mutex_lock(&bus->mu);
	bus->nats_live++; /* before nats.c can call on_complete */
	pthread_mutex_unlock(&bus->mu);

	natsSubscription *nsub = NULL;
	natsStatus st = open(arg, nc, on_msg, s, &nsub, err);
	if (st == NATS_OK) {
		st = natsSubscription_SetOnCompleteCB(nsub, on_complete, s);
		if (st != NATS_OK)
			sc_err_set(err, SC_INTERNAL, "subscribe to %s: %s %s", shown(subject, b),
				   natsStatus_GetText(st), nats_detail());
	}
	if (st != NATS_OK) {
		if (nsub) {
			/* Subscribed but no on_complete: shut the gate so fn never runs, and leave
			 * s allocated, since the delivery thread may still hold it. */
			pthread_mutex_lock(&s->mu);
			s->closed = true;
			while (s->in_cb > 0)
				pthread_cond_wait(&s->cond, &s->mu);
			pthread_mutex_unlock(&s->mu);
			natsSubscription_Unsubscribe(nsub);
			natsSubscription_Destroy(nsub);
			SC_ERROR(AREA, "subscribe to %s failed half-way; leaking its state",
				 shown(subject, b));
		} else {
			pthread_cond_destroy(&s->cond);
			pthread_mutex_destroy(&s->mu);
			if (free_ctx)
				free_ctx(ctx);
			free(s->subject);
			free(s);
		}
		pthread_mutex_lock(&bus->mu);
		bus->nats_live--;
		pthread_cond_broadcast(&bus->cond);
		pthread_mutex_unlock(&bus->mu);
		return -1;
	}

	pthread_mutex_lock(&bus->mu);
	s->nsub = nsub;
	s->id = ++bus->next_id;
	sc_list_insert_head(&bus->subs, &s->node);
	*sub_id = s->id;
	pthread_mutex_unlock(&bus->mu);

	/* Connected: make the server know the subscription before we return. */
	if (natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED) {
		st = natsConnection_FlushTimeout(nc, bus->flush_timeout_ms);
		if (st != NATS_OK)
			SC_WARN(AREA,
				"subscribe to %s: not confirmed by the server within %d ms (%s); "
				"it stays registered and is resent on reconnect",
				shown(subject, b), bus->flush_timeout_ms, natsStatus_GetText(st));
	}
	return 0;
}

int sc_nats_check_subject(const char *subject, bool wildcards, const char *what,
			  struct sc_err *err)
{
	return check_subject(subject, wildcards, what, err);
}

natsConnection *sc_nats_bus_conn(struct sc_nats_bus *bus)
{
	return bus->nc;
}

struct core_open {
	const char *subject;
	const char *queue_group;
};

static natsStatus open_core(void *arg, natsConnection *nc, natsMsgHandler cb, void *closure,
			    natsSubscription **out, struct sc_err *err)
{
	const struct core_open *o = arg;
	char b[80];
	natsStatus st =
	    o->queue_group
		? natsConnection_QueueSubscribe(out, nc, o->subject, o->queue_group, cb, closure)
		: natsConnection_Subscribe(out, nc, o->subject, cb, closure);
	if (st != NATS_OK) {
		enum sc_status code = SC_INTERNAL;
		if (st == NATS_CONNECTION_CLOSED)
			code = SC_UNAVAILABLE;
		else if (st == NATS_INVALID_SUBJECT || st == NATS_INVALID_QUEUE_NAME)
			code = SC_INVALID_ARGUMENT;
		else if (st == NATS_NO_MEMORY)
			code = SC_RESOURCE_EXHAUSTED;
		sc_err_set(err, code, "subscribe to %s: %s %s", shown(o->subject, b),
			   natsStatus_GetText(st), nats_detail());
	}
	return st;
}

int sc_nats_bus_subscribe(struct sc_nats_bus *bus, const char *subject, const char *queue_group,
			  sc_nats_msg_fn fn, void *ctx, uint64_t *sub_id, struct sc_err *err)
{
	if (!bus || !fn || !sub_id)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "subscribe: bus, handler and sub_id must not be NULL");
	if (check_subject(subject, true, "subscribe", err) != 0)
		return -1;
	if (queue_group && !*queue_group)
		queue_group = NULL;
	if (queue_group && check_queue_group(queue_group, err) != 0)
		return -1;
	struct core_open o = {.subject = subject, .queue_group = queue_group};
	return sub_open(bus, subject, open_core, &o, fn, NULL, ctx, NULL, sub_id, err);
}

int sc_nats_sub_open(struct sc_nats_bus *bus, const char *subject, sc_nats_open_fn open, void *arg,
		     sc_nats_raw_fn raw, void *ctx, void (*free_ctx)(void *ctx), uint64_t *sub_id,
		     struct sc_err *err)
{
	if (!bus || !open || !raw || !sub_id || !subject) {
		if (free_ctx)
			free_ctx(ctx);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "subscribe: bus, open, handler, subject and sub_id must not be NULL");
	}
	return sub_open(bus, subject, open, arg, NULL, raw, ctx, free_ctx, sub_id, err);
}

void sc_nats_bus_unsubscribe(struct sc_nats_bus *bus, uint64_t sub_id)
{
	if (!bus || sub_id == 0)
		return;
	struct nats_sub *s = NULL;
	struct sc_list *pos;
	pthread_mutex_lock(&bus->mu);
	sc_list_foreach(pos, &bus->subs) {
		struct nats_sub *it = sc_list_entry(pos, struct nats_sub, node);
		if (it->id == sub_id) {
			s = it;
			break;
		}
	}
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&bus->mu);
	if (!s)
		return;
	sub_close(bus, s);
	sub_unref(s);
}

/* Wait (bounded) for the closed callback and every on_complete. Returns false on timeout. */
static bool wait_bus(struct sc_nats_bus *bus, int ms)
{
	uint64_t until = sc_clock_mono_after_ms((uint64_t)ms);
	bool ok = true;
	pthread_mutex_lock(&bus->mu);
	while (bus->nats_live > 0 || !bus->closed_seen) {
		if (sc_cond_wait_until_mono(&bus->cond, &bus->mu, until) == ETIMEDOUT) {
			ok = bus->nats_live == 0 && bus->closed_seen;
			break;
		}
	}
	pthread_mutex_unlock(&bus->mu);
	return ok;
}

void sc_nats_bus_destroy(struct sc_nats_bus *bus)
{
	if (!bus)
		return;
	if (tl_cb_depth > 0) {
		SC_ERROR(AREA, "sc_nats_bus_destroy called from a NATS callback; refused (it "
			       "would deadlock); the bus is left open");
		return;
	}
	atomic_store(&bus->closing, true);
	for (;;) {
		pthread_mutex_lock(&bus->mu);
		struct sc_list *first = sc_list_first(&bus->subs);
		struct nats_sub *s = first ? sc_list_entry(first, struct nats_sub, node) : NULL;
		if (s)
			atomic_fetch_add(&s->refs, 1);
		pthread_mutex_unlock(&bus->mu);
		if (!s)
			break;
		sub_close(bus, s);
		sub_unref(s);
	}
	/* Close posts the closed callback (once, even if nats.c closed the connection earlier). */
	natsConnection_Close(bus->nc);
	natsConnection_Destroy(bus->nc);
	if (!wait_bus(bus, DESTROY_WAIT_MS)) {
		SC_ERROR(AREA,
			 "NATS connection to %s did not finish closing within %d ms; leaking the "
			 "bus rather than freeing memory a NATS thread may still use",
			 bus->url, DESTROY_WAIT_MS);
		return;
	}
	bus_free(bus);
}

void sc_nats_bus_library_shutdown(void)
{
	if (tl_cb_depth > 0) {
		SC_ERROR(AREA, "sc_nats_bus_library_shutdown called from a NATS callback; refused");
		return;
	}
	if (atomic_exchange(&g_shutdown, true))
		return;
	if (!atomic_load(&g_opened))
		return;
	natsStatus st = nats_CloseAndWait(LIB_CLOSE_WAIT_MS);
	if (st != NATS_OK)
		SC_WARN(AREA, "nats_CloseAndWait: %s (was every bus destroyed first?)",
			natsStatus_GetText(st));
	/* Once nats.c used TLS (our options, or a server that requires it), its exit handler frees
	 * OpenSSL's compression-method list, and OpenSSL 3's own exit handler frees it again: a
	 * crash at exit. Finishing OpenSSL here (the process is about to exit; NATS was its last
	 * user) makes nats.c's handler find nothing to free, and OpenSSL's a no-op. */
	OPENSSL_cleanup();
}

void sc_nats_bus_stats(struct sc_nats_bus *bus, struct sc_nats_bus_stats *out)
{
	memset(out, 0, sizeof(*out));
	natsStatistics *st = NULL;
	if (bus && bus->nc && natsStatistics_Create(&st) == NATS_OK &&
	    natsConnection_GetStats(bus->nc, st) == NATS_OK)
		(void)natsStatistics_GetCounts(st, &out->in_msgs, &out->in_bytes, &out->out_msgs,
					       &out->out_bytes, &out->reconnects);
	natsStatistics_Destroy(st);
}
