//! RDMA devices, contexts and ports.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::sync::Arc;

use ibverbs_sys as ffi;

use crate::gid::{self, Gid, GidEntry, GidSelection, GidType};
use crate::Error;

/// The device list of libibverbs, freed on drop.
struct DeviceList {
    ptr: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, Error> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array (or null)
        // is owned by us until `ibv_free_device_list`.
        let ptr = unsafe { ffi::ibv_get_device_list(&mut n) };
        if ptr.is_null() {
            return Err(Error::Verbs {
                call: "ibv_get_device_list",
                device: "(all)".into(),
                source: crate::error::verbs_errno(),
            });
        }
        Ok(DeviceList {
            ptr,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> &[*mut ffi::ibv_device] {
        // SAFETY: libibverbs returned an array of `len` valid device pointers
        // (followed by a NULL) that lives until `ibv_free_device_list`, which
        // only runs when `self` is dropped, after this borrow ends.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn names(&self) -> Vec<String> {
        self.devices().iter().map(|&d| device_name(d)).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `ibv_get_device_list` and is freed once.
        // Contexts opened from it stay valid after the list is freed.
        unsafe { ffi::ibv_free_device_list(self.ptr) }
    }
}

fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: `dev` is a live entry of a device list; the name is a
    // NUL-terminated string inside it, copied out before the list is freed.
    let name = unsafe { ffi::ibv_get_device_name(dev) };
    if name.is_null() {
        return String::from("(unnamed)");
    }
    // SAFETY: non-null, NUL-terminated, valid for the list's lifetime.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// The names of the RDMA devices on this host (empty when there are none).
pub fn device_names() -> Result<Vec<String>, Error> {
    Ok(DeviceList::get()?.names())
}

/// The state of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// No state change.
    Nop,
    /// The link is down.
    Down,
    /// The link is up but not configured (InfiniBand: no subnet manager yet).
    Init,
    /// Configured, not yet allowed to carry data.
    Armed,
    /// Ready for traffic.
    Active,
    /// Active, deferring errors.
    ActiveDefer,
    /// A value this version of mtrdma does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(raw: u32) -> Self {
        use ffi::ibv_port_state as s;
        match raw {
            s::IBV_PORT_NOP => PortState::Nop,
            s::IBV_PORT_DOWN => PortState::Down,
            s::IBV_PORT_INIT => PortState::Init,
            s::IBV_PORT_ARMED => PortState::Armed,
            s::IBV_PORT_ACTIVE => PortState::Active,
            s::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Nop => f.write_str("NOP"),
            PortState::Down => f.write_str("DOWN"),
            PortState::Init => f.write_str("INIT"),
            PortState::Armed => f.write_str("ARMED"),
            PortState::Active => f.write_str("ACTIVE"),
            PortState::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            PortState::Other(v) => write!(f, "state {v}"),
        }
    }
}

/// The link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, including SoftRoCE).
    Ethernet,
    /// Not reported by the driver (treated as InfiniBand by libibverbs).
    Unspecified,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unspecified => "unspecified",
        })
    }
}

/// A path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mtu(u32);

impl Mtu {
    fn from_raw(raw: u32) -> Option<Self> {
        (1..=5).contains(&raw).then_some(Mtu(raw))
    }

    /// The MTU in bytes (256 to 4096).
    pub fn bytes(self) -> u32 {
        128 << self.0
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// What a port reports about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// The port number (1-based).
    pub number: u8,
    /// Its state.
    pub state: PortState,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// The active path MTU, when the driver reports a valid one.
    pub active_mtu: Option<Mtu>,
    /// The number of entries in its GID table.
    pub gid_table_len: u32,
    /// Its LID (InfiniBand only; 0 on RoCE).
    pub lid: u16,
}

struct ContextInner {
    ctx: *mut ffi::ibv_context,
    name: String,
    port_count: u8,
    /// The device speaks iWARP ([`Context::is_iwarp`]).
    iwarp: bool,
    /// The device runs atomic operations ([`Context::has_atomics`]).
    atomics: bool,
    /// The most scatter entries a READ lands in (`max_sge_rd`).
    max_sge_rd: u32,
}

// SAFETY: an `ibv_context` may be used from any thread: libibverbs
// serialises what needs it internally, and mtrdma never hands out the
// pointer mutably.
unsafe impl Send for ContextInner {}
// SAFETY: as above; every method takes `&self` and calls thread-safe verbs.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Every resource made from the context holds an `Arc` to it, so the
        // context is closed last.
        // SAFETY: `ctx` came from `ibv_open_device` and is closed once.
        let rc = unsafe { ffi::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}

/// An open RDMA device. Cheap to clone; closed when the last clone (and
/// every resource made from it) is dropped.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .field("ports", &self.inner.port_count)
            .finish()
    }
}

