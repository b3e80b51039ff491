//! A fast hasher for ids and addresses (keys chosen by the caller or
//! handed out by the system, not by an adversary who could pick colliding
//! keys for a `HashMap` we own).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::TenantId;

/// Fibonacci hashing of an integer key: one multiplication. For maps
/// keyed by tenant ids or by the addresses of objects a provider
/// allocated, looked up on every request, where SipHash's resistance to
/// chosen keys buys nothing (as `mtrdma-preload`'s maps keyed by the
/// addresses of a provider's queue pairs and completion queues).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by tenant id.
pub(crate) type IdMap<V> = HashMap<TenantId, V, BuildHasherDefault<IdHasher>>;

/// Ids below this are looked up in a flat table, not hashed.
const DENSE_LIMIT: u32 = 1 << 20;

/// Tenant id to slot index: a flat table for small ids (the common case:
/// ids handed out by a coordinator from 0 up), a hash map for the rest.
#[derive(Debug, Default)]
pub(crate) struct TenantIndex {
    dense: Vec<u32>,
    sparse: IdMap<u32>,
    len: usize,
}

impl TenantIndex {
    const NONE: u32 = u32::MAX;

    #[inline]
    pub(crate) fn get(&self, id: TenantId) -> Option<u32> {
        if id.0 < DENSE_LIMIT {
            match self.dense.get(id.0 as usize) {
                Some(&s) if s != Self::NONE => Some(s),
                _ => None,
            }
        } else {
            self.sparse.get(&id).copied()
        }
    }

    /// Maps `id` to `slot`; `id` must not be mapped yet.
    pub(crate) fn insert(&mut self, id: TenantId, slot: u32) {
        if id.0 < DENSE_LIMIT {
            let i = id.0 as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, Self::NONE);
            }
            self.dense[i] = slot;
        } else {
            self.sparse.insert(id, slot);
        }
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: TenantId) -> Option<u32> {
        let old = if id.0 < DENSE_LIMIT {
            let cell = self.dense.get_mut(id.0 as usize)?;
            let old = std::mem::replace(cell, Self::NONE);
            (old != Self::NONE).then_some(old)
        } else {
            self.sparse.remove(&id)
        }?;
        self.len -= 1;
        Some(old)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_ids_map_and_unmap() {
        let mut ix = TenantIndex::default();
        for (id, slot) in [(0u32, 5u32), (7, 1), (DENSE_LIMIT, 2), (u32::MAX, 3)] {
            assert_eq!(ix.get(TenantId(id)), None);
            ix.insert(TenantId(id), slot);
            assert_eq!(ix.get(TenantId(id)), Some(slot));
        }
        assert_eq!(ix.len(), 4);
        assert_eq!(ix.get(TenantId(3)), None);
        assert_eq!(ix.remove(TenantId(7)), Some(1));
        assert_eq!(ix.remove(TenantId(7)), None);
        assert_eq!(ix.remove(TenantId(123_456)), None);
        assert_eq!(ix.remove(TenantId(u32::MAX)), Some(3));
        assert_eq!(ix.len(), 2);
    }
}
