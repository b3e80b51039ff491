//! Connections by IP address and port through rdma_cm (feature
//! `rdmacm`), the way most RDMA software connects (and iWARP devices can
//! only connect).
//!
//! The queue pair is the caller's, built as any other
//! ([`ProtectionDomain::queue_pair`](crate::ProtectionDomain::queue_pair),
//! for a tenant if it is one: admitted against its quota and scheduled as
//! its own); rdma_cm carries the connection's exchange (addresses, queue
//! pair numbers, PSNs, private data), and its attributes move the queue
//! pair to RTR and RTS. A server of many connections accepts them onto
//! one [`SharedCompletionQueue`] ([`ConnectRequest::accept_on`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use mtrdma_verbs::cm::{Connector, Listener};
//! use mtrdma_verbs::Context;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let wait = Duration::from_secs(5);
//! // The server: listen, take a request, accept it with a queue pair of
//! // its own on the device the request came to.
//! let mut listener = Listener::bind("10.0.2.15:7471".parse()?)?;
//! # let ctx = Context::open_first_active()?;
//! # let pd = ctx.alloc_pd()?;
//! let request = listener.next_request(wait)?;
//! println!("{} asks: {:?}", request.peer(), request.private_data());
//! let server = request.accept(pd.queue_pair().build()?, b"welcome", wait)?;
//!
//! // The client: resolve the address, connect a queue pair.
//! let resolved = Connector::resolve("10.0.2.15:7471".parse()?, wait)?;
//! let client = resolved.connect(pd.queue_pair().build()?, b"hello", wait)?;
//! assert_eq!(client.private_data(), b"welcome");
//! # Ok(())
//! # }
//! ```

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use crate::{Error, PreparedQueuePair, QueuePair, QueuePairBuilder, SharedCompletionQueue};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    unsafe_op_in_unsafe_fn,
    unreachable_pub,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/rdmacm.rs"));
}

use sys::rdma_cm_event_type as ev;

/// What can go wrong making a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The peer refused the connection, with its private data (padded
    /// with zeros, as rdma_cm delivers it; empty if nobody listened).
    #[error("{peer} rejected the connection ({} bytes of private data)", private_data.len())]
    Rejected {
        /// Who refused.
        peer: SocketAddr,
        /// What it said.
        private_data: Vec<u8>,
    },
    /// No event came in time.
    #[error("no answer from {peer} within {waited:?} ({step})")]
    TimedOut {
        /// Whom it waited for.
        peer: SocketAddr,
        /// How long.
        waited: Duration,
        /// At which step: resolving the address or the route, connecting.
        step: &'static str,
    },
    /// rdma_cm reported the step failed (an unreachable address, no
    /// route, no listener).
    #[error("{step} with {peer} failed: rdma_cm event {event} (status {status})")]
    Failed {
        /// With whom.
        peer: SocketAddr,
        /// At which step.
        step: &'static str,
        /// The event rdma_cm reported.
        event: String,
        /// Its status (a negative errno, or the peer's reject reason).
        status: i32,
    },
    /// A verbs or rdma_cm call failed, or the queue pair does not fit the
    /// connection.
    #[error(transparent)]
    Verbs(#[from] Error),
}

/// An rdma_cm call's error.
fn cm_error(call: &'static str, device: &str) -> Error {
    Error::Verbs {
        call,
        device: device.to_string(),
        source: io::Error::last_os_error(),
    }
}

/// A socket address as `struct sockaddr_storage`.
#[repr(C, align(8))]
struct SockAddr([u8; 128]);

