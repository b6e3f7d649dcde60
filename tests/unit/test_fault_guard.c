/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for the fault guard (sidecar/os/fault_guard.c) and the peer channel's I/O over region
 * memory that lost its backing (sidecar/peer/proto.c): a MAP_SHARED file mapping whose file the
 * test truncates, as a worker would. Copies, probes, read-ahead and socket I/O fail with
 * FAILED_PRECONDITION naming the watched region instead of raising SIGBUS, on the same thread
 * again and again.
 */
#include "check.h"

#include "os/fault_guard.h"
#include "peer/proto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 4

struct mapping {
	uint8_t *p;
	size_t len;
};

/* PAGES pages of a temporary file, mapped shared, then the file cut to `keep` bytes. */
static int map_truncated(struct mapping *m, size_t keep)
{
	char path[] = "/tmp/sc-fault-guard-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	unlink(path);
	m->len = PAGES * PAGE;
	if (ftruncate(fd, (off_t)m->len) != 0) {
		close(fd);
		return -1;
	}
	m->p = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m->p == MAP_FAILED) {
		close(fd);
		return -1;
	}
	memset(m->p, 0xab, m->len);
	int rc = ftruncate(fd, (off_t)keep);
	close(fd);
	return rc;
}

static void unmap(struct mapping *m)
{
	sc_fault_guard_unwatch(m->p);
	munmap(m->p, m->len);
}

TEST(copies_fail_and_name_the_region)
{
	struct sc_err err;
	sc_err_clear(&err);
	CHECK_INT_EQ(sc_fault_guard_install(&err), 0);
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, PAGE), 0);
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-unit"), 0);
	uint8_t buf[2 * PAGE];
	/* Inside what is left: fine. */
	CHECK_INT_EQ(sc_guarded_memcpy(buf, m.p, PAGE, &err), 0);
	CHECK_INT_EQ(buf[PAGE - 1], 0xab);
	/* Reading and writing the lost pages, several times on this thread (the guard re-arms). */
	for (int i = 0; i < 3; i++) {
		sc_err_clear(&err);
		CHECK_INT_EQ(sc_guarded_memcpy(buf, m.p + PAGE / 2, sizeof(buf), &err), -1);
		CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
		CHECK_STR_CONTAINS(err.msg, "region \"rgn-unit\" was truncated by its owner");
		CHECK_STR_CONTAINS(err.msg, " of 16384 is no longer backed");
		CHECK_STR_CONTAINS(err.msg, "no longer backed (file truncated?)");
		CHECK_STR_CONTAINS(err.msg, "the copy stopped");
		sc_err_clear(&err);
		CHECK_INT_EQ(sc_guarded_memcpy(m.p + 3 * PAGE, buf, PAGE, &err), -1);
		CHECK_STR_CONTAINS(err.msg, "region \"rgn-unit\"");
	}
	unmap(&m);
}

TEST(unwatched_memory_says_so_without_a_name)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, 0), 0);
	uint8_t b;
	CHECK_INT_EQ(sc_guarded_memcpy(&b, m.p, 1, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "region memory is no longer backed (file truncated?)");
	CHECK(strstr(err.msg, "rgn-") == NULL);
	/* Watched, then unwatched: no name either. */
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-gone"), 0);
	sc_fault_guard_unwatch(m.p);
	CHECK_INT_EQ(sc_guarded_memcpy(&b, m.p, 1, &err), -1);
	CHECK(strstr(err.msg, "rgn-gone") == NULL);
	munmap(m.p, m.len);
}

TEST(probe_checks_the_range_in_two_loads)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, 2 * PAGE), 0);
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-probe"), 0);
	CHECK_INT_EQ(sc_fault_guard_probe(m.p, 2 * PAGE, &err), 0);
	CHECK_INT_EQ(sc_fault_guard_probe(m.p + PAGE, 1, &err), 0);
	CHECK_INT_EQ(sc_fault_guard_probe(m.p + 3 * PAGE, 0, &err), 0); /* nothing to touch */
	CHECK_INT_EQ(sc_fault_guard_probe(m.p, 2 * PAGE + 1, &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-probe\" was truncated by its owner");
	CHECK_STR_CONTAINS(err.msg, "at offset 8192");
	CHECK_STR_CONTAINS(err.msg, "the request stopped");
	unmap(&m);
}

