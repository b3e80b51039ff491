//! The tests: bandwidth and latency loops of client and server.

use super::*;

pub(crate) fn ns_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

/// On an error during a run, the peer's own error (if it sent one) says more.
pub(crate) fn with_peer_error(ctrl: &mut Ctrl, e: String) -> String {
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        match ctrl.try_recv() {
            Ok(Some(line)) => {
                if let Some(msg) = line.strip_prefix("ERR ") {
                    return format!("{e} (the peer reported: {msg})");
                }
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return format!("{e} (the peer closed the control connection)"),
        }
    }
    e
}

/// Client side of a bw test: keep the pool's buffers posted.
pub(crate) fn client_bw(conn: &mut Conn, p: &Params) -> Result<Option<BwResult>, String> {
    let size = conn.size;
    let op = match p.test {
        Test::WriteBw => SendOp::Write(conn.remote),
        Test::ReadBw => SendOp::Read(conn.remote),
        Test::AtomicBw => SendOp::FetchAdd(conn.remote, 1),
        _ => SendOp::Send,
    };
    let mut limit = match p.duration() {
        Some(_) => u64::MAX,
        None => p.iters,
    };
    let cap = limit.min(1 << 22) as usize;
    let (mut tp, mut tc) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let start = Instant::now();
    let deadline = p.duration().map(|d| start + d);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut last = Instant::now();
    let mut spins = 0u32;
    while done < limit {
        while posted < limit {
            let Some(r) = conn.pool.pop() else { break };
            // Stamped before posting, as perftest does: a software
            // provider may do the whole transfer inside the post call.
            tp.push(ns_since(start));
            conn.post_send(op, r, size)?;
            posted += 1;
        }
        let n = conn.progress(p.test)?;
        if let Qp::Sched(q) = &conn.qp {
            let piece = p.chunk.min(size as u64);
            conn.window_samples
                .sample(ns_since(start), q.window(), piece);
        }
        if n > 0 {
            let now = ns_since(start);
            tc.extend(std::iter::repeat_n(now, n));
            done += n as u64;
            last = Instant::now();
        }
        spins = spins.wrapping_add(1);
        // A sender that sleeps on the completion channel (`--wait`) turns
        // this loop once per completion event, not millions of times a
        // second: it looks at the clock every turn, or a 6 s run lasted
        // 1024 events (some 40 s on the emulated link).
        if spins % 1024 == 0 || conn.wait {
            if let Some(d) = deadline {
                if limit == u64::MAX && Instant::now() >= d {
                    limit = posted;
                }
            }
            if last.elapsed() > STALL {
                return Err(format!(
                    "{done} of {posted} requests completed and nothing more for {STALL:?}"
                ));
            }
        }
    }
    Ok(bw_result(size, &tp, &tc))
}

/// Waits for the peer's `marker` in the last byte of our target (write_lat),
/// or for its next message (send_lat). Returns false when the control
/// connection says `DONE` instead (server side).
pub(crate) fn wait_peer(
    conn: &mut Conn,
    test: Test,
    marker: u8,
    recvs_before: u64,
    ctrl: &mut Ctrl,
    is_client: bool,
) -> Result<bool, String> {
    let mut byte = [0u8; 1];
    let mut spins = 0u32;
    let start = Instant::now();
    loop {
        let arrived = match test {
            // Like perftest, watch the byte; our own WRITE's completion is
            // reaped now and then (the next ping has a spare buffer).
            Test::WriteLat => {
                if spins % 64 == 63 {
                    conn.progress(test)?;
                }
                conn.target
                    .read_into(conn.size - 1, &mut byte)
                    .map_err(|e| e.to_string())?;
                byte[0] == marker
            }
            _ => {
                conn.progress(test)?;
                conn.recvs > recvs_before
            }
        };
        if arrived {
            return Ok(true);
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            if let Some(line) = ctrl.try_recv()? {
                if !is_client && line == "DONE" {
                    return Ok(false);
                }
                check_line(&line, "DONE", &ctrl.peer.clone())?;
                return Err(format!("unexpected message from {}: {line:?}", ctrl.peer));
            }
            if is_client && start.elapsed() > STALL {
                return Err(format!("no answer from the peer for {STALL:?}"));
            }
        }
    }
}

