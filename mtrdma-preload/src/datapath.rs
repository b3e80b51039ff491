//! The data path: every send of the program's queue pairs goes through its
//! tenant's scheduler (a [`ForeignQueuePair`]: the same engine as the Rust
//! API's scheduled queue pairs), and the program's completion queues give
//! it back its own completions exactly as libibverbs would.
//!
//! - `ibv_post_send` (the context's `post_send`): each request is copied
//!   (inline data too) and handed to the engine, which posts it now or
//!   when its tenant's class, weight, caps, rate limits and window let it,
//!   WRITEs and READs longer than a piece in pieces. A request the send
//!   queue has no room for is refused with `ENOMEM`, as the device
//!   refuses it; the requests before it in the list stay posted.
//! - `ibv_poll_cq` (the context's `poll_cq`) on a completion queue that
//!   carries scheduled sends: every completion is taken from the device,
//!   those of pieces are matched to their requests, and the program gets
//!   its own completions, and one for each of its requests after all its
//!   pieces, with its `wr_id`, status and opcode, in the order of its
//!   send queue. An unsignaled request's completion is shown only if it
//!   failed, as the device does. (The device's vendor error is not kept:
//!   `vendor_err` is 0.)
//! - Completion events: `ibv_req_notify_cq` and `ibv_get_cq_event` know of
//!   completions the library took from the device and holds for the
//!   program, so a program that sleeps on its channel wakes for them.
//! - A program that neither polls nor sleeps on events (it spins on memory
//!   a peer writes) still sees its requests go out: a progress thread
//!   polls for it, every millisecond while scheduled requests wait, and
//!   sleeps otherwise.
//!
//! With `MTRDMA_REPORT=1` the library says on stderr, when the program
//! exits, how many sends it scheduled and in how many work requests.
//!
//! Settings (environment, read once): `MTRDMA_CHUNK` (piece size, default
//! 65536), `MTRDMA_WINDOW=1` (a delay window on bulk queue pairs, which
//! protects a latency tenant in another process; see
//! `mtrdma_sched::window`), `MTRDMA_PIECES` (pieces of a queue pair in the
//! device at once; default its send queue's depth, within its completion
//! queue's budget, see [`CqInner::budget`]).
//!
//! Under a policy with a latency bound (`[link] latency_bound`), a bulk
//! tenant's queue pairs are held to it whatever these say, as the Rust
//! API's are (`mtrdma_verbs::ScheduleConfig`, "Protection by policy"):
//! pieces of at most the bound's size and a delay window, always.
//! `MTRDMA_CHUNK` can then only make the pieces smaller, and
//! `MTRDMA_WINDOW` is not needed.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use mtrdma_core::TenantHandle;
use mtrdma_verbs::foreign::{
    is_piece, Direct, ForeignDone, ForeignQueuePair, ForeignSend, ForeignUd, Local,
};
use mtrdma_verbs::{RemoteRegion, ScheduleConfig, SendOp};

use crate::context::{self, Provider};
use crate::ffi::{sys, Wc};
use crate::guard::{entry, entry_rc};
use crate::tenant::{say_once, tenancy, Tenancy};

mod completions;

pub(crate) use completions::*;

/// How the program's queue pairs are scheduled (from the environment).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) chunk: u64,
    pub(crate) window: bool,
    pub(crate) pieces: Option<u32>,
}

