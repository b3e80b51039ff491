//! Completions that can be awaited, on tokio (feature `tokio`).
//!
//! [`AsyncQueuePair`] wraps a queue pair built with completion events
//! (RC or UD, direct or scheduled). Posting is what it is on the queue pair
//! itself: checked and handed to the device (or to the tenant's scheduler)
//! at the call, in call order, and a refusal hands the region back at
//! once. What a post returns is a [`Pending`] request: a future that
//! resolves to the request's completion, with its region handed back.
//!
//! The queue pair's completion channel is registered once with tokio's
//! reactor ([`AsyncFd`]); a task waiting for a completion sleeps there
//! (and on a timer while the scheduler paces), never in a system call of
//! its own, so one thread serves many queue pairs. Whichever request's
//! future polls the completion queue hands every completion it finds to
//! the future it belongs to and wakes that future's task.
//!
//! **Dropping a future never frees a buffer the NIC holds.** A request's
//! region stays in the queue pair's books until its completion is polled,
//! whether or not anything still waits for it; a completion nobody waits
//! for any more is dropped then, region and all, once the NIC is done with
//! it. So a `select!` or a timeout may drop a [`Pending`] at any point.
//!
//! ```no_run
//! use mtrdma_verbs::asynchronous::AsyncQueuePair;
//! use mtrdma_verbs::{Access, Context, SendOp};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open_first_active()?;
//! let pd = ctx.alloc_pd()?;
//! let (a, b) = (
//!     pd.queue_pair().completion_events(true).build()?,
//!     pd.queue_pair().completion_events(true).build()?,
//! );
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let (a, b) = (
//!     AsyncQueuePair::new(a.connect(&eb)?)?,
//!     AsyncQueuePair::new(b.connect(&ea)?)?,
//! );
//! let received = b.post_recv(pd.allocate(4096, Access::LOCAL)?, 0..4096)?;
//! let sent = a.post_send(SendOp::Send, pd.register(vec![7u8; 4096], Access::LOCAL)?, 0..4096)?;
//! let (sent, received) = (sent.await?, received.await?);
//! assert!(sent.status.is_success());
//! assert_eq!(received.region.as_slice().map(|b| b[0]), Some(7));
//! # Ok(())
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mtrdma_core::tenant::{retry_after, RateLimited};
use mtrdma_sched::IdHasher;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::events::{Armed, Waitable};
use crate::{Error, SendOp};

mod incoming;
pub use incoming::{Incoming, IncomingMany};

mod sealed {
    /// Only this crate's queue pairs are [`AsyncQueue`](super::AsyncQueue)s.
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}

/// A queue pair an [`AsyncQueuePair`] can drive: [`QueuePair`](crate::QueuePair),
/// [`ScheduledQueuePair`](crate::ScheduledQueuePair),
/// [`UdQueuePair`](crate::UdQueuePair),
/// [`ScheduledUdQueuePair`](crate::ScheduledUdQueuePair), a
/// [`SharedCompletionQueue`](crate::SharedCompletionQueue) with all its
/// queue pairs (one channel, one registration, for all of them) and,
/// behind `test-util`, the null sink's `NullScheduled`. Sealed: its
/// methods are the crate's own.
pub trait AsyncQueue: sealed::Sealed + Send + 'static {
    /// What a request's completion hands back.
    type Completion: Send + 'static;

    #[doc(hidden)]
    fn id_of(completion: &Self::Completion) -> u64;

    #[doc(hidden)]
    fn waitable(&mut self) -> &mut dyn Waitable<Item = Self::Completion>;
}

/// An [`AsyncQueue`] that posts send-side operations ([`SendOp`]) on a
/// connection: the RC queue pairs.
pub trait AsyncSend: AsyncQueue {
    /// The memory a request names.
    type Region: Send + 'static;
    /// What a refused post hands back (the region within).
    type Refused;

    #[doc(hidden)]
    fn post_send_as(
        &mut self,
        op: SendOp,
        region: Self::Region,
        range: Range<usize>,
        id: u64,
    ) -> Result<(), Self::Refused>;
}

