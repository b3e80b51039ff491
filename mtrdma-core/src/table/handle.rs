//! A process's membership in a tenant: admission on the control path and
//! shared rate limits on the data path.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::layout::*;
use super::{QuotaTable, TableError};
use crate::policy::TenantEntry;
use crate::table::AdmissionError;
use crate::RateLimit;
use crate::{gcra_shared, EmissionInterval};

mod permits;
mod rate;
mod usage;

use crate::{TenantId, TrafficClass};
use mtrdma_sched::piece_floor::{Permit, Shift};
use mtrdma_sched::share::{GAIN_ONE, MAX_GAIN};
pub use permits::*;
use rate::{gcra_rescale, CachedCap};
pub use usage::*;

/// How far behind its fair rate a tenant may fall and still catch up, in
/// nanoseconds of that rate: the burst its fair rate allows. A sender that
/// sleeps until its next piece conforms wakes late by the time the host
/// takes to run it (hundreds of microseconds on a loaded emulated CPU);
/// without this allowance that time is lost for good at every piece, and a
/// tenant held to its fair rate moves less than the rate.
pub const FAIR_RATE_TOLERANCE_NS: u64 = 1_000_000;

/// A fair rate ([`TenantHandle::check_rate`]) or a window gain
/// ([`TenantHandle::window_gain`]) published longer than this before (by
/// the coordinator's heartbeat) is no longer applied: the coordinator
/// recomputes every few tens of milliseconds, so a second without it means
/// it stopped, and a tenant falls back to what its policy alone says
/// (fail-static).
pub const HEARTBEAT_STALE_NS: u64 = 1_000_000_000;

/// Unique ids of handles (never reused within a process), so a thread's
/// lane cache cannot mistake a new handle for an old one.
static NEXT_HANDLE_ID: AtomicU64 = AtomicU64::new(1);

/// How many (handle, lane) pairs a thread remembers.
const LANE_CACHE: usize = 32;

thread_local! {
    /// The last (handle id, lane) this thread used: the fast path.
    static LAST_LANE: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
    /// Every (handle id, lane) this thread owns.
    static MY_LANES: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug)]
struct Inner {
    id: u64,
    /// Where this tenant's shared words live, resolved once: they stay
    /// valid while `table` (which owns the mappings) does.
    words: Words,
    table: QuotaTable,
    tenant: TenantId,
    name: arc_swap::ArcSwap<String>,
    class: AtomicU64,
    slot: u32,
    process: u32,
    /// The policy seq the limits below were read at.
    seen_seq: AtomicU64,
    max_qps: AtomicU64,
    max_mr_bytes: AtomicU64,
    max_outstanding_wr: AtomicU64,
    qp_create: CachedCap,
    mr_reg: CachedCap,
    wrs: CachedCap,
    /// The byte cap of the policy, and the fair rate last seen.
    byte_cap: AtomicU64,
    byte_burst: AtomicU64,
    seen_fair: AtomicU64,
    bytes: CachedCap,
}

/// Pointers into the table's mappings.
#[derive(Debug)]
struct Words {
    header: NonNull<PolicyHeader>,
    policy: NonNull<PolicySlot>,
    state: NonNull<TenantState>,
    process: NonNull<ProcessSlot>,
}

/// The accessors of the handle's [`Words`]: `$name` borrows the word
/// `$field` points at for as long as the handle.
macro_rules! words {
    ($($name:ident: $ty:ty = $field:ident,)*) => {
        $(
            #[inline]
            fn $name(&self) -> &$ty {
                // SAFETY: see `Words`: valid while `self.inner.table` lives.
                unsafe { self.inner.words.$field.as_ref() }
            }
        )*
    };
}

// SAFETY: the pointers address atomics in shared mappings that live as long
// as the `Inner` that holds them (it owns a `QuotaTable`); atomics may be
// used from any thread.
unsafe impl Send for Words {}
// SAFETY: as above; only shared references to atomics are ever made.
unsafe impl Sync for Words {}