impl Settings {
    /// From environment variables `get` reads; a malformed value is said
    /// once and the default kept.
    pub(crate) fn from(get: impl Fn(&str) -> Option<String>) -> Settings {
        fn num<T: std::str::FromStr>(
            get: &impl Fn(&str) -> Option<String>,
            name: &str,
        ) -> Option<T> {
            let v = get(name)?;
            match v.trim().parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    say_once(
                        name,
                        &format!("{name}={v:?} is not a number; using the default"),
                    );
                    None
                }
            }
        }
        Settings {
            chunk: num::<u64>(&get, "MTRDMA_CHUNK")
                .filter(|&c| c > 0)
                .unwrap_or(64 << 10),
            window: get("MTRDMA_WINDOW").is_some_and(|v| v == "1"),
            pieces: num::<u32>(&get, "MTRDMA_PIECES").filter(|&p| p > 0),
        }
    }

    fn get() -> &'static Settings {
        static SETTINGS: OnceLock<Settings> = OnceLock::new();
        SETTINGS.get_or_init(|| Settings::from(|name| std::env::var(name).ok()))
    }

    /// The schedule of a queue pair with `max_send_wr` send slots, of
    /// which `budget` pieces may be in the device at once (see
    /// [`CqInner::budget`]).
    pub(crate) fn schedule(&self, max_send_wr: u32, budget: u32) -> ScheduleConfig {
        let pieces = self.pieces.unwrap_or(max_send_wr).min(budget).max(1);
        ScheduleConfig {
            chunk_bytes: self.chunk,
            max_pieces_in_flight: pieces,
            window: self.window.then(|| {
                Arc::new(mtrdma_sched::DelayWindowConfig::for_piece(self.chunk))
                    as Arc<dyn mtrdma_sched::WindowFactory>
            }),
            ..ScheduleConfig::default()
        }
    }
}

/// A scheduled queue pair of the program.
pub(crate) struct Qp {
    qp: usize,
    qpn: u32,
    send_cq: usize,
    ud: bool,
    sq_sig_all: bool,
    max_send_wr: u32,
    /// Pieces it took of its completion queue's budget.
    pieces: u32,
    provider: Provider,
    /// Whether requests wait in its engine (kept with the lock held, read
    /// by the progress thread without it).
    waiting: AtomicBool,
    pub(crate) inner: Mutex<QpInner>,
}

impl Qp {
    /// Whether every request is signaled (`sq_sig_all`).
    pub(crate) fn signals_all(&self) -> bool {
        self.sq_sig_all
    }

    /// Requests its send queue has room for.
    pub(crate) fn room(&self, inner: &QpInner) -> usize {
        (self.max_send_wr as usize).saturating_sub(inner.fq.queued())
    }
}

/// What a queue pair's lock guards.
pub(crate) struct QpInner {
    fq: ForeignQueuePair,
    /// Inline requests' buffers, back from their completions, for the
    /// next ones.
    spare: Vec<Vec<u8>>,
    /// The extended posting API's open session, if any.
    pub(crate) session: Option<crate::ex::Session>,
}

/// A completion queue that carries scheduled sends.
struct Cq {
    cq: usize,
    provider: Provider,
    /// Times it was drained (read by the progress thread without the
    /// lock: a queue someone drains needs no help).
    drains: AtomicU64,
    inner: Mutex<CqInner>,
}

struct CqInner {
    /// Completions taken from the device and held for the program.
    held: VecDeque<Wc>,
    /// Finished requests being turned into completions (kept for its
    /// room).
    done: Vec<ForeignDone>,
    /// The scheduled queue pairs whose sends complete here.
    qps: Vec<Arc<Qp>>,
    /// Whether the program asked for an event and has not had it.
    armed: bool,
    /// Events the library gave the program for completions it held
    /// (`ibv_get_cq_event`), not yet acknowledged.
    made_events: u32,
    /// Pieces its queue pairs may still take for their time in the
    /// device: a signaled piece's completion takes an entry of the queue
    /// until it is polled. Half the queue's entries are
    /// shared out so (the program's own completions, receives among them,
    /// keep the other half); each queue pair takes what it may have in
    /// its send queue, or what is left (at least one), and gives it back
    /// when destroyed.
    budget: u32,
}

/// A map keyed by addresses.
/// (looked up at every post and poll: one multiplication, not SipHash.)
type ByAddr<T> = HashMap<usize, T, std::hash::BuildHasherDefault<mtrdma_sched::IdHasher>>;

