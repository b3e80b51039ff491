//! Exchanging endpoints and remote regions with a peer over TCP.
//!
//! Each side writes one JSON line (its [`Handshake`]) and reads the
//! peer's. The connection is only for setup; data goes over RDMA.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use crate::{Endpoint, Error, RemoteRegion};

/// What one side tells the other before connecting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handshake {
    /// The queue pair to connect to.
    pub endpoint: Endpoint,
    /// Regions the peer may READ or WRITE.
    pub regions: Vec<RemoteRegion>,
}

/// The largest handshake line accepted (a peer cannot make us buffer more).
const MAX_LINE: u64 = 64 * 1024;

/// Sends `local` and returns the peer's handshake.
pub fn exchange(stream: &mut TcpStream, local: &Handshake) -> Result<Handshake, Error> {
    let line = serde_json::to_string(local).map_err(|e| Error::Exchange(e.to_string()))?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Error::Exchange(format!("sending: {e}")))?;
    let mut reader = BufReader::new(std::io::Read::take(&*stream, MAX_LINE));
    let mut peer = String::new();
    reader
        .read_line(&mut peer)
        .map_err(|e| Error::Exchange(format!("receiving: {e}")))?;
    if peer.is_empty() {
        return Err(Error::Exchange("the peer closed the connection".into()));
    }
    serde_json::from_str(peer.trim_end())
        .map_err(|e| Error::Exchange(format!("the peer's handshake is not valid: {e}")))
}
