//! With the `monitor` feature: compiles the kernel monitor's BPF program
//! (`bpf/monitor.bpf.c`) with clang's BPF target into `OUT_DIR`, where
//! `src/monitor/kernel.rs` includes it. Without the feature: nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=bpf/monitor.bpf.c");
    println!("cargo::rerun-if-env-changed=CLANG");
    if std::env::var_os("CARGO_FEATURE_MONITOR").is_none() {
        return;
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" {
        panic!(
            "mtrdma-core's `monitor` feature reads the probed functions' arguments from x86-64 \
             registers; it is not available on {arch}"
        );
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-target",
            "bpf",
            "-O2",
            "-Wall",
            "-Werror",
            "-c",
            "bpf/monitor.bpf.c",
            "-o",
        ])
        .arg(out.join("monitor.bpf.o"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} could not compile bpf/monitor.bpf.c for the BPF target ({s})"),
        Err(e) => panic!(
            "mtrdma-core's `monitor` feature compiles its BPF program with clang ({clang}: {e}); \
             install clang (Debian: apt-get install clang) or set CLANG to one with the BPF target"
        ),
    }
}
