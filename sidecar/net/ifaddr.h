/* SPDX-License-Identifier: Apache-2.0 */
/*
 * net/ifaddr.h: the address of a network interface by its name, for --advertise if:NAME (a
 * secondary network such as Multus' net1 or a RoCE port's netdev, whose address the downward API
 * does not give). Pure apart from getifaddrs(3); any thread.
 */
#ifndef SC_NET_IFADDR_H
#define SC_NET_IFADDR_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

/* The prefix of an --advertise entry that names an interface ("if:net1"). */
#define SC_IFADDR_PREFIX "if:"

/* Whether name is a valid Linux interface name (1..15 characters, no '/', ':' or white space,
 * not "." or ".."). */
bool sc_ifname_valid(const char *name);

/*
 * The address peers should dial on interface `ifname`, as text without brackets: its first IPv4
 * address, else its first IPv6 address that is not link-local. Errors, with the reason and what
 * to do: NOT_FOUND (no such interface here; the message lists the interfaces there are),
 * FAILED_PRECONDITION (the interface has no usable address yet), INTERNAL (getifaddrs failed).
 */
int sc_ifaddr_lookup(const char *ifname, char *out, size_t cap, struct sc_err *err);

#endif
