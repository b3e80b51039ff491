//! What the fuzz targets that drive the scheduled data path on null sinks
//! (`data_path`, `engine_rules`) share: regions that carry their
//! request's number, the remote region they write to, and the delay
//! window some of their queue pairs keep.
#![allow(dead_code)]

use std::sync::Arc;

use mtrdma_sched::{DelayWindowConfig, Nanos, WindowFactory};
use mtrdma_verbs::testing::HeapRegion;
use mtrdma_verbs::RemoteRegion;

/// Where every WRITE and READ goes.
pub const REMOTE: RemoteRegion = RemoteRegion {
    addr: 0x7000_0000,
    len: 1 << 20,
    rkey: 0x42,
};

/// A region of `len` bytes (at least 8) carrying `id`.
pub fn region(id: u64, len: usize) -> HeapRegion {
    let mut r = HeapRegion::new(len.max(8));
    r.as_mut_slice()[..8].copy_from_slice(&id.to_le_bytes());
    r
}

/// The request number a [`region`] carries.
pub fn id_of(r: &HeapRegion) -> u64 {
    u64::from_le_bytes(r.as_slice()[..8].try_into().expect("8 bytes"))
}

/// A delay window for pieces of `piece` bytes, with quiet times every
/// 50 ms of the manual clock (a quiet time lasts twice the target delay,
/// some milliseconds here: far shorter periods would leave the window
/// quiet most of the time).
pub fn delay_window(piece: u64) -> Arc<dyn WindowFactory> {
    Arc::new(DelayWindowConfig {
        quiet_every: Nanos::from_millis(50),
        ..DelayWindowConfig::for_piece(piece)
    })
}
