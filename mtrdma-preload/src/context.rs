//! Device contexts: when the program opens one, the functions libibverbs
//! reaches through the context's tables rather than through exported
//! symbols (inline functions in `<infiniband/verbs.h>`: `ibv_post_send`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_create_qp_ex`) are replaced by
//! the library's; the provider's are kept to call on.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use crate::ffi::{self, sys, CreateCqEx, CreateQpEx, PollCqFn, PostSendFn, ReqNotifyFn};
use crate::guard::entry;
use crate::{control, datapath, ex};

/// `poll_cq` as the bindings declare it (entries of their `ibv_wc`).
type SysPollCqFn = unsafe extern "C" fn(*mut sys::ibv_cq, i32, *mut sys::ibv_wc) -> i32;

/// A context's functions as the provider gave them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Provider {
    pub(crate) post_send: PostSendFn,
    pub(crate) poll_cq: PollCqFn,
    pub(crate) req_notify_cq: ReqNotifyFn,
    pub(crate) create_qp_ex: Option<CreateQpEx>,
    pub(crate) create_cq_ex: Option<CreateCqEx>,
}

static CONTEXTS: RwLock<Option<HashMap<usize, Provider>>> = RwLock::new(None);

/// The provider's functions of context `ctx`, if the library took it over.
#[inline]
pub(crate) fn provider(ctx: *mut sys::ibv_context) -> Option<Provider> {
    let contexts = CONTEXTS.read().unwrap_or_else(PoisonError::into_inner);
    contexts.as_ref()?.get(&(ctx as usize)).copied()
}

/// Takes over `ctx`'s tables (a context just opened). A provider without
/// `post_send`, `poll_cq` or `req_notify_cq` is left alone.
///
/// # Safety
/// `ctx` must be a context libibverbs just opened, not yet used by any
/// other thread.
pub(crate) unsafe fn opened(ctx: *mut sys::ibv_context) {
    // SAFETY: the caller's context is live and ours alone for now.
    let ops = unsafe { &mut (*ctx).ops };
    let (Some(post_send), Some(poll_cq), Some(req_notify_cq)) =
        (ops.post_send, ops.poll_cq, ops.req_notify_cq)
    else {
        return;
    };
    // SAFETY: `ibv_wc` and `ffi::Wc` have the same layout (checked at
    // compile time); only the pointee type of an argument differs.
    let poll_cq = unsafe { std::mem::transmute::<SysPollCqFn, PollCqFn>(poll_cq) };
    let mut provider = Provider {
        post_send,
        poll_cq,
        req_notify_cq,
        create_qp_ex: None,
        create_cq_ex: None,
    };
    // SAFETY: as above.
    if let Some(slot) = unsafe { ffi::create_qp_ex_slot(ctx) } {
        // SAFETY: `slot` lies within the context's `verbs_context` (see
        // `create_qp_ex_slot`).
        provider.create_qp_ex = unsafe { slot.read() };
        if provider.create_qp_ex.is_some() {
            // SAFETY: as above; the same C signature.
            unsafe { slot.write(Some(create_qp_ex)) };
        }
    }
    // SAFETY: as above.
    if let Some(slot) = unsafe { ffi::create_cq_ex_slot(ctx) } {
        // SAFETY: as above.
        provider.create_cq_ex = unsafe { slot.read() };
        if provider.create_cq_ex.is_some() {
            // SAFETY: as above; the same C signature.
            unsafe { slot.write(Some(create_cq_ex)) };
        }
    }
    CONTEXTS
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(ctx as usize, provider);
    ops.post_send = Some(datapath::post_send);
    // SAFETY: as for `poll_cq` above, the other way.
    ops.poll_cq = Some(unsafe {
        std::mem::transmute::<PollCqFn, SysPollCqFn>(datapath::poll_cq as PollCqFn)
    });
    ops.req_notify_cq = Some(datapath::req_notify_cq);
}

/// Forgets `ctx` (about to be closed).
pub(crate) fn closing(ctx: *mut sys::ibv_context) {
    let mut contexts = CONTEXTS.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = contexts.as_mut() {
        c.remove(&(ctx as usize));
    }
}

/// `ibv_create_qp_ex`, admitted against the tenant's quota, its sends
/// scheduled (the extended posting functions included, see [`ex`]).
unsafe extern "C" fn create_qp_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    entry("ibv_create_qp_ex", std::ptr::null_mut(), || {
        let Some(real) = provider(ctx).and_then(|p| p.create_qp_ex) else {
            ffi::set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        };
        let qp = control::admitted(
            || control::admit_qp("ibv_create_qp_ex"),
            // SAFETY: the provider's function, with the program's arguments.
            || unsafe { real(ctx, attr) },
        );
        let errno = ffi::errno();
        if !qp.is_null() {
            // SAFETY: the provider filled `attr` in and created `qp`; the
            // program has not seen it yet.
            unsafe {
                let a = &*attr;
                datapath::created(qp, a.cap.max_send_wr, a.sq_sig_all != 0, a.send_cq);
                ex::created(qp);
            }
        }
        ffi::set_errno(errno);
        qp
    })
}

/// `ibv_create_cq_ex`: the queue is remembered as extended. A program
/// polls such a queue with `ibv_start_poll` and its kin, through the
/// queue's own functions, which the library does not take over: a queue
/// pair whose sends complete there is admitted but not scheduled (see
/// [`datapath::created`]).
unsafe extern "C" fn create_cq_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut std::ffi::c_void,
) -> *mut sys::ibv_cq {
    entry("ibv_create_cq_ex", std::ptr::null_mut(), || {
        let Some(real) = provider(ctx).and_then(|p| p.create_cq_ex) else {
            ffi::set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        };
        // SAFETY: the provider's function, with the program's arguments.
        let cq = unsafe { real(ctx, attr) };
        if !cq.is_null() {
            let errno = ffi::errno();
            datapath::extended_cq(cq);
            ffi::set_errno(errno);
        }
        cq
    })
}
