//! The BPF program in the kernel and its maps, through `aya`.

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::kprobe::KProbeLinkId;
use aya::programs::{KProbe, ProgramError};
use aya::{Ebpf, EbpfLoader, Pod};

use super::{KernelCounts, ProcessCounts};

/// The monitor's BPF object, compiled by `build.rs` from
/// `bpf/monitor.bpf.c`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/monitor.bpf.o"));

/// Each program of the object and the kernel function it probes (entry or
/// return, as its section says), in the order they are attached: the
/// probes that remember objects before those that count their end.
pub const PROBES: [(&str, &str); 10] = [
    ("qp_created", "ib_create_qp_user"),
    ("qp_modify_begins", "ib_modify_qp_with_udata"),
    ("qp_modified", "ib_modify_qp_with_udata"),
    ("mr_reg_begins", "ib_uverbs_reg_mr"),
    ("mr_pin_begins", "ib_umem_get"),
    ("mr_pinned", "ib_umem_get"),
    ("mr_registered", "ib_uverbs_reg_mr"),
    ("qp_destroy_begins", "ib_destroy_qp_user"),
    ("qp_destroyed", "ib_destroy_qp_user"),
    ("mr_released", "ib_umem_release"),
];

/// When the counts map holds more processes than this (half of what it
/// can), processes that are gone and hold nothing leave it, their counts
/// with them.
const PRUNE_ABOVE: usize = 8192;

/// Who made an object (`struct owner` in the BPF program).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Owner {
    cgroup: u64,
    tgid: u32,
    pad: u32,
}

/// What one process did (`struct counts` in the BPF program).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RawCounts {
    qps_created: u64,
    qps_destroyed: u64,
    qp_state_changes: u64,
    qps_to_rts: u64,
    mrs_registered: u64,
    mrs_deregistered: u64,
    mr_bytes_registered: u64,
    mr_bytes_released: u64,
    uid: u32,
    gid: u32,
}

// SAFETY: plain `#[repr(C)]` integers with no padding (Owner: 8 + 4 + 4
// bytes; RawCounts: 8 x 8 + 4 + 4), valid for every bit pattern, as `Pod`
// requires for values copied to and from the kernel's maps.
unsafe impl Pod for Owner {}
// SAFETY: as for `Owner`.
unsafe impl Pod for RawCounts {}

/// Why the kernel monitor could not start or read its counts.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The kernel refused to load the program or to attach a probe for
    /// lack of privilege.
    #[error(
        "the kernel monitor needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN) to load its BPF program and kprobes: {0}"
    )]
    NotPermitted(String),
    /// A kernel function the monitor probes is not there to probe.
    #[error(
        "cannot attach the kernel monitor to {function}: {reason} (is the ib_uverbs module loaded, and the kernel built with kprobes and BPF?)"
    )]
    Attach {
        /// The kernel function.
        function: &'static str,
        /// What the kernel said.
        reason: String,
    },
    /// The kernel refused the BPF object or one of its programs.
    #[error("the kernel refused the monitor's BPF program {what}: {reason}")]
    Load {
        /// The object, or the program.
        what: String,
        /// What the kernel (its verifier) said.
        reason: String,
    },
    /// A map of the program could not be read.
    #[error("reading the kernel monitor's {map} map: {reason}")]
    Map {
        /// The map.
        map: &'static str,
        /// Why.
        reason: String,
    },
}

/// The kernel side of the monitor: its BPF program loaded and its probes
/// attached (see the [module docs](super)). Dropping it detaches them.
///
/// ```no_run
/// use mtrdma_core::monitor::KernelMonitor;
/// let mut monitor = KernelMonitor::start()?;
/// for p in monitor.processes()? {
///     println!("pid {} holds {} queue pairs", p.pid, p.counts.qps_held());
/// }
/// # Ok::<(), mtrdma_core::monitor::MonitorError>(())
/// ```
#[derive(Debug)]
pub struct KernelMonitor {
    ebpf: Ebpf,
    /// Each probe's attachment, in [`PROBES`]' order (empty: paused).
    links: Vec<KProbeLinkId>,
}

/// Whether an error's chain says the kernel refused for lack of privilege.
fn not_permitted(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// An error and its sources, one sentence.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    text
}

fn program_error(what: &str, e: ProgramError) -> MonitorError {
    if not_permitted(&e) {
        return MonitorError::NotPermitted(chain(&e));
    }
    let reason = match &e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => format!("{io_error}; verifier: {verifier_log}"),
        other => chain(other),
    };
    MonitorError::Load {
        what: what.to_string(),
        reason,
    }
}

