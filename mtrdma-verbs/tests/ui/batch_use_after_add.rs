// A region added to a batch belongs to the batch, then to the queue pair:
// reading it before its completion hands it back does not compile.
use mtrdma_verbs::{Access, QueuePair, SendOp};

fn post(qp: &mut QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let region = pd.allocate(64, Access::LOCAL).unwrap();
    let mut batch = qp.batch();
    batch.post_send(SendOp::Send, region, 0..64, 1).unwrap();
    batch.submit().unwrap();
    println!("{:?}", region.as_slice());
}

fn main() {}
