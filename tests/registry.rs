//! The queue-pair registry against a real memcached (Debian's package,
//! started here on 127.0.0.1): what the RPC example's servers and clients
//! rely on to find each other.

use std::time::Duration;

use mtrdma::verbs::registry::{Registry, RegistryError};
use mtrdma::verbs::UdEndpoint;

mod common;
use common::Memcached;

fn endpoint(qpn: u32) -> UdEndpoint {
    UdEndpoint {
        qpn,
        qkey: 0x1111_1111,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 77, 2],
        lid: 0,
    }
}

#[test]
fn endpoints_published_in_memcached_are_found_by_other_clients() {
    let server = Memcached::start();
    let mut a = Registry::connect(&server.addr).unwrap();
    let mut b = Registry::connect(&server.addr).unwrap();
    assert_eq!(b.lookup_json::<UdEndpoint>("rpc/server-0").unwrap(), None);
    for t in 0..4 {
        a.publish_json(&format!("rpc/server-{t}"), &endpoint(100 + t))
            .unwrap();
    }
    for t in 0..4 {
        let got: UdEndpoint = b
            .wait_for_json(&format!("rpc/server-{t}"), Duration::from_secs(5))
            .unwrap();
        assert_eq!(got, endpoint(100 + t));
    }
    // A republished endpoint (a restarted server) replaces the old one.
    a.publish_json("rpc/server-0", &endpoint(7)).unwrap();
    assert_eq!(
        b.lookup_json::<UdEndpoint>("rpc/server-0").unwrap(),
        Some(endpoint(7))
    );
    assert!(b.remove("rpc/server-0").unwrap());
    assert_eq!(a.lookup("rpc/server-0").unwrap(), None);
    // memcached's own limits agree with the client's checks.
    assert!(matches!(
        a.publish("two words", b"x"),
        Err(RegistryError::BadName(_))
    ));
    a.publish(&"k".repeat(250), b"longest name").unwrap();
    assert_eq!(
        b.lookup(&"k".repeat(250)).unwrap(),
        Some(b"longest name".to_vec())
    );
}

#[test]
fn a_client_waits_for_a_late_server_and_gives_up_at_its_deadline() {
    let server = Memcached::start();
    let addr = server.addr.clone();
    let mut client = Registry::connect(&server.addr).unwrap();
    let err = client
        .wait_for("rpc/late", Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::NotPublished { waited, .. } if waited >= Duration::from_millis(200)),
        "{err}"
    );
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        Registry::connect(&addr)
            .unwrap()
            .publish_json("rpc/late", &endpoint(9))
            .unwrap();
    });
    let got: UdEndpoint = client
        .wait_for_json("rpc/late", Duration::from_secs(10))
        .unwrap();
    assert_eq!(got, endpoint(9));
    late.join().unwrap();
}

#[test]
fn a_registry_that_dies_is_a_clear_error_not_a_wait() {
    let mut server = Memcached::start();
    let mut client = Registry::connect(&server.addr).unwrap();
    client.publish("x", b"1").unwrap();
    server.kill();
    let err = client
        .wait_for("never", Duration::from_secs(30))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Io { .. } | RegistryError::Connect { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&server.addr), "{err}");
}
