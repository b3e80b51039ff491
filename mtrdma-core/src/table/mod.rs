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

mod error;
mod handle;
mod layout;
mod shm;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU64, Ordering};
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

impl TableOwner {
    fn of(table: QuotaTable) -> TableOwner {
        TableOwner { table }
    }

    /// The table as its tenants see it (a clone sharing the mappings).
    pub fn table(&self) -> QuotaTable {
        self.table.clone()
    }

    /// Publishes `policy`. Tenants already in the table keep their slot
    /// and live state; new tenants get a free slot with fresh state.
    pub fn publish(&self, policy: &Policy) -> Result<(), TableError> {
        if !self.inner.policy.writable() {
            return Err(TableError::ReadOnly);
        }
        policy.validate()?;
        if policy.tenants.len() > self.inner.capacity as usize {
            return Err(TableError::Full {
                tenants: policy.tenants.len(),
                capacity: self.inner.capacity,
            });
        }
        // Where each tenant goes: its current slot, or a free one.
        let mut current: HashMap<u32, u32> = HashMap::new();
        for slot in 0..self.inner.capacity {
            let s = self.policy_slot(slot);
            if s.flags.load(Ordering::Relaxed) & SLOT_IN_USE != 0 {
                current.insert(s.id.load(Ordering::Relaxed), slot);
            }
        }
        let wanted: std::collections::HashSet<u32> =
            policy.tenants.iter().map(|t| t.id.0).collect();
        let referenced = self.referenced_slots();
        // A new tenant gets a slot that holds no tenant being kept, that no
        // process refers to, and whose counters are back to zero.
        let mut free = (0..self.inner.capacity).filter(|&slot| {
            let s = self.policy_slot(slot);
            let keeps = s.flags.load(Ordering::Relaxed) & SLOT_IN_USE != 0
                && wanted.contains(&s.id.load(Ordering::Relaxed));
            !keeps && !referenced.contains(&slot) && !self.holds_resources(slot)
        });
        // A tenant removed by an earlier policy whose processes still hold
        // its old slot comes back to that slot, with what they hold: a
        // second slot would give it its quota twice.
        let mut left: HashMap<u32, u32> = HashMap::new();
        for slot in 0..self.inner.capacity {
            let s = self.policy_slot(slot);
            let held = referenced.contains(&slot) || self.holds_resources(slot);
            if s.flags.load(Ordering::Relaxed) & SLOT_IN_USE == 0 && held {
                left.insert(s.id.load(Ordering::Relaxed), slot);
            }
        }
        let mut placement = Vec::with_capacity(policy.tenants.len());
        for t in &policy.tenants {
            match current.get(&t.id.0).or_else(|| left.get(&t.id.0)) {
                Some(&slot) => placement.push((slot, t, false)),
                None => {
                    let slot = free.next().ok_or(TableError::Full {
                        tenants: policy.tenants.len(),
                        capacity: self.inner.capacity,
                    })?;
                    placement.push((slot, t, true));
                }
            }
        }
        drop(free);
        // Each placed tenant's state file on a coordinated table.
        for &(slot, _, _) in &placement {
            self.ensure_segment(slot)?;
        }

        let h = self.policy_header();
        let seq = h.seq.load(Ordering::Relaxed);
        // An odd seq is a write that never finished (its writer died):
        // start from the next even value.
        let start = seq | 1;
        h.seq.store(start, Ordering::Relaxed);
        fence(Ordering::Release);
        for slot in 0..self.inner.capacity {
            let s = self.policy_slot(slot);
            if s.flags.load(Ordering::Relaxed) & SLOT_IN_USE != 0
                && !wanted.contains(&s.id.load(Ordering::Relaxed))
            {
                s.flags.store(0, Ordering::Relaxed);
                s.fair_rate.store(0, Ordering::Relaxed);
                s.window_gain.store(0, Ordering::Relaxed);
                s.floor_permit.store(0, Ordering::Relaxed);
            }
        }
        for &(slot, t, fresh) in &placement {
            if fresh {
                self.reset_state(slot);
                self.policy_slot(slot).fair_rate.store(0, Ordering::Relaxed);
                self.policy_slot(slot)
                    .window_gain
                    .store(0, Ordering::Relaxed);
                self.policy_slot(slot)
                    .floor_permit
                    .store(0, Ordering::Relaxed);
            }
            write_slot(self.policy_slot(slot), t, policy);
        }
        h.link_capacity
            .store(policy.link.capacity_bytes_per_sec, Ordering::Relaxed);
        h.recompute_interval_ms
            .store(policy.link.recompute_interval_ms, Ordering::Relaxed);
        h.tenant_count
            .store(policy.tenants.len() as u32, Ordering::Relaxed);
        h.latency_bound
            .store(policy.link.latency_bound.unwrap_or(0), Ordering::Relaxed);
        h.seq.store(start + 1, Ordering::Release);
        tracing::info!(
            table = ?self.inner.name,
            generation = start / 2 + 1,
            tenants = policy.tenants.len(),
            "published policy"
        );
        self.snapshot()?;
        Ok(())
    }

    /// Records a coordinator heartbeat (`CLOCK_MONOTONIC` ns).
    pub(crate) fn heartbeat(&self, now_ns: u64) {
        self.policy_header()
            .heartbeat_ns
            .store(now_ns, Ordering::Release);
    }

    /// Publishes the link's measured rate in bytes per second (0: not
    /// measured).
    pub(crate) fn set_link_estimate(&self, bytes_per_sec: u64) {
        self.policy_header()
            .link_estimate
            .store(bytes_per_sec, Ordering::Release);
    }

    /// Publishes the weights of the tenants whose windows contend for the
    /// link, added up (0 withdraws it).
    pub(crate) fn set_sharing_weight(&self, weights: u32) {
        self.policy_header()
            .sharing_weight
            .store(u64::from(weights), Ordering::Release);
    }

    /// Publishes a tenant's fair byte rate (0 withdraws it).
    pub(crate) fn set_fair_rate(&self, slot: u32, bytes_per_sec: u64) {
        self.policy_slot(slot)
            .fair_rate
            .store(bytes_per_sec, Ordering::Release);
    }

    /// Publishes the gain on a tenant's delay windows' growth, parts per
    /// million (0 withdraws it).
    pub(crate) fn set_window_gain(&self, slot: u32, ppm: u32) {
        self.policy_slot(slot)
            .window_gain
            .store(u64::from(ppm), Ordering::Release);
    }