static QPS: RwLock<Option<ByAddr<Arc<Qp>>>> = RwLock::new(None);
static CQS: RwLock<Option<ByAddr<Arc<Cq>>>> = RwLock::new(None);

/// Sends the engines took, and the work requests posted by the queue pairs
/// destroyed so far (for `MTRDMA_REPORT`).
static SENDS: AtomicU64 = AtomicU64::new(0);
static POSTED: AtomicU64 = AtomicU64::new(0);
static SCHEDULED_QPS: AtomicU64 = AtomicU64::new(0);

/// Says what was scheduled (at exit, with `MTRDMA_REPORT=1`).
extern "C" fn report() {
    let live: u64 = {
        let qps = QPS.read().unwrap_or_else(PoisonError::into_inner);
        qps.as_ref()
            .map(|m| m.values().map(|q| lock(&q.inner).fq.posted()).sum())
            .unwrap_or(0)
    };
    eprintln!(
        "mtrdma-preload: {} sends on {} scheduled queue pairs, posted as {} work requests",
        SENDS.load(Ordering::Relaxed),
        SCHEDULED_QPS.load(Ordering::Relaxed),
        POSTED.load(Ordering::Relaxed) + live
    );
}

/// Completion queues the program created with `ibv_create_cq_ex`.
static EXTENDED_CQS: Mutex<Option<ByAddr<()>>> = Mutex::new(None);

/// The program created `cq` with `ibv_create_cq_ex`.
pub(crate) fn extended_cq(cq: *mut sys::ibv_cq) {
    lock(&EXTENDED_CQS)
        .get_or_insert_with(ByAddr::default)
        .insert(cq as usize, ());
}

