//! Borrow rules that keep in-flight buffers safe, pinned so a later change
//! cannot silently loosen them: a region posted to a queue pair cannot be
//! read, written, dropped or still borrowed by safe code.

#[test]
fn buffers_in_flight_cannot_be_touched_by_safe_code() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
