//! Protection by policy: what a bound on the bytes a latency request may
//! find queued ahead of it at the port asks of every bulk sender.
//!
//! The operator writes one number, the **latency bound** (`[link]
//! latency_bound` in the policy file): the bytes that may stand ahead of a
//! latency request at the shared port. A request that arrives waits behind
//! the bytes the bulk senders' windows keep queued (the queue allowance),
//! behind the piece on the wire, and behind the part of a piece a window
//! that ends inside one lets go early (half a piece on average). So
//!
//! * the **piece size** is a quarter of the bound: WRITE and READ of a
//!   protected bulk sender reach the NIC in pieces of at most this size;
//! * the **queue allowance** is what is left, the bound less one and a half
//!   pieces: the bytes the senders' [`DelayWindow`](crate::DelayWindow)s
//!   keep queued at the port (their target is the time these bytes take
//!   at the link's measured rate).
//!
//! A bound of 16 KiB gives 4 KiB pieces and a 10 KiB allowance, the
//! settings the emulated link was measured with.
//!
//! Every bulk sender takes these settings unless its own are tighter
//! ([`Protection::piece_for`], [`Protection::window_config`]): a tenant's
//! code can make its pieces and its queue allowance smaller, never larger,
//! and cannot turn its window off. The clamping is silent on purpose: a
//! tenant's code written without knowing the policy goes on working, held
//! to the operator's bound.
//!
//! ```
//! use mtrdma_sched::Protection;
//! let p = Protection::for_bound(16 << 10).unwrap();
//! assert_eq!((p.piece_bytes, p.queue_bytes), (4096, 10 << 10));
//! // A tenant that asks for 1 MiB pieces gets the policy's.
//! assert_eq!(p.piece_for(1 << 20), 4096);
//! // One that asks for 2 KiB keeps its own: it is tighter.
//! assert_eq!(p.piece_for(2048), 2048);
//! ```

use crate::error::ConfigError;
use crate::window::DelayWindowConfig;

/// What a latency bound asks of every protected bulk sender (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Protection {
    /// Bytes that may be queued ahead of a latency request at the port.
    pub bound_bytes: u64,
    /// The largest piece a protected bulk sender posts.
    pub piece_bytes: u64,
    /// The bytes its delay window lets stand queued at the port.
    pub queue_bytes: u64,
}

impl Protection {
    /// The smallest latency bound: 1 KiB (pieces of 256 bytes).
    pub const MIN_BOUND: u64 = 1 << 10;
    /// The largest latency bound: 16 MiB.
    pub const MAX_BOUND: u64 = 16 << 20;

    /// The settings that follow from a bound of `bound_bytes`.
    ///
    /// # Errors
    /// [`ConfigError::Protection`] for a bound outside
    /// [`MIN_BOUND`](Self::MIN_BOUND)..=[`MAX_BOUND`](Self::MAX_BOUND).
    pub fn for_bound(bound_bytes: u64) -> Result<Protection, ConfigError> {
        if !(Self::MIN_BOUND..=Self::MAX_BOUND).contains(&bound_bytes) {
            return Err(ConfigError::Protection {
                what: "the latency bound must be between 1 KiB and 16 MiB",
            });
        }
        let piece_bytes = bound_bytes / 4;
        Ok(Protection {
            bound_bytes,
            piece_bytes,
            queue_bytes: bound_bytes - piece_bytes - piece_bytes / 2,
        })
    }

