//! Validating mapped regions: headers, lengths and fields, so that a
//! truncated, foreign or out-of-range table is an error, never undefined
//! behaviour.

use super::*;

/// Process slots per tenant state file that policy region `pmap` names
/// (0: not a coordinated table, or not a policy region).
pub(super) fn split_processes(pmap: &Mapping) -> u32 {
    header::<PolicyHeader>(pmap, "policy")
        .map_or(0, |h| h.segment_processes.load(Ordering::Relaxed))
}

/// Policy slot `slot` of region `pmap`, if it lies inside it.
pub(super) fn raw_policy_slot(pmap: &Mapping, slot: u32) -> Option<&PolicySlot> {
    // SAFETY: all atomics; `get` checks bounds and alignment.
    unsafe { pmap.get(POLICY_HEADER + slot as usize * POLICY_SLOT) }
}

/// A region's header: `T` is [`PolicyHeader`], [`StateHeader`] or [`SegmentHeader`].
pub(super) fn header<'m, T: Header>(
    map: &'m Mapping,
    region: &'static str,
) -> Result<&'m T, TableError> {
    // SAFETY: both header types are made only of atomics; `get` checks
    // bounds and alignment.
    let h = unsafe { map.get::<T>(0) }.ok_or(TableError::Truncated {
        region,
        expected: std::mem::size_of::<T>(),
        actual: map.len(),
    })?;
    let magic = h.magic().load(Ordering::Acquire);
    if magic != T::MAGIC {
        return Err(TableError::BadMagic {
            region,
            found: magic,
        });
    }
    let version = h.version().load(Ordering::Relaxed);
    if version != VERSION {
        return Err(TableError::UnsupportedVersion {
            region,
            found: version,
            supported: VERSION,
        });
    }
    Ok(h)
}

/// What the regions' headers share.
pub(super) trait Header {
    const MAGIC: u64;
    fn magic(&self) -> &AtomicU64;
    fn version(&self) -> &std::sync::atomic::AtomicU32;
}

/// Implements [`Header`] for a header type with `magic` and `version`
/// fields.
macro_rules! header {
    ($($t:ty => $magic:expr),* $(,)?) => {$(
        impl Header for $t {
            const MAGIC: u64 = $magic;
            fn magic(&self) -> &AtomicU64 {
                &self.magic
            }
            fn version(&self) -> &std::sync::atomic::AtomicU32 {
                &self.version
            }
        }
    )*};
}

header!(
    PolicyHeader => POLICY_MAGIC,
    StateHeader => STATE_MAGIC,
    SegmentHeader => SEGMENT_MAGIC,
);

/// Fails unless the region holds at least `need` bytes.
pub(super) fn check_len(
    map: &Mapping,
    region: &'static str,
    need: usize,
) -> Result<(), TableError> {
    if map.len() < need {
        return Err(TableError::Truncated {
            region,
            expected: need,
            actual: map.len(),
        });
    }
    Ok(())
}

/// Checks the policy header and returns the capacity and the shared clock.
pub(super) fn validate_policy_region(map: &Mapping) -> Result<(u32, SharedClock), TableError> {
    const R: &str = "policy";
    let h: &PolicyHeader = header(map, R)?;
    let sizes = [
        ("header_size", &h.header_size, POLICY_HEADER),
        ("slot_size", &h.slot_size, POLICY_SLOT),
    ];
    for (field, word, expected) in sizes {
        expect_field(R, field, word.load(Ordering::Relaxed), expected)?;
    }
    let capacity = h.capacity.load(Ordering::Relaxed);
    check_sizes(capacity, 1)?;
    check_len(map, R, policy_len(capacity))?;
    let clock = SharedClock::from_params(
        h.clock_raw0.load(Ordering::Relaxed),
        h.clock_ns0.load(Ordering::Relaxed),
        h.clock_mult.load(Ordering::Relaxed),
    )
    .map_err(|problem| TableError::Clock { problem })?;
    Ok((capacity, clock))
}

/// Checks the state header against the policy's capacity and returns the
/// number of process slots.
pub(super) fn validate_state_region(map: &Mapping, capacity: u32) -> Result<u32, TableError> {
    const R: &str = "state";
    let h: &StateHeader = header(map, R)?;
    let sizes = [
        ("header_size", &h.header_size, STATE_HEADER),
        ("slot_size", &h.slot_size, STATE_SLOT),
        ("process_slot_size", &h.process_slot_size, PROCESS_SLOT),
        ("capacity", &h.capacity, capacity as usize),
    ];
    for (field, word, expected) in sizes {
        expect_field(R, field, word.load(Ordering::Relaxed), expected)?;
    }
    let processes = h.process_slots.load(Ordering::Relaxed);
    check_sizes(capacity, processes)?;
    check_len(map, R, state_len(capacity, processes))?;
    Ok(processes)
}

/// Checks one tenant's state file of a coordinated table with
/// `per_tenant` process slots per tenant and `capacity` tenant slots;
/// returns the tenant slot it says it is.
pub(super) fn validate_segment(
    map: &Mapping,
    per_tenant: u32,
    capacity: u32,
) -> Result<u32, TableError> {
    const R: &str = "tenant state";
    let h: &SegmentHeader = header(map, R)?;
    expect_field(
        R,
        "process_slots",
        h.process_slots.load(Ordering::Relaxed),
        per_tenant as usize,
    )?;
    let slot = h.tenant_slot.load(Ordering::Relaxed);
    if slot >= capacity {
        return Err(TableError::OutOfRange {
            region: R,
            field: "tenant_slot".into(),
            value: slot.into(),
            range: "below the table's capacity",
        });
    }
    check_len(map, R, segment_len(per_tenant))?;
    Ok(slot)
}

pub(super) fn expect_field(
    region: &'static str,
    field: &'static str,
    found: u32,
    expected: usize,
) -> Result<(), TableError> {
    if found as usize != expected {
        return Err(TableError::Mismatch {
            region,
            field,
            found: found.into(),
            expected: expected as u64,
        });
    }
    Ok(())
}
