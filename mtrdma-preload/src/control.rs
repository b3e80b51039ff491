//! The control path: every queue pair and memory region the program
//! creates is admitted against its tenant's quota (`max_qps`,
//! `max_mr_bytes`) and rates (`qp_create_rate`, `mr_reg_rate`), with the
//! same rules as the Rust API, and given back when the program destroys
//! it.
//!
//! A refusal is what libibverbs gives for such a failure: a null pointer
//! and `errno` (`EAGAIN` for the queue-pair quota and both rates, as the
//! kernel's RDMA cgroup answers for its object limits; `ENOMEM` for
//! memory-region bytes, as the kernel answers past a locked-memory limit;
//! `EPERM` when the program was told to run as a tenant it could not
//! join). Which limit refused it, and how to raise it, is said once on
//! stderr.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use mtrdma_core::table::{OwnedMrPermit, OwnedQpPermit};
use mtrdma_core::{AdmissionError, TenantHandle};

use crate::ffi;
use crate::guard::Inside;
use crate::tenant::{say_once, tenancy, Tenancy};

/// What a verbs object holds of its tenant's quota while it lives (given
/// back when dropped).
#[derive(Debug)]
#[allow(dead_code)] // held for its `Drop`
pub(crate) enum Permit {
    Qp(OwnedQpPermit),
    Mr(OwnedMrPermit),
}

/// The permits of the objects alive, by their address.
static HELD: Mutex<Option<HashMap<usize, Permit>>> = Mutex::new(None);

fn held<R>(f: impl FnOnce(&mut HashMap<usize, Permit>) -> R) -> R {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    f(held.get_or_insert_with(HashMap::new))
}

/// The `errno` of a refusal.
pub(crate) fn errno_of(error: &AdmissionError) -> c_int {
    match error {
        AdmissionError::QuotaExceeded { field, .. } if *field == "max_mr_bytes" => libc::ENOMEM,
        _ => libc::EAGAIN,
    }
}

/// What to say of a refusal, and the key it is said once under.
pub(crate) fn refusal(call: &str, error: &AdmissionError) -> (String, String) {
    let errno = errno_of(error);
    let name = if errno == libc::ENOMEM {
        "ENOMEM"
    } else {
        "EAGAIN"
    };
    match error {
        AdmissionError::QuotaExceeded { field, .. } => (
            format!("{call}:{field}"),
            format!("{call} refused ({name}): {error}"),
        ),
        AdmissionError::RateLimited { operation, .. } => {
            let field = if operation.starts_with("QP") {
                "qp_create_rate"
            } else {
                "mr_reg_rate"
            };
            (
                format!("{call}:{field}"),
                format!("{call} refused ({name}): {error}; or raise {field} in the policy"),
            )
        }
        _ => (
            format!("{call}:other"),
            format!("{call} refused ({name}): {error}"),
        ),
    }
}

/// Admits one object for `call` with `acquire` against the process's
/// tenant: `Ok(None)` when no tenant was asked for, `Err(errno)` when
/// refused (said once on stderr).
fn admit(
    call: &str,
    acquire: impl FnOnce(&TenantHandle) -> Result<Permit, AdmissionError>,
) -> Result<Option<Permit>, c_int> {
    match tenancy() {
        Tenancy::Off => Ok(None),
        Tenancy::Failed(why) => {
            say_once(
                &format!("{call}:unjoined"),
                &format!("{call} refused (EPERM): not running as a tenant ({why})"),
            );
            Err(libc::EPERM)
        }
        Tenancy::Joined(handle) => acquire(handle).map(Some).map_err(|e| {
            let (key, message) = refusal(call, &e);
            say_once(&key, &message);
            errno_of(&e)
        }),
    }
}

/// Admits a queue pair.
pub(crate) fn admit_qp(call: &str) -> Result<Option<Permit>, c_int> {
    admit(call, |h| h.acquire_qp().map(|p| Permit::Qp(p.into_owned())))
}

/// Admits a memory region of `bytes`.
pub(crate) fn admit_mr(call: &str, bytes: usize) -> Result<Option<Permit>, c_int> {
    let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
    admit(call, |h| {
        h.acquire_mr(bytes).map(|p| Permit::Mr(p.into_owned()))
    })
}