fn is_extended(cq: *mut sys::ibv_cq) -> bool {
    lock(&EXTENDED_CQS)
        .as_ref()
        .is_some_and(|m| m.contains_key(&(cq as usize)))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The scheduled queue pair at `qp`, if any.
#[inline]
pub(crate) fn qp_of(qp: usize) -> Option<Arc<Qp>> {
    let qps = QPS.read().unwrap_or_else(PoisonError::into_inner);
    qps.as_ref()?.get(&qp).cloned()
}

#[inline]
fn cq_of(cq: usize) -> Option<Arc<Cq>> {
    let cqs = CQS.read().unwrap_or_else(PoisonError::into_inner);
    cqs.as_ref()?.get(&cq).cloned()
}

/// A queue pair was created: schedules its sends when the program runs as
/// a tenant and the queue pair is of a type the engine serves (RC, UC,
/// UD).
///
/// # Safety
/// `qp` must be a queue pair the provider just created, with `send_cq` its
/// send completion queue, not yet seen by the program.
pub(crate) unsafe fn created(
    qp: *mut sys::ibv_qp,
    max_send_wr: u32,
    sq_sig_all: bool,
    send_cq: *mut sys::ibv_cq,
) {
    let Tenancy::Joined(handle) = tenancy() else {
        return;
    };
    if qp_of(qp as usize).is_some() {
        // Already scheduled: one creation wrapper inside another (the
        // exported `ibv_create_qp` reaching the context's `create_qp_ex`).
        return;
    }
    // SAFETY: the caller's promise: live objects of the provider.
    let (ctx, qp_type, cqe) = unsafe { ((*qp).context, (*qp).qp_type, (*send_cq).cqe) };
    let Some(provider) = context::provider(ctx) else {
        return;
    };
    if is_extended(send_cq) {
        say_once(
            "cq-ex",
            "queue pairs whose sends complete on an extended completion queue \
             (ibv_create_cq_ex, polled with ibv_start_poll) are admitted but not scheduled",
        );
        return;
    }
    use sys::ibv_qp_type as t;
    if ![t::IBV_QPT_RC, t::IBV_QPT_UC, t::IBV_QPT_UD].contains(&qp_type) {
        say_once(
            "qp-type",
            &format!("queue pairs of type {qp_type} are admitted but not scheduled"),
        );
        return;
    }
    let cqe = u32::try_from(cqe).unwrap_or(1);
    if let Err(e) = schedule(qp, provider, max_send_wr, sq_sig_all, send_cq, cqe, handle) {
        say_once(
            "schedule",
            &format!(
                "a queue pair's sends cannot be scheduled ({e}); they go to the device directly"
            ),
        );
    }
}

fn schedule(
    qp: *mut sys::ibv_qp,
    provider: Provider,
    max_send_wr: u32,
    sq_sig_all: bool,
    send_cq: *mut sys::ibv_cq,
    cqe: u32,
    handle: &TenantHandle,
) -> Result<(), mtrdma_verbs::Error> {
    let mut cqs = CQS.write().unwrap_or_else(PoisonError::into_inner);
    let cq = cqs
        .get_or_insert_with(ByAddr::default)
        .entry(send_cq as usize)
        .or_insert_with(|| {
            Arc::new(Cq {
                cq: send_cq as usize,
                provider,
                drains: AtomicU64::new(0),
                inner: Mutex::new(CqInner {
                    held: VecDeque::new(),
                    done: Vec::new(),
                    qps: Vec::new(),
                    armed: false,
                    made_events: 0,
                    budget: (cqe / 2).max(1),
                }),
            })
        })
        .clone();
    drop(cqs);
    let mut c = lock(&cq.inner);
    let settings = Settings::get();
    let config = settings.schedule(max_send_wr, c.budget.max(1));
    let pieces = config.max_pieces_in_flight;
    // SAFETY: `qp` is live (the caller's promise) until the program
    // destroys it, and `destroying` drops this first.
    let fq = unsafe {
        ForeignQueuePair::new(
            qp,
            provider.post_send,
            max_send_wr,
            Some(handle.clone()),
            config,
        )
    }?;
    c.budget = c.budget.saturating_sub(pieces);
    // SAFETY: as above.
    let (qpn, ud) = unsafe { ((*qp).qp_num, (*qp).qp_type == sys::ibv_qp_type::IBV_QPT_UD) };
    let q = Arc::new(Qp {
        qp: qp as usize,
        qpn,
        send_cq: send_cq as usize,
        ud,
        sq_sig_all,
        max_send_wr,
        pieces,
        provider,
        waiting: AtomicBool::new(false),
        inner: Mutex::new(QpInner {
            fq,
            spare: Vec::new(),
            session: None,
        }),
    });
    c.qps.push(q.clone());
    drop(c);
    QPS.write()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(ByAddr::default)
        .insert(qp as usize, q);
    if SCHEDULED_QPS.fetch_add(1, Ordering::Relaxed) == 0
        && std::env::var("MTRDMA_REPORT").is_ok_and(|v| v == "1")
    {
        // SAFETY: `report` is a plain function that lives as long as the
        // library (which is never unloaded while the program runs).
        unsafe { libc::atexit(report) };
    }
    Ok(())
}

/// The program is destroying `qp`: its scheduling ends first (requests
/// not yet posted are dropped, as the device drops what a destroyed queue
/// pair held).
pub(crate) fn destroying(qp: *mut sys::ibv_qp) {
    let q = {
        let mut qps = QPS.write().unwrap_or_else(PoisonError::into_inner);
        qps.as_mut().and_then(|m| m.remove(&(qp as usize)))
    };
    let Some(q) = q else {
        return;
    };
    POSTED.fetch_add(lock(&q.inner).fq.posted(), Ordering::Relaxed);
    if let Some(cq) = cq_of(q.send_cq) {
        let mut c = lock(&cq.inner);
        c.qps.retain(|other| !Arc::ptr_eq(other, &q));
        c.budget += q.pieces;
        // What the program still holds of it stays: it may poll it.
    }
}

/// The program destroyed completion queue `cq`.
pub(crate) fn cq_destroyed(cq: *mut sys::ibv_cq) {
    let mut cqs = CQS.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(m) = cqs.as_mut() {
        m.remove(&(cq as usize));
    }
    drop(cqs);
    if let Some(m) = lock(&EXTENDED_CQS).as_mut() {
        m.remove(&(cq as usize));
    }
}

/// One of the program's send requests, copied.
///
/// # Safety
/// `wr` must be a valid work request whose scatter list holds `num_sge`
/// entries (and, if inline, whose memory is readable).
unsafe fn request(
    q: &Qp,
    wr: &sys::ibv_send_wr,
    spare: &mut Vec<Vec<u8>>,
) -> Result<ForeignSend, c_int> {
    use sys::ibv_send_flags as f;
    use sys::ibv_wr_opcode as o;
    let n = usize::try_from(wr.num_sge).map_err(|_| libc::EINVAL)?;
    let sges: &[sys::ibv_sge] = if n == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
    };
    let local = if wr.send_flags & f::IBV_SEND_INLINE.0 != 0 {
        let mut data = spare.pop().unwrap_or_default();
        data.clear();
        for s in sges {
            // SAFETY: inline data is read at the post (the caller's
            // promise), as the device copies it.
            data.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
            });
        }
        Local::Inline(data)
    } else {
        match sges {
            [] => Local::Empty,
            [one] => Local::Sge(*one),
            many => Local::List(many.into()),
        }
    };
    // SAFETY: the union members read are the ones the opcode uses.
    let (rdma, atomic, imm) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.__bindgen_anon_1.imm_data) };
    let remote = |addr, rkey| RemoteRegion {
        addr,
        len: local.len(),
        rkey,
    };
    let word = |addr, rkey| RemoteRegion { addr, len: 8, rkey };
    let op = match wr.opcode {
        o::IBV_WR_RDMA_WRITE => SendOp::Write(remote(rdma.remote_addr, rdma.rkey)),
        o::IBV_WR_RDMA_WRITE_WITH_IMM => {
            SendOp::WriteWithImm(remote(rdma.remote_addr, rdma.rkey), u32::from_be(imm))
        }
        o::IBV_WR_SEND => SendOp::Send,
        o::IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(u32::from_be(imm)),
        o::IBV_WR_RDMA_READ => SendOp::Read(remote(rdma.remote_addr, rdma.rkey)),
        o::IBV_WR_ATOMIC_FETCH_AND_ADD => {
            SendOp::FetchAdd(word(atomic.remote_addr, atomic.rkey), atomic.compare_add)
        }
        o::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote: word(atomic.remote_addr, atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        _ => return Err(libc::EOPNOTSUPP),
    };
    let ud = q.ud.then(|| {
        // SAFETY: a UD queue pair's requests use the `ud` member.
        let ud = unsafe { wr.wr.ud };
        ForeignUd {
            ah: ud.ah,
            qpn: ud.remote_qpn,
            qkey: ud.remote_qkey,
        }
    });
    Ok(ForeignSend {
        wr_id: wr.wr_id,
        op,
        local,
        fence: wr.send_flags & f::IBV_SEND_FENCE.0 != 0,
        solicited: wr.send_flags & f::IBV_SEND_SOLICITED.0 != 0,
        signaled: q.sq_sig_all || wr.send_flags & f::IBV_SEND_SIGNALED.0 != 0,
        ud,
    })
}

