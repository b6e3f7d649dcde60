/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_keys.c: the key file parser and loader, keyring refcounting and HMAC-SHA256
 * (sidecar/meta/keys.c). Key files are written at run time under $SC_TEST_TMP (or /tmp) from fresh
 * random bytes and removed afterwards; no key is committed. Single-threaded.
 */
#include "check.h"
#include "meta/keys.h"
#include "meta/metadata.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

/* Standard base64 with padding of n random bytes, into buf. */
static void random_key_b64(size_t n, char *buf, size_t cap)
{
	unsigned char raw[256];
	if (n > sizeof(raw) || (n + 2) / 3 * 4 + 1 > cap || sc_random_bytes(raw, n) != 0)
		abort();
	EVP_EncodeBlock((unsigned char *)buf, raw, (int)n);
}

static const char *tmp_dir(void)
{
	const char *d = getenv("SC_TEST_TMP");
	if (!d || !*d)
		d = "/tmp";
	mkdir(d, 0700);
	return d;
}

/* Write text to a fresh file with the given mode; path into buf. */
static void write_file(char *path, size_t cap, const char *tag, const char *text, mode_t mode)
{
	static int seq;
	snprintf(path, cap, "%s/test_keys.%d.%d.%s", tmp_dir(), (int)getpid(), seq++, tag);
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0) {
		perror(path);
		abort();
	}
	size_t len = strlen(text);
	if (write(fd, text, len) != (ssize_t)len)
		abort();
	close(fd);
	chmod(path, mode);
}

static int parse_str(const char *text, struct sc_keyring **ring, struct sc_err *err)
{
	return sc_keyring_parse(text, strlen(text), ring, err);
}

TEST(parse_two_keys_comments_blank_crlf)
{
	char k1[256], k2[256], text[600];
	random_key_b64(32, k1, sizeof(k1));
	random_key_b64(48, k2, sizeof(k2));
	snprintf(text, sizeof(text), "# cluster keys\r\n\n  \t\nk1:%s\r\n# old\nold-key.2: %s  \n",
		 k1, k2);
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(parse_str(text, &ring, &err), 0);
	CHECK_INT_EQ(sc_keyring_count(ring), 2);
	CHECK_STR_EQ(sc_keyring_signing_id(ring), "k1");
	uint8_t mac[SC_HMAC_LEN];
	const void *parts[] = {"x"};
	size_t lens[] = {1};
	CHECK(sc_keyring_hmac(ring, "old-key.2", parts, lens, 1, mac));
	CHECK(!sc_keyring_hmac(ring, "k3", parts, lens, 1, mac));
	sc_keyring_release(ring);
}

TEST(hmac_known_vector)
{
	/* HMAC-SHA256 with key 0x0b * 32; expected values from Python's hmac module. */
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(parse_str("k1:CwsLCwsLCwsLCwsLCwsLCwsLCwsLCwsLCwsLCwsLCws=\n", &ring, &err),
		     0);
	static const uint8_t want_hi[SC_HMAC_LEN] = {
	    0x19, 0x8a, 0x60, 0x7e, 0xb4, 0x4b, 0xfb, 0xc6, 0x99, 0x03, 0xa0,
	    0xf1, 0xcf, 0x2b, 0xbd, 0xc5, 0xba, 0x0a, 0xa3, 0xf3, 0xd9, 0xae,
	    0x3c, 0x1c, 0x7a, 0x3b, 0x16, 0x96, 0xa0, 0xb6, 0x8c, 0xf7};
	static const uint8_t want_dom[SC_HMAC_LEN] = {
	    0x18, 0xf2, 0x1d, 0xcd, 0x69, 0x84, 0xff, 0x57, 0x34, 0x1e, 0x1b,
	    0x26, 0x0b, 0x92, 0x78, 0x2b, 0x88, 0xde, 0xfd, 0xe7, 0x17, 0x62,
	    0x9f, 0x52, 0x2e, 0xbb, 0xf1, 0xdc, 0xb6, 0x43, 0x94, 0x62};
	uint8_t mac[SC_HMAC_LEN];
	const void *p1[] = {"Hi There"};
	size_t l1[] = {8};
	CHECK(sc_keyring_hmac(ring, "k1", p1, l1, 1, mac));
	CHECK(memcmp(mac, want_hi, SC_HMAC_LEN) == 0);
	/* Same bytes split differently, with an empty part, give the same MAC. */
	const void *p2[] = {"Hi", "", " The", "re"};
	size_t l2[] = {2, 0, 4, 2};
	CHECK(sc_keyring_hmac(ring, "k1", p2, l2, 4, mac));
	CHECK(memcmp(mac, want_hi, SC_HMAC_LEN) == 0);
	/* The metadata domain separation: "rsm1" 0 key_id 0 payload. */
	const void *p3[] = {"rsm1", "", "k1", "", "payload"};
	size_t l3[] = {4, 1, 2, 1, 7};
	CHECK(sc_keyring_hmac(ring, "k1", p3, l3, 5, mac));
	CHECK(memcmp(mac, want_dom, SC_HMAC_LEN) == 0);
	sc_keyring_release(ring);
}

