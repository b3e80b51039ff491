//! The starvation guard: bulk keeps a minimum share under strict latency
//! priority.

use crate::policy::PPM;

/// Bytes counted per piece, at most: keeps `bytes * ppm` within `i64`.
const MAX_COUNTED: u64 = 1 << 40;

/// A byte-credit counter for the bulk class, in byte x ppm units.
///
/// Latency bytes served while bulk is waiting earn bulk `share` of credit
/// per byte; bulk bytes served spend `1 - share` per byte. Bulk goes first
/// while its credit is positive, so with the latency class saturated bulk
/// gets `share` of the bytes. The credit is clamped to one quantum's worth
/// either way, so neither class can bank an advantage while the other is
/// idle.
#[derive(Debug, Clone)]
pub(crate) struct StarvationGuard {
    share_ppm: i64,
    spend_ppm: i64,
    credit: i64,
    low: i64,
    high: i64,
}

impl StarvationGuard {
    pub(crate) fn new(share_ppm: u32, quantum_bytes: u64) -> StarvationGuard {
        // share_ppm < 1e6 < 2^20 and quantum_bytes <= 2^32: products fit.
        let share = i64::from(share_ppm);
        let spend = PPM as i64 - share;
        let q = i64::try_from(quantum_bytes.min(MAX_COUNTED)).unwrap_or(i64::MAX);
        StarvationGuard {
            share_ppm: share,
            spend_ppm: spend,
            credit: 0,
            low: -q.saturating_mul(spend),
            high: q.saturating_mul(share),
        }
    }

    /// Whether bulk must go before latency now.
    #[inline]
    pub(crate) fn bulk_first(&self) -> bool {
        self.credit > 0
    }

    /// `bytes` of latency traffic were served; `bulk_waiting` says whether
    /// bulk had work queued.
    #[inline]
    pub(crate) fn on_latency(&mut self, bytes: u64, bulk_waiting: bool) {
        if bulk_waiting && self.share_ppm > 0 {
            let earned = bytes.min(MAX_COUNTED) as i64 * self.share_ppm;
            self.credit = (self.credit + earned).min(self.high);
        }
    }

    /// `bytes` of bulk traffic were served.
    #[inline]
    pub(crate) fn on_bulk(&mut self, bytes: u64) {
        if self.share_ppm > 0 {
            let spent = bytes.min(MAX_COUNTED) as i64 * self.spend_ppm;
            self.credit = (self.credit - spent).max(self.low);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturated_latency_leaves_bulk_its_share() {
        // 25% for bulk; latency pieces of 1 KiB, bulk chunks of 16 KiB.
        let mut g = StarvationGuard::new(250_000, 16 << 10);
        let (mut lat, mut bulk) = (0u64, 0u64);
        for _ in 0..100_000 {
            if g.bulk_first() {
                g.on_bulk(16 << 10);
                bulk += 16 << 10;
            } else {
                g.on_latency(1 << 10, true);
                lat += 1 << 10;
            }
        }
        let share = bulk as f64 / (bulk + lat) as f64;
        assert!((share - 0.25).abs() < 0.01, "bulk share {share}");
    }

    #[test]
    fn light_latency_keeps_strict_priority() {
        let mut g = StarvationGuard::new(100_000, 64 << 10);
        for _ in 0..1_000 {
            g.on_bulk(64 << 10);
            assert!(!g.bulk_first());
            g.on_latency(16, true);
            assert!(!g.bulk_first());
        }
    }

    #[test]
    fn disabled_guard_never_favours_bulk() {
        let mut g = StarvationGuard::new(0, 64 << 10);
        for _ in 0..1_000 {
            g.on_latency(1 << 20, true);
        }
        assert!(!g.bulk_first());
    }
}
