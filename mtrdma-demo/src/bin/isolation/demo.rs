//! The demo's tenants and how they run: the policy, the two paths, bulk
//! senders, the latency probe and the QP storm.

use super::*;
use mtrdma::verbs::PollCompletions;
pub(crate) use mtrdma_demo::lane::Lane;

/// The demo's tenants, all in one policy and one quota table.
pub(crate) fn policy(args: &Args) -> Policy {
    let mut tenants = vec![TenantEntry::new(PROBE, "latency").with_class(TrafficClass::Latency)];
    let most = args.bulk.iter().copied().max().unwrap_or(1) as u32;
    for i in 0..most {
        tenants.push(TenantEntry::new(TenantId(BULK0 + i), format!("bulk{i}")));
    }
    for (id, w) in WEIGHTED {
        tenants.push(TenantEntry::new(TenantId(id), format!("weight{w}")).with_weight(w));
    }
    let cap = (args.cap_mbps * 1e6) as u64;
    // A burst of four chunks: the capped tenant may catch up a turn it
    // lost because the bulk budget was full when its time came.
    let burst = args.chunk.saturating_mul(4);
    tenants.push(TenantEntry::new(CAPPED, "capped").with_rate(RateLimit::new(cap, burst)));
    tenants.push(TenantEntry::new(FREE, "free"));
    tenants.push(
        TenantEntry::new(STORM, "storm")
            .with_qp_create_rate(RateLimit::new(STORM_RATE, 5))
            .with_mr_reg_rate(RateLimit::new(STORM_RATE, 5)),
    );
    Policy::new(LinkConfig::new(100_000_000_000), tenants)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Alone,
    Unprotected,
    Mtrdma,
}

impl Way {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Way::Alone => "alone",
            Way::Unprotected => "unprotected",
            Way::Mtrdma => "mtrdma",
        }
    }
}

/// Who runs in one measurement.
#[derive(Default)]
pub(crate) struct Cast {
    pub(crate) probe: bool,
    pub(crate) bulk: Vec<TenantId>,
    pub(crate) storm: bool,
}

/// What one measurement found.
#[derive(Default)]
pub(crate) struct Measured {
    pub(crate) probe_us: Vec<f64>,
    /// Per bulk tenant, MB/s over the measurement window.
    pub(crate) bulk_mbps: Vec<f64>,
    /// Per bulk tenant, (seconds, MB/s) in 250 ms bins from the start.
    pub(crate) timeline: Vec<Vec<(f64, f64)>>,
    /// Storm operations done and refused per second.
    pub(crate) storm_ok: f64,
    pub(crate) storm_refused: f64,
}

pub(crate) struct Demo<'a> {
    pub(crate) args: &'a Args,
    pub(crate) pd: ProtectionDomain,
    /// The receiving side's, on `--peer-device` (else `pd`).
    pub(crate) peer: Option<ProtectionDomain>,
    pub(crate) table: QuotaTable,
    pub(crate) progress: &'a RefCell<crate::progress::Progress>,
}

pub(crate) struct BulkLane {
    pub(crate) lane: Box<dyn Lane>,
    pub(crate) remote: RemoteRegion,
    pub(crate) pool: Vec<MemoryRegion>,
}