TEST(hmac_matches_openssl_oneshot_all_key_sizes)
{
	for (size_t n = SC_KEY_MIN_BYTES; n <= SC_KEY_MAX_BYTES; n += 16) {
		unsigned char raw[SC_KEY_MAX_BYTES];
		char b64[256], text[320];
		CHECK_INT_EQ(sc_random_bytes(raw, n), 0);
		EVP_EncodeBlock((unsigned char *)b64, raw, (int)n);
		snprintf(text, sizeof(text), "a:%s\n", b64);
		struct sc_keyring *ring = NULL;
		struct sc_err err = {0};
		CHECK_INT_EQ(parse_str(text, &ring, &err), 0);
		uint8_t mac[SC_HMAC_LEN], want[SC_HMAC_LEN];
		unsigned int want_len = 0;
		const void *p[] = {"abc"};
		size_t l[] = {3};
		CHECK(sc_keyring_hmac(ring, "a", p, l, 1, mac));
		CHECK(HMAC(EVP_sha256(), raw, (int)n, (const unsigned char *)"abc", 3, want,
			   &want_len) != NULL);
		CHECK(memcmp(mac, want, SC_HMAC_LEN) == 0);
		sc_keyring_release(ring);
	}
}

TEST(refcount_retain_release)
{
	char k[64], text[128];
	random_key_b64(32, k, sizeof(k));
	snprintf(text, sizeof(text), "k:%s", k); /* no trailing newline */
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(parse_str(text, &ring, &err), 0);
	CHECK(sc_keyring_retain(ring) == ring);
	sc_keyring_release(ring);
	CHECK_STR_EQ(sc_keyring_signing_id(ring), "k"); /* still alive: one reference left */
	sc_keyring_release(ring);
	sc_keyring_release(NULL);
	CHECK(sc_keyring_retain(NULL) == NULL);
	CHECK(sc_keyring_signing_id(NULL) == NULL);
	CHECK_INT_EQ(sc_keyring_count(NULL), 0);
}

/* Expect parse of text to fail with code, the message containing `want`, and no key text. */
static int expect_parse_error(const char *text, enum sc_status code, const char *want,
			      const char *secret)
{
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	int rc = parse_str(text, &ring, &err);
	if (rc == 0 || ring) {
		fprintf(stderr, "  parse unexpectedly succeeded for a bad key text\n");
		sc_keyring_release(ring);
		return -1;
	}
	if (err.code != code || !strstr(err.msg, want)) {
		fprintf(stderr, "  got %s \"%s\", want %s containing \"%s\"\n",
			sc_status_name(err.code), err.msg, sc_status_name(code), want);
		return -1;
	}
	if (secret && *secret && strstr(err.msg, secret)) {
		fprintf(stderr, "  message leaks key text: \"%s\"\n", err.msg);
		return -1;
	}
	return 0;
}

TEST(errors_short_long_duplicate)
{
	char k31[64], k32[64], k129[256], text[600];
	random_key_b64(31, k31, sizeof(k31));
	random_key_b64(32, k32, sizeof(k32));
	random_key_b64(129, k129, sizeof(k129));
	snprintf(text, sizeof(text), "# c\nk1:%s\nk2:%s\n", k32, k31);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "key text:3", k31), 0);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "31 bytes", k31), 0);
	snprintf(text, sizeof(text), "k1:%s\n", k129);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "129 bytes", k129), 0);
	snprintf(text, sizeof(text), "k1:%s\n\nk1:%s\n", k32, k32);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "key text:3", k32), 0);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "duplicate key id 'k1'", k32),
		     0);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "line 1", k32), 0);
}

