//! A process slot's life: claimed (free to live, the claimer named in the
//! state word while it fills the slot), reclaimed when its process died
//! (live to reclaiming to free), or freed when its claimer died before the
//! slot went live. Every change of owner is a compare-and-exchange on the
//! state word, so that of two processes racing for a slot one wins, and a
//! reclaimer never takes what a newer occupant holds. `loom.rs`
//! model-checks these races.

use std::sync::atomic::Ordering;

use super::layout::{ProcessSlot, PROC_CLAIMING_BY, PROC_FREE, PROC_LIVE, PROC_RECLAIMING};
use crate::procinfo::ProcessId;

/// What a reclaimed slot held: its tenant slot, queue pairs and bytes of
/// memory regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) tenant_slot: u32,
    pub(crate) qps: u64,
    pub(crate) mr_bytes: u64,
    /// Its part of the tenant's backlog and outstanding work requests.
    pub(crate) backlog_bytes: u64,
    pub(crate) outstanding_wr: u64,
}

/// The state word of a claim in progress by process `pid`.
pub(crate) fn claiming(pid: u32) -> u32 {
    PROC_CLAIMING_BY | (pid & !PROC_CLAIMING_BY)
}

impl ProcessSlot {
    /// Claims the slot if it is free: for `process`, a member of tenant
    /// slot `tenant_slot`, by the process whose pid is `claimer` (named in
    /// the state word until the slot is live). `adopted`: a handle holds
    /// the slot from the start. `before_live` runs once the slot is filled
    /// and before it is live (so that a scan finding it live reaches it).
    /// Returns whether this call claimed it.
    pub(crate) fn claim(
        &self,
        claimer: u32,
        process: ProcessId,
        tenant_slot: u32,
        adopted: bool,
        before_live: impl FnOnce(),
    ) -> bool {
        if self
            .state
            .compare_exchange(
                PROC_FREE,
                claiming(claimer),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        self.pid.store(process.pid, Ordering::Relaxed);
        self.start_time.store(process.start_time, Ordering::Relaxed);
        self.tenant_slot.store(tenant_slot, Ordering::Relaxed);
        self.clear();
        self.adopted.store(u64::from(adopted), Ordering::Relaxed);
        before_live();
        self.state.store(PROC_LIVE, Ordering::Release);
        true
    }

    /// Reclaims the slot if it is live and still holds `who`, a process
    /// found dead: `give_back` gets what it held, then the slot is free.
    /// The slot is taken first (live to reclaiming) and its occupant read
    /// again after: since `who` was read, the slot may have been reclaimed
    /// by another process and claimed by a live one, whose resources must
    /// not be taken. Such a slot is given back as it was, and `None`
    /// returned.
    pub(crate) fn reclaim(&self, who: ProcessId, give_back: impl FnOnce(Held)) -> Option<Held> {
        self.state
            .compare_exchange(
                PROC_LIVE,
                PROC_RECLAIMING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .ok()?;
        if self.occupant() != who {
            self.state.store(PROC_LIVE, Ordering::Release);
            return None;
        }
        let tenant_slot = self.tenant_slot.load(Ordering::Relaxed);
        // The process is dead: nobody writes its lanes any more.
        let (qps, mr_bytes) = self.held();
        let (backlog_bytes, outstanding_wr) = self.gauges();
        self.clear();
        let held = Held {
            tenant_slot,
            qps,
            mr_bytes,
            backlog_bytes,
            outstanding_wr,
        };
        give_back(held);
        self.free();
        Some(held)
    }

    /// Frees the slot, found in claiming state `state`, whose claimer died
    /// before it went live (nothing was admitted through it). Returns
    /// whether this call freed it (another may have first).
    pub(crate) fn free_abandoned(&self, state: u32) -> bool {
        if state & PROC_CLAIMING_BY == 0
            || self
                .state
                .compare_exchange(state, PROC_RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        self.clear();
        self.free();
        true
    }

    /// Ends a reclamation: the slot is free for the next claim.
    fn free(&self) {
        self.pid.store(0, Ordering::Relaxed);
        self.state.store(PROC_FREE, Ordering::Release);
    }
}
