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

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::fairshare::{weighted_max_min, Demand};
use crate::link_observer::{LinkObserver, LinkSignals};
use crate::monitor::{CgroupPaths, KernelView, ProcessCounts};
use crate::policy::{PeerCredentials, Policy, PolicyError};
use crate::procinfo::{self, ProcessId};
use crate::table::{DemandCounters, QuotaTable, Reclaimed, TableError, TenantHandle, TenantUsage};
use crate::TenantId;
use mtrdma_sched::piece_floor::{FloorControl, Permit, Shift};
use mtrdma_sched::share::{ShareGains, TenantRate};
use mtrdma_sched::{Protection, TrafficClass};

use wire::HELLO;

/// The registration protocol's messages as each side parses them: what
/// the coordinator reads from a registering process (a greeting line)
/// and what the process reads back (an answer line). Public so that they
/// can be fuzzed; [`Coordinator`] and [`register`] use them.
pub mod wire {
    /// The first line a registering process sends. Version 2: the answer
    /// carries the table's objects (`SCM_RIGHTS`) and how the coordinator
    /// recorded the process.
    pub const HELLO: &str = "MTRDMA-REGISTER 2";

    /// The longest greeting read: a process that sends this many bytes
    /// without a line is turned away.
    pub const GREETING_MAX: usize = 256;

    /// The longest answer read.
    pub const ANSWER_MAX: usize = 512;

    /// What the bytes of a one-line message (a greeting, an answer) that
    /// arrived so far say.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum FirstLine {
        /// Its first line, without the line end.
        Line(String),
        /// No line yet; more may come.
        Incomplete,
        /// It cannot be the message: why.
        Invalid(String),
    }

    /// The first line of the bytes `got` so far, which must end within
    /// `max` bytes; `what` names the message in the reasons.
    pub fn first_line(got: &[u8], max: usize, what: &str) -> FirstLine {
        if let Some(end) = got.iter().take(max).position(|&b| b == b'\n') {
            return match std::str::from_utf8(&got[..end]) {
                Ok(line) => FirstLine::Line(line.trim_end_matches('\r').to_string()),
                Err(_) => FirstLine::Invalid(format!("{what} that is not text")),
            };
        }
        if got.len() >= max {
            return FirstLine::Invalid(format!(
                "{what} without a line end in its first {max} bytes"
            ));
        }
        FirstLine::Incomplete
    }

    /// Reads a greeting from the bytes a registering process sent so far.
    pub fn greeting(got: &[u8]) -> FirstLine {
        first_line(got, GREETING_MAX, "a greeting")
    }

    /// A coordinator's answer to a registration (one line).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Answer {
        /// Registered.
        Registered(Registration),
        /// Refused, and why.
        Refused(String),
    }

    /// A registration granted: the table, the tenant, the process slot
    /// claimed, the process as the coordinator recorded it (its pid there
    /// and start time), and its pid in its own PID namespace.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Registration {
        /// The table's name.
        pub table: String,
        /// The tenant's id.
        pub tenant: u32,
        /// The process slot.
        pub slot: u32,
        /// The pid the coordinator recorded.
        pub recorded_pid: u32,
        /// The start time it recorded.
        pub recorded_start: u64,
        /// The pid the process has in its own PID namespace.
        pub own_pid: u32,
    }

    impl Answer {
        /// The answer in `line` (without its line end), or `None` for
        /// anything else.
        pub fn parse(line: &str) -> Option<Answer> {
            if let Some(reason) = line.strip_prefix("ERR ") {
                return Some(Answer::Refused(reason.to_string()));
            }
            let mut words = line.strip_prefix("OK ")?.split(' ');
            let table = words.next()?;
            let valid_name = (1..=200).contains(&table.len())
                && table
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !valid_name {
                return None;
            }
            let mut number = || words.next()?.parse::<u64>().ok();
            let answer = Answer::Registered(Registration {
                table: table.to_string(),
                tenant: u32::try_from(number()?).ok()?,
                slot: u32::try_from(number()?).ok()?,
                recorded_pid: u32::try_from(number()?).ok()?,
                recorded_start: number()?,
                own_pid: u32::try_from(number()?).ok()?,
            });
            words.next().is_none().then_some(answer)
        }

        /// The answer as a line (with its line end); a refusal's reason
        /// on one line.
        pub fn to_line(&self) -> String {
            match self {
                Answer::Registered(r) => format!(
                    "OK {} {} {} {} {} {}\n",
                    r.table, r.tenant, r.slot, r.recorded_pid, r.recorded_start, r.own_pid
                ),
                Answer::Refused(reason) => {
                    format!("ERR {}\n", reason.replace(['\n', '\r'], " "))
                }
            }
        }
    }
}

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

