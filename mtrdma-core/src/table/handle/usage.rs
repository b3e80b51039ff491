//! A tenant's usage as read from the table, and its change between two
//! readings.

use super::*;

/// What a tenant's counters moved between two readings
/// ([`TenantUsage::since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageDelta {
    /// Bytes handed to the NIC in between.
    pub bytes_posted: u64,
    /// Work requests handed to the NIC in between.
    pub wrs_posted: u64,
    /// Time its callers were told to wait in between, in ns.
    pub throttled_ns: u64,
    /// Whether a counter read lower than before (written by a tenant's
    /// process, not by mtrdma): its change counts as 0.
    pub went_backwards: bool,
}

/// One tenant's use of the table, for display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUsage {
    /// The tenant.
    pub tenant: TenantId,
    /// Its name.
    pub name: String,
    /// Its class.
    pub class: TrafficClass,
    /// Queue pairs in use / allowed.
    pub qps: (u64, u64),
    /// Memory-region bytes in use / allowed.
    pub mr_bytes: (u64, u64),
    /// Outstanding work requests.
    pub outstanding_wr: u64,
    /// Bytes handed to the NIC so far.
    pub bytes_posted: u64,
    /// Work requests handed to the NIC so far.
    pub wrs_posted: u64,
    /// Bytes waiting in software backlogs.
    pub backlog_bytes: u64,
    /// Total ns its callers were told to wait.
    pub throttled_ns: u64,
    /// Admission refusals so far.
    pub refusals: u64,
    /// The fair byte rate the coordinator publishes (0: none).
    pub fair_rate: u64,
    /// The gain on its delay windows' growth the coordinator publishes,
    /// parts per million (0: none; see `mtrdma_sched::share`).
    pub window_gain: u64,
    /// Live processes attached.
    pub processes: u32,
}

impl TenantUsage {
    pub(crate) fn read(
        table: &QuotaTable,
        t: &TenantEntry,
        slot: u32,
        processes: u32,
    ) -> TenantUsage {
        let st = table.tenant_state(slot);
        let l = |w: &AtomicU64| w.load(Ordering::Relaxed);
        TenantUsage {
            tenant: t.id,
            name: t.name.clone(),
            class: t.class,
            qps: (l(&st.qps), t.max_qps.into()),
            mr_bytes: (l(&st.mr_bytes), t.max_mr_bytes),
            outstanding_wr: l(&st.outstanding_wr),
            bytes_posted: l(&st.bytes_posted),
            wrs_posted: l(&st.wrs_posted),
            backlog_bytes: l(&st.backlog_bytes),
            throttled_ns: l(&st.throttled_ns),
            refusals: l(&st.refusals),
            fair_rate: table.policy_slot(slot).fair_rate.load(Ordering::Relaxed),
            window_gain: table.policy_slot(slot).window_gain.load(Ordering::Relaxed),
            processes,
        }
    }

    /// What changed since `before` (the same tenant's earlier reading):
    /// bytes and work requests posted and the time throttled in between.
    /// These counters live in memory the tenant's processes write, so a
    /// hostile or broken tenant can make one go backwards: such a counter
    /// counts as 0 here, never as an underflow (nothing that displays or
    /// bills by it is stopped).
    ///
    /// ```
    /// use mtrdma_core::{LinkConfig, Policy, QuotaTable, TenantEntry, TenantId};
    ///
    /// let policy = Policy::new(LinkConfig::new(1_000_000_000), vec![TenantEntry::new(TenantId(1), "t")]);
    /// let table = QuotaTable::embedded(&policy).unwrap();
    /// let handle = table.attach(TenantId(1)).unwrap();
    /// let before = table.usage().unwrap().remove(0);
    /// handle.record_posted(4096, 2);
    /// let now = table.usage().unwrap().remove(0);
    /// let moved = now.since(&before);
    /// assert_eq!((moved.bytes_posted, moved.wrs_posted), (4096, 2));
    /// // Read the other way round (as after a tenant wrote its counter
    /// // back): no underflow, and it says so.
    /// let back = before.since(&now);
    /// assert_eq!(back.bytes_posted, 0);
    /// assert!(back.went_backwards);
    /// ```
    pub fn since(&self, before: &TenantUsage) -> UsageDelta {
        UsageDelta {
            bytes_posted: self.bytes_posted.saturating_sub(before.bytes_posted),
            wrs_posted: self.wrs_posted.saturating_sub(before.wrs_posted),
            throttled_ns: self.throttled_ns.saturating_sub(before.throttled_ns),
            went_backwards: self.bytes_posted < before.bytes_posted
                || self.wrs_posted < before.wrs_posted
                || self.throttled_ns < before.throttled_ns,
        }
    }
}
