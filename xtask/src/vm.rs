//! `cargo xtask vm`: real RDMA verbs without RDMA hardware.
//!
//! Boots Debian's kernel in QEMU with the host's `/` shared read-only over
//! 9p, loads SoftRoCE (`rdma_rxe`), creates `rxe0` on the guest's `eth0`
//! (10.0.2.15, so GID index 1 is the RoCE v2 IPv4-mapped GID), mounts
//! cgroup2 at `/sys/fs/cgroup`, with `--link` sets up a shared bottleneck
//! link between two more rxe devices (see [`crate::link`]), and runs a
//! command in the caller's working directory inside a chroot of the host
//! root. The command's stdout and stderr come back through a writable job
//! share and are streamed as they are written; its exit code becomes ours.
//!
//! The guest sees the host's files (so binaries built on the host run
//! unchanged), a tmpfs `/dev/shm`, a tmpfs scratch directory in `TMPDIR`,
//! and any `--rw` directories writable at their host paths. The rest of the
//! host tree is read-only. `/tmp` is left as the host's (a checkout may live
//! there).

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::link::Link;
use crate::{kernel, proc};

/// How to boot the VM.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The VM is killed after this long.
    pub(crate) timeout: Duration,
    /// Use KVM (`-enable-kvm -cpu host`) instead of TCG.
    pub(crate) kvm: bool,
    /// Host directories shared writable at the same path.
    pub(crate) rw_shares: Vec<PathBuf>,
    /// Guest memory in MiB.
    pub(crate) memory_mib: u32,
    /// Guest vCPUs.
    pub(crate) cpus: u32,
    /// The shared bottleneck link between `rxa` and `rxb`, if any.
    pub(crate) link: Option<Link>,
    /// Boot the guest with `idle=poll`: an idle vCPU spins instead of
    /// halting. Under TCG a halted vCPU takes long to wake: a latency
    /// probe alone on the link had a p99 of 1.1 to 1.4 ms, and 0.19 to
    /// 0.21 ms with `idle=poll` (three runs each, 16 B WRITEs every
    /// 500 us at real-time priority, 120 Mbit/s). The vCPUs then keep
    /// the host's CPUs busy the whole boot, so it is an option.
    pub(crate) idle_poll: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(600),
            kvm: std::env::var("MTRDMA_VM_KVM").is_ok_and(|v| v == "1"),
            rw_shares: Vec::new(),
            memory_mib: 2048,
            cpus: 2,
            link: None,
            idle_poll: std::env::var("MTRDMA_VM_IDLE_POLL").is_ok_and(|v| v == "1"),
        }
    }
}

/// The guest kernel's command line for `opts`.
pub(crate) fn kernel_cmdline(opts: &Options) -> String {
    let mut line = String::from("console=ttyS0 panic=-1 loglevel=3 tsc=reliable clocksource=tsc");
    if opts.idle_poll {
        line.push_str(" idle=poll");
    }
    line
}

/// What to run in the guest: a POSIX shell script body.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    script: String,
}