/// A tenant's windows count as contending for the link (for the one-piece
/// floor) for this long after they last judged a piece: a tenant with a
/// quiet interval is not taken for one that left.
const FLOOR_SENDER_MEMORY_NS: u64 = 1_000_000_000;

/// The coordinator (see the module docs).
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    table: QuotaTable,
    policy: Policy,
    policy_mtime: Option<SystemTime>,
    listener: UnixListener,
    reload_requested: Arc<AtomicBool>,
    /// Per tenant of the policy: its slot and counters at the last
    /// recomputation (a tenant a reload removes is forgotten, so that one
    /// brought back, or given another slot, is measured afresh).
    last_counters: HashMap<TenantId, (u32, DemandCounters)>,
    last_recompute_ns: u64,
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
}

/// How long a connection to the registration socket has to send its
/// greeting before it is turned away. Connections are served side by
/// side, never one at a time, so a silent or slow one holds up no other
/// registration, nor reclamation, fair rates or shutdown.
pub const REGISTRATION_DEADLINE_NS: u64 = 1_000_000_000;

/// Registrations in progress at once; a connection beyond them is turned
/// away at once ("try again"), so that a flood of connections costs the
/// coordinator a bounded amount of memory and work per tick.
pub const MAX_PENDING_REGISTRATIONS: usize = 64;

use wire::GREETING_MAX;

/// A connection whose greeting has not fully arrived.
#[derive(Debug)]
struct Pending {
    stream: UnixStream,
    got: Vec<u8>,
    /// When it is turned away (the table's clock).
    deadline_ns: u64,
}

/// What reading a pending connection gave.
enum Heard {
    /// Its greeting line (without the newline).
    Line(String),
    /// Nothing more yet.
    Waiting,
    /// It cannot be served: why.
    Failed(String),
}

impl Pending {
    /// Reads what has arrived, without waiting.
    fn read(&mut self) -> Heard {
        let mut buf = [0u8; GREETING_MAX];
        loop {
            match wire::greeting(&self.got) {
                wire::FirstLine::Line(line) => return Heard::Line(line),
                wire::FirstLine::Invalid(why) => return Heard::Failed(why),
                wire::FirstLine::Incomplete => {}
            }
            let room = GREETING_MAX - self.got.len();
            match (&self.stream).read(&mut buf[..room]) {
                Ok(0) => return Heard::Failed("the connection closed before its greeting".into()),
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Heard::Waiting,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Heard::Failed(format!("reading the greeting failed: {e}")),
            }
        }
    }
}

