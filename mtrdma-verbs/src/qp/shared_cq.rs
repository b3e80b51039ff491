//! A completion queue shared by many RC queue pairs: one queue, one
//! completion channel (one file descriptor), one `poll` or `poll_wait`
//! for all of a server thread's connections.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;

use super::*;

/// A completion of one of a [`SharedCompletionQueue`]'s queue pairs.
#[derive(Debug)]
pub struct SharedCompletion {
    /// The queue pair it belongs to (the number
    /// [`SharedCompletionQueue::prepare`] returned in its endpoint).
    pub qpn: u32,
    /// The completion, with its region handed back (a receive's from the
    /// shared receive queue the queue pair takes receives from, if it has
    /// one).
    pub completion: Completion,
}

/// How to build a shared completion queue (see
/// [`Context::shared_completion_queue`](crate::Context::shared_completion_queue)).
#[derive(Debug)]
pub struct SharedCompletionQueueBuilder<'a> {
    ctx: &'a crate::Context,
    entries: u32,
    events: bool,
}

impl crate::Context {
    /// Starts building a completion queue that many RC queue pairs of
    /// this context complete on (see [`SharedCompletionQueue`]).
    pub fn shared_completion_queue(&self) -> SharedCompletionQueueBuilder<'_> {
        SharedCompletionQueueBuilder {
            ctx: self,
            entries: 4096,
            events: true,
        }
    }
}

impl SharedCompletionQueueBuilder<'_> {
    /// How many completions it holds (default 4096; at most the device's
    /// `max_cqe`). Its queue pairs may have at most this many outstanding
    /// together: each counts its send queue, and its receive queue or, once
    /// for all of them, the shared receive queue it takes receives from.
    pub fn entries(mut self, n: u32) -> Self {
        self.entries = n.max(1);
        self
    }

    /// Gives it a completion channel, so that
    /// [`poll_wait`](crate::PollCompletions::poll_wait) can sleep (default
    /// on: it is one file descriptor for all its queue pairs).
    pub fn completion_events(mut self, on: bool) -> Self {
        self.events = on;
        self
    }

    /// Creates the completion queue (and its channel).
    pub fn build(self) -> Result<SharedCompletionQueue, Error> {
        let attrs = device_attrs(self.ctx)?;
        let max = u64::try_from(attrs.max_cqe).unwrap_or(0);
        if u64::from(self.entries) > max {
            return Err(Error::QueueTooDeep {
                device: self.ctx.name().to_string(),
                what: "the shared completion queue's entries",
                asked: u64::from(self.entries),
                max,
            });
        }
        // Its `poll_wait` also sleeps on the context's asynchronous
        // events when a queue pair on it uses a shared receive queue.
        crate::async_event::make_nonblocking(self.ctx)?;
        let cq = Cq::new(self.ctx, self.entries, self.events)?;
        Ok(SharedCompletionQueue {
            members: HashMap::new(),
            pending: VecDeque::new(),
            srqs: Vec::new(),
            committed: 0,
            own: HashMap::new(),
            entries: self.entries,
            ctx: self.ctx.clone(),
            cq,
        })
    }
}

/// A queue pair on the shared queue: waiting for its peer, or connected.
enum Member {
    Prepared(PreparedQueuePair),
    Connected(QueuePair),
}

impl Member {
    fn qp(&mut self) -> &mut QueuePair {
        match self {
            Member::Prepared(p) => p.qp_mut(),
            Member::Connected(qp) => qp,
        }
    }

    fn qp_ref(&self) -> &QueuePair {
        match self {
            Member::Prepared(p) => p.qp_ref(),
            Member::Connected(qp) => qp,
        }
    }
}