impl SockAddr {
    fn new(addr: SocketAddr) -> SockAddr {
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

    fn as_mut_ptr(&mut self) -> *mut sys::sockaddr {
        self.0.as_mut_ptr().cast()
    }

    /// The address at `sa` (IPv4 or IPv6; `None` otherwise).
    ///
    /// # Safety
    /// `sa` is null or points at a socket address of its family's size.
    unsafe fn read(sa: *const sys::sockaddr) -> Option<SocketAddr> {
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
struct Id {
    id: NonNull<sys::rdma_cm_id>,
    channel: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the identifier and its channel are used through `&mut self` (or
// read-only through `&self`); librdmacm's calls on them are thread-safe.
unsafe impl Send for Id {}

/// One event, copied out of rdma_cm's (which is acknowledged at once).
struct Event {
    kind: u32,
    status: i32,
    /// A connection request's new identifier (null for others).
    new_id: *mut sys::rdma_cm_id,
    private_data: Vec<u8>,
}

impl Id {
    /// A new identifier (TCP port space: reliable connections) on a
    /// channel of its own.
    fn new() -> Result<Id, Error> {
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
    fn adopt(id: NonNull<sys::rdma_cm_id>) -> Result<Id, Error> {
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

    fn raw(&self) -> *mut sys::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The device the identifier is bound to, once it is (after address
    /// resolution, or on a connection request).
    fn device(&self) -> Option<String> {
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
    fn iwarp(&self) -> bool {
        // SAFETY: as in `device`.
        unsafe {
            let verbs = (*self.raw()).verbs;
            !verbs.is_null()
                && !(*verbs).device.is_null()
                && (*(*verbs).device).transport_type == ffi::IBV_TRANSPORT_IWARP
        }
    }

    fn port_num(&self) -> u8 {
        // SAFETY: the identifier is live.
        unsafe { (*self.raw()).port_num }
    }

    /// The peer's address, once known (`rdma_get_peer_addr`, an inline
    /// function of the header).
    fn peer(&self) -> Option<SocketAddr> {
        // SAFETY: the identifier is live; the address is a field of it,
        // as large as its family's.
        unsafe {
            let addr = &(*self.raw()).route.addr.__bindgen_anon_2.dst_addr;
            SockAddr::read(addr)
        }
    }

    /// The local address, once bound (`rdma_get_local_addr`).
    fn local(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe {
            let addr = &(*self.raw()).route.addr.__bindgen_anon_1.src_addr;
            SockAddr::read(addr)
        }
    }

    /// The next event on its channel, waiting up to `timeout`.
    fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
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
    fn expect(
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
    fn move_qp(
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
fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { CStr::from_ptr(sys::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}

/// The connection parameters for `qp` with `private_data`.
fn conn_param(qp: &QueuePair, private_data: &[u8]) -> Result<sys::rdma_conn_param, Error> {
    let len = u8::try_from(private_data.len()).map_err(|_| Error::PrivateDataTooLong {
        len: private_data.len(),
    })?;
    let attrs = crate::qp::device_attrs(qp.pd().context())?;
    let rd_atomic = u8::try_from(attrs.max_qp_rd_atom.clamp(1, 16)).unwrap_or(1);
    Ok(sys::rdma_conn_param {
        private_data: private_data.as_ptr().cast(),
        private_data_len: len,
        responder_resources: rd_atomic,
        initiator_depth: rd_atomic,
        retry_count: 7,
        rnr_retry_count: 7,
        qp_num: qp.qpn(),
        ..Default::default()
    })
}

/// Checks that `qp` is on the device the connection is bound to.
fn same_device(id: &Id, qp: &QueuePair) -> Result<(), Error> {
    let ours = qp.pd().context().name();
    match id.device() {
        Some(d) if d == ours => Ok(()),
        other => Err(Error::WrongDevice {
            wanted: other.unwrap_or_else(|| "none".into()),
            got: ours.to_string(),
        }),
    }
}

/// A connected queue pair and its rdma_cm identifier: the identifier
/// carries the disconnect, and goes after the queue pair.
pub struct Connection {
    // Field order is drop order: the queue pair before its identifier.
    qp: QueuePair,
    id: Id,
    peer: SocketAddr,
    private_data: Vec<u8>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("qp", &self.qp)
            .finish()
    }
}

impl Connection {
    /// The connected queue pair.
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The private data the peer sent with its request or its accept,
    /// padded with zeros as rdma_cm delivers it
    /// ([`ConnectRequest::private_data`]).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Disconnects: the peer gets a disconnect event
    /// ([`wait_disconnected`](Self::wait_disconnected)); requests still in
    /// flight are flushed.
    pub fn disconnect(&mut self) -> Result<(), Error> {
        // SAFETY: the identifier is live and connected.
        if unsafe { sys::rdma_disconnect(self.id.raw()) } != 0 {
            return Err(cm_error("rdma_disconnect", self.qp.pd().context().name()));
        }
        self.qp.set_error()
    }

    /// Waits up to `timeout` for the peer to disconnect (or for this
    /// side's own disconnect to complete); true if it did.
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.id.next_event(left)? {
                None => return Ok(false),
                Some(e) if e.kind == ev::RDMA_CM_EVENT_DISCONNECTED => {
                    // The peer is gone: nothing more will complete but
                    // flushed.
                    let _ = self.qp.set_error();
                    return Ok(true);
                }
                Some(e) => {
                    tracing::debug!(event = %event_name(e.kind), "rdma_cm event on a connection")
                }
            }
        }
    }

    /// The queue pair and the identifier, taken apart: the connection is
    /// kept (not disconnected) until the returned guard is dropped.
    pub fn into_parts(self) -> (QueuePair, ConnectionGuard) {
        let Connection { qp, id, .. } = self;
        (qp, ConnectionGuard { _id: id })
    }
}

/// A connection accepted onto a shared completion queue
/// ([`ConnectRequest::accept_on`]).
#[derive(Debug)]
pub struct Accepted {
    /// The queue pair's number on the shared completion queue.
    pub qpn: u32,
    /// The peer's address.
    pub peer: SocketAddr,
    /// What the peer sent with its request (padded with zeros to the
    /// transport's size).
    pub private_data: Vec<u8>,
    /// Keeps the connection: drop it after the queue pair is removed.
    pub guard: ConnectionGuard,
}

/// Keeps a connection's rdma_cm identifier (and with it the connection)
/// after its queue pair was taken ([`Connection::into_parts`]); drop it
/// after the queue pair.
pub struct ConnectionGuard {
    _id: Id,
}

impl fmt::Debug for ConnectionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnectionGuard")
    }
}

/// The active side, once the address and the route are resolved: the
/// device to build the queue pair on is known.
pub struct Connector {
    id: Id,
    peer: SocketAddr,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("peer", &self.peer)
            .field("device", &self.device())
            .finish()
    }
}

impl Connector {
    /// Resolves `peer`'s address and the route to it (each step within
    /// `timeout`).
    pub fn resolve(peer: SocketAddr, timeout: Duration) -> Result<Connector, ConnectError> {
        let mut id = Id::new()?;
        let mut dst = SockAddr::new(peer);
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the identifier is live; `dst` outlives the call.
        if unsafe { sys::rdma_resolve_addr(id.raw(), std::ptr::null_mut(), dst.as_mut_ptr(), ms) }
            != 0
        {
            return Err(cm_error("rdma_resolve_addr", "rdma_cm").into());
        }
        id.expect(
            ev::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
            peer,
            "resolving the address",
        )?;
        // SAFETY: the address is resolved.
        if unsafe { sys::rdma_resolve_route(id.raw(), ms) } != 0 {
            return Err(cm_error("rdma_resolve_route", "rdma_cm").into());
        }
        id.expect(
            ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
            timeout,
            peer,
            "resolving the route",
        )?;
        Ok(Connector { id, peer })
    }

    /// The device the route leaves from: the queue pair is built on it.
    pub fn device(&self) -> Option<String> {
        self.id.device()
    }

    /// Its port on that device.
    pub fn port(&self) -> u8 {
        self.id.port_num()
    }

    /// Connects `qp` (built on [`device`](Self::device)) to the peer,
    /// sending `private_data` (at most 56 bytes over RoCE and InfiniBand),
    /// and waits up to `timeout` for the answer.
    pub fn connect(
        mut self,
        qp: PreparedQueuePair,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection, ConnectError> {
        let qp = qp.into_qp();
        same_device(&self.id, &qp)?;
        let mut param = conn_param(&qp, private_data)?;
        // SAFETY: the route is resolved; `param` and its private data
        // outlive the call.
        if unsafe { sys::rdma_connect(self.id.raw(), &mut param) } != 0 {
            let error = cm_error("rdma_connect", qp.pd().context().name());
            // iWARP connects over TCP: nobody listening refuses it at once,
            // where IB and RoCE answer with a reject.
            if let Error::Verbs { source, .. } = &error {
                if source.kind() == io::ErrorKind::ConnectionRefused {
                    return Err(ConnectError::Rejected {
                        peer: self.peer,
                        private_data: Vec::new(),
                    });
                }
            }
            return Err(error.into());
        }
        // IB and RoCE answer with a response, and the queue pair is moved
        // here; iWARP's connection manager moves it and says established.
        let iwarp = self.id.iwarp();
        let want = if iwarp {
            ev::RDMA_CM_EVENT_ESTABLISHED
        } else {
            ev::RDMA_CM_EVENT_CONNECT_RESPONSE
        };
        let answer = self.id.expect(want, timeout, self.peer, "connecting")?;
        if !iwarp {
            self.id
                .move_qp(&qp, ffi::ibv_qp_state::IBV_QPS_RTR, "RTR")?;
            self.id
                .move_qp(&qp, ffi::ibv_qp_state::IBV_QPS_RTS, "RTS")?;
            // SAFETY: the queue pair is in RTS; the identifier is connecting.
            if unsafe { sys::rdma_establish(self.id.raw()) } != 0 {
                return Err(cm_error("rdma_establish", qp.pd().context().name()).into());
            }
        }
        Ok(Connection {
            qp,
            id: self.id,
            peer: self.peer,
            private_data: answer.private_data,
        })
    }
}

/// A passive side: an address and port that takes connection requests.
pub struct Listener {
    id: Id,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.local_addr())
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` (port 0: one rdma_cm picks, see
    /// [`local_addr`](Self::local_addr)).
    pub fn bind(addr: SocketAddr) -> Result<Listener, Error> {
        let id = Id::new()?;
        let mut sa = SockAddr::new(addr);
        // SAFETY: the identifier is live; `sa` outlives the call.
        if unsafe { sys::rdma_bind_addr(id.raw(), sa.as_mut_ptr()) } != 0 {
            return Err(cm_error("rdma_bind_addr", "rdma_cm"));
        }
        // SAFETY: bound.
        if unsafe { sys::rdma_listen(id.raw(), 64) } != 0 {
            return Err(cm_error("rdma_listen", "rdma_cm"));
        }
        Ok(Listener { id })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local()
    }

    /// The next connection request, waiting up to `timeout`.
    pub fn next_request(&mut self, timeout: Duration) -> Result<ConnectRequest, ConnectError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let peer = self
                .local_addr()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            let Some(event) = self.id.next_event(left)? else {
                return Err(ConnectError::TimedOut {
                    peer,
                    waited: timeout,
                    step: "waiting for a connection request",
                });
            };
            if event.kind != ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                tracing::debug!(event = %event_name(event.kind), "rdma_cm event on a listener");
                continue;
            }
            let Some(new) = NonNull::new(event.new_id) else {
                continue;
            };
            let id = Id::adopt(new)?;
            let peer = id.peer().unwrap_or(peer);
            return Ok(ConnectRequest {
                id,
                peer,
                private_data: event.private_data,
            });
        }
    }
}

/// A connection request: accept it with a queue pair, or reject it.
pub struct ConnectRequest {
    id: Id,
    peer: SocketAddr,
    private_data: Vec<u8>,
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("peer", &self.peer)
            .field("device", &self.device())
            .field("private_data", &self.private_data)
            .finish()
    }
}

impl ConnectRequest {
    /// Who asks.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// What it sent with its request, as rdma_cm delivers it: padded with
    /// zeros to the size the transport carries (56 bytes in a request
    /// over RoCE and InfiniBand); a protocol that needs the length carries
    /// it.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The device the request came to: the queue pair is built on it.
    pub fn device(&self) -> Option<String> {
        self.id.device()
    }

    /// Accepts with `qp` (built on [`device`](Self::device)), answering
    /// `private_data`, and waits up to `timeout` for the connection to be
    /// established.
    pub fn accept(
        self,
        qp: PreparedQueuePair,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection, ConnectError> {
        let qp = qp.into_qp();
        let (id, peer, private_data) = self.accept_in_place(&qp, private_data, timeout)?;
        Ok(Connection {
            qp,
            id,
            peer,
            private_data,
        })
    }

    /// Accepts with `qp`, which stays where it is; returns the
    /// connection's identifier, the peer and its private data.
    fn accept_in_place(
        mut self,
        qp: &QueuePair,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(Id, SocketAddr, Vec<u8>), ConnectError> {
        same_device(&self.id, qp)?;
        // iWARP's connection manager moves the queue pair itself.
        if !self.id.iwarp() {
            self.id.move_qp(qp, ffi::ibv_qp_state::IBV_QPS_RTR, "RTR")?;
            self.id.move_qp(qp, ffi::ibv_qp_state::IBV_QPS_RTS, "RTS")?;
        }
        let mut param = conn_param(qp, private_data)?;
        // SAFETY: the request's identifier; `param` outlives the call.
        if unsafe { sys::rdma_accept(self.id.raw(), &mut param) } != 0 {
            return Err(cm_error("rdma_accept", qp.pd().context().name()).into());
        }
        self.id.expect(
            ev::RDMA_CM_EVENT_ESTABLISHED,
            timeout,
            self.peer,
            "accepting",
        )?;
        Ok((self.id, self.peer, self.private_data))
    }

    /// Accepts with a queue pair built from `builder` on `server`, a
    /// shared completion queue (usually with a
    /// [`srq`](crate::QueuePairBuilder::srq), so that a server's
    /// connections take receives from one queue and complete on one
    /// queue and one channel), answering `private_data`, and waits up to
    /// `timeout` for the connection to be established. The queue pair
    /// lives in `server` under the returned [`Accepted::qpn`], posted to
    /// and polled there as one it [`connect`](SharedCompletionQueue::connect)ed;
    /// the connection lasts while [`Accepted::guard`] is kept: drop it
    /// after [`remove`](SharedCompletionQueue::remove)ing the queue pair.
    /// On failure the queue pair is removed again.
    pub fn accept_on(
        self,
        server: &mut SharedCompletionQueue,
        builder: QueuePairBuilder<'_>,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Accepted, ConnectError> {
        let qpn = server.prepare(builder)?.qpn;
        let accepted = match server.prepared(qpn) {
            Some(qp) => self.accept_in_place(qp, private_data, timeout),
            None => Err(Error::NoSuchQueuePair { qpn }.into()),
        };
        match accepted {
            Ok((id, peer, private_data)) => {
                server.mark_connected(qpn);
                Ok(Accepted {
                    qpn,
                    peer,
                    private_data,
                    guard: ConnectionGuard { _id: id },
                })
            }
            Err(error) => {
                let _ = server.remove(qpn);
                Err(error)
            }
        }
    }

    /// Refuses the request, with `private_data` for the peer.
    pub fn reject(self, private_data: &[u8]) -> Result<(), Error> {
        let len = u8::try_from(private_data.len()).map_err(|_| Error::PrivateDataTooLong {
            len: private_data.len(),
        })?;
        // SAFETY: the request's identifier; the data outlives the call.
        if unsafe { sys::rdma_reject(self.id.raw(), private_data.as_ptr().cast(), len) } != 0 {
            return Err(cm_error("rdma_reject", "rdma_cm"));
        }
        Ok(())
    }
}
