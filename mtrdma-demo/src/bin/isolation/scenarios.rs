//! The scenarios on one device in loopback: latency, weights, cap and
//! storm, each alone, unprotected and with mtrdma.

use super::*;

pub(crate) const WAYS: [Way; 3] = [Way::Alone, Way::Unprotected, Way::Mtrdma];

/// The measurements scenario `scenario` of the one-process run makes (for
/// its progress; see `progress.rs`).
pub(crate) fn planned(scenario: &str, args: &Args) -> usize {
    match scenario {
        // Alone, then unprotected and mtrdma next to each bulk count.
        "latency" => 1 + 2 * args.bulk.len(),
        // Each weighted tenant alone, then all of them both ways.
        "weights" => WEIGHTED.len() + 2,
        // cap, storm: alone, unprotected, mtrdma.
        _ => WAYS.len(),
    }
}

pub(crate) fn scenario_latency(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    let args = demo.args;
    r.say(format!(
        "\n== 1. latency tenant ({PROBE_BYTES} B WRITE, 1 outstanding) against bulk tenants ({} B WRITEs, {} outstanding each) ==",
        args.msg, args.depth
    ));
    let alone = demo.measure(
        Way::Alone,
        &Cast {
            probe: true,
            ..Cast::default()
        },
    )?;
    let a = lat(&alone.probe_us);
    r.keep_samples("latency", Way::Alone, "0", &alone.probe_us);
    r.say(format!(
        "{:>4} {:<12} {:>9} {:>9} {:>10} {:>9} {:>12} {:>10}",
        "bulk", "way", "p50 us", "p99 us", "p99.9 us", "p99/alone", "bulk MB/s", "samples"
    ));
    let row = |r: &mut Report, n: usize, way: Way, l: &Lat, bulk: f64| {
        r.say(format!(
            "{n:>4} {:<12} {:>9.1} {:>9.1} {:>10} {:>9.2} {:>12.2} {:>10}",
            way.name(),
            l.p50,
            l.p99,
            l.p999_cell(),
            l.p99 / a.p99,
            bulk,
            l.n
        ));
    };
    row(r, 0, Way::Alone, &a, 0.0);
    for (m, v) in a.figures() {
        r.figure("latency", Way::Alone, "0", "latency", m, v);
    }
    let mut bars = Vec::new();
    let mut cdf = Vec::new();
    let mut summary = Vec::new();
    for &n in &args.bulk {
        let cast = Cast {
            probe: true,
            bulk: (0..n as u32).map(|i| TenantId(BULK0 + i)).collect(),
            storm: false,
        };
        let mut p99 = vec![a.p99];
        let mut totals = Vec::new();
        let mut lats = Vec::new();
        for way in [Way::Unprotected, Way::Mtrdma] {
            let m = demo.measure(way, &cast)?;
            let l = lat(&m.probe_us);
            let total: f64 = m.bulk_mbps.iter().sum();
            row(r, n, way, &l, total);
            let case = n.to_string();
            for (k, v) in l.figures() {
                r.figure("latency", way, &case, "latency", k, v);
            }
            for (i, v) in m.bulk_mbps.iter().enumerate() {
                r.figure("latency", way, &case, &format!("bulk{i}"), "mbps", *v);
            }
            r.keep_samples("latency", way, &case, &m.probe_us);
            p99.push(l.p99);
            totals.push(total);
            lats.push((way, m.probe_us));
        }
        summary.push(format!(
            "  {n} bulk: p99 mtrdma/alone {:.2} (target <= 1.5), unprotected/mtrdma {:.2} (target >= 5 at 8 bulk), bulk MB/s mtrdma/unprotected {:.2} (target >= 0.8)",
            p99[2] / p99[0],
            p99[1] / p99[2],
            totals[1] / totals[0]
        ));
        bars.push(BarGroup {
            label: format!("{n} bulk"),
            values: p99,
        });
        if Some(&n) == args.bulk.iter().max() {
            cdf = vec![LatencySeries {
                label: "alone".into(),
                samples_us: alone.probe_us.clone(),
            }];
            for (way, samples) in lats {
                cdf.push(LatencySeries {
                    label: format!("{} ({n} bulk)", way.name()),
                    samples_us: samples,
                });
            }
        }
    }
    for line in summary {
        r.say(line);
    }
    let out = &args.out;
    plot::grouped_bars(
        &out.join("latency_p99"),
        "Latency tenant p99 (16 B WRITE) against bulk tenants",
        "p99 latency (us)",
        &["alone", "unprotected", "mtrdma"],
        &bars,
    )?;
    plot::latency_cdf(
        &out.join("latency_cdf"),
        "Latency tenant: CDF of 16 B WRITE latency",
        &cdf,
    )
}

