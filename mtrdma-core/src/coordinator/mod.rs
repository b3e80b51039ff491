//! The coordinator's logic: it owns a shared quota table, decides who each
//! registering process is, turns demand into weighted max-min fair rates,
//! returns what dead processes held, and reloads its policy file.
//!
//! It also follows what the tenants move together (the link estimate it
//! publishes for their delay windows) and the share of bytes their
//! windows judged over their target ([`Coordinator::link_view`]), and,
//! with the kernel's counts of what every process does with the RDMA
//! devices ([`crate::monitor`]), which tenants hold more than they were
//! admitted ([`Coordinator::kernel_view`]).
//!
//! This is a library type; a daemon is a loop around
//! [`Coordinator::tick`] (see `examples/coordinator.rs`). Tenants never need
//! one: without it they use [`QuotaTable::embedded`] or attach to a table
//! directly. When the coordinator dies, tenants keep the last policy and
//! rates (fail-static); a restarted coordinator takes the table over
//! ([`QuotaTable::take_over`]) and they carry on.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::monitor::{CgroupPaths, KernelView, ProcessCounts};
use crate::policy::{Policy, PolicyError};
use crate::procinfo::ProcessId;
use crate::table::{QuotaTable, Reclaimed, TableError, TableOwner, TenantHandle, TenantUsage};
use crate::TenantId;

use shares::{Reading, Shares};
use wire::HELLO;

mod serve;
mod shares;
mod socket;

use serve::Pending;
pub use serve::{MAX_PENDING_REGISTRATIONS, REGISTRATION_DEADLINE_NS};

use socket::bind;
pub use socket::register;

pub mod wire;

/// Why the coordinator could not start or act, or a process could not register.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// The policy file is unreadable or invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The quota table could not be created, opened or written.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The registration socket failed.
    #[error("registration socket {path}: {source}")]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another coordinator is listening on the socket.
    #[error("another coordinator is already listening on {0}")]
    AlreadyRunning(PathBuf),
    /// The socket's path, or its directory, is not the coordinator's own:
    /// someone else could have put a socket of theirs there first, or
    /// could replace it.
    #[error("registration socket {path}: {problem}")]
    UnsafeSocket {
        /// The socket's path.
        path: PathBuf,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// The process serving the registration socket is not trusted to hand
    /// over a quota table: it runs as neither root nor this user.
    #[error(
        "registration socket {path} is served by uid {uid}, neither root nor this process's \
         uid {own}: refusing the quota table it would hand over"
    )]
    Untrusted {
        /// The socket's path.
        path: PathBuf,
        /// The serving process's uid.
        uid: u32,
        /// This process's effective uid.
        own: u32,
    },
    /// The coordinator refused a registration.
    #[error("the coordinator refused the registration: {0}")]
    Refused(String),
    /// The coordinator's answer could not be understood.
    #[error("unexpected answer from the coordinator: {0:?}")]
    Protocol(String),
}

/// How to run a coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The quota table's name (see [`QuotaTable::create`]).
    pub table: String,
    /// The registration socket's path.
    pub socket: PathBuf,
    /// The TOML policy file.
    pub policy_path: PathBuf,
    /// Tenant slots of the table.
    pub capacity: u32,
    /// Process slots of each tenant (in the tenant's own state file: see
    /// [`QuotaTable::create_coordinated`]).
    pub processes: u32,
}

/// What one [`Coordinator::tick`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    /// Processes registered.
    pub registered: Vec<(u32, TenantId)>,
    /// Registrations refused, with the reason.
    pub refused: Vec<String>,
    /// Resources returned from dead processes.
    pub reclaimed: Vec<Reclaimed>,
    /// Whether the policy was reloaded.
    pub reloaded: bool,
    /// A policy reload that failed (the previous policy stays).
    pub reload_error: Option<String>,
    /// Fair rates published (bytes/s), when they were recomputed.
    pub rates: Vec<(TenantId, u64)>,
}

