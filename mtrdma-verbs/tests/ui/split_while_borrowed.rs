// Splitting changes which bytes a region owns: it needs the region
// exclusively, so no slice of it may be alive across a split.
use mtrdma_verbs::Access;

fn split(pd: &mtrdma_verbs::ProtectionDomain) {
    let mut region = pd.allocate(128, Access::LOCAL).unwrap();
    let bytes = region.as_slice().unwrap();
    let rest = region.split_off(64).unwrap();
    println!("{} {}", bytes.len(), rest.len());
}

fn main() {}
