//! Completion events: waiting for a queue pair's completions without
//! spinning.
//!
//! A queue pair built with `completion_events(true)` (on
//! [`QueuePairBuilder`](crate::QueuePairBuilder) or
//! [`UdQueuePairBuilder`](crate::UdQueuePairBuilder)) gets a completion
//! channel of its own (`ibv_create_comp_channel`, one file descriptor) and
//! its completion queue is created with it. `poll_wait` then polls (again
//! at once while a scheduled queue pair's polls take its pieces'
//! completions, which may have let it post more); if
//! nothing came, it arms the completion queue (`ibv_req_notify_cq`), polls
//! again (a completion that arrived before the arm raises no event), and
//! sleeps in poll(2) on the channel's descriptor until the next completion
//! raises an event or the timeout runs out. Every event taken
//! (`ibv_get_cq_event`) is acknowledged at once (`ibv_ack_cq_events`), so
//! destroying the completion queue never waits for an acknowledgement.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;
use rustix::event::{PollFd, PollFlags, Timespec};

use crate::qp::{libc_enosys, Cq};
use crate::Error;

/// A completion channel: the file descriptor a completion queue's events
/// arrive on. Its descriptor is non-blocking, so taking events never
/// blocks; poll(2) is where a waiter sleeps.
pub(crate) struct CompChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
}

impl CompChannel {
    /// A channel on `ctx`'s device, its descriptor set non-blocking.
    pub(crate) fn new(ctx: &crate::Context) -> Result<CompChannel, Error> {
        let verbs = |call, source| Error::Verbs {
            call,
            device: ctx.name().to_string(),
            source,
        };
        // SAFETY: the context is open (the caller's PD keeps it open for
        // as long as the channel lives: it is dropped after the channel).
        let raw = unsafe { ffi::ibv_create_comp_channel(ctx.raw()) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(verbs(
                "ibv_create_comp_channel",
                crate::error::verbs_errno(),
            ));
        };
        let channel = CompChannel { raw };
        let fd = channel.fd();
        let flags = rustix::fs::fcntl_getfl(fd)
            .map_err(|e| verbs("fcntl(F_GETFL) on the completion channel", e.into()))?;
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| verbs("fcntl(F_SETFL) on the completion channel", e.into()))?;
        Ok(channel)
    }

    /// The channel, to create a completion queue with.
    pub(crate) fn raw(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// Its file descriptor, open as long as the channel lives.
    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `ibv_create_comp_channel` opened the descriptor, and it
        // stays open until `ibv_destroy_comp_channel` in `drop`, which the
        // borrow of `self` outlasts.
        unsafe { BorrowedFd::borrow_raw(self.raw.as_ref().fd) }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the channel is ours and destroyed once; its completion
        // queue was destroyed first (`Cq::drop` runs before its fields are
        // dropped), so no completion queue refers to it.
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

/// What a waiter sleeps on once its completion queue is armed.
// `pub` in a private module: named by the sealed `AsyncQueue` trait's
// hidden methods (feature `tokio`), reachable from nowhere outside.
#[allow(unreachable_pub)]
#[derive(Debug, Clone, Copy)]
pub enum Armed {
    /// Sleep in poll(2) on this descriptor (a completion channel's, which
    /// becomes readable at the next completion).
    Fd(RawFd),
    /// Nothing to sleep on: whatever is posted completes at the next poll
    /// (the host's null sink), so the wait ends at once.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    Ready,
}

impl Cq {
    /// The error that says how to get completion events, unless this
    /// completion queue has them.
    pub(crate) fn check_events(&self) -> Result<(), Error> {
        match self.events {
            Some(_) => Ok(()),
            None => Err(Error::NoCompletionEvents),
        }
    }

    /// Asks for an event at the next completion (`ibv_req_notify_cq`, for
    /// every completion, not only solicited ones); returns the descriptor
    /// that then becomes readable. An error names the verbs call.
    ///
    /// A queue still armed from before (its event not yet read: no
    /// completion since, or one whose event waits on the descriptor) is
    /// not armed again. The provider raises one event per arm, so this
    /// saves the call (a system call on a software device) and the read of
    /// a second event, and the descriptor still becomes readable at the
    /// next completion, or already is.
    pub(crate) fn arm(&self) -> Result<Armed, (&'static str, io::Error)> {
        let Some(events) = &self.events else {
            return Err(("ibv_req_notify_cq", io::Error::from_raw_os_error(22)));
        };
        if self.armed.get() {
            return Ok(Armed::Fd(events.fd().as_raw_fd()));
        }
        // SAFETY: the CQ is live while `self` is (and so is its context,
        // kept open by the owner's PD); `ibv_req_notify_cq` is a static
        // inline in verbs.h that makes exactly this call.
        let rc = unsafe {
            let ctx = self.cq.as_ref().context;
            match (*ctx).ops.req_notify_cq {
                Some(notify) => notify(self.cq.as_ptr(), 0),
                None => libc_enosys(),
            }
        };
        if rc != 0 {
            // Providers return a positive errno (or its negation).
            return Err(("ibv_req_notify_cq", crate::error::errno(rc)));
        }
        self.armed.set(true);
        Ok(Armed::Fd(events.fd().as_raw_fd()))
    }

    /// Takes the event waiting on the channel, acknowledging it at once
    /// (so none is ever left unacknowledged when the CQ is destroyed);
    /// returns how many it took (0 or 1). Never blocks: the descriptor is
    /// non-blocking. One arm raises one event and [`arm`](Self::arm) does
    /// not arm again before it is taken, so there is at most one: reading
    /// on until the descriptor says it has no more would cost a system
    /// call at every wake-up. Should there be another, the descriptor
    /// stays readable and the next wait takes it at once.
    pub(crate) fn take_events(&self) -> Result<u32, (&'static str, io::Error)> {
        let Some(events) = &self.events else {
            return Ok(0);
        };
        loop {
            let mut cq = std::ptr::null_mut();
            let mut context = std::ptr::null_mut();
            // SAFETY: the channel is live while `self` is; `cq` and
            // `context` are writable.
            let rc = unsafe { ffi::ibv_get_cq_event(events.raw(), &mut cq, &mut context) };
            if rc != 0 {
                let e = crate::error::verbs_errno();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(0),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(("ibv_get_cq_event", e)),
                };
            }
            debug_assert_eq!(cq, self.cq.as_ptr(), "the channel serves one CQ");
            // SAFETY: the event just taken is this CQ's (the channel is
            // its alone), and the CQ is live; one ack for one event.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), 1) };
            self.armed.set(false);
            return Ok(1);
        }
    }
}

