use super::*;
use crate::policy::ClusterTenant;
use crate::TenantId;
use proptest::prelude::*;

const MBIT: u64 = 125_000;

fn capped(id: u32, cap: u64) -> ClusterTenant {
    ClusterTenant {
        id: TenantId(id),
        cap: Some(cap),
        weight: 1,
    }
}

fn demands(pairs: &[(u32, u64)]) -> BTreeMap<u32, u64> {
    pairs.iter().copied().collect()
}

fn report(host: &str, pairs: &[(u32, u64)]) -> HostReport {
    HostReport {
        host: host.into(),
        demands: demands(pairs),
        policy_revision: 0,
    }
}

/// Every host's share of tenant `id`, each computed as that host would
/// from the same reports.
fn every_share(cluster: &ClusterPolicy, reports: &[HostReport], id: u32) -> Vec<u64> {
    reports
        .iter()
        .map(|me| {
            let others: Vec<&HostReport> = reports.iter().collect();
            let shares = host_shares(cluster, &me.host, &me.demands, &others);
            shares.get(&id).copied().unwrap_or(0)
        })
        .collect()
}

#[test]
fn a_cluster_cap_is_split_by_demand_and_an_idle_hosts_share_goes_to_the_busy_one() {
    let cluster = ClusterPolicy {
        capacity: None,
        tenants: vec![capped(1, 100 * MBIT)],
    };
    let both_busy = [report("a", &[(1, ALL)]), report("b", &[(1, ALL)])];
    assert_eq!(every_share(&cluster, &both_busy, 1), [50 * MBIT, 50 * MBIT]);
    let one_modest = [report("a", &[(1, 20 * MBIT)]), report("b", &[(1, ALL)])];
    assert_eq!(
        every_share(&cluster, &one_modest, 1),
        [20 * MBIT, 80 * MBIT]
    );
    let one_idle = [report("a", &[(1, 0)]), report("b", &[(1, ALL)])];
    assert_eq!(every_share(&cluster, &one_idle, 1), [0, 100 * MBIT]);
    // Nobody wants it all: what is left is spread, so either may grow.
    let both_modest = [
        report("a", &[(1, 10 * MBIT)]),
        report("b", &[(1, 30 * MBIT)]),
    ];
    assert_eq!(
        every_share(&cluster, &both_modest, 1),
        [40 * MBIT, 60 * MBIT]
    );
    // A host alone has the whole cap; one that does not report the tenant
    // takes none of it.
    let alone = [report("a", &[(1, ALL)]), report("b", &[(2, ALL)])];
    assert_eq!(every_share(&cluster, &alone, 1), [100 * MBIT, 0]);
}

#[test]
fn a_cluster_capacity_is_shared_by_cluster_weight_across_hosts() {
    let mut heavy = capped(2, u64::MAX);
    heavy.cap = None;
    heavy.weight = 3;
    let mut light = heavy;
    light.id = TenantId(1);
    light.weight = 1;
    let cluster = ClusterPolicy {
        capacity: Some(400 * MBIT),
        tenants: vec![light, heavy],
    };
    // Tenant 1 on both hosts, tenant 2 on b only: 100 and 300 Mbit/s
    // across the cluster, whichever hosts they run on.
    let reports = [report("a", &[(1, ALL)]), report("b", &[(1, ALL), (2, ALL)])];
    let one = every_share(&cluster, &reports, 1);
    let two = every_share(&cluster, &reports, 2);
    assert_eq!(one, [50 * MBIT, 50 * MBIT]);
    assert_eq!(two, [0, 300 * MBIT]);
    // Equal weights: equal parts, wherever the senders are.
    let mut even = cluster.clone();
    even.tenants[1].weight = 1;
    let one: u64 = every_share(&even, &reports, 1).iter().sum();
    let two: u64 = every_share(&even, &reports, 2).iter().sum();
    assert_eq!((one, two), (200 * MBIT, 200 * MBIT));
}

