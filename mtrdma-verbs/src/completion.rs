//! Work completions, typed.

use std::fmt;

use ibverbs_sys as ffi;

use crate::MemoryRegion;

/// How a work request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// It completed.
    Success,
    /// A receive buffer was too small for the message, or a local length was wrong.
    LocalLength,
    /// A local queue pair consistency error.
    LocalQpOperation,
    /// The local key or access rights did not allow the access.
    LocalProtection,
    /// The queue pair went to the error state before the request ran (flushed).
    Flushed,
    /// The peer refused the memory access (rkey, bounds or rights).
    RemoteAccess,
    /// The peer could not run the operation.
    RemoteOperation,
    /// The peer did not answer after all retries: it is gone, or the path
    /// (GID, route) is wrong.
    RetryExceeded,
    /// The peer had no receive posted after all retries.
    RnrRetryExceeded,
    /// The peer reported an invalid request.
    RemoteInvalidRequest,
    /// Another status (the raw `ibv_wc_status` value).
    Other(u32),
}

impl WcStatus {
    pub(crate) fn from_raw(status: u32) -> Self {
        use ffi::ibv_wc_status as s;
        match status {
            s::IBV_WC_SUCCESS => WcStatus::Success,
            s::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
            s::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOperation,
            s::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
            s::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            s::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
            s::IBV_WC_REM_OP_ERR => WcStatus::RemoteOperation,
            s::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
            s::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceeded,
            s::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
            other => WcStatus::Other(other),
        }
    }

    /// The `ibv_wc_status` value.
    pub fn to_raw(self) -> u32 {
        use ffi::ibv_wc_status as s;
        match self {
            WcStatus::Success => s::IBV_WC_SUCCESS,
            WcStatus::LocalLength => s::IBV_WC_LOC_LEN_ERR,
            WcStatus::LocalQpOperation => s::IBV_WC_LOC_QP_OP_ERR,
            WcStatus::LocalProtection => s::IBV_WC_LOC_PROT_ERR,
            WcStatus::Flushed => s::IBV_WC_WR_FLUSH_ERR,
            WcStatus::RemoteAccess => s::IBV_WC_REM_ACCESS_ERR,
            WcStatus::RemoteOperation => s::IBV_WC_REM_OP_ERR,
            WcStatus::RetryExceeded => s::IBV_WC_RETRY_EXC_ERR,
            WcStatus::RnrRetryExceeded => s::IBV_WC_RNR_RETRY_EXC_ERR,
            WcStatus::RemoteInvalidRequest => s::IBV_WC_REM_INV_REQ_ERR,
            WcStatus::Other(raw) => raw,
        }
    }

    /// True for [`WcStatus::Success`].
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Success => f.write_str("success"),
            WcStatus::LocalLength => f.write_str("local length error (receive buffer too small?)"),
            WcStatus::LocalQpOperation => f.write_str("local queue pair operation error"),
            WcStatus::LocalProtection => f.write_str("local protection error (wrong lkey or access)"),
            WcStatus::Flushed => f.write_str("flushed: the queue pair entered the error state"),
            WcStatus::RemoteAccess => {
                f.write_str("remote access error (rkey, bounds or access rights refused by the peer)")
            }
            WcStatus::RemoteOperation => f.write_str("remote operation error"),
            WcStatus::RetryExceeded => f.write_str(
                "transport retries exceeded: the peer is gone or unreachable (check the GID index and route)",
            ),
            WcStatus::RnrRetryExceeded => f.write_str("receiver not ready: the peer posted no receive"),
            WcStatus::RemoteInvalidRequest => f.write_str("the peer found the request invalid"),
            WcStatus::Other(s) => write!(f, "completion status {s}"),
        }
    }
}

/// What a completed work request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// A SEND (with or without immediate).
    Send,
    /// An RDMA WRITE (with or without immediate).
    Write,
    /// An RDMA READ.
    Read,
    /// An atomic operation (fetch-and-add or compare-and-swap).
    Atomic,
    /// A receive that got a SEND.
    Recv,
    /// A receive consumed by a WRITE with immediate.
    RecvWithImm,
    /// A lent piece's memory window invalidated: the piece is back and
    /// the peer's key no longer works ([`QueuePair::take_back`](crate::QueuePair::take_back)).
    Invalidate,
    /// Not known (the request failed before it ran).
    Unknown,
}

/// A completed work request, with the buffer it used handed back.
#[derive(Debug)]
pub struct Completion {
    /// The caller's value given when posting.
    pub context: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: Opcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data, for SEND/WRITE with immediate.
    pub imm: Option<u32>,
    /// The region the request used, back in the caller's hands; for a
    /// gather request ([`QueuePair::post_send_gather`]), its first region.
    ///
    /// [`QueuePair::post_send_gather`]: crate::QueuePair::post_send_gather
    pub region: MemoryRegion,
    /// A gather request's regions after the first, in the order they were
    /// posted; empty for every other request. Together with
    /// [`region`](Self::region) they are every region the request named,
    /// whether it succeeded, failed or was flushed.
    pub gathered: Vec<MemoryRegion>,
}

impl Completion {
    /// Every region the request named, in order: [`region`](Self::region),
    /// then [`gathered`](Self::gathered).
    pub fn into_regions(self) -> Vec<MemoryRegion> {
        let mut regions = Vec::with_capacity(1 + self.gathered.len());
        regions.push(self.region);
        regions.extend(self.gathered);
        regions
    }
}
