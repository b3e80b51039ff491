//! Queue pairs: the two paths (raw and scheduled) behind one interface,
//! and one side's connection.

use super::*;
use mtrdma::verbs::PollCompletions;

pub(crate) fn op_verb(op: SendOp) -> &'static str {
    match op {
        SendOp::Send | SendOp::SendWithImm(_) => "a SEND",
        SendOp::Write(_) | SendOp::WriteWithImm(..) => "an RDMA WRITE",
        SendOp::Read(_) => "an RDMA READ",
        SendOp::FetchAdd(..) | SendOp::CompareSwap { .. } => "an atomic",
    }
}

/// One connected queue pair and its buffers, for one message size.
pub(crate) struct Conn {
    pub(crate) qp: Qp,
    /// Our region the peer WRITEs into or READs from.
    pub(crate) target: MemoryRegion,
    /// The peer's region of `size` bytes.
    pub(crate) remote: RemoteRegion,
    /// Buffers not posted: sends (and READ destinations) take them.
    pub(crate) pool: Vec<MemoryRegion>,
    /// Receive completions seen (each receive is posted again).
    pub(crate) recvs: u64,
    pub(crate) size: usize,
    pub(crate) local: Endpoint,
    pub(crate) peer: Endpoint,
    pub(crate) out: Vec<Completion>,
    /// Sleep on the completion channel while no buffer is free.
    pub(crate) wait: bool,
    /// The window, sampled during a bandwidth run.
    pub(crate) window_samples: WindowSamples,
}

/// A scheduled queue pair's window sampled every [`WINDOW_SAMPLE_NS`]
/// during a bandwidth run: what it averaged, not only where it ended.
#[derive(Debug, Default)]
pub(crate) struct WindowSamples {
    pub(crate) n: u64,
    pub(crate) window: u64,
    pub(crate) in_flight: u64,
    /// Samples whose bytes in flight left no room for another piece.
    pub(crate) bound: u64,
    /// Sum of the smoothed delays (ns) of the samples that had one.
    pub(crate) smoothed: u64,
    pub(crate) with_delay: u64,
    /// Sum of the coordinator's gains on the window's growth (ppm).
    pub(crate) gain: u64,
    /// Sum of the weights sharing the link's growth.
    pub(crate) sharing: u64,
    pub(crate) last_ns: u64,
}

/// How often a bandwidth run samples its window.
pub(crate) const WINDOW_SAMPLE_NS: u64 = 5_000_000;

impl WindowSamples {
    /// Samples `w` if [`WINDOW_SAMPLE_NS`] passed since the last sample
    /// (`now_ns` since the run's start), for pieces of `piece` bytes.
    pub(crate) fn sample(
        &mut self,
        now_ns: u64,
        w: Option<mtrdma::verbs::WindowState>,
        piece: u64,
    ) {
        let Some(w) = w else { return };
        if self.n > 0 && now_ns < self.last_ns + WINDOW_SAMPLE_NS {
            return;
        }
        self.last_ns = now_ns;
        self.n += 1;
        self.window += w.window_bytes;
        self.in_flight += w.in_flight_bytes;
        self.gain += u64::from(w.gain_ppm);
        self.sharing += u64::from(w.sharing_weight);
        if w.in_flight_bytes + piece > w.window_bytes {
            self.bound += 1;
        }
        if let Some(d) = w.smoothed_delay {
            self.smoothed += d.0;
            self.with_delay += 1;
        }
    }

    /// One line for the report, or none without samples.
    pub(crate) fn summary(&self) -> Option<String> {
        if self.n == 0 {
            return None;
        }
        let n = self.n as f64;
        let delay = if self.with_delay == 0 {
            "-".to_string()
        } else {
            format!("{:.1}", self.smoothed as f64 / self.with_delay as f64 / 1e3)
        };
        Some(format!(
            " window over the run ({} samples): mean {:.0} B, in flight mean {:.0} B, no room for a piece in {:.0}% of samples, smoothed delay mean {delay} us, coordinator's gain mean {:.2}, weights sharing the growth mean {:.1}",
            self.n,
            self.window as f64 / n,
            self.in_flight as f64 / n,
            100.0 * self.bound as f64 / n,
            self.gain as f64 / n / 1e6,
            self.sharing as f64 / n,
        ))
    }
}

