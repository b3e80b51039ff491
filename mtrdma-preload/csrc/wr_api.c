/* A small verbs program that posts only through the extended API
 * (ibv_wr_start / ibv_wr_rdma_write / ibv_wr_set_sge / ibv_wr_complete, as
 * perftest does where the provider supports it), for mtrdma-preload's
 * device tests. Two RC queue pairs on one device, connected to each other:
 *
 *   1. COUNT WRITEs of SIZE bytes, signaled every SIGNAL (and the last),
 *      two requests per ibv_wr_start..ibv_wr_complete session, and one
 *      session abandoned with ibv_wr_abort in between: every signaled
 *      completion must carry the wr_id it was posted with, in order, and
 *      the target must hold exactly what was written;
 *   2. 8 SENDs of 16 bytes of inline data (ibv_wr_set_inline_data) into
 *      posted receives;
 *   3. one READ of SIZE bytes back, compared with the source.
 *
 * usage: wr_api DEVICE [SIZE [COUNT [SIGNAL]]]
 * Exits 0 and prints one "wr_api: ok ..." line, or prints what went wrong
 * and exits 1. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define DEPTH 64
#define RECVS 8

static void die(const char *what)
{
	fprintf(stderr, "wr_api: %s failed: %s\n", what, strerror(errno));
	exit(1);
}

static void fail(const char *fmt, uint64_t a, uint64_t b)
{
	fprintf(stderr, "wr_api: ");
	fprintf(stderr, fmt, a, b);
	fprintf(stderr, "\n");
	exit(1);
}

/* The first RoCE v2 GID with an IPv4 address, else index 0. */
static int gid_index(struct ibv_context *ctx, union ibv_gid *gid)
{
	for (int i = 0; i < 16; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0))
			continue;
		const uint8_t *r = e.gid.raw;
		int v4 = !r[0] && !r[1] && !r[8] && !r[9] && r[10] == 0xff && r[11] == 0xff;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
			*gid = e.gid;
			return i;
		}
	}
	if (ibv_query_gid(ctx, 1, 0, gid))
		die("ibv_query_gid");
	return 0;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, int sgid, union ibv_gid *gid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = sgid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		die("ibv_modify_qp RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("ibv_modify_qp RTS");
}

static struct ibv_qp *create(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = RECVS, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
				  IBV_QP_EX_WITH_RDMA_READ,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &attr);
	if (!qp)
		die("ibv_create_qp_ex");
	return qp;
}