    /// Checks settings read from elsewhere (a quota table another process
    /// wrote): a bound in range, pieces and an allowance of at least one
    /// byte, and a piece and a half with the allowance within the bound.
    ///
    /// # Errors
    /// [`ConfigError::Protection`] naming what is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &'static str| Err(ConfigError::Protection { what });
        if !(Self::MIN_BOUND..=Self::MAX_BOUND).contains(&self.bound_bytes) {
            return bad("the latency bound must be between 1 KiB and 16 MiB");
        }
        if self.piece_bytes == 0 || self.queue_bytes == 0 {
            return bad("the piece size and the queue allowance must be at least 1 byte");
        }
        let held = self
            .queue_bytes
            .saturating_add(self.piece_bytes)
            .saturating_add(self.piece_bytes / 2);
        if held > self.bound_bytes {
            return bad("a piece and a half and the queue allowance must fit in the bound");
        }
        Ok(())
    }

    /// The piece size of a sender that asked for `asked` bytes: its own if
    /// smaller, else the policy's.
    pub fn piece_for(&self, asked: u64) -> u64 {
        asked.clamp(1, self.piece_bytes)
    }

    /// The pieces a protected sender may have in the NIC when it asked for
    /// `asked_pieces` of `asked_chunk` bytes: the same bytes in the
    /// policy's smaller pieces ([`piece_for`](Self::piece_for); the
    /// defaults' 4 x 64 KiB become 64 x 4 KiB), at least as many pieces
    /// as it asked for and at most 1,024. Its window decides how many of
    /// them are out.
    ///
    /// ```
    /// use mtrdma_sched::Protection;
    ///
    /// let p = Protection::for_bound(16 << 10).unwrap();
    /// assert_eq!(p.pieces_for(4, 64 << 10), 64);
    /// assert_eq!(p.pieces_for(8, 1024), 8);
    /// assert_eq!(p.pieces_for(4, 1 << 30), 1024);
    /// ```
    pub fn pieces_for(&self, asked_pieces: u32, asked_chunk: u64) -> u32 {
        let piece = self.piece_for(asked_chunk);
        let bytes = u64::from(asked_pieces).saturating_mul(asked_chunk);
        let pieces = (bytes / piece).clamp(u64::from(asked_pieces.max(1)), 1024);
        u32::try_from(pieces).unwrap_or(1024)
    }

    /// The window of a protected sender whose own window keeps a queue
    /// allowance of `asked_queue_bytes` (`None`: no window, or one that
    /// keeps none): the policy's, for its pieces and allowance. Of the
    /// sender's own settings only a smaller queue allowance is kept; its
    /// weight is the tenant's (left at 1, the engine gives it the
    /// tenant's), and nothing it asks can lengthen the queue it keeps,
    /// replace the window with one of its own or turn it off.
    pub fn window_config(&self, asked_queue_bytes: Option<u64>) -> DelayWindowConfig {
        let queue_bytes =
            asked_queue_bytes.map_or(self.queue_bytes, |q| q.clamp(1, self.queue_bytes));
        DelayWindowConfig {
            queue_bytes,
            // The queue it keeps is the bound's bytes (at the link's
            // measured rate), not a share of the path's own delay: on a
            // path whose delay is long, a share of it would let the queue
            // past the bound, and each sender's own estimate of that
            // delay would set it apart from the others (in the simulator
            // at 120 Mbit/s and a 600 us path, 1:2:4 shares 87% off with
            // a share of 1, 5% with none).
            target_ratio_ppm: 0,
            ..DelayWindowConfig::for_piece(self.piece_bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_gives_pieces_and_an_allowance_that_fit_in_it() {
        for bound in [
            Protection::MIN_BOUND,
            4096,
            16 << 10,
            100_000,
            Protection::MAX_BOUND,
        ] {
            let p = Protection::for_bound(bound).unwrap();
            p.validate().unwrap();
            assert!(p.piece_bytes >= 256 && p.queue_bytes >= 1, "{p:?}");
            assert!(p.queue_bytes + p.piece_bytes + p.piece_bytes / 2 <= bound);
        }
    }

    #[test]
    fn bounds_out_of_range_are_refused_with_the_range() {
        for bound in [0, 1023, (16 << 20) + 1] {
            let e = Protection::for_bound(bound).unwrap_err();
            assert!(e.to_string().contains("between 1 KiB and 16 MiB"), "{e}");
        }
    }

    #[test]
    fn settings_that_overflow_the_bound_are_refused() {
        let mut p = Protection::for_bound(16 << 10).unwrap();
        p.queue_bytes += 1;
        assert!(p.validate().is_err());
        let mut p = Protection::for_bound(16 << 10).unwrap();
        p.piece_bytes = 0;
        assert!(p.validate().is_err());
    }

    #[test]
    fn a_sender_cannot_loosen_the_window_only_tighten_its_allowance() {
        let p = Protection::for_bound(16 << 10).unwrap();
        let loose = DelayWindowConfig {
            queue_bytes: 1 << 30,
            min_window: 1 << 30,
            max_window: 1 << 40,
            initial_window: 1 << 30,
            quiet_every: crate::Nanos::ZERO,
            ..DelayWindowConfig::for_piece(1 << 20)
        };
        let got = p.window_config(Some(loose.queue_bytes));
        assert_eq!(got, p.window_config(None));
        assert_eq!(got.queue_bytes, 10 << 10);
        let tight = DelayWindowConfig {
            queue_bytes: 2048,
            ..DelayWindowConfig::for_piece(4096)
        };
        assert_eq!(p.window_config(Some(tight.queue_bytes)).queue_bytes, 2048);
        got.validate().unwrap();
    }
}
