//! Arbitrary sequences of posts, completions, policy changes and clock
//! steps driven through the rules every mtrdma engine keeps
//! (`mtrdma_sched::gate`) around the built-in scheduler, as the verbs
//! engine and the simulator drive them: no panic, and what a user relies
//! on holds after every step.
//!
//! * The bulk bytes in the NIC stay within the budget, unless one bulk
//!   piece alone is larger than the budget and nothing else bulk is in.
//! * No queue pair has more pieces in the NIC than its slots.
//! * Every byte of every accepted request reaches the NIC exactly once, in
//!   order, its last piece marked last; nothing is lost: when the input
//!   ends, everything completes and every request is whole.
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use mtrdma_sched::compose::composed;
use mtrdma_sched::gate::{Gate, GrantOrder, Lane, Post};
use mtrdma_sched::{
    Admit, Dequeue, Descriptor, Grant, Nanos, Opcode, RateLimit, Scheduler, SchedulerConfig,
    TenantId, TenantPolicy, TenantScheduler, TrafficClass,
};

const LANES: usize = 4;

/// A request: its length, the bytes of it posted so far, whether its last
/// piece was posted.
struct Request {
    lane: usize,
    len: u64,
    posted: u64,
    last: bool,
}

struct Engine<S> {
    sched: S,
    gate: Gate,
    order: GrantOrder,
    lanes: Vec<Lane<usize>>,
    /// Per lane, the tags (request numbers) and lengths of its pieces in
    /// the NIC, in post order.
    nic: Vec<VecDeque<(usize, u64)>>,
    requests: Vec<Request>,
    now: u64,
}

fn config(chunk: u64) -> SchedulerConfig {
    SchedulerConfig {
        chunk_bytes: chunk,
        quantum_bytes: chunk,
        ..SchedulerConfig::default()
    }
}

fn tenant(lane: usize) -> TenantId {
    TenantId(lane as u32 + 1)
}

impl<S: Scheduler<usize>> Engine<S> {
    fn new(mut sched: S, chunk: u64, budget: u64, slots: &[u32; LANES]) -> Engine<S> {
        // Every queue pair's tenant is known, as the engine adopts it.
        for lane in 0..LANES {
            sched
                .set_policy(tenant(lane), TenantPolicy::weight(1))
                .expect("a valid policy");
        }
        let lanes = (0..LANES)
            .map(|i| {
                let class = if i == 0 {
                    TrafficClass::Latency
                } else {
                    TrafficClass::Bulk
                };
                Lane::new(class, slots[i], None)
            })
            .collect();
        Engine {
            sched,
            gate: Gate::new(chunk, budget),
            order: GrantOrder::default(),
            lanes,
            nic: vec![VecDeque::new(); LANES],
            requests: Vec::new(),
            now: 0,
        }
    }

    /// A request on `lane`: the fast path if the gate and the caps let it
    /// go now, else the scheduler.
    fn post(&mut self, lane: usize, op: Opcode, len: u64) {
        let tag = self.requests.len();
        self.requests.push(Request {
            lane,
            len,
            posted: 0,
            last: false,
        });
        let now = Nanos(self.now);
        let tenant = tenant(lane);
        let class = self.lanes[lane].class();
        let fast = self
            .gate
            .unhindered(&self.lanes[lane], op, len, self.sched.is_empty(), || now)
            && self.sched.admit_now(tenant, len, now).is_ok();
        if fast {
            let grant = Grant {
                tenant,
                class,
                op,
                handle: tag,
                offset: 0,
                len,
                is_last: true,
            };
            self.send(lane, grant);
            return;
        }
        let d = Descriptor::new(tenant, class, op, len, tag);
        match self.sched.enqueue(d, now) {
            Ok(()) => self.gate.enqueued(class),
            // Refused (a zero-length split request, say): never granted.
            Err(_) => self.requests[tag].last = true,
        }
    }

    fn send(&mut self, lane: usize, grant: Grant<usize>) {
        let r = &mut self.requests[grant.handle];
        assert!(!r.last, "a piece after the last one");
        assert_eq!(grant.offset, r.posted, "pieces of a request in order");
        r.posted += grant.len;
        assert!(r.posted <= r.len, "more bytes than the request has");
        if grant.is_last {
            assert_eq!(r.posted, r.len, "the last piece ends the request");
            r.last = true;
        }
        let now = Nanos(self.now);
        self.gate
            .sent(&mut self.lanes[lane], grant.handle, grant.len, || now);
        self.nic[lane].push_back((grant.handle, grant.len));
    }

    fn post_head(&mut self, lane: usize) -> Post {
        let Some(len) = self.lanes[lane].pending().front().map(|g| g.len) else {
            return Post::Held;
        };
        if self.gate.budget_holds(&self.lanes[lane], len) {
            return Post::Budget;
        }
        let now = Nanos(self.now);
        match self.gate.admits(&self.lanes[lane], len, || now) {
            Admit::Now => {
                let grant = self.lanes[lane].pop_pending().expect("checked");
                self.send(lane, grant);
                Post::Posted
            }
            Admit::At(_) | Admit::AfterCompletion => Post::Held,
        }
    }

