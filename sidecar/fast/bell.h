/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/bell.h: the fast path's doorbells (rdma_sidecar/fast_ring.h, "Doorbells"). A doorbell is an
 * AF_UNIX SOCK_DGRAM socketpair: the worker gets one end over SCM_RIGHTS, the sidecar keeps the
 * other. The two ends are separate open file descriptions, so a worker that clears O_NONBLOCK on
 * its end (or shuts it down, disconnects it, stops reading it, fills it) changes nothing of the
 * sidecar's; and the sidecar's calls are non-blocking per call (MSG_DONTWAIT) whatever the flags.
 *
 * No call here blocks, logs or allocates; any thread (a doorbell end is used by one thread at a
 * time: the session's).
 */
#ifndef SC_FAST_BELL_H
#define SC_FAST_BELL_H

#include "base/status.h"

#include <stdbool.h>

/* A fresh doorbell: *mine (the sidecar's end) and *theirs (for the worker), both non-blocking
 * and close-on-exec. 0, or -1 with err (nothing left open). */
int sc_fast_bell_pair(int *mine, int *theirs, struct sc_err *err);
/* Rings: one 8-byte datagram. false when it did not go (EAGAIN: rings are pending on the other
 * side already; the worker's end is gone): never an error to the caller, never SIGPIPE. */
bool sc_fast_bell_ring(int mine);
/* Rings unless a ring is still unread: the other side reads until the doorbell is empty and only
 * then looks at the ring, so one unread datagram wakes it for everything written before this
 * call (as an eventfd's counter would; the worker's queue never holds more than one of ours). */
bool sc_fast_bell_ring_once(int mine);
/* Takes at most max datagrams waiting on mine, and clears a pending socket error (a worker that
 * disconnected its end leaves ECONNRESET there, which poll reports until read): how many
 * datagrams it took. */
unsigned sc_fast_bell_drain(int mine, unsigned max);

#endif
