//! Windows: how many bytes one sender may have in the NIC.
//!
//! A [`Window`] bounds what one sender (a queue pair, or a process's bulk
//! traffic) keeps in the NIC, told what happens to its pieces. The gate
//! ([`Lane`](crate::gate::Lane)), `mtrdma-verbs`' engine and the
//! [simulator](crate::sim) call it only through this trait, so a window is
//! a plug-in, as a congestion controller is in quinn: a
//! [`WindowFactory`] (in `mtrdma_verbs::ScheduleConfig::window`) makes one
//! for every sender, and the coordinator's signals (the link's measured
//! rate, the gain on the tenant's growth, the weights sharing the link, a
//! new weight from a policy reload) reach it through one method,
//! [`Window::signals`].
//!
//! [`DelayWindow`] (the [`delay`] module) is the one mtrdma ships: it
//! follows the delay of the sender's own pieces, with no shared state and
//! no daemon. [`FixedWindow`] is the smallest other: a fixed byte budget.
//! A policy with a latency bound always gives bulk senders a
//! `DelayWindow` ([`Protection`](crate::Protection)): a tenant's own
//! window is not trusted to hold the operator's bound.
//!
//! ```
//! use mtrdma_sched::window::{FixedWindow, Window, WindowFactory};
//! use mtrdma_sched::{Admit, Nanos};
//! let mut w = FixedWindow::new(8192).build(0, 1).unwrap();
//! assert_eq!(w.admit(4096, 4096, Nanos::ZERO), Admit::Now);
//! assert_eq!(w.admit(8192, 4096, Nanos::ZERO), Admit::AfterCompletion);
//! w.on_sent(4096, Nanos::ZERO);
//! assert_eq!(w.window(), 8192);
//! ```

use std::fmt;

use crate::error::ConfigError;
use crate::time::Nanos;

pub mod delay;
pub(crate) use delay::splitmix64;
pub use delay::{DelayWindow, DelayWindowConfig, MAX_ALLOWANCE};

/// Whether a piece may go into the NIC now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// It may go now.
    Now,
    /// Not before this time (pacing), unless a completion changes that.
    At(Nanos),
    /// Not until a piece in flight completes. With none of the sender's
    /// pieces in flight, the gate lets the piece go alone instead: no
    /// completion would come (see [`Window::admit`]).
    AfterCompletion,
}

impl Admit {
    /// [`Now`](Admit::Now) if `fits`, else
    /// [`AfterCompletion`](Admit::AfterCompletion).
    #[inline]
    pub(crate) fn now_if(fits: bool) -> Admit {
        if fits {
            Admit::Now
        } else {
            Admit::AfterCompletion
        }
    }
}

/// A bound on the bytes one sender keeps in the NIC, told what happens to
/// its pieces.
///
/// The engine calls [`admit`](Self::admit) before posting a piece,
/// [`on_sent`](Self::on_sent) when it posts one and
/// [`on_completed`](Self::on_completed) when its completion is polled. The
/// window knows nothing of verbs; implement it to plug in a rule of your
/// own.
pub trait Window: fmt::Debug + Send {
    /// Whether a piece of `bytes` may be posted at `now` while `in_flight`
    /// bytes of this sender are in the NIC. A piece larger than the
    /// window (a request sent whole) never fits it: when none of the
    /// sender's pieces is in the NIC, [`gate`](crate::gate) posts it alone
    /// on [`Admit::AfterCompletion`] rather than wait for a completion
    /// that would never come ([`Admit::At`] still holds it for a time).
    fn admit(&self, in_flight: u64, bytes: u64, now: Nanos) -> Admit;

    /// A piece of `bytes` was posted at `now`.
    fn on_sent(&mut self, bytes: u64, now: Nanos);

    /// A piece of `bytes` posted at `sent_at` completed at `now`.
    fn on_completed(&mut self, bytes: u64, sent_at: Nanos, now: Nanos);

