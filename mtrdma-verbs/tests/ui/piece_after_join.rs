// Joining takes both pieces: the second is the first's tail afterwards,
// not a region of its own.
use mtrdma_verbs::Access;

fn join(pd: &mtrdma_verbs::ProtectionDomain) {
    let mut first = pd.allocate(128, Access::LOCAL).unwrap();
    let second = first.split_off(64).unwrap();
    let whole = first.join(second).unwrap();
    println!("{} {:?}", whole.len(), second.as_slice());
}

fn main() {}