    fn pump(&mut self) {
        let mut order = std::mem::take(&mut self.order);
        order.drain(|lane| self.post_head(lane));
        while order.len() < Gate::pending_bound(LANES, false) && self.gate.may_grant() {
            let grant = match self.sched.dequeue(Nanos(self.now)) {
                Dequeue::Ready(g) => g,
                Dequeue::Wait(_) | Dequeue::Empty => break,
            };
            self.gate.granted(&grant);
            let lane = self.requests[grant.handle].lane;
            let class = grant.class;
            self.lanes[lane].push_pending(grant);
            order.push(class, lane);
            order.drain_newest(class, lane, |lane| self.post_head(lane));
        }
        self.order = order;
        self.check();
    }

    /// Completes the oldest piece of `lane` (or, out of turn, a piece of
    /// the newest piece's request: the front one if it is of that request,
    /// as `Gate::completed` takes it, else the newest).
    fn complete(&mut self, lane: usize, out_of_turn: bool) {
        let nic = &mut self.nic[lane];
        let tag = if out_of_turn {
            match (nic.front().copied(), nic.back().copied()) {
                (Some(front), Some(back)) if front.0 == back.0 => nic.pop_front(),
                _ => nic.pop_back(),
            }
        } else {
            nic.pop_front()
        };
        if let Some((tag, _)) = tag {
            let now = Nanos(self.now);
            let done = self
                .gate
                .completed(&mut self.lanes[lane], tag, || now, Nanos::ZERO);
            assert!(done.is_some(), "a piece in flight is found");
        }
    }

    fn check(&self) {
        // Pieces of no bytes take none of the budget.
        let bulk_pieces: usize = self
            .lanes
            .iter()
            .zip(&self.nic)
            .filter(|(l, _)| l.class() == TrafficClass::Bulk)
            .map(|(_, nic)| nic.iter().filter(|(_, len)| *len > 0).count())
            .sum();
        let bulk_bytes: u64 = self
            .lanes
            .iter()
            .zip(&self.nic)
            .filter(|(l, _)| l.class() == TrafficClass::Bulk)
            .map(|(_, nic)| nic.iter().map(|(_, len)| len).sum::<u64>())
            .sum();
        assert_eq!(self.gate.bulk_in_flight(), bulk_bytes);
        assert!(
            self.gate.bulk_in_flight() <= self.gate.budget() || bulk_pieces == 1,
            "{} bulk bytes in the NIC over a budget of {}",
            self.gate.bulk_in_flight(),
            self.gate.budget()
        );
        for (lane, nic) in self.lanes.iter().zip(&self.nic) {
            assert!(lane.in_flight() as u32 <= lane.slots(), "slots overrun");
            assert_eq!(lane.in_flight(), nic.len());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    // The first byte's top bit: the built-in scheduler, or the same policy
    // composed of pieces (mtrdma_sched::compose).
    let chunk = 64 << (data[0] % 8);
    if data[0] & 0x80 == 0 {
        let sched = TenantScheduler::new(config(chunk)).expect("a valid configuration");
        drive(sched, data);
    } else {
        let sched = composed(&config(chunk)).expect("a valid configuration");
        drive(sched, data);
    }
});

fn drive<S: Scheduler<usize>>(sched: S, data: &[u8]) {
    let chunk = 64 << (data[0] % 8);
    let budget = u64::from(data[1]) * 512;
    let slots = [
        u32::from(data[2] % 8) + 1,
        u32::from(data[3] % 8) + 1,
        u32::from(data[4] % 8) + 1,
        u32::from(data[5] % 8) + 1,
    ];
    let mut e = Engine::new(sched, chunk, budget, &slots);
    for op in data[6..].chunks_exact(3) {
        let lane = usize::from(op[0] >> 4) % LANES;
        match op[0] % 8 {
            0..=2 => {
                let kind = match op[1] % 3 {
                    0 => Opcode::Send,
                    1 => Opcode::Write,
                    _ => Opcode::Read,
                };
                e.post(lane, kind, u64::from(op[2]) * u64::from(op[1] / 3 + 1) * 16);
            }
            3 | 4 => e.complete(lane, op[1] == 0xff),
            5 => e.now += u64::from(op[1]) * 1000,
            6 => {
                let weight = u32::from(op[1] % 8) + 1;
                let mut policy = TenantPolicy::weight(weight);
                if op[2] % 2 == 1 {
                    policy = policy.with_byte_cap(RateLimit::new(u64::from(op[2]) * 1000, 4096));
                }
                let _ = e.sched.set_policy(tenant(lane), policy);
            }
            _ => {}
        }
        e.pump();
    }
    // The input is over: everything in the NIC completes, and every
    // request is posted whole (a second passes per round, for the caps:
    // the lowest, 1,000 B/s, takes 1e5 rounds for the most bytes an input
    // can ask).
    for _ in 0..1_000_000 {
        let busy = e.nic.iter().any(|n| !n.is_empty());
        if !busy && e.sched.is_empty() && e.order.is_empty() {
            break;
        }
        for lane in 0..LANES {
            while !e.nic[lane].is_empty() {
                e.complete(lane, false);
            }
        }
        e.now += 1_000_000_000;
        e.pump();
    }
    for (tag, r) in e.requests.iter().enumerate() {
        assert!(
            r.last,
            "request {tag} ({} of {} B posted) was lost",
            r.posted, r.len
        );
    }
}