    /// As [`on_completed`](Self::on_completed), for a piece whose
    /// completion was found `host` late because the polling thread, woken
    /// by the completion, waited that long for a CPU (its run-queue wait,
    /// which the kernel accounts): time the host, not the NIC, added. The
    /// default dates the completion that much earlier (never before
    /// `sent_at`).
    fn on_completed_late(&mut self, bytes: u64, sent_at: Nanos, now: Nanos, host: Nanos) {
        self.on_completed(bytes, sent_at, dated(sent_at, now, host));
    }

    /// A piece of `bytes` posted at `sent_at` is known at `now` to have
    /// completed without a completion of its own: it went unsignaled, and
    /// the completion of a later piece of its queue pair reported it (the
    /// send queue completes in order). It finished at some time up to
    /// `now`, so it is no delay sample; the completion that reported it
    /// comes next. The default takes it as a piece completed at `now`
    /// (which may overstate its delay); [`DelayWindow`] counts its bytes
    /// back at once and judges them with the sample that follows.
    fn on_completed_unsampled(&mut self, bytes: u64, sent_at: Nanos, now: Nanos) {
        self.on_completed(bytes, sent_at, now);
    }

    /// The window now, in bytes.
    fn window(&self) -> u64;

    /// What the window made of the pieces completed since the last call:
    /// the bytes it judged and those it found over its target (a queue
    /// longer than it allows). The engine adds them to the tenant's
    /// counters in the quota table, and the coordinator shows the share
    /// over target (`mtrdma_core::coordinator::Coordinator::link_view`).
    /// The default judges nothing.
    fn take_verdicts(&mut self) -> Verdicts {
        Verdicts::default()
    }

    /// Takes the coordinator's signals: whatever `signals` names (a field
    /// left `None` is not news). The engine passes the link rate, gain and
    /// sharing weight at every completion, and a weight when a policy
    /// reload changes the tenant's. The default ignores them.
    fn signals(&mut self, signals: &Signals) {
        let _ = signals;
    }

    /// What the window stands at, for a queue pair's
    /// `mtrdma_verbs::ScheduledQueuePair::window`. The default tells only
    /// [`window`](Self::window).
    fn view(&self) -> WindowView {
        WindowView {
            window_bytes: self.window(),
            ..WindowView::default()
        }
    }
}

/// When a piece posted at `sent_at` and found complete at `now` by a
/// poller that woke `host` late really completed: `host` earlier, never
/// before `sent_at` ([`Window::on_completed_late`]; a latency lane's delay
/// samples, [`Gate::completed`](crate::gate::Gate::completed)).
pub(crate) fn dated(sent_at: Nanos, now: Nanos, host: Nanos) -> Nanos {
    Nanos(now.0.saturating_sub(host.0).max(sent_at.0))
}

/// Bytes a [`Window`] judged, and how many of them it found over its
/// target ([`Window::take_verdicts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Bytes of completed pieces judged against the target.
    pub judged: u64,
    /// Of those, bytes whose delay was over the target.
    pub over_target: u64,
}

/// What the coordinator tells a tenant's windows ([`Window::signals`]);
/// `None`: not news.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// The rate the tenants together move through the link, bytes per
    /// second, as the coordinator measures it (`Some(0)`: not measured).
    pub link_rate: Option<u64>,
    /// The gain on the tenant's windows' growth, parts per million
    /// ([`ShareGains`](crate::share::ShareGains)).
    pub gain_ppm: Option<u32>,
    /// The weights of the tenants whose windows share the link's growth,
    /// added up ([`sharing_for`](crate::share::sharing_for)).
    pub sharing_weight: Option<u32>,
    /// The tenant's weight, after a policy reload changed it.
    pub weight: Option<u32>,
    /// Whether the coordinator permits windows no smaller than one piece
    /// ([`piece_floor`](crate::piece_floor)).
    pub piece_floor: Option<bool>,
}

