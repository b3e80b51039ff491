//! The demo's programs, run on a real device (the one MTRDMA_TEST_DEVICE
//! names): `perf` (every test, both paths) and `isolation` (every
//! scenario, short). Ignored on a plain `cargo test`; `cargo xtask test`
//! runs them in the SoftRoCE VM. `cargo test` builds the binaries (and,
//! with `--workspace`, the root package's examples) before the tests run.

use std::process::Command;

mod common;
use common::{demo_run, device, example, result_row, run, ISOLATION, PERF};

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn perf_runs_every_test_on_both_paths_and_prints_perftest_columns() {
    for test in [
        "write_bw",
        "read_bw",
        "send_bw",
        "write_lat",
        "read_lat",
        "send_lat",
        "write_comp_lat",
    ] {
        for path in ["raw", "mtrdma"] {
            let out = run(Command::new(PERF).args([
                "--loopback",
                "--device",
                &device(),
                "--test",
                test,
                "--path",
                path,
                "-s",
                "4096",
                "-n",
                "50",
            ]));
            let row = result_row(&out);
            let columns = if test.ends_with("_bw") { 5 } else { 9 };
            assert_eq!(row.len(), columns, "{test} {path}:\n{out}");
            assert_eq!(
                (row[0], row[1]),
                (4096.0, 50.0),
                "{test} {path}: bytes, iterations"
            );
            assert!(
                row[2..].iter().all(|v| v.is_finite() && *v > 0.0),
                "{test} {path}: every figure positive:\n{out}"
            );
        }
    }
}

