//! Tests of `handle`.

use super::gcra_rescale;

#[test]
fn a_debt_keeps_its_units_when_the_rate_changes() {
    // 100 ms owed at 1,000 units/s is 100 units: 10 ms at 10,000/s.
    assert_eq!(
        gcra_rescale(1_100_000_000, 1_000_000_000, 1_000, 10_000),
        1_010_000_000
    );
    // And 1 s at 100/s, rounded up.
    assert_eq!(
        gcra_rescale(1_100_000_000, 1_000_000_000, 1_000, 100),
        2_000_000_000
    );
    // Nothing owed, or no rate before or after: kept.
    assert_eq!(gcra_rescale(500, 1_000, 1_000, 10_000), 500);
    assert_eq!(gcra_rescale(5_000, 1_000, 0, 10_000), 5_000);
    assert_eq!(gcra_rescale(5_000, 1_000, 1_000, 0), 5_000);
    // A debt too large for the clock saturates.
    assert_eq!(gcra_rescale(u64::MAX, 0, u64::MAX, 1), u64::MAX);
}
