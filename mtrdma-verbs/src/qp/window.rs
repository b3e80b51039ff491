//! Pieces lent to the peer through memory windows of type 2: the peer
//! gets a key to one piece, bound to this queue pair, and the key stops
//! working when the piece is taken back.

use std::collections::HashMap;

use super::books::{own_wr_id, BIND_WR};
use super::*;

/// A piece lent to the peer: the piece (held by the queue pair, so safe
/// code cannot touch bytes the peer may write) and the window it is
/// reached through.
struct Loan {
    region: MemoryRegion,
    mw: NonNull<ffi::ibv_mw>,
}

/// A queue pair's memory windows: the pieces lent through them, those
/// being taken back, and the windows free to bind again.
#[derive(Default)]
pub(crate) struct Windows {
    /// The pieces lent, by the key the peer was given.
    lent: HashMap<u32, Loan>,
    /// Windows whose invalidation is posted, by the invalidation's slot.
    retiring: HashMap<u64, NonNull<ffi::ibv_mw>>,
    /// Windows invalidated, free to bind again.
    spare: Vec<NonNull<ffi::ibv_mw>>,
    /// Windows whose invalidation failed (the queue pair is in the error
    /// state): freed with the queue pair.
    dead: Vec<NonNull<ffi::ibv_mw>>,
    /// Every window is freed ([`free`](Self::free)).
    freed: bool,
}

impl Windows {
    /// A completion with the device `wr_id` `wr_id` arrived: if it is a
    /// window's invalidation, the window is free again (or, if it failed,
    /// kept for the queue pair's end).
    #[inline]
    pub(crate) fn settle(&mut self, wr_id: u64, success: bool) {
        if self.retiring.is_empty() {
            return;
        }
        if let Some(mw) = self.retiring.remove(&own_wr_id(wr_id)) {
            if success {
                self.spare.push(mw);
            } else {
                self.dead.push(mw);
            }
        }
    }

    /// Pieces lent and not yet taken back.
    pub(crate) fn lent(&self) -> usize {
        self.lent.len()
    }

    /// Frees every window, before its queue pair is destroyed: a bound
    /// window of type 2 holds its queue pair, and the provider waits for
    /// it to go when destroying the queue pair (rxe, a minute). The lent
    /// pieces stay until [`close`](Self::close).
    pub(crate) fn free(&mut self) {
        let mws = self
            .lent
            .values()
            .map(|l| l.mw)
            .chain(self.retiring.drain().map(|(_, mw)| mw))
            .chain(self.spare.drain(..))
            .chain(self.dead.drain(..))
            .collect::<Vec<_>>();
        for mw in mws {
            // SAFETY: the window is ours and freed once (the lent pieces'
            // are not used again: `close` only drops the pieces).
            let rc = unsafe { dealloc_mw(mw) };
            if rc != 0 {
                tracing::warn!(rc, "ibv_dealloc_mw failed");
            }
        }
        self.freed = true;
    }

    /// Drops the lent pieces once the queue pair is destroyed and its
    /// windows freed (`destroyed`); else leaks them, as the queue pair's
    /// own are (a window may still reach them).
    pub(crate) fn close(&mut self, destroyed: bool) {
        let loans = std::mem::take(&mut self.lent);
        for (_, loan) in loans {
            if destroyed && self.freed {
                drop(loan.region);
            } else {
                std::mem::forget(loan.region);
            }
        }
    }
}

/// `ibv_alloc_mw(pd, IBV_MW_TYPE_2)` (an inline function in verbs.h).
///
/// # Safety
/// `pd` is live.
unsafe fn alloc_mw(pd: *mut ffi::ibv_pd) -> Option<NonNull<ffi::ibv_mw>> {
    // SAFETY: `pd` and its context are live (the caller's promise).
    unsafe {
        let ctx = (*pd).context;
        match (*ctx).ops.alloc_mw {
            Some(alloc) => NonNull::new(alloc(pd, ffi::IBV_MW_TYPE_2)),
            None => None,
        }
    }
}

/// `ibv_dealloc_mw(mw)`.
///
/// # Safety
/// `mw` is live and freed once.
unsafe fn dealloc_mw(mw: NonNull<ffi::ibv_mw>) -> i32 {
    // SAFETY: the caller's promise.
    unsafe {
        let ctx = mw.as_ref().context;
        match (*ctx).ops.dealloc_mw {
            Some(dealloc) => dealloc(mw.as_ptr()),
            None => libc_enosys(),
        }
    }
}

/// The next key of a window whose key is `rkey` (`ibv_inc_rkey`: the low
/// byte is the consumer's to change).
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

