//! The byte layout of the quota table, and its validation.
//!
//! Two shared-memory objects make a table:
//!
//! * the **policy region** (`NAME.policy`), written only by its creator (the
//!   coordinator, or the embedding process) and mapped read-only by tenant
//!   processes, so a tenant cannot raise its own quota. Readers take
//!   consistent snapshots with a seqlock (`seq` is odd while a write is in
//!   progress; `seq / 2` is the policy's generation). Each slot's
//!   `fair_rate` and `window_gain` are single words published every few
//!   milliseconds outside the seqlock.
//! * the **state region** (`NAME.state`), written by tenant processes: per
//!   tenant, the shared GCRA states, resources in use and traffic counters;
//!   per process, what it holds (for reclamation when it dies).
//!
//! A coordinator's table has no state region: each tenant's state and its
//! processes' slots are a file of their own (a [`SegmentHeader`], the
//! tenant's [`TenantState`], then its [`ProcessSlot`]s), a memory file with
//! no name, sealed so that it can never shrink or grow, which the
//! coordinator hands only to the processes it registers as that tenant.
//!
//! Every field is an atomic: other processes write concurrently, and every
//! value read is validated before use.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

// The words of the protocols between processes (the policy's seqlock, a
// process slot's claim and reclamation): loom's when those are
// model-checked (see `sync.rs`).
use super::sync as protocol;

/// `b"MTRDMAPL"` as a little-endian u64.
pub(crate) const POLICY_MAGIC: u64 = u64::from_le_bytes(*b"MTRDMAPL");
/// `b"MTRDMAST"` as a little-endian u64.
pub(crate) const STATE_MAGIC: u64 = u64::from_le_bytes(*b"MTRDMAST");
/// The layout version this code reads and writes.
pub(crate) const VERSION: u32 = 1;
/// The largest number of tenant slots a table may have.
pub const MAX_TENANTS: u32 = 65_536;
/// The largest number of process slots a table may have.
pub const MAX_PROCESSES: u32 = 65_536;
/// Bytes of a tenant name (NUL-padded).
pub(crate) const NAME_BYTES: usize = 32;

/// Header of the policy region.
#[repr(C)]
pub(crate) struct PolicyHeader {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) header_size: AtomicU32,
    pub(crate) capacity: AtomicU32,
    pub(crate) slot_size: AtomicU32,
    /// Seqlock: odd while the creator writes the policy.
    pub(crate) seq: protocol::AtomicU64,
    pub(crate) link_capacity: AtomicU64,
    pub(crate) recompute_interval_ms: AtomicU32,
    pub(crate) tenant_count: AtomicU32,
    pub(crate) coordinator_pid: AtomicU32,
    /// Process slots in each tenant's state file of a coordinated table
    /// (see [`SegmentHeader`]); 0: one state region for every tenant.
    pub(crate) segment_processes: AtomicU32,
    pub(crate) coordinator_start: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the coordinator's last recomputation.
    pub(crate) heartbeat_ns: AtomicU64,
    /// The shared clock's calibration (see `clock::SharedClock`), written
    /// once by the creator.
    pub(crate) clock_raw0: AtomicU64,
    pub(crate) clock_ns0: AtomicU64,
    pub(crate) clock_mult: AtomicU64,
    /// Bytes per second the tenants together moved through the link, as
    /// the coordinator measures it (0: not measured). One word, outside
    /// the seqlock.
    pub(crate) link_estimate: AtomicU64,
    /// The weights of the tenants whose delay windows contend for the
    /// link, added up, as the coordinator last counted them (0: none
    /// published; see `mtrdma_sched::DelayWindow::set_sharing_weight`).
    /// One word outside the seqlock, as `link_estimate`.
    pub(crate) sharing_weight: AtomicU64,
    /// [`TABLE_COORDINATED`], written once by the creator.
    pub(crate) flags: AtomicU64,
    /// The policy's latency bound in bytes (0: none), under the seqlock.
    /// Tables written before it existed hold 0 here (reserved space).
    pub(crate) latency_bound: AtomicU64,
}