pub(crate) fn scenario_weights(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    r.say("\n== 2. three bulk tenants with weights 1:2:4 ==");
    let tenants: Vec<TenantId> = WEIGHTED.iter().map(|&(id, _)| TenantId(id)).collect();
    let weights: Vec<f64> = WEIGHTED.iter().map(|&(_, w)| f64::from(w)).collect();
    let names: Vec<String> = WEIGHTED
        .iter()
        .map(|&(_, w)| format!("weight{w}"))
        .collect();
    let mut per_way: Vec<Vec<f64>> = Vec::new();
    // Alone: each tenant by itself.
    let mut alone = Vec::new();
    for &t in &tenants {
        let m = demo.measure(
            Way::Alone,
            &Cast {
                bulk: vec![t],
                ..Cast::default()
            },
        )?;
        alone.push(m.bulk_mbps[0]);
    }
    per_way.push(alone);
    let mut series = Vec::new();
    for way in [Way::Unprotected, Way::Mtrdma] {
        let m = demo.measure(
            way,
            &Cast {
                bulk: tenants.clone(),
                ..Cast::default()
            },
        )?;
        r.keep_timeline("weights", way, &names, &m);
        if way == Way::Mtrdma {
            for (name, points) in names.iter().zip(&m.timeline) {
                series.push(RateSeries {
                    label: format!("{name} (mtrdma)"),
                    points: points.clone(),
                });
            }
        }
        per_way.push(m.bulk_mbps);
    }
    r.say(format!(
        "{:<12} {:>12} {:>12} {:>12} {:>10} {:>8}",
        "way", "weight1 MB/s", "weight2 MB/s", "weight4 MB/s", "total", "Jain"
    ));
    for (way, v) in WAYS.iter().zip(&per_way) {
        let normalised: Vec<f64> = v.iter().zip(&weights).map(|(x, w)| x / w).collect();
        let j = if *way == Way::Alone {
            f64::NAN
        } else {
            jain_index(&normalised)
        };
        let total: f64 = v.iter().sum();
        r.say(format!(
            "{:<12} {:>12.2} {:>12.2} {:>12.2} {:>10.2} {:>8.4}",
            way.name(),
            v[0],
            v[1],
            v[2],
            total,
            j
        ));
        for (name, x) in names.iter().zip(v) {
            r.figure("weights", *way, "1:2:4", name, "mbps", *x);
        }
        if *way != Way::Alone {
            r.figure("weights", *way, "1:2:4", "all", "jain", j);
            let shares: Vec<String> = v
                .iter()
                .zip(&weights)
                .map(|(x, w)| format!("{:.3} (want {:.3})", x / total, w / 7.0))
                .collect();
            r.say(format!("  {} shares: {}", way.name(), shares.join(", ")));
        }
    }
    let groups: Vec<BarGroup> = names
        .iter()
        .enumerate()
        .map(|(i, n)| BarGroup {
            label: n.clone(),
            values: per_way.iter().map(|v| v[i]).collect(),
        })
        .collect();
    let out = &demo.args.out;
    plot::grouped_bars(
        &out.join("weights_bars"),
        "Bulk tenants with weights 1:2:4",
        "MB/s",
        &["alone", "unprotected", "mtrdma"],
        &groups,
    )?;
    plot::rates_over_time(
        &out.join("weights_timeline"),
        "Bulk tenants with weights 1:2:4 under mtrdma",
        "MB/s",
        &series,
    )
}

