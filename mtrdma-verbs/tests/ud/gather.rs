//! Gather lists on unreliable-datagram queue pairs: several regions in
//! one datagram, plain and scheduled.

use super::*;

/// Regions of `lens` bytes, each with the pattern of `seed + i`, and the
/// range a gather takes of each (all but its first `skip` bytes).
fn gather_parts(
    pd: &ProtectionDomain,
    lens: &[usize],
    skip: usize,
    seed: u8,
) -> Vec<(mtrdma_verbs::MemoryRegion, std::ops::Range<usize>)> {
    lens.iter()
        .enumerate()
        .map(|(i, &len)| {
            let mr = pd
                .register(pattern(len, seed + i as u8), Access::LOCAL)
                .unwrap();
            (mr, skip..len)
        })
        .collect()
}

/// The bytes a gather of [`gather_parts`] sends, back to back.
fn gathered_bytes(lens: &[usize], skip: usize, seed: u8) -> Vec<u8> {
    lens.iter()
        .enumerate()
        .flat_map(|(i, &len)| pattern(len, seed + i as u8)[skip..].to_vec())
        .collect()
}

/// A gather of `parts` from `qp` to `ep` behind `ah`, with `context`,
/// which must be refused: the refusal.
fn gather_refused(
    qp: &mut UdQueuePair,
    ah: &mtrdma_verbs::AddressHandle,
    ep: &mtrdma_verbs::UdEndpoint,
    parts: Vec<(mtrdma_verbs::MemoryRegion, std::ops::Range<usize>)>,
    context: u64,
) -> mtrdma_verbs::GatherError {
    qp.post_send_gather(ah, ep.qpn, ep.qkey, parts, context)
        .unwrap_err()
}

/// A UD queue pair on `pd` to receive the gathers, and its MTU in bytes.
fn server_and_mtu(pd: &ProtectionDomain) -> (UdQueuePair, usize) {
    let server = pd.ud_queue_pair().build().unwrap();
    let mtu = server.mtu() as usize;
    (server, mtu)
}

