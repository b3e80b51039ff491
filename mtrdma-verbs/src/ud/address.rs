//! What a peer needs to reach a UD queue pair: its endpoint, and the
//! address handles built from it.

use super::*;

/// What a peer needs to send to a UD queue pair. Serialisable, to send it
/// over any channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UdEndpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// The Q_Key senders must use.
    pub qkey: u32,
    /// The GID the queue pair is addressed by.
    pub gid: [u8; 16],
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
}

pub(super) struct AhInner {
    ah: NonNull<ffi::ibv_ah>,
    remote: UdEndpoint,
    pub(super) pd: ProtectionDomain,
}

// SAFETY: an address handle is immutable after creation; it is only handed
// to `post_send` (which reads it) and destroyed once, by the last owner.
unsafe impl Send for AhInner {}
// SAFETY: as above; `&self` never mutates it.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: `ah` came from `ibv_create_ah` and is destroyed once; no
        // work request uses it any more (each in-flight send holds a clone
        // of the handle until its completion is polled).
        let rc = unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_ah failed");
        }
    }
}

/// Where UD sends go: the route to one peer port (GID, LID, local GID index
/// and port). Cheap to clone; it keeps its protection domain alive, and a
/// send in flight keeps its handle alive until its completion is polled.
#[derive(Clone)]
pub struct AddressHandle {
    pub(super) inner: Arc<AhInner>,
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("dgid", &Gid(self.inner.remote.gid))
            .field("remote_qpn", &self.inner.remote.qpn)
            .finish()
    }
}

impl AddressHandle {
    /// The endpoint it was made from (its QPN and Q_Key are what
    /// [`UdQueuePair::post_send`] usually sends to).
    pub fn endpoint(&self) -> UdEndpoint {
        self.inner.remote
    }

    pub(super) fn raw(&self) -> *mut ffi::ibv_ah {
        self.inner.ah.as_ptr()
    }
}

impl ProtectionDomain {
    /// An address handle for sending from `port` of this domain's device to
    /// `remote`, with the local GID chosen by `gid` (as for queue pairs).
    pub fn address_handle(
        &self,
        remote: &UdEndpoint,
        port: u8,
        gid: GidSelection,
    ) -> Result<AddressHandle, Error> {
        let local = self.context().select_gid(port, gid)?;
        create_ah(self, remote, port, local.index)
    }
}

pub(super) fn create_ah(
    pd: &ProtectionDomain,
    remote: &UdEndpoint,
    port: u8,
    sgid_index: u32,
) -> Result<AddressHandle, Error> {
    let mut attr = global_ah_attr(remote.gid, remote.lid, port, sgid_index);
    // SAFETY: the PD is alive; `attr` is a complete attribute set that the
    // call only reads.
    let ah = unsafe { ffi::ibv_create_ah(pd.raw(), &mut attr) };
    let Some(ah) = NonNull::new(ah) else {
        return Err(Error::Verbs {
            call: "ibv_create_ah",
            device: pd.context().name().to_string(),
            source: crate::error::verbs_errno(),
        });
    };
    Ok(AddressHandle {
        inner: Arc::new(AhInner {
            ah,
            remote: *remote,
            pd: pd.clone(),
        }),
    })
}
