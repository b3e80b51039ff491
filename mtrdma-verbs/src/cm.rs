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

use std::fmt;
use std::io;
use std::net::SocketAddr;
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

mod id;
use id::{event_name, Id, SockAddr};

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
        source: crate::error::verbs_errno(),
    }
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