/// The patterns of the regions a refusal or completion hands back, in order.
fn patterns_back(regions: &[mtrdma_verbs::MemoryRegion]) -> Vec<Vec<u8>> {
    regions.iter().map(|r| r.read().to_vec()).collect()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_ud_gather_is_one_datagram_within_the_mtu_and_every_region_comes_back() {
    let (ctx, pd) = device_pd();
    let (mut server, mtu) = server_and_mtu(&pd);
    let mut client = pd.ud_queue_pair().max_send_sge(3).build().unwrap();
    assert_eq!((client.max_send_sge(), server.max_send_sge()), (3, 1));
    let ep = server.endpoint();
    let to_server = client.address_handle(&ep).unwrap();

    // Three regions, the first bytes of each skipped: one datagram.
    let lens = [100, 41, mtu / 2];
    let want = gathered_bytes(&lens, 1, 10);
    let recv = pd.register(vec![FILL; mtu + 64], Access::LOCAL).unwrap();
    server.post_recv(recv, 32..32 + mtu, 1).unwrap();
    let parts = gather_parts(&pd, &lens, 1, 10);
    client
        .post_send_gather(&to_server, ep.qpn, ep.qkey, parts, 2)
        .unwrap();
    let got = wait(&mut server, 1).pop().unwrap();
    assert_eq!(
        (got.status, got.byte_len as usize),
        (WcStatus::Success, want.len())
    );
    assert_eq!(got.source.unwrap().qpn, client.qpn());
    check_received(&got, 32, &want);
    let sent = wait(&mut client, 1).pop().unwrap();
    assert_eq!(
        (
            sent.status,
            sent.opcode,
            sent.context,
            sent.byte_len as usize
        ),
        (WcStatus::Success, Opcode::Send, 2, want.len())
    );
    let back = patterns_back(&sent.into_regions());
    let given: Vec<Vec<u8>> = (0..3).map(|i| pattern(lens[i], 10 + i as u8)).collect();
    assert_eq!(back, given, "every region back, in order, untouched");
    assert_eq!(client.in_flight(), (0, 0));

    // Each part fits the MTU, together they do not: refused before
    // posting, every region back in order.
    let big = [mtu / 2, mtu / 2, 2];
    let refused = client
        .post_send_gather(
            &to_server,
            ep.qpn,
            ep.qkey,
            gather_parts(&pd, &big, 0, 20),
            3,
        )
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::MessageTooLarge { len, mtu: m } if len == mtu + 2 && m as usize == mtu),
        "{}",
        refused.error
    );
    let (regions, ranges): (Vec<_>, Vec<_>) = refused.parts.into_iter().unzip();
    assert_eq!(
        patterns_back(&regions),
        (0..3)
            .map(|i| pattern(big[i], 20 + i as u8))
            .collect::<Vec<_>>()
    );
    assert_eq!(ranges, big.iter().map(|&l| 0..l).collect::<Vec<_>>());

    // More regions than the queue pair was built for.
    let four = gather_parts(&pd, &[8, 8, 8, 8], 0, 30);
    let refused = gather_refused(&mut client, &to_server, &ep, four, 4);
    assert!(
        matches!(*refused.error, Error::TooManyParts { parts: 4, max: 3 }),
        "{}",
        refused.error
    );
    assert_eq!(refused.parts.len(), 4);

    // An address handle of another protection domain.
    let other_pd = ctx.alloc_pd().unwrap();
    let foreign = other_pd
        .address_handle(&ep, 1, mtrdma_verbs::GidSelection::Auto)
        .unwrap();
    let two = gather_parts(&pd, &[8, 8], 0, 40);
    let refused = gather_refused(&mut client, &foreign, &ep, two, 5);
    let error = &refused.error;
    assert!(matches!(**error, Error::ForeignAddressHandle), "{error}");
    assert_eq!(refused.parts.len(), 2);
    assert_eq!(client.in_flight(), (0, 0), "nothing refused was posted");

    // A queue pair built with the default takes one region a request.
    let mut single = pd.ud_queue_pair().build().unwrap();
    let two = gather_parts(&pd, &[8, 8], 0, 50);
    let refused = gather_refused(&mut single, &to_server, &ep, two, 6);
    let error = refused.error;
    assert!(
        matches!(*error, Error::TooManyParts { parts: 2, max: 1 }),
        "{error}"
    );
    // And a device that allows fewer entries refuses the queue pair.
    let err = pd
        .ud_queue_pair()
        .max_send_sge(100_000)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::TooManySges { asked: 100_000, .. }),
        "{err}"
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_scheduled_ud_gather_goes_as_one_datagram_and_hands_every_region_back() {
    use mtrdma_core::TrafficClass;
    use mtrdma_verbs::ScheduleConfig;
    let (_ctx, pd) = device_pd();
    let (mut server, mtu) = server_and_mtu(&pd);
    let mut client = pd
        .ud_queue_pair()
        .max_send_sge(2)
        .build()
        .unwrap()
        .scheduled(ScheduleConfig {
            max_pieces_in_flight: 1,
            ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
        })
        .unwrap();
    let ep = server.endpoint();
    let to_server = client.address_handle(&ep).unwrap();
    // A single datagram, then two gathers: one in the NIC at a time, the
    // others wait for the scheduler.
    let lens = [[64, mtu - 64], [1, 39]];
    for i in 0..3 {
        let recv = pd.register(vec![FILL; mtu + 64], Access::LOCAL).unwrap();
        server.post_recv(recv, 32..32 + mtu, i).unwrap();
    }
    let mut first = pd.allocate(10, Access::LOCAL).unwrap();
    first.write_at(0, &pattern(10, 1)).unwrap();
    client
        .post_send(&to_server, ep.qpn, ep.qkey, first, 0..10, 100)
        .unwrap();
    for (i, lens) in lens.iter().enumerate() {
        let parts = gather_parts(&pd, lens, 0, 10 * (i as u8 + 1));
        client
            .post_send_gather(&to_server, ep.qpn, ep.qkey, parts, 101 + i as u64)
            .unwrap();
    }
    // Refused before it is queued: over the MTU together.
    let refused = client
        .post_send_gather(
            &to_server,
            ep.qpn,
            ep.qkey,
            gather_parts(&pd, &[mtu, 1], 0, 60),
            9,
        )
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::MessageTooLarge { .. }),
        "{}",
        refused.error
    );
    assert_eq!(refused.parts.len(), 2, "both regions come back");
    let refused = client
        .post_send_gather(
            &to_server,
            ep.qpn,
            ep.qkey,
            gather_parts(&pd, &[1, 1, 1], 0, 70),
            9,
        )
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::TooManyParts { parts: 3, max: 2 }),
        "{}",
        refused.error
    );

    let sent = wait_scheduled(&mut client, 3);
    let got: Vec<(u64, WcStatus, usize, usize)> = sent
        .iter()
        .map(|c| (c.context, c.status, c.byte_len as usize, c.gathered.len()))
        .collect();
    assert_eq!(
        got,
        [
            (100, WcStatus::Success, 10, 0),
            (101, WcStatus::Success, mtu, 1),
            (102, WcStatus::Success, 40, 1),
        ],
        "one completion a datagram, in order"
    );
    let back = patterns_back(&sent.into_iter().nth(1).unwrap().into_regions());
    assert_eq!(back, [pattern(64, 10), pattern(mtu - 64, 11)]);
    assert_eq!(client.queued(), 0);
    let received = wait(&mut server, 3);
    for c in &received {
        assert_eq!(c.status, WcStatus::Success);
        let want = match c.context {
            0 => pattern(10, 1),
            i => gathered_bytes(&lens[i as usize - 1], 0, 10 * i as u8),
        };
        check_received(c, 32, &want);
    }
}
