//! Completions: what the program polls, routed to its queue pairs with
//! the pieces of the scheduled ones counted back, and the completion
//! events the program waits on.

use super::*;

/// The completion the program sees for a finished request.
pub(super) fn wc_of(d: &ForeignDone, qpn: u32) -> Wc {
    Wc {
        wr_id: d.wr_id,
        status: d.status,
        opcode: d.opcode,
        byte_len: d.byte_len,
        qp_num: qpn,
        ..Wc::default()
    }
}

/// Hands the completions of pieces among `wcs` (just polled from the
/// device) to their queue pairs, and moves the program's own to the front
/// in their order; returns how many are the program's, and whether any
/// piece completed.
pub(super) fn route(c: &CqInner, wcs: &mut [Wc]) -> (usize, bool) {
    let (mut kept, mut pieces) = (0, false);
    for i in 0..wcs.len() {
        let wc = wcs[i];
        if !is_piece(wc.wr_id) {
            wcs[kept] = wc;
            kept += 1;
        } else if let Some(q) = c.qps.iter().find(|q| q.qpn == wc.qp_num) {
            lock(&q.inner).fq.deliver(wc.wr_id, wc.status);
            pieces = true;
        }
        // A piece of a queue pair the program destroyed: nothing waits
        // for it.
    }
    (kept, pieces)
}

/// Lets each queue pair with completions handed over (`pieces`) or with
/// requests waiting post what it may now, and holds the requests that
/// finished for the program.
pub(super) fn pump(c: &mut CqInner, pieces: bool) {
    let CqInner {
        held, qps, done, ..
    } = c;
    for q in qps.iter() {
        if !pieces && !q.waiting.load(Ordering::Relaxed) {
            continue;
        }
        let mut inner = lock(&q.inner);
        let _ = inner.fq.poll(done);
        q.waiting.store(inner.fq.unposted(), Ordering::Relaxed);
        for d in done.drain(..) {
            if d.signaled || d.status != 0 {
                held.push_back(wc_of(&d, q.qpn));
            }
            if let Some(buf) = d.inline {
                if inner.spare.len() < SPARE_BUFFERS {
                    inner.spare.push(buf);
                }
            }
        }
    }
}

/// Inline buffers a queue pair keeps for reuse.
const SPARE_BUFFERS: usize = 64;

/// Takes every completion from the device: pieces to their queue pairs,
/// the rest held for the program; then lets each queue pair post what it
/// may and hold its finished requests for the program. The provider's
/// error, if its poll fails.
pub(super) fn drain(cq: &Cq, c: &mut CqInner) -> Result<(), c_int> {
    let mut buf = [Wc::default(); 32];
    let mut pieces = false;
    loop {
        // SAFETY: the provider's poll of its own completion queue, into a
        // buffer of 32 entries.
        let n = unsafe { (cq.provider.poll_cq)(cq.cq as *mut sys::ibv_cq, 32, buf.as_mut_ptr()) };
        if n < 0 {
            return Err(n);
        }
        let (kept, p) = route(c, &mut buf[..n as usize]);
        c.held.extend(&buf[..kept]);
        pieces |= p;
        if n < 32 {
            break;
        }
    }
    pump(c, pieces);
    cq.drains.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The context's `poll_cq`.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut sys::ibv_cq, num: c_int, wc: *mut Wc) -> c_int {
    entry("ibv_poll_cq", -1, || {
        let Some(c) = cq_of(cq as usize) else {
            // SAFETY: a completion queue of a context the library took over.
            let ctx = unsafe { (*cq).context };
            return match context::provider(ctx) {
                // SAFETY: the program's arguments, to the provider.
                Some(p) => unsafe { (p.poll_cq)(cq, num, wc) },
                None => -1,
            };
        };
        let num = usize::try_from(num).unwrap_or(0);
        let mut inner = lock(&c.inner);
        let mut k = 0;
        if inner.held.is_empty() && num > 0 {
            // Nothing held: the device's completions go straight into the
            // program's array, the pieces' taken out.
            // SAFETY: the provider's poll into the program's array of
            // `num` entries.
            let n = unsafe { (c.provider.poll_cq)(cq, num as c_int, wc) };
            if n < 0 {
                return n;
            }
            // SAFETY: the provider wrote the first `n` entries.
            let wcs = unsafe { std::slice::from_raw_parts_mut(wc, n as usize) };
            let (kept, pieces) = route(&inner, wcs);
            pump(&mut inner, pieces);
            c.drains.fetch_add(1, Ordering::Relaxed);
            k = kept;
        } else if let Err(rc) = drain(&c, &mut inner) {
            if inner.held.is_empty() {
                return rc;
            }
        }
        while k < num {
            let Some(w) = inner.held.pop_front() else {
                break;
            };
            // SAFETY: the program's array holds `num` entries.
            unsafe { wc.add(k).write(w) };
            k += 1;
        }
        k as c_int
    })
}

/// The context's `req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(
    cq: *mut sys::ibv_cq,
    solicited_only: c_int,
) -> c_int {
    entry_rc("ibv_req_notify_cq", || {
        // SAFETY: a completion queue of a context the library took over.
        let ctx = unsafe { (*cq).context };
        let Some(p) = context::provider(ctx) else {
            return libc::EINVAL;
        };
        // SAFETY: the program's arguments, to the provider.
        let rc = unsafe { (p.req_notify_cq)(cq, solicited_only) };
        if rc == 0 {
            if let Some(c) = cq_of(cq as usize) {
                lock(&c.inner).armed = true;
            }
        }
        rc
    })
}