TEST(a_fault_without_err_stays_noted)
{
	struct sc_err err;
	sc_err_clear(&err);
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, 0), 0);
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-noted"), 0);
	uint8_t b[16];
	CHECK_INT_EQ(sc_guarded_memcpy(b, m.p + 5, sizeof(b), NULL), -1);
	sc_fault_guard_error(&err, "the test");
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-noted\"");
	CHECK_STR_CONTAINS(err.msg, "the test stopped");
	/* Reported once: the note is gone after. */
	sc_fault_guard_error(&err, "the test");
	CHECK(strstr(err.msg, "rgn-noted") == NULL);
	/* An I/O layer's own note (EFAULT from a system call). */
	sc_fault_guard_note(m.p + PAGE);
	sc_fault_guard_error(&err, "x");
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-noted\" was truncated by its owner: its memory "
				    "at offset 4096");
	unmap(&m);
}

TEST(many_watched_ranges)
{
	static uint8_t mem[300][64];
	for (int i = 0; i < 300; i++) {
		char id[32];
		snprintf(id, sizeof(id), "rgn-%03d", i);
		CHECK_INT_EQ(sc_fault_guard_watch(mem[i], sizeof(mem[i]), id), 0);
	}
	struct sc_err err;
	for (int i = 0; i < 300; i += 37) {
		char want[64];
		snprintf(want, sizeof(want), "region \"rgn-%03d\"", i);
		sc_fault_guard_note(&mem[i][10]);
		sc_fault_guard_error(&err, "x");
		CHECK_STR_CONTAINS(err.msg, want);
		CHECK_STR_CONTAINS(err.msg, "at offset 10 of 64");
	}
	for (int i = 0; i < 300; i++)
		sc_fault_guard_unwatch(mem[i]);
	sc_fault_guard_note(&mem[5][0]);
	sc_fault_guard_error(&err, "x");
	CHECK(strstr(err.msg, "rgn-") == NULL);
}

static const struct sc_peer_wait quick = {.deadline_mono_ms = 0};

/* Item 5 of issue 32: the read-ahead copied a small WRITE's bytes into region memory unguarded. */
TEST(read_ahead_into_truncated_memory)
{
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, PAGE), 0);
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-rb"), 0);
	int sv[2];
	CHECK_INT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	uint8_t bytes[3 * PAGE], rx[4 * PAGE];
	memset(bytes, 7, sizeof(bytes));
	CHECK_INT_EQ(write(sv[1], bytes, sizeof(bytes)), (long long)sizeof(bytes));
	struct sc_peer_rxbuf rb = {.p = rx, .cap = sizeof(rx)};
	CHECK(sc_peer_rxbuf_fill_nowait(sv[0], &rb) > 0);
	/* Into what is left: fine. */
	CHECK_INT_EQ(sc_peer_rxbuf_take(&rb, m.p, 100), 100);
	/* Across the end of the file: EFAULT, as recv would say, and no SIGBUS. */
	errno = 0;
	CHECK_INT_EQ(sc_peer_rxbuf_take(&rb, m.p + PAGE - 100, 2 * PAGE), -1);
	CHECK_INT_EQ(errno, EFAULT);
	struct sc_err err;
	sc_err_clear(&err);
	CHECK_INT_EQ(sc_peer_io_err(SC_PEER_IO_ERRNO, EFAULT, "peer sidecar t", &err), -1);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-rb\" was truncated by its owner");
	CHECK_STR_CONTAINS(err.msg, "moving bytes with peer sidecar t stopped");

	/* The same through sc_peer_recv_rb and sc_peer_recvv_rb. */
	CHECK_INT_EQ(write(sv[1], bytes, PAGE), PAGE);
	rb.off = rb.len = 0;
	CHECK(sc_peer_rxbuf_fill_nowait(sv[0], &rb) > 0);
	size_t got = 0;
	int e = 0;
	CHECK_INT_EQ(sc_peer_recv_rb(sv[0], &rb, m.p + 2 * PAGE, 64, &quick, &got, &e),
		     SC_PEER_IO_ERRNO);
	CHECK_INT_EQ(e, EFAULT);
	sc_peer_io_err(SC_PEER_IO_ERRNO, e, "peer sidecar t", &err);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-rb\"");
	CHECK_INT_EQ(write(sv[1], bytes, PAGE), PAGE);
	rb.off = rb.len = 0;
	CHECK(sc_peer_rxbuf_fill_nowait(sv[0], &rb) > 0);
	uint8_t head[10];
	struct iovec iov[2] = {{.iov_base = head, .iov_len = sizeof(head)},
			       {.iov_base = m.p + 3 * PAGE, .iov_len = 64}};
	CHECK_INT_EQ(sc_peer_recvv_rb(sv[0], &rb, iov, 2, &quick, &got, &e), SC_PEER_IO_ERRNO);
	CHECK_INT_EQ(e, EFAULT);
	CHECK_U64_EQ(got, sizeof(head));
	sc_peer_io_err(SC_PEER_IO_ERRNO, e, "peer sidecar t", &err);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-rb\"");
	close(sv[0]);
	close(sv[1]);
	unmap(&m);
}

