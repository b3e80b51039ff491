//! Tests of `foreign`.

use super::*;
use crate::RemoteRegion;
use mtrdma_core::{TenantId, TrafficClass};
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// One work request as the fake provider saw it.
#[derive(Debug, Clone)]
struct Seen {
    wr_id: u64,
    opcode: u32,
    flags: u32,
    sges: Vec<(u64, u32, u32)>,
    bytes: Vec<u8>,
    remote: u64,
}

thread_local! {
    static SEEN: RefCell<Vec<Seen>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn fake_post(
    _qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_send_wr,
    _bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // SAFETY: the engine passes one valid work request whose scatter
    // list holds `num_sge` entries.
    let wr = unsafe { &*wr };
    let sges: Vec<_> = (0..wr.num_sge as usize)
        // SAFETY: as above.
        .map(|i| unsafe { *wr.sg_list.add(i) })
        .map(|s| (s.addr, s.length, s.lkey))
        .collect();
    let inline = wr.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0;
    let bytes = if inline {
        sges.iter()
            // SAFETY: inline data is read at the post, as a provider
            // copies it into the work queue entry.
            .flat_map(|&(a, l, _)| unsafe {
                std::slice::from_raw_parts(a as *const u8, l as usize).to_vec()
            })
            .collect()
    } else {
        Vec::new()
    };
    // SAFETY: the `rdma` member is the one a WRITE or READ uses.
    let remote = unsafe { wr.wr.rdma.remote_addr };
    SEEN.with(|s| {
        s.borrow_mut().push(Seen {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.send_flags,
            sges,
            bytes,
            remote,
        })
    });
    0
}

fn seen() -> Vec<Seen> {
    SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

struct Fake {
    _qp: Box<ffi::ibv_qp>,
    fq: ForeignQueuePair,
}

fn fake(chunk: u64) -> Fake {
    // SAFETY: all-zero is a valid `ibv_qp` (only `qp_num` is read).
    let mut qp: Box<ffi::ibv_qp> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
    qp.qp_num = 77;
    let config = ScheduleConfig {
        chunk_bytes: chunk,
        max_pieces_in_flight: 64,
        ..ScheduleConfig::local(TenantId(1), TrafficClass::Bulk)
    };
    // SAFETY: the fake provider never touches the queue pair, which
    // lives as long as `Fake`.
    let fq = unsafe { ForeignQueuePair::new(&mut *qp, fake_post, 128, None, config) }.unwrap();
    Fake { _qp: qp, fq }
}

/// Completes every piece posted so far, in order; returns what the
/// program is given back.
fn complete_all(f: &mut Fake, status: u32) -> (Vec<Seen>, Vec<ForeignDone>) {
    let mut all = Vec::new();
    let mut done = Vec::new();
    loop {
        let posted = seen();
        if posted.is_empty() {
            break;
        }
        for p in &posted {
            assert!(is_piece(p.wr_id), "every piece is marked as mtrdma's");
            f.fq.deliver(p.wr_id, status);
        }
        f.fq.poll(&mut done).unwrap();
        all.extend(posted);
    }
    (all, done)
}

fn write(wr_id: u64, local: Local, signaled: bool) -> ForeignSend {
    let len = local.len();
    ForeignSend {
        wr_id,
        op: SendOp::Write(RemoteRegion {
            addr: 1 << 40,
            len,
            rkey: 9,
        }),
        local,
        fence: true,
        solicited: true,
        signaled,
        ud: None,
    }
}

#[test]
fn a_long_write_goes_in_pieces_and_completes_once_with_the_programs_wr_id() {
    let mut f = fake(4096);
    let sge = sg_entry(0x10_000, 10_000, 5);
    // SAFETY: the fake provider reads no memory of a non-inline request.
    unsafe { f.fq.post(write(42, Local::Sge(sge), true)) }.unwrap();
    let (pieces, done) = complete_all(&mut f, 0);
    assert_eq!(pieces.len(), 3, "{pieces:?}");
    let lens: Vec<u32> = pieces.iter().map(|p| p.sges[0].1).collect();
    assert_eq!(lens, [4096, 4096, 1808]);
    assert_eq!(pieces[1].sges[0].0, 0x10_000 + 4096);
    assert_eq!(pieces[2].remote, (1 << 40) + 8192);
    assert!(pieces.iter().all(|p| p.sges[0].2 == 5));
    use ffi::ibv_send_flags as fl;
    assert_ne!(
        pieces[0].flags & fl::IBV_SEND_FENCE.0,
        0,
        "fence on the first"
    );
    assert_eq!(pieces[1].flags & fl::IBV_SEND_FENCE.0, 0);
    assert_ne!(
        pieces[2].flags & fl::IBV_SEND_SOLICITED.0,
        0,
        "solicited on the last"
    );
    assert_eq!(pieces[0].flags & fl::IBV_SEND_SOLICITED.0, 0);
    assert_eq!(
        done,
        [ForeignDone {
            wr_id: 42,
            status: 0,
            opcode: ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE,
            byte_len: 10_000,
            signaled: true,
            inline: None,
        }]
    );
    assert_eq!(f.fq.queued(), 0);
    assert_eq!(f.fq.posted(), 3);
}

#[test]
fn requests_finish_in_order_unsignaled_ones_marked_and_a_failure_kept() {
    let mut f = fake(4096);
    for (i, signaled) in [(1, false), (2, false), (3, true)] {
        let sge = sg_entry(0x1000 * i, 6000, 1);
        // SAFETY: as above.
        unsafe { f.fq.post(write(i, Local::Sge(sge), signaled)) }.unwrap();
    }
    let (_, done) = complete_all(&mut f, 0);
    let ids: Vec<_> = done.iter().map(|d| (d.wr_id, d.signaled)).collect();
    assert_eq!(ids, [(1, false), (2, false), (3, true)]);

    let sge = sg_entry(0x9000, 9000, 1);
    // SAFETY: as above.
    unsafe { f.fq.post(write(7, Local::Sge(sge), false)) }.unwrap();
    let status = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
    let (_, done) = complete_all(&mut f, status);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!((done[0].wr_id, done[0].status), (7, status));
}

#[test]
fn inline_data_is_copied_and_a_scatter_list_goes_whole() {
    let mut f = fake(4096);
    let mut data = *b"sixteen bytes!!!";
    let req = ForeignSend {
        op: SendOp::Send,
        ..write(5, Local::Inline(data.to_vec()), true)
    };
    // SAFETY: inline: the request owns its bytes.
    unsafe { f.fq.post(req) }.unwrap();
    data.fill(0);
    let list: Box<[ffi::ibv_sge]> = (0..3)
        .map(|i| sg_entry(0x100_000 * (i + 1), 3000, 8))
        .collect();
    // SAFETY: the fake provider reads no memory of a non-inline request.
    unsafe { f.fq.post(write(6, Local::List(list), true)) }.unwrap();
    let (pieces, done) = complete_all(&mut f, 0);
    assert_eq!(pieces.len(), 2, "{pieces:?}");
    assert_eq!(pieces[0].bytes, b"sixteen bytes!!!");
    assert_eq!(pieces[0].opcode, ffi::ibv_wr_opcode::IBV_WR_SEND);
    assert_eq!(
        pieces[1].sges,
        [
            (0x100_000, 3000, 8),
            (0x200_000, 3000, 8),
            (0x300_000, 3000, 8)
        ],
        "9,000 bytes in three entries go whole"
    );
    let ids: Vec<_> = done.iter().map(|d| (d.wr_id, d.byte_len)).collect();
    assert_eq!(ids, [(5, 16), (6, 9000)]);
    assert_eq!(done[0].inline.as_deref(), Some(&b"sixteen bytes!!!"[..]));
}

fn tenant(class: &str) -> TenantHandle {
    let policy = mtrdma_core::Policy::from_toml_str(&format!(
        "[link]\ncapacity = \"100Gbit\"\n[[tenant]]\nid = 1\nname = \"t\"\nclass = \"{class}\"\n"
    ))
    .unwrap();
    mtrdma_core::QuotaTable::embedded(&policy)
        .unwrap()
        .attach(TenantId(1))
        .unwrap()
}

fn fake_for(handle: TenantHandle) -> Fake {
    // SAFETY: all-zero is a valid `ibv_qp` (only `qp_num` is read).
    let mut qp: Box<ffi::ibv_qp> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
    qp.qp_num = 78;
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        ..ScheduleConfig::default()
    };
    // SAFETY: as in `fake`.
    let fq =
        unsafe { ForeignQueuePair::new(&mut *qp, fake_post, 4, Some(handle), config) }.unwrap();
    Fake { _qp: qp, fq }
}

/// A scatter-gather entry of `length` bytes at `addr` in the region `lkey`.
fn sg_entry(addr: u64, length: u32, lkey: u32) -> ffi::ibv_sge {
    ffi::ibv_sge { addr, length, lkey }
}

fn raw_write(wr_id: u64, sge: &mut ffi::ibv_sge) -> ffi::ibv_send_wr {
    // SAFETY: all-zero is a valid work request.
    let mut wr: ffi::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
    wr.wr_id = wr_id;
    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr
}

#[test]
fn a_latency_request_with_nothing_ahead_goes_direct_and_keeps_its_place() {
    let handle = tenant("latency");
    let mut f = fake_for(handle.clone());
    let mut sge = sg_entry(0x1000, 16, 3);
    let wr = raw_write(11, &mut sge);
    // SAFETY: the fake provider reads no memory.
    assert_eq!(unsafe { f.fq.post_direct(&wr, false) }, Direct::Posted);
    let posted = seen();
    assert_eq!(posted.len(), 1);
    assert!(is_piece(posted[0].wr_id) && posted[0].wr_id & ENGINE_BITS == 0);
    use ffi::ibv_send_flags as fl;
    assert_eq!(
        posted[0].flags & fl::IBV_SEND_SIGNALED.0,
        0,
        "unsignaled, as the program posted it"
    );
    assert_eq!(f.fq.queued(), 1);
    // A long one behind it goes through the engine, and after it.
    let big = sg_entry(0x10_000, 9000, 3);
    // SAFETY: as above.
    unsafe { f.fq.post(write(12, Local::Sge(big), true)) }.unwrap();
    let wr13 = raw_write(13, &mut sge);
    // SAFETY: as above.
    let behind = unsafe { f.fq.post_direct(&wr13, true) };
    assert_eq!(
        behind,
        Direct::Engine,
        "not while something waits in the engine"
    );
    // The device reports the direct request with the first signaled
    // completion after it.
    let (_, done) = complete_all(&mut f, 0);
    let ids: Vec<_> = done
        .iter()
        .map(|d| (d.wr_id, d.signaled, d.byte_len))
        .collect();
    assert_eq!(ids, [(11, false, 16), (12, true, 9000)]);
    assert_eq!(f.fq.queued(), 0);
    let usage = handle.table().usage().unwrap();
    assert_eq!(
        usage[0].wrs_posted, 4,
        "one direct request and three pieces"
    );

    // A bulk request of one piece goes direct without a window, never
    // with one; a longer one never.
    let mut f = fake_for(tenant("bulk"));
    // SAFETY: as above.
    assert_eq!(unsafe { f.fq.post_direct(&wr, true) }, Direct::Posted);
    let mut long = sg_entry(0x1000, 8192, 3);
    let wr_long = raw_write(14, &mut long);
    // SAFETY: as above.
    assert_eq!(unsafe { f.fq.post_direct(&wr_long, true) }, Direct::Engine);
    // SAFETY: all-zero is a valid `ibv_qp`.
    let mut qp: Box<ffi::ibv_qp> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        window: Some(std::sync::Arc::new(
            mtrdma_sched::DelayWindowConfig::for_piece(4096),
        )),
        ..ScheduleConfig::default()
    };
    // SAFETY: as in `fake`.
    let mut windowed =
        unsafe { ForeignQueuePair::new(&mut *qp, fake_post, 4, Some(tenant("bulk")), config) }
            .unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { windowed.post_direct(&wr, true) }, Direct::Engine);
    seen();
}

