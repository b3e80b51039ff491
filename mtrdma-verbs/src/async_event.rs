//! A device context's asynchronous events: the file descriptor on which
//! the device reports what happened to its objects outside any work
//! request (a shared receive queue ran below its limit, a queue pair hit a
//! fatal error, a port went down).
//!
//! mtrdma reads them without blocking (the descriptor is made
//! non-blocking) and acknowledges each one at once, so destroying the
//! object an event names never waits for an acknowledgement. The limit
//! event of a shared receive queue refills that queue
//! ([`crate::SharedReceiveQueue`]); the others are logged.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use ibverbs_sys as ffi;

use crate::{Context, Error};

/// The context's asynchronous event descriptor.
pub(crate) fn fd(ctx: &Context) -> RawFd {
    // SAFETY: the context is open while `ctx` lives; `async_fd` is set
    // when it is opened and never changes.
    unsafe { (*ctx.raw()).async_fd }
}

/// Makes the context's asynchronous event descriptor non-blocking, so
/// that [`service`] never blocks (idempotent).
pub(crate) fn make_nonblocking(ctx: &Context) -> Result<(), Error> {
    let verbs = |call, source| Error::Verbs {
        call,
        device: ctx.name().to_string(),
        source,
    };
    // SAFETY: the descriptor stays open as long as the context, which
    // `ctx` keeps open for the whole call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd(ctx)) };
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| {
        verbs(
            "fcntl(F_GETFL) on the asynchronous event descriptor",
            e.into(),
        )
    })?;
    if !flags.contains(rustix::fs::OFlags::NONBLOCK) {
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK).map_err(|e| {
            verbs(
                "fcntl(F_SETFL) on the asynchronous event descriptor",
                e.into(),
            )
        })?;
    }
    Ok(())
}

/// Takes every asynchronous event waiting on `ctx` (its descriptor must
/// be non-blocking, see [`make_nonblocking`]), acknowledges each, refills
/// the shared receive queues whose limit event came, and logs the rest.
/// Returns how many events it took.
pub(crate) fn service(ctx: &Context) -> Result<u32, Error> {
    let mut taken = 0;
    loop {
        // SAFETY: all-zero is a valid value of this plain C struct (a
        // union of pointers and an integer, and an integer).
        let mut event: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `event` is writable.
        let rc = unsafe { ffi::ibv_get_async_event(ctx.raw(), &mut event) };
        if rc != 0 {
            let e = crate::error::verbs_errno();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(taken),
                io::ErrorKind::Interrupted => continue,
                _ => Err(Error::Verbs {
                    call: "ibv_get_async_event",
                    device: ctx.name().to_string(),
                    source: e,
                }),
            };
        }
        taken += 1;
        let kind = event.event_type;
        // The queue is found (and kept alive) before the event is
        // acknowledged: until then its destruction waits.
        let srq = if kind == ffi::IBV_EVENT_SRQ_LIMIT_REACHED {
            // SAFETY: for this event type the element is the SRQ.
            crate::srq::live(unsafe { event.element.srq } as usize)
        } else {
            None
        };
        log(ctx, &event);
        // SAFETY: the event was returned by `ibv_get_async_event` and is
        // acknowledged once.
        unsafe { ffi::ibv_ack_async_event(&mut event) };
        if let Some(srq) = srq {
            srq.on_limit_event();
        }
    }
}

/// Logs an event other than a shared receive queue's limit.
fn log(ctx: &Context, event: &ffi::ibv_async_event) {
    let device = ctx.name();
    let kind = event.event_type;
    let qpn = || {
        // SAFETY: for the queue pair events the element is the queue pair,
        // which lives until the event is acknowledged.
        unsafe { (*event.element.qp).qp_num }
    };
    match kind {
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED => {
            tracing::debug!(device, "shared receive queue below its limit")
        }
        ffi::IBV_EVENT_QP_LAST_WQE_REACHED => {
            tracing::debug!(
                device,
                qpn = qpn(),
                "last receive of a queue pair on an SRQ"
            )
        }
        ffi::IBV_EVENT_QP_FATAL | ffi::IBV_EVENT_QP_REQ_ERR | ffi::IBV_EVENT_QP_ACCESS_ERR => {
            tracing::warn!(device, qpn = qpn(), kind, "queue pair error event")
        }
        ffi::IBV_EVENT_COMM_EST | ffi::IBV_EVENT_SQ_DRAINED => {
            tracing::debug!(device, qpn = qpn(), kind, "queue pair event")
        }
        ffi::IBV_EVENT_CQ_ERR => {
            tracing::error!(device, "completion queue error (overrun?)")
        }
        ffi::IBV_EVENT_SRQ_ERR => tracing::error!(device, "shared receive queue error"),
        ffi::IBV_EVENT_DEVICE_FATAL => tracing::error!(device, "device fatal error"),
        _ => tracing::info!(device, kind, "asynchronous event"),
    }
}
