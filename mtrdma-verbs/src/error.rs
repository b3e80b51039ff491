//! The error type of the verbs layer.

use std::io;

/// Why a verbs operation failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libibverbs found no RDMA device at all.
    #[error(
        "no RDMA device found: load a driver for your NIC, or create a SoftRoCE device with \
         `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <ifname>` \
         (needs the rdma_rxe kernel module and iproute2's `rdma`)"
    )]
    NoDevice,
    /// A device was asked for by name and does not exist.
    #[error("RDMA device {name:?} not found; available devices: {available:?}")]
    DeviceNotFound {
        /// The name that was asked for.
        name: String,
        /// The devices that do exist.
        available: Vec<String>,
    },
    /// Devices exist but none has an active port.
    #[error(
        "no RDMA device has an active port (devices: {devices:?}); check the link with \
         `ibv_devinfo` and, for SoftRoCE, that its network device is up"
    )]
    NoActivePort {
        /// The devices that were tried.
        devices: Vec<String>,
    },
    /// A port number outside `1..=port_count` was given.
    #[error("device {device} has ports 1..={port_count}; port {port} does not exist")]
    NoSuchPort {
        /// The device.
        device: String,
        /// The port asked for.
        port: u8,
        /// How many ports the device has.
        port_count: u8,
    },
    /// The port is not active, so its GID table is not valid and it cannot carry traffic.
    #[error(
        "port {port} of {device} is {state}, not ACTIVE; bring the link up \
         (for SoftRoCE: `ip link set <ifname> up`) and check `ibv_devinfo`"
    )]
    PortNotActive {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The state it is in.
        state: crate::PortState,
    },
    /// No GID of the port can be used to reach a peer.
    #[error(
        "no usable GID on port {port} of {device}: {reason}; on RoCE give the port's network \
         device an IPv4 address (a RoCE v2 IPv4-mapped GID appears at the next index)"
    )]
    NoUsableGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// What was wrong with the GIDs that exist.
        reason: String,
    },
    /// A libibverbs call failed.
    #[error("{call} failed on {device}: {source}")]
    Verbs {
        /// The verbs call that failed.
        call: &'static str,
        /// The device it was made on.
        device: String,
        /// The OS error it reported.
        #[source]
        source: io::Error,
    },
}
