//! The programs the isolation demo starts, and which of its scenarios
//! start each: one list, read by `isolation` (a scenario finds a
//! program's path only through it) and by `cargo xtask demo` (which builds
//! every program on it before the VM boots, in the profile it runs). A
//! scenario that starts a program missing from the list for it fails,
//! naming both, before it measures anything.
//!
//! Scenario names are those of `isolation --link --scenarios` and the
//! demo's own steps around it: `reference` (perftest's tools next to
//! mtrdma-demo's `perf`), `preload` (perftest under the preload library), `link
//! rate` (what rxe carries unshaped, measured with `perf`, then the search
//! for the rate `ib_write_bw` fills), `link` (the link run itself) and
//! `single-process` (isolation's one-process run). Programs installed with
//! the system (perftest's `ib_write_bw`, `memcached`) are not built and not
//! listed: `cargo xtask deps` installs them.

use std::path::{Path, PathBuf};

/// How a program on the list is built, and where the build puts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    /// `cargo build --example NAME`: `target/PROFILE/examples/NAME`.
    Example,
    /// `cargo build -p mtrdma-demo --bin NAME`: `target/PROFILE/NAME`.
    Demo,
    /// `cargo build -p mtrdma-preload`: the library unmodified verbs
    /// programs run under, `target/PROFILE/libmtrdma_preload.so`.
    PreloadLibrary,
}

/// A program the demo starts.
#[derive(Debug)]
pub(crate) struct Program {
    /// The example's or binary's name (or, for the preload library, its
    /// package's).
    pub(crate) name: &'static str,
    pub(crate) build: Build,
    /// The scenarios and steps that start it.
    pub(crate) scenarios: &'static [&'static str],
}

/// Every program the demo starts.
pub(crate) const PROGRAMS: &[Program] = &[
    Program {
        name: "isolation",
        build: Build::Demo,
        // The link run and the single-process run are this program; the
        // storm and attack scenarios also start it as a storm tenant.
        scenarios: &["link", "single-process", "storm", "attack", "soak"],
    },
    Program {
        name: "coordinator",
        build: Build::Example,
        // The link run's coordinator, whose tenants every scenario's are.
        scenarios: &[
            "link", "latency", "hogs", "weights", "cap", "storm", "attack", "apps", "soak",
            "cluster",
        ],
    },
    Program {
        name: "perf",
        build: Build::Demo,
        scenarios: &[
            "reference",
            "link rate",
            "latency",
            "hogs",
            "weights",
            "cap",
            "storm",
            "attack",
            "soak",
            "cluster",
        ],
    },
    Program {
        name: "rpc",
        build: Build::Example,
        scenarios: &["apps"],
    },
    Program {
        name: "remote_memory",
        build: Build::Demo,
        scenarios: &["apps"],
    },
    Program {
        name: "mtrdma-preload",
        build: Build::PreloadLibrary,
        scenarios: &["preload", "hogs"],
    },
];

impl Program {
    /// Where the build of `profile_dir` (`target/PROFILE`) puts it.
    pub(crate) fn path(&self, profile_dir: &Path) -> PathBuf {
        match self.build {
            Build::Example => profile_dir.join("examples").join(self.name),
            Build::Demo => profile_dir.join(self.name),
            Build::PreloadLibrary => profile_dir.join("libmtrdma_preload.so"),
        }
    }
}

/// The program `name` as the scenario `scenario` starts it, or why it
/// cannot: not on the list for that scenario, or not built.
pub(crate) fn find(profile_dir: &Path, scenario: &str, name: &str) -> Result<PathBuf, String> {
    let Some(program) = PROGRAMS
        .iter()
        .find(|p| p.name == name && p.scenarios.contains(&scenario))
    else {
        return Err(format!(
            "scenario {scenario} starts {name}, which the demo's list of programs \
             (mtrdma-demo/src/bin/isolation/programs.rs) does not name for it, so `cargo xtask demo` \
             need not have built it"
        ));
    };
    let path = program.path(profile_dir);
    if !path.exists() {
        return Err(format!(
            "scenario {scenario} starts {name}, and {} is missing: `cargo xtask demo` builds \
             every program on mtrdma-demo/src/bin/isolation/programs.rs (by hand: {})",
            path.display(),
            {
                let release = if profile_dir.ends_with("release") {
                    " --release"
                } else {
                    ""
                };
                match program.build {
                    Build::Example => format!("cargo build{release} --example {name}"),
                    Build::Demo => format!("cargo build{release} -p mtrdma-demo --bin {name}"),
                    Build::PreloadLibrary => format!("cargo build{release} -p {name}"),
                }
            }
        ));
    }
    Ok(path)
}
