//! What the scheduler is fed (descriptors) and what it answers (grants).

use crate::{TenantId, TrafficClass};

use crate::time::Nanos;

/// The kind of work request a descriptor stands for; decides whether it may
/// be split into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Opcode {
    /// A two-sided SEND: the receiver consumes one receive buffer per
    /// message, so it is never split.
    Send,
    /// A one-sided RDMA WRITE: split into chunks at offsets.
    #[default]
    Write,
    /// A one-sided RDMA READ: split into chunks at offsets.
    Read,
    /// An atomic operation (8 bytes): never split.
    Atomic,
}

impl Opcode {
    /// Whether a descriptor of this kind may be split into chunks.
    pub const fn is_splittable(self) -> bool {
        matches!(self, Opcode::Write | Opcode::Read)
    }
}

/// One work request as the scheduler sees it: who sends it, how urgent it
/// is, how many bytes it moves, and an opaque handle the caller uses to find
/// the real work request again (a slab index, typically).
///
/// ```
/// use mtrdma_sched::{TenantId, TrafficClass};
/// use mtrdma_sched::{Descriptor, Opcode};
/// let d = Descriptor::new(TenantId(1), TrafficClass::Bulk, Opcode::Write, 1 << 20, 42usize);
/// assert_eq!(d.bytes, 1 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<H> {
    /// The tenant it is charged to.
    pub tenant: TenantId,
    /// Its traffic class.
    pub class: TrafficClass,
    /// The kind of work request.
    pub op: Opcode,
    /// Payload bytes.
    pub bytes: u64,
    /// The caller's handle, returned with every grant.
    pub handle: H,
    /// Granted in one piece whatever its size, even a WRITE or READ larger
    /// than the chunk size (see [`whole`](Self::whole)).
    pub whole: bool,
}

impl<H> Descriptor<H> {
    /// A descriptor with these fields (split into chunks if its kind may
    /// be).
    pub fn new(tenant: TenantId, class: TrafficClass, op: Opcode, bytes: u64, handle: H) -> Self {
        Descriptor {
            tenant,
            class,
            op,
            bytes,
            handle,
            whole: false,
        }
    }

    /// The same descriptor, granted in one piece: for a request the peer
    /// must see as one (a WRITE with immediate, whose receive completion
    /// reports only the bytes of the piece that carries the immediate).
    /// Its bytes are charged to its tenant as one piece.
    pub fn whole(self) -> Self {
        Descriptor {
            whole: true,
            ..self
        }
    }

    /// Whether it may be split into chunks.
    pub fn is_splittable(&self) -> bool {
        !self.whole && self.op.is_splittable()
    }

    /// The one grant of all its bytes: what a scheduler that does not
    /// split hands out.
    pub fn grant_whole(self) -> Grant<H> {
        let len = self.bytes;
        self.piece(0, len, true)
    }

    /// The grant of its `len` bytes at `offset`, the last one if `is_last`.
    #[inline(always)]
    pub(crate) fn piece(self, offset: u64, len: u64, is_last: bool) -> Grant<H> {
        Grant {
            tenant: self.tenant,
            class: self.class,
            op: self.op,
            handle: self.handle,
            offset,
            len,
            is_last,
        }
    }
}

/// Permission to post (part of) one descriptor now.
///
/// A descriptor that was split yields one grant per chunk, in order; the
/// caller posts `len` bytes at `offset` of the work request behind `handle`,
/// and reports the original work request complete once the completion of
/// the grant with `is_last` arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant<H> {
    /// The tenant it is charged to.
    pub tenant: TenantId,
    /// Its traffic class.
    pub class: TrafficClass,
    /// The kind of work request.
    pub op: Opcode,
    /// The descriptor's handle.
    pub handle: H,
    /// Byte offset of this piece within the descriptor.
    pub offset: u64,
    /// Bytes in this piece.
    pub len: u64,
    /// Whether this is the descriptor's last piece.
    pub is_last: bool,
}

/// The answer to "what next?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dequeue<H> {
    /// Post this now.
    Ready(Grant<H>),
    /// Work is queued but none may go before this time (rate caps): ask
    /// again then, or earlier if something new is enqueued.
    Wait(Nanos),
    /// Nothing is queued.
    Empty,
}

impl<H> Dequeue<H> {
    /// The grant, if one is ready.
    pub fn ready(self) -> Option<Grant<H>> {
        match self {
            Dequeue::Ready(g) => Some(g),
            _ => None,
        }
    }
}