impl QueuePair {
    /// Lends `region` (a piece of a registration made
    /// [`lendable`](Access::lendable)) to the peer with `rights`: binds a
    /// memory window of type 2 over exactly its bytes, on this queue pair,
    /// and returns what the peer needs to reach them. The peer reaches
    /// them only through this queue pair, and only until the piece is
    /// taken back ([`take_back`](Self::take_back)); the window's bounds
    /// keep it to this piece on devices that enforce them, as the verbs
    /// specification asks (stock rxe does not: it checks a window's accesses
    /// against the whole registration; a [`Lease`](crate::Lease) is
    /// bounded on every device). Until then the queue pair holds
    /// the piece; dropping the queue pair revokes the key and frees it.
    ///
    /// The bind is a work request on the send queue: requests posted after
    /// it (a SEND telling the peer the key) reach the peer after it. The
    /// queue pair must grant the rights lent (its
    /// [`access`](crate::QueuePairBuilder::access), READ and WRITE by
    /// default).
    ///
    /// Refused, region handed back in the [`PostError`]: a registration
    /// not lendable, `rights` with no remote right, a region of another
    /// protection domain, a full send queue, or a device without memory
    /// windows ([`Error::MemoryWindowsUnsupported`]).
    pub fn lend(
        &mut self,
        region: MemoryRegion,
        rights: Access,
    ) -> Result<RemoteRegion, PostError> {
        let refuse = |error, region| Err(PostError::new((error, region)));
        if !region.access().lendable {
            return refuse(Error::NotLendable, region);
        }
        let flags = rights.remote_flags();
        if flags == 0 {
            return refuse(Error::NoRightsToLend, region);
        }
        if region.pd().raw() != self.pd.raw() {
            let error = Error::ForeignObject {
                what: "memory region",
                with: "queue pair",
                scope: "protection domain",
            };
            return refuse(error, region);
        }
        if self.books.sends_in_flight >= self.books.max_send_wr {
            let depth = self.books.max_send_wr;
            return refuse(Error::SendQueueFull { depth }, region);
        }
        let mw = match self.windows().spare.pop() {
            Some(mw) => mw,
            // SAFETY: the PD is live while `self` is.
            None => match unsafe { alloc_mw(self.pd.raw()) } {
                Some(mw) => mw,
                None => {
                    let device = self.pd.context().name().to_string();
                    return refuse(Error::MemoryWindowsUnsupported { device }, region);
                }
            },
        };
        // SAFETY: `mw` is a live window of ours.
        let rkey = inc_rkey(unsafe { mw.as_ref().rkey });
        let (addr, len) = (region.addr(), region.len() as u64);
        let mut wr = ffi::ibv_send_wr {
            wr_id: BIND_WR,
            opcode: ffi::ibv_wr_opcode::IBV_WR_BIND_MW,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            // SAFETY: all-zero is a valid value of this plain C struct.
            ..unsafe { std::mem::MaybeUninit::zeroed().assume_init() }
        };
        wr.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: mw.as_ptr(),
            rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr: region.raw_mr().as_ptr(),
                addr,
                length: len,
                mw_access_flags: flags,
            },
        };
        // SAFETY: the QP and the window are live; the piece's bytes stay
        // registered and untouched by safe code while it is lent (the
        // queue pair holds it).
        let posted = unsafe { post_send_list(self.qp, &mut wr, &mut self.books, &self.pd, |_| {}) };
        if let Err((_, error)) = posted {
            self.windows().spare.push(mw);
            return refuse(error, region);
        }
        self.books.sends_in_flight += 1;
        // The provider takes the window's key from it, as `ibv_bind_mw`
        // leaves it.
        // SAFETY: `mw` is ours; no other thread reaches it.
        unsafe { (*mw.as_ptr()).rkey = rkey };
        self.windows().lent.insert(rkey, Loan { region, mw });
        Ok(RemoteRegion { addr, len, rkey })
    }

    /// Takes back the piece lent under `lent`'s key: invalidates its
    /// memory window (a work request on the send queue, after everything
    /// posted before it), after which the peer's key no longer works. The
    /// piece comes back in that request's [`Completion`], with `context`
    /// and [`Opcode::Invalidate`](crate::Opcode::Invalidate).
    ///
    /// # Errors
    /// [`Error::NotLent`] if no piece is lent under the key, or the send
    /// queue is full (the piece stays lent).
    pub fn take_back(&mut self, lent: &RemoteRegion, context: u64) -> Result<(), Error> {
        let rkey = lent.rkey;
        if !self
            .windows
            .as_ref()
            .is_some_and(|w| w.lent.contains_key(&rkey))
        {
            return Err(Error::NotLent { rkey });
        }
        if self.books.sends_in_flight >= self.books.max_send_wr {
            let depth = self.books.max_send_wr;
            return Err(Error::SendQueueFull { depth });
        }
        let Loan { region, mw } = self.windows().lent.remove(&rkey).expect("looked up above");
        let len = region.len() as u32;
        let slot = self.books.park(Slot {
            context,
            region,
            rest: Vec::new(),
            send: true,
            len,
        }) as u64;
        let mut wr = ffi::ibv_send_wr {
            wr_id: slot,
            opcode: ffi::ibv_wr_opcode::IBV_WR_LOCAL_INV,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            // SAFETY: all-zero is a valid value of this plain C struct.
            ..unsafe { std::mem::MaybeUninit::zeroed().assume_init() }
        };
        wr.__bindgen_anon_1.invalidate_rkey = rkey;
        // SAFETY: the QP is live; the request names no memory.
        let posted = unsafe { post_send_list(self.qp, &mut wr, &mut self.books, &self.pd, |_| {}) };
        if let Err((_, error)) = posted {
            let slot = self.books.unpark(slot as usize).expect("parked above");
            self.windows().lent.insert(
                rkey,
                Loan {
                    region: slot.region,
                    mw,
                },
            );
            return Err(error);
        }
        self.books.sends_in_flight += 1;
        self.windows().retiring.insert(slot, mw);
        Ok(())
    }

    /// Pieces lent ([`lend`](Self::lend)) and not yet taken back.
    pub fn lent(&self) -> usize {
        self.windows.as_ref().map_or(0, |w| w.lent())
    }

    /// Its windows, made at the first loan.
    fn windows(&mut self) -> &mut Windows {
        self.windows.get_or_insert_with(Default::default)
    }
}
