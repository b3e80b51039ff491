//! A remote-memory pool: a swap-like pager over RC queue pairs to memory
//! nodes, checking every page it reads back.
//!
//! `remote_memory node` lends a region of pages (registered for remote
//! READ and WRITE) to one pager at a time. `remote_memory client` is the
//! pager: a page cache in front of a working set spread over the nodes
//! in clusters of K pages (`--cluster K`, default 1: cluster g = p / K on
//! node g % nodes, its pages contiguous from slot (g / nodes) * K), fed by
//! a workload of uniform random accesses (a share of them writes), paging
//! out dirty victim clusters with one RDMA WRITE each and paging in a
//! missed page's whole cluster with one RDMA READ, several misses in
//! flight. Every page carries a header (magic, page number, version,
//! checksum of the body) and a body derived from (page, version); a page
//! read back that is not exactly the version last written is CORRUPT. A
//! node that dies loses its pages (reported, counted), and the pager goes
//! on with the others.
//!
//! Requests go straight to the queue pair (`--path raw`) or through
//! mtrdma's scheduled path (`--path mtrdma`: a [`ScheduledQueuePair`] with
//! a delay window, as the tenant a coordinator decides with
//! `--coordinator`).
//!
//! ```text
//! remote_memory node --device rxe0 -p 7001 --pages 4096 &
//! remote_memory node --device rxe0 -p 7002 --pages 4096 &
//! remote_memory client --device rxe0 --node 127.0.0.1:7001 --node 127.0.0.1:7002 \
//!     --working-set 4096 --cache 1024 --seconds 5 --path mtrdma
//! ```
//!
//! Units: MB/s counts page-in and page-out bytes with MB = 2^20 bytes;
//! page-in latency is from posting the READ (of a whole cluster) to its
//! completion, in microseconds; page-ins, page-outs and verified count
//! pages, page-in requests count READs. Exit status 0 when no page was corrupt, 2 when one was,
//! 1 on other errors.
//!
//! [`ScheduledQueuePair`]: mtrdma::verbs::ScheduledQueuePair

mod cli;
mod node;
mod page;
mod pager;
mod report;

use std::process::ExitCode;

use mtrdma_demo::{args, open_device, tenant};

/// The first words of a node's greeting, then `pages N`.
pub(crate) const HELLO: &str = "mtrdma-remote-memory/1";

/// Runs the command line; `Ok(true)` if a page was corrupt.
fn run() -> Result<bool, String> {
    match cli::parse(std::env::args().skip(1))? {
        cli::Command::Help => {
            print!("{}", cli::HELP);
            Ok(false)
        }
        cli::Command::Node(a) => node::run(&a).map(|()| false),
        cli::Command::Client(a) => {
            let mut r = pager::run(&a)?;
            print!("{}", r.block());
            if let Some(file) = &a.csv {
                r.write_csv(file)?;
            }
            Ok(r.corrupt > 0)
        }
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => {
            eprintln!("remote_memory: pages read back were corrupt");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("remote_memory: {e}");
            ExitCode::from(1)
        }
    }
}
