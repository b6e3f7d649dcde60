/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib_backend.c: the ibverbs backend. This first version discovers devices and ports and reports
 * what it found for GetInfo; the RDMA data path (issue 4) builds on it. Main thread at start-up.
 */
#include "backend.h"
#include "log.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ib_backend {
	struct sc_backend base;
};

static void ib_destroy(struct sc_backend *b)
{
	free(container_of(b, struct ib_backend, base));
}

static const struct sc_backend_ops ib_ops = {
	.name = "ibverbs",
	.kind = SC_BACKEND_IBVERBS,
	.transport_level = 2,
	.start = sc_backend_start_unsupported,
	.stop = sc_backend_noop,
	.destroy = ib_destroy,
	.register_region = sc_backend_register_unsupported,
	.deregister_region = sc_backend_deregister_noop,
	.expose = sc_backend_expose_noop,
	.revoke = sc_backend_revoke_noop,
	.submit = sc_backend_submit_unsupported,
	.cancel = sc_backend_cancel_noop,
};

struct sc_backend *sc_backend_ibverbs_create(struct sc_engine *eng, const struct sc_config *cfg)
{
	struct ib_backend *ib = calloc(1, sizeof(*ib));
	if (!ib)
		return NULL;
	ib->base.ops = &ib_ops;
	ib->base.eng = eng;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		snprintf(ib->base.detail, sizeof(ib->base.detail),
			 "no RDMA devices found (ibv_get_device_list: %d devices; check "
			 "/dev/infiniband and the NIC driver, or rdma link add rxe0 type rxe "
			 "netdev ETH for Soft-RoCE)",
			 n);
	} else {
		for (int i = 0; i < n && ib->base.n_devices < 4; i++)
			snprintf(ib->base.devices[ib->base.n_devices++], sizeof(ib->base.devices[0]),
				 "%s", ibv_get_device_name(list[i]));
		snprintf(ib->base.detail, sizeof(ib->base.detail),
			 "%d RDMA device(s) found; the ibverbs data path is not enabled in this "
			 "build",
			 n);
	}
	if (list)
		ibv_free_device_list(list);
	return &ib->base;
}
