//! Running commands and finding the workspace.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

/// The workspace root (the directory of the root `Cargo.toml`).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cmake that the builds xtask runs use (`CMAKE`, which ibverbs-sys's
/// build script, through the cmake crate, runs): one that configures
/// rdma-core and skips building it (see the script). Set for this process
/// and so for every build it starts, unless `CMAKE` names one already.
pub(crate) fn configure_only_cmake() {
    if std::env::var_os("CMAKE").is_none() {
        let script = cmake_configure_only();
        if script.exists() {
            std::env::set_var("CMAKE", script);
        }
    }
}

/// `xtask/cmake-configure-only`.
fn cmake_configure_only() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cmake-configure-only")
}

/// Cargo's target directory.
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// A `cargo` command (the same cargo that runs xtask), run in the workspace root.
pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Whether a program is on `PATH`.
pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Prints the command, runs it with inherited stdio, and returns whether it succeeded.
pub(crate) fn status(cmd: &mut Command) -> Result<bool> {
    eprintln!("$ {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    Ok(status.success())
}

/// Runs the command and fails unless it succeeds.
pub(crate) fn check(cmd: &mut Command) -> Result<()> {
    if !status(cmd)? {
        bail!("command failed: {}", describe(cmd));
    }
    Ok(())
}

/// Runs the command quietly and returns its stdout; fails with its stderr.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "command failed: {}\n{}",
            describe(cmd),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the command, echoing its stdout as it comes (stderr inherited), and
/// returns whether it succeeded and the stdout it printed.
pub(crate) fn tee(cmd: &mut Command) -> Result<(bool, String)> {
    eprintln!("$ {}", describe(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    let mut captured = String::new();
    let reader = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut out = std::io::stdout().lock();
    for line in reader.split(b'\n') {
        let line = String::from_utf8_lossy(&line?).into_owned();
        writeln!(out, "{line}")?;
        captured.push_str(&line);
        captured.push('\n');
    }
    drop(out);
    Ok((child.wait()?.success(), captured))
}

/// A command running beside the stages that follow it (its stdout and
/// stderr in a log file), joined when its result is needed: the stages
/// after the host tests run on one core much of the time (loom's and
/// Miri's runs, each fuzz target), and builds can use the other.
pub(crate) struct Background {
    what: String,
    child: std::process::Child,
    log: PathBuf,
    started: std::time::Instant,
}

impl Background {
    /// Starts `cmd`, its output into `log`.
    pub(crate) fn start(what: &str, cmd: &mut Command, log: &Path) -> Result<Background> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        eprintln!("$ {} > {} 2>&1 &", describe(cmd), log.display());
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
        Ok(Background {
            what: what.to_string(),
            child,
            log: log.to_path_buf(),
            started: std::time::Instant::now(),
        })
    }

    /// Starts `cmd` as [`Background::start`] does, under the idle
    /// scheduling policy (`chrt --idle 0`, `SCHED_IDLE`): it runs only on
    /// CPU time nothing else wants, so that it neither slows the stages in
    /// the foreground nor the VM's emulated CPUs, and takes up what they
    /// leave (the VM's device tests leave much of the host idle).
    pub(crate) fn start_idle(what: &str, cmd: &Command, log: &Path) -> Result<Background> {
        let mut idle = Command::new("chrt");
        idle.args(["--idle", "0"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => idle.env(key, value),
                None => idle.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            idle.current_dir(dir);
        }
        Self::start(what, &mut idle, log)
    }

    /// Waits for it. Returns whether it succeeded and a line saying how
    /// long it ran; on failure its log is printed.
    pub(crate) fn join(mut self) -> Result<(bool, String)> {
        let status = self.child.wait()?;
        let took = self.started.elapsed().as_secs_f64();
        let ok = status.success();
        if !ok {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("{log}");
        }
        Ok((
            ok,
            format!(
                "{} {} after {took:.0} s in the background (log: {})",
                self.what,
                if ok { "succeeded" } else { "FAILED" },
                self.log.display()
            ),
        ))
    }
}

/// One left unjoined (a run that stopped early) is stopped with it.
impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The first word after `prefix` on the first line of `output` that starts
/// with it (a count a tool reports), or `?`.
pub(crate) fn word_after<'a>(output: &'a str, prefix: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.split_whitespace().next())
        .unwrap_or("?")
}

/// How a command reads on a shell line.
pub(crate) fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes a word for a POSIX shell.
pub(crate) fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The totals of libtest's `test result:` lines in some output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TestCounts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
}

impl TestCounts {
    /// Sums every `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line.
    pub(crate) fn parse(output: &str) -> TestCounts {
        let mut counts = TestCounts::default();
        for line in output.lines() {
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(label), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match label {
                    "passed" => counts.passed += n,
                    "failed" => counts.failed += n,
                    "ignored" => counts.ignored += n,
                    _ => {}
                }
            }
        }
        counts
    }
}

/// A shell line that waits, up to `tenths` tenths of a second, until a
/// socket listens on TCP `port` (IPv4 or IPv6: state 0A and a remote
/// address of zeros in `/proc/net/tcp*`, so that an earlier connection's
/// closed socket on the port does not count): the client of a server started in the
/// background goes once it can connect, not after a guessed sleep.
pub(crate) fn wait_listening_sh(port: u32, tenths: u32) -> String {
    format!(
        "for i in $(seq {tenths}); do grep -qE \":{port:04X} 0+:0000 0A\" \
         /proc/net/tcp /proc/net/tcp6 2>/dev/null && break; sleep 0.1; done"
    )
}

/// Panics unless `script` is valid shell (`sh -n`), with the shell's
/// complaint and the script (for the tests of the scripts xtask writes).
#[cfg(test)]
pub(crate) fn assert_valid_shell(script: &str) {
    let checked = Command::new("sh")
        .args(["-n", "-c", script])
        .output()
        .expect("sh runs");
    assert!(
        checked.status.success(),
        "{}\n{script}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configure_only_cmake_skips_the_build_and_is_cmake_otherwise() {
        let script = cmake_configure_only();
        let dir = std::env::temp_dir().join(format!("xtask-cmake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("CMakeLists.txt"),
            "cmake_minimum_required(VERSION 3.10)\nproject(probe NONE)\n\
             file(WRITE ${CMAKE_BINARY_DIR}/configured \"\")\n\
             add_custom_target(built ALL COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_BINARY_DIR}/built)\n",
        )
        .unwrap();
        let build = dir.join("build");
        let run = |args: &[&str]| {
            let out = Command::new(&script)
                .args(args)
                .output()
                .expect("the script runs");
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(run(&["--version"]).starts_with("cmake version"));
        run(&[
            "-S",
            &dir.display().to_string(),
            "-B",
            &build.display().to_string(),
        ]);
        assert!(build.join("configured").exists(), "configured");
        run(&["--build", &build.display().to_string()]);
        assert!(!build.join("built").exists(), "not built");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sums_libtest_result_lines() {
        let out = "running 2 tests\n\
            test a ... ok\n\
            test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
            test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.20s\n\
            the test result: is not at the start\n";
        assert_eq!(
            TestCounts::parse(out),
            TestCounts {
                passed: 7,
                failed: 2,
                ignored: 1
            }
        );
    }

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(shell_quote("ibv_devinfo"), "ibv_devinfo");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
