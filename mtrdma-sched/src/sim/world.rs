//! The simulated port at work: events in virtual time, the NIC's queue,
//! and each tenant's sender, window and completions.

use super::*;

pub(super) struct Sim<'a, S> {
    pub(super) config: &'a SimConfig,
    pub(super) specs: &'a [TenantSpec],
    pub(super) engines: Vec<Engine<S>>,
    /// The engine each tenant posts through.
    pub(super) owner: Vec<usize>,
    /// Each tenant's queue pair.
    pub(super) lanes: Vec<Lane<u64>>,
    /// Where the next fill of the NIC starts (round robin over engines).
    pub(super) next_engine: usize,
    pub(super) nic: VecDeque<InNic>,
    pub(super) wire_busy: bool,
    /// Exact time the wire frees, in units of 1/link_bps ns, so that
    /// back-to-back pieces do not each round up to a whole ns.
    pub(super) wire_end: u128,
    pub(super) events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    pub(super) seq: u64,
    pub(super) next_tag: usize,
    pub(super) wake_at: Option<u64>,
    pub(super) msgs: Vec<Msg>,
    pub(super) state: Vec<TenantState>,
    /// State of the jitter's generator.
    pub(super) rng: u64,
    /// The coordinator's gains ([`SimConfig::coordinator_every`]), if the
    /// tenants have windows and a coordinator runs.
    pub(super) gains: Option<ShareGains>,
    /// The coordinator's one-piece floor ([`SimConfig::piece_floor`]), the
    /// windows' piece size, and each latency tenant's last report.
    pub(super) floor: Option<FloorControl>,
    pub(super) floor_piece: u64,
    pub(super) shifts: Vec<Shift>,
    /// The most windowed tenants that had the floor at once, and the
    /// measured time all had it (ns).
    pub(super) floor_most: usize,
    pub(super) floor_all_ns: u64,
    /// What the tenants moved together, as the coordinator measures it
    /// (see [`SimConfig::measured_link_rate`]).
    pub(super) moved: LinkEstimate,
    /// Per tenant: the tags of the pieces posted in this pump (its list;
    /// kept only with [`SimConfig::signal_every`] above 1).
    pub(super) lists: Vec<Vec<usize>>,
    /// The tenants whose lists are not empty.
    pub(super) listed: Vec<usize>,
    /// Per tenant: tags of unsignaled pieces off the wire, waiting for the
    /// completion of a later piece to report them.
    pub(super) quiet: Vec<VecDeque<usize>>,
}

