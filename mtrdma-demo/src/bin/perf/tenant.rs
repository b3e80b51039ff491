//! The tenant a run is admitted and scheduled as: a policy file, a cap,
//! or a coordinator.

use super::*;

/// The tenant handle (if any) and a description for the header.
pub(crate) fn tenant_handle(
    a: &Args,
    chunk: u64,
) -> Result<Option<(TenantHandle, String)>, String> {
    if let Some(socket) = &a.coordinator {
        let handle = Tenant::join(&TenantSource::coordinator(socket))
            .map_err(|e| e.to_string())?
            .into_handle();
        let desc = format!(
            "{} (id {}, {:?} class, decided by the coordinator at {})",
            handle.name(),
            handle.tenant().0,
            handle.class(),
            socket.display()
        );
        return Ok(Some((handle, desc)));
    }
    let cap = a.cap_mbps.map(|x| {
        RateLimit::new(
            (x * MIB).round().max(1.0) as u64,
            chunk.max(64 << 10), // one chunk may go back-to-back
        )
    });
    let (policy, id) = match (&a.policy, cap) {
        (None, None) => return Ok(None),
        (None, Some(cap)) => {
            let policy = Policy::new(
                LinkConfig::new(12_500_000_000), // 100 Gbit/s: only the cap binds
                vec![TenantEntry::new(TenantId(1), "perf").with_rate(cap)],
            );
            (policy, TenantId(1))
        }
        (Some(file), cap) => {
            let mut policy =
                Policy::from_file(file).map_err(|e| format!("policy {}: {e}", file.display()))?;
            let id = policy
                .tenant_named(a.tenant.as_deref())
                .map(|t| t.id)
                .map_err(|e| format!("policy {}: {e} (--tenant NAME)", file.display()))?;
            if let Some(t) = cap.and(policy.tenants.iter_mut().find(|t| t.id == id)) {
                t.schedule.byte_cap = cap;
            }
            (policy, id)
        }
    };
    let table = QuotaTable::embedded(&policy).map_err(|e| format!("quota table: {e}"))?;
    let handle = table
        .attach(id)
        .map_err(|e| format!("attaching as tenant {}: {e}", id.0))?;
    let t = policy.tenant(id).cloned().unwrap_or_else(|| {
        // `attach` found it, so the policy has it; keep a sane fallback.
        TenantEntry::new(id, "?")
    });
    let mut desc = format!(
        "{} (id {}, {:?} class, weight {}",
        t.name, id.0, t.class, t.schedule.weight
    );
    match t.schedule.byte_cap {
        Some(r) => {
            let _ = write!(
                desc,
                ", cap {:.2} MB/sec, burst {} B",
                r.per_second as f64 / MIB,
                r.burst
            );
        }
        None => desc.push_str(", no byte-rate cap"),
    }
    if let Some(r) = t.schedule.wr_cap {
        let _ = write!(desc, ", {} WR/s cap", r.per_second);
    }
    desc.push(')');
    Ok(Some((handle, desc)))
}
