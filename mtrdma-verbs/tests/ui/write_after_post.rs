// Nor can safe code modify or free it while the NIC may use it.
use mtrdma_verbs::{Access, ScheduledQueuePair, SendOp};

fn post(qp: &mut ScheduledQueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let mut region = pd.allocate(64, Access::LOCAL).unwrap();
    let remote = pd.allocate(64, Access::REMOTE_READ_WRITE).unwrap().remote().unwrap();
    qp.post_send(SendOp::Write(remote), region, 0..64, 1).unwrap();
    region.write_at(0, &[1]).unwrap();
    drop(region);
}

fn main() {}
