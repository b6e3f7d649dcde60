/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ib/qp_wire.c: the QP_CONNECT payload (ib/qp.c's rendezvous): encoding, decoding with its
 * checks, and filling in this side's half from a lane and a QP. Pure functions; any thread.
 * Owns nothing.
 *
 * Wire format of the QP_CONNECT body (little-endian): u8 version (1), u8 op (1 request, 2 reply,
 * 3 verify, 4 verify reply), u16 status (verify reply: 1 alive, 0 unknown; else 0), u32 qpn,
 * u32 psn, gid[16], u16 lid, u8 link_layer, u8 flags (QPC_F_NOTICE: the sender posts receives
 * for completion notices, ib/notify.c; older releases send 0), u32 mtu (bytes), u32
 * max_rd_atomic (initiator depth), u32 max_dest_rd_atomic (responder resources), u32 prev_qpn
 * (verify: the responder's qpn asked about), u16 id length + id (requester or responder id),
 * then, only when it is not 0, u8 rail: which of the responder's rails (lanes, ib/lanes.c) the
 * request and verify are for (absent: rail 0, so older peers, which know one rail, still
 * work; a requester asks for another rail only of a peer whose metadata lists it).
 */
#include "ib/internal.h"

#include <stdio.h>
#include <string.h>

size_t ib_qpc_encode(const struct ib_qpc *m, uint8_t *out, size_t cap)
{
	size_t idlen = strlen(m->id);
	if (cap < QPC_FIXED + 2 + idlen + (m->lane != 0) || idlen >= SC_NAME_MAX)
		return 0;
	memset(out, 0, QPC_FIXED);
	out[0] = QPC_VERSION;
	out[1] = m->op;
	ib_put_le(out + 2, m->status, 2);
	ib_put_le(out + 4, m->qpn, 4);
	ib_put_le(out + 8, m->psn, 4);
	memcpy(out + 12, m->gid, 16);
	ib_put_le(out + 28, m->lid, 2);
	out[30] = m->link_layer;
	out[31] = m->flags;
	ib_put_le(out + 32, m->mtu, 4);
	ib_put_le(out + 36, m->max_rd, 4);
	ib_put_le(out + 40, m->max_dest_rd, 4);
	ib_put_le(out + 44, m->prev_qpn, 4);
	ib_put_le(out + 48, idlen, 2);
	memcpy(out + 50, m->id, idlen);
	if (m->lane) {
		out[50 + idlen] = m->lane;
		return QPC_FIXED + 2 + idlen + 1;
	}
	return QPC_FIXED + 2 + idlen;
}

int ib_qpc_decode(const uint8_t *in, size_t len, uint8_t want_op, struct ib_qpc *m,
		  struct sc_err *err)
{
	if (len < QPC_FIXED + 2)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "QP_CONNECT body of %zu bytes is too short", len);
	if (in[0] != QPC_VERSION)
		return sc_err_set(
		    err, SC_INVALID_ARGUMENT,
		    "QP_CONNECT version %u, expected %u (a different rdma-sidecar release)", in[0],
		    QPC_VERSION);
	if (in[1] != want_op)
		return sc_err_set(err, SC_INVALID_ARGUMENT, "QP_CONNECT op %u, expected %u", in[1],
				  want_op);
	memset(m, 0, sizeof(*m));
	m->op = in[1];
	m->status = (uint16_t)ib_get_le(in + 2, 2);
	m->qpn = (uint32_t)ib_get_le(in + 4, 4);
	m->psn = (uint32_t)ib_get_le(in + 8, 4);
	memcpy(m->gid, in + 12, 16);
	m->lid = (uint16_t)ib_get_le(in + 28, 2);
	m->link_layer = in[30];
	m->flags = in[31];
	m->mtu = (uint32_t)ib_get_le(in + 32, 4);
	m->max_rd = (uint32_t)ib_get_le(in + 36, 4);
	m->max_dest_rd = (uint32_t)ib_get_le(in + 40, 4);
	m->prev_qpn = (uint32_t)ib_get_le(in + 44, 4);
	size_t idlen = (size_t)ib_get_le(in + 48, 2);
	if (idlen >= SC_NAME_MAX ||
	    (len != QPC_FIXED + 2 + idlen && len != QPC_FIXED + 2 + idlen + 1) ||
	    memchr(in + 50, 0, idlen))
		return sc_err_set(err, SC_INVALID_ARGUMENT, "QP_CONNECT: bad sidecar id");
	memcpy(m->id, in + 50, idlen);
	m->id[idlen] = '\0';
	if (len == QPC_FIXED + 2 + idlen + 1) {
		m->lane = in[50 + idlen];
		if (m->lane == 0 || m->lane >= SC_MAX_IB_RAILS)
			return sc_err_set(err, SC_INVALID_ARGUMENT, "QP_CONNECT: rail %u", m->lane);
	}
	if (m->qpn == 0 || m->qpn > 0xffffff || m->psn > 0xffffff || m->mtu < 256 ||
	    m->max_rd == 0 || m->max_dest_rd == 0)
		return sc_err_set(err, SC_INVALID_ARGUMENT,
				  "QP_CONNECT: out-of-range qpn %u / psn %u / mtu %u / rd %u,%u",
				  m->qpn, m->psn, m->mtu, m->max_rd, m->max_dest_rd);
	return 0;
}

void ib_qpc_fill_local(struct ib_backend *ib, struct ib_qp *q, uint8_t op, uint32_t psn,
		       struct ib_qpc *m)
{
	memset(m, 0, sizeof(*m));
	m->op = op;
	m->qpn = q->qp->qp_num;
	m->psn = psn;
	memcpy(m->gid, ib->gid.raw, 16);
	m->lid = ib->lid;
	m->link_layer = ib->link_layer;
	m->mtu = ib_mtu_bytes(ib->active_mtu);
	m->max_rd = ib->max_init_rd;
	m->max_dest_rd = ib->max_dest_rd;
	snprintf(m->id, sizeof(m->id), "%s", ib->self_id);
}
