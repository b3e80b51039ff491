//! The quota table: policy and live state of every tenant, in shared memory.
//!
//! A table is two shared-memory regions (see the layout module docs): a
//! policy region that only its creator writes and tenants map read-only,
//! and a state region that tenant processes update with atomics (a named
//! POSIX object, or for a coordinator's table a sealed memory file that
//! it hands to the processes it registers). Opening
//! validates everything: a truncated, foreign, other-version or
//! other-capacity table, or one holding out-of-range values, is a
//! [`TableError`], never undefined behaviour or a panic.
//!
//! Without a coordinator, [`QuotaTable::embedded`] gives the same API on
//! process-local memory.
//!
//! ```
//! use mtrdma_core::{LinkConfig, Policy, QuotaTable, TenantId, TenantEntry};
//!
//! let mut tenant = TenantEntry::new(TenantId(1), "kv");
//! tenant.max_qps = 2;
//! let policy = Policy::new(LinkConfig::new(12_500_000_000), vec![tenant]);
//! let table = QuotaTable::embedded(&policy).unwrap();
//! let kv = table.attach(TenantId(1)).unwrap();
//! let a = kv.acquire_qp().unwrap();
//! let _b = kv.acquire_qp().unwrap();
//! let refused = kv.acquire_qp().unwrap_err();
//! assert!(refused.to_string().contains("limit 2, in use 2"));
//! drop(a);
//! assert!(kv.acquire_qp().is_ok());
//! ```

// The fuzzers' entry points: built for them (`cargo fuzz` sets
// `cfg(fuzzing)`) and for the tests, not for applications.
#[cfg(any(test, fuzzing))]
mod bytes;
mod error;
#[cfg(test)]
mod fixtures;
mod handle;
mod layout;
#[cfg(all(test, mtrdma_loom))]
mod loom;
mod open;
mod policy;
mod processes;
mod seqlock;
mod shm;
mod slot;
mod sync;
#[cfg(all(test, not(mtrdma_loom)))]
mod tests;
mod validate;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use error::{AdmissionError, TableError};
pub use handle::{
    MrPermit, OwnedMrPermit, OwnedQpPermit, QpPermit, TenantHandle, TenantUsage, UsageDelta,
    WrPermit, FAIR_RATE_TOLERANCE_NS, HEARTBEAT_STALE_NS,
};
pub use layout::{MAX_PROCESSES, MAX_TENANTS};

use crate::clock::SharedClock;
use crate::policy::{LinkConfig, Policy, TenantEntry};
use crate::procinfo::ProcessId;
use crate::RateLimit;
use crate::{TenantId, TrafficClass};
use layout::*;
use mtrdma_sched::Protection;
use shm::Mapping;

use open::*;

pub use processes::Reclaimed;
use validate::*;

/// Process slots of a table made without an explicit count.
pub const DEFAULT_PROCESSES: u32 = 256;

/// A tenant's traffic counters as the coordinator reads them each
/// recomputation (each only grows, but for `backlog`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DemandCounters {
    /// Bytes handed to the NIC.
    pub(crate) posted: u64,
    /// Bytes waiting in software backlogs now.
    pub(crate) backlog: u64,
    /// Bytes its delay windows judged, and those over their target.
    pub(crate) judged: u64,
    pub(crate) over_target: u64,
    /// Work requests handed to the NIC.
    pub(crate) wrs: u64,
}

/// A quota table (cheap to clone: clones share the mappings).
#[derive(Clone)]
pub struct QuotaTable {
    inner: Arc<Inner>,
}

struct Inner {
    /// The table's name; `None` for an embedded table.
    name: Option<String>,
    policy: Mapping,
    state: State,
    capacity: u32,
    /// Process slots of the whole table (on a coordinated one, the
    /// tenant slots times the process slots of each tenant's file).
    processes: u32,
    cache: ArcSwap<PolicySnapshot>,
    clock: SharedClock,
}