/// Hands `req` to the queue pair's engine (the caller saw room for it,
/// [`Qp::room`]); the `errno` of a refusal.
pub(crate) fn submit(q: &Qp, inner: &mut QpInner, req: ForeignSend) -> Result<(), c_int> {
    // SAFETY: the program keeps the memory its requests name registered
    // until their completions (the verbs contract it posted under).
    match unsafe { inner.fq.post(req) } {
        Ok(()) => {
            SENDS.fetch_add(1, Ordering::Relaxed);
            if !q.waiting.swap(true, Ordering::Relaxed) {
                progress::busy();
            }
            Ok(())
        }
        Err(refused) => {
            say_once(
                &format!("post:{}", refused.error),
                &format!(
                    "a send of queue pair {} was refused with EINVAL: {}",
                    q.qpn, refused.error
                ),
            );
            Err(libc::EINVAL)
        }
    }
}

/// Posts an operation the engine does not schedule (memory windows,
/// invalidations) straight to the device, if nothing of the queue pair is
/// queued before it (else it would overtake them).
///
/// # Safety
/// As `ibv_post_send` for `wr`.
unsafe fn pass_through(q: &Qp, inner: &QpInner, wr: &sys::ibv_send_wr) -> c_int {
    if inner.fq.unposted() {
        say_once(
            &format!("opcode:{}", wr.opcode),
            &format!(
                "opcode {} is not scheduled and cannot pass requests still queued; refused \
                 with EOPNOTSUPP (poll their completions first)",
                wr.opcode
            ),
        );
        return libc::EOPNOTSUPP;
    }
    let mut one = *wr;
    one.next = std::ptr::null_mut();
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's promise, one request of it.
    unsafe { (q.provider.post_send)(q.qp as *mut sys::ibv_qp, &mut one, &mut bad) }
}

