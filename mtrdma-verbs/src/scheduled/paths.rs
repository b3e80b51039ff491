//! The two ways a scheduled queue pair reaches its engine: one of its own
//! (`Solo`, owned outright, nothing locked) or a shared one (`Attached`,
//! behind the scheduler's lock, with its side for what is decided and
//! finished while its owner is away).

use super::*;

mod attached;
mod solo;

pub(super) use attached::Attached;
pub(super) use solo::{BatchScratch, Solo};

/// A scheduled queue pair, for any [`Sink`]: what [`ScheduledQueuePair`]
/// is.
pub(crate) struct Scheduled<S: Sink, Q: PieceScheduler> {
    pub(super) way: Way<S, Q>,
    pub(crate) qpn: u32,
    pub(crate) tenant: TenantId,
    pub(crate) class: TrafficClass,
    /// Its device (none for a null sink): a request of a kind the device
    /// does not run is refused before the scheduler accepts it.
    pub(crate) device: Option<crate::Context>,
}

/// How a queue pair reaches its engine.
pub(super) enum Way<S: Sink, Q: PieceScheduler> {
    /// An engine of its own ([`QueuePair::scheduled`]), owned outright: no
    /// other thread can reach it, so nothing is locked.
    Solo(Box<Solo<S, Q>>),
    /// A [`SharedScheduler`]'s engine, behind its lock.
    Attached(Attached<S, Q>),
}

impl<S: Sink, Q: PieceScheduler> Scheduled<S, Q> {
    /// `sink` on a scheduler of its own.
    pub(crate) fn solo(
        sink: S,
        config: ScheduleConfig,
        sched: Q,
        clock: EngineClock,
    ) -> Result<Scheduled<S, Q>, Error> {
        // Who it is scheduled as first: the engine's pieces follow the
        // latency bound its tenant is held to.
        let who = Who::of(&sink, config.tenant)?;
        let config = held(config, who.protection.as_ref());
        let mut engine = Engine::new(
            SharedConfig {
                chunk_bytes: config.chunk_bytes,
                // One queue pair: `max_pieces_in_flight` is its bound.
                bulk_bytes_in_flight: u64::MAX,
                ..SharedConfig::default()
            },
            sched,
            clock,
        )?;
        engine.set_solo();
        let qpn = sink.qpn();
        let device = sink.device().cloned();
        let (member, tenant, class) =
            engine.add_member(None, qpn, sink.send_room(), who, config)?;
        Ok(Scheduled {
            device,
            way: Way::Solo(Box::new(Solo {
                engine,
                sink,
                member,
                raw: Vec::new(),
                took: false,
                batch: BatchScratch::default(),
            })),
            qpn,
            tenant,
            class,
        })
    }

    pub(crate) fn debug(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("qpn", &self.qpn)
            .field("tenant", &self.tenant)
            .field("class", &self.class)
            .field("queued", &self.queued())
            .finish()
    }

    /// Requests accepted and not yet handed back.
    pub(crate) fn queued(&self) -> usize {
        self.with_member(Member::accepted)
    }

    /// Whether bytes accepted are not yet in the device (queued in the
    /// scheduler, or granted and waiting for room).
    pub(crate) fn unposted(&self) -> bool {
        self.with_member(Member::unposted)
    }

    /// See [`ScheduledQueuePair::window`].
    pub(crate) fn window(&self) -> Option<WindowState> {
        self.with_member(Member::window_state)
    }

    /// Reads this queue pair's entry in the engine.
    fn with_member<R>(&self, f: impl FnOnce(&Member<S>) -> R) -> R {
        match &self.way {
            Way::Solo(solo) => f(solo.engine.member(solo.member)),
            Way::Attached(a) => f(lock(&a.engine).member(a.member)),
        }
    }

