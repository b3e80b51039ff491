//! What awaiting completions on tokio (`mtrdma::verbs::asynchronous`)
//! adds to a completion, on the host against the null sink (as
//! `benches/batch.rs`: the library's own code, no RDMA device, nothing
//! ever sleeps: the null sink completes at the next poll).
//!
//! Each path moves 16 WRITEs of 64 B through a scheduled queue pair of
//! its own per iteration and takes the 16 regions back:
//!
//! * `blocking_poll`: `post_send` 16 times, then `poll` until all 16
//!   completed: the blocking API, the baseline.
//! * `async_incoming`: the same posts through `AsyncQueuePair::with`, with
//!   contexts of the caller's own, then `incoming_many` until all 16 came
//!   (as `examples/rpc.rs`'s async server takes its requests and its
//!   answers' completions).
//! * `async_futures`: 16 `AsyncQueuePair::post_send`, each a future, each
//!   awaited in turn.
//!
//! The futures are polled by hand with a waker that does nothing (inside
//! a tokio runtime's context, as the queue pair needs): what is measured
//! is the wrapper's books, not a runtime's scheduling. After criterion's
//! groups, paired rounds (each path in turn, 31 rounds of 20,000
//! iterations) give the medians of each path's ns per completion and of
//! the async paths' ratios to the blocking one.
//!
//! `cargo bench --bench asynchronous` (add `-- --quick` for a short run).
//! For an instruction count that repeats whatever else the machine is
//! doing: `valgrind --tool=callgrind target/release/deps/asynchronous-HASH
//! --path async_incoming --iterations 20000` (the executable `cargo bench
//! --bench asynchronous --no-run` names), and compare what
//! `callgrind_annotate --inclusive=yes` counts inside
//! `<asynchronous::Rig as asynchronous::common::Paths>::run`, divided by
//! the completions (20,000 x 16).

#[allow(dead_code)]
mod common;

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use mtrdma::core::{TenantId, TrafficClass};
use mtrdma::verbs::asynchronous::AsyncQueuePair;
use mtrdma::verbs::testing::{self, HeapRegion, HostCompletion, NullScheduled, NullSink};
use mtrdma::verbs::{ScheduleConfig, SendOp};

use common::{bench_main, each_in_turn, median, median_ratio, Paths, BYTES, DEPTH, REMOTE, ROUNDS};

/// Requests per iteration.
const N: usize = 16;
/// Iterations per path per round of the paired rounds.
const ROUND_ITERS: u32 = 20_000;
/// What `incoming_many` may take at once (as the async RPC server).
const AT_ONCE: usize = 256;

/// The paths, in the order of the summary; the first is the baseline.
const PATHS: [&str; 3] = ["blocking_poll", "async_incoming", "async_futures"];

/// A scheduled null queue pair of its own that lets all `N` go at once.
fn queue_pair() -> NullScheduled {
    let config = ScheduleConfig {
        chunk_bytes: BYTES as u64,
        max_pieces_in_flight: N as u32,
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    };
    testing::scheduled(NullSink::new(1, DEPTH), config).expect("a scheduler of its own")
}

/// Polls `f` until it is ready, with a waker that does nothing: on the
/// null sink nothing sleeps.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// `N` WRITEs of `regions` on `qp`, with contexts 0 to 15.
fn post_all(qp: &mut NullScheduled, regions: &mut Vec<HeapRegion>) {
    for (i, r) in regions.drain(..).enumerate() {
        if qp
            .post_send(SendOp::Write(REMOTE), r, 0..BYTES, i as u64)
            .is_err()
        {
            panic!("the scheduler accepts every post");
        }
    }
}

/// Everything a path needs between iterations.
struct Rig {
    blocking: NullScheduled,
    shared: AsyncQueuePair<NullScheduled>,
    regions: Vec<HeapRegion>,
    out: Vec<HostCompletion>,
    _runtime: tokio::runtime::Runtime,
}

impl Rig {
    fn new() -> Rig {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let shared = {
            let _inside = runtime.enter();
            AsyncQueuePair::new(queue_pair()).expect("the null sink needs no channel")
        };
        Rig {
            blocking: queue_pair(),
            shared,
            regions: (0..N).map(|_| HeapRegion::new(BYTES)).collect(),
            out: Vec::with_capacity(2 * AT_ONCE),
            _runtime: runtime,
        }
    }
}

impl Paths for Rig {
    const PATHS: &'static [&'static str] = &PATHS;
    const ITEMS: usize = N;

    /// One iteration of `path`: 16 WRITEs posted and their regions back.
    fn run(&mut self, path: &str) {
        match path {
            "blocking_poll" => {
                post_all(&mut self.blocking, &mut self.regions);
                while self.out.len() < N {
                    self.blocking.poll(&mut self.out).expect("null poll");
                }
            }
            "async_incoming" => {
                self.shared.with(|qp| post_all(qp, &mut self.regions));
                while self.out.len() < N {
                    ready(self.shared.incoming_many(&mut self.out, AT_ONCE)).expect("null poll");
                }
            }
            "async_futures" => {
                let mut pending = Vec::with_capacity(N);
                for r in self.regions.drain(..) {
                    match self.shared.post_send(SendOp::Write(REMOTE), r, 0..BYTES) {
                        Ok(p) => pending.push(p),
                        Err(_) => panic!("the scheduler accepts every post"),
                    }
                }
                for p in pending {
                    let c = ready(p).expect("null poll");
                    self.regions.push(black_box(c.region));
                }
                return;
            }
            other => panic!("no path {other}"),
        }
        assert_eq!(self.out.len(), N, "every request completes once");
        self.regions
            .extend(self.out.drain(..).map(|c| black_box(c.region)));
    }

    /// Every path in turn, round after round: the medians of each path's ns
    /// per completion and of each async path's ratio to the blocking one.
    fn paired(&mut self) {
        let ns = each_in_turn(&PATHS, |p| self.time(p, ROUND_ITERS));
        println!(
            "\npaired rounds ({ROUNDS} x {ROUND_ITERS} iterations of {N} completions per path), ns per completion (medians):"
        );
        for (i, (path, all)) in PATHS.iter().zip(&ns).enumerate() {
            let ratio = median_ratio(all, &ns[0]);
            let against = if i == 0 {
                String::new()
            } else {
                format!("  ({ratio:.2}x {})", PATHS[0])
            };
            println!("  {path:<16} {:>7.1}{against}", median(&mut all.clone()));
        }
    }
}

fn main() {
    bench_main(&mut Rig::new(), "asynchronous", "completion");
}