impl Demo<'_> {
    /// Where the targets of the tenants' WRITEs live.
    pub(crate) fn far(&self) -> &ProtectionDomain {
        self.peer.as_ref().unwrap_or(&self.pd)
    }

    /// A connected pair, the sending side created for `tenant` if given.
    pub(crate) fn connect(
        &self,
        depth: u32,
        tenant: Option<&TenantHandle>,
    ) -> Result<(QueuePair, QueuePair), Error> {
        // A local ACK timeout of 4.096 us x 2^20 (about 4 s): across a
        // shaped link the unprotected bulk tenants' megabytes queue for
        // longer than the default 67 ms, which would resend what is only
        // waiting.
        let mut a = self.pd.queue_pair().max_send_wr(depth).ack_timeout(20);
        if let Some(t) = tenant {
            a = a.tenant(t);
        }
        let a = a.build()?;
        let b = self
            .far()
            .queue_pair()
            .max_send_wr(depth)
            .ack_timeout(20)
            .build()?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        Ok((a.connect(&eb)?, b.connect(&ea)?))
    }

    /// A tenant's queue pair, posting straight or through `shared`.
    pub(crate) fn lane(
        &self,
        tenant: TenantId,
        shared: Option<&SharedScheduler>,
        peers: &mut Vec<QueuePair>,
    ) -> Result<Box<dyn Lane>, String> {
        let depth = u32::try_from(self.args.depth.max(8) * 4).unwrap_or(u32::MAX);
        // Scheduled, the queue pair is created for its tenant (admitted
        // against its quota, scheduled as it).
        let handle = match shared {
            Some(_) => Some(self.table.attach(tenant).map_err(|e| e.to_string())?),
            None => None,
        };
        let (qp, peer) = self
            .connect(depth, handle.as_ref())
            .map_err(|e| e.to_string())?;
        peers.push(peer);
        Ok(match shared {
            None => Box::new(qp),
            Some(shared) => Box::new(
                qp.scheduled_on(
                    shared,
                    ScheduleConfig {
                        max_pieces_in_flight: depth,
                        ..ScheduleConfig::default()
                    },
                )
                .map_err(|e| e.to_string())?,
            ),
        })
    }

    pub(crate) fn measure(&self, way: Way, cast: &Cast) -> Result<Measured, String> {
        println!("{}", self.progress.borrow_mut().measurement(way.name()));
        let args = self.args;
        let shared = match way {
            Way::Mtrdma => Some(
                SharedScheduler::new(SharedConfig {
                    chunk_bytes: args.chunk,
                    bulk_bytes_in_flight: args.budget,
                    ..SharedConfig::default()
                })
                .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        let mut peers = Vec::new();
        let err = |e: Error| e.to_string();
        let probe = if cast.probe {
            let lane = self.lane(PROBE, shared.as_ref(), &mut peers)?;
            let target = self
                .far()
                .allocate(PROBE_BYTES, Access::REMOTE_READ_WRITE)
                .map_err(err)?;
            let local = self.pd.allocate(PROBE_BYTES, Access::LOCAL).map_err(err)?;
            Some((lane, target, local))
        } else {
            None
        };
        let mut bulk = Vec::new();
        let mut targets = Vec::new();
        for &tenant in &cast.bulk {
            let lane = self.lane(tenant, shared.as_ref(), &mut peers)?;
            let target = self
                .far()
                .allocate(args.msg, Access::REMOTE_READ_WRITE)
                .map_err(err)?;
            // One registration per tenant, its `depth` buffers pieces of it.
            let pool = self
                .pd
                .allocate(args.msg * args.depth, Access::LOCAL)
                .and_then(|r| r.into_pieces(args.msg))
                .map_err(err)?;
            bulk.push(BulkLane {
                lane,
                remote: target.remote().expect("remote access granted"),
                pool,
            });
            targets.push(target);
        }
        let storm_handle = match (cast.storm, way) {
            (true, Way::Mtrdma) => Some(self.table.attach(STORM).map_err(|e| e.to_string())?),
            _ => None,
        };

        let stop = &AtomicBool::new(false);
        let start = Instant::now();
        let window = (
            args.warmup,
            args.warmup + Duration::from_secs_f64(args.seconds),
        );
        let msg = args.msg;
        let mut measured = Measured::default();
        std::thread::scope(|s| -> Result<(), String> {
            let bulk_thread = (!bulk.is_empty())
                .then(|| s.spawn(move || drive_bulk(bulk, msg, start, window, stop)));
            let storm = cast.storm.then(|| {
                let pd = &self.pd;
                let run = StormRun {
                    handle: storm_handle.as_ref(),
                    start,
                    window,
                    stop,
                };
                s.spawn(move || storm(pd, run, false))
            });
            let probe_thread = probe.map(|(lane, target, local)| {
                s.spawn(move || run_probe(lane, &target, local, start, window, stop))
            });
            while start.elapsed() < window.1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Release);
            if let Some(t) = probe_thread {
                measured.probe_us = t.join().map_err(|_| "the probe thread panicked")??;
            }
            if let Some(t) = bulk_thread {
                let records = t.join().map_err(|_| "the bulk thread panicked")??;

                measured.bulk_mbps = (0..cast.bulk.len())
                    .map(|i| rate_mbps(&records, i, window))
                    .collect();
                measured.timeline = timeline(&records, cast.bulk.len(), window.1);
            }
            if let Some(t) = storm {
                let (ok, refused) = t.join().map_err(|_| "the storm thread panicked")??;
                measured.storm_ok = ok as f64 / args.seconds;
                measured.storm_refused = refused as f64 / args.seconds;
            }
            Ok(())
        })?;
        drop(peers);
        Ok(measured)
    }
}

