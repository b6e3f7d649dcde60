/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_path_guard.c: which files RegisterRegion may open (sidecar/os/path_guard.c), through openat2
 * and through the component walk used where openat2 is missing. A fresh tree under $SC_TEST_TMP
 * (or /tmp): allowed/ (the shm dir) with a file, a subdirectory, symlinks out and in, a FIFO and
 * the key file; outside/ with a secret. Removed afterwards. Single-threaded.
 */
#include "check.h"
#include "conf/config.h"
#include "os/path_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256], allowed[300], outside[300];

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		CHECK_FAIL_("cannot create %s: %s", path, strerror(errno));
	fputs(text, f);
	fclose(f);
	chmod(path, 0600);
}

static void make_tree(void)
{
	const char *tmp = getenv("SC_TEST_TMP");
	mkdir(tmp ? tmp : "/tmp", 0755);
	snprintf(root, sizeof(root), "%s/pg-XXXXXX", tmp ? tmp : "/tmp");
	CHECK(mkdtemp(root) != NULL);
	snprintf(allowed, sizeof(allowed), "%s/allowed", root);
	snprintf(outside, sizeof(outside), "%s/outside", root);
	CHECK_INT_EQ(mkdir(allowed, 0700), 0);
	CHECK_INT_EQ(mkdir(outside, 0700), 0);
	char p[600], q[600];
	snprintf(p, sizeof(p), "%s/secret", outside);
	put(p, "secret");
	snprintf(p, sizeof(p), "%s/ok", allowed);
	put(p, "fine");
	snprintf(p, sizeof(p), "%s/sub", allowed);
	CHECK_INT_EQ(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/sub/deep", allowed);
	put(p, "deep");
	snprintf(p, sizeof(p), "%s/keys", allowed);
	put(p, "k1:AAAA\n");
	snprintf(p, sizeof(p), "%s/fifo", allowed);
	CHECK_INT_EQ(mkfifo(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/linkdir", allowed);
	CHECK_INT_EQ(symlink(outside, p), 0);
	snprintf(p, sizeof(p), "%s/linkfile", allowed);
	snprintf(q, sizeof(q), "%s/secret", outside);
	CHECK_INT_EQ(symlink(q, p), 0);
	snprintf(p, sizeof(p), "%s/alias", allowed);
	CHECK_INT_EQ(symlink("ok", p), 0);
}

static void remove_tree(void)
{
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	CHECK_INT_EQ(system(cmd), 0);
}

/* Open rel beneath allowed through the guard; expect code (SC_OK = opened). */
static void expect(const struct sc_config *cfg, const char *rel, enum sc_status code,
		   const char *needle)
{
	char path[700];
	struct sc_err err;
	sc_err_clear(&err);
	snprintf(path, sizeof(path), "%s/%s", allowed, rel);
	int fd = sc_path_guard_open(cfg, path, &err);
	if (code == SC_OK) {
		if (fd < 0)
			CHECK_FAIL_("%s refused: %s", rel, err.msg);
		close(fd);
		return;
	}
	if (fd >= 0) {
		close(fd);
		CHECK_FAIL_("%s was opened, expected code %d", rel, (int)code);
	}
	CHECK_INT_EQ(err.code, code);
	CHECK_STR_CONTAINS(err.msg, needle);
}

TEST(guard_open)
{
	make_tree();
	char keys[400];
	snprintf(keys, sizeof(keys), "%s/keys", allowed);
	struct sc_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.shm_dir = allowed;
	cfg.key_file = keys;
	expect(&cfg, "ok", SC_OK, NULL);
	expect(&cfg, "sub/deep", SC_OK, NULL);
	expect(&cfg, "./sub//deep", SC_OK, NULL);
	expect(&cfg, "sub/../ok", SC_PERMISSION_DENIED, "symlink or \"..\"");
	expect(&cfg, "../outside/secret", SC_PERMISSION_DENIED, "symlink or \"..\"");
	expect(&cfg, "linkdir/secret", SC_PERMISSION_DENIED, "symlink");
	expect(&cfg, "linkfile", SC_PERMISSION_DENIED, "symlink");
	expect(&cfg, "alias", SC_PERMISSION_DENIED, "symlink");
	expect(&cfg, "keys", SC_PERMISSION_DENIED, "--key-file");
	expect(&cfg, "fifo", SC_INVALID_ARGUMENT, "not a regular file");
	expect(&cfg, "sub", SC_INVALID_ARGUMENT, "not a regular file");
	expect(&cfg, "missing", SC_NOT_FOUND, "does not exist");

	struct sc_err err;
	char p[700];
	snprintf(p, sizeof(p), "%s/secret", outside);
	CHECK_INT_EQ(sc_path_guard_open(&cfg, p, &err), -1);
	CHECK_INT_EQ(err.code, SC_PERMISSION_DENIED);
	CHECK_STR_CONTAINS(err.msg, "not beneath");
	CHECK_STR_CONTAINS(err.msg, allowed);
	/* A prefix that is not a whole component does not count. */
	snprintf(p, sizeof(p), "%sX/ok", allowed);
	CHECK_INT_EQ(sc_path_guard_open(&cfg, p, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "not beneath");

	/* --register-dir opens outside/ as well. */
	cfg.register_dirs[0] = outside;
	cfg.n_register_dirs = 1;
	snprintf(p, sizeof(p), "%s/secret", outside);
	int fd = sc_path_guard_open(&cfg, p, &err);
	CHECK(fd >= 0);
	close(fd);
	CHECK_INT_EQ(sc_path_guard_check_dirs(&cfg, &err), 0);
	snprintf(p, sizeof(p), "%s/nope", root);
	cfg.register_dirs[0] = p;
	CHECK_INT_EQ(sc_path_guard_check_dirs(&cfg, &err), -1);
	CHECK_STR_CONTAINS(err.msg, "--register-dir");
	remove_tree();
}

/* The ENOSYS fallback refuses the same things, by errno. */
TEST(walk_fallback)
{
	make_tree();
	int dirfd = open(allowed, O_PATH | O_DIRECTORY | O_CLOEXEC);
	CHECK(dirfd >= 0);
	int fd = sc_path_guard_walk(dirfd, "ok");
	CHECK(fd >= 0);
	close(fd);
	fd = sc_path_guard_walk(dirfd, "./sub//deep");
	CHECK(fd >= 0);
	close(fd);
	CHECK_INT_EQ(sc_path_guard_walk(dirfd, "../outside/secret"), -1);
	CHECK_INT_EQ(errno, EXDEV);
	CHECK_INT_EQ(sc_path_guard_walk(dirfd, "sub/../ok"), -1);
	CHECK_INT_EQ(errno, EXDEV);
	CHECK_INT_EQ(sc_path_guard_walk(dirfd, "linkdir/secret"), -1);
	CHECK_INT_EQ(errno, ELOOP);
	CHECK_INT_EQ(sc_path_guard_walk(dirfd, "linkfile"), -1);
	CHECK_INT_EQ(errno, ELOOP);
	CHECK_INT_EQ(sc_path_guard_walk(dirfd, "sub"), -1);
	CHECK_INT_EQ(errno, EISDIR);
	close(dirfd);
	remove_tree();
}

RUN_TESTS(T(guard_open), T(walk_fallback))
