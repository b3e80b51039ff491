//! Reading the TOML policy file into [`Policy`].
//!
//! Three steps, each able to say where a mistake is:
//! 1. parse the TOML into a tree that remembers where every key and value
//!    sits in the text (syntax errors get a line and column);
//! 2. check every key against the settings that exist at its place, and
//!    deserialize into private raw structs (`deny_unknown_fields`
//!    everywhere, numbers kept wide); a type error is traced back through the
//!    tree to its tenant and field;
//! 3. convert the raw structs into the public types, parsing units and
//!    checking ranges with the tenant and field at hand.
//!
//! The rules that hold for policies built in code too live in `validate`.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use toml::de::{DeTable, DeValue};

use super::error::quote;
use super::units::{self, Kind, UnitError};
use super::validate::name_problem;
use super::{
    ClusterPolicy, ClusterTenant, LinkConfig, MatchRule, Policy, PolicyError, RateLimit,
    TenantEntry, TenantRef,
};
use crate::{TenantId, TenantPolicy, TrafficClass, MAX_WEIGHT};

/// Parses `text` into a policy, without [`Policy::validate`].
pub(super) fn parse(text: &str) -> Result<Policy, PolicyError> {
    let root = DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
    let root = root.into_inner();
    check_keys(&root)?;
    let raw = RawPolicy::deserialize(toml::de::Deserializer::from(toml::Spanned::new(
        0..text.len(),
        root.clone(),
    )))
    .map_err(|e| located_error(&root, &e))?;
    raw.convert()
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn syntax_error(text: &str, e: &toml::de::Error) -> PolicyError {
    let offset = e.span().map_or(0, |s| s.start);
    let (line, column) = line_column(text, offset);
    PolicyError::Syntax {
        line,
        column,
        message: e.message().trim().replace('\n', "; "),
    }
}

// ---------------------------------------------------------------------------
// Step 2a: known keys.

const TOP_KEYS: &[&str] = &["link", "cluster", "tenant"];
const CLUSTER_KEYS: &[&str] = &["capacity"];
const LINK_KEYS: &[&str] = &[
    "capacity",
    "recompute_interval_ms",
    "latency_bound",
    "exempt",
];
const TENANT_KEYS: &[&str] = &[
    "id",
    "name",
    "class",
    "weight",
    "rate",
    "wr_rate",
    "max_qps",
    "max_mr_bytes",
    "max_outstanding_wr",
    "qp_create_rate",
    "mr_reg_rate",
    "cluster_cap",
    "cluster_weight",
    "match",
];
const RATE_KEYS: &[&str] = &["rate", "burst"];
const RATE_FIELDS: &[&str] = &["rate", "wr_rate", "qp_create_rate", "mr_reg_rate"];
const MATCH_KEYS: &[&str] = &["uid", "gid", "cgroup"];

/// Refuses the first key, in the file's structure, that is not a setting.
fn check_keys(root: &DeTable<'_>) -> Result<(), PolicyError> {
    unknown_key(root, TOP_KEYS, None, "", "at the top level")?;
    if let Some(DeValue::Table(link)) = root.get("link").map(|v| v.get_ref()) {
        unknown_key(link, LINK_KEYS, None, "link.", "in [link]")?;
    }
    if let Some(DeValue::Table(cluster)) = root.get("cluster").map(|v| v.get_ref()) {
        unknown_key(cluster, CLUSTER_KEYS, None, "cluster.", "in [cluster]")?;
    }
    let tenants = match root.get("tenant").map(|v| v.get_ref()) {
        Some(DeValue::Array(tenants)) => tenants,
        Some(DeValue::Table(_)) => {
            return Err(PolicyError::invalid(
                None,
                "tenant",
                "tenants are a list; start each one with [[tenant]] (double brackets), \
                 before its [[tenant.match]] rules",
            ))
        }
        _ => return Ok(()),
    };
    for (i, tenant) in tenants.iter().enumerate() {
        let DeValue::Table(tenant) = tenant.get_ref() else {
            continue;
        };
        let who = tree_tenant_ref(tenant, i);
        unknown_key(tenant, TENANT_KEYS, Some(&who), "", "of a tenant")?;
        for field in RATE_FIELDS {
            if let Some(DeValue::Table(cap)) = tenant.get(*field).map(|v| v.get_ref()) {
                let prefix = format!("{field}.");
                unknown_key(cap, RATE_KEYS, Some(&who), &prefix, "of a rate limit")?;
            }
        }
        if let Some(DeValue::Array(rules)) = tenant.get("match").map(|v| v.get_ref()) {
            for (j, rule) in rules.iter().enumerate() {
                if let DeValue::Table(rule) = rule.get_ref() {
                    let prefix = format!("match[{}].", j + 1);
                    unknown_key(rule, MATCH_KEYS, Some(&who), &prefix, "of a match rule")?;
                }
            }
        }
    }
    Ok(())
}

fn unknown_key(
    table: &DeTable<'_>,
    known: &[&str],
    who: Option<&TenantRef>,
    prefix: &str,
    place: &str,
) -> Result<(), PolicyError> {
    for key in table.keys() {
        let key: &str = key.get_ref();
        if !known.contains(&key) {
            return Err(PolicyError::invalid(
                who,
                format!("{prefix}{key}"),
                format!(
                    "{} is not a setting {place}; the settings are {}",
                    quote(key),
                    known.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// How to refer to the tenant table at position `index` of the file.
fn tree_tenant_ref(tenant: &DeTable<'_>, index: usize) -> TenantRef {
    if let Some(DeValue::String(name)) = tenant.get("name").map(|v| v.get_ref()) {
        if name_problem(name).is_none() {
            return TenantRef::Name(name.to_string());
        }
    }
    if let Some(DeValue::Integer(id)) = tenant.get("id").map(|v| v.get_ref()) {
        if let Ok(id) = u32::from_str_radix(id.as_str(), id.radix()) {
            return TenantRef::Id(TenantId(id));
        }
    }
    TenantRef::Position(index + 1)
}

// ---------------------------------------------------------------------------
// Step 2b: tracing a deserialization error to its tenant and field.

enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end
}

fn locate_in_table<'a>(table: &'a DeTable<'_>, span: &Range<usize>) -> Option<Vec<Segment<'a>>> {
    for (key, value) in table.iter() {
        if let Some(mut path) = locate_in_value(value.get_ref(), span) {
            path.insert(0, Segment::Key(key.get_ref()));
            return Some(path);
        }
    }
    table
        .iter()
        .find(|(key, value)| contains(&key.span(), span) || contains(&value.span(), span))
        .map(|(key, _)| vec![Segment::Key(key.get_ref())])
}

fn locate_in_value<'a>(value: &'a DeValue<'_>, span: &Range<usize>) -> Option<Vec<Segment<'a>>> {
    match value {
        DeValue::Table(table) => locate_in_table(table, span),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(mut path) = locate_in_value(item.get_ref(), span) {
                    path.insert(0, Segment::Index(i));
                    return Some(path);
                }
            }
            items
                .iter()
                .position(|item| contains(&item.span(), span))
                .map(|i| vec![Segment::Index(i)])
        }
        _ => None,
    }
}

/// Turns a deserialization error into one naming the tenant and field.
fn located_error(root: &DeTable<'_>, e: &toml::de::Error) -> PolicyError {
    let problem = e.message().trim().replace('\n', "; ");
    let path = e.span().and_then(|span| locate_in_table(root, &span));
    let Some(path) = path else {
        return PolicyError::invalid(None, "(unknown)", problem);
    };
    let mut rest = path.as_slice();
    let mut who = None;
    let mut field = String::new();
    if let [Segment::Key("tenant"), Segment::Index(i), tail @ ..] = rest {
        if tail.is_empty() {
            return PolicyError::invalid(None, format!("tenant[{}]", i + 1), problem);
        }
        if let Some(DeValue::Array(tenants)) = root.get("tenant").map(|v| v.get_ref()) {
            if let Some(DeValue::Table(t)) = tenants.get(*i).map(|v| v.get_ref()) {
                who = Some(tree_tenant_ref(t, *i));
            }
        }
        if who.is_none() {
            who = Some(TenantRef::Position(i + 1));
        }
        rest = tail;
    }
    for segment in rest {
        match segment {
            Segment::Key(key) => {
                if !field.is_empty() {
                    field.push('.');
                }
                field.push_str(key);
            }
            Segment::Index(i) => field.push_str(&format!("[{}]", i + 1)),
        }
    }
    PolicyError::invalid(who.as_ref(), field, problem)
}

// ---------------------------------------------------------------------------
// Step 2c: the raw structs.

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a policy document")]
struct RawPolicy {
    link: Option<RawLink>,
    cluster: Option<RawCluster>,
    #[serde(default)]
    tenant: Vec<RawTenant>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [link] table")]
struct RawLink {
    capacity: Option<Quantity>,
    recompute_interval_ms: Option<Whole>,
    latency_bound: Option<Quantity>,
    exempt: Option<Vec<String>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [cluster] table")]
struct RawCluster {
    capacity: Option<Quantity>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[tenant]] table")]
struct RawTenant {
    id: Option<Whole>,
    name: Option<String>,
    class: Option<RawClass>,
    weight: Option<Whole>,
    rate: Option<RawRate<Quantity>>,
    wr_rate: Option<RawRate<Whole>>,
    max_qps: Option<Whole>,
    max_mr_bytes: Option<Quantity>,
    max_outstanding_wr: Option<Whole>,
    qp_create_rate: Option<RawRate<Whole>>,
    mr_reg_rate: Option<RawRate<Whole>>,
    cluster_cap: Option<Quantity>,
    cluster_weight: Option<Whole>,
    #[serde(default, rename = "match")]
    matches: Vec<RawMatch>,
}

#[derive(serde::Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an inline table such as { rate = 1000, burst = 10 }"
)]
struct RawRate<T> {
    rate: Option<T>,
    burst: Option<T>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[tenant.match]] table")]
struct RawMatch {
    uid: Option<Whole>,
    gid: Option<Whole>,
    cgroup: Option<String>,
}

#[derive(serde::Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RawClass {
    Latency,
    Bulk,
}

/// A TOML integer, kept wide so that range errors are worded here.
struct Whole(i128);

/// A size or byte rate: an integer, or a string with a unit.
enum Quantity {
    Whole(i128),
    Text(String),
}

struct WholeVisitor;

impl Visitor<'_> for WholeVisitor {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        Ok(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        Ok(i128::from(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<i128, E> {
        Ok(v)
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<i128, E> {
        Ok(i128::try_from(v).unwrap_or(i128::MAX))
    }
}

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Whole, D::Error> {
        d.deserialize_any(WholeVisitor).map(Whole)
    }
}

struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a whole number of bytes or a string with a unit, such as \"64KiB\" or \"10Gbit\"",
        )
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity::Whole(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity::Whole(i128::from(v)))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Quantity, E> {
        Ok(Quantity::Whole(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Quantity, E> {
        Ok(Quantity::Whole(i128::try_from(v).unwrap_or(i128::MAX)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Ok(Quantity::Text(v.to_owned()))
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Quantity, D::Error> {
        d.deserialize_any(QuantityVisitor)
    }
}

// ---------------------------------------------------------------------------
// Step 3: conversion into the public types.

/// The value of an integer field that must lie in `min..=max`.
fn ranged<T>(
    value: &Whole,
    min: T,
    max: T,
    who: Option<&TenantRef>,
    field: &str,
) -> Result<T, PolicyError>
where
    T: TryFrom<i128> + Into<i128> + Copy + fmt::Display,
{
    let v = value.0;
    if v >= min.into() && v <= max.into() {
        if let Ok(v) = T::try_from(v) {
            return Ok(v);
        }
    }
    Err(PolicyError::invalid(
        who,
        field,
        format!("{v} is out of range; use a whole number from {min} to {max}"),
    ))
}

/// The value of a size or byte-rate field, in bytes (per second).
fn quantity(
    value: &Quantity,
    kind: Kind,
    who: Option<&TenantRef>,
    field: &str,
) -> Result<u64, PolicyError> {
    let (what, examples) = match kind {
        Kind::Size => ("size", "64KiB, 1MB, 4096"),
        Kind::ByteRate => ("byte rate", "10Gbit, 1.25GB/s, 500MiB/s, 1000000"),
    };
    let problem = match value {
        Quantity::Whole(v) => match u64::try_from(*v) {
            Ok(v) => return Ok(v),
            Err(_) if *v < 0 => format!("{v} is negative; a {what} is 0 or more"),
            Err(_) => format!("{v} is too large; the largest {what} is {}", u64::MAX),
        },
        Quantity::Text(text) => match units::parse_quantity(text, kind) {
            Ok(v) => return Ok(v),
            Err(UnitError::Malformed) => {
                format!("{} is not a {what} (use e.g. {examples})", quote(text))
            }
            Err(UnitError::TooPrecise) => format!(
                "{} has more than 9 digits after the decimal point; round it",
                quote(text)
            ),
            Err(UnitError::TooLarge) => format!(
                "{} is too large; the largest {what} is {} bytes{}",
                quote(text),
                u64::MAX,
                if kind == Kind::ByteRate { "/s" } else { "" }
            ),
        },
    };
    Err(PolicyError::invalid(who, field, problem))
}

fn missing(who: Option<&TenantRef>, field: &str, hint: &str) -> PolicyError {
    PolicyError::invalid(who, field, format!("the setting is missing; {hint}"))
}

impl RawPolicy {
    fn convert(self) -> Result<Policy, PolicyError> {
        let (link, exempt) =
            match self.link {
                Some(link) => link.convert()?,
                None => return Err(missing(
                    None,
                    "link.capacity",
                    "add a [link] section with the link's capacity, e.g. capacity = \"100Gbit\"",
                )),
            };
        let mut cluster = ClusterPolicy {
            capacity: match self.cluster.and_then(|c| c.capacity) {
                Some(c) => Some(quantity(&c, Kind::ByteRate, None, "cluster.capacity")?),
                None => None,
            },
            tenants: Vec::new(),
        };
        let mut tenants = Vec::with_capacity(self.tenant.len());
        for (i, t) in self.tenant.into_iter().enumerate() {
            let (entry, across) = t.convert(i)?;
            cluster.tenants.extend(across);
            tenants.push(entry);
        }
        Ok(Policy {
            link,
            tenants,
            exempt,
            cluster: cluster.into(),
        })
    }
}

impl RawLink {
    fn convert(self) -> Result<(LinkConfig, Vec<String>), PolicyError> {
        let field = "link.capacity";
        let capacity = match &self.capacity {
            Some(c) => quantity(c, Kind::ByteRate, None, field)?,
            None => {
                return Err(missing(
                    None,
                    field,
                    "give the link's capacity, e.g. capacity = \"100Gbit\"",
                ))
            }
        };
        let recompute_interval_ms = match &self.recompute_interval_ms {
            Some(ms) => ranged(
                ms,
                LinkConfig::MIN_RECOMPUTE_INTERVAL_MS,
                LinkConfig::MAX_RECOMPUTE_INTERVAL_MS,
                None,
                "link.recompute_interval_ms",
            )?,
            None => LinkConfig::DEFAULT_RECOMPUTE_INTERVAL_MS,
        };
        let latency_bound = match &self.latency_bound {
            Some(b) => Some(quantity(b, Kind::Size, None, "link.latency_bound")?),
            None => None,
        };
        Ok((
            LinkConfig {
                capacity_bytes_per_sec: capacity,
                recompute_interval_ms,
                latency_bound,
            },
            self.exempt.unwrap_or_default(),
        ))
    }
}

impl RawTenant {
    /// How to refer to this tenant in messages; `index` counts from 0.
    fn reference(&self, index: usize) -> TenantRef {
        if let Some(name) = &self.name {
            if name_problem(name).is_none() {
                return TenantRef::Name(name.clone());
            }
        }
        match self.id.as_ref().map(|id| u32::try_from(id.0)) {
            Some(Ok(id)) => TenantRef::Id(TenantId(id)),
            _ => TenantRef::Position(index + 1),
        }
    }

    /// The tenant, and its limits across hosts if it sets any.
    fn convert(self, index: usize) -> Result<(TenantEntry, Option<ClusterTenant>), PolicyError> {
        let who = self.reference(index);
        let who = Some(&who);
        let id = match &self.id {
            Some(id) => TenantId(ranged(id, 0, u32::MAX, who, "id")?),
            None => {
                return Err(missing(
                    who,
                    "id",
                    "give every tenant a unique numeric id, e.g. id = 1",
                ))
            }
        };
        let Some(name) = self.name else {
            return Err(missing(
                who,
                "name",
                "give every tenant a unique name, e.g. name = \"kv-latency\"",
            ));
        };
        let weight = match &self.weight {
            Some(w) => ranged(w, 1, MAX_WEIGHT, who, "weight")?,
            None => TenantPolicy::default().weight,
        };
        let count_cap = |cap: Option<RawRate<Whole>>, field: &str| {
            cap.map(|cap| cap.convert(field, who, |v, f| ranged(v, 0, u64::MAX, who, f)))
                .transpose()
        };
        let rate = self
            .rate
            .map(|cap| {
                cap.convert("rate", who, |v, f| {
                    let kind = if f.ends_with(".burst") {
                        Kind::Size
                    } else {
                        Kind::ByteRate
                    };
                    quantity(v, kind, who, f)
                })
            })
            .transpose()?;
        let wr_rate = count_cap(self.wr_rate, "wr_rate")?;
        let qp_create_rate = count_cap(self.qp_create_rate, "qp_create_rate")?;
        let mr_reg_rate = count_cap(self.mr_reg_rate, "mr_reg_rate")?;
        let max_qps = match &self.max_qps {
            Some(v) => ranged(v, 0, u32::MAX, who, "max_qps")?,
            None => TenantEntry::DEFAULT_MAX_QPS,
        };
        let max_mr_bytes = match &self.max_mr_bytes {
            Some(v) => quantity(v, Kind::Size, who, "max_mr_bytes")?,
            None => TenantEntry::DEFAULT_MAX_MR_BYTES,
        };
        let max_outstanding_wr = match &self.max_outstanding_wr {
            Some(v) => ranged(v, 0, u32::MAX, who, "max_outstanding_wr")?,
            None => TenantEntry::DEFAULT_MAX_OUTSTANDING_WR,
        };
        let matches = self
            .matches
            .into_iter()
            .enumerate()
            .map(|(j, rule)| rule.convert(j, who))
            .collect::<Result<Vec<_>, _>>()?;
        let cluster_cap = match &self.cluster_cap {
            Some(v) => Some(quantity(v, Kind::ByteRate, who, "cluster_cap")?),
            None => None,
        };
        let cluster_weight = match &self.cluster_weight {
            Some(w) => Some(ranged(w, 1, MAX_WEIGHT, who, "cluster_weight")?),
            None => None,
        };
        let across = (cluster_cap.is_some() || cluster_weight.is_some()).then(|| ClusterTenant {
            id,
            cap: cluster_cap,
            weight: cluster_weight.unwrap_or(weight),
        });
        let entry = TenantEntry {
            id,
            name,
            class: match self.class {
                Some(RawClass::Latency) => TrafficClass::Latency,
                Some(RawClass::Bulk) | None => TrafficClass::Bulk,
            },
            schedule: TenantPolicy {
                weight,
                byte_cap: rate,
                wr_cap: wr_rate,
            },
            max_qps,
            max_mr_bytes,
            max_outstanding_wr,
            qp_create_rate,
            mr_reg_rate,
            matches,
        };
        Ok((entry, across))
    }
}

impl<T> RawRate<T> {
    /// Converts with `value(raw, field)`; a missing burst is 0.
    fn convert(
        self,
        field: &str,
        who: Option<&TenantRef>,
        mut value: impl FnMut(&T, &str) -> Result<u64, PolicyError>,
    ) -> Result<RateLimit, PolicyError> {
        let rate_field = format!("{field}.rate");
        let per_second = match &self.rate {
            Some(r) => value(r, &rate_field)?,
            None => {
                return Err(missing(
                    who,
                    &rate_field,
                    &if field == "rate" {
                        "give the sustained rate, e.g. rate = { rate = \"10Gbit\", burst = \"64KiB\" }"
                            .to_owned()
                    } else {
                        format!(
                            "give the sustained rate, e.g. {field} = {{ rate = 1000, burst = 10 }}"
                        )
                    },
                ))
            }
        };
        let burst = match &self.burst {
            Some(b) => value(b, &format!("{field}.burst"))?,
            None => 0,
        };
        Ok(RateLimit { per_second, burst })
    }
}

impl RawMatch {
    fn convert(self, index: usize, who: Option<&TenantRef>) -> Result<MatchRule, PolicyError> {
        let field = |name: &str| format!("match[{}].{name}", index + 1);
        let uid = self
            .uid
            .map(|v| ranged(&v, 0, u32::MAX, who, &field("uid")))
            .transpose()?;
        let gid = self
            .gid
            .map(|v| ranged(&v, 0, u32::MAX, who, &field("gid")))
            .transpose()?;
        Ok(MatchRule {
            uid,
            gid,
            cgroup: self.cgroup,
        })
    }
}
