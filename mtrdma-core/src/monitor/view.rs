//! Each process the kernel saw, put with its tenant, against what the
//! tenant was admitted.

use std::collections::HashMap;

use mtrdma_sched::TenantId;

use super::{KernelCounts, ProcessCounts};
use crate::policy::{PeerCredentials, Policy};
use crate::table::TenantUsage;

/// One tenant's processes as the kernel saw them, next to what the quota
/// table says it was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKernelView {
    /// The tenant.
    pub tenant: TenantId,
    /// Its name.
    pub name: String,
    /// What its processes did, together.
    pub kernel: KernelCounts,
    /// Its processes the kernel saw (pids, ascending).
    pub processes: Vec<u32>,
    /// Of those, the ones that are not registered with the coordinator
    /// (put with the tenant by its match rules) and hold objects.
    pub unregistered: Vec<u32>,
    /// Queue pairs the quota table says it holds.
    pub admitted_qps: u64,
    /// Memory-region bytes the quota table says it holds.
    pub admitted_mr_bytes: u64,
}

impl TenantKernelView {
    /// The bypass, if its processes hold more queue pairs or region bytes
    /// than it was admitted.
    pub fn bypass(&self) -> Option<Bypass> {
        let (qps, bytes) = (self.kernel.qps_held(), self.kernel.mr_bytes_held());
        (qps > self.admitted_qps || bytes > self.admitted_mr_bytes).then(|| Bypass {
            tenant: self.tenant,
            name: self.name.clone(),
            qps_held: qps,
            qps_admitted: self.admitted_qps,
            mr_bytes_held: bytes,
            mr_bytes_admitted: self.admitted_mr_bytes,
            unregistered: self.unregistered.clone(),
        })
    }
}

/// A tenant whose processes hold more than mtrdma admitted: some of its
/// verbs calls did not go through mtrdma.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    /// The tenant.
    pub tenant: TenantId,
    /// Its name.
    pub name: String,
    /// Queue pairs its processes hold, and those admitted.
    pub qps_held: u64,
    /// See `qps_held`.
    pub qps_admitted: u64,
    /// Region bytes its processes hold, and those admitted.
    pub mr_bytes_held: u64,
    /// See `mr_bytes_held`.
    pub mr_bytes_admitted: u64,
    /// Its processes that hold objects without being registered (the
    /// likely culprits; a registered process can bypass too).
    pub unregistered: Vec<u32>,
}

impl std::fmt::Display for Bypass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant {} ({}) bypasses mtrdma: its processes hold {} queue pairs ({} admitted) and {} region bytes ({} admitted)",
            self.tenant.0,
            self.name,
            self.qps_held,
            self.qps_admitted,
            self.mr_bytes_held,
            self.mr_bytes_admitted
        )?;
        if !self.unregistered.is_empty() {
            write!(f, "; not registered: pid")?;
            for (i, pid) in self.unregistered.iter().enumerate() {
                write!(f, "{}{pid}", if i == 0 { " " } else { ", " })?;
            }
        }
        Ok(())
    }
}

/// A process that made verbs objects and that no tenant's match rules
/// take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unattributed {
    /// Its process id.
    pub pid: u32,
    /// Its cgroup id, and path where it was found.
    pub cgroup_id: u64,
    /// See `cgroup_id`.
    pub cgroup: Option<String>,
    /// Its user and group id.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// What it did.
    pub counts: KernelCounts,
}

/// Every tenant's processes as the kernel saw them, and the processes of
/// no tenant ([`attribute`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelView {
    /// Each tenant of the policy, in its order.
    pub tenants: Vec<TenantKernelView>,
    /// Processes no tenant takes, by pid.
    pub unattributed: Vec<Unattributed>,
    /// The bypasses that began since the coordinator's last view
    /// ([`Coordinator::kernel_view`](crate::coordinator::Coordinator::kernel_view)
    /// fills it; [`attribute`] alone leaves it empty).
    pub new_bypasses: Vec<Bypass>,
}

impl KernelView {
    /// The tenants that hold more than they were admitted.
    pub fn bypasses(&self) -> Vec<Bypass> {
        self.tenants.iter().filter_map(|t| t.bypass()).collect()
    }

    /// The view of `tenant`, if the policy has it.
    pub fn tenant(&self, tenant: TenantId) -> Option<&TenantKernelView> {
        self.tenants.iter().find(|t| t.tenant == tenant)
    }
}

