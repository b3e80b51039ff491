//! The command line: the two modes, their flags and their checks.

use std::path::PathBuf;
use std::time::Duration;

use crate::args;
pub(crate) use mtrdma_demo::qp::PathKind;

pub(crate) const HELP: &str = "\
remote_memory: a remote-memory pager (swap-like) over RC queue pairs to memory nodes

USAGE:
    remote_memory node --device DEV -p PORT --pages N [--forever]
    remote_memory client --device DEV --node HOST:PORT [--node HOST:PORT ...]
                         --working-set W --cache C --seconds S [OPTIONS]

NODE:
    --device NAME        RDMA device (default: the first active one)
    -p, --port PORT      TCP port to listen on, on every address (0: any free port;
                         the ready line says which)
    --pages N            pages of 4 KiB the node lends (registered for remote READ/WRITE)
    --forever            serve one client after another (default: exit when the
                         first client closes its connection)
    Prints `node: ready port PORT pages N` once it listens.

CLIENT:
    --device NAME        RDMA device (default: the first active one)
    --node HOST:PORT     a memory node (repeat for more); page p belongs to
                         cluster g = p / K, which lives on node g % nodes, its
                         pages contiguous from slot (g / nodes) * K
    --working-set W      pages the workload touches (all remote; a multiple of K)
    --cache C            pages held locally (C < W; a multiple of K, and with
                         K > 1 at least 2 clusters)
    --cluster K          pages per I/O, a power of two 1 ..= 64 (default 1): the
                         cache holds clusters of K pages, a miss on any page reads
                         its whole cluster with one RDMA READ, a dirty cluster is
                         written back with one RDMA WRITE (as swap's page-cluster)
    --seconds S          length of the timed run
    --depth D            misses (cluster READs) in flight at once (default 8)
    --write-share F      share of accesses that write (dirty) the page (default 0.5)
    --path PATH          raw: post on the queue pair; mtrdma: through the scheduled
                         path (ScheduledQueuePair with a delay window) (default raw)
    --coordinator SOCKET register with a running coordinator: queue pairs and
                         regions are created for its tenant, the scheduled path
                         runs as that tenant
    --chunk BYTES        scheduled path: piece size (default 4096, one page)
    --pieces N           scheduled path: pieces in the NIC per queue pair (default:
                         twice the depth)
    --seed N             the workload's random seed (default 1)
    --spin               poll completions in a loop instead of sleeping on
                         completion events (the default sleeps)
    --csv FILE           write a CSV header and one row of the results

Exit status: 0 if no page was corrupt (lost pages of a dead node are reported,
not a failure), 2 if a page was corrupt, 1 on any other error.
";

/// A memory node's settings.
#[derive(Debug, Clone)]
pub(crate) struct NodeArgs {
    pub(crate) device: Option<String>,
    pub(crate) port: u16,
    pub(crate) pages: u64,
    pub(crate) forever: bool,
}

/// A node address as given: `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAddr {
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The pager's settings, checked.
#[derive(Debug, Clone)]
pub(crate) struct ClientArgs {
    pub(crate) device: Option<String>,
    pub(crate) nodes: Vec<NodeAddr>,
    pub(crate) working_set: u64,
    pub(crate) cache: u64,
    /// Pages per cluster: the unit of placement, caching and I/O.
    pub(crate) cluster: u64,
    pub(crate) duration: Duration,
    pub(crate) depth: u32,
    pub(crate) write_share: f64,
    pub(crate) path: PathKind,
    pub(crate) coordinator: Option<PathBuf>,
    pub(crate) chunk: u64,
    pub(crate) pieces: u32,
    pub(crate) seed: u64,
    pub(crate) spin: bool,
    pub(crate) csv: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Command {
    Help,
    Node(NodeArgs),
    Client(Box<ClientArgs>),
}

/// The most pages a working set or a node may have (1 TiB of 4 KiB pages).
const MAX_PAGES: u64 = 1 << 28;
/// The most pages in a cluster (256 KiB per I/O).
const MAX_CLUSTER: u64 = 64;

fn parse_num<T: std::str::FromStr>(flag: &str, s: &str, what: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{flag} {s:?}: not {what}"))
}

fn parse_node(s: &str) -> Result<NodeAddr, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("--node {s:?}: give HOST:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("--node {s:?}: the host is missing (HOST:PORT)"));
    }
    let port = parse_num("--node", port, "a port number (HOST:PORT)")?;
    Ok(NodeAddr {
        host: host.to_string(),
        port,
    })
}

fn pages(flag: &str, s: &str) -> Result<u64, String> {
    let n: u64 = parse_num(flag, s, "a number of pages")?;
    if n == 0 || n > MAX_PAGES {
        return Err(format!("{flag} {n}: give 1 ..= {MAX_PAGES} pages"));
    }
    Ok(n)
}

/// Reads the command line (without the program's name).
pub(crate) fn parse(raw: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut it = args::Args::from_args(raw);
    let mode = match it.next()? {
        None => return Err("give a mode: node or client (see --help)".into()),
        Some(args::Token::Value(m)) => m,
        Some(args::Token::Flag(f)) if f == "-h" || f == "--help" => return Ok(Command::Help),
        Some(args::Token::Flag(f)) => {
            return Err(format!(
                "{f}: give the mode first, node or client (see --help)"
            ))
        }
    };
    match mode.as_str() {
        "node" => parse_node_args(&mut it),
        "client" => parse_client_args(&mut it),
        other => Err(format!(
            "unknown mode {other:?}: node or client (see --help)"
        )),
    }
}

fn parse_node_args(it: &mut args::Args) -> Result<Command, String> {
    let (mut device, mut port, mut pages_n, mut forever) = (None, None, None, false);
    while let Some(flag) = it.next_flag(|v| format!("node: unexpected argument {v:?}"))? {
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--device" => device = Some(it.value(&flag)?),
            "-p" | "--port" => port = Some(parse_num(&flag, &it.value(&flag)?, "a port")?),
            "--pages" => pages_n = Some(pages(&flag, &it.value(&flag)?)?),
            "--forever" => forever = true,
            _ => return Err(format!("node: unknown flag {flag} (see --help)")),
        }
    }
    Ok(Command::Node(NodeArgs {
        device,
        port: port.ok_or("node: give the TCP port to listen on (-p PORT)")?,
        pages: pages_n.ok_or("node: give the pages it lends (--pages N)")?,
        forever,
    }))
}

