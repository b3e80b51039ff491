//! Arbitrary sequences of posts (single, whole, batches), polls of any
//! queue pair in any order, refused posts, failed completions, queue
//! pairs dropped mid-flight, policy changes and clock steps, driven
//! through the real scheduled engine on null sinks: two queue pairs with
//! engines of their own (the built-in scheduler with a delay window; the
//! built-in scheduler or the same policy composed of pieces,
//! `mtrdma_sched::compose`) and three on one shared engine (latency,
//! bulk, bulk with a delay window), on a manual clock. Each null sink is
//! watched (`NullSink::watch`): every work request the engine hands it,
//! every refusal and every completion, so the rules every mtrdma engine
//! keeps (`mtrdma_sched::gate`) are checked on what the engine really
//! posts, at every post and after every step:
//!
//! * The shared engine's bulk bytes in the NIC (posted, not yet
//!   completed) stay within its budget, unless one bulk piece alone is
//!   larger than the budget and nothing else bulk is in. Not counted: the
//!   pieces of a queue pair being dropped (its share is given back when it
//!   detaches) and of one the engine may have taken for stalled (an open
//!   request of it older than the engine's `stall_after`).
//! * No queue pair has more pieces in the NIC than its slots.
//! * Every byte of every accepted request reaches the NIC exactly once,
//!   in order (its local and remote addresses follow), its last piece
//!   marked last (a WRITE with immediate carries the immediate on its last
//!   piece only), nothing of it after its last piece or after it was
//!   handed back, nothing of a refused one; a request is handed back once,
//!   with its own region, only when none of its pieces is in the NIC, and
//!   as succeeded only if every piece of it completed.
//! * When the input ends, everything completes and every request that
//!   succeeded reached the NIC whole.
#![no_main]

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::{delay_window, id_of, region, REMOTE};
use libfuzzer_sys::fuzz_target;
use mtrdma_core::{TenantId, TrafficClass};
use mtrdma_sched::compose::composed;
use mtrdma_sched::{Clock, ManualClock, Nanos, RateLimit, SchedulerConfig, TenantPolicy};
use mtrdma_verbs::testing::{
    self, BatchRefused, HeapRegion, HostCompletion, NullScheduled, NullScheduler, NullSink, Posted,
    SinkEvent,
};
use mtrdma_verbs::{
    Error, PieceScheduler, RemoteRegion, ScheduleConfig, SendOp, SharedConfig, WcStatus,
};

const QPS: usize = 5;
/// Queue pairs below this have engines of their own; the others share one.
const SOLO: usize = 2;
/// The latency-class queue pair (on the shared engine).
const LATENCY: usize = 2;
/// Send queue depth of every null sink.
const DEPTH: u32 = 16;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// RDMA WRITE with immediate: split, the immediate on its last piece.
    WriteImm,
    /// RDMA READ: split.
    Read,
    /// SEND with immediate: one piece.
    SendImm,
}

impl Kind {
    /// The operation of request `id`, which every work request of it
    /// names: a WRITE's or READ's remote key is `id`, a SEND's immediate.
    fn op(self, id: u64) -> SendOp {
        let remote = RemoteRegion {
            rkey: id as u32,
            ..REMOTE
        };
        match self {
            Kind::WriteImm => SendOp::WriteWithImm(remote, id as u32),
            Kind::Read => SendOp::Read(remote),
            Kind::SendImm => SendOp::SendWithImm(id as u32),
        }
    }
}

/// A request the harness handed to a queue pair (from just before the
/// post, so that pieces posted inside it are known) until it is handed
/// back, refused, or its queue pair is dropped.
#[derive(Debug)]
struct Req {
    q: usize,
    kind: Kind,
    /// Posted whole (one piece, however long).
    whole: bool,
    /// Its region's first byte, and its bytes (a range `0..len` of it).
    base: u64,
    len: u64,
    /// Bytes of it that reached the NIC, in order.
    posted: u64,
    /// Its last piece reached the NIC.
    last: bool,
    /// Pieces of it in the NIC.
    in_nic: u32,
    /// One of its pieces completed in error.
    bad: bool,
    /// When it was posted (the manual clock).
    at: u64,
}