/// (tenant index, completion time since start, bytes)
pub(crate) type Record = (usize, Duration, u64);

pub(crate) fn drive_bulk(
    mut lanes: Vec<BulkLane>,
    msg: usize,
    start: Instant,
    window: (Duration, Duration),
    stop: &AtomicBool,
) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        for (i, b) in lanes.iter_mut().enumerate() {
            while let Some(region) = b.pool.pop() {
                b.lane.post(SendOp::Write(b.remote), region, msg)?;
            }
            b.lane.reap(&mut out)?;
            let now = start.elapsed();
            for c in out.drain(..) {
                if !c.status.is_success() {
                    return Err(format!("a bulk WRITE failed: {}", c.status));
                }
                if now < window.1 {
                    records.push((i, now, u64::from(c.byte_len)));
                }
                b.pool.push(c.region);
            }
        }
    }
    Ok(records)
}

pub(crate) fn run_probe(
    mut lane: Box<dyn Lane>,
    target: &MemoryRegion,
    local: MemoryRegion,
    start: Instant,
    window: (Duration, Duration),
    stop: &AtomicBool,
) -> Result<Vec<f64>, String> {
    let remote = target.remote().expect("remote access granted");
    let mut region = Some(local);
    let mut samples = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let t0 = Instant::now();
        let r = region.take().expect("the probe region is back");
        lane.post(SendOp::Write(remote), r, PROBE_BYTES)?;
        while region.is_none() {
            lane.reap(&mut out)?;
            if let Some(c) = out.pop() {
                if !c.status.is_success() {
                    return Err(format!("a probe WRITE failed: {}", c.status));
                }
                region = Some(c.region);
            }
        }
        let since = t0 - start;
        if since >= window.0 && since < window.1 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(samples)
}

/// Sizes a sweeping storm registers in turn (1 KiB to 64 MiB).
const SWEEP_SIZES: [usize; 9] = [
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

/// How a storm runs: as whose tenant (`handle`: admitted, and rate
/// limited, against its quota; none: no limits), the window it counts in
/// (from `start`), and the flag that ends it.
#[derive(Clone, Copy)]
pub(crate) struct StormRun<'a> {
    pub(crate) handle: Option<&'a TenantHandle>,
    pub(crate) start: Instant,
    pub(crate) window: (Duration, Duration),
    pub(crate) stop: &'a AtomicBool,
}

