/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_fast.c: libFuzzer target for the fast path's wire checks (sidecar/fast/wire.c), the
 * sidecar's side of a worker that writes anything anywhere.
 *   (a) The input as one datagram: sc_fast_msg_type, sc_fast_parse_prepare and
 *       sc_fast_parse_unprepare. A PREPARE that parses must hold what fast/wire.h promises (kind,
 *       backend, metadata of printable ASCII, 1..RSC_FAST_DESCS_MAX descriptors with valid ids,
 *       lengths > 0 and no overflow), else abort; a refusal must say why.
 *   (b) The input as ring memory: data[0] picks the entry counts (low nibble: sq, high: cq; 1..16
 *       each), the ring is laid out and initialised, then the input is copied over the mapping from
 *       offset 0, control block included (bytes past the input stay zero). data[1] bit 0 adopts
 *       the indices found there as the sidecar's own (a session long under way, near the wrap). The
 *       input past the mapping is the worker's script: 8 bytes per round, its next sq_tail and
 *       cq_head. The sidecar then runs at most ROUNDS rounds of take / check_sqe / cq_room / post
 *       as the session will (a refused entry is answered with a CQE saying why). The mapping is
 *       heap memory of exactly map_size bytes, so ASan sees any access outside it; the indices must
 *       move as fast/wire.h says, else abort. Each round also checks sc_fast_ring_cq_space
 *       against sc_fast_ring_cq_room (an impossible cq_head is an error, never room) and raises or
 *       clears NEED_WAKEUP as the session does while it waits for room.
 *   (c) The input as a hostile worker's script against one doorbell (fast/bell.c): two bytes per
 *       step, an action and its argument. The worker clears or sets O_NONBLOCK on its end, sends
 *       datagrams of any size, fills the sidecar's end until EAGAIN, reads, shuts its end down,
 *       disconnects it, shrinks its buffers, closes it; the sidecar rings (any number of times)
 *       and drains. No sidecar call may block (a hang is a libFuzzer timeout), raise SIGPIPE, or
 *       see its own end's flags change; after a drain that stopped short of its limit, poll finds
 *       the sidecar's end quiet (no datagram, no pending error: nothing to spin on).
 * Built with -DSC_FUZZ_GEN_SEEDS (no libFuzzer) it writes a seed corpus into argv[1]: good and bad
 * PREPAREs and UNPREPAREs, and ring images with valid entries before and across the uint32 wrap.
 * Single-threaded.
 */
#include "fast/bell.h"
#include "fast/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ROUNDS 64
#define BELL_STEPS 256

static uint32_t counts_sq(uint8_t b)
{
	return 1u << ((b & 0x0f) % 5);
}

static uint32_t counts_cq(uint8_t b)
{
	return 1u << ((b >> 4) % 5);
}

#ifndef SC_FUZZ_GEN_SEEDS

static void check_refusal(const struct sc_err *err)
{
	if (err->code == SC_OK || !err->msg[0] || !memchr(err->msg, 0, sizeof(err->msg)))
		abort();
}

