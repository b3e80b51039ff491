//! `remote_memory`: two memory nodes and a pager on one device
//! (the one MTRDMA_TEST_DEVICE names), on both paths, and with a node
//! killed in the middle of the run (ignored on a plain `cargo test`; run
//! them in the SoftRoCE VM). The argument checks run on the host, with no
//! device: a refused working set is refused before the device is opened.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

// Not every test file uses all of what the tests share.
mod common;
use common::{device, REMOTE_MEMORY};

/// A memory node on a free port, killed when dropped.
struct Node {
    child: Child,
    port: u16,
}

impl Node {
    /// Starts a node of `pages` pages (serving one pager after another
    /// if `forever`) and waits for its ready line.
    fn start(pages: u64, forever: bool) -> Node {
        let mut child = Command::new(REMOTE_MEMORY)
            .args(["node", "--device", &device(), "-p", "0", "--pages"])
            .arg(pages.to_string())
            .args(forever.then_some("--forever"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a memory node");
        let mut lines = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        lines.read_line(&mut line).expect("the node's first line");
        let port = line
            .strip_prefix("node: ready port ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("the node did not say it was ready: {line:?}\n{err}");
        };
        assert_eq!(
            line.trim(),
            format!("node: ready port {port} pages {pages}")
        );
        // Later lines go nowhere; the pipe's buffer holds the few there are.
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        Node { child, port }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(args: &[String]) -> Command {
    let mut cmd = Command::new(REMOTE_MEMORY);
    cmd.arg("client").args(args);
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The figure on the result block's `  NAME: value` line.
fn figure(stdout: &str, name: &str) -> f64 {
    let prefix = format!("  {name}: ");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{name}` in the result:\n{stdout}"))
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("`{name}` is not a number:\n{stdout}"))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A client's arguments for a working set of 1024 pages, 256 cached, on
/// the test device, lent by nodes `a` and `b`.
fn two_nodes(a: &Node, b: &Node) -> Vec<String> {
    strings(&[
        "--device",
        &device(),
        "--node",
        &a.addr(),
        "--node",
        &b.addr(),
        "--working-set",
        "1024",
        "--cache",
        "256",
    ])
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_pager_pages_in_and_out_and_verifies_every_page_on_both_paths() {
    pages_in_and_out_on_both_paths(1);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_pager_pages_clusters_of_8_and_verifies_every_page_on_both_paths() {
    pages_in_and_out_on_both_paths(8);
}

/// Two nodes and the pager with clusters of `cluster` pages, on both
/// paths: pages go in and out, every page read in verifies, and the CSV
/// row says the same; a READ brings a whole cluster.
fn pages_in_and_out_on_both_paths(cluster: u64) {
    let (a, b) = (Node::start(512, true), Node::start(512, true));
    for path in ["raw", "mtrdma"] {
        let csv = std::env::temp_dir().join(format!(
            "mtrdma-remote-memory-{}-{path}-{cluster}.csv",
            std::process::id()
        ));
        let mut args = two_nodes(&a, &b);
        args.extend(strings(&["--seconds", "3", "--path", path, "--csv"]));
        args.push(csv.display().to_string());
        args.extend(strings(&["--cluster", &cluster.to_string()]));
        let out = client(&args).output().expect("run the pager");
        let (stdout, stderr) = text(&out);
        println!("{path}, cluster {cluster}:\n{stdout}");
        assert!(
            out.status.success(),
            "{path}: {}\n{stdout}\n{stderr}",
            out.status
        );
        let page_ins = figure(&stdout, "page-ins");
        assert!(page_ins > 0.0, "{path}: page-ins\n{stdout}");
        assert!(
            figure(&stdout, "page-outs") > 0.0,
            "{path}: page-outs\n{stdout}"
        );
        assert_eq!(figure(&stdout, "verified"), page_ins, "{path}:\n{stdout}");
        let requests = figure(&stdout, "page-in requests");
        assert!(requests > 0.0, "{path}:\n{stdout}");
        assert_eq!(requests * cluster as f64, page_ins, "{path}:\n{stdout}");
        assert_eq!(figure(&stdout, "corrupt"), 0.0, "{path}:\n{stdout}");
        assert_eq!(figure(&stdout, "lost pages"), 0.0, "{path}:\n{stdout}");
        assert!(!stdout.contains("lost:"), "{path}:\n{stdout}");
        assert!(figure(&stdout, "MB/s") > 0.0, "{path}:\n{stdout}");
        // The CSV row carries the same figures.
        let table = std::fs::read_to_string(&csv).expect("the CSV file");
        let _ = std::fs::remove_file(&csv);
        let mut rows = table.lines();
        let header: Vec<&str> = rows.next().expect("a header").split(',').collect();
        let row: Vec<&str> = rows.next().expect("a row").split(',').collect();
        assert_eq!(header.len(), row.len(), "{table}");
        let col = |name: &str| row[header.iter().position(|h| *h == name).expect(name)];
        assert_eq!(col("path"), path);
        assert_eq!(col("page_ins").parse::<f64>().ok(), Some(page_ins));
        assert_eq!(col("corrupt"), "0");
        assert_eq!(col("page_in_requests").parse::<f64>().ok(), Some(requests));
        assert_eq!(col("cluster"), cluster.to_string());
    }
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_killed_node_loses_its_pages_and_the_pager_goes_on_with_the_other() {
    a_killed_node_loses_its_pages(1);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_killed_node_loses_its_clusters_and_the_pager_goes_on_with_the_other() {
    a_killed_node_loses_its_pages(8);
}

/// Node 1 of two killed during the run, with clusters of `cluster`
/// pages: its 512 pages are lost, nothing read is corrupt, and the pager
/// goes on with node 0's.
fn a_killed_node_loses_its_pages(cluster: u64) {
    let a = Node::start(512, false);
    let mut b = Node::start(512, false);
    let mut args = two_nodes(&a, &b);
    args.extend(strings(&[
        "--seconds",
        "6",
        "--cluster",
        &cluster.to_string(),
    ]));
    let mut pager = client(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the pager");
    // Node 1 is killed once the pager has filled both nodes and begun its
    // timed run (it says so on its "initial fill" line): the fill takes
    // longer in a debug build and on a busy host.
    let (began, stdout) =
        common::lines_starting(pager.stdout.take().expect("piped"), "initial fill:");
    began
        .recv_timeout(Duration::from_secs(120))
        .expect("the pager filled its nodes within 120 s");
    b.child.kill().expect("SIGKILL node 1");
    let _ = b.child.wait();
    let out = pager.wait_with_output().expect("the pager's output");
    let stdout = stdout.join().expect("the pager's stdout");
    let (_, stderr) = text(&out);
    println!("{stdout}");
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let lost: Vec<&str> = stdout.lines().filter(|l| l.starts_with("lost:")).collect();
    assert_eq!(lost.len(), 1, "one node lost, once:\n{stdout}");
    assert!(
        lost[0].starts_with(&format!("lost: 512 pages on node {} (", b.addr())),
        "node 1's 512 pages:\n{stdout}"
    );
    assert_eq!(figure(&stdout, "lost pages"), 512.0, "{stdout}");
    assert!(figure(&stdout, "lost accesses") > 0.0, "{stdout}");
    assert_eq!(figure(&stdout, "corrupt"), 0.0, "{stdout}\n{stderr}");
    assert_eq!(
        figure(&stdout, "verified"),
        figure(&stdout, "page-ins"),
        "{stdout}"
    );
    assert!(
        figure(&stdout, "page-ins after first loss") > 0.0,
        "the pager goes on with node 0's pages:\n{stdout}"
    );
}

/// The pager's own command line checks, no device needed.
fn refused(args: &[&str], says: &str) {
    let out = client(&strings(args)).output().expect("run the pager");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains(says),
        "{args:?}: expected {says:?} in:\n{stderr}"
    );
}

#[test]
fn the_pager_refuses_a_cache_as_large_as_the_working_set() {
    refused(
        &[
            "--node",
            "127.0.0.1:1",
            "--working-set",
            "64",
            "--cache",
            "64",
            "--seconds",
            "1",
        ],
        "the cache (64 pages) must be smaller than the working set (64 pages)",
    );
}

#[test]
fn the_pager_refuses_to_run_without_a_node() {
    refused(
        &["--working-set", "64", "--cache", "8", "--seconds", "1"],
        "give at least one memory node (--node HOST:PORT)",
    );
}

#[test]
fn the_pager_refuses_a_working_set_larger_than_the_nodes() {
    // A stand-in node that greets with its size (4 pages) and waits for
    // the pager to hang up: the check comes before any device is opened.
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("the pager connects");
        s.write_all(b"mtrdma-remote-memory/1 pages 4\n")
            .expect("greet");
        let _ = s.read(&mut [0u8; 64]);
    });
    let node = format!("127.0.0.1:{port}");
    refused(
        &[
            "--node",
            &node,
            "--working-set",
            "16",
            "--cache",
            "2",
            "--seconds",
            "1",
        ],
        &format!("the working set of 16 pages needs 16 pages on node {node}, which lends only 4"),
    );
    fake.join().expect("the stand-in node");
}
