/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/path_guard.c: confines RegisterRegion to files beneath --shm-dir and the --register-dir
 * directories. The path a worker gives must start with one of those directories (as configured or
 * as its canonical form); the rest is resolved relative to an O_PATH descriptor of the directory
 * with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), or, on kernels
 * without openat2 (ENOSYS), by a walk that opens one component at a time with O_NOFOLLOW and
 * refuses "..". Only regular files pass, and never the --key-file (compared by st_dev/st_ino, so a
 * hard link to it is refused too). Sockets are not regular files, so the sidecar's unix socket is
 * refused as well. Region files that the sidecar created under --shm-dir may be registered: they
 * hold nothing but what a worker put there.
 *
 * Runs on gRPC worker threads (RegisterRegion), without the engine lock. Owns nothing: every
 * descriptor it opens is closed before it returns, except the one it hands back.
 */
#include "os/path_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define OPEN_FLAGS (O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)

/* "--shm-dir /dev/shm, --register-dir /data" for messages. */
static void allowed_list(const struct sc_config *cfg, char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "--shm-dir %s", cfg->shm_dir);
	for (size_t i = 0; i < cfg->n_register_dirs && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, ", --register-dir %s",
				      cfg->register_dirs[i]);
}

/* If path lies lexically beneath dir, the part after "dir/"; else NULL. */
static const char *beneath(const char *dir, const char *path)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (strncmp(dir, path, n) != 0)
		return NULL;
	if (n == 1) /* "/" */
		return path + 1;
	if (path[n] != '/')
		return NULL;
	const char *rel = path + n;
	while (*rel == '/')
		rel++;
	return rel;
}

int sc_path_guard_walk(int dirfd, const char *rel)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof(buf), "%s", rel) >= (int)sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int cur = dup(dirfd);
	if (cur < 0)
		return -1;
	char *save = NULL;
	char *comp = strtok_r(buf, "/", &save);
	while (comp) {
		char *next = strtok_r(NULL, "/", &save);
		if (strcmp(comp, "..") == 0) {
			close(cur);
			errno = EXDEV;
			return -1;
		}
		if (strcmp(comp, ".") == 0) {
			comp = next;
			continue;
		}
		int fd = next ? openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
			      : openat(cur, comp, OPEN_FLAGS | O_NOFOLLOW);
		int e = errno;
		close(cur);
		if (fd < 0) {
			/* O_NOFOLLOW|O_DIRECTORY on a symlink says ENOTDIR: call it a link. */
			struct stat st;
			if ((e == ENOTDIR || e == ELOOP) && fstatat(dirfd, rel, &st,
								    AT_SYMLINK_NOFOLLOW) == 0)
				e = ELOOP;
			errno = e;
			return -1;
		}
		cur = fd;
		comp = next;
	}
	/* rel named the directory itself: not a regular file; fstat says so later. */
	return cur;
}

/* Any ".." component? Refused even when it would stay beneath, like the walk does. */
static bool has_dotdot(const char *rel)
{
	for (const char *p = rel; (p = strstr(p, "..")) != NULL; p += 2)
		if ((p == rel || p[-1] == '/') && (p[2] == '\0' || p[2] == '/'))
			return true;
	return false;
}