/// The context's `post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    entry_rc("ibv_post_send", || {
        let Some(q) = qp_of(qp as usize) else {
            // SAFETY: a queue pair of a context the library took over.
            let ctx = unsafe { (*qp).context };
            return match context::provider(ctx) {
                // SAFETY: the program's arguments, to the provider.
                Some(p) => unsafe { (p.post_send)(qp, wr, bad_wr) },
                None => libc::EINVAL,
            };
        };
        let mut inner = lock(&q.inner);
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the program's list of valid work requests.
            let w = unsafe { &*cur };
            let signaled =
                q.sq_sig_all || w.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            let rc = if q.room(&inner) == 0 {
                libc::ENOMEM
            } else {
                // SAFETY: as above.
                match unsafe { inner.fq.post_direct(w, signaled) } {
                    Direct::Posted => {
                        SENDS.fetch_add(1, Ordering::Relaxed);
                        0
                    }
                    Direct::Refused(rc) => rc,
                    // SAFETY: as above.
                    Direct::Engine => match unsafe { request(&q, w, &mut inner.spare) } {
                        Ok(req) => submit(&q, &mut inner, req).err().unwrap_or(0),
                        // SAFETY: as above.
                        Err(libc::EOPNOTSUPP) => unsafe { pass_through(&q, &inner, w) },
                        Err(e) => e,
                    },
                }
            };
            if rc != 0 {
                if !bad_wr.is_null() {
                    // SAFETY: the program's out-pointer.
                    unsafe { *bad_wr = cur };
                }
                return rc;
            }
            cur = w.next;
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_environment_with_defaults_for_the_rest() {
        let s = Settings::from(|_| None);
        assert_eq!((s.chunk, s.window, s.pieces), (64 << 10, false, None));
        let c = s.schedule(128, 256);
        assert_eq!((c.chunk_bytes, c.max_pieces_in_flight), (64 << 10, 128));
        assert!(c.window.is_none());
        // Never more than the completion queue's budget, never none.
        assert_eq!(s.schedule(128, 16).max_pieces_in_flight, 16);
        assert_eq!(s.schedule(128, 0).max_pieces_in_flight, 1);

        let vars = [
            ("MTRDMA_CHUNK", "4096"),
            ("MTRDMA_WINDOW", "1"),
            ("MTRDMA_PIECES", "8"),
        ];
        let get = |n: &str| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        };
        let s = Settings::from(get);
        let c = s.schedule(128, 1024);
        assert_eq!((c.chunk_bytes, c.max_pieces_in_flight), (4096, 8));
        assert_eq!(c.window.and_then(|w| w.queue_bytes()), Some(10 << 10));

        let bad = |n: &str| (n == "MTRDMA_CHUNK").then(|| "lots".to_string());
        assert_eq!(Settings::from(bad).chunk, 64 << 10);
    }
}