/// The calling process's membership in a tenant (cheap to clone).
///
/// Control path: [`acquire_qp`](Self::acquire_qp) and
/// [`acquire_mr`](Self::acquire_mr) admit against the tenant's quota across
/// all its processes, never above it under any interleaving, and return
/// permits that give the resource back when dropped. Data path:
/// [`check_rate`](Self::check_rate) applies the tenant's shared rate limits
/// (its caps, and the coordinator's fair rate when one is published).
///
/// Dropping the last clone (and every permit) frees the process slot.
#[derive(Debug, Clone)]
pub struct TenantHandle {
    inner: Arc<Inner>,
}

impl TenantHandle {
    pub(crate) fn new(
        table: QuotaTable,
        tenant: TenantId,
        process: u32,
    ) -> Result<Self, TableError> {
        let slot = table
            .process_slot(process)
            .tenant_slot
            .load(Ordering::Relaxed);
        if slot >= table.capacity() {
            return Err(TableError::NotOurSlot {
                slot: process,
                reason: format!("it names tenant slot {slot} of {}", table.capacity()),
            });
        }
        let words = Words {
            header: NonNull::from(table.policy_header()),
            policy: NonNull::from(table.policy_slot(slot)),
            state: NonNull::from(table.tenant_state(slot)),
            process: NonNull::from(table.process_slot(process)),
        };
        let handle = TenantHandle {
            inner: Arc::new(Inner {
                id: NEXT_HANDLE_ID.fetch_add(1, Ordering::Relaxed),
                words,
                table,
                tenant,
                name: arc_swap::ArcSwap::from_pointee(String::new()),
                class: AtomicU64::new(1),
                slot,
                process,
                seen_seq: AtomicU64::new(u64::MAX),
                max_qps: AtomicU64::new(0),
                max_mr_bytes: AtomicU64::new(0),
                max_outstanding_wr: AtomicU64::new(0),
                qp_create: CachedCap::default(),
                mr_reg: CachedCap::default(),
                wrs: CachedCap::default(),
                byte_cap: AtomicU64::new(0),
                byte_burst: AtomicU64::new(0),
                seen_fair: AtomicU64::new(u64::MAX),
                bytes: CachedCap::default(),
            }),
        };
        handle.refresh_now(handle.header().seq.load(Ordering::Acquire))?;
        Ok(handle)
    }

    /// The tenant.
    pub fn tenant(&self) -> TenantId {
        self.inner.tenant
    }

    /// The tenant's name in the policy.
    pub fn name(&self) -> String {
        self.inner.name.load().to_string()
    }

    /// The tenant's traffic class.
    pub fn class(&self) -> TrafficClass {
        if self.inner.class.load(Ordering::Relaxed) == 0 {
            TrafficClass::Latency
        } else {
            TrafficClass::Bulk
        }
    }

    /// The table this handle lives in.
    pub fn table(&self) -> &QuotaTable {
        &self.inner.table
    }

    /// The tenant's current policy (from the table's cached snapshot).
    pub fn policy(&self) -> Option<TenantEntry> {
        self.inner
            .table
            .cached_snapshot()
            .policy
            .tenant(self.inner.tenant)
            .cloned()
    }

    /// What the policy's latency bound asks of the tenant's scheduled
    /// queue pairs (from the table's cached snapshot): their largest piece
    /// and their windows' queue allowance, as the coordinator (or the
    /// embedding process) published them. `None`: the policy sets no
    /// bound, the tenant is of the latency class, or the policy exempts
    /// it by name.
    pub fn protection(&self) -> Option<mtrdma_sched::Protection> {
        self.inner
            .table
            .cached_snapshot()
            .protection(self.inner.tenant)
    }

    /// The sequence number of the policy this handle's limits were read
    /// from, after re-reading them if the table's policy changed: it moves
    /// when a policy is published (a reload), not when fair rates are. One
    /// atomic load when nothing changed. Schedulers that copy the tenant's
    /// weight and caps compare it to see a reload.
    #[inline]
    pub fn policy_seq(&self) -> u64 {
        self.refresh();
        self.inner.seen_seq.load(Ordering::Acquire)
    }

