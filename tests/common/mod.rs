//! What the root package's device tests share: finding the examples that
//! `cargo test` builds, reading perftest-style result rows, and a
//! memcached of a test's own.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

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

/// A `memcached` of its own on 127.0.0.1, stopped when dropped. Debian's
/// package (`cargo xtask deps` installs it) is a test dependency: a test
/// that needs it fails, rather than passes, without it.
pub(crate) struct Memcached {
    child: std::process::Child,
    pub(crate) addr: String,
}

impl Memcached {
    pub(crate) fn start() -> Memcached {
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
            .spawn()
            .expect("memcached is not installed: run `cargo xtask deps`");
        let addr = format!("127.0.0.1:{port}");
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("memcached exited at start: {status}");
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "memcached does not listen on {addr} after 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Memcached { child, addr }
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