/// A completion queue that many RC queue pairs of one device context
/// complete on, with one completion channel: a server thread polls (or
/// sleeps on) this one object for all its connections and learns from
/// each [`SharedCompletion`] which queue pair it came from.
///
/// The queue pairs live inside it, created by
/// [`prepare`](Self::prepare) from a [`QueuePairBuilder`] (usually with
/// [`srq`](QueuePairBuilder::srq), so that all of them take receives from
/// one [`SharedReceiveQueue`]), connected by [`connect`](Self::connect),
/// posted to by their queue pair number, and torn down by
/// [`remove`](Self::remove) or when the shared queue is dropped. Posting
/// moves the region in, and the completion that [`poll`](crate::PollCompletions::poll)
/// returns hands it back, as with a [`QueuePair`]. Each completion is
/// routed by the queue pair number the device reports with it: a send's
/// to the books of its queue pair (its region), a receive's to the shared
/// receive queue it came from.
///
/// Per-queue-pair polling: a queue pair on a shared completion queue is
/// never handed out as a [`QueuePair`], so nothing can poll it alone
/// (which would take the other queue pairs' completions); its
/// completions come only through this queue's `poll` and `poll_wait`.
/// Queue pairs built with [`QueuePairBuilder::build`] keep a completion
/// queue of their own and their own `poll`, unchanged, with or without a
/// shared receive queue.
///
/// The queue is not `Sync`: one thread polls it. A server with several
/// threads gives each its own shared completion queue; they may all take
/// receives from one shared receive queue.
///
/// ```no_run
/// use std::time::Duration;
/// use mtrdma_verbs::{Access, Context, Opcode, PollCompletions, SendOp};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let srq = pd.shared_receive_queue().max_wr(256).build()?;
/// for i in 0..256 {
///     srq.post_recv(pd.allocate(64, Access::LOCAL)?, 0..64, i)?;
/// }
/// let mut server = ctx.shared_completion_queue().entries(1024).build()?;
/// # let peers: Vec<mtrdma_verbs::Endpoint> = Vec::new();
/// for peer in &peers {
///     // Each client's endpoint comes over TCP (mtrdma_verbs::exchange).
///     let me = server.prepare(pd.queue_pair().srq(&srq))?;
///     server.connect(me.qpn, peer)?;
/// }
/// let mut done = Vec::new();
/// server.poll_wait(&mut done, Duration::from_secs(1))?;
/// for c in done.drain(..) {
///     if c.completion.opcode == Opcode::Recv {
///         // Answer on the connection it came from; the request's buffer
///         // goes back to the shared receive queue's reserve.
///         let answer = pd.allocate(64, Access::LOCAL)?;
///         server.post_send(c.qpn, SendOp::Send, answer, 0..64, 0)?;
///         srq.stock(c.completion.region, 0..64, c.completion.context)?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct SharedCompletionQueue {
    members: HashMap<u32, Member>,
    /// Completions polled (while a queue pair was torn down) and not yet
    /// handed out.
    pending: VecDeque<SharedCompletion>,
    /// The shared receive queues its queue pairs take receives from, each
    /// once.
    srqs: Vec<SharedReceiveQueue>,
    /// What its queue pairs may have outstanding together.
    committed: u64,
    /// What each queue pair adds to it with its own queues.
    own: HashMap<u32, u64>,
    entries: u32,
    ctx: crate::Context,
    /// Destroyed after every queue pair on it (`Drop::drop` removes them).
    cq: Cq,
}

// SAFETY: it owns its completion queue and its queue pairs (each `Send`);
// moving it to another thread moves all of them. It is not Sync: every
// method that touches the device takes `&mut self`.
unsafe impl Send for SharedCompletionQueue {}

impl fmt::Debug for SharedCompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCompletionQueue")
            .field("entries", &self.entries)
            .field("queue_pairs", &self.members.len())
            .field("committed", &self.committed)
            .field("pending", &self.pending.len())
            .finish()
    }
}

/// What a queue pair on the shared queue may have outstanding there: its
/// send queue, and its receive queue or (counted once for the shared
/// queue) its SRQ's depth if the SRQ is new to it.
fn commitment(
    (send, recv): (u32, u32),
    srq: Option<&SharedReceiveQueue>,
    known: &[SharedReceiveQueue],
) -> u64 {
    let recv = match srq {
        Some(srq) if known.iter().any(|k| k.same_queue(srq)) => 0,
        Some(srq) => srq.max_wr(),
        None => recv,
    };
    u64::from(send) + u64::from(recv)
}

