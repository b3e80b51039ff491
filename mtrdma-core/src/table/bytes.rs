//! A table as bytes: the entry points the fuzzers and the layout tests
//! use to validate regions that did not come from a live table.

use super::*;

impl QuotaTable {
    /// Validates `bytes` as a policy region followed by the matching state
    /// region (as laid out by [`QuotaTable::to_bytes`]) and reads the policy:
    /// what a fuzzer feeds arbitrary bytes to.
    pub fn validate_bytes(policy: &[u8], state: &[u8]) -> Result<PolicySnapshot, TableError> {
        let table = Self::from_mappings(None, copy(policy)?, State::Whole(copy(state)?))?;
        Ok((*table.snapshot()?).clone())
    }

    /// Validates `policy` as a coordinated table's policy region and
    /// `segment` as one tenant's state file of it (what a coordinator
    /// hands a registered process; see
    /// [`create_coordinated`](Self::create_coordinated)), and reads that
    /// tenant's usage: what a fuzzer feeds arbitrary bytes to.
    pub fn validate_tenant_bytes(
        policy: &[u8],
        segment: &[u8],
    ) -> Result<Vec<TenantUsage>, TableError> {
        let pmap = copy(policy)?;
        let (capacity, _) = validate_policy_region(&pmap)?;
        let per_tenant = split_processes(&pmap);
        check_split_sizes(capacity, per_tenant)?;
        let map = copy(segment)?;
        validate_segment(&map, per_tenant, capacity)?;
        let state = State::split(capacity, per_tenant, [Segment { map, fd: None }]);
        Self::from_mappings(None, pmap, state)?.usage()
    }

    /// The bytes of a coordinated table for `policy` made in this process
    /// with no names (its policy region, and tenant slot 0's state file),
    /// with `capacity` tenant slots of `per_tenant` process slots each: a
    /// valid input for [`validate_tenant_bytes`](Self::validate_tenant_bytes),
    /// for tests and fuzzers.
    pub fn sample_tenant_bytes(
        policy: &Policy,
        capacity: u32,
        per_tenant: u32,
    ) -> Result<(Vec<u8>, Vec<u8>), TableError> {
        check_split_sizes(capacity, per_tenant)?;
        let pmap =
            Mapping::anonymous(policy_len(capacity)).map_err(|e| io_err("mmap", "(sample)", e))?;
        let table = Self::init_coordinated(None, pmap, capacity, per_tenant, policy)?;
        let segment = table.segment(0).map(|s| dump(&s.map)).unwrap_or_default();
        Ok((dump(&table.inner.policy), segment))
    }

    /// The bytes of both regions (policy, state), for tests and tools. A
    /// coordinated table has no state region (each tenant's state is a
    /// file of its own): its state bytes are empty.
    pub fn to_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        let state = match &self.inner.state {
            State::Whole(smap) => dump(smap),
            State::Split { .. } => Vec::new(),
        };
        (dump(&self.inner.policy), state)
    }
}

/// A process-local mapping holding a copy of `bytes` (a trailing partial
/// word is left out: validation reports the region as truncated).
pub(super) fn copy(bytes: &[u8]) -> Result<Mapping, TableError> {
    let map = Mapping::anonymous(bytes.len()).map_err(|e| io_err("mmap", "(bytes)", e))?;
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: an AtomicU64 inside the mapping (bounds checked by `get`).
        match unsafe { map.get::<AtomicU64>(i * 8) } {
            Some(w) => w.store(u64::from_le_bytes(word), Ordering::Relaxed),
            None => break,
        }
    }
    Ok(map)
}

