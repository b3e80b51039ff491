//! The rules every policy follows, whether read from a file or built in code.

use std::collections::HashMap;

use super::error::quote;
use super::{LinkConfig, Policy, PolicyError, RateLimit, TenantEntry, TenantRef};
use crate::MAX_WEIGHT;

/// The characters a tenant name may use, for messages.
pub(super) const NAME_RULE: &str = "use 1 to 31 letters, digits, '_', '.' or '-'";

pub(super) fn policy(policy: &Policy) -> Result<(), PolicyError> {
    link(&policy.link)?;
    if policy.tenants.is_empty() {
        return Err(PolicyError::invalid(
            None,
            "tenant",
            "the policy defines no tenants; add at least one [[tenant]] with an id and a name",
        ));
    }
    let mut ids = HashMap::with_capacity(policy.tenants.len());
    let mut names = HashMap::with_capacity(policy.tenants.len());
    for t in &policy.tenants {
        tenant(t)?;
        if let Some(first) = ids.insert(t.id, t) {
            return Err(PolicyError::invalid(
                Some(&TenantRef::Name(t.name.clone())),
                "id",
                format!(
                    "{} is already the id of tenant {}; give every tenant its own id",
                    t.id.0,
                    TenantRef::Name(first.name.clone())
                ),
            ));
        }
        if let Some(first) = names.insert(t.name.as_str(), t) {
            return Err(PolicyError::invalid(
                Some(&TenantRef::Id(t.id)),
                "name",
                format!(
                    "{:?} is already the name of tenant {}; give every tenant its own name",
                    t.name,
                    TenantRef::Id(first.id)
                ),
            ));
        }
    }
    exempt(policy)?;
    cluster(policy)
}

/// The limits across hosts name tenants of the policy, once each, and a
/// cluster weight has a cluster capacity to share.
fn cluster(policy: &Policy) -> Result<(), PolicyError> {
    let mut seen = HashMap::with_capacity(policy.cluster.tenants.len());
    for c in &policy.cluster.tenants {
        let Some(t) = policy.tenant(c.id) else {
            return Err(PolicyError::invalid(
                Some(&TenantRef::Id(c.id)),
                "cluster_cap",
                "limits across hosts are given to a tenant the policy does not define",
            ));
        };
        let who = Some(TenantRef::Name(t.name.clone()));
        if seen.insert(c.id, ()).is_some() {
            return Err(PolicyError::invalid(
                who.as_ref(),
                "cluster_cap",
                "the tenant's limits across hosts are given twice",
            ));
        }
        if !(1..=MAX_WEIGHT).contains(&c.weight) {
            return Err(PolicyError::invalid(
                who.as_ref(),
                "cluster_weight",
                format!(
                    "{} is out of range; use a whole number from 1 to {MAX_WEIGHT}",
                    c.weight
                ),
            ));
        }
        if c.cap.is_none() && policy.cluster.capacity.is_none() {
            return Err(PolicyError::invalid(
                who.as_ref(),
                "cluster_weight",
                "a cluster weight shares [cluster] capacity, which the policy does not give; \
                 add [cluster] capacity = \"...\", or give the tenant a cluster_cap",
            ));
        }
    }
    Ok(())
}

/// A latency bound's exemptions name tenants of the policy, once each.
fn exempt(policy: &Policy) -> Result<(), PolicyError> {
    for (i, name) in policy.exempt.iter().enumerate() {
        if !policy.tenants.iter().any(|t| &t.name == name) {
            let names: Vec<&str> = policy.tenants.iter().map(|t| t.name.as_str()).collect();
            return Err(PolicyError::invalid(
                None,
                "link.exempt",
                format!(
                    "{} is not the name of a tenant of the policy; the tenants are {}",
                    quote(name),
                    names.join(", ")
                ),
            ));
        }
        if policy.exempt[..i].contains(name) {
            return Err(PolicyError::invalid(
                None,
                "link.exempt",
                format!("{} is named twice; name each tenant once", quote(name)),
            ));
        }
    }
    if !policy.exempt.is_empty() && policy.link.latency_bound.is_none() {
        return Err(PolicyError::invalid(
            None,
            "link.exempt",
            "exempts tenants from a latency bound the policy does not set; \
             add latency_bound (e.g. latency_bound = \"16KiB\") or remove exempt",
        ));
    }
    Ok(())
}

