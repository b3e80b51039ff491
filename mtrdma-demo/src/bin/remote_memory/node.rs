//! The memory node: lends a registered region of pages to one pager at a
//! time. It does no work per request (the pager's READs and WRITEs are
//! one-sided); it only sets up the queue pair and waits for the pager to
//! hang up. Every pager's queue pair goes on the one completion queue the
//! node makes at its start (a shared completion queue), not on one of its
//! own.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use mtrdma::verbs::exchange::{exchange_within, Handshake};
use mtrdma::verbs::{Access, ProtectionDomain, RemoteRegion, SharedCompletionQueue};

use crate::cli::NodeArgs;
use crate::page::PAGE;
use crate::{open_device, HELLO};

/// How long a connecting pager has to complete the handshake.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// Runs a memory node until its (first) pager is done, or for ever with
/// `--forever`.
pub(crate) fn run(a: &NodeArgs) -> Result<(), String> {
    let bytes = usize::try_from(a.pages)
        .ok()
        .and_then(|p| p.checked_mul(PAGE))
        .ok_or_else(|| format!("--pages {}: too many to address", a.pages))?;
    let ctx = open_device(a.device.as_deref())?;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("allocating a protection domain on {}: {e}", ctx.name()))?;
    // The pages stay registered across pagers: one served after another
    // (`--forever`) finds what the last one wrote.
    let region = pd
        .allocate(bytes, Access::REMOTE_READ_WRITE)
        .map_err(|e| format!("registering {} pages ({bytes} bytes): {e}", a.pages))?;
    let remote = region
        .remote()
        .ok_or("a region with remote access has no remote descriptor")?;
    // Every address: loopback for local runs, the link's for two devices.
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, a.port))
        .map_err(|e| format!("listening on port {}: {e}", a.port))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("listening socket: {e}"))?
        .port();
    // Nothing completes on it (the node posts nothing), so it has no
    // completion channel.
    let mut cq = ctx
        .shared_completion_queue()
        .entries(64)
        .completion_events(false)
        .build()
        .map_err(|e| format!("creating the completion queue on {}: {e}", ctx.name()))?;
    println!("node: ready port {port} pages {}", a.pages);
    loop {
        let (mut stream, addr) = listener
            .accept()
            .map_err(|e| format!("accepting a pager: {e}"))?;
        let _ = stream.set_nodelay(true);
        match serve(&pd, &mut cq, remote, a.pages, &mut stream, addr) {
            Ok(()) => {
                println!("node: pager {addr} done");
                if !a.forever {
                    return Ok(());
                }
            }
            // A pager that gave up before connecting (it found the node
            // too small, say) is not served; wait for the next one.
            Err(e) => eprintln!("node: pager {addr}: {e}"),
        }
    }
}

/// Connects a queue pair on `cq` to the pager on `stream` and keeps it
/// until the pager closes the connection.
fn serve(
    pd: &ProtectionDomain,
    cq: &mut SharedCompletionQueue,
    remote: RemoteRegion,
    pages: u64,
    stream: &mut TcpStream,
    addr: SocketAddr,
) -> Result<(), String> {
    // What the pager checks its working set against before it opens its
    // device.
    stream
        .write_all(format!("{HELLO} pages {pages}\n").as_bytes())
        .map_err(|e| format!("sending the greeting: {e}"))?;
    let endpoint = cq
        .prepare(
            pd.queue_pair()
                .max_send_wr(1)
                .max_recv_wr(1)
                .access(Access::REMOTE_READ_WRITE),
        )
        .map_err(|e| format!("creating the queue pair: {e}"))?;
    let served = connect_and_wait(cq, endpoint, remote, stream, addr);
    // The queue pair goes when its pager does, whatever happened.
    cq.remove(endpoint.qpn)
        .map_err(|e| format!("destroying the queue pair: {e}"))?;
    served
}

/// Connects queue pair `endpoint` of `cq` to the pager on `stream` and
/// waits until the pager closes the connection.
fn connect_and_wait(
    cq: &mut SharedCompletionQueue,
    endpoint: mtrdma::verbs::Endpoint,
    remote: RemoteRegion,
    stream: &mut TcpStream,
    addr: SocketAddr,
) -> Result<(), String> {
    let peer = exchange_within(
        stream,
        &Handshake {
            endpoint,
            regions: vec![remote],
        },
        HANDSHAKE,
    )
    .map_err(|e| format!("exchanging endpoints: {e}"))?;
    cq.connect(endpoint.qpn, &peer.endpoint)
        .map_err(|e| format!("connecting to the pager: {e}"))?;
    println!("node: serving pager {addr} (queue pair {})", endpoint.qpn);
    // The pager sends nothing more; end of stream is its goodbye (or its
    // death), and then the queue pair goes.
    let _ = stream.set_read_timeout(None);
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("node: pager {addr}: connection: {e}; taking it as gone");
                return Ok(());
            }
        }
    }
}
