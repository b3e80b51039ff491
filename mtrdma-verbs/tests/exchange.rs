//! Endpoint exchange over TCP (loopback 127.0.0.1): on the host for the
//! protocol, and on a device for a full connect-WRITE-SEND between two
//! threads that only share a TCP connection.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mtrdma_verbs::exchange::{exchange, Handshake, HandshakeError};
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{Access, Context, Endpoint, Error, Opcode, RemoteRegion, SendOp};

fn handshake(qpn: u32) -> Handshake {
    Handshake {
        endpoint: Endpoint {
            qpn,
            psn: 7,
            gid: [0xfe; 16],
            lid: 0,
            mtu: 1024,
        },
        regions: vec![RemoteRegion {
            addr: 0x1000,
            len: 4096,
            rkey: 42,
        }],
    }
}

/// Listens on a loopback port and runs `server` on the listener in a
/// thread of its own: the port's address and the thread.
fn serve<T: Send + 'static>(
    server: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> (SocketAddr, JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, std::thread::spawn(move || server(listener)))
}

#[test]
fn both_sides_learn_each_others_handshake() {
    let (addr, server) = serve(move |listener| {
        let (mut s, _) = listener.accept().unwrap();
        exchange(&mut s, &handshake(1)).unwrap()
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let from_server = exchange(&mut c, &handshake(2)).unwrap();
    assert_eq!(from_server, handshake(1));
    assert_eq!(server.join().unwrap(), handshake(2));
}

#[test]
fn bytes_the_peer_sends_after_its_handshake_stay_in_the_stream() {
    let (addr, server) = serve(move |listener| {
        let (mut s, _) = listener.accept().unwrap();
        // The handshake and the application's first message in one write.
        let mut bytes = serde_json::to_vec(&handshake(1)).unwrap();
        bytes.extend_from_slice(b"\nGO 42\n");
        s.write_all(&bytes).unwrap();
        exchange_rest(&mut s);
    });
    let mut c = TcpStream::connect(addr).unwrap();
    assert_eq!(exchange(&mut c, &handshake(2)).unwrap(), handshake(1));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut c, &mut rest).unwrap();
    assert_eq!(rest, "GO 42\n", "what followed the handshake");
    server.join().unwrap();
}

/// Reads the client's handshake line and closes.
fn exchange_rest(s: &mut TcpStream) {
    let mut byte = [0u8; 1];
    while std::io::Read::read(s, &mut byte).unwrap() == 1 && byte[0] != b'\n' {}
}

#[test]
fn an_endless_handshake_is_refused() {
    let (addr, server) = serve(move |listener| {
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.write_all(&vec![b'x'; 100 * 1024]);
    });
    let mut c = TcpStream::connect(addr).unwrap();
    match exchange(&mut c, &handshake(2)) {
        Err(Error::Exchange(HandshakeError::TooLong)) => {}
        other => panic!("expected an exchange error, got {other:?}"),
    }
    drop(c);
    server.join().unwrap();
}

#[test]
fn a_garbled_or_missing_handshake_is_a_clear_error() {
    let (addr, server) = serve(move |listener| {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"{\"endpoint\": 12}\n").unwrap();
        let (s2, _) = listener.accept().unwrap();
        drop(s2); // closes without a word
        drop(s);
    });
    let mut c = TcpStream::connect(addr).unwrap();
    match exchange(&mut c, &handshake(2)) {
        Err(Error::Exchange(HandshakeError::Invalid(_))) => {}
        other => panic!("expected an exchange error, got {other:?}"),
    }
    let mut c2 = TcpStream::connect(addr).unwrap();
    server.join().unwrap();
    match exchange(&mut c2, &handshake(3)) {
        Err(Error::Exchange(HandshakeError::Closed | HandshakeError::Send(_))) => {}
        other => panic!("expected an exchange error, got {other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn two_threads_connect_through_tcp_and_write() {
    let name = common::device_name();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server_name = name.clone();
    let server = std::thread::spawn(move || {
        let ctx = Context::open(&server_name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let target = pd.allocate(1 << 16, Access::REMOTE_READ_WRITE).unwrap();
        let mut qp = pd.queue_pair().build().unwrap();
        let note = pd.allocate(8, Access::LOCAL).unwrap();
        qp.post_recv(note, 0..8, 1).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let peer = exchange(
            &mut s,
            &Handshake {
                endpoint: qp.endpoint(),
                regions: vec![target.remote().unwrap()],
            },
        )
        .unwrap();
        let mut qp = qp.connect(&peer.endpoint).unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while out.is_empty() {
            qp.poll(&mut out).unwrap();
            assert!(Instant::now() < deadline, "no SEND arrived");
        }
        assert_eq!(out[0].opcode, Opcode::Recv);
        assert_eq!(&out[0].region.read()[..4], b"done");
        assert!(
            target.read().iter().all(|&b| b == 0xab),
            "the WRITE landed before the SEND"
        );
    });
    let ctx = Context::open(&name).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let qp = pd.queue_pair().build().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let peer = exchange(
        &mut s,
        &Handshake {
            endpoint: qp.endpoint(),
            regions: vec![],
        },
    )
    .unwrap();
    let mut qp = qp.connect(&peer.endpoint).unwrap();
    let mut data = pd.allocate(1 << 16, Access::LOCAL).unwrap();
    data.write_at(0, &[0xab; 1 << 16]).unwrap();
    qp.post_send(SendOp::Write(peer.regions[0]), data, 0..1 << 16, 1)
        .unwrap();
    let mut done = pd.allocate(8, Access::LOCAL).unwrap();
    done.write_at(0, b"done").unwrap();
    qp.post_send(SendOp::Send, done, 0..4, 2).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < 2 {
        qp.poll(&mut out).unwrap();
        assert!(Instant::now() < deadline);
    }
    assert!(out.iter().all(|c| c.status.is_success()));
    server.join().unwrap();
}

#[test]
fn a_silent_peer_fails_the_exchange_in_time() {
    use mtrdma_verbs::exchange::exchange_within;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        // Accepts, reads nothing and says nothing until told to go.
        let (s, _) = listener.accept().unwrap();
        let _ = held.recv();
        drop(s);
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(77))).unwrap();
    let start = Instant::now();
    match exchange_within(&mut c, &handshake(2), Duration::from_millis(300)) {
        Err(Error::Exchange(HandshakeError::TimedOut(t))) => {
            assert_eq!(t, Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "gave up after {took:?}");
    assert_eq!(
        c.read_timeout().unwrap(),
        Some(Duration::from_secs(77)),
        "the stream's own timeout is put back"
    );
    hold.send(()).unwrap();
    server.join().unwrap();
}
