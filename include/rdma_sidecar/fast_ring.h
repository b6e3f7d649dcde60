/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rdma_sidecar/fast_ring.h: the wire format of the sidecar's fast path (shared-memory rings).
 *
 * The fast path is a second local channel beside gRPC for small transfers repeated many times.
 * Most programs use it through rdma_sidecar/client.h (rsc_fast_*) or the Python package; this
 * header is the contract for those who map the rings themselves. Little-endian, fixed sizes.
 *
 * 1. The worker connects a SOCK_SEQPACKET unix socket (the sidecar's --fast-path-socket, by
 *    default its gRPC unix socket's path + ".fast"). The sidecar checks the peer's uid
 *    (SO_PEERCRED) against --allowed-uids, as on the gRPC socket, and sends HELLO with three file
 *    descriptors (SCM_RIGHTS, in this order): the ring memory (a sealed memfd: it can be neither
 *    shrunk nor grown), the submission doorbell and the completion doorbell. A sidecar that
 *    refuses the worker (a uid --allowed-uids does not list: PERMISSION_DENIED; all of
 *    --fast-path-max-sessions in use, or this uid's share of them: RESOURCE_EXHAUSTED) sends a
 *    RESULT with token 0, the code and why, in place of HELLO, and closes the socket.
 * 2. PREPARE (on the socket) hands the sidecar a READ or WRITE once: the peer's "rsm1." metadata
 *    and the local descriptors, as BeginRead/BeginWrite would. The answer (RESULT) carries a
 *    handle. Use metadata whose passive operation accepts many uses (max_uses, any_uses): every
 *    run of a handle is one use.
 * 3. Each run is a 64-byte submission entry (SQE) naming the handle, written at sq tail; the worker
 *    then advances tail and rings the submission doorbell. The sidecar begins the transfer and,
 *    when it ends, writes a 128-byte completion entry (CQE) at cq tail, advances it and rings the
 *    completion doorbell. The worker may poll cq tail for a while before sleeping on that
 *    doorbell.
 * 4. Closing the socket ends the session: transfers still in flight are cancelled, the handles
 *    and the ring memory go.
 *
 * Doorbells. Each is one end of an AF_UNIX SOCK_DGRAM socketpair whose other end only the
 * sidecar holds (so nothing the worker does to its end, O_NONBLOCK included, changes the
 * sidecar's); the worker's ends come non-blocking. To ring, send (or write) one 8-byte datagram
 * (the value is ignored; use 1); EAGAIN means rings are pending already: done. To consume, read
 * 8 bytes: one read takes one datagram, so read until EAGAIN (with MSG_DONTWAIT or the fd
 * non-blocking) before looking at cq tail again, then sleep (poll) on the doorbell. (The sidecar
 * sends a completion ring only when the worker has read its last one, so there is at most one.) A worker
 * written for the eventfds of earlier sidecars (write 8 bytes, read 8 bytes after poll) still
 * works: it only wakes once more per datagram left.
 *
 * Ring indices are free-running uint32 counters (entry = index % entries); each is written by one
 * side only (sq_tail, cq_head: the worker; sq_head, cq_tail, cq_flags: the sidecar) with release
 * stores and read with acquire loads. Each store must be one aligned 4-byte store: a byte-wise
 * copy shows the other side values that were never meant (Python's struct.pack_into zero-fills
 * first, so the sidecar may read a tail of 0 and end the session; a memoryview cast to "I" stores
 * whole). The sidecar takes a submission only while the completion ring has room for it and for
 * every transfer already in flight, so a completion never waits for room: a worker that stops
 * reading completions stops its own submissions, nobody else's. While submissions wait for room
 * the sidecar sets RSC_FAST_CQ_NEED_WAKEUP in cq_flags and sleeps; a worker that advances cq_head
 * then loads cq_flags (both sequentially consistent, or a full fence between the store and the
 * load) and rings the submission doorbell when the flag is set. A worker that never looks is
 * served too, only later: the sleeping sidecar looks again after a back-off that grows to 1 s.
 * A cq_head ahead of cq_tail, or more than cq_entries behind it, ends the session, as an
 * impossible sq_tail does.
 *
 * Every entry and message is checked as a gRPC request is; a bad one fails with a CQE or RESULT
 * that says why (INVALID_ARGUMENT, NOT_FOUND, ...), never the session of another worker.
 */
#ifndef RDMA_SIDECAR_FAST_RING_H
#define RDMA_SIDECAR_FAST_RING_H

#include <stdint.h>

#define RSC_FAST_MAGIC 0x46435352u /* "RSCF" */
#define RSC_FAST_VERSION 1u
#define RSC_FAST_MSG_MAX 65536u /* the largest socket message either side sends */
#define RSC_FAST_ID_MAX 40u	/* a region id, NUL-padded */
#define RSC_FAST_DESCS_MAX 1024u
/* cq_flags: the sidecar waits for room in the completion ring; ring the submission doorbell
 * after advancing cq_head. */
#define RSC_FAST_CQ_NEED_WAKEUP 1u

/* ---- socket messages (one message per SOCK_SEQPACKET datagram) ----------------------------- */

enum rsc_fast_msg_type {
	RSC_FAST_MSG_HELLO = 1,	    /* sidecar -> worker, first, with the three fds */
	RSC_FAST_MSG_PREPARE = 2,   /* worker -> sidecar */
	RSC_FAST_MSG_UNPREPARE = 3, /* worker -> sidecar */
	RSC_FAST_MSG_RESULT = 4,    /* sidecar -> worker: the answer to PREPARE/UNPREPARE */
};

struct rsc_fast_msg_hdr {
	uint32_t type;	/* enum rsc_fast_msg_type */
	uint32_t len;	/* of the whole message, header included */
	uint64_t token; /* chosen by the worker; RESULT echoes it */
};

struct rsc_fast_hello {
	struct rsc_fast_msg_hdr hdr;
	uint32_t magic;	  /* RSC_FAST_MAGIC */
	uint32_t version; /* RSC_FAST_VERSION */
	uint32_t sq_entries, cq_entries; /* powers of two */
	uint64_t map_size;		 /* bytes to mmap from the memfd, offset 0 */
	uint64_t sq_offset, cq_offset;	 /* where the entry arrays start */
	uint32_t max_handles;		 /* PREPAREs a session may hold at once */
	uint32_t reserved;
	char sidecar_id[128]; /* NUL-terminated */
};

/* A descriptor in PREPARE: a range of a region of this sidecar. */
struct rsc_fast_desc {
	char region_id[RSC_FAST_ID_MAX]; /* 1-39 characters, NUL-padded (every byte after them 0) */
	uint64_t offset;
	uint64_t length;
};

/* PREPARE: this struct, then metadata_len bytes of "rsm1." text (no NUL), then n_descs
 * struct rsc_fast_desc at the next multiple of 8. len must be exactly that. */
struct rsc_fast_prepare {
	struct rsc_fast_msg_hdr hdr;
	uint32_t kind;	       /* 3 = READ, 4 = WRITE (rsc_op_kind) */
	uint32_t backend;      /* rsc_backend; 0 = the fastest both sides offer */
	uint64_t timeout_ms;   /* default deadline of each run; 0 = the sidecar's --default-timeout */
	uint32_t metadata_len; /* 1..RSC_FAST_MSG_MAX */
	uint32_t n_descs;      /* 1..RSC_FAST_DESCS_MAX */
};

struct rsc_fast_unprepare {
	struct rsc_fast_msg_hdr hdr;
	uint32_t handle;
	uint32_t reserved;
};

struct rsc_fast_result {
	struct rsc_fast_msg_hdr hdr;
	int32_t code;	 /* gRPC status code; 0 = done */
	uint32_t handle; /* PREPARE: the new handle (never 0) */
	uint64_t bytes;	 /* PREPARE: bytes each run moves */
	char message[512];
};

/* ---- ring memory ----------------------------------------------------------------------------- */

/* At offset 0 of the memfd. Each index sits on its own cache line. */
struct rsc_fast_ctl {
	uint32_t magic, version, sq_entries, cq_entries;
	uint8_t pad0[48];
	uint32_t sq_head; /* sidecar: entries taken */
	uint8_t pad1[60];
	uint32_t sq_tail; /* worker: entries written */
	uint8_t pad2[60];
	uint32_t cq_head; /* worker: completions read */
	uint32_t cq_flags; /* sidecar: RSC_FAST_CQ_NEED_WAKEUP (older sidecars: 0) */
	uint8_t pad3[56];
	uint32_t cq_tail; /* sidecar: completions written */
	uint8_t pad4[60];
};

enum rsc_fast_opcode {
	RSC_FAST_OP_RUN = 1,	/* run handle once */
	RSC_FAST_OP_CANCEL = 2, /* cancel the run in flight whose user_data is target */
};

struct rsc_fast_sqe {
	uint64_t user_data;  /* returned in the CQE */
	uint32_t opcode;     /* enum rsc_fast_opcode */
	uint32_t handle;     /* RUN: from PREPARE */
	uint64_t timeout_ms; /* RUN: this run's deadline; 0 = the handle's */
	uint64_t target;     /* CANCEL: the user_data of the run to cancel */
	uint8_t reserved[32]; /* zero */
};

struct rsc_fast_cqe {
	uint64_t user_data;
	int32_t code;	    /* gRPC status code: 0 = the run COMPLETE (or the cancel was delivered) */
	uint32_t status;    /* RUN: rsc_op_status at the end (COMPLETE, CANCELLED, ERRORED); 0 when
			       the entry was refused before a transfer began */
	uint64_t bytes;	    /* bytes moved */
	uint32_t backend;   /* rsc_backend that moved them */
	uint32_t reserved;
	char message[96]; /* why, when code != 0; NUL-terminated */
};

#ifdef __cplusplus
static_assert(sizeof(struct rsc_fast_ctl) == 320, "ctl");
static_assert(sizeof(struct rsc_fast_sqe) == 64, "sqe");
static_assert(sizeof(struct rsc_fast_cqe) == 128, "cqe");
#else
_Static_assert(sizeof(struct rsc_fast_ctl) == 320, "ctl");
_Static_assert(__builtin_offsetof(struct rsc_fast_ctl, cq_flags) == 196, "cq_flags");
_Static_assert(sizeof(struct rsc_fast_sqe) == 64, "sqe");
_Static_assert(sizeof(struct rsc_fast_cqe) == 128, "cqe");
_Static_assert(sizeof(struct rsc_fast_hello) == 192, "hello");
_Static_assert(sizeof(struct rsc_fast_prepare) == 40, "prepare");
_Static_assert(sizeof(struct rsc_fast_desc) == 56, "desc");
_Static_assert(sizeof(struct rsc_fast_result) == 544, "result");
#endif

#endif
