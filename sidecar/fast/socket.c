/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/socket.c: the fast path's socket (fast/socket.h). Binds --fast-path-socket (SOCK_SEQPACKET,
 * the gRPC unix socket's mode), checks each connecting worker's uid (SO_PEERCRED) against
 * --allowed-uids as the gRPC socket does, holds at most --fast-path-max-sessions sessions, of which
 * one uid holds at most its share (per_uid: the total over the number of --allowed-uids, at least
 * 1; the total when any uid may connect), and joins the sessions that ended. Every line a worker
 * can make it log is rate-limited (sc_log_limited, one key per call site).
 *
 * Threads: one accept thread (poll on the socket, a stop eventfd and the ended-sessions eventfd;
 * every WATCH_MS while sessions exist it also watches those busy with a transfer).
 * Sessions run on their own threads (fast/session.c) and report their end through `ended`.
 */
#include "fast/socket.h"
#include "net/api_listen.h"
#include "fast/session.h"
#include "base/list.h"
#include <rdma_sidecar/fast_ring.h>
#include "base/log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define RING_ENTRIES 256
/* How often the accept thread looks at sessions busy with a transfer (sc_fast_session_watch). */
#define WATCH_MS 50

struct entry {
	struct sc_list node;
	struct sc_fast_session *s;
	uint32_t uid;
	bool ended;
};

struct sc_fast_path {
	struct sc_engine *eng;
	char *path;
	int fd, stop_fd, ended_fd;
	uint32_t allowed[SC_MAX_ALLOWED_UIDS];
	size_t n_allowed;
	uint32_t max_sessions;
	uint32_t per_uid; /* sessions one uid may hold */
	pthread_t thread;
	bool running;
	pthread_mutex_t mu;
	struct sc_list sessions; /* under mu: struct entry */
	uint32_t n_sessions;	 /* under mu */
};

static void on_session_exit(void *ctx, struct sc_fast_session *s)
{
	struct sc_fast_path *fp = ctx;
	pthread_mutex_lock(&fp->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &fp->sessions) {
		struct entry *e = sc_list_entry(pos, struct entry, node);
		if (e->s == s)
			e->ended = true;
	}
	pthread_mutex_unlock(&fp->mu);
	uint64_t one = 1;
	(void)!write(fp->ended_fd, &one, sizeof(one));
}

/* Joins the sessions that ended (all of them when `all`, after asking each to stop). */
static void join_sessions(struct sc_fast_path *fp, bool all)
{
	for (;;) {
		struct entry *found = NULL;
		pthread_mutex_lock(&fp->mu);
		struct sc_list *pos;
		sc_list_foreach(pos, &fp->sessions) {
			struct entry *e = sc_list_entry(pos, struct entry, node);
			if (e->ended || all) {
				found = e;
				break;
			}
		}
		if (found) {
			sc_list_remove(&found->node);
			fp->n_sessions--;
		}
		pthread_mutex_unlock(&fp->mu);
		if (!found)
			return;
		if (all)
			sc_fast_session_stop(found->s);
		sc_fast_session_join_free(found->s);
		sc_engine_fast_path_note(fp->eng, SC_FAST_SESSION_CLOSED);
		free(found);
	}
}

/* Cancels the transfers sessions run on their own threads when their workers asked (CANCEL, or a
 * closed socket): sc_fast_session_watch. */
static void watch_sessions(struct sc_fast_path *fp)
{
	pthread_mutex_lock(&fp->mu);
	struct sc_list *pos;
	sc_list_foreach(pos, &fp->sessions) {
		struct entry *e = sc_list_entry(pos, struct entry, node);
		if (!e->ended && e->s)
			sc_fast_session_watch(e->s);
	}
	pthread_mutex_unlock(&fp->mu);
}

/* A refusal the worker can read: a RESULT in place of HELLO, then the socket closes. */
static void refuse(int fd, enum sc_status code, const char *msg)
{
	struct rsc_fast_result m;
	memset(&m, 0, sizeof(m));
	m.hdr.type = RSC_FAST_MSG_RESULT;
	m.hdr.len = sizeof(m);
	m.code = (int32_t)code;
	snprintf(m.message, sizeof(m.message), "%s", msg);
	(void)!send(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL);
	close(fd);
}

