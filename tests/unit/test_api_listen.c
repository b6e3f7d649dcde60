/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_api_listen.c: the API listener policy (sidecar/net/api_listen.c): loopback detection, refusal
 * of an unauthenticated non-loopback TCP listener, the unix socket directory checks, refusal of a
 * socket a live server answers on, removal of a stale one, the explicit socket mode, and the
 * bearer token store (load, reject, compare, reload). Single-threaded; files and sockets under
 * $SC_TEST_TMP (or /tmp).
 */
#include "net/api_listen.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char base[256];

static void make_base(void)
{
	if (base[0])
		return;
	const char *d = getenv("SC_TEST_TMP");
	if (!d || !*d)
		d = "/tmp";
	mkdir(d, 0700);
	snprintf(base, sizeof(base), "%s/api_listen.%d", d, (int)getpid());
	mkdir(base, 0700);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0);
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	CHECK(chmod(path, mode) == 0);
}

TEST(loopback)
{
	CHECK(sc_addr_is_loopback("127.0.0.1:50051"));
	CHECK(sc_addr_is_loopback("127.1.2.3:0"));
	CHECK(sc_addr_is_loopback("localhost:1"));
	CHECK(sc_addr_is_loopback("[::1]:1"));
	CHECK(!sc_addr_is_loopback("0.0.0.0:50051"));
	CHECK(!sc_addr_is_loopback("[::]:1"));
	CHECK(!sc_addr_is_loopback("10.0.0.1:1"));
	CHECK(!sc_addr_is_loopback("127example.com:1"));
	CHECK(!sc_addr_is_loopback("unix:/tmp/x"));
}

TEST(policy)
{
	struct sc_config c;
	memset(&c, 0, sizeof(c));
	struct sc_err e;
	char *a[] = {"unix:/tmp/x.sock", "127.0.0.1:1", "0.0.0.0:50051"};
	c.grpc_listen[0] = a[0];
	c.grpc_listen[1] = a[1];
	c.n_grpc_listen = 2;
	sc_err_clear(&e);
	CHECK_INT_EQ(sc_api_listen_check(&c, &e), 0); /* loopback: a WARN only */
	c.grpc_listen[2] = a[2];
	c.n_grpc_listen = 3;
	CHECK_INT_EQ(sc_api_listen_check(&c, &e), -1);
	CHECK_INT_EQ(e.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(e.msg, "--grpc-listen 0.0.0.0:50051 would serve the whole API");
	CHECK_STR_CONTAINS(e.msg, "--grpc-token-file");
	char tok[] = "/t";
	c.grpc_token_file = tok;
	CHECK_INT_EQ(sc_api_listen_check(&c, &e), 0);
	c.grpc_token_file = NULL;
	char ca[] = "/ca";
	c.grpc_tls_client_ca = ca;
	CHECK_INT_EQ(sc_api_listen_check(&c, &e), 0);
}

TEST(unix_dir_checks)
{
	make_base();
	struct sc_err e;
	char dir[300], path[400];
	/* Created when missing, 0750 whatever the umask. */
	snprintf(dir, sizeof(dir), "%s/new/sub", base);
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	mode_t old = umask(0);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), 0);
	umask(old);
	struct stat st;
	CHECK(stat(dir, &st) == 0);
	CHECK_INT_EQ(st.st_mode & 07777, 0750);
	/* Group- or world-writable: refused. */
	CHECK(chmod(dir, 0770) == 0);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "is group- or world-writable (mode 0770)");
	CHECK(chmod(dir, 0757) == 0);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), -1);
	CHECK(chmod(dir, 0700) == 0);
	/* Not a socket: refused, left alone. */
	write_file(path, "x", 0600);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "exists and is not a socket");
	unlink(path);
	/* A listening socket: refused; once closed (stale): removed. */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(fd, 4) == 0);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "another server (a running rdma-sidecar?) is answering");
	CHECK(access(path, F_OK) == 0);
	close(fd);
	CHECK_INT_EQ(sc_unix_socket_prepare(path, &e), 0);
	CHECK(access(path, F_OK) != 0 && errno == ENOENT);
	/* Mode set explicitly. */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	old = umask(077);
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	umask(old);
	CHECK_INT_EQ(sc_unix_socket_set_mode(path, 0660, &e), 0);
	CHECK(stat(path, &st) == 0);
	CHECK_INT_EQ(st.st_mode & 07777, 0660);
	close(fd);
	unlink(path);
	rmdir(dir);
	snprintf(dir, sizeof(dir), "%s/new", base);
	rmdir(dir);
}

TEST(token_store)
{
	make_base();
	struct sc_err e;
	char path[300];
	snprintf(path, sizeof(path), "%s/token", base);
	struct sc_token_store *ts = NULL;
	write_file(path, "short\n", 0600);
	CHECK_INT_EQ(sc_token_store_create(path, &ts, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "token shorter than 16 characters");
	write_file(path, "0123456789abcdef0123\n", 0604);
	CHECK_INT_EQ(sc_token_store_create(path, &ts, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "readable or writable by every user");
	write_file(path, "0123456789abcdef0123\n", 0600);
	CHECK_INT_EQ(sc_token_store_create(path, &ts, &e), 0);
	const char *good = "Bearer 0123456789abcdef0123";
	CHECK(sc_token_check(ts, good, strlen(good)));
	CHECK(!sc_token_check(ts, good, strlen(good) - 1));
	CHECK(!sc_token_check(ts, "Bearer 0123456789abcdef0124", strlen(good)));
	CHECK(!sc_token_check(ts, "0123456789abcdef0123", 20));
	CHECK(!sc_token_check(ts, NULL, 0));
	/* Reload: the new token counts, the old no longer; a bad file keeps the current one. */
	write_file(path, "fedcba9876543210fedc", 0600);
	CHECK_INT_EQ(sc_token_store_reload(ts, &e), 0);
	CHECK(!sc_token_check(ts, good, strlen(good)));
	const char *good2 = "Bearer fedcba9876543210fedc";
	CHECK(sc_token_check(ts, good2, strlen(good2)));
	write_file(path, "bad token with spaces", 0600);
	CHECK_INT_EQ(sc_token_store_reload(ts, &e), -1);
	CHECK(sc_token_check(ts, good2, strlen(good2)));
	sc_token_store_destroy(ts);
	unlink(path);
	/* A FIFO is not a token file (and must not block). */
	CHECK(mkfifo(path, 0600) == 0);
	CHECK_INT_EQ(sc_token_store_create(path, &ts, &e), -1);
	CHECK_STR_CONTAINS(e.msg, "not a regular file");
	unlink(path);
}

RUN_TESTS(T(loopback), T(policy), T(unix_dir_checks), T(token_store))
