//! The scheduled data path on null sinks: a shared engine
//! ([`NullScheduler`]), a queue pair on an engine of its own or on a shared
//! one ([`NullScheduled`]), and batches ([`NullBatch`]).

use super::*;

/// A [`SharedScheduler`](crate::SharedScheduler) for null sinks.
#[derive(Clone)]
pub struct NullScheduler {
    shared: Shared<NullSink, DefaultScheduler>,
}

impl std::fmt::Debug for NullScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.debug("NullScheduler", f)
    }
}

impl NullScheduler {
    /// See [`SharedScheduler::new`](crate::SharedScheduler::new).
    pub fn new(config: SharedConfig) -> Result<NullScheduler, Error> {
        Self::on(config, EngineClock::real())
    }

    /// The same on `clock`, which moves only when told to: the engine
    /// (its windows, pacing, the release of stalled budget, its wake-ups)
    /// then runs in virtual time.
    pub fn with_clock(
        config: SharedConfig,
        clock: Arc<ManualClock>,
    ) -> Result<NullScheduler, Error> {
        Self::on(config, EngineClock::Manual(clock))
    }

    fn on(config: SharedConfig, clock: EngineClock) -> Result<NullScheduler, Error> {
        let sched = default_scheduler(&config)?;
        Ok(NullScheduler {
            shared: Shared::new(config, sched, clock)?,
        })
    }

    crate::scheduled::shared_scheduler_methods!();

    /// See [`QueuePair::scheduled_on`](crate::QueuePair::scheduled_on).
    pub fn attach(&self, sink: NullSink, config: ScheduleConfig) -> Result<NullScheduled, Error> {
        Ok(NullScheduled {
            inner: self.shared.attach(sink, config)?,
        })
    }
}

/// See [`QueuePair::scheduled`](crate::QueuePair::scheduled): a null sink
/// on a scheduler of its own.
pub fn scheduled(sink: NullSink, config: ScheduleConfig) -> Result<NullScheduled, Error> {
    let (config, sched) = solo_parts(config, sink.tenant.as_ref())?;
    scheduled_with(sink, config, sched)
}

/// [`scheduled`] on `clock`, which moves only when told to: the engine
/// (its window, pacing, its wake-ups) runs in virtual time, and a test
/// decides how long each piece took by moving the clock between the post
/// and the poll that completes it.
pub fn scheduled_with_clock(
    sink: NullSink,
    config: ScheduleConfig,
    clock: Arc<ManualClock>,
) -> Result<NullScheduled, Error> {
    let (config, sched) = solo_parts(config, sink.tenant.as_ref())?;
    scheduled_with_on_clock(sink, config, sched, clock)
}

/// See [`QueuePair::scheduled_with`](crate::QueuePair::scheduled_with): a
/// null sink on a scheduler of its own, `sched`.
pub fn scheduled_with<Q: PieceScheduler>(
    sink: NullSink,
    config: ScheduleConfig,
    sched: Q,
) -> Result<NullScheduled<Q>, Error> {
    Ok(NullScheduled {
        inner: Scheduled::solo(sink, config, sched, EngineClock::real())?,
    })
}

/// [`scheduled_with`] on `clock`, as [`scheduled_with_clock`] is for the
/// built-in scheduler: a scheduler of the caller's (say, one composed of
/// `mtrdma_sched::compose` pieces) in virtual time.
pub fn scheduled_with_on_clock<Q: PieceScheduler>(
    sink: NullSink,
    config: ScheduleConfig,
    sched: Q,
    clock: Arc<ManualClock>,
) -> Result<NullScheduled<Q>, Error> {
    Ok(NullScheduled {
        inner: Scheduled::solo(sink, config, sched, EngineClock::Manual(clock))?,
    })
}

/// A [`ScheduledQueuePair`](crate::ScheduledQueuePair) on a null sink.
pub struct NullScheduled<Q: PieceScheduler = DefaultScheduler> {
    inner: Scheduled<NullSink, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for NullScheduled<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug("NullScheduled", f)
    }
}

impl<Q: PieceScheduler> NullScheduled<Q> {
    /// It, as something whose completions can be waited for.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waitable(&mut self) -> &mut dyn crate::events::Waitable<Item = HostCompletion> {
        self.inner.waitable()
    }
}

