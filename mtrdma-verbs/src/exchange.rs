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
pub const MAX_LINE: u64 = 64 * 1024;

/// Why [`exchange`] failed ([`Error::Exchange`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Our handshake could not be encoded.
    #[error("our handshake could not be encoded: {0}")]
    Encode(#[source] serde_json::Error),
    /// Writing our handshake to the stream failed.
    #[error("sending our handshake: {0}")]
    Send(#[source] std::io::Error),
    /// Reading the peer's handshake from the stream failed.
    #[error("receiving the peer's handshake: {0}")]
    Receive(#[source] std::io::Error),
    /// The peer closed the connection before sending anything.
    #[error("the peer closed the connection")]
    Closed,
    /// The peer closed the connection in the middle of its handshake.
    #[error("the peer closed the connection in the middle of its handshake")]
    Truncated,
    /// The peer's line is longer than [`MAX_LINE`].
    #[error("the peer's handshake is longer than {MAX_LINE} bytes")]
    TooLong,
    /// The peer's line is not UTF-8.
    #[error("the peer's handshake is not UTF-8")]
    NotUtf8,
    /// The peer's line is not a [`Handshake`] in JSON.
    #[error("the peer's handshake is not valid: {0}")]
    Invalid(#[source] serde_json::Error),
}

/// Sends `local` and returns the peer's handshake.
///
/// Reads exactly the peer's line and nothing after it, so the stream can
/// go on carrying the application's own messages.
///
/// # Errors
/// [`Error::Exchange`] with the [`HandshakeError`] that stopped it.
pub fn exchange(stream: &mut TcpStream, local: &Handshake) -> Result<Handshake, Error> {
    exchange_lines(stream, local).map_err(Error::Exchange)
}

fn exchange_lines(stream: &mut TcpStream, local: &Handshake) -> Result<Handshake, HandshakeError> {
    let line = serde_json::to_string(local).map_err(HandshakeError::Encode)?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(HandshakeError::Send)?;
    let peer = read_line(stream)?;
    serde_json::from_str(&peer).map_err(HandshakeError::Invalid)
}

/// One line, read a byte at a time so that nothing past its end is taken
/// from the stream (a handshake is a few hundred bytes, read once).
fn read_line(stream: &mut impl Read) -> Result<String, HandshakeError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) if line.is_empty() => return Err(HandshakeError::Closed),
            Ok(0) => return Err(HandshakeError::Truncated),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if line.len() as u64 >= MAX_LINE {
                    return Err(HandshakeError::TooLong);
                }
                line.push(byte[0]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HandshakeError::Receive(e)),
        }
    }
    String::from_utf8(line).map_err(|_| HandshakeError::NotUtf8)
}
