//! What a page holds: a header (magic, page number, version, checksum of
//! the body) and a body that is a deterministic pattern of (page number,
//! version). Every page read back from a memory node is checked against
//! the version the pager expects, so a stale, misplaced or damaged page is
//! caught rather than served.

use std::fmt;

/// Bytes in a page.
pub(crate) const PAGE: usize = 4096;
/// Bytes of the header at the start of every page.
pub(crate) const HEADER: usize = 32;
/// The header's first word: "MTRDMAPG" in ASCII, little-endian.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"MTRDMAPG");

/// Why a page read back is not the page expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Corrupt {
    /// The first word is not [`MAGIC`]: not a page this pager wrote.
    Magic(u64),
    /// The header names another page.
    WrongPage { found: u64 },
    /// An older or newer version than the one last written.
    WrongVersion { found: u64, expected: u64 },
    /// The body does not match the checksum in the header.
    Checksum { found: u64, computed: u64 },
    /// Checksum and header agree, but the body is not the pattern of
    /// (page, version).
    Body { offset: usize },
    /// The buffer is not one page long.
    Length(usize),
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corrupt::Magic(m) => write!(f, "bad magic {m:#018x}"),
            Corrupt::WrongPage { found } => write!(f, "holds page {found}"),
            Corrupt::WrongVersion { found, expected } => {
                write!(f, "version {found}, expected {expected}")
            }
            Corrupt::Checksum { found, computed } => write!(
                f,
                "checksum {found:#018x} in the header, {computed:#018x} over the body"
            ),
            Corrupt::Body { offset } => {
                write!(f, "body differs from the pattern at byte {offset}")
            }
            Corrupt::Length(n) => write!(f, "{n} bytes, not a {PAGE}-byte page"),
        }
    }
}

/// splitmix64: a small, fast mixing function; the body's pattern and the
/// workload's random numbers both come from it.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The body's `i`-th 8-byte word for (page, version).
fn pattern_word(seed: u64, i: usize) -> u64 {
    mix(seed ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

fn seed(page: u64, version: u64) -> u64 {
    mix(page.wrapping_mul(0xa076_1d64_78bd_642f) ^ mix(version))
}

/// A 64-bit checksum over the body, word by word (every bit of every word
/// changes it).
pub(crate) fn checksum(body: &[u8]) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c908u64;
    for w in body.chunks(8) {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(word))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    mix(h)
}

fn word_at(buf: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Fills `buf` (one page) with page `page` at `version`.
pub(crate) fn encode(buf: &mut [u8], page: u64, version: u64) {
    debug_assert_eq!(buf.len(), PAGE);
    let s = seed(page, version);
    let (head, body) = buf.split_at_mut(HEADER);
    for (i, w) in body.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&pattern_word(s, i).to_le_bytes());
    }
    let sum = checksum(body);
    head[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    head[8..16].copy_from_slice(&page.to_le_bytes());
    head[16..24].copy_from_slice(&version.to_le_bytes());
    head[24..32].copy_from_slice(&sum.to_le_bytes());
}

/// Checks that `buf` is page `page` at exactly `version`: header fields,
/// the checksum over the body, and the body against the pattern.
pub(crate) fn verify(buf: &[u8], page: u64, version: u64) -> Result<(), Corrupt> {
    if buf.len() != PAGE {
        return Err(Corrupt::Length(buf.len()));
    }
    let magic = word_at(buf, 0);
    if magic != MAGIC {
        return Err(Corrupt::Magic(magic));
    }
    let found = word_at(buf, 8);
    if found != page {
        return Err(Corrupt::WrongPage { found });
    }
    let v = word_at(buf, 16);
    if v != version {
        return Err(Corrupt::WrongVersion {
            found: v,
            expected: version,
        });
    }
    let body = &buf[HEADER..];
    let (found, computed) = (word_at(buf, 24), checksum(body));
    if found != computed {
        return Err(Corrupt::Checksum { found, computed });
    }
    let s = seed(page, version);
    for (i, w) in body.chunks_exact(8).enumerate() {
        if word_at(w, 0) != pattern_word(s, i) {
            return Err(Corrupt::Body {
                offset: HEADER + 8 * i,
            });
        }
    }
    Ok(())
}

/// The workload's random numbers: a splitmix64 counter (no dependency),
/// seeded so that a run can be repeated.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth speaking of
    /// (Lemire's multiply-shift).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p` (0.0 ..= 1.0).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(p: u64, v: u64) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        encode(&mut b, p, v);
        b
    }

    #[test]
    fn an_encoded_page_verifies() {
        for (p, v) in [(0, 1), (1, 1), (12345, 7), (u64::MAX, u64::MAX)] {
            assert_eq!(verify(&page(p, v), p, v), Ok(()));
        }
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let good = page(42, 3);
        for at in 0..PAGE {
            let mut b = good.clone();
            b[at] ^= 0x01;
            assert!(verify(&b, 42, 3).is_err(), "flip at byte {at} undetected");
        }
    }

    #[test]
    fn a_flipped_body_byte_breaks_the_checksum() {
        let mut b = page(42, 3);
        b[HEADER + 100] ^= 0x80;
        assert!(matches!(verify(&b, 42, 3), Err(Corrupt::Checksum { .. })));
    }

    #[test]
    fn a_stale_or_newer_version_is_corrupt() {
        assert_eq!(
            verify(&page(9, 4), 9, 5),
            Err(Corrupt::WrongVersion {
                found: 4,
                expected: 5
            })
        );
        assert_eq!(
            verify(&page(9, 6), 9, 5),
            Err(Corrupt::WrongVersion {
                found: 6,
                expected: 5
            })
        );
    }

    #[test]
    fn another_page_is_corrupt() {
        assert_eq!(
            verify(&page(8, 5), 9, 5),
            Err(Corrupt::WrongPage { found: 8 })
        );
    }

    #[test]
    fn a_body_with_a_matching_checksum_but_the_wrong_pattern_is_corrupt() {
        // Another page's body under this page's header, checksum redone:
        // only the pattern check can tell.
        let mut b = page(9, 5);
        let other = page(10, 5);
        b[HEADER..].copy_from_slice(&other[HEADER..]);
        let sum = checksum(&b[HEADER..]);
        b[24..32].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(verify(&b, 9, 5), Err(Corrupt::Body { .. })));
    }

    #[test]
    fn zeroes_and_short_buffers_are_corrupt() {
        assert_eq!(verify(&[0u8; PAGE], 0, 1), Err(Corrupt::Magic(0)));
        assert_eq!(verify(&[0u8; 16], 0, 1), Err(Corrupt::Length(16)));
    }

    #[test]
    fn patterns_differ_between_pages_and_versions() {
        assert_ne!(page(1, 1)[HEADER..], page(2, 1)[HEADER..]);
        assert_ne!(page(1, 1)[HEADER..], page(1, 2)[HEADER..]);
    }

    #[test]
    fn the_rng_is_seeded_and_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.below(10);
            assert!(x < 10);
            assert_eq!(x, b.below(10));
        }
        let writes = (0..10_000).filter(|_| a.chance(0.5)).count();
        assert!((4_000..6_000).contains(&writes), "{writes}");
    }
}
