//! A throwaway etcd cluster on loopback: three members of the `etcd`
//! program (Debian's etcd-server), each on ports the kernel picked, in a
//! directory of their own. For tests and trials of coordinators sharing
//! through etcd on one machine; members can be stopped and started again
//! to see what a coordinator does without them.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::commands::runtime;
use super::EtcdError;

/// How long a member has to answer after it starts.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// A running etcd cluster of three members on loopback (see the module
/// docs). Dropped, it stops them and removes its directory.
#[derive(Debug)]
pub struct LocalEtcd {
    dir: PathBuf,
    members: Vec<Option<Child>>,
    args: Vec<Vec<String>>,
    clients: Vec<String>,
}

/// The ports the members listen on: below the kernel's ephemeral ports
/// (`net.ipv4.ip_local_port_range`, 32768 and up by default), from which
/// every outgoing connection takes its local port, the members' own
/// dialling of each other included. A port picked there and let go could
/// be taken by one of those before its member binds it, and the member
/// would never answer. (The link demo's servers use 20,000 and up.)
const PORTS: std::ops::Range<u16> = 12_000..20_000;

/// The first of this host's ephemeral ports (the low end of
/// `net.ipv4.ip_local_port_range`; Linux's default, 32768, where it
/// cannot be read). Outgoing connections take their local ports from there
/// up, so a server that must find its port still free when it binds it
/// listens below it, as [`LocalEtcd`]'s members do.
pub fn first_ephemeral_port() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port of [`PORTS`] free on loopback now (bound and let go), each call
/// another: from a place set by the process id, so that clusters of other
/// processes start elsewhere.
fn free_port() -> Result<u16, EtcdError> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static TRIED: AtomicU16 = AtomicU16::new(0);
    let span = PORTS.end - PORTS.start;
    let from = (std::process::id() % u32::from(span)) as u16;
    for _ in 0..span {
        let k = TRIED.fetch_add(1, Ordering::Relaxed) % span;
        let port = PORTS.start + (from + k) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(EtcdError::Config(format!(
        "no free port on loopback in {}..{} for etcd's members",
        PORTS.start, PORTS.end
    )))
}

impl LocalEtcd {
    /// Starts three members under `dir` (created; what was there is
    /// removed) and waits until each answers. `tag` names the cluster.
    ///
    /// # Errors
    /// [`EtcdError::Thread`] when `etcd` cannot be run (it says to install
    /// it), [`EtcdError::Config`] when a member does not answer in 30 s.
    pub fn start(dir: &Path, tag: &str) -> Result<LocalEtcd, EtcdError> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let mut clients = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..3 {
            clients.push(format!("http://127.0.0.1:{}", free_port()?));
            peers.push(format!("http://127.0.0.1:{}", free_port()?));
        }
        let initial: Vec<String> = peers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}={p}"))
            .collect();
        let args = (0..3)
            .map(|i| {
                let data = dir.join(format!("m{i}")).display().to_string();
                let pairs = [
                    ("--name", format!("m{i}")),
                    ("--data-dir", data),
                    ("--listen-client-urls", clients[i].clone()),
                    ("--advertise-client-urls", clients[i].clone()),
                    ("--listen-peer-urls", peers[i].clone()),
                    ("--initial-advertise-peer-urls", peers[i].clone()),
                    ("--initial-cluster", initial.join(",")),
                    ("--initial-cluster-token", tag.to_string()),
                    ("--initial-cluster-state", "new".into()),
                    // Quick elections on loopback: a stopped leader is
                    // replaced within about a second.
                    ("--heartbeat-interval", "50".into()),
                    ("--election-timeout", "500".into()),
                ];
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k.to_string(), v])
                    .collect()
            })
            .collect();
        let mut etcd = LocalEtcd {
            dir: dir.to_path_buf(),
            members: vec![None, None, None],
            args,
            clients,
        };
        for i in 0..3 {
            etcd.run(i)?;
        }
        for i in 0..3 {
            etcd.wait_answering(i)?;
        }
        Ok(etcd)
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.clients.clone()
    }

    /// Where the members keep their data and logs (`m0.log` ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn run(&mut self, i: usize) -> Result<(), EtcdError> {
        let log = std::fs::File::create(self.dir.join(format!("m{i}.log")))?;
        let child = Command::new("etcd")
            .args(&self.args[i])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "etcd did not start ({e}); install Debian's etcd-server (cargo xtask deps)"
                    ),
                )
            })?;
        self.members[i] = Some(child);
        Ok(())
    }

    /// Waits until member `i` answers a status request.
    fn wait_answering(&self, i: usize) -> Result<(), EtcdError> {
        let endpoint = [self.clients[i].clone()];
        let until = Instant::now() + START_PATIENCE;
        let rt = runtime()?;
        loop {
            let answered = rt.block_on(async {
                let mut client =
                    etcd_client::Client::connect(&endpoint, Some(super::options())).await?;
                client.status().await
            });
            if answered.is_ok() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(EtcdError::Config(format!(
                    "etcd member {i} did not answer in {START_PATIENCE:?}; see {}",
                    self.dir.join(format!("m{i}.log")).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops member `i` at once (SIGKILL), as a crash would.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.members.get_mut(i).and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `members` again on their data (those running are stopped
    /// first), then waits until each answers: a member serves once a
    /// majority of the cluster runs, so members stopped together are
    /// started again together.
    ///
    /// # Errors
    /// As [`LocalEtcd::start`].
    pub fn resume(&mut self, members: &[usize]) -> Result<(), EtcdError> {
        for &i in members {
            self.stop(i);
            self.run(i)?;
        }
        for &i in members {
            self.wait_answering(i)?;
        }
        Ok(())
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_listen_below_the_ephemeral_ports_on_ports_free_when_picked() {
        let low = first_ephemeral_port();
        assert!(PORTS.end <= low, "ephemeral ports from {low}");
        let a = free_port().unwrap();
        // Held: the next pick passes it over.
        let _held = TcpListener::bind(("127.0.0.1", a)).unwrap();
        let b = free_port().unwrap();
        assert!(PORTS.contains(&a) && PORTS.contains(&b));
        assert_ne!(a, b);
        assert!(TcpListener::bind(("127.0.0.1", b)).is_ok(), "{b} is free");
    }
}
