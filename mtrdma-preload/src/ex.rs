//! The extended posting API (`ibv_wr_start`, `ibv_wr_rdma_write`,
//! `ibv_wr_set_sge`, ..., `ibv_wr_complete`): inline functions that call
//! through the `struct ibv_qp_ex` of the queue pair. For a scheduled queue
//! pair the library puts its own functions there: they build the
//! session's requests as the provider would, and `ibv_wr_complete` hands
//! them to the same engine as `ibv_post_send`, all of them or (when the
//! send queue has no room for all) none, returning the `errno`.
//! `ibv_wr_abort` drops the session.
//!
//! Operations the engine does not schedule (memory-window binds, local
//! and send invalidations, TSO, XRC, atomic writes) fail the session at
//! `ibv_wr_complete` with `EOPNOTSUPP`, said once on stderr.

use std::ffi::{c_int, c_void};

use mtrdma_verbs::foreign::{ForeignSend, ForeignUd, Local};
use mtrdma_verbs::{RemoteRegion, SendOp};

use crate::datapath::{qp_of, submit, Qp};
use crate::ffi::{self, sys, QpEx};
use crate::guard::entry;
use crate::tenant::say_once;

/// A session's requests, as built so far.
#[derive(Debug, Default)]
pub(crate) struct Session {
    reqs: Vec<ForeignSend>,
    error: Option<c_int>,
}

/// Puts the library's functions in `qp`'s extended structure, if it has
/// one and the queue pair is scheduled.
///
/// # Safety
/// `qp` must be a queue pair the provider just created, not yet seen by
/// the program.
pub(crate) unsafe fn created(qp: *mut sys::ibv_qp) {
    if qp_of(qp as usize).is_none() {
        return;
    }
    let Some(to_ex) = ffi::real().and_then(|r| r.qp_to_qp_ex) else {
        return;
    };
    // SAFETY: libibverbs' own function on a live queue pair.
    let x = unsafe { to_ex(qp) };
    if x.is_null() {
        return;
    }
    // SAFETY: the queue pair's extended structure, laid out as the
    // installed headers say (checked at compile time), not yet used.
    let x = unsafe { &mut *x };
    if x.wr_start.is_none() {
        return;
    }
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_bind_mw = Some(unsupported_bind_mw);
    x.wr_local_inv = Some(unsupported_u32);
    x.wr_send_inv = Some(unsupported_u32);
    x.wr_send_tso = Some(unsupported_tso);
    x.wr_set_xrc_srqn = Some(unsupported_u32);
    x.wr_atomic_write = Some(unsupported_atomic_write);
}

/// Runs `f` on the open session of the scheduled queue pair of `x`.
fn with_session(x: *mut QpEx, name: &str, f: impl FnOnce(&Qp, &mut Session, &QpEx)) {
    entry(name, (), || {
        let Some(q) = qp_of(x as usize) else {
            return;
        };
        let mut inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(session) = inner.session.as_mut() else {
            say_once(
                &format!("nosession:{name}"),
                &format!("{name} outside ibv_wr_start .. ibv_wr_complete: ignored"),
            );
            return;
        };
        // SAFETY: the program's extended queue pair, live while it posts.
        f(&q, session, unsafe { &*x });
    });
}

/// Starts a request of `op` in the session, with the `wr_id` and flags
/// the program set on the queue pair.
fn begin(x: *mut QpEx, name: &str, op: SendOp) {
    with_session(x, name, |q, s, x| {
        use sys::ibv_send_flags as f;
        let flags = x.wr_flags;
        s.reqs.push(ForeignSend {
            wr_id: x.wr_id,
            op,
            local: Local::Empty,
            fence: flags & f::IBV_SEND_FENCE.0 != 0,
            solicited: flags & f::IBV_SEND_SOLICITED.0 != 0,
            signaled: q.signals_all() || flags & f::IBV_SEND_SIGNALED.0 != 0,
            ud: None,
        });
    });
}

/// Sets the local bytes of the session's last request (a remote region's
/// length follows them).
fn set_local(x: *mut QpEx, name: &str, local: Local) {
    with_session(x, name, |_, s, _| {
        let Some(req) = s.reqs.last_mut() else {
            s.error = Some(libc::EINVAL);
            return;
        };
        let len = local.len();
        match &mut req.op {
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => r.len = len,
            _ => {}
        }
        req.local = local;
    });
}

fn remote(rkey: u32, addr: u64) -> RemoteRegion {
    RemoteRegion { addr, len: 0, rkey }
}

unsafe extern "C" fn wr_start(x: *mut QpEx) {
    entry("ibv_wr_start", (), || {
        if let Some(q) = qp_of(x as usize) {
            q.inner.lock().unwrap_or_else(|e| e.into_inner()).session = Some(Session::default());
        }
    });
}

unsafe extern "C" fn wr_complete(x: *mut QpEx) -> c_int {
    entry("ibv_wr_complete", libc::EIO, || {
        let Some(q) = qp_of(x as usize) else {
            return libc::EINVAL;
        };
        let mut inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(session) = inner.session.take() else {
            return libc::EINVAL;
        };
        if let Some(e) = session.error {
            return e;
        }
        if q.room(&inner) < session.reqs.len() {
            return libc::ENOMEM;
        }
        for req in session.reqs {
            if let Err(e) = submit(&q, &mut inner, req) {
                return e;
            }
        }
        0
    })
}