/// A window as it stands ([`Window::view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    /// Bytes it lets the sender have in the NIC.
    pub window_bytes: u64,
    /// The path's own delay as learnt, if the window learns one.
    pub base_delay: Option<Nanos>,
    /// The smoothed completion time of recent pieces, if kept.
    pub smoothed_delay: Option<Nanos>,
    /// Completion times above this shrink it, if it has a target.
    pub target_delay: Option<Nanos>,
    /// The sender's weight (1 if it has none).
    pub weight: u32,
    /// The coordinator's gain on its growth, parts per million.
    pub gain_ppm: u32,
    /// The weights sharing the link's growth with it (1: not known).
    pub sharing_weight: u32,
    /// The bytes it lets stand queued at the port once the link's rate is
    /// known (0: it keeps no such allowance).
    pub queue_bytes: u64,
}

impl Default for WindowView {
    fn default() -> WindowView {
        WindowView {
            window_bytes: 0,
            base_delay: None,
            smoothed_delay: None,
            target_delay: None,
            weight: 1,
            gain_ppm: crate::share::GAIN_ONE,
            sharing_weight: 1,
            queue_bytes: 0,
        }
    }
}

/// Makes a [`Window`] for each sender, as quinn's `ControllerFactory`
/// makes a congestion controller for each connection. Put one in
/// `mtrdma_verbs::ScheduleConfig::window`.
pub trait WindowFactory: fmt::Debug + Send + Sync {
    /// A window for one sender. `seed` differs between senders (the
    /// engine passes the queue pair number) for windows that spread their
    /// senders out; `weight` is its tenant's weight, for windows that share
    /// by weight (unless [`weight`](Self::weight) names one).
    ///
    /// # Errors
    /// [`ConfigError`] for settings the window cannot run with.
    fn build(&self, seed: u64, weight: u32) -> Result<Box<dyn Window>, ConfigError>;

    /// The weight its windows keep whatever the tenant's (`None`, the
    /// default: the tenant's, following policy reloads).
    fn weight(&self) -> Option<u32> {
        None
    }

    /// The queue allowance its windows keep, in bytes, if it has one: a
    /// latency bound keeps a smaller one than its own.
    fn queue_bytes(&self) -> Option<u64> {
        None
    }
}

impl WindowFactory for DelayWindowConfig {
    /// A [`DelayWindow`] with these settings, seeded with `seed`, of
    /// `weight` if its own is left at 1.
    fn build(&self, seed: u64, weight: u32) -> Result<Box<dyn Window>, ConfigError> {
        let window = DelayWindow::new(DelayWindowConfig {
            seed,
            weight: self.weight().unwrap_or(weight),
            ..self.clone()
        })?;
        Ok(Box::new(window))
    }

    /// Its own weight, unless left at 1.
    fn weight(&self) -> Option<u32> {
        (self.weight != 1).then_some(self.weight)
    }

    fn queue_bytes(&self) -> Option<u64> {
        Some(self.queue_bytes)
    }
}

/// A window of a fixed number of bytes: the sender keeps at most that many
/// in the NIC, whatever the delay (at least one piece goes when none is
/// out). The smallest [`Window`] besides [`DelayWindow`]; its own factory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    bytes: u64,
}

impl FixedWindow {
    /// A budget of `bytes` (at least 1).
    pub fn new(bytes: u64) -> FixedWindow {
        FixedWindow {
            bytes: bytes.max(1),
        }
    }
}

impl Window for FixedWindow {
    fn admit(&self, in_flight: u64, bytes: u64, _now: Nanos) -> Admit {
        Admit::now_if(in_flight == 0 || in_flight.saturating_add(bytes) <= self.bytes)
    }

    fn on_sent(&mut self, _bytes: u64, _now: Nanos) {}

    fn on_completed(&mut self, _bytes: u64, _sent_at: Nanos, _now: Nanos) {}

    fn window(&self) -> u64 {
        self.bytes
    }
}

impl WindowFactory for FixedWindow {
    fn build(&self, _seed: u64, _weight: u32) -> Result<Box<dyn Window>, ConfigError> {
        Ok(Box::new(*self))
    }
}
