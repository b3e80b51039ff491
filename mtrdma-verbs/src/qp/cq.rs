//! The completion queue a queue pair polls: its own, or a handle on a
//! [`SharedCompletionQueue`](crate::SharedCompletionQueue)'s, which only
//! that queue polls and destroys.

use super::*;

pub(crate) struct Cq {
    pub(crate) cq: NonNull<ffi::ibv_cq>,
    /// Its completion channel, if it has one (see [`crate::events`]).
    /// Dropped after `Drop::drop` destroyed the CQ: the channel goes last.
    pub(crate) events: Option<CompChannel>,
    /// Whether this handle polls and destroys the CQ. A queue pair on a
    /// shared completion queue holds a handle that does neither: the
    /// shared queue polls for all its queue pairs and routes each
    /// completion to its own.
    owner: bool,
    /// Armed for an event whose descriptor has not been read yet
    /// ([`Cq::arm`], [`Cq::take_events`]): a completion after the arm
    /// raises (or raised) it, so arming again would only cost a system
    /// call and leave a second event to read.
    pub(crate) armed: std::cell::Cell<bool>,
}

impl Cq {
    /// A completion queue of at least `entries` entries, with a completion
    /// channel of its own if `events`.
    pub(crate) fn new(ctx: &crate::Context, entries: u32, events: bool) -> Result<Cq, Error> {
        let cqe = i32::try_from(entries).unwrap_or(i32::MAX);
        let events = if events {
            Some(CompChannel::new(ctx)?)
        } else {
            None
        };
        let channel = events
            .as_ref()
            .map_or(std::ptr::null_mut(), CompChannel::raw);
        // SAFETY: the context is open; the channel, if any, is live and
        // outlives the CQ (see `events`); no context pointer.
        let cq = unsafe { ffi::ibv_create_cq(ctx.raw(), cqe, std::ptr::null_mut(), channel, 0) };
        match NonNull::new(cq) {
            Some(cq) => Ok(Cq {
                cq,
                events,
                owner: true,
                armed: std::cell::Cell::new(false),
            }),
            None => Err(Error::Verbs {
                call: "ibv_create_cq",
                device: ctx.name().to_string(),
                source: crate::error::verbs_errno(),
            }),
        }
    }

    /// A handle on `self` for a queue pair on it that neither polls it
    /// nor destroys it (see `owner`).
    pub(crate) fn member(&self) -> Cq {
        Cq {
            cq: self.cq,
            events: None,
            owner: false,
            armed: std::cell::Cell::new(false),
        }
    }

    /// Polls up to 32 completions and hands each, read, to `each`, in
    /// order; returns how many, or the provider's error (as
    /// [`poll`](Self::poll)).
    #[inline]
    pub(crate) fn poll_each(&self, mut each: impl FnMut(RawWc)) -> Result<usize, io::Error> {
        // Not zeroed: the provider writes the entries it returns, and a
        // busy poll that finds nothing should cost nothing but the call.
        let mut wcs = [const { MaybeUninit::<ffi::ibv_wc>::uninit() }; 32];
        let n = self.poll(&mut wcs)?;
        for entry in &wcs[..n] {
            // SAFETY: `poll` returns how many entries the provider wrote.
            each(unsafe { RawWc::read(entry) });
        }
        Ok(n)
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many
    /// (the first that many entries are written), or the provider's error.
    /// A member's handle refuses: its completions belong to the shared
    /// queue, which routes them.
    #[inline]
    pub(crate) fn poll(&self, wcs: &mut [MaybeUninit<ffi::ibv_wc>]) -> Result<usize, io::Error> {
        if !self.owner {
            return Err(io::Error::from_raw_os_error(22));
        }
        let room = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: the CQ is live while `self` is (and so is its context,
        // kept open by the owner's PD); `wcs` has room for `room` entries.
        let n = unsafe {
            let ctx = self.cq.as_ref().context;
            match (*ctx).ops.poll_cq {
                Some(poll) => poll(self.cq.as_ptr(), room, wcs.as_mut_ptr().cast()),
                None => -libc_enosys(),
            }
        };
        usize::try_from(n)
            .map(|n| n.min(wcs.len()))
            .map_err(|_| io::Error::from_raw_os_error(-n))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        // SAFETY: the CQ is ours; its QP was destroyed first (field order
        // and `QueuePair::drop`). Every event taken from its channel was
        // acknowledged at once (`Cq::take_events`), so this does not wait.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}
