//! Memory the caller owns, registered (`ProtectionDomain::register_memory`):
//! anonymous mappings, huge pages, a shared-memory file; the registration
//! keeps the memory until its last piece is gone.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mtrdma_verbs::memmap2::{MmapMut, MmapOptions};
use mtrdma_verbs::{Access, Error, ProtectionDomain, QueuePair, RegisterMemory, SendOp, WcStatus};

use super::common::{device_pd, pair, pattern, wait};
use super::tenant;

/// A mapping that says when it is given back.
pub(super) struct Watched {
    map: MmapMut,
    dropped: Arc<AtomicBool>,
}

impl Watched {
    pub(super) fn anonymous(len: usize) -> (Watched, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let map = MmapMut::map_anon(len).expect("an anonymous mapping");
        let watched = Watched {
            map,
            dropped: dropped.clone(),
        };
        (watched, dropped)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

// SAFETY: the bytes are the mapping's, which stays where it is until the
// value (and with it the mapping) is dropped.
unsafe impl RegisterMemory for Watched {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// WRITEs `data` from `a` into `to`, and waits for its completion.
fn write(a: &mut QueuePair, pd: &ProtectionDomain, to: mtrdma_verbs::RemoteRegion, data: Vec<u8>) {
    let len = data.len();
    let src = pd.register(data, Access::LOCAL).unwrap();
    a.post_send(SendOp::Write(to), src, 0..len, 7).unwrap();
    let done = wait(a, 1).pop().unwrap();
    assert_eq!(done.status, WcStatus::Success);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_mapping_is_registered_and_kept_until_its_last_piece_is_dropped() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair(&pd);
    let (mem, dropped) = Watched::anonymous(64 << 10);
    let mut region = pd.register_memory(mem, Access::REMOTE_READ_WRITE).unwrap();
    assert_eq!(region.len(), 64 << 10);
    let last = region.split_off(60 << 10).unwrap();
    let remote = last.remote().unwrap();
    write(&mut a, &pd, remote, pattern(4096, 3));
    assert_eq!(
        last.read(),
        pattern(4096, 3),
        "the peer's WRITE landed in the mapping"
    );
    // A READ from the mapping, back into a heap region.
    let into = pd.allocate(4096, Access::LOCAL).unwrap();
    a.post_send(SendOp::Read(remote), into, 0..4096, 8).unwrap();
    let read = wait(&mut a, 1).pop().unwrap();
    assert_eq!(read.status, WcStatus::Success);
    assert_eq!(read.region.read(), pattern(4096, 3));
    drop(region);
    assert!(
        !dropped.load(Ordering::SeqCst),
        "a piece is left: the mapping stays"
    );
    drop(last);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the last piece took the registration and the mapping with it"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn memory_refused_by_the_tenants_quota_or_empty_is_given_back() {
    let (_ctx, pd) = device_pd();
    let (table, t) = tenant(4, 1 << 20);
    let (mem, dropped) = Watched::anonymous(2 << 20);
    match pd.register_memory_for(&t, mem, Access::LOCAL) {
        Err(Error::Admission(e)) => {
            assert!(e.to_string().contains("memory-region bytes quota"), "{e}")
        }
        other => panic!("2 MiB over a 1 MiB quota: {other:?}"),
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the refused mapping was dropped"
    );
    let (mem, dropped) = Watched::anonymous(1 << 20);
    let region = pd.register_memory_for(&t, mem, Access::LOCAL).unwrap();
    assert_eq!(table.usage().unwrap()[0].mr_bytes.0, 1 << 20);
    drop(region);
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(
        table.usage().unwrap()[0].mr_bytes.0,
        0,
        "the quota came back"
    );
    let empty = MmapMut::map_anon(0).unwrap();
    assert!(matches!(
        pd.register_memory(empty, Access::LOCAL),
        Err(Error::EmptyRegion)
    ));
}

/// Makes sure the kernel has `n` free 2 MiB huge pages, if it can be asked
/// to (as root); says what to do otherwise.
fn huge_pages(n: u64) {
    let path = "/proc/sys/vm/nr_hugepages";
    let free = || {
        std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("HugePages_Free:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    if free() < n {
        let now: u64 = std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _ = std::fs::write(path, (now + n).to_string());
    }
    assert!(
        free() >= n,
        "{n} free 2 MiB huge pages are needed (as root: echo {n} > {path})"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn huge_pages_and_a_shared_memory_file_carry_writes() {
    let (_ctx, pd) = device_pd();
    let (mut a, _b) = pair(&pd);

    huge_pages(2);
    let huge = MmapOptions::new()
        .len(4 << 20)
        .huge(Some(21))
        .map_anon()
        .expect("4 MiB on 2 MiB huge pages");
    let region = pd.register_memory(huge, Access::REMOTE_READ_WRITE).unwrap();
    // A WRITE across the boundary of the two huge pages.
    let across = region
        .remote()
        .unwrap()
        .slice((2 << 20) - 100, 200)
        .unwrap();
    write(&mut a, &pd, across, pattern(200, 9));
    let mut got = vec![0u8; 200];
    region.read_into((2 << 20) - 100, &mut got).unwrap();
    assert_eq!(got, pattern(200, 9));

    // A memfd: memory another process could map too. A second mapping of
    // the same file sees what the NIC wrote into the registered one.
    let fd: OwnedFd = rustix::fs::memfd_create("mtrdma-test", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    let file = std::fs::File::from(fd);
    file.set_len(64 << 10).unwrap();
    // SAFETY: the file is this test's alone, and the second mapping is
    // only read after the WRITE into the first completed.
    let (shared, view) = unsafe { (MmapMut::map_mut(&file), MmapMut::map_mut(&file)) };
    let (shared, view) = (shared.unwrap(), view.unwrap());
    let region = pd
        .register_memory(shared, Access::REMOTE_READ_WRITE)
        .unwrap();
    let to = region.remote().unwrap().slice(8192, 4096).unwrap();
    write(&mut a, &pd, to, pattern(4096, 11));
    assert_eq!(&view[8192..8192 + 4096], &pattern(4096, 11)[..]);
}