    /// Publishes a tenant's permit for the one-piece floor
    /// (`mtrdma_sched::piece_floor::Permit::to_word`).
    pub(crate) fn set_floor_permit(&self, slot: u32, word: u64) {
        self.policy_slot(slot)
            .floor_permit
            .store(word, Ordering::Release);
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
    /// Creates the shared-memory table `name` with room for `capacity`
    /// tenants and `processes` attached processes, and publishes `policy`.
    ///
    /// The policy region is created with mode 0644 (only this process's
    /// user may write it), the state region with mode 0666.
    pub fn create(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<TableOwner, TableError> {
        Self::create_named(name, capacity, processes, policy, (0o644, 0o666), 0).map(TableOwner::of)
    }

    /// Creates the table `name` for a coordinator: private to this
    /// process's user, and the table marked as kept by a
    /// coordinator, so that processes join it by registering (the
    /// coordinator hands them the table over its socket) and
    /// [`attach`](Self::attach) refuses to attach a process as a tenant of
    /// its choice.
    ///
    /// The policy is a named object (mode 0600). The state has no name:
    /// each tenant's is a memory file of its own, with `processes` process
    /// slots, sealed so that it can never shrink or grow, made when the
    /// tenant first takes a slot. The coordinator hands a registering
    /// process its tenant's file alone: a registered process can write
    /// its own tenant's counters (it keeps them there) but cannot reach
    /// another tenant's, nor truncate its own under its fellow processes'
    /// mappings, and no process the coordinator did not register can open
    /// any. Every holder keeps its file open; a restarted coordinator
    /// ([`take_over`](Self::take_over)) finds each again through a live
    /// holder's `/proc/PID/fd` entry, by the inode number the policy
    /// records.
    pub fn create_coordinated(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<TableOwner, TableError> {
        check_name(name)?;
        check_split_sizes(capacity, processes)?;
        policy.validate()?;
        let (pname, _) = object_names(name);
        let pmap = Mapping::create(&pname, policy_len(capacity), 0o600)
            .map_err(|e| io_err("create", &pname, e))?;
        let table =
            Self::init_coordinated(Some(name.to_string()), pmap, capacity, processes, policy);
        if table.is_err() {
            let _ = shm::unlink(&pname);
        }
        table.map(TableOwner::of)
    }

    /// Marks the policy region `pmap` (sized for `capacity`) as a
    /// coordinated table's with `per_tenant` process slots per tenant file,
    /// and makes the table on it with no tenant file yet (publishing
    /// `policy` makes its tenants' files).
    fn init_coordinated(
        name: Option<String>,
        pmap: Mapping,
        capacity: u32,
        per_tenant: u32,
        policy: &Policy,
    ) -> Result<QuotaTable, TableError> {
        // SAFETY: the header is all atomics, in bounds (the mapping was
        // sized from `capacity`).
        if let Some(h) = unsafe { pmap.get::<PolicyHeader>(0) } {
            h.segment_processes.store(per_tenant, Ordering::Relaxed);
            h.flags.store(TABLE_COORDINATED, Ordering::Relaxed);
        }
        let state = State::split(capacity, per_tenant, []);
        Self::init(name, pmap, state, capacity, capacity * per_tenant, policy)
    }

    fn create_named(
        name: &str,
        capacity: u32,
        processes: u32,
        policy: &Policy,
        (pmode, smode): (u32, u32),
        flags: u64,
    ) -> Result<QuotaTable, TableError> {
        check_name(name)?;
        check_sizes(capacity, processes)?;
        policy.validate()?;
        let (pname, sname) = object_names(name);
        let pmap = Mapping::create(&pname, policy_len(capacity), pmode)
            .map_err(|e| io_err("create", &pname, e))?;
        let smap = match Mapping::create(&sname, state_len(capacity, processes), smode) {
            Ok(m) => m,
            Err(e) => {
                let _ = shm::unlink(&pname);
                return Err(io_err("create", &sname, e));
            }
        };
        let table = Self::init(
            Some(name.to_string()),
            pmap,
            State::Whole(smap),
            capacity,
            processes,
            policy,
        )
        .inspect(|t| t.policy_header().flags.store(flags, Ordering::Release));
        if table.is_err() {
            let _ = shm::unlink(&pname);
            let _ = shm::unlink(&sname);
        }
        table
    }

    /// A process-local table (no coordinator, no shared memory name) with
    /// the same API, sized for the policy's tenants (at least 64) and
    /// [`DEFAULT_PROCESSES`] process slots.
    pub fn embedded(policy: &Policy) -> Result<TableOwner, TableError> {
        let capacity = u32::try_from(policy.tenants.len())
            .unwrap_or(MAX_TENANTS)
            .clamp(64, MAX_TENANTS);
        Self::embedded_with_capacity(policy, capacity, DEFAULT_PROCESSES)
    }

    /// A process-local table with explicit sizes.
    pub fn embedded_with_capacity(
        policy: &Policy,
        capacity: u32,
        processes: u32,
    ) -> Result<TableOwner, TableError> {
        check_sizes(capacity, processes)?;
        policy.validate()?;
        let pmap = Mapping::anonymous(policy_len(capacity))
            .map_err(|e| io_err("mmap", "(embedded)", e))?;
        let smap = Mapping::anonymous(state_len(capacity, processes))
            .map_err(|e| io_err("mmap", "(embedded)", e))?;
        Self::init(None, pmap, State::Whole(smap), capacity, processes, policy).map(TableOwner::of)
    }

    fn init(
        name: Option<String>,
        pmap: Mapping,
        state: State,
        capacity: u32,
        processes: u32,
        policy: &Policy,
    ) -> Result<QuotaTable, TableError> {
        // SAFETY: the header is all atomics; the mapping is writable and
        // was sized from `capacity`.
        let ph = unsafe { pmap.get::<PolicyHeader>(0) }.ok_or(TableError::Truncated {
            region: "policy",
            expected: POLICY_HEADER,
            actual: pmap.len(),
        })?;
        if let State::Whole(smap) = &state {
            // SAFETY: as above, for the state region.
            let sh = unsafe { smap.get::<StateHeader>(0) }.ok_or(TableError::Truncated {
                region: "state",
                expected: STATE_HEADER,
                actual: smap.len(),
            })?;
            sh.version.store(VERSION, Ordering::Relaxed);
            sh.header_size.store(STATE_HEADER as u32, Ordering::Relaxed);
            sh.capacity.store(capacity, Ordering::Relaxed);
            sh.slot_size.store(STATE_SLOT as u32, Ordering::Relaxed);
            sh.process_slots.store(processes, Ordering::Relaxed);
            sh.process_slot_size
                .store(PROCESS_SLOT as u32, Ordering::Relaxed);
            sh.magic.store(STATE_MAGIC, Ordering::Release);
        }
        ph.version.store(VERSION, Ordering::Relaxed);
        ph.header_size
            .store(POLICY_HEADER as u32, Ordering::Relaxed);
        ph.capacity.store(capacity, Ordering::Relaxed);
        ph.slot_size.store(POLICY_SLOT as u32, Ordering::Relaxed);
        if let Some(me) = ProcessId::current() {
            ph.coordinator_pid.store(me.pid, Ordering::Relaxed);
            ph.coordinator_start.store(me.start_time, Ordering::Relaxed);
        }
        let (raw0, ns0, mult) = SharedClock::calibrate();
        ph.clock_raw0.store(raw0, Ordering::Relaxed);
        ph.clock_ns0.store(ns0, Ordering::Relaxed);
        ph.clock_mult.store(mult, Ordering::Relaxed);
        ph.magic.store(POLICY_MAGIC, Ordering::Release);
        let clock = SharedClock::from_params(raw0, ns0, mult)
            .map_err(|problem| TableError::Clock { problem })?;
        let table = QuotaTable {
            inner: Arc::new(Inner {
                name,
                policy: pmap,
                state,
                capacity,
                processes,
                cache: ArcSwap::from_pointee(PolicySnapshot {
                    generation: 0,
                    policy: Policy::new(LinkConfig::new(1), Vec::new()),
                    slots: HashMap::new(),
                    protections: HashMap::new(),
                }),
                clock,
            }),
        };
        let owner = TableOwner::of(table);
        owner.publish(policy)?;
        Ok(owner.table)
    }

    /// Opens the table `name` as a tenant process: the policy region
    /// read-only, the state region read-write. Everything is validated.
    pub fn open(name: &str) -> Result<QuotaTable, TableError> {
        Self::open_mode(name, false)
    }

    /// Opens the table `name` with a writable policy region, as a restarted
    /// coordinator does to take over a table whose tenants are running.
    pub fn open_writable(name: &str) -> Result<TableOwner, TableError> {
        Self::open_mode(name, true).map(TableOwner::of)
    }

    /// Takes over the table `name` as a restarted coordinator: like
    /// [`open_writable`](Self::open_writable), after checking that both of
    /// its objects belong to this process's user and that no one else may
    /// open them ([`create_coordinated`](Self::create_coordinated) made
    /// them so). A table someone else created first, or one others may
    /// write, is refused ([`TableError::NotPrivate`]): taking it over would
    /// trust what they wrote and hand it to every tenant.
    ///
    /// Each tenant's state file is found through a live process that
    /// holds it (see [`create_coordinated`](Self::create_coordinated)); a
    /// tenant's file that no process holds any more (its processes and the
    /// old coordinator are gone) is made anew, empty, at the next
    /// [`publish`](Self::publish): nothing in it was owed to anyone.
    pub fn take_over(name: &str) -> Result<TableOwner, TableError> {
        check_name(name)?;
        let (pname, _) = object_names(name);
        let me = rustix::process::geteuid().as_raw();
        let fd = shm::open_fd(&pname, true).map_err(|e| io_err("open", &pname, e))?;
        let (owner, mode) = shm::owner_and_mode(&fd).map_err(|e| io_err("fstat", &pname, e))?;
        if owner != me || mode & 0o077 != 0 {
            return Err(TableError::NotPrivate {
                object: pname,
                owner,
                mode,
                expected: me,
            });
        }
        let pmap = Mapping::from_fd(&fd, true).map_err(|e| io_err("mmap", &pname, e))?;
        let table = Self::with_state(name, pmap)?;
        if !table.is_coordinated() {
            return Err(TableError::NotPrivate {
                object: pname,
                owner: me,
                mode: 0o600,
                expected: me,
            });
        }
        Ok(TableOwner::of(table))
    }

    /// Maps a table from the objects a coordinator handed over: the policy
    /// read-only, the state read-write. Everything is validated.
    /// The tenant's state file is kept open for as long as the table is
    /// (see `create_coordinated`); it must be the file the policy records
    /// for its tenant slot, sealed.
    pub(crate) fn from_fds(
        name: &str,
        policy: &OwnedFd,
        state: OwnedFd,
    ) -> Result<QuotaTable, TableError> {
        let (pname, _) = object_names(name);
        let pmap = Mapping::from_fd(policy, false).map_err(|e| io_err("mmap", &pname, e))?;
        let (capacity, _) = validate_policy_region(&pmap)?;
        let per_tenant = split_processes(&pmap);
        if per_tenant == 0 {
            // Not a coordinated table: it has no state file per tenant.
            return Err(TableError::OutOfRange {
                region: "policy",
                field: "segment_processes".into(),
                value: 0,
                range: "1..=65536 on a coordinated table",
            });
        }
        let label = format!("mtrdma.{name}.tenant*");
        let seg = Self::segment_from_fd(&pmap, state, per_tenant, capacity, &label)?;
        let state = State::split(capacity, per_tenant, [seg]);
        Self::from_mappings(Some(name.to_string()), pmap, state)
    }

    /// Validates `fd` as a tenant's state file of the table whose policy
    /// is `pmap`: its header names a tenant slot and `per_tenant` process
    /// slots, its length fits, it is sealed, and it is the file (inode)
    /// the policy records for that slot.
    fn segment_from_fd(
        pmap: &Mapping,
        fd: OwnedFd,
        per_tenant: u32,
        capacity: u32,
        label: &str,
    ) -> Result<Segment, TableError> {
        const R: &str = "tenant state";
        let map = Mapping::from_fd(&fd, true).map_err(|e| io_err("mmap", label, e))?;
        let slot = validate_segment(&map, per_tenant, capacity)?;
        let recorded =
            raw_policy_slot(pmap, slot).map_or(0, |s| s.state_inode.load(Ordering::Acquire));
        let inode = shm::inode(&fd).map_err(|e| io_err("fstat", label, e))?;
        if inode != recorded {
            return Err(TableError::Mismatch {
                region: R,
                field: "inode (the file the policy records for its tenant slot)",
                found: inode,
                expected: recorded,
            });
        }
        if !shm::sealed(&fd) {
            return Err(TableError::OutOfRange {
                region: R,
                field: "seals".into(),
                value: 0,
                range: "sealed against shrinking and growing",
            });
        }
        Ok(Segment { map, fd: Some(fd) })
    }

    /// The table's policy object opened read-only, as a coordinator hands
    /// it to every process it registers.
    pub(crate) fn policy_fd(&self) -> Result<OwnedFd, TableError> {
        let name = self.inner.name.as_deref().ok_or(TableError::ReadOnly)?;
        let (pname, _) = object_names(name);
        shm::open_fd(&pname, false).map_err(|e| io_err("open", &pname, e))
    }

    /// What else a coordinator hands a process it registers as `tenant`:
    /// that tenant's state file, and no other.
    pub(crate) fn tenant_state_fd(&self, tenant: TenantId) -> Result<OwnedFd, TableError> {
        let slot = self
            .snapshot()?
            .slot_of(tenant)
            .ok_or(TableError::UnknownTenant(tenant))?;
        let fd = self
            .segment(slot)
            .and_then(|seg| seg.fd.as_ref())
            .ok_or(TableError::UnknownTenant(tenant))?;
        let label = segment_label(self.inner.name.as_deref().unwrap_or(""), slot);
        fd.try_clone().map_err(|e| io_err("dup", &label, e))
    }

    /// Whether a coordinator keeps the table
    /// ([`create_coordinated`](Self::create_coordinated)).
    pub fn is_coordinated(&self) -> bool {
        self.policy_header().flags.load(Ordering::Acquire) & TABLE_COORDINATED != 0
    }

    fn open_mode(name: &str, writable_policy: bool) -> Result<QuotaTable, TableError> {
        check_name(name)?;
        let (pname, _) = object_names(name);
        let pmap = Mapping::open(&pname, writable_policy).map_err(|e| io_err("open", &pname, e))?;
        Self::with_state(name, pmap)
    }

    /// Maps the state of table `name`, whose policy is `pmap`: the named
    /// object, or on a coordinated table each tenant's state file the
    /// policy records, found through a live process that holds it (one
    /// that no process holds stays unmapped); then validates everything.
    fn with_state(name: &str, pmap: Mapping) -> Result<QuotaTable, TableError> {
        let per_tenant = split_processes(&pmap);
        if per_tenant == 0 {
            let (_, sname) = object_names(name);
            let smap = Mapping::open(&sname, true).map_err(|e| io_err("open", &sname, e))?;
            return Self::from_mappings(Some(name.to_string()), pmap, State::Whole(smap));
        }
        let (capacity, _) = validate_policy_region(&pmap)?;
        check_split_sizes(capacity, per_tenant)?;
        let wanted: HashMap<String, u64> = (0..capacity)
            .filter_map(|slot| {
                let inode = raw_policy_slot(&pmap, slot)?
                    .state_inode
                    .load(Ordering::Acquire);
                (inode != 0).then(|| (segment_label(name, slot), inode))
            })
            .collect();
        let mut found = shm::find_memfds(&wanted);
        let mut segments = Vec::with_capacity(found.len());
        for slot in 0..capacity {
            let label = segment_label(name, slot);
            let Some(fd) = found.remove(&label) else {
                continue;
            };
            match Self::segment_from_fd(&pmap, fd, per_tenant, capacity, &label) {
                Ok(seg) if seg.header().tenant_slot.load(Ordering::Relaxed) == slot => {
                    segments.push(seg);
                }
                Ok(_) => tracing::warn!(slot, "a tenant state file names another slot; left out"),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "a tenant state file does not validate; left out")
                }
            }
        }
        let state = State::split(capacity, per_tenant, segments);
        Self::from_mappings(Some(name.to_string()), pmap, state)
    }

    /// Validates two mapped regions and builds a table on them.
    fn from_mappings(
        name: Option<String>,
        pmap: Mapping,
        state: State,
    ) -> Result<QuotaTable, TableError> {
        let (capacity, clock) = validate_policy_region(&pmap)?;
        let processes = match &state {
            State::Whole(smap) => validate_state_region(smap, capacity)?,
            State::Split { per_tenant, .. } => {
                check_split_sizes(capacity, *per_tenant)?;
                capacity * per_tenant
            }
        };
        let table = QuotaTable {
            inner: Arc::new(Inner {
                name,
                policy: pmap,
                state,
                capacity,
                processes,
                cache: ArcSwap::from_pointee(PolicySnapshot {
                    generation: u64::MAX,
                    policy: Policy::new(LinkConfig::new(1), Vec::new()),
                    slots: HashMap::new(),
                    protections: HashMap::new(),
                }),
                clock,
            }),
        };
        match table.snapshot() {
            Ok(_) => {}
            // A writer that died in the middle of publishing left the
            // policy half-written. Whoever opens it to write takes it over
            // and publishes a whole one (`publish` starts from an odd
            // sequence); tenants keep their last good policy until then.
            Err(TableError::Torn) if table.inner.policy.writable() => {
                tracing::warn!(
                    "the table's policy was left half-written by a writer that stopped; \
                     publish one to recover"
                );
            }
            Err(e) => return Err(e),
        }
        Ok(table)
    }

    /// Validates `bytes` as a policy region followed by the matching state
    /// region (as laid out by [`QuotaTable::to_bytes`]) and reads the policy:
    /// what a fuzzer feeds arbitrary bytes to.
    pub fn validate_bytes(policy: &[u8], state: &[u8]) -> Result<PolicySnapshot, TableError> {
        let table = Self::from_mappings(None, copy(policy)?, State::Whole(copy(state)?))?;
        Ok((*table.snapshot()?).clone())
    }

    /// Validates `policy` as a coordinated table's policy region and
    /// `segment` as one tenant's state file of it (what a coordinator
    /// hands a registered process; see
    /// [`create_coordinated`](Self::create_coordinated)), and reads that
    /// tenant's usage: what a fuzzer feeds arbitrary bytes to.
    pub fn validate_tenant_bytes(
        policy: &[u8],
        segment: &[u8],
    ) -> Result<Vec<TenantUsage>, TableError> {
        let pmap = copy(policy)?;
        let (capacity, _) = validate_policy_region(&pmap)?;
        let per_tenant = split_processes(&pmap);
        check_split_sizes(capacity, per_tenant)?;
        let map = copy(segment)?;
        validate_segment(&map, per_tenant, capacity)?;
        let state = State::split(capacity, per_tenant, [Segment { map, fd: None }]);
        Self::from_mappings(None, pmap, state)?.usage()
    }

    /// The bytes of a coordinated table for `policy` made in this process
    /// with no names (its policy region, and tenant slot 0's state file),
    /// with `capacity` tenant slots of `per_tenant` process slots each: a
    /// valid input for [`validate_tenant_bytes`](Self::validate_tenant_bytes),
    /// for tests and fuzzers.
    pub fn sample_tenant_bytes(
        policy: &Policy,
        capacity: u32,
        per_tenant: u32,
    ) -> Result<(Vec<u8>, Vec<u8>), TableError> {
        check_split_sizes(capacity, per_tenant)?;
        let pmap =
            Mapping::anonymous(policy_len(capacity)).map_err(|e| io_err("mmap", "(sample)", e))?;
        let table = Self::init_coordinated(None, pmap, capacity, per_tenant, policy)?;
        let segment = table.segment(0).map(|s| dump(&s.map)).unwrap_or_default();
        Ok((dump(&table.inner.policy), segment))
    }

    /// The bytes of both regions (policy, state), for tests and tools. A
    /// coordinated table has no state region (each tenant's state is a
    /// file of its own): its state bytes are empty.
    pub fn to_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        let state = match &self.inner.state {
            State::Whole(smap) => dump(smap),
            State::Split { .. } => Vec::new(),
        };
        (dump(&self.inner.policy), state)
    }

