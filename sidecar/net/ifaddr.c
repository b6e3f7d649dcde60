/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/ifaddr.c: an interface's address by name (getifaddrs), for --advertise if:NAME. The peer
 * server resolves it at start and again from its accept thread, so the metadata follows the
 * interface when its address changes. Pure functions; any thread.
 */
#include "net/ifaddr.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

bool sc_ifname_valid(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n >= IFNAMSIZ || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	for (const char *p = name; *p; p++)
		if (*p == '/' || *p == ':' || *p == ',' || (unsigned char)*p <= ' ' ||
		    (unsigned char)*p >= 0x7f)
			return false;
	return true;
}

static bool link_local6(const struct in6_addr *a)
{
	return a->s6_addr[0] == 0xfe && (a->s6_addr[1] & 0xc0) == 0x80;
}

int sc_ifaddr_lookup(const char *ifname, char *out, size_t cap, struct sc_err *err)
{
	struct ifaddrs *all = NULL;
	if (getifaddrs(&all) != 0)
		return sc_err_set(err, SC_INTERNAL,
				  "--advertise if:%s: cannot list the interfaces: %m", ifname);
	bool seen = false;
	const struct sockaddr_in *v4 = NULL;
	const struct sockaddr_in6 *v6 = NULL;
	char names[256] = "";
	size_t used = 0;
	for (struct ifaddrs *a = all; a; a = a->ifa_next) {
		if (!a->ifa_name)
			continue;
		if (strcmp(a->ifa_name, ifname) != 0) {
			/* the names there are, once each (getifaddrs lists a name per address) */
			char key[IFNAMSIZ + 2];
			snprintf(key, sizeof(key), " %s,", a->ifa_name);
			char hay[sizeof(names) + 2];
			snprintf(hay, sizeof(hay), " %s,", names);
			if (!strstr(hay, key) && used + strlen(a->ifa_name) + 3 < sizeof(names))
				used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
							 used ? ", " : "", a->ifa_name);
			continue;
		}
		seen = true;
		if (!a->ifa_addr)
			continue;
		if (a->ifa_addr->sa_family == AF_INET && !v4)
			v4 = (const struct sockaddr_in *)a->ifa_addr;
		else if (a->ifa_addr->sa_family == AF_INET6 && !v6 &&
			 !link_local6(&((const struct sockaddr_in6 *)a->ifa_addr)->sin6_addr))
			v6 = (const struct sockaddr_in6 *)a->ifa_addr;
	}
	int rc = 0;
	if (!seen) {
		rc = sc_err_set(
		    err, SC_NOT_FOUND,
		    "--advertise if:%s: there is no network interface \"%s\" here (there "
		    "are: %s); name one of them, or attach the network (Multus, DRA) "
		    "that creates it",
		    ifname, ifname, names[0] ? names : "none");
	} else if (!v4 && !v6) {
		rc = sc_err_set(
		    err, SC_FAILED_PRECONDITION,
		    "--advertise if:%s: the interface has no IPv4 address and no IPv6 "
		    "address other than link-local; give it one (ip addr add ... dev %s)",
		    ifname, ifname);
	} else if (!inet_ntop(v4 ? AF_INET : AF_INET6,
			      v4 ? (const void *)&v4->sin_addr : (const void *)&v6->sin6_addr, out,
			      (socklen_t)cap)) {
		rc =
		    sc_err_set(err, SC_INTERNAL, "--advertise if:%s: address does not fit", ifname);
	}
	freeifaddrs(all);
	return rc;
}