/// The bytes of `map`, word by word.
pub(super) fn dump(map: &Mapping) -> Vec<u8> {
    let mut out = Vec::with_capacity(map.len());
    for i in 0..map.len() / 8 {
        // SAFETY: an AtomicU64 inside the mapping (bounds checked by `get`).
        let w = unsafe { map.get::<AtomicU64>(i * 8) }.expect("in bounds");
        out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    out
}

/// A table as bytes, and every kind of corruption it can show up with:
/// each gives its error, never a panic.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TenantEntry;
    use crate::table::fixtures::two_tenants;

    // ---- corruption: every kind gives its error, never a panic ----

    fn bytes() -> (Vec<u8>, Vec<u8>) {
        QuotaTable::embedded_with_capacity(&two_tenants(), 4, 4)
            .unwrap()
            .to_bytes()
    }

    /// The error `validate_bytes` gives the regions `$p` and `$s`,
    /// asserted to match `$err`.
    macro_rules! refused {
        ($p:expr, $s:expr, $err:pat) => {{
            let err = QuotaTable::validate_bytes($p, $s).unwrap_err();
            assert!(matches!(err, $err), "{err}");
            err
        }};
    }

    /// [`refused!`] for the table's bytes with the policy region's `u32`
    /// at `at` set to `v`.
    macro_rules! refused_with {
        ($at:expr, $v:expr, $err:pat) => {{
            let (mut p, s) = bytes();
            put_u32(&mut p, $at, $v);
            refused!(&p, &s, $err)
        }};
    }

    fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn intact_bytes_validate() {
        let (p, s) = bytes();
        let snap = QuotaTable::validate_bytes(&p, &s).unwrap();
        assert_eq!(snap.policy.tenants.len(), 2);
        assert_eq!(snap.policy.tenants[0].name, "kv");
        assert_eq!(snap.policy.tenants[0].class, TrafficClass::Latency);
        assert_eq!(snap.policy.tenants[1].schedule.weight, 3);
    }

    #[test]
    fn truncated_regions() {
        let (p, s) = bytes();
        for cut in [0, 7, 64, 127, p.len() - 8] {
            let err = QuotaTable::validate_bytes(&p[..cut], &s).unwrap_err();
            assert!(
                matches!(
                    err,
                    TableError::Truncated {
                        region: "policy",
                        ..
                    }
                ),
                "{cut}: {err}"
            );
        }
        let err = refused!(
            &p,
            &s[..s.len() - 64],
            TableError::Truncated {
                region: "state",
                ..
            }
        );
        assert!(err.to_string().contains("truncated"));
    }

    #[test]
    fn foreign_bytes_are_not_a_table() {
        let (mut p, s) = bytes();
        p[..8].copy_from_slice(b"NOTMTRDM");
        refused!(
            &p,
            &s,
            TableError::BadMagic {
                region: "policy",
                ..
            }
        );
        let (p, mut s) = bytes();
        s[0] ^= 0xff;
        refused!(
            &p,
            &s,
            TableError::BadMagic {
                region: "state",
                ..
            }
        );
    }

    #[test]
    fn other_versions_are_refused() {
        refused_with!(
            8,
            2,
            TableError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        );
    }

    #[test]
    fn other_capacities_and_layouts_are_refused() {
        // The state region was made for another capacity than the policy region.
        let (p, _) = bytes();
        let (_, s8) = QuotaTable::embedded_with_capacity(&two_tenants(), 8, 4)
            .unwrap()
            .to_bytes();
        refused!(
            &p,
            &s8,
            TableError::Mismatch {
                field: "capacity",
                found: 8,
                expected: 4,
                ..
            }
        );
        // A capacity out of range, and a slot size of another layout.
        refused_with!(16, 0, TableError::OutOfRange { .. });
        refused_with!(16, u32::MAX, TableError::OutOfRange { .. });
        refused_with!(
            20,
            100,
            TableError::Mismatch {
                field: "slot_size",
                ..
            }
        );
    }

    #[test]
    fn out_of_range_values_are_refused() {
        const SLOT0: usize = 128;
        let (mut p, s) = bytes();
        put_u32(&mut p, SLOT0 + 8, 7); // class
        let err = QuotaTable::validate_bytes(&p, &s).unwrap_err();
        assert!(
            err.to_string().contains("class = 7 is out of range"),
            "{err}"
        );

        // weight
        refused_with!(SLOT0 + 12, 0, TableError::InvalidPolicy(_));

        let (mut p, s) = bytes();
        p[SLOT0 + 32] = 0xff; // name: not UTF-8
        refused!(&p, &s, TableError::OutOfRange { .. });

        // tenant_count disagrees with the slots in use
        refused_with!(
            44,
            3,
            TableError::Mismatch {
                field: "tenant_count",
                ..
            }
        );

        let (mut p, s) = bytes();
        put_u64(&mut p, 32, 0); // link capacity 0
        refused!(&p, &s, TableError::InvalidPolicy(_));
    }

    #[test]
    fn a_writer_that_died_mid_update_is_reported_not_waited_on_forever() {
        let (mut p, s) = bytes();
        put_u64(&mut p, 24, 7); // odd seq: a write in progress that never ends
        refused!(&p, &s, TableError::Torn);
    }

    // ---- the latency bound: published per tenant, checked when read ----

    fn bounded() -> Policy {
        Policy::new(
            LinkConfig::new(12_500_000_000).with_latency_bound(16 << 10),
            vec![
                TenantEntry::new(TenantId(1), "kv").with_class(TrafficClass::Latency),
                TenantEntry::new(TenantId(2), "bulk").with_weight(3),
                TenantEntry::new(TenantId(3), "backup"),
            ],
        )
        .with_exempt(["backup"])
    }

    /// Byte offset of tenant slot `slot`'s word at `field` in the policy
    /// region (a 128-byte header, then 192-byte slots).
    fn slot_word(slot: usize, field: usize) -> usize {
        128 + slot * 192 + field
    }
    const PIECE_BYTES: usize = 152;
    const QUEUE_BYTES: usize = 160;
    const LATENCY_BOUND: usize = 120;

    #[test]
    fn a_latency_bound_holds_every_bulk_tenant_the_policy_does_not_exempt_by_name() {
        let table = QuotaTable::embedded(&bounded()).unwrap();
        let bulk = table.attach(TenantId(2)).unwrap();
        let p = bulk
            .protection()
            .expect("a bulk tenant is held to the bound");
        assert_eq!(
            (p.bound_bytes, p.piece_bytes, p.queue_bytes),
            (16 << 10, 4096, 10 << 10)
        );
        assert_eq!(table.attach(TenantId(1)).unwrap().protection(), None);
        assert_eq!(table.attach(TenantId(3)).unwrap().protection(), None);
        let snap = table.snapshot().unwrap();
        assert_eq!(snap.policy.link.latency_bound, Some(16 << 10));
        assert_eq!(snap.policy.exempt, ["backup"]);
        // Published again without the bound, nobody is held.
        table.publish(&two_tenants()).unwrap();
        assert_eq!(bulk.protection(), None);
        assert_eq!(table.snapshot().unwrap().policy.link.latency_bound, None);
    }

    #[test]
    fn protection_words_that_do_not_fit_the_bound_are_refused() {
        let (p, s) = QuotaTable::embedded_with_capacity(&bounded(), 4, 4)
            .unwrap()
            .to_bytes();
        let snap = QuotaTable::validate_bytes(&p, &s).unwrap();
        assert_eq!(snap.protection(TenantId(2)).unwrap().piece_bytes, 4096);
        let refused = |p: &[u8]| {
            let err = refused!(p, &s, TableError::OutOfRange { .. });
            err.to_string()
        };
        // Pieces larger than the bound allows.
        let mut big = p.clone();
        put_u64(&mut big, slot_word(1, PIECE_BYTES), 1 << 20);
        assert!(refused(&big).contains("latency bound"));
        // A bulk tenant under a bound whose slot says nothing.
        let mut none = p.clone();
        put_u64(&mut none, slot_word(1, PIECE_BYTES), 0);
        put_u64(&mut none, slot_word(1, QUEUE_BYTES), 0);
        assert!(refused(&none).contains("piece size"));
        // Settings with no bound to fit in.
        let mut unbound = p.clone();
        put_u64(&mut unbound, LATENCY_BOUND, 0);
        assert!(refused(&unbound).contains("no latency bound"));
        // A bound out of range.
        let mut huge = p;
        put_u64(&mut huge, LATENCY_BOUND, u64::MAX);
        QuotaTable::validate_bytes(&huge, &s).unwrap_err();
    }
}