    /// Re-reads the limits when the policy's generation changed. A policy
    /// that cannot be read (mid-update for too long, invalid) leaves the
    /// last limits in force: fail-static.
    #[inline]
    fn refresh(&self) {
        let seq = self.header().seq.load(Ordering::Acquire);
        if seq != self.inner.seen_seq.load(Ordering::Relaxed) {
            self.refresh_changed(seq);
        }
    }

    /// [`refresh`](Self::refresh) once the generation changed: out of line,
    /// so the check above is all that callers inline. A policy that cannot
    /// be read (its writer died in the middle, or it does not validate) is
    /// said once and not read again until the table changes: the tenant
    /// keeps its last good policy (fail-static) and its calls do not wait
    /// on the table each time.
    #[cold]
    #[inline(never)]
    fn refresh_changed(&self, seq: u64) {
        if let Err(e) = self.refresh_now(seq) {
            self.inner.seen_seq.store(seq, Ordering::Release);
            tracing::warn!(tenant = %self.inner.tenant, error = %e, "keeping the last policy");
        }
    }

    fn refresh_now(&self, seq: u64) -> Result<(), TableError> {
        let i = &self.inner;
        let snapshot = i.table.snapshot()?;
        let t = snapshot
            .policy
            .tenant(i.tenant)
            .ok_or(TableError::UnknownTenant(i.tenant))?;
        i.name.store(Arc::new(t.name.clone()));
        i.class
            .store(u64::from(t.class == TrafficClass::Bulk), Ordering::Relaxed);
        i.max_qps.store(t.max_qps.into(), Ordering::Relaxed);
        i.max_mr_bytes.store(t.max_mr_bytes, Ordering::Relaxed);
        i.max_outstanding_wr
            .store(t.max_outstanding_wr.into(), Ordering::Relaxed);
        i.qp_create.set(t.qp_create_rate);
        i.mr_reg.set(t.mr_reg_rate);
        i.wrs.set(t.schedule.wr_cap);
        let (cap, burst) = t
            .schedule
            .byte_cap
            .map_or((0, 0), |c| (c.per_second, c.burst));
        i.byte_cap.store(cap, Ordering::Relaxed);
        i.byte_burst.store(burst, Ordering::Relaxed);
        i.seen_fair.store(u64::MAX, Ordering::Relaxed);
        i.seen_seq.store(seq, Ordering::Release);
        Ok(())
    }

    words! {
        header: PolicyHeader = header,
        policy_slot: PolicySlot = policy,
        state: TenantState = state,
        process: ProcessSlot = process,
    }

    /// This thread's lane of the process slot (taken on first use).
    #[inline]
    fn my_lane(&self) -> u32 {
        let id = self.inner.id;
        let (last_id, last_lane) = LAST_LANE.with(Cell::get);
        if last_id == id {
            return last_lane;
        }
        self.find_lane()
    }

