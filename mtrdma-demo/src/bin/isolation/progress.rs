//! How far a run of scenarios has come, and about how long is left.
//!
//! Each scenario says up front how many measurements it makes; the time
//! left is the measurements left at the mean pace of those done so far
//! (before the first, a guess from the measurement's length). A scenario
//! that makes a different number of measurements than it planned is an
//! error in debug builds (the test command's run of the demo), so that the
//! plan stays true as scenarios change.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    /// (scenario, measurements it plans), in the order they run.
    plan: Vec<(String, usize)>,
    /// The running scenario's index in `plan`.
    current: Option<usize>,
    /// Measurements the running scenario has started.
    started_here: usize,
    /// Measurements of the scenarios before the running one (planned).
    before: usize,
    /// When the first scenario began.
    since: Instant,
    /// Time per measurement before any has run.
    guess: Duration,
}

impl Progress {
    /// `plan`: each scenario with the measurements it makes; `guess`: how
    /// long one measurement takes, until one has.
    pub(crate) fn new(plan: Vec<(String, usize)>, guess: Duration) -> Self {
        Progress {
            plan,
            current: None,
            started_here: 0,
            before: 0,
            since: Instant::now(),
            guess,
        }
    }

    fn total(&self) -> usize {
        self.plan.iter().map(|(_, n)| n).sum()
    }

    /// Measurements finished (those before the running one).
    fn done(&self) -> usize {
        self.before + self.started_here.saturating_sub(1)
    }

    /// About how long the measurements from the `done`-th on take.
    fn left(&self, done: usize) -> Duration {
        let pace = if done == 0 {
            self.guess
        } else {
            self.since.elapsed() / done as u32
        };
        pace * self.total().saturating_sub(done) as u32
    }

    /// The line that opens scenario `name`.
    pub(crate) fn begin(&mut self, name: &str) -> String {
        let i = self.plan.iter().position(|(s, _)| s == name);
        self.current = i;
        self.started_here = 0;
        let n = i.map_or(0, |i| self.plan[i].1);
        format!(
            "\n>> scenario {} of {}: {name}, {n} measurement{}; about {} left in all",
            i.map_or(0, |i| i + 1),
            self.plan.len(),
            if n == 1 { "" } else { "s" },
            about(self.left(self.before)),
        )
    }

    /// The line that opens a measurement (`tag`) of the running scenario.
    pub(crate) fn measurement(&mut self, tag: &str) -> String {
        self.started_here += 1;
        let (name, n) = self
            .current
            .map_or(("?", 0), |i| (self.plan[i].0.as_str(), self.plan[i].1));
        let mut line = format!(
            ">> {name} {}/{n} ({tag}): about {} left",
            self.started_here,
            about(self.left(self.done()))
        );
        if self.started_here > n {
            let _ = write!(line, " (more measurements than the scenario planned)");
        }
        line
    }

    /// The running scenario made `n` measurements where it could not know
    /// how many up front (one that runs for a time, not a count): its
    /// plan becomes `n`.
    pub(crate) fn replan(&mut self, n: usize) {
        if let Some(i) = self.current {
            self.plan[i].1 = n;
        }
    }

    /// Closes the running scenario. One that ran (`ran`) must have made
    /// the measurements it planned: a debug build says when it did not.
    pub(crate) fn end(&mut self, ran: bool) -> Result<(), String> {
        let Some(i) = self.current.take() else {
            return Ok(());
        };
        let (name, planned) = (&self.plan[i].0, self.plan[i].1);
        let made = self.started_here;
        self.before += planned;
        self.started_here = 0;
        if ran && made != planned && cfg!(debug_assertions) {
            return Err(format!(
                "scenario {name} made {made} measurements, its plan says {planned} \
                 (the progress's time left is wrong: fix the plan)"
            ));
        }
        Ok(())
    }
}

/// A duration as a person reads it: "40 s", "3 min 10 s" (to 10 s).
pub(crate) fn about(d: Duration) -> String {
    let s = (d.as_secs_f64() / 10.0).round() as u64 * 10;
    match (s / 60, s % 60) {
        (0, 0) => "10 s".to_string(),
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_counts_the_measurements_left_at_the_pace_so_far() {
        let mut p = Progress::new(
            vec![("a".into(), 2), ("b".into(), 3)],
            Duration::from_secs(12),
        );
        // Before anything ran: five measurements at the guess.
        assert!(p
            .begin("a")
            .contains("scenario 1 of 2: a, 2 measurements; about 1 min left in all"));
        assert!(p
            .measurement("a-1")
            .contains(">> a 1/2 (a-1): about 1 min left"));
        // Pretend the first measurement took 20 s.
        p.since -= Duration::from_secs(20);
        assert!(p
            .measurement("a-2")
            .contains("a 2/2 (a-2): about 1 min 20 s left"));
        p.end(true).unwrap();
        let line = p.begin("b");
        assert!(
            line.contains("scenario 2 of 2: b, 3 measurements"),
            "{line}"
        );
        p.measurement("b-1");
        p.measurement("b-2");
        p.measurement("b-3");
        let extra = p.measurement("b-4");
        assert!(
            extra.contains("more measurements than the scenario planned"),
            "{extra}"
        );
        // Debug builds (the tests') refuse a plan that was not kept...
        let err = p.end(true).unwrap_err();
        assert!(
            err.contains("made 4 measurements, its plan says 3"),
            "{err}"
        );
        // ...unless the scenario did not run to the end.
        p.begin("a");
        p.measurement("a-1");
        p.end(false).unwrap();
    }

    #[test]
    fn durations_read_as_minutes_and_tens_of_seconds() {
        assert_eq!(about(Duration::from_secs(3)), "10 s");
        assert_eq!(about(Duration::from_secs(44)), "40 s");
        assert_eq!(about(Duration::from_secs(60)), "1 min");
        assert_eq!(about(Duration::from_secs(194)), "3 min 10 s");
    }
}