impl SharedCompletionQueue {
    /// How many completions it holds.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// How many queue pairs are on it.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether no queue pair is on it.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The numbers of its queue pairs.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.keys().copied()
    }

    /// Work requests posted on queue pair `qpn` and not yet polled (send,
    /// receive; receives from a shared receive queue are counted there).
    pub fn in_flight(&self, qpn: u32) -> Option<(u32, u32)> {
        self.members.get(&qpn).map(|m| m.qp_ref().in_flight())
    }

    fn member(&mut self, qpn: u32) -> Result<&mut Member, Error> {
        self.members
            .get_mut(&qpn)
            .ok_or(Error::NoSuchQueuePair { qpn })
    }

    /// Creates a queue pair from `builder` on this completion queue (its
    /// [`completion_events`](QueuePairBuilder::completion_events) setting
    /// does not matter: this queue's channel serves it) and moves it to
    /// INIT; returns the endpoint its peer needs, whose `qpn` names it
    /// here. Refused if its protection domain is of another device
    /// context, or if this queue could overflow with it (see
    /// [`entries`](SharedCompletionQueueBuilder::entries)).
    pub fn prepare(&mut self, builder: QueuePairBuilder<'_>) -> Result<Endpoint, Error> {
        if builder.pd().context().raw() != self.ctx.raw() {
            return Err(Error::ForeignObject {
                what: "queue pair's protection domain",
                with: "shared completion queue",
                scope: "device context",
            });
        }
        let srq = builder.shared_rq().cloned();
        let depths = builder.depths();
        let adds = commitment(depths, srq.as_ref(), &self.srqs);
        let needed = self.committed + adds;
        if needed > u64::from(self.entries) {
            return Err(Error::CompletionQueueTooSmall {
                entries: self.entries,
                needed,
            });
        }
        let prepared = builder.build_on(Some(&self.cq))?;
        let endpoint = prepared.endpoint();
        self.committed = needed;
        if let Some(srq) = srq {
            if !self.srqs.iter().any(|k| k.same_queue(&srq)) {
                self.srqs.push(srq);
            }
        }
        self.own
            .insert(endpoint.qpn, u64::from(depths.0) + u64::from(depths.1));
        self.members
            .insert(endpoint.qpn, Member::Prepared(prepared));
        Ok(endpoint)
    }

    /// Connects queue pair `qpn` to `remote` (as
    /// [`PreparedQueuePair::connect`]). On failure it stays here, not
    /// connected; [`remove`](Self::remove) takes it away.
    pub fn connect(&mut self, qpn: u32, remote: &Endpoint) -> Result<(), Error> {
        let Some(Member::Prepared(prepared)) = self.members.get(&qpn) else {
            return match self.members.get(&qpn) {
                Some(Member::Connected(_)) => Ok(()),
                _ => Err(Error::NoSuchQueuePair { qpn }),
            };
        };
        prepared.ready(remote)?;
        self.mark_connected(qpn);
        Ok(())
    }

    /// Queue pair `qpn`, if it is prepared and not yet connected.
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    pub(crate) fn prepared(&self, qpn: u32) -> Option<&QueuePair> {
        match self.members.get(&qpn) {
            Some(Member::Prepared(prepared)) => Some(prepared.qp_ref()),
            _ => None,
        }
    }

    /// Queue pair `qpn` was connected elsewhere (by rdma_cm): it is
    /// posted to from now on.
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    pub(crate) fn mark_connected(&mut self, qpn: u32) {
        if let Some(Member::Prepared(prepared)) = self.members.remove(&qpn) {
            self.members
                .insert(qpn, Member::Connected(prepared.into_qp()));
        }
    }

    crate::macros::posting_fn! {
        /// Posts a send-side operation on queue pair `qpn` (as
        /// [`QueuePair::post_send`]); its completion comes through
        /// [`poll`](crate::PollCompletions::poll) with the region.
        pub fn post_send(&mut self, qpn: u32, op: SendOp) posts (region, range, context) {
            match self.members.get_mut(&qpn) {
                Some(Member::Connected(qp)) => qp.post_send(op, region, range, context),
                Some(Member::Prepared(_)) => Err(PostError::new((Error::NotConnected { qpn }, region))),
                None => Err(PostError::new((Error::NoSuchQueuePair { qpn }, region))),
            }
        }
    }

    crate::macros::posting_fn! {
        /// Posts a receive on queue pair `qpn`'s own receive queue (as
        /// [`QueuePair::post_recv`]; refused for one that takes receives from
        /// a shared receive queue: post to that instead).
        pub fn post_recv(&mut self, qpn: u32) posts (region, range, context) {
            match self.member(qpn) {
                Ok(m) => m.qp().post_recv(region, range, context),
                Err(e) => Err(PostError::new((e, region))),
            }
        }
    }

    /// Moves queue pair `qpn` to the error state: its outstanding requests
    /// complete with [`WcStatus::Flushed`] through [`poll`](crate::PollCompletions::poll).
    pub fn set_error(&mut self, qpn: u32) -> Result<(), Error> {
        self.member(qpn)?.qp().set_error()
    }

    /// Polls the device once, routing each completion to its queue pair.
    fn poll_device(&mut self, out: &mut Vec<SharedCompletion>) -> Result<usize, Error> {
        let mut wcs = [const { MaybeUninit::<ffi::ibv_wc>::uninit() }; 32];
        let n = self.cq.poll(&mut wcs).map_err(|source| Error::Verbs {
            call: "ibv_poll_cq",
            device: self.ctx.name().to_string(),
            source,
        })?;
        let mut own = Vec::new();
        let mut raw = Vec::new();
        for entry in &wcs[..n] {
            // SAFETY: `ibv_poll_cq` wrote the first `n` entries.
            let wc = unsafe { RawWc::read(entry) };
            let qpn = wc.qp_num;
            let Some(member) = self.members.get_mut(&qpn) else {
                // Every queue pair's completions are polled before it
                // leaves (`remove`), so none can come later.
                tracing::error!(
                    qpn,
                    wr_id = wc.wr_id,
                    "completion of a queue pair not on this shared completion queue"
                );
                continue;
            };
            let qp = member.qp();
            if let Some(c) = qp.srq.as_ref().and_then(|srq| srq.complete_rc(&wc)) {
                out.push(SharedCompletion { qpn, completion: c });
                continue;
            }
            qp.books
                .complete_device(Wc::from_raw(&wc, None), &mut own, &mut raw);
            debug_assert!(raw.is_empty(), "its queue pairs post no raw requests");
            raw.clear();
            out.extend(
                own.drain(..)
                    .map(|completion| SharedCompletion { qpn, completion }),
            );
        }
        Ok(n)
    }

    /// Takes queue pair `qpn` off the queue and destroys it: moves it to
    /// the error state if it has requests outstanding, waits (5 s at most)
    /// until every one of them has completed, destroys it, and polls the
    /// queue empty so that no completion of it is left behind. Returns the
    /// completions of its own requests found meanwhile (flushed ones
    /// included, their regions handed back); other queue pairs'
    /// completions found meanwhile come at the next [`poll`](crate::PollCompletions::poll).
    /// What the device never completed is freed once the queue pair is
    /// destroyed; if it could not be destroyed, its in-flight regions are
    /// leaked, never freed while the NIC may reach them.
    pub fn remove(&mut self, qpn: u32) -> Result<Vec<Completion>, Error> {
        let member = self.member(qpn)?;
        let qp = member.qp();
        let outstanding = qp.books.outstanding();
        // A queue pair on an SRQ may hold a receive it took from it: the
        // error state flushes that too.
        if outstanding > 0 || qp.srq.is_some() {
            let _ = qp.set_error();
        }
        let mut mine = Vec::new();
        let mut polled = Vec::new();
        let mut route = |polled: &mut Vec<SharedCompletion>,
                         pending: &mut VecDeque<SharedCompletion>| {
            for c in polled.drain(..) {
                if c.qpn == qpn {
                    mine.push(c.completion);
                } else {
                    pending.push_back(c);
                }
            }
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut failed = false;
        while self.member(qpn)?.qp().books.outstanding() > 0 && Instant::now() < deadline {
            if self.poll_device(&mut polled).is_err() {
                failed = true;
                break;
            }
            route(&mut polled, &mut self.pending);
        }
        let qp = self.member(qpn)?.qp();
        let drained = qp.books.outstanding() == 0;
        qp.destroyed = true;
        // SAFETY: the queue pair is ours and destroyed once (marked
        // `destroyed`, so its own drop does not destroy it again), before
        // the shared completion queue it is on.
        let rc = unsafe { ffi::ibv_destroy_qp(qp.qp.as_ptr()) };
        if rc == 0 && !failed {
            // A destroyed queue pair adds no completion: once the queue is
            // empty, none of it is left (a receive it had taken from its
            // shared receive queue may have been among them).
            loop {
                match self.poll_device(&mut polled) {
                    Ok(0) => break,
                    Ok(_) => route(&mut polled, &mut self.pending),
                    Err(_) => break,
                }
            }
        }
        let mut member = self.members.remove(&qpn).expect("looked up above");
        let qp = member.qp();
        tracing::debug!(
            qpn,
            outstanding,
            drained,
            rc,
            "removed a queue pair from a shared completion queue"
        );
        if rc != 0 {
            tracing::error!(
                qpn,
                rc,
                drained,
                "queue pair teardown failed; leaking in-flight buffers"
            );
            for region in qp.books.drain_regions() {
                std::mem::forget(region);
            }
        } else if !drained {
            // Destroyed, its requests are the device's no more (as a
            // queue pair's own teardown, `Sink::drain_and_destroy`).
            tracing::warn!(
                qpn,
                "requests the device never completed are given back after destroying the queue pair"
            );
        }
        let srq = qp.srq.clone();
        self.committed -= self.own.remove(&qpn).unwrap_or(0);
        drop(member);
        // The SRQ's depth stays committed while another queue pair on this
        // queue uses it.
        if let Some(srq) = srq {
            let still = self
                .members
                .values()
                .any(|m| m.qp_ref().srq.as_ref().is_some_and(|s| s.same_queue(&srq)));
            if !still {
                self.committed -= u64::from(srq.max_wr());
                self.srqs.retain(|k| !k.same_queue(&srq));
            }
        }
        if rc != 0 {
            return Err(Error::Verbs {
                call: "ibv_destroy_qp",
                device: self.ctx.name().to_string(),
                source: crate::error::errno(rc),
            });
        }
        Ok(mine)
    }
}

