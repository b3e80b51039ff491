// A slice borrowed from a region cannot outlive posting it as a receive.
use mtrdma_verbs::{Access, QueuePair};

fn post(qp: &mut QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let region = pd.allocate(64, Access::LOCAL).unwrap();
    let view = region.as_slice();
    qp.post_recv(region, 0..64, 1).unwrap();
    println!("{view:?}");
}

fn main() {}
