//! rdma_cm's identifiers and event channels, and the socket addresses
//! they take: what the connection types of [`super`] are built on.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use super::{cm_error, ev, sys, ConnectError};
use crate::{Error, QueuePair};

/// A socket address as `struct sockaddr_storage`.
#[repr(C, align(8))]
pub(super) struct SockAddr([u8; 128]);

impl SockAddr {
    pub(super) fn new(addr: SocketAddr) -> SockAddr {
        let mut buf = [0u8; 128];
        match addr {
            SocketAddr::V4(a) => {
                buf[0..2]
                    .copy_from_slice(&(rustix::net::AddressFamily::INET.as_raw()).to_ne_bytes());
                buf[2..4].copy_from_slice(&a.port().to_be_bytes());
                buf[4..8].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                buf[0..2]
                    .copy_from_slice(&(rustix::net::AddressFamily::INET6.as_raw()).to_ne_bytes());
                buf[2..4].copy_from_slice(&a.port().to_be_bytes());
                buf[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                buf[8..24].copy_from_slice(&a.ip().octets());
                buf[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            }
        }
        SockAddr(buf)
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut sys::sockaddr {
        self.0.as_mut_ptr().cast()
    }

    /// The address at `sa` (IPv4 or IPv6; `None` otherwise).
    ///
    /// # Safety
    /// `sa` is null or points at a socket address of its family's size.
    pub(super) unsafe fn read(sa: *const sys::sockaddr) -> Option<SocketAddr> {
        if sa.is_null() {
            return None;
        }
        let bytes = sa.cast::<u8>();
        // SAFETY: the caller's promise: the family field, then as many
        // bytes as the family's address holds.
        unsafe {
            let family = u16::from_ne_bytes([*bytes, *bytes.add(1)]);
            let port = u16::from_be_bytes([*bytes.add(2), *bytes.add(3)]);
            if family == rustix::net::AddressFamily::INET.as_raw() {
                let mut ip = [0u8; 4];
                std::ptr::copy_nonoverlapping(bytes.add(4), ip.as_mut_ptr(), 4);
                Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
            } else if family == rustix::net::AddressFamily::INET6.as_raw() {
                let mut ip = [0u8; 16];
                std::ptr::copy_nonoverlapping(bytes.add(8), ip.as_mut_ptr(), 16);
                Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
            } else {
                None
            }
        }
    }
}

/// An rdma_cm identifier with an event channel of its own: its events
/// come there, and both go when it is dropped.
pub(super) struct Id {
    id: NonNull<sys::rdma_cm_id>,
    channel: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the identifier and its channel are used through `&mut self` (or
// read-only through `&self`); librdmacm's calls on them are thread-safe.
unsafe impl Send for Id {}

/// One event, copied out of rdma_cm's (which is acknowledged at once).
pub(super) struct Event {
    pub(super) kind: u32,
    pub(super) status: i32,
    /// A connection request's new identifier (null for others).
    pub(super) new_id: *mut sys::rdma_cm_id,
    pub(super) private_data: Vec<u8>,
}

impl Id {
    /// A new identifier (TCP port space: reliable connections) on a
    /// channel of its own.
    pub(super) fn new() -> Result<Id, Error> {
        // SAFETY: no arguments; returns null on failure.
        let channel = NonNull::new(unsafe { sys::rdma_create_event_channel() })
            .ok_or_else(|| cm_error("rdma_create_event_channel", "rdma_cm"))?;
        let mut id = std::ptr::null_mut();
        // SAFETY: `channel` is live; `id` is written on success.
        let rc = unsafe {
            sys::rdma_create_id(
                channel.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        let Some(id) = NonNull::new(id).filter(|_| rc == 0) else {
            let error = cm_error("rdma_create_id", "rdma_cm");
            // SAFETY: created above, destroyed once.
            unsafe { sys::rdma_destroy_event_channel(channel.as_ptr()) };
            return Err(error);
        };
        Ok(Id { id, channel })
    }

    /// An identifier a connection request made (on the listener's
    /// channel), moved to a channel of its own.
    pub(super) fn adopt(id: NonNull<sys::rdma_cm_id>) -> Result<Id, Error> {
        // SAFETY: no arguments; returns null on failure.
        let channel = NonNull::new(unsafe { sys::rdma_create_event_channel() });
        let fail = |call| {
            let error = cm_error(call, "rdma_cm");
            // SAFETY: the request's identifier, not yet acknowledged to
            // anyone else: destroyed once, here.
            unsafe { sys::rdma_destroy_id(id.as_ptr()) };
            error
        };
        let Some(channel) = channel else {
            return Err(fail("rdma_create_event_channel"));
        };
        // SAFETY: both are live.
        if unsafe { sys::rdma_migrate_id(id.as_ptr(), channel.as_ptr()) } != 0 {
            // SAFETY: created above, destroyed once.
            unsafe { sys::rdma_destroy_event_channel(channel.as_ptr()) };
            return Err(fail("rdma_migrate_id"));
        }
        Ok(Id { id, channel })
    }

    pub(super) fn raw(&self) -> *mut sys::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The device the identifier is bound to, once it is (after address
    /// resolution, or on a connection request).
    pub(super) fn device(&self) -> Option<String> {
        // SAFETY: the identifier is live; `verbs` and its device are
        // rdma_cm's, alive while the identifier is bound.
        unsafe {
            let verbs = (*self.raw()).verbs;
            if verbs.is_null() || (*verbs).device.is_null() {
                return None;
            }
            let name = (*(*verbs).device).name.as_ptr();
            Some(CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    /// Whether the device is iWARP: its connection manager moves the
    /// queue pair to RTS itself, during the connect or the accept.
    pub(super) fn iwarp(&self) -> bool {
        // SAFETY: as in `device`.
        unsafe {
            let verbs = (*self.raw()).verbs;
            !verbs.is_null()
                && !(*verbs).device.is_null()
                && (*(*verbs).device).transport_type == ffi::IBV_TRANSPORT_IWARP
        }
    }

    pub(super) fn port_num(&self) -> u8 {
        // SAFETY: the identifier is live.
        unsafe { (*self.raw()).port_num }
    }

    /// The peer's address, once known (`rdma_get_peer_addr`, an inline
    /// function of the header).
    pub(super) fn peer(&self) -> Option<SocketAddr> {
        // SAFETY: the identifier is live; the address is a field of it,
        // as large as its family's.
        unsafe {
            let addr = &(*self.raw()).route.addr.__bindgen_anon_2.dst_addr;
            SockAddr::read(addr)
        }
    }

    /// The local address, once bound (`rdma_get_local_addr`).
    pub(super) fn local(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe {
            let addr = &(*self.raw()).route.addr.__bindgen_anon_1.src_addr;
            SockAddr::read(addr)
        }
    }

    /// The next event on its channel, waiting up to `timeout`.
    pub(super) fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        // SAFETY: the channel is live while `self` is; its fd too.
        let fd = unsafe { BorrowedFd::borrow_raw(self.channel.as_ref().fd) };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let wait = rustix::event::Timespec::try_from(left).unwrap_or(rustix::event::Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            });
            match rustix::event::poll(&mut fds, Some(&wait)) {
                Ok(0) => return Ok(None),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(Error::Verbs {
                        call: "poll on the rdma_cm event channel",
                        device: "rdma_cm".into(),
                        source: e.into(),
                    })
                }
            }
        }
        let mut event = std::ptr::null_mut();
        // SAFETY: the channel is live and has an event (it polled readable).
        if unsafe { sys::rdma_get_cm_event(self.channel.as_ptr(), &mut event) } != 0 {
            return Err(cm_error("rdma_get_cm_event", "rdma_cm"));
        }
        // SAFETY: rdma_cm returned a live event; its private data (if any)
        // is `private_data_len` bytes; the event is acknowledged once.
        unsafe {
            let e = &*event;
            let conn = e.param.conn.as_ref();
            let private_data =
                if conn.private_data.is_null() || e.event == ev::RDMA_CM_EVENT_DISCONNECTED {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        usize::from(conn.private_data_len),
                    )
                    .to_vec()
                };
            let out = Event {
                kind: e.event,
                status: e.status,
                new_id: if e.event == ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                    e.id
                } else {
                    std::ptr::null_mut()
                },
                private_data,
            };
            sys::rdma_ack_cm_event(event);
            Ok(Some(out))
        }
    }

    /// Waits for the event `want`; any other event is the step's failure.
    pub(super) fn expect(
        &mut self,
        want: u32,
        timeout: Duration,
        peer: SocketAddr,
        step: &'static str,
    ) -> Result<Event, ConnectError> {
        let Some(event) = self.next_event(timeout)? else {
            return Err(ConnectError::TimedOut {
                peer,
                waited: timeout,
                step,
            });
        };
        if event.kind == want {
            return Ok(event);
        }
        if event.kind == ev::RDMA_CM_EVENT_REJECTED {
            return Err(ConnectError::Rejected {
                peer,
                private_data: event.private_data,
            });
        }
        Err(ConnectError::Failed {
            peer,
            step,
            event: event_name(event.kind),
            status: event.status,
        })
    }

    /// Moves `qp` to `state` with the attributes rdma_cm gives for it.
    pub(super) fn move_qp(
        &self,
        qp: &QueuePair,
        state: ffi::ibv_qp_state::Type,
        to: &'static str,
    ) -> Result<(), Error> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let mut mask = 0;
        // SAFETY: the identifier is live and connecting; `attr` and `mask`
        // are written.
        let rc = unsafe {
            sys::rdma_init_qp_attr(
                self.raw(),
                (&mut attr as *mut ffi::ibv_qp_attr).cast(),
                &mut mask,
            )
        };
        if rc != 0 {
            return Err(cm_error("rdma_init_qp_attr", qp.pd().context().name()));
        }
        qp.modify(
            &mut attr,
            ffi::ibv_qp_attr_mask(mask as u32),
            to,
            "the attributes rdma_cm gives for the connection",
        )
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: both are ours and destroyed once, the identifier first
        // (its events are acknowledged as they are taken).
        unsafe {
            sys::rdma_destroy_id(self.id.as_ptr());
            sys::rdma_destroy_event_channel(self.channel.as_ptr());
        }
    }
}

/// rdma_cm's name of an event.
pub(super) fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { CStr::from_ptr(sys::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}
