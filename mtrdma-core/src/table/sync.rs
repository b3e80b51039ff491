//! The atomics the table's shared memory is made of: the standard
//! library's, or loom's when the table's protocols are model-checked
//! (`RUSTFLAGS="--cfg mtrdma_loom"`, see `loom.rs`). Under loom a table
//! is never mapped: the checks build the protocols' words on the heap.

#[cfg(mtrdma_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
#[cfg(not(mtrdma_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64};

/// Waits a moment in a loop that waits for another process (or, under
/// loom, lets the model run another thread).
pub(crate) fn spin(attempt: u32) {
    #[cfg(mtrdma_loom)]
    {
        let _ = attempt;
        loom::thread::yield_now();
    }
    #[cfg(not(mtrdma_loom))]
    {
        if attempt > 100 {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}
