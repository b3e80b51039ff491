//! Exchanging endpoints and remote regions with a peer over TCP.
//!
//! Each side writes one JSON line (its [`Handshake`]) and reads the
//! peer's. The connection is only for setup; data goes over RDMA.

use std::io::{Read, Write};
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
///
/// Reads exactly the peer's line and nothing after it, so the stream can
/// go on carrying the application's own messages.
pub fn exchange(stream: &mut TcpStream, local: &Handshake) -> Result<Handshake, Error> {
    let line = serde_json::to_string(local).map_err(|e| Error::Exchange(e.to_string()))?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Error::Exchange(format!("sending: {e}")))?;
    let peer = read_line(stream)?;
    serde_json::from_str(&peer)
        .map_err(|e| Error::Exchange(format!("the peer's handshake is not valid: {e}")))
}

/// One line, read a byte at a time so that nothing past its end is taken
/// from the stream (a handshake is a few hundred bytes, read once).
fn read_line(stream: &mut impl Read) -> Result<String, Error> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) if line.is_empty() => {
                return Err(Error::Exchange("the peer closed the connection".into()))
            }
            Ok(0) => {
                return Err(Error::Exchange(
                    "the peer closed the connection in the middle of its handshake".into(),
                ))
            }
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if line.len() as u64 >= MAX_LINE {
                    return Err(Error::Exchange(format!(
                        "the peer's handshake is longer than {MAX_LINE} bytes"
                    )));
                }
                line.push(byte[0]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Exchange(format!("receiving: {e}"))),
        }
    }
    String::from_utf8(line).map_err(|_| Error::Exchange("the peer's handshake is not UTF-8".into()))
}
