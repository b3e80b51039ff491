// A batch cannot outlive its queue pair: the queue pair (and the regions
// it holds) cannot be dropped while a batch of it is open.
use mtrdma_verbs::{Access, QueuePair, SendOp};

fn post(qp: QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let mut qp = qp;
    let mut batch = qp.batch();
    batch
        .post_send(SendOp::Send, pd.allocate(64, Access::LOCAL).unwrap(), 0..64, 1)
        .unwrap();
    drop(qp);
    batch.submit().unwrap();
}

fn main() {}
