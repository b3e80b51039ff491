//! The C side: the libibverbs structures the library reads and writes,
//! checked at compile time against the installed rdma-core headers, and
//! the real libibverbs functions, reached with `dlvsym` (never through this
//! library's own link, which would find its own wrappers again).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::mem::offset_of;
use std::sync::OnceLock;

pub(crate) use ibverbs_sys as sys;
use sys::{ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_qp_init_attr, ibv_send_wr, ibv_sge};

/// Sizes and offsets from the installed `<infiniband/verbs.h>` (build.rs).
#[allow(dead_code)]
pub(crate) mod c {
    include!(concat!(env!("OUT_DIR"), "/layout.rs"));
}

/// Fails the build when `$ty`'s field `$field` is not where the installed
/// headers put it.
macro_rules! at {
    ($ty:ty, $($field:ident).+ , $c:expr) => {
        const _: () = assert!(
            offset_of!($ty, $($field).+) == $c,
            concat!(
                stringify!($ty), ".", stringify!($($field).+),
                " is not where the installed <infiniband/verbs.h> puts it"
            )
        );
    };
}

/// Fails the build when `$ty`'s size differs from the installed headers'.
macro_rules! size {
    ($ty:ty, $c:expr) => {
        const _: () = assert!(
            size_of::<$ty>() == $c,
            concat!(
                "size of ",
                stringify!($ty),
                " differs from the installed <infiniband/verbs.h>"
            )
        );
    };
}

// The checks of every structure build.rs lists, by the two macros above.
include!(concat!(env!("OUT_DIR"), "/layout_checks.rs"));

/// `struct ibv_wc` (the bindings keep its fields private; the library
/// writes completions into the application's array).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_qp_ex` as the installed headers lay it out (the bindings'
/// copy comes from a newer rdma-core with more fields: writing those would
/// reach past what an older provider allocated).
#[repr(C)]
#[allow(missing_debug_implementations)]
pub(crate) struct QpEx {
    pub(crate) qp_base: ibv_qp,
    pub(crate) comp_mask: u64,
    pub(crate) wr_id: u64,
    pub(crate) wr_flags: c_uint,
    pub(crate) wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut QpEx, u32, u64, u64, u64)>,
    pub(crate) wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut QpEx, u32, u64, u64)>,
    pub(crate) wr_bind_mw: Option<unsafe extern "C" fn(*mut QpEx, *mut c_void, u32, *const c_void)>,
    pub(crate) wr_local_inv: Option<unsafe extern "C" fn(*mut QpEx, u32)>,
    pub(crate) wr_rdma_read: Option<unsafe extern "C" fn(*mut QpEx, u32, u64)>,
    pub(crate) wr_rdma_write: Option<unsafe extern "C" fn(*mut QpEx, u32, u64)>,
    pub(crate) wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut QpEx, u32, u64, u32)>,
    pub(crate) wr_send: Option<unsafe extern "C" fn(*mut QpEx)>,
    pub(crate) wr_send_imm: Option<unsafe extern "C" fn(*mut QpEx, u32)>,
    pub(crate) wr_send_inv: Option<unsafe extern "C" fn(*mut QpEx, u32)>,
    pub(crate) wr_send_tso: Option<unsafe extern "C" fn(*mut QpEx, *mut c_void, u16, u16)>,
    pub(crate) wr_set_ud_addr: Option<unsafe extern "C" fn(*mut QpEx, *mut sys::ibv_ah, u32, u32)>,
    pub(crate) wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut QpEx, u32)>,
    pub(crate) wr_set_inline_data: Option<unsafe extern "C" fn(*mut QpEx, *mut c_void, usize)>,
    pub(crate) wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut QpEx, usize, *const sys::ibv_data_buf)>,
    pub(crate) wr_set_sge: Option<unsafe extern "C" fn(*mut QpEx, u32, u64, u32)>,
    pub(crate) wr_set_sge_list: Option<unsafe extern "C" fn(*mut QpEx, usize, *const ibv_sge)>,
    pub(crate) wr_start: Option<unsafe extern "C" fn(*mut QpEx)>,
    pub(crate) wr_complete: Option<unsafe extern "C" fn(*mut QpEx) -> c_int>,
    pub(crate) wr_abort: Option<unsafe extern "C" fn(*mut QpEx)>,
    pub(crate) wr_atomic_write: Option<unsafe extern "C" fn(*mut QpEx, u32, u64, *const c_void)>,
}