/// Puts each process the kernel saw with its tenant: the one it
/// registered as (`registered`: tenant and pid of each registered
/// process), or else the first tenant of `policy` whose match rules its
/// uid, gid and cgroup satisfy (`cgroup_path` names a cgroup id's path, as
/// [`CgroupPaths::path_of`](super::CgroupPaths::path_of) does), or none.
/// Each tenant's counts are set against what the quota table says it
/// holds: the larger of `admitted_before` and `admitted_after`, usage read
/// just before and just after the kernel's counts. Admission comes before
/// a creation and the release after a destruction, so an object made or
/// destroyed while they were read is never taken for a bypass.
pub fn attribute(
    processes: &[ProcessCounts],
    mut cgroup_path: impl FnMut(u64) -> Option<String>,
    policy: &Policy,
    registered: &[(TenantId, u32)],
    admitted_before: &[TenantUsage],
    admitted_after: &[TenantUsage],
) -> KernelView {
    let registered: HashMap<u32, TenantId> = registered
        .iter()
        .map(|&(tenant, pid)| (pid, tenant))
        .collect();
    let admitted = |tenant: TenantId| {
        let held = |usage: &[TenantUsage]| {
            usage
                .iter()
                .find(|u| u.tenant == tenant)
                .map_or((0, 0), |u| (u.qps.0, u.mr_bytes.0))
        };
        let (a, b) = (held(admitted_before), held(admitted_after));
        (a.0.max(b.0), a.1.max(b.1))
    };
    let mut tenants: Vec<TenantKernelView> = policy
        .tenants
        .iter()
        .map(|t| {
            let (admitted_qps, admitted_mr_bytes) = admitted(t.id);
            TenantKernelView {
                tenant: t.id,
                name: t.name.clone(),
                kernel: KernelCounts::default(),
                processes: Vec::new(),
                unregistered: Vec::new(),
                admitted_qps,
                admitted_mr_bytes,
            }
        })
        .collect();
    let mut unattributed = Vec::new();
    for p in processes {
        let cgroup = cgroup_path(p.cgroup_id);
        let (tenant, is_registered) = match registered.get(&p.pid) {
            Some(&t) => (Some(t), true),
            None => {
                let peer = PeerCredentials {
                    pid: p.pid,
                    uid: p.uid,
                    gid: p.gid,
                    cgroup: cgroup.clone(),
                };
                (policy.tenant_for_peer(&peer).map(|t| t.id), false)
            }
        };
        match tenant.and_then(|t| tenants.iter_mut().find(|v| v.tenant == t)) {
            Some(view) => {
                view.kernel.add(&p.counts);
                view.processes.push(p.pid);
                if !is_registered && p.counts.holds_any() {
                    view.unregistered.push(p.pid);
                }
            }
            None => unattributed.push(Unattributed {
                pid: p.pid,
                cgroup_id: p.cgroup_id,
                cgroup,
                uid: p.uid,
                gid: p.gid,
                counts: p.counts,
            }),
        }
    }
    for view in &mut tenants {
        for list in [&mut view.processes, &mut view.unregistered] {
            list.sort_unstable();
            list.dedup();
        }
    }
    unattributed.sort_by_key(|u| (u.pid, u.cgroup_id));
    KernelView {
        tenants,
        unattributed,
        new_bypasses: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{LinkConfig, MatchRule, TenantEntry};
    use mtrdma_sched::TrafficClass;

    fn policy() -> Policy {
        Policy::new(
            LinkConfig::new(1_000_000_000),
            vec![
                TenantEntry::new(TenantId(1), "good")
                    .with_match(MatchRule::default().with_cgroup("/t/good")),
                TenantEntry::new(TenantId(2), "raw")
                    .with_match(MatchRule::default().with_cgroup("/t/raw")),
            ],
        )
    }

    fn usage(tenant: u32, qps: u64, mr_bytes: u64) -> TenantUsage {
        TenantUsage {
            tenant: TenantId(tenant),
            name: String::new(),
            class: TrafficClass::Bulk,
            qps: (qps, 100),
            mr_bytes: (mr_bytes, 1 << 30),
            outstanding_wr: 0,
            bytes_posted: 0,
            wrs_posted: 0,
            backlog_bytes: 0,
            throttled_ns: 0,
            refusals: 0,
            fair_rate: 0,
            window_gain: 0,
            processes: 1,
        }
    }

    fn process(pid: u32, cgroup_id: u64, qps: u64, mr_bytes: u64) -> ProcessCounts {
        ProcessCounts {
            cgroup_id,
            pid,
            uid: 1000,
            gid: 1000,
            counts: KernelCounts {
                qps_created: qps,
                mrs_registered: u64::from(mr_bytes > 0),
                mr_bytes_registered: mr_bytes,
                ..KernelCounts::default()
            },
        }
    }

    fn paths(id: u64) -> Option<String> {
        match id {
            10 => Some("/t/good".into()),
            11 => Some("/t/raw/app".into()),
            12 => Some("/elsewhere".into()),
            _ => None,
        }
    }

    #[test]
    fn each_process_goes_to_its_tenant_and_an_unadmitted_one_is_a_bypass() {
        let processes = [
            process(100, 10, 3, 1 << 20),
            // In the raw tenant's cgroup, never registered: a bypass.
            process(200, 11, 1, 4096),
            // Registered as tenant 1 although its cgroup is elsewhere: the
            // registration decides.
            process(300, 12, 1, 0),
            // No rule takes it.
            process(400, 12, 2, 8192),
            // A cgroup that is gone.
            process(500, 99, 1, 0),
        ];
        let registered = [(TenantId(1), 100), (TenantId(1), 300)];
        let admitted = [usage(1, 4, 1 << 20), usage(2, 0, 0)];
        let view = attribute(
            &processes,
            paths,
            &policy(),
            &registered,
            &admitted,
            &admitted,
        );
        let good = view.tenant(TenantId(1)).unwrap();
        assert_eq!(good.processes, vec![100, 300]);
        assert_eq!(good.kernel.qps_held(), 4);
        assert_eq!(good.kernel.mr_bytes_held(), 1 << 20);
        assert!(good.unregistered.is_empty());
        assert_eq!(good.bypass(), None, "it holds what it was admitted");
        let raw = view.tenant(TenantId(2)).unwrap();
        assert_eq!(raw.processes, vec![200]);
        assert_eq!(raw.unregistered, vec![200]);
        let bypass = raw
            .bypass()
            .expect("the raw tenant holds what it was never admitted");
        assert_eq!((bypass.qps_held, bypass.qps_admitted), (1, 0));
        assert_eq!((bypass.mr_bytes_held, bypass.mr_bytes_admitted), (4096, 0));
        assert!(
            bypass.to_string().contains("not registered: pid 200"),
            "{bypass}"
        );
        assert_eq!(view.bypasses(), vec![bypass]);
        let pids: Vec<u32> = view.unattributed.iter().map(|u| u.pid).collect();
        assert_eq!(pids, vec![400, 500]);
        assert_eq!(view.unattributed[0].cgroup.as_deref(), Some("/elsewhere"));
        assert_eq!(view.unattributed[1].cgroup, None);
    }

    #[test]
    fn more_held_than_admitted_of_either_kind_is_a_bypass() {
        let registered = [(TenantId(1), 100)];
        let view = |qps: u64, bytes: u64| {
            attribute(
                &[process(100, 10, qps, bytes)],
                paths,
                &policy(),
                &registered,
                &[usage(1, 2, 8192)],
                &[usage(1, 2, 8192)],
            )
        };
        assert!(view(2, 8192).bypasses().is_empty());
        assert!(view(1, 4096).bypasses().is_empty());
        assert_eq!(view(3, 8192).bypasses().len(), 1, "a queue pair too many");
        assert_eq!(view(2, 8193).bypasses().len(), 1, "a byte too many");
        let b = &view(3, 0).bypasses()[0];
        assert!(
            b.unregistered.is_empty(),
            "a registered process can bypass too"
        );
    }

    #[test]
    fn an_object_made_or_destroyed_while_the_counts_were_read_is_no_bypass() {
        // One registered process holding 3 queue pairs, the table read
        // before and after the kernel's counts.
        let view = |before, after| {
            attribute(
                &[process(100, 10, 3, 0)],
                paths,
                &policy(),
                &[(TenantId(1), 100)],
                &[usage(1, before, 0)],
                &[usage(1, after, 0)],
            )
        };
        // Made: admitted before the kernel saw it, so only the later read
        // of the table has it.
        assert!(view(2, 3).bypasses().is_empty());
        // Destroyed: the kernel's count still had it, the table's release
        // came after.
        assert!(view(3, 2).bypasses().is_empty());
    }

    #[test]
    fn counts_add_and_subtract_without_overflow() {
        let mut a = KernelCounts {
            qps_created: 5,
            qps_destroyed: 2,
            mrs_registered: 3,
            mrs_released: 3,
            mr_bytes_registered: 100,
            mr_bytes_released: 100,
            ..KernelCounts::default()
        };
        assert_eq!((a.qps_held(), a.mrs_held(), a.mr_bytes_held()), (3, 0, 0));
        assert!(a.holds_any());
        let before = a;
        a.add(&KernelCounts {
            qps_created: u64::MAX,
            ..KernelCounts::default()
        });
        assert_eq!(a.qps_created, u64::MAX);
        assert_eq!(a.since(&before).qps_created, u64::MAX - 5);
        assert_eq!(before.since(&a), KernelCounts::default());
    }
}
