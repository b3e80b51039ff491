/* Prints the sizes and field offsets of the libibverbs structures
 * mtrdma-preload reads or writes, as the installed rdma-core headers lay
 * them out. build.rs turns the output into Rust constants, and the crate
 * asserts at compile time that its own declarations agree. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define SIZE(t) printf("SIZEOF_%s %zu\n", #t, sizeof(struct t))
#define OFF(t, f, name) printf("%s__%s %zu\n", #t, name, offsetof(struct t, f))

int main(void)
{
	SIZE(ibv_context);
	OFF(ibv_context, ops.poll_cq, "OPS_POLL_CQ");
	OFF(ibv_context, ops.req_notify_cq, "OPS_REQ_NOTIFY_CQ");
	OFF(ibv_context, ops.post_send, "OPS_POST_SEND");
	OFF(ibv_context, ops.post_recv, "OPS_POST_RECV");
	OFF(ibv_context, abi_compat, "ABI_COMPAT");

	SIZE(verbs_context);
	OFF(verbs_context, create_qp_ex, "CREATE_QP_EX");
	OFF(verbs_context, create_cq_ex, "CREATE_CQ_EX");
	OFF(verbs_context, sz, "SZ");
	OFF(verbs_context, context, "CONTEXT");

	SIZE(ibv_pd);
	OFF(ibv_pd, context, "CONTEXT");

	SIZE(ibv_mr);
	OFF(ibv_mr, context, "CONTEXT");
	OFF(ibv_mr, addr, "ADDR");
	OFF(ibv_mr, length, "LENGTH");

	SIZE(ibv_cq);
	OFF(ibv_cq, context, "CONTEXT");
	OFF(ibv_cq, channel, "CHANNEL");
	OFF(ibv_cq, cq_context, "CQ_CONTEXT");
	OFF(ibv_cq, cqe, "CQE");

	SIZE(ibv_qp);
	OFF(ibv_qp, context, "CONTEXT");
	OFF(ibv_qp, send_cq, "SEND_CQ");
	OFF(ibv_qp, qp_num, "QP_NUM");
	OFF(ibv_qp, qp_type, "QP_TYPE");

	SIZE(ibv_qp_cap);
	SIZE(ibv_qp_init_attr);
	OFF(ibv_qp_init_attr, send_cq, "SEND_CQ");
	OFF(ibv_qp_init_attr, cap, "CAP");
	OFF(ibv_qp_init_attr, qp_type, "QP_TYPE");
	OFF(ibv_qp_init_attr, sq_sig_all, "SQ_SIG_ALL");

	SIZE(ibv_qp_init_attr_ex);
	OFF(ibv_qp_init_attr_ex, send_cq, "SEND_CQ");
	OFF(ibv_qp_init_attr_ex, cap, "CAP");
	OFF(ibv_qp_init_attr_ex, qp_type, "QP_TYPE");
	OFF(ibv_qp_init_attr_ex, sq_sig_all, "SQ_SIG_ALL");
	OFF(ibv_qp_init_attr_ex, comp_mask, "COMP_MASK");
	OFF(ibv_qp_init_attr_ex, pd, "PD");
	OFF(ibv_qp_init_attr_ex, send_ops_flags, "SEND_OPS_FLAGS");

	SIZE(ibv_qp_ex);
	OFF(ibv_qp_ex, qp_base, "QP_BASE");
	OFF(ibv_qp_ex, comp_mask, "COMP_MASK");
	OFF(ibv_qp_ex, wr_id, "WR_ID");
	OFF(ibv_qp_ex, wr_flags, "WR_FLAGS");
	OFF(ibv_qp_ex, wr_atomic_cmp_swp, "WR_ATOMIC_CMP_SWP");
	OFF(ibv_qp_ex, wr_atomic_fetch_add, "WR_ATOMIC_FETCH_ADD");
	OFF(ibv_qp_ex, wr_bind_mw, "WR_BIND_MW");
	OFF(ibv_qp_ex, wr_local_inv, "WR_LOCAL_INV");
	OFF(ibv_qp_ex, wr_rdma_read, "WR_RDMA_READ");
	OFF(ibv_qp_ex, wr_rdma_write, "WR_RDMA_WRITE");
	OFF(ibv_qp_ex, wr_rdma_write_imm, "WR_RDMA_WRITE_IMM");
	OFF(ibv_qp_ex, wr_send, "WR_SEND");
	OFF(ibv_qp_ex, wr_send_imm, "WR_SEND_IMM");
	OFF(ibv_qp_ex, wr_send_inv, "WR_SEND_INV");
	OFF(ibv_qp_ex, wr_send_tso, "WR_SEND_TSO");
	OFF(ibv_qp_ex, wr_set_ud_addr, "WR_SET_UD_ADDR");
	OFF(ibv_qp_ex, wr_set_xrc_srqn, "WR_SET_XRC_SRQN");
	OFF(ibv_qp_ex, wr_set_inline_data, "WR_SET_INLINE_DATA");
	OFF(ibv_qp_ex, wr_set_inline_data_list, "WR_SET_INLINE_DATA_LIST");
	OFF(ibv_qp_ex, wr_set_sge, "WR_SET_SGE");
	OFF(ibv_qp_ex, wr_set_sge_list, "WR_SET_SGE_LIST");
	OFF(ibv_qp_ex, wr_start, "WR_START");
	OFF(ibv_qp_ex, wr_complete, "WR_COMPLETE");
	OFF(ibv_qp_ex, wr_abort, "WR_ABORT");
	OFF(ibv_qp_ex, wr_atomic_write, "WR_ATOMIC_WRITE");

	SIZE(ibv_sge);
	SIZE(ibv_send_wr);
	OFF(ibv_send_wr, wr_id, "WR_ID");
	OFF(ibv_send_wr, next, "NEXT");
	OFF(ibv_send_wr, sg_list, "SG_LIST");
	OFF(ibv_send_wr, num_sge, "NUM_SGE");
	OFF(ibv_send_wr, opcode, "OPCODE");
	OFF(ibv_send_wr, send_flags, "SEND_FLAGS");
	OFF(ibv_send_wr, imm_data, "IMM_DATA");
	OFF(ibv_send_wr, wr, "WR");
	OFF(ibv_send_wr, qp_type, "QP_TYPE");

	SIZE(ibv_recv_wr);
	SIZE(ibv_wc);
	OFF(ibv_wc, wr_id, "WR_ID");
	OFF(ibv_wc, status, "STATUS");
	OFF(ibv_wc, opcode, "OPCODE");
	OFF(ibv_wc, byte_len, "BYTE_LEN");
	OFF(ibv_wc, imm_data, "IMM_DATA");
	OFF(ibv_wc, qp_num, "QP_NUM");
	OFF(ibv_wc, wc_flags, "WC_FLAGS");

	SIZE(ibv_comp_channel);
	OFF(ibv_comp_channel, fd, "FD");
	return 0;
}
