/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_nats_bus.c: the NATS bus against a real nats-server. Each test starts its own server on a
 * free 127.0.0.1 port (fork/exec, PR_SET_PDEATHSIG so a crashed test leaves no server behind),
 * and its fixture kills it and destroys every bus even when a CHECK fails. Every wait is bounded.
 * Exit 77 (skipped) when /usr/sbin/nats-server is missing.
 */
#include "nats/client.h"
#include "nats/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define NATS_SERVER "/usr/sbin/nats-server"
#define WAIT_MS 10000

/* ---- time ------------------------------------------------------------------------------------ */

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

/* Poll cond every 2 ms until it holds or ms have passed; CHECK it afterwards. */
#define WAIT_UNTIL(cond, ms)                                                                       \
	do {                                                                                       \
		int64_t dl_ = mono_ms() + (ms);                                                    \
		while (!(cond) && mono_ms() < dl_)                                                 \
			sleep_ms(2);                                                               \
	} while (0)

/* ---- nats-server processes ------------------------------------------------------------------- */

#define MAX_SERVERS 8
static pid_t g_servers[MAX_SERVERS];

static void kill_server(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
	}
	for (int i = 0; i < MAX_SERVERS; i++)
		if (g_servers[i] == pid)
			g_servers[i] = 0;
}

static void kill_all_servers(void)
{
	for (int i = 0; i < MAX_SERVERS; i++)
		kill_server(g_servers[i]);
}

static void skip_without_server(void) __attribute__((constructor));
static void skip_without_server(void)
{
	if (access(NATS_SERVER, X_OK) != 0) {
		printf("SKIP: %s not found\n", NATS_SERVER);
		exit(77);
	}
	atexit(kill_all_servers);
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &al) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static bool port_accepts(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Start nats-server on 127.0.0.1:port (with JetStream storing in js_dir unless NULL) and wait
 * until it accepts. Returns its pid or -1. */
static pid_t start_server_js(int port, const char *js_dir)
{
	char port_s[16];
	snprintf(port_s, sizeof(port_s), "%d", port);
	char *const plain[] = {NATS_SERVER, "-a", "127.0.0.1", "-p", port_s, NULL};
	char *const js[] = {NATS_SERVER, "-a", "127.0.0.1", "-p", port_s, "-js", "-sd", (char *)js_dir,
			    NULL};
	char *const *argv = js_dir ? js : plain;
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* Only async-signal-safe calls here: the parent has NATS threads. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
			dup2(devnull, 2);
		}
		execv(NATS_SERVER, argv);
		_exit(127);
	}
	for (int i = 0; i < MAX_SERVERS; i++)
		if (g_servers[i] == 0) {
			g_servers[i] = pid;
			break;
		}
	int64_t dl = mono_ms() + WAIT_MS;
	while (mono_ms() < dl) {
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			for (int i = 0; i < MAX_SERVERS; i++)
				if (g_servers[i] == pid)
					g_servers[i] = 0;
			fprintf(stderr, "  nats-server on port %d exited at start\n", port);
			return -1;
		}
		if (port_accepts(port))
			return pid;
		sleep_ms(5);
	}
	kill_server(pid);
	return -1;
}

