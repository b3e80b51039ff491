//! What the device tests share (the root package's, and mtrdma-demo's,
//! which include this file): the test device, finding the examples that
//! `cargo test` builds, running a program, reading perftest-style result
//! rows, a memcached of a test's own, and the files of the tree the
//! checks of the book and the layout read.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The RDMA device the device tests run on.
pub(crate) fn device() -> String {
    std::env::var("MTRDMA_TEST_DEVICE")
        .expect("MTRDMA_TEST_DEVICE must name the RDMA device to test (e.g. rxe0)")
}

/// Runs `cmd` to its end; its output, or a panic with all it printed if
/// it failed.
pub(crate) fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("start the program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `target/<profile>/examples/<name>`, next to `target/<profile>/deps/`.
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples",
        path.display()
    );
    path
}

/// The numbers of the first row under perftest's `#bytes` header.
pub(crate) fn result_row(text: &str) -> Vec<f64> {
    let mut lines = text.lines().skip_while(|l| !l.contains("#bytes"));
    lines.next().expect("a #bytes header");
    let row = lines.next().expect("a result row");
    row.split_whitespace()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("not a number in {row:?}"))
        })
        .collect()
}

/// Whether a server listens on `addr` (a loopback address). A connection
/// from a port to itself is not one: a port from the ephemeral range,
/// with nothing listening on it yet, can be picked as the connecting
/// socket's own, and TCP then connects it to itself (a simultaneous open).
pub(crate) fn listening(addr: &str) -> bool {
    std::net::TcpStream::connect(addr)
        .is_ok_and(|s| matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l != p))
}

/// Whether process `pid` holds a socket listening on TCP `port` (IPv4 or
/// IPv6): the socket's inode in `/proc/net/tcp` or `tcp6` is one of the
/// process's open files.
fn listens_on(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    let table: String = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect();
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // local_address is the 2nd column, the state (0A: LISTEN) the
            // 4th, the inode the 10th.
            (cols.len() > 9 && cols[1].ends_with(&want) && cols[3] == "0A")
                .then(|| format!("socket:[{}]", cols[9]))
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
        })
    })
}

/// Waits until `child` listens on TCP `port` (a server's readiness,
/// rather than a sleep that may be too short on a busy emulated host);
/// `Err` with its status if it exits first. Panics, naming `what`, if it
/// does not listen within `secs` seconds.
fn listening_or_exited(
    child: &mut std::process::Child,
    port: u16,
    what: &str,
    secs: u64,
) -> Result<(), std::process::ExitStatus> {
    let start = std::time::Instant::now();
    while !listens_on(child.id(), port) {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(status);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(secs),
            "{what} does not listen on port {port} after {secs} s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// [`listening_or_exited`] within 30 s, for a server that must not exit:
/// panics if it does.
#[allow(dead_code)] // Not every test binary that shares this module waits so.
pub(crate) fn wait_listening(child: &mut std::process::Child, port: u16, what: &str) {
    if let Err(status) = listening_or_exited(child, port, what, 30) {
        panic!("{what} exited ({status}) before it listened on port {port}");
    }
}

/// Reads `out` to its end on a thread of its own (so the process never
/// writes to a closed pipe): sends each line that starts with `prefix` on
/// the channel, and hands back all of it when the output ends.
#[allow(dead_code)] // Not every test binary that shares this module reads so.
pub(crate) fn lines_starting(
    out: std::process::ChildStdout,
    prefix: &'static str,
) -> (
    std::sync::mpsc::Receiver<String>,
    std::thread::JoinHandle<String>,
) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let all = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with(prefix) {
                let _ = tx.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (rx, all)
}

/// A `memcached` of its own on 127.0.0.1, stopped when dropped. Debian's
/// package (`cargo xtask deps` installs it) is a test dependency: a test
/// that needs it fails, rather than passes, without it.
pub(crate) struct Memcached {
    child: std::process::Child,
    pub(crate) addr: String,
}

impl Memcached {
    /// Starts one on a free port and waits until it listens there. Tests
    /// run in parallel: another test's memcached can take the same free
    /// port first (this one then exits), and a test must not take that
    /// one for its own (its requests were reset when the other test
    /// ended), so it waits for its own process's socket, and tries
    /// another port if its memcached exits.
    pub(crate) fn start() -> Memcached {
        for _ in 0..8 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut cmd = std::process::Command::new("memcached");
            cmd.args(["-l", "127.0.0.1", "-U", "0", "-p"])
                .arg(port.to_string());
            // memcached refuses to run as root unless told which user to be.
            if rustix::process::geteuid().is_root() {
                cmd.args(["-u", "root"]);
            }
            let mut child = cmd
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("memcached is not installed: run `cargo xtask deps`");
            // An exit means the port was taken: another one.
            if listening_or_exited(&mut child, port, "memcached", 20).is_ok() {
                return Memcached {
                    child,
                    addr: format!("127.0.0.1:{port}"),
                };
            }
        }
        panic!("memcached exited at start on eight ports in turn");
    }

    /// Stops it now (as a crashed registry would vanish).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every file under `dir` (recursively) whose name ends in `.ext`.
pub(crate) fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files_under(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}
