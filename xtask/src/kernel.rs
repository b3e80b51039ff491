//! The VM's Debian kernel (downloaded and unpacked once) and its initramfs
//! (built once per kernel and init script).

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::{cpio, deps, proc};

/// The modules the guest needs; their dependencies are found from each
/// module's `depends=` field and loaded first. `crc32_generic` is loaded by
/// name at run time by rdma_rxe (no `depends=` names it): without it
/// `rdma link add` fails with ENOENT. `veth` and `sch_tbf` carry
/// `--link`'s shaped link. `rdma_ucm` gives programs rdma_cm
/// (`/dev/infiniband/rdma_cm`: connections by address). `siw` is
/// SoftiWARP, the second provider: Debian's kernel package does not ship
/// it, so it is built from Debian's kernel source for that kernel
/// ([`build_siw`]); it loads `crc32c_generic` by name at run time, as rxe
/// does `crc32_generic`. `rdma_rxe` is built from the same source with its
/// memory windows bounded ([`build_rxe`]).
///
/// The cache records this list and [`BUILT`]: a cache unpacked for
/// another is unpacked again.
const ROOT_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "crc32_generic",
    "ib_uverbs",
    "rdma_rxe",
    "rdma_ucm",
    "crc32c_generic",
    "siw",
    "veth",
    "sch_tbf",
];

/// The file in a cached kernel's directory that holds the `ROOT_MODULES`
/// it was unpacked for, and [`BUILT`].
const ROOTS_FILE: &str = "root-modules";

/// The modules built from Debian's kernel source rather than taken from
/// the package, each with how (a line of [`ROOTS_FILE`], after the
/// modules).
const BUILT: &[&str] = &[
    "# siw: built from source",
    "# rdma_rxe: built from source, memory windows bounded",
];

/// rxe's responder (`check_rkey` in `rxe_resp.c`) checks an access
/// through a memory window against the memory region under the window, not
/// against the window: a key lent for one piece reaches the whole
/// registration. The verbs specification bounds a window's key to the
/// window, as devices that have windows do. After the line that sets a
/// zero-based window's offset, and before the region's reference is taken
/// (so the error path drops the window's only), the access is checked
/// against the window's bounds.
const RXE_WINDOW_ANCHOR: &str =
    "\t\tif (mw->access & IB_ZERO_BASED)\n\t\t\tqp->resp.offset = mw->addr;\n";
const RXE_WINDOW_CHECK: &str = "\n\t\t/* mtrdma's VM: a window's key reaches the window only. */\n\
\t\tif (va + qp->resp.offset < mw->addr || resid > mw->length ||\n\
\t\t    va + qp->resp.offset - mw->addr > mw->length - resid) {\n\
\t\t\tmr = NULL;\n\
\t\t\tstate = RESPST_ERR_RKEY_VIOLATION;\n\
\t\t\tgoto err;\n\
\t\t}\n";

/// The Debian meta-package that names the current kernel image package.
const META_PACKAGE: &str = "linux-image-amd64";

/// A kernel ready to boot: its image and the modules to load, in order.
#[derive(Debug)]
pub(crate) struct Kernel {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    pub(crate) vmlinuz: PathBuf,
    /// Module names in load order; each is `dir/modules/NAME.ko`.
    pub(crate) modules: Vec<String>,
}

fn cache_root() -> PathBuf {
    proc::target_dir().join("vm").join("kernel")
}

