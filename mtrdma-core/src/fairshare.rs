//! Weighted max-min fair division of a link's capacity among tenants
//! (water-filling), as the coordinator computes it every few milliseconds.
//!
//! Each tenant asks for a rate (its demand, bounded by its own cap). Tenants
//! that ask for less than their weighted fair share get what they ask for;
//! what they leave is divided again among the others in proportion to their
//! weights, until everyone is either satisfied or held at a common level of
//! rate per unit of weight. Idle tenants get nothing, so their share goes to
//! the others (work conservation).

use std::cmp::Ordering;

/// One tenant's request to [`weighted_max_min`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Demand {
    /// The tenant's weight; a weight of 0 counts as 1.
    pub weight: u32,
    /// Bytes per second the tenant wants; 0 means idle.
    pub demand: u64,
    /// The tenant's own rate cap in bytes per second, if any.
    pub cap: Option<u64>,
}

impl Demand {
    /// What the tenant can use: its demand, bounded by its cap.
    pub fn effective(&self) -> u64 {
        match self.cap {
            Some(cap) => self.demand.min(cap),
            None => self.demand,
        }
    }

    fn weight(&self) -> u128 {
        u128::from(self.weight.max(1))
    }
}

/// Divides `capacity` (bytes/s) among `demands` by weighted max-min
/// fairness and returns each tenant's rate, in the order of `demands`.
///
/// * Each tenant gets at most its effective demand (`min(demand, cap)`);
///   idle tenants (effective demand 0) get 0.
/// * Tenants that cannot be fully served (*unsatisfied*) all get the same
///   rate per unit of weight, to within one byte per second, and no
///   satisfied tenant gets more per unit of weight than they do.
/// * Nothing is wasted: the rates add up to exactly
///   `min(capacity, sum of effective demands)`; bytes left over by integer
///   division go to the unsatisfied tenants with the largest remainders
///   (ties to the earlier tenant), so the result is deterministic.
///
/// Runs in O(n log n) with exact integer arithmetic (128-bit intermediates;
/// no overflow for any `u64` inputs).
///
/// ```
/// use mtrdma_core::{weighted_max_min, Demand};
/// let busy = |weight| Demand { weight, demand: u64::MAX, cap: None };
/// // Weights 1:2:4, all backlogged: 1/7, 2/7 and 4/7 of the link.
/// assert_eq!(weighted_max_min(700, &[busy(1), busy(2), busy(4)]), [100, 200, 400]);
/// // A tenant that wants little gets it; the rest is shared.
/// let small = Demand { weight: 1, demand: 50, cap: None };
/// assert_eq!(weighted_max_min(700, &[small, busy(1), busy(1)]), [50, 325, 325]);
/// ```
pub fn weighted_max_min(capacity: u64, demands: &[Demand]) -> Vec<u64> {
    let mut alloc = vec![0u64; demands.len()];
    // Active tenants, most modest (effective demand per unit of weight) first.
    let mut order: Vec<usize> = (0..demands.len())
        .filter(|&i| demands[i].effective() > 0)
        .collect();
    order.sort_by(|&a, &b| {
        let (da, db) = (&demands[a], &demands[b]);
        // ea / wa vs eb / wb, cross-multiplied: each product < 2^96.
        (u128::from(da.effective()) * db.weight())
            .cmp(&(u128::from(db.effective()) * da.weight()))
            .then(a.cmp(&b))
    });

    let mut left = u128::from(capacity);
    let mut weight_left: u128 = order.iter().map(|&i| demands[i].weight()).sum();
    let mut rest = order.as_slice();
    // Satisfy every tenant whose demand is within its share of what is left.
    while let Some((&i, tail)) = rest.split_first() {
        let d = &demands[i];
        let e = u128::from(d.effective());
        // e <= left * w / weight_left, without division.
        if e.saturating_mul(weight_left) > left * d.weight() {
            break;
        }
        alloc[i] = d.effective();
        left -= e;
        weight_left -= d.weight();
        rest = tail;
    }
    if rest.is_empty() {
        return alloc;
    }

    // Everyone in `rest` is held at the level left / weight_left per unit of
    // weight: floor(left * w / weight_left) each, and the bytes lost to
    // rounding (fewer than rest.len()) one each by largest remainder. Each
    // still gets no more than its demand: e > left * w / weight_left >= floor,
    // so e >= floor + 1.
    let mut remainders = Vec::with_capacity(rest.len());
    let mut given: u128 = 0;
    for &i in rest {
        let share = left * demands[i].weight();
        let floor = share / weight_left;
        alloc[i] = u64::try_from(floor).unwrap_or(u64::MAX);
        given += floor;
        remainders.push((share % weight_left, i));
    }
    remainders.sort_by(|a, b| match b.0.cmp(&a.0) {
        Ordering::Equal => a.1.cmp(&b.1),
        other => other,
    });
    let leftover = usize::try_from(left - given).unwrap_or(usize::MAX);
    for &(_, i) in remainders.iter().take(leftover) {
        alloc[i] += 1;
    }
    alloc
}
