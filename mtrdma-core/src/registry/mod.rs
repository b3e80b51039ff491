//! A queue-pair registry: endpoints published and looked up by name, as
//! HRD's clients and servers find each other through a central memcached
//! (`hrd_publish` / `hrd_get_published`).
//!
//! [`Registry`] is a client of memcached's text protocol. It works with a
//! real `memcached` (any version: it uses only `set`, `get` and
//! `delete`), or, where there is none, with a [`RegistryHost`]: a
//! registry served from a thread of one of the application's own
//! processes (the RPC server, say) over TCP, speaking the same protocol.
//! A pair of processes that know each other's address needs neither:
//! `mtrdma_verbs::exchange` swaps endpoints over one TCP connection.
//!
//! ```
//! use std::time::Duration;
//! use mtrdma_core::registry::{Registry, RegistryHost};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Endpoint { qpn: u32, gid: [u8; 16] }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // No memcached here: this process serves the names itself.
//! let host = RegistryHost::bind("127.0.0.1:0")?;
//! let mut registry = Registry::connect(&host.addr().to_string())?;
//! registry.publish_json("rpc/server-0", &Endpoint { qpn: 17, gid: [0; 16] })?;
//!
//! // A client, in any process that reaches the registry, waits up to
//! // 10 s for the server to publish, as HRD's clients do. With
//! // mtrdma-verbs the value is a `UdEndpoint` or an `Endpoint`.
//! let ep: Endpoint = registry.wait_for_json("rpc/server-0", Duration::from_secs(10))?;
//! assert_eq!(ep.qpn, 17);
//! # Ok(())
//! # }
//! ```

pub mod wire;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wire::{Command, Parsed, Reply, WireError};