/// What the coordinator sees of the link ([`Coordinator::link_view`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkView {
    /// The link estimate published for the tenants' windows: the most
    /// they moved together lately (bytes per second; 0 while nothing was
    /// measured).
    pub estimate_bytes_per_sec: u64,
    /// The share of bytes the tenants' delay windows judged over their
    /// target lately (0 to 1).
    pub over_target: f64,
    /// Tenants whose windows the one-piece floor is given to now
    /// ([`Coordinator::set_piece_floor`]).
    pub floor_granted: usize,
    /// Tenants whose windows contend for the link, as the floor counts
    /// them.
    pub floor_senders: usize,
    /// Steps of the floor taken back so far: the latency tenants' median
    /// delay moved by more than allowed.
    pub floor_withdrawals: u64,
}

/// The coordinator (see the module docs).
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    table: TableOwner,
    policy: Policy,
    /// The policy file as it was when last read.
    policy_stamp: Option<FileStamp>,
    listener: UnixListener,
    reload_requested: Arc<AtomicBool>,
    /// The fair rates, gains, link estimate and floor: what the
    /// recomputations decide and remember.
    shares: Shares,
    /// When `tick` last looked at the policy file and for dead processes
    /// (0: never).
    last_housekeeping_ns: u64,
    /// What the last [`Coordinator::wait`] saw: whether a registration is
    /// waiting (`None`: no wait since the last tick, so look).
    registration_waiting: Option<bool>,
    /// Connections accepted whose greeting has not fully arrived.
    pending: Vec<Pending>,
    /// The table's policy object, read-only, as every registered process
    /// gets it (with its own tenant's state file).
    policy_fd: OwnedFd,
    /// The tenants found bypassing mtrdma by the last kernel view.
    bypassing: HashSet<TenantId>,
    /// Whether the policy comes from the file (and reloads when it
    /// changes), or was given by [`Coordinator::apply_policy`].
    policy_from_file: bool,
    /// What the cluster-wide tenants wanted on this host at the last
    /// recomputation ([`Coordinator::cluster_demand`]).
    cluster_demand: BTreeMap<u32, u64>,
}

/// How often [`Coordinator::tick`] looks at the policy file (which file
/// its path names, its size and modification time) and for dead
/// processes. Both cost system calls per look (a
/// `/proc/PID/stat` read per live process), which at every 5 ms tick took
/// a coordinator on an emulated CPU past a third of a core; a reload asked
/// for with [`Coordinator::reload_flag`] (SIGHUP) is not delayed.
pub const HOUSEKEEPING_INTERVAL_NS: u64 = 250_000_000;

/// What tells that the policy file changed without reading it: the file
/// its path resolves to (device and inode), its size and its modification
/// time. The file itself matters as much as the time: a Kubernetes
/// ConfigMap volume updates by writing a new directory and swapping a
/// `..data` symbolic link to it, and a file copied with its times kept
/// (`cp -p`, `rsync -t`) may carry the old one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

/// The stamp of the file `path` resolves to (`None`: it cannot be read).
fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

impl Coordinator {
    /// Reads the policy, creates the table (or takes over an existing one
    /// of the same name, so running tenants carry on), and listens for
    /// registrations.
    pub fn start(config: CoordinatorConfig) -> Result<Coordinator, CoordinatorError> {
        let policy = Policy::from_file(&config.policy_path)?;
        let policy_stamp = stamp(&config.policy_path);
        let listener = bind(&config.socket)?;
        let table = match QuotaTable::take_over(&config.table) {
            Ok(table) => {
                tracing::info!(table = %config.table, "taking over an existing quota table");
                table.publish(&policy)?;
                table
            }
            Err(TableError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                QuotaTable::create_coordinated(
                    &config.table,
                    config.capacity,
                    config.processes,
                    &policy,
                )?
            }
            Err(e) => return Err(e.into()),
        };
        tracing::info!(
            table = %config.table,
            socket = %config.socket.display(),
            tenants = policy.tenants.len(),
            "coordinator started"
        );
        let policy_fd = table.policy_fd()?;
        Ok(Coordinator {
            config,
            table,
            policy,
            policy_stamp,
            listener,
            reload_requested: Arc::new(AtomicBool::new(false)),
            shares: Shares::default(),
            last_housekeeping_ns: 0,
            registration_waiting: None,
            pending: Vec::new(),
            policy_fd,
            bypassing: HashSet::new(),
            policy_from_file: true,
            cluster_demand: BTreeMap::new(),
        })
    }

