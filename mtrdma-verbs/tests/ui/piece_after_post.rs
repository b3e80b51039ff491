// Pieces of one registration are posted on their own: a piece handed to
// post_send belongs to the queue pair until its completion, while the
// other pieces stay usable.
use mtrdma_verbs::{Access, QueuePair, SendOp};

fn post(qp: &mut QueuePair, pd: &mtrdma_verbs::ProtectionDomain) {
    let mut first = pd.allocate(128, Access::LOCAL).unwrap();
    let second = first.split_off(64).unwrap();
    qp.post_send(SendOp::Send, second, 0..64, 1).unwrap();
    first.as_mut_slice().unwrap()[0] = 1;
    println!("{:?}", second.as_slice());
}

fn main() {}
