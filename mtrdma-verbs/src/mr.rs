//! Memory regions: registered buffers the NIC reads and writes.

use std::fmt;
use std::io;
use std::ops::Range;
use std::ptr::NonNull;

use ibverbs_sys as ffi;
use mtrdma_core::table::OwnedMrPermit;
use mtrdma_core::TenantHandle;

use crate::{Error, ProtectionDomain};

/// What a peer (and the local NIC) may do with a memory region. Local
/// write is always granted (receives and READ results land in it); remote
/// access is opt-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Peers may RDMA READ from it.
    pub remote_read: bool,
    /// Peers may RDMA WRITE into it.
    pub remote_write: bool,
}

impl Access {
    /// Local access only (the default).
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
    /// Peers may READ and WRITE.
    pub const REMOTE_READ_WRITE: Access = Access {
        remote_read: true,
        remote_write: true,
    };

    /// The rights a queue pair grants its peer (remote access of each
    /// region is still checked against the region's own rights).
    pub(crate) fn qp_flags(self) -> u32 {
        self.flags() & !ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    }

    fn flags(self) -> u32 {
        let mut flags = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if self.remote_read {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.remote_write {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        flags
    }
}

/// A range of a peer's memory region: what RDMA WRITE and READ target.
/// Hand it to the peer (it is serialisable) with
/// [`MemoryRegion::remote`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteRegion {
    /// The region's address in the peer's address space.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The key that authorises access.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The `len` bytes at `offset`, if they lie inside the region.
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteRegion> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| RemoteRegion {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }
}

/// A registered buffer owned by mtrdma.
///
/// While no work request uses it, it reads and writes like a byte slice.
/// Posting moves it into the queue pair; the completion hands it back, so
/// safe code can never touch memory the NIC may be using.
pub struct MemoryRegion {
    // Field order is drop order: deregister before freeing the buffer.
    mr: NonNull<ffi::ibv_mr>,
    buf: Box<[u8]>,
    access: Access,
    pd: ProtectionDomain,
    _permit: Option<OwnedMrPermit>,
}

// SAFETY: the region owns its buffer and registration; moving it to
// another thread moves that ownership, and verbs calls on `mr` are
// thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: `&MemoryRegion` only reads the buffer and the keys.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.buf.len())
            .field("lkey", &self.lkey())
            .field("access", &self.access)
            .finish()
    }
}

/// The memlock limit (`RLIMIT_MEMLOCK`) in bytes, if limited and not
/// waived (root has `CAP_IPC_LOCK`).
fn memlock_limit() -> Option<u64> {
    if rustix::process::geteuid().is_root() {
        return None;
    }
    rustix::process::getrlimit(rustix::process::Resource::Memlock).current
}

impl ProtectionDomain {
    /// Registers `buf` (a `Vec<u8>`, boxed slice, ...) with `access`.
    pub fn register(
        &self,
        buf: impl Into<Box<[u8]>>,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        self.register_inner(buf.into(), access, None)
    }

    /// Allocates and registers `len` zeroed bytes.
    pub fn allocate(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        self.register(vec![0u8; len], access)
    }

    /// Registers `buf` for `tenant`: admitted against its memory-region
    /// quota and registration rate first, and given back when the region is
    /// dropped.
    pub fn register_for(
        &self,
        tenant: &TenantHandle,
        buf: impl Into<Box<[u8]>>,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        let buf = buf.into();
        let permit = tenant.acquire_mr(buf.len() as u64)?.into_owned();
        self.register_inner(buf, access, Some(permit))
    }

