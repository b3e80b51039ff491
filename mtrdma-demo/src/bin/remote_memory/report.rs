//! The pager's figures: the result block on stdout and the CSV row.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use mtrdma::sched::stats::percentile;

use crate::cli::ClientArgs;
use crate::page::PAGE;

/// What a run counted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Results {
    pub(crate) path: &'static str,
    pub(crate) nodes: usize,
    pub(crate) working_set: u64,
    pub(crate) cache: u64,
    pub(crate) depth: u32,
    /// Pages per cluster (per READ and WRITE).
    pub(crate) cluster: u64,
    /// Pages written at version 1 before the run.
    pub(crate) filled: u64,
    /// Accesses served (hits, and faults once their page was in) or
    /// counted as lost.
    pub(crate) accesses: u64,
    /// Of them, writes that dirtied their page.
    pub(crate) writes: u64,
    /// Misses that posted a page-in (one READ of a cluster).
    pub(crate) faults: u64,
    /// Pages read in (a cluster's READ brings `cluster` of them).
    pub(crate) page_ins: u64,
    /// Pages written out (a cluster's WRITE takes `cluster` of them).
    pub(crate) page_outs: u64,
    /// READs completed with data: page-ins / cluster.
    pub(crate) page_in_requests: u64,
    /// Pages read in whose header, checksum and body were right.
    pub(crate) verified: u64,
    /// Pages read in that were not the page and version expected.
    pub(crate) corrupt: u64,
    pub(crate) lost_pages: u64,
    pub(crate) lost_accesses: u64,
    /// Page-ins completed after the first node was lost.
    pub(crate) page_ins_after_loss: u64,
    /// Each page-in READ's (cluster's) time from posting to completion.
    pub(crate) latencies_ns: Vec<u64>,
    /// The timed run, with the drain of the requests still out at its end.
    pub(crate) elapsed: Duration,
}

/// Figures derived from [`Results`], in the report's units.
struct Figures {
    secs: f64,
    page_ins_per_s: f64,
    mb_per_s: f64,
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
}

impl Results {
    pub(crate) fn new(a: &ClientArgs) -> Results {
        Results {
            path: a.path.name(),
            nodes: a.nodes.len(),
            working_set: a.working_set,
            cache: a.cache,
            depth: a.depth,
            cluster: a.cluster,
            ..Results::default()
        }
    }

    fn figures(&mut self) -> Figures {
        self.latencies_ns.sort_unstable();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let us = |q| percentile(&self.latencies_ns, q).map(|ns| ns as f64 / 1e3);
        Figures {
            secs,
            page_ins_per_s: self.page_ins as f64 / secs,
            // MB = 2^20 bytes, of page-ins and page-outs together.
            mb_per_s: (self.page_ins + self.page_outs) as f64 * PAGE as f64 / 1_048_576.0 / secs,
            p50: us(0.5),
            p99: us(0.99),
            p999: us(0.999),
        }
    }

    /// The result block for stdout: one `name: value` per line.
    pub(crate) fn block(&mut self) -> String {
        let f = self.figures();
        let lat = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let mut s = String::from("result:\n");
        let mut line = |k: &str, v: String| {
            let _ = writeln!(s, "  {k}: {v}");
        };
        line("seconds", format!("{:.2}", f.secs));
        line("accesses", self.accesses.to_string());
        line("writes", self.writes.to_string());
        line("page-ins", self.page_ins.to_string());
        line("page-outs", self.page_outs.to_string());
        line("page-in requests", self.page_in_requests.to_string());
        line("page-ins/s", format!("{:.0}", f.page_ins_per_s));
        line("MB/s", format!("{:.2}", f.mb_per_s));
        line("page-in p50 us", lat(f.p50));
        line("page-in p99 us", lat(f.p99));
        line("page-in p99.9 us", lat(f.p999));
        line("verified", self.verified.to_string());
        line("corrupt", self.corrupt.to_string());
        line("lost pages", self.lost_pages.to_string());
        line("lost accesses", self.lost_accesses.to_string());
        line(
            "page-ins after first loss",
            self.page_ins_after_loss.to_string(),
        );
        s
    }

    /// Writes `file`: a header and one row of the figures.
    pub(crate) fn write_csv(&mut self, file: &Path) -> Result<(), String> {
        let f = self.figures();
        let lat = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.1}"));
        let text = format!(
            "path,nodes,working_set,cache,depth,seconds,page_ins,page_outs,page_ins_per_s,mb_per_s,\
             p50_us,p99_us,p999_us,verified,corrupt,lost_pages,lost_accesses,page_ins_after_loss,\
             page_in_requests,cluster\n\
             {},{},{},{},{},{:.3},{},{},{:.0},{:.3},{},{},{},{},{},{},{},{},{},{}\n",
            self.path,
            self.nodes,
            self.working_set,
            self.cache,
            self.depth,
            f.secs,
            self.page_ins,
            self.page_outs,
            f.page_ins_per_s,
            f.mb_per_s,
            lat(f.p50),
            lat(f.p99),
            lat(f.p999),
            self.verified,
            self.corrupt,
            self.lost_pages,
            self.lost_accesses,
            self.page_ins_after_loss,
            self.page_in_requests,
            self.cluster,
        );
        std::fs::write(file, text).map_err(|e| format!("writing {}: {e}", file.display()))
    }
}