/// Returns the cached kernel, downloading and unpacking it the first time.
pub(crate) fn ensure() -> Result<Kernel> {
    if let Some(k) = cached()? {
        return Ok(k);
    }
    for tool in ["apt-get", "apt-cache", "dpkg-deb"] {
        if !proc::on_path(tool) {
            bail!(
                "`{tool}` not found: the VM boots Debian's kernel package ({META_PACKAGE}), \
                 fetched with apt; on another distribution put a kernel with rdma_rxe, \
                 virtio and 9p modules in {}",
                cache_root().display()
            );
        }
    }
    deps::apt_update_if_needed()?;
    let package = image_package()?;
    let dir = cache_root().join(&package);
    let work = cache_root().join(format!(".download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let result = unpack(&package, &work, &dir);
    let _ = fs::remove_dir_all(&work);
    result?;
    cached()?.context("kernel cache incomplete after unpacking")
}

/// The newest complete kernel in the cache that was unpacked for
/// today's `ROOT_MODULES`.
fn cached() -> Result<Option<Kernel>> {
    let Ok(entries) = fs::read_dir(cache_root()) else {
        return Ok(None);
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("complete").is_file())
        .collect();
    dirs.sort();
    let Some(dir) = dirs.pop() else {
        return Ok(None);
    };
    let order = fs::read_to_string(dir.join("complete"))?;
    let roots = fs::read_to_string(dir.join(ROOTS_FILE)).ok();
    if roots.as_deref() != Some(&roots_text()) {
        println!(
            "vm: the cached kernel in {} was unpacked for other modules ({}); unpacking again",
            dir.display(),
            module_change(roots.as_deref(), &order)
        );
        return Ok(None);
    }
    Ok(Some(Kernel {
        name: dir.file_name().unwrap_or_default().to_string_lossy().into(),
        vmlinuz: dir.join("vmlinuz"),
        modules: order.split_whitespace().map(String::from).collect(),
        dir,
    }))
}

/// `linux-image-6.1.0-NN-amd64`, as the meta-package depends on it.
fn image_package() -> Result<String> {
    let out = proc::output(Command::new("apt-cache").args(["depends", META_PACKAGE]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && !p.starts_with('<'))
        .map(String::from)
        .with_context(|| format!("`apt-cache depends {META_PACKAGE}` names no kernel image"))
}

fn unpack(package: &str, work: &Path, dir: &Path) -> Result<()> {
    println!(
        "vm: downloading {package} (once; cached in {})",
        dir.display()
    );
    proc::check(
        Command::new("apt-get")
            .args(["download", "-q", package])
            .current_dir(work),
    )?;
    let deb = fs::read_dir(work)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    let tree = work.join("tree");
    proc::check(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;

    let vmlinuz = find_file(&tree.join("boot"), |n| n.starts_with("vmlinuz-"))?
        .context("no boot/vmlinuz-* in the kernel package")?;
    let modules_root = fs::read_dir(tree.join("lib/modules"))
        .context("no lib/modules in the kernel package")?
        .flatten()
        .map(|e| e.path())
        .next()
        .context("lib/modules is empty")?;
    let builtin: HashSet<String> = fs::read_to_string(modules_root.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(Path::new(l)))
        .collect();
    let mut available = BTreeMap::new();
    walk(&modules_root.join("kernel"), &mut |p| {
        if let Some(name) = module_name(p) {
            available.insert(name, p.to_path_buf());
        }
    })?;

    let version = modules_root
        .file_name()
        .and_then(|n| n.to_str())
        .context("lib/modules/<version>")?;
    if !available.contains_key("siw") && !builtin.contains("siw") {
        available.insert("siw".into(), build_siw(version, work)?);
    }
    available.insert("rdma_rxe".into(), build_rxe(version, work)?);

    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for m in ROOT_MODULES {
        resolve(m, &available, &builtin, &mut seen, &mut order)?;
    }

    let staging = work.join("out");
    fs::create_dir_all(staging.join("modules"))?;
    fs::copy(&vmlinuz, staging.join("vmlinuz"))?;
    for m in &order {
        fs::copy(
            &available[m],
            staging.join("modules").join(format!("{m}.ko")),
        )?;
    }
    fs::write(staging.join(ROOTS_FILE), roots_text())?;
    fs::write(staging.join("complete"), order.join("\n") + "\n")?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&staging, dir)?;
    println!("vm: kernel {package} ready ({} modules)", order.len());
    Ok(())
}

/// Builds SoftiWARP's module (`siw.ko`) for the kernel `version`
/// (`6.1.0-48-amd64`) in `work` (see [`build_module`]).
fn build_siw(version: &str, work: &Path) -> Result<PathBuf> {
    println!("vm: building siw for {version} (the kernel package has no SoftiWARP)");
    build_module(version, work, "siw", "CONFIG_RDMA_SIW", "siw", |_| Ok(()))
}

/// Builds rxe's module (`rdma_rxe.ko`) for the kernel `version` in `work`
/// with its memory windows bounded ([`RXE_WINDOW_CHECK`]; see
/// [`build_module`]).
fn build_rxe(version: &str, work: &Path) -> Result<PathBuf> {
    println!("vm: building rdma_rxe for {version} (its memory windows bounded)");
    build_module(version, work, "rxe", "CONFIG_RDMA_RXE", "rdma_rxe", |dir| {
        let file = dir.join("rxe_resp.c");
        let source = fs::read_to_string(&file)?;
        fs::write(&file, bound_windows(&source)?)?;
        Ok(())
    })
}

/// `rxe_resp.c`'s `source` with [`RXE_WINDOW_CHECK`] after
/// [`RXE_WINDOW_ANCHOR`], which must stand in it once.
fn bound_windows(source: &str) -> Result<String> {
    let mut at = source.match_indices(RXE_WINDOW_ANCHOR).map(|(i, _)| i);
    let (Some(i), None) = (at.next(), at.next()) else {
        bail!(
            "rxe_resp.c does not set a zero-based window's offset once as rxe 6.1 does; \
             the check of a window's bounds has no place to go"
        );
    };
    let end = i + RXE_WINDOW_ANCHOR.len();
    Ok(format!(
        "{}{RXE_WINDOW_CHECK}{}",
        &source[..end],
        &source[end..]
    ))
}

/// Builds the module `ko` (`ko.ko`) of `drivers/infiniband/sw/<driver>`
/// for the kernel `version` (`6.1.0-48-amd64`) in `work`: from Debian's
/// kernel source for its series (`linux-source-6.1`), changed by `edit`
/// (given the driver's folder), against its headers
/// (`linux-headers-6.1.0-48-amd64`), both installed if missing; its debug
/// sections stripped, as the package's modules are.
fn build_module(
    version: &str,
    work: &Path,
    driver: &str,
    config: &str,
    ko: &str,
    edit: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let series = version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".");
    let (headers, source) = (
        format!("linux-headers-{version}"),
        format!("linux-source-{series}"),
    );
    deps::ensure_packages(&[&headers, &source], &format!("building {ko} for the VM"))?;
    let src = work.join(format!("{driver}-src"));
    fs::create_dir_all(&src)?;
    let tarball = format!("/usr/src/linux-source-{series}.tar.xz");
    let tree = format!("drivers/infiniband/sw/{driver}");
    proc::check(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&src)
            .args(["--wildcards", &format!("*/{tree}/*")]),
    )?;
    let dir = fs::read_dir(&src)?
        .flatten()
        .map(|e| e.path().join(&tree))
        .find(|p| p.is_dir())
        .with_context(|| format!("no {tree} in {tarball}"))?;
    edit(&dir)?;
    proc::check(
        Command::new("make")
            .arg("-C")
            .arg(format!("/usr/src/linux-headers-{version}"))
            .arg(format!("M={}", dir.display()))
            .args([&format!("{config}=m"), "modules"]),
    )?;
    let ko = dir.join(format!("{ko}.ko"));
    anyhow::ensure!(ko.exists(), "the build left no {}", ko.display());
    proc::check(Command::new("strip").arg("--strip-debug").arg(&ko))?;
    Ok(ko)
}

/// `ROOT_MODULES` as the cache records them, one a line.
fn roots_text() -> String {
    ROOT_MODULES
        .iter()
        .chain(BUILT)
        .map(|m| format!("{m}\n"))
        .collect()
}

/// How a cache's modules differ from today's `ROOT_MODULES` and
/// [`BUILT`]: `recorded`
/// is its record of them (none in a cache made before the record existed),
/// `loaded` its load order.
fn module_change(recorded: Option<&str>, loaded: &str) -> String {
    let has: HashSet<&str> = recorded.unwrap_or(loaded).lines().collect();
    let missing: Vec<&str> = ROOT_MODULES
        .iter()
        .copied()
        .filter(|m| !has.contains(m))
        .collect();
    let mut extra: Vec<&str> = match recorded {
        Some(_) => has
            .iter()
            .copied()
            .filter(|m| !m.starts_with('#') && !ROOT_MODULES.contains(m))
            .collect(),
        None => Vec::new(),
    };
    extra.sort_unstable();
    let built_otherwise: Vec<&str> = match recorded {
        Some(_) => BUILT
            .iter()
            .filter(|b| !has.contains(*b))
            .map(|b| b.trim_start_matches("# "))
            .collect(),
        None => Vec::new(),
    };
    let mut parts = Vec::new();
    if recorded.is_none() {
        parts.push("made before the cache recorded its modules".to_string());
    }
    if !missing.is_empty() {
        parts.push(format!("lacks {}", missing.join(", ")));
    }
    if !extra.is_empty() {
        parts.push(format!("has {} no longer needed", extra.join(", ")));
    }
    if !built_otherwise.is_empty() {
        parts.push(format!("not {}", built_otherwise.join("; ")));
    }
    if parts.is_empty() {
        parts.push("the module order changed".to_string());
    }
    parts.join("; ")
}

/// Appends `name` after its dependencies (depth first), skipping built-ins.
fn resolve(
    name: &str,
    available: &BTreeMap<String, PathBuf>,
    builtin: &HashSet<String>,
    seen: &mut HashSet<String>,
    order: &mut Vec<String>,
) -> Result<()> {
    let name = name.replace('-', "_");
    if !seen.insert(name.clone()) {
        return Ok(());
    }
    let Some(path) = available.get(&name) else {
        if builtin.contains(&name) {
            return Ok(());
        }
        bail!("kernel module {name} is neither in the package nor built in");
    };
    let bytes = fs::read(path)?;
    for dep in modinfo_depends(&bytes) {
        resolve(&dep, available, builtin, seen, order)?;
    }
    order.push(name);
    Ok(())
}

/// The `depends=` list of a module's `.modinfo` section.
fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|list| {
            String::from_utf8_lossy(list)
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// `kernel/fs/9p/9p.ko` -> `9p` (modules are named with `_`, files may use `-`).
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".ko")?;
    Some(stem.replace('-', "_"))
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(&path, f)?;
        } else {
            f(&path);
        }
    }
    Ok(())
}

