// A region handed to post_send belongs to the queue pair: reading it
// before its completion hands it back does not compile.
use mtrdma_verbs::{Access, QueuePair, SendOp};

fn post(qp: &mut QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let region = pd.allocate(64, Access::LOCAL).unwrap();
    qp.post_send(SendOp::Send, region, 0..64, 1).unwrap();
    println!("{:?}", region.as_slice());
}

fn main() {}