static bool id_ok(const char *id)
{
	size_t n = strnlen(id, SC_ID_MAX);
	if (n == 0 || n >= SC_ID_MAX)
		return false;
	return strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static void fuzz_messages(const uint8_t *data, size_t size)
{
	uint32_t type = sc_fast_msg_type(data, size);
	if (size < sizeof(struct rsc_fast_msg_hdr) && type != 0)
		abort();

	struct sc_fast_prepared p;
	memset(&p, 0, sizeof(p));
	struct sc_err err = {0};
	if (sc_fast_parse_prepare(data, size, &p, &err) == 0) {
		if (type != RSC_FAST_MSG_PREPARE)
			abort();
		if ((p.kind != 3 && p.kind != 4) || p.backend > 3)
			abort();
		size_t mlen = strlen(p.metadata);
		if (mlen == 0 || mlen > RSC_FAST_MSG_MAX)
			abort();
		for (size_t k = 0; k < mlen; k++) {
			if (p.metadata[k] < 0x20 || p.metadata[k] > 0x7e)
				abort();
		}
		if (p.n_descs == 0 || p.n_descs > RSC_FAST_DESCS_MAX || !p.descs)
			abort();
		for (size_t i = 0; i < p.n_descs; i++) {
			if (!id_ok(p.descs[i].region_id) || p.descs[i].length == 0 ||
			    p.descs[i].offset > UINT64_MAX - p.descs[i].length)
				abort();
		}
		sc_fast_prepared_free(&p);
		if (p.metadata || p.descs)
			abort();
	} else {
		check_refusal(&err);
		if (p.metadata || p.descs || p.n_descs)
			abort();
	}

	uint32_t handle = 0;
	memset(&err, 0, sizeof(err));
	if (sc_fast_parse_unprepare(data, size, &handle, &err) == 0) {
		if (type != RSC_FAST_MSG_UNPREPARE || handle == 0)
			abort();
	} else {
		check_refusal(&err);
		if (handle != 0)
			abort();
	}
}

static void fuzz_ring(const uint8_t *data, size_t size)
{
	if (size < 2)
		return;
	uint32_t sq_n = counts_sq(data[0]), cq_n = counts_cq(data[0]);
	uint64_t map_size = 0;
	if (sc_fast_ring_layout(sq_n, cq_n, &map_size, NULL, NULL) != 0)
		abort();
	void *base = malloc(map_size);
	if (!base)
		return;
	memset(base, 0, map_size);
	struct sc_fast_ring r;
	sc_fast_ring_init(&r, base, sq_n, cq_n);
	size_t image = size < map_size ? size : (size_t)map_size;
	memcpy(base, data, image); /* the worker writes over all of it, control block included */
	if (data[1] & 1) {
		r.sq_head = r.ctl->sq_head;
		r.cq_tail = r.ctl->cq_tail;
	}
	const uint8_t *script = data + image;
	size_t script_len = size - image;

	for (int round = 0; round < ROUNDS; round++) {
		if (script_len >= 8) {
			uint32_t tail, head;
			memcpy(&tail, script, 4);
			memcpy(&head, script + 4, 4);
			__atomic_store_n(&r.ctl->sq_tail, tail, __ATOMIC_RELEASE);
			__atomic_store_n(&r.ctl->cq_head, head, __ATOMIC_RELEASE);
			script += 8;
			script_len -= 8;
		}
		uint32_t room = sc_fast_ring_cq_room(&r);
		if (room > r.cq_entries)
			abort();
		uint32_t space = 0;
		struct sc_err serr = {0};
		uint32_t used = r.cq_tail - __atomic_load_n(&r.ctl->cq_head, __ATOMIC_ACQUIRE);
		if (sc_fast_ring_cq_space(&r, &space, &serr) == 0) {
			if (space != room || used > r.cq_entries)
				abort();
		} else {
			check_refusal(&serr);
			if (room != 0 || used <= r.cq_entries)
				abort();
		}
		bool flag_before = r.need_wakeup; /* cq_flags may hold the image's bytes till then */
		sc_fast_ring_need_wakeup(&r, room == 0);
		if (r.need_wakeup != (room == 0) ||
		    (flag_before != r.need_wakeup &&
		     __atomic_load_n(&r.ctl->cq_flags, __ATOMIC_ACQUIRE) !=
			 (room == 0 ? RSC_FAST_CQ_NEED_WAKEUP : 0u)))
			abort();
		uint32_t head_before = r.sq_head;
		struct rsc_fast_sqe e;
		struct sc_err err = {0};
		int rc = sc_fast_ring_take(&r, room, &e, &err);
		if (rc == -1) {
			check_refusal(&err);
			if (r.sq_head != head_before)
				abort();
			if (script_len < 8)
				break; /* the session ends here; nothing will change */
			continue;
		}
		if (rc == 0) {
			if (r.sq_head != head_before)
				abort();
			if (script_len < 8)
				break;
			continue;
		}
		if (rc != 1 || room == 0 || r.sq_head != head_before + 1 ||
		    __atomic_load_n(&r.ctl->sq_head, __ATOMIC_ACQUIRE) != r.sq_head)
			abort();
		struct rsc_fast_cqe c;
		memset(&err, 0, sizeof(err));
		if (sc_fast_check_sqe(&e, &err) == 0) {
			bool run = e.opcode == RSC_FAST_OP_RUN;
			if (run ? e.handle == 0 : e.opcode != RSC_FAST_OP_CANCEL || e.handle != 0)
				abort();
			sc_fast_cqe_fill(&c, e.user_data, 0, run ? SC_OPS_COMPLETE : 0,
					 e.timeout_ms, SC_BACKEND_TCP, NULL);
		} else {
			check_refusal(&err);
			sc_fast_cqe_fill(&c, e.user_data, err.code, 0, 0, 0, err.msg);
		}
		if (c.message[sizeof(c.message) - 1] != '\0')
			abort();
		uint32_t tail_before = r.cq_tail;
		sc_fast_ring_post(&r, &c);
		if (r.cq_tail != tail_before + 1 ||
		    __atomic_load_n(&r.ctl->cq_tail, __ATOMIC_ACQUIRE) != r.cq_tail)
			abort();
	}
	free(base);
}

/* The sidecar's end is quiet: no datagram waiting, no error pending. */
static void check_quiet(int mine)
{
	struct pollfd p = {.fd = mine, .events = POLLIN};
	if (poll(&p, 1, 0) != 0)
		abort();
}

static void fuzz_bells(const uint8_t *data, size_t size)
{
	int mine = -1, theirs = -1;
	struct sc_err err = {0};
	if (sc_fast_bell_pair(&mine, &theirs, &err) != 0)
		return; /* out of fds: nothing to learn */
	int flags = fcntl(mine, F_GETFL);
	if (flags < 0 || !(flags & O_NONBLOCK))
		abort();
	uint8_t buf[256];
	memset(buf, 0xa5, sizeof(buf));
	for (size_t i = 0; i + 1 < size && i / 2 < BELL_STEPS; i += 2) {
		uint8_t arg = data[i + 1];
		int v;
		switch (data[i] % 12) {
		case 0: /* the attack of issue 32: make the shared description blocking */
			if (theirs >= 0)
				fcntl(theirs, F_SETFL, fcntl(theirs, F_GETFL) & ~O_NONBLOCK);
			break;
		case 1:
			if (theirs >= 0)
				fcntl(theirs, F_SETFL, fcntl(theirs, F_GETFL) | O_NONBLOCK);
			break;
		case 2: /* a ring of any size, even 0 bytes */
			if (theirs >= 0)
				(void)!send(theirs, buf, arg % (sizeof(buf) + 1), MSG_DONTWAIT | MSG_NOSIGNAL);
			break;
		case 3: /* fill the sidecar's end */
			for (int k = 0; theirs >= 0 && k < 4096; k++)
				if (send(theirs, buf, 8, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
					break;
			break;
		case 4: /* take one of the sidecar's rings */
			if (theirs >= 0)
				(void)!recv(theirs, buf, sizeof(buf), MSG_DONTWAIT);
			break;
		case 5: /* the sidecar rings, the worker reading nothing */
			for (unsigned k = 0; k <= arg; k++)
				if (arg & 1)
					sc_fast_bell_ring_once(mine);
				else
					sc_fast_bell_ring(mine);
			break;
		case 6: {
			unsigned max = 1u + arg;
			if (sc_fast_bell_drain(mine, max) < max)
				check_quiet(mine);
			break;
		}
		case 7:
			if (theirs >= 0)
				shutdown(theirs, arg % 3);
			break;
		case 8: { /* disconnect: the sidecar's end gets ECONNRESET pending */
			struct sockaddr sa = {.sa_family = AF_UNSPEC};
			if (theirs >= 0)
				(void)!connect(theirs, &sa, sizeof(sa));
			break;
		}
		case 9:
			if (theirs >= 0)
				close(theirs);
			theirs = -1;
			break;
		case 10:
			v = arg;
			if (theirs >= 0)
				setsockopt(theirs, SOL_SOCKET, arg & 1 ? SO_RCVBUF : SO_SNDBUF, &v,
					   sizeof(v));
			break;
		default: /* the worker looks at its end's flags and error */
			if (theirs >= 0) {
				socklen_t len = sizeof(v);
				(void)getsockopt(theirs, SOL_SOCKET, SO_ERROR, &v, &len);
			}
			break;
		}
		if (fcntl(mine, F_GETFL) != flags)
			abort();
	}
	/* Whatever is left drains, and leaves nothing to spin on. */
	while (sc_fast_bell_drain(mine, 64) == 64)
		;
	check_quiet(mine);
	close(mine);
	if (theirs >= 0)
		close(theirs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_messages(data, size);
	fuzz_ring(data, size);
	fuzz_bells(data, size);
	return 0;
}

#else

static int n_seeds;

static int write_seed(const char *dir, const char *name, const void *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/fast-%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t w = fwrite(p, 1, n, f);
	if (fclose(f) != 0 || w != n) {
		perror(path);
		return -1;
	}
	n_seeds++;
	return 0;
}

static uint8_t seed[16384];

/* A PREPARE as the client writes it; returns its length. */
static size_t prepare(uint8_t *m, uint32_t kind, const char *meta, uint32_t n_descs)
{
	uint32_t meta_len = (uint32_t)strlen(meta);
	size_t descs_at = sizeof(struct rsc_fast_prepare) + (meta_len + 7u) / 8u * 8u;
	size_t len = descs_at + n_descs * sizeof(struct rsc_fast_desc);
	struct rsc_fast_prepare p = {
	    .hdr = {.type = RSC_FAST_MSG_PREPARE, .len = (uint32_t)len, .token = 1},
	    .kind = kind,
	    .backend = 0,
	    .timeout_ms = 1000,
	    .metadata_len = meta_len,
	    .n_descs = n_descs,
	};
	memset(m, 0, len);
	memcpy(m, &p, sizeof(p));
	memcpy(m + sizeof(p), meta, meta_len);
	for (uint32_t i = 0; i < n_descs; i++) {
		struct rsc_fast_desc d;
		memset(&d, 0, sizeof(d));
		snprintf(d.region_id, sizeof(d.region_id), "region-%u", i);
		d.offset = (uint64_t)i * 4096;
		d.length = 4096;
		memcpy(m + descs_at + i * sizeof(d), &d, sizeof(d));
	}
	return len;
}

/* A ring image: counts byte, indices at `at` (sq: `queued` entries waiting), valid entries. */
static size_t ring_image(uint8_t *m, uint8_t counts, uint32_t at, uint32_t queued, bool bad_entry)
{
	uint32_t sq_n = counts_sq(counts), cq_n = counts_cq(counts);
	uint64_t size = 0, sq_off = 0, cq_off = 0;
	sc_fast_ring_layout(sq_n, cq_n, &size, &sq_off, &cq_off);
	memset(m, 0, size);
	struct rsc_fast_ctl ctl;
	memset(&ctl, 0, sizeof(ctl));
	ctl.magic = RSC_FAST_MAGIC;
	ctl.version = RSC_FAST_VERSION;
	ctl.sq_entries = sq_n;
	ctl.cq_entries = cq_n;
	ctl.sq_head = at;
	ctl.sq_tail = at + queued;
	ctl.cq_head = at;
	ctl.cq_tail = at;
	memcpy(m, &ctl, sizeof(ctl));
	m[0] = counts;
	m[1] = 1; /* adopt these indices */
	for (uint32_t k = 0; k < queued; k++) {
		struct rsc_fast_sqe e;
		memset(&e, 0, sizeof(e));
		e.user_data = 1000 + k;
		e.opcode = (k % 3 == 2) ? RSC_FAST_OP_CANCEL : RSC_FAST_OP_RUN;
		e.handle = e.opcode == RSC_FAST_OP_RUN ? k + 1 : 0;
		e.target = e.opcode == RSC_FAST_OP_CANCEL ? 1000 : 0;
		if (bad_entry && k == 1)
			e.reserved[5] = 1;
		memcpy(m + sq_off + ((at + k) & (sq_n - 1)) * sizeof(e), &e, sizeof(e));
	}
	return (size_t)size;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SEED_DIR\n", argv[0]);
		return 2;
	}
	const char *dir = argv[1];
	int rc = 0;
	size_t len = prepare(seed, 3, "rsm1.eyJ2IjoxfQ.c2ln", 3);
	rc |= write_seed(dir, "prepare-read", seed, len);
	len = prepare(seed, 4, "x", 1);
	rc |= write_seed(dir, "prepare-write", seed, len);
	len = prepare(seed, 3, "rsm1.a", 40);
	seed[sizeof(struct rsc_fast_prepare) + 8 + 56 + 3] = '/'; /* a bad id in descriptor 1 */
	rc |= write_seed(dir, "prepare-bad-id", seed, len);
	struct rsc_fast_unprepare u = {
	    .hdr = {.type = RSC_FAST_MSG_UNPREPARE, .len = sizeof(u), .token = 2},
	    .handle = 7,
	};
	rc |= write_seed(dir, "unprepare", &u, sizeof(u));

	len = ring_image(seed, 0x22, 0, 3, false); /* 4 and 4 */
	rc |= write_seed(dir, "ring-fresh", seed, len);
	len = ring_image(seed, 0x44, UINT32_MAX - 5, 16, false); /* 16 and 16, across the wrap */
	rc |= write_seed(dir, "ring-wrap-full", seed, len);
	len = ring_image(seed, 0x13, UINT32_MAX - 1, 5, true); /* 8 sq, 2 cq: room runs out */
	rc |= write_seed(dir, "ring-small-cq", seed, len);
	/* The worker's script after the image: tail jumps ahead, then back, cq_head moves. */
	len = ring_image(seed, 0x22, 100, 2, false);
	uint32_t script[] = {102, 100, 110, 100, 104, 102, 104, 106, 99, 106};
	memcpy(seed + len, script, sizeof(script));
	rc |= write_seed(dir, "ring-script", seed, len + sizeof(script));
	/* A hostile worker's doorbell script: blocking end, rings, fills, disconnects, drains. */
	uint8_t bells[] = {0, 0, 2, 8, 5, 40, 3, 0, 6, 255, 10, 1, 5, 200, 8, 0,
			   6, 3, 2, 0, 4, 0,  7, 2, 5, 9,   9,	0, 5, 9,   6, 255};
	rc |= write_seed(dir, "bells-hostile", bells, sizeof(bells));
	if (rc)
		return 1;
	printf("%d seeds in %s\n", n_seeds, dir);
	return 0;
}

#endif