impl<Q: PieceScheduler> NullScheduled<Q> {
    crate::macros::posting_fn! {
        /// See [`ScheduledQueuePair::post_send`](crate::ScheduledQueuePair::post_send).
        pub fn post_send(&mut self, op: SendOp)
            posts (region, range, context) for HeapRegion {
            self.inner.post_send(op, region, range, context, false)
        }
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledQueuePair::post_send_gather`](crate::ScheduledQueuePair::post_send_gather):
        /// on refusal, the error and the parts, untouched, in order.
        pub fn post_send_gather(&mut self, op: SendOp)
            posts gather (parts, context) for HeapRegion {
            self.inner.post_gather(op, parts, context)
        }
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledQueuePair::post_send_whole`](crate::ScheduledQueuePair::post_send_whole).
        pub fn post_send_whole(&mut self, op: SendOp)
            posts (region, range, context) for HeapRegion {
            self.inner.post_send(op, region, range, context, true)
        }
    }

    /// See [`ScheduledQueuePair::batch`](crate::ScheduledQueuePair::batch)
    /// and [`ScheduledBatch::submit`](crate::ScheduledBatch::submit):
    /// `requests` (operation, region, range, context) accepted together.
    /// On refusal, the error and the requests not accepted, as (context,
    /// region).
    pub fn post_batch(
        &mut self,
        requests: impl IntoIterator<Item = (SendOp, HeapRegion, Range<usize>, u64)>,
    ) -> Result<(), BatchRefused> {
        super::post_all(Batched::new(&mut self.inner), requests)
    }

    /// See [`ScheduledQueuePair::batch`](crate::ScheduledQueuePair::batch).
    pub fn batch(&mut self) -> NullBatch<'_, Q> {
        NullBatch {
            inner: Batched::new(&mut self.inner),
        }
    }

    /// See [`ScheduledQueuePair::poll`](crate::ScheduledQueuePair::poll).
    pub fn poll(&mut self, out: &mut Vec<HostCompletion>) -> Result<usize, Error> {
        self.inner.poll(out)
    }

    /// See [`ScheduledQueuePair::poll_wait`](crate::ScheduledQueuePair::poll_wait).
    /// A null sink completes what was posted at the next poll, so this
    /// never sleeps: it polls and returns.
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<HostCompletion>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        self.inner.poll_wait(out, timeout)
    }

    /// See [`ScheduledQueuePair::queued`](crate::ScheduledQueuePair::queued).
    pub fn queued(&self) -> usize {
        self.inner.queued()
    }

    /// See [`ScheduledQueuePair::window`](crate::ScheduledQueuePair::window).
    pub fn window(&self) -> Option<crate::WindowState> {
        self.inner.window()
    }

    /// See [`ScheduledQueuePair::tenant`](crate::ScheduledQueuePair::tenant).
    pub fn tenant(&self) -> TenantId {
        self.inner.tenant
    }

    /// See [`ScheduledQueuePair::class`](crate::ScheduledQueuePair::class).
    pub fn class(&self) -> mtrdma_core::TrafficClass {
        self.inner.class
    }

    /// Runs `f` on its null sink.
    pub fn with_sink<R>(&mut self, f: impl FnOnce(&mut NullSink) -> R) -> R {
        self.inner.with_sink(f)
    }
}

/// A [`ScheduledBatch`](crate::ScheduledBatch) on a null sink
/// ([`NullScheduled::batch`]).
#[must_use = "a batch posts nothing until it is submitted"]
pub struct NullBatch<'qp, Q: PieceScheduler = DefaultScheduler> {
    inner: Batched<'qp, NullSink, Q>,
}

impl<Q: PieceScheduler> std::fmt::Debug for NullBatch<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullBatch")
            .field("requests", &self.inner.len())
            .finish()
    }
}

impl<Q: PieceScheduler> NullBatch<'_, Q> {
    crate::macros::posting_fn! {
        /// See [`ScheduledBatch::post_send`](crate::ScheduledBatch::post_send).
        pub fn post_send(&mut self, op: SendOp)
            posts (region, range, context) for HeapRegion {
            self.inner.push(op, region, range, context)
        }
    }

    crate::macros::posting_fn! {
        /// See [`ScheduledBatch::post_send_gather`](crate::ScheduledBatch::post_send_gather):
        /// on refusal, the error and the parts, untouched, in order.
        pub fn post_send_gather(&mut self, op: SendOp)
            posts gather (parts, context) for HeapRegion {
            self.inner.push_gather(op, parts, context)
        }
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }

    /// See [`ScheduledBatch::submit`](crate::ScheduledBatch::submit): on
    /// refusal, the error and the regions not accepted, as (context,
    /// region), a gather request's consecutive.
    pub fn submit(self) -> Result<(), BatchRefused> {
        self.inner
            .submit()
            .map_err(|refusal| (*refusal.error, refusal.refused))
    }

    /// See [`ScheduledBatch::cancel`](crate::ScheduledBatch::cancel).
    pub fn cancel(self) -> Vec<(u64, HeapRegion)> {
        self.inner.cancel()
    }
}