impl<S: Scheduler<u64>> Sim<'_, S> {
    pub(super) fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    /// A draw of the completion jitter.
    pub(super) fn jitter(&mut self) -> u64 {
        let span = self.config.completion_jitter_ns;
        if span == 0 {
            return 0;
        }
        // SplitMix64: the mixer of the state before its step.
        let draw = splitmix64(self.rng);
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        draw % (span + 1)
    }

    pub(super) fn tx_ns(&self, bytes: u64) -> u64 {
        let ns = (u128::from(bytes) * 8_000_000_000).div_ceil(u128::from(self.config.link_bps));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    pub(super) fn start(&mut self) -> Result<(), SimError> {
        for i in 0..self.specs.len() {
            let n = match self.specs[i].workload {
                Workload::Probe { .. } | Workload::MessageRate { .. } => 1,
                Workload::Bulk { outstanding, .. } => outstanding,
            };
            let start = self.specs[i].start.0;
            for _ in 0..n {
                if start == 0 {
                    self.post(i as u32, 0)?;
                } else {
                    self.at(start, Event::Post { tenant: i as u32 });
                }
            }
        }
        self.pump(0, false);
        Ok(())
    }

    /// Tenant `t` posts what its workload posts at once: each message goes
    /// straight to the NIC if the engine's fast path lets it
    /// ([`Gate::unhindered`], and the scheduler's caps), else to the
    /// scheduler.
    pub(super) fn post(&mut self, t: u32, now: u64) -> Result<(), SimError> {
        let spec = self.specs[t as usize];
        let (op, bytes, count) = match spec.workload {
            Workload::Probe { bytes, .. } => (Opcode::Send, bytes, 1),
            Workload::MessageRate { batch, bytes } => {
                self.state[t as usize].batch_left = batch;
                (Opcode::Send, bytes, batch)
            }
            Workload::Bulk { bytes, .. } => (Opcode::Write, bytes, 1),
        };
        let e = self.owner[t as usize];
        for _ in 0..count {
            let msg = self.msgs.len() as u64;
            self.msgs.push(Msg {
                tenant: t,
                posted: now,
            });
            let engine = &mut self.engines[e];
            let lane = &self.lanes[t as usize];
            let fast = engine.gate.as_ref().is_some_and(|g| {
                g.unhindered(lane, op, bytes, engine.sched.is_empty(), || Nanos(now))
            }) && engine.sched.admit_now(spec.id, bytes, Nanos(now)).is_ok();
            if fast {
                let grant = Grant {
                    tenant: spec.id,
                    class: spec.class,
                    op,
                    handle: msg,
                    offset: 0,
                    len: bytes,
                    is_last: true,
                };
                self.send(t as usize, grant, now);
                continue;
            }
            let d = Descriptor::new(spec.id, spec.class, op, bytes, msg);
            let engine = &mut self.engines[e];
            engine
                .sched
                .enqueue(d, Nanos(now))
                .map_err(|r| SimError::Refused(r.reason))?;
            if let Some(g) = &mut engine.gate {
                g.enqueued(spec.class);
            }
        }
        Ok(())
    }

    /// Puts `grant`, of tenant `t`, in the NIC queue, counted in its lane.
    pub(super) fn send(&mut self, t: usize, grant: Grant<u64>, now: u64) {
        let tag = self.next_tag;
        self.next_tag += 1;
        let gate = self.engines[self.owner[t]]
            .gate
            .as_mut()
            .expect("only gated engines have lanes");
        gate.sent(&mut self.lanes[t], tag, grant.len, || Nanos(now));
        // Provisionally: the list's pieces are settled when it closes.
        let signaled = grant.is_last || self.config.signal_every <= 1;
        if self.config.signal_every > 1 {
            if self.lists[t].is_empty() {
                self.listed.push(t);
            }
            self.lists[t].push(tag);
        }
        self.nic.push_back(InNic {
            grant,
            tag: Some(tag),
            signaled,
        });
    }

    /// The end of a pump: each tenant's pieces of it go as one list, in
    /// which the last piece and every `k`-th ask for a completion, `k`
    /// half the list (rounded up) and at most
    /// [`SimConfig::signal_every`], as the verbs engine posts them: a
    /// window of a few pieces frees half of them while the rest are on
    /// the wire.
    pub(super) fn close_lists(&mut self) {
        for t in std::mem::take(&mut self.listed) {
            let n = self.lists[t].len();
            let every = n
                .div_ceil(2)
                .clamp(1, self.config.signal_every.max(1) as usize);
            for (i, tag) in self.lists[t].drain(..).enumerate() {
                if (i + 1) % every != 0 && i + 1 != n {
                    continue;
                }
                if let Some(p) = self.nic.iter_mut().rev().find(|p| p.tag == Some(tag)) {
                    p.signaled = true;
                }
            }
        }
    }

    /// Fills the NIC queue from the engines and starts the wire.
    /// `wire_just_freed`: called on the event of the wire freeing, whose
    /// time is rounded up to a whole ns; the next piece starts at the exact
    /// free time.
    pub(super) fn pump(&mut self, now: u64, wire_just_freed: bool) {
        let n = self.engines.len();
        if n == 1 {
            self.step(0, now, usize::MAX);
        } else {
            // Processes posting at once: round robin over their engines,
            // one step each per turn, until none moves.
            let mut idle = 0;
            while idle < n {
                let e = self.next_engine % n;
                self.next_engine = (e + 1) % n;
                if self.step(e, now, 1) > 0 {
                    idle = 0;
                } else {
                    idle += 1;
                }
            }
        }
        self.close_lists();
        if !self.wire_busy {
            if let Some(head) = self.nic.front() {
                self.wire_busy = true;
                let bps = u128::from(self.config.link_bps);
                let start = if wire_just_freed {
                    self.wire_end
                } else {
                    self.wire_end.max(u128::from(now) * bps)
                };
                self.wire_end = start + u128::from(head.grant.len) * 8_000_000_000;
                let end = u64::try_from(self.wire_end.div_ceil(bps)).unwrap_or(u64::MAX);
                self.at(end, Event::WireDone);
            }
        }
    }

    /// Engine `e` at `now`, as the verbs engine pumps: its lanes' pending
    /// pieces first, in grant order, then new grants from its scheduler
    /// while the gate lets it ask, each posted if it may go. Stops after
    /// `limit` moves (a piece posted or a grant taken); returns them.
    pub(super) fn step(&mut self, e: usize, now: u64, limit: usize) -> usize {
        if self.engines[e].gate.is_none() {
            return self.step_raw(e, now, limit);
        }
        let mut moved = 0;
        let mut order = std::mem::take(&mut self.engines[e].order);
        order.drain(|t| {
            if moved >= limit {
                return Post::Held;
            }
            let post = self.post_head(e, t, now);
            if post == Post::Posted {
                moved += 1;
            }
            post
        });
        let bound = Gate::pending_bound(self.lanes.len(), self.engines[e].solo);
        while moved < limit && order.len() < bound {
            let engine = &mut self.engines[e];
            let gate = engine.gate.as_mut().expect("checked above");
            if !gate.may_grant() {
                break;
            }
            let grant = match engine.sched.dequeue(Nanos(now)) {
                Dequeue::Ready(grant) => grant,
                Dequeue::Wait(t) => {
                    self.wake(t.0);
                    break;
                }
                Dequeue::Empty => break,
            };
            gate.granted(&grant);
            let t = self.msgs[grant.handle as usize].tenant as usize;
            let class = grant.class;
            self.lanes[t].push_pending(grant);
            order.push(class, t);
            moved += 1;
            if moved < limit {
                order.drain_newest(class, t, |t| {
                    let post = self.post_head(e, t, now);
                    if post == Post::Posted {
                        moved += 1;
                    }
                    post
                });
            }
        }
        self.engines[e].order = order;
        moved
    }

    /// No mtrdma: whatever engine `e`'s scheduler hands out, while the
    /// NIC queue has room.
    pub(super) fn step_raw(&mut self, e: usize, now: u64, limit: usize) -> usize {
        let mut moved = 0;
        while moved < limit && self.nic.len() < self.engines[e].raw_depth {
            match self.engines[e].sched.dequeue(Nanos(now)) {
                Dequeue::Ready(grant) => {
                    self.nic.push_back(InNic {
                        grant,
                        tag: None,
                        signaled: true,
                    });
                    moved += 1;
                }
                Dequeue::Wait(t) => {
                    self.wake(t.0);
                    break;
                }
                Dequeue::Empty => break,
            }
        }
        moved
    }

    /// Posts tenant `t`'s first pending piece if the gate of engine `e`
    /// lets it go at `now` (asking for a wake-up when its window's pacing
    /// names a time).
    pub(super) fn post_head(&mut self, e: usize, t: usize, now: u64) -> Post {
        let lane = &self.lanes[t];
        let Some(len) = lane.pending().front().map(|g| g.len) else {
            return Post::Held;
        };
        let gate = self.engines[e].gate.as_ref().expect("gated");
        if gate.budget_holds(lane, len) {
            return Post::Budget;
        }
        match gate.admits(lane, len, || Nanos(now)) {
            Admit::Now => {
                let grant = self.lanes[t].pop_pending().expect("checked above");
                self.send(t, grant, now);
                Post::Posted
            }
            Admit::At(at) => {
                self.wake(at.0);
                Post::Held
            }
            Admit::AfterCompletion => Post::Held,
        }
    }

    /// Asks for a pump at `t`, unless one is due earlier.
    pub(super) fn wake(&mut self, t: u64) {
        if self.wake_at.is_none_or(|w| t < w) {
            self.wake_at = Some(t);
            self.at(t, Event::Wake);
        }
    }

    pub(super) fn run(&mut self) -> Result<(), SimError> {
        let end = self.config.duration.0;
        let warm = self.config.warmup.0;
        while let Some(Reverse((now, _, event))) = self.events.pop() {
            if now > end {
                break;
            }
            match event {
                Event::WireDone => {
                    self.wire_busy = false;
                    if let Some(InNic {
                        grant: g,
                        tag,
                        signaled,
                    }) = self.nic.pop_front()
                    {
                        let msg = self.msgs[g.handle as usize];
                        self.state[msg.tenant as usize].moved += g.len;
                        if now > warm {
                            // Bytes of the piece that left inside the window.
                            let tx = self.tx_ns(g.len).max(1);
                            let inside = (now - warm).min(tx);
                            let bytes = u128::from(g.len) * u128::from(inside) / u128::from(tx);
                            self.state[msg.tenant as usize].bytes += bytes as u64;
                        }
                        let done = now + self.config.base_latency_ns + self.jitter();
                        match tag {
                            Some(tag) if signaled => {
                                let tenant = msg.tenant;
                                self.at(done, Event::PieceDone { tenant, tag });
                            }
                            Some(tag) => self.quiet[msg.tenant as usize].push_back(tag),
                            None => {}
                        }
                        if g.is_last {
                            self.at(done, Event::Completion { msg: g.handle });
                        }
                    }
                    self.pump(now, true);
                }
                Event::Completion { msg } => {
                    let m = self.msgs[msg as usize];
                    let t = m.tenant as usize;
                    if m.posted >= warm {
                        self.state[t].samples.push(now - m.posted);
                    }
                    match self.specs[t].workload {
                        Workload::Probe { think_ns: 0, .. } | Workload::Bulk { .. } => {
                            self.post(m.tenant, now)?;
                        }
                        Workload::Probe { think_ns, .. } => {
                            self.at(now + think_ns, Event::Post { tenant: m.tenant });
                        }
                        Workload::MessageRate { .. } => {
                            self.state[t].batch_left -= 1;
                            if self.state[t].batch_left == 0 {
                                self.post(m.tenant, now)?;
                            }
                        }
                    }
                    self.pump(now, false);
                }
                Event::PieceDone { tenant, tag } => {
                    let t = tenant as usize;
                    let gate = self.engines[self.owner[t]]
                        .gate
                        .as_mut()
                        .expect("only gated engines tag pieces");
                    // The unsignaled pieces before it complete with it.
                    while let Some(&q) = self.quiet[t].front() {
                        if q > tag {
                            break;
                        }
                        self.quiet[t].pop_front();
                        gate.completed_unsampled(&mut self.lanes[t], q, || Nanos(now));
                    }
                    gate.completed(&mut self.lanes[t], tag, || Nanos(now), Nanos::ZERO);
                    if let Some(report) = self.lanes[t].take_shift_report() {
                        self.shifts[t] = report;
                    }
                    self.pump(now, false);
                }
                Event::Post { tenant } => {
                    self.post(tenant, now)?;
                    self.pump(now, false);
                }
                Event::Recompute => {
                    self.recompute(now);
                    self.at(now + self.config.coordinator_every.0, Event::Recompute);
                    self.pump(now, false);
                }
                Event::Wake => {
                    if self.wake_at == Some(now) {
                        self.wake_at = None;
                        self.pump(now, false);
                    }
                }
            }
        }
        Ok(())
    }

    /// The coordinator's recomputation: what each tenant moved since the
    /// last, into the gains of their windows.
    pub(super) fn recompute(&mut self, now: u64) {
        // The time a piece takes on the wire, by which the floor's steps
        // are judged.
        let piece = Nanos(self.tx_ns(self.floor_piece));
        let Some(gains) = self.gains.as_mut() else {
            return;
        };
        let every = self.config.coordinator_every.0.max(1);
        let rates: Vec<TenantRate> = self
            .specs
            .iter()
            .zip(&mut self.state)
            .map(|(spec, st)| {
                let moved = std::mem::take(&mut st.moved);
                TenantRate {
                    id: spec.id,
                    weight: spec.policy.weight,
                    bytes_per_sec: (u128::from(moved) * 1_000_000_000 / u128::from(every)) as u64,
                    // A bulk tenant always has more to send, once started.
                    wants_more: matches!(spec.workload, Workload::Bulk { .. })
                        && spec.start.0 <= now,
                    cap: spec.policy.byte_cap.map(|c| c.per_second),
                }
            })
            .collect();
        gains.update(Nanos(now), &rates);
        // The link's use as the coordinator sees it: what the tenants moved,
        // smoothed over 200 ms, against the link's rate (which the
        // simulator knows; the coordinator takes the highest it has seen).
        let total: u64 = rates.iter().map(|r| r.bytes_per_sec).sum();
        let estimate = self.moved.update(total, every);
        let (used, rate) = if self.config.measured_link_rate {
            (self.moved.utilization_ppm(), estimate)
        } else {
            let link = self.config.link_bps as f64 / 8.0;
            let used = self.moved.smoothed() / link * 1e6;
            (used.clamp(0.0, 1e6) as u32, self.config.link_bps / 8)
        };
        let sharing = crate::share::sharing_for(gains.sharing_weight(), used);
        let link_rate = self.config.publish_link_rate.then_some(rate);
        // The floor: given to the windowed tenants that have started, in
        // the order of the specs.
        let senders = self
            .specs
            .iter()
            .zip(&self.lanes)
            .filter(|(spec, lane)| lane.window().is_some() && spec.start.0 <= now)
            .count();
        if let Some(floor) = self.floor.as_mut() {
            let report = FloorControl::merge(floor.permit(None), self.shifts.iter().copied());
            let n = floor.update(Nanos(now), report, piece, senders);
            self.floor_most = self.floor_most.max(n);
            if n == senders && now >= self.config.warmup.0 {
                self.floor_all_ns += self.config.coordinator_every.0;
            }
        }
        let mut sender = 0;
        for (spec, lane) in self.specs.iter().zip(&mut self.lanes) {
            let started = spec.start.0 <= now;
            let piece_floor = self.floor.as_ref().map(|f| {
                lane.set_permit(f.permit(None));
                started && f.permit(Some(sender)).on
            });
            if let Some(w) = lane.window_mut() {
                sender += usize::from(started);
                w.signals(&Signals {
                    gain_ppm: Some(gains.gain(spec.id)),
                    sharing_weight: Some(sharing),
                    link_rate,
                    piece_floor,
                    ..Signals::default()
                });
            }
        }
    }

    pub(super) fn report(&mut self) -> Report {
        let window = (self.config.duration - self.config.warmup).as_secs_f64();
        let mut tenants = Vec::with_capacity(self.specs.len());
        let mut normalised = Vec::new();
        let mut total = 0.0;
        for (spec, st) in self.specs.iter().zip(&mut self.state) {
            st.samples.sort_unstable();
            let gbps = st.bytes as f64 * 8.0 / window / 1e9;
            total += gbps;
            if let Workload::Bulk { .. } = spec.workload {
                normalised.push(gbps / f64::from(spec.policy.weight));
            }
            let pct = |p| percentile(&st.samples, p).map(Nanos);
            tenants.push(TenantReport {
                id: spec.id,
                class: spec.class,
                weight: spec.policy.weight,
                workload: spec.workload,
                bytes: st.bytes,
                gbps,
                messages: st.samples.len() as u64,
                p50: pct(0.5),
                p99: pct(0.99),
                p999: pct(0.999),
            });
        }
        let piece_floor = self.floor.as_ref().map(|f| FloorReport {
            granted: f.granted(),
            most: self.floor_most,
            withdrawals: f.withdrawals(),
            all_ppm: (self.floor_all_ns as f64
                / (self.config.duration - self.config.warmup).0 as f64
                * 1e6) as u32,
        });
        Report {
            tenants,
            total_gbps: total,
            jain_index: jain_index(&normalised),
            piece_floor,
        }
    }
}
