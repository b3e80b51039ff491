//! perftest's rdma_cm mode (`ib_write_bw -R`) as a real peer of this
//! crate's `cm` module, as the server and as the client.
//!
//! With `-R`, perftest connects twice through rdma_cm on the one port:
//! first a queue pair of its own for its exchange (SENDs of at most 56
//! bytes, one receive up at a time, each side answering the other's
//! message: the client writes first, the server reads first), then the
//! queue pair the test runs on. Its exchange, as perftest 4.5-0.17
//! (`perftest_communication.c`) writes it:
//!
//! 1. versions (16 bytes, a C string), the page size and the cache line
//!    size (4 bytes each, network order), the MTU (2 bytes: the
//!    `ibv_mtu` value as a C string);
//! 2. a handshake of `struct pingpong_dest` (56 bytes, below), the test's
//!    connection, another handshake;
//! 3. three handshakes of the dests, the server's naming its buffer;
//! 4. the test (the client WRITEs; the server waits);
//! 5. a handshake, the client's report (size, iterations, peak and
//!    average MB/s, million messages a second: 8 bytes each, network
//!    order) and the server's, and a last handshake.

use super::*;

use common::assert_at_cap;
use mtrdma_verbs::ScheduleConfig;

/// The perftest version whose exchange this speaks: perftest refuses a
/// peer older than 5.70, and from 5.33 its reports carry 8-byte counts.
const VERSION: &[u8] = b"6.06";
/// `struct pingpong_dest`'s size: lid, out_reads, qpn, psn, rkey (4
/// bytes each, then 4 of padding), vaddr (8), the GID (16), srqn and
/// gid_index (4 each).
const DEST: usize = 56;
/// The messages' WRITEs: size and count.
const WRITE_SIZE: usize = 65_536;
const WRITES: u64 = 200;
/// The cap of the tenant whose scheduled queue pair WRITEs into
/// ib_write_bw (bytes a second): its 200 WRITEs take about 0.8 s.
const CAP: u64 = 16 << 20;

/// A pingpong_dest naming `qpn` and a buffer `at`, in network order as
/// perftest sends it.
fn dest(qpn: u32, at: &RemoteRegion) -> Vec<u8> {
    let mut d = vec![0u8; DEST];
    d[8..12].copy_from_slice(&qpn.to_be_bytes());
    d[16..20].copy_from_slice(&at.rkey.to_be_bytes());
    d[24..32].copy_from_slice(&at.addr.to_be_bytes());
    d
}

/// The buffer a peer's pingpong_dest names (`len` bytes of it).
fn dest_buffer(d: &[u8], len: usize) -> RemoteRegion {
    assert_eq!(d.len(), DEST, "perftest's dest is {DEST} bytes: {d:?}");
    RemoteRegion {
        rkey: u32::from_be_bytes(d[16..20].try_into().unwrap()),
        addr: u64::from_be_bytes(d[24..32].try_into().unwrap()),
        len: len as u64,
    }
}

/// A bandwidth report as perftest exchanges it: size, iterations, peak
/// and average MB/s, million messages a second.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Report {
    size: u64,
    iters: u64,
    peak: f64,
    avg: f64,
    mpps: f64,
}

/// One side of perftest's exchange over its first connection.
struct Peer {
    ex: Exchange,
    client: bool,
}

impl Peer {
    /// The exchange's opening on `comm`, perftest's first connection, as
    /// the client (it goes first) or the server.
    fn open(comm: mtrdma_verbs::cm::Connection, pd: &ProtectionDomain, client: bool) -> Peer {
        let mut peer = Peer {
            ex: Exchange::new(comm, pd),
            client,
        };
        let version = peer.opening();
        assert!(
            version.starts_with(|c: char| c.is_ascii_digit()),
            "perftest's version: {version:?}"
        );
        peer
    }

    /// Gives `mine` and takes the peer's message, in the order the side
    /// goes in (the client first).
    fn trade(&mut self, mine: Vec<u8>) -> Vec<u8> {
        if self.client {
            self.ex.send(mine);
            self.ex.receive()
        } else {
            let theirs = self.ex.receive();
            self.ex.send(mine);
            theirs
        }
    }

