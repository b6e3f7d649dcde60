/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fast/bell.c: the fast path's doorbells (fast/bell.h): socketpairs whose worker end is handed
 * over and whose sidecar end is used only with per-call non-blocking sends and receives. Runs on
 * the session's thread; owns nothing past the fds it returns.
 */
#include "fast/bell.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

int sc_fast_bell_pair(int *mine, int *theirs, struct sc_err *err)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
		return sc_err_set(err, SC_RESOURCE_EXHAUSTED, "fast-path doorbell: socketpair: %s",
				  strerror(errno));
	*mine = sv[0];
	*theirs = sv[1];
	return 0;
}

bool sc_fast_bell_ring(int mine)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = send(mine, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof(one);
}

bool sc_fast_bell_ring_once(int mine)
{
	/* What the caller wrote before (the ring's tail) is visible before we look at the queue, as
	 * the reader's dequeue (an atomic release of the datagram's memory) comes before its look
	 * at the tail: one of the two sees the other. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	int unread = 0;
	if (ioctl(mine, SIOCOUTQ, &unread) == 0 && unread > 0)
		return true;
	return sc_fast_bell_ring(mine);
}

unsigned sc_fast_bell_drain(int mine, unsigned max)
{
	unsigned got = 0, errors = 0;
	while (got < max) {
		uint64_t v;
		ssize_t n = recv(mine, &v, sizeof(v), MSG_DONTWAIT | MSG_TRUNC);
		if (n >= 0) {
			got++;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK || ++errors > 4)
			break;
		/* A socket error (the worker disconnected its end): reading it cleared it; make
		 * sure, then look again for datagrams behind it. */
		int e = 0;
		socklen_t len = sizeof(e);
		(void)getsockopt(mine, SOL_SOCKET, SO_ERROR, &e, &len);
	}
	return got;
}
