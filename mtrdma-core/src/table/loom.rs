//! The table's protocols between processes, model-checked with loom: every
//! interleaving (within a bound of preemptions) of the threads below, each
//! standing for a process, under the C++ memory model's orderings.
//!
//! ```text
//! RUSTFLAGS="--cfg mtrdma_loom" cargo test -p mtrdma-core --lib --release loom
//! ```
//!
//! `cargo xtask test` runs them (its `loom` stage, with its own target
//! directory). The checks build the protocols' words on the heap with
//! loom's atomics (`sync.rs`) and call the same functions the table does:
//! the seqlock (`seqlock.rs`) and a process slot's claim, reclamation and
//! freeing (`slot.rs`).

use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::Ordering::Relaxed;

use super::layout::{Lane, ProcessSlot, LANES, PROC_FREE, PROC_LIVE};
use super::seqlock;
use super::slot::{claiming, Held};
use super::sync::{AtomicU32, AtomicU64};
use crate::procinfo::ProcessId;

/// Every interleaving with at most this many preemptions (loom's
/// advice: bugs need few).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// A policy's words under the seqlock: two that a reader must see from
/// the same write.
struct Words {
    seq: AtomicU64,
    a: AtomicU64,
    b: AtomicU64,
}

impl Words {
    fn new(seq: u64, a: u64, b: u64) -> Arc<Words> {
        Arc::new(Words {
            seq: AtomicU64::new(seq),
            a: AtomicU64::new(a),
            b: AtomicU64::new(b),
        })
    }

    /// Writes generation `g`: both words `g`.
    fn write(&self, g: u64) {
        let start = seqlock::begin_write(&self.seq);
        self.a.store(g, Relaxed);
        self.b.store(g, Relaxed);
        seqlock::end_write(&self.seq, start);
    }

    fn read(&self, tries: u32) -> Option<(u64, (u64, u64))> {
        seqlock::read(&self.seq, tries, || {
            (self.a.load(Relaxed), self.b.load(Relaxed))
        })
    }
}

#[test]
fn a_seqlock_reader_sees_one_whole_generation_or_tries_again() {
    model(|| {
        let w = Words::new(0, 0, 0);
        let writer = {
            let w = w.clone();
            thread::spawn(move || {
                w.write(1);
                w.write(2);
            })
        };
        if let Some((seq, (a, b))) = w.read(3) {
            assert_eq!(seq % 2, 0, "read under an odd seq");
            assert_eq!((a, b), (seq / 2, seq / 2), "a torn read at seq {seq}");
        }
        writer.join().unwrap();
        assert_eq!(w.read(1), Some((4, (2, 2))));
    });
}

#[test]
fn a_write_its_writer_never_finished_is_never_read() {
    // A writer died in the middle of generation 2 (seq 3), leaving one
    // word written; the next owner writes generation 2 again.
    model(|| {
        let w = Words::new(3, 2, 1);
        assert_eq!(w.read(2), None);
        let writer = {
            let w = w.clone();
            thread::spawn(move || w.write(2))
        };
        if let Some((seq, (a, b))) = w.read(3) {
            assert_eq!((seq, a, b), (4, 2, 2));
        }
        writer.join().unwrap();
    });
}

fn slot() -> Arc<ProcessSlot> {
    let word = || AtomicU64::new(0);
    Arc::new(ProcessSlot {
        state: AtomicU32::new(PROC_FREE),
        pid: AtomicU32::new(0),
        tenant_slot: AtomicU32::new(0),
        next_lane: AtomicU32::new(0),
        start_time: word(),
        adopted: word(),
        backlog_bytes: word(),
        outstanding_wr: word(),
        _reserved: std::array::from_fn(|_| word()),
        lanes: std::array::from_fn::<_, LANES, _>(|_| Lane {
            qps: word(),
            mr_bytes: word(),
        }),
    })
}

/// Runs `f` on a thread of the model with a clone of `s`.
fn on_thread<T: Send + 'static>(
    s: &Arc<ProcessSlot>,
    f: impl FnOnce(Arc<ProcessSlot>) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let s = Arc::clone(s);
    thread::spawn(move || f(s))
}

fn process(pid: u32) -> ProcessId {
    ProcessId {
        pid,
        start_time: 1000 + u64::from(pid),
    }
}