/// A work request in a null sink's ring: its request (none for a
/// zero-length WRITE that only reports earlier ones) and bytes.
#[derive(Debug, Clone, Copy)]
struct Piece {
    id: Option<u64>,
    len: u64,
}

/// What the null sinks hold, as their watchers report it.
struct Nic {
    reqs: HashMap<u64, Req>,
    rings: Vec<VecDeque<Piece>>,
    slots: Vec<usize>,
    /// Bulk queue pairs on the shared engine.
    budgeted: Vec<bool>,
    /// Queue pairs being dropped: their share of the budget is given back.
    leaving: Vec<bool>,
    /// Per queue pair, requests open while the engine may have taken it
    /// for stalled: until they are done, its pieces may be off the budget.
    stalled: Vec<HashSet<u64>>,
    budget: u64,
    chunk: u64,
    stall_after: u64,
    now: u64,
}

impl Nic {
    /// The queue pair `q` may be off the budget, stalled: an open request
    /// of it is older than `stall_after` (its oldest piece in the NIC, as
    /// the engine counts it, is no older than its request), or one was
    /// while a request still open now was.
    fn maybe_stalled(&mut self, q: usize) -> bool {
        let old = self.now.saturating_sub(self.stall_after);
        let reqs = &self.reqs;
        let open = || reqs.iter().filter(move |(_, r)| r.q == q);
        if self.budgeted[q] && open().any(|(_, r)| r.at <= old) {
            self.stalled[q].extend(open().map(|(&id, _)| id));
        }
        !self.stalled[q].is_empty()
    }

    /// The rules, on what is in the NIC now.
    fn check(&mut self) {
        for q in 0..QPS {
            let pieces = self.rings[q].iter().filter(|p| p.id.is_some()).count();
            assert!(
                pieces <= self.slots[q],
                "queue pair {q}: {pieces} pieces in the NIC, {} slots",
                self.slots[q]
            );
        }
        let (mut bytes, mut pieces) = (0, 0);
        for q in 0..QPS {
            if !self.budgeted[q] || self.leaving[q] || self.maybe_stalled(q) {
                continue;
            }
            for p in self.rings[q].iter().filter(|p| p.id.is_some()) {
                bytes += p.len;
                pieces += usize::from(p.len > 0);
            }
        }
        assert!(
            bytes <= self.budget || pieces == 1,
            "{bytes} bulk bytes in {pieces} pieces in the NIC, over a budget of {}",
            self.budget
        );
    }

    /// The open request of queue pair `q` that work request `p` is of (by
    /// its remote key, or a SEND's immediate; request numbers start at 1,
    /// and a work request of no request names 0).
    fn find(&self, q: usize, p: &Posted) -> Option<u64> {
        let id = match p.rkey {
            0 => u64::from(p.imm?),
            rkey => u64::from(rkey),
        };
        let r = self.reqs.get(&id)?;
        assert_eq!(r.q, q, "a piece of request {id} on another queue pair");
        Some(id)
    }

    fn on(&mut self, q: usize, event: SinkEvent<'_>) {
        match event {
            SinkEvent::Posted(p) => {
                let id = self.posted(q, p, true);
                if id.is_none() {
                    assert_eq!(p.length, 0, "a work request of no request: {p:?}");
                }
                self.rings[q].push_back(Piece {
                    id,
                    len: u64::from(p.length),
                });
                self.check();
            }
            // Refused: not in the NIC, and its bytes still to come, or its
            // request fails (a refused fast-path post goes again through
            // the engine).
            SinkEvent::Refused(p) => {
                self.posted(q, p, false);
            }
            SinkEvent::Completed(status) => {
                let piece = self.rings[q]
                    .pop_front()
                    .unwrap_or_else(|| panic!("queue pair {q}: a completion of nothing"));
                if let Some(id) = piece.id {
                    let r = self
                        .reqs
                        .get_mut(&id)
                        .expect("a request with a piece in the NIC");
                    r.in_nic -= 1;
                    r.bad |= status != WcStatus::Success;
                }
            }
        }
    }