/// The table as its owner holds it: the process that created it (or an
/// embedded one), or a coordinator that took it over. Only the owner
/// publishes a policy and sets what the coordinator decides (fair rates,
/// gains, the link estimate); it reads as a [`QuotaTable`] (it
/// dereferences to one). A process that opened the table as a tenant
/// ([`QuotaTable::open`]) or registered with a coordinator holds a
/// [`QuotaTable`], which cannot publish: the compiler refuses, not a
/// check at run time.
///
/// ```compile_fail
/// # use mtrdma_core::{LinkConfig, Policy, QuotaTable};
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let tenant_view = QuotaTable::open("some-table")?;
/// // A tenant's view has no `publish`.
/// tenant_view.publish(&Policy::new(LinkConfig::new(1 << 30), Vec::new()))?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TableOwner {
    table: QuotaTable,
}

impl std::ops::Deref for TableOwner {
    type Target = QuotaTable;

    fn deref(&self) -> &QuotaTable {
        &self.table
    }
}

impl std::fmt::Debug for QuotaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaTable")
            .field("name", &self.inner.name)
            .field("capacity", &self.inner.capacity)
            .field("processes", &self.inner.processes)
            .field("writable_policy", &self.inner.policy.writable())
            .finish()
    }
}

/// Where the tenants' live state is.
enum State {
    /// One region for every tenant: a named object, or the embedded
    /// table's memory.
    Whole(Mapping),
    /// A coordinated table: a sealed memory file per tenant slot (see the
    /// layout module docs), made by the coordinator as tenants come. The
    /// coordinator maps every tenant's; a registered process only its own
    /// tenant's, the one file it was handed.
    Split {
        /// Process slots in each tenant's file.
        per_tenant: u32,
        segments: Box<[std::sync::OnceLock<Segment>]>,
    },
}

/// One tenant's state file, held open for as long as the table is mapped:
/// a restarted coordinator finds it through a live holder's
/// `/proc/PID/fd`. (No file: a copy of one's bytes, validated.)
struct Segment {
    map: Mapping,
    fd: Option<OwnedFd>,
}

impl State {
    /// A coordinated table's state: `capacity` tenant slots of
    /// `per_tenant` process slots each, holding `segments` (each in the
    /// tenant slot its validated header names) and no file in the others.
    fn split(capacity: u32, per_tenant: u32, segments: impl IntoIterator<Item = Segment>) -> State {
        let cells: Box<[std::sync::OnceLock<Segment>]> =
            (0..capacity).map(|_| std::sync::OnceLock::new()).collect();
        for seg in segments {
            let slot = seg.header().tenant_slot.load(Ordering::Relaxed);
            if let Some(cell) = cells.get(slot as usize) {
                let _ = cell.set(seg);
            }
        }
        State::Split {
            per_tenant,
            segments: cells,
        }
    }
}

impl Segment {
    fn header(&self) -> &SegmentHeader {
        // SAFETY: the header is all atomics; `get` checks bounds and
        // alignment, and every segment is validated (or made) at least
        // `segment_len` long before it is kept.
        unsafe { self.map.get(0) }.expect("segment validated")
    }
}

/// A consistent view of the table's policy, with the slot of each tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySnapshot {
    /// Bumped on every publication of a policy.
    pub generation: u64,
    /// The policy (match rules are not stored in the table and are empty).
    pub policy: Policy,
    slots: HashMap<TenantId, u32>,
    /// What the latency bound asks of each tenant held to it, as published.
    protections: HashMap<TenantId, Protection>,
}

impl PolicySnapshot {
    /// The slot index of a tenant.
    pub fn slot_of(&self, tenant: TenantId) -> Option<u32> {
        self.slots.get(&tenant).copied()
    }

    /// What the policy's latency bound asks of `tenant`'s scheduled queue
    /// pairs, as the table's publisher (the coordinator, or the embedding
    /// process) published it: `None` for a tenant it does not hold (no
    /// bound, a latency-class tenant, or one the policy exempts).
    pub fn protection(&self, tenant: TenantId) -> Option<Protection> {
        self.protections.get(&tenant).copied()
    }
}