pub(crate) fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Posts our ping (write_lat: WRITE with `marker` in the last byte;
/// send_lat: SEND).
pub(crate) fn post_ping(conn: &mut Conn, test: Test, marker: u8) -> Result<(), String> {
    let size = conn.size;
    let mut r = conn.take_buffer(test)?;
    let op = if test == Test::WriteLat {
        if let Some(buf) = r.as_mut_slice() {
            buf[size - 1] = marker;
        }
        SendOp::Write(conn.remote)
    } else {
        SendOp::Send
    };
    conn.post_send(op, r, size)
}

/// Client side of a latency test: per-iteration samples in ns.
pub(crate) fn client_lat(
    conn: &mut Conn,
    p: &Params,
    ctrl: &mut Ctrl,
    interval: Option<Duration>,
) -> Result<Vec<u64>, String> {
    let deadline = p.duration().map(|d| Instant::now() + d);
    let mut samples = Vec::with_capacity(p.iters.min(1 << 22) as usize);
    // How late each sleep between requests ended (ns): a busy host shows
    // here, apart from the link's queue.
    let mut late = Vec::new();
    let mut i = 0u64;
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if i >= p.iters => break,
            _ => {}
        }
        let t0 = Instant::now();
        match p.test {
            Test::ReadLat | Test::WriteCompLat => {
                let r = conn.take_buffer(p.test)?;
                let op = if p.test == Test::ReadLat {
                    SendOp::Read(conn.remote)
                } else {
                    SendOp::Write(conn.remote)
                };
                conn.post_send(op, r, conn.size)?;
                let spin_start = Instant::now();
                // With --wait the probe sleeps while its request is out:
                // a process that spins for its completion is, on a host
                // with more runnable processes than CPUs, the one taken
                // off the CPU for a whole scheduling period.
                let block = conn.wait;
                while conn.progress_blocking(p.test, block)? == 0 {
                    if spin_start.elapsed() > STALL {
                        return Err(format!("no {} completion for {STALL:?}", p.test.verb()));
                    }
                }
            }
            test => {
                let m = marker(i);
                let recvs = conn.recvs;
                post_ping(conn, test, m)?;
                wait_peer(conn, test, m, recvs, ctrl, true)?;
            }
        }
        samples.push(t0.elapsed().as_nanos() as u64);
        i += 1;
        if let Some(gap) = interval {
            // The next request starts one interval after this one did
            // (sleeping, so the probe leaves the CPUs to the others).
            let next = t0 + gap;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
                late.push(next.elapsed().as_nanos() as u64);
            }
        }
    }
    if let Some(l) = lat_result(0, late, 1.0) {
        eprintln!(
            "perf: {} sleeps between requests ended late by p50 {:.0} us, p99 {:.0} us (the host's CPUs, not the link)",
            l.iters, l.typical, l.p99
        );
    }
    Ok(samples)
}

/// Server side of write_lat / send_lat: answer every ping until `DONE`.
pub(crate) fn server_pong(conn: &mut Conn, test: Test, ctrl: &mut Ctrl) -> Result<(), String> {
    let mut i = 0u64;
    loop {
        let m = marker(i);
        let recvs = conn.recvs;
        if !wait_peer(conn, test, m, recvs, ctrl, false)? {
            return Ok(());
        }
        post_ping(conn, test, m)?;
        i += 1;
    }
}

/// Server side of send_bw: keep receives posted until `DONE`.
pub(crate) fn server_recv(conn: &mut Conn, test: Test, ctrl: &mut Ctrl) -> Result<(), String> {
    let mut spins = 0u32;
    loop {
        conn.progress(test)?;
        spins = spins.wrapping_add(1);
        if spins % 256 == 0 {
            if let Some(line) = ctrl.try_recv()? {
                let peer = ctrl.peer.clone();
                return check_line(&line, "DONE", &peer);
            }
        }
    }
}