/// How long one request to the registry may take before it fails with
/// [`RegistryError::TimedOut`], unless [`Registry::connect_within`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest pause between two looks while [`Registry::wait_for`]
/// waits for a name (it starts at a millisecond and doubles).
pub const MAX_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Why a registry request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No connection to the registry could be made.
    #[error("connecting to the registry at {server}: {source}")]
    Connect {
        /// The registry's address, as given.
        server: String,
        /// What the connection attempt said.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the connection failed (the registry went away).
    #[error("talking to the registry at {server}: {source}")]
    Io {
        /// The registry's address.
        server: String,
        /// What the socket said.
        #[source]
        source: std::io::Error,
    },
    /// The registry did not answer within the request timeout.
    #[error("the registry at {server} did not answer within {after:?}")]
    TimedOut {
        /// The registry's address.
        server: String,
        /// The request timeout.
        after: Duration,
    },
    /// The registry's reply is not memcached's protocol.
    #[error("the registry at {server} sent what memcached would not: {source}")]
    Protocol {
        /// The registry's address.
        server: String,
        /// What is wrong with the reply.
        #[source]
        source: WireError,
    },
    /// The registry refused the request (`ERROR`, `CLIENT_ERROR`,
    /// `SERVER_ERROR`, `NOT_STORED`).
    #[error("the registry at {server} refused: {reply}")]
    Refused {
        /// The registry's address.
        server: String,
        /// Its reply line.
        reply: String,
    },
    /// A name memcached does not accept (empty, over 250 bytes, with
    /// whitespace or control characters).
    #[error(transparent)]
    BadName(WireError),
    /// A value larger than [`wire::MAX_VALUE`].
    #[error("a value of {0} bytes: the registry takes at most {max}", max = wire::MAX_VALUE)]
    TooLarge(usize),
    /// Nobody published the name within the time [`Registry::wait_for`]
    /// was given.
    #[error("nothing was published as {name:?} within {waited:?}")]
    NotPublished {
        /// The name waited for.
        name: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The value published under the name is not what was asked for.
    #[error("the value published as {name:?} is not valid: {source}")]
    Decode {
        /// The name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
}

/// A client of a registry (memcached or a [`RegistryHost`]).
///
/// A request that fails on the connection (the registry restarted, a
/// reply cut short) drops it; the next request connects again.
#[derive(Debug)]
pub struct Registry {
    server: String,
    timeout: Duration,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Registry {
    /// Connects to the registry at `server` (`HOST:PORT`), with
    /// [`DEFAULT_TIMEOUT`] for each request.
    ///
    /// # Errors
    /// [`RegistryError::Connect`] if no connection can be made.
    pub fn connect(server: &str) -> Result<Registry, RegistryError> {
        Registry::connect_within(server, DEFAULT_TIMEOUT)
    }

    /// [`connect`](Self::connect), with `timeout` for the connection and
    /// for each request.
    ///
    /// # Errors
    /// [`RegistryError::Connect`] if no connection can be made.
    pub fn connect_within(server: &str, timeout: Duration) -> Result<Registry, RegistryError> {
        let mut registry = Registry {
            server: server.to_string(),
            timeout: timeout.max(Duration::from_millis(1)),
            stream: None,
            buf: Vec::new(),
        };
        registry.stream()?;
        Ok(registry)
    }

    /// The registry's address, as given.
    pub fn server(&self) -> &str {
        &self.server
    }

    fn stream(&mut self) -> Result<&mut TcpStream, RegistryError> {
        if self.stream.is_none() {
            let connect_error = |source| RegistryError::Connect {
                server: self.server.clone(),
                source,
            };
            let addrs: Vec<SocketAddr> = self
                .server
                .to_socket_addrs()
                .map_err(connect_error)?
                .collect();
            let mut last =
                std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address");
            let mut stream = None;
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, self.timeout) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let stream = stream.ok_or_else(|| connect_error(last))?;
            // Requests are a line or two: send them now, not with the next.
            let _ = stream.set_nodelay(true);
            self.buf.clear();
            self.stream = Some(stream);
        }
        Ok(self.stream.as_mut().expect("connected above"))
    }

    /// Sends `command` and reads its reply; any failure drops the
    /// connection (the bytes on it can no longer be trusted to line up).
    fn request(&mut self, command: &Command) -> Result<Reply, RegistryError> {
        let result = self.try_request(command);
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn try_request(&mut self, command: &Command) -> Result<Reply, RegistryError> {
        let deadline = Instant::now() + self.timeout;
        let (server, timeout) = (self.server.clone(), self.timeout);
        let io = |source: std::io::Error| match source.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                RegistryError::TimedOut {
                    server: server.clone(),
                    after: timeout,
                }
            }
            _ => RegistryError::Io {
                server: server.clone(),
                source,
            },
        };
        let left = |server: &str| {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(RegistryError::TimedOut {
                    server: server.to_string(),
                    after: timeout,
                })
            } else {
                Ok(left)
            }
        };
        let stream = self.stream()?;
        let _ = stream.set_write_timeout(Some(left(&server)?));
        stream.write_all(&command.encode()).map_err(io)?;
        let mut chunk = [0u8; 4096];
        loop {
            match Reply::parse(&self.buf) {
                Ok(Parsed::Done(reply, used)) => {
                    self.buf.drain(..used);
                    return Ok(reply);
                }
                Ok(Parsed::Incomplete) => {}
                Err(source) => return Err(RegistryError::Protocol { server, source }),
            }
            let stream = self.stream.as_mut().expect("connected above");
            let _ = stream.set_read_timeout(Some(left(&server)?));
            match stream.read(&mut chunk) {
                Ok(0) => {
                    let source = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the registry closed the connection",
                    );
                    return Err(RegistryError::Io { server, source });
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
    }

    fn refused(&self, reply: Reply) -> RegistryError {
        let reply = match reply {
            Reply::Error(line) => line,
            other => format!("{other:?}"),
        };
        RegistryError::Refused {
            server: self.server.clone(),
            reply,
        }
    }

    /// Publishes `value` as `name`, replacing what was there.
    ///
    /// # Errors
    /// [`RegistryError::BadName`], [`RegistryError::TooLarge`], or the
    /// registry's failure.
    pub fn publish(&mut self, name: &str, value: &[u8]) -> Result<(), RegistryError> {
        wire::check_key(name).map_err(RegistryError::BadName)?;
        if value.len() > wire::MAX_VALUE {
            return Err(RegistryError::TooLarge(value.len()));
        }
        let command = Command::Set {
            key: name.to_string(),
            flags: 0,
            data: value.to_vec(),
            noreply: false,
        };
        match self.request(&command)? {
            Reply::Stored => Ok(()),
            other => Err(self.refused(other)),
        }
    }

    /// What is published as `name`, if anything.
    ///
    /// # Errors
    /// [`RegistryError::BadName`], or the registry's failure.
    pub fn lookup(&mut self, name: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        wire::check_key(name).map_err(RegistryError::BadName)?;
        match self.request(&Command::Get(vec![name.to_string()]))? {
            reply @ Reply::Values(_) => reply.value_of(name).map_err(|source| {
                self.stream = None;
                RegistryError::Protocol {
                    server: self.server.clone(),
                    source,
                }
            }),
            other => Err(self.refused(other)),
        }
    }

    /// Withdraws `name`; returns whether it was published.
    ///
    /// # Errors
    /// [`RegistryError::BadName`], or the registry's failure.
    pub fn remove(&mut self, name: &str) -> Result<bool, RegistryError> {
        wire::check_key(name).map_err(RegistryError::BadName)?;
        let command = Command::Delete {
            key: name.to_string(),
            noreply: false,
        };
        match self.request(&command)? {
            Reply::Deleted => Ok(true),
            Reply::NotFound => Ok(false),
            other => Err(self.refused(other)),
        }
    }

    /// Waits for `name` to be published and returns it, looking again
    /// after 1 ms, 2 ms, 4 ms ... up to [`MAX_POLL_INTERVAL`] apart.
    ///
    /// # Errors
    /// [`RegistryError::NotPublished`] when `timeout` runs out first; the
    /// registry's failure at once (a dead registry is not waited out).
    pub fn wait_for(&mut self, name: &str, timeout: Duration) -> Result<Vec<u8>, RegistryError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(value) = self.lookup(name)? {
                return Ok(value);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(RegistryError::NotPublished {
                    name: name.to_string(),
                    waited,
                });
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(MAX_POLL_INTERVAL);
        }
    }

    /// Publishes `value` in JSON as `name` (an endpoint, say).
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub fn publish_json<T: serde::Serialize>(
        &mut self,
        name: &str,
        value: &T,
    ) -> Result<(), RegistryError> {
        let json = serde_json::to_vec(value).map_err(|source| RegistryError::Decode {
            name: name.to_string(),
            source,
        })?;
        self.publish(name, &json)
    }

    /// What is published as `name`, read from JSON.
    ///
    /// # Errors
    /// As [`lookup`](Self::lookup), and [`RegistryError::Decode`].
    pub fn lookup_json<T: serde::de::DeserializeOwned>(
        &mut self,
        name: &str,
    ) -> Result<Option<T>, RegistryError> {
        self.lookup(name)?.map(|v| decode(name, &v)).transpose()
    }

    /// [`wait_for`](Self::wait_for), read from JSON.
    ///
    /// # Errors
    /// As [`wait_for`](Self::wait_for), and [`RegistryError::Decode`].
    pub fn wait_for_json<T: serde::de::DeserializeOwned>(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<T, RegistryError> {
        decode(name, &self.wait_for(name, timeout)?)
    }
}

fn decode<T: serde::de::DeserializeOwned>(name: &str, value: &[u8]) -> Result<T, RegistryError> {
    serde_json::from_slice(value).map_err(|source| RegistryError::Decode {
        name: name.to_string(),
        source,
    })
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut s) = self.stream.take() {
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = s.write_all(&Command::Quit.encode());
        }
    }
}