    fn register_inner(
        &self,
        mut buf: Box<[u8]>,
        access: Access,
        permit: Option<OwnedMrPermit>,
    ) -> Result<MemoryRegion, Error> {
        let device = self.context().name().to_string();
        if buf.is_empty() {
            return Err(Error::EmptyRegion);
        }
        if let Some(limit) = memlock_limit() {
            if buf.len() as u64 > limit {
                return Err(Error::MemlockTooLow {
                    limit,
                    needed: buf.len() as u64,
                });
            }
        }
        // SAFETY: the buffer is heap memory of `len` bytes that this region
        // owns (and frees only after deregistering); the PD is alive.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                self.raw(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                access.flags() as i32,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(12) {
                // ENOMEM from pinning: almost always the memlock limit.
                if let Some(limit) = memlock_limit() {
                    return Err(Error::MemlockTooLow {
                        limit,
                        needed: buf.len() as u64,
                    });
                }
            }
            return Err(Error::Verbs {
                call: "ibv_reg_mr",
                device,
                source,
            });
        };
        tracing::debug!(%device, len = buf.len(), ?access, "registered memory region");
        Ok(MemoryRegion {
            mr,
            buf,
            access,
            pd: self.clone(),
            _permit: permit,
        })
    }
}

impl MemoryRegion {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Never true: empty regions cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes, unless the region grants remote write access: a peer
    /// may then change it at any moment, so it is read with
    /// [`read`](Self::read) / [`read_into`](Self::read_into) instead.
    pub fn as_slice(&self) -> Option<&[u8]> {
        (!self.access.remote_write).then_some(&*self.buf)
    }

    /// The bytes, to fill before sending, unless the region grants remote
    /// write access (then use [`write_at`](Self::write_at)).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        (!self.access.remote_write).then_some(&mut *self.buf)
    }

    /// Copies the bytes at `offset` into `buf`, reading each byte once
    /// (volatile), as memory a peer may write must be read.
    pub fn read_into(&self, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        let end = offset
            .checked_add(buf.len())
            .filter(|&e| e <= self.buf.len());
        if end.is_none() {
            return Err(Error::LocalRangeOutOfBounds {
                range: offset..offset.saturating_add(buf.len()),
                len: self.buf.len(),
            });
        }
        let base = self.buf.as_ptr();
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: `offset + i < len` (checked above): in bounds of the
            // buffer this region owns; a byte read is always valid.
            *b = unsafe { base.add(offset + i).read_volatile() };
        }
        Ok(())
    }

    /// A copy of the whole region (see [`read_into`](Self::read_into)).
    pub fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.buf.len()];
        self.read_into(0, &mut out)
            .expect("the whole region is in bounds");
        out
    }

    /// Writes `data` at `offset`, each byte once (volatile).
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let end = offset
            .checked_add(data.len())
            .filter(|&e| e <= self.buf.len());
        if end.is_none() {
            return Err(Error::LocalRangeOutOfBounds {
                range: offset..offset.saturating_add(data.len()),
                len: self.buf.len(),
            });
        }
        let base = self.buf.as_mut_ptr();
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above) of the buffer this region
            // owns exclusively (`&mut self`).
            unsafe { base.add(offset + i).write_volatile(b) };
        }
        Ok(())
    }

    /// The access it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration owned by `self`.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().rkey }
    }

    pub(crate) fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// The descriptor a peer needs to READ or WRITE this whole region, if
    /// remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        (self.access.remote_read || self.access.remote_write).then(|| RemoteRegion {
            addr: self.addr(),
            len: self.buf.len() as u64,
            rkey: self.rkey(),
        })
    }

    /// Checks that `range` lies in the region and returns its (address, length).
    pub(crate) fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        if range.start > range.end || range.end > self.buf.len() {
            return None;
        }
        Some(ffi::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: u32::try_from(range.end - range.start).ok()?,
            lkey: self.lkey(),
        })
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `mr` is our registration, deregistered once, before the
        // buffer (a later field) is freed. A region is only dropped when no
        // work request uses it (the queue pair owns it while one does).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // The NIC may still map the buffer: leak it rather than free it.
            tracing::error!(rc, "ibv_dereg_mr failed; leaking the buffer");
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}
