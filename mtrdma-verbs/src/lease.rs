//! A piece lent to peers through a registration of exactly its bytes: a
//! key bounded on every device, revoked when the piece is taken back.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use ibverbs_sys as ffi;
use mtrdma_core::table::OwnedMrPermit;
use mtrdma_core::TenantHandle;

use crate::mr::reg_mr_error;
use crate::{Access, Error, MemoryRegion, PostError, RemoteRegion};

/// A piece of a registration lent to peers with a key of its own
/// ([`MemoryRegion::lease`]): the piece's bytes are registered again,
/// alone, with the rights lent, and the key of that registration is what
/// peers are given ([`remote`](Self::remote)). A peer reaches those bytes
/// and nothing else: the device checks every access against the
/// registration's bounds, as it checks any registration's, so an access
/// outside the piece fails with a remote access error. Taking the piece
/// back ([`take_back`](Self::take_back)) deregisters it, after which the
/// key reaches nothing.
///
/// While it is lent the lease holds the piece, so safe code cannot touch
/// bytes a peer may be writing; dropping the lease takes the piece back
/// and frees it.
///
/// Against [`QueuePair::lend`](crate::QueuePair::lend) (memory windows of
/// type 2): a window binds in a work request on the send queue, without a
/// system call, and its key works only through the queue pair it was bound
/// on, but its bounds are the device's to enforce and stock rxe does not (it
/// checks a window's accesses against the whole registration under it),
/// and some devices (SoftiWARP) have no windows. A lease costs a
/// registration (a system call, and the pages pinned again) and its key
/// works through any queue pair of the protection domain, but it is
/// bounded on every device. Lend pieces of a registration with no remote
/// rights of its own ([`Access::LOCAL`]), or its own key reaches them all.
///
/// ```no_run
/// use mtrdma_verbs::{Access, Context};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// let mut pieces = pd.allocate(4 * 4096, Access::LOCAL)?.into_pieces(4096)?;
/// let lease = pieces.remove(1).lease(Access::REMOTE_READ_WRITE)?;
/// let key = lease.remote(); // for the peer: these 4096 bytes only
/// // ... the peer READs or WRITEs them ...
/// let piece = lease.take_back()?; // the key reaches nothing now
/// # Ok(())
/// # }
/// ```
pub struct Lease {
    /// The piece's own registration.
    mr: NonNull<ffi::ibv_mr>,
    /// The piece, held until the registration is gone.
    piece: ManuallyDrop<MemoryRegion>,
    rights: Access,
    /// The tenant's quota it holds ([`MemoryRegion::lease_for`]).
    permit: Option<OwnedMrPermit>,
}

// SAFETY: the lease owns its `ibv_mr` (verbs calls on it are thread-safe)
// and its piece, which is `Send`.
unsafe impl Send for Lease {}
// SAFETY: shared references read only the key, the address and the
// length.
unsafe impl Sync for Lease {}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("remote", &self.remote())
            .field("rights", &self.rights)
            .finish()
    }
}

impl MemoryRegion {
    /// Lends this piece to peers with `rights`, through a registration of
    /// its bytes alone (see [`Lease`]).
    ///
    /// # Errors
    /// The piece comes back in the [`PostError`]: `rights` with no remote
    /// right ([`Error::NoRightsToLend`]), or the device refused the
    /// registration.
    pub fn lease(self, rights: Access) -> Result<Lease, PostError> {
        Lease::new(self, rights, None).map_err(PostError::new)
    }

    /// [`lease`](Self::lease) for `tenant`: the piece's bytes count
    /// against its memory-region quota, and its registration rate, while
    /// the lease lasts (the device holds a second registration of them).
    ///
    /// # Errors
    /// As [`lease`](Self::lease), and [`Error::Admission`] if the quota or
    /// the rate refuses it.
    pub fn lease_for(self, tenant: &TenantHandle, rights: Access) -> Result<Lease, PostError> {
        let permit = match tenant.acquire_mr(self.len() as u64) {
            Ok(permit) => permit.into_owned(),
            Err(e) => return Err(PostError::new((e.into(), self))),
        };
        Lease::new(self, rights, Some(permit)).map_err(PostError::new)
    }
}

impl Lease {
    fn new(
        piece: MemoryRegion,
        rights: Access,
        permit: Option<OwnedMrPermit>,
    ) -> Result<Lease, (Error, MemoryRegion)> {
        let rights = Access {
            lendable: false,
            ..rights
        };
        if !(rights.remote_read || rights.remote_write || rights.remote_atomic) {
            return Err((Error::NoRightsToLend, piece));
        }
        let pd = piece.pd().clone();
        // SAFETY: the piece's bytes are valid (its registration keeps
        // them) and stay where they are while the lease holds the piece,
        // which it gives back only after deregistering; the PD is alive.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.raw(),
                piece.base().cast(),
                piece.len(),
                rights.flags() as i32,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let source = crate::error::verbs_errno();
            let device = pd.context().name().to_string();
            return Err((reg_mr_error(source, piece.len(), rights, device), piece));
        };
        tracing::debug!(len = piece.len(), ?rights, "piece leased");
        Ok(Lease {
            mr,
            piece: ManuallyDrop::new(piece),
            rights,
            permit,
        })
    }

    /// What a peer needs to reach the piece: its address, its length, and
    /// the lease's key.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.piece.base() as u64,
            len: self.piece.len() as u64,
            // SAFETY: `mr` is our live registration.
            rkey: unsafe { self.mr.as_ref().rkey },
        }
    }

    /// The rights lent.
    pub fn rights(&self) -> Access {
        self.rights
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.piece.len()
    }

    /// Never true: a piece is never empty.
    pub fn is_empty(&self) -> bool {
        self.piece.is_empty()
    }

    /// Takes the piece back: deregisters the lease, after which its key
    /// reaches nothing, and hands the piece back with what peers wrote.
    ///
    /// # Errors
    /// If the device refuses to deregister, it may still reach the bytes:
    /// the piece is then never freed (leaked), and the error says why.
    pub fn take_back(self) -> Result<MemoryRegion, Error> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: our registration, deregistered once: `this` is never
        // dropped.
        let result = unsafe { this.deregister() };
        // SAFETY: taken once, and `this` is never dropped.
        let piece = unsafe { ManuallyDrop::take(&mut this.piece) };
        let permit = this.permit.take();
        match result {
            Ok(()) => Ok(piece),
            Err(error) => {
                // The device may still reach the bytes, and holds them
                // registered: neither they nor the quota are given back.
                std::mem::forget((piece, permit));
                Err(error)
            }
        }
    }

    /// Deregisters the lease's registration.
    ///
    /// # Safety
    /// Called once.
    unsafe fn deregister(&self) -> Result<(), Error> {
        // SAFETY: the caller's promise: our registration, deregistered
        // once.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        let source = crate::error::errno(rc);
        tracing::error!(rc, "ibv_dereg_mr of a lease failed; leaking its piece");
        Err(Error::Verbs {
            call: "ibv_dereg_mr",
            device: self.piece.pd().context().name().to_string(),
            source,
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // SAFETY: `mr` is ours, deregistered once, here (`take_back` never
        // drops the lease).
        if unsafe { self.deregister() }.is_ok() {
            // SAFETY: dropped once, here, after the device let go of it.
            unsafe { ManuallyDrop::drop(&mut self.piece) };
        } else {
            // The device may still reach the bytes: the piece is leaked
            // (above) and so is the quota it holds.
            std::mem::forget(self.permit.take());
        }
    }
}