    /// [`my_lane`](Self::my_lane) when this thread last used another
    /// handle: looks the lane up, or takes one.
    #[cold]
    #[inline(never)]
    fn find_lane(&self) -> u32 {
        let id = self.inner.id;
        let lane = MY_LANES.with(|lanes| {
            let mut lanes = lanes.borrow_mut();
            if let Some(&(_, lane)) = lanes.iter().find(|(h, _)| *h == id) {
                return lane;
            }
            let lane = self
                .process()
                .next_lane
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                    (n < SHARED_LANE).then_some(n + 1)
                })
                .unwrap_or(SHARED_LANE);
            if lanes.len() == LANE_CACHE {
                lanes.remove(0);
            }
            lanes.push((id, lane));
            lane
        });
        LAST_LANE.with(|last| last.set((id, lane)));
        lane
    }

    /// Adds `delta` (wrapping: a release adds the negation) to this
    /// thread's lane: a plain load and store on a lane only this thread
    /// writes, an atomic add on the shared lane.
    #[inline]
    fn lane_add(&self, field: fn(&Lane) -> &super::sync::AtomicU64, delta: u64) {
        let lane = self.my_lane();
        let word = field(&self.process().lanes[lane as usize]);
        if lane == SHARED_LANE {
            word.fetch_add(delta, Ordering::AcqRel);
        } else {
            word.store(
                word.load(Ordering::Relaxed).wrapping_add(delta),
                Ordering::Release,
            );
        }
    }

    #[inline]
    fn release_qp(&self) {
        self.lane_add(|l| &l.qps, 1u64.wrapping_neg());
        self.state().qps.fetch_sub(1, Ordering::AcqRel);
    }

    #[inline]
    fn release_mr(&self, bytes: u64) {
        self.lane_add(|l| &l.mr_bytes, bytes.wrapping_neg());
        self.state().mr_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Nanoseconds on the table's shared time base, for [`check_rate`](Self::check_rate).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.inner.table.now_ns()
    }

    /// Adds `n` to the tenant's `word` unless that passes `limit`.
    #[inline]
    fn admit(
        &self,
        word: &AtomicU64,
        n: u64,
        limit: u64,
        resource: &'static str,
        field: &'static str,
    ) -> Result<(), AdmissionError> {
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let next = current.saturating_add(n);
            if next > limit {
                return Err(self.refuse(n, limit, current, resource, field));
            }
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// Counts and reports an admission refused by [`admit`](Self::admit):
    /// out of line, so that admitting stays short.
    #[cold]
    #[inline(never)]
    fn refuse(
        &self,
        n: u64,
        limit: u64,
        current: u64,
        resource: &'static str,
        field: &'static str,
    ) -> AdmissionError {
        self.state().refusals.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(tenant = %self.inner.tenant, resource, limit, in_use = current, requested = n, "admission refused");
        AdmissionError::QuotaExceeded {
            tenant: self.inner.tenant,
            name: self.name(),
            resource,
            field,
            limit,
            in_use: current,
            requested: n,
        }
    }

    #[cold]
    #[inline(never)]
    fn rate_limited(
        &self,
        operation: &'static str,
        cap: &CachedCap,
        retry_at: u64,
        now: u64,
    ) -> AdmissionError {
        self.state().refusals.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(tenant = %self.inner.tenant, operation, "control-path rate limit");
        AdmissionError::RateLimited {
            tenant: self.inner.tenant,
            name: self.name(),
            operation,
            per_second: cap.per_second.load(Ordering::Relaxed),
            retry_after_ns: retry_at.saturating_sub(now),
        }
    }

    /// Admits one queue pair: within `max_qps` and the QP-creation rate.
    #[inline]
    pub fn acquire_qp(&self) -> Result<QpPermit<'_>, AdmissionError> {
        self.refresh();
        let st = self.state();
        self.admit(
            &st.qps,
            1,
            self.inner.max_qps.load(Ordering::Relaxed),
            "queue pairs",
            "max_qps",
        )?;
        if self.inner.qp_create.per_second.load(Ordering::Relaxed) != 0 {
            let now = self.now_ns();
            if let Err(retry_at) = self.inner.qp_create.charge(&st.tat[TAT_QP_CREATE], now, 1) {
                sub_saturating(&st.qps, 1);
                return Err(self.rate_limited("QP creation", &self.inner.qp_create, retry_at, now));
            }
        }
        self.lane_add(|l| &l.qps, 1);
        Ok(QpPermit { handle: self })
    }

    /// Admits `bytes` of memory registration: within `max_mr_bytes` and the
    /// registration rate.
    #[inline]
    pub fn acquire_mr(&self, bytes: u64) -> Result<MrPermit<'_>, AdmissionError> {
        self.refresh();
        let st = self.state();
        self.admit(
            &st.mr_bytes,
            bytes,
            self.inner.max_mr_bytes.load(Ordering::Relaxed),
            "memory-region bytes",
            "max_mr_bytes",
        )?;
        if self.inner.mr_reg.per_second.load(Ordering::Relaxed) != 0 {
            let now = self.now_ns();
            if let Err(retry_at) = self.inner.mr_reg.charge(&st.tat[TAT_MR_REG], now, 1) {
                sub_saturating(&st.mr_bytes, bytes);
                return Err(self.rate_limited(
                    "MR registration",
                    &self.inner.mr_reg,
                    retry_at,
                    now,
                ));
            }
        }
        self.lane_add(|l| &l.mr_bytes, bytes);
        Ok(MrPermit {
            handle: self,
            bytes,
        })
    }

    /// Admits `n` more outstanding work requests (within `max_outstanding_wr`).
    pub fn acquire_wrs(&self, n: u64) -> Result<WrPermit, AdmissionError> {
        self.refresh();
        self.admit(
            &self.state().outstanding_wr,
            n,
            self.inner.max_outstanding_wr.load(Ordering::Relaxed),
            "outstanding work requests",
            "max_outstanding_wr",
        )?;
        ProcessSlot::gauge_add(&self.process().outstanding_wr, n);
        Ok(WrPermit {
            handle: self.clone(),
            n,
        })
    }

    /// Applies the tenant's data-path rate limits, shared by all its
    /// processes, to `bytes` in `wrs` work requests at `now_ns` (on the
    /// table's time base: [`now_ns`](Self::now_ns)). `Err(retry_at)` names the time at
    /// which the same request would conform; nothing is charged then
    /// (except, when the work-request rate admits and the byte rate
    /// refuses, the work-request budget: the caller is under-served, never
    /// over).
    ///
    /// The byte rate is the smaller of the policy's cap and the fair rate
    /// the coordinator publishes (none without a coordinator, and none
    /// once its heartbeat is more than [`HEARTBEAT_STALE_NS`] before
    /// `now_ns`: a coordinator that stopped does not hold tenants to the
    /// rates of a moment that has passed).
    #[inline]
    pub fn check_rate(&self, now_ns: u64, bytes: u64, wrs: u64) -> Result<(), u64> {
        self.refresh();
        let i = &self.inner;
        let st = self.state();
        let fair = if self.coordinator_live(now_ns) {
            self.policy_slot().fair_rate.load(Ordering::Acquire)
        } else {
            0
        };
        if fair != i.seen_fair.load(Ordering::Relaxed) {
            let cap = i.byte_cap.load(Ordering::Relaxed);
            let burst = i.byte_burst.load(Ordering::Relaxed);
            let (rate, burst) = if fair == 0 || (cap != 0 && cap <= fair) {
                // The policy's cap binds (or nothing does: rate 0).
                (cap, burst)
            } else {
                // The fair rate binds: a sender woken late may catch up on
                // what it was owed, up to FAIR_RATE_TOLERANCE_NS of it.
                let owed = u128::from(fair) * u128::from(FAIR_RATE_TOLERANCE_NS) / 1_000_000_000;
                (fair, burst.max(u64::try_from(owed).unwrap_or(u64::MAX)))
            };
            i.bytes.set((rate != 0).then_some(RateLimit {
                per_second: rate,
                burst,
            }));
            self.follow_byte_rate(now_ns, rate);
            i.seen_fair.store(fair, Ordering::Relaxed);
        }
        let result = i
            .wrs
            .charge(&st.tat[TAT_WRS], now_ns, wrs)
            .and_then(|()| i.bytes.charge(&st.tat[TAT_BYTES], now_ns, bytes));
        if let Err(retry_at) = result {
            st.throttled_ns
                .fetch_add(retry_at.saturating_sub(now_ns), Ordering::Relaxed);
        }
        result
    }

    /// The tenant's byte rate is now `rate` (0: none): the bytes its
    /// shared TAT owes, charged at the rate before, are owed at this one
    /// (`gcra_rescale`). The first of the tenant's handles to see the new
    /// rate carries the TAT over, once; the others find the rate already
    /// recorded.
    #[cold]
    fn follow_byte_rate(&self, now_ns: u64, rate: u64) {
        let st = self.state();
        let from = st.byte_rate.load(Ordering::Acquire);
        if from == rate
            || st
                .byte_rate
                .compare_exchange(from, rate, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let _ = st.tat[TAT_BYTES].fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            let carried = gcra_rescale(tat, now_ns, from, rate);
            (carried != tat).then_some(carried)
        });
    }

    /// The link's rate as the coordinator measures it from what every
    /// tenant moves (bytes per second), or `None` without a measurement.
    #[inline]
    pub fn link_estimate(&self) -> Option<u64> {
        self.inner.table.link_estimate()
    }

    /// The gain the coordinator set on this tenant's delay windows' growth,
    /// parts per million (`mtrdma_sched::share::GAIN_ONE` is 1), so that
    /// tenants in separate processes share the link by their weights (see
    /// `mtrdma_sched::share`). A gain of 1 where none is published, where
    /// the coordinator's last recomputation is more than
    /// [`HEARTBEAT_STALE_NS`] before `now_ns` (a stopped coordinator leaves the
    /// windows to their weights alone), and for a word out of range.
    #[inline]
    pub fn window_gain(&self, now_ns: u64) -> u32 {
        self.gain_if(self.coordinator_live(now_ns))
    }

    /// [`window_gain`](Self::window_gain), the coordinator `live` or not.
    #[inline]
    fn gain_if(&self, live: bool) -> u32 {
        let ppm = self.policy_slot().window_gain.load(Ordering::Acquire);
        let one = u64::from(GAIN_ONE);
        let max = (GAIN_ONE as f64 * MAX_GAIN) as u64;
        if !live || !(one * one / max..=max).contains(&ppm) {
            return GAIN_ONE;
        }
        ppm as u32
    }

    /// The weights of the tenants whose delay windows contend for the link
    /// with this one, added up (its own among them), as the coordinator
    /// counted them (`mtrdma_sched::share::ShareGains::sharing_weight`):
    /// the windows share one increase per round trip
    /// (`mtrdma_sched::DelayWindow::set_sharing_weight`). 1 where none is
    /// published, where the coordinator's heartbeat is more than
    /// [`HEARTBEAT_STALE_NS`] before `now_ns`, and for a word out of range
    /// (more than [`MAX_TENANTS`](crate::table::MAX_TENANTS) times the
    /// largest weight).
    #[inline]
    pub fn sharing_weight(&self, now_ns: u64) -> u32 {
        self.sharing_if(self.coordinator_live(now_ns))
    }

    /// [`sharing_weight`](Self::sharing_weight), the coordinator `live` or
    /// not.
    #[inline]
    fn sharing_if(&self, live: bool) -> u32 {
        let w = self.inner.table.sharing_weight();
        let most = u64::from(crate::table::MAX_TENANTS) * u64::from(mtrdma_sched::MAX_WEIGHT);
        if !live || w == 0 || w > most {
            return 1;
        }
        u32::try_from(w).unwrap_or(u32::MAX)
    }

    /// Everything the coordinator tells this tenant's delay windows, read
    /// with one look at its heartbeat: the link's measured rate
    /// ([`link_estimate`](Self::link_estimate), 0 where none), the gain
    /// ([`window_gain`](Self::window_gain)), the sharing weight
    /// ([`sharing_weight`](Self::sharing_weight)) and whether the
    /// one-piece floor is permitted ([`floor_permit`](Self::floor_permit)).
    #[inline]
    pub fn window_signals(&self, now_ns: u64) -> mtrdma_sched::Signals {
        let live = self.coordinator_live(now_ns);
        mtrdma_sched::Signals {
            link_rate: Some(self.link_estimate().unwrap_or(0)),
            gain_ppm: Some(self.gain_if(live)),
            sharing_weight: Some(self.sharing_if(live)),
            weight: None,
            piece_floor: Some(self.permit_if(live).on),
        }
    }

    /// Whether the coordinator recomputed within [`HEARTBEAT_STALE_NS`]
    /// before `now_ns`: what it publishes (fair rates, window gains)
    /// applies only then.
    #[inline]
    fn coordinator_live(&self, now_ns: u64) -> bool {
        let beat = self.inner.table.last_heartbeat_ns();
        beat != 0 && now_ns.saturating_sub(beat) <= HEARTBEAT_STALE_NS
    }

    /// The coordinator's permit for the one-piece floor
    /// (`mtrdma_sched::piece_floor`): for a bulk tenant, whether its delay
    /// windows may keep one piece whatever the delay; for a latency
    /// tenant, whether the floor is given to any (its delays are then the
    /// floor's trial). Off where none is published, where the
    /// coordinator's heartbeat is more than [`HEARTBEAT_STALE_NS`] before
    /// `now_ns` (a stopped coordinator judges no trial), and for a word
    /// out of range.
    #[inline]
    pub fn floor_permit(&self, now_ns: u64) -> Permit {
        self.permit_if(self.coordinator_live(now_ns))
    }

    /// [`floor_permit`](Self::floor_permit), the coordinator `live` or not.
    #[inline]
    fn permit_if(&self, live: bool) -> Permit {
        let word = self.policy_slot().floor_permit.load(Ordering::Acquire);
        if word == 0 || !live {
            return Permit::OFF;
        }
        Permit::from_word(word).unwrap_or(Permit::OFF)
    }

    /// Publishes what this tenant's latency queue pairs saw of the floor
    /// (`mtrdma_sched::piece_floor::DelayShift::report`) for the
    /// coordinator. Processes of one tenant write the same word: the last
    /// report stands.
    #[inline]
    pub fn report_delay_shift(&self, shift: Shift) {
        self.state()
            .delay_shift
            .store(shift.to_word(), Ordering::Release);
    }

    /// Counts traffic handed to the NIC (for usage and the coordinator's demand estimate).
    #[inline]
    pub fn record_posted(&self, bytes: u64, wrs: u64) {
        let st = self.state();
        st.bytes_posted.fetch_add(bytes, Ordering::Relaxed);
        st.wrs_posted.fetch_add(wrs, Ordering::Relaxed);
    }

    /// Adds the verdicts of this tenant's delay windows on completed
    /// pieces: `judged` bytes, `over_target` of them over the window's
    /// target. The coordinator shows the share over target
    /// (`Coordinator::link_view`).
    #[inline]
    pub fn record_verdicts(&self, judged: u64, over_target: u64) {
        let st = self.state();
        st.judged_bytes.fetch_add(judged, Ordering::Relaxed);
        st.over_target_bytes
            .fetch_add(over_target, Ordering::Relaxed);
    }

    /// Adds to (positive) or removes from (negative) the bytes this tenant
    /// has waiting in software backlogs: the demand the coordinator sees.
    #[inline]
    pub fn add_backlog(&self, delta: i64) {
        let st = self.state();
        // The process's part too: the coordinator takes it off the
        // tenant's if the process dies (else a killed sender's backlog
        // would stay the tenant's demand for good).
        let mine = &self.process().backlog_bytes;
        if delta >= 0 {
            st.backlog_bytes
                .fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
            ProcessSlot::gauge_add(mine, delta.unsigned_abs());
        } else {
            sub_saturating(&st.backlog_bytes, delta.unsigned_abs());
            ProcessSlot::gauge_sub(mine, delta.unsigned_abs());
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every permit borrowed or owned a handle, so none is left; return
        // whatever the lanes still count (nothing, unless memory was
        // corrupted) and free the slot.
        let p = self.table.process_slot(self.process);
        let st = self.table.tenant_state(self.slot);
        let (qps, mr_bytes) = p.held();
        sub_saturating(&st.qps, qps);
        sub_saturating(&st.mr_bytes, mr_bytes);
        // What the process's schedulers left in the backlog count.
        let (backlog, wrs) = p.gauges();
        sub_saturating(&st.backlog_bytes, backlog);
        sub_saturating(&st.outstanding_wr, wrs);
        p.clear();
        p.pid.store(0, Ordering::Relaxed);
        p.state.store(PROC_FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