fn find_file(dir: &Path, pred: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    Ok(fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&pred)))
}

/// The guest's `/init`. It loads the modules, mounts the host's root
/// read-only and the job share writable, and hands over to the job's
/// `guest.sh` inside a chroot of the host root. `/job/paths` (written by
/// the host) holds the host path of the job directory on its first line and
/// one writable share (tag and path) per following line.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m.ko || echo "mtrdma-vm: insmod $m failed" >&2
done
fail() { echo "mtrdma-vm: $*" >&2; sleep 1; reboot -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job /job || fail "cannot mount the job share"
R=/mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro,cache=loose hostroot $R || fail "cannot mount the host root"
JOB=$(head -n 1 /job/paths)
mount --bind /job "$R$JOB" || fail "cannot bind the job directory at $JOB"
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/shm $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs -o mode=755 run $R/run
mount -t tmpfs -o mode=1777 scratch "$R$JOB/scratch"
tail -n +2 /job/paths | while read tag path; do
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 "$tag" "$R$path" || echo "mtrdma-vm: cannot mount $path" >&2
done
chroot $R /bin/sh "$JOB/guest.sh" </dev/null >"$R$JOB/setup.log" 2>&1
sync
reboot -f
"#;

/// Builds (once per kernel, module list and init script) the initramfs and returns its path.
pub(crate) fn initramfs(kernel: &Kernel) -> Result<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        bail!("/bin/busybox not found: run `cargo xtask deps` (installs busybox-static)");
    }
    let busybox_bytes = fs::read(busybox)?;
    let order = kernel.modules.join("\n");
    let key = fnv1a(&[
        INIT.as_bytes(),
        &busybox_bytes,
        kernel.name.as_bytes(),
        order.as_bytes(),
    ]);
    let path = kernel.dir.join(format!("initramfs-{key:016x}.cpio"));
    if path.is_file() {
        return Ok(path);
    }
    let mut archive = cpio::Writer::new();
    for dir in [
        "bin",
        "dev",
        "proc",
        "sys",
        "mnt",
        "mnt/root",
        "job",
        "lib",
        "lib/modules",
    ] {
        archive.dir(dir);
    }
    archive.char_device("dev/console", 5, 1);
    archive.file("init", 0o755, INIT.as_bytes());
    archive.file("bin/busybox", 0o755, &busybox_bytes);
    archive.file("lib/modules/order", 0o644, order.as_bytes());
    for m in &kernel.modules {
        let ko = fs::read(kernel.dir.join("modules").join(format!("{m}.ko")))?;
        archive.file(&format!("lib/modules/{m}.ko"), 0o644, &ko);
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, archive.finish())?;
    fs::rename(&tmp, &path)?;
    Ok(path)
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_depends_from_modinfo() {
        let ko = b"\x7fELF junk\0license=GPL\0depends=ib_uverbs,ib_core,udp_tunnel\0vermagic=6.1\0";
        assert_eq!(modinfo_depends(ko), ["ib_uverbs", "ib_core", "udp_tunnel"]);
        assert!(modinfo_depends(b"\0depends=\0").is_empty());
        assert!(modinfo_depends(b"no modinfo").is_empty());
    }

    #[test]
    fn names_modules_like_the_kernel() {
        assert_eq!(
            module_name(Path::new("kernel/fs/9p/9p.ko")).as_deref(),
            Some("9p")
        );
        assert_eq!(
            module_name(Path::new("kernel/crypto/crc32-generic.ko")).as_deref(),
            Some("crc32_generic")
        );
        assert_eq!(module_name(Path::new("modules.order")), None);
    }

    #[test]
    fn says_how_a_cached_module_list_differs() {
        // A cache made before the record: what it lacks, from its load order.
        let old = "virtio_pci\nib_core\nrdma_rxe\nveth\n";
        let said = module_change(None, old);
        assert!(said.contains("made before"), "{said}");
        assert!(said.contains("sch_tbf"), "{said}");
        assert!(!said.contains("rdma_rxe"), "{said}");
        // A recorded list: what is missing and what is extra.
        let recorded = roots_text().replace("sch_tbf\n", "") + "old_mod\n";
        let said = module_change(Some(&recorded), "");
        assert_eq!(said, "lacks sch_tbf; has old_mod no longer needed");
        assert_eq!(
            module_change(Some(&roots_text()), ""),
            "the module order changed"
        );
        assert!(roots_text()
            .lines()
            .eq(ROOT_MODULES.iter().chain(BUILT).copied()));
        // A cache whose modules were built otherwise (before rxe's windows
        // were bounded) is unpacked again, and says why.
        let recorded: String = ROOT_MODULES.iter().map(|m| format!("{m}\n")).collect();
        let said = module_change(Some(&recorded), "");
        assert!(
            said.starts_with(
                "not siw: built from source; rdma_rxe: built from source, memory windows bounded"
            ),
            "{said}"
        );
    }

    #[test]
    fn rxe_is_given_the_check_of_a_windows_bounds_once_in_the_place_for_it() {
        // The lines of rxe 6.1's `check_rkey` around the place.
        let source = "\t\tmr = mw->mr;\n\
                      \t\tif (mw->access & IB_ZERO_BASED)\n\
                      \t\t\tqp->resp.offset = mw->addr;\n\
                      \n\
                      \t\trxe_get(mr);\n";
        let bounded = bound_windows(source).unwrap();
        assert_eq!(bounded.matches("mw->length - resid").count(), 1);
        let check = bounded.find("mw->length - resid").unwrap();
        assert!(bounded.find("qp->resp.offset = mw->addr;").unwrap() < check);
        assert!(
            check < bounded.find("rxe_get(mr)").unwrap(),
            "before the region's reference"
        );
        assert!(bounded.starts_with(source.split("\n\n").next().unwrap()));
        // A source without the place, or with it twice, is refused.
        for other in ["int x;\n".to_string(), format!("{source}{source}")] {
            let err = bound_windows(&other).unwrap_err().to_string();
            assert!(err.contains("no place to go"), "{err}");
        }
    }

    #[test]
    fn orders_dependencies_first_and_skips_builtins() {
        let dir = std::env::temp_dir().join(format!("xtask-modtest-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut available = BTreeMap::new();
        for (name, deps) in [("a", "b,c"), ("b", "c,d"), ("c", "")] {
            let p = dir.join(format!("{name}.ko"));
            fs::write(&p, format!("\0depends={deps}\0")).unwrap();
            available.insert(name.to_string(), p);
        }
        let builtin: HashSet<String> = ["d".to_string()].into();
        let (mut seen, mut order) = (HashSet::new(), Vec::new());
        resolve("a", &available, &builtin, &mut seen, &mut order).unwrap();
        assert_eq!(order, ["c", "b", "a"]);
        let err = resolve("zz", &available, &builtin, &mut seen, &mut order).unwrap_err();
        assert!(err
            .to_string()
            .contains("neither in the package nor built in"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
