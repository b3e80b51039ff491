//! Cost of the data path per piece, one request per post against batches
//! of 16, on the host against the null sink (as `benches/verbs.rs`: the
//! library's own code up to the provider's `ibv_post_send` and from its
//! `ibv_poll_cq`; no RDMA device).
//!
//! Each path moves 64 B WRITEs, 16 per iteration, and polls until all 16
//! have handed their regions back:
//!
//! * `direct_single`: 16 times [`QueuePair::post_send`] and a poll: 16
//!   posts, 16 completions.
//! * `direct_batch16`: one [`QueuePair::batch`] of 16: one post (a list),
//!   two completions (the 8th and the 16th ask) that report all 16.
//! * `scheduled_single`: 16 times [`ScheduledQueuePair::post_send`] on a
//!   queue pair of its own, each posted and completed on its own.
//! * `scheduled_batch16`: one [`ScheduledQueuePair::batch`] of 16: the
//!   engine accepts all 16, posts them as one list, and two completions
//!   report them.
//! * `scheduled_split16`: one 1 KiB WRITE the engine splits into 16
//!   pieces of 64 B, posted as one list, its 8th and last pieces
//!   signaled.
//!
//! The queue pairs allow 16 pieces in flight. After criterion's groups,
//! paired rounds (each path in turn, 31 rounds of 20,000 iterations, the
//! medians of the per-round ratios) judge the target: a piece in a batch
//! of 16 costs at most half of what it costs posted alone, on the direct
//! and on the scheduled path.
//!
//! `cargo bench --bench batch` (add `-- --quick` for a short run). For an
//! instruction count that repeats whatever else the machine is doing,
//! run one path alone under callgrind: `valgrind --tool=callgrind
//! target/release/deps/batch-HASH --path scheduled_batch16 --iterations
//! 20000` (the executable `cargo bench --bench batch --no-run` names, not
//! the `.d` file beside it; and the same for `scheduled_single`), and
//! compare what `callgrind_annotate --inclusive=yes` counts inside
//! `<batch::Rig as batch::common::Paths>::run`, divided by the pieces
//! (20,000 x 16): that leaves out start-up and the clock's calibration,
//! whose count varies from run to run.
//!
//! [`QueuePair::post_send`]: mtrdma::verbs::QueuePair::post_send
//! [`QueuePair::batch`]: mtrdma::verbs::QueuePair::batch
//! [`ScheduledQueuePair::post_send`]: mtrdma::verbs::ScheduledQueuePair::post_send
//! [`ScheduledQueuePair::batch`]: mtrdma::verbs::ScheduledQueuePair::batch

#[allow(dead_code)]
mod common;

use std::hint::black_box;

use mtrdma::core::{TenantId, TrafficClass};
use mtrdma::verbs::testing::{self, HeapRegion, HostCompletion, NullScheduled, NullSink};
use mtrdma::verbs::{ScheduleConfig, SendOp};

use common::{
    bench_main, each_in_turn, median, median_ratio, verdict, Paths, BYTES, DEPTH, REMOTE, ROUNDS,
};

/// Requests (or pieces) per iteration, and in a batch.
const N: usize = 16;
/// Iterations per path per round of the paired rounds.
const ROUND_ITERS: u32 = 20_000;
/// What a piece in a batch may cost, as a share of one posted alone.
const TARGET: f64 = 0.5;

/// The paths, in the order of the summary.
const PATHS: [&str; 5] = [
    "direct_single",
    "direct_batch16",
    "scheduled_single",
    "scheduled_batch16",
    "scheduled_split16",
];

/// `N` WRITEs posted one at a time on `$rig.$q`, and their completions.
macro_rules! one_per_post {
    ($rig:ident, $q:ident, $refused:literal) => {{
        let write = SendOp::Write(REMOTE);
        for (i, r) in $rig.regions.drain(..).enumerate() {
            if $rig.$q.post_send(write, r, 0..BYTES, i as u64).is_err() {
                panic!($refused);
            }
        }
        while $rig.out.len() < N {
            $rig.$q.poll(&mut $rig.out).expect("null poll");
        }
        $rig.take_back(N);
    }};
}