pub(crate) fn scenario_cap(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    let cap = demo.args.cap_mbps;
    r.say(format!(
        "\n== 3. a tenant capped at {cap:.2} MB/s next to one running free =="
    ));
    let names = vec!["capped".to_string(), "free".to_string()];
    r.say(format!(
        "{:<12} {:>12} {:>12} {:>14}",
        "way", "capped MB/s", "free MB/s", "capped / cap"
    ));
    let mut groups = vec![
        BarGroup {
            label: "capped".into(),
            values: Vec::new(),
        },
        BarGroup {
            label: "free".into(),
            values: Vec::new(),
        },
    ];
    let mut series = Vec::new();
    for way in WAYS {
        // Alone: the capped tenant by itself, under mtrdma (its cap holds
        // with no one else around).
        let (run_way, bulk) = match way {
            Way::Alone => (Way::Mtrdma, vec![CAPPED]),
            w => (w, vec![CAPPED, FREE]),
        };
        let m = demo.measure(
            run_way,
            &Cast {
                bulk,
                ..Cast::default()
            },
        )?;
        let capped = m.bulk_mbps[0];
        let free = m.bulk_mbps.get(1).copied().unwrap_or(f64::NAN);
        r.say(format!(
            "{:<12} {:>12.3} {} {:>14.3}",
            way.name(),
            capped,
            figure_cell(free, 12),
            capped / cap
        ));
        r.figure("cap", way, &format!("{cap}"), "capped", "mbps", capped);
        r.figure("cap", way, &format!("{cap}"), "free", "mbps", free);
        groups[0].values.push(capped);
        groups[1]
            .values
            .push(if free.is_nan() { 0.0 } else { free });
        if way == Way::Mtrdma {
            r.keep_timeline("cap", way, &names, &m);
            for (name, points) in names.iter().zip(&m.timeline) {
                series.push(RateSeries {
                    label: format!("{name} (mtrdma)"),
                    points: points.clone(),
                });
            }
        }
    }
    let out = &demo.args.out;
    plot::grouped_bars(
        &out.join("cap_bars"),
        &format!("A tenant capped at {cap} MB/s next to one running free"),
        "MB/s",
        &["alone", "unprotected", "mtrdma"],
        &groups,
    )?;
    plot::rates_over_time(
        &out.join("cap_timeline"),
        &format!("Capped ({cap} MB/s) and free tenant under mtrdma"),
        "MB/s",
        &series,
    )
}

pub(crate) fn scenario_storm(demo: &Demo<'_>, r: &mut Report) -> Result<(), String> {
    r.say(format!(
        "\n== 4. control-path storm: QP create/destroy and 64 KiB MR register/deregister next to the latency tenant (mtrdma: {STORM_RATE}/s each) =="
    ));
    r.say(format!(
        "{:<12} {:>9} {:>9} {:>10} {:>9} {:>14} {:>14}",
        "way", "p50 us", "p99 us", "p99.9 us", "p99/alone", "storm ops/s", "refused/s"
    ));
    let mut alone_p99 = f64::NAN;
    let mut cdf = Vec::new();
    for way in WAYS {
        let m = demo.measure(
            way,
            &Cast {
                probe: true,
                bulk: Vec::new(),
                storm: way != Way::Alone,
            },
        )?;
        let l = lat(&m.probe_us);
        if way == Way::Alone {
            alone_p99 = l.p99;
        }
        r.say(format!(
            "{:<12} {:>9.1} {:>9.1} {:>10} {:>9.2} {:>14.1} {:>14.1}",
            way.name(),
            l.p50,
            l.p99,
            l.p999_cell(),
            l.p99 / alone_p99,
            m.storm_ok,
            m.storm_refused
        ));
        for (k, v) in l.figures() {
            r.figure("storm", way, "storm", "latency", k, v);
        }
        r.figure("storm", way, "storm", "storm", "ops_per_s", m.storm_ok);
        r.figure(
            "storm",
            way,
            "storm",
            "storm",
            "refused_per_s",
            m.storm_refused,
        );
        r.keep_samples("storm", way, "storm", &m.probe_us);
        cdf.push(LatencySeries {
            label: way.name().into(),
            samples_us: m.probe_us,
        });
    }
    plot::latency_cdf(
        &demo.args.out.join("storm_cdf"),
        "Latency tenant next to a control-path storm",
        &cdf,
    )
}
