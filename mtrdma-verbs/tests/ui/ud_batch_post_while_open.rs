// A datagram batch borrows its queue pair: nothing else is posted on it
// (which would overtake the batch's datagrams) until the batch is
// submitted, and a region added to it is the batch's.
use mtrdma_verbs::{Access, AddressHandle, UdEndpoint, UdQueuePair};

fn post(qp: &mut UdQueuePair, pd: &mtrdma_verbs::ProtectionDomain, ah: &AddressHandle, to: UdEndpoint) {
    let mut batch = qp.batch();
    let msg = pd.allocate(64, Access::LOCAL).unwrap();
    batch.post_send(ah, to.qpn, to.qkey, msg, 0..64, 1).unwrap();
    let _ = msg.read();
    qp.post_send(ah, to.qpn, to.qkey, pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 2)
        .unwrap();
    batch.submit().unwrap();
}

fn main() {}
