//! What every entry point from C goes through: no panic unwinds into C,
//! and a wrapper that libibverbs itself calls from inside another (one
//! exported function built on another) passes straight through, so that
//! nothing is admitted twice.

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ffi::set_errno;
use crate::tenant::say_once;

thread_local! {
    /// Whether this thread is inside one of the library's wrappers.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Held while a wrapper runs on this thread.
#[derive(Debug)]
pub(crate) struct Inside(());

impl Inside {
    /// `None` when this thread is already inside a wrapper (libibverbs
    /// calling its own exported functions): the caller then passes the
    /// call through.
    pub(crate) fn enter() -> Option<Inside> {
        INSIDE.with(|inside| (!inside.replace(true)).then_some(Inside(())))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|inside| inside.set(false));
    }
}

/// Runs `f` for the C function `name`; a panic (a bug of this library)
/// is said once on stderr and returns `failed` with `errno` `EIO`, never
/// unwinding into the program.
pub(crate) fn entry<T>(name: &str, failed: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            say_once(
                &format!("panic:{name}"),
                &format!("internal error in {name}: {what}; the call failed with EIO"),
            );
            set_errno(libc::EIO);
            failed
        }
    }
}

/// [`entry`] for functions that return an `int` error code.
pub(crate) fn entry_rc(name: &str, f: impl FnOnce() -> c_int) -> c_int {
    entry(name, libc::EIO, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_c_error_and_nesting_passes_through() {
        let rc = entry_rc("ibv_test", || panic!("boom"));
        assert_eq!(rc, libc::EIO);
        assert_eq!(crate::ffi::errno(), libc::EIO);
        let outer = Inside::enter().expect("the first wrapper on the thread");
        assert!(Inside::enter().is_none(), "a nested wrapper passes through");
        drop(outer);
        assert!(Inside::enter().is_some());
    }
}
