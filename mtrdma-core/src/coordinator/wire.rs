//! The registration protocol's messages as each side parses them: what
//! the coordinator reads from a registering process (a greeting line)
//! and what the process reads back (an answer line). Public so that they
//! can be fuzzed; [`Coordinator`](super::Coordinator) and
//! [`register`](super::register) use them.

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
