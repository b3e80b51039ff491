//! The pager at work: accesses, the cache's frames, requests to the
//! nodes and their completions.

use super::*;

impl Pager {
    /// The node cluster `g` lives on.
    pub(super) fn node_of(&self, g: u64) -> usize {
        place(g * self.k, self.k, self.nodes.len() as u64).0 as usize
    }

    /// Bytes in a cluster.
    pub(super) fn cluster_bytes(&self) -> usize {
        self.k as usize * PAGE
    }

    /// Cluster `g`'s `K` pages on its node.
    pub(super) fn remote_of(&self, g: u64) -> RemoteRegion {
        let (node, slot) = place(g * self.k, self.k, self.nodes.len() as u64);
        self.nodes[node as usize]
            .remote
            .slice(slot * PAGE as u64, self.cluster_bytes() as u64)
            .expect("the capacity check keeps every slot inside the node's region")
    }

    /// Writes every page of cluster `g` into `buf` at its own version.
    pub(super) fn encode_cluster(&self, buf: &mut MemoryRegion, g: u64) {
        if let Some(bytes) = buf.as_mut_slice() {
            for (j, page_buf) in bytes.chunks_exact_mut(PAGE).enumerate() {
                let page = g * self.k + j as u64;
                encode(page_buf, page, self.versions[page as usize]);
            }
        }
    }

    pub(super) fn reads_alive(&self) -> usize {
        self.alive_sum(|n| n.reads)
    }

    pub(super) fn writes_alive(&self) -> usize {
        self.alive_sum(|n| n.writes)
    }

    /// Requests out on nodes not lost: what the end of the run waits for.
    pub(super) fn in_flight_alive(&self) -> usize {
        self.alive_sum(Node::in_flight)
    }

