//! What the kernel says about a process: is it still the one we knew?

use std::fs;

/// A process identified by pid *and* start time, so a later process that
/// reuses the pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
}

impl ProcessId {
    /// The calling process.
    pub fn current() -> Option<ProcessId> {
        let pid = std::process::id();
        Some(ProcessId {
            pid,
            start_time: start_time(pid)?,
        })
    }

    /// Looks a running process up by pid.
    pub fn of(pid: u32) -> Option<ProcessId> {
        Some(ProcessId {
            pid,
            start_time: start_time(pid)?,
        })
    }

    /// True while this very process (same pid and start time) exists and
    /// is not a zombie.
    pub fn is_alive(&self) -> bool {
        match stat_fields(self.pid) {
            Some((state, start)) => start == self.start_time && state != 'Z' && state != 'X',
            None => false,
        }
    }
}

/// Whether some process (not a zombie) has `pid` now: all that is known of
/// a process whose start time was never recorded.
pub fn pid_in_use(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// The pid that process `pid` (as this process sees it) has in its own,
/// innermost PID namespace: what it gets from `getpid()` (the last field
/// of `NSpid` in `/proc/PID/status`; `pid` itself where the kernel does
/// not say).
pub fn pid_in_own_namespace(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    match status.lines().find(|l| l.starts_with("NSpid:")) {
        Some(line) => line.split_whitespace().last()?.parse().ok(),
        None => Some(pid),
    }
}

/// A process's start time in clock ticks after boot.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|(_, start)| start)
}

/// (state, starttime) from `/proc/PID/stat`.
fn stat_fields(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Parses `pid (comm) S ppid ... starttime ...`; `comm` may hold spaces and
/// parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), starttime is field 22: 18 fields further.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The cgroup (v2 unified hierarchy path) of a process, if it has one.
pub fn cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 0";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R 1 2"), None);
    }

    #[test]
    fn knows_itself_and_not_a_reused_pid() {
        let me = ProcessId::current().unwrap();
        assert!(me.is_alive());
        let reused = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_alive());
        assert!(!ProcessId {
            pid: u32::MAX,
            start_time: 0
        }
        .is_alive());
    }
}
