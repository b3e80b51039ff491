//! The policy's seqlock: one writer (the table's owner) and any number of
//! readers, in other processes. `seq` is odd while a write is in progress
//! and `seq / 2` is the generation of the policy last written. The writer
//! stores the words it protects with relaxed stores between
//! [`begin_write`] and [`end_write`]; a reader loads them with relaxed
//! loads inside [`read`], which retries whatever overlapped a write
//! (the fences are Boehm's, "Can seqlocks get along with programming
//! language memory models?", 2012). `loom.rs` model-checks it.

use super::sync::{fence, spin, AtomicU64};
use std::sync::atomic::Ordering;

/// Begins a write: makes `seq` odd and returns that value. A writer that
/// died in the middle of a write left it odd: the next write goes on from
/// there.
pub(crate) fn begin_write(seq: &AtomicU64) -> u64 {
    let start = seq.load(Ordering::Relaxed) | 1;
    seq.store(start, Ordering::Relaxed);
    // The protected words' stores stay after the odd value.
    fence(Ordering::Release);
    start
}

/// Ends the write [`begin_write`] returned `start` for: the next
/// generation.
pub(crate) fn end_write(seq: &AtomicU64, start: u64) {
    seq.store(start + 1, Ordering::Release);
}

/// Runs `load` (relaxed loads of the protected words) until one run
/// overlapped no write, at most `tries` times. Returns the (even) `seq`
/// it read under with what `load` returned, or `None` when every try
/// overlapped a write (or found one never finished).
pub(crate) fn read<T>(
    seq: &AtomicU64,
    tries: u32,
    mut load: impl FnMut() -> T,
) -> Option<(u64, T)> {
    for attempt in 0..tries {
        let s1 = seq.load(Ordering::Acquire);
        if s1 % 2 == 1 {
            spin(attempt);
            continue;
        }
        let value = load();
        // The protected words' loads stay before the second look.
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s1 {
            return Some((s1, value));
        }
    }
    None
}
