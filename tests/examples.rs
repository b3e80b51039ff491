//! The tools the README tells users to run, run on a real device (the one
//! MTRDMA_TEST_DEVICE names): `examples/perf` (every test, both paths) and
//! `examples/isolation` (every scenario, short). Ignored on a plain `cargo
//! test`; `cargo xtask test` runs them in the SoftRoCE VM. `cargo test`
//! builds the examples next to this test binary.

use std::process::Command;

// Not every test file uses all of what the tests share.
mod common;
use common::{example, result_row};

fn device() -> String {
    std::env::var("MTRDMA_TEST_DEVICE")
        .expect("MTRDMA_TEST_DEVICE must name the RDMA device to test (e.g. rxe0)")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("start the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn perf_runs_every_test_on_both_paths_and_prints_perftest_columns() {
    let perf = example("perf");
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
            let out = run(Command::new(&perf).args([
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
    let perf = example("perf");
    let samples = std::env::temp_dir().join(format!("mtrdma-perf-samples-{}", std::process::id()));
    let _ = std::fs::remove_file(&samples);
    let start = std::time::Instant::now();
    let out = run(Command::new(&perf)
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
    let refused = Command::new(&perf)
        .args(["--loopback", "--test", "write_comp_lat", "--interval", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--interval 0"), "{err}");
    let refused = Command::new(&perf)
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
        run(Command::new(example("perf")).args([
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

/// `examples/isolation` in one process: every scenario writes its table,
/// its figures and its pictures. In `cargo xtask test`'s boot the demo's
/// short form has run it already across the shared link
/// (`MTRDMA_DEMO_SHORT` names its output), and that run is what is
/// checked; elsewhere it runs here, in loopback on the test device.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_isolation_demo_runs_every_scenario_and_writes_tables_csv_and_pictures() {
    let (stdout, out_dir) = match std::env::var_os("MTRDMA_DEMO_SHORT") {
        Some(demo) => {
            let out_dir = std::path::Path::new(&demo).join("single-process");
            let text = std::fs::read_to_string(out_dir.join("results.txt"))
                .expect("the demo's short form wrote the one-process run's report");
            (text, out_dir)
        }
        None => {
            let out_dir =
                std::env::temp_dir().join(format!("mtrdma-demo-test-{}", std::process::id()));
            let stdout = run(Command::new(example("isolation")).args([
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
            ]));
            (stdout, out_dir)
        }
    };
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

/// `examples/own_window`: a window written in the example (a fixed byte
/// budget) bounds what a queue pair keeps in the NIC, in place of the
/// pieces-in-flight bound alone.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_window_of_ones_own_bounds_what_a_queue_pair_keeps_in_the_nic() {
    let out = run(Command::new(example("own_window")).arg(device()));
    let most = |what: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("most bytes in the NIC, {what}: ")))
            .unwrap_or_else(|| panic!("no {what:?} line in:\n{out}"))
            .parse()
            .expect("a byte count")
    };
    let open = most("16 pieces of 4096 B allowed");
    let budget = most("under an 8192 B budget");
    assert!(budget > 0 && budget <= 8192, "{out}");
    assert!(open > 8192 && open <= 16 * 4096, "{out}");
}

/// `examples/own_scheduler`: a scheduler written in the example (smallest
/// request first) decides what reaches the NIC in place of the built-in
/// one; mtrdma_sched's FIFO keeps the posting order.
#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduler_of_ones_own_orders_what_reaches_the_nic() {
    let out = run(Command::new(example("own_scheduler")).arg(device()));
    let order = |name: &str| -> Vec<u64> {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} completion order: ")))
            .unwrap_or_else(|| panic!("no {name} line in:\n{out}"));
        line.split(' ')
            .map(|w| w.parse().expect("a request"))
            .collect()
    };
    assert_eq!(order("fifo"), [0, 1, 2, 3], "{out}");
    let sjf = order("sjf");
    let at = |i: u64| sjf.iter().position(|&c| c == i).expect("every request");
    // The first large WRITE goes at once and the second waits for room;
    // the scheduler holds the rest and picks the small one next.
    assert!(
        at(3) < at(2),
        "the small request overtakes a large one queued before it:\n{out}"
    );
}