impl Job {
    /// Runs one command given as argv.
    pub(crate) fn argv(argv: Vec<String>) -> Job {
        Job {
            script: argv
                .iter()
                .map(|a| proc::shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// Runs a shell script (its exit status is the job's).
    pub(crate) fn script(script: impl Into<String>) -> Job {
        Job {
            script: script.into(),
        }
    }
}

/// How the command ended.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) exit_code: i32,
    /// Everything the command wrote to stdout (also streamed to ours).
    pub(crate) stdout: String,
}

const QEMU: &str = "qemu-system-x86_64";

/// Boots the VM, runs the job, and returns its exit code and stdout.
/// The lock that lets one VM run on this host at a time: two would share
/// the host's CPUs, each emulating its own, and what the tests and the demo
/// measure inside either would be off. `MTRDMA_VM_LOCK` names the file
/// (default `mtrdma-vm.lock` in the temporary directory); a second VM
/// waits, and says so.
fn host_lock() -> Result<fs::File> {
    let path = std::env::var_os("MTRDMA_VM_LOCK")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("mtrdma-vm.lock"));
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the VM lock {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!(
            "vm: another VM runs on this host; waiting for it (lock {})",
            path.display()
        );
        file.lock()
            .with_context(|| format!("waiting for the VM lock {}", path.display()))?;
    }
    Ok(file)
}

pub(crate) fn run(opts: &Options, job: &Job) -> Result<Outcome> {
    if !proc::on_path(QEMU) {
        bail!("{QEMU} not found: run `cargo xtask deps` (installs qemu-system-x86)");
    }
    let kernel = kernel::ensure()?;
    let initramfs = kernel::initramfs(&kernel)?;
    let _one_at_a_time = host_lock()?;

    let jobs = proc::target_dir().join("vm").join("jobs");
    let dir = jobs.join(format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    fs::create_dir_all(dir.join("scratch"))?;
    let dir = dir.canonicalize()?;
    let cwd = std::env::current_dir()?;

    let mut paths = format!("{}\n", dir.display());
    let mut shares = Vec::new();
    for (i, share) in opts.rw_shares.iter().enumerate() {
        fs::create_dir_all(share)
            .with_context(|| format!("cannot create --rw directory {}", share.display()))?;
        let share = share.canonicalize()?;
        let tag = format!("rw{i}");
        paths.push_str(&format!("{tag} {}\n", share.display()));
        shares.push((tag, share));
    }
    fs::write(dir.join("paths"), paths)?;
    fs::write(
        dir.join("guest.sh"),
        guest_script(&dir, &cwd, opts.link.as_ref(), &job.script),
    )?;

    let mut cmd = Command::new(QEMU);
    cmd.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    if opts.kvm {
        cmd.args(["-enable-kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    cmd.arg("-m").arg(opts.memory_mib.to_string());
    cmd.arg("-smp").arg(opts.cpus.to_string());
    cmd.arg("-kernel").arg(&kernel.vmlinuz);
    cmd.arg("-initrd").arg(&initramfs);
    cmd.arg("-append").arg(kernel_cmdline(opts));
    cmd.arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()));
    cmd.arg("-virtfs")
        .arg(virtfs(Path::new("/"), "hostroot", true));
    cmd.arg("-virtfs").arg(virtfs(&dir, "job", false));
    for (tag, share) in &shares {
        cmd.arg("-virtfs").arg(virtfs(share, tag, false));
    }
    // `restrict=on`: the guest reaches nothing outside itself; rxe0 only
    // talks to its own address.
    cmd.args(["-netdev", "user,id=n0,restrict=on"]);
    cmd.args(["-device", "virtio-net-pci,netdev=n0"]);
    cmd.stdin(Stdio::null());
    cmd.stdout(fs::File::create(dir.join("qemu.log"))?);
    cmd.stderr(fs::File::create(dir.join("qemu.log"))?);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {QEMU}"))?;
    prioritise_timers(child.id());

    let started = Instant::now();
    let mut out = Stream::new(dir.join("stdout"));
    let mut err = Stream::new(dir.join("stderr"));
    let mut captured = Vec::new();
    let status = loop {
        out.forward(&mut std::io::stdout(), Some(&mut captured))?;
        err.forward(&mut std::io::stderr(), None)?;
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > opts.timeout {
            let _ = child.kill();
            let _ = child.wait();
            show_logs(&dir);
            bail!(
                "the VM did not finish within {} s and was killed (job kept in {})",
                opts.timeout.as_secs(),
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    out.forward(&mut std::io::stdout(), Some(&mut captured))?;
    err.forward(&mut std::io::stderr(), None)?;

    let rc = fs::read_to_string(dir.join("rc")).ok();
    let Some(exit_code) = rc.and_then(|s| s.trim().parse::<i32>().ok()) else {
        show_logs(&dir);
        bail!(
            "the VM stopped ({status}) before the command finished (job kept in {})",
            dir.display()
        );
    };
    if exit_code != 0 {
        eprintln!(
            "vm: command exited with {exit_code} after {:.1} s (job kept in {})",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
    } else {
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(Outcome {
        exit_code,
        stdout: String::from_utf8_lossy(&captured).into_owned(),
    })
}

fn virtfs(path: &Path, tag: &str, readonly: bool) -> String {
    // QEMU's option parser takes `,,` for a literal comma in a value.
    let path = path.display().to_string().replace(',', ",,");
    let ro = if readonly { ",readonly=on" } else { "" };
    format!("local,path={path},mount_tag={tag},security_model=none,multidevs=remap{ro}")
}

/// The script the guest runs in the chroot: setup (cgroup2, `rxe0`, the
/// link), then the job. A setup step that fails says which on the job's
/// stderr and ends the job with 125.
fn guest_script(dir: &Path, cwd: &Path, link: Option<&Link>, script: &str) -> String {
    let q = |p: &Path| proc::shell_quote(&p.display().to_string());
    let job = q(dir);
    let mut env = String::new();
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            continue;
        };
        let valid = key
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        // The link's variables describe this boot's link only.
        let ours = key.starts_with("MTRDMA_LINK_");
        if valid && !ours && !matches!(key, "TMPDIR" | "PWD" | "OLDPWD" | "SHLVL" | "_") {
            env.push_str(&format!("export {key}={}\n", proc::shell_quote(value)));
        }
    }
    let mut link_setup = String::new();
    if let Some(link) = link {
        link_setup = link.setup_script();
        for (key, value) in link.env() {
            env.push_str(&format!("export {key}={}\n", proc::shell_quote(&value)));
        }
    }
    format!(
        r#"JOB={job}
# The setup's tools (the job gets the caller's PATH below).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
finish() {{ echo "$1" > "$JOB/rc.tmp" && mv "$JOB/rc.tmp" "$JOB/rc"; exit 0; }}
setup_failed() {{ echo "mtrdma-vm: $*" | tee -a "$JOB/stderr"; finish 125; }}
# step WHAT COMMAND...: runs COMMAND; if it fails, names WHAT and ends with 125.
step() {{
    what=$1
    shift
    if ! out=$("$@" 2>&1); then
        setup_failed "setup step \"$what\" failed ($*): ${{out:-no output}}"
    fi
}}
# wait_active DEVICE: until port 1 is ACTIVE with its IPv4 GID at index 1.
wait_active() {{
    port=/sys/class/infiniband/$1/ports/1
    i=0
    until grep -q ACTIVE "$port/state" 2>/dev/null && grep -q :ffff: "$port/gids/1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 200 ] || setup_failed "setup step \"wait for $1\" failed: port 1 did not become ACTIVE with an IPv4 GID at index 1 (state: $(cat "$port/state" 2>&1), GID 1: $(cat "$port/gids/1" 2>&1))"
        sleep 0.05
    done
}}
step 'mount cgroup2 at /sys/fs/cgroup' mount -t cgroup2 cgroup2 /sys/fs/cgroup
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    step "enable the $c cgroup controller" sh -c "echo +$c > /sys/fs/cgroup/cgroup.subtree_control"
done
step 'bring lo up' ip link set lo up
step 'bring eth0 up' ip link set eth0 up
step 'add 10.0.2.15 to eth0' ip addr add 10.0.2.15/24 dev eth0
step 'rdma link add rxe0' rdma link add rxe0 type rxe netdev eth0
wait_active rxe0
# SoftiWARP, the second provider, on a netdev of its own (one end of a
# veth pair, 10.0.3.1): rdma_cm resolves that address to siw0, and
# 10.0.2.15 to rxe0.
if [ -d /sys/module/siw ]; then
    ip link add siwa type veth peer name siwb && ip addr add 10.0.3.1/24 dev siwa \
        && ip link set siwa up && ip link set siwb up \
        && rdma link add siw0 type siw netdev siwa \
        || echo "mtrdma-vm: SoftiWARP (siw0 on siwa) could not be set up" >&2
fi
{link_setup}ulimit -l unlimited
{env}export TMPDIR="$JOB/scratch"
export MTRDMA_VM=1
cd {cwd} || finish 126
(
{script}
) >"$JOB/stdout" 2>"$JOB/stderr"
finish $?
"#,
        cwd = q(cwd),
    )
}

/// Forwards what a file grows by since the last call.
struct Stream {
    path: PathBuf,
    offset: u64,
}

impl Stream {
    fn new(path: PathBuf) -> Self {
        Stream { path, offset: 0 }
    }

    fn forward(&mut self, to: &mut dyn Write, mut capture: Option<&mut Vec<u8>>) -> Result<()> {
        let Ok(mut f) = fs::File::open(&self.path) else {
            return Ok(());
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.offset += buf.len() as u64;
        to.write_all(&buf)?;
        to.flush()?;
        if let Some(c) = capture.as_mut() {
            c.extend_from_slice(&buf);
        }
        Ok(())
    }
}

/// Prints what the guest and QEMU said, for a VM that failed.
fn show_logs(dir: &Path) {
    for (name, last) in [("qemu.log", 40), ("setup.log", 40), ("console.log", 80)] {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        if text.trim().is_empty() {
            eprintln!("---- {name}: empty ----");
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(last);
        eprintln!("---- {name} (last {} lines) ----", lines.len() - start);
        for line in &lines[start..] {
            eprintln!("{line}");
        }
    }
}

/// The real-time priority of QEMU's main thread (`chrt -f`).
const QEMU_MAIN_PRIORITY: &str = "10";

/// Runs QEMU's main thread (the one that delivers the guest's timers under
/// TCG) at real-time priority, so that a guest timer fires on time while
/// the vCPU threads keep both host cores busy. Without it the shaped
/// link's timer (tbf's watchdog) fired milliseconds late and a latency
/// request waited behind it (traced in the guest: the request's packet
/// waited up to 20 ms in tbf with one 2 KiB packet ahead of it). At
/// 50 Mbit/s next to one bulk sender with a single 2 KiB WRITE in flight
/// the latency request's p99 was 2.2 to 3.5 ms (median 3.2) without this
/// and 1.5 to 3.5 ms (median 2.1) with it, in four alternating boots.
/// `--reset-on-fork`: threads QEMU starts later (vCPUs, I/O workers) keep
/// normal priority. Where the priority cannot be set (not root), the VM
/// runs as before and says so.
fn prioritise_timers(pid: u32) {
    let out = Command::new("chrt")
        .args(["--reset-on-fork", "-f", "-p", QEMU_MAIN_PRIORITY])
        .arg(pid.to_string())
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "vm: QEMU's main thread keeps normal priority (guest timers may fire late): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!(
            "vm: QEMU's main thread keeps normal priority (guest timers may fire late): chrt: {e}"
        ),
    }
}
