//! What a run measured: rates, timelines, latency figures and the report.

use super::*;

/// A tenant's rate in the window: the bytes completed after its first
/// completion in the window over the time to its last one (whole 1 MiB
/// messages would otherwise make a short window's figure coarse).
pub(crate) fn rate_mbps(records: &[Record], tenant: usize, window: (Duration, Duration)) -> f64 {
    let mine: Vec<&Record> = records
        .iter()
        .filter(|r| r.0 == tenant && r.1 >= window.0 && r.1 < window.1)
        .collect();
    match (mine.first(), mine.last()) {
        (Some(first), Some(last)) if mine.len() >= 2 && last.1 > first.1 => {
            let bytes: u64 = mine[1..].iter().map(|r| r.2).sum();
            bytes as f64 / (last.1 - first.1).as_secs_f64() / 1e6
        }
        _ => {
            let bytes: u64 = mine.iter().map(|r| r.2).sum();
            bytes as f64 / (window.1 - window.0).as_secs_f64() / 1e6
        }
    }
}

pub(crate) fn timeline(records: &[Record], tenants: usize, end: Duration) -> Vec<Vec<(f64, f64)>> {
    let bins = (end.as_nanos() / BIN.as_nanos()).max(1) as usize;
    let mut bytes = vec![vec![0u64; bins]; tenants];
    for &(i, t, b) in records {
        let bin = (t.as_nanos() / BIN.as_nanos()) as usize;
        if bin < bins {
            bytes[i][bin] += b;
        }
    }
    bytes
        .into_iter()
        .map(|row| {
            row.into_iter()
                .enumerate()
                .map(|(k, b)| {
                    let t = (k as f64 + 0.5) * BIN.as_secs_f64();
                    (t, b as f64 / BIN.as_secs_f64() / 1e6)
                })
                .collect()
        })
        .collect()
}

/// p99.9 is reported only over at least this many samples: below, it is
/// one or a few samples' worth of noise.
pub(crate) const P999_MIN_SAMPLES: usize = 10_000;

pub(crate) struct Lat {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    /// `None` under [`P999_MIN_SAMPLES`] samples.
    pub(crate) p999: Option<f64>,
    pub(crate) n: usize,
}

impl Lat {
    /// p99.9 for a table cell: "-" where there are too few samples.
    pub(crate) fn p999_cell(&self) -> String {
        self.p999.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
    }

    /// The percentiles as result figures (p99.9 only where reported).
    pub(crate) fn figures(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![("p50_us", self.p50), ("p99_us", self.p99)];
        if let Some(v) = self.p999 {
            out.push(("p999_us", v));
        }
        out
    }
}

/// A figure of a table `width` characters wide with three decimals, or
/// `-` where there is none (NaN: the free tenant of the cap's alone row).
pub(crate) fn figure_cell(v: f64, width: usize) -> String {
    if v.is_nan() {
        format!("{:>width$}", "-")
    } else {
        format!("{v:>width$.3}")
    }
}

pub(crate) fn lat(samples: &[f64]) -> Lat {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    Lat {
        p50: percentile(&s, 0.50).unwrap_or(f64::NAN),
        p99: percentile(&s, 0.99).unwrap_or(f64::NAN),
        p999: (s.len() >= P999_MIN_SAMPLES)
            .then(|| percentile(&s, 0.999))
            .flatten(),
        n: s.len(),
    }
}

/// Everything written out: the tables, one CSV line per figure, the
/// samples and the timelines.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) text: String,
    pub(crate) csv: String,
    pub(crate) samples: String,
    pub(crate) timeline: String,
}

impl Report {
    pub(crate) fn say(&mut self, line: impl AsRef<str>) {
        println!("{}", line.as_ref());
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    pub(crate) fn figure(
        &mut self,
        scenario: &str,
        way: Way,
        case: &str,
        tenant: &str,
        metric: &str,
        v: f64,
    ) {
        let _ = writeln!(
            self.csv,
            "{scenario},{},{case},{tenant},{metric},{v:.4}",
            way.name()
        );
    }

    pub(crate) fn keep_samples(&mut self, scenario: &str, way: Way, case: &str, samples: &[f64]) {
        for (i, s) in samples.iter().enumerate() {
            let _ = writeln!(self.samples, "{scenario},{},{case},{i},{s:.3}", way.name());
        }
    }

    pub(crate) fn keep_timeline(
        &mut self,
        scenario: &str,
        way: Way,
        names: &[String],
        m: &Measured,
    ) {
        for (name, points) in names.iter().zip(&m.timeline) {
            for (t, v) in points {
                let _ = writeln!(
                    self.timeline,
                    "{scenario},{},{name},{t:.3},{v:.4}",
                    way.name()
                );
            }
        }
    }
}
