//! Reading a work completion the provider wrote: only the fields the verbs
//! specification defines for its status and opcode.
//!
//! `ibv_poll_cq(3)`: when the status is not `IBV_WC_SUCCESS`, only
//! `wr_id`, `status`, `qp_num` and `vendor_err` are valid; `byte_len`
//! counts the bytes of a receive, an RDMA READ or an atomic; `imm_data`
//! holds something only with `IBV_WC_WITH_IMM` in `wc_flags`; `src_qp`
//! and the GRH flag belong to receives. A provider need not write the
//! others (SoftRoCE happens to write them all; others do not), so reading
//! them from the array handed to `ibv_poll_cq` would read uninitialised
//! memory. Each field is read here on its own through a raw pointer, never
//! by taking a reference to the whole entry.

use super::*;

/// Offsets of `struct ibv_wc`'s fields (rdma-core's layout, the same as
/// `ibverbs_sys::ibv_wc`'s; checked against its accessors in the tests).
mod offset {
    pub(super) const WR_ID: usize = 0;
    pub(super) const STATUS: usize = 8;
    pub(super) const OPCODE: usize = 12;
    pub(super) const BYTE_LEN: usize = 20;
    pub(super) const IMM_DATA: usize = 24;
    pub(super) const QP_NUM: usize = 28;
    pub(super) const SRC_QP: usize = 32;
    pub(super) const WC_FLAGS: usize = 36;
}

/// What a work completion says, as far as its status and opcode define.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawWc {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    /// The local queue pair it belongs to (defined whatever the status:
    /// how a completion queue shared by several queue pairs routes it).
    pub(crate) qp_num: u32,
    /// Its opcode, on success.
    pub(crate) opcode: Option<ffi::ibv_wc_opcode::Type>,
    /// Bytes of a successful receive, RDMA READ or atomic.
    pub(crate) byte_len: Option<u32>,
    /// Immediate data (network order), when the completion carries some.
    pub(crate) imm: Option<u32>,
    /// The sender's queue pair, for a successful receive.
    pub(crate) src_qp: Option<u32>,
    /// Whether a successful receive's first 40 bytes hold a GRH.
    pub(crate) grh: bool,
}

