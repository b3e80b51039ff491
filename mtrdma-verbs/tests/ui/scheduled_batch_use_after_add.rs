// A region added to a scheduled batch belongs to it, then to the
// scheduler: writing it before its completion hands it back does not
// compile.
use mtrdma_verbs::{Access, ScheduledQueuePair, SendOp};

fn post(qp: &mut ScheduledQueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let mut region = pd.allocate(64, Access::LOCAL).unwrap();
    let mut batch = qp.batch();
    batch.post_send(SendOp::Send, region, 0..64, 1).unwrap();
    batch.submit().unwrap();
    region.as_mut_slice().unwrap()[0] = 1;
}

fn main() {}
