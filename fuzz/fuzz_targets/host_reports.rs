//! Hosts' reports as etcd hands them over (`hosts/NAME` keys, JSON) from
//! arbitrary bytes: each is a report or an error, never a panic; and the
//! shares every host computes from the reports that were read add up to
//! each cluster-wide tenant's part, never more, whatever they say; and a
//! member that hears them one by one (some going again) computes the
//! shares computed afresh from the reports it holds.
#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use mtrdma_core::cluster::{host_shares, HostReport, Member};
use mtrdma_core::{ClusterPolicy, ClusterTenant, TenantId};

fuzz_target!(|data: &[u8]| {
    // The first bytes set the limits; the rest are reports, one a line.
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let cap = 1 + u64::from(head) * 1_000_000;
    let cluster = ClusterPolicy {
        capacity: (head & 1 == 1).then_some(cap * 3),
        tenants: (1..=3)
            .map(|id| ClusterTenant {
                id: TenantId(id),
                cap: (id != 3 || head & 1 == 0).then_some(cap),
                weight: id,
            })
            .collect(),
    };
    let mut reports: Vec<HostReport> = Vec::new();
    for (i, line) in rest.split(|&b| b == b'\n').enumerate().take(16) {
        let name = format!("h{i}");
        if let Ok(r) = HostReport::from_json(&name, line) {
            assert_eq!(r.host, name);
            assert_eq!(
                HostReport::from_json(&name, r.to_json().as_bytes()),
                Ok(r.clone())
            );
            reports.push(r);
        }
    }
    if reports.is_empty() {
        return;
    }
    let others: Vec<&HostReport> = reports.iter().collect();
    let mut sums: BTreeMap<u32, u128> = BTreeMap::new();
    for me in &reports {
        for (id, share) in host_shares(&cluster, &me.host, &me.demands, &others) {
            *sums.entry(id).or_default() += u128::from(share);
        }
    }
    let parts: u128 = sums.values().sum();
    match cluster.capacity {
        Some(capacity) => assert!(parts <= u128::from(capacity), "{sums:?}"),
        None => assert!(sums.values().all(|&s| s <= u128::from(cap)), "{sums:?}"),
    }
    // A member that heard the reports one by one computes what is
    // computed afresh from the reports it holds. The first report is the
    // member's own; the others come from three hosts in turn, so that a
    // later report of a host replaces its earlier one, and every fourth
    // is heard as its host leaving instead.
    let cluster = Arc::new(cluster);
    let me = &reports[0];
    let mut member = Member::new(me.host.clone());
    member.connected(Vec::new());
    for (i, r) in reports.iter().enumerate().skip(1) {
        let mut r = r.clone();
        r.host = format!("other{}", i % 3);
        if i % 4 == 0 {
            member.gone(&r.host);
        } else {
            member.heard(r);
        }
        let held: Vec<HostReport> = member.others().cloned().collect();
        let held: Vec<&HostReport> = held.iter().collect();
        assert_eq!(
            member.shares(&cluster, &me.demands),
            &host_shares(&cluster, &me.host, &me.demands, &held)
        );
    }
});
