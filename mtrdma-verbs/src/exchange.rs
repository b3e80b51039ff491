//! Exchanging endpoints and remote regions with a peer over TCP.
//!
//! Each side writes one JSON line (its [`Handshake`]) and reads the
//! peer's. The connection is only for setup; data goes over RDMA.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

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

/// How long [`exchange`] waits for a peer: a silent one fails it then
/// rather than holding the caller forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The peer sent no whole handshake (or did not take ours) in time.
    #[error("no handshake from the peer within {0:?}")]
    TimedOut(Duration),
}

/// Sends `local` and returns the peer's handshake, waiting at most
/// [`DEFAULT_TIMEOUT`] for the peer (see [`exchange_within`]).
///
/// Reads exactly the peer's line and nothing after it, so the stream can
/// go on carrying the application's own messages.
///
/// # Errors
/// [`Error::Exchange`] with the [`HandshakeError`] that stopped it.
pub fn exchange(stream: &mut TcpStream, local: &Handshake) -> Result<Handshake, Error> {
    exchange_within(stream, local, DEFAULT_TIMEOUT)
}

/// [`exchange`], failing with [`HandshakeError::TimedOut`] if the whole
/// handshake (ours sent, the peer's read) takes longer than `timeout`. The
/// stream's own read and write timeouts are put back afterwards.
///
/// # Errors
/// [`Error::Exchange`] with the [`HandshakeError`] that stopped it.
pub fn exchange_within(
    stream: &mut TcpStream,
    local: &Handshake,
    timeout: Duration,
) -> Result<Handshake, Error> {
    let before = (stream.read_timeout(), stream.write_timeout());
    let deadline = Deadline {
        at: Instant::now() + timeout,
        timeout,
    };
    let result = exchange_lines(stream, local, &deadline);
    if let (Ok(read), Ok(write)) = before {
        let _ = stream.set_read_timeout(read);
        let _ = stream.set_write_timeout(write);
    }
    result.map_err(Error::Exchange)
}

/// When a handshake must be done by.
struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// Bounds the stream's next read and write by the time left.
    fn arm(&self, stream: &TcpStream) -> Result<(), HandshakeError> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeError::TimedOut(self.timeout));
        }
        // Setting a non-zero timeout on an open socket does not fail.
        let _ = stream.set_read_timeout(Some(left));
        let _ = stream.set_write_timeout(Some(left));
        Ok(())
    }

    /// `e`, or [`HandshakeError::TimedOut`] if it is the timeout firing.
    fn judge(&self, e: std::io::Error, or: fn(std::io::Error) -> HandshakeError) -> HandshakeError {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                HandshakeError::TimedOut(self.timeout)
            }
            _ => or(e),
        }
    }
}

fn exchange_lines(
    stream: &mut TcpStream,
    local: &Handshake,
    deadline: &Deadline,
) -> Result<Handshake, HandshakeError> {
    let line = serde_json::to_string(local).map_err(HandshakeError::Encode)?;
    deadline.arm(stream)?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| deadline.judge(e, HandshakeError::Send))?;
    let peer = read_line(stream, deadline)?;
    serde_json::from_str(&peer).map_err(HandshakeError::Invalid)
}

/// One line, read a byte at a time so that nothing past its end is taken
/// from the stream (a handshake is a few hundred bytes, read once).
fn read_line(stream: &mut TcpStream, deadline: &Deadline) -> Result<String, HandshakeError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        deadline.arm(stream)?;
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
            Err(e) => return Err(deadline.judge(e, HandshakeError::Receive)),
        }
    }
    String::from_utf8(line).map_err(|_| HandshakeError::NotUtf8)
}
