//! `cargo xtask deps`: the Debian packages mtrdma's build, VM and baselines need.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::proc;

/// Each package and why it is needed.
pub(crate) const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "runs the SoftRoCE VM"),
    ("busybox-static", "the VM's init"),
    ("rdma-core", "RDMA userspace (udev rules, rdma tools)"),
    (
        "ibverbs-providers",
        "the rxe provider (librxe) libibverbs loads",
    ),
    ("ibverbs-utils", "ibv_devices, ibv_devinfo, ibv_rc_pingpong"),
    ("perftest", "ib_write_bw and ib_write_lat baselines"),
    (
        "memcached",
        "the queue-pair registry's server in the RPC tests and demo",
    ),
    ("iproute2", "ip and rdma (creates rxe0)"),
    ("libibverbs-dev", "links libibverbs"),
    (
        "librdmacm-dev",
        "links librdmacm and its header (connections by address, feature rdmacm)",
    ),
    (
        "rdmacm-utils",
        "rping and ucmatose, rdma_cm peers in the device tests",
    ),
    ("cmake", "builds ibverbs-sys's vendored rdma-core headers"),
    ("pkg-config", "ibverbs-sys build"),
    ("libnl-3-dev", "ibverbs-sys build"),
    ("libnl-route-3-dev", "ibverbs-sys build"),
    ("clang", "bindgen in ibverbs-sys"),
    ("libclang-dev", "bindgen in ibverbs-sys"),
    ("fonts-dejavu-core", "the font of the demo's PNG pictures"),
    (
        "protobuf-compiler",
        "protoc, which etcd's client (feature etcd) builds its gRPC code with",
    ),
    (
        "etcd-server",
        "the three-member etcd cluster of the cluster tests",
    ),
    ("etcd-client", "etcdctl, which the cluster tests write with"),
];

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", package])
        .output()
        .map(|o| o.status.success() && o.stdout == b"installed")
        .unwrap_or(false)
}

fn is_root() -> bool {
    proc::output(Command::new("id").arg("-u"))
        .map(|uid| uid.trim() == "0")
        .unwrap_or(false)
}

/// True when apt has package lists to install from.
fn apt_lists_present() -> bool {
    std::fs::read_dir("/var/lib/apt/lists")
        .map(|dir| {
            dir.flatten()
                .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
        })
        .unwrap_or(false)
}

/// Runs `apt-get update` (as root) when apt has no package lists yet.
pub(crate) fn apt_update_if_needed() -> Result<()> {
    if !apt_lists_present() {
        apt_update()?;
    }
    Ok(())
}

fn apt_update() -> Result<()> {
    if !is_root() {
        bail!("apt has no package lists; run as root: apt-get update");
    }
    proc::check(Command::new("apt-get").args(["update", "-q"]))
}

/// Installs `packages` if any is missing (as root), or says how to.
pub(crate) fn ensure_packages(packages: &[&str], why: &str) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "{why} needs {}; run as root: apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    apt_update_if_needed()?;
    if !apt_install(&missing)? {
        apt_update()?;
        if !apt_install(&missing)? {
            bail!("apt-get could not install {} ({why})", missing.join(" "));
        }
    }
    Ok(())
}

fn apt_install(packages: &[&str]) -> Result<bool> {
    proc::status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Installs whatever of [`PACKAGES`] is missing (as root), or says how to.
pub(crate) fn ensure() -> Result<()> {
    if !Path::new("/usr/bin/dpkg-query").exists() {
        bail!(
            "this is not a Debian-based system; install the equivalents of: {}",
            PACKAGES.iter().map(|p| p.0).collect::<Vec<_>>().join(" ")
        );
    }
    let missing: Vec<&str> = PACKAGES
        .iter()
        .map(|&(p, _)| p)
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        println!("deps: all {} packages are installed", PACKAGES.len());
        return Ok(());
    }
    let line = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        bail!(
            "missing packages: {}\nrun as root: {line}",
            missing.join(" ")
        );
    }
    println!("deps: installing {}", missing.join(" "));
    apt_update_if_needed()?;
    if !apt_install(&missing)? {
        // Lists may be stale (a package version was replaced): refresh once.
        apt_update()?;
        if !apt_install(&missing)? {
            bail!("apt-get could not install the packages; try by hand: {line}");
        }
    }
    let still: Vec<&str> = missing.into_iter().filter(|p| !installed(p)).collect();
    if !still.is_empty() {
        bail!("still missing after apt-get: {}", still.join(" "));
    }
    println!("deps: all {} packages are installed", PACKAGES.len());
    Ok(())
}
