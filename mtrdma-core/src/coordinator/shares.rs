//! The coordinator's decisions, apart from its socket and its table: from
//! what each tenant's counters say it moved and wants over an interval,
//! the rates it publishes (weighted max-min fair), the gains on its delay
//! windows' growth, the link estimate and sharing weight, and the
//! one-piece floor's permits. It is fed the counters and the time and
//! touches nothing else, so it runs in virtual time in tests.

use std::collections::{BTreeMap, HashMap};

use crate::fairshare::{weighted_max_min, Demand};
use crate::link_observer::{LinkObserver, LinkSignals};
use crate::policy::{LinkConfig, TenantEntry};
use crate::table::DemandCounters;
use crate::TenantId;
use mtrdma_sched::piece_floor::{FloorControl, Permit, Shift};
use mtrdma_sched::share::{ShareGains, TenantRate};
use mtrdma_sched::{Nanos, Protection, TrafficClass};

/// A tenant's windows count as contending for the link (for the one-piece
/// floor) for this long after they last judged a piece: a tenant with a
/// quiet interval is not taken for one that left.
const FLOOR_SENDER_MEMORY_NS: u64 = 1_000_000_000;

/// What the table says of one tenant of the policy at a recomputation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading<'a> {
    /// Its entry in the policy.
    pub(crate) entry: &'a TenantEntry,
    /// Its slot in the table.
    pub(crate) slot: u32,
    /// Its counters (bytes posted, work requests, backlog, what its
    /// windows judged).
    pub(crate) counters: DemandCounters,
    /// What its latency queue pairs last reported of the floor
    /// (`Shift::to_word`; 0: nothing).
    pub(crate) delay_shift: u64,
}

/// What to publish for one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) id: TenantId,
    pub(crate) slot: u32,
    /// Its rate, bytes per second.
    pub(crate) fair_rate: u64,
    /// What it wanted, bytes per second, within its own caps but not its
    /// host's share of a cluster-wide one ([`crate::cluster::ALL`]: all it
    /// can get): what the host reports of it to the cluster.
    pub(crate) wants: u64,
    /// The gain on its windows' growth, ppm (0: none).
    pub(crate) window_gain: u32,
    /// Its one-piece floor permit (`Permit::to_word`).
    pub(crate) floor_permit: u64,
}

/// What to publish of the link: nothing on the first recomputation, which
/// has no interval to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkDecision {
    /// What the tenants move together lately, bytes per second.
    pub(crate) estimate: u64,
    /// The weights of the tenants whose windows contend, added up, as far
    /// as the link is full (0: none).
    pub(crate) sharing_weight: u32,
}

/// One recomputation's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    /// Per tenant, in the order of the readings.
    pub(crate) tenants: Vec<Decision>,
    pub(crate) link: Option<LinkDecision>,
}

/// What the recomputations remember between them.
#[derive(Debug)]
pub(crate) struct Shares {
    /// Per tenant of the policy: its slot and counters at the last
    /// recomputation (a tenant a reload removes is forgotten, so that one
    /// brought back, or given another slot, is measured afresh).
    last_counters: HashMap<TenantId, (u32, DemandCounters)>,
    /// When the last recomputation ran (0: never).
    last_ns: u64,
    /// What the tenants move and what their windows judge.
    link: LinkObserver,
    /// The gains on the tenants' windows' growth, from what each moved
    /// (`None`: turned off, every gain 1).
    gains: Option<ShareGains>,
    /// The one-piece floor (`None`: turned off), and when each tenant's
    /// windows last judged a piece.
    floor: Option<FloorControl>,
    windows_seen: HashMap<TenantId, u64>,
    /// The windowed senders in the order they came: the floor is given
    /// to the first of them, so that one that comes does not take it from
    /// one that has it.
    floor_order: Vec<TenantId>,
    /// This host's shares of cluster-wide limits, bytes per second, by
    /// tenant id.
    cluster_shares: BTreeMap<u32, u64>,
}

impl Default for Shares {
    fn default() -> Shares {
        Shares {
            last_counters: HashMap::new(),
            last_ns: 0,
            link: LinkObserver::default(),
            gains: Some(ShareGains::default()),
            floor: Some(FloorControl::default()),
            windows_seen: HashMap::new(),
            floor_order: Vec::new(),
            cluster_shares: BTreeMap::new(),
        }
    }
}

impl Shares {
    /// When the last recomputation ran (0: never).
    pub(crate) fn last_ns(&self) -> u64 {
        self.last_ns
    }

