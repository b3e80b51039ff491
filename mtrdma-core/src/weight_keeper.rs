//! Weights across processes where the link's rate is not known: the
//! coordinator holds a tenant that moves more than its weighted share of
//! what the tenants move together, while another that wants more moves
//! less than its own.
//!
//! Delay windows keep the link's queue short but share the link only
//! roughly by weight (on the emulated link the lightest of three weighted
//! tenants got a third more than its share). Dividing the link's nominal
//! rate binds no one below the link, and dividing a measured capacity binds
//! everyone as soon as the measure falls short, which leaves the link
//! partly idle. Here no capacity is guessed: the shares are of what the
//! tenants moved, and only a tenant over its share is paced, at what makes
//! it move its share. A tenant under its share is never paced, so its window takes what
//! the held ones leave, and the link stays as full as the windows keep it.
//!
//! Shares are weighted max-min over what was moved: a tenant with nothing
//! waiting wants what it moves, one with a cap at most its cap. A tenant
//! is *contested* while it has had bytes waiting for
//! [`CONTESTED_INTERVALS`] recomputations in a row (a probe with one
//! request waiting now and then is not) and its share is under its cap (a
//! tenant its cap holds back is paced already). A contested tenant is held
//! when it moves more than its share while another contested one, not
//! held, moves less than its own, both by [`HOLD_MARGIN`]; it stays held while it
//! moves at least its share less [`RELEASE_BELOW`] and another contested
//! tenant is not held. A held tenant is paced at its share, raised by what
//! it misses of it (pacing on a busy host falls a little short).
//!
//! The room a held tenant leaves may go to no one: the tenant short of its
//! share may be held back by its CPU or its peer, not by the link. So holds
//! are on trial: if over [`TRIAL_NS`] the tenants together move
//! [`TRIAL_LOSS`] less than before them, the holds are dropped and none are
//! tried for a second, then two, up to [`MAX_BACKOFF_NS`].

use std::collections::HashMap;

use crate::fairshare::{weighted_max_min, Demand};
use crate::tenant::TenantId;

/// Over how long each tenant's rate is averaged.
pub(crate) const SMOOTHING_NS: f64 = 200e6;
/// A tenant is held when it moves this much more than its share while
/// another moves this much less than its own. Tenants of equal weight whose
/// windows share the link well still differ by several percent from one
/// second to the next on a busy host; holding them for that only costs the
/// link.
pub(crate) const HOLD_MARGIN: f64 = 0.1;
/// How fast a held tenant's pace follows what it misses of its share, per
/// recomputation.
pub(crate) const BOOST_GAIN: f64 = 0.05;
/// The most a held tenant's pace is raised over its share for what it
/// misses.
pub(crate) const MAX_BOOST: f64 = 1.25;
/// A held tenant that moves this far under its share is let go: it is no
/// longer served over its weight.
pub(crate) const RELEASE_BELOW: f64 = 0.15;
/// How long holds run before they are judged on what the tenants move.
pub(crate) const TRIAL_NS: u64 = 1_000_000_000;
/// The share of what the tenants moved before holds that holds may cost.
pub(crate) const TRIAL_LOSS: f64 = 0.05;
/// How long no holds are tried after holds failed a trial, doubling with
/// each failure in a row up to the most.
pub(crate) const MIN_BACKOFF_NS: u64 = 1_000_000_000;
pub(crate) const MAX_BACKOFF_NS: u64 = 16_000_000_000;
/// Recomputations in a row with bytes waiting before a tenant counts as
/// wanting more than it moves.
pub(crate) const CONTESTED_INTERVALS: u32 = 5;

/// One tenant in one recomputation interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    pub(crate) id: TenantId,
    pub(crate) weight: u32,
    /// Its policy's cap (bytes per second), if any.
    pub(crate) cap: Option<u64>,
    /// Whether it has bytes waiting in its backlogs now.
    pub(crate) backlogged: bool,
    /// Bytes per second it posted over the interval.
    pub(crate) rate: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Kept {
    rate: f64,
    streak: u32,
    held: bool,
    /// While held: how much over its share it is paced so that it moves
    /// its share (1 to [`MAX_BOOST`]).
    boost: f64,
}

/// Holds in force: since when, what the tenants moved together before
/// them (or over the last trial they passed), and what they moved since.
#[derive(Debug, Clone, Copy)]
struct Trial {
    since_ns: u64,
    moved_before: f64,
    /// Bytes moved since `since_ns`.
    bytes: f64,
}

