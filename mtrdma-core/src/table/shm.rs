//! Memory mappings of POSIX shared-memory objects (and anonymous ones for
//! the embedded, process-local table).

use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::fs::{fchmod, fstat, ftruncate, MemfdFlags, Mode, SealFlags};
use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use rustix::shm;

/// A shared mapping, unmapped on drop. Its memory is only ever accessed
/// through atomics, since other processes write it concurrently.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain memory owned by this value; all access to
// its contents goes through atomic types, which are Sync.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates the shared-memory object `name` (which must not exist) of
    /// `len` zero bytes with permissions `mode`, and maps it read-write.
    pub(crate) fn create(name: &str, len: usize, mode: u32) -> io::Result<Mapping> {
        let fd = shm::open(
            name,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::from_raw_mode(mode),
        )?;
        let result = (|| {
            // shm_open applies the umask; set the mode we were asked for.
            fchmod(&fd, Mode::from_raw_mode(mode))?;
            ftruncate(&fd, len as u64)?;
            Self::map_fd(&fd, len, true)
        })();
        if result.is_err() {
            let _ = shm::unlink(name);
        }
        result
    }

    /// Creates a memory file (`memfd_create`) of `len` zero bytes, private
    /// to this user (mode 0600), that can never shrink or grow: sealed
    /// with `F_SEAL_SHRINK | F_SEAL_GROW`, and `F_SEAL_SEAL` so that the
    /// seals stay. Whoever is handed it may write its bytes, but no holder
    /// can `ftruncate` it under the others' mappings (which would make
    /// their next access fault with SIGBUS). `label` names it in
    /// `/proc/PID/fd` (as `/memfd:LABEL`), where
    /// [`find_memfd`] looks for it. Returns the file and its read-write
    /// mapping.
    pub(crate) fn create_sealed(label: &str, len: usize) -> io::Result<(OwnedFd, Mapping)> {
        let fd = rustix::fs::memfd_create(label, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        fchmod(&fd, Mode::from_raw_mode(0o600))?;
        ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, STATE_SEALS | SealFlags::SEAL)?;
        let map = Self::map_fd(&fd, len, true)?;
        Ok((fd, map))
    }

    /// Maps the existing object `name`, read-write or read-only, whatever
    /// its size (the caller validates the contents).
    pub(crate) fn open(name: &str, writable: bool) -> io::Result<Mapping> {
        Self::from_fd(&open_fd(name, writable)?, writable)
    }

    /// Maps the whole of the shared-memory object `fd` (one handed over
    /// by a coordinator), read-write or read-only.
    pub(crate) fn from_fd(fd: &OwnedFd, writable: bool) -> io::Result<Mapping> {
        let len = usize::try_from(fstat(fd)?.st_size).unwrap_or(0);
        if len == 0 {
            // Nothing to map; an empty object is reported as truncated.
            return Ok(Mapping {
                ptr: NonNull::dangling(),
                len: 0,
                writable,
            });
        }
        Self::map_fd(fd, len, writable)
    }

    /// A process-local shared mapping of `len` zero bytes.
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Ok(Mapping {
                ptr: NonNull::dangling(),
                len: 0,
                writable: true,
            });
        }
        // SAFETY: a fresh anonymous mapping aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
            )?
        };
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
            writable: true,
        })
    }

    fn map_fd(fd: &OwnedFd, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: mapping a shared-memory object at an address of the
        // kernel's choosing aliases no Rust object; the fd may be closed
        // afterwards, the mapping stays valid.
        let ptr = unsafe { mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0)? };
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
            writable,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// A reference to a `T` at `offset`, if it lies inside the mapping and
    /// is aligned.
    ///
    /// # Safety
    /// `T` must be a type made only of atomics (and arrays of them), for
    /// which every bit pattern is valid and which may be shared, and if
    /// the mapping is read-only the caller must only load through it.
    pub(crate) unsafe fn get<T>(&self, offset: usize) -> Option<&T> {
        let end = offset.checked_add(std::mem::size_of::<T>())?;
        if end > self.len {
            return None;
        }
        // SAFETY: `offset + size_of::<T>() <= len`, so the pointer is in
        // the mapping.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        if (ptr as usize) % std::mem::align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: in bounds and aligned (checked above); every bit pattern
        // is a valid `T` and `T` is only atomics (the caller's promise); the
        // mapping lives as long as `&self`.
        Some(unsafe { &*ptr.cast::<T>() })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: `ptr`/`len` are our own mapping, unmapped once; no
        // reference into it outlives `self` (they borrow from it).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Opens the existing object `name`, read-write or read-only.
pub(crate) fn open_fd(name: &str, writable: bool) -> io::Result<OwnedFd> {
    let flags = if writable {
        shm::OFlags::RDWR
    } else {
        shm::OFlags::RDONLY
    };
    Ok(shm::open(name, flags, Mode::empty())?)
}

/// The owner and permission bits of the object behind `fd`.
pub(crate) fn owner_and_mode(fd: &OwnedFd) -> io::Result<(u32, u32)> {
    let st = fstat(fd)?;
    Ok((st.st_uid, st.st_mode & 0o7777))
}

/// The seals a table's state file must carry: it can neither shrink nor
/// grow.
pub(crate) const STATE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// The inode number of the file behind `fd`.
pub(crate) fn inode(fd: &OwnedFd) -> io::Result<u64> {
    Ok(fstat(fd)?.st_ino)
}

/// Whether the file behind `fd` carries every seal of [`STATE_SEALS`].
pub(crate) fn sealed(fd: &OwnedFd) -> bool {
    rustix::fs::fcntl_get_seals(fd).is_ok_and(|s| s.contains(STATE_SEALS))
}

/// Finds memory files that live processes hold open: for each `(label,
/// inode)` of `wanted`, the file of that label and inode, opened
/// read-write through a holder's `/proc/PID/fd` entry (which the kernel
/// allows to the holder's own user and to root). Nothing else is trusted:
/// each must be that inode, owned by this user with no access for others,
/// and sealed against shrinking and growing. One pass over `/proc`; a file
/// no process holds (or none this process may look into) is missing from
/// the result.
pub(crate) fn find_memfds(
    wanted: &std::collections::HashMap<String, u64>,
) -> std::collections::HashMap<String, OwnedFd> {
    let mut found = std::collections::HashMap::new();
    if wanted.is_empty() {
        return found;
    }
    let me = rustix::process::geteuid().as_raw();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for proc in procs.flatten() {
        let is_pid = proc
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        let Some(fds) = is_pid
            .then(|| std::fs::read_dir(proc.path().join("fd")).ok())
            .flatten()
        else {
            continue;
        };
        for entry in fds.flatten() {
            let path = entry.path();
            let Ok(target) = std::fs::read_link(&path) else {
                continue;
            };
            // The kernel shows a memory file as `/memfd:LABEL (deleted)`.
            let Some(label) = target
                .to_str()
                .and_then(|t| t.strip_prefix("/memfd:"))
                .and_then(|t| t.strip_suffix(" (deleted)"))
            else {
                continue;
            };
            let Some(&inode) = wanted.get(label) else {
                continue;
            };
            if found.contains_key(label) {
                continue;
            }
            let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            else {
                continue;
            };
            let fd = OwnedFd::from(file);
            let Ok(st) = fstat(&fd) else { continue };
            if st.st_ino == inode && st.st_uid == me && st.st_mode & 0o077 == 0 && sealed(&fd) {
                found.insert(label.to_string(), fd);
            }
        }
    }
    found
}

/// Removes a shared-memory object's name (mappings stay valid).
pub(crate) fn unlink(name: &str) -> io::Result<()> {
    Ok(shm::unlink(name)?)
}
