//! Safe RDMA verbs for mtrdma.
//!
//! This crate is where mtrdma talks to `libibverbs`: devices, ports and
//! GIDs (choosing the IPv4-mapped RoCE v2 GID rather than the link-local
//! entry at index 0, which fails to connect on RoCE), protection domains,
//! memory regions that own their buffer, and reliable-connected queue pairs
//! whose posted buffers belong to the queue pair until their completion is
//! polled. [`ScheduledQueuePair`] routes sends through mtrdma's per-tenant
//! scheduler (chunking, bounded NIC occupancy, shared rate limits), and
//! queue pair creation and memory registration can be admitted against a
//! tenant's quota ([`QueuePairBuilder::tenant`],
//! [`ProtectionDomain::register_for`]). A scheduled queue pair is
//! scheduled as the tenant it was created for; one created without a
//! tenant is scheduled only when a tenant of this process is named
//! explicitly ([`Tenancy`]), never as tenant 0 by accident. A queue pair built with
//! [`completion_events(true)`](QueuePairBuilder::completion_events) can
//! sleep until its next completion ([`QueuePair::poll_wait`],
//! [`ScheduledQueuePair::poll_wait`], [`UdQueuePair::poll_wait`]) rather
//! than spin on `poll`, so many tenants can share a few CPUs.
//!
//! Servers share receive and completion queues: queue pairs built with
//! [`srq`](QueuePairBuilder::srq) take their receives from one
//! [`SharedReceiveQueue`] (refilled from its reserve on the device's limit
//! event), and a [`SharedCompletionQueue`] holds a server thread's RC queue
//! pairs on one completion queue and one completion channel, routing each
//! completion to its queue pair ([`SharedCompletion::qpn`]).
//!
//! Two queue pairs on one device, connected to each other: WRITE a buffer
//! into the peer's region, then READ it back. A posted region belongs to
//! the queue pair until its completion is polled, which hands it back.
//!
//! ```no_run
//! use mtrdma_verbs::{Access, Completion, Context, PollCompletions, QueuePair, SendOp};
//!
//! fn wait(qp: &mut QueuePair) -> Result<Completion, mtrdma_verbs::Error> {
//!     let mut done = Vec::new();
//!     while done.is_empty() {
//!         qp.poll(&mut done)?;
//!     }
//!     Ok(done.remove(0))
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open_first_active()?; // or Context::open("rxe0")
//! let pd = ctx.alloc_pd()?;
//! let (a, b) = (pd.queue_pair().build()?, pd.queue_pair().build()?);
//! // Across hosts, swap endpoints with mtrdma_verbs::exchange over TCP.
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let mut a = a.connect(&eb)?;
//! let _b = b.connect(&ea)?;
//!
//! let target = pd.allocate(4096, Access::REMOTE_READ_WRITE)?;
//! let remote = target.remote().expect("remote access was granted");
//! let mut src = pd.allocate(4096, Access::LOCAL)?;
//! src.write_at(0, &[7; 4096])?;
//! a.post_send(SendOp::Write(remote), src, 0..4096, 1)?;
//! let written = wait(&mut a)?;
//! assert!(written.status.is_success());
//!
//! let back = pd.allocate(4096, Access::LOCAL)?;
//! a.post_send(SendOp::Read(remote), back, 0..4096, 2)?;
//! let read = wait(&mut a)?;
//! assert!(read.region.read().iter().all(|&b| b == 7));
//! # Ok(())
//! # }
//! ```
//!
//! Devices, ports and GIDs:
//!
//! ```no_run
//! use mtrdma_verbs::{Context, GidSelection};
//!
//! # fn main() -> Result<(), mtrdma_verbs::Error> {
//! let ctx = Context::open_first_active()?;
//! for port in ctx.ports()? {
//!     println!("{} port {}: {}", ctx.name(), port.number, port.state);
//! }
//! let gid = ctx.select_gid(1, GidSelection::Auto)?;
//! println!("using GID index {} ({})", gid.index, gid.gid);
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(unused_imports))))]

mod macros;

mod async_event;
#[cfg(feature = "tokio")]
pub mod asynchronous;
#[cfg(feature = "rdmacm")]
pub mod cm;
mod completion;
mod device;
mod error;
mod events;
pub mod exchange;
// The preload library's data path (the same engine over a queue pair and
// memory a program created itself): unsafe functions that only it calls,
// not part of the library's API.
#[doc(hidden)]
pub mod foreign;
mod gid;
mod lease;
mod mr;
mod pd;
mod poll;
mod progress;
pub use mtrdma_core::registry;
mod qp;
pub mod scheduled;
mod slab;
pub mod srq;
// Null sinks for mtrdma's benches, tests and fuzz targets: not part of
// the API (`test-util` feature).
#[cfg(any(test, feature = "test-util"))]
#[doc(hidden)]
pub mod testing;
mod ud;

pub use completion::{Completion, Opcode, WcStatus};
pub use device::{device_names, Context, LinkLayer, Mtu, PortInfo, PortState};
pub use error::Error;
pub use gid::{Gid, GidEntry, GidSelection, GidType};
pub use lease::Lease;
/// Memory mappings (files, shared memory, huge pages) to register with
/// [`ProtectionDomain::register_memory`]: the version this crate implements
/// [`RegisterMemory`] for.
pub use memmap2;
pub use mr::{Access, MemoryRegion, RegisterMemory, RemoteRegion};
pub use pd::ProtectionDomain;
pub use poll::PollCompletions;
pub use progress::ProgressThread;
pub use qp::{
    BatchError, Endpoint, GatherError, PostBatch, PostError, PreparedQueuePair, QueuePair,
    QueuePairBuilder, SendOp, SharedCompletion, SharedCompletionQueue,
    SharedCompletionQueueBuilder, ATOMIC_BYTES, MAX_RNR_RETRY,
};
pub use scheduled::{
    DefaultScheduler, PieceRef, PieceScheduler, ScheduleConfig, ScheduledBatch, ScheduledQueuePair,
    ScheduledUdQueuePair, SharedConfig, SharedScheduler, Tenancy, WindowState,
};
pub use srq::{SharedReceiveQueue, SharedReceiveQueueBuilder};
pub use ud::{
    AddressHandle, UdBatch, UdCompletion, UdEndpoint, UdQueuePair, UdQueuePairBuilder, UdSource,
    DEFAULT_QKEY, GRH_BYTES,
};
