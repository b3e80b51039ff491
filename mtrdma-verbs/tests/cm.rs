//! Connections by IP address and port through rdma_cm (feature
//! `rdmacm`), on the device MTRDMA_TEST_DEVICE names, to its own IPv4
//! address (loopback). Ignored on a plain `cargo test`; `cargo xtask
//! test` runs them in the SoftRoCE VM.

mod common;
// perftest's rdma_cm mode as a peer: a file of its own.
#[path = "cm/perftest.rs"]
mod perftest;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{capped_table, device_pd, pattern, wait};
use mtrdma_core::{LinkConfig, Policy, QuotaTable, TenantEntry, TenantId};
use mtrdma_verbs::cm::{ConnectError, Connector, Listener};
use mtrdma_verbs::{
    Access, Error, Opcode, PollCompletions, ProtectionDomain, QueuePair, RemoteRegion, SendOp,
    WcStatus,
};

const WAIT: Duration = Duration::from_secs(10);

/// The IPv4 address of `device`'s port 1 (loopback through the device).
fn device_ip(device: &str) -> Ipv4Addr {
    mtrdma_verbs::testing::device_ipv4(device)
        .unwrap_or_else(|| panic!("{device} has no IPv4 address"))
}

/// Whether `got` is `sent` as rdma_cm delivers private data: padded with
/// zeros to the size the transport carries.
fn padded(got: &[u8], sent: &[u8]) -> bool {
    got.len() >= sent.len() && got.starts_with(sent) && got[sent.len()..].iter().all(|&b| b == 0)
}