impl Context {
    /// Opens the device called `name` (as `ibv_devices` lists it, e.g. `rxe0`, `mlx5_0`).
    pub fn open(name: &str) -> Result<Context, Error> {
        let list = DeviceList::get()?;
        let names = list.names();
        if names.is_empty() {
            return Err(Error::NoDevice);
        }
        match names.iter().position(|n| n == name) {
            Some(i) => Self::open_device(list.devices()[i], names[i].clone()),
            None => Err(Error::DeviceNotFound {
                name: name.to_string(),
                available: names,
            }),
        }
    }

    /// Opens the first device (in libibverbs' order) that has an active port.
    pub fn open_first_active() -> Result<Context, Error> {
        let list = DeviceList::get()?;
        let names = list.names();
        if names.is_empty() {
            return Err(Error::NoDevice);
        }
        for (&dev, name) in list.devices().iter().zip(&names) {
            let ctx = match Self::open_device(dev, name.clone()) {
                Ok(ctx) => ctx,
                Err(e) => {
                    tracing::debug!(device = %name, error = %e, "skipping device");
                    continue;
                }
            };
            if ctx.ports()?.iter().any(|p| p.state == PortState::Active) {
                return Ok(ctx);
            }
        }
        Err(Error::NoActivePort { devices: names })
    }

