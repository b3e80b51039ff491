//! What the engine keeps of each request and queue pair: the requests and
//! their pieces in the NIC, and each attached queue pair's side (its lock,
//! and the book of what was decided for it and what it finished).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ibverbs_sys as ffi;

use super::{lock, post_pieces, Done};
use crate::completion::{Opcode, WcStatus};
use crate::qp::{Extra, RawCompletion, RawSend, Region, SendOp, Sink};
use crate::Error;

/// The handle of a scheduled request, as a [`PieceScheduler`](crate::PieceScheduler) sees it
/// (opaque: a scheduler only keeps it and hands it back in its grants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceRef {
    // Which message a scheduled piece belongs to. `seq` tells a message
    // from a later one stored under the same key (the descriptors of a
    // detached queue pair stay queued until the scheduler hands them out).
    pub(super) message: usize,
    pub(super) seq: u64,
}

/// One send request and the pieces of it still in the NIC.
pub(super) struct Message<R> {
    pub(super) member: usize,
    pub(super) seq: u64,
    pub(super) op: SendOp,
    pub(super) region: R,
    pub(super) start: usize,
    pub(super) len: u64,
    pub(super) context: u64,
    pub(super) pieces_out: u32,
    pub(super) last_granted: bool,
    /// Bytes granted so far.
    pub(super) granted: u64,
    /// It failed before its last piece was granted: the rest is dropped
    /// as the scheduler grants it, and it finishes without waiting.
    pub(super) abandoned: bool,
    pub(super) status: WcStatus,
    /// A gather request's other regions and its scatter list (none for
    /// every other request). Such a request goes whole, as one piece.
    pub(super) gather: Option<Box<Gathered<R>>>,
}

/// What a scheduled gather request keeps beyond its first region.
pub(super) struct Gathered<R> {
    /// Its regions after the first, in order.
    pub(super) rest: Vec<R>,
    /// Its scatter list ([`check_gather`]'s): its piece's work request
    /// points at it when it names several entries. It lives as long as
    /// the request, and the list's entries do not move with it.
    pub(super) sges: Vec<ffi::ibv_sge>,
}

impl<R: Region> Gathered<R> {
    /// What the work request of the request's one piece carries beyond
    /// `extra`: its first scatter entry, and the whole list when it has
    /// several.
    pub(super) fn lower(&self, extra: &mut Extra) -> ffi::ibv_sge {
        if self.sges.len() > 1 {
            extra.sg_list = self.sges.as_ptr() as usize;
            extra.num_sge = i32::try_from(self.sges.len()).unwrap_or(i32::MAX);
        }
        self.sges.first().copied().unwrap_or_default()
    }
}

impl<R: Region> Message<R> {
    /// The request's one completion, its region handed back.
    #[inline]
    pub(super) fn complete(self) -> R::Completion {
        let opcode = if self.status.is_success() {
            self.op.completion_opcode()
        } else {
            Opcode::Unknown
        };
        let byte_len = u32::try_from(self.len).unwrap_or(u32::MAX);
        let mut done = self
            .region
            .complete((self.context, self.status, opcode, byte_len, None));
        if let Some(gather) = self.gather {
            R::attach_rest(&mut done, gather.rest);
        }
        done
    }

    /// Every region of the request, in order.
    pub(super) fn into_regions(self) -> impl Iterator<Item = R> {
        let rest = self.gather.map(|g| g.rest).unwrap_or_default();
        std::iter::once(self.region).chain(rest)
    }
}

/// The tag in its lane of a request parked in the queue pair's books.
pub(super) const PARKED: usize = usize::MAX;

/// A queue pair and what its owner collects at its next poll.
///
/// Two locks, so that the engine never waits for a post in progress
/// (on SoftRoCE a post moves the data before it returns): `qp` is held to
/// post and to poll, `book` only for moments. Lock order: engine, then
/// `qp`, then `book`; the engine only ever tries `qp` (`reap_others`) or
/// takes it to tear down (`detach`).
pub(super) struct Side<S: Sink> {
    pub(super) qp: Mutex<S>,
    pub(super) book: Mutex<Book<Done<S>>>,
    /// Whether `book` may hold something for the owner (set under the
    /// book's lock by whoever adds; cleared by the owner under it), so an
    /// owner's poll with nothing new takes no lock but the queue pair's.
    pub(super) mail: AtomicBool,
    /// Whether the book names refused requests (set and cleared under its
    /// lock), so that posting looks at the book only then.
    pub(super) refusals: AtomicBool,
}