/// Creates an object with `create` after admitting it with `admit`; the
/// permit stays with the object. A nested call (libibverbs calling its
/// own exported functions) is created without admission.
pub(crate) fn admitted<T>(
    admit: impl FnOnce() -> Result<Option<Permit>, c_int>,
    create: impl FnOnce() -> *mut T,
) -> *mut T {
    let Some(_inside) = Inside::enter() else {
        return create();
    };
    let permit = match admit() {
        Ok(p) => p,
        Err(errno) => {
            ffi::set_errno(errno);
            return std::ptr::null_mut();
        }
    };
    let object = create();
    let errno = ffi::errno();
    created(object, permit);
    ffi::set_errno(errno);
    object
}

/// The object at `addr` was created (or not, if null) under `permit`: the
/// permit stays with it until it is destroyed, or goes back now.
pub(crate) fn created<T>(addr: *mut T, permit: Option<Permit>) {
    if let (false, Some(permit)) = (addr.is_null(), permit) {
        held(|h| h.insert(addr as usize, permit));
    }
}

/// The object at `addr` was destroyed: its permit goes back.
pub(crate) fn destroyed<T>(addr: *mut T) {
    let permit = held(|h| h.remove(&(addr as usize)));
    drop(permit);
}

/// The memory region at `addr` now holds `permit` in place of the one it
/// held (a re-registration with a new length).
pub(crate) fn replaced<T>(addr: *mut T, permit: Option<Permit>) {
    let old = held(|h| match permit {
        Some(p) => h.insert(addr as usize, p),
        None => h.remove(&(addr as usize)),
    });
    drop(old);
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId};

    fn handle(entry: TenantEntry) -> TenantHandle {
        let policy = Policy::new(LinkConfig::new(12_500_000_000), vec![entry]);
        QuotaTable::embedded(&policy)
            .unwrap()
            .attach(TenantId(1))
            .unwrap()
    }

    /// Asserts that `e`, refusing `call`, gives `errno` and that its
    /// message names `limit`, how to raise it, and `errno_name`.
    fn assert_refusal(e: &AdmissionError, call: &str, limit: &str, errno: c_int, errno_name: &str) {
        assert_eq!(errno_of(e), errno);
        let (key, msg) = refusal(call, e);
        assert_eq!(key, format!("{call}:{limit}"));
        assert!(
            msg.contains(&format!("raise {limit}")) && msg.contains(errno_name),
            "{msg}"
        );
    }

    #[test]
    fn a_refusal_names_its_limit_how_to_raise_it_and_the_errno_verbs_would_give() {
        let h = handle(
            TenantEntry::new(TenantId(1), "t")
                .with_max_qps(1)
                .with_max_mr_bytes(4096)
                .with_mr_reg_rate(RateLimit::new(1, 0)),
        );
        let _qp = h.acquire_qp().unwrap();
        let e = h.acquire_qp().unwrap_err();
        assert_refusal(&e, "ibv_create_qp", "max_qps", libc::EAGAIN, "EAGAIN");
        let e = h.acquire_mr(8192).unwrap_err();
        assert_refusal(&e, "ibv_reg_mr", "max_mr_bytes", libc::ENOMEM, "ENOMEM");
        let _mr = h.acquire_mr(1).unwrap();
        let e = h.acquire_mr(1).unwrap_err();
        assert_refusal(&e, "ibv_reg_mr", "mr_reg_rate", libc::EAGAIN, "");
    }

    #[test]
    fn a_permit_stays_with_its_object_until_it_is_destroyed() {
        let h = handle(TenantEntry::new(TenantId(1), "t").with_max_qps(1));
        let permit = Permit::Qp(h.acquire_qp().unwrap().into_owned());
        // A failed creation (null) gives the permit back at once.
        created(std::ptr::null_mut::<u8>(), Some(permit));
        let permit = Permit::Qp(h.acquire_qp().unwrap().into_owned());
        let mut object = 0u8;
        created(&mut object as *mut u8, Some(permit));
        assert!(h.acquire_qp().is_err(), "the live object holds the quota");
        destroyed(&mut object as *mut u8);
        assert!(h.acquire_qp().is_ok(), "destroying it gave the quota back");
    }
}
