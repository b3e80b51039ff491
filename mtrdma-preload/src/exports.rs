//! The functions a preloaded program calls in place of libibverbs' own
//! (exported under libibverbs' names, found before libibverbs by the
//! dynamic linker). Each calls the real function (see [`crate::ffi::real`])
//! around what the library adds.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use crate::control::{self, admitted};
use crate::ffi::{self, real, sys, Real};
use crate::guard::{entry, Inside};
use crate::tenant::{tenancy, Tenancy};
use crate::{context, datapath};

/// `ibv_rereg_mr`'s flag for a new address or length.
const REREG_MR_CHANGE_TRANSLATION: c_int = 1;
/// `ibv_rereg_mr`'s code for a failed command (`errno` says why).
const REREG_MR_ERR_CMD: c_int = -4;

/// The real functions, or `errno` `ENOSYS` if libibverbs is not loaded.
fn real_or_enosys() -> Option<&'static Real> {
    let r = real();
    if r.is_none() {
        ffi::set_errno(libc::ENOSYS);
    }
    r
}

/// [`entry`] for the C function `name` with the real functions: without
/// them `errno` is `ENOSYS` and the call returns `missing` (a panic
/// returns `failed`).
fn with_real<T>(name: &str, failed: T, missing: T, f: impl FnOnce(&'static Real) -> T) -> T {
    entry(name, failed, || match real_or_enosys() {
        Some(real) => f(real),
        None => missing,
    })
}

/// `name`, a registration of `length` bytes through the real function
/// `pick` finds: admitted against the tenant's region bytes and rate.
fn registered<F>(
    name: &str,
    length: usize,
    pick: impl FnOnce(&'static Real) -> Option<F>,
    register: impl FnOnce(F) -> *mut sys::ibv_mr,
) -> *mut sys::ibv_mr {
    entry(name, null_mut(), || {
        let Some(f) = real_or_enosys().and_then(pick) else {
            ffi::set_errno(libc::ENOSYS);
            return null_mut();
        };
        admitted(|| control::admit_mr(name, length), || register(f))
    })
}

/// Destroys an object with `destroy`; on success its permit goes back.
fn released<T>(object: *mut T, destroy: impl FnOnce() -> c_int) -> c_int {
    let rc = destroy();
    if rc == 0 {
        let errno = ffi::errno();
        control::destroyed(object);
        ffi::set_errno(errno);
    }
    rc
}

/// `ibv_open_device`: the context's tables are taken over (see
/// [`crate::context`]) when the program runs as a tenant.
///
/// # Safety
/// As libibverbs' `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut sys::ibv_device) -> *mut sys::ibv_context {
    with_real("ibv_open_device", null_mut(), null_mut(), |real| {
        // SAFETY: the program's argument, to the real function.
        let ctx = unsafe { (real.open_device)(device) };
        if !ctx.is_null() && !matches!(tenancy(), Tenancy::Off) {
            // SAFETY: just opened; the program has not had it yet.
            unsafe { context::opened(ctx) };
        }
        ctx
    })
}

/// `ibv_close_device`.
///
/// # Safety
/// As libibverbs' `ibv_close_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    with_real("ibv_close_device", libc::EIO, -1, |real| {
        context::closing(ctx);
        // SAFETY: the program's argument, to the real function.
        unsafe { (real.close_device)(ctx) }
    })
}

/// `ibv_create_qp`, admitted against the tenant's `max_qps` and
/// `qp_create_rate`.
///
/// # Safety
/// As libibverbs' `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    with_real("ibv_create_qp", null_mut(), null_mut(), |real| {
        let qp = admitted(
            || control::admit_qp("ibv_create_qp"),
            // SAFETY: the program's arguments, to the real function.
            || unsafe { (real.create_qp)(pd, attr) },
        );
        if !qp.is_null() {
            let errno = ffi::errno();
            // SAFETY: created just now with `attr`, which the provider
            // filled in; the program has not seen it yet.
            unsafe {
                let a = &*attr;
                datapath::created(qp, a.cap.max_send_wr, a.sq_sig_all != 0, a.send_cq);
            }
            ffi::set_errno(errno);
        }
        qp
    })
}

/// `ibv_destroy_qp`; the queue pair's quota goes back.
///
/// # Safety
/// As libibverbs' `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    with_real("ibv_destroy_qp", libc::EIO, libc::ENOSYS, |real| {
        datapath::destroying(qp);
        // SAFETY: the program's argument, to the real function.
        released(qp, || unsafe { (real.destroy_qp)(qp) })
    })
}

/// `ibv_destroy_cq`; the library forgets what it held for the queue.
///
/// # Safety
/// As libibverbs' `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    with_real("ibv_destroy_cq", libc::EIO, libc::ENOSYS, |real| {
        // SAFETY: the program's argument, to the real function.
        let rc = unsafe { (real.destroy_cq)(cq) };
        if rc == 0 {
            datapath::cq_destroyed(cq);
        }
        rc
    })
}

