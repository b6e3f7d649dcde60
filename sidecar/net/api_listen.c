/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/api_listen.c: the checks that decide who can reach the worker API (see net/api_listen.h): the
 * TCP listener policy, the unix socket's directory, liveness and mode, and the bearer token
 * store. No gRPC types: service/server.c calls these around grpc_server_add_http2_port and on
 * every call.
 *
 * Runs on the main thread at start-up, except the token store, which gRPC worker threads read
 * and the signal thread reloads under its mutex. Owns only the token store's copy of the token.
 */
#include "net/api_listen.h"

#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define TOKEN_MIN 16
#define TOKEN_MAX 4096

bool sc_addr_is_loopback(const char *addr)
{
	if (!addr || strncmp(addr, "unix:", 5) == 0)
		return false;
	if (strncmp(addr, "127.", 4) == 0 || strncmp(addr, "localhost:", 10) == 0 ||
	    strncmp(addr, "[::1]:", 6) == 0)
		return true;
	return false;
}

bool sc_api_tcp_authenticated(const struct sc_config *cfg)
{
	return (cfg->grpc_tls_client_ca && cfg->grpc_tls_client_ca[0]) ||
	       (cfg->grpc_token_file && cfg->grpc_token_file[0]);
}

int sc_api_listen_check(const struct sc_config *cfg, struct sc_err *err)
{
	if (sc_api_tcp_authenticated(cfg))
		return 0;
	for (size_t i = 0; i < cfg->n_grpc_listen; i++) {
		const char *a = cfg->grpc_listen[i];
		if (strncmp(a, "unix:", 5) == 0)
			continue;
		if (!sc_addr_is_loopback(a))
			return sc_err_set(
			    err, SC_INVALID_ARGUMENT,
			    "--grpc-listen %s would serve the whole API (read and write region "
			    "memory) to anyone who can reach that address, without authentication: "
			    "turn on mTLS (--grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca) "
			    "and/or --grpc-token-file, or serve workers on a unix socket; probes "
			    "belong on --health-listen",
			    a);
		SC_WARN("grpc",
			"SECURITY: --grpc-listen %s serves the whole API WITHOUT AUTHENTICATION: "
			"every local user and process can read and write the memory this sidecar "
			"can; use the unix socket, or --grpc-tls-client-ca / --grpc-token-file",
			a);
	}
	return 0;
}

/* Make the parents of dir (0755, as before) and dir itself (0750, chmod'ed past the umask), or
 * verify an existing dir: a directory owned by this user that no one else may write. */
static int prepare_dir(const char *what, const char *path, const char *dir, struct sc_err *err)
{
	struct stat st;
	if (stat(dir, &st) != 0) {
		if (errno != ENOENT)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s%s: cannot use directory %s: %s",
					  what, path, dir, strerror(errno));
		char tmp[512];
		snprintf(tmp, sizeof(tmp), "%s", dir);
		for (char *p = tmp + 1; *p; p++) {
			if (*p != '/')
				continue;
			*p = '\0';
			mkdir(tmp, 0755);
			*p = '/';
		}
		if (mkdir(dir, 0750) != 0 && errno != EEXIST)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s%s: cannot create directory %s: %s",
					  what, path, dir, strerror(errno));
		if (stat(dir, &st) != 0)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "%s%s: cannot use directory %s: %s",
					  what, path, dir, strerror(errno));
		if (st.st_uid == geteuid() && chmod(dir, 0750) == 0)
			st.st_mode = (st.st_mode & ~(mode_t)07777) | 0750;
	}
	if (!S_ISDIR(st.st_mode))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: %s is not a directory", what, path, dir);
	if (st.st_uid != geteuid())
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: directory %s belongs to uid %u, not to "
				  "this sidecar (uid %u): another user could replace the socket; "
				  "use a directory the sidecar owns (it creates a missing one)",
				  what, path, dir, (unsigned)st.st_uid, (unsigned)geteuid());
	if (st.st_mode & 022)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: directory %s is group- or world-writable "
				  "(mode %04o): another user could replace the socket; chmod go-w "
				  "it or use a directory only the sidecar writes",
				  what, path, dir, (unsigned)(st.st_mode & 07777));
	if (access(dir, W_OK | X_OK) != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: directory %s is not writable: %s", what, path,
				  dir, strerror(errno));
	return 0;
}

int sc_unix_socket_prepare_as(const char *what, int type, const char *path, struct sc_err *err)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		if (prepare_dir(what, path, dir, err) != 0)
			return -1;
	}
	struct stat st;
	if (lstat(path, &st) != 0)
		return 0; /* nothing there yet */
	if (!S_ISSOCK(st.st_mode))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: the path exists and is not a socket: "
				  "remove it or pick another path",
				  what, path);
	/* A server answering there is alive: never take its socket over. */
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sc_err_set(err, SC_INTERNAL, "socket: %s", strerror(errno));
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	close(fd);
	if (rc == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: another server (a running rdma-sidecar?) "
				  "is answering on this socket: stop it first or pick another path",
				  what, path);
	if (e != ECONNREFUSED)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "%s%s: cannot tell whether a server still uses "
		    "the socket (connect: %s): remove it by hand or pick another path",
		    what, path, strerror(e));
	if (unlink(path) != 0 && errno != ENOENT)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "%s%s: cannot remove the stale socket: %s", what, path,
				  strerror(errno));
	SC_INFO("grpc", "removed stale socket %s (no server answered)", path);
	return 0;
}

