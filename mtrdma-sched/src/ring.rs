//! The active rings of the DRR scheduler: FIFOs of slot indices.

/// A FIFO of `u32` slot indices in a power-of-two buffer, so that every
/// position is a mask away and moving the front to the back (a DRR turn
/// ending) is one store.
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    /// Empty, or a power of two long.
    buf: Box<[u32]>,
    /// Position of the front; below `buf.len()` (or 0 when empty).
    head: usize,
    len: usize,
}

impl Ring {
    /// An empty ring (allocates on the first push).
    pub(crate) fn new() -> Self {
        Ring {
            buf: Box::new([]),
            head: 0,
            len: 0,
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.buf.len().wrapping_sub(1)
    }

    /// Entries in the ring.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the ring is empty.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The front entry.
    #[inline]
    pub(crate) fn front(&self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.buf.get(self.head).copied()
    }

    /// Drops the front entry (nothing if empty).
    #[inline]
    pub(crate) fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = (self.head + 1) & self.mask();
            self.len -= 1;
        }
    }

    /// Appends `s` at the back.
    #[inline]
    pub(crate) fn push_back(&mut self, s: u32) {
        if self.len == self.buf.len() {
            self.grow();
        }
        let i = (self.head + self.len) & self.mask();
        self.buf[i] = s;
        self.len += 1;
    }

    /// Moves the front entry to the back.
    #[inline]
    pub(crate) fn rotate(&mut self) {
        if let Some(s) = self.front() {
            // Also right when full: the back position is then the front's.
            let mask = self.mask();
            self.buf[(self.head + self.len) & mask] = s;
            self.head = (self.head + 1) & mask;
        }
    }

    /// The entries from front to back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mask = self.mask();
        (0..self.len).map(move |k| self.buf[(self.head + k) & mask])
    }

    /// Doubles the buffer, keeping the order.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = (self.buf.len() * 2).max(8);
        let mut buf = vec![0u32; cap].into_boxed_slice();
        for (slot, s) in buf.iter_mut().zip(self.iter()) {
            *slot = s;
        }
        self.buf = buf;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn behaves_like_a_vecdeque_through_growth_and_rotation() {
        let mut ring = Ring::new();
        let mut model = VecDeque::new();
        assert_eq!(ring.front(), None);
        ring.pop_front();
        ring.rotate();
        // A cheap deterministic mix of pushes, pops and rotations.
        let mut x = 12_345u32;
        for i in 0..10_000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            match (x >> 16) % 4 {
                0 | 1 => {
                    ring.push_back(i);
                    model.push_back(i);
                }
                2 => {
                    ring.pop_front();
                    model.pop_front();
                }
                _ => {
                    ring.rotate();
                    model.rotate_left(usize::from(!model.is_empty()));
                }
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.is_empty(), model.is_empty());
            assert_eq!(ring.front(), model.front().copied());
        }
        assert!(ring.iter().eq(model.iter().copied()));
        // Rotating a full ring.
        let mut full = Ring::new();
        for s in 0..8 {
            full.push_back(s);
        }
        full.rotate();
        assert!(full.iter().eq([1, 2, 3, 4, 5, 6, 7, 0]));
        full.push_back(8);
        assert!(full.iter().eq([1, 2, 3, 4, 5, 6, 7, 0, 8]));
    }
}