    /// A work request of queue pair `q` reached the NIC (`taken`) or was
    /// refused: the checks of its request's bytes; its request.
    fn posted(&mut self, q: usize, p: &Posted, taken: bool) -> Option<u64> {
        let id = self.find(q, p)?;
        let chunk = self.chunk;
        let r = self.reqs.get_mut(&id).expect("found");
        let offset = r.posted;
        assert!(!r.last, "request {id}: a piece after its last one");
        let len = u64::from(p.length);
        if len > 0 {
            assert_eq!(
                p.addr,
                r.base + offset,
                "request {id}: its bytes in order, once"
            );
        }
        assert!(
            offset + len <= r.len,
            "request {id}: {len} B at {offset} of {} B",
            r.len
        );
        assert!(
            len > 0 || r.len == 0,
            "request {id}: an empty piece of a request with bytes"
        );
        let end = offset + len == r.len;
        if r.kind != Kind::SendImm {
            assert_eq!(p.remote_addr, REMOTE.addr + offset, "request {id}: remote");
        }
        if r.whole || r.kind == Kind::SendImm {
            assert!(end && offset == 0, "request {id}: sent whole, in pieces");
        } else {
            assert!(
                len <= chunk,
                "request {id}: a piece of {len} B, chunks of {chunk}"
            );
        }
        if r.kind != Kind::Read {
            // The last piece is marked last: only it carries the immediate.
            let want = end.then_some(id as u32);
            assert_eq!(
                p.imm, want,
                "request {id}: the immediate on its last piece only"
            );
        }
        if taken {
            r.posted += len;
            r.last = end;
            r.in_nic += 1;
        }
        Some(id)
    }
}

/// A request as a queue pair takes it: operation, region, range, context.
type Request = (SendOp, HeapRegion, Range<usize>, u64);

/// What the harness calls on a queue pair, whatever its scheduler.
trait Qp {
    /// Posts `request` (`whole`: not split).
    fn post(&mut self, request: Request, whole: bool) -> Result<(), (Error, HeapRegion)>;
    fn batch(&mut self, requests: Vec<Request>) -> Result<(), BatchRefused>;
    fn poll(&mut self, out: &mut Vec<HostCompletion>);
    fn sink(&mut self, f: &mut dyn FnMut(&mut NullSink));
}

impl<Q: PieceScheduler> Qp for NullScheduled<Q> {
    fn post(&mut self, request: Request, whole: bool) -> Result<(), (Error, HeapRegion)> {
        let (op, r, range, id) = request;
        if whole {
            self.post_send_whole(op, r, range, id)
        } else {
            self.post_send(op, r, range, id)
        }
    }

    fn batch(&mut self, requests: Vec<Request>) -> Result<(), BatchRefused> {
        self.post_batch(requests)
    }

    fn poll(&mut self, out: &mut Vec<HostCompletion>) {
        NullScheduled::poll(self, out).expect("a null poll");
    }

    fn sink(&mut self, f: &mut dyn FnMut(&mut NullSink)) {
        self.with_sink(f);
    }
}

fn lock(nic: &Mutex<Nic>) -> MutexGuard<'_, Nic> {
    nic.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Rig {
    clock: Arc<ManualClock>,
    shared: NullScheduler,
    nic: Arc<Mutex<Nic>>,
    qps: Vec<Box<dyn Qp>>,
    slots: [u32; QPS],
    chunk: u64,
    composed: bool,
    /// The next request's number.
    next: u64,
}