/// Something whose completions can be waited for: a queue pair, direct
/// or scheduled. [`poll_wait`] drives it, and so do the futures of
/// `asynchronous` (feature `tokio`).
// `pub` in a private module, as `Armed`.
#[allow(unreachable_pub)]
pub trait Waitable {
    /// What a completion is handed back as.
    type Item;

    /// Polls completions into `out` (as the owner's `poll` does).
    fn poll(&mut self, out: &mut Vec<Self::Item>) -> Result<usize, Error>;

    /// [`Error::NoCompletionEvents`] unless it was built with completion
    /// events.
    fn check_events(&mut self) -> Result<(), Error>;

    /// Asks for an event at the next completion; says what to sleep on.
    fn arm(&mut self) -> Result<Armed, Error>;

    /// Takes and acknowledges the events that arrived.
    fn take_events(&mut self) -> Result<(), Error>;

    /// When it must be polled again whether or not anything completes
    /// (a scheduler's wake-up); `None`: not before a completion.
    fn poll_by(&self) -> Option<Instant> {
        None
    }

    /// Another descriptor to sleep on besides the completion channel: the
    /// device context's asynchronous events, for one whose queue pairs
    /// take receives from a shared receive queue (its limit event refills
    /// the queue while nothing completes). `None` by default.
    fn side_fd(&self) -> Option<RawFd> {
        None
    }

