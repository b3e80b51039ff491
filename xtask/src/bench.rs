//! `cargo xtask bench-device`: the criterion bench on a device
//! (`benches/device.rs`) on `rxe0` inside the SoftRoCE VM.
//!
//! Builds the bench on the host (`cargo bench --bench device --no-run`),
//! boots the VM and runs the built binary there with
//! `MTRDMA_BENCH_DEVICE=rxe0 ... --bench` and the arguments after `--`
//! (criterion's: `--quick`, a filter, `--measurement-time`, ...). The
//! host's tree is read-only in the guest, so criterion keeps its results in
//! `target/vm/criterion`, shared writable: a later run is compared with the
//! one before, as on the host.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::{proc, vm};

/// The device the bench runs on in the VM.
const DEVICE: &str = "rxe0";

/// How long the VM may run: the full bench takes a few minutes under
/// emulation.
const TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// `cargo xtask bench-device [-- ARGS]`.
pub(crate) fn run(rest: &[String]) -> Result<ExitCode> {
    let args = match rest.split_first() {
        None => &[][..],
        Some((first, args)) if first == "--" => args,
        Some((other, _)) => bail!(
            "`cargo xtask bench-device` takes [-- ARGS for the bench (criterion's, such as \
             --quick)], not {other:?}"
        ),
    };
    let bin = build()?;
    let criterion = proc::target_dir().join("vm").join("criterion");
    std::fs::create_dir_all(&criterion)
        .with_context(|| format!("creating {}", criterion.display()))?;
    let opts = vm::Options {
        timeout: TIMEOUT,
        rw_shares: vec![criterion.clone()],
        ..vm::Options::default()
    };
    let outcome = vm::run(&opts, &vm::Job::script(script(&bin, &criterion, args)))?;
    println!("criterion's results: {}", criterion.display());
    Ok(ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1)))
}

/// The job: the bench on the VM's device, its results in `criterion`.
fn script(bin: &Path, criterion: &Path, args: &[String]) -> String {
    let q = |p: &Path| proc::shell_quote(&p.display().to_string());
    let mut script = format!(
        "export MTRDMA_BENCH_DEVICE={DEVICE}\nexport CRITERION_HOME={}\nexec {} --bench",
        q(criterion),
        q(bin)
    );
    for arg in args {
        script.push(' ');
        script.push_str(&proc::shell_quote(arg));
    }
    script.push('\n');
    script
}

/// Builds the bench and returns its executable.
fn build() -> Result<PathBuf> {
    let mut cmd = proc::cargo();
    cmd.args([
        "bench",
        "--bench",
        "device",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    eprintln!("$ {}", proc::describe(&cmd));
    let out = proc::output(&mut cmd)?;
    out.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "device")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .context("`cargo bench --bench device --no-run` built no executable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_names_the_device_and_passes_the_arguments() {
        let args = ["--quick".to_string(), "device rate".to_string()];
        let job = script(
            Path::new("/t/device-1"),
            Path::new("/t/vm/criterion"),
            &args,
        );
        assert_eq!(
            job,
            "export MTRDMA_BENCH_DEVICE=rxe0\nexport CRITERION_HOME=/t/vm/criterion\n\
             exec /t/device-1 --bench --quick 'device rate'\n"
        );
    }
}