/// `ibv_get_cq_event`: a queue the program armed while the library held
/// completions for it has its event at once (see [`crate::datapath`]).
///
/// # Safety
/// As libibverbs' `ibv_get_cq_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    with_real("ibv_get_cq_event", libc::EIO, -1, |real| {
        if let Some((made, context)) = datapath::made_event(channel) {
            // SAFETY: the program's out-pointers.
            unsafe {
                *cq = made;
                *cq_context = context;
            }
            return 0;
        }
        // SAFETY: the program's arguments, to the real function.
        let rc = unsafe { (real.get_cq_event)(channel, cq, cq_context) };
        if rc == 0 {
            // SAFETY: the real function set it.
            datapath::event_taken(unsafe { *cq });
        }
        rc
    })
}

/// `ibv_ack_cq_events`: the events the library made are taken off before
/// the rest reach libibverbs (whose count `ibv_destroy_cq` waits on).
///
/// # Safety
/// As libibverbs' `ibv_ack_cq_events`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, nevents: c_uint) {
    with_real("ibv_ack_cq_events", (), (), |real| {
        let device = datapath::device_events(cq, nevents);
        if device > 0 {
            // SAFETY: the program's argument, to the real function.
            unsafe { (real.ack_cq_events)(cq, device) };
        }
    })
}

/// Exported registration functions, each admitted against
/// `max_mr_bytes` and `mr_reg_rate` for its argument `$length` (see
/// [`registered`])
/// before the real one, picked from the table by `$real`, is called with
/// the program's arguments.
macro_rules! registrations {
    ($(
        $(#[$doc:meta])*
        $name:ident($($arg:ident: $ty:ty),*) admits $length:ident => $real:expr;
    )*) => {
        $(
            $(#[$doc])*
            #[no_mangle]
            pub unsafe extern "C" fn $name(pd: *mut sys::ibv_pd, $($arg: $ty),*) -> *mut sys::ibv_mr {
                registered(
                    stringify!($name),
                    $length,
                    $real,
                    // SAFETY: the program's arguments, to the real function.
                    |f| unsafe { f(pd, $($arg),*) },
                )
            }
        )*
    };
}

registrations! {
    /// `ibv_reg_mr` (what the `ibv_reg_mr` macro calls when the access flags
    /// are constant), admitted against `max_mr_bytes` and `mr_reg_rate`.
    ///
    /// # Safety
    /// As libibverbs' `ibv_reg_mr`.
    ibv_reg_mr(addr: *mut c_void, length: usize, access: c_int)
        admits length => |r| Some(r.reg_mr);
    /// `ibv_reg_mr_iova`, admitted as [`ibv_reg_mr`].
    ///
    /// # Safety
    /// As libibverbs' `ibv_reg_mr_iova`.
    ibv_reg_mr_iova(addr: *mut c_void, length: usize, iova: u64, access: c_int)
        admits length => |r| r.reg_mr_iova;
    /// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro calls otherwise),
    /// admitted as [`ibv_reg_mr`].
    ///
    /// # Safety
    /// As libibverbs' `ibv_reg_mr_iova2`.
    ibv_reg_mr_iova2(addr: *mut c_void, length: usize, iova: u64, access: c_uint)
        admits length => |r| r.reg_mr_iova2;
    /// `ibv_reg_dmabuf_mr`, admitted as [`ibv_reg_mr`].
    ///
    /// # Safety
    /// As libibverbs' `ibv_reg_dmabuf_mr`.
    ibv_reg_dmabuf_mr(offset: u64, length: usize, iova: u64, fd: c_int, access: c_int)
        admits length => |r| r.reg_dmabuf_mr;
}

/// `ibv_rereg_mr`: a new length is admitted before the region changes, and
/// the old length goes back once it has.
///
/// # Safety
/// As libibverbs' `ibv_rereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    with_real("ibv_rereg_mr", libc::EIO, REREG_MR_ERR_CMD, |real| {
        let call = || {
            // SAFETY: the program's arguments, to the real function.
            unsafe { (real.rereg_mr)(mr, flags, pd, addr, length, access) }
        };
        let Some(_inside) = Inside::enter() else {
            return call();
        };
        if flags & REREG_MR_CHANGE_TRANSLATION == 0 {
            return call();
        }
        let permit = match control::admit_mr("ibv_rereg_mr", length) {
            Ok(p) => p,
            Err(errno) => {
                ffi::set_errno(errno);
                return REREG_MR_ERR_CMD;
            }
        };
        let rc = call();
        let errno = ffi::errno();
        if rc == 0 && permit.is_some() {
            control::replaced(mr, permit);
        }
        ffi::set_errno(errno);
        rc
    })
}

/// `ibv_dereg_mr`; the region's bytes go back to the quota.
///
/// # Safety
/// As libibverbs' `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    with_real("ibv_dereg_mr", libc::EIO, libc::ENOSYS, |real| {
        // SAFETY: the program's argument, to the real function.
        released(mr, || unsafe { (real.dereg_mr)(mr) })
    })
}