TEST(errors_bad_base64_and_ids)
{
	char k[64], text[600];
	random_key_b64(32, k, sizeof(k));
	/* Bad character, missing padding, wrapped key, '=' inside. */
	char bad[64];
	snprintf(bad, sizeof(bad), "%s", k);
	bad[5] = '*';
	snprintf(text, sizeof(text), "k1:%s\n", bad);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "base64", bad), 0);
	snprintf(bad, sizeof(bad), "%s", k);
	bad[strlen(bad) - 1] = '\0'; /* drop the '=' */
	snprintf(text, sizeof(text), "k1:%s\n", bad);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "key text:1", bad), 0);
	snprintf(text, sizeof(text), "k1:%.20s\n%s\n", k, k + 20);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "key text:1", k + 20), 0);
	snprintf(text, sizeof(text), "k1:%.20s %s\n", k, k + 20);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "base64", k + 20), 0);
	snprintf(text, sizeof(text), "k1:=%s\n", k + 1);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "base64", k + 1), 0);
	/* No colon: the line might be a bare key, so it must not be echoed. */
	snprintf(text, sizeof(text), "%s\n", k);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "no ':'", k), 0);
	snprintf(text, sizeof(text), ":%s\n", k);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "empty key id", k), 0);
	snprintf(text, sizeof(text), "bad id:%s\n", k);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "[A-Za-z0-9._-]", k), 0);
	snprintf(text, sizeof(text), "k/1:%s\n", k);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "position 2", k), 0);
	char id64[65];
	memset(id64, 'a', 64);
	id64[64] = '\0';
	snprintf(text, sizeof(text), "%s:%s\n", id64, k);
	CHECK_INT_EQ(expect_parse_error(text, SC_INVALID_ARGUMENT, "at most 63", k), 0);
	id64[63] = '\0'; /* 63 characters is fine */
	snprintf(text, sizeof(text), "%s:%s\n", id64, k);
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(parse_str(text, &ring, &err), 0);
	CHECK_STR_EQ(sc_keyring_signing_id(ring), id64);
	sc_keyring_release(ring);
}

TEST(errors_empty_and_nul)
{
	CHECK_INT_EQ(expect_parse_error("", SC_INVALID_ARGUMENT, "no keys", NULL), 0);
	CHECK_INT_EQ(
	    expect_parse_error("# only a comment\n\n", SC_INVALID_ARGUMENT, "no keys", NULL), 0);
	char k[64], text[128];
	random_key_b64(32, k, sizeof(k));
	int n = snprintf(text, sizeof(text), "k1:%s\n", k);
	text[4] = '\0';
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_keyring_parse(text, (size_t)n, &ring, &err), -1);
	CHECK(ring == NULL);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "NUL");
}

TEST(load_file_ok_0600_and_0400)
{
	char k1[256], k2[256], text[600], path[512];
	random_key_b64(32, k1, sizeof(k1));
	random_key_b64(64, k2, sizeof(k2));
	snprintf(text, sizeof(text), "new:%s\nold:%s\n", k1, k2);
	mode_t modes[] = {0600, 0400};
	for (size_t i = 0; i < 2; i++) {
		write_file(path, sizeof(path), "ok", text, modes[i]);
		struct sc_keyring *ring = NULL;
		struct sc_err err = {0};
		int rc = sc_keyring_load(path, &ring, &err);
		unlink(path);
		if (rc != 0)
			CHECK_FAIL_("load: %s %s", sc_status_name(err.code), err.msg);
		CHECK_INT_EQ(sc_keyring_count(ring), 2);
		CHECK_STR_EQ(sc_keyring_signing_id(ring), "new");
		sc_keyring_release(ring);
	}
}

TEST(load_refuses_group_other_modes)
{
	char k[64], text[128], path[512];
	random_key_b64(32, k, sizeof(k));
	snprintf(text, sizeof(text), "k1:%s\n", k);
	mode_t modes[] = {0644, 0640, 0604, 0601, 0610};
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		write_file(path, sizeof(path), "mode", text, modes[i]);
		struct sc_keyring *ring = NULL;
		struct sc_err err = {0};
		int rc = sc_keyring_load(path, &ring, &err);
		unlink(path);
		CHECK_INT_EQ(rc, -1);
		CHECK(ring == NULL);
		CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
		char want[600];
		snprintf(want, sizeof(want), "chmod 600 %s", path);
		CHECK_STR_CONTAINS(err.msg, want);
		CHECK(!strstr(err.msg, k));
	}
}

/* A Kubernetes Secret with fsGroup is root-owned and 0440/0640: a non-root sidecar accepts that
 * (group read only), still refuses others' read, and holds its own files to 0600. Needs root to
 * create the files and a child that drops to another uid; skipped otherwise. */
static int load_as(uid_t uid, const char *path)
{
	pid_t pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)
			_exit(3);
		struct sc_keyring *ring = NULL;
		struct sc_err err = {0};
		int rc = sc_keyring_load(path, &ring, &err);
		sc_keyring_release(ring);
		if (rc != 0)
			fprintf(stderr, "  (child uid %d) %s\n", (int)uid, err.msg);
		_exit(rc == 0 ? 0 : err.code == SC_FAILED_PRECONDITION ? 1 : 2);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 9;
}

