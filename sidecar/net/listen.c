/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/listen.c: binds the TCP listeners of the data plane and the metrics endpoint. Runs on the
 * main thread at start-up; owns nothing once it returns (the caller owns the socket).
 */
#include "net/listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int sc_listen_tcp(const char *flag, const char *flag_value, const char *node, uint16_t port,
		  int backlog, const char *in_use_hint, int *fd_out, uint16_t *bound_port,
		  struct sc_err *err)
{
	char port_text[8];
	snprintf(port_text, sizeof(port_text), "%u", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	int gai = getaddrinfo(node, port_text, &hints, &res);
	if (gai != 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION,
				  "%s %s: cannot resolve host \"%s\": %s", flag, flag_value, node,
				  gai_strerror(gai));
	int listen_fd = -1, last_errno = 0;
	for (struct addrinfo *ai = res; ai && listen_fd < 0; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
				ai->ai_protocol);
		if (fd < 0) {
			last_errno = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0) {
			listen_fd = fd;
			break;
		}
		last_errno = errno;
		close(fd);
	}
	freeaddrinfo(res);
	if (listen_fd < 0)
		return sc_err_set(err, SC_FAILED_PRECONDITION, "cannot listen on %s %s: %s%s%s%s%s",
				  flag, flag_value, strerror(last_errno),
				  last_errno == EADDRINUSE
				      ? " (another process has that port: choose another "
				      : "",
				  last_errno == EADDRINUSE ? flag : "",
				  last_errno == EADDRINUSE ? in_use_hint : "",
				  last_errno == EADDRINUSE ? ")" : "");
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
		int e = errno;
		close(listen_fd);
		return sc_err_set(err, SC_INTERNAL, "getsockname on the %s listener: %s", flag,
				  strerror(e));
	}
	*bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = listen_fd;
	return 0;
}
