//! The policy: publishing it (the owner), reading it back under the
//! seqlock as a snapshot, and what the coordinator publishes with it.

use super::*;

impl TableOwner {
    pub(super) fn of(table: QuotaTable) -> TableOwner {
        TableOwner { table }
    }

    /// The table as its tenants see it (a clone sharing the mappings).
    pub fn table(&self) -> QuotaTable {
        self.table.clone()
    }

    /// Publishes `policy`. Tenants already in the table keep their slot
    /// and live state; new tenants get a free slot with fresh state.
    pub fn publish(&self, policy: &Policy) -> Result<(), TableError> {
        // An owner maps the policy writable (every constructor of one does).
        debug_assert!(self.inner.policy.writable());
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
        let start = seqlock::begin_write(&h.seq);
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
        seqlock::end_write(&h.seq, start);
        tracing::info!(
            table = ?self.inner.name,
            generation = start / 2 + 1,
            tenants = policy.tenants.len(),
            "published policy"
        );
        self.snapshot()?;
        Ok(())
    }

    /// Publishes `value` in the policy header's word `word`, on its own
    /// (outside the seqlock).
    fn publish_header_word(&self, word: fn(&PolicyHeader) -> &AtomicU64, value: u64) {
        word(self.policy_header()).store(value, Ordering::Release);
    }

    /// Publishes `value` in the word `word` of tenant slot `slot`, on its
    /// own (outside the seqlock).
    fn publish_slot_word(&self, slot: u32, word: fn(&PolicySlot) -> &AtomicU64, value: u64) {
        word(self.policy_slot(slot)).store(value, Ordering::Release);
    }

    /// Records a coordinator heartbeat (`CLOCK_MONOTONIC` ns).
    pub(crate) fn heartbeat(&self, now_ns: u64) {
        self.publish_header_word(|h| &h.heartbeat_ns, now_ns);
    }

    /// Publishes the link's measured rate in bytes per second (0: not
    /// measured).
    pub(crate) fn set_link_estimate(&self, bytes_per_sec: u64) {
        self.publish_header_word(|h| &h.link_estimate, bytes_per_sec);
    }

    /// Publishes the weights of the tenants whose windows contend for the
    /// link, added up (0 withdraws it).
    pub(crate) fn set_sharing_weight(&self, weights: u32) {
        self.publish_header_word(|h| &h.sharing_weight, u64::from(weights));
    }

    /// Publishes a tenant's fair byte rate (0 withdraws it).
    pub(crate) fn set_fair_rate(&self, slot: u32, bytes_per_sec: u64) {
        self.publish_slot_word(slot, |p| &p.fair_rate, bytes_per_sec);
    }

    /// Publishes the gain on a tenant's delay windows' growth, parts per
    /// million (0 withdraws it).
    pub(crate) fn set_window_gain(&self, slot: u32, ppm: u32) {
        self.publish_slot_word(slot, |p| &p.window_gain, u64::from(ppm));
    }

    /// Publishes a tenant's permit for the one-piece floor
    /// (`mtrdma_sched::piece_floor::Permit::to_word`).
    pub(crate) fn set_floor_permit(&self, slot: u32, word: u64) {
        self.publish_slot_word(slot, |p| &p.floor_permit, word);
    }
}

impl QuotaTable {
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
    pub(super) fn read_snapshot(&self) -> Result<PolicySnapshot, TableError> {
        let h = self.policy_header();
        let (seq, (link, interval, count, bound, raw)) = seqlock::read(&h.seq, 10_000, || {
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
            (link, interval, count, bound, raw)
        })
        .ok_or(TableError::Torn)?;
        decode(seq / 2, link, interval, count, bound, raw)
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
}

/// One policy slot as read under the seqlock (not yet validated).
pub(super) struct RawSlot {
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

pub(super) fn write_slot(s: &PolicySlot, t: &TenantEntry, policy: &Policy) {
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
pub(super) fn slot_protection(r: &RawSlot, bound: u64) -> Result<Option<Protection>, TableError> {
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
pub(super) fn decode(
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
        // Limits across hosts stay with the coordinator: they reach the
        // tenants as their hosts' fair rates.
        cluster: std::sync::Arc::default(),
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
