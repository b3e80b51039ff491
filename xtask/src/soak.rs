//! `cargo xtask soak [--minutes N] [--link RATE]`: churn on the VM's
//! shared link that must leave nothing behind (mtrdma-demo's `isolation --link
//! --scenarios soak`): tenants that come and go, SIGKILLed tenants, the
//! coordinator SIGKILLed and restarted, policy reloads, storms; after
//! every round, every tenant's counters are back to zero, and over each
//! coordinator's life its descriptors and memory stay flat. The test
//! command runs it for a minute in its device boot ([`script`]).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::{demo, deps, proc, vm};

/// How long the test command's soak churns.
pub(crate) const TEST_SECONDS: u64 = 60;

/// The lines of a VM script that run the soak for `seconds` with the
/// `isolation` binary at `isolation`, writing into `out` (tables, CSV,
/// logs). The script's variable `soak_fail` is then empty if it held, or
/// says why not.
pub(crate) fn script(isolation: &Path, seconds: u64, out: &Path) -> String {
    let q = |p: &Path| proc::shell_quote(&p.display().to_string());
    format!(
        "echo '==== the soak: {seconds} s of churn on the link (isolation --link --scenarios soak) ===='\n\
         soak_fail=''\n\
         {isolation} --link --scenarios soak --soak-seconds {seconds} --out {out} || \
         soak_fail=\"isolation --scenarios soak exited $? (its report: {out_text}/results.txt)\"\n",
        isolation = q(isolation),
        out = q(out),
        out_text = out.display(),
    )
}

/// `cargo xtask soak [--minutes N] [--link RATE|auto]`.
pub(crate) fn run(rest: &[String]) -> Result<ExitCode> {
    let mut minutes = 10.0f64;
    let mut rate = "auto".to_string();
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--minutes" => {
                let v = it.next().context("--minutes needs a number")?;
                minutes = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| m.is_finite() && *m > 0.0 && *m <= 24.0 * 60.0)
                    .with_context(|| format!("--minutes {v}: a number of minutes, above 0, at most a day"))?;
            }
            "--link" => rate = demo::link_rate_arg(it.next())?,
            other => anyhow::bail!(
                "`cargo xtask soak` takes [--minutes N (default 10)] [--link RATE|auto], not {other:?}"
            ),
        }
    }
    let seconds = (minutes * 60.0).round().max(1.0) as u64;
    let (link, choice) = demo::link_choice(&rate, true)?;
    let plan = demo::Plan {
        form: demo::Form::Default,
        release: true,
        calibrate: Some((link.clone(), choice)),
        isolation_args: Vec::new(),
    };
    deps::ensure()?;
    demo::build(&plan)?;
    let out = proc::target_dir().join("soak");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let perf = proc::shell_quote(&plan.program("perf").display().to_string());
    let mut job = link.calibration_script(
        &perf,
        choice,
        &format!(
            "{}/link-rate.txt",
            proc::shell_quote(&out.display().to_string())
        ),
    );
    job.push_str(&script(&plan.program("isolation"), seconds, &out));
    job.push_str("if [ -n \"$soak_fail\" ]; then echo \"soak: $soak_fail\" >&2; exit 1; fi\n");
    let opts = vm::Options {
        // The churn, its rounds' ends, the boot and the link's rate.
        timeout: Duration::from_secs(seconds * 3 / 2 + 15 * 60),
        rw_shares: vec![out.clone()],
        link: Some(link),
        ..vm::Options::default()
    };
    let outcome = vm::run(&opts, &vm::Job::script(job))?;
    println!("the soak's report, CSV and logs: {}", out.display());
    Ok(if outcome.exit_code == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soak_script_names_its_failure() {
        let s = super::script(
            std::path::Path::new("/t/release/isolation"),
            60,
            std::path::Path::new("/t/soak"),
        );
        assert!(
            s.contains("/t/release/isolation --link --scenarios soak --soak-seconds 60 --out /t/soak || soak_fail="),
            "{s}"
        );
        assert!(s.contains("soak_fail=''\n"), "{s}");
    }
}