/// A listener on the test device's address, on a port rdma_cm picks.
fn listener() -> (Listener, SocketAddr) {
    let ip = device_ip(&common::device_name());
    let listener = Listener::bind(SocketAddr::new(ip.into(), 0)).expect("listen");
    let addr = listener.local_addr().expect("bound");
    assert_ne!(addr.port(), 0, "a port was picked");
    (listener, addr)
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_client_connects_by_address_with_private_data_and_the_bytes_move() {
    let (ctx, pd) = device_pd();
    let table = capped_table(1 << 40, 1 << 30);
    let tenant = table.table().attach(TenantId(1)).unwrap();
    let (mut listener, addr) = listener();
    let server_pd = pd.clone();
    let server = std::thread::spawn(move || {
        let request = listener.next_request(WAIT).expect("a request");
        assert!(
            padded(request.private_data(), b"hello"),
            "{:?}",
            request.private_data()
        );
        let mut qp = server_pd.queue_pair().build().unwrap();
        // The receive goes up before the accept: the first SEND finds it.
        let buf = server_pd.allocate(4096, Access::LOCAL).unwrap();
        qp.post_recv(buf, 0..4096, 1).unwrap();
        let mut conn = request.accept(qp, b"welcome", WAIT).expect("accepted");
        assert!(padded(conn.private_data(), b"hello"));
        let got = wait(conn.qp(), 1).pop().unwrap();
        assert_eq!((got.status, got.opcode), (WcStatus::Success, Opcode::Recv));
        let bytes = got.region.read()[..got.byte_len as usize].to_vec();
        let disconnected = conn.wait_disconnected(WAIT).unwrap();
        (bytes, disconnected)
    });

    let resolved = Connector::resolve(addr, WAIT).expect("resolved");
    assert_eq!(resolved.device().as_deref(), Some(ctx.name()));
    // The queue pair is the tenant's: admitted against its quota.
    let qp = pd.queue_pair().tenant(&tenant).build().unwrap();
    let mut conn = resolved.connect(qp, b"hello", WAIT).expect("connected");
    assert!(
        padded(conn.private_data(), b"welcome"),
        "{:?}",
        conn.private_data()
    );
    assert_eq!(conn.peer(), addr);
    assert_eq!(table.table().usage().unwrap()[0].qps.0, 1);
    let msg = pd.register(pattern(1000, 4), Access::LOCAL).unwrap();
    conn.qp().post_send(SendOp::Send, msg, 0..1000, 2).unwrap();
    let sent = wait(conn.qp(), 1).pop().unwrap();
    assert_eq!(sent.status, WcStatus::Success);
    conn.disconnect().unwrap();
    let (bytes, disconnected) = server.join().unwrap();
    assert_eq!(bytes, pattern(1000, 4));
    assert!(disconnected, "the server saw the disconnect");
    drop(conn);
    assert_eq!(
        table.table().usage().unwrap()[0].qps.0,
        0,
        "the quota came back"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_rejected_request_says_why_and_a_port_nobody_listens_on_is_refused() {
    let (_ctx, pd) = device_pd();
    let (mut listener, addr) = listener();
    // Nobody asks yet: the wait ends, and says so.
    match listener.next_request(Duration::from_millis(200)) {
        Err(ConnectError::TimedOut { step, .. }) => assert!(step.contains("request"), "{step}"),
        other => panic!("no request came: {other:?}"),
    }
    let server = std::thread::spawn(move || {
        let request = listener.next_request(WAIT).expect("a request");
        assert!(padded(request.private_data(), b"let me in"));
        request.reject(b"full").unwrap();
        listener
    });
    let resolved = Connector::resolve(addr, WAIT).unwrap();
    let qp = pd.queue_pair().build().unwrap();
    match resolved.connect(qp, b"let me in", WAIT) {
        Err(ConnectError::Rejected { peer, private_data }) => {
            assert_eq!(peer, addr);
            assert!(padded(&private_data, b"full"), "{private_data:?}");
        }
        other => panic!("rejected with its reason: {other:?}"),
    }
    let listener = server.join().unwrap();
    drop(listener);

    // The listener is gone: its port refuses, promptly, as an error.
    let resolved = Connector::resolve(addr, WAIT).unwrap();
    let qp = pd.queue_pair().build().unwrap();
    let refused = resolved.connect(qp, b"", WAIT).unwrap_err();
    assert!(
        !matches!(refused, ConnectError::TimedOut { .. }),
        "refused, not left waiting: {refused}"
    );
    // Private data beyond what rdma_cm carries is refused before sending.
    let resolved = Connector::resolve(addr, WAIT).unwrap();
    let qp = pd.queue_pair().build().unwrap();
    let err = resolved.connect(qp, &[0u8; 300], WAIT).unwrap_err();
    assert!(
        err.to_string().contains("300 bytes of private data"),
        "{err}"
    );
}

/// One of rdma-core's rdmacm-utils (`rping`, `ucmatose`): `name`, the
/// flags `flags` followed by `addr`'s IP address, `-p` and its port, then
/// `rest`; its output kept.
fn tool(name: &str, flags: &[&str], addr: SocketAddr, rest: &[&str]) -> std::process::Child {
    let (ip, port) = (addr.ip().to_string(), addr.port().to_string());
    std::process::Command::new(name)
        .args(flags)
        .args([ip.as_str(), "-p", port.as_str()])
        .args(rest)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name} (rdmacm-utils; `cargo xtask deps`) runs: {e}"))
}

/// Connects a queue pair `qp` makes to `addr`, where `what` is about to
/// listen: asked again while the port refuses, for up to `WAIT`.
fn connect_when_listening(
    addr: SocketAddr,
    qp: impl Fn() -> mtrdma_verbs::PreparedQueuePair,
    what: &str,
) -> mtrdma_verbs::cm::Connection {
    let start = std::time::Instant::now();
    loop {
        let resolved = Connector::resolve(addr, WAIT).unwrap();
        match resolved.connect(qp(), b"", WAIT) {
            Ok(conn) => return conn,
            // Not listening yet.
            Err(ConnectError::Rejected { .. }) if start.elapsed() < WAIT => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("connecting to {what}: {e}"),
        }
    }
}

/// Waits for `child` (at most a minute); its output, and whether it
/// succeeded.
fn finish(child: std::process::Child) -> (bool, String) {
    let start = std::time::Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// ucmatose's exchange: `COUNT` SENDs of `SIZE` bytes each way, the
/// server's first.
const COUNT: usize = 10;
const SIZE: usize = 100;

/// The contexts of receives (this and above), of SENDs, READs and WRITEs.
const RECV: u64 = 1000;
const SEND: u64 = 7;
const READ: u64 = 8;
const WRITE: u64 = 9;

/// A queue pair not yet connected, with `n` receives of `len` bytes up.
fn with_receives(
    pd: &mtrdma_verbs::ProtectionDomain,
    n: usize,
    len: usize,
) -> mtrdma_verbs::PreparedQueuePair {
    let mut qp = pd.queue_pair().build().unwrap();
    for i in 0..n {
        let buf = pd.allocate(len, Access::LOCAL).unwrap();
        qp.post_recv(buf, 0..len, RECV + i as u64).unwrap();
    }
    qp
}

/// A connection's completions taken one kind at a time: a poll may bring
/// several, of several kinds, and those not asked for wait their turn.
struct Exchange {
    conn: mtrdma_verbs::cm::Connection,
    pd: mtrdma_verbs::ProtectionDomain,
    waiting: std::collections::VecDeque<mtrdma_verbs::Completion>,
}

impl Exchange {
    fn new(conn: mtrdma_verbs::cm::Connection, pd: &mtrdma_verbs::ProtectionDomain) -> Exchange {
        Exchange {
            conn,
            pd: pd.clone(),
            waiting: Default::default(),
        }
    }

    /// The next completion `want` picks (30 s at most).
    fn next(
        &mut self,
        want: impl Fn(&mtrdma_verbs::Completion) -> bool,
    ) -> mtrdma_verbs::Completion {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(i) = self.waiting.iter().position(&want) {
                return self.waiting.remove(i).unwrap();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not in 30 s; completions waiting: {:?}",
                self.waiting
            );
            let mut out = Vec::new();
            self.conn.qp().poll(&mut out).unwrap();
            self.waiting.extend(out);
        }
    }

    /// The completion of the request posted with `context`, succeeded.
    fn done(&mut self, context: u64) -> mtrdma_verbs::Completion {
        let c = self.next(|c| c.context == context);
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        c
    }

    /// SENDs `data` and waits for its completion.
    fn send(&mut self, data: Vec<u8>) {
        let len = data.len();
        let msg = self.pd.register(data, Access::LOCAL).unwrap();
        self.conn
            .qp()
            .post_send(SendOp::Send, msg, 0..len, SEND)
            .unwrap();
        self.done(SEND);
    }

    /// The next message received, its receive posted again.
    fn receive(&mut self) -> Vec<u8> {
        let got = self.next(|c| c.context >= RECV);
        assert_eq!(
            (got.status, got.opcode),
            (WcStatus::Success, Opcode::Recv),
            "{got:?}"
        );
        let bytes = got.region.read()[..got.byte_len as usize].to_vec();
        let len = got.region.len();
        self.conn
            .qp()
            .post_recv(got.region, 0..len, got.context)
            .unwrap();
        bytes
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn ucmatose_as_the_server_and_as_the_client_exchanges_with_ours() {
    let (_ctx, pd) = device_pd();
    let ip = device_ip(&common::device_name());

    // ucmatose listens; ours connects, receives its messages, replies,
    // and sees it disconnect.
    let port = 20_000 + (std::process::id() % 5_000) as u16;
    let (count, size) = (COUNT.to_string(), SIZE.to_string());
    let addr = SocketAddr::new(ip.into(), port);
    let server = tool("ucmatose", &["-b"], addr, &["-C", &count, "-S", &size]);
    let conn = connect_when_listening(addr, || with_receives(&pd, COUNT, SIZE), "ucmatose");
    let mut ex = Exchange::new(conn, &pd);
    for _ in 0..COUNT {
        assert_eq!(ex.receive().len(), SIZE);
    }
    for i in 0..COUNT {
        ex.send(pattern(SIZE, i as u8));
    }
    assert!(
        ex.conn.wait_disconnected(WAIT).unwrap(),
        "ucmatose disconnected"
    );
    drop(ex);
    let (ok, out) = finish(server);
    assert!(ok && out.contains("data transfers complete"), "{out}");

    // Ours listens; ucmatose connects, and the server's side is ours.
    let (mut listener, addr) = listener();
    let client = tool("ucmatose", &["-s"], addr, &["-C", &count, "-S", &size]);
    let request = listener.next_request(WAIT).expect("ucmatose's request");
    let conn = request
        .accept(with_receives(&pd, COUNT, SIZE), b"", WAIT)
        .expect("accepted");
    let mut ex = Exchange::new(conn, &pd);
    for i in 0..COUNT {
        ex.send(pattern(SIZE, i as u8));
    }
    for _ in 0..COUNT {
        assert_eq!(ex.receive().len(), SIZE);
    }
    ex.conn.disconnect().unwrap();
    drop(ex);
    let (ok, out) = finish(client);
    assert!(ok && out.contains("data transfers complete"), "{out}");
}

/// rping's advertisement of a buffer: address, key and length, in
/// network order (`struct rping_rdma_info`).
fn rping_info(r: &mtrdma_verbs::RemoteRegion) -> Vec<u8> {
    let mut b = r.addr.to_be_bytes().to_vec();
    b.extend_from_slice(&r.rkey.to_be_bytes());
    b.extend_from_slice(&(r.len as u32).to_be_bytes());
    b
}

/// The buffer an rping advertisement names.
fn rping_parse(b: &[u8]) -> mtrdma_verbs::RemoteRegion {
    assert_eq!(b.len(), 16, "rping's advertisement is 16 bytes");
    mtrdma_verbs::RemoteRegion {
        addr: u64::from_be_bytes(b[0..8].try_into().unwrap()),
        rkey: u32::from_be_bytes(b[8..12].try_into().unwrap()),
        len: u64::from(u32::from_be_bytes(b[12..16].try_into().unwrap())),
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn rping_as_the_server_and_as_the_client_pings_ours() {
    const PINGS: usize = 5;
    const LEN: usize = 64;
    let (_ctx, pd) = device_pd();
    let ip = device_ip(&common::device_name());
    let pings = PINGS.to_string();
    let len = LEN.to_string();

    // rping serves; ours is the client: each ping advertises a source the
    // server READs and a sink it WRITEs the same bytes back to.
    let port = 25_000 + (std::process::id() % 5_000) as u16;
    let addr = SocketAddr::new(ip.into(), port);
    let server = tool("rping", &["-s", "-a"], addr, &["-C", &pings, "-S", &len]);
    let conn = connect_when_listening(addr, || with_receives(&pd, 2, 64), "rping");
    let mut ex = Exchange::new(conn, &pd);
    for ping in 0..PINGS {
        let mut text = format!("rdma-ping-{ping}: ").into_bytes();
        text.extend((0..LEN - text.len() - 1).map(|i| b'A' + ((i + ping) % 26) as u8));
        text.push(0);
        let readable = Access {
            remote_read: true,
            ..Access::LOCAL
        };
        let source = pd.register(text.clone(), readable).unwrap();
        let sink = pd.allocate(LEN, Access::REMOTE_READ_WRITE).unwrap();
        ex.send(rping_info(&source.remote().unwrap()));
        assert_eq!(ex.receive().len(), 16, "rping's go-ahead after its READ");
        ex.send(rping_info(&sink.remote().unwrap()));
        assert_eq!(ex.receive().len(), 16, "rping's go-ahead after its WRITE");
        assert_eq!(sink.read(), text, "ping {ping} came back");
    }
    ex.conn.disconnect().unwrap();
    drop(ex);
    let (ok, out) = finish(server);
    assert!(ok, "{out}");

    // Ours serves: READs what rping advertises, WRITEs it back.
    let (mut listener, addr) = listener();
    let client = tool(
        "rping",
        &["-c", "-a"],
        addr,
        &["-C", &pings, "-S", &len, "-V", "-v"],
    );
    let request = listener.next_request(WAIT).expect("rping's request");
    let conn = request
        .accept(with_receives(&pd, 2, 64), b"", WAIT)
        .expect("accepted");
    let mut ex = Exchange::new(conn, &pd);
    for _ in 0..PINGS {
        let from = rping_parse(&ex.receive());
        let n = from.len as usize;
        let buf = pd.allocate(n, Access::LOCAL).unwrap();
        ex.conn
            .qp()
            .post_send(SendOp::Read(from), buf, 0..n, READ)
            .unwrap();
        let read = ex.done(READ);
        ex.send(vec![0; 16]);
        let to = rping_parse(&ex.receive());
        let data = read.region.read();
        let n = data
            .iter()
            .position(|&b| b == 0)
            .map_or(data.len(), |i| i + 1);
        ex.conn
            .qp()
            .post_send(SendOp::Write(to), read.region, 0..n, WRITE)
            .unwrap();
        ex.done(WRITE);
        ex.send(vec![0; 16]);
    }
    assert!(
        ex.conn.wait_disconnected(WAIT).unwrap(),
        "rping disconnected"
    );
    drop(ex);
    let (ok, out) = finish(client);
    assert!(
        ok && out.matches("ping data: rdma-ping-").count() == PINGS,
        "{out}"
    );
}

/// Two queue pairs on `pd` connected to each other through rdma_cm on the
/// test device's address: (the client's, the server's).
fn connected(pd: &ProtectionDomain) -> (QueuePair, QueuePair) {
    let build = || pd.queue_pair().build().unwrap();
    common::connect_by_address(build(), build())
}

/// `op` of `len` bytes from or into `local` over a new connection on
/// `pd` (a refused request ends its connection, so each has one of its
/// own): its status, and `local` back.
fn over_new_connection(
    pd: &ProtectionDomain,
    op: SendOp,
    local: mtrdma_verbs::MemoryRegion,
) -> (WcStatus, mtrdma_verbs::MemoryRegion) {
    let (mut peer, _owner) = connected(pd);
    let len = local.len();
    peer.post_send(op, local, 0..len, 1).unwrap();
    let done = wait(&mut peer, 1).pop().unwrap();
    (done.status, done.region)
}

/// Whether a READ of `from` is refused, landing none of its bytes. IB and
/// RoCE report a remote access error; iWARP's responder terminates the
/// connection, which flushes the READ.
fn read_refused(pd: &ProtectionDomain, from: RemoteRegion, what: &str) -> bool {
    let into = pd.allocate(from.len as usize, Access::LOCAL).unwrap();
    let (status, into) = over_new_connection(pd, SendOp::Read(from), into);
    let refusals: &[WcStatus] = if common::iwarp() {
        &[WcStatus::RemoteAccess, WcStatus::Flushed]
    } else {
        &[WcStatus::RemoteAccess]
    };
    assert!(refusals.contains(&status), "{what}: {status:?}");
    into.read().iter().all(|&b| b == 0)
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_leased_piece_is_all_a_peer_reaches_and_only_until_it_is_taken_back() {
    // Pieces of 4 KiB of a registration with no remote right of its own,
    // one of them leased: the peer READs and WRITEs it through the
    // lease's key, and nothing else, on rxe (whose memory windows are not
    // bounded) and on SoftiWARP (which has none).
    const PIECE: usize = 4096;
    let (_ctx, pd) = device_pd();
    let policy = Policy::new(
        LinkConfig::new(1_000_000_000),
        vec![TenantEntry::new(TenantId(1), "lender").with_max_mr_bytes(PIECE as u64 + 1)],
    );
    let table = QuotaTable::embedded(&policy).unwrap();
    let tenant = table.table().attach(TenantId(1)).unwrap();
    let mr_bytes = || table.table().usage().unwrap()[0].mr_bytes.0;
    let mut pieces = pd
        .allocate(4 * PIECE, Access::LOCAL)
        .unwrap()
        .into_pieces(PIECE)
        .unwrap();
    for (i, p) in pieces.iter_mut().enumerate() {
        p.write_at(0, &pattern(PIECE, i as u8)).unwrap();
    }
    let p1 = pieces.remove(1);
    let own_key = p1.rkey();
    let lease = p1.lease_for(&tenant, Access::REMOTE_READ_WRITE).unwrap();
    let key = lease.remote();
    assert_eq!(
        (key.len, lease.len(), mr_bytes()),
        (PIECE as u64, PIECE, PIECE as u64)
    );

    // The piece, both ways.
    let (mut peer, _owner) = connected(&pd);
    let into = pd.allocate(PIECE, Access::LOCAL).unwrap();
    peer.post_send(SendOp::Read(key), into, 0..PIECE, 1)
        .unwrap();
    let got = wait(&mut peer, 1).pop().unwrap();
    assert_eq!(
        (got.status, got.region.read()),
        (WcStatus::Success, pattern(PIECE, 1))
    );
    let from = pd.register(pattern(PIECE, 9), Access::LOCAL).unwrap();
    peer.post_send(SendOp::Write(key), from, 0..PIECE, 2)
        .unwrap();
    assert_eq!(wait(&mut peer, 1).pop().unwrap().status, WcStatus::Success);
    drop((peer, _owner));

    // The next piece under the lease's key, and one byte past the piece:
    // refused. The registration's own key reaches nothing either.
    let next = RemoteRegion {
        addr: key.addr + PIECE as u64,
        ..key
    };
    assert!(read_refused(&pd, next, "the next piece"));
    let past = RemoteRegion {
        addr: key.addr + 1,
        ..key
    };
    assert!(read_refused(&pd, past, "one byte past the piece"));
    // The registration's own key: a WRITE. (Not a READ: SoftiWARP sends
    // a READ's bytes from any registration of the protection domain
    // without checking its remote rights, `siw_qp_sq_proc_tx` in
    // `drivers/infiniband/sw/siw/siw_qp_tx.c`.) An iWARP WRITE completes
    // once sent, before the peer refuses it: the piece's bytes, below,
    // show it landed nothing.
    let own = RemoteRegion {
        rkey: own_key,
        ..key
    };
    let from = pd.register(pattern(PIECE, 0xee), Access::LOCAL).unwrap();
    let (status, _) = over_new_connection(&pd, SendOp::Write(own), from);
    if !common::iwarp() {
        assert_eq!(status, WcStatus::RemoteAccess, "the registration's own key");
    }

    // Taken back: the peer's bytes, the quota back, the key dead.
    let piece = lease.take_back().unwrap();
    assert_eq!((piece.read(), mr_bytes()), (pattern(PIECE, 9), 0));
    assert!(read_refused(&pd, key, "the key, taken back"));

    // Refused with the piece handed back: no remote right, and over the
    // tenant's quota (two pieces are more than it allows).
    let refused = piece.lease(Access::LOCAL).unwrap_err();
    assert!(matches!(*refused.error, Error::NoRightsToLend), "{refused}");
    let pair = refused.region.join(pieces.remove(1)).unwrap();
    let refused = pair
        .lease_for(&tenant, Access::REMOTE_READ_WRITE)
        .unwrap_err();
    assert!(matches!(*refused.error, Error::Admission(_)), "{refused}");
    assert_eq!((refused.region.len(), mr_bytes()), (2 * PIECE, 0));
    // Dropped, a lease gives its quota back.
    let lease = pieces
        .remove(0)
        .lease_for(&tenant, Access::REMOTE_READ_WRITE)
        .unwrap();
    assert_eq!(mr_bytes(), PIECE as u64);
    drop(lease);
    assert_eq!(mr_bytes(), 0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_server_accepts_its_clients_onto_one_completion_queue_and_one_receive_queue() {
    // 64 clients connect by address; the server accepts each onto one
    // shared completion queue, taking receives from one shared receive
    // queue (a receive up for every client: iWARP has no
    // receiver-not-ready retries), and answers each request on the
    // connection it came from. Each client opens a device context of its
    // own, as a client process would. (In one context SoftiWARP's user
    // library refuses the queue that the kernel maps at offset 0x90000,
    // which the library takes for "no key", SIW_INVAL_UOBJ_KEY: 64
    // clients' queues in one context reach it.)
    const CLIENTS: usize = 64;
    const MSG: usize = 64;
    let (ctx, pd) = device_pd();
    let srq = pd.shared_receive_queue().max_wr(128).build().unwrap();
    for i in 0..CLIENTS as u64 {
        let buf = pd.allocate(MSG, Access::LOCAL).unwrap();
        srq.post_recv(buf, 0..MSG, i).unwrap();
    }
    let mut server = ctx.shared_completion_queue().entries(2048).build().unwrap();
    let (mut listener, addr) = listener();
    let clients = std::thread::spawn(move || {
        (0..CLIENTS)
            .map(|i| {
                let (_ctx, client_pd) = device_pd();
                let mut qp = client_pd.queue_pair().build().unwrap();
                let answer = client_pd.allocate(MSG, Access::LOCAL).unwrap();
                qp.post_recv(answer, 0..MSG, 1).unwrap();
                let connection = Connector::resolve(addr, WAIT)
                    .expect("resolved")
                    .connect(qp, &[i as u8], WAIT)
                    .expect("connected");
                (connection, client_pd)
            })
            .collect::<Vec<_>>()
    });
    let mut client_of = std::collections::HashMap::new();
    let mut guards = Vec::new();
    for _ in 0..CLIENTS {
        let request = listener.next_request(WAIT).expect("a request");
        let accepted = request
            .accept_on(
                &mut server,
                pd.queue_pair().srq(&srq).max_send_wr(8),
                b"",
                WAIT,
            )
            .expect("accepted");
        client_of.insert(accepted.qpn, accepted.private_data[0]);
        guards.push(accepted.guard);
    }
    assert_eq!(server.len(), CLIENTS);
    let mut clients = clients.join().unwrap();
    for (i, (c, client_pd)) in clients.iter_mut().enumerate() {
        let msg = client_pd
            .register(vec![i as u8; MSG], Access::LOCAL)
            .unwrap();
        c.qp().post_send(SendOp::Send, msg, 0..MSG, 2).unwrap();
    }
    // Each request answered on its own connection, its buffer back to the
    // shared receive queue.
    let (mut heard, mut answered) = (0, 0);
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while heard < CLIENTS || answered < CLIENTS {
        assert!(
            std::time::Instant::now() < deadline,
            "{heard} heard, {answered} answered"
        );
        server.poll(&mut done).unwrap();
        for c in done.drain(..) {
            assert_eq!(c.completion.status, WcStatus::Success);
            if c.completion.opcode == Opcode::Recv {
                let who = c.completion.region.read()[0];
                assert_eq!(client_of[&c.qpn], who, "on the connection it came from");
                let answer = pd.register(vec![who + 100; MSG], Access::LOCAL).unwrap();
                server
                    .post_send(c.qpn, SendOp::Send, answer, 0..MSG, 3)
                    .unwrap();
                let context = c.completion.context;
                srq.stock(c.completion.region, 0..MSG, context).unwrap();
                heard += 1;
            } else {
                answered += 1;
            }
        }
    }
    for (i, (c, _)) in clients.iter_mut().enumerate() {
        let got = wait(c.qp(), 2);
        let answer = got.iter().find(|g| g.opcode == Opcode::Recv).unwrap();
        assert_eq!(answer.region.read(), vec![i as u8 + 100; MSG]);
    }
    // Torn down: each queue pair removed, then its connection.
    let qpns: Vec<u32> = server.qpns().collect();
    for qpn in qpns {
        server.remove(qpn).unwrap();
    }
    drop(guards);
    assert!(server.is_empty());
}
