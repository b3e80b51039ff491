//! Arbitrary bytes as a policy file: an error or a valid policy, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrdma_core::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(policy) = Policy::from_toml_bytes(data) {
        // Whatever parses must also validate on its own.
        policy.validate().expect("a parsed policy validates");
    }
});