TEST(load_root_owned_group_readable_for_non_root)
{
	if (geteuid() != 0) {
		fprintf(stderr, "  (not root: skipped)\n");
		return;
	}
	const uid_t uid = 65532;
	char dir[] = "/tmp/sc-keys-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	chmod(dir, 0755);
	char k[64], text[128], path[600];
	random_key_b64(32, k, sizeof(k));
	snprintf(text, sizeof(text), "k1:%s\n", k);
	snprintf(path, sizeof(path), "%s/keys", dir);
	struct {
		uid_t owner;
		mode_t mode;
		int want; /* child exit: 0 loaded, 1 refused (FAILED_PRECONDITION) */
	} cases[] = {
		{0, 0640, 0},   /* Secret with fsGroup */
		{0, 0440, 0},   /* the same, read-only */
		{0, 0644, 1},   /* others may read: refused */
		{uid, 0640, 1}, /* the daemon's own file must be 0600 */
		{uid, 0600, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		CHECK(fd >= 0);
		CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
		close(fd);
		CHECK(chown(path, cases[i].owner, uid) == 0);
		CHECK(chmod(path, cases[i].mode) == 0);
		int got = load_as(uid, path);
		if (got != cases[i].want)
			fprintf(stderr, "  case owner %d mode %04o\n", (int)cases[i].owner,
				(unsigned)cases[i].mode);
		CHECK_INT_EQ(got, cases[i].want);
	}
	unlink(path);
	rmdir(dir);
}

TEST(load_missing_file_and_directory)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/test_keys.%d.does-not-exist", tmp_dir(), (int)getpid());
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	CHECK_INT_EQ(sc_keyring_load(path, &ring, &err), -1);
	CHECK(ring == NULL);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, path);
	CHECK_STR_CONTAINS(err.msg, "No such file");

	snprintf(path, sizeof(path), "%s/test_keys.%d.dir", tmp_dir(), (int)getpid());
	mkdir(path, 0700);
	CHECK_INT_EQ(sc_keyring_load(path, &ring, &err), -1);
	rmdir(path);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "not a regular file");

	CHECK_INT_EQ(sc_keyring_load("", &ring, &err), -1);
	CHECK(ring == NULL);
}

TEST(load_file_errors_name_path_and_line)
{
	char k[64], short_key[64], text[256], path[512];
	random_key_b64(32, k, sizeof(k));
	random_key_b64(16, short_key, sizeof(short_key));
	snprintf(text, sizeof(text), "# keys\nk1:%s\nk2:%s\n", k, short_key);
	write_file(path, sizeof(path), "short", text, 0600);
	struct sc_keyring *ring = NULL;
	struct sc_err err = {0};
	int rc = sc_keyring_load(path, &ring, &err);
	unlink(path);
	CHECK_INT_EQ(rc, -1);
	CHECK(ring == NULL);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	char want[600];
	snprintf(want, sizeof(want), "%s:3:", path);
	CHECK_STR_CONTAINS(err.msg, want);
	CHECK(!strstr(err.msg, short_key));
	CHECK(!strstr(err.msg, k));

	write_file(path, sizeof(path), "empty", "", 0600);
	rc = sc_keyring_load(path, &ring, &err);
	unlink(path);
	CHECK_INT_EQ(rc, -1);
	CHECK_INT_EQ(err.code, SC_INVALID_ARGUMENT);
	CHECK_STR_CONTAINS(err.msg, "no keys");
	CHECK_STR_CONTAINS(err.msg, path);
}

TEST(key_id_valid)
{
	CHECK(sc_key_id_valid("k1", 2));
	CHECK(sc_key_id_valid("A.b_c-9", 7));
	CHECK(sc_key_id_valid("k1:xyz", 2)); /* only the first len characters count */
	CHECK(!sc_key_id_valid("", 0));
	CHECK(!sc_key_id_valid(NULL, 0));
	CHECK(!sc_key_id_valid("k 1", 3));
	CHECK(!sc_key_id_valid("k:1", 3));
	CHECK(!sc_key_id_valid("k\xc3\xa9", 3));
	char id[SC_KEY_ID_MAX + 1];
	memset(id, 'a', sizeof(id));
	CHECK(sc_key_id_valid(id, SC_KEY_ID_MAX - 1));
	CHECK(!sc_key_id_valid(id, SC_KEY_ID_MAX));
}

RUN_TESTS(T(key_id_valid), T(parse_two_keys_comments_blank_crlf), T(hmac_known_vector),
	  T(hmac_matches_openssl_oneshot_all_key_sizes), T(refcount_retain_release),
	  T(errors_short_long_duplicate), T(errors_bad_base64_and_ids), T(errors_empty_and_nul),
	  T(load_file_ok_0600_and_0400), T(load_refuses_group_other_modes),
	  T(load_root_owned_group_readable_for_non_root),
	  T(load_missing_file_and_directory), T(load_file_errors_name_path_and_line))
