//! Connections by IP address and port through rdma_cm (feature
//! `rdmacm`), on the device MTRDMA_TEST_DEVICE names, to its own IPv4
//! address (loopback). Ignored on a plain `cargo test`; `cargo xtask
//! test` runs them in the SoftRoCE VM.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{capped_table, device_pd, pattern, wait};
use mtrdma_core::TenantId;
use mtrdma_verbs::cm::{ConnectError, Connector, Listener};
use mtrdma_verbs::{Access, Opcode, SendOp, WcStatus};

const WAIT: Duration = Duration::from_secs(10);

/// The IPv4 address of `device`'s port 1: its IPv4-mapped GID.
fn device_ip(device: &str) -> Ipv4Addr {
    (0..16)
        .filter_map(|i| {
            std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/1/gids/{i}")).ok()
        })
        .find_map(|gid| {
            let words: Vec<u16> = gid
                .trim()
                .split(':')
                .map(|w| u16::from_str_radix(w, 16).unwrap_or(0))
                .collect();
            (words.len() == 8 && words[..5].iter().all(|&w| w == 0) && words[5] == 0xffff).then(
                || {
                    let [a, b] = words[6].to_be_bytes();
                    let [c, d] = words[7].to_be_bytes();
                    Ipv4Addr::new(a, b, c, d)
                },
            )
        })
        .unwrap_or_else(|| panic!("{device} has no IPv4 address (no IPv4-mapped GID on port 1)"))
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