/// The tenants' smoothed rates and who is held (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct WeightKeeper {
    kept: HashMap<TenantId, Kept>,
    now_ns: u64,
    trial: Option<Trial>,
    /// No holds before this time (a trial failed).
    quiet_until_ns: u64,
    /// How long the next failed trial keeps holds off.
    backoff_ns: u64,
    /// What the tenants moved together, averaged over about
    /// [`TRIAL_NS`]: the baseline a trial starts from.
    moved_slow: f64,
    /// Tenants held after the last update.
    held: usize,
    /// Trials failed so far.
    failed: u64,
}

impl WeightKeeper {
    /// Takes one interval of `elapsed_ns`; returns, in the order of
    /// `tenants`, the rate each held tenant is paced at (bytes per second)
    /// and `None` for the others.
    pub(crate) fn update(&mut self, elapsed_ns: u64, tenants: &[Moved]) -> Vec<Option<u64>> {
        self.now_ns = self.now_ns.saturating_add(elapsed_ns);
        let alpha = (elapsed_ns as f64 / SMOOTHING_NS).min(1.0);
        self.kept
            .retain(|id, _| tenants.iter().any(|t| t.id == *id));
        let mut kept: Vec<Kept> = tenants
            .iter()
            .map(|t| {
                let k = self.kept.entry(t.id).or_insert(Kept {
                    rate: t.rate as f64,
                    boost: 1.0,
                    ..Kept::default()
                });
                k.rate += alpha * (t.rate as f64 - k.rate);
                k.streak = if t.backlogged {
                    k.streak.saturating_add(1)
                } else {
                    0
                };
                *k
            })
            .collect();
        let total = kept.iter().map(|k| k.rate).sum::<f64>() as u64;
        let demands: Vec<Demand> = tenants
            .iter()
            .zip(&kept)
            .map(|(t, k)| Demand {
                weight: t.weight,
                demand: if t.backlogged {
                    u64::MAX
                } else {
                    k.rate as u64
                },
                cap: t.cap,
            })
            .collect();
        let shares = weighted_max_min(total, &demands);
        let contested: Vec<bool> = demands
            .iter()
            .zip(&kept)
            .zip(&shares)
            .map(|((d, k), &share)| k.streak >= CONTESTED_INTERVALS && share < d.effective())
            .collect();
        // Whether room a held tenant leaves may go to j.
        let takes_room = |j: usize| contested[j] && !kept[j].held;
        let short = |j: usize, by: f64| kept[j].rate < shares[j] as f64 * (1.0 - by);
        let n = tenants.len();
        let held: Vec<bool> = (0..n)
            .map(|i| {
                let (k, share) = (&kept[i], shares[i] as f64);
                if !contested[i] {
                    false
                } else if k.held {
                    // Held while it still moves about its share and some
                    // other tenant is there to take the room (however
                    // close to its own share it has come).
                    k.rate >= share * (1.0 - RELEASE_BELOW)
                        && (0..n).any(|j| j != i && takes_room(j))
                } else {
                    k.rate > share * (1.0 + HOLD_MARGIN)
                        && (0..n).any(|j| j != i && takes_room(j) && short(j, HOLD_MARGIN))
                }
            })
            .collect();
        let now_moved: f64 = tenants.iter().map(|t| t.rate as f64).sum();
        let keep = self.try_holds(held.contains(&true), now_moved, elapsed_ns);
        for ((k, h), &share) in kept.iter_mut().zip(held).zip(&shares) {
            let target = share as f64;
            k.boost = match (k.held, h && keep) {
                // Held on: pacing falls short of its rate on a busy host
                // (a sender woken late), so the pace is raised by what the
                // tenant missed, slowly (the rate it moves lags), and
                // lowered back when it moves more.
                (true, true) if k.rate > 0.0 => {
                    let missed = target / k.rate - 1.0;
                    (k.boost * (1.0 + BOOST_GAIN * missed)).clamp(1.0, MAX_BOOST)
                }
                (_, true) => k.boost,
                (_, false) => 1.0,
            };
            k.held = h && keep;
        }
        self.held = kept.iter().filter(|k| k.held).count();
        tenants
            .iter()
            .zip(&kept)
            .zip(&shares)
            .map(|((t, k), &share)| {
                self.kept.insert(t.id, *k);
                k.held.then(|| (share as f64 * k.boost).max(1.0) as u64)
            })
            .collect()
    }
}

impl WeightKeeper {
    /// How many tenants are held now, and how many times holds were
    /// dropped for leaving the link idle.
    pub(crate) fn held(&self) -> (usize, u64) {
        (self.held, self.failed)
    }

