//! What the null-sink benches share: the 64 B RDMA WRITE they post, one
//! through a scheduled queue pair, and their paired rounds.

use std::hint::black_box;
use std::time::Instant;

use mtrdma::verbs::testing::{HeapRegion, HostCompletion, NullScheduled};
use mtrdma::verbs::{PieceScheduler, RemoteRegion, SendOp};

/// Bytes per WRITE (and per piece of a split one).
pub(crate) const BYTES: usize = 64;
/// Send queue depth of every null sink.
pub(crate) const DEPTH: u32 = 128;
/// Where the WRITEs go (nothing is written: the sink is null).
pub(crate) const REMOTE: RemoteRegion = RemoteRegion {
    addr: 0x7000_0000,
    len: 1 << 20,
    rkey: 0x42,
};
/// Paired rounds (after one of warm-up).
pub(crate) const ROUNDS: usize = 31;

/// One WRITE of `region` through the scheduled queue pair `qp`, and its
/// completion: the region back.
pub(crate) fn scheduled<Q: PieceScheduler>(
    qp: &mut NullScheduled<Q>,
    region: HeapRegion,
    out: &mut Vec<HostCompletion>,
) -> HeapRegion {
    if qp
        .post_send(SendOp::Write(REMOTE), region, 0..BYTES, 1)
        .is_err()
    {
        panic!("the scheduler accepts every post");
    }
    loop {
        qp.poll(out).expect("null poll");
        if let Some(c) = out.pop() {
            return c.region;
        }
    }
}

/// A WRITE (or whatever a path does with one region), handed the region
/// the one before gave back.
pub(crate) type Path<'a> = &'a mut dyn FnMut(HeapRegion, &mut Vec<HostCompletion>) -> HeapRegion;

/// The ns per call of `a` and of `b` in each of [`ROUNDS`] paired rounds
/// of `iters` calls each, and what `b` adds to `a` round by round. With
/// `alternate`, `b` goes first in every other round, so that neither always
/// finds the caches as the other left them.
pub(crate) fn paired_rounds(
    iters: u32,
    alternate: bool,
    a: Path<'_>,
    b: Path<'_>,
) -> [Vec<f64>; 3] {
    let mut out = Vec::with_capacity(64);
    let mut region = Some(HeapRegion::new(BYTES));
    let mut time = |f: &mut dyn FnMut(HeapRegion, &mut Vec<HostCompletion>) -> HeapRegion| {
        let start = Instant::now();
        for _ in 0..iters {
            let r = region.take().expect("region back");
            region = Some(black_box(f(r, &mut out)));
        }
        start.elapsed().as_nanos() as f64 / f64::from(iters)
    };
    let [mut a_ns, mut b_ns, mut added] = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..=ROUNDS {
        let (a_round, b_round) = if alternate && round % 2 == 1 {
            let b_round = time(&mut *b);
            (time(&mut *a), b_round)
        } else {
            let a_round = time(&mut *a);
            (a_round, time(&mut *b))
        };
        if round == 0 {
            continue; // warm-up
        }
        a_ns.push(a_round);
        b_ns.push(b_round);
        added.push(b_round - a_round);
    }
    [a_ns, b_ns, added]
}

