//! Batches of datagrams: one doorbell, each to its own destination.

use super::*;

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_batch_of_datagrams_reaches_each_client_and_hands_each_region_back() {
    let (_ctx, pd) = device_pd();
    let mut server = pd.ud_queue_pair().build().unwrap();
    let mtu = server.mtu() as usize;
    let mut clients: Vec<UdQueuePair> = (0..CLIENTS)
        .map(|_| pd.ud_queue_pair().build().unwrap())
        .collect();
    for (k, client) in clients.iter_mut().enumerate() {
        let recv = pd.register(vec![FILL; mtu], Access::LOCAL).unwrap();
        client.post_recv(recv, 0..mtu, 100 + k as u64).unwrap();
    }

    // Refusals leave the batch as it was, regions back untouched.
    let mut batch = server.batch();
    let to = clients[0].endpoint();
    let ah0 = batch.address_handle(&to).unwrap();
    let big = pd.register(pattern(mtu + 1, 1), Access::LOCAL).unwrap();
    let refused = batch.post_send(&ah0, to.qpn, to.qkey, big, 0..mtu + 1, 9);
    let Err(refused) = refused else {
        panic!("a datagram over the MTU was added")
    };
    let too_large = matches!(*refused.error, Error::MessageTooLarge { .. });
    assert!(too_large, "{}", refused.error);
    assert_eq!(refused.region.read(), &pattern(mtu + 1, 1)[..]);
    assert!(batch.is_empty());

    // One datagram to each client, of its own size and bytes.
    let len = |k: usize| 1 + k * (mtu - 1) / CLIENTS;
    for (k, client) in clients.iter().enumerate() {
        let to = client.endpoint();
        let ah = batch.address_handle(&to).unwrap();
        let msg = pd
            .register(pattern(len(k), seed(k, 0)), Access::LOCAL)
            .unwrap();
        batch
            .post_send(&ah, to.qpn, to.qkey, msg, 0..len(k), k as u64)
            .unwrap();
    }
    assert_eq!(batch.len(), CLIENTS);
    batch.submit().unwrap();

    let mut sent = wait(&mut server, CLIENTS);
    sent.sort_by_key(|c| c.context);
    for (k, c) in sent.iter().enumerate() {
        assert_eq!(
            (c.context, c.status, c.opcode),
            (k as u64, WcStatus::Success, Opcode::Send)
        );
        assert_eq!(
            c.region.read(),
            &pattern(len(k), seed(k, 0))[..],
            "its region back"
        );
    }
    for (k, client) in clients.iter_mut().enumerate() {
        let got = wait(client, 1);
        let c = &got[0];
        assert_eq!((c.context, c.status), (100 + k as u64, WcStatus::Success));
        assert_eq!(c.byte_len as usize, len(k));
        assert_eq!(c.source.unwrap().qpn, server.qpn(), "from the server");
        check_received(c, 0, &pattern(len(k), seed(k, 0)));
    }

    // A batch cancelled posts nothing and hands its regions back in order.
    let mut batch = server.batch();
    for k in 0..2 {
        let msg = pd.register(pattern(8, seed(k, 1)), Access::LOCAL).unwrap();
        batch
            .post_send(&ah0, to.qpn, to.qkey, msg, 0..8, 50 + k as u64)
            .unwrap();
    }
    let back = batch.cancel();
    assert_eq!(
        back.iter()
            .map(|(c, r)| (*c, r.read().to_vec()))
            .collect::<Vec<_>>(),
        (0..2)
            .map(|k| (50 + k as u64, pattern(8, seed(k, 1))))
            .collect::<Vec<_>>()
    );
    assert_eq!(server.in_flight(), (0, 0), "nothing was posted");
}
