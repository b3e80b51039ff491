//! Which of the demo's scenarios ran: `scenarios.tsv` in the output
//! directory, one line a scenario (`NAME<TAB>ran`, `NAME<TAB>pending`, or
//! `NAME<TAB>did not run<TAB>WHY`). `isolation` writes it as it
//! goes, every scenario `pending` first, so a run cut short still says
//! which scenarios it never reached; `cargo xtask demo` reads it for the
//! summary it ends with, and the demo's own steps write lines of the same
//! form.

use std::path::{Path, PathBuf};

/// The file's name in the output directory.
pub(crate) const FILE: &str = "scenarios.tsv";

/// What became of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Not reached (yet).
    Pending,
    /// It ran to the end (whether its targets were met is in its table).
    Ran,
    /// It could not run, and why.
    Failed(String),
}

impl State {
    /// The state's columns in the file.
    fn columns(&self) -> String {
        match self {
            State::Pending => "pending".into(),
            State::Ran => "ran".into(),
            // One line, no tabs: the first line of the reason says what
            // failed and where its output is.
            State::Failed(why) => {
                let first = why.lines().next().unwrap_or_default().replace('\t', " ");
                let short: String = first.chars().take(400).collect();
                format!("did not run\t{short}")
            }
        }
    }
}

/// The scenarios of a run and their states, kept in `scenarios.tsv`.
#[derive(Debug)]
pub(crate) struct Record {
    path: PathBuf,
    entries: Vec<(String, State)>,
}

impl Record {
    /// Every one of `scenarios` pending, written into `out`.
    pub(crate) fn start(out: &Path, scenarios: &[String]) -> Result<Record, String> {
        let record = Record {
            path: out.join(FILE),
            entries: scenarios
                .iter()
                .map(|s| (s.clone(), State::Pending))
                .collect(),
        };
        record.write()?;
        Ok(record)
    }

    /// Records how `scenario` ended and writes the file again.
    pub(crate) fn set(&mut self, scenario: &str, state: State) -> Result<(), String> {
        match self.entries.iter_mut().find(|(s, _)| s == scenario) {
            Some(entry) => entry.1 = state,
            None => self.entries.push((scenario.to_string(), state)),
        }
        self.write()
    }

    /// The scenarios that did not run, with why.
    pub(crate) fn failed(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .filter_map(|(s, state)| match state {
                State::Failed(why) => Some((s.as_str(), why.as_str())),
                _ => None,
            })
            .collect()
    }

    fn write(&self) -> Result<(), String> {
        let text: String = self
            .entries
            .iter()
            .map(|(s, state)| format!("{s}\t{}\n", state.columns()))
            .collect();
        std::fs::write(&self.path, text).map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// The scenarios in a `scenarios.tsv`, in order; a scenario named twice
/// takes its last line, and a line that is not of the file's form is
/// reported as a scenario that did not run.
pub(crate) fn parse(text: &str) -> Vec<(String, State)> {
    let mut out: Vec<(String, State)> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut cols = line.splitn(3, '\t');
        let name = cols.next().unwrap_or_default().trim().to_string();
        let state = match (cols.next(), cols.next()) {
            (Some("ran"), None) => State::Ran,
            (Some("pending"), None) => State::Pending,
            (Some("did not run"), why) => State::Failed(why.unwrap_or("no reason given").into()),
            _ => State::Failed(format!("unreadable line in {FILE}: {line:?}")),
        };
        match out.iter_mut().find(|(s, _)| *s == name) {
            Some(entry) => entry.1 = state,
            None => out.push((name, state)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let out = std::env::temp_dir().join(format!("isolation-status-{}", std::process::id()));
        std::fs::create_dir_all(&out).unwrap();
        let names = ["latency".to_string(), "apps".to_string(), "cap".to_string()];
        let mut record = Record::start(&out, &names).unwrap();
        record.set("latency", State::Ran).unwrap();
        record
            .set(
                "apps",
                State::Failed("starting node0:\tno such file\nmore".into()),
            )
            .unwrap();
        let text = std::fs::read_to_string(out.join(FILE)).unwrap();
        assert_eq!(
            parse(&text),
            [
                ("latency".to_string(), State::Ran),
                (
                    "apps".to_string(),
                    State::Failed("starting node0: no such file".into())
                ),
                ("cap".to_string(), State::Pending),
            ]
        );
        assert_eq!(
            record.failed(),
            [("apps", "starting node0:\tno such file\nmore")]
        );
        assert!(
            matches!(&parse("x\tsomething else\n")[0].1, State::Failed(w) if w.contains("unreadable"))
        );
        std::fs::remove_dir_all(&out).ok();
    }
}
