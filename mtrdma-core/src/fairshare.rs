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
use std::collections::BinaryHeap;

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
///   division go one at a time to the tenant whose next byte stands
///   lowest per unit of weight (ties to the larger remainder, then to the
///   earlier tenant), so the result is deterministic.
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

    // Everyone in `rest` is held at the level L = left / weight_left per
    // unit of weight: floor(left * w / weight_left) each, at or below L.
    // Each still gets no more than its demand: e / w >= the first one's
    // > L, so e > L * w >= floor, so e >= floor + 1. The bytes lost to
    // rounding (fewer than rest.len()) are then given one at a time, as
    // water-filling in whole bytes would: each to the tenant whose next
    // byte stands lowest, (a + 1) / w, until its demand is met. A byte
    // that completes one tenant's demand must not go ahead of another's
    // lower next byte (the other would stay short while it stands higher),
    // and a tenant may take more than one of them. Ties go to the larger
    // remainder, then to the earlier tenant, so the result is
    // deterministic.
    let mut next = BinaryHeap::with_capacity(rest.len());
    let mut given: u128 = 0;
    for &i in rest {
        let share = left * demands[i].weight();
        let floor = share / weight_left;
        alloc[i] = u64::try_from(floor).unwrap_or(u64::MAX);
        given += floor;
        next.push(NextByte {
            level: floor + 1,
            weight: demands[i].weight(),
            remainder: share % weight_left,
            tenant: i,
        });
    }
    let mut leftover = left - given;
    while leftover > 0 {
        let Some(mut lowest) = next.pop() else {
            break;
        };
        let i = lowest.tenant;
        alloc[i] += 1;
        leftover -= 1;
        if alloc[i] < demands[i].effective() {
            lowest.level += 1;
            next.push(lowest);
        }
    }
    alloc
}

/// A tenant's next byte in [`weighted_max_min`]'s rounding: it would bring
/// the tenant to `level / weight` per unit of weight. Ordered so that a
/// max-heap pops the lowest level first (then the larger remainder, then
/// the earlier tenant).
#[derive(Debug, PartialEq, Eq)]
struct NextByte {
    level: u128,
    weight: u128,
    remainder: u128,
    tenant: usize,
}

impl Ord for NextByte {
    fn cmp(&self, other: &Self) -> Ordering {
        // level_a / w_a vs level_b / w_b, cross-multiplied: a level is at
        // most 2^64 and a weight below 2^32, so each product < 2^96.
        (other.level * self.weight)
            .cmp(&(self.level * other.weight))
            .then(self.remainder.cmp(&other.remainder))
            .then(other.tenant.cmp(&self.tenant))
    }
}

impl PartialOrd for NextByte {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
