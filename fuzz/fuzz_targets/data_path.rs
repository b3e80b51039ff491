//! Arbitrary sequences of posts (single, batches, requests split into
//! pieces or sent whole), polls, refused posts, failed completions and
//! queue pairs dropped mid-flight, driven through the whole scheduled data
//! path (the verbs engine, its lists of work requests and its selective
//! signaling) on null sinks: two queue pairs with engines of their own and
//! two on one shared engine, one of each with a delay window. The engines
//! run on a manual clock the input moves, so windows, pacing, quiet
//! times, the release of a stalled queue pair's budget and timed wake-ups
//! all happen, and a crash replays exactly. What a user relies on holds:
//!
//! * every request a queue pair accepted completes exactly once, with its
//!   own region (each region carries its request's number), whatever
//!   failed around it; none is lost, none returned twice;
//! * a refused post hands its own region back at once;
//! * when the input ends and the queue pairs are polled, nothing is left
//!   in flight or queued.
#![no_main]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{delay_window, id_of, region, REMOTE};
use libfuzzer_sys::fuzz_target;
use mtrdma_core::{TenantId, TrafficClass};
use mtrdma_sched::{ManualClock, Nanos};
use mtrdma_verbs::testing::{self, HostCompletion, NullScheduled, NullScheduler, NullSink};
use mtrdma_verbs::{ScheduleConfig, SendOp, SharedConfig};

const QPS: usize = 4;

struct Rig {
    clock: Arc<ManualClock>,
    shared: NullScheduler,
    qps: Vec<NullScheduled>,
    /// Per queue pair: requests accepted and not yet completed, by number,
    /// with their regions' lengths.
    open: Vec<HashMap<u64, usize>>,
    next: u64,
}

impl Rig {
    fn new() -> Rig {
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
        let shared = NullScheduler::with_clock(
            SharedConfig {
                chunk_bytes: 1024,
                bulk_bytes_in_flight: 8 << 10,
                stall_after: Duration::from_millis(20),
                ..SharedConfig::default()
            },
            Arc::clone(&clock),
        )
        .expect("a shared engine");
        let mut rig = Rig {
            clock,
            shared,
            qps: Vec::new(),
            open: vec![HashMap::new(); QPS],
            next: 0,
        };
        for q in 0..QPS {
            let qp = rig.make(q);
            rig.qps.push(qp);
        }
        rig
    }

    fn make(&self, q: usize) -> NullScheduled {
        // Queue pairs 1 and 3 keep a delay window.
        let window = (q % 2 == 1).then(|| delay_window(1024));
        let config = ScheduleConfig {
            chunk_bytes: 1024,
            max_pieces_in_flight: 8,
            window,
            ..ScheduleConfig::local(TenantId(q as u32), TrafficClass::Bulk)
        };
        let sink = NullSink::new(q as u32, 16);
        if q < 2 {
            testing::scheduled_with_clock(sink, config, Arc::clone(&self.clock))
                .expect("a queue pair of its own")
        } else {
            self.shared.attach(sink, config).expect("attached")
        }
    }

    fn completed(&mut self, q: usize, done: Vec<HostCompletion>) {
        for c in done {
            let id = id_of(&c.region);
            assert_eq!(c.context, id, "a completion hands back its own region");
            let len = self.open[q]
                .remove(&id)
                .unwrap_or_else(|| panic!("request {id} completed twice or was never accepted"));
            assert_eq!(c.region.len(), len, "request {id}'s region, whole");
        }
    }

    fn poll(&mut self, q: usize) {
        let mut out = Vec::new();
        self.qps[q].poll(&mut out).expect("a null poll");
        self.completed(q, out);
    }

    fn post(&mut self, q: usize, len: usize, whole: bool) {
        let id = self.next;
        self.next += 1;
        let r = region(id, len);
        let len = r.len();
        let op = SendOp::Write(REMOTE);
        let result = if whole {
            self.qps[q].post_send_whole(op, r, 0..len, id)
        } else {
            self.qps[q].post_send(op, r, 0..len, id)
        };
        match result {
            Ok(()) => {
                self.open[q].insert(id, len);
            }
            Err((_, r)) => assert_eq!(id_of(&r), id, "a refused post hands its region back"),
        }
    }

    fn batch(&mut self, q: usize, lens: &[u8]) {
        let requests: Vec<_> = lens
            .iter()
            .map(|&l| {
                let id = self.next;
                self.next += 1;
                let r = region(id, 8 + usize::from(l) * 32);
                let len = r.len();
                (SendOp::Write(REMOTE), r, 0..len, id)
            })
            .collect();
        let ids: Vec<(u64, usize)> = requests
            .iter()
            .map(|(_, r, _, id)| (*id, r.len()))
            .collect();
        match self.qps[q].post_batch(requests) {
            Ok(()) => self.open[q].extend(ids),
            Err((_, refused)) => {
                // The first ones were accepted; the rest came back, in
                // order, each with its own region.
                let accepted = ids.len() - refused.len();
                self.open[q].extend(ids[..accepted].iter().copied());
                for ((context, r), (id, _)) in refused.iter().zip(&ids[accepted..]) {
                    assert_eq!((*context, id_of(r)), (*id, *id));
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rig = Rig::new();
    let mut bytes = data.iter().copied();
    while let (Some(op), Some(arg)) = (bytes.next(), bytes.next()) {
        let q = usize::from(arg) % QPS;
        let n = usize::from(arg / 4);
        match op % 10 {
            0 => rig.post(q, 8 + n * 64, false),
            1 => {
                let lens: Vec<u8> = bytes.by_ref().take(1 + n % 12).collect();
                rig.batch(q, &lens);
            }
            2 | 3 => rig.poll(q),
            4 => rig.qps[q].with_sink(|s| s.refuse_after(n % 20)),
            5 => rig.qps[q].with_sink(|s| s.fail_completion_after(n % 20)),
            6 => rig.post(q, 8 + n * 64, true),
            // Time passes: up to about 3 ms, or up to 63 ms (past a
            // stalled queue pair's 20 ms).
            7 => rig.clock.advance(Nanos::from_micros(n as u64 * 50)),
            8 => rig.clock.advance(Nanos::from_millis(n as u64)),
            _ => {
                // Dropped with work in flight: its requests are flushed and
                // their regions freed, none handed back.
                let qp = rig.make(q);
                drop(std::mem::replace(&mut rig.qps[q], qp));
                rig.open[q].clear();
            }
        }
    }
    // Everything accepted completes, once.
    for _ in 0..100_000 {
        if rig.open.iter().all(HashMap::is_empty) {
            break;
        }
        for q in 0..QPS {
            rig.poll(q);
        }
        // Paced pieces and quiet times wait for the clock. A window the
        // input drove down to a fraction of a piece sends one piece every
        // few round trips: slow, not lost, so the rounds are long (a
        // sender that slept 380 ms before its first poll, then 24 pieces
        // behind a window of a quarter of a piece, takes about 110 s).
        rig.clock.advance(Nanos::from_millis(10));
    }
    for q in 0..QPS {
        assert!(
            rig.open[q].is_empty(),
            "queue pair {q}: requests {:?} never completed",
            rig.open[q].keys().collect::<Vec<_>>()
        );
        assert_eq!(rig.qps[q].queued(), 0, "queue pair {q}");
        assert_eq!(
            rig.qps[q].with_sink(|s| s.sends_in_flight()),
            0,
            "queue pair {q}"
        );
    }
});