/// Table flag: a coordinator keeps the table. Its objects are private to
/// the coordinator's user; processes join by registering with it (which
/// hands them the table), never by attaching as a tenant of their choice.
pub(crate) const TABLE_COORDINATED: u64 = 1;

/// Slot flag: the slot holds a tenant.
pub(crate) const SLOT_IN_USE: u32 = 1;
/// Slot flag: the policy exempts the tenant from its latency bound.
pub(crate) const SLOT_EXEMPT: u32 = 2;

/// Indices into [`PolicySlot::caps`]: (rate, burst) pairs; a rate of 0 is "no cap".
pub(crate) const CAP_BYTES: usize = 0;
pub(crate) const CAP_WRS: usize = 2;
pub(crate) const CAP_QP_CREATE: usize = 4;
pub(crate) const CAP_MR_REG: usize = 6;

/// One tenant's policy.
#[repr(C)]
pub(crate) struct PolicySlot {
    pub(crate) id: AtomicU32,
    pub(crate) flags: AtomicU32,
    pub(crate) class: AtomicU32,
    pub(crate) weight: AtomicU32,
    pub(crate) max_qps: AtomicU32,
    pub(crate) max_outstanding_wr: AtomicU32,
    pub(crate) max_mr_bytes: AtomicU64,
    pub(crate) name: [AtomicU64; NAME_BYTES / 8],
    pub(crate) caps: [AtomicU64; 8],
    /// The coordinator's current fair byte rate for the tenant (0: none
    /// published). Outside the seqlock: one word, read on its own.
    pub(crate) fair_rate: AtomicU64,
    /// The coordinator's gain on the tenant's delay windows' growth, parts
    /// per million (0: none published; see `mtrdma_sched::share`). One
    /// word outside the seqlock, as `fair_rate`.
    pub(crate) window_gain: AtomicU64,
    /// On a coordinated table, the inode number of the tenant's state file
    /// (a sealed memory file with no name, see [`SegmentHeader`]), by which
    /// a restarted coordinator finds it again among what live processes
    /// hold; 0: none made yet.
    pub(crate) state_inode: AtomicU64,
    /// What the latency bound asks of the tenant's bulk queue pairs, as
    /// its publisher worked it out (`mtrdma_sched::Protection`): the
    /// largest piece and the queue allowance of its windows, in bytes
    /// (both 0: not held to a bound). Under the seqlock.
    pub(crate) piece_bytes: AtomicU64,
    pub(crate) queue_bytes: AtomicU64,
    /// The coordinator's permit for the one-piece floor
    /// (`mtrdma_sched::piece_floor::Permit::to_word`; 0: off). One word
    /// outside the seqlock, as `window_gain`.
    pub(crate) floor_permit: AtomicU64,
    pub(crate) _reserved: [AtomicU64; 2],
}

/// Header of the state region.
#[repr(C)]
pub(crate) struct StateHeader {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) header_size: AtomicU32,
    pub(crate) capacity: AtomicU32,
    pub(crate) slot_size: AtomicU32,
    pub(crate) process_slots: AtomicU32,
    pub(crate) process_slot_size: AtomicU32,
    pub(crate) _reserved: [AtomicU64; 4],
}

/// Indices into [`TenantState::tat`].
pub(crate) const TAT_BYTES: usize = 0;
pub(crate) const TAT_WRS: usize = 1;
pub(crate) const TAT_QP_CREATE: usize = 2;
pub(crate) const TAT_MR_REG: usize = 3;