/// A queue pair's bookkeeping between the engine and its owner.
pub(super) struct Book<C> {
    /// Pieces the engine decided to post, in order, posted by `flush`.
    pub(super) to_post: VecDeque<RawSend>,
    /// When the oldest of `to_post` was decided (the engine's clock).
    pub(super) decided_at: u64,
    /// Finished requests and receives waiting for the owner's poll.
    pub(super) done: Vec<C>,
    /// Completions of pieces polled and not yet matched to their requests.
    pub(super) raw: Vec<RawCompletion>,
    /// Requests (`wr_id`s) one of whose pieces the NIC refused, until
    /// they finish: their later pieces are not posted.
    pub(super) refused: Vec<u64>,
}

impl<C> Default for Book<C> {
    fn default() -> Self {
        Book {
            to_post: VecDeque::new(),
            decided_at: 0,
            done: Vec::new(),
            raw: Vec::new(),
            refused: Vec::new(),
        }
    }
}

impl<S: Sink> Side<S> {
    /// Posts the pieces the engine queued, in order, as lists (one
    /// doorbell each).
    pub(super) fn flush(&self) {
        if lock(&self.book).to_post.is_empty() {
            return;
        }
        let mut qp = lock(&self.qp);
        let mut pieces = Vec::new();
        loop {
            // Only the holder of `qp` takes pieces, so they go in order.
            pieces.extend(lock(&self.book).to_post.drain(..));
            if pieces.is_empty() {
                return;
            }
            self.post(&mut qp, &mut pieces);
        }
    }

    /// Posts `pieces` (drained) on `qp` (this side's, locked by the
    /// caller), as lists. A piece the NIC refuses completes as failed at
    /// the next poll, and the later pieces of its request are not posted
    /// (they complete as flushed).
    pub(super) fn post(&self, qp: &mut S, pieces: &mut Vec<RawSend>) {
        let mut failed = Vec::new();
        let refusals = self.refusals.load(Ordering::Acquire);
        post_pieces(
            qp,
            pieces,
            |wr_id| refusals && lock(&self.book).refused.contains(&wr_id),
            &mut failed,
        );
        pieces.clear();
        if failed.is_empty() {
            return;
        }
        self.deliver(|book| {
            for c in &failed {
                if c.status != WcStatus::Flushed && !book.refused.contains(&c.wr_id) {
                    book.refused.push(c.wr_id);
                }
            }
            book.raw.append(&mut failed);
        });
        self.refusals.store(true, Ordering::Release);
    }

    /// Request `wr_id` finished: a refusal of one of its pieces no longer
    /// holds back the pieces of whatever request takes its number next.
    pub(super) fn forget_refused(&self, wr_id: u64) {
        if !self.refusals.load(Ordering::Acquire) {
            return;
        }
        let mut book = lock(&self.book);
        book.refused.retain(|&r| r != wr_id);
        self.refusals
            .store(!book.refused.is_empty(), Ordering::Release);
    }

    /// Leaves a finished request for the owner's next poll.
    #[inline(never)]
    pub(super) fn deliver_done(&self, done: Done<S>) {
        self.deliver(|book| book.done.push(done));
    }

    /// Leaves something in the book for the owner's next poll.
    pub(super) fn deliver(&self, f: impl FnOnce(&mut Book<Done<S>>)) {
        let mut book = lock(&self.book);
        f(&mut book);
        self.mail.store(true, Ordering::Release);
    }

    /// Polls into the book (for the engine, on the owner's behalf);
    /// skipped while the queue pair is busy posting.
    pub(super) fn try_reap(&self) -> Result<(), Error> {
        let Ok(mut qp) = self.qp.try_lock() else {
            return Ok(());
        };
        let (mut done, mut raw) = (Vec::new(), Vec::new());
        let polled = qp.poll(&mut done, &mut raw);
        if !done.is_empty() || !raw.is_empty() {
            self.deliver(|book| {
                book.done.append(&mut done);
                book.raw.append(&mut raw);
            });
        }
        polled.map(|_| ())
    }
}