#[test]
fn unsignaled_requests_go_unsignaled_a_few_in_a_row_and_complete_with_a_later_one() {
    let mut f = fake(4096);
    let sge = |i: u64| sg_entry(0x1000 * (i + 1), 64, 1);
    for i in 0..20 {
        // SAFETY: the fake provider reads no memory of these.
        unsafe { f.fq.post(write(i, Local::Sge(sge(i)), false)) }.unwrap();
    }
    // SAFETY: as above.
    unsafe { f.fq.post(write(20, Local::Sge(sge(20)), true)) }.unwrap();
    let posted = seen();
    assert_eq!(posted.len(), 21);
    let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    let asked: Vec<usize> = (0..21)
        .filter(|&i| posted[i].flags & signaled != 0)
        .collect();
    // 64 pieces in the device at most, 128 send slots: 16 in a row.
    assert_eq!(asked, [16, 20]);
    // The device reports only what asked; each report covers the rest.
    let mut done = Vec::new();
    for &i in &asked {
        f.fq.deliver(posted[i].wr_id, 0);
        f.fq.poll(&mut done).unwrap();
    }
    let ids: Vec<u64> = done.iter().map(|d| d.wr_id).collect();
    assert_eq!(ids, (0..21).collect::<Vec<_>>());
    assert!(done.iter().all(|d| d.status == 0));
    assert_eq!(done.iter().filter(|d| d.signaled).count(), 1);
    assert_eq!(f.fq.queued(), 0);
}
