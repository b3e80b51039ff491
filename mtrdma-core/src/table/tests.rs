//! The table's unit tests.

use super::fixtures::small_link;
use super::*;
use crate::policy::TenantEntry;

#[test]
fn a_new_process_with_a_dead_ones_pid_is_not_confused_with_it() {
    let policy = small_link(vec![TenantEntry::new(TenantId(1), "t")]);
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
    let policy = small_link(vec![
        TenantEntry::new(TenantId(7), "seven").with_max_qps(3),
        TenantEntry::new(TenantId(8), "eight"),
    ]);
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
    let policy = small_link(vec![TenantEntry::new(TenantId(1), "t")]);
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
    let policy = small_link(
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
    let both = small_link(vec![TenantEntry::new(TenantId(1), "t"), limited]);
    let only_first = small_link(vec![TenantEntry::new(TenantId(1), "t")]);
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
    let policy = small_link(vec![TenantEntry::new(TenantId(1), "t")]);
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
    let policy = small_link(vec![
        TenantEntry::new(TenantId(1), "t").with_max_mr_bytes(1 << 30)
    ]);
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

/// A process that dies with bytes in its schedulers' backlogs and work
/// requests outstanding leaves neither behind: reclaiming its slot takes
/// its part off its tenant's demand and outstanding count (a killed
/// sender's backlog would otherwise stay the tenant's demand for good).
#[test]
fn a_dead_process_s_backlog_and_outstanding_requests_are_taken_back() {
    let table = one_tenant();
    let handle = table.attach(TenantId(1)).unwrap();
    handle.add_backlog(1_000_000);
    handle.add_backlog(-400_000);
    let permit = handle.acquire_wrs(5).unwrap();
    let usage = &table.usage().unwrap()[0];
    assert_eq!((usage.backlog_bytes, usage.outstanding_wr), (600_000, 5));
    let p = table
        .mapped_processes()
        .find(|&p| table.process_slot(p).state.load(Ordering::Acquire) == PROC_LIVE)
        .unwrap();
    assert_eq!(table.process_slot(p).gauges(), (600_000, 5));
    // The process "dies": nothing of it runs again (its handle and permit
    // are never dropped), and its slot names a process that is gone.
    std::mem::forget(permit);
    std::mem::forget(handle);
    let slot = table.process_slot(p);
    slot.start_time.store(
        slot.start_time.load(Ordering::Relaxed).wrapping_sub(1),
        Ordering::Relaxed,
    );
    assert_eq!(table.reclaim_dead().len(), 1);
    let usage = &table.usage().unwrap()[0];
    assert_eq!(
        (usage.backlog_bytes, usage.outstanding_wr, usage.processes),
        (0, 0, 0)
    );
    assert_eq!(slot.gauges(), (0, 0), "a reclaimed slot starts empty");
}

/// A handle dropped with backlog its schedulers never took back (and its
/// process alive) returns it too.
#[test]
fn a_dropped_handle_returns_the_backlog_it_left() {
    let table = one_tenant();
    let handle = table.attach(TenantId(1)).unwrap();
    handle.add_backlog(4_096);
    assert_eq!(table.usage().unwrap()[0].backlog_bytes, 4_096);
    drop(handle);
    assert_eq!(table.usage().unwrap()[0].backlog_bytes, 0);
}
