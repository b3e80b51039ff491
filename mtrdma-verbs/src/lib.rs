//! Safe RDMA verbs for mtrdma.
//!
//! This crate is where mtrdma talks to `libibverbs`. It opens devices,
//! reads their ports and GID tables, and picks a GID that works on RoCE
//! (the IPv4-mapped RoCE v2 GID of the port's network device rather than
//! the link-local entry at index 0, which fails to connect on RoCE).
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

mod completion;
mod device;
mod error;
pub mod exchange;
mod gid;
mod mr;
mod pd;
mod qp;

pub use completion::{Completion, Opcode, WcStatus};
pub use device::{device_names, Context, LinkLayer, Mtu, PortInfo, PortState};
pub use error::Error;
pub use gid::{Gid, GidEntry, GidSelection, GidType};
pub use mr::{Access, MemoryRegion, RemoteRegion};
pub use pd::ProtectionDomain;
pub use qp::{Endpoint, PostError, PreparedQueuePair, QueuePair, QueuePairBuilder, SendOp};