impl StormRun<'_> {
    /// Whether now is inside the window counted.
    fn inside(&self) -> bool {
        (self.window.0..self.window.1).contains(&self.start.elapsed())
    }

    /// Whether the storm is to end.
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Creates and destroys queue pairs and registers and drops regions as
/// fast as it may: 64 KiB ones, or with `sweep` 1 KiB to 64 MiB in turn,
/// each in a protection domain of its own. Returns the operations done
/// and refused in the window.
pub(crate) fn storm(
    pd: &ProtectionDomain,
    run: StormRun<'_>,
    sweep: bool,
) -> Result<(u64, u64), String> {
    let handle = run.handle;
    let mut sizes = SWEEP_SIZES.iter().cycle();
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut count = |result: Result<(), Error>| -> Result<(), String> {
        let inside = run.inside();
        if admitted(result, inside, &mut refused, "storm")?.is_some() {
            ok += u64::from(inside);
        }
        Ok(())
    };
    while !run.stopped() {
        let qp = match handle {
            Some(h) => pd.queue_pair().tenant(h).build(),
            None => pd.queue_pair().build(),
        };
        count(qp.map(drop))?;
        let (buf, own_pd) = if sweep {
            let size = *sizes.next().expect("a cycle never ends");
            let own = pd.context().alloc_pd().map_err(|e| format!("storm: {e}"))?;
            (vec![0u8; size], Some(own))
        } else {
            (vec![0u8; 64 << 10], None)
        };
        let pd = own_pd.as_ref().unwrap_or(pd);
        let mr = match handle {
            Some(h) => pd.register_for(h, buf, Access::LOCAL),
            None => pd.register(buf, Access::LOCAL),
        };
        count(mr.map(drop))?;
    }
    Ok((ok, refused))
}

/// What a storm's creation or registration gave: the object, or `None`
/// when the tenant's rate limit refused it (counted in `refused` if
/// `inside` the measured window, after sleeping until it may try again).
fn admitted<T>(
    result: Result<T, Error>,
    inside: bool,
    refused: &mut u64,
    storm: &str,
) -> Result<Option<T>, String> {
    match result {
        Ok(t) => Ok(Some(t)),
        Err(Error::Admission(AdmissionError::RateLimited { retry_after_ns, .. })) => {
            *refused += u64::from(inside);
            std::thread::sleep(Duration::from_nanos(retry_after_ns));
            Ok(None)
        }
        Err(e) => Err(format!("{storm}: {e}")),
    }
}

/// An RNR storm: SENDs to a peer that never posts a receive. Each is
/// answered with RNR NAKs at the shortest wait (10 us) until its retries
/// run out, which fails the queue pair; then a new pair, as fast as it
/// may. The sending queue pairs are the tenant's (`run.handle`).
/// Returns the SENDs failed so and the creations refused, in the window.
pub(crate) fn rnr_storm(
    pd: &ProtectionDomain,
    peer: &ProtectionDomain,
    run: StormRun<'_>,
) -> Result<(u64, u64), String> {
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut region = Some(pd.allocate(8, Access::LOCAL).map_err(|e| e.to_string())?);
    let mut out = Vec::new();
    while !run.stopped() {
        let inside = run.inside();
        let mut a = pd
            .queue_pair()
            .completion_events(true)
            .min_rnr_timer(1)
            .rnr_retry(mtrdma::verbs::MAX_RNR_RETRY);
        if let Some(h) = run.handle {
            a = a.tenant(h);
        }
        let Some(a) = admitted(a.build(), inside, &mut refused, "rnr storm")? else {
            continue;
        };
        // The RNR NAKs carry the receiver's shortest wait (code 1: 10 us).
        let b = peer
            .queue_pair()
            .min_rnr_timer(1)
            .build()
            .map_err(|e| e.to_string())?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let mut a = a.connect(&eb).map_err(|e| e.to_string())?;
        let _b = b.connect(&ea).map_err(|e| e.to_string())?;
        let r = region.take().expect("the region is back after every SEND");
        a.post_send(SendOp::Send, r, 0..8, 1)
            .map_err(|e| format!("rnr storm: {e}"))?;
        out.clear();
        while out.is_empty() {
            if a.poll_wait(&mut out, Duration::from_secs(5))
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("rnr storm: no completion within 5 s".into());
            }
        }
        let c: Completion = out.pop().expect("one completion");
        if c.status.is_success() {
            return Err("rnr storm: a SEND without a receive completed".into());
        }
        region = Some(c.region);
        ok += u64::from(inside);
    }
    Ok((ok, refused))
}

