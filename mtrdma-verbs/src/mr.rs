//! Memory regions: registered buffers the NIC reads and writes.

use std::fmt;
use std::io;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

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
    /// Peers may run atomic operations (fetch-and-add, compare-and-swap)
    /// on its 8-byte words.
    pub remote_atomic: bool,
    /// Its pieces may be lent to a peer one at a time through memory
    /// windows ([`QueuePair::lend`](crate::QueuePair::lend)), each with
    /// the rights it is lent with. With no remote right of its own, a
    /// peer reaches only the piece it was lent, and only until it is taken
    /// back.
    pub lendable: bool,
}

impl Access {
    /// Local access only (the default).
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
        remote_atomic: false,
        lendable: false,
    };
    /// Peers may READ and WRITE.
    pub const REMOTE_READ_WRITE: Access = Access {
        remote_read: true,
        remote_write: true,
        remote_atomic: false,
        lendable: false,
    };
    /// Peers may READ, WRITE and run atomic operations.
    pub const REMOTE_ALL: Access = Access {
        remote_read: true,
        remote_write: true,
        remote_atomic: true,
        lendable: false,
    };
    /// No remote access but through the pieces lent to a peer, one at a
    /// time, with [`QueuePair::lend`](crate::QueuePair::lend) (memory
    /// windows of type 2).
    pub const LENDABLE: Access = Access {
        remote_read: false,
        remote_write: false,
        remote_atomic: false,
        lendable: true,
    };

    /// The rights a queue pair grants its peer (remote access of each
    /// region is still checked against the region's own rights).
    pub(crate) fn qp_flags(self) -> u32 {
        self.remote_flags()
    }

    /// The remote rights alone (a queue pair's, or a memory window's).
    pub(crate) fn remote_flags(self) -> u32 {
        self.flags()
            & !(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
                | ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0)
    }

    pub(crate) fn flags(self) -> u32 {
        let mut flags = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if self.remote_read {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.remote_write {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if self.remote_atomic {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        if self.lendable {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
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
    /// The `len` bytes at `offset`, if they lie inside the region (and
    /// its addresses inside the address space: a region a peer described
    /// may claim otherwise).
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteRegion> {
        let end = offset.checked_add(len)?;
        let addr = self.addr.checked_add(offset)?;
        addr.checked_add(len)?;
        (end <= self.len).then_some(RemoteRegion {
            addr,
            len,
            rkey: self.rkey,
        })
    }
}

/// A registered buffer owned by mtrdma, or a piece of one.
///
/// While no work request uses it, it reads and writes like a byte slice.
/// Posting moves it into the queue pair; the completion hands it back, so
/// safe code can never touch memory the NIC may be using.
///
/// One registration can be split into pieces ([`split_off`](Self::split_off),
/// [`into_pieces`](Self::into_pieces)) that are posted independently: each
/// piece owns its bytes alone, so several requests may be in flight from
/// one registration at once, each handing its piece back with its
/// completion, without a registration per request. Adjacent pieces join
/// again ([`join`](Self::join)); the registration is released when its
/// last piece is dropped.
pub struct MemoryRegion {
    reg: Arc<Registration>,
    /// Where this piece starts in the registration's buffer.
    offset: usize,
    /// Its length (at least 1).
    len: usize,
}

/// Memory the caller owns that a registration can keep: an anonymous or
/// file mapping, huge pages, memory from an allocator of one's own.
/// [`ProtectionDomain::register_memory`] takes it, registers its bytes,
/// and keeps it until the registration is released (after the last piece
/// of the region is dropped, and after deregistration), so the NIC never
/// reaches memory that was given back.
///
/// Implemented for [`memmap2::MmapMut`] (re-exported as
/// [`mtrdma_verbs::memmap2`](crate::memmap2)), which covers mappings of
/// files (shared memory on tmpfs, `memfd`), anonymous mappings and huge
/// pages:
///
/// ```no_run
/// use mtrdma_verbs::memmap2::MmapOptions;
/// use mtrdma_verbs::{Access, Context};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = Context::open_first_active()?;
/// let pd = ctx.alloc_pd()?;
/// // 4 MiB on 2 MiB huge pages (`/proc/sys/vm/nr_hugepages` must have
/// // them), registered; the mapping lives as long as the registration.
/// let pages = MmapOptions::new().len(4 << 20).huge(Some(21)).map_anon()?;
/// let region = pd.register_memory(pages, Access::REMOTE_READ_WRITE)?;
/// # Ok(())
/// # }
/// ```
///
/// A heap buffer (`Vec<u8>`, `Box<[u8]>`) is registered with
/// [`ProtectionDomain::register`] instead.
///
/// # Safety
/// [`as_mut_ptr`](Self::as_mut_ptr) and [`len`](Self::len) describe
/// `len` bytes valid for reads and writes, which stay at that address for
/// as long as the value lives, wherever the value is moved (they must not
/// live inside the value, nor in a `Box` or `Vec` it holds, whose moves
/// assert exclusive access to them), and which nothing but the
/// registration reads or writes while it holds the value. Both return the
/// same on every call.
pub unsafe trait RegisterMemory: Send + Sync + 'static {
    /// The first byte.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;

    /// Whether it has no bytes (it cannot be registered then).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a mapping's bytes are the kernel's pages at a fixed address
// until it is unmapped, which dropping the `MmapMut` does; moving the
// value moves only its pointer and length.
unsafe impl RegisterMemory for memmap2::MmapMut {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }

    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// What holds a registration's bytes.
enum Backing {
    /// A boxed slice, leaked at registration and freed in `Drop` after
    /// deregistration.
    Boxed,
    /// The caller's memory ([`ProtectionDomain::register_memory`]),
    /// dropped in `Drop` after deregistration.
    Owned(ManuallyDrop<Box<dyn RegisterMemory>>),
}

impl Backing {
    /// Gives back the `len` bytes at `buf` that it holds.
    ///
    /// # Safety
    /// Called once, when nothing reaches the bytes any more (never
    /// registered, or deregistered); for [`Backing::Boxed`], `buf` is a
    /// leaked boxed slice of `len` bytes. The value is not used after.
    unsafe fn free(&mut self, buf: NonNull<u8>, len: usize) {
        match self {
            Backing::Boxed => {
                let slice = std::ptr::slice_from_raw_parts_mut(buf.as_ptr(), len);
                // SAFETY: the caller's promise: a leaked boxed slice of
                // `len` bytes, freed once, here.
                drop(unsafe { Box::from_raw(slice) });
            }
            // SAFETY: the caller's promise: dropped once, here.
            Backing::Owned(owner) => unsafe { ManuallyDrop::drop(owner) },
        }
    }
}

/// A registration and the buffer it covers, shared by the pieces of one
/// region. Each piece owns a disjoint range of the buffer.
struct Registration {
    // Field order is drop order: deregister (in `Drop`) before freeing.
    mr: NonNull<ffi::ibv_mr>,
    /// The buffer: its bytes are reached through this pointer only.
    buf: NonNull<u8>,
    len: usize,
    /// What holds `buf`, given back in `Drop` after deregistration.
    backing: Backing,
    access: Access,
    pd: ProtectionDomain,
    _permit: Option<OwnedMrPermit>,
}

// SAFETY: the registration owns its buffer and its `ibv_mr`; verbs calls
// on `mr` are thread-safe, and the buffer's bytes are only reached through
// the piece that owns them.
unsafe impl Send for Registration {}
// SAFETY: shared references read only the keys, length and access.
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `mr` is our registration, deregistered once. No piece is
        // left (this is the last reference), so no work request uses the
        // buffer (a queue pair owns the pieces in flight).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // The NIC may still map the buffer: leak it rather than free it.
            tracing::error!(rc, "ibv_dereg_mr failed; leaking the buffer");
            return;
        }
        // SAFETY: deregistered; `backing` holds `buf` as registered, and
        // is freed once, here.
        unsafe { self.backing.free(self.buf, self.len) };
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len)
            .field("offset", &self.offset)
            .field("registered_len", &self.reg.len)
            .field("lkey", &self.lkey())
            .field("access", &self.reg.access)
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

/// What a failed `ibv_reg_mr` of `len` bytes with `access` on `device`
/// means, from its `errno` (`source`).
pub(crate) fn reg_mr_error(source: io::Error, len: usize, access: Access, device: String) -> Error {
    // A device without memory windows refuses the right to bind them.
    let errno = rustix::io::Errno::from_io_error(&source);
    let refused = [rustix::io::Errno::INVAL, rustix::io::Errno::OPNOTSUPP];
    if access.lendable && errno.is_some_and(|e| refused.contains(&e)) {
        return Error::MemoryWindowsUnsupported { device };
    }
    if source.raw_os_error() == Some(12) {
        // ENOMEM from pinning: almost always the memlock limit.
        if let Some(limit) = memlock_limit() {
            return Error::MemlockTooLow {
                limit,
                needed: len as u64,
            };
        }
    }
    Error::Verbs {
        call: "ibv_reg_mr",
        device,
        source,
    }
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

    /// Registers `mem`, memory the caller owns (a mapping, huge pages),
    /// with `access`: the region keeps `mem` until the registration is
    /// released (see [`RegisterMemory`]). On error `mem` is dropped.
    pub fn register_memory(
        &self,
        mem: impl RegisterMemory,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        self.register_owned(Box::new(mem), access, None)
    }

    /// [`register_memory`](Self::register_memory) for `tenant`: admitted
    /// against its memory-region quota and registration rate first, as
    /// [`register_for`](Self::register_for).
    pub fn register_memory_for(
        &self,
        tenant: &TenantHandle,
        mem: impl RegisterMemory,
        access: Access,
    ) -> Result<MemoryRegion, Error> {
        let permit = tenant.acquire_mr(mem.len() as u64)?.into_owned();
        self.register_owned(Box::new(mem), access, Some(permit))
    }

    fn register_owned(
        &self,
        mut mem: Box<dyn RegisterMemory>,
        access: Access,
        permit: Option<OwnedMrPermit>,
    ) -> Result<MemoryRegion, Error> {
        let (ptr, len) = (mem.as_mut_ptr(), mem.len());
        let buf = NonNull::new(ptr).ok_or(Error::EmptyRegion)?;
        // SAFETY: `RegisterMemory`'s contract: `len` bytes at `buf`, fixed
        // while `mem` lives, which the registration keeps until after it
        // deregisters.
        unsafe {
            self.register_raw(
                buf,
                len,
                Backing::Owned(ManuallyDrop::new(mem)),
                access,
                permit,
            )
        }
    }

    fn register_inner(
        &self,
        buf: Box<[u8]>,
        access: Access,
        permit: Option<OwnedMrPermit>,
    ) -> Result<MemoryRegion, Error> {
        let len = buf.len();
        let buf = NonNull::new(Box::into_raw(buf).cast::<u8>())
            .expect("a boxed slice's pointer is never null");
        // SAFETY: the box was leaked just above: its `len` bytes are the
        // registration's, freed by it after deregistration.
        unsafe { self.register_raw(buf, len, Backing::Boxed, access, permit) }
    }

    /// Registers the `len` bytes at `buf`, which `backing` holds, and
    /// makes the region that keeps them; on error `backing` gives them
    /// back at once.
    ///
    /// # Safety
    /// The bytes are valid for reads and writes, stay where they are and
    /// are reached by no one else while `backing` is held, and `backing`
    /// is what frees them (for [`Backing::Boxed`], a leaked boxed slice of
    /// `len` bytes at `buf`).
    unsafe fn register_raw(
        &self,
        buf: NonNull<u8>,
        len: usize,
        backing: Backing,
        access: Access,
        permit: Option<OwnedMrPermit>,
    ) -> Result<MemoryRegion, Error> {
        let device = self.context().name().to_string();
        // Nothing registered yet: each early return gives the bytes back.
        let mut backing = backing;
        // SAFETY: the caller's promise for `buf`; once, on an early return.
        let give_back = |b: &mut Backing| unsafe { b.free(buf, len) };
        if len == 0 {
            give_back(&mut backing);
            return Err(Error::EmptyRegion);
        }
        if let Some(limit) = memlock_limit() {
            if len as u64 > limit {
                give_back(&mut backing);
                return Err(Error::MemlockTooLow {
                    limit,
                    needed: len as u64,
                });
            }
        }
        // SAFETY: the caller's promise: `len` bytes at `buf` that this
        // registration keeps (and gives back only after deregistering);
        // the PD is alive.
        let mr =
            unsafe { ffi::ibv_reg_mr(self.raw(), buf.as_ptr().cast(), len, access.flags() as i32) };
        let Some(mr) = NonNull::new(mr) else {
            let source = crate::error::verbs_errno();
            give_back(&mut backing);
            return Err(reg_mr_error(source, len, access, device));
        };
        tracing::debug!(%device, len, ?access, "registered memory region");
        Ok(MemoryRegion {
            reg: Arc::new(Registration {
                mr,
                buf,
                len,
                backing,
                access,
                pd: self.clone(),
                _permit: permit,
            }),
            offset: 0,
            len,
        })
    }
}

impl MemoryRegion {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: empty regions cannot be registered or split off.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte of this piece.
    pub(crate) fn base(&self) -> *mut u8 {
        // SAFETY: `offset < reg.len` (a piece is never empty and lies in
        // the buffer), so the result is in bounds of the allocation.
        unsafe { self.reg.buf.as_ptr().add(self.offset) }
    }

    /// The bytes, unless the region grants remote write access: a peer
    /// may then change it at any moment, so it is read with
    /// [`read`](Self::read) / [`read_into`](Self::read_into) instead.
    pub fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: this piece owns `len` bytes at `base` alone (pieces are
        // disjoint), no work request uses them (the queue pair would own
        // the piece), and no peer may write them (checked).
        (!self.reg.access.remote_write)
            .then(|| unsafe { std::slice::from_raw_parts(self.base(), self.len) })
    }

    /// The bytes, to fill before sending, unless the region grants remote
    /// write access (then use [`write_at`](Self::write_at)).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow
        // exclusive.
        (!self.reg.access.remote_write)
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.base(), self.len) })
    }

    /// Copies the bytes at `offset` into `buf`, reading each byte once
    /// (volatile), as memory a peer may write must be read.
    pub fn read_into(&self, offset: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.check(offset, buf.len())?;
        let base = self.base();
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: `offset + i < len` (checked): in bounds of the bytes
            // this piece owns; a byte read is always valid.
            *b = unsafe { base.add(offset + i).read_volatile() };
        }
        Ok(())
    }

    /// A copy of the whole region (see [`read_into`](Self::read_into)).
    pub fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.read_into(0, &mut out)
            .expect("the whole region is in bounds");
        out
    }

    /// Writes `data` at `offset`, each byte once (volatile).
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.check(offset, data.len())?;
        let base = self.base();
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked) of the bytes this piece owns
            // exclusively (`&mut self`).
            unsafe { base.add(offset + i).write_volatile(b) };
        }
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::LocalRangeOutOfBounds {
                range: offset..offset.saturating_add(len),
                len: self.len,
            }),
        }
    }

    /// Splits the region in two at `at`: this one keeps its first `at`
    /// bytes, the returned piece owns the rest. Both stay registered (one
    /// registration, counted once against the tenant's quota) and may be
    /// posted on their own.
    ///
    /// # Errors
    /// [`Error::LocalRangeOutOfBounds`] unless `0 < at < len` (neither
    /// piece may be empty); the region is unchanged.
    pub fn split_off(&mut self, at: usize) -> Result<MemoryRegion, Error> {
        if at == 0 || at >= self.len {
            return Err(Error::LocalRangeOutOfBounds {
                range: at..self.len,
                len: self.len,
            });
        }
        let rest = MemoryRegion {
            reg: Arc::clone(&self.reg),
            offset: self.offset + at,
            len: self.len - at,
        };
        self.len = at;
        Ok(rest)
    }

    /// The region as pieces of `piece` bytes each (the last may be
    /// shorter), in order: one registration posted as many requests.
    ///
    /// # Errors
    /// [`Error::LocalRangeOutOfBounds`] for a piece size of 0.
    pub fn into_pieces(mut self, piece: usize) -> Result<Vec<MemoryRegion>, Error> {
        if piece == 0 {
            return Err(Error::LocalRangeOutOfBounds {
                range: 0..0,
                len: self.len,
            });
        }
        let mut pieces = Vec::with_capacity(self.len.div_ceil(piece));
        while self.len > piece {
            let rest = self.split_off(piece)?;
            pieces.push(std::mem::replace(&mut self, rest));
        }
        pieces.push(self);
        Ok(pieces)
    }

    /// Joins `next`, the piece that follows this one in the same
    /// registration, back onto it.
    ///
    /// # Errors
    /// Both pieces back, unchanged, if `next` is of another registration
    /// or does not start where this one ends.
    pub fn join(self, next: MemoryRegion) -> Result<MemoryRegion, (MemoryRegion, MemoryRegion)> {
        if !Arc::ptr_eq(&self.reg, &next.reg) || self.offset + self.len != next.offset {
            return Err((self, next));
        }
        Ok(MemoryRegion {
            len: self.len + next.len,
            ..self
        })
    }

    /// Where this piece starts in its registration (0 for a whole region).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The length of the whole registration this piece is part of.
    pub fn registered_len(&self) -> usize {
        self.reg.len
    }

    /// The access it was registered with.
    pub fn access(&self) -> Access {
        self.reg.access
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.reg.pd
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration (alive while any piece is).
        unsafe { self.reg.mr.as_ref().lkey }
    }

    /// The remote key (the whole registration's).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.reg.mr.as_ref().rkey }
    }

    pub(crate) fn addr(&self) -> u64 {
        self.base() as u64
    }

    /// Its registration's verbs object.
    pub(crate) fn raw_mr(&self) -> NonNull<ffi::ibv_mr> {
        self.reg.mr
    }

    /// The descriptor a peer needs to READ or WRITE this region (this
    /// piece), if remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        let access = self.reg.access;
        (access.remote_read || access.remote_write).then(|| RemoteRegion {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        })
    }

    /// Checks that `range` lies in the region and returns its (address, length).
    pub(crate) fn sge(&self, range: &Range<usize>) -> Option<ffi::ibv_sge> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        Some(ffi::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: u32::try_from(range.end - range.start).ok()?,
            lkey: self.lkey(),
        })
    }
}
