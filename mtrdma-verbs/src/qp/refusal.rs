//! What a device refused, said as what it is: a kind of request it does
//! not run, or its provider's `errno`.

use std::io;

use ibverbs_sys as ffi;

use crate::Error;

/// Why the provider refused a request of (opcode, scatter entries)
/// `refused` with return code `rc` (0 if it returned success and pointed
/// at the request all the same): a kind of request the device does not
/// run, said as such, or the provider's `errno`.
pub(super) fn refusal_error(
    ctx: &crate::Context,
    rc: i32,
    refused: Option<(ffi::ibv_wr_opcode::Type, i32)>,
) -> Error {
    if let Some(error) = refused.and_then(|(opcode, sges)| unsupported(ctx, opcode, sges)) {
        return error;
    }
    let device = ctx.name().to_string();
    let source = if rc == 0 {
        io::Error::other("the provider refused the request but returned success")
    } else {
        crate::error::errno(rc)
    };
    Error::Verbs {
        call: "ibv_post_send",
        device,
        source,
    }
}

/// A request of `opcode` with `sges` scatter entries, if `ctx`'s device
/// does not run it: immediate data on iWARP, a READ into more entries
/// than its `max_sge_rd`, atomic operations without an atomic capability. Checked
/// before a scheduled request is accepted, and when a device refuses a
/// direct one.
fn unsupported(ctx: &crate::Context, opcode: ffi::ibv_wr_opcode::Type, sges: i32) -> Option<Error> {
    use ffi::ibv_wr_opcode::*;
    let (operation, why) = match opcode {
        IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM if ctx.is_iwarp() => {
            ("immediate data", "iWARP carries none")
        }
        IBV_WR_RDMA_READ
            if sges > 1
                && ctx.max_read_sge() > 0
                && i64::from(sges) > i64::from(ctx.max_read_sge()) =>
        {
            (
                "READs into that many regions",
                "more than its max_sge_rd (1 on iWARP)",
            )
        }
        IBV_WR_ATOMIC_FETCH_AND_ADD | IBV_WR_ATOMIC_CMP_AND_SWP if !ctx.has_atomics() => (
            "atomic operations",
            "its atomic capability is IBV_ATOMIC_NONE",
        ),
        _ => return None,
    };
    Some(Error::OperationUnsupported {
        device: ctx.name().to_string(),
        operation,
        why,
    })
}

/// [`unsupported`] for `op` on `sges` regions: what a scheduled queue
/// pair checks before accepting a request, and a sink before posting a
/// gather.
pub(crate) fn unsupported_op(
    ctx: &crate::Context,
    op: crate::SendOp,
    sges: usize,
) -> Option<Error> {
    let sges = i32::try_from(sges).unwrap_or(i32::MAX);
    unsupported(ctx, op.lower(true).0, sges)
}
