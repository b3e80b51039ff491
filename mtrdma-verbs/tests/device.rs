//! Tests against a real RDMA device.
//!
//! They are ignored by default; `cargo xtask test` runs them inside the
//! SoftRoCE VM with `--ignored` and `MTRDMA_TEST_DEVICE=rxe0`. On a host
//! with an RDMA NIC: `MTRDMA_TEST_DEVICE=mlx5_0 cargo test -- --ignored`.

use mtrdma_verbs::{device_names, Context, Error, GidSelection, GidType, LinkLayer, PortState};

/// The device under test. Running ignored tests without naming one is a
/// mistake worth failing on, not a pass.
fn test_device() -> String {
    std::env::var("MTRDMA_TEST_DEVICE")
        .expect("MTRDMA_TEST_DEVICE must name the RDMA device to test (e.g. rxe0)")
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn device_has_active_port_with_roce_v2_ipv4_gid() {
    let name = test_device();
    let ctx = Context::open(&name).expect("open the test device");
    assert_eq!(ctx.name(), name);
    assert!(ctx.port_count() >= 1, "{name} reports no ports");

    let ports = ctx.ports().expect("query ports");
    for p in &ports {
        println!(
            "{name} port {}: {} link {} mtu {:?} gid table {}",
            p.number, p.state, p.link_layer, p.active_mtu, p.gid_table_len
        );
    }
    let active: Vec<_> = ports
        .iter()
        .filter(|p| p.state == PortState::Active)
        .collect();
    assert!(!active.is_empty(), "no active port on {name}: {ports:?}");

    let mut found = None;
    for port in &active {
        let gids = ctx.gids(port.number).expect("query GID table");
        for g in &gids {
            println!(
                "  [{}] {} {} ifindex {}",
                g.index, g.gid, g.kind, g.netdev_ifindex
            );
        }
        if let Some(g) = gids
            .iter()
            .find(|g| g.kind == GidType::RoceV2 && g.gid.ipv4_mapped().is_some())
        {
            assert_eq!(
                port.link_layer,
                LinkLayer::Ethernet,
                "RoCE GID on a non-Ethernet port"
            );
            found = Some((port.number, *g));
        }
    }
    let (port, mapped) = found.expect("an active port with a RoCE v2 IPv4-mapped GID");

    // Automatic selection must land on exactly such an entry, never on the
    // link-local one at index 0.
    let chosen = ctx
        .select_gid(port, GidSelection::Auto)
        .expect("select GID");
    assert_eq!(chosen.kind, GidType::RoceV2);
    assert!(chosen.gid.ipv4_mapped().is_some(), "chose {chosen:?}");
    assert!(!chosen.gid.is_link_local());
    assert_eq!(chosen.index, mapped.index);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn unknown_device_and_port_are_clear_errors() {
    let name = test_device();
    let names = device_names().expect("list devices");
    assert!(names.contains(&name), "{name} not in {names:?}");

    match Context::open("no-such-rdma-device") {
        Err(Error::DeviceNotFound {
            name: asked,
            available,
        }) => {
            assert_eq!(asked, "no-such-rdma-device");
            assert_eq!(available, names);
        }
        other => panic!("expected DeviceNotFound, got {other:?}"),
    }

    let ctx = Context::open(&name).expect("open the test device");
    let beyond = ctx.port_count() + 1;
    let err = ctx.port(beyond).unwrap_err();
    assert!(
        matches!(err, Error::NoSuchPort { port, .. } if port == beyond),
        "{err}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(matches!(
        ctx.port(0),
        Err(Error::NoSuchPort { port: 0, .. })
    ));

    // An index past the table is refused with the valid indices named.
    let err = ctx.select_gid(1, GidSelection::Index(100_000)).unwrap_err();
    assert!(err.to_string().contains("not in the table"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn first_active_device_is_usable() {
    let _ = test_device();
    let ctx = Context::open_first_active().expect("an active device");
    assert!(ctx
        .ports()
        .unwrap()
        .iter()
        .any(|p| p.state == PortState::Active));
    // Contexts are shared by cloning; the device stays open while any clone lives.
    let clone = ctx.clone();
    drop(ctx);
    assert!(clone.port(1).is_ok());
}
