//! Process slots: claiming one for a process, attaching and adopting,
//! reclaiming what dead processes held, and usage.

use super::*;

impl QuotaTable {
    /// Whether tenant slot `slot`'s counters hold queue pairs or memory
    /// (none where this process maps no state for it).
    pub(super) fn holds_resources(&self, slot: u32) -> bool {
        self.state_of(slot).is_some_and(|st| {
            st.qps.load(Ordering::Relaxed) != 0 || st.mr_bytes.load(Ordering::Relaxed) != 0
        })
    }

    /// Tenant slots that a live (or claiming) process refers to.
    pub(super) fn referenced_slots(&self) -> std::collections::HashSet<u32> {
        self.mapped_processes()
            .map(|p| self.process_slot(p))
            .filter(|p| p.state.load(Ordering::Acquire) != PROC_FREE)
            .map(|p| p.tenant_slot.load(Ordering::Relaxed))
            .collect()
    }

    pub(super) fn reset_state(&self, slot: u32) {
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
    pub(super) fn reclaim_slot(&self, p: u32, who: ProcessId) -> Option<Reclaimed> {
        let held = self.process_slot(p).reclaim(who, |held| {
            if let Some(st) = self.state_of(held.tenant_slot) {
                handle::sub_saturating(&st.qps, held.qps);
                handle::sub_saturating(&st.mr_bytes, held.mr_bytes);
                // Demand and work requests it will never take back.
                handle::sub_saturating(&st.backlog_bytes, held.backlog_bytes);
                handle::sub_saturating(&st.outstanding_wr, held.outstanding_wr);
            }
        })?;
        let tenant = TenantId(
            self.policy_slot(held.tenant_slot.min(self.inner.capacity - 1))
                .id
                .load(Ordering::Relaxed),
        );
        tracing::info!(
            pid = who.pid,
            %tenant,
            qps = held.qps,
            mr_bytes = held.mr_bytes,
            "reclaimed resources of a dead process"
        );
        Some(Reclaimed {
            process: who,
            tenant,
            qps: held.qps,
            mr_bytes: held.mr_bytes,
        })
    }

    /// Frees process slot `p`, found in claiming state `state`, if the
    /// process claiming it is gone: it died between taking the slot and
    /// making it live, and nothing was admitted through it.
    pub(super) fn free_abandoned_claim(&self, p: u32, state: u32) {
        let claimer = state & !PROC_CLAIMING_BY;
        if crate::procinfo::pid_in_use(claimer) {
            // Still claiming (or its pid was reused: freed once that
            // process is gone).
            return;
        }
        if self.process_slot(p).free_abandoned(state) {
            tracing::warn!(
                slot = p,
                claimer,
                "freed a process slot whose claimer died before finishing the claim"
            );
        }
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
    pub(super) fn claim(
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
        let claimer = std::process::id();
        let slots = self.claimable(tenant_slot);
        for round in 0..2 {
            for p in slots.clone() {
                let Some(slot) = self.process_of(p) else {
                    break;
                };
                let claimed = slot.claim(claimer, process, tenant_slot, adopted, || {
                    if let Some(seg) = self.segment(tenant_slot) {
                        // Before the slot is live: a scan that finds it
                        // live reaches it.
                        seg.header()
                            .claimed
                            .fetch_max(p - slots.start + 1, Ordering::AcqRel);
                    }
                });
                if claimed {
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