/// `perf --interval` starts one latency request per interval (an open-loop
/// probe): 50 requests 2 ms apart take at least 98 ms, and every one is a
/// sample. An interval of 0 is refused with the reason.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn perf_spaces_latency_requests_by_the_interval() {
    let samples = std::env::temp_dir().join(format!("mtrdma-perf-samples-{}", std::process::id()));
    let _ = std::fs::remove_file(&samples);
    let start = std::time::Instant::now();
    let out = run(Command::new(PERF)
        .args([
            "--loopback",
            "--device",
            &device(),
            "--test",
            "write_comp_lat",
            "--wait",
            "--interval",
            "2000",
            "-n",
            "50",
            "--samples",
        ])
        .arg(&samples));
    let elapsed = start.elapsed();
    let row = result_row(&out);
    assert_eq!(row[1], 50.0, "iterations:\n{out}");
    assert!(
        elapsed >= std::time::Duration::from_millis(98),
        "50 requests 2 ms apart took {elapsed:?}"
    );
    // --samples: every sample, under the size's line; the largest is the
    // reported t_max or above it (the report drops the two largest).
    let text = std::fs::read_to_string(&samples).unwrap();
    std::fs::remove_file(&samples).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("# 2 B"), "{text}");
    let values: Vec<f64> = lines.map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), 50, "{text}");
    let (min, max) = values
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    assert!(
        min > 0.0 && (min - row[2]).abs() < 0.01,
        "min {min}, t_min {}",
        row[2]
    );
    assert!(max >= row[3], "max {max}, t_max {}", row[3]);
    let refused = Command::new(PERF)
        .args(["--loopback", "--test", "write_comp_lat", "--interval", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--interval 0"), "{err}");
    let refused = Command::new(PERF)
        .args(["--loopback", "--window", "--window-target", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--window-target"), "{err}");
}

/// `perf --coordinator` takes the tenant the coordinator decides from the
/// process's credentials (its uid here), and `--window --wait` runs a bulk
/// test whose pieces follow a delay window while the process sleeps on its
/// completion channel.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn perf_joins_a_running_coordinator_and_windows_its_bulk_pieces() {
    let dir = std::env::temp_dir().join(format!("mtrdma-perf-coord-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (policy, socket) = (dir.join("policy.toml"), dir.join("coord.sock"));
    let uid = rustix::process::getuid().as_raw();
    std::fs::write(
        &policy,
        format!(
            "[link]\ncapacity = \"100Gbit\"\n\n[[tenant]]\nid = 7\nname = \"perf-bulk\"\n\n[[tenant.match]]\nuid = {uid}\n"
        ),
    )
    .unwrap();
    let table = format!("perf-coord-{}", std::process::id());
    let mut coordinator = Command::new(example("coordinator"))
        .args(["--policy", policy.to_str().unwrap(), "--table", &table])
        .args(["--socket", socket.to_str().unwrap(), "--quiet"])
        .spawn()
        .expect("start the coordinator");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let result = std::panic::catch_unwind(|| {
        run(Command::new(PERF).args([
            "--loopback",
            "--device",
            &device(),
            "--coordinator",
            socket.to_str().unwrap(),
            "--test",
            "write_bw",
            "--path",
            "mtrdma",
            "--window",
            // A queue allowance of three times the path's own delay.
            "--window-target",
            "3000000",
            "--wait",
            "--chunk",
            "4096",
            "-s",
            "65536",
            "-n",
            "50",
        ]))
    });
    // SIGTERM: the coordinator removes its socket and table.
    let _ = Command::new("kill")
        .arg(coordinator.id().to_string())
        .status();
    let _ = coordinator.wait();
    std::fs::remove_dir_all(&dir).ok();
    let out = result.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(
        out.contains("perf-bulk (id 7") && out.contains("decided by the coordinator"),
        "the tenant comes from the coordinator:\n{out}"
    );
    let row = result_row(&out);
    assert_eq!((row[0], row[1]), (65536.0, 50.0), "{out}");
    assert!(row[3] > 0.0, "bandwidth measured:\n{out}");
    assert!(
        out.contains(" window at the end: "),
        "the window's state is reported:\n{out}"
    );
    // "(path delay P us, smoothed S us, target T us)": T is P plus at
    // least three times P.
    let us_after = |key: &str| -> f64 {
        let at = out.find(key).unwrap_or_else(|| panic!("{key} in:\n{out}")) + key.len();
        out[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (path, target) = (us_after("path delay "), us_after("target "));
    assert!(
        target >= 4.0 * path - 1.0,
        "target {target} us for a path of {path} us:\n{out}"
    );
}

/// `isolation` in one process: every scenario writes its table,
/// its figures and its pictures. In `cargo xtask test`'s boot the demo's
/// short form has run it already across the shared link
/// (`MTRDMA_DEMO_SHORT` names its output), and that run is what is
/// checked; elsewhere it runs here, in loopback on the test device.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_isolation_demo_runs_every_scenario_and_writes_tables_csv_and_pictures() {
    let (stdout, out_dir) = demo_run(
        "single-process",
        |_| {},
        format!("mtrdma-demo-test-{}", std::process::id()),
        |out_dir| {
            run(Command::new(ISOLATION).args([
                "--device",
                &device(),
                "--out",
                out_dir.to_str().expect("a UTF-8 temporary directory"),
                "--seconds",
                "0.4",
                "--warmup-ms",
                "100",
                "--bulk",
                "1,2",
            ]))
        },
    );
    for heading in ["== 1.", "== 2.", "== 3.", "== 4."] {
        assert!(
            stdout.contains(heading),
            "scenario {heading} missing:\n{stdout}"
        );
    }
    let csv = std::fs::read_to_string(out_dir.join("results.csv")).expect("results.csv");
    for scenario in ["latency", "weights", "cap", "storm"] {
        for way in ["alone", "unprotected", "mtrdma"] {
            assert!(
                csv.lines()
                    .any(|l| l.starts_with(&format!("{scenario},{way},"))),
                "no {scenario}/{way} figures in results.csv:\n{csv}"
            );
        }
    }
    let samples = std::fs::read_to_string(out_dir.join("latency_samples.csv")).unwrap();
    assert!(samples.lines().count() > 10, "latency samples recorded");
    for picture in [
        "latency_p99",
        "latency_cdf",
        "weights_bars",
        "weights_timeline",
        "cap_bars",
        "cap_timeline",
        "storm_cdf",
    ] {
        for ext in ["svg", "png"] {
            let file = out_dir.join(format!("{picture}.{ext}"));
            let len = std::fs::metadata(&file).map_or(0, |m| m.len());
            assert!(len > 1000, "{} is missing or empty", file.display());
        }
    }
    if std::env::var_os("MTRDMA_DEMO_SHORT").is_none() {
        std::fs::remove_dir_all(&out_dir).ok();
    }
}

/// `cluster_scale` at a small scale (six hosts, 200 tenants on three
/// hosts each; needs `etcd`, which `cargo xtask deps` installs): every
/// step ends with every host's shares right and each cap's sum exact;
/// nothing is written while demands hold still; a demand change writes
/// one report per host whose demand moved (tenants 97 and 194, each on
/// its first host), not one per host whose shares it moved.
#[test]
fn cluster_scale_converges_exactly_and_writes_only_what_moved() {
    let out = run(Command::new(env!("CARGO_BIN_EXE_cluster_scale")).args([
        "--hosts",
        "6",
        "--tenants",
        "200",
        "--per-tenant",
        "3",
        "--ttl",
        "2",
        "--steady",
        "0.5",
    ]));
    for step in [
        "1. all joined and even",
        "3. 2 tenants' demand moved",
        "4. a host's member stopped",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(step))
            .unwrap_or_else(|| panic!("no step {step:?} in:\n{out}"));
        assert!(line.ends_with("cap error 0.0000%"), "{line}");
    }
    for (said, what) in [
        (
            "0.0 writes/s to etcd (0 reports written)",
            "steady demands write nothing",
        ),
        (
            "2 writes to etcd (2 reports)",
            "one write per host whose demand moved",
        ),
    ] {
        assert!(out.contains(said), "{what}:\n{out}");
    }
}
