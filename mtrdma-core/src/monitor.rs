//! What every process does with the RDMA devices, seen from the kernel, set
//! against what mtrdma admitted.
//!
//! mtrdma isolates tenants that use its API or its preload library. A
//! process that calls verbs directly is invisible to the quota table: its
//! queue pairs and memory regions were never admitted. The kernel sees
//! them all. With the `monitor` feature, `KernelMonitor` loads a small
//! BPF program (`bpf/monitor.bpf.c`, compiled with `clang -target bpf` when
//! the crate is built) whose kprobes sit on the RDMA core's functions that
//! every user-space verbs path reaches (`ib_create_qp_user`,
//! `ib_destroy_qp_user`, `ib_modify_qp_with_udata`, `ib_uverbs_reg_mr`,
//! `ib_umem_get`, `ib_umem_release`: the RDMA core, not a driver, so rxe
//! and mlx5 alike), and counts per cgroup and process the queue pairs
//! created and destroyed, their state changes, and the regions registered
//! and released with their bytes (from `ib_umem_get`'s length argument:
//! no kernel structure is read but the first field of a modify's
//! attributes, so no headers of the running kernel's build are needed).
//! Each object is counted once, when its creation succeeds, and its
//! destruction is counted for the process that made it.
//!
//! [`attribute`] (pure, no kernel needed) puts each process with a tenant:
//! the tenant it registered as, or else the tenant whose match rules its
//! uid, gid and cgroup satisfy, as the coordinator would decide at
//! registration; a process no tenant's rules match is *unattributed*. A
//! tenant whose processes hold more queue pairs or region bytes than the
//! quota table says were admitted bypasses mtrdma ([`Bypass`]).
//! [`Coordinator::kernel_view`](crate::coordinator::Coordinator::kernel_view)
//! does it for a running coordinator, and `examples/coordinator --monitor`
//! shows it every second.
//!
//! The kernel's counts start when the monitor does: objects made before
//! are not counted, nor their destruction.

mod cgroups;
#[cfg(feature = "monitor")]
mod kernel;
mod view;

pub use cgroups::CgroupPaths;
#[cfg(feature = "monitor")]
pub use kernel::{KernelMonitor, MonitorError, PROBES};
pub use view::{attribute, Bypass, KernelView, TenantKernelView, Unattributed};

/// What the kernel saw one process (or a tenant's processes together) do
/// with RDMA devices since the monitor started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounts {
    /// Queue pairs created.
    pub qps_created: u64,
    /// Of those, queue pairs destroyed.
    pub qps_destroyed: u64,
    /// Successful state changes of its queue pairs.
    pub qp_state_changes: u64,
    /// Of those, changes to ready-to-send (a connected queue pair).
    pub qps_to_rts: u64,
    /// Memory regions registered.
    pub mrs_registered: u64,
    /// Of those, regions released (deregistered, or freed at exit).
    pub mrs_released: u64,
    /// Bytes of the regions registered.
    pub mr_bytes_registered: u64,
    /// Bytes of the regions released.
    pub mr_bytes_released: u64,
}

impl KernelCounts {
    /// Queue pairs held now.
    pub fn qps_held(&self) -> u64 {
        self.qps_created.saturating_sub(self.qps_destroyed)
    }

    /// Memory regions held now.
    pub fn mrs_held(&self) -> u64 {
        self.mrs_registered.saturating_sub(self.mrs_released)
    }

    /// Bytes of memory regions held now.
    pub fn mr_bytes_held(&self) -> u64 {
        self.mr_bytes_registered
            .saturating_sub(self.mr_bytes_released)
    }

    /// Whether it holds any queue pair or region.
    pub fn holds_any(&self) -> bool {
        self.qps_held() > 0 || self.mrs_held() > 0
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &KernelCounts) {
        let KernelCounts {
            qps_created,
            qps_destroyed,
            qp_state_changes,
            qps_to_rts,
            mrs_registered,
            mrs_released,
            mr_bytes_registered,
            mr_bytes_released,
        } = other;
        self.qps_created = self.qps_created.saturating_add(*qps_created);
        self.qps_destroyed = self.qps_destroyed.saturating_add(*qps_destroyed);
        self.qp_state_changes = self.qp_state_changes.saturating_add(*qp_state_changes);
        self.qps_to_rts = self.qps_to_rts.saturating_add(*qps_to_rts);
        self.mrs_registered = self.mrs_registered.saturating_add(*mrs_registered);
        self.mrs_released = self.mrs_released.saturating_add(*mrs_released);
        self.mr_bytes_registered = self
            .mr_bytes_registered
            .saturating_add(*mr_bytes_registered);
        self.mr_bytes_released = self.mr_bytes_released.saturating_add(*mr_bytes_released);
    }

    /// What happened between `before` and these counts (0 where a count
    /// went backwards: a process's counts left the monitor's map).
    pub fn since(&self, before: &KernelCounts) -> KernelCounts {
        KernelCounts {
            qps_created: self.qps_created.saturating_sub(before.qps_created),
            qps_destroyed: self.qps_destroyed.saturating_sub(before.qps_destroyed),
            qp_state_changes: self
                .qp_state_changes
                .saturating_sub(before.qp_state_changes),
            qps_to_rts: self.qps_to_rts.saturating_sub(before.qps_to_rts),
            mrs_registered: self.mrs_registered.saturating_sub(before.mrs_registered),
            mrs_released: self.mrs_released.saturating_sub(before.mrs_released),
            mr_bytes_registered: self
                .mr_bytes_registered
                .saturating_sub(before.mr_bytes_registered),
            mr_bytes_released: self
                .mr_bytes_released
                .saturating_sub(before.mr_bytes_released),
        }
    }
}

/// One process as the kernel saw it: who it is and what it did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounts {
    /// Its cgroup (v2) id when it made its first object (the cgroup
    /// directory's inode number; [`CgroupPaths`] finds the path).
    pub cgroup_id: u64,
    /// Its process id (thread group id) in the initial PID namespace.
    pub pid: u32,
    /// Its user and group id when it made its first object.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// What it did.
    pub counts: KernelCounts,
}