    fn open_device(dev: *mut ffi::ibv_device, name: String) -> Result<Context, Error> {
        // SAFETY: `dev` is a live entry of a device list held by the caller.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(Error::Verbs {
                call: "ibv_open_device",
                device: name,
                source: crate::error::verbs_errno(),
            });
        }
        let mut inner = ContextInner {
            ctx,
            name,
            port_count: 0,
            // SAFETY: `dev` is live (the caller's promise).
            iwarp: unsafe { (*dev).transport_type } == ffi::IBV_TRANSPORT_IWARP,
            atomics: false,
            max_sge_rd: 0,
        };
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is open and `attr` is a valid, writable struct.
        let rc = unsafe { ffi::ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            // `inner` closes the context on drop.
            return Err(Error::Verbs {
                call: "ibv_query_device",
                device: inner.name.clone(),
                source: crate::error::errno(rc),
            });
        }
        inner.port_count = attr.phys_port_cnt;
        inner.atomics = attr.atomic_cap != ffi::IBV_ATOMIC_NONE;
        inner.max_sge_rd = u32::try_from(attr.max_sge_rd).unwrap_or(0);
        tracing::debug!(device = %inner.name, ports = inner.port_count, "opened RDMA device");
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    /// The raw context (valid while `self` lives).
    pub(crate) fn raw(&self) -> *mut ffi::ibv_context {
        self.inner.ctx
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The most scatter/gather entries one work request may have on this
    /// device (its `max_sge` attribute): the most regions one gather
    /// request may name, and so the most
    /// [`QueuePairBuilder::max_send_sge`](crate::QueuePairBuilder::max_send_sge)
    /// may ask for.
    pub fn max_sge(&self) -> Result<u32, Error> {
        let attrs = crate::qp::device_attrs(self)?;
        Ok(u32::try_from(attrs.max_sge).unwrap_or(0))
    }

    /// Whether the device speaks iWARP (SoftiWARP, Chelsio, Intel's iWARP
    /// mode): it connects only through rdma_cm (the `cm` module), and its
    /// requests carry no immediate data.
    pub fn is_iwarp(&self) -> bool {
        self.inner.iwarp
    }

    /// Whether the device runs atomic operations (fetch-and-add,
    /// compare-and-swap): its `atomic_cap` is not `IBV_ATOMIC_NONE`.
    pub fn has_atomics(&self) -> bool {
        self.inner.atomics
    }

    /// The most regions one READ may land in (the device's `max_sge_rd`:
    /// 1 on iWARP, whose READ response names one buffer; 0 where the
    /// device does not say).
    pub fn max_read_sge(&self) -> u32 {
        self.inner.max_sge_rd
    }

    /// How many ports the device has (they are numbered from 1).
    pub fn port_count(&self) -> u8 {
        self.inner.port_count
    }

    fn check_port(&self, port: u8) -> Result<(), Error> {
        if port == 0 || port > self.inner.port_count {
            return Err(Error::NoSuchPort {
                device: self.inner.name.clone(),
                port,
                port_count: self.inner.port_count,
            });
        }
        Ok(())
    }

    /// Queries one port (its state can change at any time; this is a snapshot).
    pub fn port(&self, port: u8) -> Result<PortInfo, Error> {
        self.check_port(port)?;
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: the context is open; the exported `ibv_query_port` fills
        // the legacy prefix of `ibv_port_attr`, which `attr` (the full,
        // zeroed struct) is large enough for.
        let rc = unsafe {
            ffi::ibv_query_port(
                self.inner.ctx,
                port,
                (&mut attr as *mut ffi::ibv_port_attr).cast(),
            )
        };
        if rc != 0 {
            return Err(Error::Verbs {
                call: "ibv_query_port",
                device: self.inner.name.clone(),
                source: crate::error::errno(rc),
            });
        }
        let link_layer = match u32::from(attr.link_layer) {
            ffi::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            ffi::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        };
        Ok(PortInfo {
            number: port,
            state: PortState::from_raw(attr.state),
            link_layer,
            active_mtu: Mtu::from_raw(attr.active_mtu),
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            lid: attr.lid,
        })
    }

    /// Queries every port.
    pub fn ports(&self) -> Result<Vec<PortInfo>, Error> {
        (1..=self.inner.port_count).map(|p| self.port(p)).collect()
    }

    /// The valid entries of one port's GID table.
    ///
    /// The table is only meaningful while the port is ACTIVE or ARMED; for
    /// any other state this returns [`Error::PortNotActive`].
    pub fn gids(&self, port: u8) -> Result<Vec<GidEntry>, Error> {
        let info = self.port(port)?;
        if !matches!(info.state, PortState::Active | PortState::Armed) {
            return Err(Error::PortNotActive {
                device: self.inner.name.clone(),
                port,
                state: info.state,
            });
        }
        // The call returns the valid entries of every port, so size the
        // buffer for all of them.
        let mut capacity = 0usize;
        for p in 1..=self.inner.port_count {
            capacity += self.port(p)?.gid_table_len as usize;
        }
        let mut raw = vec![ffi::ibv_gid_entry::default(); capacity.max(1)];
        // SAFETY: the context is open; `raw` has room for `raw.len()` entries
        // of the size we pass, and the call writes at most that many.
        let n = unsafe {
            ffi::_ibv_query_gid_table(
                self.inner.ctx,
                raw.as_mut_ptr(),
                raw.len(),
                0,
                std::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(Error::Verbs {
                call: "ibv_query_gid_table",
                device: self.inner.name.clone(),
                source: io::Error::from_raw_os_error(i32::try_from(-n).unwrap_or(libc_eio())),
            });
        }
        raw.truncate(usize::try_from(n).unwrap_or(0));
        Ok(raw
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry {
                port,
                index: e.gid_index,
                // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
                gid: Gid(unsafe { e.gid.raw }),
                kind: GidType::from_raw(e.gid_type),
                netdev_ifindex: e.ndev_ifindex,
            })
            .collect())
    }

    /// Chooses the GID of `port` to address queue pairs by (see [`GidSelection`]).
    pub fn select_gid(&self, port: u8, selection: GidSelection) -> Result<GidEntry, Error> {
        let entries = self.gids(port)?;
        gid::select(&entries, selection).map_err(|reason| Error::NoUsableGid {
            device: self.inner.name.clone(),
            port,
            reason,
        })
    }
}

const fn libc_eio() -> i32 {
    5
}