#[test]
fn a_report_is_published_on_a_real_change_and_at_most_every_interval() {
    let mut m = Member::new("a");
    let want = |d| demands(&[(1, d)]);
    assert_eq!(m.to_publish(1, &want(ALL), 0), None, "not connected");
    m.connected(vec![report("a", &[(1, 5)]), report("b", &[(1, ALL)])]);
    assert_eq!(
        m.others().count(),
        1,
        "its own old report is not another host's"
    );
    let first = m
        .to_publish(1, &want(80 * MBIT), 0)
        .expect("published on connecting");
    assert_eq!(first.host, "a");
    let later = MIN_PUBLISH_INTERVAL_NS + 1;
    assert_eq!(
        m.to_publish(later, &want(85 * MBIT), 0),
        None,
        "moved by a sixteenth"
    );
    assert_eq!(
        m.to_publish(2, &want(ALL), 0),
        None,
        "too soon after the last"
    );
    assert!(m.to_publish(later, &want(ALL), 0).is_some());
    assert_eq!(
        m.to_publish(3 * later, &want(ALL), 0),
        None,
        "steady: no write"
    );
    assert!(
        m.to_publish(3 * later, &want(ALL), 7).is_some(),
        "a new policy is said"
    );
    m.connected(Vec::new());
    assert!(
        m.to_publish(3 * later, &want(ALL), 7).is_some(),
        "again after reconnecting"
    );
}

/// Tenant 1 capped at 100 Mbit/s across hosts, and host `a`'s member,
/// connected, with `b` wanting all it can get of it.
fn a_beside_busy_b() -> (Arc<ClusterPolicy>, Member) {
    let cluster = Arc::new(ClusterPolicy {
        capacity: None,
        tenants: vec![capped(1, 100 * MBIT)],
    });
    let mut m = Member::new("a");
    m.connected(vec![report("b", &[(1, ALL)])]);
    (cluster, m)
}

#[test]
fn another_hosts_demand_moves_the_shares_but_writes_no_report_here() {
    let (cluster, mut m) = a_beside_busy_b();
    let own = demands(&[(1, ALL)]);
    assert_eq!(m.shares(&cluster, &own)[&1], 50 * MBIT);
    let changes = m.share_changes();
    assert!(
        m.to_publish(1, &own, 0).is_some(),
        "published on connecting"
    );
    m.heard(report("b", &[(1, 10 * MBIT)]));
    assert_eq!(m.shares(&cluster, &own)[&1], 90 * MBIT);
    assert_eq!(m.share_changes(), changes + 1, "the shares changed once");
    assert_eq!(
        m.to_publish(1 + MIN_PUBLISH_INTERVAL_NS, &own, 0),
        None,
        "its own demands did not move"
    );
    // The same policy again, in another allocation (a reload of the same
    // file): the same shares, no change counted.
    let reloaded = Arc::new((*cluster).clone());
    assert_eq!(m.shares(&reloaded, &own)[&1], 90 * MBIT);
    assert_eq!(m.share_changes(), changes + 1);
    // A new cap is seen, whatever the allocation.
    let raised = Arc::new(ClusterPolicy {
        capacity: None,
        tenants: vec![capped(1, 200 * MBIT)],
    });
    assert_eq!(m.shares(&raised, &own)[&1], 190 * MBIT);
    assert_eq!(m.share_changes(), changes + 2);
}

#[test]
fn without_the_store_the_shares_hold_as_they_were() {
    let (cluster, mut m) = a_beside_busy_b();
    assert_eq!(m.shares(&cluster, &demands(&[(1, ALL)]))[&1], 50 * MBIT);
    m.disconnected();
    m.gone("b");
    assert_eq!(
        m.shares(&cluster, &demands(&[(1, ALL)]))[&1],
        50 * MBIT,
        "no limit lifted while the store is away"
    );
    m.connected(Vec::new());
    assert_eq!(m.shares(&cluster, &demands(&[(1, ALL)]))[&1], 100 * MBIT);
}