    /// The sum of `count` over the nodes not lost.
    pub(super) fn alive_sum(&self, count: impl Fn(&Node) -> usize) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.lost.is_none())
            .map(count)
            .sum()
    }

    /// Declares node `i` lost: every page of it LOST, its frames freed,
    /// nothing more posted to it.
    pub(super) fn lose(&mut self, i: usize, why: String) {
        if self.nodes[i].lost.is_some() {
            return;
        }
        let n = self.nodes.len();
        let mut count = 0u64;
        for g in (i..self.clusters.len()).step_by(n) {
            match self.clusters[g] {
                State::Cached(f) => {
                    if let Some(buf) = self.frames[f as usize].take().and_then(|fr| fr.buf) {
                        self.free.push(buf);
                    }
                    self.empty_frames.push(f);
                }
                // Its buffer comes back with the failed (or discarded)
                // READ's completion.
                State::Reading(f) => {
                    self.frames[f as usize] = None;
                    self.empty_frames.push(f);
                }
                State::Remote | State::WritingOut | State::Lost => {}
            }
            self.clusters[g] = State::Lost;
            count += self.k;
        }
        println!("lost: {count} pages on node {} ({why})", self.nodes[i].addr);
        self.r.lost_pages += count;
        self.nodes[i].lost = Some(why);
        // Its requests still out are flushed back at once on the plain
        // path (their buffers return); a scheduled queue pair keeps them
        // until its retries run out. Either way the pager no longer waits
        // for them.
        if let Qp::Raw(q) = &self.nodes[i].qp {
            let _ = q.set_error();
        }
        self.first_loss.get_or_insert_with(Instant::now);
    }

    /// Looks at every node's connection: end of stream means the node is
    /// gone.
    pub(super) fn check_connections(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].lost.is_some() {
                continue;
            }
            let mut b = [0u8; 16];
            let why = match (&self.nodes[i].stream).read(&mut b) {
                Ok(0) => Some("the node closed its connection".to_string()),
                Ok(_) => None,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    None
                }
                Err(e) => Some(format!("its connection failed: {e}")),
            };
            if let Some(why) = why {
                self.lose(i, why);
            }
        }
    }

    /// Posts `op` of `buf` for cluster `g` on its node; a refusal loses
    /// the node and hands the buffer back to the free list.
    pub(super) fn post(&mut self, g: u64, write: bool, buf: MemoryRegion) -> bool {
        let i = self.node_of(g);
        let remote = self.remote_of(g);
        let len = self.cluster_bytes();
        let op = if write {
            SendOp::Write(remote)
        } else {
            SendOp::Read(remote)
        };
        match self.nodes[i].qp.post_send(op, buf, len, context(g, write)) {
            Ok(()) => {
                if write {
                    self.nodes[i].writes += 1;
                } else {
                    self.nodes[i].reads += 1;
                }
                true
            }
            Err(e) => {
                let why = format!(
                    "posting a {} failed: {}",
                    if write { "WRITE" } else { "READ" },
                    e.error
                );
                self.free.push(e.region);
                self.lose(i, why);
                false
            }
        }
    }

    /// Writes every page out once at version 1, one WRITE per cluster, so
    /// that every page-in has something to check.
    pub(super) fn fill(&mut self, spin: bool) -> Result<(), String> {
        let w = self.clusters.len() as u64;
        let per_node = self.depth.max(8);
        let mut next = 0u64;
        let mut last_check = Instant::now();
        while next < w || self.in_flight_alive() > 0 {
            if last_check.elapsed() >= TCP_CHECK {
                last_check = Instant::now();
                self.check_connections();
            }
            let mut posted = false;
            while next < w {
                let i = self.node_of(next);
                if self.nodes[i].lost.is_some() {
                    next += 1;
                    continue;
                }
                if self.nodes[i].writes >= per_node {
                    break;
                }
                let Some(mut buf) = self.free.pop() else {
                    break;
                };
                self.encode_cluster(&mut buf, next);
                if self.post(next, true, buf) {
                    self.r.filled += self.k;
                }
                posted = true;
                next += 1;
            }
            self.progress(spin, !posted)?;
        }
        Ok(())
    }

    /// Reaps completions of every node; if there were none and `block`,
    /// sleeps on the busiest node's completion channel first. Returns how
    /// many completions it handled.
    pub(super) fn progress(&mut self, spin: bool, block: bool) -> Result<usize, String> {
        let mut handled = 0;
        for i in 0..self.nodes.len() {
            if self.nodes[i].in_flight() == 0 {
                continue;
            }
            handled += self.reap(i, None)?;
        }
        if handled == 0 && block && !spin {
            let busy: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].in_flight() > 0)
                .collect();
            if let Some(&i) = busy.iter().max_by_key(|&&i| self.nodes[i].in_flight()) {
                let slice = if busy.len() > 1 {
                    SHORT_SLICE
                } else {
                    WAIT_SLICE
                };
                handled += self.reap(i, Some(slice))?;
            }
        }
        Ok(handled)
    }

    /// Polls node `i` once (sleeping up to `wait` if given) and handles
    /// what completed.
    pub(super) fn reap(&mut self, i: usize, wait: Option<Duration>) -> Result<usize, String> {
        let mut out = std::mem::take(&mut self.out);
        let polled = match wait {
            Some(t) => self.nodes[i].qp.poll_wait(&mut out, t),
            None => self.nodes[i].qp.poll(&mut out),
        };
        if let Err(e) = polled {
            // A queue pair that cannot be polled is as good as gone.
            self.lose(i, format!("polling its queue pair failed: {e}"));
        }
        let n = out.len();
        for c in out.drain(..) {
            self.complete(i, c);
        }
        self.out = out;
        Ok(n)
    }

    /// One finished READ or WRITE of node `i`.
    pub(super) fn complete(&mut self, i: usize, c: Completion) {
        let g = c.context >> 1;
        let write = c.context & 1 == 1;
        let ok = c.status.is_success();
        if write {
            self.nodes[i].writes = self.nodes[i].writes.saturating_sub(1);
        } else {
            self.nodes[i].reads = self.nodes[i].reads.saturating_sub(1);
        }
        if !ok {
            self.lose(
                i,
                format!(
                    "a {} completed with {}",
                    if write { "WRITE" } else { "READ" },
                    c.status
                ),
            );
        }
        let Some(state) = self.clusters.get(g as usize).copied() else {
            self.free.push(c.region);
            return;
        };
        if write {
            self.free.push(c.region);
            if ok && !self.filling && state == State::WritingOut {
                self.r.page_outs += self.k;
                self.clusters[g as usize] = State::Remote;
            }
            return;
        }
        // A READ: data only if it succeeded, from a node still alive, for a
        // cluster still waiting for it.
        let State::Reading(f) = state else {
            self.free.push(c.region);
            return;
        };
        if !ok || self.nodes[i].lost.is_some() {
            self.free.push(c.region);
            return;
        }
        let latency = self.frames[f as usize]
            .as_ref()
            .and_then(|fr| fr.posted)
            .map(|t| t.elapsed());
        if let Some(l) = latency {
            self.r.latencies_ns.push(l.as_nanos() as u64);
        }
        self.r.page_ins += self.k;
        self.r.page_in_requests += 1;
        if self.first_loss.is_some() {
            self.r.page_ins_after_loss += self.k;
        }
        // Every page of the cluster against its own version.
        match c.region.as_slice() {
            Some(bytes) if bytes.len() >= self.cluster_bytes() => {
                for (j, page_buf) in bytes.chunks_exact(PAGE).take(self.k as usize).enumerate() {
                    let page = g * self.k + j as u64;
                    let version = self.versions[page as usize];
                    match verify(page_buf, page, version) {
                        Ok(()) => self.r.verified += 1,
                        Err(e) => {
                            self.r.corrupt += 1;
                            if self.r.corrupt <= SHOW_CORRUPT {
                                eprintln!(
                                    "CORRUPT: page {page} from node {} (expected version \
                                     {version}): {e}",
                                    self.nodes[i].addr
                                );
                            }
                        }
                    }
                }
            }
            _ => {
                self.r.corrupt += self.k;
                eprintln!("CORRUPT: cluster {g}: its buffer cannot be read");
            }
        }
        if let Some(fr) = self.frames[f as usize].as_mut() {
            fr.buf = Some(c.region);
            fr.posted = None;
        }
        self.clusters[g as usize] = State::Cached(f);
    }

    /// A frame to fill: an empty one, or the clock's victim (written out
    /// first if dirty). `None` if none can be had now.
    pub(super) fn take_frame(&mut self) -> Option<u32> {
        if let Some(f) = self.empty_frames.pop() {
            return Some(f);
        }
        let n = self.frames.len();
        for _ in 0..2 * n {
            let f = self.hand;
            self.hand = (self.hand + 1) % n;
            let Some(fr) = self.frames[f].as_mut() else {
                continue;
            };
            if fr.posted.is_some() {
                continue; // its page-in is in flight
            }
            if fr.referenced {
                fr.referenced = false;
                continue;
            }
            // A dirty victim needs a page-out slot and a spare buffer for
            // the page coming in.
            if fr.dirty && (self.writes_alive() >= self.depth || self.free.is_empty()) {
                return None;
            }
            let fr = self.frames[f].take().expect("looked at above");
            let buf = fr.buf.expect("a frame not being read holds its page");
            let victim = fr.cluster;
            if fr.dirty {
                let mut buf = buf;
                self.encode_cluster(&mut buf, victim);
                self.clusters[victim as usize] = State::WritingOut;
                if !self.post(victim, true, buf) {
                    // Its node is lost now (and the cluster with it).
                    self.clusters[victim as usize] = State::Lost;
                }
            } else {
                self.free.push(buf);
                self.clusters[victim as usize] = State::Remote;
            }
            return Some(f as u32);
        }
        None
    }

    /// Starts reading cluster `g` in; false if it cannot start now.
    pub(super) fn start_miss(&mut self, g: u64) -> bool {
        if self.reads_alive() >= self.depth {
            return false;
        }
        let Some(f) = self.take_frame() else {
            return false;
        };
        let Some(buf) = self.free.pop() else {
            // Cannot happen with C + D buffers; give the frame back.
            self.empty_frames.push(f);
            return false;
        };
        self.frames[f as usize] = Some(Frame {
            cluster: g,
            buf: None,
            dirty: false,
            referenced: true,
            posted: Some(Instant::now()),
        });
        self.clusters[g as usize] = State::Reading(f);
        if !self.post(g, false, buf) {
            // `post` lost the node, which emptied the frame and marked the
            // cluster lost.
            return false;
        }
        self.r.faults += 1;
        true
    }

    /// One access to `page`: served, or the worker waits.
    pub(super) fn access(&mut self, page: u64, write: bool) -> Outcome {
        let g = page / self.k;
        match self.clusters[g as usize] {
            State::Lost => {
                self.r.lost_accesses += 1;
                self.r.accesses += 1;
                Outcome::Done
            }
            State::Cached(f) => {
                if let Some(fr) = self.frames[f as usize].as_mut() {
                    fr.referenced = true;
                    if write {
                        // The store: the page's next version, written into
                        // its bytes when its cluster is paged out.
                        fr.dirty = true;
                        self.versions[page as usize] += 1;
                        self.r.writes += 1;
                    }
                }
                self.r.accesses += 1;
                Outcome::Done
            }
            State::Reading(_) | State::WritingOut => Outcome::Blocked,
            State::Remote => {
                self.start_miss(g);
                Outcome::Blocked
            }
        }
    }

    /// The timed run, then the drain of what is still in flight.
    pub(super) fn timed(&mut self, a: &ClientArgs) -> Result<(), String> {
        let mut rng = Rng::new(a.seed);
        let w = self.versions.len() as u64;
        let mut workers: Vec<Option<(u64, bool)>> = vec![None; self.depth];
        self.started = Instant::now();
        let deadline = self.started + a.duration;
        let mut last_check = Instant::now();
        loop {
            let now = Instant::now();
            let running = now < deadline;
            if !running && self.in_flight_alive() == 0 {
                break;
            }
            if !running && now >= deadline + DRAIN {
                eprintln!(
                    "remote_memory: {} request(s) still out {DRAIN:?} after the run; not waiting longer",
                    self.in_flight_alive()
                );
                break;
            }
            let mut moved = false;
            if running {
                for wk in workers.iter_mut() {
                    for _ in 0..BURST {
                        let (page, write) =
                            *wk.get_or_insert_with(|| (rng.below(w), rng.chance(a.write_share)));
                        match self.access(page, write) {
                            Outcome::Done => {
                                *wk = None;
                                moved = true;
                            }
                            Outcome::Blocked => break,
                        }
                    }
                }
            }
            if now.duration_since(last_check) >= TCP_CHECK {
                last_check = now;
                self.check_connections();
            }
            let block = !moved;
            self.progress(a.spin, block)?;
        }
        self.r.elapsed = self.started.elapsed();
        Ok(())
    }
}
