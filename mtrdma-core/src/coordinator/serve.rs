//! Serving the registration socket: connections are accepted and kept
//! side by side until their greeting has arrived, each peer is identified
//! by its credentials and given a process slot of its tenant, and the
//! table goes with the answer.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use super::socket::{peer_credentials, refuse, send_with_fds};
use super::wire::{self, GREETING_MAX, HELLO};
use super::{Coordinator, TickReport};
use crate::policy::PeerCredentials;
use crate::procinfo::{self, ProcessId};
use crate::TenantId;

/// How long a connection to the registration socket has to send its
/// greeting before it is turned away. Connections are served side by
/// side, never one at a time, so a silent or slow one holds up no other
/// registration, nor reclamation, fair rates or shutdown.
pub const REGISTRATION_DEADLINE_NS: u64 = 1_000_000_000;

/// Registrations in progress at once; a connection beyond them is turned
/// away at once ("try again"), so that a flood of connections costs the
/// coordinator a bounded amount of memory and work per tick.
pub const MAX_PENDING_REGISTRATIONS: usize = 64;

/// A connection whose greeting has not fully arrived.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) stream: UnixStream,
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

/// Why a registration of `peer` is refused when no tenant matches it. A
/// cgroup path that begins with `/..` lies outside the coordinator's
/// cgroup namespace (a coordinator in a container of its own sees the
/// other containers' cgroups so): no cgroup rule can match it, and the
/// answer says how to run the coordinator so that one can.
fn no_tenant_matches(peer: &PeerCredentials) -> String {
    let cgroup = peer.cgroup.as_deref().unwrap_or("(none)");
    let mut why = format!(
        "no tenant of the policy matches uid {} gid {} cgroup {cgroup}",
        peer.uid, peer.gid
    );
    if cgroup.starts_with("/..") {
        why.push_str(
            " (a path outside the coordinator's cgroup namespace: run the coordinator \
             in the host's, e.g. `nsenter --target 1 --cgroup`, for cgroup rules to match)",
        );
    }
    why
}

impl Coordinator {
    /// Accepts the connections waiting on the registration socket and
    /// answers every one whose greeting has arrived, without waiting for
    /// any: a connection that has not said all of its greeting is kept for
    /// the next call, until [`REGISTRATION_DEADLINE_NS`] after it came.
    pub fn serve_registrations(&mut self, report: &mut TickReport) {
        let now = self.table.now_ns();
        self.serve_registrations_at(now, report);
    }

    /// [`serve_registrations`](Self::serve_registrations) at `now` (the
    /// table's clock, as [`tick`](Self::tick) is given it): deadlines are
    /// judged against the time the caller names, so that a test can run
    /// them in virtual time.
    pub(super) fn serve_registrations_at(&mut self, now: u64, report: &mut TickReport) {
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
            .ok_or_else(|| no_tenant_matches(&peer))?
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_when_the_peers_cgroup_is_outside_the_coordinators_namespace() {
        let peer = |cgroup: Option<&str>| PeerCredentials {
            pid: 7,
            uid: 1000,
            gid: 2000,
            cgroup: cgroup.map(str::to_string),
        };
        let inside = no_tenant_matches(&peer(Some("/kubepods.slice/kv")));
        assert_eq!(
            inside,
            "no tenant of the policy matches uid 1000 gid 2000 cgroup /kubepods.slice/kv"
        );
        let outside = no_tenant_matches(&peer(Some("/../../kubepods-besteffort.slice/x.scope")));
        assert!(outside.contains("outside the coordinator's cgroup namespace"));
        assert!(outside.contains("nsenter --target 1 --cgroup"));
        assert!(no_tenant_matches(&peer(None)).ends_with("cgroup (none)"));
    }
}