    /// This host's shares of cluster-wide limits (bytes per second by
    /// tenant id), which cap those tenants' rates from the next step on.
    pub(crate) fn set_cluster_shares(&mut self, shares: BTreeMap<u32, u64>) {
        self.cluster_shares = shares;
    }

    /// The gains on, or off (every gain 1).
    pub(crate) fn set_window_gains(&mut self, on: bool) {
        if on != self.gains.is_some() {
            self.gains = on.then(ShareGains::default);
        }
    }

    /// The one-piece floor on, or off.
    pub(crate) fn set_piece_floor(&mut self, on: bool) {
        if on != self.floor.is_some() {
            self.floor = on.then(FloorControl::default);
        }
    }

    /// The share of bytes the windows judged over their target lately.
    pub(crate) fn over_share(&self) -> f64 {
        self.link.over_share()
    }

    /// The floor's state: tenants granted it, windowed senders, and
    /// withdrawals so far (all 0 with the floor off).
    pub(crate) fn floor_counts(&self) -> (usize, usize, u64) {
        self.floor
            .as_ref()
            .map_or((0, 0, 0), |f| (f.granted(), f.senders(), f.withdrawals()))
    }

    /// Recomputes from `readings` (the policy's tenants in id order) at
    /// `now_ns`, on `link` (the policy's), the table holding
    /// `estimate_before` as the link estimate, each tenant with a share of
    /// a cluster-wide limit ([`Shares::set_cluster_shares`]) held to it
    /// too.
    ///
    /// A tenant with bytes waiting in its backlog wants all it can get (up
    /// to its cap); one without wants what it sent, with 25% headroom to
    /// grow. Every tenant is published at least its weighted share of the
    /// capacity among the active tenants (an idle one the share it would
    /// get by becoming active), so a tenant that starts to want more can
    /// take its share at once rather than 25% more every interval.
    pub(crate) fn step(
        &mut self,
        now_ns: u64,
        link: &LinkConfig,
        estimate_before: Option<u64>,
        readings: &[Reading<'_>],
    ) -> Step {
        let elapsed = now_ns.saturating_sub(self.last_ns).max(1);
        let first = self.last_ns == 0;
        self.last_ns = now_ns;
        let per_sec = |bytes: u64| (u128::from(bytes) * 1_000_000_000 / u128::from(elapsed)) as u64;
        let mut demands = Vec::with_capacity(readings.len());
        let mut wants = Vec::with_capacity(readings.len());
        let mut moved = Vec::with_capacity(readings.len());
        let mut signals = LinkSignals::default();
        for r in readings {
            let (t, now) = (r.entry, r.counters);
            let before = match self.last_counters.insert(t.id, (r.slot, now)) {
                Some((was, before)) if was == r.slot => before,
                _ => now,
            };
            let observed = per_sec(now.posted.saturating_sub(before.posted));
            signals.moved = signals.moved.saturating_add(observed);
            signals.judged = signals
                .judged
                .saturating_add(now.judged.saturating_sub(before.judged));
            signals.over_target = signals
                .over_target
                .saturating_add(now.over_target.saturating_sub(before.over_target));
            let demand = if now.backlog > 0 {
                u64::MAX
            } else if first {
                0
            } else {
                observed.saturating_add(observed / 4)
            };
            // A work-request cap bounds the bytes too, at the tenant's
            // bytes per work request: a tenant flooding small requests at
            // its cap is held by it, and contends for nothing more.
            let wrs = now.wrs.saturating_sub(before.wrs);
            let bytes = now.posted.saturating_sub(before.posted);
            let by_wrs = t.schedule.wr_cap.filter(|_| wrs > 0).map(|c| {
                let b = u128::from(c.per_second) * u128::from(bytes) / u128::from(wrs);
                u64::try_from(b).unwrap_or(u64::MAX)
            });
            let own_cap = match (t.schedule.byte_cap.map(|c| c.per_second), by_wrs) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            wants.push(own_cap.map_or(demand, |c| demand.min(c)));
            let cap = match (own_cap, self.cluster_shares.get(&t.id.0)) {
                (Some(a), Some(&b)) => Some(a.min(b)),
                (a, b) => a.or(b.copied()),
            };
            demands.push(Demand {
                weight: t.schedule.weight,
                demand,
                cap,
            });
            // The gains act on delay windows: a tenant whose windows judged
            // nothing in the interval (no windows, or nothing completed)
            // does not contend for them. Counted as contending, a flood of
            // small requests with no window, slower than its cap (an
            // atomic's round trip holds it), pulled the victim's gain to
            // 0.7 and left it half of what it moves alone.
            let windowed = now.judged > before.judged;
            if windowed {
                self.windows_seen.insert(t.id, now_ns);
            }
            moved.push(TenantRate {
                id: t.id,
                weight: t.schedule.weight,
                bytes_per_sec: observed,
                wants_more: now.backlog > 0 && windowed,
                cap,
            });
        }
        // Tenants no longer in the policy are forgotten.
        let present = |id: &TenantId| readings.binary_search_by_key(id, |r| r.entry.id).is_ok();
        self.last_counters.retain(|id, _| present(id));
        self.windows_seen.retain(|id, _| present(id));
        let mut link_decision = None;
        let mut estimate = estimate_before;
        if !first {
            if let Some(gains) = self.gains.as_mut() {
                // Windows of tenants in separate processes: each grows by
                // its gain so that what they move follows their weights.
                gains.update(Nanos(now_ns), &moved);
            }
            let measured = self.link.update(now_ns, elapsed, signals);
            // The windows share their growth as far as the link is full.
            let used = self.link.utilization_ppm();
            let sharing_weight = self.gains.as_ref().map_or(0, |g| {
                mtrdma_sched::share::sharing_for(g.sharing_weight(), used)
            });
            link_decision = Some(LinkDecision {
                estimate: measured,
                sharing_weight,
            });
            estimate = (measured != 0).then_some(measured);
        }
        let floor_permits = self.piece_floor(now_ns, link, estimate, readings);
        let capacity = link.capacity_bytes_per_sec;
        let rates = weighted_max_min(capacity, &demands);
        let active_weight: u128 = demands
            .iter()
            .filter(|d| d.effective() > 0)
            .map(|d| u128::from(d.weight.max(1)))
            .sum();
        let tenants = readings
            .iter()
            .zip(&demands)
            .zip(rates)
            .zip(floor_permits)
            .zip(wants)
            .map(|((((r, d), rate), permit), wants)| {
                // Its weighted share among the active tenants (with itself
                // counted in if idle), within its cap.
                let w = u128::from(d.weight.max(1));
                let among = if d.effective() == 0 {
                    active_weight + w
                } else {
                    active_weight
                };
                let share = (u128::from(capacity) * w / among.max(1)) as u64;
                let share = d.cap.map_or(share, |c| c.min(share));
                Decision {
                    id: r.entry.id,
                    slot: r.slot,
                    fair_rate: rate.max(share),
                    wants,
                    window_gain: self.gains.as_ref().map_or(0, |g| g.gain(r.entry.id)),
                    floor_permit: permit.to_word(),
                }
            })
            .collect();
        Step {
            tenants,
            link: link_decision,
        }
    }

    /// The one-piece floor's step at `now_ns` (`mtrdma_sched::piece_floor`):
    /// the latency tenants' reports in, the permit of each reading out.
    /// The windowed senders are the bulk tenants whose windows judged a
    /// piece within [`FLOOR_SENDER_MEMORY_NS`], in the order they came
    /// (those that came together in id order); steps are judged by the
    /// time a piece of the policy's bound takes at the link's measured
    /// rate, `estimate` (`FloorControl::update`). With no bound, no
    /// measured rate or the floor turned off, every permit is off.
    fn piece_floor(
        &mut self,
        now_ns: u64,
        link: &LinkConfig,
        estimate: Option<u64>,
        readings: &[Reading<'_>],
    ) -> Vec<Permit> {
        let off = |floor: &FloorControl| Permit {
            on: false,
            generation: floor.permit(None).generation,
        };
        let Some(floor) = self.floor.as_mut() else {
            return vec![Permit::OFF; readings.len()];
        };
        let piece = link
            .latency_bound
            .and_then(|b| Protection::for_bound(b).ok())
            .map(|p| p.piece_bytes);
        let seen = &self.windows_seen;
        let is_sender = |t: &TenantEntry| {
            t.class == TrafficClass::Bulk
                && seen
                    .get(&t.id)
                    .is_some_and(|&at| now_ns.saturating_sub(at) <= FLOOR_SENDER_MEMORY_NS)
        };
        let order = &mut self.floor_order;
        order.retain(|id| {
            readings
                .iter()
                .any(|r| r.entry.id == *id && is_sender(r.entry))
        });
        for r in readings {
            if is_sender(r.entry) && !order.contains(&r.entry.id) {
                order.push(r.entry.id);
            }
        }
        let (Some(piece), Some(rate)) = (piece, estimate) else {
            floor.update(Nanos(now_ns), Shift::default(), Nanos::ZERO, 0);
            return readings.iter().map(|_| off(floor)).collect();
        };
        let senders = order.len();
        let reports = readings
            .iter()
            .filter(|r| r.entry.class == TrafficClass::Latency)
            .map(|r| Shift::from_word(r.delay_shift));
        let report = FloorControl::merge(floor.permit(None), reports);
        let piece_ns = u128::from(piece) * 1_000_000_000 / u128::from(rate.max(1));
        let piece_time = Nanos(u64::try_from(piece_ns).unwrap_or(u64::MAX));
        floor.update(Nanos(now_ns), report, piece_time, senders);
        readings
            .iter()
            .map(|r| {
                if let Some(index) = order.iter().position(|id| *id == r.entry.id) {
                    floor.permit(Some(index))
                } else if r.entry.class == TrafficClass::Latency {
                    floor.permit(None)
                } else {
                    off(floor)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RateLimit;

    const SEC: u64 = 1_000_000_000;
    /// 1 GB/s of capacity.
    const CAPACITY: u64 = 1_000_000_000;

    fn link() -> LinkConfig {
        LinkConfig::new(CAPACITY)
    }

    /// Counters that say `posted` bytes so far, `backlog` waiting, and
    /// windows that judged `judged` bytes.
    fn counters(posted: u64, backlog: u64, judged: u64) -> DemandCounters {
        DemandCounters {
            posted,
            backlog,
            judged,
            over_target: 0,
            wrs: posted / 4096,
        }
    }

    fn reading(entry: &TenantEntry, slot: u32, c: DemandCounters) -> Reading<'_> {
        Reading {
            entry,
            slot,
            counters: c,
            delay_shift: 0,
        }
    }

    fn rates(step: &Step) -> Vec<u64> {
        step.tenants.iter().map(|d| d.fair_rate).collect()
    }

    #[test]
    fn backlogged_tenants_split_the_capacity_by_weight() {
        let a = TenantEntry::new(TenantId(1), "a").with_weight(1);
        let b = TenantEntry::new(TenantId(2), "b").with_weight(3);
        let mut s = Shares::default();
        let mut at = |t: u64, posted: u64| {
            let c = counters(posted, 1 << 20, 0);
            s.step(
                t * SEC,
                &link(),
                None,
                &[reading(&a, 0, c), reading(&b, 1, c)],
            )
        };
        let first = at(1, 0);
        assert_eq!(
            first.link, None,
            "the first step has no interval to measure"
        );
        assert_eq!(rates(&at(2, 1 << 20)), vec![CAPACITY / 4, CAPACITY * 3 / 4]);
    }

    #[test]
    fn a_tenant_without_backlog_wants_what_it_sent_and_an_idle_one_keeps_its_share() {
        let a = TenantEntry::new(TenantId(1), "a");
        let b = TenantEntry::new(TenantId(2), "b");
        let c = TenantEntry::new(TenantId(3), "c");
        let mut s = Shares::default();
        let step = |s: &mut Shares, t: u64, a_posted: u64, b_posted: u64| {
            s.step(
                t * SEC,
                &link(),
                None,
                &[
                    reading(&a, 0, counters(a_posted, 0, 0)),
                    reading(&b, 1, counters(b_posted, 1, 0)),
                    reading(&c, 2, counters(0, 0, 0)),
                ],
            )
        };
        step(&mut s, 1, 0, 0);
        // a sent 100 MB/s with nothing waiting: 125 MB/s is what it wants,
        // but it is published at least its share among a and b (a half);
        // b, backlogged, takes the rest; c, idle, the third it would get
        // by becoming active.
        let got = step(&mut s, 2, 100_000_000, 0);
        assert_eq!(got.tenants[0].fair_rate, CAPACITY / 2);
        assert_eq!(got.tenants[1].fair_rate, CAPACITY - 125_000_000);
        assert_eq!(got.tenants[2].fair_rate, CAPACITY / 3);
        // The link estimate is what they moved together.
        assert_eq!(got.link.map(|l| l.estimate), Some(100_000_000));
    }

    #[test]
    fn a_capped_tenant_is_held_to_its_cap_and_the_rest_goes_to_the_others() {
        let a = TenantEntry::new(TenantId(1), "a").with_rate(RateLimit::new(100_000_000, 1 << 16));
        let b = TenantEntry::new(TenantId(2), "b");
        let mut s = Shares::default();
        for t in 1..=2 {
            let c = counters(t << 20, 1 << 20, 0);
            let got = s.step(
                t * SEC,
                &link(),
                None,
                &[reading(&a, 0, c), reading(&b, 1, c)],
            );
            if t == 2 {
                assert_eq!(rates(&got), vec![100_000_000, CAPACITY - 100_000_000]);
            }
        }
    }

    #[test]
    fn a_hosts_share_of_a_cluster_cap_holds_its_tenant_with_its_own_cap() {
        let a = TenantEntry::new(TenantId(1), "a").with_rate(RateLimit::new(300_000_000, 1 << 16));
        let b = TenantEntry::new(TenantId(2), "b");
        let mut s = Shares::default();
        s.set_cluster_shares([(1, 200_000_000)].into_iter().collect());
        for t in 1..=2 {
            let busy = counters(t << 20, 1 << 20, 0);
            let got = s.step(
                t * SEC,
                &link(),
                None,
                &[reading(&a, 0, busy), reading(&b, 1, busy)],
            );
            if t == 2 {
                assert_eq!(rates(&got), vec![200_000_000, CAPACITY - 200_000_000]);
                // What it reports wanting is within its own cap, not the
                // cluster's share (which the others' demands decide).
                assert_eq!(got.tenants[0].wants, 300_000_000);
                assert_eq!(got.tenants[1].wants, crate::cluster::ALL);
            }
        }
        // A share above its own cap: the own cap holds.
        s.set_cluster_shares([(1, 500_000_000)].into_iter().collect());
        let busy = counters(3 << 20, 1 << 20, 0);
        let got = s.step(
            3 * SEC,
            &link(),
            None,
            &[reading(&a, 0, busy), reading(&b, 1, busy)],
        );
        assert_eq!(got.tenants[0].fair_rate, 300_000_000);
    }

    #[test]
    fn a_tenant_gone_from_the_policy_and_back_is_measured_afresh() {
        let a = TenantEntry::new(TenantId(1), "a");
        let b = TenantEntry::new(TenantId(2), "b");
        let mut s = Shares::default();
        let both = |s: &mut Shares, t: u64, a_posted: u64| {
            s.step(
                t * SEC,
                &link(),
                None,
                &[
                    reading(&a, 0, counters(a_posted, 0, 0)),
                    reading(&b, 1, counters(0, 0, 0)),
                ],
            )
        };
        both(&mut s, 1, 0);
        both(&mut s, 2, 0);
        // a leaves the policy while it posts 100 GB...
        s.step(3 * SEC, &link(), None, &[reading(&b, 1, counters(0, 0, 0))]);
        // ...and comes back: what it posted while out is not one
        // interval's traffic.
        let back = both(&mut s, 4, 100_000_000_000);
        assert_eq!(back.link.map(|l| l.estimate), Some(0));
        // One interval later it is measured from where it came back.
        let next = both(&mut s, 5, 100_000_000_000 + 2_000_000);
        assert_eq!(next.link.map(|l| l.estimate), Some(2_000_000));
    }

    #[test]
    fn without_a_latency_bound_or_with_the_floor_off_no_permit_is_given() {
        let bulk = TenantEntry::new(TenantId(1), "bulk");
        let lat = TenantEntry::new(TenantId(2), "lat").with_class(TrafficClass::Latency);
        let bounded = LinkConfig::new(CAPACITY).with_latency_bound(16 << 10);
        for (link, floor) in [(link(), true), (bounded, false)] {
            let mut s = Shares::default();
            s.set_piece_floor(floor);
            for t in 1..=5 {
                // The bulk tenant's windows judge a piece every interval.
                let c = counters(t * (1 << 20), 1 << 20, t * (1 << 20));
                let got = s.step(
                    t * SEC,
                    &link,
                    Some(100_000_000),
                    &[reading(&bulk, 0, c), reading(&lat, 1, counters(0, 0, 0))],
                );
                assert!(
                    got.tenants
                        .iter()
                        .all(|d| Permit::from_word(d.floor_permit).is_none_or(|p| !p.on)),
                    "{got:?}"
                );
            }
            assert_eq!(s.floor_counts().0, 0);
        }
    }

    #[test]
    fn gains_turned_off_publish_none() {
        let a = TenantEntry::new(TenantId(1), "a");
        let mut s = Shares::default();
        s.set_window_gains(false);
        for t in 1..=3 {
            let c = counters(t << 20, 1 << 20, t << 20);
            let got = s.step(t * SEC, &link(), None, &[reading(&a, 0, c)]);
            assert_eq!(got.tenants[0].window_gain, 0);
            if let Some(l) = got.link {
                assert_eq!(l.sharing_weight, 0);
            }
        }
    }
}