static pid_t start_server(int port)
{
	return start_server_js(port, NULL);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* ---- receivers, observers, a publishing thread ------------------------------------------------
 */

#define RX_MAX 64
#define NSEEN 256

struct rx_msg {
	char subject[128];
	unsigned char *data;
	size_t len;
};

struct rx {
	pthread_mutex_t mu;
	atomic_int count;
	struct rx_msg msgs[RX_MAX];
	int seen[NSEEN];	 /* by the first payload byte, for queue tests (under mu) */
	int delay_us;		 /* handler sleeps this long (unsubscribe tests) */
	atomic_int running;	 /* handler is inside */
	atomic_int after;	 /* set once unsubscribe/destroy returned */
	atomic_int violations;	 /* handler started after "after" */
	struct sc_nats_bus *bus; /* self-unsubscribe test */
	uint64_t self_id;
};

static void rx_fn(void *ctx, const char *subject, const void *data, size_t len)
{
	struct rx *r = ctx;
	if (atomic_load(&r->after))
		atomic_fetch_add(&r->violations, 1);
	atomic_store(&r->running, 1);
	if (r->delay_us)
		usleep((useconds_t)r->delay_us);
	pthread_mutex_lock(&r->mu);
	int i = atomic_load(&r->count);
	if (i < RX_MAX) {
		snprintf(r->msgs[i].subject, sizeof(r->msgs[i].subject), "%s", subject);
		free(r->msgs[i].data);
		r->msgs[i].data = malloc(len ? len : 1);
		if (r->msgs[i].data && len)
			memcpy(r->msgs[i].data, data, len);
		r->msgs[i].len = len;
	}
	if (len > 0)
		r->seen[((const unsigned char *)data)[0]]++;
	atomic_store(&r->running, 0);
	atomic_fetch_add(&r->count, 1);
	pthread_mutex_unlock(&r->mu);
}

/* Unsubscribes itself on its first message. */
static void rx_self_unsub_fn(void *ctx, const char *subject, const void *data, size_t len)
{
	struct rx *r = ctx;
	rx_fn(ctx, subject, data, len);
	sc_nats_bus_unsubscribe(r->bus, r->self_id);
}

static bool rx_has(struct rx *r, const char *payload)
{
	bool found = false;
	size_t n = strlen(payload);
	pthread_mutex_lock(&r->mu);
	int c = atomic_load(&r->count);
	for (int i = 0; i < c && i < RX_MAX; i++)
		if (r->msgs[i].len == n && memcmp(r->msgs[i].data, payload, n) == 0)
			found = true;
	pthread_mutex_unlock(&r->mu);
	return found;
}

#define OBS_MAX 16
struct observer {
	pthread_mutex_t mu;
	int n;
	const char *states[OBS_MAX];
};

static void obs_fn(void *ctx, const char *state)
{
	struct observer *o = ctx;
	pthread_mutex_lock(&o->mu);
	if (o->n < OBS_MAX)
		o->states[o->n++] = state;
	pthread_mutex_unlock(&o->mu);
}

static int obs_count(struct observer *o)
{
	pthread_mutex_lock(&o->mu);
	int n = o->n;
	pthread_mutex_unlock(&o->mu);
	return n;
}

static const char *obs_at(struct observer *o, int i)
{
	pthread_mutex_lock(&o->mu);
	const char *s = i < o->n ? o->states[i] : "(none)";
	pthread_mutex_unlock(&o->mu);
	return s;
}

struct pumper {
	pthread_t th;
	bool started;
	atomic_bool stop;
	struct sc_nats_bus *bus;
	const char *subject;
	atomic_int sent;
};

static void *pump_main(void *arg)
{
	struct pumper *p = arg;
	unsigned char payload[32] = "pump";
	while (!atomic_load(&p->stop)) {
		if (sc_nats_bus_publish(p->bus, p->subject, payload, sizeof(payload), NULL) == 0)
			atomic_fetch_add(&p->sent, 1);
		usleep(200);
	}
	return NULL;
}

static bool pump_start(struct pumper *p, struct sc_nats_bus *bus, const char *subject)
{
	p->bus = bus;
	p->subject = subject;
	atomic_store(&p->stop, false);
	p->started = pthread_create(&p->th, NULL, pump_main, p) == 0;
	return p->started;
}

static void pump_stop(struct pumper *p)
{
	if (!p->started)
		return;
	atomic_store(&p->stop, true);
	pthread_join(p->th, NULL);
	p->started = false;
}

/* ---- fixture: every resource a test makes, released even when a CHECK fails ---------------- */

#define NBUS 4
struct fix {
	int port;
	pid_t server;
	char url[64];
	struct sc_nats_bus *bus[NBUS];
	struct rx rx[NBUS];
	struct observer obs[2];
	struct pumper pump;
	struct sc_nats_store *store; /* destroyed before the buses */
	char js_dir[64];	     /* JetStream's store directory, removed at cleanup */
};

static void fix_init(struct fix *f)
{
	memset(f, 0, sizeof(*f));
	f->port = free_port();
	snprintf(f->url, sizeof(f->url), "nats://127.0.0.1:%d", f->port);
	for (int i = 0; i < NBUS; i++)
		pthread_mutex_init(&f->rx[i].mu, NULL);
	for (int i = 0; i < 2; i++)
		pthread_mutex_init(&f->obs[i].mu, NULL);
}

static void fix_cleanup(struct fix *f)
{
	pump_stop(&f->pump);
	sc_nats_store_destroy(f->store);
	f->store = NULL;
	for (int i = 0; i < NBUS; i++) {
		sc_nats_bus_destroy(f->bus[i]);
		f->bus[i] = NULL;
	}
	kill_server(f->server);
	f->server = 0;
	if (f->js_dir[0])
		nftw(f->js_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	for (int i = 0; i < NBUS; i++) {
		for (int j = 0; j < RX_MAX; j++)
			free(f->rx[i].msgs[j].data);
		pthread_mutex_destroy(&f->rx[i].mu);
	}
	for (int i = 0; i < 2; i++)
		pthread_mutex_destroy(&f->obs[i].mu);
}

static struct sc_nats_bus_opts fast_opts(struct observer *o)
{
	struct sc_nats_bus_opts opts = {.reconnect_wait_ms = 100, .reconnect_jitter_ms = 100};
	if (o) {
		opts.on_state = obs_fn;
		opts.on_state_ctx = o;
	}
	return opts;
}

/* Body runs with a fresh fixture; cleanup runs whatever the body did. */
#define FIX_TEST(name)                                                                             \
	static void name##_body(struct fix *f);                                                    \
	TEST(name)                                                                                 \
	{                                                                                          \
		struct fix *f = malloc(sizeof(*f));                                                \
		if (!f)                                                                            \
			CHECK_FAIL_("out of memory");                                              \
		fix_init(f);                                                                       \
		name##_body(f);                                                                    \
		fix_cleanup(f);                                                                    \
		free(f);                                                                           \
	}                                                                                          \
	static void name##_body(struct fix *f)

#define START_SERVER(f)                                                                            \
	do {                                                                                       \
		CHECK((f)->port > 0);                                                              \
		(f)->server = start_server((f)->port);                                             \
		CHECK((f)->server > 0);                                                            \
	} while (0)

#define CREATE(f, i, opts)                                                                         \
	do {                                                                                       \
		struct sc_err e_ = {0};                                                            \
		char name_[32];                                                                    \
		snprintf(name_, sizeof(name_), "test-bus-%d", i);                                  \
		int rc_ = sc_nats_bus_create_ex((f)->url, name_, (opts), &(f)->bus[i], &e_);       \
		if (rc_ != 0)                                                                      \
			CHECK_FAIL_("create: %s", e_.msg);                                         \
	} while (0)

#define SUBSCRIBE(bus, subject, group, fn, ctx, idp)                                               \
	do {                                                                                       \
		struct sc_err e_ = {0};                                                            \
		if (sc_nats_bus_subscribe((bus), (subject), (group), (fn), (ctx), (idp), &e_) !=   \
		    0)                                                                             \
			CHECK_FAIL_("subscribe %s: %s", (subject), e_.msg);                        \
	} while (0)

#define PUBLISH(bus, subject, data, len)                                                           \
	do {                                                                                       \
		struct sc_err e_ = {0};                                                            \
		if (sc_nats_bus_publish((bus), (subject), (data), (len), &e_) != 0)                \
			CHECK_FAIL_("publish %s: %s", (subject), e_.msg);                          \
	} while (0)

/* ---- tests ------------------------------------------------------------------------------------
 */

FIX_TEST(round_trip_binary)
{
	START_SERVER(f);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	CREATE(f, 1, &o);
	CHECK_STR_EQ(sc_nats_bus_state(f->bus[0]), "connected");
	uint64_t id = 0, wid = 0;
	SUBSCRIBE(f->bus[0], "rt.data", NULL, rx_fn, &f->rx[0], &id);
	SUBSCRIBE(f->bus[0], "rt.*", "", rx_fn, &f->rx[1], &wid);
	CHECK(id != 0 && wid != 0 && id != wid);

	static unsigned char all[256], proto[] = "PUB x 5\r\nhello\r\n\0MSG";
	for (int i = 0; i < 256; i++)
		all[i] = (unsigned char)i;
	size_t big_len = 64 * 1024, max_len = 1024 * 1024;
	unsigned char *big = malloc(max_len);
	CHECK(big != NULL);
	uint32_t x = 12345;
	for (size_t i = 0; i < max_len; i++) {
		x = x * 1103515245u + 12345u;
		big[i] = (unsigned char)(x >> 16);
	}
	struct {
		const void *data;
		size_t len;
	} sent[] = {
	    {NULL, 0}, {all, sizeof(all)}, {proto, sizeof(proto)}, {big, big_len}, {big, max_len}};
	int n = (int)(sizeof(sent) / sizeof(sent[0]));
	int failed_at = -1;
	for (int i = 0; i < n && failed_at < 0; i++) {
		struct sc_err e = {0};
		if (sc_nats_bus_publish(f->bus[1], "rt.data", sent[i].data, sent[i].len, &e) != 0) {
			fprintf(stderr, "  publish %d: %s\n", i, e.msg);
			failed_at = i;
		}
	}
	if (failed_at >= 0) {
		free(big);
		CHECK_INT_EQ(failed_at, -1);
	}
	WAIT_UNTIL(atomic_load(&f->rx[0].count) >= n && atomic_load(&f->rx[1].count) >= n, WAIT_MS);
	int bad = -1;
	for (int r = 0; r < 2 && bad < 0; r++)
		for (int i = 0; i < n && bad < 0; i++) {
			struct rx_msg *m = &f->rx[r].msgs[i];
			if (strcmp(m->subject, "rt.data") != 0 || m->len != sent[i].len ||
			    (m->len && memcmp(m->data, sent[i].data, m->len) != 0))
				bad = r * 100 + i;
		}
	free(big);
	CHECK_INT_EQ(atomic_load(&f->rx[0].count), n);
	CHECK_INT_EQ(atomic_load(&f->rx[1].count), n);
	CHECK_INT_EQ(bad, -1);
}

FIX_TEST(queue_group_delivers_once)
{
	START_SERVER(f);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	CREATE(f, 1, &o);
	CREATE(f, 2, &o);
	uint64_t a, b, all;
	SUBSCRIBE(f->bus[0], "q.work", "workers", rx_fn, &f->rx[0], &a);
	SUBSCRIBE(f->bus[1], "q.work", "workers", rx_fn, &f->rx[1], &b);
	SUBSCRIBE(f->bus[2], "q.work", NULL, rx_fn, &f->rx[2], &all);
	enum { N = 200 };
	for (int i = 0; i < N; i++) {
		unsigned char p[4] = {(unsigned char)i, 'q', 'g', 0};
		PUBLISH(f->bus[2], "q.work", p, sizeof(p));
	}
	WAIT_UNTIL(atomic_load(&f->rx[0].count) + atomic_load(&f->rx[1].count) >= N &&
		       atomic_load(&f->rx[2].count) >= N,
		   WAIT_MS);
	sleep_ms(300); /* time for a duplicate to show up */
	int qa = atomic_load(&f->rx[0].count), qb = atomic_load(&f->rx[1].count);
	CHECK_INT_EQ(qa + qb, N);
	CHECK_INT_EQ(atomic_load(&f->rx[2].count), N);
	CHECK(qa > 0);
	CHECK(qb > 0);
	for (int i = 0; i < N; i++)
		CHECK_INT_EQ(f->rx[0].seen[i] + f->rx[1].seen[i], 1);
}

FIX_TEST(unsubscribe_is_synchronous)
{
	START_SERVER(f);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	CREATE(f, 1, &o);
	CHECK(pump_start(&f->pump, f->bus[1], "u.x"));
	for (int round = 0; round < 5; round++) {
		struct rx *r = &f->rx[0];
		atomic_store(&r->after, 0);
		atomic_store(&r->count, 0);
		r->delay_us = 1000; /* a handler that is often mid-call when unsubscribe comes */
		uint64_t id;
		SUBSCRIBE(f->bus[0], "u.x", NULL, rx_fn, r, &id);
		WAIT_UNTIL(atomic_load(&r->count) >= 20, WAIT_MS);
		CHECK(atomic_load(&r->count) >= 20);
		sc_nats_bus_unsubscribe(f->bus[0], id);
		CHECK_INT_EQ(atomic_load(&r->running), 0);
		atomic_store(&r->after, 1);
		int snap = atomic_load(&r->count);
		int sent = atomic_load(&f->pump.sent);
		sleep_ms(150);
		CHECK(atomic_load(&f->pump.sent) > sent); /* messages kept flowing */
		CHECK_INT_EQ(atomic_load(&r->count), snap);
		CHECK_INT_EQ(atomic_load(&r->violations), 0);
		sc_nats_bus_unsubscribe(f->bus[0], id); /* again: no-op */
	}
	pump_stop(&f->pump);
	sc_nats_bus_unsubscribe(f->bus[0], 0);
	sc_nats_bus_unsubscribe(f->bus[0], 987654321);
	sc_nats_bus_unsubscribe(NULL, 1);

	/* From the handler itself: returns at once, and the handler is not called again. */
	struct rx *s = &f->rx[1];
	s->bus = f->bus[0];
	SUBSCRIBE(f->bus[0], "u.self", NULL, rx_self_unsub_fn, s, &s->self_id);
	for (int i = 0; i < 10; i++)
		PUBLISH(f->bus[1], "u.self", "x", 1);
	WAIT_UNTIL(atomic_load(&s->count) >= 1, WAIT_MS);
	sleep_ms(200);
	CHECK_INT_EQ(atomic_load(&s->count), 1);
}

FIX_TEST(bad_arguments)
{
	static const char *const bad_urls[] = {"",
					       "http://127.0.0.1:4222",
					       "nats://",
					       "nats://:4222",
					       "nats://127.0.0.1:0",
					       "nats://127.0.0.1:70000",
					       "nats://127.0.0.1:42x",
					       "nats://127.0.0.1:",
					       "nats://u:p@127.0.0.1:4222",
					       "nats://a:1,,nats://b:2",
					       "nats://a:1,",
					       "nats://::1:4222",
					       "nats://127.0.0.1:4222/path",
					       "nats://[::1]x",
					       "nats://bad host:4222"};
	struct sc_nats_bus *sentinel = (struct sc_nats_bus *)&bad_urls;
	for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++) {
		struct sc_nats_bus *b = sentinel;
		struct sc_err e = {0};
		CHECK_INT_EQ(sc_nats_bus_create(bad_urls[i], "x", &b, &e), -1);
		CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
		CHECK(b == sentinel);
		CHECK(e.msg[0] != '\0');
	}
	struct sc_err e = {0};
	struct sc_nats_bus *b = NULL;
	CHECK_INT_EQ(sc_nats_bus_create(NULL, "x", &b, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_nats_bus_create(f->url, "bad\nname", &b, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	struct sc_nats_bus_opts neg = {.reconnect_wait_ms = -1};
	CHECK_INT_EQ(sc_nats_bus_create_ex(f->url, "x", &neg, &b, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_nats_bus_create(f->url, "x", NULL, &e), -1);
	CHECK(b == NULL);

	START_SERVER(f);
	/* Two entries, spaces around the comma, IPv6 syntax (never reachable here: fine). */
	char two[160];
	snprintf(two, sizeof(two), "nats://127.0.0.1:%d , nats://[::1]:%d", f->port, f->port);
	CHECK_INT_EQ(sc_nats_bus_create(two, "two", &f->bus[1], &e), 0);
	sc_nats_bus_destroy(f->bus[1]);
	f->bus[1] = NULL;

	CREATE(f, 0, NULL);
	struct sc_nats_bus *bus = f->bus[0];
	static char longsub[SC_NATS_SUBJECT_MAX + 2];
	memset(longsub, 'a', sizeof(longsub) - 1);
	static const char *const bad_pub[] = {"",    "a b", "a\tb", "a\nb", "a\rb", "a.*",
					      "a.>", ">",   "*",    "a..b", ".a",   "a.",
					      "a*",  "a>b", ".",    longsub};
	for (size_t i = 0; i < sizeof(bad_pub) / sizeof(bad_pub[0]); i++) {
		sc_err_clear(&e);
		CHECK_INT_EQ(sc_nats_bus_publish(bus, bad_pub[i], "x", 1, &e), -1);
		CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
		CHECK_STR_CONTAINS(e.msg, "subject");
	}
	CHECK_INT_EQ(sc_nats_bus_publish(bus, NULL, "x", 1, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_nats_bus_publish(bus, "ok", NULL, 5, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_INT_EQ(sc_nats_bus_publish(NULL, "ok", "x", 1, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	size_t over = 1024 * 1024 + 1;
	char *huge = calloc(1, over);
	CHECK(huge != NULL);
	int rc = sc_nats_bus_publish(bus, "ok", huge, over, &e);
	free(huge);
	CHECK_INT_EQ(rc, -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(e.msg, "max_payload of 1048576");
	CHECK_INT_EQ(sc_nats_bus_publish(bus, "ok.fine-subject_1", "x", 1, NULL), 0);

	static const char *const bad_sub[] = {"", "a b", "a.>.b", "a*b", "a..b", "a.", "x\x7f"};
	uint64_t id = 0;
	for (size_t i = 0; i < sizeof(bad_sub) / sizeof(bad_sub[0]); i++) {
		sc_err_clear(&e);
		CHECK_INT_EQ(
		    sc_nats_bus_subscribe(bus, bad_sub[i], NULL, rx_fn, &f->rx[0], &id, &e), -1);
		CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	}
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, "a", "my group", rx_fn, &f->rx[0], &id, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(e.msg, "queue group");
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, "a", NULL, NULL, NULL, &id, &e), -1);
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, "a", NULL, rx_fn, NULL, NULL, &e), -1);
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, "a.*", NULL, rx_fn, &f->rx[0], &id, &e), 0);
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, "a.>", "g", rx_fn, &f->rx[0], &id, &e), 0);
	CHECK_INT_EQ(sc_nats_bus_subscribe(bus, ">", NULL, rx_fn, &f->rx[0], &id, &e), 0);
	CHECK_STR_EQ(sc_nats_bus_state(NULL), "closed");
	sc_nats_bus_destroy(NULL);
}

FIX_TEST(connects_when_server_starts_later)
{
	struct sc_nats_bus_opts o = fast_opts(&f->obs[0]);
	o.reconnect_buf_bytes = 8192;
	int64_t t0 = mono_ms();
	CREATE(f, 0, &o);
	CHECK(mono_ms() - t0 < 3000); /* create does not wait for the server */
	struct sc_nats_bus *bus = f->bus[0];
	CHECK_STR_EQ(sc_nats_bus_state(bus), "connecting");
	uint64_t id;
	SUBSCRIBE(bus, "early.x", NULL, rx_fn, &f->rx[0], &id);
	PUBLISH(bus, "early.x", "hello-1", 7);

	struct sc_err e = {0};
	char *huge = calloc(1, 1024 * 1024 + 1);
	CHECK(huge != NULL);
	int rc = sc_nats_bus_publish(bus, "early.x", huge, 1024 * 1024 + 1, &e);
	free(huge);
	CHECK_INT_EQ(rc, -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(e.msg, "assumed");
	static char big[9000];
	CHECK_INT_EQ(sc_nats_bus_publish(bus, "early.x", big, sizeof(big), &e), -1);
	CHECK_INT_EQ(e.code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(e.msg, "reconnect buffer");

	/* Fill the bounded buffer: 1000-byte messages until it refuses. */
	static char kb[1000];
	int buffered = 0;
	for (int i = 0; i < 20; i++) {
		memset(kb, 'a' + i, sizeof(kb));
		sc_err_clear(&e);
		if (sc_nats_bus_publish(bus, "early.x", kb, sizeof(kb), &e) != 0)
			break;
		buffered++;
	}
	CHECK_INT_EQ(e.code, SC_UNAVAILABLE);
	CHECK_STR_CONTAINS(e.msg, "reconnect buffer");
	CHECK_STR_CONTAINS(e.msg, "connecting");
	CHECK(buffered >= 5 && buffered <= 10);
	CHECK_STR_EQ(sc_nats_bus_state(bus), "connecting");
	CHECK_INT_EQ(obs_count(&f->obs[0]), 0);

	START_SERVER(f);
	WAIT_UNTIL(strcmp(sc_nats_bus_state(bus), "connected") == 0, WAIT_MS);
	CHECK_STR_EQ(sc_nats_bus_state(bus), "connected");
	WAIT_UNTIL(obs_count(&f->obs[0]) >= 1, WAIT_MS);
	CHECK_STR_EQ(obs_at(&f->obs[0], 0), "connected");
	/* The subscription went first, then the buffered publishes, in order. */
	WAIT_UNTIL(atomic_load(&f->rx[0].count) >= 1 + buffered, WAIT_MS);
	CHECK_INT_EQ(atomic_load(&f->rx[0].count), 1 + buffered);
	CHECK(f->rx[0].msgs[0].len == 7 && memcmp(f->rx[0].msgs[0].data, "hello-1", 7) == 0);
	CHECK(f->rx[0].msgs[buffered].len == 1000 &&
	      f->rx[0].msgs[buffered].data[0] == 'a' + buffered - 1);

	CREATE(f, 1, NULL);
	PUBLISH(f->bus[1], "early.x", "hello-2", 7);
	WAIT_UNTIL(rx_has(&f->rx[0], "hello-2"), WAIT_MS);
	CHECK(rx_has(&f->rx[0], "hello-2"));
}

FIX_TEST(survives_server_restart)
{
	START_SERVER(f);
	struct sc_nats_bus_opts oa = fast_opts(&f->obs[0]), ob = fast_opts(&f->obs[1]);
	CREATE(f, 0, &oa);
	CREATE(f, 1, &ob);
	struct sc_nats_bus *a = f->bus[0], *b = f->bus[1];
	uint64_t id, qid;
	SUBSCRIBE(a, "rs.x", NULL, rx_fn, &f->rx[0], &id);
	SUBSCRIBE(a, "rs.q", "g", rx_fn, &f->rx[1], &qid);
	PUBLISH(b, "rs.x", "before", 6);
	WAIT_UNTIL(rx_has(&f->rx[0], "before"), WAIT_MS);
	CHECK(rx_has(&f->rx[0], "before"));

	kill_server(f->server);
	f->server = 0;
	WAIT_UNTIL(strcmp(sc_nats_bus_state(a), "reconnecting") == 0 &&
		       strcmp(sc_nats_bus_state(b), "reconnecting") == 0,
		   WAIT_MS);
	CHECK_STR_EQ(sc_nats_bus_state(a), "reconnecting");
	CHECK_STR_EQ(sc_nats_bus_state(b), "reconnecting");
	/* Buffered on a's own connection: sent after a's subscriptions on reconnect. */
	PUBLISH(a, "rs.x", "buffered", 8);
	PUBLISH(a, "rs.q", "buffered-q", 10);

	f->server = start_server(f->port); /* same port */
	CHECK(f->server > 0);
	WAIT_UNTIL(strcmp(sc_nats_bus_state(a), "connected") == 0 &&
		       strcmp(sc_nats_bus_state(b), "connected") == 0,
		   WAIT_MS);
	CHECK_STR_EQ(sc_nats_bus_state(a), "connected");
	CHECK_STR_EQ(sc_nats_bus_state(b), "connected");
	WAIT_UNTIL(rx_has(&f->rx[0], "buffered") && rx_has(&f->rx[1], "buffered-q"), WAIT_MS);
	CHECK(rx_has(&f->rx[0], "buffered"));
	CHECK(rx_has(&f->rx[1], "buffered-q"));

	/* From the other connection: its SUB may reach the server a moment later, so repeat. */
	int64_t dl = mono_ms() + WAIT_MS;
	while (!(rx_has(&f->rx[0], "after") && rx_has(&f->rx[1], "after-q")) && mono_ms() < dl) {
		PUBLISH(b, "rs.x", "after", 5);
		PUBLISH(b, "rs.q", "after-q", 7);
		sleep_ms(50);
	}
	CHECK(rx_has(&f->rx[0], "after"));
	CHECK(rx_has(&f->rx[1], "after-q"));

	CHECK_INT_EQ(obs_count(&f->obs[0]), 3);
	CHECK_STR_EQ(obs_at(&f->obs[0], 0), "connected");
	CHECK_STR_EQ(obs_at(&f->obs[0], 1), "reconnecting");
	CHECK_STR_EQ(obs_at(&f->obs[0], 2), "connected");
	sc_nats_bus_destroy(a);
	f->bus[0] = NULL;
	CHECK_INT_EQ(obs_count(&f->obs[0]), 4);
	CHECK_STR_EQ(obs_at(&f->obs[0], 3), "closed");
}

FIX_TEST(destroy_with_live_subscriptions)
{
	START_SERVER(f);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	CREATE(f, 1, &o);
	uint64_t ids[3];
	struct rx *r = &f->rx[0];
	r->delay_us = 200;
	SUBSCRIBE(f->bus[0], "d.x", NULL, rx_fn, r, &ids[0]);
	SUBSCRIBE(f->bus[0], "d.*", NULL, rx_fn, r, &ids[1]);
	SUBSCRIBE(f->bus[0], "d.x", "g", rx_fn, r, &ids[2]);
	CHECK(pump_start(&f->pump, f->bus[1], "d.x"));
	WAIT_UNTIL(atomic_load(&r->count) >= 60, WAIT_MS);
	CHECK(atomic_load(&r->count) >= 60);
	int64_t t0 = mono_ms();
	sc_nats_bus_destroy(f->bus[0]);
	f->bus[0] = NULL;
	CHECK(mono_ms() - t0 < 5000);
	CHECK_INT_EQ(atomic_load(&r->running), 0);
	atomic_store(&r->after, 1);
	int snap = atomic_load(&r->count);
	sleep_ms(150);
	CHECK_INT_EQ(atomic_load(&r->count), snap);
	CHECK_INT_EQ(atomic_load(&r->violations), 0);
	pump_stop(&f->pump);

	/* Destroy while still connecting (no server on that port), with subscriptions. */
	char dead[64];
	snprintf(dead, sizeof(dead), "nats://127.0.0.1:%d", free_port());
	struct sc_err e = {0};
	CHECK_INT_EQ(sc_nats_bus_create_ex(dead, "dead", &o, &f->bus[2], &e), 0);
	CHECK_STR_EQ(sc_nats_bus_state(f->bus[2]), "connecting");
	SUBSCRIBE(f->bus[2], "d.y", NULL, rx_fn, &f->rx[2], &ids[0]);
	SUBSCRIBE(f->bus[2], "d.z", "g", rx_fn, &f->rx[2], &ids[1]);
	PUBLISH(f->bus[2], "d.y", "lost", 4);
	t0 = mono_ms();
	sc_nats_bus_destroy(f->bus[2]);
	f->bus[2] = NULL;
	CHECK(mono_ms() - t0 < 3000);

	/* Destroy while reconnecting. */
	kill_server(f->server);
	f->server = 0;
	WAIT_UNTIL(strcmp(sc_nats_bus_state(f->bus[1]), "reconnecting") == 0, WAIT_MS);
	CHECK_STR_EQ(sc_nats_bus_state(f->bus[1]), "reconnecting");
	SUBSCRIBE(f->bus[1], "d.w", NULL, rx_fn, &f->rx[1], &ids[0]);
	t0 = mono_ms();
	sc_nats_bus_destroy(f->bus[1]);
	f->bus[1] = NULL;
	CHECK(mono_ms() - t0 < 3000);
}

/* Last: nats.c cannot be reopened in this process afterwards. */
/* ---- the JetStream store (nats/store.c) -------------------------------------------------------
 */

static void store_rx_fn(void *ctx, const char *subject, const void *data, size_t len, uint64_t seq)
{
	(void)seq;
	rx_fn(ctx, subject, data, len);
}

#define STORE_PUT(st, subject, text, seqp)                                                          \
	do {                                                                                       \
		struct sc_err e_ = {0};                                                            \
		if (sc_nats_store_put((st), (subject), (text), strlen(text), (seqp), &e_) != 0)    \
			CHECK_FAIL_("store put %s: %s", (subject), e_.msg);                        \
	} while (0)

FIX_TEST(store_keeps_the_latest_per_subject)
{
	snprintf(f->js_dir, sizeof(f->js_dir), "/tmp/sc-ut-js-XXXXXX");
	CHECK(mkdtemp(f->js_dir) != NULL);
	CHECK(f->port > 0);
	f->server = start_server_js(f->port, f->js_dir);
	CHECK(f->server > 0);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	struct sc_err e = {0};
	struct sc_nats_store *bad = NULL;
	struct sc_nats_store_opts bo = {.stream = "a.b"};
	CHECK_INT_EQ(sc_nats_store_create(f->bus[0], &bo, &bad, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(e.msg, "may not hold '.'");
	CHECK(bad == NULL);
	struct sc_nats_store_opts so = {.stream = "UT_STORE"};
	CHECK_INT_EQ(sc_nats_store_create(f->bus[0], &so, &f->store, &e), 0);
	CHECK_STR_EQ(sc_nats_store_stream(f->store), "UT_STORE");
	uint64_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
	STORE_PUT(f->store, "ut.a", "one", &s1);
	STORE_PUT(f->store, "ut.a", "two", &s2); /* replaces "one" */
	STORE_PUT(f->store, "ut.b", "three", &s3);
	CHECK(s1 > 0 && s1 < s2 && s2 < s3);
	/* A watch that starts afterwards gets the latest of each subject, then what comes. */
	uint64_t id = 0;
	CHECK_INT_EQ(sc_nats_store_watch(f->store, "ut.>", store_rx_fn, &f->rx[0], &id, &e), 0);
	STORE_PUT(f->store, "ut.c", "end", &s4);
	WAIT_UNTIL(rx_has(&f->rx[0], "end"), WAIT_MS); /* stream order: everything before is in */
	CHECK_INT_EQ(atomic_load(&f->rx[0].count), 3);
	CHECK(rx_has(&f->rx[0], "two") && rx_has(&f->rx[0], "three") && !rx_has(&f->rx[0], "one"));
	CHECK_STR_EQ(f->rx[0].msgs[0].subject, "ut.a"); /* the root is stripped */
	sc_nats_bus_unsubscribe(f->bus[0], id);
	/* Wildcards are for watching only. */
	CHECK_INT_EQ(sc_nats_store_put(f->store, "ut.*", "x", 1, NULL, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
}

FIX_TEST(store_without_jetstream_says_what_to_enable)
{
	START_SERVER(f);
	struct sc_nats_bus_opts o = fast_opts(NULL);
	CREATE(f, 0, &o);
	struct sc_err e = {0};
	CHECK_INT_EQ(sc_nats_store_create(f->bus[0], NULL, &f->store, &e), 0);
	CHECK_INT_EQ(sc_nats_store_put(f->store, "ut.x", "x", 1, NULL, &e), -1);
	CHECK_INT_EQ(e.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(e.msg, "publish to ut.x: nothing was stored: the NATS server has no "
				  "JetStream");
	CHECK_STR_CONTAINS(e.msg, "-js");
	uint64_t id = 0;
	CHECK_INT_EQ(sc_nats_store_watch(f->store, "ut.x", store_rx_fn, &f->rx[0], &id, &e), -1);
	CHECK_INT_EQ(e.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(e.msg, "wait on ut.x: nothing can be received");
}

TEST(library_shutdown)
{
	sc_nats_bus_library_shutdown();
	sc_nats_bus_library_shutdown();
	struct sc_nats_bus *b = NULL;
	struct sc_err e = {0};
	CHECK_INT_EQ(sc_nats_bus_create("nats://127.0.0.1:4222", "late", &b, &e), -1);
	CHECK_INT_EQ(e.code, SC_FAILED_PRECONDITION);
	CHECK(b == NULL);
}

RUN_TESTS(T(round_trip_binary), T(queue_group_delivers_once), T(unsubscribe_is_synchronous),
	  T(bad_arguments), T(connects_when_server_starts_later), T(survives_server_restart),
	  T(destroy_with_live_subscriptions), T(store_keeps_the_latest_per_subject),
	  T(store_without_jetstream_says_what_to_enable), T(library_shutdown))