fn link(link: &LinkConfig) -> Result<(), PolicyError> {
    if let Some(bound) = link.latency_bound {
        if let Err(e) = mtrdma_sched::Protection::for_bound(bound) {
            return Err(PolicyError::invalid(
                None,
                "link.latency_bound",
                format!("{bound} bytes: {e}; e.g. latency_bound = \"16KiB\""),
            ));
        }
    }
    if link.capacity_bytes_per_sec == 0 {
        return Err(PolicyError::invalid(
            None,
            "link.capacity",
            "0 is not a usable link capacity; give the link's rate, e.g. \"100Gbit\"",
        ));
    }
    let range = LinkConfig::MIN_RECOMPUTE_INTERVAL_MS..=LinkConfig::MAX_RECOMPUTE_INTERVAL_MS;
    if !range.contains(&link.recompute_interval_ms) {
        return Err(PolicyError::invalid(
            None,
            "link.recompute_interval_ms",
            format!(
                "{} is out of range; use a whole number from {} to {}",
                link.recompute_interval_ms,
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(())
}

/// How a tenant built in code is referred to: by name if it is a valid one.
fn reference(t: &TenantEntry) -> TenantRef {
    if name_problem(&t.name).is_none() {
        TenantRef::Name(t.name.clone())
    } else {
        TenantRef::Id(t.id)
    }
}

/// Why `name` is not a valid tenant name, if it is not.
pub(super) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some(format!("the name is empty; {NAME_RULE}"));
    }
    if name.len() > TenantEntry::MAX_NAME_LEN {
        return Some(format!(
            "{} is {} bytes long; {NAME_RULE}",
            quote(name),
            name.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    name.chars().find(|&c| !allowed(c)).map(|c| {
        format!(
            "{} contains {c:?}, which is not allowed; {NAME_RULE}",
            quote(name)
        )
    })
}

fn tenant(t: &TenantEntry) -> Result<(), PolicyError> {
    let who = reference(t);
    if let Some(problem) = name_problem(&t.name) {
        return Err(PolicyError::invalid(Some(&who), "name", problem));
    }
    if !(1..=MAX_WEIGHT).contains(&t.schedule.weight) {
        return Err(PolicyError::invalid(
            Some(&who),
            "weight",
            format!(
                "{} is out of range; use a whole number from 1 to {}",
                t.schedule.weight, MAX_WEIGHT
            ),
        ));
    }
    let caps = [
        ("rate", t.schedule.byte_cap),
        ("wr_rate", t.schedule.wr_cap),
        ("qp_create_rate", t.qp_create_rate),
        ("mr_reg_rate", t.mr_reg_rate),
    ];
    for (field, cap) in caps {
        if let Some(RateLimit { per_second: 0, .. }) = cap {
            return Err(PolicyError::invalid(
                Some(&who),
                format!("{field}.rate"),
                format!(
                    "0 is not a usable rate; give a rate above 0, or remove {field} to leave it uncapped"
                ),
            ));
        }
    }
    for (i, rule) in t.matches.iter().enumerate() {
        let field = format!("match[{}]", i + 1);
        if rule.is_empty() {
            return Err(PolicyError::invalid(
                Some(&who),
                field,
                "the rule sets no condition; set at least one of uid, gid or cgroup",
            ));
        }
        if let Some(cgroup) = &rule.cgroup {
            if !cgroup.starts_with('/') {
                return Err(PolicyError::invalid(
                    Some(&who),
                    format!("{field}.cgroup"),
                    format!(
                        "{} is not an absolute cgroup path; start it with '/', e.g. \"/kubepods.slice\"",
                        quote(cgroup)
                    ),
                ));
            }
        }
    }
    Ok(())
}