/// For `ibv_get_cq_event` on `channel`: a completion queue of it that the
/// program armed while the library held completions for it, if any (its
/// event is then the library's, counted for `ibv_ack_cq_events`).
pub(crate) fn made_event(
    channel: *mut sys::ibv_comp_channel,
) -> Option<(*mut sys::ibv_cq, *mut c_void)> {
    let cqs: Vec<Arc<Cq>> = {
        let cqs = CQS.read().unwrap_or_else(PoisonError::into_inner);
        cqs.as_ref()?.values().cloned().collect()
    };
    for c in cqs {
        let cq = c.cq as *mut sys::ibv_cq;
        // SAFETY: a live completion queue (the program has not destroyed
        // it: `cq_destroyed` would have removed it).
        let (on, context) = unsafe { ((*cq).channel == channel, (*cq).cq_context) };
        if !on {
            continue;
        }
        let mut inner = lock(&c.inner);
        if inner.armed && !inner.held.is_empty() {
            inner.armed = false;
            inner.made_events += 1;
            return Some((cq, context));
        }
    }
    None
}

/// An event the device raised for `cq` reached the program.
pub(crate) fn event_taken(cq: *mut sys::ibv_cq) {
    if let Some(c) = cq_of(cq as usize) {
        lock(&c.inner).armed = false;
    }
}

/// Of `n` events the program acknowledges for `cq`, how many the device
/// raised (the rest were the library's).
pub(crate) fn device_events(cq: *mut sys::ibv_cq, n: u32) -> u32 {
    let Some(c) = cq_of(cq as usize) else {
        return n;
    };
    let mut inner = lock(&c.inner);
    let ours = inner.made_events.min(n);
    inner.made_events -= ours;
    n - ours
}

/// The progress thread: polls for programs that do not (see the module
/// docs).
pub(crate) mod progress {
    use super::*;

    /// Whether the thread sleeps until woken.
    static PARKED: AtomicBool = AtomicBool::new(false);
    static THREAD: OnceLock<Thread> = OnceLock::new();

    /// How soon it looks again at a queue nobody drains.
    const TICK: Duration = Duration::from_millis(1);
    /// How soon it looks again when the program drains every queue with
    /// waiting requests itself.
    const RELAXED: Duration = Duration::from_millis(10);
    /// How long nothing waits before it sleeps until woken.
    const IDLE: Duration = Duration::from_millis(100);

    /// A queue pair has requests waiting again: wakes the thread if it
    /// sleeps.
    #[inline]
    pub(crate) fn busy() {
        match THREAD.get() {
            Some(t) => {
                if PARKED.load(Ordering::Acquire) && PARKED.swap(false, Ordering::AcqRel) {
                    t.unpark();
                }
            }
            None => start(),
        }
    }

    fn start() {
        let _ = THREAD.get_or_init(|| {
            std::thread::Builder::new()
                .name("mtrdma-progress".into())
                .spawn(run)
                .map(|h| h.thread().clone())
                .unwrap_or_else(|_| std::thread::current())
        });
    }

    fn run() {
        let mut seen: HashMap<usize, u64> = HashMap::new();
        let mut idle_since = Instant::now();
        loop {
            let found = entry("progress", Look::default(), || look(&mut seen));
            let now = Instant::now();
            if found.waiting {
                idle_since = now;
            } else if now.duration_since(idle_since) >= IDLE {
                PARKED.store(true, Ordering::Release);
                // Requests queued between the look and the flag find the
                // flag set and unpark; look once more for those before.
                let again = entry("progress", Look::default(), || look(&mut seen));
                if !again.waiting {
                    std::thread::park();
                }
                PARKED.store(false, Ordering::Release);
                idle_since = Instant::now();
                continue;
            }
            let mut sleep = if found.helped { TICK } else { RELAXED };
            if let Some(at) = found.next {
                sleep = sleep.min(at.saturating_duration_since(now));
            }
            std::thread::sleep(sleep);
        }
    }

    /// What a look found.
    #[derive(Debug, Default)]
    struct Look {
        /// Requests wait somewhere.
        waiting: bool,
        /// A queue nobody had drained since the last look was drained.
        helped: bool,
        /// When an engine it drained wants to be polled next.
        next: Option<Instant>,
    }

    /// Drains the completion queues whose queue pairs have requests
    /// waiting and that nobody drained since the last look (`seen`: the
    /// drain counts then).
    fn look(seen: &mut HashMap<usize, u64>) -> Look {
        let cqs: Vec<Arc<Cq>> = {
            let cqs = CQS.read().unwrap_or_else(PoisonError::into_inner);
            cqs.as_ref()
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default()
        };
        let mut found = Look::default();
        for c in &cqs {
            let drains = c.drains.load(Ordering::Relaxed);
            let last = seen.insert(c.cq, drains);
            let mut inner = lock(&c.inner);
            if !inner.qps.iter().any(|q| q.waiting.load(Ordering::Relaxed)) {
                continue;
            }
            found.waiting = true;
            if last.is_some_and(|l| l != drains) {
                continue;
            }
            found.helped = true;
            let _ = drain(c, &mut inner);
            seen.insert(c.cq, c.drains.load(Ordering::Relaxed));
            for q in &inner.qps {
                if let Some(at) = lock(&q.inner).fq.poll_by() {
                    found.next = Some(found.next.map_or(at, |n: Instant| n.min(at)));
                }
            }
        }
        seen.retain(|k, _| cqs.iter().any(|c| c.cq == *k));
        found
    }
}
