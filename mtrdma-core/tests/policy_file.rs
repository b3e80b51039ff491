//! The policy file: what it accepts, the values it gives, and a message for
//! every kind of mistake.

use std::path::{Path, PathBuf};

use mtrdma_core::{
    ClusterPolicy, ClusterTenant, LinkConfig, MatchRule, PeerCredentials, Policy, PolicyError,
    RateLimit, TenantEntry, TenantId, TenantRef, TrafficClass,
};
use proptest::prelude::*;

const LINK: &str = "[link]\ncapacity = \"100Gbit\"\n";

/// A policy with the standard link and one tenant "kv" (id 1) whose table
/// ends with `extra`.
fn one_tenant(extra: &str) -> String {
    format!("{LINK}\n[[tenant]]\nid = 1\nname = \"kv\"\n{extra}")
}

/// The error message for `text`, which must be refused.
fn error(text: &str) -> String {
    match Policy::from_toml_str(text) {
        Ok(p) => panic!("accepted a bad policy: {p:?}\n--- input ---\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policy.toml")
}

#[test]
fn example_file_parses_to_expected_values() {
    let policy = Policy::from_file(&example_path()).unwrap();
    let expected = Policy::new(
        LinkConfig::new(12_500_000_000)
            .with_recompute_interval_ms(5)
            .with_latency_bound(16 << 10),
        vec![
            TenantEntry::new(TenantId(1), "kv-latency")
                .with_class(TrafficClass::Latency)
                .with_weight(4)
                .with_rate(RateLimit::new(1_250_000_000, 65_536))
                .with_wr_rate(RateLimit::new(1_000_000, 64))
                .with_max_qps(64)
                .with_max_mr_bytes(4 << 30)
                .with_max_outstanding_wr(1024)
                .with_qp_create_rate(RateLimit::new(100, 10))
                .with_mr_reg_rate(RateLimit::new(1000, 100))
                .with_match(MatchRule::default().with_uid(1000))
                .with_match(
                    MatchRule::default()
                        .with_gid(2000)
                        .with_cgroup("/kubepods.slice/kv"),
                ),
            TenantEntry::new(TenantId(2), "backup")
                .with_rate(RateLimit::new(1_250_000_000, 1 << 20))
                .with_max_mr_bytes(16 << 30)
                .with_match(MatchRule::default().with_cgroup("/system.slice/backup.service")),
            TenantEntry::new(TenantId(3), "batch"),
        ],
    )
    .with_exempt(["backup"])
    .with_cluster(ClusterPolicy {
        capacity: None,
        tenants: vec![ClusterTenant {
            id: TenantId(2),
            cap: Some(2_500_000_000),
            weight: 1,
        }],
    });
    assert_eq!(policy, expected);
    assert_eq!(policy.validate().ok(), Some(()));
}

#[test]
fn omitted_settings_take_their_defaults() {
    let policy = Policy::from_toml_str(&one_tenant("")).unwrap();
    assert_eq!(policy.link.recompute_interval_ms, 5);
    let t = &policy.tenants[0];
    assert_eq!(*t, TenantEntry::new(TenantId(1), "kv"));
    assert_eq!(t.class, TrafficClass::Bulk);
    assert_eq!(t.schedule.weight, 1);
    assert_eq!(t.max_qps, 1024);
    assert_eq!(t.max_mr_bytes, 1 << 30);
    assert_eq!(t.max_outstanding_wr, 4096);
    assert_eq!(
        (
            t.schedule.byte_cap,
            t.schedule.wr_cap,
            t.qp_create_rate,
            t.mr_reg_rate
        ),
        (None, None, None, None)
    );
    assert!(t.matches.is_empty());
}

#[test]
fn a_latency_bound_holds_bulk_tenants_unless_the_policy_exempts_them_by_name() {
    let text = "[link]\ncapacity = \"100Gbit\"\nlatency_bound = \"16KiB\"\nexempt = [\"backup\"]\n\
                [[tenant]]\nid = 1\nname = \"kv\"\nclass = \"latency\"\n\
                [[tenant]]\nid = 2\nname = \"bulk\"\n\
                [[tenant]]\nid = 3\nname = \"backup\"\n";
    let policy = Policy::from_toml_str(text).unwrap();
    assert_eq!(policy.link.latency_bound, Some(16 << 10));
    let held: Vec<_> = policy
        .tenants
        .iter()
        .map(|t| policy.protection_for(t).map(|p| p.piece_bytes))
        .collect();
    assert_eq!(held, [None, Some(4096), None]);
    // Left out, nobody is held.
    let policy = Policy::from_toml_str(&one_tenant("")).unwrap();
    assert_eq!(policy.link.latency_bound, None);
    assert_eq!(policy.protection_for(&policy.tenants[0]), None);
}

#[test]
fn a_bad_latency_bound_or_exemption_is_refused_with_what_to_write() {
    let with_link = |link: &str| format!("{LINK}{link}\n[[tenant]]\nid = 1\nname = \"kv\"\n");
    let e = error(&with_link("latency_bound = 100"));
    assert!(
        e.contains("link.latency_bound") && e.contains("between 1 KiB and 16 MiB"),
        "{e}"
    );
    assert!(e.contains("latency_bound = \"16KiB\""), "{e}");
    let e = error(&with_link("latency_bound = \"1GiB\""));
    assert!(e.contains("link.latency_bound"), "{e}");
    let e = error(&with_link("latency_bound = \"16 parsecs\""));
    assert!(e.contains("link.latency_bound"), "{e}");
    let e = error(&with_link("latency_bound = \"16KiB\"\nexempt = [\"kv2\"]"));
    assert!(
        e.contains("link.exempt")
            && e.contains("\"kv2\" is not the name of a tenant")
            && e.contains("kv"),
        "{e}"
    );
    let e = error(&with_link(
        "latency_bound = \"16KiB\"\nexempt = [\"kv\", \"kv\"]",
    ));
    assert!(e.contains("named twice"), "{e}");
    let e = error(&with_link("exempt = [\"kv\"]"));
    assert!(e.contains("add latency_bound"), "{e}");
    let e = error(&with_link("exempt = \"kv\""));
    assert!(e.contains("exempt"), "{e}");
}

#[test]
fn limits_across_hosts_are_read_and_checked() {
    let text = format!(
        "[cluster]\ncapacity = \"400Mbit\"\n{}",
        one_tenant("cluster_weight = 3\n")
    );
    let policy = Policy::from_toml_str(&text).unwrap();
    assert_eq!(
        *policy.cluster,
        ClusterPolicy {
            capacity: Some(50_000_000),
            tenants: vec![ClusterTenant {
                id: TenantId(1),
                cap: None,
                weight: 3,
            }],
        }
    );
    let capped =
        Policy::from_toml_str(&one_tenant("weight = 2\ncluster_cap = \"8Mbit\"\n")).unwrap();
    assert_eq!(
        capped.cluster.tenants,
        [ClusterTenant {
            id: TenantId(1),
            cap: Some(1_000_000),
            weight: 2,
        }],
        "the cluster weight is the tenant's weight unless given"
    );
    assert!(Policy::from_toml_str(&one_tenant(""))
        .unwrap()
        .cluster
        .tenants
        .is_empty());
    assert_eq!(
        error(&one_tenant("cluster_weight = 2\n")),
        "tenant \"kv\": field cluster_weight: a cluster weight shares [cluster] capacity, which \
         the policy does not give; add [cluster] capacity = \"...\", or give the tenant a cluster_cap"
    );
    assert!(error(&one_tenant("cluster_weight = 0\n"))
        .contains("field cluster_weight: 0 is out of range"));
    assert!(error(&one_tenant("cluster_cap = \"fast\"\n")).contains("field cluster_cap"));
    // Built in code: the limits name tenants of the policy, once each.
    let across = |id| ClusterTenant {
        id: TenantId(id),
        cap: Some(1),
        weight: 1,
    };
    let built = |tenants| {
        Policy::new(
            LinkConfig::new(1),
            vec![TenantEntry::new(TenantId(1), "kv")],
        )
        .with_cluster(ClusterPolicy {
            capacity: None,
            tenants,
        })
    };
    assert!(built(vec![across(1)]).validate().is_ok());
    assert!(built(vec![across(9)])
        .validate()
        .unwrap_err()
        .to_string()
        .contains("does not define"));
    assert!(built(vec![across(1), across(1)])
        .validate()
        .unwrap_err()
        .to_string()
        .contains("twice"));
    assert!(error(&format!("[cluster]\nspeed = 1\n{}", one_tenant("")))
        .contains("\"speed\" is not a setting in [cluster]; the settings are capacity"));
}

#[test]
fn a_missing_burst_is_zero() {
    let policy = Policy::from_toml_str(&one_tenant("wr_rate = { rate = 5 }\n")).unwrap();
    assert_eq!(
        policy.tenants[0].schedule.wr_cap,
        Some(RateLimit::new(5, 0))
    );
}

#[test]
fn units_follow_the_documented_grammar() {
    let cases: &[(&str, u64)] = &[
        ("12500000000", 12_500_000_000),
        ("\"100Gbit\"", 12_500_000_000),
        ("\"100Gbps\"", 12_500_000_000),
        ("\"100Gbit/s\"", 12_500_000_000),
        ("\"25 Gbit\"", 3_125_000_000),
        ("\"2.5Gbit\"", 312_500_000),
        ("\"800Mbit\"", 100_000_000),
        ("\"800kbit\"", 100_000),
        ("\"1Tbps\"", 125_000_000_000),
        ("\"1.25GB/s\"", 1_250_000_000),
        ("\"500MiB/s\"", 524_288_000),
        ("\"1KB/s\"", 1_000),
        ("\"1KiB/s\"", 1_024),
        ("\"7B/s\"", 7),
        ("\"12bit\"", 2), // 1.5 bytes rounds up
    ];
    for (text, want) in cases {
        let policy = Policy::from_toml_str(&format!(
            "[link]\ncapacity = {text}\n[[tenant]]\nid = 1\nname = \"kv\"\n"
        ))
        .unwrap_or_else(|e| panic!("capacity = {text}: {e}"));
        assert_eq!(
            policy.link.capacity_bytes_per_sec, *want,
            "capacity = {text}"
        );
    }
    let sizes: &[(&str, u64)] = &[
        ("4096", 4096),
        ("\"4096\"", 4096),
        ("\"4096B\"", 4096),
        ("\"1kB\"", 1000),
        ("\"1MB\"", 1_000_000),
        ("\"1GB\"", 1_000_000_000),
        ("\"1TB\"", 1_000_000_000_000),
        ("\"1KiB\"", 1 << 10),
        ("\"1MiB\"", 1 << 20),
        ("\"1.5GiB\"", 3 << 29),
        ("\"2TiB\"", 2 << 40),
    ];
    for (text, want) in sizes {
        let policy = Policy::from_toml_str(&one_tenant(&format!("max_mr_bytes = {text}\n")))
            .unwrap_or_else(|e| panic!("max_mr_bytes = {text}: {e}"));
        assert_eq!(
            policy.tenants[0].max_mr_bytes, *want,
            "max_mr_bytes = {text}"
        );
    }
}

#[test]
fn a_syntax_error_gives_line_and_column() {
    assert_eq!(
        error("[link]\ncapacity = \"100Gbit\"\n[[tenant]\nid = 1\n"),
        "the policy is not valid TOML: line 3, column 10: unclosed array table, expected `]`"
    );
    let e = Policy::from_toml_str("[link]\ncapacity = = 1\n").unwrap_err();
    match e {
        PolicyError::Syntax { line, column, .. } => assert_eq!((line, column), (2, 12)),
        other => panic!("not a syntax error: {other:?}"),
    }
}

#[test]
fn a_duplicate_key_is_a_syntax_error() {
    let e = error(&one_tenant("id = 2\n"));
    assert!(
        e.starts_with("the policy is not valid TOML: line 7, column 1"),
        "{e}"
    );
    assert!(e.contains("duplicate key"), "{e}");
}

#[test]
fn an_unknown_tenant_field_is_named() {
    assert_eq!(
        error(&one_tenant("max_qp = 8\n")),
        "tenant \"kv\": field max_qp: \"max_qp\" is not a setting of a tenant; the settings are \
         id, name, class, weight, rate, wr_rate, max_qps, max_mr_bytes, max_outstanding_wr, \
         qp_create_rate, mr_reg_rate, cluster_cap, cluster_weight, match"
    );
}

/// Asserts that `field = value` in `[link]`, which has no such setting,
/// is refused with the settings it has.
fn not_a_link_setting(field: &str, value: &str) {
    assert_eq!(
        error(&format!("{LINK}{field} = {value}\n")),
        format!(
            "field link.{field}: \"{field}\" is not a setting in [link]; the settings are \
             capacity, recompute_interval_ms, latency_bound, exempt"
        )
    );
}

#[test]
fn unknown_fields_elsewhere_are_named() {
    not_a_link_setting("speed", "1");
    assert_eq!(
        error(&format!("tenants = []\n{LINK}")),
        "field tenants: \"tenants\" is not a setting at the top level; the settings are link, cluster, tenant"
    );
    assert_eq!(
        error(&one_tenant("rate = { rate = 1, brust = 2 }\n")),
        "tenant \"kv\": field rate.brust: \"brust\" is not a setting of a rate limit; the settings \
         are rate, burst"
    );
    assert_eq!(
        error(&one_tenant("[[tenant.match]]\nuser = 1\n")),
        "tenant \"kv\": field match[1].user: \"user\" is not a setting of a match rule; the \
         settings are uid, gid, cgroup"
    );
}

#[test]
fn a_tenant_written_as_a_single_table_is_refused() {
    let message = "field tenant: tenants are a list; start each one with [[tenant]] (double \
                   brackets), before its [[tenant.match]] rules";
    assert_eq!(
        error(&format!("{LINK}[tenant]\nid = 1\nname = \"kv\"\n")),
        message
    );
    assert_eq!(
        error(&format!("{LINK}[[tenant.match]]\nuid = 1\n")),
        message
    );
}

#[test]
fn a_missing_tenant_id_is_named() {
    assert_eq!(
        error(&format!("{LINK}[[tenant]]\nname = \"kv\"\n")),
        "tenant \"kv\": field id: the setting is missing; give every tenant a unique numeric id, \
         e.g. id = 1"
    );
}

#[test]
fn a_missing_name_is_named() {
    assert_eq!(
        error(&format!("{LINK}[[tenant]]\nid = 7\n")),
        "tenant with id 7: field name: the setting is missing; give every tenant a unique name, \
         e.g. name = \"kv-latency\""
    );
    // With neither, the tenant is known by its position.
    assert_eq!(
        error(&format!(
            "{LINK}[[tenant]]\nid = 1\nname = \"a\"\n[[tenant]]\nweight = 2\n"
        )),
        "tenant #2: field id: the setting is missing; give every tenant a unique numeric id, e.g. \
         id = 1"
    );
}

#[test]
fn a_missing_link_capacity_is_named() {
    assert_eq!(
        error("[link]\nrecompute_interval_ms = 5\n[[tenant]]\nid = 1\nname = \"kv\"\n"),
        "field link.capacity: the setting is missing; give the link's capacity, e.g. capacity = \
         \"100Gbit\""
    );
    assert_eq!(
        error("[[tenant]]\nid = 1\nname = \"kv\"\n"),
        "field link.capacity: the setting is missing; add a [link] section with the link's \
         capacity, e.g. capacity = \"100Gbit\""
    );
}

#[test]
fn a_rate_limit_without_a_rate_is_refused() {
    assert_eq!(
        error(&one_tenant("qp_create_rate = { burst = 10 }\n")),
        "tenant \"kv\": field qp_create_rate.rate: the setting is missing; give the sustained \
         rate, e.g. qp_create_rate = { rate = 1000, burst = 10 }"
    );
}

#[test]
fn a_duplicate_tenant_id_is_refused() {
    assert_eq!(
        error(&format!(
            "{LINK}[[tenant]]\nid = 3\nname = \"a\"\n[[tenant]]\nid = 3\nname = \"b\"\n"
        )),
        "tenant \"b\": field id: 3 is already the id of tenant \"a\"; give every tenant its own id"
    );
}

#[test]
fn a_duplicate_name_is_refused() {
    assert_eq!(
        error(&format!(
            "{LINK}[[tenant]]\nid = 3\nname = \"a\"\n[[tenant]]\nid = 4\nname = \"a\"\n"
        )),
        "tenant with id 4: field name: \"a\" is already the name of tenant with id 3; give every \
         tenant its own name"
    );
}

#[test]
fn a_bad_name_is_refused() {
    let bad = |name: &str| error(&format!("{LINK}[[tenant]]\nid = 9\nname = {name:?}\n"));
    assert_eq!(
        bad("kv latency"),
        "tenant with id 9: field name: \"kv latency\" contains ' ', which is not allowed; use 1 \
         to 31 letters, digits, '_', '.' or '-'"
    );
    assert_eq!(
        bad(""),
        "tenant with id 9: field name: the name is empty; use 1 to 31 letters, digits, '_', '.' \
         or '-'"
    );
    assert_eq!(
        bad(&"a".repeat(32)),
        format!(
            "tenant with id 9: field name: {:?} is 32 bytes long; use 1 to 31 letters, digits, \
             '_', '.' or '-'",
            "a".repeat(32)
        )
    );
    assert!(Policy::from_toml_str(&format!(
        "{LINK}[[tenant]]\nid = 9\nname = \"{}\"\n",
        "a".repeat(31)
    ))
    .is_ok());
    assert!(bad("kv/1").contains("contains '/'"));
    assert!(bad("ключ").contains("contains 'к'"));
}

#[test]
fn a_zero_or_too_large_weight_is_refused() {
    let message = |w: &str| {
        format!("tenant \"kv\": field weight: {w} is out of range; use a whole number from 1 to 1000000")
    };
    assert_eq!(error(&one_tenant("weight = 0\n")), message("0"));
    assert_eq!(error(&one_tenant("weight = 1000001\n")), message("1000001"));
    assert_eq!(error(&one_tenant("weight = -3\n")), message("-3"));
    assert_eq!(
        error(&one_tenant("weight = 9223372036854775807\n")),
        message("9223372036854775807")
    );
    assert!(Policy::from_toml_str(&one_tenant("weight = 1000000\n")).is_ok());
}

#[test]
fn a_mistyped_value_names_its_field() {
    assert_eq!(
        error(&one_tenant("weight = \"heavy\"\n")),
        "tenant \"kv\": field weight: invalid type: string \"heavy\", expected a whole number"
    );
    assert_eq!(
        error(&one_tenant("class = \"fast\"\n")),
        "tenant \"kv\": field class: unknown variant `fast`, expected `latency` or `bulk`"
    );
    assert_eq!(
        error(&one_tenant("[[tenant.match]]\nuid = \"root\"\n")),
        "tenant \"kv\": field match[1].uid: invalid type: string \"root\", expected a whole number"
    );
    assert_eq!(
        error(&one_tenant("rate = 5\n")),
        "tenant \"kv\": field rate: invalid type: integer `5`, expected an inline table such as \
         { rate = 1000, burst = 10 }"
    );
    not_a_link_setting("tenant", "[1]");
    assert_eq!(
        error(&format!("tenant = [1]\n{LINK}")),
        "field tenant[1]: invalid type: integer `1`, expected a [[tenant]] table"
    );
    assert_eq!(
        error("link = 5\n"),
        "field link: invalid type: integer `5`, expected a [link] table"
    );
    assert_eq!(
        error("[link]\ncapacity = 1.5e9\n"),
        "field link.capacity: invalid type: floating point `1500000000.0`, expected a whole number \
         of bytes or a string with a unit, such as \"64KiB\" or \"10Gbit\""
    );
}

#[test]
fn a_zero_rate_is_refused() {
    assert_eq!(
        error(&one_tenant(
            "rate = { rate = \"0Gbit\", burst = \"64KiB\" }\n"
        )),
        "tenant \"kv\": field rate.rate: 0 is not a usable rate; give a rate above 0, or remove \
         rate to leave it uncapped"
    );
    assert_eq!(
        error(&one_tenant("mr_reg_rate = { rate = 0 }\n")),
        "tenant \"kv\": field mr_reg_rate.rate: 0 is not a usable rate; give a rate above 0, or \
         remove mr_reg_rate to leave it uncapped"
    );
    assert_eq!(
        error("[link]\ncapacity = 0\n[[tenant]]\nid = 1\nname = \"kv\"\n"),
        "field link.capacity: 0 is not a usable link capacity; give the link's rate, e.g. \
         \"100Gbit\""
    );
    // Rounds to zero bytes per second.
    assert!(error(&one_tenant("rate = { rate = \"3bit\" }\n")).contains("0 is not a usable rate"));
}

#[test]
fn a_bad_unit_string_is_refused() {
    assert_eq!(
        error(&one_tenant(
            "rate = { rate = \"10Gbit\", burst = \"64XB\" }\n"
        )),
        "tenant \"kv\": field rate.burst: \"64XB\" is not a size (use e.g. 64KiB, 1MB, 4096)"
    );
    assert_eq!(
        error(&one_tenant("rate = { rate = \"10GB\" }\n")),
        "tenant \"kv\": field rate.rate: \"10GB\" is not a byte rate (use e.g. 10Gbit, 1.25GB/s, \
         500MiB/s, 1000000)"
    );
    assert_eq!(
        error(&one_tenant("max_mr_bytes = \"4gib\"\n")),
        "tenant \"kv\": field max_mr_bytes: \"4gib\" is not a size (use e.g. 64KiB, 1MB, 4096)"
    );
    for bad in [
        "", "GiB", "-1GiB", "1e9", "1,5GiB", ".5GiB", "5.GiB", "1.2.3B", "1 0B",
    ] {
        let e = error(&one_tenant(&format!("max_mr_bytes = {bad:?}\n")));
        assert!(e.contains("is not a size"), "{bad:?}: {e}");
    }
    assert_eq!(
        error(&one_tenant("max_mr_bytes = \"1.0000000001GB\"\n")),
        "tenant \"kv\": field max_mr_bytes: \"1.0000000001GB\" has more than 9 digits after the \
         decimal point; round it"
    );
    assert_eq!(
        error(&one_tenant("max_mr_bytes = -1\n")),
        "tenant \"kv\": field max_mr_bytes: -1 is negative; a size is 0 or more"
    );
}

#[test]
fn an_overflow_is_refused() {
    assert_eq!(
        error(&one_tenant("max_mr_bytes = \"16777216TiB\"\n")),
        "tenant \"kv\": field max_mr_bytes: \"16777216TiB\" is too large; the largest size is \
         18446744073709551615 bytes"
    );
    assert_eq!(
        error("[link]\ncapacity = \"147573952589676412928bit\"\n"),
        "field link.capacity: \"147573952589676412928bit\" is too large; the largest byte rate is \
         18446744073709551615 bytes/s"
    );
    let huge = "9".repeat(100);
    let e = error(&one_tenant(&format!("max_mr_bytes = \"{huge}\"\n")));
    assert!(
        e.ends_with("is too large; the largest size is 18446744073709551615 bytes"),
        "{e}"
    );
    assert!(e.len() < 200, "the echoed input is shortened: {e}");
    assert_eq!(
        error(&format!(
            "{LINK}[[tenant]]\nid = 4294967296\nname = \"kv\"\n"
        )),
        "tenant \"kv\": field id: 4294967296 is out of range; use a whole number from 0 to \
         4294967295"
    );
    assert_eq!(
        error(&one_tenant("max_qps = 4294967296\n")),
        "tenant \"kv\": field max_qps: 4294967296 is out of range; use a whole number from 0 to \
         4294967295"
    );
    // The largest value still fits.
    let policy =
        Policy::from_toml_str(&one_tenant("max_mr_bytes = \"18446744073709551615B\"\n")).unwrap();
    assert_eq!(policy.tenants[0].max_mr_bytes, u64::MAX);
}

#[test]
fn an_empty_match_rule_is_refused() {
    assert_eq!(
        error(&one_tenant("[[tenant.match]]\nuid = 1\n[[tenant.match]]\n")),
        "tenant \"kv\": field match[2]: the rule sets no condition; set at least one of uid, gid \
         or cgroup"
    );
}

#[test]
fn a_relative_cgroup_is_refused() {
    assert_eq!(
        error(&one_tenant(
            "[[tenant.match]]\ncgroup = \"kubepods.slice\"\n"
        )),
        "tenant \"kv\": field match[1].cgroup: \"kubepods.slice\" is not an absolute cgroup path; \
         start it with '/', e.g. \"/kubepods.slice\""
    );
}

#[test]
fn a_policy_without_tenants_is_refused() {
    assert_eq!(
        error(LINK),
        "field tenant: the policy defines no tenants; add at least one [[tenant]] with an id and \
         a name"
    );
}

#[test]
fn a_recompute_interval_out_of_range_is_refused() {
    let with = |ms: i64| {
        format!("{LINK}recompute_interval_ms = {ms}\n[[tenant]]\nid = 1\nname = \"kv\"\n")
    };
    for ms in [0, 1001, -5] {
        assert_eq!(
            error(&with(ms)),
            format!(
                "field link.recompute_interval_ms: {ms} is out of range; use a whole number from \
                 1 to 1000"
            )
        );
    }
    for ms in [1, 1000] {
        let policy = Policy::from_toml_str(&with(ms)).unwrap();
        assert_eq!(i64::from(policy.link.recompute_interval_ms), ms);
    }
}

#[test]
fn bytes_that_are_not_utf8_are_refused() {
    let e = Policy::from_toml_bytes(b"[link]\ncapacity = \"\xff\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "the policy is not UTF-8 text (invalid byte at offset 19); save it as UTF-8"
    );
}

#[test]
fn file_errors_name_the_path() {
    let missing = Path::new("/nonexistent/mtrdma/policy.toml");
    let e = Policy::from_file(missing).unwrap_err();
    assert!(matches!(e, PolicyError::Io { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("cannot read policy file /nonexistent/mtrdma/policy.toml: "),
        "{e}"
    );

    let dir = std::env::temp_dir().join(format!("mtrdma-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, one_tenant("weight = 0\n")).unwrap();
    let e = Policy::from_file(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "policy file {}: tenant \"kv\": field weight: 0 is out of range; use a whole number \
             from 1 to 1000000",
            path.display()
        )
    );
    match e {
        PolicyError::File { source, .. } => match *source {
            PolicyError::Invalid { tenant, field, .. } => {
                assert_eq!(tenant, Some(TenantRef::Name("kv".into())));
                assert_eq!(field, "weight");
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn policies_built_in_code_are_validated_too() {
    let link = LinkConfig::new(1_000_000);
    let ok = Policy::new(link, vec![TenantEntry::new(TenantId(0), "a")]);
    assert!(ok.validate().is_ok());

    let zero_weight = Policy::new(
        link,
        vec![TenantEntry::new(TenantId(1), "a").with_weight(0)],
    );
    assert_eq!(
        zero_weight.validate().unwrap_err().to_string(),
        "tenant \"a\": field weight: 0 is out of range; use a whole number from 1 to 1000000"
    );
    let zero_wr = Policy::new(
        link,
        vec![TenantEntry::new(TenantId(1), "a").with_wr_rate(RateLimit::new(0, 5))],
    );
    assert_eq!(
        zero_wr.validate().unwrap_err().to_string(),
        "tenant \"a\": field wr_rate.rate: 0 is not a usable rate; give a rate above 0, or remove \
         wr_rate to leave it uncapped"
    );
    let bad_interval = Policy::new(
        link.with_recompute_interval_ms(0),
        vec![TenantEntry::new(TenantId(1), "a")],
    );
    assert_eq!(
        bad_interval.validate().unwrap_err().to_string(),
        "field link.recompute_interval_ms: 0 is out of range; use a whole number from 1 to 1000"
    );
    let empty_rule = Policy::new(
        link,
        vec![TenantEntry::new(TenantId(1), "a").with_match(MatchRule::default())],
    );
    assert!(empty_rule.validate().is_err());
    let no_tenants = Policy::new(link, Vec::new());
    assert!(no_tenants.validate().is_err());
}

fn peer(uid: u32, gid: u32, cgroup: Option<&str>) -> PeerCredentials {
    PeerCredentials {
        pid: 4242,
        uid,
        gid,
        cgroup: cgroup.map(str::to_owned),
    }
}

#[test]
fn peers_are_assigned_to_the_first_matching_tenant() {
    let policy = Policy::from_file(&example_path()).unwrap();
    for (uid, gid, cgroup, tenant) in [
        (1000, 1, None, Some("kv-latency")),
        // The second rule needs both the gid and the cgroup.
        (1, 2000, Some("/kubepods.slice/kv"), Some("kv-latency")),
        (1, 2000, Some("/kubepods.slice/kv/pod3"), Some("kv-latency")),
        (1, 2000, Some("/kubepods.slice/kv2"), None),
        (1, 2000, None, None),
        (1, 1, Some("/kubepods.slice/kv"), None),
        (1, 1, Some("/system.slice/backup.service"), Some("backup")),
        // Matches two tenants: the first in file order wins.
        (
            1000,
            1,
            Some("/system.slice/backup.service"),
            Some("kv-latency"),
        ),
        (0, 0, Some("/"), None),
    ] {
        let p = peer(uid, gid, cgroup);
        let found = policy.tenant_for_peer(&p).map(|t| t.name.as_str());
        assert_eq!(found, tenant, "{p:?}");
    }

    assert_eq!(
        policy.tenant(TenantId(3)).map(|t| t.name.as_str()),
        Some("batch")
    );
    assert_eq!(policy.tenant(TenantId(4)), None);
}

#[test]
fn a_root_or_trailing_slash_cgroup_prefix_matches_whole_components() {
    let root = MatchRule::default().with_cgroup("/");
    assert!(root.matches(&peer(0, 0, Some("/a/b"))));
    assert!(!root.matches(&peer(0, 0, None)));
    let trailing = MatchRule::default().with_cgroup("/a/");
    assert!(trailing.matches(&peer(0, 0, Some("/a"))));
    assert!(trailing.matches(&peer(0, 0, Some("/a/b"))));
    assert!(!trailing.matches(&peer(0, 0, Some("/ab"))));
    assert!(!MatchRule::default().matches(&peer(0, 0, Some("/a"))));
}

proptest! {
    #[test]
    fn any_text_gives_a_policy_or_an_error_never_a_panic(text in any::<String>()) {
        let _ = Policy::from_toml_str(&text);
    }

    #[test]
    fn any_bytes_give_a_policy_or_an_error_never_a_panic(bytes in any::<Vec<u8>>()) {
        let _ = Policy::from_toml_bytes(&bytes);
    }

    /// Random text spliced into the example reaches the deeper stages
    /// (keys, types, units, validation), where random text alone rarely gets.
    #[test]
    fn a_damaged_example_gives_a_policy_or_an_error_never_a_panic(
        at in any::<prop::sample::Index>(),
        cut in 0usize..40,
        insert in "[ -~\\n]{0,24}",
    ) {
        let original = std::fs::read_to_string(example_path()).unwrap();
        let mut start = at.index(original.len());
        while !original.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + cut).min(original.len());
        while !original.is_char_boundary(end) {
            end -= 1;
        }
        let damaged = format!("{}{}{}", &original[..start], insert, &original[end..]);
        if let Ok(policy) = Policy::from_toml_str(&damaged) {
            prop_assert!(policy.validate().is_ok());
        }
    }

    #[test]
    fn any_value_in_a_unit_field_gives_a_policy_or_an_error(value in "[0-9. A-Za-z/]{0,16}") {
        let text = one_tenant(&format!("rate = {{ rate = {value:?}, burst = {value:?} }}\n"));
        if let Ok(policy) = Policy::from_toml_str(&text) {
            prop_assert!(policy.tenants[0].schedule.byte_cap.unwrap().per_second > 0);
        }
    }
}
