//! Developer and CI commands of mtrdma.
//!
//! ```text
//! cargo xtask deps                      install the Debian packages the build, VM and baselines need
//! cargo xtask vm [OPTIONS] -- CMD...    run CMD inside a QEMU VM with SoftRoCE (rxe0; with
//!                                       --link RATE also rxa -> rxb over a shaped link)
//! cargo xtask test                      deps, fmt, clippy, the book, unit tests, loom, Miri, fuzz, package, device tests in the VM
//! cargo xtask demo                      the isolation demo inside the VM (--full: with perftest's reference)
//! cargo xtask soak [--minutes N]        churn on the VM's link that must leave nothing behind
//! cargo xtask fuzz [--seconds N]        every fuzz target for N seconds (default 20)
//! cargo xtask bench-device [-- ARGS]    the criterion bench on a device (benches/device.rs) on rxe0 in the VM
//! ```

mod bench;
mod book;
mod cpio;
mod demo;
mod deps;
mod fuzz;
mod kernel;
mod link;
mod loom;
mod miri;
mod overhead;
mod proc;
mod soak;
// The demo's list of programs and its record of scenarios, shared with
// mtrdma-demo's `isolation`, which uses the parts this program does not.
#[allow(dead_code)]
#[path = "../../mtrdma-demo/src/bin/isolation/programs.rs"]
mod programs;
#[allow(dead_code)]
#[path = "../../mtrdma-demo/src/bin/isolation/status.rs"]
mod status;
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
                          (one VM at a time on a host: a second waits for the first, and
                          says so; MTRDMA_VM_LOCK names the lock file, default
                          $TMPDIR/mtrdma-vm.lock)
      --timeout SECS      kill the VM after SECS seconds (default 600)
      --kvm               use KVM instead of TCG emulation (also: MTRDMA_VM_KVM=1)
      --idle-poll         boot the guest with idle=poll (also: MTRDMA_VM_IDLE_POLL=1, which
                          the demo and the tests' boots take too): idle vCPUs spin rather
                          than halt, and a latency probe's tail is then its own, not the
                          emulator's wake-up of a halted vCPU (p99 alone 0.2 ms, not 1.1
                          to 1.4); the vCPUs keep the host's CPUs busy the whole boot
      --rw DIR            share host directory DIR writable at the same path (repeatable)
      --memory MIB        guest memory (default 2048)
      --cpus N            guest vCPUs (default 2)
      --link RATE         also set up a shared bottleneck link, a queue every QP on it shares
                          (rxe0's loopback never queues): rxa, the sender, on va 192.168.77.1
                          and rxb, the receiver, on vb 192.168.77.2, the two ends of a veth
                          pair, each end shaped by tbf at RATE (in bits: 200mbit, 50mbit,
                          1gbit; burst 16kb, limit 16mb) or `unshaped` (no qdisc); the job
                          gets MTRDMA_LINK_SENDER, _RECEIVER, _SENDER_IP, _RECEIVER_IP,
                          _RATE and _RATE_BPS (0 when unshaped)
      --link-mtu BYTES    the veth MTU with --link (default 4200: rxe active MTU 4096;
                          1500 gives 1024)
  test                    deps, cargo fmt --check, clippy -D warnings, the book
                          (mdbook build docs; its doctests and links in cargo test), cargo test, the
                          quota table's protocols between processes under loom, the
                          work-completion reads under Miri, every fuzz target for 20 s
                          (as many at once as there are CPUs), inside one VM boot, with
                          --link 200mbit (then shaped to the highest rate up to it that
                          ib_write_bw -s 4096 fills to 95%), the demo's short form, a
                          minute of the soak and the device tests (#[ignore]d on the
                          host; with MTRDMA_TEST_DEVICE set, on this host's device
                          instead of the VM), then cargo package (every published crate
                          packages and builds). The package verification and the preload
                          library's release build run from loom on at idle priority, on
                          the CPU time the other stages and the VM leave
  demo [--full|--short] [--link RATE] [-- ARGS]
                          builds every program on the demo's list (mtrdma-demo's
                          src/bin/isolation/programs.rs), then
                          inside the VM with the shared link (default, auto: the highest
                          rate, 50 to 400mbit in steps of 10mbit, at which ib_write_bw -s
                          4096 alone fills 95% of it in that boot, found by a binary search
                          whose probes are printed and kept in link-rate.txt; or RATE)
                          runs isolation --link ARGS (tenants as processes:
                          alone, unprotected and with mtrdma): the latency tenant next to
                          1, 4 and 8 bulk tenants, weights, a cap and the control-path
                          storm, 4 s a measurement (about 5 minutes); tables, CSV and
                          pictures in target/demo/; prints each step and measurement as it
                          begins, with about how long is left; ends with every scenario
                          and whether it ran (exit status 1 if one did not).
                          --full (about 20 minutes): first perftest's ib_write_lat and
                          ib_write_bw plain and preloaded next to mtrdma-demo's perf,
                          in rounds until each overhead target is decided, then every
                          link scenario (the preloaded hogs, the adversarial table, the
                          applications too) at its own length with the coordinator's
                          kernel monitor, then the single-process variant. --short: what
                          --full runs, about a second a measurement, figures not judged
                          (target/demo-short/; the test command runs it too)
  soak [--minutes N] [--link RATE]
                          builds the demo's programs, then inside the VM with the shared
                          link (its rate chosen as the demo's) churns for N minutes
                          (default 10) in rounds of about 10 s: bulk tenants that come and
                          go, one SIGKILLed every other round, the control-path storm,
                          policy rewrites the coordinator reloads, the coordinator
                          SIGKILLed and restarted twice; after every round every
                          tenant's counters in the table must be back to zero, and over
                          each coordinator's life its open descriptors must not grow and
                          its memory stay flat; report in target/soak/ (the test command
                          runs it for a minute)
  fuzz [--seconds N]      builds every cargo-fuzz target, then runs each for N seconds
                          (default 20), as many at once as there are CPUs (the test
                          command's fuzz stage)
  bench-device [-- ARGS]  builds benches/device.rs and runs it inside the VM on rxe0
                          (MTRDMA_BENCH_DEVICE=rxe0): latency and message rate of 64 B
                          WRITEs, raw against mtrdma, single posts and batches, then
                          paired rounds; ARGS go to the bench (criterion's: --quick, a
                          filter); criterion's results in target/vm/criterion/
";

fn main() -> ExitCode {
    proc::configure_only_cmake();
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
    if matches!(rest.first().map(String::as_str), Some("--help" | "-h")) {
        if let Some(text) = usage_of(cmd) {
            print!("usage: cargo xtask {text}");
            return Ok(ExitCode::SUCCESS);
        }
    }
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
        "demo" => demo::run(rest),
        "fuzz" => {
            let each = match rest {
                [] => test::FUZZ_TIME,
                [flag, secs] if flag == "--seconds" => {
                    Duration::from_secs(secs.parse().context("--seconds takes whole seconds")?)
                }
                _ => bail!("`cargo xtask fuzz` takes [--seconds N] (got {rest:?})"),
            };
            println!("{}", fuzz::run(each)?);
            Ok(ExitCode::SUCCESS)
        }
        "soak" => soak::run(rest),
        "bench-device" => bench::run(rest),
        // Run by the demo's script in the VM, between overhead rounds.
        "demo-rounds-decided" => overhead::decided_command(rest),
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

/// The part of [`USAGE`] about `cmd` (its lines, from the one that names
/// it to the next command's), if it is a command.
fn usage_of(cmd: &str) -> Option<String> {
    let is_command_line = |line: &str| {
        line.strip_prefix("  ")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_alphabetic()))
    };
    let mut lines = USAGE.lines().skip_while(|line| {
        !(is_command_line(line) && line[2..].split_whitespace().next() == Some(cmd))
    });
    let first = lines.next()?.trim_start();
    // The command and its words, then what it does on a line of its own,
    // as the lines after it are indented.
    let mut text = match first.split_once("  ") {
        Some((synopsis, what)) => format!("{synopsis}\n{:26}{}\n", "", what.trim_start()),
        None => format!("{first}\n"),
    };
    for line in lines.take_while(|line| !is_command_line(line)) {
        text.push_str(line);
        text.push('\n');
    }
    Some(text)
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
    let (mut link_rate, mut link_mtu) = (None, None);
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
            "--idle-poll" => opts.idle_poll = true,
            "--rw" => opts.rw_shares.push(PathBuf::from(value("--rw")?)),
            "--memory" => {
                opts.memory_mib = value("--memory")?.parse().context("--memory takes MiB")?
            }
            "--cpus" => opts.cpus = value("--cpus")?.parse().context("--cpus takes a count")?,
            "--link" => link_rate = Some(value("--link")?),
            "--link-mtu" => link_mtu = Some(value("--link-mtu")?),
            other if other.starts_with('-') => bail!("unknown vm option {other:?}\n{USAGE}"),
            _ => {
                command.push(arg.clone());
                command.extend(it.by_ref().cloned());
                break;
            }
        }
    }
    opts.link = match (link_rate, link_mtu) {
        (Some(rate), mtu) => {
            let link = link::Link::new(&rate)?;
            Some(match mtu {
                Some(mtu) => link.with_mtu(&mtu)?,
                None => link,
            })
        }
        (None, Some(_)) => bail!("--link-mtu needs --link RATE"),
        (None, None) => None,
    };
    if command.is_empty() {
        bail!("`cargo xtask vm` needs a command: cargo xtask vm -- ibv_devinfo");
    }
    Ok((opts, command))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_commands_help_is_its_own_part_of_the_usage() {
        let demo = usage_of("demo").expect("demo is a command");
        assert!(demo.starts_with("demo [--full|--short]"), "{demo}");
        assert!(demo.contains("--full (about 20 minutes)"), "{demo}");
        assert!(!demo.contains("soak [--minutes N]"), "{demo}");
        let vm = usage_of("vm").expect("vm is a command");
        assert!(vm.contains("--link-mtu BYTES"), "{vm}");
        assert!(!vm.contains("install the Debian packages"), "{vm}");
        assert!(usage_of("nothing").is_none());
        // Every command the usage names has a part of its own.
        for cmd in ["deps", "vm", "test", "demo", "soak", "fuzz", "bench-device"] {
            assert!(usage_of(cmd).is_some(), "{cmd}");
        }
    }

    #[test]
    fn idle_poll_goes_on_the_guest_kernel_s_command_line_only_when_asked() {
        let (opts, _) = parse_vm_args(&args(&["--idle-poll", "--", "true"])).unwrap();
        assert!(opts.idle_poll);
        assert!(vm::kernel_cmdline(&opts).ends_with(" idle=poll"));
        let plain = vm::Options {
            idle_poll: false,
            ..opts
        };
        assert!(!vm::kernel_cmdline(&plain).contains("idle="));
        assert!(vm::kernel_cmdline(&plain).starts_with("console=ttyS0 "));
    }

    #[test]
    fn vm_takes_a_link_and_its_mtu() {
        let (opts, cmd) = parse_vm_args(&args(&["--link", "50mbit", "--", "true"])).unwrap();
        let link = opts.link.unwrap();
        assert_eq!((link.bits_per_second(), link.mtu), (50_000_000, 4200));
        assert_eq!(link.rate_text, "50mbit");
        assert_eq!(cmd, ["true"]);

        let (opts, _) = parse_vm_args(&args(&[
            "--link-mtu",
            "1500",
            "--link",
            "unshaped",
            "--",
            "true",
        ]))
        .unwrap();
        let link = opts.link.unwrap();
        assert_eq!((link.bits_per_second(), link.mtu), (0, 1500));

        let (opts, _) = parse_vm_args(&args(&["--", "true"])).unwrap();
        assert!(opts.link.is_none());
    }

    #[test]
    fn vm_refuses_bad_link_options() {
        for (list, says) in [
            (&["--link", "200", "--", "true"][..], "needs a unit"),
            (&["--link", "200mbps", "--", "true"], "bytes per second"),
            (&["--link-mtu", "1500", "--", "true"], "needs --link"),
            (
                &["--link", "1gbit", "--link-mtu", "100000", "--", "true"],
                "576 to 9000",
            ),
            (&["--link"], "needs a value"),
        ] {
            let err = format!("{:#}", parse_vm_args(&args(list)).unwrap_err());
            assert!(err.contains(says), "{list:?}: {err}");
        }
    }
}
