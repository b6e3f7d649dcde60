/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp/paths.c: a TCP rail's facts from the host (getifaddrs, /sys/class/net) and the
 * cool-down bookkeeping of the peer endpoints the tcp backend stripes over (tcp/paths.h).
 * Runs on the caller's thread: the facts at backend creation, the health under the tcp backend's
 * mutex. Owns nothing beyond the health table it is handed.
 */
#include "tcp/paths.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The host part of "host:port" or "[v6]:port". */
static void endpoint_host(const char *endpoint, char *out, size_t cap)
{
	const char *start = endpoint, *end = strrchr(endpoint, ':');
	if (endpoint[0] == '[') {
		start = endpoint + 1;
		end = strchr(endpoint, ']');
	}
	size_t len = end ? (size_t)(end - start) : strlen(start);
	snprintf(out, cap, "%.*s", (int)len, start);
}

/* The interface that has address host (numeric), into ifname. False when none has. */
static bool interface_of(const char *host, char *ifname, size_t cap)
{
	struct in_addr a4;
	struct in6_addr a6;
	int family = inet_pton(AF_INET, host, &a4) == 1	   ? AF_INET
		     : inet_pton(AF_INET6, host, &a6) == 1 ? AF_INET6
							   : 0;
	struct ifaddrs *ifs;
	if (!family || getifaddrs(&ifs) != 0)
		return false;
	bool found = false;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != family)
			continue;
		if (family == AF_INET)
			found = memcmp(&((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, &a4,
				       sizeof(a4)) == 0;
		else
			found = memcmp(&((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr,
				       &a6, sizeof(a6)) == 0;
		if (found)
			snprintf(ifname, cap, "%s", i->ifa_name);
	}
	freeifaddrs(ifs);
	return found;
}

/* A small sysfs file's first line as a number; def when absent or not a number. */
static long long sysfs_number(const char *path, long long def)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return def;
	long long v;
	int n = fscanf(f, "%lld", &v);
	fclose(f);
	return n == 1 ? v : def;
}

void sc_tcp_rail_facts(struct sc_rail *r, const char *endpoint)
{
	snprintf(r->name, sizeof(r->name), "%s", endpoint);
	r->pci[0] = r->netdev[0] = '\0';
	r->numa = -1;
	r->rate_mbps = 0;
	char host[80], ifname[IF_NAMESIZE + 1];
	endpoint_host(endpoint, host, sizeof(host));
	if (!interface_of(host, ifname, sizeof(ifname)))
		return;
	snprintf(r->netdev, sizeof(r->netdev), "%s", ifname);
	char path[PATH_MAX], target[PATH_MAX];
	snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifname);
	long long speed = sysfs_number(path, -1);
	r->rate_mbps = speed > 0 ? (uint64_t)speed : 0;
	/* A PCI function's device link ends in its address (0000:17:00.0); virtual ones: none */
	snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifname);
	ssize_t n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return;
	target[n] = '\0';
	const char *base = strrchr(target, '/');
	base = base ? base + 1 : target;
	unsigned dom, bus, dev, fn;
	char tail;
	if (sscanf(base, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4)
		snprintf(r->pci, sizeof(r->pci), "%s", base);
	snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node", ifname);
	long long numa = sysfs_number(path, -1);
	r->numa = numa >= 0 ? (int)numa : -1;
}

/* ---- path health ----------------------------------------------------------------------------- */

static struct sc_tcp_path_health *find(struct sc_tcp_health *h, const char *endpoint, bool add,
				       uint64_t now_ms)
{
	struct sc_tcp_path_health *oldest = NULL;
	for (size_t i = 0; i < SC_TCP_HEALTH_SLOTS; i++) {
		struct sc_tcp_path_health *p = &h->slot[i];
		if (p->endpoint[0] && strcmp(p->endpoint, endpoint) == 0) {
			p->seen_ms = now_ms;
			return p;
		}
		if (!oldest || !p->endpoint[0] ||
		    (oldest->endpoint[0] && p->seen_ms < oldest->seen_ms))
			oldest = p;
	}
	if (!add)
		return NULL;
	*oldest =
	    (struct sc_tcp_path_health){.backoff_ms = SC_TCP_COOL_FIRST_MS, .seen_ms = now_ms};
	snprintf(oldest->endpoint, sizeof(oldest->endpoint), "%s", endpoint);
	return oldest;
}

bool sc_tcp_health_usable(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms,
			  uint64_t *cooling_ms)
{
	struct sc_tcp_path_health *p = find(h, endpoint, false, now_ms);
	*cooling_ms = p && p->cool_until_ms > now_ms ? p->cool_until_ms - now_ms : 0;
	return *cooling_ms == 0;
}

uint32_t sc_tcp_health_failed(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms)
{
	struct sc_tcp_path_health *p = find(h, endpoint, true, now_ms);
	if (p->cool_until_ms > now_ms) /* already cooling (another stream saw it first) */
		return (uint32_t)(p->cool_until_ms - now_ms);
	uint32_t cool = p->backoff_ms ? p->backoff_ms : SC_TCP_COOL_FIRST_MS;
	p->cool_until_ms = now_ms + cool;
	p->backoff_ms = cool * 2 > SC_TCP_COOL_MAX_MS ? SC_TCP_COOL_MAX_MS : cool * 2;
	return cool;
}

bool sc_tcp_health_ok(struct sc_tcp_health *h, const char *endpoint, uint64_t now_ms)
{
	struct sc_tcp_path_health *p = find(h, endpoint, false, now_ms);
	if (!p || !p->cool_until_ms || p->cool_until_ms > now_ms)
		return false; /* healthy, or still cooling (a stream from before the failure) */
	p->cool_until_ms = 0;
	p->backoff_ms = SC_TCP_COOL_FIRST_MS;
	return true;
}