    /// Whether holds may be in force now, given whether any tenant would be
    /// held and what the tenants moved together over the last `elapsed_ns`
    /// (bytes per second): holds under which the tenants move less than
    /// [`TRIAL_LOSS`] under what they moved before, averaged over
    /// [`TRIAL_NS`] (the room the holds leave goes to no one), are dropped,
    /// and none are tried again for a while.
    fn try_holds(&mut self, wanted: bool, moved: f64, elapsed_ns: u64) -> bool {
        let alpha = (elapsed_ns as f64 / TRIAL_NS as f64).min(1.0);
        let before = self.moved_slow;
        self.moved_slow += alpha * (moved - self.moved_slow);
        if !wanted || self.now_ns < self.quiet_until_ns {
            self.trial = None;
            return false;
        }
        let now = self.now_ns;
        let trial = self.trial.get_or_insert(Trial {
            since_ns: now.saturating_sub(elapsed_ns),
            moved_before: before,
            bytes: 0.0,
        });
        trial.bytes += moved * elapsed_ns as f64 / 1e9;
        let ran = now.saturating_sub(trial.since_ns);
        if ran < TRIAL_NS {
            return true;
        }
        let mean = trial.bytes * 1e9 / ran as f64;
        let before = trial.moved_before;
        if mean < before * (1.0 - TRIAL_LOSS) {
            self.trial = None;
            let backoff = self.backoff_ns.max(MIN_BACKOFF_NS);
            self.quiet_until_ns = now.saturating_add(backoff);
            self.backoff_ns = backoff.saturating_mul(2).min(MAX_BACKOFF_NS);
            self.failed += 1;
            tracing::debug!(
                before,
                with_holds = mean,
                backoff_ms = backoff / 1_000_000,
                "weights: holds left the link idle, dropped"
            );
            return false;
        }
        // Passed: judged again over the next trial, against this one.
        *trial = Trial {
            since_ns: now,
            moved_before: mean,
            bytes: 0.0,
        };
        self.backoff_ns = MIN_BACKOFF_NS;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 20_000_000;
    const LINK: f64 = 25e6;

    /// A backlogged tenant of the model link in [`run`].
    #[derive(Clone, Copy)]
    struct Spec {
        weight: u32,
        cap: Option<u64>,
        /// How much of the link its windows take against the others' (the
        /// windows' own split, unrelated to the weights).
        grab: f64,
        /// The most it can move whatever the link (its CPU, its peer).
        room: f64,
    }

    fn spec(weight: u32, grab: f64) -> Spec {
        Spec {
            weight,
            cap: None,
            grab,
            room: LINK,
        }
    }

    /// A link of [`LINK`] bytes/s that the tenants' windows split by their
    /// grab, each within what limits it (its room, and 98% of its cap or of
    /// the rate it is held at: pacing on a busy host falls a little short),
    /// what one leaves going to the others. Returns each tenant's share of
    /// what was moved over the last second of `seconds`, and the link's
    /// use.
    fn run(tenants: &[Spec], seconds: u64) -> (Vec<f64>, f64) {
        let n = tenants.len();
        let mut keeper = WeightKeeper::default();
        let mut held: Vec<Option<u64>> = vec![None; n];
        let ticks = seconds * 1_000_000_000 / TICK;
        let last = 1_000_000_000 / TICK;
        let mut sums = vec![0.0; n];
        for tick in 0..ticks {
            let limits: Vec<f64> = (0..n)
                .map(|i| {
                    let paced = match (held[i], tenants[i].cap) {
                        (Some(h), Some(c)) => Some(h.min(c)),
                        (h, c) => h.or(c),
                    };
                    paced.map_or(LINK, |p| p as f64 * 0.98).min(tenants[i].room)
                })
                .collect();
            // Water-filling by grab within the limits.
            let mut rates = vec![0.0; n];
            let mut open: Vec<usize> = (0..n).collect();
            let mut left = LINK;
            while !open.is_empty() && left > 1.0 {
                let grab: f64 = open.iter().map(|&i| tenants[i].grab).sum();
                let full: Vec<usize> = open
                    .iter()
                    .copied()
                    .filter(|&i| rates[i] + left * tenants[i].grab / grab >= limits[i])
                    .collect();
                if full.is_empty() {
                    for &i in &open {
                        rates[i] += left * tenants[i].grab / grab;
                    }
                    break;
                }
                for &i in &full {
                    left -= limits[i] - rates[i];
                    rates[i] = limits[i];
                }
                open.retain(|i| !full.contains(i));
            }
            let moved: Vec<Moved> = (0..n)
                .map(|i| Moved {
                    id: TenantId(i as u32),
                    weight: tenants[i].weight,
                    cap: tenants[i].cap,
                    backlogged: true,
                    rate: rates[i] as u64,
                })
                .collect();
            held = keeper.update(TICK, &moved);
            if std::env::var("WK_DEBUG").is_ok() && tick % 10 == 0 {
                eprintln!(
                    "{tick} {:?} {:?} {:?}",
                    rates.iter().map(|r| (r / 1e4) as u64).collect::<Vec<_>>(),
                    held.iter()
                        .map(|p| p.map(|p| p / 10_000))
                        .collect::<Vec<_>>(),
                    keeper.held()
                );
            }
            if tick >= ticks - last {
                for (s, r) in sums.iter_mut().zip(&rates) {
                    *s += r;
                }
            }
        }
        let used: f64 = sums.iter().sum();
        (
            sums.iter().map(|s| s / used).collect(),
            used / (last as f64 * LINK),
        )
    }

    fn worst_error(shares: &[f64], weights: &[u32]) -> f64 {
        let total: u32 = weights.iter().sum();
        shares
            .iter()
            .zip(weights)
            .map(|(s, &w)| (s / (f64::from(w) / f64::from(total)) - 1.0).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn holding_the_over_served_brings_the_shares_to_the_weights_and_keeps_the_link_full() {
        // Windows that split the link equally, and ones that favour the
        // lightest tenant or the heaviest, come to within 5% of 1:2:4.
        for grab in [[1.0, 1.0, 1.0], [3.0, 2.0, 1.0], [1.0, 2.0, 8.0]] {
            let tenants = [spec(1, grab[0]), spec(2, grab[1]), spec(4, grab[2])];
            let (shares, used) = run(&tenants, 6);
            assert!(
                worst_error(&shares, &[1, 2, 4]) < 0.05,
                "{grab:?}: {shares:?}"
            );
            assert!(used > 0.97, "{grab:?}: the link {used}");
        }
        // Eight equal tenants whose windows split unevenly.
        let tenants: Vec<Spec> = (1..=8).map(|g| spec(1, f64::from(g))).collect();
        let (shares, used) = run(&tenants, 6);
        assert!(worst_error(&shares, &[1; 8]) < 0.05, "{shares:?}");
        assert!(used > 0.97, "the link {used}");
    }

    #[test]
    fn a_tenant_held_back_by_its_own_cap_makes_no_one_else_be_held() {
        // A cap of a quarter of the link, met at 98%: the free tenant is
        // not held for the capped one's shortfall.
        let capped = Spec {
            cap: Some((LINK / 4.0) as u64),
            ..spec(1, 1.0)
        };
        let (shares, used) = run(&[capped, spec(1, 1.0)], 6);
        assert!(used > 0.99, "the link {used}: {shares:?}");
        assert!(shares[0] < 0.25, "{shares:?}");
    }

    #[test]
    fn a_tenant_held_back_by_something_else_than_the_link_makes_no_one_else_be_held() {
        // The heavier tenant cannot move more than 30% of the link (its
        // CPU), and the windows leave it 20%: holding the lighter one at a
        // fifth of what is moved would idle half the link. The holds fail
        // their trial, and the link stays as full as the windows keep it
        // (but for a trial now and then, ever rarer).
        let heavy = Spec {
            room: 0.3 * LINK,
            ..spec(4, 1.0)
        };
        let (shares, used) = run(&[spec(1, 4.0), heavy], 30);
        assert!(used > 0.97, "the link {used}: {shares:?}");
        assert!(shares[1] > 0.195, "{shares:?}");
    }

    #[test]
    fn a_tenant_with_bytes_waiting_only_now_and_then_holds_no_one() {
        let mut keeper = WeightKeeper::default();
        for tick in 0..200 {
            let held = keeper.update(
                TICK,
                &[
                    // A latency probe: a request waiting every third look.
                    Moved {
                        id: TenantId(1),
                        weight: 4,
                        cap: None,
                        backlogged: tick % 3 == 0,
                        rate: 32_000,
                    },
                    Moved {
                        id: TenantId(2),
                        weight: 1,
                        cap: None,
                        backlogged: true,
                        rate: 20_000_000,
                    },
                ],
            );
            assert_eq!(held, [None, None], "tick {tick}");
        }
    }

    #[test]
    fn a_tenant_that_leaves_is_forgotten() {
        let mut keeper = WeightKeeper::default();
        let busy = |id, rate| Moved {
            id: TenantId(id),
            weight: 1,
            cap: None,
            backlogged: true,
            rate,
        };
        let mut held = Vec::new();
        for _ in 0..20 {
            held = keeper.update(TICK, &[busy(1, 20_000_000), busy(2, 5_000_000)]);
        }
        assert!(held[0].is_some() && held[1].is_none(), "{held:?}");
        // Tenant 2 leaves: tenant 1 is alone and held by no one.
        assert_eq!(keeper.update(TICK, &[busy(1, 20_000_000)]), [None]);
        assert_eq!(keeper.kept.len(), 1);
    }
}
