//! The control connection: short text lines, read without buffering ahead.

use super::*;

pub(crate) struct Ctrl {
    pub(crate) stream: TcpStream,
    pub(crate) partial: Vec<u8>,
    pub(crate) nonblocking: bool,
    pub(crate) peer: String,
}

impl Ctrl {
    pub(crate) fn new(stream: TcpStream, peer: String) -> Ctrl {
        let _ = stream.set_nodelay(true);
        Ctrl {
            stream,
            partial: Vec::new(),
            nonblocking: false,
            peer,
        }
    }

    pub(crate) fn send(&mut self, line: &str) -> Result<(), String> {
        self.set_nonblocking(false)?;
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("sending to {}: {e}", self.peer))
    }

    pub(crate) fn set_nonblocking(&mut self, on: bool) -> Result<(), String> {
        if self.nonblocking != on {
            self.stream
                .set_nonblocking(on)
                .map_err(|e| format!("control connection: {e}"))?;
            self.nonblocking = on;
        }
        Ok(())
    }

    /// Reads what has arrived; a whole line if there is one.
    pub(crate) fn read_some(&mut self) -> Result<Option<String>, std::io::Error> {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the peer closed the connection",
                    ))
                }
                Ok(_) if byte[0] == b'\n' => {
                    let line = String::from_utf8_lossy(&self.partial).trim().to_string();
                    self.partial.clear();
                    return Ok(Some(line));
                }
                Ok(_) => {
                    if self.partial.len() >= 4096 {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "the peer sent a line longer than 4096 bytes",
                        ));
                    }
                    self.partial.push(byte[0]);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A whole line, waiting at most `timeout` (`None`: forever).
    pub(crate) fn recv(&mut self, timeout: Option<Duration>) -> Result<String, String> {
        self.set_nonblocking(false)?;
        self.stream
            .set_read_timeout(timeout)
            .map_err(|e| format!("control connection: {e}"))?;
        match self.read_some() {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!("no message from {}", self.peer)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
                format!("timed out after {timeout:?} waiting for {}", self.peer),
            ),
            Err(e) => Err(format!("control connection to {}: {e}", self.peer)),
        }
    }

    /// A line if one has arrived, without waiting.
    pub(crate) fn try_recv(&mut self) -> Result<Option<String>, String> {
        self.set_nonblocking(true)?;
        match self.read_some() {
            Ok(line) => Ok(line),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(format!("control connection to {}: {e}", self.peer)),
        }
    }

    /// Waits for `word`; an `ERR ...` line from the peer becomes the error.
    pub(crate) fn expect(
        &mut self,
        word: &str,
        timeout: Option<Duration>,
    ) -> Result<String, String> {
        let line = self.recv(timeout)?;
        check_line(&line, word, &self.peer)?;
        Ok(line)
    }
}

/// `Ok` if `line` starts with `word`; the peer's error if it is `ERR ...`.
pub(crate) fn check_line(line: &str, word: &str, peer: &str) -> Result<(), String> {
    if let Some(msg) = line.strip_prefix("ERR ") {
        return Err(format!("{peer} reported: {msg}"));
    }
    if line.split_whitespace().next() == Some(word) {
        Ok(())
    } else {
        Err(format!(
            "protocol error: expected {word} from {peer}, got {line:?}"
        ))
    }
}