impl RawWc {
    /// Reads the entry `raw` that `ibv_poll_cq` returned.
    ///
    /// # Safety
    /// `raw` is one of the entries `ibv_poll_cq` reported as written: at
    /// least the fields the specification defines for its status and
    /// opcode are initialised.
    #[inline]
    pub(crate) unsafe fn read(raw: &MaybeUninit<ffi::ibv_wc>) -> RawWc {
        let base = raw.as_ptr().cast::<u8>();
        // SAFETY: every offset lies inside `ibv_wc` (48 bytes) at a field
        // of the type read and of its alignment (the struct is 8-aligned);
        // each field read is one the caller promises is written for the
        // status and opcode already read.
        let u32_at = |at: usize| unsafe { base.add(at).cast::<u32>().read() };
        // SAFETY: as above; `wr_id` is always written.
        let wr_id = unsafe { base.add(offset::WR_ID).cast::<u64>().read() };
        let status = u32_at(offset::STATUS);
        let qp_num = u32_at(offset::QP_NUM);
        if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            return RawWc {
                wr_id,
                status: WcStatus::from_raw(status),
                qp_num,
                opcode: None,
                byte_len: None,
                imm: None,
                src_qp: None,
                grh: false,
            };
        }
        use ffi::ibv_wc_opcode as o;
        let opcode = u32_at(offset::OPCODE);
        let flags = u32_at(offset::WC_FLAGS);
        let receive = opcode & o::IBV_WC_RECV != 0;
        let counted = receive
            || matches!(
                opcode,
                o::IBV_WC_RDMA_READ | o::IBV_WC_COMP_SWAP | o::IBV_WC_FETCH_ADD
            );
        let with_imm = flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        RawWc {
            wr_id,
            status: WcStatus::Success,
            qp_num,
            opcode: Some(opcode),
            byte_len: counted.then(|| u32_at(offset::BYTE_LEN)),
            imm: with_imm.then(|| u32_at(offset::IMM_DATA)),
            src_qp: receive.then(|| u32_at(offset::SRC_QP)),
            grh: receive && flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry with only the bytes of `fields` written (offset, value),
    /// as a provider that writes nothing else leaves it.
    fn entry(fields: &[(usize, u32)], wr_id: u64) -> MaybeUninit<ffi::ibv_wc> {
        let mut raw = MaybeUninit::<ffi::ibv_wc>::uninit();
        let base = raw.as_mut_ptr().cast::<u8>();
        // SAFETY: the offsets are `ibv_wc`'s fields, in bounds and aligned.
        unsafe {
            base.add(offset::WR_ID).cast::<u64>().write(wr_id);
            for &(at, value) in fields {
                base.add(at).cast::<u32>().write(value);
            }
        }
        raw
    }

    // These read entries that are only partly written: under Miri
    // (`cargo +nightly miri test -p mtrdma-verbs --lib qp::wc`, a stage of
    // `cargo xtask test`), reading any other field is reported as
    // undefined behaviour.

    #[test]
    fn an_error_completion_reads_only_wr_id_and_status() {
        let raw = entry(
            &[
                (offset::STATUS, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR),
                (offset::QP_NUM, 0x42),
            ],
            7,
        );
        // SAFETY: the fields defined for an error are written.
        let wc = unsafe { RawWc::read(&raw) };
        assert_eq!(wc.wr_id, 7);
        assert_eq!(wc.status, WcStatus::Flushed);
        assert_eq!(wc.qp_num, 0x42, "the queue pair is defined for errors too");
        assert_eq!(
            (wc.opcode, wc.byte_len, wc.imm, wc.src_qp),
            (None, None, None, None)
        );
    }

    #[test]
    fn a_send_completion_reads_no_length_and_no_immediate() {
        let raw = entry(
            &[
                (offset::STATUS, ffi::ibv_wc_status::IBV_WC_SUCCESS),
                (offset::OPCODE, ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE),
                (offset::QP_NUM, 5),
                (offset::WC_FLAGS, 0),
            ],
            9,
        );
        // SAFETY: the fields defined for a successful WRITE are written.
        let wc = unsafe { RawWc::read(&raw) };
        assert_eq!(wc.opcode, Some(ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE));
        assert_eq!((wc.byte_len, wc.imm, wc.src_qp), (None, None, None));
    }

    #[test]
    fn a_receive_reads_its_length_source_and_immediate_only_when_flagged() {
        let fields = [
            (offset::STATUS, ffi::ibv_wc_status::IBV_WC_SUCCESS),
            (offset::OPCODE, ffi::ibv_wc_opcode::IBV_WC_RECV),
            (offset::BYTE_LEN, 1040),
            (offset::SRC_QP, 0x11),
            (offset::WC_FLAGS, ffi::ibv_wc_flags::IBV_WC_GRH.0),
            (offset::QP_NUM, 6),
        ];
        // SAFETY: the fields defined for a receive without immediate are
        // written.
        let wc = unsafe { RawWc::read(&entry(&fields, 3)) };
        assert_eq!(
            (wc.byte_len, wc.src_qp, wc.imm, wc.grh),
            (Some(1040), Some(0x11), None, true)
        );
        let mut with_imm = fields.to_vec();
        with_imm[4].1 = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        with_imm.push((offset::IMM_DATA, 0x0102_0304));
        // SAFETY: as above, and the immediate too.
        let wc = unsafe { RawWc::read(&entry(&with_imm, 3)) };
        assert_eq!((wc.imm, wc.grh), (Some(0x0102_0304), false));
    }

    #[test]
    fn the_offsets_are_those_of_ibverbs_sys() {
        // Every byte written, each field a value of its own; the crate's
        // accessors must read what the offsets say.
        let mut raw = MaybeUninit::<ffi::ibv_wc>::zeroed();
        let base = raw.as_mut_ptr().cast::<u8>();
        // SAFETY: in bounds and aligned, as above.
        unsafe {
            base.add(offset::WR_ID).cast::<u64>().write(0xdead_beef);
            base.add(offset::STATUS).cast::<u32>().write(0);
            base.add(offset::OPCODE)
                .cast::<u32>()
                .write(ffi::ibv_wc_opcode::IBV_WC_RECV);
            base.add(offset::BYTE_LEN).cast::<u32>().write(77);
            base.add(offset::IMM_DATA).cast::<u32>().write(88);
            base.add(offset::QP_NUM).cast::<u32>().write(66);
            base.add(offset::SRC_QP).cast::<u32>().write(99);
            base.add(offset::WC_FLAGS)
                .cast::<u32>()
                .write(ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0);
        }
        // SAFETY: zeroed, then written: every byte is initialised.
        let wc = unsafe { raw.assume_init_ref() };
        assert_eq!(wc.wr_id(), 0xdead_beef);
        assert_eq!(wc.opcode(), ffi::ibv_wc_opcode::IBV_WC_RECV);
        assert_eq!(wc.len(), 77);
        assert_eq!(wc.imm_data(), Some(88));
        assert_eq!(wc.src_qp, 99);
        assert_eq!(wc.qp_num, 66);
        assert!(wc.error().is_none());
    }
}