/// The shared-memory object names of table `name`.
fn object_names(name: &str) -> (String, String) {
    (
        format!("/mtrdma.{name}.policy"),
        format!("/mtrdma.{name}.state"),
    )
}

/// The label of tenant slot `slot`'s state file on coordinated table
/// `name` (shown in `/proc/PID/fd` as `/memfd:LABEL`).
fn segment_label(name: &str, slot: u32) -> String {
    format!("mtrdma.{name}.tenant{slot}")
}

fn check_name(name: &str) -> Result<(), TableError> {
    let ok = (1..=200).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(TableError::BadName(name.to_string()))
    }
}

fn io_err(op: &'static str, object: &str, source: std::io::Error) -> TableError {
    let hint = match source.kind() {
        std::io::ErrorKind::NotFound => " (is the coordinator running? it creates the table)",
        std::io::ErrorKind::AlreadyExists => {
            " (a table of that name exists: open it, or remove it if its coordinator is gone)"
        }
        std::io::ErrorKind::PermissionDenied => {
            " (the policy region is writable only by its creator)"
        }
        _ => "",
    };
    TableError::Io {
        op,
        object: object.to_string(),
        source,
        hint,
    }
}

impl QuotaTable {
    /// Whether a coordinator keeps the table
    /// ([`create_coordinated`](Self::create_coordinated)).
    pub fn is_coordinated(&self) -> bool {
        self.policy_header().flags.load(Ordering::Acquire) & TABLE_COORDINATED != 0
    }

    /// The table's name (`None` when embedded).
    pub fn name(&self) -> Option<&str> {
        self.inner.name.as_deref()
    }

    /// How many tenant slots the table has.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// How many process slots the table has.
    pub fn process_slots(&self) -> u32 {
        self.inner.processes
    }

    pub(crate) fn policy_header(&self) -> &PolicyHeader {
        // SAFETY: validated at open/create: the header is in bounds and
        // aligned; it is all atomics.
        unsafe { self.inner.policy.get(0) }.expect("policy header validated at open")
    }

    pub(crate) fn policy_slot(&self, slot: u32) -> &PolicySlot {
        assert!(
            slot < self.inner.capacity,
            "policy slot {slot} out of range"
        );
        // SAFETY: the region holds `capacity` slots (validated at open).
        unsafe {
            self.inner
                .policy
                .get(POLICY_HEADER + slot as usize * POLICY_SLOT)
        }
        .expect("policy slots validated at open")
    }

    /// Tenant slot `slot`'s live state, where this process maps it: every
    /// slot of a table with one state region; on a coordinated table, the
    /// slots whose files the coordinator made (all of them in the
    /// coordinator, a registered process's own tenant's in that process).
    pub(crate) fn state_of(&self, slot: u32) -> Option<&TenantState> {
        if slot >= self.inner.capacity {
            return None;
        }
        match &self.inner.state {
            // SAFETY: the state region holds `capacity` tenant slots
            // (validated); all atomics.
            State::Whole(smap) => unsafe { smap.get(STATE_HEADER + slot as usize * STATE_SLOT) },
            // SAFETY: every kept segment is at least `segment_len` long
            // (validated or made so); all atomics.
            State::Split { .. } => unsafe { self.segment(slot)?.map.get(SEGMENT_HEADER) },
        }
    }

    /// [`state_of`](Self::state_of) a slot this process maps: its
    /// handles' own tenant, or any in the coordinator.
    pub(crate) fn tenant_state(&self, slot: u32) -> &TenantState {
        self.state_of(slot)
            .expect("a tenant slot this process maps (its handles' own)")
    }