/// The `p` quantile of `v` (0: the least, 1: the most), sorting it.
pub(crate) fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// How to report what paired rounds of two paths measured: a line of the
/// two medians, then what the second adds, and whether that is within
/// its target.
pub(crate) struct Report {
    /// The first line's start, and what each call is: the rounds and the
    /// calls in each stand between them, in brackets.
    pub(crate) title: [&'static str; 2],
    /// The two paths' names, and the second's where it adds to the first.
    pub(crate) names: [&'static str; 3],
    /// Whether the extremes of what it adds are given too.
    pub(crate) range: bool,
    /// The most it may add, ns a call.
    pub(crate) target: f64,
}

impl Report {
    /// Runs [`paired_rounds`] of `iters` calls of `a` and `b` and prints
    /// what they measured.
    pub(crate) fn run(&self, iters: u32, alternate: bool, a: Path<'_>, b: Path<'_>) {
        let [mut a, mut b, mut added] = paired_rounds(iters, alternate, a, b);
        let q = quantile;
        let [a_name, b_name, adds] = self.names;
        let [lead, per] = self.title;
        let median = q(&mut added, 0.5);
        println!(
            "{lead}({ROUNDS} x {iters}{per}): {a_name} {:.1} ns, {b_name} {:.1} ns (medians)",
            q(&mut a, 0.5),
            q(&mut b, 0.5)
        );
        let range = if self.range {
            format!(
                ", range {:.1} to {:.1}",
                q(&mut added, 0.0),
                q(&mut added, 1.0)
            )
        } else {
            String::new()
        };
        println!(
            "  {adds} adds {median:.1} ns (median; quartiles {:.1} to {:.1}{range})",
            q(&mut added, 0.25),
            q(&mut added, 0.75)
        );
        let (target, verdict) = (self.target, verdict(median, self.target));
        println!("  target: {adds} adds at most {target} ns: {verdict} ({median:.1} ns)");
    }
}

/// "met" or "NOT met": whether `value` is within `target`.
pub(crate) fn verdict(value: f64, target: f64) -> &'static str {
    if value <= target {
        "met"
    } else {
        "NOT met"
    }
}

/// The median of `v` (its middle value, the upper one of an even count),
/// sorting it.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of the round-by-round ratios `a / b` (paired rounds).
pub(crate) fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&mut r)
}

/// ns per item of `iters` calls of `f`, each moving `items` items.
pub(crate) fn ns_per_item(iters: u32, items: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iters) / items as f64
}

/// Every one of `paths` in turn (`time` measures one), round after round,
/// [`ROUNDS`] rounds after one of warm-up: each path's figures, one a
/// round.
pub(crate) fn each_in_turn(paths: &[&str], mut time: impl FnMut(&str) -> f64) -> Vec<Vec<f64>> {
    let mut all: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for round in 0..=ROUNDS {
        let this: Vec<f64> = paths.iter().map(|p| time(p)).collect();
        if round == 0 {
            continue; // warm-up
        }
        for (figures, t) in all.iter_mut().zip(this) {
            figures.push(t);
        }
    }
    all
}

/// `--path P [--iterations N]` on the command line: the path to run
/// alone (for callgrind) and how many iterations (10,000 by default).
pub(crate) fn path_alone(args: &[String]) -> Option<(String, u32)> {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let path = value("--path")?;
    let iters = value("--iterations")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    Some((path, iters))
}

/// Whether criterion was asked to run the benches (not to list them or
/// to profile): the paired rounds run after its groups only then.
pub(crate) fn benching(args: &[String]) -> bool {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    has("--bench") && !has("--list") && !has("--profile-time")
}

/// A bench of paths on the null sink, each iteration moving `ITEMS`
/// items (pieces, completions), run by [`bench_main`].
pub(crate) trait Paths {
    /// The paths, in the order of the summary.
    const PATHS: &'static [&'static str];
    /// Items moved per iteration.
    const ITEMS: usize;
    /// One iteration of `path`.
    fn run(&mut self, path: &str);
    /// The paired rounds' summary, after criterion's groups.
    fn paired(&mut self);

    /// ns per item of `path`, over `iters` iterations.
    fn time(&mut self, path: &str, iters: u32) -> f64 {
        ns_per_item(iters, Self::ITEMS, || self.run(path))
    }
}

/// A null-sink bench's `main`: with `--path P [--iterations N]`, that path
/// alone (for callgrind); otherwise criterion's group `group` of every
/// path, then the paired rounds. An `item` is what an iteration moves
/// `R::ITEMS` of ("piece").
pub(crate) fn bench_main<R: Paths>(rig: &mut R, group: &str, item: &str) {
    let args: Vec<String> = std::env::args().collect();
    if let Some((path, iters)) = path_alone(&args) {
        let ns = rig.time(&path, iters);
        let n = R::ITEMS;
        println!("{path}: {iters} iterations of {n} {item}s, {ns:.1} ns per {item}");
        return;
    }
    let mut c = criterion::Criterion::default().configure_from_args();
    let mut group = c.benchmark_group(group);
    group.throughput(criterion::Throughput::Elements(R::ITEMS as u64));
    for &path in R::PATHS {
        group.bench_function(path, |b| b.iter(|| rig.run(path)));
    }
    group.finish();
    if benching(&args) {
        rig.paired();
    }
}