    /// Removes table `name`'s shared-memory objects. Processes that mapped
    /// them keep their mappings; new ones can no longer open it. (A
    /// coordinated table's state has no name: it goes with its last
    /// holder.)
    pub fn remove(name: &str) -> Result<(), TableError> {
        check_name(name)?;
        let (pname, sname) = object_names(name);
        let a = shm::unlink(&pname).map_err(|e| io_err("unlink", &pname, e));
        let b = match shm::unlink(&sname) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && a.is_ok() => Ok(()),
            b => b.map_err(|e| io_err("unlink", &sname, e)),
        };
        a.and(b)
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

    /// Nanoseconds on the table's shared time base: the clock every rate
    /// decision through this table must be given (close to
    /// `CLOCK_MONOTONIC`, read from the TSC where there is one, and equal
    /// in every process of the table).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.inner.clock.now_ns()
    }

    /// The generation of the policy now in the table (odd seq: mid-write).
    pub fn generation(&self) -> u64 {
        self.policy_header().seq.load(Ordering::Acquire) / 2
    }

    /// The current policy, re-read only when its generation changed.
    ///
    /// When the stored policy is mid-update for too long or fails
    /// validation, this returns the error; callers that must go on (the data
    /// path) keep using the last good snapshot (fail-static).
    pub fn snapshot(&self) -> Result<Arc<PolicySnapshot>, TableError> {
        let seq = self.policy_header().seq.load(Ordering::Acquire);
        let cached = self.inner.cache.load_full();
        if seq % 2 == 0 && cached.generation == seq / 2 {
            return Ok(cached);
        }
        let fresh = Arc::new(self.read_snapshot()?);
        self.inner.cache.store(Arc::clone(&fresh));
        Ok(fresh)
    }

    /// The last snapshot read, without looking at the table.
    pub fn cached_snapshot(&self) -> Arc<PolicySnapshot> {
        self.inner.cache.load_full()
    }

    /// Reads the policy under the seqlock and validates it.
    fn read_snapshot(&self) -> Result<PolicySnapshot, TableError> {
        let h = self.policy_header();
        for attempt in 0..10_000u32 {
            let s1 = h.seq.load(Ordering::Acquire);
            if s1 % 2 == 1 {
                if attempt > 100 {
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
                continue;
            }
            let link = h.link_capacity.load(Ordering::Relaxed);
            let interval = h.recompute_interval_ms.load(Ordering::Relaxed);
            let count = h.tenant_count.load(Ordering::Relaxed);
            let bound = h.latency_bound.load(Ordering::Relaxed);
            let mut raw = Vec::new();
            for slot in 0..self.inner.capacity {
                let s = self.policy_slot(slot);
                if s.flags.load(Ordering::Relaxed) & SLOT_IN_USE != 0 {
                    raw.push(RawSlot::load(slot, s));
                }
            }
            fence(Ordering::Acquire);
            if h.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            return decode(s1 / 2, link, interval, count, bound, raw);
        }
        Err(TableError::Torn)
    }

    /// Whether tenant slot `slot`'s counters hold queue pairs or memory
    /// (none where this process maps no state for it).
    fn holds_resources(&self, slot: u32) -> bool {
        self.state_of(slot).is_some_and(|st| {
            st.qps.load(Ordering::Relaxed) != 0 || st.mr_bytes.load(Ordering::Relaxed) != 0
        })
    }

    /// Tenant slots that a live (or claiming) process refers to.
    fn referenced_slots(&self) -> std::collections::HashSet<u32> {
        self.mapped_processes()
            .map(|p| self.process_slot(p))
            .filter(|p| p.state.load(Ordering::Acquire) != PROC_FREE)
            .map(|p| p.tenant_slot.load(Ordering::Relaxed))
            .collect()
    }

    fn reset_state(&self, slot: u32) {
        let Some(st) = self.state_of(slot) else {
            return;
        };
        for w in st.tat.iter() {
            w.store(0, Ordering::Relaxed);
        }
        for w in [
            &st.qps,
            &st.mr_bytes,
            &st.outstanding_wr,
            &st.bytes_posted,
            &st.wrs_posted,
            &st.backlog_bytes,
            &st.throttled_ns,
            &st.refusals,
            &st.judged_bytes,
            &st.over_target_bytes,
            &st.byte_rate,
        ] {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// The coordinator's last heartbeat (0: never).
    pub fn last_heartbeat_ns(&self) -> u64 {
        self.policy_header().heartbeat_ns.load(Ordering::Acquire)
    }

    /// The rate the tenants together moved through the link, as the
    /// coordinator last measured it (bytes per second), or `None` if no
    /// coordinator measures it. Windows take their queue allowance from it
    /// (see `mtrdma_sched::DelayWindow::set_link_rate`).
    pub fn link_estimate(&self) -> Option<u64> {
        let rate = self.policy_header().link_estimate.load(Ordering::Acquire);
        (rate != 0).then_some(rate)
    }

    /// The weights of the tenants whose delay windows contend for the
    /// link, added up, as last published (0: none), whatever its age (see
    /// `TenantHandle::sharing_weight`).
    pub fn sharing_weight(&self) -> u64 {
        self.policy_header().sharing_weight.load(Ordering::Acquire)
    }

    /// The policy's latency bound in bytes, as last published (`None`:
    /// no bound). One word read on its own, outside the seqlock.
    pub fn latency_bound(&self) -> Option<u64> {
        let bound = self.policy_header().latency_bound.load(Ordering::Acquire);
        (bound != 0).then_some(bound)
    }

    /// What a tenant's latency queue pairs last reported of the floor
    /// (`mtrdma_sched::piece_floor::Shift::to_word`; 0: nothing).
    pub(crate) fn delay_shift(&self, slot: u32) -> u64 {
        self.state_of(slot)
            .map_or(0, |st| st.delay_shift.load(Ordering::Acquire))
    }

    /// Returns the resources of processes that died without releasing them
    /// (a process is identified by pid and start time, so a new process
    /// that reuses a dead one's pid is not mistaken for it), and frees the
    /// slots of claims whose claimer died before finishing them. Returns
    /// what was reclaimed.
    ///
    /// On a table a coordinator keeps, only the coordinator reclaims (a
    /// tenant in a PID namespace of its own would take live processes it
    /// cannot see for dead): a tenant's call returns nothing.
    pub fn reclaim_dead(&self) -> Vec<Reclaimed> {
        let mut out = Vec::new();
        if self.is_coordinated() && !self.inner.policy.writable() {
            return out;
        }
        for p in self.mapped_processes() {
            let slot = self.process_slot(p);
            let state = slot.state.load(Ordering::Acquire);
            if state & PROC_CLAIMING_BY != 0 {
                self.free_abandoned_claim(p, state);
                continue;
            }
            if state != PROC_LIVE {
                continue;
            }
            let who = slot.occupant();
            if who.is_alive() {
                continue;
            }
            out.extend(self.reclaim_slot(p, who));
        }
        out
    }

    /// Reclaims process slot `p` if it still holds `who`, a process found
    /// dead. The slot is taken first (live to reclaiming) and its occupant
    /// read again after: between the first read and the taking, the slot
    /// may have been reclaimed by another process and claimed by a live
    /// one, whose resources must not be taken.
    fn reclaim_slot(&self, p: u32, who: ProcessId) -> Option<Reclaimed> {
        let slot = self.process_slot(p);
        slot.state
            .compare_exchange(
                PROC_LIVE,
                PROC_RECLAIMING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        if slot.occupant() != who {
            // Another process's now: give it back as it was.
            slot.state.store(PROC_LIVE, Ordering::Release);
            return None;
        }
        let tenant_slot = slot.tenant_slot.load(Ordering::Relaxed);
        // The process is dead: nobody writes its lanes any more.
        let (qps, mr_bytes) = slot.held();
        slot.clear();
        if let Some(st) = self.state_of(tenant_slot) {
            handle::sub_saturating(&st.qps, qps);
            handle::sub_saturating(&st.mr_bytes, mr_bytes);
        }
        slot.pid.store(0, Ordering::Relaxed);
        slot.state.store(PROC_FREE, Ordering::Release);
        let tenant = TenantId(
            self.policy_slot(tenant_slot.min(self.inner.capacity - 1))
                .id
                .load(Ordering::Relaxed),
        );
        tracing::info!(pid = who.pid, %tenant, qps, mr_bytes, "reclaimed resources of a dead process");
        Some(Reclaimed {
            process: who,
            tenant,
            qps,
            mr_bytes,
        })
    }

    /// Frees process slot `p`, found in claiming state `state`, if the
    /// process claiming it is gone: it died between taking the slot and
    /// making it live, and nothing was admitted through it.
    fn free_abandoned_claim(&self, p: u32, state: u32) {
        let claimer = state & !PROC_CLAIMING_BY;
        if crate::procinfo::pid_in_use(claimer) {
            // Still claiming (or its pid was reused: freed once that
            // process is gone).
            return;
        }
        let slot = self.process_slot(p);
        if slot
            .state
            .compare_exchange(state, PROC_RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        slot.clear();
        slot.pid.store(0, Ordering::Relaxed);
        slot.state.store(PROC_FREE, Ordering::Release);
        tracing::warn!(
            slot = p,
            claimer,
            "freed a process slot whose claimer died before finishing the claim"
        );
    }

    /// Claims a process slot for `process` as a member of `tenant`, and
    /// returns its index. The coordinator does this for a registering
    /// process, which then [`adopt`](Self::adopt)s it; [`attach`](Self::attach)
    /// does it for the caller itself.
    pub fn claim_process_slot(
        &self,
        tenant: TenantId,
        process: ProcessId,
    ) -> Result<u32, TableError> {
        self.claim(tenant, process, false)
    }

    /// [`claim_process_slot`](Self::claim_process_slot), the slot already
    /// held by a handle (`adopted`) or left for its process to adopt.
    fn claim(
        &self,
        tenant: TenantId,
        process: ProcessId,
        adopted: bool,
    ) -> Result<u32, TableError> {
        let snapshot = self.snapshot()?;
        let tenant_slot = snapshot
            .slot_of(tenant)
            .ok_or(TableError::UnknownTenant(tenant))?;
        // Who is claiming, in the state word itself: a claim its claimer
        // never finishes can be told and freed (`reclaim_dead`).
        let claiming = PROC_CLAIMING_BY | (std::process::id() & !PROC_CLAIMING_BY);
        let slots = self.claimable(tenant_slot);
        for round in 0..2 {
            for p in slots.clone() {
                let Some(slot) = self.process_of(p) else {
                    break;
                };
                if slot
                    .state
                    .compare_exchange(PROC_FREE, claiming, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    slot.pid.store(process.pid, Ordering::Relaxed);
                    slot.start_time.store(process.start_time, Ordering::Relaxed);
                    slot.tenant_slot.store(tenant_slot, Ordering::Relaxed);
                    slot.clear();
                    slot.adopted.store(u64::from(adopted), Ordering::Relaxed);
                    if let Some(seg) = self.segment(tenant_slot) {
                        // Before the slot is live: a scan that finds it
                        // live reaches it.
                        seg.header()
                            .claimed
                            .fetch_max(p - slots.start + 1, Ordering::AcqRel);
                    }
                    slot.state.store(PROC_LIVE, Ordering::Release);
                    return Ok(p);
                }
            }
            if round == 0 {
                self.reclaim_dead();
            }
        }
        Err(TableError::NoProcessSlot(slots.len() as u32))
    }

    /// Attaches the calling process to the table as a member of `tenant`
    /// (embedded mode, or a shared table used without a coordinator).
    ///
    /// # Errors
    /// [`TableError::Coordinated`] on a table a coordinator keeps (unless
    /// this is the coordinator's own view of it): there a process's tenant
    /// is what the coordinator decides from its credentials.
    pub fn attach(&self, tenant: TenantId) -> Result<TenantHandle, TableError> {
        if self.is_coordinated() && !self.inner.policy.writable() {
            return Err(TableError::Coordinated);
        }
        let me = ProcessId::current().ok_or_else(|| TableError::NotOurSlot {
            slot: 0,
            reason: "cannot read this process's start time from /proc".into(),
        })?;
        let process = self.claim(tenant, me, true)?;
        TenantHandle::new(self.clone(), tenant, process)
    }

    /// Takes over the process slot a coordinator claimed for this process,
    /// once: a second handle of the slot would free it when dropped while
    /// the first still counts on it (clone the handle instead).
    pub fn adopt(&self, tenant: TenantId, process_slot: u32) -> Result<TenantHandle, TableError> {
        let me = ProcessId::current().ok_or_else(|| TableError::NotOurSlot {
            slot: process_slot,
            reason: "cannot read this process's start time from /proc".into(),
        })?;
        self.adopt_as(tenant, process_slot, me)
    }

    /// [`adopt`](Self::adopt) a slot the coordinator recorded as `me`: this
    /// process as the coordinator sees it, whose pid differs from this
    /// process's own when the two are in different PID namespaces (the
    /// start time is the same: it is counted from boot).
    pub(crate) fn adopt_as(
        &self,
        tenant: TenantId,
        process_slot: u32,
        me: ProcessId,
    ) -> Result<TenantHandle, TableError> {
        if process_slot >= self.inner.processes {
            return Err(TableError::NotOurSlot {
                slot: process_slot,
                reason: format!("the table has {} process slots", self.inner.processes),
            });
        }
        let own_start = ProcessId::current().map(|p| p.start_time);
        if own_start != Some(me.start_time) {
            return Err(TableError::NotOurSlot {
                slot: process_slot,
                reason: format!(
                    "it was claimed for a process started at {}, this one started at {own_start:?}",
                    me.start_time
                ),
            });
        }
        let slot = self
            .process_of(process_slot)
            .ok_or_else(|| TableError::NotOurSlot {
                slot: process_slot,
                reason: "its tenant's state was not handed to this process".into(),
            })?;
        let state = slot.state.load(Ordering::Acquire);
        let holder = slot.occupant();
        if state != PROC_LIVE || holder != me {
            return Err(TableError::NotOurSlot {
                slot: process_slot,
                reason: format!(
                    "it holds pid {} (state {state}), this is pid {}",
                    holder.pid, me.pid
                ),
            });
        }
        let expected = self
            .snapshot()?
            .slot_of(tenant)
            .ok_or(TableError::UnknownTenant(tenant))?;
        if slot.tenant_slot.load(Ordering::Relaxed) != expected {
            return Err(TableError::NotOurSlot {
                slot: process_slot,
                reason: format!("it belongs to another tenant than {tenant}"),
            });
        }
        if slot
            .adopted
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Err(TableError::NotOurSlot {
                slot: process_slot,
                reason: "a handle of this process already holds it; clone that handle".into(),
            });
        }
        TenantHandle::new(self.clone(), tenant, process_slot).inspect_err(|_| {
            slot.adopted.store(0, Ordering::Release);
        })
    }

    /// Per-tenant usage, for display.
    pub fn usage(&self) -> Result<Vec<TenantUsage>, TableError> {
        let snapshot = self.snapshot()?;
        // One pass over the process slots counts every tenant's processes
        // (a pass per tenant cost tenants x processes).
        let mut processes: HashMap<u32, u32> = HashMap::new();
        for (slot, _) in self.live_processes() {
            *processes.entry(slot).or_default() += 1;
        }
        let mut out: Vec<TenantUsage> = snapshot
            .policy
            .tenants
            .iter()
            .filter_map(|t| {
                let slot = snapshot.slot_of(t.id)?;
                self.state_of(slot)?;
                let processes = processes.get(&slot).copied().unwrap_or(0);
                Some(TenantUsage::read(self, t, slot, processes))
            })
            .collect();
        out.sort_by_key(|u| u.tenant);
        Ok(out)
    }

    /// What the coordinator's fair-rate computation reads of tenant slot
    /// `slot`: bytes posted so far, bytes waiting in backlogs, and the
    /// bytes its windows judged and found over target, and work requests
    /// posted. Five loads, nothing allocated (it runs every few
    /// milliseconds).
    pub(crate) fn demand_counters(&self, slot: u32) -> DemandCounters {
        let Some(st) = self.state_of(slot) else {
            return DemandCounters::default();
        };
        let l = |w: &AtomicU64| w.load(Ordering::Relaxed);
        DemandCounters {
            posted: l(&st.bytes_posted),
            backlog: l(&st.backlog_bytes),
            judged: l(&st.judged_bytes),
            over_target: l(&st.over_target_bytes),
            wrs: l(&st.wrs_posted),
        }
    }

    /// How many process slots hold a live process (as last recorded; no
    /// `/proc` read): one pass over the process slots.
    pub fn live_process_count(&self) -> u32 {
        self.mapped_processes()
            .filter(|&p| self.process_slot(p).state.load(Ordering::Acquire) == PROC_LIVE)
            .count() as u32
    }

    /// The processes attached as tenants (as last recorded; no `/proc`
    /// read), each with its tenant: on a coordinator's table, the
    /// processes it registered, with the pids it recorded. A tenant's
    /// process sees only its own tenant's.
    pub fn attached_processes(&self) -> Vec<(TenantId, ProcessId)> {
        let last = self.inner.capacity.saturating_sub(1);
        self.live_processes()
            .into_iter()
            .map(|(slot, process)| {
                let id = self.policy_slot(slot.min(last)).id.load(Ordering::Relaxed);
                (TenantId(id), process)
            })
            .collect()
    }

    /// Live processes attached to each tenant slot.
    pub(crate) fn live_processes(&self) -> Vec<(u32, ProcessId)> {
        self.mapped_processes()
            .map(|p| self.process_slot(p))
            .filter(|p| p.state.load(Ordering::Acquire) == PROC_LIVE)
            .map(|p| {
                (
                    p.tenant_slot.load(Ordering::Relaxed),
                    ProcessId {
                        pid: p.pid.load(Ordering::Relaxed),
                        start_time: p.start_time.load(Ordering::Relaxed),
                    },
                )
            })
            .collect()
    }
}

/// Resources returned from a dead process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimed {
    /// The process that died.
    pub process: ProcessId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Queue pairs returned.
    pub qps: u64,
    /// Memory-region bytes returned.
    pub mr_bytes: u64,
}

fn check_sizes(capacity: u32, processes: u32) -> Result<(), TableError> {
    if !(1..=MAX_TENANTS).contains(&capacity) {
        return Err(TableError::OutOfRange {
            region: "policy",
            field: "capacity".into(),
            value: capacity.into(),
            range: "1..=65536",
        });
    }
    if !(1..=MAX_PROCESSES).contains(&processes) {
        return Err(TableError::OutOfRange {
            region: "state",
            field: "process_slots".into(),
            value: processes.into(),
            range: "1..=65536",
        });
    }
    Ok(())
}

/// A process-local mapping holding a copy of `bytes` (a trailing partial
/// word is left out: validation reports the region as truncated).
fn copy(bytes: &[u8]) -> Result<Mapping, TableError> {
    let map = Mapping::anonymous(bytes.len()).map_err(|e| io_err("mmap", "(bytes)", e))?;
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: an AtomicU64 inside the mapping (bounds checked by `get`).
        match unsafe { map.get::<AtomicU64>(i * 8) } {
            Some(w) => w.store(u64::from_le_bytes(word), Ordering::Relaxed),
            None => break,
        }
    }
    Ok(map)
}

/// The bytes of `map`, word by word.
fn dump(map: &Mapping) -> Vec<u8> {
    let mut out = Vec::with_capacity(map.len());
    for i in 0..map.len() / 8 {
        // SAFETY: an AtomicU64 inside the mapping (bounds checked by `get`).
        let w = unsafe { map.get::<AtomicU64>(i * 8) }.expect("in bounds");
        out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    out
}

/// Process slots per tenant state file that policy region `pmap` names
/// (0: not a coordinated table, or not a policy region).
fn split_processes(pmap: &Mapping) -> u32 {
    header::<PolicyHeader>(pmap, "policy")
        .map_or(0, |h| h.segment_processes.load(Ordering::Relaxed))
}

/// Policy slot `slot` of region `pmap`, if it lies inside it.
fn raw_policy_slot(pmap: &Mapping, slot: u32) -> Option<&PolicySlot> {
    // SAFETY: all atomics; `get` checks bounds and alignment.
    unsafe { pmap.get(POLICY_HEADER + slot as usize * POLICY_SLOT) }
}

/// A coordinated table's sizes: `capacity` tenant files of `per_tenant`
/// process slots, whose process slots together fit in a `u32`.
fn check_split_sizes(capacity: u32, per_tenant: u32) -> Result<(), TableError> {
    check_sizes(capacity, per_tenant)?;
    if u32::try_from(u64::from(capacity) * u64::from(per_tenant)).is_err() {
        return Err(TableError::OutOfRange {
            region: "policy",
            field: "segment_processes".into(),
            value: per_tenant.into(),
            range: "capacity x process slots per tenant below 2^32",
        });
    }
    Ok(())
}

/// A region's header: `T` is [`PolicyHeader`], [`StateHeader`] or [`SegmentHeader`].
fn header<'m, T: Header>(map: &'m Mapping, region: &'static str) -> Result<&'m T, TableError> {
    // SAFETY: both header types are made only of atomics; `get` checks
    // bounds and alignment.
    let h = unsafe { map.get::<T>(0) }.ok_or(TableError::Truncated {
        region,
        expected: std::mem::size_of::<T>(),
        actual: map.len(),
    })?;
    let magic = h.magic().load(Ordering::Acquire);
    if magic != T::MAGIC {
        return Err(TableError::BadMagic {
            region,
            found: magic,
        });
    }
    let version = h.version().load(Ordering::Relaxed);
    if version != VERSION {
        return Err(TableError::UnsupportedVersion {
            region,
            found: version,
            supported: VERSION,
        });
    }
    Ok(h)
}

/// What the regions' headers share.
trait Header {
    const MAGIC: u64;
    fn magic(&self) -> &AtomicU64;
    fn version(&self) -> &std::sync::atomic::AtomicU32;
}

/// Implements [`Header`] for a header type with `magic` and `version`
/// fields.
macro_rules! header {
    ($($t:ty => $magic:expr),* $(,)?) => {$(
        impl Header for $t {
            const MAGIC: u64 = $magic;
            fn magic(&self) -> &AtomicU64 {
                &self.magic
            }
            fn version(&self) -> &std::sync::atomic::AtomicU32 {
                &self.version
            }
        }
    )*};
}

header!(
    PolicyHeader => POLICY_MAGIC,
    StateHeader => STATE_MAGIC,
    SegmentHeader => SEGMENT_MAGIC,
);

/// Fails unless the region holds at least `need` bytes.
fn check_len(map: &Mapping, region: &'static str, need: usize) -> Result<(), TableError> {
    if map.len() < need {
        return Err(TableError::Truncated {
            region,
            expected: need,
            actual: map.len(),
        });
    }
    Ok(())
}

/// Checks the policy header and returns the capacity and the shared clock.
fn validate_policy_region(map: &Mapping) -> Result<(u32, SharedClock), TableError> {
    const R: &str = "policy";
    let h: &PolicyHeader = header(map, R)?;
    let sizes = [
        ("header_size", &h.header_size, POLICY_HEADER),
        ("slot_size", &h.slot_size, POLICY_SLOT),
    ];
    for (field, word, expected) in sizes {
        expect_field(R, field, word.load(Ordering::Relaxed), expected)?;
    }
    let capacity = h.capacity.load(Ordering::Relaxed);
    check_sizes(capacity, 1)?;
    check_len(map, R, policy_len(capacity))?;
    let clock = SharedClock::from_params(
        h.clock_raw0.load(Ordering::Relaxed),
        h.clock_ns0.load(Ordering::Relaxed),
        h.clock_mult.load(Ordering::Relaxed),
    )
    .map_err(|problem| TableError::Clock { problem })?;
    Ok((capacity, clock))
}

/// Checks the state header against the policy's capacity and returns the
/// number of process slots.
fn validate_state_region(map: &Mapping, capacity: u32) -> Result<u32, TableError> {
    const R: &str = "state";
    let h: &StateHeader = header(map, R)?;
    let sizes = [
        ("header_size", &h.header_size, STATE_HEADER),
        ("slot_size", &h.slot_size, STATE_SLOT),
        ("process_slot_size", &h.process_slot_size, PROCESS_SLOT),
        ("capacity", &h.capacity, capacity as usize),
    ];
    for (field, word, expected) in sizes {
        expect_field(R, field, word.load(Ordering::Relaxed), expected)?;
    }
    let processes = h.process_slots.load(Ordering::Relaxed);
    check_sizes(capacity, processes)?;
    check_len(map, R, state_len(capacity, processes))?;
    Ok(processes)
}

/// Checks one tenant's state file of a coordinated table with
/// `per_tenant` process slots per tenant and `capacity` tenant slots;
/// returns the tenant slot it says it is.
fn validate_segment(map: &Mapping, per_tenant: u32, capacity: u32) -> Result<u32, TableError> {
    const R: &str = "tenant state";
    let h: &SegmentHeader = header(map, R)?;
    expect_field(
        R,
        "process_slots",
        h.process_slots.load(Ordering::Relaxed),
        per_tenant as usize,
    )?;
    let slot = h.tenant_slot.load(Ordering::Relaxed);
    if slot >= capacity {
        return Err(TableError::OutOfRange {
            region: R,
            field: "tenant_slot".into(),
            value: slot.into(),
            range: "below the table's capacity",
        });
    }
    check_len(map, R, segment_len(per_tenant))?;
    Ok(slot)
}

fn expect_field(
    region: &'static str,
    field: &'static str,
    found: u32,
    expected: usize,
) -> Result<(), TableError> {
    if found as usize != expected {
        return Err(TableError::Mismatch {
            region,
            field,
            found: found.into(),
            expected: expected as u64,
        });
    }
    Ok(())
}

/// One policy slot as read under the seqlock (not yet validated).
struct RawSlot {
    slot: u32,
    id: u32,
    class: u32,
    weight: u32,
    max_qps: u32,
    max_outstanding_wr: u32,
    max_mr_bytes: u64,
    name: [u8; NAME_BYTES],
    caps: [u64; 8],
    flags: u32,
    piece_bytes: u64,
    queue_bytes: u64,
}

impl RawSlot {
    fn load(slot: u32, s: &PolicySlot) -> RawSlot {
        let mut name = [0u8; NAME_BYTES];
        for (i, w) in s.name.iter().enumerate() {
            name[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        RawSlot {
            slot,
            id: s.id.load(Ordering::Relaxed),
            class: s.class.load(Ordering::Relaxed),
            weight: s.weight.load(Ordering::Relaxed),
            max_qps: s.max_qps.load(Ordering::Relaxed),
            max_outstanding_wr: s.max_outstanding_wr.load(Ordering::Relaxed),
            max_mr_bytes: s.max_mr_bytes.load(Ordering::Relaxed),
            name,
            caps: std::array::from_fn(|i| s.caps[i].load(Ordering::Relaxed)),
            flags: s.flags.load(Ordering::Relaxed),
            piece_bytes: s.piece_bytes.load(Ordering::Relaxed),
            queue_bytes: s.queue_bytes.load(Ordering::Relaxed),
        }
    }
}

fn write_slot(s: &PolicySlot, t: &TenantEntry, policy: &Policy) {
    s.id.store(t.id.0, Ordering::Relaxed);
    s.class.store(
        match t.class {
            TrafficClass::Latency => 0,
            TrafficClass::Bulk => 1,
        },
        Ordering::Relaxed,
    );
    s.weight.store(t.schedule.weight, Ordering::Relaxed);
    s.max_qps.store(t.max_qps, Ordering::Relaxed);
    s.max_outstanding_wr
        .store(t.max_outstanding_wr, Ordering::Relaxed);
    s.max_mr_bytes.store(t.max_mr_bytes, Ordering::Relaxed);
    let mut name = [0u8; NAME_BYTES];
    let bytes = t.name.as_bytes();
    let n = bytes.len().min(NAME_BYTES - 1);
    name[..n].copy_from_slice(&bytes[..n]);
    for (i, w) in s.name.iter().enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&name[i * 8..i * 8 + 8]);
        w.store(u64::from_le_bytes(word), Ordering::Relaxed);
    }
    for (at, cap) in [
        (CAP_BYTES, t.schedule.byte_cap),
        (CAP_WRS, t.schedule.wr_cap),
        (CAP_QP_CREATE, t.qp_create_rate),
        (CAP_MR_REG, t.mr_reg_rate),
    ] {
        let (rate, burst) = cap.map_or((0, 0), |c| (c.per_second, c.burst));
        s.caps[at].store(rate, Ordering::Relaxed);
        s.caps[at + 1].store(burst, Ordering::Relaxed);
    }
    let protection = policy.protection_for(t);
    s.piece_bytes
        .store(protection.map_or(0, |p| p.piece_bytes), Ordering::Relaxed);
    s.queue_bytes
        .store(protection.map_or(0, |p| p.queue_bytes), Ordering::Relaxed);
    let exempt = policy.exempt.contains(&t.name);
    s.flags.store(
        SLOT_IN_USE | if exempt { SLOT_EXEMPT } else { 0 },
        Ordering::Relaxed,
    );
}

/// The protection slot `r` of a policy with latency bound `bound` (0:
/// none) publishes, checked: both words 0 (not held to a bound), or
/// settings that fit the bound.
fn slot_protection(r: &RawSlot, bound: u64) -> Result<Option<Protection>, TableError> {
    const R: &str = "policy";
    if r.piece_bytes == 0 && r.queue_bytes == 0 {
        return Ok(None);
    }
    let field = |what: &str| format!("slot {} {what}", r.slot);
    if bound == 0 {
        return Err(TableError::OutOfRange {
            region: R,
            field: field("piece_bytes"),
            value: r.piece_bytes,
            range: "0 in a policy with no latency bound",
        });
    }
    let p = Protection {
        bound_bytes: bound,
        piece_bytes: r.piece_bytes,
        queue_bytes: r.queue_bytes,
    };
    p.validate().map_err(|_| TableError::OutOfRange {
        region: R,
        field: field("piece_bytes and queue_bytes"),
        value: r.piece_bytes,
        range: "a piece and a half and the queue allowance within the latency bound",
    })?;
    Ok(Some(p))
}

/// Turns raw slots into a validated policy.
fn decode(
    generation: u64,
    link: u64,
    interval: u32,
    count: u32,
    bound: u64,
    raw: Vec<RawSlot>,
) -> Result<PolicySnapshot, TableError> {
    const R: &str = "policy";
    if count as usize != raw.len() {
        return Err(TableError::Mismatch {
            region: R,
            field: "tenant_count",
            found: count.into(),
            expected: raw.len() as u64,
        });
    }
    let mut tenants = Vec::with_capacity(raw.len());
    let mut slots = HashMap::with_capacity(raw.len());
    let mut protections = HashMap::new();
    let mut exempt = Vec::new();
    for r in raw {
        let class = match r.class {
            0 => TrafficClass::Latency,
            1 => TrafficClass::Bulk,
            v => {
                return Err(TableError::OutOfRange {
                    region: R,
                    field: format!("slot {} class", r.slot),
                    value: v.into(),
                    range: "0 (latency) or 1 (bulk)",
                })
            }
        };
        let len = r.name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
        let name = std::str::from_utf8(&r.name[..len])
            .map_err(|_| TableError::OutOfRange {
                region: R,
                field: format!("slot {} name", r.slot),
                value: len as u64,
                range: "UTF-8 text",
            })?
            .to_string();
        let cap = |at: usize| {
            (r.caps[at] != 0).then_some(RateLimit {
                per_second: r.caps[at],
                burst: r.caps[at + 1],
            })
        };
        let mut t = TenantEntry::new(TenantId(r.id), name);
        t.class = class;
        t.schedule.weight = r.weight;
        t.max_qps = r.max_qps;
        t.max_outstanding_wr = r.max_outstanding_wr;
        t.max_mr_bytes = r.max_mr_bytes;
        t.schedule.byte_cap = cap(CAP_BYTES);
        t.schedule.wr_cap = cap(CAP_WRS);
        t.qp_create_rate = cap(CAP_QP_CREATE);
        t.mr_reg_rate = cap(CAP_MR_REG);
        slots.insert(t.id, r.slot);
        if r.flags & SLOT_EXEMPT != 0 {
            exempt.push((t.id, t.name.clone()));
        }
        if let Some(p) = slot_protection(&r, bound)? {
            protections.insert(t.id, p);
        }
        tenants.push(t);
    }
    tenants.sort_by_key(|t| t.id);
    exempt.sort();
    let policy = Policy {
        link: LinkConfig {
            capacity_bytes_per_sec: link,
            recompute_interval_ms: interval,
            latency_bound: (bound != 0).then_some(bound),
        },
        tenants,
        exempt: exempt.into_iter().map(|(_, name)| name).collect(),
    };
    policy.validate()?;
    // A bulk tenant the bound holds must have its settings published: a
    // slot that says nothing would let its queue pairs go unprotected.
    if let Some(t) = policy
        .tenants
        .iter()
        .find(|t| policy.protection_for(t).is_some() && !protections.contains_key(&t.id))
    {
        return Err(TableError::OutOfRange {
            region: R,
            field: format!("slot {} piece_bytes", slots[&t.id]),
            value: 0,
            range: "the piece size of a tenant the latency bound holds (above 0)",
        });
    }
    Ok(PolicySnapshot {
        generation,
        policy,
        slots,
        protections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TenantEntry;

    #[test]
    fn a_new_process_with_a_dead_ones_pid_is_not_confused_with_it() {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t")],
        );
        let table = QuotaTable::embedded(&policy).unwrap();
        let me = ProcessId::current().unwrap();
        // A slot left by an earlier process that had our pid: same pid,
        // other start time. It held 2 QPs and 4 KiB.
        let stale = ProcessId {
            pid: me.pid,
            start_time: me.start_time.wrapping_sub(1),
        };
        let slot = table.claim_process_slot(TenantId(1), stale).unwrap();
        let st = table.tenant_state(0);
        st.qps.store(2, Ordering::Relaxed);
        st.mr_bytes.store(4096, Ordering::Relaxed);
        table.process_slot(slot).lanes[0]
            .qps
            .store(2, Ordering::Relaxed);
        // Taken on one thread, partly given back on another: lanes add up.
        table.process_slot(slot).lanes[3]
            .mr_bytes
            .store(8192, Ordering::Relaxed);
        table.process_slot(slot).lanes[5]
            .mr_bytes
            .store(4096u64.wrapping_neg(), Ordering::Relaxed);
        // We (the live process with that pid) hold one QP of our own.
        let live = table.attach(TenantId(1)).unwrap();
        let permit = live.acquire_qp().unwrap();

        let reclaimed = table.reclaim_dead();
        assert_eq!(reclaimed.len(), 1, "only the stale slot is reclaimed");
        assert_eq!(reclaimed[0].process, stale);
        assert_eq!((reclaimed[0].qps, reclaimed[0].mr_bytes), (2, 4096));
        let usage = &table.usage().unwrap()[0];
        assert_eq!((usage.qps.0, usage.mr_bytes.0, usage.processes), (1, 0, 1));
        assert!(
            table.reclaim_dead().is_empty(),
            "the live process is left alone"
        );
        drop(permit);
        assert_eq!(table.usage().unwrap()[0].qps.0, 0);
    }

    /// A tenant's state file as a registered process gets it validates
    /// against its policy, and each way of getting it wrong is an error,
    /// never a panic: another magic, another count of process slots, a
    /// tenant slot past the table's, too few bytes, or a policy that is
    /// not a coordinated table's.
    #[test]
    fn a_tenant_state_file_is_validated_against_its_policy() {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            vec![
                TenantEntry::new(TenantId(7), "seven").with_max_qps(3),
                TenantEntry::new(TenantId(8), "eight"),
            ],
        );
        let (p, seg) = QuotaTable::sample_tenant_bytes(&policy, 4, 8).unwrap();
        assert_eq!(seg.len(), segment_len(8));
        let usage = QuotaTable::validate_tenant_bytes(&p, &seg).unwrap();
        let seen: Vec<(TenantId, u64)> = usage.iter().map(|u| (u.tenant, u.qps.1)).collect();
        assert_eq!(seen, [(TenantId(7), 3)], "slot 0's tenant alone");

        let word = |bytes: &[u8], at: usize, value: u32| {
            let mut b = bytes.to_vec();
            b[at..at + 4].copy_from_slice(&value.to_le_bytes());
            b
        };
        let errors = [
            QuotaTable::validate_tenant_bytes(&p, &word(&seg, 0, 1)),
            QuotaTable::validate_tenant_bytes(&p, &word(&seg, 16, 9)),
            QuotaTable::validate_tenant_bytes(&p, &word(&seg, 12, 4)),
            QuotaTable::validate_tenant_bytes(&p, &seg[..seg.len() - 8]),
            QuotaTable::validate_tenant_bytes(&word(&p, 52, 0), &seg),
            QuotaTable::validate_tenant_bytes(&p, &[]),
        ];
        let shown: Vec<String> = errors
            .into_iter()
            .map(|r| r.expect_err("refused").to_string())
            .collect();
        assert!(shown[0].contains("not an mtrdma quota table"), "{shown:?}");
        assert!(
            shown[1].contains("process_slots = 9, expected 8"),
            "{shown:?}"
        );
        assert!(shown[2].contains("tenant_slot = 4"), "{shown:?}");
        assert!(shown[3].contains("truncated"), "{shown:?}");
        assert!(shown[4].contains("process_slots"), "{shown:?}");
        assert!(shown[5].contains("truncated"), "{shown:?}");
    }

    fn one_tenant() -> TableOwner {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t")],
        );
        QuotaTable::embedded(&policy).unwrap()
    }

    /// A process found dead in a slot, and before the slot is taken, the
    /// slot reclaimed by another process and claimed by a live one: the
    /// reclaim that comes late takes nothing from the live one.
    #[test]
    fn a_slot_claimed_again_between_the_look_and_the_reclaim_is_left_alone() {
        let table = one_tenant();
        let me = ProcessId::current().unwrap();
        let dead = ProcessId {
            pid: me.pid,
            start_time: me.start_time.wrapping_sub(1),
        };
        let p = table.claim_process_slot(TenantId(1), dead).unwrap();
        // The other reclaimer, then the live process in the freed slot.
        assert_eq!(table.reclaim_dead().len(), 1);
        let live = table.attach(TenantId(1)).unwrap();
        assert_eq!(table.process_slot(p).occupant(), me, "the same slot");
        let permit = live.acquire_qp().unwrap();
        // The late reclaim of what it saw.
        assert_eq!(table.reclaim_slot(p, dead), None);
        let slot = table.process_slot(p);
        assert_eq!(slot.state.load(Ordering::Acquire), PROC_LIVE);
        assert_eq!(slot.held(), (1, 0), "the live process keeps its QP");
        assert_eq!(table.usage().unwrap()[0].qps.0, 1);
        drop(permit);
        assert_eq!(table.usage().unwrap()[0].qps.0, 0);
    }

    /// The view counts each tenant's live processes (in one pass).
    #[test]
    fn usage_counts_each_tenants_processes() {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            (1..=3)
                .map(|i| TenantEntry::new(TenantId(i), format!("t{i}")))
                .collect(),
        );
        let table = QuotaTable::embedded(&policy).unwrap();
        for (p, tenant) in [1, 1, 3, 1].into_iter().enumerate() {
            let who = ProcessId {
                pid: 4_000_000 + p as u32,
                start_time: 1,
            };
            table.claim_process_slot(TenantId(tenant), who).unwrap();
        }
        let counts: Vec<u32> = table.usage().unwrap().iter().map(|u| u.processes).collect();
        assert_eq!(counts, [3, 0, 1]);
        assert_eq!(table.live_process_count(), 4);
    }

    /// A slot a coordinator claimed for this process is adopted once: a
    /// second handle would free it when dropped, under the first.
    #[test]
    fn a_claimed_slot_is_adopted_once() {
        let table = one_tenant();
        let me = ProcessId::current().unwrap();
        let p = table.claim_process_slot(TenantId(1), me).unwrap();
        let first = table.adopt(TenantId(1), p).unwrap();
        match table.adopt(TenantId(1), p) {
            Err(TableError::NotOurSlot { reason, .. }) => {
                assert!(reason.contains("already holds it"), "{reason}");
            }
            other => panic!("adopted twice: {other:?}"),
        }
        // Attaching claims a slot of its own, already held.
        let attached = table.attach(TenantId(1)).unwrap();
        let q = (0..table.process_slots())
            .find(|&q| q != p && table.process_slot(q).state.load(Ordering::Acquire) == PROC_LIVE)
            .unwrap();
        assert!(table.adopt(TenantId(1), q).is_err());
        drop(first);
        assert_eq!(
            table.process_slot(p).state.load(Ordering::Acquire),
            PROC_FREE
        );
        drop(attached);
    }

    /// A tenant taken out by one policy and put back by the next, while
    /// its processes still hold its old slot, comes back to that slot: a
    /// second slot would give it its quota twice.
    #[test]
    fn a_tenant_removed_and_added_back_keeps_its_slot_and_what_it_holds() {
        let mut limited = TenantEntry::new(TenantId(2), "limited");
        limited.max_qps = 1;
        let both = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t"), limited],
        );
        let only_first = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t")],
        );
        let table = QuotaTable::embedded(&both).unwrap();
        let before = table.snapshot().unwrap().slot_of(TenantId(2));
        let holder = table.attach(TenantId(2)).unwrap();
        let permit = holder.acquire_qp().unwrap();
        table.publish(&only_first).unwrap();
        table.publish(&both).unwrap();
        assert_eq!(table.snapshot().unwrap().slot_of(TenantId(2)), before);
        let newcomer = table.attach(TenantId(2)).unwrap();
        assert!(
            newcomer.acquire_qp().is_err(),
            "max_qps = 1, and its one QP is held"
        );
        drop(permit);
        assert!(newcomer.acquire_qp().is_ok());
    }

    /// A process that died between taking a process slot and making it
    /// live left the slot claiming: it is freed, not lost for good.
    #[test]
    fn a_claim_whose_claimer_died_is_freed() {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t")],
        );
        let table = QuotaTable::embedded_with_capacity(&policy, 1, 1).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        table
            .process_slot(0)
            .state
            .store(PROC_CLAIMING_BY | gone, Ordering::Release);
        let handle = table
            .attach(TenantId(1))
            .expect("the only slot, left mid-claim, is freed and claimed");
        // A claim in progress (its claimer alive) is not taken.
        drop(handle);
        let alive = PROC_CLAIMING_BY | std::process::id();
        table.process_slot(0).state.store(alive, Ordering::Release);
        assert!(matches!(
            table.attach(TenantId(1)),
            Err(TableError::NoProcessSlot(1))
        ));
        assert_eq!(table.process_slot(0).state.load(Ordering::Acquire), alive);
    }

    #[test]
    fn lanes_add_up_across_threads_that_take_and_give_back() {
        let policy = Policy::new(
            LinkConfig::new(1_000_000),
            vec![TenantEntry::new(TenantId(1), "t").with_max_mr_bytes(1 << 30)],
        );
        let table = QuotaTable::embedded(&policy).unwrap();
        let handle = table.attach(TenantId(1)).unwrap();
        // More threads than single-writer lanes: the last ones share a lane.
        let permits: Vec<OwnedMrPermit> = std::thread::scope(|s| {
            (0..24u64)
                .map(|i| {
                    let handle = &handle;
                    s.spawn(move || {
                        (0..5)
                            .map(|j| handle.acquire_mr(1000 + i * 10 + j).unwrap().into_owned())
                            .collect::<Vec<_>>()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let expected: u64 = permits.iter().map(OwnedMrPermit::bytes).sum();
        let process = table.process_slot(0);
        assert_eq!(process.held().1, expected);
        assert_eq!(table.usage().unwrap()[0].mr_bytes.0, expected);
        // Give them back on other threads than took them.
        let mut permits = permits;
        std::thread::scope(|s| {
            while !permits.is_empty() {
                let batch: Vec<_> = permits.drain(..permits.len().min(7)).collect();
                s.spawn(move || drop(batch));
            }
        });
        assert_eq!(process.held(), (0, 0));
        assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 0);
    }
}