    /// Process slot `slot`, where this process maps it (as
    /// [`state_of`](Self::state_of)).
    pub(crate) fn process_of(&self, slot: u32) -> Option<&ProcessSlot> {
        if slot >= self.inner.processes {
            return None;
        }
        match &self.inner.state {
            State::Whole(smap) => {
                let offset = STATE_HEADER
                    + self.inner.capacity as usize * STATE_SLOT
                    + slot as usize * PROCESS_SLOT;
                // SAFETY: the state region holds `processes` process
                // slots after the tenant slots (validated at open).
                unsafe { smap.get(offset) }
            }
            State::Split { per_tenant, .. } => {
                let seg = self.segment(slot / per_tenant)?;
                let offset =
                    SEGMENT_HEADER + STATE_SLOT + (slot % per_tenant) as usize * PROCESS_SLOT;
                // SAFETY: the segment holds `per_tenant` process slots
                // after its tenant's state (validated or made so).
                unsafe { seg.map.get(offset) }
            }
        }
    }

    /// [`process_of`](Self::process_of) a slot this process maps.
    pub(crate) fn process_slot(&self, slot: u32) -> &ProcessSlot {
        self.process_of(slot)
            .expect("a process slot this process maps (its handles' own)")
    }

    /// Tenant slot `slot`'s state file on a coordinated table, if mapped.
    fn segment(&self, slot: u32) -> Option<&Segment> {
        match &self.inner.state {
            State::Split { segments, .. } => segments.get(slot as usize)?.get(),
            State::Whole(_) => None,
        }
    }

    /// The process slots a process of tenant slot `slot` may take: all of
    /// a table with one state region, the slot's own on a coordinated one.
    fn claimable(&self, slot: u32) -> std::ops::Range<u32> {
        match &self.inner.state {
            State::Whole(_) => 0..self.inner.processes,
            State::Split { per_tenant, .. } => slot * per_tenant..(slot + 1) * per_tenant,
        }
    }

    /// Every process slot this process maps.
    ///
    /// Of a tenant's state file, only the slots ever claimed: a scan of
    /// 256 slots per tenant every 250 ms cost the coordinator about half a
    /// percent of an emulated core.
    fn mapped_processes(&self) -> impl Iterator<Item = u32> + '_ {
        let (groups, per) = match &self.inner.state {
            State::Whole(_) => (1, self.inner.processes),
            State::Split { per_tenant, .. } => (self.inner.capacity, *per_tenant),
        };
        (0..groups).flat_map(move |g| {
            let used = match &self.inner.state {
                State::Whole(_) => per,
                State::Split { .. } => self
                    .segment(g)
                    .map_or(0, |s| s.header().claimed.load(Ordering::Acquire).min(per)),
            };
            g * per..g * per + used
        })
    }

    /// Makes tenant slot `slot`'s state file on a coordinated table if it
    /// has none (a new tenant, or one no live process held when this
    /// coordinator took over), and records its inode in the policy.
    fn ensure_segment(&self, slot: u32) -> Result<(), TableError> {
        let State::Split {
            per_tenant,
            segments,
        } = &self.inner.state
        else {
            return Ok(());
        };
        let Some(cell) = segments.get(slot as usize) else {
            return Ok(());
        };
        if cell.get().is_some() {
            return Ok(());
        }
        let label = segment_label(self.inner.name.as_deref().unwrap_or(""), slot);
        let (fd, map) = Mapping::create_sealed(&label, segment_len(*per_tenant))
            .map_err(|e| io_err("create", &label, e))?;
        let inode = shm::inode(&fd).map_err(|e| io_err("fstat", &label, e))?;
        let seg = Segment { map, fd: Some(fd) };
        let h = seg.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.tenant_slot.store(slot, Ordering::Relaxed);
        h.process_slots.store(*per_tenant, Ordering::Relaxed);
        h.magic.store(SEGMENT_MAGIC, Ordering::Release);
        let _ = cell.set(seg);
        self.policy_slot(slot)
            .state_inode
            .store(inode, Ordering::Release);
        Ok(())
    }
}