/// A UD flood: datagrams of one MTU to a peer's queue pair that posts no
/// receives (each crosses the link and is dropped at the receiver: UD has
/// no RNR, no retries and no congestion control), 64 outstanding, as fast
/// as it may. With `run.handle` the queue pair is the tenant's and its
/// sends go through the tenant's scheduler, so its work-request rate
/// applies. Returns the datagrams sent (and 0 refused) in the window.
pub(crate) fn ud_flood(
    pd: &ProtectionDomain,
    peer: &ProtectionDomain,
    run: StormRun<'_>,
) -> Result<(u64, u64), String> {
    let handle = run.handle;
    const DEPTH: u32 = 64;
    let e = |e: Error| format!("ud flood: {e}");
    let sink = peer.ud_queue_pair().build().map_err(e)?;
    let to = sink.endpoint();
    let mut b = pd
        .ud_queue_pair()
        .max_send_wr(DEPTH)
        .completion_events(true);
    if let Some(h) = handle {
        b = b.tenant(h);
    }
    let qp = b.build().map_err(e)?;
    let mtu = qp.mtu() as usize;
    let mut free = Vec::with_capacity(DEPTH as usize);
    for _ in 0..DEPTH {
        let buf = vec![0u8; mtu];
        free.push(
            match handle {
                Some(h) => pd.register_for(h, buf, Access::LOCAL),
                None => pd.register(buf, Access::LOCAL),
            }
            .map_err(e)?,
        );
    }
    let mut qp = match handle {
        Some(_) => UdFlooder::Scheduled(qp.scheduled(ScheduleConfig::default()).map_err(e)?),
        None => UdFlooder::Plain(qp),
    };
    let ah = qp.address_handle(&to).map_err(e)?;
    let (mut sent, mut out) = (0u64, Vec::new());
    while !run.stopped() {
        while let Some(r) = free.pop() {
            qp.post(&ah, to.qpn, to.qkey, r, mtu)
                .map_err(|p| format!("ud flood: {p}"))?;
        }
        out.clear();
        qp.poll_wait(&mut out).map_err(e)?;
        let inside = run.inside();
        for c in out.drain(..) {
            if !c.status.is_success() {
                return Err(format!("ud flood: a datagram failed: {}", c.status));
            }
            sent += u64::from(inside);
            free.push(c.region);
        }
    }
    drop(sink);
    Ok((sent, 0))
}

/// The UD flood's queue pair, plain or through its tenant's scheduler.
enum UdFlooder {
    Plain(UdQueuePair),
    Scheduled(ScheduledUdQueuePair),
}

impl UdFlooder {
    fn address_handle(&mut self, to: &UdEndpoint) -> Result<AddressHandle, Error> {
        match self {
            UdFlooder::Plain(q) => q.address_handle(to),
            UdFlooder::Scheduled(q) => q.address_handle(to),
        }
    }

    fn post(
        &mut self,
        ah: &AddressHandle,
        qpn: u32,
        qkey: u32,
        region: MemoryRegion,
        len: usize,
    ) -> Result<(), PostError> {
        match self {
            UdFlooder::Plain(q) => q.post_send(ah, qpn, qkey, region, 0..len, 0),
            UdFlooder::Scheduled(q) => q.post_send(ah, qpn, qkey, region, 0..len, 0),
        }
    }

    fn poll_wait(&mut self, out: &mut Vec<UdCompletion>) -> Result<usize, Error> {
        let wait = Duration::from_millis(100);
        match self {
            UdFlooder::Plain(q) => q.poll_wait(out, wait),
            UdFlooder::Scheduled(q) => q.poll_wait(out, wait),
        }
    }
}
