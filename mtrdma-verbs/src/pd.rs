//! Protection domains.

use std::fmt;
use std::sync::Arc;

use ibverbs_sys as ffi;

use crate::{Context, Error};

struct Inner {
    ctx: Context,
    pd: *mut ffi::ibv_pd,
}

// SAFETY: a protection domain is used only through thread-safe verbs calls
// (registration, QP creation) that libibverbs serialises as needed.
unsafe impl Send for Inner {}
// SAFETY: as above; `&self` methods only pass the pointer to verbs.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every MR and QP of the PD holds an `Arc` to it, so none is left.
        // SAFETY: `pd` came from `ibv_alloc_pd` and is freed once.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name(), rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain: memory regions and queue pairs of one domain can
/// work together. Cheap to clone; it keeps its [`Context`] open.
#[derive(Clone)]
pub struct ProtectionDomain {
    inner: Arc<Inner>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name())
            .finish()
    }
}

impl Context {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        // SAFETY: the context is open for as long as `self` lives.
        let pd = unsafe { ffi::ibv_alloc_pd(self.raw()) };
        if pd.is_null() {
            return Err(Error::Verbs {
                call: "ibv_alloc_pd",
                device: self.name().to_string(),
                source: crate::error::verbs_errno(),
            });
        }
        Ok(ProtectionDomain {
            inner: Arc::new(Inner {
                ctx: self.clone(),
                pd,
            }),
        })
    }
}

impl ProtectionDomain {
    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    pub(crate) fn raw(&self) -> *mut ffi::ibv_pd {
        self.inner.pd
    }
}
