//! Tests of `srq`.

use super::*;

fn level(posted: u32, armed: bool) -> Level {
    Level {
        max_wr: 64,
        limit: 16,
        posted,
        armed,
    }
}

#[test]
fn a_stocked_receive_waits_only_while_the_limit_is_armed() {
    assert!(level(40, true).keeps());
    assert!(!level(40, false).keeps(), "no event will come: post now");
    let off = Level {
        limit: 0,
        ..level(40, true)
    };
    assert!(!off.keeps(), "no limit: post now");
}

#[test]
fn the_limit_is_armed_only_above_it() {
    assert!(
        !level(16, false).should_arm(),
        "at the limit: it would fire at once"
    );
    assert!(level(17, false).should_arm());
    assert!(!level(17, true).should_arm(), "armed already");
    let off = Level {
        limit: 0,
        ..level(40, false)
    };
    assert!(!off.should_arm());
}

#[test]
fn a_queue_seen_below_its_armed_limit_is_due_a_refill() {
    assert!(!level(16, true).below());
    assert!(level(15, true).below());
    assert!(
        !level(15, false).below(),
        "no event armed: refilled already"
    );
    assert_eq!(level(60, true).room(), 4);
}
