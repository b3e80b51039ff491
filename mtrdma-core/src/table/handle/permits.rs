//! What admission hands out: permits that give back a queue pair, a
//! region's bytes or a work request when dropped.

use super::*;

/// Subtracts without wrapping below zero (a corrupted or double release
/// must not turn into a huge "in use" count).
pub(crate) fn sub_saturating(word: &AtomicU64, n: u64) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// One admitted queue pair, borrowed from its [`TenantHandle`]; returned
/// to the quota when dropped. [`into_owned`](Self::into_owned) makes one
/// that can be stored anywhere.
#[derive(Debug)]
#[must_use = "dropping the permit releases the queue pair quota at once"]
pub struct QpPermit<'h> {
    pub(super) handle: &'h TenantHandle,
}

impl QpPermit<'_> {
    /// The tenant it was admitted for.
    pub fn tenant(&self) -> TenantId {
        self.handle.tenant()
    }

    /// The same permit, holding its own reference to the handle.
    pub fn into_owned(self) -> OwnedQpPermit {
        let handle = self.handle.clone();
        std::mem::forget(self);
        OwnedQpPermit { handle }
    }
}

/// A [`QpPermit`] that owns a clone of its handle.
#[derive(Debug)]
#[must_use = "dropping the permit releases the queue pair quota at once"]
pub struct OwnedQpPermit {
    pub(super) handle: TenantHandle,
}

impl OwnedQpPermit {
    /// The tenant it was admitted for.
    pub fn tenant(&self) -> TenantId {
        self.handle.tenant()
    }

    /// The handle of the tenant it was admitted for.
    pub fn handle(&self) -> &TenantHandle {
        &self.handle
    }
}

/// Admitted memory-region bytes, borrowed from their [`TenantHandle`];
/// returned to the quota when dropped.
#[derive(Debug)]
#[must_use = "dropping the permit releases the memory-region quota at once"]
pub struct MrPermit<'h> {
    pub(super) handle: &'h TenantHandle,
    pub(super) bytes: u64,
}

impl MrPermit<'_> {
    /// The bytes admitted.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The same permit, holding its own reference to the handle.
    pub fn into_owned(self) -> OwnedMrPermit {
        let (handle, bytes) = (self.handle.clone(), self.bytes);
        std::mem::forget(self);
        OwnedMrPermit { handle, bytes }
    }
}

/// An [`MrPermit`] that owns a clone of its handle.
#[derive(Debug)]
#[must_use = "dropping the permit releases the memory-region quota at once"]
pub struct OwnedMrPermit {
    pub(super) handle: TenantHandle,
    pub(super) bytes: u64,
}

impl OwnedMrPermit {
    /// The bytes admitted.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// `Drop` for the permits that give back what they hold at once: `$p`
/// the permit, `$release` how.
macro_rules! release_on_drop {
    ($($permit:ty => |$p:ident| $release:expr;)*) => {
        $(
            impl Drop for $permit {
                #[inline]
                fn drop(&mut self) {
                    let $p = self;
                    $release
                }
            }
        )*
    };
}

release_on_drop! {
    QpPermit<'_> => |p| p.handle.release_qp();
    OwnedQpPermit => |p| p.handle.release_qp();
    MrPermit<'_> => |p| p.handle.release_mr(p.bytes);
    OwnedMrPermit => |p| p.handle.release_mr(p.bytes);
}

/// Admitted outstanding work requests; returned when dropped.
#[derive(Debug)]
#[must_use = "dropping the permit releases the work requests at once"]
pub struct WrPermit {
    pub(super) handle: TenantHandle,
    pub(super) n: u64,
}

impl WrPermit {
    /// Gives back `k` of the work requests now (as their completions arrive).
    pub fn release(&mut self, k: u64) {
        let k = k.min(self.n);
        self.n -= k;
        sub_saturating(&self.handle.state().outstanding_wr, k);
        ProcessSlot::gauge_sub(&self.handle.process().outstanding_wr, k);
    }
}

impl Drop for WrPermit {
    fn drop(&mut self) {
        sub_saturating(&self.handle.state().outstanding_wr, self.n);
        ProcessSlot::gauge_sub(&self.handle.process().outstanding_wr, self.n);
    }
}