/// `ibv_context_ops.post_send`.
pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_context_ops.poll_cq` (its entries are `struct ibv_wc`, [`Wc`]).
pub(crate) type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut Wc) -> c_int;
/// `ibv_context_ops.req_notify_cq`.
pub(crate) type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;

/// `struct verbs_context`'s `create_qp_ex` member.
pub(crate) type CreateQpEx =
    unsafe extern "C" fn(*mut ibv_context, *mut sys::ibv_qp_init_attr_ex) -> *mut ibv_qp;

/// `__VERBS_ABI_IS_EXTENDED`: an `ibv_context` inside a `verbs_context`.
const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// `struct verbs_context`'s `create_cq_ex` member (its `ibv_cq_ex` is an
/// `ibv_cq` at the same address, as `ibv_cq_ex_to_cq` says).
pub(crate) type CreateCqEx = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_cq;

/// Where `ctx`'s `verbs_context` keeps the member `offset` bytes into it,
/// if it has one (as `verbs_get_ctx_op` finds it: the structure grows
/// towards lower addresses, and `sz` says how far it reaches).
///
/// # Safety
/// `ctx` must be a context libibverbs opened and has not closed.
unsafe fn verbs_context_slot<F>(ctx: *mut ibv_context, offset: usize) -> Option<*mut Option<F>> {
    // SAFETY: the caller's `ctx` is a live context; `abi_compat` is a
    // plain field of it.
    let compat = unsafe { (*ctx).abi_compat } as usize;
    if compat != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let back = c::VERBS_CONTEXT__CONTEXT - c::VERBS_CONTEXT__SZ;
    let reach = c::VERBS_CONTEXT__CONTEXT - offset;
    // SAFETY: an extended context is the last member of a `verbs_context`
    // (the ABI marker just read says so), whose `sz` lies `back` bytes
    // before it.
    let sz = unsafe { ctx.cast::<u8>().sub(back).cast::<usize>().read() };
    // `sz` counts from the first member the provider knows to the end of
    // the context; the slot must lie within it.
    if sz < c::SIZEOF_VERBS_CONTEXT - offset {
        return None;
    }
    // SAFETY: within the `verbs_context`, as `sz` just showed.
    Some(unsafe { ctx.cast::<u8>().sub(reach).cast::<Option<F>>() })
}

/// Where `ctx`'s `verbs_context` keeps its `create_qp_ex`, if it has one.
///
/// # Safety
/// As [`verbs_context_slot`].
pub(crate) unsafe fn create_qp_ex_slot(ctx: *mut ibv_context) -> Option<*mut Option<CreateQpEx>> {
    // SAFETY: the caller's promise.
    unsafe { verbs_context_slot(ctx, c::VERBS_CONTEXT__CREATE_QP_EX) }
}

/// Where `ctx`'s `verbs_context` keeps its `create_cq_ex`, if it has one.
///
/// # Safety
/// As [`verbs_context_slot`].
pub(crate) unsafe fn create_cq_ex_slot(ctx: *mut ibv_context) -> Option<*mut Option<CreateCqEx>> {
    // SAFETY: the caller's promise.
    unsafe { verbs_context_slot(ctx, c::VERBS_CONTEXT__CREATE_CQ_EX) }
}

/// The real libibverbs functions the library wraps.
#[derive(Debug)]
pub(crate) struct Real {
    pub(crate) open_device: unsafe extern "C" fn(*mut sys::ibv_device) -> *mut ibv_context,
    pub(crate) close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub(crate) reg_mr_iova:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr>,
    pub(crate) reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    pub(crate) reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub(crate) rereg_mr:
        unsafe extern "C" fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub(crate) get_cq_event: unsafe extern "C" fn(
        *mut sys::ibv_comp_channel,
        *mut *mut ibv_cq,
        *mut *mut c_void,
    ) -> c_int,
    pub(crate) ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub(crate) qp_to_qp_ex: Option<unsafe extern "C" fn(*mut ibv_qp) -> *mut QpEx>,
}

/// `name` at `version` in the libraries loaded after this one.
fn next(name: &CStr, version: &CStr) -> Option<*mut c_void> {
    // SAFETY: both strings are NUL-terminated; RTLD_NEXT looks only in the
    // objects after this library, so a wrapper never finds itself.
    let p = unsafe {
        libc::dlvsym(
            libc::RTLD_NEXT,
            name.as_ptr().cast::<c_char>(),
            version.as_ptr().cast::<c_char>(),
        )
    };
    (!p.is_null()).then_some(p)
}

/// `s`, which ends in its only NUL, as a C string.
fn c_str(s: &'static str) -> &'static CStr {
    CStr::from_bytes_with_nul(s.as_bytes()).expect("one NUL, at the end")
}

/// The [`Real`] of the functions `ibv_<field>` its fields name: those of
/// `IBVERBS_<version>`, which every libibverbs the library runs with has
/// (the table is `None` without one of them), and those of later
/// versions, each `None` where missing.
macro_rules! reals {
    (
        $version:literal: $($field:ident),*;
        later: $($later:ident $since:literal),*;
    ) => {
        Real {
            $($field: real!($field, $version)?,)*
            $($later: real!($later, $since),)*
        }
    };
}

/// The real function `ibv_<name>` of `IBVERBS_<version>`, if loaded.
macro_rules! real {
    ($name:ident, $version:literal) => {
        next(
            c_str(concat!("ibv_", stringify!($name), "\0")),
            c_str(concat!("IBVERBS_", $version, "\0")),
        )
        // SAFETY: the symbol is libibverbs' function of that name and
        // version, whose C signature the field's type spells out.
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
    };
}

/// The real functions, found once; `None` when libibverbs is not loaded
/// (or is older than IBVERBS_1.1).
pub(crate) fn real() -> Option<&'static Real> {
    static REAL: OnceLock<Option<Real>> = OnceLock::new();
    REAL.get_or_init(|| {
        Some(reals! {
            "1.1": open_device, close_device, create_qp, destroy_qp, reg_mr, rereg_mr, dereg_mr,
                destroy_cq, get_cq_event, ack_cq_events;
            later: reg_mr_iova "1.7", reg_mr_iova2 "1.8", reg_dmabuf_mr "1.12", qp_to_qp_ex "1.6";
        })
    })
    .as_ref()
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno.
    unsafe { *libc::__errno_location() = value };
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}