/// `N` WRITEs posted as one batch on `$rig.$q`, and their completions.
macro_rules! one_batch {
    ($rig:ident, $q:ident, $refused:literal) => {{
        let write = SendOp::Write(REMOTE);
        let batch = $rig
            .regions
            .drain(..)
            .enumerate()
            .map(|(i, r)| (write, r, 0..BYTES, i as u64));
        if $rig.$q.post_batch(batch).is_err() {
            panic!($refused);
        }
        while $rig.out.len() < N {
            $rig.$q.poll(&mut $rig.out).expect("null poll");
        }
        $rig.take_back(N);
    }};
}

/// Everything a path needs between iterations.
struct Rig {
    sink: NullSink,
    qp: NullScheduled,
    /// 16 regions of 64 B, and one of 1 KiB for the split WRITE.
    regions: Vec<HeapRegion>,
    big: Option<HeapRegion>,
    out: Vec<HostCompletion>,
}

impl Rig {
    fn new() -> Rig {
        let config = ScheduleConfig {
            chunk_bytes: BYTES as u64,
            max_pieces_in_flight: N as u32,
            ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
        };
        Rig {
            sink: NullSink::new(1, DEPTH),
            qp: testing::scheduled(NullSink::new(2, DEPTH), config)
                .expect("a scheduler of its own"),
            regions: (0..N).map(|_| HeapRegion::new(BYTES)).collect(),
            big: Some(HeapRegion::new(BYTES * N)),
            out: Vec::with_capacity(64),
        }
    }

    /// Takes the regions back from the completions in `out`.
    fn take_back(&mut self, want: usize) {
        assert_eq!(self.out.len(), want, "every request completes");
        for c in self.out.drain(..) {
            if c.region.len() == BYTES {
                self.regions.push(black_box(c.region));
            } else {
                self.big = Some(black_box(c.region));
            }
        }
    }
}

impl Paths for Rig {
    const PATHS: &'static [&'static str] = &PATHS;
    const ITEMS: usize = N;

    /// One iteration of `path`: 16 pieces posted and completed.
    fn run(&mut self, path: &str) {
        let write = SendOp::Write(REMOTE);
        match path {
            "direct_single" => one_per_post!(self, sink, "the null sink takes every post"),
            "direct_batch16" => one_batch!(self, sink, "the null sink takes every batch"),
            "scheduled_single" => one_per_post!(self, qp, "the scheduler accepts every post"),
            "scheduled_batch16" => one_batch!(self, qp, "the scheduler accepts every batch"),
            "scheduled_split16" => {
                let r = self.big.take().expect("region back");
                if self.qp.post_send(write, r, 0..BYTES * N, 0).is_err() {
                    panic!("the scheduler accepts every post");
                }
                while self.out.is_empty() {
                    self.qp.poll(&mut self.out).expect("null poll");
                }
                self.take_back(1);
            }
            other => panic!("no path {other}"),
        }
    }

    /// Every path in turn, round after round; the medians of each path's ns
    /// per piece and of the ratios batch / single in each round.
    fn paired(&mut self) {
        let ns = each_in_turn(&PATHS, |p| self.time(p, ROUND_ITERS));
        println!("\npaired rounds ({ROUNDS} x {ROUND_ITERS} iterations of {N} pieces per path), ns per piece (medians):");
        for (path, all) in PATHS.iter().zip(&ns) {
            println!("  {path:<18} {:>7.1}", median(&mut all.clone()));
        }
        for (name, batch, single) in [
            ("direct: batch of 16 / one per post", 1, 0),
            ("scheduled: batch of 16 / one per post", 3, 2),
            ("scheduled: one request in 16 pieces / one per post", 4, 2),
        ] {
            let r = median_ratio(&ns[batch], &ns[single]);
            println!(
                "  {name}: {r:.2} (target at most {TARGET}: {})",
                verdict(r, TARGET)
            );
        }
    }
}

fn main() {
    bench_main(&mut Rig::new(), "batch", "piece");
}
