//! Arbitrary bytes as a quota table: an error or a valid snapshot, never a
//! panic or undefined behaviour.
//!
//! The first byte picks the mode: raw bytes split into the two regions, or
//! a valid table's bytes with patches (offset, value) applied, which gets
//! past the magic numbers into the deeper checks; each either as a table
//! with one state region, or as a coordinated table's policy and one
//! tenant's state file (what a registered process is handed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit, TenantEntry, TenantId, TrafficClass};

fn policy() -> Policy {
    Policy::new(
        LinkConfig::new(12_500_000_000),
        vec![
            TenantEntry::new(TenantId(1), "kv").with_class(TrafficClass::Latency),
            TenantEntry::new(TenantId(2), "bulk")
                .with_weight(3)
                .with_rate(RateLimit::new(1_000_000, 4096)),
        ],
    )
}

fn valid(coordinated: bool) -> (Vec<u8>, Vec<u8>) {
    if coordinated {
        QuotaTable::sample_tenant_bytes(&policy(), 4, 4).expect("a valid table")
    } else {
        QuotaTable::embedded_with_capacity(&policy(), 4, 4)
            .expect("a valid table")
            .to_bytes()
    }
}

/// Validates the two regions as the mode's kind of table.
fn validate(coordinated: bool, policy: &[u8], state: &[u8]) {
    if coordinated {
        let _ = QuotaTable::validate_tenant_bytes(policy, state);
    } else {
        let _ = QuotaTable::validate_bytes(policy, state);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let coordinated = mode & 2 != 0;
    if mode % 2 == 0 {
        let split = rest
            .first()
            .map_or(0, |&b| usize::from(b) * 8)
            .min(rest.len());
        validate(coordinated, &rest[..split], &rest[split..]);
    } else {
        let (mut policy, mut state) = valid(coordinated);
        for patch in rest.chunks_exact(4) {
            let region = if patch[0] & 1 == 0 {
                &mut policy
            } else {
                &mut state
            };
            let at = usize::from(u16::from_le_bytes([patch[1], patch[2]]));
            if let Some(byte) = region.get_mut(at) {
                *byte = patch[3];
            }
        }
        let cut = rest.len() % 3 == 0;
        let policy = if cut {
            &policy[..policy.len() - rest.len().min(policy.len())]
        } else {
            &policy[..]
        };
        validate(coordinated, policy, &state);
    }
});