    /// The table it maintains.
    pub fn table(&self) -> &QuotaTable {
        &self.table
    }

    /// The policy in force (with its match rules).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A flag that makes the next tick reload the policy (set it from a
    /// SIGHUP handler).
    pub fn reload_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.reload_requested)
    }

    /// Publishes `policy` in place of the one in force, as a reload does,
    /// and stops watching the policy file: the policy now comes from
    /// elsewhere (a cluster's store, [`crate::cluster::etcd`]). On error
    /// the previous policy stays.
    pub fn apply_policy(&mut self, policy: Policy) -> Result<(), CoordinatorError> {
        policy.validate()?;
        self.table.publish(&policy)?;
        tracing::info!(tenants = policy.tenants.len(), "policy applied");
        self.policy = policy;
        self.policy_from_file = false;
        Ok(())
    }

    /// This host's shares of the cluster-wide tenants' limits (bytes per
    /// second by tenant id, from [`crate::cluster::host_shares`]): each
    /// caps its tenant's fair rate from the next recomputation on, with
    /// its own cap. A cluster-wide tenant left out is not capped by the
    /// cluster.
    pub fn set_cluster_shares(&mut self, shares: BTreeMap<u32, u64>) {
        self.shares.set_cluster_shares(shares);
    }

    /// What each cluster-wide tenant of the policy with processes on this
    /// host wanted at the last recomputation, bytes per second
    /// ([`crate::cluster::ALL`]: all it could get; within its own cap),
    /// by tenant id: what this host reports to the others.
    pub fn cluster_demand(&self) -> BTreeMap<u32, u64> {
        self.policy
            .cluster
            .tenants
            .iter()
            .filter_map(|t| Some((t.id.0, *self.cluster_demand.get(&t.id.0)?)))
            .collect()
    }

    /// Re-reads the policy file and publishes it. Running tenants keep
    /// their slots and live state. On error the previous policy stays.
    pub fn reload(&mut self) -> Result<(), CoordinatorError> {
        self.policy_stamp = stamp(&self.config.policy_path);
        let policy = Policy::from_file(&self.config.policy_path)?;
        self.table.publish(&policy)?;
        tracing::info!(tenants = policy.tenants.len(), "policy reloaded");
        self.policy = policy;
        Ok(())
    }

    /// Recomputes the weighted max-min fair byte rates from each tenant's
    /// demand over the last interval and publishes them.
    ///
    /// A tenant with bytes waiting in its backlog wants all it can get (up
    /// to its cap); one without wants what it sent, with 25% headroom to
    /// grow. Every tenant is published at least its weighted share of the
    /// capacity among the active tenants (an idle one the share it would
    /// get by becoming active), so a tenant that starts to want more can
    /// take its share at once rather than 25% more every interval.
    pub fn recompute(&mut self, now_ns: u64) -> Vec<(TenantId, u64)> {
        let Ok(snapshot) = self.table.snapshot() else {
            return Vec::new();
        };
        // The policy's tenants in id order, with their slots' counters.
        let mut readings: Vec<Reading<'_>> = snapshot
            .policy
            .tenants
            .iter()
            .filter_map(|entry| {
                let slot = snapshot.slot_of(entry.id)?;
                Some(Reading {
                    entry,
                    slot,
                    counters: self.table.demand_counters(slot),
                    delay_shift: self.table.delay_shift(slot),
                })
            })
            .collect();
        readings.sort_by_key(|r| r.entry.id);
        let step = self.shares.step(
            now_ns,
            &self.policy.link,
            self.table.link_estimate(),
            &readings,
        );
        if let Some(link) = step.link {
            self.table.set_link_estimate(link.estimate);
            self.table.set_sharing_weight(link.sharing_weight);
        }
        let mut out = Vec::with_capacity(step.tenants.len());
        self.cluster_demand = if self.policy.cluster.tenants.is_empty() {
            BTreeMap::new()
        } else {
            // Only the tenants with processes here are this host's to
            // report.
            let present: HashSet<TenantId> = self
                .table
                .attached_processes()
                .into_iter()
                .map(|(tenant, _)| tenant)
                .collect();
            step.tenants
                .iter()
                .filter(|d| present.contains(&d.id))
                .map(|d| (d.id.0, d.wants))
                .collect()
        };
        for d in &step.tenants {
            self.table.set_fair_rate(d.slot, d.fair_rate.max(1));
            self.table.set_window_gain(d.slot, d.window_gain);
            self.table.set_floor_permit(d.slot, d.floor_permit);
            out.push((d.id, d.fair_rate));
        }
        self.table.heartbeat(now_ns);
        out
    }

    /// Whether the coordinator runs the one-piece floor
    /// (`mtrdma_sched::piece_floor`; on by default): it gives the bulk
    /// tenants' delay windows a floor of one piece, one tenant at a time,
    /// as far as the latency tenants' median delay allows. Off, windows
    /// under a latency bound pace their pieces below one piece as they
    /// need.
    pub fn set_piece_floor(&mut self, on: bool) {
        self.shares.set_piece_floor(on);
    }

    /// Whether the coordinator sets gains on the tenants' delay windows'
    /// growth so that tenants in separate processes share the link by
    /// their weights (`mtrdma_sched::share`; on by default). Off, every
    /// window grows by its weight alone, as without a coordinator.
    pub fn set_window_gains(&mut self, on: bool) {
        self.shares.set_window_gains(on);
    }

    /// The link estimate and the share of bytes the tenants' delay windows
    /// judged over their target, as of the last recomputation.
    pub fn link_view(&self) -> LinkView {
        let (floor_granted, floor_senders, floor_withdrawals) = self.shares.floor_counts();
        LinkView {
            estimate_bytes_per_sec: self.table.link_estimate().unwrap_or(0),
            over_target: self.shares.over_share(),
            floor_granted,
            floor_senders,
            floor_withdrawals,
        }
    }

    /// Every tenant's processes as the kernel saw them, against what the
    /// table says each tenant holds, and the processes of no tenant
    /// ([`crate::monitor::attribute`]): a registered process is its
    /// registration's tenant, any other the tenant whose match rules its
    /// uid, gid and cgroup satisfy. `read_kernel` reads the kernel's
    /// counts (such as `KernelMonitor::processes` with the `monitor`
    /// feature); the table's usage is read just before and just after it.
    /// A tenant found holding more than it was admitted is said once, as a
    /// `tracing` warning and in the view's `new_bypasses`, until it no
    /// longer does.
    ///
    /// # Errors
    /// What `read_kernel` returns.
    pub fn kernel_view<E>(
        &mut self,
        read_kernel: impl FnOnce() -> Result<Vec<ProcessCounts>, E>,
        cgroups: &mut CgroupPaths,
    ) -> Result<KernelView, E> {
        let before = self.usage();
        let processes = read_kernel()?;
        let registered: Vec<(TenantId, u32)> = self
            .table
            .attached_processes()
            .into_iter()
            .map(|(tenant, p)| (tenant, p.pid))
            .collect();
        let after = self.usage();
        let mut view = crate::monitor::attribute(
            &processes,
            |id| cgroups.path_of(id),
            &self.policy,
            &registered,
            &before,
            &after,
        );
        let mut now = HashSet::new();
        for b in view.bypasses() {
            now.insert(b.tenant);
            if !self.bypassing.contains(&b.tenant) {
                tracing::warn!(
                    tenant = %b.tenant,
                    qps_held = b.qps_held,
                    qps_admitted = b.qps_admitted,
                    mr_bytes_held = b.mr_bytes_held,
                    mr_bytes_admitted = b.mr_bytes_admitted,
                    unregistered = ?b.unregistered,
                    "{b}"
                );
                view.new_bypasses.push(b);
            }
        }
        for gone in self.bypassing.difference(&now) {
            tracing::info!(tenant = %gone, "tenant no longer holds more than it was admitted");
        }
        self.bypassing = now;
        Ok(view)
    }

    /// Returns the resources of processes that died.
    pub fn reclaim(&mut self) -> Vec<Reclaimed> {
        self.table.reclaim_dead()
    }

    /// One round of the coordinator's work: reload on request or file
    /// change, serve registrations, reclaim dead processes, and recompute
    /// fair rates when the policy's interval has passed. The file and the
    /// processes are looked at on the first tick and then at most every
    /// [`HOUSEKEEPING_INTERVAL_NS`]. `now_ns` is the table's clock
    /// ([`QuotaTable::now_ns`]); registrations' deadlines and the
    /// intervals are judged against it.
    pub fn tick(&mut self, now_ns: u64) -> TickReport {
        let mut report = TickReport::default();
        let housekeeping = self.last_housekeeping_ns == 0
            || now_ns.saturating_sub(self.last_housekeeping_ns) >= HOUSEKEEPING_INTERVAL_NS;
        if housekeeping {
            self.last_housekeeping_ns = now_ns.max(1);
        }
        let changed = housekeeping
            && self.policy_from_file
            && stamp(&self.config.policy_path) != self.policy_stamp;
        let asked = self.reload_requested.swap(false, Ordering::AcqRel) && self.policy_from_file;
        if asked || changed {
            match self.reload() {
                Ok(()) => report.reloaded = true,
                Err(e) => {
                    tracing::warn!(error = %e, "policy reload failed; keeping the previous policy");
                    report.reload_error = Some(e.to_string());
                }
            }
        }
        if self.registration_waiting.take() != Some(false) || !self.pending.is_empty() {
            self.serve_registrations_at(now_ns, &mut report);
        }
        if housekeeping {
            report.reclaimed = self.reclaim();
        }
        let interval = u64::from(self.policy.link.recompute_interval_ms) * 1_000_000;
        if now_ns.saturating_sub(self.shares.last_ns()) >= interval {
            report.rates = self.recompute(now_ns);
        }
        report
    }

    /// Waits until a process asks to register (or sends more of its
    /// greeting) or `timeout` has passed, whichever comes first: the
    /// daemon's sleep between ticks, so that a registration is served at
    /// once and an idle coordinator costs one system call per tick.
    pub fn wait(&mut self, timeout: Duration) {
        use rustix::event::{PollFd, PollFlags};
        let timeout = rustix::event::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(&self.listener, PollFlags::IN))
            .chain(
                self.pending
                    .iter()
                    .map(|p| PollFd::new(&p.stream, PollFlags::IN)),
            )
            .collect();
        // A wait that fails (interrupted by a signal) says nothing: the
        // next tick looks for registrations itself.
        self.registration_waiting = match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => Some(false),
            Ok(_) | Err(_) => None,
        };
    }

    /// Per-tenant usage for display.
    pub fn usage(&self) -> Vec<TenantUsage> {
        self.table.usage().unwrap_or_default()
    }

    /// Stops: removes the socket and, if `remove_table`, the table's names
    /// (tenants keep their mappings and go on with the last policy).
    pub fn shutdown(self, remove_table: bool) -> Result<(), CoordinatorError> {
        let _ = std::fs::remove_file(&self.config.socket);
        if remove_table {
            QuotaTable::remove(&self.config.table)?;
        }
        Ok(())
    }
}