    /// Versions, page and cache line sizes, MTUs: the peer's version.
    fn opening(&mut self) -> String {
        let mut version = VERSION.to_vec();
        version.resize(16, 0);
        let theirs = self.trade(version);
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(theirs.len());
        let theirs = String::from_utf8_lossy(&theirs[..end]).into_owned();
        assert_eq!(self.trade(4096u32.to_be_bytes().to_vec()).len(), 4);
        assert_eq!(self.trade(64u32.to_be_bytes().to_vec()).len(), 4);
        // IBV_MTU_1024: the least any of the test devices has; rdma_cm
        // sets the connection's path MTU itself.
        assert_eq!(self.trade(b"3\0".to_vec()).len(), 2);
        theirs
    }

    /// A handshake: `mine` for the peer's dest.
    fn handshake(&mut self, mine: &[u8]) -> Vec<u8> {
        let theirs = self.trade(mine.to_vec());
        assert_eq!(theirs.len(), DEST, "a pingpong_dest: {theirs:?}");
        theirs
    }

    /// `mine` for the peer's report.
    fn reports(&mut self, mine: Report) -> Report {
        let mut u = |x: u64| {
            u64::from_be_bytes(
                self.trade(x.to_be_bytes().to_vec())[..8]
                    .try_into()
                    .unwrap(),
            )
        };
        let size = u(mine.size);
        let iters = u(mine.iters);
        let peak = f64::from_bits(u(mine.peak.to_bits()));
        let avg = f64::from_bits(u(mine.avg.to_bits()));
        let mpps = f64::from_bits(u(mine.mpps.to_bits()));
        Report {
            size,
            iters,
            peak,
            avg,
            mpps,
        }
    }
}