#[test]
fn of_two_processes_claiming_one_free_slot_one_gets_it() {
    model(|| {
        let s = slot();
        let other = on_thread(&s, move |s| s.claim(2, process(2), 7, false, || {}));
        let mine = s.claim(1, process(1), 7, true, || {});
        let theirs = other.join().unwrap();
        assert!(mine != theirs, "claimed by both or by neither");
        let winner = if mine { process(1) } else { process(2) };
        assert_eq!(s.state.load(Relaxed), PROC_LIVE);
        assert_eq!(s.occupant(), winner);
        assert_eq!(s.adopted.load(Relaxed), u64::from(mine));
    });
}

#[test]
fn a_slot_seen_live_shows_all_of_its_claim() {
    model(|| {
        let s = slot();
        let claimer = on_thread(&s, move |s| assert!(s.claim(1, process(1), 7, true, || {})));
        // A reclaimer's or a scan's look, as `reclaim_dead` takes it.
        if s.state.load(std::sync::atomic::Ordering::Acquire) == PROC_LIVE {
            assert_eq!(s.occupant(), process(1));
            assert_eq!(s.tenant_slot.load(Relaxed), 7);
            assert_eq!(s.adopted.load(Relaxed), 1);
        }
        claimer.join().unwrap();
    });
}

/// A live slot of process 1 holding two queue pairs, whose tenant's
/// counter says so.
fn held_by_a_process_that_died() -> (Arc<ProcessSlot>, Arc<AtomicU64>) {
    let s = slot();
    assert!(s.claim(1, process(1), 7, true, || {}));
    s.lanes[0].qps.store(2, Relaxed);
    (s, Arc::new(AtomicU64::new(2)))
}

/// A reclaimer's return of what a dead process held to its tenant.
fn give_back(tenant: &AtomicU64) -> impl FnOnce(Held) + '_ {
    move |held| {
        tenant.fetch_sub(held.qps, Relaxed);
    }
}

#[test]
fn a_late_reclaimer_never_takes_what_the_next_occupant_holds() {
    // Two reclaimers found process 1 dead. One of them reclaims, then
    // process 3 claims the slot and takes five queue pairs; the other
    // reclaimer may come only then.
    model(|| {
        let (s, tenant) = held_by_a_process_that_died();
        let other = {
            let (s, tenant) = (s.clone(), tenant.clone());
            thread::spawn(move || {
                let reclaimed = s.reclaim(process(1), give_back(&tenant));
                let claimed = s.claim(3, process(3), 7, true, || {});
                if claimed {
                    s.lanes[1].qps.store(5, Relaxed);
                    tenant.fetch_add(5, Relaxed);
                }
                (reclaimed, claimed)
            })
        };
        let mine = s.reclaim(process(1), give_back(&tenant));
        let (theirs, claimed) = other.join().unwrap();
        let dead = Held {
            tenant_slot: 7,
            qps: 2,
            mr_bytes: 0,
            backlog_bytes: 0,
            outstanding_wr: 0,
        };
        match (mine, theirs) {
            (Some(h), None) | (None, Some(h)) => assert_eq!(h, dead),
            both => panic!("process 1's slot reclaimed {both:?}"),
        }
        if claimed {
            assert_eq!(s.state.load(Relaxed), PROC_LIVE);
            assert_eq!(s.occupant(), process(3));
            assert_eq!(s.held(), (5, 0));
            assert_eq!(tenant.load(Relaxed), 5);
        } else {
            assert_eq!(s.state.load(Relaxed), PROC_FREE);
            assert_eq!(tenant.load(Relaxed), 0);
        }
    });
}

#[test]
fn a_claim_whose_claimer_died_is_freed_once() {
    // Process 9 died claiming the slot; two reclaimers find it, and one
    // of them then claims the slot for process 3.
    model(|| {
        let s = slot();
        let abandoned = claiming(9);
        s.state.store(abandoned, Relaxed);
        s.pid.store(9, Relaxed);
        let other = on_thread(&s, move |s| {
            let freed = s.free_abandoned(abandoned);
            (freed, s.claim(3, process(3), 7, false, || {}))
        });
        let mine = s.free_abandoned(abandoned);
        let (theirs, claimed) = other.join().unwrap();
        assert!(mine != theirs, "freed by both or by neither");
        if claimed {
            assert_eq!(s.state.load(Relaxed), PROC_LIVE);
            assert_eq!(s.occupant(), process(3));
        } else {
            assert_eq!(s.state.load(Relaxed), PROC_FREE);
            assert_eq!(s.pid.load(Relaxed), 0);
        }
    });
}