unsafe extern "C" fn wr_abort(x: *mut QpEx) {
    entry("ibv_wr_abort", (), || {
        if let Some(q) = qp_of(x as usize) {
            q.inner.lock().unwrap_or_else(|e| e.into_inner()).session = None;
        }
    });
}

unsafe extern "C" fn wr_rdma_write(x: *mut QpEx, rkey: u32, addr: u64) {
    begin(x, "ibv_wr_rdma_write", SendOp::Write(remote(rkey, addr)));
}

unsafe extern "C" fn wr_rdma_write_imm(x: *mut QpEx, rkey: u32, addr: u64, imm: u32) {
    let op = SendOp::WriteWithImm(remote(rkey, addr), u32::from_be(imm));
    begin(x, "ibv_wr_rdma_write_imm", op);
}

unsafe extern "C" fn wr_rdma_read(x: *mut QpEx, rkey: u32, addr: u64) {
    begin(x, "ibv_wr_rdma_read", SendOp::Read(remote(rkey, addr)));
}

unsafe extern "C" fn wr_send(x: *mut QpEx) {
    begin(x, "ibv_wr_send", SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(x: *mut QpEx, imm: u32) {
    begin(x, "ibv_wr_send_imm", SendOp::SendWithImm(u32::from_be(imm)));
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    x: *mut QpEx,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    let remote = RemoteRegion { addr, len: 8, rkey };
    let op = SendOp::CompareSwap {
        remote,
        compare,
        swap,
    };
    begin(x, "ibv_wr_atomic_cmp_swp", op);
}

unsafe extern "C" fn wr_atomic_fetch_add(x: *mut QpEx, rkey: u32, addr: u64, add: u64) {
    let remote = RemoteRegion { addr, len: 8, rkey };
    begin(x, "ibv_wr_atomic_fetch_add", SendOp::FetchAdd(remote, add));
}

unsafe extern "C" fn wr_set_sge(x: *mut QpEx, lkey: u32, addr: u64, length: u32) {
    let sge = sys::ibv_sge { addr, length, lkey };
    set_local(x, "ibv_wr_set_sge", Local::Sge(sge));
}

unsafe extern "C" fn wr_set_sge_list(x: *mut QpEx, n: usize, list: *const sys::ibv_sge) {
    let list: Box<[sys::ibv_sge]> = if n == 0 || list.is_null() {
        Box::new([])
    } else {
        // SAFETY: the program's list of `n` entries, read now.
        unsafe { std::slice::from_raw_parts(list, n) }.into()
    };
    set_local(x, "ibv_wr_set_sge_list", Local::List(list));
}

unsafe extern "C" fn wr_set_inline_data(x: *mut QpEx, addr: *mut c_void, length: usize) {
    let data: Vec<u8> = if length == 0 || addr.is_null() {
        Vec::new()
    } else {
        // SAFETY: the program's `length` bytes, copied now (it may reuse
        // them when the call returns).
        unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), length) }.into()
    };
    set_local(x, "ibv_wr_set_inline_data", Local::Inline(data));
}

unsafe extern "C" fn wr_set_inline_data_list(
    x: *mut QpEx,
    n: usize,
    list: *const sys::ibv_data_buf,
) {
    let mut data = Vec::new();
    if !list.is_null() {
        for i in 0..n {
            // SAFETY: the program's list of `n` buffers, copied now.
            let b = unsafe { &*list.add(i) };
            if !b.addr.is_null() && b.length > 0 {
                // SAFETY: as above.
                data.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(b.addr.cast::<u8>(), b.length)
                });
            }
        }
    }
    set_local(x, "ibv_wr_set_inline_data_list", Local::Inline(data));
}

unsafe extern "C" fn wr_set_ud_addr(x: *mut QpEx, ah: *mut sys::ibv_ah, qpn: u32, qkey: u32) {
    with_session(x, "ibv_wr_set_ud_addr", |_, s, _| match s.reqs.last_mut() {
        Some(req) => req.ud = Some(ForeignUd { ah, qpn, qkey }),
        None => s.error = Some(libc::EINVAL),
    });
}

/// An operation the engine does not schedule: the session fails.
fn unsupported(x: *mut QpEx, what: &str) {
    with_session(x, what, |_, s, _| {
        say_once(
            &format!("ex:{what}"),
            &format!("{what} is not scheduled by mtrdma: ibv_wr_complete fails with EOPNOTSUPP"),
        );
        s.error = Some(libc::EOPNOTSUPP);
    });
}

unsafe extern "C" fn unsupported_u32(x: *mut QpEx, _: u32) {
    unsupported(x, "an invalidation or XRC operation");
}

unsafe extern "C" fn unsupported_bind_mw(x: *mut QpEx, _: *mut c_void, _: u32, _: *const c_void) {
    unsupported(x, "ibv_wr_bind_mw");
}

unsafe extern "C" fn unsupported_tso(x: *mut QpEx, _: *mut c_void, _: u16, _: u16) {
    unsupported(x, "ibv_wr_send_tso");
}

unsafe extern "C" fn unsupported_atomic_write(x: *mut QpEx, _: u32, _: u64, _: *const c_void) {
    unsupported(x, "ibv_wr_atomic_write");
}