fn parse_client_args(it: &mut args::Args) -> Result<Command, String> {
    let mut device = None;
    let mut nodes = Vec::new();
    let (mut ws, mut cache, mut seconds, mut cluster) = (None, None, None, 1u64);
    let (mut depth, mut write_share, mut path) = (8u32, 0.5f64, PathKind::Raw);
    let (mut coordinator, mut chunk, mut pieces) = (None, 4096u64, None);
    let (mut seed, mut spin, mut csv) = (1u64, false, None);
    while let Some(flag) = it.next_flag(|v| format!("client: unexpected argument {v:?}"))? {
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--device" => device = Some(it.value(&flag)?),
            "--node" => nodes.push(parse_node(&it.value(&flag)?)?),
            "--working-set" => ws = Some(pages(&flag, &it.value(&flag)?)?),
            "--cache" => cache = Some(pages(&flag, &it.value(&flag)?)?),
            "--cluster" => {
                cluster = parse_num(&flag, &it.value(&flag)?, "a number of pages")?;
                if !(1..=MAX_CLUSTER).contains(&cluster) || !cluster.is_power_of_two() {
                    return Err(format!(
                        "{flag} {cluster}: give a power of two 1 ..= {MAX_CLUSTER} pages"
                    ));
                }
            }
            "--seconds" => {
                let s: f64 = parse_num(&flag, &it.value(&flag)?, "seconds")?;
                if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
                    return Err(format!("{flag} {s}: give 0 < S <= 86400"));
                }
                seconds = Some(s);
            }
            "--depth" => {
                depth = parse_num(&flag, &it.value(&flag)?, "a count")?;
                if !(1..=256).contains(&depth) {
                    return Err(format!("{flag} {depth}: give 1 ..= 256"));
                }
            }
            "--write-share" => {
                write_share = parse_num(&flag, &it.value(&flag)?, "a share 0 ..= 1")?;
                if !(0.0..=1.0).contains(&write_share) {
                    return Err(format!("{flag} {write_share}: give a share 0 ..= 1"));
                }
            }
            "--path" => {
                let v = it.value(&flag)?;
                path =
                    PathKind::from_name(&v).ok_or_else(|| format!("--path {v:?}: raw or mtrdma"))?
            }
            "--coordinator" => coordinator = Some(PathBuf::from(it.value(&flag)?)),
            "--chunk" => {
                chunk = parse_num(&flag, &it.value(&flag)?, "a size in bytes")?;
                if !(64..=1 << 20).contains(&chunk) {
                    return Err(format!("{flag} {chunk}: give 64 ..= 1048576 bytes"));
                }
            }
            "--pieces" => {
                let n: u32 = parse_num(&flag, &it.value(&flag)?, "a count")?;
                if !(1..=1024).contains(&n) {
                    return Err(format!("{flag} {n}: give 1 ..= 1024"));
                }
                pieces = Some(n);
            }
            "--seed" => seed = parse_num(&flag, &it.value(&flag)?, "a number")?,
            "--spin" => spin = true,
            "--csv" => csv = Some(PathBuf::from(it.value(&flag)?)),
            _ => return Err(format!("client: unknown flag {flag} (see --help)")),
        }
    }
    if nodes.is_empty() {
        return Err("client: give at least one memory node (--node HOST:PORT)".into());
    }
    let working_set = ws.ok_or("client: give the working set in pages (--working-set W)")?;
    let cache = cache.ok_or("client: give the cache size in pages (--cache C)")?;
    if cache >= working_set {
        return Err(format!(
            "client: the cache ({cache} pages) must be smaller than the working set \
             ({working_set} pages), or nothing is ever paged"
        ));
    }
    if working_set % cluster != 0 {
        return Err(format!(
            "client: the working set ({working_set} pages) must be a multiple of the \
             cluster ({cluster} pages)"
        ));
    }
    if cache % cluster != 0 {
        return Err(format!(
            "client: the cache ({cache} pages) must be a multiple of the cluster \
             ({cluster} pages)"
        ));
    }
    if cluster > 1 && cache < 2 * cluster {
        return Err(format!(
            "client: the cache ({cache} pages) must hold at least 2 clusters \
             ({} pages with --cluster {cluster})",
            2 * cluster
        ));
    }
    let seconds = seconds.ok_or("client: give the run's length (--seconds S)")?;
    Ok(Command::Client(Box::new(ClientArgs {
        device,
        nodes,
        working_set,
        cache,
        cluster,
        duration: Duration::from_secs_f64(seconds),
        depth,
        write_share,
        path,
        coordinator,
        chunk,
        pieces: pieces.unwrap_or(2 * depth),
        seed,
        spin,
        csv,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(extra: &[&str]) -> Result<Command, String> {
        let mut v: Vec<String> = ["client", "--node", "h:1", "--seconds", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        parse(v)
    }

    #[test]
    fn a_cache_as_large_as_the_working_set_is_refused() {
        let e = client(&["--working-set", "8", "--cache", "8"]).unwrap_err();
        assert!(e.contains("must be smaller than the working set"), "{e}");
    }

    #[test]
    fn nodes_parse_and_default_settings_hold() {
        let Ok(Command::Client(a)) = client(&["--working-set", "8", "--cache", "2"]) else {
            panic!("parses");
        };
        assert_eq!(
            a.nodes,
            vec![NodeAddr {
                host: "h".into(),
                port: 1
            }]
        );
        assert_eq!((a.depth, a.path, a.pieces), (8, PathKind::Raw, 16));
        assert_eq!(a.cluster, 1);
    }

    #[test]
    fn clusters_are_checked_against_the_working_set_and_the_cache() {
        let Ok(Command::Client(a)) =
            client(&["--working-set", "64", "--cache", "16", "--cluster", "8"])
        else {
            panic!("parses");
        };
        assert_eq!(a.cluster, 8);
        refused(&[
            ("--working-set 64 --cache 16 --cluster 3", "power of two"),
            ("--working-set 64 --cache 16 --cluster 0", "power of two"),
            (
                "--working-set 256 --cache 128 --cluster 128",
                "power of two",
            ),
            (
                "--working-set 60 --cache 16 --cluster 8",
                "multiple of the cluster",
            ),
            (
                "--working-set 64 --cache 12 --cluster 8",
                "multiple of the cluster",
            ),
            (
                "--working-set 64 --cache 8 --cluster 8",
                "at least 2 clusters",
            ),
        ]);
    }

    /// Each client command line (`args`, split at spaces) is refused, the
    /// reason naming `says`.
    fn refused(cases: &[(&str, &str)]) {
        for (args, says) in cases {
            let args: Vec<&str> = args.split(' ').collect();
            let e = client(&args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_flag() {
        refused(&[
            ("--working-set 0 --cache 1", "--working-set 0"),
            ("--working-set 8 --cache 2 --depth 0", "--depth"),
            ("--working-set 8 --cache 2 --write-share 2", "--write-share"),
            ("--working-set 8 --cache 2 --path x", "--path"),
            ("--working-set 8 --cache 2 --node nohost", "HOST:PORT"),
        ]);
    }
}