impl KernelMonitor {
    /// Loads the program and attaches every probe of [`PROBES`].
    ///
    /// # Errors
    /// [`MonitorError::NotPermitted`] without the privilege to load BPF
    /// programs, [`MonitorError::Attach`] where a probed function is
    /// missing (no `ib_uverbs` module, no kprobes), [`MonitorError::Load`]
    /// if the kernel refuses the program.
    pub fn start() -> Result<KernelMonitor, MonitorError> {
        let ebpf = EbpfLoader::new().load(OBJECT).map_err(|e| {
            if not_permitted(&e) {
                MonitorError::NotPermitted(chain(&e))
            } else {
                MonitorError::Load {
                    what: "object".into(),
                    reason: chain(&e),
                }
            }
        })?;
        let mut monitor = KernelMonitor {
            ebpf,
            links: Vec::new(),
        };
        for (program, _) in PROBES {
            monitor
                .probe(program)?
                .load()
                .map_err(|e| program_error(program, e))?;
        }
        monitor.resume()?;
        tracing::info!(probes = PROBES.len(), "kernel monitor attached");
        Ok(monitor)
    }

    fn probe(&mut self, program: &'static str) -> Result<&mut KProbe, MonitorError> {
        self.ebpf
            .program_mut(program)
            .ok_or_else(|| MonitorError::Load {
                what: program.into(),
                reason: "not in the object".into(),
            })?
            .try_into()
            .map_err(|e| program_error(program, e))
    }

    /// Detaches every probe: nothing is counted until
    /// [`resume`](Self::resume), and the counts so far stay. Objects made
    /// meanwhile are not known to the monitor (their destruction is not
    /// counted either). For measuring what the probes cost.
    ///
    /// # Errors
    /// [`MonitorError::Load`] if a probe cannot be detached.
    pub fn pause(&mut self) -> Result<(), MonitorError> {
        let links = std::mem::take(&mut self.links);
        for ((program, _), link) in PROBES.into_iter().zip(links) {
            self.probe(program)?
                .detach(link)
                .map_err(|e| program_error(program, e))?;
        }
        Ok(())
    }

    /// Attaches every probe again (see [`pause`](Self::pause)); nothing if
    /// they are attached.
    ///
    /// # Errors
    /// As [`start`](Self::start)'s attaching.
    pub fn resume(&mut self) -> Result<(), MonitorError> {
        if !self.links.is_empty() {
            return Ok(());
        }
        for (program, function) in PROBES {
            let link = self.probe(program)?.attach(function, 0).map_err(|e| {
                if not_permitted(&e) {
                    MonitorError::NotPermitted(chain(&e))
                } else {
                    MonitorError::Attach {
                        function,
                        reason: chain(&e),
                    }
                }
            })?;
            self.links.push(link);
        }
        Ok(())
    }

    fn counts_map(&self) -> Result<BpfHashMap<&MapData, Owner, RawCounts>, MonitorError> {
        let map = self.ebpf.map("COUNTS").ok_or(MonitorError::Map {
            map: "COUNTS",
            reason: "not in the object".into(),
        })?;
        BpfHashMap::try_from(map).map_err(|e| MonitorError::Map {
            map: "COUNTS",
            reason: chain(&e),
        })
    }

    /// Every process that made a queue pair or a memory region since the
    /// monitor started, with what it did. A process that changed cgroups
    /// between its objects appears once per cgroup.
    ///
    /// # Errors
    /// [`MonitorError::Map`] if the kernel's map cannot be read.
    pub fn processes(&mut self) -> Result<Vec<ProcessCounts>, MonitorError> {
        let mut out = Vec::new();
        for entry in self.counts_map()?.iter() {
            let (owner, c) = match entry {
                Ok(kv) => kv,
                // An entry removed while the map was walked.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => {
                    return Err(MonitorError::Map {
                        map: "COUNTS",
                        reason: chain(&e),
                    })
                }
            };
            out.push(ProcessCounts {
                cgroup_id: owner.cgroup,
                pid: owner.tgid,
                uid: c.uid,
                gid: c.gid,
                counts: KernelCounts {
                    qps_created: c.qps_created,
                    qps_destroyed: c.qps_destroyed,
                    qp_state_changes: c.qp_state_changes,
                    qps_to_rts: c.qps_to_rts,
                    mrs_registered: c.mrs_registered,
                    mrs_released: c.mrs_deregistered,
                    mr_bytes_registered: c.mr_bytes_registered,
                    mr_bytes_released: c.mr_bytes_released,
                },
            });
        }
        out.sort_by_key(|p| (p.pid, p.cgroup_id));
        if out.len() > PRUNE_ABOVE {
            self.prune(&out)?;
        }
        Ok(out)
    }

    /// Takes out of the counts map the processes that are gone and hold
    /// nothing, so that the map (16,384 processes) does not fill.
    fn prune(&mut self, processes: &[ProcessCounts]) -> Result<(), MonitorError> {
        let map = self.ebpf.map_mut("COUNTS").ok_or(MonitorError::Map {
            map: "COUNTS",
            reason: "not in the object".into(),
        })?;
        let mut map: BpfHashMap<&mut MapData, Owner, RawCounts> = BpfHashMap::try_from(map)
            .map_err(|e| MonitorError::Map {
                map: "COUNTS",
                reason: chain(&e),
            })?;
        for p in processes {
            if p.counts.holds_any() || crate::procinfo::pid_in_use(p.pid) {
                continue;
            }
            // Already gone is as good.
            let _ = map.remove(&Owner {
                cgroup: p.cgroup_id,
                tgid: p.pid,
                pad: 0,
            });
        }
        Ok(())
    }
}