    /// Runs `f` on the queue pair, to read (not on the engine).
    pub(crate) fn with_sink_ref<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        match &self.way {
            Way::Solo(solo) => f(&solo.sink),
            Way::Attached(a) => f(&lock(&a.side.qp)),
        }
    }

    /// Runs `f` on the queue pair (not on the engine).
    pub(crate) fn with_sink<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R {
        match &mut self.way {
            Way::Solo(solo) => f(&mut solo.sink),
            Way::Attached(a) => f(&mut lock(&a.side.qp)),
        }
    }

    /// `op` on `sges` regions, if the device does not run it
    /// ([`unsupported_op`](crate::qp::unsupported_op)).
    #[inline]
    pub(crate) fn unsupported(&self, op: SendOp, sges: usize) -> Option<Error> {
        crate::qp::unsupported_op(self.device.as_ref()?, op, sges)
    }

    /// See [`ScheduledQueuePair::post_send`].
    #[inline]
    pub(crate) fn post_send(
        &mut self,
        op: SendOp,
        region: S::Region,
        range: Range<usize>,
        context: u64,
        whole: bool,
    ) -> Result<(), (Error, S::Region)> {
        let sge = match check_send(op, &region, &range) {
            Ok(sge) => sge,
            Err(error) => return Err((error, region)),
        };
        if let Some(error) = self.unsupported(op, 1) {
            return Err((error, region));
        }
        match &mut self.way {
            Way::Solo(solo) => solo.post_send(op, whole, region, range, sge, context),
            Way::Attached(a) => {
                let member = a.member;
                a.with_engine(|e| {
                    let piece =
                        e.post_send(member, Op { op, whole }, region, range, sge, context)?;
                    e.own_pieces_mut().extend(piece);
                    Ok(())
                })
            }
        }
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledQueuePair::post_send_gather`].
        pub(crate) fn post_gather(&mut self, op: SendOp)
            posts gather (parts, context) for S::Region {
            if let Some(error) = self.unsupported(op, parts.len()) {
                return Err((error, parts));
            }
            let (request, ranges) = self.gather_request(op, parts, context)?;
            let result = match &mut self.way {
                Way::Solo(solo) => solo.post_request(request),
                Way::Attached(a) => {
                    let member = a.member;
                    a.with_engine(|e| {
                        let piece = request.accept(e, member)?;
                        e.own_pieces_mut().extend(piece);
                        Ok(())
                    })
                }
            };
            result.map_err(|(error, regions)| (error, regions.into_iter().zip(ranges).collect()))
        }
    }

    /// A gather request of `parts` checked against this queue pair's
    /// `max_send_sge` ([`check_gather`]), and the ranges as given (to
    /// hand back with the regions should it be refused later); on refusal
    /// the parts come back untouched.
    #[allow(clippy::type_complexity)]
    pub(crate) fn gather_request(
        &self,
        op: SendOp,
        parts: Vec<(S::Region, Range<usize>)>,
        context: u64,
    ) -> Result<(Request<S::Region>, Vec<Range<usize>>), (Error, Vec<(S::Region, Range<usize>)>)>
    {
        let max_sge = self.with_sink_ref(|qp| qp.books().max_send_sge);
        let Gather { sges, len } = match check_gather(op, &parts, max_sge) {
            Ok(gather) => gather,
            Err(error) => return Err((error, parts)),
        };
        let (regions, ranges): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        let mut regions = regions.into_iter();
        let region = regions.next().expect("check_gather refuses an empty list");
        let sge = sges.first().copied().unwrap_or_default();
        let request = Request {
            op,
            region,
            range: 0..len as usize,
            sge,
            context,
            gather: Some(Box::new(Gathered {
                rest: regions.collect(),
                sges,
            })),
        };
        Ok((request, ranges))
    }

    /// See [`ScheduledQueuePair::poll`].
    #[inline]
    pub(crate) fn poll(&mut self, out: &mut Vec<Done<S>>) -> Result<usize, Error> {
        match &mut self.way {
            Way::Solo(solo) => solo.poll(out),
            Way::Attached(a) => a.poll(out),
        }
    }

    /// When the engine wants to be polled although no completion arrives
    /// (see `Waitable::poll_by`).
    pub(crate) fn poll_by(&self) -> Option<Instant> {
        match &self.way {
            Way::Solo(solo) => Waitable::poll_by(&**solo),
            Way::Attached(a) => Waitable::poll_by(a),
        }
    }

    /// See [`ScheduledQueuePair::poll_wait`].
    pub(crate) fn poll_wait(
        &mut self,
        out: &mut Vec<Done<S>>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        crate::events::poll_wait(self.waitable(), out, timeout)
    }

    /// Its way to the engine, as something whose completions can be
    /// waited for (blocking in [`poll_wait`](Self::poll_wait), or by a
    /// future).
    pub(crate) fn waitable(&mut self) -> &mut dyn Waitable<Item = Done<S>> {
        match &mut self.way {
            Way::Solo(solo) => &mut **solo,
            Way::Attached(a) => a,
        }
    }
}

/// A send-side request of a batch, its range checked (`sge`).
pub(crate) struct Request<R> {
    pub(crate) op: SendOp,
    /// Its region (a gather request's first).
    pub(crate) region: R,
    /// Its range (a gather request's: `0..` its bytes).
    pub(crate) range: Range<usize>,
    /// Its scatter entry (a gather request's first).
    pub(crate) sge: ffi::ibv_sge,
    pub(crate) context: u64,
    /// A gather request's other regions and scatter list
    /// ([`Scheduled::gather_request`]); it goes whole, never parked.
    pub(super) gather: Option<Box<Gathered<R>>>,
}

impl<R: Region> Request<R> {
    /// A request on one region (not a gather), already checked: `sge` is
    /// its scatter entry.
    pub(crate) fn single(
        op: SendOp,
        region: R,
        range: Range<usize>,
        sge: ffi::ibv_sge,
        context: u64,
    ) -> Request<R> {
        Request {
            op,
            region,
            range,
            sge,
            context,
            gather: None,
        }
    }

    /// Its regions, in order (a gather request's all), each with its
    /// context: how a request not posted is handed back.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (u64, R)> {
        let context = self.context;
        let rest = self.gather.map(|g| g.rest).unwrap_or_default();
        std::iter::once(self.region)
            .chain(rest)
            .map(move |region| (context, region))
    }

    /// Accepts it on `engine` for `member` (see [`Engine::post_send`]; a
    /// gather request whole, [`Engine::post_gather`]). On refusal its
    /// regions come back, in order.
    #[allow(clippy::type_complexity)]
    fn accept<S: Sink<Region = R>, Q: PieceScheduler>(
        self,
        engine: &mut Engine<S, Q>,
        member: usize,
    ) -> Result<Option<RawSend>, (Error, Vec<R>)> {
        let Request {
            op,
            region,
            range,
            sge,
            context,
            gather,
        } = self;
        match gather {
            None => engine
                .post_send(member, Op { op, whole: false }, region, range, sge, context)
                .map_err(|(error, region)| (error, vec![region])),
            Some(gather) => {
                let len = u32::try_from(range.len()).expect("check_gather: it fits a u32");
                engine
                    .post_gather(member, op, region, gather, len, context)
                    .map_err(|(error, first, gather)| {
                        (error, std::iter::once(first).chain(gather.rest).collect())
                    })
            }
        }
    }
}

/// Send-side requests to be accepted together on a scheduled queue pair
/// of any [`Sink`]: what [`ScheduledBatch`] is.
///
/// On a queue pair with an engine of its own, the leading requests the
/// engine lets go at once (`may_park`, judged as each is added, after
/// those before it are counted, as for as many single posts) are built
/// into one list of work requests as they are added, and counted by the
/// engine then; the rest (from the first it does not let go, or the first
/// gather request, on) are accepted by the engine in order at
/// [`submit`](Self::submit), as are all of a shared engine's.
pub(crate) struct Batched<'a, S: Sink, Q: PieceScheduler> {
    qp: &'a mut Scheduled<S, Q>,
    /// The leading requests let go at once, and what each asked for (to
    /// hand one the queue pair refuses to the engine after all).
    parked: Option<(List<S::Region>, Vec<Asked>)>,
    /// The rest, in order.
    requests: Vec<Request<S::Region>>,
}

/// What a parked request of a batch asked for.
pub(super) type Asked = (SendOp, Range<usize>, ffi::ibv_sge);

impl<'a, S: Sink, Q: PieceScheduler> Batched<'a, S, Q> {
    pub(crate) fn new(qp: &'a mut Scheduled<S, Q>) -> Self {
        Batched {
            qp,
            parked: None,
            requests: Vec::new(),
        }
    }

    /// Requests in the batch.
    pub(crate) fn len(&self) -> usize {
        self.parked.as_ref().map_or(0, |(list, _)| list.len()) + self.requests.len()
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledBatch::post_send`].
        pub(crate) fn push(&mut self, op: SendOp)
            posts (region, range, context) for S::Region {
            if let Some(error) = self.qp.unsupported(op, 1) {
                return Err((error, region));
            }
            let sge = match check_send(op, &region, &range) {
                Ok(sge) => sge,
                Err(error) => return Err((error, region)),
            };
            let region = match &mut self.qp.way {
                Way::Solo(solo) if self.requests.is_empty() => {
                    match solo.park_in(&mut self.parked, op, region, &range, sge, context) {
                        Ok(()) => return Ok(()),
                        Err(region) => region,
                    }
                }
                _ => region,
            };
            self.requests
                .push(Request::single(op, region, range, sge, context));
            Ok(())
        }
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledBatch::post_send_gather`].
        pub(crate) fn push_gather(&mut self, op: SendOp)
            posts gather (parts, context) for S::Region {
            if let Some(error) = self.qp.unsupported(op, parts.len()) {
                return Err((error, parts));
            }
            let (request, _) = self.qp.gather_request(op, parts, context)?;
            self.requests.push(request);
            Ok(())
        }
    }

    /// See [`ScheduledBatch::submit`].
    pub(crate) fn submit(mut self) -> Result<(), Refusal<S::Region>> {
        let parked = self.parked.take();
        let requests = std::mem::take(&mut self.requests);
        match &mut self.qp.way {
            Way::Solo(solo) => solo.post_batch(parked, requests),
            Way::Attached(a) => {
                debug_assert!(parked.is_none(), "only a solo queue pair parks");
                let member = a.member;
                a.with_engine(|e| accept_all(e, member, requests))
            }
        }
    }

    /// See [`ScheduledBatch::cancel`].
    pub(crate) fn cancel(mut self) -> Vec<(u64, S::Region)> {
        let mut back = self.unpark();
        back.extend(
            std::mem::take(&mut self.requests)
                .into_iter()
                .flat_map(Request::into_entries),
        );
        back
    }

    /// Takes the parked requests back out of the engine's count, and
    /// hands their regions back in order.
    fn unpark(&mut self) -> Vec<(u64, S::Region)> {
        let (Some((list, asked)), Way::Solo(solo)) = (self.parked.take(), &mut self.qp.way) else {
            return Vec::new();
        };
        solo.engine.parked_done(solo.member, list.len());
        solo.keep_asked(asked);
        list.cancel(solo.sink.books_mut())
    }
}

impl<S: Sink, Q: PieceScheduler> Drop for Batched<'_, S, Q> {
    fn drop(&mut self) {
        // Never submitted: nothing was posted, and the regions may be
        // freed.
        drop(self.unpark());
    }
}

/// Accepts `requests` on `engine` for `member` in order, the pieces it
/// decides left in `own_pieces` for the caller to post as one list (a
/// request's piece sent at once may report with a later one, as in a
/// direct batch); stops at the first the engine refuses, which comes back
/// with those after it.
fn accept_all<S: Sink, Q: PieceScheduler>(
    engine: &mut Engine<S, Q>,
    member: usize,
    requests: Vec<Request<S::Region>>,
) -> Result<(), Refusal<S::Region>> {
    let mut requests = requests.into_iter();
    let mut posted = 0;
    while let Some(r) = requests.next() {
        let context = r.context;
        match r.accept(engine, member) {
            Ok(piece) => {
                engine.own_pieces_mut().extend(piece.map(|mut piece| {
                    piece.quiet_ok = piece.ud.is_none();
                    piece
                }));
                posted += 1;
            }
            Err((error, regions)) => {
                let mut refused: Vec<_> = regions.into_iter().map(|r| (context, r)).collect();
                let mut not_posted = 1;
                for r in requests {
                    not_posted += 1;
                    refused.extend(r.into_entries());
                }
                return Err(Refusal {
                    posted,
                    not_posted,
                    error: Box::new(error),
                    refused,
                });
            }
        }
    }
    Ok(())
}

/// Whether the engine asked (through `wake_at`) to be pumped by now.
#[inline]
pub(super) fn wake_due(wake_at: &AtomicU64, clock: &EngineClock) -> bool {
    let wake = wake_at.load(Ordering::Acquire);
    wake != u64::MAX && clock.now().0 >= wake
}

/// When the engine asked (through `wake_at`) to be pumped, as an instant;
/// `None`: not before a completion or a post.
pub(super) fn wake_instant(wake_at: &AtomicU64, clock: &EngineClock) -> Option<Instant> {
    let wake = wake_at.load(Ordering::Acquire);
    if wake == u64::MAX {
        return None;
    }
    let left = Duration::from_nanos(wake.saturating_sub(clock.now().0));
    Instant::now().checked_add(left)
}

/// The longest a queue pair on a [`SharedScheduler`] sleeps in
/// `poll_wait` before polling again: work the other queue pairs decide
/// for it raises no event on its channel.
pub(super) const ATTACHED_WAIT: Duration = Duration::from_millis(1);

/// Posts one piece on `qp`; if the NIC refuses it, the completion that
/// fails it.
#[inline(always)]
pub(super) fn post_piece<S: Sink>(qp: &mut S, piece: RawSend) -> Option<RawCompletion> {
    let wr_id = piece.wr_id;
    // SAFETY: the piece lies inside its message's region (checked at
    // `post_send`), and the engine keeps the message, region and all,
    // until every piece decided for it has completed or failed
    // (`finish_if_done` counts decided pieces), or forever if the queue
    // pair cannot be drained (`detach`).
    match unsafe { qp.post(piece) } {
        Ok(()) => None,
        Err(e) => Some(refused_piece(wr_id, &e)),
    }
}

/// Posts `pieces` on `qp` in order, as lists ([`Sink::post_list`]: one
/// doorbell each). A piece the NIC refuses completes as failed, and so
/// does every later piece of its request or of one `refused_before`
/// names (as flushed, not posted): the rest of a request must not reach
/// the peer after a hole (the last piece of a split WRITE with immediate
/// would tell the peer that the whole of it had arrived). Those
/// completions go to `failed`.
pub(super) fn post_pieces<S: Sink>(
    qp: &mut S,
    pieces: &[RawSend],
    refused_before: impl Fn(u64) -> bool,
    failed: &mut Vec<RawCompletion>,
) {
    let refused = |wr_id: u64, failed: &[RawCompletion]| {
        refused_before(wr_id) || failed.iter().any(|c| c.wr_id == wr_id)
    };
    let mut start = 0;
    while start < pieces.len() {
        let end = pieces[start..]
            .iter()
            .position(|p| refused(p.wr_id, failed))
            .map_or(pieces.len(), |k| start + k);
        if end == start {
            failed.push(dropped(pieces[start].wr_id));
            start += 1;
            continue;
        }
        // SAFETY: every piece lies inside its message's region (checked
        // at `post_send`), and the engine keeps the message, region and
        // all, until every piece decided for it has completed or failed
        // (`finish_if_done` counts decided pieces), or forever if the
        // queue pair cannot be drained (`detach`).
        match unsafe { qp.post_list(&pieces[start..end]) } {
            Ok(()) => start = end,
            Err((taken, e)) => {
                let at = start + taken;
                failed.push(refused_piece(pieces[at].wr_id, &e));
                start = at + 1;
            }
        }
    }
}

/// The completion that fails piece `wr_id`, which the NIC refused.
#[cold]
pub(super) fn refused_piece(wr_id: u64, e: &Error) -> RawCompletion {
    tracing::warn!(error = %e, "posting a scheduled piece failed");
    RawCompletion {
        wr_id,
        status: WcStatus::LocalQpOperation,
        sampled: false,
    }
}

/// The completion of piece `wr_id`, not posted because an earlier piece
/// of its request was refused: the rest of a request must not reach the
/// peer after a hole (the last piece of a split WRITE with immediate
/// would tell the peer that the whole of it had arrived).
#[cold]
pub(super) fn dropped(wr_id: u64) -> RawCompletion {
    RawCompletion {
        wr_id,
        status: WcStatus::Flushed,
        sampled: false,
    }
}
