//! The registry's protocol (memcached's text subset) from arbitrary bytes,
//! as a client reads a registry's replies and a `RegistryHost` reads its
//! clients' commands: a message, "read more" or an error, never a panic;
//! a message encoded again reads back as the same message, using exactly
//! its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrdma_core::registry::wire::{Command, Parsed, Reply, MAX_LINE, MAX_VALUE, MAX_VALUES};

fuzz_target!(|data: &[u8]| {
    if let Ok(Parsed::Done(reply, used)) = Reply::parse(data) {
        assert!(used <= data.len());
        if let Reply::Values(values) = &reply {
            assert!(values.iter().all(|(_, _, v)| v.len() <= MAX_VALUE));
        }
        let wire = reply.encode();
        assert_eq!(
            Reply::parse(&wire),
            Ok(Parsed::Done(reply.clone(), wire.len()))
        );
        if let Reply::Values(values) = &reply {
            if let [(key, _, value)] = &values[..] {
                // Asking for the one name a reply carries gives its value.
                assert_eq!(reply.clone().value_of(key), Ok(Some(value.clone())));
            }
        }
    }
    if let Ok(Parsed::Done(command, used)) = Command::parse(data) {
        assert!(used <= data.len());
        let wire = command.encode();
        assert_eq!(Command::parse(&wire), Ok(Parsed::Done(command, wire.len())));
    }
    // "Read more" never holds on to more than a command line and its
    // value, or a reply's lines and values.
    if data.len() > MAX_LINE + 2 + MAX_VALUE + 2 {
        assert_ne!(Command::parse(data), Ok(Parsed::Incomplete));
    }
    if data.len() > (MAX_VALUES + 1) * (MAX_LINE + 2 + MAX_VALUE + 2) {
        assert_ne!(Reply::parse(data), Ok(Parsed::Incomplete));
    }
});
