/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/uds_accept.c: the unix socket listener behind --allowed-uids (see net/uds_accept.h). gRPC's
 * own unix listener gives a call no peer credentials, so with an allow list the sidecar binds the
 * socket, accepts, reads SO_PEERCRED and records the uid by descriptor before handing the
 * connection to gRPC; service/server.c looks the uid up for every call and refuses others. (The
 * --allowed-uids list itself is parsed by base/parse.c.)
 *
 * Threads: one accept thread per acceptor (poll on the socket and a stop pipe). The uid table is
 * shared by every acceptor under one mutex. Owns the listening socket and its path.
 */
#include "net/uds_accept.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define UID_TABLE 4096 /* descriptors above this have no recorded uid: refused by the caller */

static pthread_mutex_t uid_mu = PTHREAD_MUTEX_INITIALIZER;
static uid_t uid_of_fd[UID_TABLE];
static bool uid_known[UID_TABLE];

struct sc_uds_acceptor {
	char *path;
	int fd;
	int stop_pipe[2];
	pthread_t thread;
	bool running;
	sc_uds_conn_fn on_conn;
	void *ctx;
};

bool sc_uds_peer_uid(int fd, uid_t *uid)
{
	if (fd < 0 || fd >= UID_TABLE)
		return false;
	pthread_mutex_lock(&uid_mu);
	bool known = uid_known[fd];
	*uid = uid_of_fd[fd];
	pthread_mutex_unlock(&uid_mu);
	return known;
}

int sc_uds_acceptor_create(const char *path, unsigned mode, struct sc_uds_acceptor **out,
			   struct sc_err *err)
{
	struct sc_uds_acceptor *a = calloc(1, sizeof(*a));
	if (!a)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	a->fd = -1;
	a->stop_pipe[0] = a->stop_pipe[1] = -1;
	a->path = strdup(path);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	a->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (!a->path || a->fd < 0 || pipe2(a->stop_pipe, O_CLOEXEC) != 0) {
		sc_err_set(err, SC_INTERNAL, "unix socket %s: %s", path, strerror(errno));
		goto fail;
	}
	if (bind(a->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--grpc-listen unix:%s: cannot bind: %s", path,
			   strerror(errno));
		goto fail;
	}
	if (chmod(path, (mode_t)mode) != 0 || listen(a->fd, 128) != 0) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "--grpc-listen unix:%s: %s", path,
			   strerror(errno));
		unlink(path);
		goto fail;
	}
	*out = a;
	return 0;
fail:
	if (a->fd >= 0)
		close(a->fd);
	if (a->stop_pipe[0] >= 0) {
		close(a->stop_pipe[0]);
		close(a->stop_pipe[1]);
	}
	free(a->path);
	free(a);
	return -1;
}

static void *accept_main(void *arg)
{
	struct sc_uds_acceptor *a = arg;
	struct pollfd pfd[2] = {{.fd = a->fd, .events = POLLIN},
				{.fd = a->stop_pipe[0], .events = POLLIN}};
	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			SC_ERROR("grpc", "unix socket %s: poll: %s", a->path, strerror(errno));
			return NULL;
		}
		if (pfd[1].revents)
			return NULL;
		int fd = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				SC_WARN("grpc", "unix socket %s: accept: %s", a->path,
					strerror(errno));
			if (errno == EMFILE || errno == ENFILE)
				usleep(100 * 1000);
			continue;
		}
		struct ucred cred;
		socklen_t len = sizeof(cred);
		bool known =
		    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && fd < UID_TABLE;
		pthread_mutex_lock(&uid_mu);
		if (fd < UID_TABLE) {
			uid_known[fd] = known;
			uid_of_fd[fd] = known ? cred.uid : (uid_t)-1;
		}
		pthread_mutex_unlock(&uid_mu);
		a->on_conn(a->ctx, fd);
	}
}

int sc_uds_acceptor_start(struct sc_uds_acceptor *a, sc_uds_conn_fn on_conn, void *ctx,
			  struct sc_err *err)
{
	a->on_conn = on_conn;
	a->ctx = ctx;
	if (pthread_create(&a->thread, NULL, accept_main, a) != 0)
		return sc_err_set(err, SC_INTERNAL, "cannot start the unix socket accept thread");
	pthread_setname_np(a->thread, "sc-uds-accept");
	a->running = true;
	return 0;
}

void sc_uds_acceptor_destroy(struct sc_uds_acceptor *a)
{
	if (!a)
		return;
	if (a->running) {
		char c = 1;
		if (write(a->stop_pipe[1], &c, 1) != 1)
			SC_WARN("grpc", "unix socket %s: cannot stop the accept thread", a->path);
		pthread_join(a->thread, NULL);
	}
	close(a->fd);
	close(a->stop_pipe[0]);
	close(a->stop_pipe[1]);
	unlink(a->path);
	free(a->path);
	free(a);
}