/// `ib_write_bw -R` on the test device and port `port` with the size
/// and count of [`WRITE_SIZE`] and [`WRITES`]; a client of `server` if
/// given.
fn ib_write_bw(port: u16, server: Option<Ipv4Addr>) -> std::process::Child {
    let (size, iters) = (WRITE_SIZE.to_string(), WRITES.to_string());
    let mut cmd = std::process::Command::new("ib_write_bw");
    cmd.args(["-R", "-d", &common::device_name(), "-p", &port.to_string()])
        .args(["-s", &size, "-n", &iters]);
    if let Some(ip) = server {
        cmd.arg(ip.to_string());
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("ib_write_bw (perftest; `cargo xtask deps`) runs: {e}"))
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn perftest_s_rdma_cm_mode_as_the_server_and_as_the_client_runs_with_ours() {
    let (_ctx, pd) = device_pd();
    let ip = device_ip(&common::device_name());

    // ib_write_bw serves: ours is the client, and WRITEs into the buffer
    // its dest names through a capped tenant's scheduled queue pair; the
    // server prints the report ours sends.
    let table = capped_table(CAP, WRITE_SIZE as u64);
    let tenant = table.table().attach(TenantId(1)).unwrap();
    let port = 30_000 + (std::process::id() % 5_000) as u16;
    let addr = SocketAddr::new(ip.into(), port);
    let server = ib_write_bw(port, None);
    let comm = connect_when_listening(addr, || with_receives(&pd, 2, DEST), "ib_write_bw");
    let mut peer = Peer::open(comm, &pd, true);
    let source = pd.register(pattern(WRITE_SIZE, 3), Access::LOCAL).unwrap();
    let own = pd.allocate(WRITE_SIZE, Access::REMOTE_READ_WRITE).unwrap();
    let own_remote = own.remote().unwrap();
    peer.handshake(&[0; DEST]);
    let data = connect_when_listening(
        addr,
        || pd.queue_pair().tenant(&tenant).build().unwrap(),
        "ib_write_bw's test connection",
    );
    assert_eq!(
        table.table().usage().unwrap()[0].qps.0,
        1,
        "the test's queue pair is the tenant's"
    );
    let (qp, connection) = data.into_parts();
    let mine = dest(qp.qpn(), &own_remote);
    let mut data = qp.scheduled(ScheduleConfig::default()).unwrap();
    peer.handshake(&mine);
    let mut theirs = Vec::new();
    for _ in 0..3 {
        theirs = peer.handshake(&mine);
    }
    let target = dest_buffer(&theirs, WRITE_SIZE);
    let start = std::time::Instant::now();
    let mut buf = source;
    for i in 0..WRITES {
        data.post_send(SendOp::Write(target), buf, 0..WRITE_SIZE, WRITE)
            .unwrap();
        let done = wait(&mut data, 1).pop().unwrap();
        assert_eq!(done.status, WcStatus::Success, "WRITE {i}: {done:?}");
        buf = done.region;
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = WRITE_SIZE as f64 * WRITES as f64;
    assert_at_cap(bytes / secs, CAP, "the tenant's WRITEs into ib_write_bw");
    let mb = bytes / secs / 1_048_576.0;
    let sent = Report {
        size: WRITE_SIZE as u64,
        iters: WRITES,
        peak: mb,
        avg: mb,
        mpps: WRITES as f64 / secs / 1e6,
    };
    peer.handshake(&mine);
    // The server's report says nothing: a write_bw server measures
    // nothing, and sends a report it never filled in.
    peer.reports(sent);
    peer.handshake(&mine);
    drop(data);
    drop(connection);
    drop(peer);
    assert_eq!(
        table.table().usage().unwrap()[0].qps.0,
        0,
        "the quota came back"
    );
    let (ok, out) = finish(server);
    assert!(ok, "ib_write_bw -R as the server:\n{out}");
    let row = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 4 && w[0] == WRITE_SIZE.to_string());
    assert_eq!(
        row.as_ref().map(|w| w[1].to_string()),
        Some(WRITES.to_string()),
        "the server printed the report of ours, {WRITES} WRITEs of {WRITE_SIZE} B:\n{out}"
    );
    eprintln!(
        "ib_write_bw -R as the server printed ours: {} (ours measured {mb:.1} MB/s)",
        row.unwrap_or_default().join(" ")
    );

    // Ours serves: ib_write_bw WRITEs into the buffer our dest names and
    // sends its report.
    let (mut listener, addr) = listener();
    let client = ib_write_bw(addr.port(), Some(ip));
    let request = listener.next_request(WAIT).expect("ib_write_bw's request");
    let comm = request
        .accept(with_receives(&pd, 2, DEST), b"", WAIT)
        .expect("accepted");
    let mut peer = Peer::open(comm, &pd, false);
    let target = pd
        .register(vec![0xa5; WRITE_SIZE], Access::REMOTE_READ_WRITE)
        .unwrap();
    let target_remote = target.remote().unwrap();
    // The test's connection comes to the same port, once the first
    // handshake is answered: the listener is up already.
    peer.handshake(&[0; DEST]);
    let request = listener
        .next_request(WAIT)
        .expect("ib_write_bw's test connection");
    let mut data = request
        .accept(pd.queue_pair().build().unwrap(), b"", WAIT)
        .expect("accepted");
    let mine = dest(data.qp().qpn(), &target_remote);
    for _ in 0..4 {
        peer.handshake(&mine);
    }
    // The client runs its test, then says it is done.
    peer.handshake(&mine);
    let ours = Report {
        size: WRITE_SIZE as u64,
        iters: WRITES,
        peak: 0.0,
        avg: 0.0,
        mpps: 0.0,
    };
    let report = peer.reports(ours);
    peer.handshake(&mine);
    assert!(
        data.wait_disconnected(WAIT).unwrap(),
        "ib_write_bw disconnected its test connection"
    );
    drop(data);
    drop(peer);
    let (ok, out) = finish(client);
    assert!(ok, "ib_write_bw -R as the client:\n{out}");
    assert_eq!(
        (report.size, report.iters),
        (WRITE_SIZE as u64, WRITES),
        "the client's report: {report:?}\n{out}"
    );
    assert!(report.avg > 0.0 && report.avg <= report.peak, "{report:?}");
    eprintln!(
        "ib_write_bw -R as the client reported {} WRITEs of {} B to ours: {:.1} MB/s, {:.4} Mpps",
        report.iters, report.size, report.avg, report.mpps
    );
    assert!(
        target.read().iter().any(|&b| b != 0xa5),
        "ib_write_bw's WRITEs reached the buffer our dest named"
    );
}