/* Sessions uid holds now; under mu. */
static uint32_t sessions_of_locked(struct sc_fast_path *fp, uint32_t uid)
{
	uint32_t n = 0;
	struct sc_list *pos;
	sc_list_foreach(pos, &fp->sessions) {
		struct entry *e = sc_list_entry(pos, struct entry, node);
		n += e->uid == uid;
	}
	return n;
}

static void admit(struct sc_fast_path *fp, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char msg[256];
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		refuse(fd, SC_PERMISSION_DENIED,
		       "the worker's credentials are unknown (SO_PEERCRED)");
		return;
	}
	bool allowed = fp->n_allowed == 0;
	for (size_t i = 0; i < fp->n_allowed && !allowed; i++)
		allowed = fp->allowed[i] == (uint32_t)cred.uid;
	if (!allowed) {
		snprintf(msg, sizeof(msg),
			 "uid %u may not use this sidecar (--allowed-uids does not list it)",
			 (unsigned)cred.uid);
		SC_WARN_LIMITED("fast", "fast.refused-uid",
				"fast-path connection of pid %d refused: %s", (int)cred.pid, msg);
		sc_engine_fast_path_note(fp->eng, SC_FAST_SESSION_REFUSED);
		refuse(fd, SC_PERMISSION_DENIED, msg);
		return;
	}
	struct entry *e = calloc(1, sizeof(*e));
	if (!e) {
		refuse(fd, SC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	e->uid = (uint32_t)cred.uid;
	/* Counted and listed at once, before the thread starts (its on_exit always finds it). */
	pthread_mutex_lock(&fp->mu);
	bool room = fp->n_sessions < fp->max_sessions;
	uint32_t mine = sessions_of_locked(fp, e->uid);
	if (room && mine < fp->per_uid) {
		sc_list_insert_head(&fp->sessions, &e->node);
		fp->n_sessions++;
	}
	pthread_mutex_unlock(&fp->mu);
	if (!room || mine >= fp->per_uid) {
		if (!room)
			snprintf(msg, sizeof(msg),
				 "--fast-path-max-sessions %u sessions are open; close one, or use "
				 "gRPC",
				 fp->max_sessions);
		else
			snprintf(
			    msg, sizeof(msg),
			    "uid %u holds %u fast-path sessions, its share of "
			    "--fast-path-max-sessions %u (over the %zu uids of --allowed-uids): "
			    "close one, or use gRPC",
			    (unsigned)cred.uid, mine, fp->max_sessions, fp->n_allowed);
		SC_WARN_LIMITED("fast", room ? "fast.refused-uid-share" : "fast.refused-full",
				"fast-path connection of pid %d (uid %u) refused: %s",
				(int)cred.pid, (unsigned)cred.uid, msg);
		sc_engine_fast_path_note(fp->eng, SC_FAST_SESSION_REFUSED);
		refuse(fd, SC_RESOURCE_EXHAUSTED, msg);
		free(e);
		return;
	}
	struct sc_err err;
	sc_err_clear(&err);
	struct sc_fast_session_params p = {
	    .eng = fp->eng,
	    .sock = fd,
	    .pid = cred.pid,
	    .uid = cred.uid,
	    .entries = RING_ENTRIES,
	    .on_exit = on_session_exit,
	    .ctx = fp,
	};
	pthread_mutex_lock(&fp->mu); /* e->s is set before on_exit can look for it */
	int rc = sc_fast_session_start(&p, &e->s, &err);
	pthread_mutex_unlock(&fp->mu);
	if (rc != 0) {
		SC_WARN_LIMITED("fast", "fast.start-failed",
				"fast-path session of pid %d (uid %u) not started: %s",
				(int)cred.pid, (unsigned)cred.uid, err.msg);
		pthread_mutex_lock(&fp->mu);
		sc_list_remove(&e->node);
		fp->n_sessions--;
		pthread_mutex_unlock(&fp->mu);
		free(e);
		return;
	}
	sc_engine_fast_path_note(fp->eng, SC_FAST_SESSION_OPENED);
	sc_log_limited(SC_LOG_INFO, "fast", "fast.session-opened",
		       "fast-path session of pid %d (uid %u) opened", (int)cred.pid,
		       (unsigned)cred.uid);
}

static void *accept_main(void *arg)
{
	struct sc_fast_path *fp = arg;
	struct pollfd pfd[3] = {{.fd = fp->fd, .events = POLLIN},
				{.fd = fp->stop_fd, .events = POLLIN},
				{.fd = fp->ended_fd, .events = POLLIN}};
	for (;;) {
		pthread_mutex_lock(&fp->mu);
		int wait_ms = fp->n_sessions ? WATCH_MS : -1;
		pthread_mutex_unlock(&fp->mu);
		if (poll(pfd, 3, wait_ms) < 0) {
			if (errno == EINTR)
				continue;
			SC_ERROR("fast", "fast-path socket %s: poll: %s", fp->path,
				 strerror(errno));
			return NULL;
		}
		if (pfd[1].revents)
			return NULL;
		if (pfd[2].revents) {
			uint64_t v;
			(void)!read(fp->ended_fd, &v, sizeof(v));
			join_sessions(fp, false);
		}
		watch_sessions(fp);
		if (!(pfd[0].revents & POLLIN))
			continue;
		/* Non-blocking: every call on it says MSG_DONTWAIT anyway. */
		int fd = accept4(fp->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				SC_WARN_LIMITED("fast", "fast.accept",
						"fast-path socket %s: accept: %s", fp->path,
						strerror(errno));
			if (errno == EMFILE || errno == ENFILE)
				usleep(100 * 1000);
			continue;
		}
		admit(fp, fd);
	}
}

int sc_fast_path_create(struct sc_engine *eng, const struct sc_config *cfg,
			struct sc_fast_path **out, struct sc_err *err)
{
	*out = NULL;
	if (!cfg->fast_path_socket)
		return 0;
	struct sc_fast_path *fp = calloc(1, sizeof(*fp));
	if (!fp)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	fp->eng = eng;
	fp->fd = fp->stop_fd = fp->ended_fd = -1;
	fp->max_sessions = cfg->fast_path_max_sessions ? cfg->fast_path_max_sessions : 64;
	fp->n_allowed = cfg->n_allowed_uids;
	memcpy(fp->allowed, cfg->allowed_uids, sizeof(fp->allowed));
	pthread_mutex_init(&fp->mu, NULL);
	sc_list_init(&fp->sessions);
	fp->per_uid = fp->n_allowed ? fp->max_sessions / (uint32_t)fp->n_allowed : fp->max_sessions;
	if (fp->per_uid < 1)
		fp->per_uid = 1;
	fp->path = strdup(cfg->fast_path_socket);
	if (!fp->path) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	if (sc_unix_socket_prepare_as("--fast-path-socket ", SOCK_SEQPACKET, fp->path, err) != 0)
		goto fail;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", fp->path);
	fp->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	fp->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	fp->ended_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fp->fd < 0 || fp->stop_fd < 0 || fp->ended_fd < 0) {
		sc_err_set(err, SC_INTERNAL, "--fast-path-socket %s: %s", fp->path, strerror(errno));
		goto fail;
	}
	if (bind(fp->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--fast-path-socket %s: cannot bind: %s",
			   fp->path, strerror(errno));
		goto fail;
	}
	if (chmod(fp->path, (mode_t)cfg->unix_socket_mode) != 0 || listen(fp->fd, 128) != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--fast-path-socket %s: %s", fp->path,
			   strerror(errno));
		unlink(fp->path);
		goto fail;
	}
	*out = fp;
	return 0;
fail:
	sc_fast_path_destroy(fp);
	return -1;
}

int sc_fast_path_start(struct sc_fast_path *fp, struct sc_err *err)
{
	if (!fp)
		return 0;
	int rc = pthread_create(&fp->thread, NULL, accept_main, fp);
	if (rc != 0)
		return sc_err_set(err, SC_INTERNAL, "fast-path thread: %s", strerror(rc));
	fp->running = true;
	SC_INFO("fast", "fast path on %s (at most %u sessions, %u per uid)", fp->path,
		fp->max_sessions, fp->per_uid);
	return 0;
}

void sc_fast_path_destroy(struct sc_fast_path *fp)
{
	if (!fp)
		return;
	if (fp->running) {
		uint64_t one = 1;
		(void)!write(fp->stop_fd, &one, sizeof(one));
		pthread_join(fp->thread, NULL);
	}
	join_sessions(fp, true);
	if (fp->fd >= 0) {
		close(fp->fd);
		unlink(fp->path);
	}
	if (fp->stop_fd >= 0)
		close(fp->stop_fd);
	if (fp->ended_fd >= 0)
		close(fp->ended_fd);
	pthread_mutex_destroy(&fp->mu);
	free(fp->path);
	free(fp);
}
