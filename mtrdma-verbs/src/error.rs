//! The error type of the verbs layer.

use std::io;

/// What a verbs call that failed left in `errno`, as the error's source.
/// A provider that fails without setting it would be reported as "Success
/// (os error 0)"; SoftiWARP's `ibv_create_qp` does when the kernel maps
/// the queue at offset 0x90000, which its user library takes for "no
/// key". That is said as it is instead.
pub(crate) fn verbs_errno() -> io::Error {
    errno_said(io::Error::last_os_error())
}

/// `e`, unless it is errno 0: then an error that says no reason was given.
fn errno_said(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(0) {
        io::Error::other("the provider failed without setting errno")
    } else {
        e
    }
}

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
    /// A queue pair state transition failed.
    #[error("moving the queue pair to {to} failed (attributes: {attrs}): {source}{hint}")]
    Transition {
        /// The state it was moving to.
        to: &'static str,
        /// The attributes set in that transition.
        attrs: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
        /// A likely cause, when one is known.
        hint: &'static str,
    },
    /// The tenant's quota refused the operation.
    #[error(transparent)]
    Admission(#[from] mtrdma_core::AdmissionError),
    /// A memory region of zero bytes was asked for.
    #[error("a memory region must hold at least one byte")]
    EmptyRegion,
    /// The memlock limit is below the region's size.
    #[error(
        "registering {needed} bytes needs a memlock limit at least that large, but it is {limit} \
         bytes; raise it (`ulimit -l unlimited`, or `memlock` in /etc/security/limits.conf, or \
         LimitMEMLOCK= for a systemd service)"
    )]
    MemlockTooLow {
        /// The current limit in bytes.
        limit: u64,
        /// The bytes needed.
        needed: u64,
    },
    /// A local range does not lie inside the region.
    #[error("local range {range:?} is outside the memory region of {len} bytes")]
    LocalRangeOutOfBounds {
        /// The range asked for.
        range: std::ops::Range<usize>,
        /// The region's length.
        len: usize,
    },
    /// An RDMA WRITE or READ would reach past the end of the remote region.
    #[error(
        "{len} bytes do not fit the remote region of {} bytes at {:#x}; refused before posting",
        remote.len,
        remote.addr
    )]
    RemoteOutOfBounds {
        /// The remote region given.
        remote: crate::RemoteRegion,
        /// The bytes to transfer.
        len: u64,
    },
    /// An atomic operation's operands are not one 8-byte word.
    #[error(
        "an atomic operation works on one 8-byte word: the local range must be 8 bytes (it is {local_len}) \
         and the remote region at least 8 bytes at an 8-byte aligned address ({} bytes at {:#x}); refused before posting",
        remote.len,
        remote.addr
    )]
    AtomicLayout {
        /// The local range's length.
        local_len: u32,
        /// The remote region given.
        remote: crate::RemoteRegion,
    },
    /// The device has no memory windows of type 2 (or refuses the right
    /// to bind them): pieces cannot be lent ([`Access::lendable`](crate::Access::lendable)).
    #[error(
        "{device} has no memory windows of type 2: pieces cannot be lent; give the peer the \
         region's own remote rights, or lease the piece (MemoryRegion::lease)"
    )]
    MemoryWindowsUnsupported {
        /// The device.
        device: String,
    },
    /// The device refused a request of a kind it does not run: immediate
    /// data on iWARP, atomic operations on a device without them
    /// ([`Context::is_iwarp`](crate::Context::is_iwarp),
    /// [`Context::has_atomics`](crate::Context::has_atomics)).
    #[error("{device} does not run {operation}: {why}")]
    OperationUnsupported {
        /// The device.
        device: String,
        /// What it does not run.
        operation: &'static str,
        /// Why.
        why: &'static str,
    },
    /// The region's registration was not made lendable
    /// ([`Access::lendable`](crate::Access::lendable)).
    #[error("the region was not registered lendable (Access::LENDABLE)")]
    NotLendable,
    /// A piece is lent only with some remote right.
    #[error("a piece is lent with at least one remote right (read, write or atomic)")]
    NoRightsToLend,
    /// No piece is lent on this queue pair under that key.
    #[error("no piece is lent on this queue pair under remote key {rkey:#x}")]
    NotLent {
        /// The key asked for.
        rkey: u32,
    },
    /// Private data for rdma_cm is at most 255 bytes (and 56 over RoCE
    /// and InfiniBand when connecting).
    #[error("{len} bytes of private data: rdma_cm carries at most 255 (56 when connecting over RoCE or InfiniBand)")]
    PrivateDataTooLong {
        /// What was given.
        len: usize,
    },
    /// A queue pair on another device than the connection's.
    #[error(
        "the connection goes through device {wanted}, but the queue pair is on {got}: build it \
         on a protection domain of {wanted}"
    )]
    WrongDevice {
        /// The connection's device.
        wanted: String,
        /// The queue pair's.
        got: String,
    },
    /// The send queue is full.
    #[error("the send queue is full ({depth} work requests in flight); poll completions first")]
    SendQueueFull {
        /// Its depth.
        depth: u32,
    },
    /// The receive queue is full.
    #[error("the receive queue is full ({depth} receives posted)")]
    RecvQueueFull {
        /// Its depth.
        depth: u32,
    },
    /// A UD message is larger than the port's active MTU (UD does not
    /// segment messages).
    #[error(
        "a UD message of {len} bytes exceeds the active MTU of {mtu} bytes; UD carries one \
         packet per message: split it, or use an RC queue pair; refused before posting"
    )]
    MessageTooLarge {
        /// The message length asked for.
        len: usize,
        /// The port's active MTU in bytes.
        mtu: u32,
    },
    /// The device cannot give a UD receive the two scatter/gather entries
    /// mtrdma needs (one for the 40-byte GRH, one for the payload).
    #[error(
        "device {device} allows {max_sge} scatter/gather entries per work request; a UD queue \
         pair needs 2 (the 40-byte GRH goes to an internal buffer, the payload to yours)"
    )]
    TooFewSges {
        /// The device.
        device: String,
        /// The most it allows.
        max_sge: i32,
    },
    /// A queue pair was asked for more scatter/gather entries per send
    /// than its device allows (`max_send_sge` against the device's
    /// `max_sge`).
    #[error(
        "max_send_sge of {asked} is more than device {device} allows ({max} scatter/gather \
         entries per work request)"
    )]
    TooManySges {
        /// The device.
        device: String,
        /// The entries asked for.
        asked: u32,
        /// The most the device allows.
        max: u32,
    },
    /// A gather request named no region.
    #[error("a gather request needs at least one region; refused before posting")]
    EmptyGather,
    /// A gather request named more regions than the queue pair's
    /// `max_send_sge`.
    #[error(
        "a gather request of {parts} regions exceeds this queue pair's max_send_sge of {max}; \
         build it with QueuePairBuilder::max_send_sge, or post fewer regions; refused before \
         posting"
    )]
    TooManyParts {
        /// The regions named.
        parts: usize,
        /// The queue pair's `max_send_sge`.
        max: u32,
    },
    /// A gather request's regions add up to more bytes than one work
    /// request carries (2^32 - 1).
    #[error(
        "a gather request of {len} bytes is longer than one work request carries (4294967295 \
         bytes); refused before posting"
    )]
    GatherTooLong {
        /// The bytes of all its regions.
        len: u64,
    },
    /// An atomic operation was given several regions: its old value goes
    /// into one 8-byte range.
    #[error(
        "an atomic operation returns its word into one 8-byte range, not a gather list of \
         {parts} regions; refused before posting"
    )]
    AtomicGather {
        /// The regions named.
        parts: usize,
    },
    /// A queue asked for is deeper than the device allows (its
    /// `max_qp_wr`, or `max_cqe` for the completion queue that holds both
    /// queues' completions).
    #[error("{what} of {asked} is more than device {device} allows ({max})")]
    QueueTooDeep {
        /// The device.
        device: String,
        /// Which depth (`max_send_wr`, `max_recv_wr`, or the completion
        /// queue's entries).
        what: &'static str,
        /// The depth asked for.
        asked: u64,
        /// The most the device allows.
        max: u64,
    },
    /// A receive was posted to a queue pair that receives from a shared
    /// receive queue: its own receive queue does not exist.
    #[error(
        "this queue pair receives from a shared receive queue and has no receive queue of its \
         own; post receives to the SharedReceiveQueue it was built with"
    )]
    ReceivesFromSrq,
    /// The device offers no shared receive queues (its `max_srq` is 0).
    #[error("device {device} does not support shared receive queues (max_srq is 0)")]
    SrqUnsupported {
        /// The device.
        device: String,
    },
    /// A shared receive queue's limit is not below its depth.
    #[error(
        "a shared receive queue's limit ({limit}) must be below its depth ({max_wr}); 0 turns \
         the limit event off"
    )]
    SrqLimit {
        /// The limit asked for.
        limit: u32,
        /// The queue's depth.
        max_wr: u32,
    },
    /// A queue pair and a shared receive queue do not carry the same
    /// kind of receive (UD receives take the 40-byte GRH, RC ones do not).
    #[error(
        "a {qp} queue pair cannot receive from a shared receive queue built for {srq} queue \
         pairs; UD queue pairs need one built with `datagrams(true)`, RC ones one without"
    )]
    SrqTransport {
        /// The transport the queue was built for ("UD" or "RC").
        srq: &'static str,
        /// The queue pair's transport.
        qp: &'static str,
    },
    /// An object was used with one of another device context or
    /// protection domain, which the NIC would refuse.
    #[error(
        "the {what} belongs to another {scope} than the {with}; create both from the same \
         {scope} (opening a device twice gives two contexts)"
    )]
    ForeignObject {
        /// What was passed in.
        what: &'static str,
        /// What it was used with.
        with: &'static str,
        /// What they must share: "device context" or "protection domain".
        scope: &'static str,
    },
    /// Adding a queue pair to a shared completion queue would let more
    /// completions be outstanding than the queue holds (an overflow moves
    /// every queue pair on it to the error state).
    #[error(
        "the shared completion queue holds {entries} completions, but with this queue pair \
         {needed} could be outstanding (send queues, receive queues and shared receive queues \
         of its queue pairs); build it with `entries({needed})` or more"
    )]
    CompletionQueueTooSmall {
        /// Its entries.
        entries: u32,
        /// What its queue pairs could have outstanding with the new one.
        needed: u64,
    },
    /// No queue pair of that number is on the shared completion queue.
    #[error("no queue pair {qpn} is on this shared completion queue")]
    NoSuchQueuePair {
        /// The queue pair number asked for.
        qpn: u32,
    },
    /// A send was posted to a queue pair on a shared completion queue
    /// before it was connected.
    #[error("queue pair {qpn} is not connected yet; connect it before posting sends")]
    NotConnected {
        /// The queue pair number.
        qpn: u32,
    },
    /// An address handle was used with a queue pair of another protection
    /// domain (the NIC would fail the send).
    #[error(
        "the address handle belongs to another protection domain than the queue pair; create \
         it from the queue pair (`UdQueuePair::address_handle`) or from its protection domain"
    )]
    ForeignAddressHandle,
    /// `poll_wait` was called on a queue pair built without completion
    /// events.
    #[error(
        "this queue pair has no completion channel to wait on; build it with \
         `completion_events(true)` on its builder to use `poll_wait`, or call `poll`"
    )]
    NoCompletionEvents,
    /// Sleeping on a completion channel failed.
    #[error("waiting for completion events failed (poll(2) on the completion channel): {source}")]
    CompletionWait {
        /// The OS error poll(2) reported.
        #[source]
        source: io::Error,
    },
    /// A queue pair's progress thread stopped on its own (its poll
    /// failed, or it panicked): nothing polls the queue pair any more, so
    /// no request is accepted through it.
    #[error(
        "the progress thread stopped: {reason}; take the queue pair back with \
         `ProgressThread::stop` (it returns the cause) and poll it yourself or start another"
    )]
    ProgressStopped {
        /// What stopped it.
        reason: String,
    },
    /// A queue pair created without a tenant was to be scheduled as the
    /// tenant it was created for.
    #[error(
        "this queue pair was created without a tenant: create it with \
         `QueuePairBuilder::tenant(&handle)` to schedule it as that tenant, or schedule it \
         explicitly without shared limits with `ScheduleConfig::local(id, class)`"
    )]
    NoTenant,
    /// The scheduler's settings are not valid (a chunk size, a weight, a
    /// window's parameters).
    #[error("scheduler settings: {0}")]
    ScheduleConfig(#[source] mtrdma_sched::ConfigError),
    /// The scheduler refused the request (its tenant has too many queued,
    /// or no policy); the request's region is handed back with it.
    #[error("the scheduler refused the request: {0}")]
    Rejected(#[source] mtrdma_sched::RejectReason),
    /// Endpoints could not be exchanged with the peer
    /// ([`exchange`](crate::exchange::exchange)).
    #[error("endpoint exchange failed: {0}")]
    Exchange(#[source] crate::exchange::HandshakeError),
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

impl mtrdma_core::tenant::RateLimited for Error {
    /// A queue pair or memory region refused by the tenant's control-path
    /// rate limit ([`Error::Admission`]) may be created after the wait it
    /// names.
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Admission(e) => e.retry_after(),
            _ => None,
        }
    }
}

/// The error a verbs call's return code `rc` names: an `errno`, which
/// libibverbs returns positive and some providers (SoftiWARP's) negative.
pub(crate) fn errno(rc: i32) -> io::Error {
    io::Error::from_raw_os_error(rc.saturating_abs())
}

#[cfg(test)]
mod errno_tests {
    use super::errno_said;
    use std::io;

    #[test]
    fn an_unset_errno_is_said_as_such_and_a_set_one_is_kept() {
        let unset = errno_said(io::Error::from_raw_os_error(0));
        assert_eq!(unset.raw_os_error(), None);
        assert_eq!(
            unset.to_string(),
            "the provider failed without setting errno"
        );
        let set = errno_said(io::Error::from_raw_os_error(12));
        assert_eq!(set.raw_os_error(), Some(12));
    }
}