int sc_unix_socket_prepare(const char *path, struct sc_err *err)
{
	return sc_unix_socket_prepare_as("--grpc-listen unix:", SOCK_STREAM, path, err);
}

int sc_unix_socket_set_mode(const char *path, unsigned mode, struct sc_err *err)
{
	if (chmod(path, (mode_t)mode) != 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--grpc-listen unix:%s: cannot set mode %04o: %s", path, mode,
				  strerror(errno));
	return 0;
}

int sc_read_small_file(const char *path, size_t max, const char *what, char **out, size_t *len,
		       struct sc_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: cannot open: %s", what, path,
				  strerror(errno));
	char *buf = NULL;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: not a regular file", what, path);
		goto fail;
	}
	if ((uint64_t)st.st_size > max) {
		sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: larger than %zu bytes", what, path,
			   max);
		goto fail;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		goto fail;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			sc_err_set(err, SC_INVALID_ARGUMENT, "%s %s: read failed: %s", what, path,
				   n < 0 ? strerror(errno) : "file shrank");
			goto fail;
		}
		got += (size_t)n;
	}
	buf[got] = '\0';
	close(fd);
	*out = buf;
	*len = got;
	return 0;
fail:
	free(buf);
	close(fd);
	return -1;
}

/* ---- the bearer token ------------------------------------------------------------------------ */

struct sc_token_store {
	pthread_mutex_t mu;
	char *path;
	char *token;
	size_t len;
};

static int token_load(const char *path, char **out, size_t *len, struct sc_err *err)
{
	char *buf;
	size_t n;
	struct stat st;
	if (stat(path, &st) == 0 && (st.st_mode & 07))
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--grpc-token-file %s: readable or writable by every user (mode "
				  "%04o): chmod o-rwx it",
				  path, (unsigned)(st.st_mode & 07777));
	if (sc_read_small_file(path, TOKEN_MAX, "--grpc-token-file", &buf, &n, err) != 0)
		return -1;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
			 buf[n - 1] == '\t'))
		buf[--n] = '\0';
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)buf[i];
		if (c <= ' ' || c >= 0x7f) {
			free(buf);
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "--grpc-token-file %s: the token must be one line of "
					  "printable characters without spaces",
					  path);
		}
	}
	if (n < TOKEN_MIN) {
		free(buf);
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "--grpc-token-file %s: token shorter than %d characters: use "
				  "e.g. `head -c 32 /dev/urandom | base64`",
				  path, TOKEN_MIN);
	}
	*out = buf;
	*len = n;
	return 0;
}

int sc_token_store_create(const char *path, struct sc_token_store **out, struct sc_err *err)
{
	struct sc_token_store *ts = calloc(1, sizeof(*ts));
	if (!ts)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
	pthread_mutex_init(&ts->mu, NULL);
	ts->path = strdup(path);
	if (!ts->path || token_load(path, &ts->token, &ts->len, err) != 0) {
		if (!ts->path)
			sc_err_set(err, SC_RESOURCE_EXHAUSTED, "out of memory");
		sc_token_store_destroy(ts);
		return -1;
	}
	*out = ts;
	return 0;
}

void sc_token_store_destroy(struct sc_token_store *ts)
{
	if (!ts)
		return;
	if (ts->token)
		OPENSSL_cleanse(ts->token, ts->len);
	free(ts->token);
	free(ts->path);
	pthread_mutex_destroy(&ts->mu);
	free(ts);
}

int sc_token_store_reload(struct sc_token_store *ts, struct sc_err *err)
{
	char *tok;
	size_t n;
	if (token_load(ts->path, &tok, &n, err) != 0)
		return -1;
	pthread_mutex_lock(&ts->mu);
	char *old = ts->token;
	size_t old_len = ts->len;
	ts->token = tok;
	ts->len = n;
	pthread_mutex_unlock(&ts->mu);
	OPENSSL_cleanse(old, old_len);
	free(old);
	return 0;
}

bool sc_token_check(struct sc_token_store *ts, const char *header, size_t len)
{
	static const char prefix[] = "Bearer ";
	const size_t pl = sizeof(prefix) - 1;
	if (!ts || !header || len <= pl || strncasecmp(header, prefix, pl) != 0)
		return false;
	header += pl;
	len -= pl;
	pthread_mutex_lock(&ts->mu);
	/* Length is not secret (it is fixed per deployment); the bytes are compared in constant
	 * time. */
	bool ok = len == ts->len && CRYPTO_memcmp(header, ts->token, len) == 0;
	pthread_mutex_unlock(&ts->mu);
	return ok;
}
