//! Developer and CI commands of mtrdma.
//!
//! ```text
//! cargo xtask deps                      install the Debian packages the build, VM and baselines need
//! cargo xtask vm [OPTIONS] -- CMD...    run CMD inside a QEMU VM with SoftRoCE (rxe0)
//! cargo xtask test                      deps, fmt, clippy, unit tests, device tests in the VM
//! cargo xtask demo                      the isolation demo and perftest reference inside the VM
//! ```

mod cpio;
mod demo;
mod deps;
mod fuzz;
mod kernel;
mod proc;
mod test;
mod vm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  deps                    install the Debian packages mtrdma's build, VM and baselines need
                          (apt-get when root; otherwise prints the command to run)
  vm [OPTIONS] -- CMD...  boot the SoftRoCE VM, run CMD in the current directory, exit with its code
      --timeout SECS      kill the VM after SECS seconds (default 600)
      --kvm               use KVM instead of TCG emulation (also: MTRDMA_VM_KVM=1)
      --rw DIR            share host directory DIR writable at the same path (repeatable)
      --memory MIB        guest memory (default 2048)
      --cpus N            guest vCPUs (default 2)
  test                    deps, cargo fmt --check, clippy -D warnings, cargo test, every
                          fuzz target for 30 s, and the device tests (#[ignore]d on the
                          host) inside one VM boot;
                          with MTRDMA_TEST_DEVICE set, the device tests run on this host's
                          device instead of the VM
  demo                    inside the VM: perftest's ib_write_lat/ib_write_bw next to mtrdma's
                          examples/perf, then examples/isolation (every scenario alone,
                          unprotected and with mtrdma); tables, CSV and pictures in target/demo/
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode> {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return Ok(ExitCode::from(2));
    };
    match cmd.as_str() {
        "deps" => {
            no_args(cmd, rest)?;
            deps::ensure()?;
            Ok(ExitCode::SUCCESS)
        }
        "vm" => {
            let (opts, command) = parse_vm_args(rest)?;
            let outcome = vm::run(&opts, &vm::Job::argv(command))?;
            Ok(ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(1)))
        }
        "test" => {
            no_args(cmd, rest)?;
            test::run()
        }
        "demo" => {
            no_args(cmd, rest)?;
            demo::run()
        }
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => {
            eprint!("{USAGE}");
            bail!("unknown command {other:?}")
        }
    }
}

fn no_args(cmd: &str, rest: &[String]) -> Result<()> {
    if !rest.is_empty() {
        bail!("`cargo xtask {cmd}` takes no arguments (got {rest:?})");
    }
    Ok(())
}

fn parse_vm_args(args: &[String]) -> Result<(vm::Options, Vec<String>)> {
    let mut opts = vm::Options::default();
    let mut it = args.iter();
    let mut command = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--" => {
                command.extend(it.by_ref().cloned());
                break;
            }
            "--timeout" => {
                let secs: u64 = value("--timeout")?
                    .parse()
                    .context("--timeout takes whole seconds")?;
                opts.timeout = Duration::from_secs(secs);
            }
            "--kvm" => opts.kvm = true,
            "--rw" => opts.rw_shares.push(PathBuf::from(value("--rw")?)),
            "--memory" => {
                opts.memory_mib = value("--memory")?.parse().context("--memory takes MiB")?
            }
            "--cpus" => opts.cpus = value("--cpus")?.parse().context("--cpus takes a count")?,
            other if other.starts_with('-') => bail!("unknown vm option {other:?}\n{USAGE}"),
            _ => {
                command.push(arg.clone());
                command.extend(it.by_ref().cloned());
                break;
            }
        }
    }
    if command.is_empty() {
        bail!("`cargo xtask vm` needs a command: cargo xtask vm -- ibv_devinfo");
    }
    Ok((opts, command))
}