impl Conn {
    /// Posts `op` of the first `len` bytes of `region`, as a send.
    pub(crate) fn post_send(
        &mut self,
        op: SendOp,
        region: MemoryRegion,
        len: usize,
    ) -> Result<(), String> {
        self.qp
            .post_send(op, region, len, SEND_CTX)
            .map_err(|e| format!("posting {}: {e}", op_verb(op)))
    }

    /// Polls once: send buffers go back to the pool, receives are posted
    /// again. Returns the number of send-side completions. With `wait`
    /// and no buffer free, sleeps until a completion comes (at most
    /// [`WAIT_SLICE`]) rather than spinning.
    pub(crate) fn progress(&mut self, test: Test) -> Result<usize, String> {
        let block = self.wait && self.pool.is_empty();
        self.progress_blocking(test, block)
    }

    /// [`Conn::progress`], sleeping on the completion channel (at most
    /// [`WAIT_SLICE`]) if `block`.
    pub(crate) fn progress_blocking(&mut self, test: Test, block: bool) -> Result<usize, String> {
        let mut out = std::mem::take(&mut self.out);
        if block {
            self.qp
                .poll_wait(&mut out, WAIT_SLICE)
                .map_err(|e| format!("waiting for completions: {e}"))?;
        } else {
            self.qp
                .poll(&mut out)
                .map_err(|e| format!("polling the completion queue: {e}"))?;
        }
        let mut sends = 0;
        for c in out.drain(..) {
            if !c.status.is_success() {
                let what = if c.context == RECV_CTX {
                    "a receive"
                } else {
                    test.verb()
                };
                return Err(format!("{what} failed: {}", c.status));
            }
            if c.context == RECV_CTX {
                self.recvs += 1;
                self.qp
                    .post_recv(c.region, self.size, RECV_CTX)
                    .map_err(|e| format!("posting a receive: {e}"))?;
            } else {
                sends += 1;
                self.pool.push(c.region);
            }
        }
        self.out = out;
        Ok(sends)
    }

    /// A pool buffer, polling until one comes back.
    pub(crate) fn take_buffer(&mut self, test: Test) -> Result<MemoryRegion, String> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.pool.pop() {
                return Ok(r);
            }
            self.progress(test)?;
            if start.elapsed() > STALL {
                return Err(format!("no {} completed for {STALL:?}", test.verb()));
            }
        }
    }
}

/// What each side sets up; the same code runs on both.
pub(crate) struct Side {
    pub(crate) ctx: Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) tenant: Option<(TenantHandle, String)>,
    pub(crate) pool_bytes: u64,
    pub(crate) is_client: bool,
    pub(crate) flags: QpFlags,
}

