//! The examples the README tells users to run, run on a real device (the
//! one MTRDMA_TEST_DEVICE names): a window and a scheduler of one's own.
//! Ignored on a plain `cargo test`; `cargo xtask test` runs them in the
//! SoftRoCE VM. `cargo test` builds the examples next to this test binary.

use std::process::Command;

// Not every test file uses all of what the tests share.
mod common;
use common::{device, example, run};

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