#[test]
fn a_stored_report_must_be_the_keys_host_and_well_formed() {
    let r = report("a", &[(1, ALL), (2, 3)]);
    assert_eq!(
        HostReport::from_json("a", r.to_json().as_bytes()),
        Ok(r.clone())
    );
    assert!(HostReport::from_json("b", r.to_json().as_bytes())
        .unwrap_err()
        .contains("names another host"));
    for bad in [&b"{"[..], b"null", b"{\"host\":\"a\"}", b"\xff\xfe"] {
        assert!(HostReport::from_json("a", bad).is_err());
    }
}

proptest! {
    /// However the hosts' demands lie, the shares they compute from the
    /// same reports add up to the tenant's cap, no busy host gets less
    /// than an equal split of what the modest ones leave, and no host
    /// gets less than it wants while another gets more than it wants.
    #[test]
    fn shares_add_up_to_the_cap_and_are_max_min_fair(
        wants in proptest::collection::vec(prop_oneof![Just(ALL), 0u64..200 * MBIT], 1..8),
        cap in 1u64..1_000 * MBIT,
    ) {
        let cluster = ClusterPolicy { capacity: None, tenants: vec![capped(1, cap)] };
        let reports: Vec<HostReport> = wants
            .iter()
            .enumerate()
            .map(|(i, &w)| report(&format!("h{i}"), &[(1, w)]))
            .collect();
        let shares = every_share(&cluster, &reports, 1);
        prop_assert_eq!(shares.iter().sum::<u64>(), cap);
        for (i, &s) in shares.iter().enumerate() {
            let wi = wants[i].min(cap);
            if s < wi {
                // Short of its demand: nobody else holds more than it
                // beyond their own demand.
                for (j, &o) in shares.iter().enumerate() {
                    prop_assert!(o <= s + 1 || o <= wants[j], "{:?} {:?}", wants, shares);
                }
            }
        }
    }
}

/// One step of a member's life: another host's report comes (host, its
/// demands of tenants 1 to 3), or goes, or this host's own tenants
/// change.
#[derive(Debug, Clone)]
enum Step {
    Report(u8, Vec<(u32, u64)>),
    Gone(u8),
    Own(Vec<(u32, u64)>),
}

fn step() -> impl Strategy<Value = Step> {
    let demand = prop_oneof![Just(ALL), Just(0u64), 1u64..300 * MBIT];
    prop_oneof![
        3 => (0u8..5, proptest::collection::vec((1u32..4, demand), 0..4))
            .prop_map(|(h, d)| Step::Report(h, d)),
        1 => (0u8..5).prop_map(Step::Gone),
        1 => proptest::collection::vec((1u32..4, prop_oneof![Just(ALL), 0u64..300 * MBIT]), 0..3)
            .prop_map(Step::Own),
    ]
}

proptest! {
    /// A member keeps the others' demands by tenant as reports come, change
    /// and go, and its own tenants change; whatever the order, its shares
    /// are those computed afresh from the reports it holds, with and
    /// without a cluster capacity.
    #[test]
    fn a_members_shares_follow_its_reports_as_if_computed_afresh(
        steps in proptest::collection::vec(step(), 1..40),
        own in proptest::collection::vec((1u32..4, prop_oneof![Just(ALL), 0u64..300 * MBIT]), 1..3),
        capacity in proptest::option::of(1u64..500 * MBIT),
    ) {
        let cluster = Arc::new(ClusterPolicy {
            capacity,
            tenants: vec![capped(1, 100 * MBIT), capped(2, 200 * MBIT), capped(3, 50 * MBIT)],
        });
        let mut own = demands(&own);
        let mut m = Member::new("h2");
        m.connected(Vec::new());
        for step in steps {
            match step {
                // h2 is the member itself: a report of its name is not
                // another host's.
                Step::Report(h, d) => m.heard(report(&format!("h{h}"), &d)),
                Step::Gone(h) => m.gone(&format!("h{h}")),
                Step::Own(d) => own = demands(&d),
            }
            let others: Vec<HostReport> = m.others().cloned().collect();
            prop_assert!(others.iter().all(|r| r.host != "h2"));
            let refs: Vec<&HostReport> = others.iter().collect();
            let afresh = host_shares(&cluster, "h2", &own, &refs);
            prop_assert_eq!(m.shares(&cluster, &own), &afresh);
        }
    }
}