/// One tenant's live state, shared by all its processes.
#[repr(C)]
pub(crate) struct TenantState {
    /// GCRA theoretical arrival times (ns of `CLOCK_MONOTONIC`).
    pub(crate) tat: [AtomicU64; 4],
    pub(crate) qps: AtomicU64,
    pub(crate) mr_bytes: AtomicU64,
    pub(crate) outstanding_wr: AtomicU64,
    pub(crate) bytes_posted: AtomicU64,
    pub(crate) wrs_posted: AtomicU64,
    /// Bytes waiting in software backlogs (demand the coordinator sees).
    pub(crate) backlog_bytes: AtomicU64,
    /// Total ns callers were told to wait by the rate limits.
    pub(crate) throttled_ns: AtomicU64,
    /// Admission refusals.
    pub(crate) refusals: AtomicU64,
    /// Bytes of completed pieces the tenant's delay windows judged, and
    /// those they found over their target (the coordinator shows the share).
    pub(crate) judged_bytes: AtomicU64,
    pub(crate) over_target_bytes: AtomicU64,
    /// The byte rate (per second) `tat[TAT_BYTES]` is charged at (0: none
    /// known), so that a new rate carries over what is owed in bytes.
    pub(crate) byte_rate: AtomicU64,
    /// What the tenant's latency queue pairs last reported of their delays
    /// with and without the one-piece floor
    /// (`mtrdma_sched::piece_floor::Shift::to_word`; 0: nothing).
    pub(crate) delay_shift: AtomicU64,
}

/// `b"MTRDMASG"` as a little-endian u64.
pub(crate) const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"MTRDMASG");

/// Header of one tenant's state file on a coordinated table: the tenant's
/// [`TenantState`] follows it, then `process_slots` [`ProcessSlot`]s
/// (process slot `j` of tenant slot `i` is the table's process slot
/// `i * process_slots + j`).
#[repr(C)]
pub(crate) struct SegmentHeader {
    pub(crate) magic: AtomicU64,
    pub(crate) version: AtomicU32,
    pub(crate) tenant_slot: AtomicU32,
    pub(crate) process_slots: AtomicU32,
    /// How many of its process slots, from the first, were ever claimed
    /// (slots are claimed first free first): scans of the tenant's
    /// processes stop there. Its processes may write it, which can only
    /// hide their own dead processes from reclamation (at most
    /// `process_slots` is read).
    pub(crate) claimed: AtomicU32,
    pub(crate) _reserved: [AtomicU64; 5],
}

/// Process slot states.
pub(crate) const PROC_FREE: u32 = 0;
pub(crate) const PROC_LIVE: u32 = 2;
pub(crate) const PROC_RECLAIMING: u32 = 3;
/// A slot being claimed: this bit and the claiming process's pid (pids
/// are under 2^22), so that a claim its claimer never finished (it died
/// in the middle) can be told from one in progress and freed.
pub(crate) const PROC_CLAIMING_BY: u32 = 1 << 31;

/// Lanes of a process slot. Each thread of the process that admits or
/// releases resources gets a lane of its own and updates it with a plain
/// load and store (no locked instruction); threads beyond the last
/// single-writer lane share [`SHARED_LANE`] with atomic read-modify-writes.
/// (Two under loom, whose checks need no more and explore less.)
pub(crate) const LANES: usize = if cfg!(mtrdma_loom) { 2 } else { 16 };
/// The lane threads share once the others are taken.
pub(crate) const SHARED_LANE: u32 = LANES as u32 - 1;

/// What one thread of a process has taken (+) and given back (-), as
/// wrapping sums: a permit may be released on another thread than the one
/// that took it, so one lane can go "negative"; the lanes add up.
#[repr(C)]
pub(crate) struct Lane {
    pub(crate) qps: protocol::AtomicU64,
    pub(crate) mr_bytes: protocol::AtomicU64,
}

/// What one process holds, so its resources can be returned when it dies.
#[repr(C)]
pub(crate) struct ProcessSlot {
    pub(crate) state: protocol::AtomicU32,
    pub(crate) pid: protocol::AtomicU32,
    pub(crate) tenant_slot: protocol::AtomicU32,
    /// The next lane to hand to a thread.
    pub(crate) next_lane: protocol::AtomicU32,
    pub(crate) start_time: protocol::AtomicU64,
    /// 1 while a [`TenantHandle`](crate::TenantHandle) of the process
    /// holds the slot (taken by `attach`, or by `adopt` once), 0 before.
    pub(crate) adopted: protocol::AtomicU64,
    /// The process's part of its tenant's `backlog_bytes` and
    /// `outstanding_wr`, which a process that dies leaves behind: what
    /// its slot's reclamation takes off them.
    pub(crate) backlog_bytes: protocol::AtomicU64,
    pub(crate) outstanding_wr: protocol::AtomicU64,
    pub(crate) _reserved: [protocol::AtomicU64; 2],
    pub(crate) lanes: [Lane; LANES],
}