    /// [`side_fd`](Self::side_fd) became readable: read what is there.
    fn side_ready(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Whether the last poll took completions it kept to itself (a
    /// scheduled queue pair's pieces, whose request is not done): it may
    /// have posted more in their place, and on a device that completes
    /// work while it is posted (a software one) those may be done
    /// already, so [`poll_wait`] polls again before it arms and sleeps.
    /// False by default: every completion a plain queue pair takes is
    /// handed over.
    fn took(&self) -> bool {
        false
    }

    /// The thread woke from the channel and then waited `late` for a CPU:
    /// completions the next poll finds came that much before it ran
    /// (zero: the next poll's are on time).
    fn woke_late(&mut self, _late: Duration) {}

    /// Whether [`woke_late`](Self::woke_late) is of use to it (a
    /// scheduled queue pair's delay window judges its pieces without the
    /// host's wait): [`poll_wait`] reads the thread's run-queue time
    /// around a sleep, two reads of `/proc`, only then. False by default.
    fn wants_lateness(&self) -> bool {
        false
    }
}

/// This thread's total wait on a CPU run queue so far (the second field of
/// `/proc/thread-self/schedstat`, in nanoseconds), or `None` where the
/// kernel does not account it. Around a sleep on a completion channel,
/// its growth is how long the thread, woken by a completion, waited to run:
/// on a host with more runnable threads than CPUs that is often longer
/// than the completion took to come from the NIC.
fn runqueue_wait() -> Option<u64> {
    use std::cell::RefCell;
    use std::fs::File;
    thread_local! {
        /// The thread's schedstat file, opened at its first use (`None`
        /// after a failure: not tried again).
        static SCHEDSTAT: RefCell<Option<Option<File>>> = const { RefCell::new(None) };
    }
    SCHEDSTAT.with(|cell| {
        let mut slot = cell.borrow_mut();
        let file = slot
            .get_or_insert_with(|| File::open("/proc/thread-self/schedstat").ok())
            .as_ref()?;
        let mut buf = [0u8; 96];
        let n = rustix::io::pread(file, &mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        text.split_ascii_whitespace().nth(1)?.parse().ok()
    })
}

/// Polls `w` until it adds completions to `out` or `timeout` runs out,
/// sleeping on its completion channel in between; returns how many it
/// added (0: the timeout ran out). See the module docs.
pub(crate) fn poll_wait<W: Waitable + ?Sized>(
    w: &mut W,
    out: &mut Vec<W::Item>,
    timeout: Duration,
) -> Result<usize, Error> {
    w.check_events()?;
    // No deadline when `timeout` is too long to represent: wait for ever.
    let deadline = Instant::now().checked_add(timeout);
    let before = out.len();
    loop {
        // Only the poll right after a wake-up is late, even if it failed.
        let polled = w.poll(out);
        w.woke_late(Duration::ZERO);
        polled?;
        if out.len() > before {
            return Ok(out.len() - before);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(0);
        }
        let until = match (deadline, w.poll_by()) {
            (Some(d), Some(p)) => Some(d.min(p)),
            (d, p) => d.or(p),
        };
        if until.is_some_and(|u| now >= u) || w.took() {
            // Due for a poll now (a scheduler's wake-up), or the poll
            // took pieces' completions and may have posted more.
            continue;
        }
        let fd = match w.arm()? {
            Armed::Fd(fd) => fd,
            Armed::Ready => {
                w.poll(out)?;
                return Ok(out.len() - before);
            }
        };
        // A completion that arrived before the arm raises no event: find
        // it now.
        w.poll(out)?;
        if out.len() > before {
            return Ok(out.len() - before);
        }
        if w.took() {
            // It found pieces' completions (the queue stays armed: the
            // next arm costs nothing) and may have posted more.
            continue;
        }
        let waited = if w.wants_lateness() {
            runqueue_wait()
        } else {
            None
        };
        let side = w.side_fd();
        // SAFETY: `fd` is the completion channel of a completion queue `w`
        // owns (directly, or through an `Arc` it holds); the channel is
        // destroyed only when `w`'s queue pair is dropped, and `w` is
        // borrowed for the whole call. `side` is the asynchronous event
        // descriptor of the device context `w` keeps open.
        let (ready, side_ready) = unsafe { block(fd, side, until) }?;
        if side_ready {
            w.side_ready()?;
        }
        if ready {
            w.take_events()?;
        }
        if let Some(late) = waited.and_then(|a| runqueue_wait().map(|b| b.saturating_sub(a))) {
            w.woke_late(Duration::from_nanos(late));
        }
    }
}

/// Sleeps until `fd` or `side` is readable or `until` passes; says which
/// became readable (neither: the time passed). An interrupted sleep goes
/// on for the time that remains.
///
/// # Safety
/// `fd` and `side` must stay open until this returns.
unsafe fn block(
    fd: RawFd,
    side: Option<RawFd>,
    until: Option<Instant>,
) -> Result<(bool, bool), Error> {
    // SAFETY: the caller keeps `fd` and `side` open until this returns,
    // and the borrows do not outlive the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    // SAFETY: as above.
    let side = side.map(|side| unsafe { BorrowedFd::borrow_raw(side) });
    loop {
        let timeout = match until {
            None => None,
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                // Beyond `Timespec`'s range is as good as for ever.
                Timespec::try_from(left).ok()
            }
        };
        let mut fds = [
            PollFd::from_borrowed_fd(fd, PollFlags::IN),
            PollFd::from_borrowed_fd(side.unwrap_or(fd), PollFlags::IN),
        ];
        let n = if side.is_some() { 2 } else { 1 };
        match rustix::event::poll(&mut fds[..n], timeout.as_ref()) {
            Ok(0) => return Ok((false, false)),
            Ok(_) => {
                let readable = |p: &PollFd<'_>| !p.revents().is_empty();
                return Ok((readable(&fds[0]), n == 2 && readable(&fds[1])));
            }
            Err(rustix::io::Errno::INTR) => {
                if until.is_some_and(|u| Instant::now() >= u) {
                    return Ok((false, false));
                }
            }
            Err(e) => return Err(Error::CompletionWait { source: e.into() }),
        }
    }
}

/// [`Waitable`] and [`PollCompletions`](crate::PollCompletions) for a
/// queue pair that owns its completion queue (`QueuePair`,
/// `UdQueuePair`): it polls with its `poll_own`, arms with its
/// `arm_events`, takes events through its [`Sink`](crate::qp::Sink), and,
/// when it receives from a shared receive queue, sleeps on its context's
/// asynchronous events too.
macro_rules! waitable_queue_pair {
    ($qp:ty, $completion:ty) => {
        impl $crate::events::Waitable for $qp {
            type Item = $completion;

            fn poll(&mut self, out: &mut Vec<$completion>) -> Result<usize, $crate::Error> {
                self.poll_own(out)
            }

            fn check_events(&mut self) -> Result<(), $crate::Error> {
                $crate::qp::Sink::check_events(self)
            }

            fn arm(&mut self) -> Result<$crate::events::Armed, $crate::Error> {
                self.arm_events()
            }

            fn take_events(&mut self) -> Result<(), $crate::Error> {
                $crate::qp::Sink::take_events(self)
            }

            fn side_fd(&self) -> Option<std::os::fd::RawFd> {
                self.srq
                    .as_ref()
                    .map(|_| $crate::async_event::fd(self.pd.context()))
            }

            fn side_ready(&mut self) -> Result<(), $crate::Error> {
                $crate::async_event::service(self.pd.context()).map(drop)
            }
        }

        impl $crate::PollCompletions for $qp {
            type Completion = $completion;

            fn poll(&mut self, out: &mut Vec<$completion>) -> Result<usize, $crate::Error> {
                self.poll_own(out)
            }

            fn poll_wait(
                &mut self,
                out: &mut Vec<$completion>,
                timeout: std::time::Duration,
            ) -> Result<usize, $crate::Error> {
                $crate::events::poll_wait(self, out, timeout)
            }
        }
    };
}
pub(crate) use waitable_queue_pair;

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use super::{poll_wait, runqueue_wait, Armed, Waitable};
    use crate::Error;

    /// A completion channel stood in for by a socket: a byte written to
    /// its other end is an event, and the completion a poll then finds.
    struct Channel {
        events: UnixStream,
        ready: bool,
        lateness: bool,
        /// What `woke_late` was told, in order.
        late: Vec<Duration>,
    }

    impl Waitable for Channel {
        type Item = u8;

        fn poll(&mut self, out: &mut Vec<u8>) -> Result<usize, Error> {
            let found = std::mem::take(&mut self.ready);
            if found {
                out.push(1);
            }
            Ok(usize::from(found))
        }

        fn check_events(&mut self) -> Result<(), Error> {
            Ok(())
        }

        fn arm(&mut self) -> Result<Armed, Error> {
            Ok(Armed::Fd(self.events.as_raw_fd()))
        }

        fn take_events(&mut self) -> Result<(), Error> {
            let mut byte = [0u8];
            self.events.read_exact(&mut byte).unwrap();
            self.ready = true;
            Ok(())
        }

        fn woke_late(&mut self, late: Duration) {
            self.late.push(late);
        }

        fn wants_lateness(&self) -> bool {
            self.lateness
        }
    }

    #[test]
    fn a_sleep_is_timed_on_the_run_queue_only_for_what_wants_it() {
        for lateness in [false, true] {
            let (events, mut peer) = UnixStream::pair().unwrap();
            let mut channel = Channel {
                events,
                ready: false,
                lateness,
                late: Vec::new(),
            };
            let event = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                peer.write_all(&[1]).unwrap();
                peer
            });
            let mut out = Vec::new();
            assert_eq!(
                poll_wait(&mut channel, &mut out, Duration::from_secs(10)).unwrap(),
                1
            );
            drop(event.join().unwrap());
            // Each poll after a wake-up says "on time" (zero); a sleep's
            // own lateness is measured and told only where it is wanted
            // (the measure reads /proc twice).
            let measured = channel.late.len() - channel.late.iter().filter(|d| d.is_zero()).count();
            assert!(measured <= usize::from(lateness), "{:?}", channel.late);
            assert_eq!(
                channel.late.len(),
                if lateness { 3 } else { 2 },
                "lateness wanted: {lateness}; told {:?}",
                channel.late
            );
        }
    }

    #[test]
    fn reads_the_threads_own_run_queue_wait() {
        // Linux accounts it for every thread (schedstat); it only grows,
        // and another thread's file is its own.
        let a = runqueue_wait().expect("/proc/thread-self/schedstat is readable");
        std::thread::yield_now();
        let b = runqueue_wait().expect("read again from the same open file");
        assert!(b >= a, "{b} < {a}");
        let other = std::thread::spawn(|| runqueue_wait().is_some())
            .join()
            .unwrap();
        assert!(other);
    }
}
