//! Unreliable-datagram queue pairs on a real device (all queue pairs on the
//! device named by MTRDMA_TEST_DEVICE). Ignored on a plain `cargo test`;
//! run them in the SoftRoCE VM.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{device_pd, wait_within};

use mtrdma_core::{LinkConfig, Policy, QuotaTable, TenantEntry, TenantId};
use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Error, Gid, Opcode, ProtectionDomain, UdCompletion, UdQueuePair, WcStatus,
};

mod common;
// Gather lists: a file of their own.
#[path = "ud/gather.rs"]
mod gather;
// Batches of datagrams.
#[path = "ud/batch.rs"]
mod batch;

/// Polls until `n` completions arrive (10 s at most), and no more.
fn wait(qp: &mut UdQueuePair, n: usize) -> Vec<UdCompletion> {
    let out = wait_within(qp, n, Duration::from_secs(10));
    assert_eq!(out.len(), n, "no more completions than requests");
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Distinct message sizes from 1 B up to the MTU, around the 40-byte GRH
/// size too.
fn sizes(mtu: usize) -> Vec<usize> {
    let mut s = vec![1, 2, 39, 40, 41, 100, mtu / 2 + 1, mtu - 1, mtu];
    s.retain(|&n| n >= 1 && n <= mtu);
    s.sort_unstable();
    s.dedup();
    s
}

const FILL: u8 = 0xee;
const CLIENTS: usize = 4;

fn seed(client: usize, msg: usize) -> u8 {
    (client * 16 + msg) as u8
}

fn reply_seed(client: usize, msg: usize) -> u8 {
    seed(client, msg).wrapping_add(0x80)
}

/// Checks a received region: the payload at `offset`, and every other byte
/// of the region still [`FILL`] (the GRH never reaches it).
fn check_received(c: &UdCompletion, offset: usize, expected: &[u8]) {
    let bytes = c.region.read();
    let end = offset + expected.len();
    assert!(
        bytes[offset..end] == *expected,
        "payload of {} B arrived intact",
        expected.len()
    );
    assert!(
        bytes[..offset].iter().all(|&b| b == FILL),
        "nothing written before the posted range"
    );
    assert!(
        bytes[end..].iter().all(|&b| b == FILL),
        "nothing written after the payload (no GRH bytes, no overrun)"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_server_qp_serves_four_clients_with_the_grh_hidden() {
    let (_ctx, pd) = device_pd();
    let probe = pd.ud_queue_pair().build().unwrap();
    let mtu = probe.mtu() as usize;
    drop(probe);
    let sizes = sizes(mtu);
    let n = sizes.len();
    let total = CLIENTS * n;
    println!("MTU {mtu}; {CLIENTS} clients x {n} messages of sizes {sizes:?}");

    let mut server = pd
        .ud_queue_pair()
        .max_recv_wr(total as u32)
        .max_send_wr(total as u32)
        .build()
        .unwrap();
    let server_ep = server.endpoint();
    // Receives: every other one starts 32 bytes into its region.
    let mut offsets = HashMap::new();
    for k in 0..total {
        let offset = if k % 2 == 0 { 0 } else { 32 };
        let region = pd
            .register(vec![FILL; offset + mtu + 64], Access::LOCAL)
            .unwrap();
        server
            .post_recv(region, offset..offset + mtu, k as u64)
            .unwrap();
        offsets.insert(k as u64, offset);
    }
    assert_eq!(server.in_flight(), (0, total as u32));

    let mut clients: Vec<UdQueuePair> = (0..CLIENTS)
        .map(|_| {
            pd.ud_queue_pair()
                .max_send_wr(n as u32)
                .max_recv_wr(n as u32)
                .build()
                .unwrap()
        })
        .collect();
    let by_qpn: HashMap<u32, usize> = clients
        .iter()
        .enumerate()
        .map(|(c, qp)| (qp.qpn(), c))
        .collect();
    assert_eq!(by_qpn.len(), CLIENTS, "distinct QPNs");

    // Each client posts receives for the replies, then sends its messages.
    for (c, client) in clients.iter_mut().enumerate() {
        for i in 0..n {
            let region = pd.register(vec![FILL; mtu + 16], Access::LOCAL).unwrap();
            client.post_recv(region, 0..mtu, 1000 + i as u64).unwrap();
        }
        let to_server = client.address_handle(&server_ep).unwrap();
        assert_eq!(to_server.endpoint(), server_ep);
        for (i, &len) in sizes.iter().enumerate() {
            let mut region = pd.allocate(len + 8, Access::LOCAL).unwrap();
            region.write_at(4, &pattern(len, seed(c, i))).unwrap();
            client
                .post_send(
                    &to_server,
                    server_ep.qpn,
                    server_ep.qkey,
                    region,
                    4..4 + len,
                    i as u64,
                )
                .unwrap();
        }
        // The sends in flight keep the address handle alive.
        drop(to_server);
    }
    for (c, client) in clients.iter_mut().enumerate() {
        let mut sent = wait(client, n);
        sent.sort_by_key(|s| s.context);
        for (i, s) in sent.iter().enumerate() {
            let len = sizes[i];
            assert_eq!(
                (s.status, s.opcode, s.context, s.byte_len as usize),
                (WcStatus::Success, Opcode::Send, i as u64, len)
            );
            assert!(s.source.is_none());
            assert_eq!(
                &s.region.read()[4..4 + len],
                &pattern(len, seed(c, i))[..],
                "the sender's buffer comes back intact"
            );
        }
        assert_eq!(client.in_flight(), (0, n as u32));
    }

    let got = wait(&mut server, total);
    assert_eq!(server.in_flight(), (0, 0));
    let mut seen = vec![vec![false; n]; CLIENTS];
    for g in &got {
        assert_eq!((g.status, g.opcode), (WcStatus::Success, Opcode::Recv));
        let source = g.source.expect("a receive names its sender");
        let c = *by_qpn
            .get(&source.qpn)
            .unwrap_or_else(|| panic!("source QPN {} is not a client", source.qpn));
        assert_eq!(
            source.gid,
            Some(Gid(clients[c].endpoint().gid)),
            "the sender's GID is decoded from the GRH"
        );
        let len = g.byte_len as usize;
        let i = sizes
            .iter()
            .position(|&s| s == len)
            .unwrap_or_else(|| panic!("byte_len {len} is not a size that was sent"));
        assert!(!seen[c][i], "client {c} message {i} arrived twice");
        seen[c][i] = true;
        check_received(g, offsets[&g.context], &pattern(len, seed(c, i)));
    }
    assert!(seen.iter().flatten().all(|&s| s), "every message arrived");

    // The server answers each message through an address handle built from
    // the client's endpoint.
    for (c, client) in clients.iter().enumerate() {
        let ep = client.endpoint();
        let to_client = server.address_handle(&ep).unwrap();
        for (i, &len) in sizes.iter().enumerate() {
            let region = pd
                .register(pattern(len, reply_seed(c, i)), Access::LOCAL)
                .unwrap();
            server
                .post_send(&to_client, ep.qpn, ep.qkey, region, 0..len, i as u64)
                .unwrap();
        }
    }
    let replies_sent = wait(&mut server, total);
    assert!(replies_sent
        .iter()
        .all(|s| s.status.is_success() && s.opcode == Opcode::Send));
    for (c, client) in clients.iter_mut().enumerate() {
        let got = wait(client, n);
        let mut lens = Vec::new();
        for g in &got {
            assert_eq!((g.status, g.opcode), (WcStatus::Success, Opcode::Recv));
            let source = g.source.unwrap();
            assert_eq!(source.qpn, server_ep.qpn, "replies come from the server");
            assert_eq!(source.gid, Some(Gid(server_ep.gid)));
            let len = g.byte_len as usize;
            let i = sizes.iter().position(|&s| s == len).unwrap();
            check_received(g, 0, &pattern(len, reply_seed(c, i)));
            lens.push(len);
        }
        lens.sort_unstable();
        assert_eq!(lens, sizes, "client {c} got one reply per message");
        assert_eq!(client.in_flight(), (0, 0));
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn an_over_mtu_send_is_refused_before_posting_and_the_region_comes_back() {
    let (ctx, pd) = device_pd();
    let mut qp = pd.ud_queue_pair().build().unwrap();
    let ep = qp.endpoint();
    let mtu = qp.mtu() as usize;
    let to_self = qp.address_handle(&ep).unwrap();

    let region = pd.register(pattern(mtu + 1, 7), Access::LOCAL).unwrap();
    let refused = qp
        .post_send(&to_self, ep.qpn, ep.qkey, region, 0..mtu + 1, 1)
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::MessageTooLarge { len, mtu: m } if len == mtu + 1 && m as usize == mtu),
        "{}",
        refused.error
    );
    let msg = refused.to_string();
    assert!(
        msg.contains("exceeds the active MTU") && msg.contains("refused before posting"),
        "{msg}"
    );
    assert_eq!(
        refused.region.read(),
        &pattern(mtu + 1, 7)[..],
        "the region comes back untouched"
    );
    assert_eq!(qp.in_flight(), (0, 0), "nothing was posted");

    // A range outside the region is refused too.
    let err = qp
        .post_send(&to_self, ep.qpn, ep.qkey, refused.region, mtu..mtu + 2, 2)
        .unwrap_err();
    assert!(
        matches!(*err.error, Error::LocalRangeOutOfBounds { .. }),
        "{}",
        err.error
    );

    // An address handle of another protection domain is refused.
    let other_pd = ctx.alloc_pd().unwrap();
    let foreign = other_pd
        .address_handle(&ep, 1, mtrdma_verbs::GidSelection::Auto)
        .unwrap();
    let err = qp
        .post_send(&foreign, ep.qpn, ep.qkey, err.region, 0..1, 3)
        .unwrap_err();
    assert!(
        matches!(*err.error, Error::ForeignAddressHandle),
        "{}",
        err.error
    );
    assert_eq!(qp.in_flight(), (0, 0));

    // Exactly the MTU goes through (here to the queue pair itself).
    let recv = pd.register(vec![FILL; mtu], Access::LOCAL).unwrap();
    qp.post_recv(recv, 0..mtu, 10).unwrap();
    qp.post_send(&to_self, ep.qpn, ep.qkey, err.region, 1..mtu + 1, 11)
        .unwrap();
    let mut done = wait(&mut qp, 2);
    done.sort_by_key(|c| c.context);
    assert_eq!(
        (done[0].status, done[0].opcode, done[0].byte_len as usize),
        (WcStatus::Success, Opcode::Recv, mtu)
    );
    assert_eq!(done[0].source.unwrap().qpn, ep.qpn);
    assert_eq!(done[0].region.read(), &pattern(mtu + 1, 7)[1..]);
    assert_eq!(
        (done[1].status, done[1].opcode),
        (WcStatus::Success, Opcode::Send)
    );
}

fn tenant_table() -> QuotaTable {
    let tenant = TenantEntry::new(TenantId(1), "t")
        .with_max_qps(4)
        .with_max_mr_bytes(1 << 30);
    QuotaTable::embedded(&Policy::new(LinkConfig::new(1_000_000_000), vec![tenant]))
        .unwrap()
        .table()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn dropping_a_ud_qp_with_receives_posted_frees_every_buffer() {
    let (_ctx, pd) = device_pd();
    let table = tenant_table();
    let t = table.attach(TenantId(1)).unwrap();
    let depth = 64u64;
    let mut qp = pd
        .ud_queue_pair()
        .tenant(&t)
        .max_recv_wr(depth as u32)
        .build()
        .unwrap();
    let usage = || {
        let u = &table.usage().unwrap()[0];
        (u.qps.0, u.mr_bytes.0)
    };
    assert_eq!(usage(), (1, depth * 40), "the queue pair and its GRH cells");
    for i in 0..50 {
        let mr = pd.register_for(&t, vec![0u8; 4096], Access::LOCAL).unwrap();
        qp.post_recv(mr, 0..4096, i).unwrap();
    }
    // A few sends to itself: they complete (and consume receives) but are
    // never polled.
    let ep = qp.endpoint();
    let to_self = qp.address_handle(&ep).unwrap();
    for i in 0..3 {
        let mr = pd.register_for(&t, vec![1u8; 512], Access::LOCAL).unwrap();
        qp.post_send(&to_self, ep.qpn, ep.qkey, mr, 0..512, 100 + i)
            .unwrap();
    }
    drop(to_self);
    assert_eq!(qp.in_flight(), (3, 50));
    assert_eq!(usage(), (1, depth * 40 + 50 * 4096 + 3 * 512));
    drop(qp);
    // Every region (and the GRH buffer) was flushed, deregistered and
    // freed, and the queue pair gave its place back.
    assert_eq!(usage(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_datagram_longer_than_the_receive_range_fails_and_the_region_comes_back() {
    let (_ctx, pd) = device_pd();
    let mut receiver = pd.ud_queue_pair().build().unwrap();
    let mut sender = pd.ud_queue_pair().build().unwrap();
    let ep = receiver.endpoint();
    let to_receiver = sender.address_handle(&ep).unwrap();
    let small = pd.register(vec![FILL; 64], Access::LOCAL).unwrap();
    receiver.post_recv(small, 0..16, 1).unwrap();
    let msg = pd.register(pattern(100, 3), Access::LOCAL).unwrap();
    sender
        .post_send(&to_receiver, ep.qpn, ep.qkey, msg, 0..100, 2)
        .unwrap();
    let sent = wait(&mut sender, 1).pop().unwrap();
    assert_eq!((sent.status, sent.byte_len), (WcStatus::Success, 100));
    let got = wait(&mut receiver, 1).pop().unwrap();
    println!("a 100 B datagram into a 16 B range: {:?}", got.status);
    assert!(
        matches!(
            got.status,
            WcStatus::LocalLength | WcStatus::LocalQpOperation
        ),
        "{}",
        got.status
    );
    assert_eq!((got.opcode, got.context), (Opcode::Unknown, 1));
    assert!(got.source.is_none(), "a failed receive names no sender");
    assert_eq!(got.region.len(), 64, "the region comes back");
    assert!(
        got.region.read()[16..].iter().all(|&b| b == FILL),
        "nothing written past the posted range"
    );
    assert_eq!(receiver.in_flight(), (0, 0));
    // rxe leaves the receiver in the error state without flushing
    // receives posted later; moving it to the error state explicitly
    // hands them back.
    let next = pd.register(vec![FILL; 64], Access::LOCAL).unwrap();
    receiver.post_recv(next, 0..64, 3).unwrap();
    receiver.set_error().unwrap();
    let flushed = wait(&mut receiver, 1).pop().unwrap();
    assert_eq!(
        (flushed.status, flushed.context, flushed.region.len()),
        (WcStatus::Flushed, 3, 64)
    );
    assert_eq!(receiver.in_flight(), (0, 0));
}

/// Polls a scheduled UD queue pair until `n` completions arrive (10 s at
/// most).
fn wait_scheduled(qp: &mut mtrdma_verbs::ScheduledUdQueuePair, n: usize) -> Vec<UdCompletion> {
    wait_within(qp, n, Duration::from_secs(10))
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn scheduled_ud_sends_arrive_whole_with_their_source_and_complete_once() {
    use mtrdma_verbs::ScheduleConfig;
    let table = tenant_table();
    let handle = table.attach(TenantId(1)).unwrap();
    let (_ctx, pd) = device_pd();
    let mut server = pd.ud_queue_pair().max_recv_wr(64).build().unwrap();
    let mtu = server.mtu() as usize;
    // The client's tenant is its queue pair's: scheduled by its policy.
    let mut client = pd
        .ud_queue_pair()
        .tenant(&handle)
        .build()
        .unwrap()
        .scheduled(ScheduleConfig {
            max_pieces_in_flight: 2,
            ..ScheduleConfig::default()
        })
        .unwrap();
    assert_eq!(client.tenant(), TenantId(1));
    let sizes = sizes(mtu);
    for i in 0..sizes.len() {
        let mut r = pd.allocate(mtu + 64, Access::LOCAL).unwrap();
        r.write_at(0, &vec![FILL; mtu + 64]).unwrap();
        server.post_recv(r, 32..32 + mtu, i as u64).unwrap();
    }
    let ep = server.endpoint();
    let to_server = client.address_handle(&ep).unwrap();
    // Posted all at once: two in the NIC, the rest wait for the scheduler.
    for (i, &len) in sizes.iter().enumerate() {
        let mut msg = pd.allocate(len, Access::LOCAL).unwrap();
        msg.write_at(0, &pattern(len, seed(0, i))).unwrap();
        client
            .post_send(&to_server, ep.qpn, ep.qkey, msg, 0..len, 100 + i as u64)
            .unwrap();
    }
    // An over-MTU datagram is refused before it is queued.
    let big = pd.allocate(mtu + 1, Access::LOCAL).unwrap();
    let refused = client
        .post_send(&to_server, ep.qpn, ep.qkey, big, 0..mtu + 1, 999)
        .unwrap_err();
    assert!(matches!(*refused.error, Error::MessageTooLarge { .. }));
    assert_eq!(refused.region.len(), mtu + 1, "the region comes back");
    let sent = wait_scheduled(&mut client, sizes.len());
    let contexts: Vec<u64> = sent.iter().map(|c| c.context).collect();
    let expected: Vec<u64> = (0..sizes.len() as u64).map(|i| 100 + i).collect();
    assert_eq!(contexts, expected, "one completion per datagram, in order");
    for (c, &len) in sent.iter().zip(&sizes) {
        assert_eq!((c.status, c.opcode), (WcStatus::Success, Opcode::Send));
        assert_eq!(c.byte_len as usize, len);
    }
    assert_eq!(client.queued(), 0);
    let got = wait(&mut server, sizes.len());
    for c in &got {
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.source.unwrap().qpn, client.qpn(), "the sender is known");
        let i = c.context as usize;
        check_received(c, 32, &pattern(sizes[i], seed(0, i)));
    }
    // The tenant's table saw every datagram posted.
    let usage = table.usage().unwrap();
    let bytes: usize = sizes.iter().sum();
    assert_eq!(usage[0].bytes_posted, bytes as u64);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduled_ud_tenant_keeps_to_its_cap() {
    use mtrdma_core::RateLimit;
    use mtrdma_verbs::ScheduleConfig;
    const CAP: u64 = 400_000; // 400 kB/s
    const LEN: usize = 1024;
    let tenant = TenantEntry::new(TenantId(1), "capped")
        .with_max_qps(4)
        .with_max_mr_bytes(1 << 30)
        .with_rate(RateLimit::new(CAP, 4 * LEN as u64));
    let table =
        QuotaTable::embedded(&Policy::new(LinkConfig::new(1_000_000_000), vec![tenant])).unwrap();
    let handle = table.attach(TenantId(1)).unwrap();
    let (_ctx, pd) = device_pd();
    let server = pd.ud_queue_pair().build().unwrap();
    let mut client = pd
        .ud_queue_pair()
        .tenant(&handle)
        .build()
        .unwrap()
        .scheduled(ScheduleConfig::default())
        .unwrap();
    let ep = server.endpoint();
    let to_server = client.address_handle(&ep).unwrap();
    let mut spare: Vec<_> = (0..16)
        .map(|_| pd.allocate(LEN, Access::LOCAL).unwrap())
        .collect();
    let (mut done, mut out) = (0u64, Vec::new());
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        while let Some(msg) = spare.pop() {
            client
                .post_send(&to_server, ep.qpn, ep.qkey, msg, 0..LEN, 0)
                .unwrap();
        }
        client.poll(&mut out).unwrap();
        for c in out.drain(..) {
            assert_eq!(c.status, WcStatus::Success);
            done += u64::from(c.byte_len);
            spare.push(c.region);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = done as f64 / secs;
    println!("capped UD tenant: {rate:.0} B/s against a cap of {CAP} B/s");
    assert!(
        rate <= CAP as f64 * 1.05 + (4 * LEN) as f64 / secs,
        "{rate:.0} B/s above the cap"
    );
    assert!(rate >= CAP as f64 * 0.8, "{rate:.0} B/s far below the cap");
}