impl ProcessSlot {
    /// The process it was claimed for.
    pub(crate) fn occupant(&self) -> crate::procinfo::ProcessId {
        crate::procinfo::ProcessId {
            pid: self.pid.load(Ordering::Relaxed),
            start_time: self.start_time.load(Ordering::Relaxed),
        }
    }

    /// Its part of the tenant's backlog and outstanding work requests.
    pub(crate) fn gauges(&self) -> (u64, u64) {
        (
            self.backlog_bytes.load(Ordering::Acquire),
            self.outstanding_wr.load(Ordering::Acquire),
        )
    }

    /// Adds `n` to one of its gauges ([`ProcessSlot::gauges`]).
    pub(crate) fn gauge_add(word: &protocol::AtomicU64, n: u64) {
        word.fetch_add(n, Ordering::AcqRel);
    }

    /// Takes `n` off one of its gauges, never below zero.
    pub(crate) fn gauge_sub(word: &protocol::AtomicU64, n: u64) {
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }

    /// What the process holds: the sums of its lanes.
    pub(crate) fn held(&self) -> (u64, u64) {
        self.lanes.iter().fold((0u64, 0u64), |(q, m), lane| {
            (
                q.wrapping_add(lane.qps.load(Ordering::Acquire)),
                m.wrapping_add(lane.mr_bytes.load(Ordering::Acquire)),
            )
        })
    }

    /// Empties every lane (a freshly claimed or reclaimed slot); no
    /// handle holds it.
    pub(crate) fn clear(&self) {
        self.next_lane.store(0, Ordering::Relaxed);
        self.adopted.store(0, Ordering::Relaxed);
        self.backlog_bytes.store(0, Ordering::Relaxed);
        self.outstanding_wr.store(0, Ordering::Relaxed);
        for lane in &self.lanes {
            lane.qps.store(0, Ordering::Relaxed);
            lane.mr_bytes.store(0, Ordering::Relaxed);
        }
    }
}

pub(crate) const POLICY_HEADER: usize = std::mem::size_of::<PolicyHeader>();
pub(crate) const POLICY_SLOT: usize = std::mem::size_of::<PolicySlot>();
pub(crate) const STATE_HEADER: usize = std::mem::size_of::<StateHeader>();
pub(crate) const STATE_SLOT: usize = std::mem::size_of::<TenantState>();
pub(crate) const PROCESS_SLOT: usize = std::mem::size_of::<ProcessSlot>();
pub(crate) const SEGMENT_HEADER: usize = std::mem::size_of::<SegmentHeader>();

/// Bytes of one tenant's state file with `processes` process slots.
pub(crate) fn segment_len(processes: u32) -> usize {
    SEGMENT_HEADER + STATE_SLOT + processes as usize * PROCESS_SLOT
}

/// Bytes of a policy region with `capacity` slots.
pub(crate) fn policy_len(capacity: u32) -> usize {
    POLICY_HEADER + capacity as usize * POLICY_SLOT
}

/// Bytes of a state region.
pub(crate) fn state_len(capacity: u32, processes: u32) -> usize {
    STATE_HEADER + capacity as usize * STATE_SLOT + processes as usize * PROCESS_SLOT
}

// Loom's atomics are larger: under loom no table is mapped.
#[cfg(not(mtrdma_loom))]
const _: () = {
    assert!(POLICY_HEADER == 128);
    assert!(POLICY_SLOT == 192);
    assert!(STATE_HEADER == 64);
    assert!(SEGMENT_HEADER == 64);
    assert!(STATE_SLOT == 128);
    assert!(PROCESS_SLOT == 64 + 16 * LANES);
};
