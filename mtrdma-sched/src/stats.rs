//! The statistics mtrdma reports (the simulator, the benchmarks, the
//! examples), defined once.

/// Jain's fairness index of `xs`: `(sum x)^2 / (n * sum x^2)`, 1 when all
/// are equal, `1/n` when one gets everything. 1 for an empty or all-zero
/// input (nothing to be unfair about).
///
/// ```
/// use mtrdma_sched::stats::jain_index;
/// assert_eq!(jain_index(&[2.0, 2.0, 2.0]), 1.0);
/// assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
/// ```
pub fn jain_index(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

/// The `p`-quantile (0 < p <= 1) of sorted `xs` by nearest rank (the
/// smallest sample with at least `p` of the samples at or below it);
/// `None` for no samples.
///
/// ```
/// use mtrdma_sched::stats::percentile;
/// let xs: Vec<u64> = (1..=1000).collect();
/// assert_eq!(percentile(&xs, 0.5), Some(500));
/// assert_eq!(percentile(&xs, 0.999), Some(999));
/// assert_eq!(percentile::<u64>(&[], 0.5), None);
/// ```
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}