impl Rig {
    fn new(header: &[u8]) -> Rig {
        let chunk = 64 << (header[0] % 8);
        let budget = u64::from(header[1]) * 512;
        let stall_after = [5, 20, 100, 3_600_000][usize::from(header[2] % 4)];
        let slots: [u32; QPS] =
            std::array::from_fn(|q| 1 + u32::from(header[3 + q / 2] >> (q % 2 * 4) & 7));
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(1)));
        let shared = NullScheduler::with_clock(
            SharedConfig {
                chunk_bytes: chunk,
                bulk_bytes_in_flight: budget,
                stall_after: Duration::from_millis(stall_after),
                ..SharedConfig::default()
            },
            Arc::clone(&clock),
        )
        .expect("a shared engine");
        let nic = Nic {
            reqs: HashMap::new(),
            rings: vec![VecDeque::new(); QPS],
            slots: slots.iter().map(|&s| s.min(DEPTH) as usize).collect(),
            budgeted: (0..QPS).map(|q| q >= SOLO && q != LATENCY).collect(),
            leaving: vec![false; QPS],
            stalled: vec![HashSet::new(); QPS],
            budget: budget.max(1),
            chunk,
            stall_after: stall_after * 1_000_000,
            now: clock.now().0,
        };
        let mut rig = Rig {
            clock,
            shared,
            nic: Arc::new(Mutex::new(nic)),
            qps: Vec::new(),
            slots,
            chunk,
            composed: header[0] & 0x80 != 0,
            next: 1,
        };
        for q in 0..QPS {
            let qp = rig.make(q);
            rig.qps.push(qp);
        }
        rig
    }

    fn make(&self, q: usize) -> Box<dyn Qp> {
        let class = if q == LATENCY {
            TrafficClass::Latency
        } else {
            TrafficClass::Bulk
        };
        let config = ScheduleConfig {
            chunk_bytes: self.chunk,
            max_pieces_in_flight: self.slots[q],
            window: (q == 0 || q == 4).then(|| delay_window(self.chunk)),
            ..ScheduleConfig::local(TenantId(q as u32), class)
        };
        let nic = Arc::clone(&self.nic);
        let sink = NullSink::new(q as u32, DEPTH).watch(move |e| lock(&nic).on(q, e));
        match q {
            // The same policy composed of pieces, on the same clock.
            1 if self.composed => {
                let sched = composed(&SchedulerConfig {
                    chunk_bytes: self.chunk,
                    quantum_bytes: self.chunk,
                    ..SchedulerConfig::default()
                })
                .expect("a valid configuration");
                Box::new(
                    testing::scheduled_with_on_clock(sink, config, sched, Arc::clone(&self.clock))
                        .expect("composed"),
                )
            }
            0 | 1 => Box::new(
                testing::scheduled_with_clock(sink, config, Arc::clone(&self.clock))
                    .expect("a queue pair of its own"),
            ),
            _ => Box::new(self.shared.attach(sink, config).expect("attached")),
        }
    }

    /// Notes request `id` of `kind` on `q`, about to be posted.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        nic: &mut Nic,
        q: usize,
        id: u64,
        kind: Kind,
        whole: bool,
        r: &HeapRegion,
        len: usize,
    ) {
        nic.reqs.insert(
            id,
            Req {
                q,
                kind,
                whole,
                base: r.addr(),
                len: len as u64,
                posted: 0,
                last: false,
                in_nic: 0,
                bad: false,
                at: self.clock.now().0,
            },
        );
    }

    /// Request `id` was refused, its region `r` handed back.
    fn refused(&self, id: u64, r: &HeapRegion) {
        assert_eq!(id_of(r), id, "a refused post hands its own region back");
        let req = lock(&self.nic).reqs.remove(&id).expect("open");
        assert!(
            req.posted == 0 && req.in_nic == 0,
            "refused request {id} reached the NIC: {req:?}"
        );
    }

    fn post(&mut self, q: usize, kind: Kind, len: usize, whole: bool) {
        let id = self.next;
        self.next += 1;
        let r = region(id, len);
        self.open(&mut lock(&self.nic), q, id, kind, whole, &r, len);
        if let Err((_, r)) = self.qps[q].post((kind.op(id), r, 0..len, id), whole) {
            self.refused(id, &r);
        }
        self.step_done();
    }

    fn batch(&mut self, q: usize, spec: &[u8]) {
        let mut requests = Vec::new();
        {
            let mut nic = lock(&self.nic);
            for &b in spec {
                let id = self.next;
                self.next += 1;
                let kind = [Kind::WriteImm, Kind::Read, Kind::SendImm][usize::from(b % 3)];
                let len = usize::from(b / 3) * 48;
                let r = region(id, len);
                self.open(&mut nic, q, id, kind, false, &r, len);
                requests.push((kind.op(id), r, 0..len, id));
            }
        }
        if let Err((_, refused)) = self.qps[q].batch(requests) {
            // The first ones were accepted; the rest came back, in order.
            let first = self.next - refused.len() as u64;
            for (i, (context, r)) in refused.iter().enumerate() {
                assert_eq!(*context, first + i as u64, "refused in order");
                self.refused(*context, r);
            }
        }
        self.step_done();
    }

    fn poll(&mut self, q: usize) {
        let mut out = Vec::new();
        self.qps[q].poll(&mut out);
        let mut nic = lock(&self.nic);
        for c in out {
            let id = id_of(&c.region);
            assert_eq!(c.context, id, "a completion hands back its own region");
            let r = nic
                .reqs
                .remove(&id)
                .unwrap_or_else(|| panic!("request {id} completed twice or was never accepted"));
            assert_eq!(r.q, q, "request {id} completed on its own queue pair");
            assert_eq!(
                r.in_nic, 0,
                "request {id} handed back with pieces in the NIC"
            );
            if c.status == WcStatus::Success {
                assert!(!r.bad, "request {id} succeeded, a piece of it failed");
                assert!(
                    r.last && r.posted == r.len,
                    "request {id} succeeded, not whole: {r:?}"
                );
            }
            for s in &mut nic.stalled {
                s.remove(&id);
            }
        }
        drop(nic);
        self.step_done();
    }

    fn drop_qp(&mut self, q: usize) {
        lock(&self.nic).leaving[q] = true;
        let qp = self.make(q);
        drop(std::mem::replace(&mut self.qps[q], qp));
        let mut nic = lock(&self.nic);
        assert!(
            nic.rings[q].is_empty(),
            "queue pair {q} dropped, not drained"
        );
        nic.reqs.retain(|_, r| r.q != q);
        nic.stalled[q].clear();
        nic.leaving[q] = false;
        drop(nic);
        self.step_done();
    }

    fn advance(&mut self, by: Nanos) {
        self.clock.advance(by);
        self.step_done();
    }

    /// After every step (and before the next, at the clock it runs at).
    fn step_done(&self) {
        let mut nic = lock(&self.nic);
        nic.now = self.clock.now().0;
        nic.check();
    }

    fn open_requests(&self) -> usize {
        lock(&self.nic).reqs.len()
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let mut rig = Rig::new(&data[..6]);
    let mut bytes = data[6..].iter().copied();
    while let (Some(op), Some(arg)) = (bytes.next(), bytes.next()) {
        let q = usize::from(arg) % QPS;
        let n = usize::from(arg / 8);
        match op % 16 {
            0..=2 => {
                let kind = [Kind::WriteImm, Kind::Read, Kind::SendImm][usize::from(op / 16 % 3)];
                let len = n * usize::from(op / 48 + 1) * 64;
                rig.post(q, kind, len, false);
            }
            3 => rig.post(q, Kind::WriteImm, n * 256, true),
            4 => {
                let spec: Vec<u8> = bytes.by_ref().take(1 + n % 8).collect();
                rig.batch(q, &spec);
            }
            5..=7 => rig.poll(q),
            8 => rig.qps[q].sink(&mut |s| s.refuse_after(n % 20)),
            9 => rig.qps[q].sink(&mut |s| s.fail_completion_after(n % 20)),
            10 => rig.advance(Nanos::from_micros(n as u64 * 100)),
            11 => rig.advance(Nanos::from_millis(n as u64)),
            12 => {
                let mut policy = TenantPolicy::weight(u32::from(op / 16 % 8) + 1);
                if n % 2 == 1 {
                    policy = policy.with_byte_cap(RateLimit::new(n as u64 * 100_000, 64 << 10));
                }
                let _ = rig.shared.set_policy(TenantId(q as u32), policy);
            }
            13 => rig.drop_qp(q),
            _ => {}
        }
    }
    // Everything accepted completes, once. Paced pieces, caps and quiet
    // times wait for the clock; a window the input drove down to a
    // fraction of a piece sends one piece every few round trips: slow,
    // not lost.
    for _ in 0..100_000 {
        if rig.open_requests() == 0 {
            break;
        }
        for q in 0..QPS {
            rig.poll(q);
        }
        rig.advance(Nanos::from_millis(10));
    }
    let nic = lock(&rig.nic);
    assert!(
        nic.reqs.is_empty(),
        "requests never completed: {:?}",
        nic.reqs.keys().collect::<Vec<_>>()
    );
    for (q, ring) in nic.rings.iter().enumerate() {
        assert!(
            ring.is_empty(),
            "queue pair {q}: work requests left in the NIC"
        );
    }
});