/// The most names a [`RegistryHost`] holds: past it, `set` of a new name
/// is refused with `SERVER_ERROR`.
pub const HOST_MAX_NAMES: usize = 65_536;
/// How often a [`RegistryHost`]'s threads look whether it is dropped.
const HOST_TICK: Duration = Duration::from_millis(100);

/// A registry served by this process over TCP, for when there is no
/// memcached: the same protocol, so [`Registry`] (and any memcached
/// client) uses it alike. Names live as long as the host; dropping it
/// stops its threads and closes its connections.
#[derive(Debug)]
pub struct RegistryHost {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

type Names = Arc<Mutex<HashMap<String, (u32, Vec<u8>)>>>;

impl RegistryHost {
    /// Listens on `addr` (port 0: any free port; see [`addr`](Self::addr)).
    ///
    /// # Errors
    /// The listening socket's error.
    pub fn bind(addr: impl ToSocketAddrs) -> std::io::Result<RegistryHost> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let names: Names = Arc::default();
        let acceptor = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("mtrdma-registry".into())
                .spawn(move || accept(&listener, &names, &stop))?
        };
        Ok(RegistryHost {
            addr,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RegistryHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept(listener: &TcpListener, names: &Names, stop: &Arc<AtomicBool>) {
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        clients.retain(|c| !c.is_finished());
        match listener.accept() {
            Ok((stream, peer)) => {
                let (names, stop) = (names.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("mtrdma-registry-client".into())
                    .spawn(move || {
                        if let Err(e) = serve(stream, &names, &stop) {
                            tracing::debug!(%peer, error = %e, "registry client dropped");
                        }
                    });
                match spawned {
                    Ok(t) => clients.push(t),
                    Err(e) => tracing::warn!(%peer, error = %e, "no thread for a registry client"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(HOST_TICK / 10)
            }
            Err(e) => {
                tracing::warn!(error = %e, "registry: accept failed");
                std::thread::sleep(HOST_TICK);
            }
        }
    }
    for c in clients {
        let _ = c.join();
    }
}

/// Answers one client's commands until it quits, closes, breaks the
/// protocol (told with `CLIENT_ERROR`, then closed) or the host stops.
fn serve(mut stream: TcpStream, names: &Names, stop: &AtomicBool) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HOST_TICK))?;
    stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        loop {
            let (command, used) = match Command::parse(&buf) {
                Ok(Parsed::Incomplete) => break,
                Ok(Parsed::Done(c, used)) => (c, used),
                Err(e) => {
                    stream.write_all(&Reply::Error(format!("CLIENT_ERROR {e}")).encode())?;
                    return stream.shutdown(Shutdown::Both);
                }
            };
            buf.drain(..used);
            let (reply, noreply) = match command {
                Command::Quit => return stream.shutdown(Shutdown::Both),
                Command::Set {
                    key,
                    flags,
                    data,
                    noreply,
                } => {
                    let mut names = names.lock().unwrap_or_else(|p| p.into_inner());
                    let reply = if names.len() >= HOST_MAX_NAMES && !names.contains_key(&key) {
                        Reply::Error("SERVER_ERROR out of memory storing object".into())
                    } else {
                        names.insert(key, (flags, data));
                        Reply::Stored
                    };
                    (reply, noreply)
                }
                Command::Get(keys) => {
                    let names = names.lock().unwrap_or_else(|p| p.into_inner());
                    let values = keys
                        .into_iter()
                        .filter_map(|k| names.get(&k).map(|(f, v)| (k, *f, v.clone())))
                        .collect();
                    (Reply::Values(values), false)
                }
                Command::Delete { key, noreply } => {
                    let mut names = names.lock().unwrap_or_else(|p| p.into_inner());
                    let reply = if names.remove(&key).is_some() {
                        Reply::Deleted
                    } else {
                        Reply::NotFound
                    };
                    (reply, noreply)
                }
            };
            if !noreply {
                stream.write_all(&reply.encode())?;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_published_found_replaced_and_withdrawn() {
        let host = RegistryHost::bind("127.0.0.1:0").unwrap();
        let mut a = Registry::connect(&host.addr().to_string()).unwrap();
        let mut b = Registry::connect(&host.addr().to_string()).unwrap();
        assert_eq!(a.lookup("srv").unwrap(), None);
        a.publish("srv", b"one").unwrap();
        assert_eq!(b.lookup("srv").unwrap(), Some(b"one".to_vec()));
        b.publish("srv", b"two").unwrap();
        assert_eq!(a.lookup("srv").unwrap(), Some(b"two".to_vec()));
        assert!(a.remove("srv").unwrap());
        assert!(!a.remove("srv").unwrap());
        assert_eq!(b.lookup("srv").unwrap(), None);
    }

    #[test]
    fn a_waiting_client_gets_the_name_once_published_or_a_clear_timeout() {
        let host = RegistryHost::bind("127.0.0.1:0").unwrap();
        let addr = host.addr().to_string();
        let mut waiter = Registry::connect(&addr).unwrap();
        let err = waiter
            .wait_for("late", Duration::from_millis(30))
            .unwrap_err();
        assert!(
            matches!(err, RegistryError::NotPublished { ref name, waited } if name == "late" && waited >= Duration::from_millis(30)),
            "{err}"
        );
        let publisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            let mut r = Registry::connect(&addr).unwrap();
            r.publish_json("late", &[1u32, 2, 3]).unwrap();
        });
        let got: Vec<u32> = waiter
            .wait_for_json("late", Duration::from_secs(10))
            .unwrap();
        assert_eq!(got, [1, 2, 3]);
        publisher.join().unwrap();
        let err = waiter.lookup_json::<String>("late").unwrap_err();
        assert!(matches!(err, RegistryError::Decode { .. }), "{err}");
    }

    #[test]
    fn bad_names_and_values_are_refused_before_anything_is_sent() {
        let host = RegistryHost::bind("127.0.0.1:0").unwrap();
        let mut r = Registry::connect(&host.addr().to_string()).unwrap();
        for name in ["", "has space", "new\nline", &"x".repeat(251)] {
            assert!(
                matches!(r.publish(name, b"v"), Err(RegistryError::BadName(_))),
                "{name:?}"
            );
            assert!(matches!(r.lookup(name), Err(RegistryError::BadName(_))));
        }
        assert!(matches!(
            r.publish("big", &vec![0; wire::MAX_VALUE + 1]),
            Err(RegistryError::TooLarge(_))
        ));
        // The connection is still good.
        r.publish("ok", b"").unwrap();
        assert_eq!(r.lookup("ok").unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_registry_that_goes_away_is_an_error_and_the_client_reconnects_to_a_new_one() {
        let host = RegistryHost::bind("127.0.0.1:0").unwrap();
        let addr = host.addr();
        let mut r = Registry::connect(&addr.to_string()).unwrap();
        r.publish("a", b"1").unwrap();
        drop(host);
        let err = r.lookup("a").unwrap_err();
        assert!(
            matches!(
                err,
                RegistryError::Io { .. } | RegistryError::Connect { .. }
            ),
            "{err}"
        );
        // A registry on the same address again: the client carries on
        // (the old one's names are gone with it).
        let again = RegistryHost::bind(addr).unwrap();
        assert_eq!(r.lookup("a").unwrap(), None);
        drop(again);
        assert!(matches!(
            Registry::connect(&addr.to_string()),
            Err(RegistryError::Connect { .. })
        ));
    }

    #[test]
    fn a_server_that_speaks_nonsense_or_says_nothing_gives_a_clear_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = [0u8; 64];
            let _ = s.read(&mut line);
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n").unwrap();
            let (s2, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(500));
            drop((s, s2));
        });
        let mut r = Registry::connect_within(&addr, Duration::from_millis(200)).unwrap();
        let err = r.lookup("x").unwrap_err();
        assert!(matches!(err, RegistryError::Protocol { .. }), "{err}");
        let err = r.lookup("x").unwrap_err();
        assert!(matches!(err, RegistryError::TimedOut { .. }), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn the_host_tells_a_client_that_breaks_the_protocol_and_closes() {
        let host = RegistryHost::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(host.addr()).unwrap();
        s.write_all(b"set k 0 0 3\r\nabcd\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("CLIENT_ERROR"), "{out}");
    }
}
