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