impl Side {
    pub(crate) fn open(a: &Args, chunk: u64, is_client: bool) -> Result<Side, String> {
        let ctx = open_device(a.device.as_deref())?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("allocating a protection domain on {}: {e}", ctx.name()))?;
        let tenant = tenant_handle(a, chunk)?;
        Ok(Side {
            ctx,
            pd,
            tenant,
            pool_bytes: a.pool_mib.unwrap_or(64) << 20,
            is_client,
            flags: a.qp_flags,
        })
    }

    /// Buffers of `size` bytes that fit the pool memory, at most `want`.
    pub(crate) fn pool_count(&self, size: usize, want: usize) -> usize {
        want.min((self.pool_bytes / size as u64).max(1) as usize)
            .max(1)
    }

    pub(crate) fn outstanding(&self, p: &Params, size: usize) -> usize {
        if p.test.is_bw() {
            self.pool_count(size, p.tx_depth as usize)
        } else {
            2
        }
    }

    pub(crate) fn build_qp(
        &self,
        sq: u32,
        rq: u32,
        inline: u32,
    ) -> Result<PreparedQueuePair, String> {
        admitted_within(Duration::from_secs(10), || {
            let mut b = self
                .pd
                .queue_pair()
                .max_send_wr(sq)
                .max_recv_wr(rq)
                .max_inline_data(inline)
                .access(Access::REMOTE_ALL)
                .completion_events(self.flags.wait);
            if let Some(exp) = self.flags.ack_timeout {
                b = b.ack_timeout(exp);
            }
            if let Some((t, _)) = &self.tenant {
                b = b.tenant(t);
            }
            b.build()
        })
        .map_err(|e| format!("creating the queue pair: {e}"))
    }

    /// `size` zeroed bytes registered: for the tenant (admitted against
    /// its quota, waiting for its registration rate as for queue pairs),
    /// or plain without one.
    pub(crate) fn allocate(&self, size: usize, access: Access) -> Result<MemoryRegion, String> {
        admitted_within(Duration::from_secs(30), || match &self.tenant {
            Some((t, _)) => self.pd.register_for(t, vec![0u8; size], access),
            None => self.pd.allocate(size, access),
        })
        .map_err(|e| format!("registering {size} bytes: {e}"))
    }

    /// `count` buffers of `size` bytes, pieces of one registration: one
    /// region per side, posted as many requests at once.
    pub(crate) fn buffers(
        &self,
        size: usize,
        count: usize,
        access: Access,
    ) -> Result<Vec<MemoryRegion>, String> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let total = size
            .checked_mul(count)
            .ok_or_else(|| format!("{count} buffers of {size} bytes do not fit in memory"))?;
        self.allocate(total, access)?
            .into_pieces(size)
            .map_err(|e| format!("splitting {total} bytes into {size}-byte buffers: {e}"))
    }

    /// Creates the queue pair and buffers for `size`, swaps endpoints over
    /// `hs`, connects.
    pub(crate) fn connect(
        &self,
        p: &Params,
        size: usize,
        hs: &mut TcpStream,
    ) -> Result<Conn, String> {
        let test = p.test;
        let recvs = match test {
            Test::SendBw if !self.is_client => self.pool_count(size, BW_RECVS),
            Test::SendLat => LAT_RECVS,
            _ => 0,
        };
        let sends = if self.is_client || !test.is_bw() {
            self.outstanding(p, size)
        } else {
            0
        };
        let sq = if test.is_bw() { p.tx_depth.max(4) } else { 4 };
        let rq = u32::try_from(recvs).unwrap_or(u32::MAX).max(1);
        let mut prepared = self.build_qp(sq, rq, p.inline)?;
        let target = self.allocate(size, Access::REMOTE_ALL)?;
        let mine = target
            .remote()
            .ok_or("a region with remote access has no remote descriptor")?;
        // Receives go in before connecting, so the first SEND finds one.
        for r in self.buffers(size, recvs, Access::LOCAL)? {
            prepared
                .post_recv(r, 0..size, RECV_CTX)
                .map_err(|e| format!("posting a receive: {e}"))?;
        }
        let pool = self.buffers(size, sends, Access::LOCAL)?;
        let local = prepared.endpoint();
        let peer = exchange(
            hs,
            &Handshake {
                endpoint: local,
                regions: vec![mine],
            },
        )
        .map_err(|e| format!("exchanging endpoints: {e}"))?;
        let remote = peer
            .regions
            .first()
            .and_then(|r| r.slice(0, size as u64))
            .ok_or_else(|| {
                format!(
                    "the peer's region is smaller than the {size} bytes agreed on: {:?}",
                    peer.regions
                )
            })?;
        let qp = prepared
            .connect(&peer.endpoint)
            .map_err(|e| format!("connecting to the peer: {e}"))?;
        let qp = Qp::on_path(qp, p.path, || ScheduleConfig {
            chunk_bytes: p.chunk,
            max_pieces_in_flight: p.pieces,
            tenant: tenancy(
                self.tenant.as_ref().map(|(t, _)| t),
                self.flags.class.unwrap_or(TrafficClass::Bulk),
            ),
            window: self.flags.window.then(|| {
                let window = DelayWindowConfig::for_piece(p.chunk);
                std::sync::Arc::new(DelayWindowConfig {
                    target_ratio_ppm: self
                        .flags
                        .window_target_ppm
                        .unwrap_or(window.target_ratio_ppm),
                    target_floor: self.flags.window_floor.unwrap_or(window.target_floor),
                    queue_bytes: self.flags.window_queue.unwrap_or(window.queue_bytes),
                    ..window
                }) as std::sync::Arc<dyn mtrdma::sched::WindowFactory>
            }),
        })
        .map_err(|e| format!("setting up the scheduled path: {e}"))?;
        Ok(Conn {
            qp,
            target,
            remote,
            pool,
            recvs: 0,
            size,
            local,
            peer: peer.endpoint,
            out: Vec::new(),
            wait: self.flags.wait,
            window_samples: WindowSamples::default(),
        })
    }
}
