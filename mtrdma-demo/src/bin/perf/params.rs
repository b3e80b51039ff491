//! The parameters both sides agree on, sent by the client to the server.

use super::*;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    pub(crate) test: Test,
    pub(crate) path: PathKind,
    pub(crate) sizes: Vec<usize>,
    pub(crate) iters: u64,
    /// 0: run `iters` iterations; otherwise milliseconds per size.
    pub(crate) duration_ms: u64,
    pub(crate) tx_depth: u32,
    pub(crate) chunk: u64,
    pub(crate) pieces: u32,
    /// Sends up to this many bytes go inline.
    pub(crate) inline: u32,
}

pub(crate) fn all_sizes() -> Vec<usize> {
    (1..=23).map(|p| 1usize << p).collect()
}

impl Params {
    pub(crate) fn from_args(a: &Args) -> Params {
        let test = a.test.unwrap_or(Test::WriteBw);
        let sizes = if a.all {
            all_sizes()
        } else {
            vec![a.size.unwrap_or(if test.is_bw() { 65_536 } else { 2 })]
        };
        Params {
            test,
            path: a.path.unwrap_or(PathKind::Mtrdma),
            sizes,
            iters: a.iters.unwrap_or(if test.is_bw() { 5000 } else { 1000 }),
            duration_ms: a.duration.map_or(0, |d| d.as_millis().max(1) as u64),
            tx_depth: a.tx_depth.unwrap_or(128),
            chunk: a.chunk.unwrap_or(ScheduleConfig::default().chunk_bytes),
            pieces: a
                .pieces
                .unwrap_or(ScheduleConfig::default().max_pieces_in_flight),
            // perftest's default: 220 B inline for WRITE and SEND latency.
            inline: a.inline.unwrap_or(match test {
                Test::WriteLat | Test::SendLat | Test::WriteCompLat => DEFAULT_INLINE,
                _ => 0,
            }),
        }
    }

    pub(crate) fn duration(&self) -> Option<Duration> {
        (self.duration_ms > 0).then(|| Duration::from_millis(self.duration_ms))
    }

    pub(crate) fn encode(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!(
            "{PROTOCOL} test={} path={} sizes={} iters={} duration_ms={} tx_depth={} chunk={} pieces={} inline={}",
            self.test.name(),
            self.path.name(),
            sizes.join(","),
            self.iters,
            self.duration_ms,
            self.tx_depth,
            self.chunk,
            self.pieces,
            self.inline
        )
    }

    pub(crate) fn decode(line: &str) -> Result<Params, String> {
        let mut words = line.split_whitespace();
        match words.next() {
            Some(PROTOCOL) => {}
            Some(p) if p.starts_with("mtrdma-perf/") => {
                return Err(format!(
                "the client speaks {p}, this server {PROTOCOL}: use the same build on both sides"
            ))
            }
            _ => return Err("the peer is not an mtrdma perf client".into()),
        }
        let mut p = Params {
            test: Test::WriteBw,
            path: PathKind::Mtrdma,
            sizes: Vec::new(),
            iters: 0,
            duration_ms: 0,
            tx_depth: 0,
            chunk: 0,
            pieces: 0,
            inline: 0,
        };
        let bad = |k: &str, v: &str| format!("the client sent a bad parameter {k}={v:?}");
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("the client sent a bad parameter {w:?}"))?;
            match k {
                "test" => p.test = Test::parse(v)?,
                "path" => p.path = parse_path(v)?,
                "sizes" => {
                    p.sizes = v
                        .split(',')
                        .map(|s| s.parse::<usize>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| bad(k, v))?
                }
                "iters" => p.iters = v.parse().map_err(|_| bad(k, v))?,
                "duration_ms" => p.duration_ms = v.parse().map_err(|_| bad(k, v))?,
                "tx_depth" => p.tx_depth = v.parse().map_err(|_| bad(k, v))?,
                "chunk" => p.chunk = v.parse().map_err(|_| bad(k, v))?,
                "pieces" => p.pieces = v.parse().map_err(|_| bad(k, v))?,
                "inline" => p.inline = v.parse().map_err(|_| bad(k, v))?,
                _ => {} // a newer client's extra setting: ignored
            }
        }
        let sizes_ok = !p.sizes.is_empty()
            && p.sizes.len() <= 64
            && p.sizes.iter().all(|&s| s >= 1 && s <= u32::MAX as usize);
        if !sizes_ok
            || (p.iters == 0 && p.duration_ms == 0)
            || !(1..=16_384).contains(&p.tx_depth)
            || p.chunk == 0
            || p.pieces == 0
        {
            return Err(format!("the client sent invalid parameters: {line}"));
        }
        Ok(p)
    }

    /// The parameters a server runs with: the client's, unless the server
    /// was given a different value explicitly.
    pub(crate) fn agree(server: &Args, client: Params) -> Result<Params, String> {
        let mut diffs = Vec::new();
        let mut check = |what: &str, mine: Option<String>, theirs: String| {
            if let Some(m) = mine {
                if m != theirs {
                    diffs.push(format!("{what}: server {m}, client {theirs}"));
                }
            }
        };
        check(
            "test",
            server.test.map(|t| t.name().to_string()),
            client.test.name().to_string(),
        );
        check(
            "path",
            server.path.map(|p| p.name().to_string()),
            client.path.name().to_string(),
        );
        let sizes = |v: &[usize]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let my_sizes = if server.all {
            Some(sizes(&all_sizes()))
        } else {
            server.size.map(|s| s.to_string())
        };
        check("sizes", my_sizes, sizes(&client.sizes));
        let client_run = if client.duration_ms > 0 {
            format!("{} ms", client.duration_ms)
        } else {
            format!("{} iterations", client.iters)
        };
        let my_run = match (server.iters, server.duration) {
            (Some(n), _) => Some(format!("{n} iterations")),
            (_, Some(d)) => Some(format!("{} ms", d.as_millis().max(1))),
            _ => None,
        };
        check("length", my_run, client_run);
        let numbers = [
            (
                "tx depth",
                server.tx_depth.map(u64::from),
                u64::from(client.tx_depth),
            ),
            ("chunk", server.chunk, client.chunk),
            (
                "pieces",
                server.pieces.map(u64::from),
                u64::from(client.pieces),
            ),
            (
                "inline size",
                server.inline.map(u64::from),
                u64::from(client.inline),
            ),
        ];
        for (what, mine, theirs) in numbers {
            check(what, mine.map(|n| n.to_string()), theirs.to_string());
        }
        if diffs.is_empty() {
            Ok(client)
        } else {
            Err(format!(
                "server and client disagree ({}); give the same flags on both sides, or none on the server",
                diffs.join("; ")
            ))
        }
    }
}