static int open_beneath(const char *dir, const char *rel)
{
	if (has_dotdot(rel)) {
		errno = EXDEV;
		return -1;
	}
	int dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return -1;
	struct open_how how = {
	    .flags = OPEN_FLAGS,
	    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = *rel ? (int)syscall(SYS_openat2, dirfd, rel, &how, sizeof(how)) : -1;
	if (!*rel)
		errno = EISDIR;
	if (fd < 0 && errno == ENOSYS)
		fd = sc_path_guard_walk(dirfd, rel);
	int e = errno;
	close(dirfd);
	errno = e;
	return fd;
}

/* Try path beneath dir, as configured and in its canonical form. -2: path is not beneath dir. */
static int try_dir(const char *dir, const char *path)
{
	const char *rel = beneath(dir, path);
	if (rel)
		return open_beneath(dir, rel);
	char real[PATH_MAX];
	if (realpath(dir, real) && (rel = beneath(real, path)) != NULL)
		return open_beneath(real, rel);
	return -2;
}

static bool same_file(const char *path, const struct stat *st)
{
	struct stat k;
	return path && path[0] && stat(path, &k) == 0 && k.st_dev == st->st_dev &&
	       k.st_ino == st->st_ino;
}

/* The sidecar's secrets: the signing keys, TLS private keys, the API token, NATS credentials.
 * Returns the flag that names the file, or NULL. */
static const char *secret_flag(const struct sc_config *cfg, const struct stat *st)
{
	const struct {
		const char *flag, *path;
	} secrets[] = {
		{"--key-file", cfg->key_file},
		{"--grpc-tls-key", cfg->grpc_tls_key},
		{"--grpc-token-file", cfg->grpc_token_file},
		{"--peer-tls-key", cfg->peer_tls_key},
		{"--nats-tls-key", cfg->nats_tls_key},
		{"--nats-creds", cfg->nats_creds},
		{"--nats-nkey-seed", cfg->nats_nkey_seed},
	};
	for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++)
		if (same_file(secrets[i].path, st))
			return secrets[i].flag;
	return NULL;
}

int sc_path_guard_open(const struct sc_config *cfg, const char *path, struct sc_err *err)
{
	char allowed[1024];
	allowed_list(cfg, allowed, sizeof(allowed));
	int fd = -2, e = 0;
	for (size_t i = 0; i <= cfg->n_register_dirs && fd < 0; i++) {
		const char *dir = i == 0 ? cfg->shm_dir : cfg->register_dirs[i - 1];
		int r = try_dir(dir, path);
		if (r == -2)
			continue;
		/* Keep the most telling failure: a real file error beats "not beneath". */
		if (r < 0 && (fd == -2 || errno != EXDEV))
			e = errno;
		fd = r;
	}
	if (fd == -2)
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "host_file.path %s is not beneath a directory the sidecar may "
				  "register from (%s): put the file there, or ask the operator to "
				  "add --register-dir",
				  path, allowed);
	if (fd < 0) {
		if (e == ENOENT)
			return sc_err_set(err, SC_NOT_FOUND, "host_file.path %s does not exist", path);
		if (e == EXDEV || e == ELOOP || e == ENOTDIR)
			return sc_err_set(err, SC_PERMISSION_DENIED,
					  "host_file.path %s is refused: it leads through a "
					  "symlink or \"..\" and may not leave the allowed "
					  "directories (%s); give the file's real path",
					  path, allowed);
		if (e == EISDIR || e == ENXIO || e == EOPNOTSUPP)
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "host_file.path %s is not a regular file", path);
		return sc_err_set(err, e == EACCES || e == EPERM ? SC_PERMISSION_DENIED
								 : SC_INTERNAL,
				  "cannot open %s read-write: %s (allowed directories: %s)", path,
				  strerror(e), allowed);
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return sc_err_set(err, SC_INVALID_ARGUMENT, "host_file.path %s is not a regular file",
				  path);
	}
	const char *secret = secret_flag(cfg, &st);
	if (secret) {
		close(fd);
		return sc_err_set(err, SC_PERMISSION_DENIED,
				  "host_file.path %s is the sidecar's %s: it may never be "
				  "registered (allowed: other regular files beneath %s)",
				  path, secret, allowed);
	}
	return fd;
}

int sc_path_guard_check_dirs(const struct sc_config *cfg, struct sc_err *err)
{
	for (size_t i = 0; i < cfg->n_register_dirs; i++) {
		struct stat st;
		errno = 0;
		if (stat(cfg->register_dirs[i], &st) != 0 || !S_ISDIR(st.st_mode))
			return sc_err_set(err, SC_INVALID_ARGUMENT,
					  "--register-dir %s is not a directory: %s",
					  cfg->register_dirs[i],
					  errno ? strerror(errno) : "not a directory");
	}
	return 0;
}