/* Waits for one completion on cq and checks it. */
static void expect(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	int n;
	long spins = 0;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (++spins > 2000000000L)
			fail("no completion for wr_id %" PRIu64 " (%" PRIu64 ")", wr_id, 0);
	if (n < 0)
		die("ibv_poll_cq");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "wr_api: wr_id %" PRIu64 " completed with %s\n", wc.wr_id,
			ibv_wc_status_str(wc.status));
		exit(1);
	}
	if (wc.wr_id != wr_id)
		fail("completion for wr_id %" PRIu64 ", expected %" PRIu64, wc.wr_id, wr_id);
	if (wc.opcode != op)
		fail("completion opcode %" PRIu64 ", expected %" PRIu64, wc.opcode, op);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: wr_api DEVICE [SIZE [COUNT [SIGNAL]]]\n");
		return 2;
	}
	size_t size = argc > 2 ? strtoul(argv[2], NULL, 0) : 1 << 20;
	uint64_t count = argc > 3 ? strtoull(argv[3], NULL, 0) : 64;
	uint64_t signal = argc > 4 ? strtoull(argv[4], NULL, 0) : 8;
	if (!size || !count || !signal || signal > DEPTH / 2 || signal % 2)
		fail("bad arguments (signal %" PRIu64 " must be even, 2 to %" PRIu64 ")",
		     signal, DEPTH / 2);

	int n;
	struct ibv_device **list = ibv_get_device_list(&n), *dev = NULL;
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	if (!dev) {
		fprintf(stderr, "wr_api: no device %s\n", argv[1]);
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd");
	struct ibv_cq *cq1 = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
	if (!cq1 || !cq2)
		die("ibv_create_cq");
	struct ibv_qp *qp1 = create(ctx, pd, cq1), *qp2 = create(ctx, pd, cq2);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp1);
	if (!x)
		die("ibv_qp_to_qp_ex");
	union ibv_gid gid;
	int sgid = gid_index(ctx, &gid);
	connect_qp(qp1, qp2->qp_num, sgid, &gid);
	connect_qp(qp2, qp1->qp_num, sgid, &gid);

	/* Four source slots, each with a pattern of its own, written to the
	 * same four target slots in turn; a fifth target slot is a canary
	 * that only the abandoned session names. */
	size_t slots = 4;
	uint8_t *src = malloc(slots * size), *dst = calloc(slots + 1, size);
	uint8_t *back = calloc(1, size), *recv = calloc(RECVS, 64);
	if (!src || !dst || !back || !recv)
		die("malloc");
	for (size_t b = 0; b < slots * size; b++)
		src[b] = (uint8_t)(b / size * 61 + b * 7 + 1);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *smr = ibv_reg_mr(pd, src, slots * size, access);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, (slots + 1) * size, access);
	struct ibv_mr *bmr = ibv_reg_mr(pd, back, size, access);
	struct ibv_mr *rmr = ibv_reg_mr(pd, recv, RECVS * 64, access);
	if (!smr || !dmr || !bmr || !rmr)
		die("ibv_reg_mr");

	/* 1. WRITEs, two per session; every `signal`-th (and the last) is
	 * signaled, and its completion awaited before the next batch. */
	for (uint64_t j = 0; j < count; j++) {
		if (j == count / 2 && j % 2 == 0) {
			/* A session abandoned: nothing of it may be posted. */
			ibv_wr_start(x);
			x->wr_id = 999999;
			x->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(x, dmr->rkey, (uintptr_t)(dst + slots * size));
			ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, size);
			ibv_wr_abort(x);
		}
		if (j % 2 == 0)
			ibv_wr_start(x);
		int last = j == count - 1, signaled = j % signal == signal - 1 || last;
		x->wr_id = j;
		x->wr_flags = signaled ? IBV_SEND_SIGNALED : 0;
		ibv_wr_rdma_write(x, dmr->rkey, (uintptr_t)(dst + (j % slots) * size));
		ibv_wr_set_sge(x, smr->lkey, (uintptr_t)(src + (j % slots) * size), size);
		if (j % 2 == 1 || last) {
			int rc = ibv_wr_complete(x);
			if (rc) {
				errno = rc;
				die("ibv_wr_complete");
			}
		}
		if (signaled)
			expect(cq1, j, IBV_WC_RDMA_WRITE);
	}
	for (size_t k = 0; k < slots && k < count; k++)
		if (memcmp(dst + k * size, src + k * size, size))
			fail("target slot %" PRIu64 " differs from its source (size %" PRIu64 ")",
			     k, size);
	for (size_t b = 0; b < size; b++)
		if (dst[slots * size + b])
			fail("the abandoned session wrote byte %" PRIu64 " (%" PRIu64 ")", b, 0);

	/* 2. SENDs of inline data into posted receives. */
	for (int r = 0; r < RECVS; r++) {
		struct ibv_sge sge = { (uintptr_t)(recv + r * 64), 64, rmr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + r, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp2, &wr, &bad))
			die("ibv_post_recv");
	}
	for (int s = 0; s < RECVS; s++) {
		char msg[16] = { 0 };
		snprintf(msg, sizeof(msg), "inline send %02d", s);
		ibv_wr_start(x);
		x->wr_id = 1000 + s;
		x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_send(x);
		ibv_wr_set_inline_data(x, msg, sizeof(msg));
		int rc = ibv_wr_complete(x);
		if (rc) {
			errno = rc;
			die("ibv_wr_complete (send)");
		}
		memset(msg, 0, sizeof(msg)); /* inline: the data was copied */
		expect(cq1, 1000 + s, IBV_WC_SEND);
		expect(cq2, 100 + s, IBV_WC_RECV);
		char want[16] = { 0 };
		snprintf(want, sizeof(want), "inline send %02d", s);
		if (memcmp(recv + s * 64, want, sizeof(want)))
			fail("SEND %" PRIu64 " arrived changed (%" PRIu64 ")", s, 0);
	}

	/* 3. A READ of the last WRITE's slot back. */
	ibv_wr_start(x);
	x->wr_id = 2000;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(x, dmr->rkey, (uintptr_t)(dst + ((count - 1) % slots) * size));
	ibv_wr_set_sge(x, bmr->lkey, (uintptr_t)back, size);
	int rc = ibv_wr_complete(x);
	if (rc) {
		errno = rc;
		die("ibv_wr_complete (read)");
	}
	expect(cq1, 2000, IBV_WC_RDMA_READ);
	if (memcmp(back, dst + ((count - 1) % slots) * size, size))
		fail("the READ brought back other bytes (%" PRIu64 ", %" PRIu64 ")", size, 0);

	struct ibv_wc wc;
	if (ibv_poll_cq(cq1, 1, &wc) != 0)
		fail("a completion more than was asked for (wr_id %" PRIu64 ")%" PRIu64,
		     wc.wr_id, 0);

	printf("wr_api: ok: %" PRIu64 " WRITEs of %zu B (signaled every %" PRIu64
	       "), %d inline SENDs, 1 READ of %zu B, on %s\n",
	       count, size, signal, RECVS, size, argv[1]);
	ibv_destroy_qp(qp1);
	ibv_destroy_qp(qp2);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(bmr);
	ibv_dereg_mr(rmr);
	ibv_destroy_cq(cq1);
	ibv_destroy_cq(cq2);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