/// An [`AsyncQueue`] that takes receives (RC and UD).
pub trait AsyncRecv: AsyncQueue {
    #[doc(hidden)]
    fn post_recv_as(
        &mut self,
        region: crate::MemoryRegion,
        range: Range<usize>,
        id: u64,
    ) -> Result<(), crate::PostError>;
}

/// Writes the [`AsyncQueue`] impl of a queue pair type whose completions
/// carry their `context` (with `recv`, its [`AsyncRecv`] impl too; with
/// `send`, its [`AsyncSend`] impl for the region and refusal given).
macro_rules! async_queue {
    ($(#[$attr:meta])* [$($gen:tt)*] $ty:ty, $completion:ty) => {
        $(#[$attr])*
        impl<$($gen)*> sealed::Sealed for $ty {}

        $(#[$attr])*
        impl<$($gen)*> AsyncQueue for $ty {
            type Completion = $completion;

            fn id_of(completion: &$completion) -> u64 {
                completion.context
            }

            fn waitable(&mut self) -> &mut dyn Waitable<Item = $completion> {
                self.waitable()
            }
        }
    };
    (send $(#[$attr:meta])* [$($gen:tt)*] $ty:ty, $region:ty, $refused:ty) => {
        $(#[$attr])*
        impl<$($gen)*> AsyncSend for $ty {
            type Region = $region;
            type Refused = $refused;

            fn post_send_as(
                &mut self,
                op: SendOp,
                region: $region,
                range: Range<usize>,
                id: u64,
            ) -> Result<(), $refused> {
                self.post_send(op, region, range, id)
            }
        }
    };
    (recv [$($gen:tt)*] $ty:ty) => {
        impl<$($gen)*> AsyncRecv for $ty {
            fn post_recv_as(
                &mut self,
                region: crate::MemoryRegion,
                range: Range<usize>,
                id: u64,
            ) -> Result<(), crate::PostError> {
                self.post_recv(region, range, id)
            }
        }
    };
}

async_queue!([] crate::QueuePair, crate::Completion);
async_queue!(send [] crate::QueuePair, crate::MemoryRegion, crate::PostError);
async_queue!(recv [] crate::QueuePair);
async_queue!([Q: crate::scheduled::PieceScheduler] crate::ScheduledQueuePair<Q>, crate::Completion);
async_queue!(send [Q: crate::scheduled::PieceScheduler] crate::ScheduledQueuePair<Q>, crate::MemoryRegion, crate::PostError);
async_queue!(recv [Q: crate::scheduled::PieceScheduler] crate::ScheduledQueuePair<Q>);
async_queue!([] crate::UdQueuePair, crate::UdCompletion);
// Its queue pairs' completions, on one completion queue and channel; a
// request is posted with `post_with(|cq, id| cq.post_send(qpn, ...))`.
impl sealed::Sealed for crate::SharedCompletionQueue {}

impl AsyncQueue for crate::SharedCompletionQueue {
    type Completion = crate::SharedCompletion;

    fn id_of(completion: &crate::SharedCompletion) -> u64 {
        completion.completion.context
    }

    fn waitable(&mut self) -> &mut dyn Waitable<Item = crate::SharedCompletion> {
        self.waitable()
    }
}
async_queue!(recv [] crate::UdQueuePair);
async_queue!([Q: crate::scheduled::PieceScheduler] crate::ScheduledUdQueuePair<Q>, crate::UdCompletion);
async_queue!(recv [Q: crate::scheduled::PieceScheduler] crate::ScheduledUdQueuePair<Q>);
async_queue!(
    #[cfg(any(test, feature = "test-util"))]
    [Q: crate::scheduled::PieceScheduler]
    crate::testing::NullScheduled<Q>,
    crate::testing::HostCompletion
);
async_queue!(
    send
    #[cfg(any(test, feature = "test-util"))]
    [Q: crate::scheduled::PieceScheduler]
    crate::testing::NullScheduled<Q>,
    crate::testing::HeapRegion,
    (Error, crate::testing::HeapRegion)
);

/// A completion channel's descriptor, registered with the reactor; the
/// queue pair owns it (and outlives the registration).
struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A queue pair whose requests' completions are awaited (see the
/// [module docs](self)). Cheap to clone: clones drive the same queue pair.
pub struct AsyncQueuePair<Q: AsyncQueue> {
    shared: Arc<Shared<Q>>,
}

impl<Q: AsyncQueue> Clone for AsyncQueuePair<Q> {
    fn clone(&self) -> Self {
        AsyncQueuePair {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Q: AsyncQueue> fmt::Debug for AsyncQueuePair<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("AsyncQueuePair")
            .field("waiting", &st.waiting.len())
            .field("done", &st.done.len())
            .field("registered", &self.shared.fd.is_some())
            .finish()
    }
}

/// What the queue pair's handles and futures share.
struct Shared<Q: AsyncQueue> {
    /// The completion channel's registration (none on the null sink,
    /// where everything posted is complete at the next poll). Declared
    /// before `state`: it is deregistered before the queue pair, which
    /// owns the descriptor, is dropped.
    fd: Option<AsyncFd<ChannelFd>>,
    state: Mutex<State<Q>>,
}

impl<Q: AsyncQueue> Shared<Q> {
    fn lock(&self) -> MutexGuard<'_, State<Q>> {
        // A panic while polling leaves the books as they were before the
        // call that panicked: go on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A map keyed by the ids this wrapper gives requests (counted up by
/// itself, never chosen by a peer): hashed with one multiplication, not
/// SipHash, as it is looked up for every completion.
type ById<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The bit of the contexts this wrapper posts with: a completion without
/// it is the caller's own ([`AsyncQueuePair::incoming`]).
const OWN: u64 = 1 << 63;

/// The key in `State::waiting` of the task waiting for an incoming
/// completion (never a request's: those count up from [`OWN`]).
const INCOMING: u64 = u64::MAX;

struct State<Q: AsyncQueue> {
    qp: Q,
    /// The id the next request is posted with (its completion's context).
    next_id: u64,
    /// The requests whose futures still wait, and the task to wake when
    /// their completion is found.
    waiting: ById<Option<Waker>>,
    /// Completions found for futures that have not taken them yet.
    done: ById<Q::Completion>,
    /// Completions of work requests posted with contexts of the caller's
    /// own (receives of a shared receive queue, requests posted through
    /// [`AsyncQueuePair::with`]), oldest first, for [`AsyncQueuePair::incoming`].
    incoming: VecDeque<Q::Completion>,
    scratch: Vec<Q::Completion>,
    /// The scheduler's next wake-up, while it paces.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The key in `waiting` of the future whose task last registered for
    /// the channel's readiness and the timer: their registrations keep
    /// only the last task's waker, so when that future goes, one other
    /// must take over ([`State::leave`]).
    watcher: Option<u64>,
}

impl<Q: AsyncQueue> State<Q> {
    /// Polls the queue pair: each completion goes to the future that waits
    /// for it (whose task is added to `wake`); one nobody waits for any
    /// more is dropped, its region with it (the NIC is done with it).
    fn collect(&mut self, wake: &mut Vec<Waker>) -> Result<(), Error> {
        let result = self.qp.waitable().poll(&mut self.scratch);
        self.route(None, wake);
        result.map(drop)
    }

    /// Hands out what the last poll put in `scratch`: each request's
    /// completion to its future (see [`collect`](Self::collect)); the
    /// incoming ones, oldest first, to the end of `out` while it has room
    /// (the `Vec`, and how many more it may take), then to `incoming`.
    /// Says how many went to `out`.
    fn route(
        &mut self,
        mut out: Option<(&mut Vec<Q::Completion>, usize)>,
        wake: &mut Vec<Waker>,
    ) -> usize {
        if let Some((out, room)) = &mut out {
            // Only incoming ones, and room for them all: one copy.
            let n = self.scratch.len();
            if n <= *room && self.scratch.iter().all(|c| Q::id_of(c) & OWN == 0) {
                out.append(&mut self.scratch);
                return n;
            }
        }
        let (mut moved, queued) = (0, self.incoming.len());
        for c in self.scratch.drain(..) {
            let id = Q::id_of(&c);
            if id & OWN == 0 {
                match &mut out {
                    Some((out, room)) if moved < *room => {
                        out.push(c);
                        moved += 1;
                    }
                    _ => self.incoming.push_back(c),
                }
            } else if let Some(waker) = self.waiting.get_mut(&id) {
                wake.extend(waker.take());
                self.done.insert(id, c);
            }
        }
        if self.incoming.len() > queued {
            if let Some(waker) = self.waiting.get_mut(&INCOMING) {
                wake.extend(waker.take());
            }
        }
        moved
    }

    /// The future under `key` waits no more (it resolved, failed or was
    /// dropped). If its task was the one registered for the channel and
    /// the timer, one other sleeping task is woken to take over (it
    /// registers when it finds nothing for itself); the others sleep on.
    /// Waking every waiting task instead would poll each of them again
    /// for every request that resolves: with a task per request, the
    /// polls would grow with the square of the requests in flight.
    fn leave(&mut self, key: u64, wake: &mut Vec<Waker>) {
        self.waiting.remove(&key);
        if self.watcher == Some(key) {
            self.watcher = None;
            wake.extend(self.waiting.values_mut().find_map(Option::take));
        }
    }
}

impl<Q: AsyncQueue> AsyncQueuePair<Q> {
    /// Drives `qp`, which must have been built with completion events
    /// (`completion_events(true)`), from within a tokio runtime whose I/O
    /// and time drivers are enabled (`#[tokio::main]`, or a builder's
    /// `enable_all()`): the channel is registered with its reactor, and a
    /// scheduled queue pair's pacing waits on its timer.
    ///
    /// # Errors
    /// [`Error::NoCompletionEvents`] without completion events;
    /// [`Error::CompletionWait`] when the channel cannot be registered
    /// (no runtime, or one without I/O).
    pub fn new(mut qp: Q) -> Result<Self, Error> {
        let w = qp.waitable();
        w.check_events()?;
        let fd = match w.arm()? {
            Armed::Fd(fd) => {
                if let Err(e) = tokio::runtime::Handle::try_current() {
                    return Err(Error::CompletionWait {
                        source: std::io::Error::other(e),
                    });
                }
                // SAFETY: `fd` is the completion channel of `qp`'s
                // completion queue, open until the queue pair is dropped.
                // The queue pair goes into the same `Shared` as the
                // registration, whose `fd` field is dropped (deregistered)
                // before its `state`, which holds the queue pair; and
                // `ChannelFd` always names that one descriptor.
                let fd =
                    unsafe { AsyncFd::register_with_interest(ChannelFd(fd), Interest::READABLE) }
                        .map_err(|e| Error::CompletionWait {
                        source: e.into_parts().1,
                    })?;
                Some(fd)
            }
            Armed::Ready => None,
        };
        Ok(AsyncQueuePair {
            shared: Arc::new(Shared {
                fd,
                state: Mutex::new(State {
                    qp,
                    next_id: OWN,
                    waiting: ById::default(),
                    done: ById::default(),
                    incoming: VecDeque::new(),
                    scratch: Vec::new(),
                    timer: None,
                    watcher: None,
                }),
            }),
        })
    }

    /// Posts with the queue pair's own method, `f`, at once: `f` is given
    /// the queue pair and the context to post with (a UD send to an
    /// address, a gather request, a WRITE with immediate data: whatever the
    /// queue pair posts); the future resolves to that request's
    /// completion. What `f` refuses comes back as it is.
    ///
    /// ```no_run
    /// # use mtrdma_verbs::asynchronous::AsyncQueuePair;
    /// # use mtrdma_verbs::{AddressHandle, MemoryRegion, UdQueuePair, DEFAULT_QKEY};
    /// # async fn run(qp: &AsyncQueuePair<UdQueuePair>, to: &AddressHandle, qpn: u32, msg: MemoryRegion)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let sent = qp
    ///     .post_with(|qp, id| qp.post_send(to, qpn, DEFAULT_QKEY, msg, 0..64, id))?
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// What `f` returns.
    pub fn post_with<E>(
        &self,
        f: impl FnOnce(&mut Q, u64) -> Result<(), E>,
    ) -> Result<Pending<Q>, E> {
        let mut st = self.shared.lock();
        let id = st.next_id;
        // Wraps within the contexts with the `OWN` bit, short of `INCOMING`.
        st.next_id = if id + 1 == INCOMING { OWN } else { id + 1 };
        f(&mut st.qp, id)?;
        st.waiting.insert(id, None);
        Ok(Pending {
            shared: Arc::clone(&self.shared),
            id,
            finished: false,
        })
    }

    /// Runs `f` on the queue pair (its endpoint, counters, or a post of
    /// its own kind), under the lock its futures take.
    pub fn with<R>(&self, f: impl FnOnce(&mut Q) -> R) -> R {
        f(&mut self.shared.lock().qp)
    }

    /// Requests whose futures still wait for their completion.
    pub fn waiting(&self) -> usize {
        let st = self.shared.lock();
        st.waiting.len() - usize::from(st.waiting.contains_key(&INCOMING))
    }

    /// The next completion of a work request posted with a context of the
    /// caller's own rather than through this wrapper: a receive of a
    /// shared receive queue the queue pair takes from (its completions
    /// come on this queue pair's completion queue), or a request posted
    /// through [`with`](Self::with). Oldest first; one task at a time
    /// takes them (a second one would not be woken). Contexts with the
    /// top bit set are this wrapper's own.
    pub fn incoming(&self) -> Incoming<Q> {
        Incoming {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Waits for at least one incoming completion (as
    /// [`incoming`](Self::incoming) does), then moves it and every other
    /// one already found, up to `limit` in all, to the end of `out`,
    /// oldest first; resolves to how many it moved. As tokio's
    /// `mpsc::Receiver::recv_many`: a server takes what came in one wake
    /// together, and can answer it together (a batch, one doorbell). A
    /// `limit` of 0 resolves to 0 at once. Dropping the future loses
    /// nothing.
    pub fn incoming_many<'a>(
        &self,
        out: &'a mut Vec<Q::Completion>,
        limit: usize,
    ) -> IncomingMany<'a, Q> {
        IncomingMany {
            next: self.incoming(),
            out,
            limit,
        }
    }
}

impl<Q: AsyncSend> AsyncQueuePair<Q> {
    /// Posts a send-side request, as the queue pair's own `post_send`
    /// does, at once; the future resolves to its completion, region
    /// handed back.
    ///
    /// # Errors
    /// The queue pair's refusal, region handed back.
    pub fn post_send(
        &self,
        op: SendOp,
        region: Q::Region,
        range: Range<usize>,
    ) -> Result<Pending<Q>, Q::Refused> {
        self.post_with(|qp, id| qp.post_send_as(op, region, range, id))
    }
}

impl<Q: AsyncRecv> AsyncQueuePair<Q> {
    /// Posts a receive into `range` of `region`, at once; the future
    /// resolves to its completion, region handed back.
    ///
    /// # Errors
    /// The queue pair's refusal, region handed back.
    pub fn post_recv(
        &self,
        region: crate::MemoryRegion,
        range: Range<usize>,
    ) -> Result<Pending<Q>, crate::PostError> {
        self.post_with(|qp, id| qp.post_recv_as(region, range, id))
    }
}

/// A posted request: a future that resolves to its completion (see the
/// [module docs](self); dropping it is safe at any point).
#[must_use = "a request's completion is only known by awaiting it"]
pub struct Pending<Q: AsyncQueue> {
    shared: Arc<Shared<Q>>,
    id: u64,
    /// Its completion was handed out (or an error was).
    finished: bool,
}

impl<Q: AsyncQueue> fmt::Debug for Pending<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("id", &self.id)
            .field("finished", &self.finished)
            .finish()
    }
}

/// Polls of the queue pair in one wake-up while its scheduler takes
/// pieces' completions and posts more in their place, before the task
/// yields to others.
const POLLS_PER_WAKE: usize = 64;

impl<Q: AsyncQueue> Future for Pending<Q> {
    type Output = Result<Q::Completion, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.finished {
            panic!("a request's future was polled after it resolved");
        }
        let mut wake = Vec::new();
        let id = this.id;
        let result = drive(&this.shared, id, |st| st.done.remove(&id), cx, &mut wake);
        if result.is_ready() {
            this.finished = true;
        }
        for w in wake {
            w.wake();
        }
        result
    }
}

/// One poll of a future waiting under `key` in `shared`'s books for what
/// `take` finds there (a request's completion, or an incoming one); the
/// tasks to wake once the lock is let go go to `wake`.
fn drive<Q: AsyncQueue>(
    shared: &Shared<Q>,
    key: u64,
    take: impl Fn(&mut State<Q>) -> Option<Q::Completion>,
    cx: &mut Context<'_>,
    wake: &mut Vec<Waker>,
) -> Poll<Result<Q::Completion, Error>> {
    let mut st = shared.lock();
    let ready = |st: &mut State<Q>, wake: &mut Vec<Waker>| {
        let c = take(st)?;
        st.leave(key, wake);
        Some(c)
    };
    let failed = |st: &mut State<Q>, wake: &mut Vec<Waker>, e| {
        st.leave(key, wake);
        Poll::Ready(Err(e))
    };
    if let Some(c) = ready(&mut st, wake) {
        return Poll::Ready(Ok(c));
    }
    for _ in 0..POLLS_PER_WAKE {
        if let Err(e) = st.collect(wake) {
            return failed(&mut st, wake, e);
        }
        if let Some(c) = ready(&mut st, wake) {
            return Poll::Ready(Ok(c));
        }
        if !st.qp.waitable().took() {
            break;
        }
    }
    // Nothing for it yet. Arm, then poll once more: a completion that
    // came before the arm raises no event.
    match st.qp.waitable().arm() {
        Ok(Armed::Fd(_)) => {}
        Ok(Armed::Ready) => {
            // Nothing to sleep on: what is posted completes at the next
            // poll.
            st.waiting.insert(key, Some(cx.waker().clone()));
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Err(e) => return failed(&mut st, wake, e),
    }
    if let Err(e) = st.collect(wake) {
        return failed(&mut st, wake, e);
    }
    if let Some(c) = ready(&mut st, wake) {
        return Poll::Ready(Ok(c));
    }
    st.waiting.insert(key, Some(cx.waker().clone()));
    if st.qp.waitable().took() {
        // The scheduler posted more in the pieces' place: poll again
        // soon, after the other tasks.
        cx.waker().wake_by_ref();
        return Poll::Pending;
    }
    // This task registers for the channel and the timer below: it is
    // their watcher now.
    st.watcher = Some(key);
    if let Some(fd) = &shared.fd {
        match fd.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                if let Err(e) = st.qp.waitable().take_events() {
                    return failed(&mut st, wake, e);
                }
                guard.clear_ready();
                cx.waker().wake_by_ref();
            }
            Poll::Ready(Err(source)) => {
                return failed(&mut st, wake, Error::CompletionWait { source });
            }
            Poll::Pending => {}
        }
    }
    if let Some(at) = st.qp.waitable().poll_by() {
        // The scheduler paces: poll again when it is due.
        let due = tokio::time::Instant::from_std(at);
        let timer = st
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        if timer.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
    }
    Poll::Pending
}

impl<Q: AsyncQueue> Drop for Pending<Q> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut wake = Vec::new();
        let dropped = {
            let mut st = self.shared.lock();
            st.leave(self.id, &mut wake);
            // The request may still be in the NIC: its region stays in
            // the books until its completion is polled, and is dropped
            // then. One already found is dropped here, after the lock.
            st.done.remove(&self.id)
        };
        drop(dropped);
        for w in wake {
            w.wake();
        }
    }
}

/// What `create` gives, waiting out a control-path rate limit without
/// blocking the thread ([`mtrdma_core::tenant::admitted_within`], on
/// tokio's timer): tried again after each wait the refusal names (at least
/// 1 ms, at most 1 s) until admitted or `patience` runs out.
///
/// # Errors
/// Any other error at once; a rate limit once `patience` has run out.
pub async fn admitted_within<T, E: RateLimited>(
    patience: Duration,
    mut create: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + patience;
    loop {
        match retry_after(create(), deadline) {
            Ok(answer) => return answer,
            Err(wait) => tokio::time::sleep(wait).await,
        }
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests;