/// How often [`Coordinator::tick`] looks at the policy file's modification
/// time and for dead processes. Both cost system calls per look (a
/// `/proc/PID/stat` read per live process), which at every 5 ms tick took
/// a coordinator on an emulated CPU past a third of a core; a reload asked
/// for with [`Coordinator::reload_flag`] (SIGHUP) is not delayed.
pub const HOUSEKEEPING_INTERVAL_NS: u64 = 250_000_000;

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Coordinator {
    /// Reads the policy, creates the table (or takes over an existing one
    /// of the same name, so running tenants carry on), and listens for
    /// registrations.
    pub fn start(config: CoordinatorConfig) -> Result<Coordinator, CoordinatorError> {
        let policy = Policy::from_file(&config.policy_path)?;
        let policy_mtime = mtime(&config.policy_path);
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
            policy_mtime,
            listener,
            reload_requested: Arc::new(AtomicBool::new(false)),
            last_counters: HashMap::new(),
            last_recompute_ns: 0,
            link: LinkObserver::default(),
            gains: Some(ShareGains::default()),
            floor: Some(FloorControl::default()),
            windows_seen: HashMap::new(),
            floor_order: Vec::new(),
            last_housekeeping_ns: 0,
            registration_waiting: None,
            pending: Vec::new(),
            policy_fd,
            bypassing: HashSet::new(),
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

    /// Re-reads the policy file and publishes it. Running tenants keep
    /// their slots and live state. On error the previous policy stays.
    pub fn reload(&mut self) -> Result<(), CoordinatorError> {
        self.policy_mtime = mtime(&self.config.policy_path);
        let policy = Policy::from_file(&self.config.policy_path)?;
        self.table.publish(&policy)?;
        tracing::info!(tenants = policy.tenants.len(), "policy reloaded");
        self.policy = policy;
        Ok(())
    }

    /// Accepts the connections waiting on the registration socket and
    /// answers every one whose greeting has arrived, without waiting for
    /// any: a connection that has not said all of its greeting is kept for
    /// the next call, until [`REGISTRATION_DEADLINE_NS`] after it came.
    pub fn serve_registrations(&mut self, report: &mut TickReport) {
        let now = self.table.now_ns();
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the registration socket failed");
                    break;
                }
            };
            if let Err(e) = stream.set_nonblocking(true) {
                tracing::warn!(error = %e, "a registration's socket could not be set up");
                continue;
            }
            if self.pending.len() >= MAX_PENDING_REGISTRATIONS {
                refuse(
                    &stream,
                    format!("{MAX_PENDING_REGISTRATIONS} registrations are in progress; try again"),
                    report,
                );
                continue;
            }
            self.pending.push(Pending {
                stream,
                got: Vec::new(),
                deadline_ns: now.saturating_add(REGISTRATION_DEADLINE_NS),
            });
        }
        let mut i = 0;
        while i < self.pending.len() {
            let heard = self.pending[i].read();
            let heard = match heard {
                Heard::Waiting if now < self.pending[i].deadline_ns => {
                    i += 1;
                    continue;
                }
                Heard::Waiting => Heard::Failed(format!(
                    "no greeting within {} ms",
                    REGISTRATION_DEADLINE_NS / 1_000_000
                )),
                heard => heard,
            };
            let Pending { stream, .. } = self.pending.swap_remove(i);
            let answer = match heard {
                Heard::Line(line) => self.register_peer(&stream, &line),
                Heard::Failed(reason) => Err(reason),
                Heard::Waiting => unreachable!("kept above"),
            };
            match answer {
                Ok(r) => {
                    // The table goes with the answer: the process needs no
                    // access to its objects by name (a container's
                    // /dev/shm is usually its own).
                    // Its tenant's state alone: no other tenant's.
                    let (slot, tenant) = (r.slot, TenantId(r.tenant));
                    let state = match self.table.tenant_state_fd(tenant) {
                        Ok(fd) => fd,
                        Err(e) => {
                            refuse(
                                &stream,
                                format!("the table could not be handed over: {e}"),
                                report,
                            );
                            continue;
                        }
                    };
                    let line = wire::Answer::Registered(r).to_line();
                    let fds = [self.policy_fd.as_fd(), state.as_fd()];
                    match send_with_fds(&stream, line.as_bytes(), &fds) {
                        Ok(()) => report.registered.push((slot, tenant)),
                        Err(e) => {
                            // It left: the slot goes back when it is found dead.
                            tracing::warn!(error = %e, slot, "a registration's answer was not delivered");
                        }
                    }
                }
                Err(reason) => refuse(&stream, reason, report),
            }
        }
    }

    /// Registrations in progress: connections whose greeting has not
    /// fully arrived.
    pub fn pending_registrations(&self) -> usize {
        self.pending.len()
    }

    /// Identifies the peer that sent greeting `line` from its credentials
    /// and claims a process slot.
    fn register_peer(&self, stream: &UnixStream, line: &str) -> Result<wire::Registration, String> {
        if line.trim_end() != HELLO {
            return Err(format!(
                "unknown greeting {:?} (this coordinator speaks {HELLO:?})",
                line.trim_end()
            ));
        }
        let (pid, uid, gid) = peer_credentials(stream)
            .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
        if pid == 0 {
            return Err(
                "the peer's process is in a PID namespace the coordinator cannot see; \
                 run the coordinator in the tenants' PID namespace or an ancestor of it"
                    .into(),
            );
        }
        let peer = PeerCredentials {
            pid,
            uid,
            gid,
            cgroup: procinfo::cgroup(pid),
        };
        let tenant = self
            .policy
            .tenant_for_peer(&peer)
            .ok_or_else(|| {
                format!(
                    "no tenant of the policy matches uid {} gid {} cgroup {}",
                    peer.uid,
                    peer.gid,
                    peer.cgroup.as_deref().unwrap_or("(none)")
                )
            })?
            .id;
        let process = ProcessId::of(pid).ok_or_else(|| format!("process {pid} is gone"))?;
        let own_pid =
            procinfo::pid_in_own_namespace(pid).ok_or_else(|| format!("process {pid} is gone"))?;
        let slot = self
            .table
            .claim_process_slot(tenant, process)
            .map_err(|e| e.to_string())?;
        tracing::info!(pid, own_pid, uid = peer.uid, %tenant, slot, "registered process");
        Ok(wire::Registration {
            table: self.config.table.clone(),
            tenant: tenant.0,
            slot,
            recorded_pid: process.pid,
            recorded_start: process.start_time,
            own_pid,
        })
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
        let elapsed = now_ns.saturating_sub(self.last_recompute_ns).max(1);
        let first = self.last_recompute_ns == 0;
        self.last_recompute_ns = now_ns;
        // The policy's tenants in id order, with their slots' counters.
        let mut tenants: Vec<(&crate::policy::TenantEntry, u32)> = snapshot
            .policy
            .tenants
            .iter()
            .filter_map(|t| Some((t, snapshot.slot_of(t.id)?)))
            .collect();
        tenants.sort_by_key(|(t, _)| t.id);
        let per_sec = |bytes: u64| (u128::from(bytes) * 1_000_000_000 / u128::from(elapsed)) as u64;
        let mut demands = Vec::with_capacity(tenants.len());
        let mut moved = Vec::with_capacity(tenants.len());
        let mut signals = LinkSignals::default();
        for &(t, slot) in &tenants {
            let now = self.table.demand_counters(slot);
            let before = match self.last_counters.insert(t.id, (slot, now)) {
                Some((was, before)) if was == slot => before,
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
            let cap = match (t.schedule.byte_cap.map(|c| c.per_second), by_wrs) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
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
        let present = |id: &TenantId| tenants.binary_search_by_key(id, |(t, _)| t.id).is_ok();
        self.last_counters.retain(|id, _| present(id));
        self.windows_seen.retain(|id, _| present(id));
        if !first {
            if let Some(gains) = self.gains.as_mut() {
                // Windows of tenants in separate processes: each grows by
                // its gain so that what they move follows their weights.
                gains.update(mtrdma_sched::Nanos(now_ns), &moved);
            }
            let estimate = self.link.update(now_ns, elapsed, signals);
            self.table.set_link_estimate(estimate);
            // The windows share their growth as far as the link is full.
            let used = self.link.utilization_ppm();
            self.table
                .set_sharing_weight(self.gains.as_ref().map_or(0, |g| {
                    mtrdma_sched::share::sharing_for(g.sharing_weight(), used)
                }));
        }
        let floor_permits = self.piece_floor(now_ns, &tenants);
        let capacity = self.policy.link.capacity_bytes_per_sec;
        let rates = weighted_max_min(capacity, &demands);
        let active_weight: u128 = demands
            .iter()
            .filter(|d| d.effective() > 0)
            .map(|d| u128::from(d.weight.max(1)))
            .sum();
        let mut out = Vec::with_capacity(tenants.len());
        for ((&(t, slot), d), rate) in tenants.iter().zip(&demands).zip(rates) {
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
            let published = rate.max(share);
            self.table.set_fair_rate(slot, published.max(1));
            let gain = self.gains.as_ref().map_or(0, |g| g.gain(t.id));
            self.table.set_window_gain(slot, gain);
            out.push((t.id, published));
        }
        for (&(_, slot), permit) in tenants.iter().zip(floor_permits) {
            self.table.set_floor_permit(slot, permit.to_word());
        }
        self.table.heartbeat(now_ns);
        out
    }

    /// The one-piece floor's step at `now_ns` (`mtrdma_sched::piece_floor`):
    /// the latency tenants' reports in, the permit of each of `tenants`
    /// out. The windowed senders are the bulk tenants whose windows judged
    /// a piece within [`FLOOR_SENDER_MEMORY_NS`], in the order they came
    /// (those that came together in id order); steps are judged by the
    /// time a piece of the policy's bound takes at the link's measured
    /// rate (`FloorControl::update`). With no
    /// bound, no measured rate or the floor turned off, every permit is
    /// off.
    fn piece_floor(
        &mut self,
        now_ns: u64,
        tenants: &[(&crate::policy::TenantEntry, u32)],
    ) -> Vec<Permit> {
        let off = |floor: &FloorControl| Permit {
            on: false,
            generation: floor.permit(None).generation,
        };
        let Some(floor) = self.floor.as_mut() else {
            return vec![Permit::OFF; tenants.len()];
        };
        let piece = self
            .policy
            .link
            .latency_bound
            .and_then(|b| Protection::for_bound(b).ok())
            .map(|p| p.piece_bytes);
        let rate = self.table.link_estimate();
        let seen = &self.windows_seen;
        let is_sender = |t: &crate::policy::TenantEntry| {
            t.class == TrafficClass::Bulk
                && seen
                    .get(&t.id)
                    .is_some_and(|&at| now_ns.saturating_sub(at) <= FLOOR_SENDER_MEMORY_NS)
        };
        let order = &mut self.floor_order;
        order.retain(|id| tenants.iter().any(|(t, _)| t.id == *id && is_sender(t)));
        for (t, _) in tenants {
            if is_sender(t) && !order.contains(&t.id) {
                order.push(t.id);
            }
        }
        let (Some(piece), Some(rate)) = (piece, rate) else {
            floor.update(
                mtrdma_sched::Nanos(now_ns),
                Shift::default(),
                mtrdma_sched::Nanos::ZERO,
                0,
            );
            return tenants.iter().map(|_| off(floor)).collect();
        };
        let senders = order.len();
        let reports = tenants
            .iter()
            .filter(|(t, _)| t.class == TrafficClass::Latency)
            .map(|&(_, slot)| Shift::from_word(self.table.delay_shift(slot)));
        let report = FloorControl::merge(floor.permit(None), reports);
        let piece_ns = u128::from(piece) * 1_000_000_000 / u128::from(rate.max(1));
        let piece_time = mtrdma_sched::Nanos(u64::try_from(piece_ns).unwrap_or(u64::MAX));
        floor.update(mtrdma_sched::Nanos(now_ns), report, piece_time, senders);
        tenants
            .iter()
            .map(|(t, _)| {
                if let Some(index) = order.iter().position(|id| *id == t.id) {
                    floor.permit(Some(index))
                } else if t.class == TrafficClass::Latency {
                    floor.permit(None)
                } else {
                    off(floor)
                }
            })
            .collect()
    }

    /// Whether the coordinator runs the one-piece floor
    /// (`mtrdma_sched::piece_floor`; on by default): it gives the bulk
    /// tenants' delay windows a floor of one piece, one tenant at a time,
    /// as far as the latency tenants' median delay allows. Off, windows
    /// under a latency bound pace their pieces below one piece as they
    /// need.
    pub fn set_piece_floor(&mut self, on: bool) {
        if on != self.floor.is_some() {
            self.floor = on.then(FloorControl::default);
        }
    }

    /// Whether the coordinator sets gains on the tenants' delay windows'
    /// growth so that tenants in separate processes share the link by
    /// their weights (`mtrdma_sched::share`; on by default). Off, every
    /// window grows by its weight alone, as without a coordinator.
    pub fn set_window_gains(&mut self, on: bool) {
        if on != self.gains.is_some() {
            self.gains = on.then(ShareGains::default);
        }
    }

    /// The link estimate and the share of bytes the tenants' delay windows
    /// judged over their target, as of the last recomputation.
    pub fn link_view(&self) -> LinkView {
        LinkView {
            estimate_bytes_per_sec: self.table.link_estimate().unwrap_or(0),
            over_target: self.link.over_share(),
            floor_granted: self.floor.as_ref().map_or(0, FloorControl::granted),
            floor_senders: self.floor.as_ref().map_or(0, FloorControl::senders),
            floor_withdrawals: self.floor.as_ref().map_or(0, FloorControl::withdrawals),
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
    /// [`HOUSEKEEPING_INTERVAL_NS`].
    pub fn tick(&mut self, now_ns: u64) -> TickReport {
        let mut report = TickReport::default();
        let housekeeping = self.last_housekeeping_ns == 0
            || now_ns.saturating_sub(self.last_housekeeping_ns) >= HOUSEKEEPING_INTERVAL_NS;
        if housekeeping {
            self.last_housekeeping_ns = now_ns.max(1);
        }
        let changed = housekeeping && mtime(&self.config.policy_path) != self.policy_mtime;
        if self.reload_requested.swap(false, Ordering::AcqRel) || changed {
            match self.reload() {
                Ok(()) => report.reloaded = true,
                Err(e) => {
                    tracing::warn!(error = %e, "policy reload failed; keeping the previous policy");
                    report.reload_error = Some(e.to_string());
                }
            }
        }
        if self.registration_waiting.take() != Some(false) || !self.pending.is_empty() {
            self.serve_registrations(&mut report);
        }
        if housekeeping {
            report.reclaimed = self.reclaim();
        }
        let interval = u64::from(self.policy.link.recompute_interval_ms) * 1_000_000;
        if now_ns.saturating_sub(self.last_recompute_ns) >= interval {
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

/// The credentials of the process at the other end of `stream`
/// (`SO_PEERCRED`): pid, uid, gid. The pid is 0 when that process is in a
/// PID namespace this one cannot see.
fn peer_credentials(stream: &UnixStream) -> std::io::Result<(u32, u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes, as SO_PEERCRED
    // fills; the descriptor is the stream's own, open for the call. (A
    // raw `ucred` because its pid may be 0, which a non-zero pid type
    // cannot hold.)
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid, cred.gid))
}

/// Sends `bytes` on `stream` with the descriptors `fds` (`SCM_RIGHTS`).
fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for the buffer"));
    }
    let sent = sendmsg(
        stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent < bytes.len() {
        // The descriptors went with the first byte; the rest follows.
        let mut stream = stream;
        stream.write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// Reads the coordinator's answer: one line of at most
/// [`wire::ANSWER_MAX`] bytes, and the descriptors that came with it.
fn receive_answer(stream: &UnixStream) -> std::io::Result<(String, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut got = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; wire::ANSWER_MAX];
    loop {
        match wire::first_line(&got, wire::ANSWER_MAX, "an answer") {
            wire::FirstLine::Line(line) => return Ok((line, fds)),
            wire::FirstLine::Invalid(why) => return Err(std::io::Error::other(why)),
            wire::FirstLine::Incomplete => {}
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let room = buf.len() - got.len();
        let n = match recvmsg(
            stream,
            &mut [std::io::IoSliceMut::new(&mut buf[..room])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the coordinator closed the connection without an answer",
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// Turns a registration away with `reason`.
fn refuse(mut stream: &UnixStream, reason: String, report: &mut TickReport) {
    tracing::warn!(%reason, "registration refused");
    let line = wire::Answer::Refused(reason.clone()).to_line();
    let _ = stream.write_all(line.as_bytes());
    report.refused.push(reason);
}

/// Binds the registration socket, replacing a stale one nobody listens on.
fn bind(path: &Path) -> Result<UnixListener, CoordinatorError> {
    let sock_err = |source| CoordinatorError::Socket {
        path: path.to_path_buf(),
        source,
    };
    check_socket_path(path)?;
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(CoordinatorError::AlreadyRunning(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(sock_err)?;
    }
    let listener = UnixListener::bind(path).map_err(sock_err)?;
    // Any local process may ask to register; who it is comes from its
    // credentials, not from anything it says.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(sock_err)?;
    listener.set_nonblocking(true).map_err(sock_err)?;
    Ok(listener)
}

/// Refuses a socket path the coordinator cannot trust: one whose
/// directory others may write without the sticky bit (they could replace
/// the socket), or that already holds something not a socket of this user
/// (someone else put it there first).
fn check_socket_path(path: &Path) -> Result<(), CoordinatorError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let unsafe_socket = |problem: String| CoordinatorError::UnsafeSocket {
        path: path.to_path_buf(),
        problem,
    };
    let me = rustix::process::geteuid().as_raw();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let d = std::fs::metadata(dir).map_err(|source| CoordinatorError::Socket {
        path: dir.to_path_buf(),
        source,
    })?;
    let writable_by_others = d.mode() & 0o022 != 0;
    let sticky = d.mode() & 0o1000 != 0;
    if (writable_by_others && !sticky) || (d.uid() != me && d.uid() != 0) {
        return Err(unsafe_socket(format!(
            "its directory {} (uid {}, mode {:o}) may be changed by others; put the socket in \
             a directory of root or uid {me} that only they may write",
            dir.display(),
            d.uid(),
            d.mode() & 0o7777
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(unsafe_socket(
            "something that is not a socket is there; remove it if it is stale".into(),
        )),
        Ok(m) if m.uid() != me => Err(unsafe_socket(format!(
            "the socket there belongs to uid {}: another user's coordinator, or one put \
             there to impersonate it",
            m.uid()
        ))),
        _ => Ok(()),
    }
}

/// Registers the calling process with the coordinator listening on
/// `socket`: the coordinator decides its tenant from its credentials,
/// claims a process slot and hands over the table (its objects, so the
/// process needs no access to them by name, as in a container with a
/// /dev/shm of its own), and the process maps it (the policy read-only)
/// and takes the slot over. Only a coordinator running as root or as this
/// process's user is trusted.
pub fn register(socket: &Path) -> Result<TenantHandle, CoordinatorError> {
    let sock_err = |source| CoordinatorError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(sock_err)?;
    let (_, uid, _) = peer_credentials(&stream).map_err(sock_err)?;
    let own = rustix::process::geteuid().as_raw();
    if uid != 0 && uid != own {
        return Err(CoordinatorError::Untrusted {
            path: socket.to_path_buf(),
            uid,
            own,
        });
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(sock_err)?;
    writeln!(stream, "{HELLO}").map_err(sock_err)?;
    let (line, fds) = receive_answer(&stream).map_err(sock_err)?;
    let line = line.trim_end();
    let r = match wire::Answer::parse(line) {
        Some(wire::Answer::Registered(r)) => r,
        Some(wire::Answer::Refused(reason)) => return Err(CoordinatorError::Refused(reason)),
        None => return Err(CoordinatorError::Protocol(line.to_string())),
    };
    let own_pid = r.own_pid;
    if own_pid != std::process::id() {
        return Err(CoordinatorError::Protocol(format!(
            "{line}: the coordinator registered pid {own_pid}, this is pid {}",
            std::process::id()
        )));
    }
    let [policy, state] = <[OwnedFd; 2]>::try_from(fds).map_err(|fds| {
        CoordinatorError::Protocol(format!(
            "{line}: the answer carried {} descriptors, not the table's 2",
            fds.len()
        ))
    })?;
    let table = QuotaTable::from_fds(&r.table, &policy, state)?;
    let recorded = ProcessId {
        pid: r.recorded_pid,
        start_time: r.recorded_start,
    };
    Ok(table.adopt_as(TenantId(r.tenant), r.slot, recorded)?)
}
