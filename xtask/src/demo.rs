//! `cargo xtask demo`: mtrdma on a real verbs device inside the SoftRoCE VM.
//!
//! Until the isolation demo exists this shows the smallest real thing: the
//! devices, ports and GIDs as libibverbs reports them (`ibv_devinfo`) and as
//! mtrdma reads them (`examples/devices.rs`), including the GID mtrdma
//! chooses for RoCE.

use std::process::ExitCode;

use anyhow::Result;

use crate::{deps, proc, vm};

pub(crate) fn run() -> Result<ExitCode> {
    deps::ensure()?;
    proc::check(proc::cargo().args(["build", "--release", "--example", "devices"]))?;
    let example = proc::target_dir().join("release/examples/devices");
    let script = format!(
        "echo '== ibv_devinfo ==' && ibv_devinfo && echo && echo '== mtrdma: examples/devices ==' && {}",
        proc::shell_quote(&example.display().to_string())
    );
    let outcome = vm::run(&vm::Options::default(), &vm::Job::script(script))?;
    Ok(ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1)))
}