/* recv/recvmsg/sendmsg straight into or from truncated memory: EFAULT, named. */
TEST(socket_io_on_truncated_memory)
{
	struct mapping m;
	CHECK_INT_EQ(map_truncated(&m, PAGE), 0);
	CHECK_INT_EQ(sc_fault_guard_watch(m.p, m.len, "rgn-io"), 0);
	int sv[2];
	CHECK_INT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	uint8_t bytes[2 * PAGE];
	memset(bytes, 9, sizeof(bytes));
	struct sc_err err;
	size_t got = 0;
	int e = 0;
	/* Receive: half lands, then EFAULT. */
	CHECK_INT_EQ(write(sv[1], bytes, sizeof(bytes)), (long long)sizeof(bytes));
	CHECK_INT_EQ(sc_peer_recv_all(sv[0], m.p + PAGE / 2, PAGE, &quick, &got, &e),
		     SC_PEER_IO_ERRNO);
	CHECK_INT_EQ(e, EFAULT);
	sc_peer_io_err(SC_PEER_IO_ERRNO, e, "peer sidecar t", &err);
	CHECK_INT_EQ(err.code, SC_FAILED_PRECONDITION);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-io\" was truncated by its owner");
	/* Scattered receive. */
	struct iovec iov[2] = {{.iov_base = m.p, .iov_len = 16},
			       {.iov_base = m.p + 2 * PAGE, .iov_len = 16}};
	CHECK_INT_EQ(sc_peer_recvv_all(sv[0], iov, 2, &quick, &got, &e), SC_PEER_IO_ERRNO);
	CHECK_INT_EQ(e, EFAULT);
	sc_peer_io_err(SC_PEER_IO_ERRNO, e, "peer sidecar t", &err);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-io\"");
	CHECK_STR_CONTAINS(err.msg, "at offset 8192");
	/* Gathered send. */
	uint8_t hdr[8] = {0};
	struct iovec out[2] = {{.iov_base = hdr, .iov_len = sizeof(hdr)},
			       {.iov_base = m.p + 3 * PAGE, .iov_len = 100}};
	CHECK_INT_EQ(sc_peer_sendv_all(sv[0], out, 2, &quick, &got, &e), SC_PEER_IO_ERRNO);
	CHECK_INT_EQ(e, EFAULT);
	sc_peer_io_err(SC_PEER_IO_ERRNO, e, "peer sidecar t", &err);
	CHECK_STR_CONTAINS(err.msg, "region \"rgn-io\"");
	/* Anything else is still the connection's. */
	sc_peer_io_err(SC_PEER_IO_ERRNO, ECONNABORTED, "peer sidecar t", &err);
	CHECK_INT_EQ(err.code, SC_UNAVAILABLE);
	close(sv[0]);
	close(sv[1]);
	unmap(&m);
}

RUN_TESTS(T(copies_fail_and_name_the_region), T(unwatched_memory_says_so_without_a_name),
	  T(probe_checks_the_range_in_two_loads), T(a_fault_without_err_stays_noted),
	  T(many_watched_ranges), T(read_ahead_into_truncated_memory),
	  T(socket_io_on_truncated_memory))