impl SharedCompletionQueue {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn crate::events::Waitable<Item = SharedCompletion> {
        self
    }
}

impl crate::events::Waitable for SharedCompletionQueue {
    type Item = SharedCompletion;

    fn poll(&mut self, out: &mut Vec<SharedCompletion>) -> Result<usize, Error> {
        crate::PollCompletions::poll(self, out)
    }

    fn check_events(&mut self) -> Result<(), Error> {
        self.cq.check_events()
    }

    fn arm(&mut self) -> Result<Armed, Error> {
        self.cq.arm().map_err(|(call, source)| Error::Verbs {
            call,
            device: self.ctx.name().to_string(),
            source,
        })
    }

    fn take_events(&mut self) -> Result<(), Error> {
        self.cq
            .take_events()
            .map(drop)
            .map_err(|(call, source)| Error::Verbs {
                call,
                device: self.ctx.name().to_string(),
                source,
            })
    }

    fn side_fd(&self) -> Option<RawFd> {
        (!self.srqs.is_empty()).then(|| crate::async_event::fd(&self.ctx))
    }

    fn side_ready(&mut self) -> Result<(), Error> {
        crate::async_event::service(&self.ctx).map(drop)
    }
}

impl Drop for SharedCompletionQueue {
    fn drop(&mut self) {
        let qpns: Vec<u32> = self.members.keys().copied().collect();
        for qpn in qpns {
            if let Err(e) = self.remove(qpn) {
                tracing::warn!(qpn, error = %e, "tearing down a queue pair of a shared completion queue");
            }
        }
        // The completion queue goes with the fields, after its queue pairs.
    }
}

/// A shared completion queue polls all its queue pairs, each completion
/// with the number of its queue pair. Its wait also sleeps, when a queue
/// pair on it takes receives from a shared receive queue, on the context's
/// asynchronous events, whose limit event refills that queue.
impl crate::PollCompletions for SharedCompletionQueue {
    type Completion = SharedCompletion;

    fn poll(&mut self, out: &mut Vec<SharedCompletion>) -> Result<usize, Error> {
        let before = out.len();
        out.extend(self.pending.drain(..));
        self.poll_device(out)?;
        Ok(out.len() - before)
    }

    fn poll_wait(
        &mut self,
        out: &mut Vec<SharedCompletion>,
        timeout: std::time::Duration,
    ) -> Result<usize, Error> {
        crate::events::poll_wait(self, out, timeout)
    }
}
