// A batch borrows its queue pair: nothing else is posted on it (which
// would overtake the batch's requests) until the batch is submitted.
use mtrdma_verbs::{Access, QueuePair, SendOp};

fn post(qp: &mut QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let mut batch = qp.batch();
    batch
        .post_send(SendOp::Send, pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 1)
        .unwrap();
    qp.post_send(SendOp::Send, pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 2)
        .unwrap();
    batch.submit().unwrap();
}

fn main() {}
