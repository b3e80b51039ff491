//! `examples/rpc` on a real device: one UD server queue pair answering
//! many clients, found through the registry (the server's own, or a real
//! memcached), on both paths.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{device, example, Memcached};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until something listens on `addr` (the server's own registry).
fn wait_for_registry(addr: &str) {
    let start = std::time::Instant::now();
    while !common::listening(addr) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no registry on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rpc(args: &[&str]) -> Command {
    let mut cmd = Command::new(example("rpc"));
    cmd.args(args)
        .args(["--device", &device()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(child: Child, what: &str) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("waiting for rpc");
    let (out, err) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(status.success(), "{what} failed ({status}):\n{out}{err}");
    out
}

/// The number after `word` on the line starting with `prefix`.
fn figure(out: &str, prefix: &str, word: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix) && l.contains(word))
        .unwrap_or_else(|| panic!("no {prefix:?} line with {word:?} in:\n{out}"));
    let rest = &line[line.find(word).unwrap() + word.len()..];
    rest.split(|c: char| c.is_whitespace() || c == ';' || c == ':')
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {word:?} in {line:?}"))
}

/// Serves `clients` clients split over `processes` client processes on
/// one server queue pair (`asynchronous`: as one task on tokio); checks
/// that every request was answered to the client that sent it.
fn serve_and_ask(
    registry: Option<&str>,
    path: &str,
    clients: u32,
    processes: u32,
    asynchronous: bool,
) {
    let addr;
    let mut server = match registry {
        Some(r) => {
            addr = r.to_string();
            rpc(&["server", "--registry", r])
        }
        None => {
            addr = format!("127.0.0.1:{}", free_port());
            rpc(&["server", "--host-registry", &addr])
        }
    };
    let name = format!("t{}", free_port());
    let clients_arg = clients.to_string();
    let server = server
        .args(["--name", &name, "--clients", &clients_arg, "--path", path])
        .args(["--threads", "1", "--seconds", "120"])
        .args(asynchronous.then_some("--async"))
        .spawn()
        .expect("starting the server");
    // The hosted registry listens once the server is up.
    wait_for_registry(&addr);
    let each = clients / processes;
    let askers: Vec<Child> = (0..processes)
        .map(|p| {
            let (first, n) = ((p * each).to_string(), each.to_string());
            rpc(&[
                "client",
                "--registry",
                &addr,
                "--name",
                &name,
                "--path",
                path,
            ])
            .args(["--first", &first, "--clients", &n, "--seconds", "2"])
            .spawn()
            .expect("starting a client")
        })
        .collect();
    let mut answered = 0.0;
    for (p, c) in askers.into_iter().enumerate() {
        let out = finish(c, &format!("client process {p}"));
        // "rpc client: N requests answered in S s: ..."
        answered += out
            .lines()
            .find(|l| l.contains("requests answered"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|w| w.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no requests line in:\n{out}"));
        assert_eq!(figure(&out, "rpc client:", "lost"), 0.0, "{out}");
        assert!(figure(&out, "rpc client: latency", "p99") > 0.0, "{out}");
    }
    let out = finish(server, "the server");
    assert!(
        out.contains(&format!("{clients} of {clients} clients said bye")),
        "{out}"
    );
    assert_eq!(
        figure(&out, "rpc server: answered", "strangers"),
        0.0,
        "{out}"
    );
    // The shared receive queue ran low and was refilled from its reserve
    // (every request's buffer went back there, from the blocking server
    // and from the async one alike) without losing a request.
    assert!(
        figure(&out, "rpc server: answered", "refilled") >= 1.0,
        "{out}"
    );
    // Every answered request, plus each client's warm-up, reached the one
    // server queue pair.
    let served = figure(&out, "rpc server:", "answered");
    assert!(
        served >= answered + 20.0 * f64::from(clients),
        "{served} < {answered}\n{out}"
    );
    assert!(answered > 0.0);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_server_queue_pair_answers_eight_clients_through_its_own_registry() {
    serve_and_ask(None, "raw", 8, 1, false);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_async_server_task_answers_sixty_four_clients_and_loses_none() {
    serve_and_ask(None, "raw", 64, 4, true);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_blocking_server_queue_pair_answers_sixty_four_clients_and_hears_every_bye() {
    // Its shared receive queue is refilled only at its limit event, and
    // 64 clients say bye at once: each bye is answered, and sent again
    // while it is not.
    serve_and_ask(None, "raw", 64, 4, false);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn an_async_scheduled_server_answers_its_clients() {
    serve_and_ask(None, "mtrdma", 8, 1, true);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn clients_in_two_processes_find_a_scheduled_server_through_memcached() {
    let memcached = Memcached::start();
    serve_and_ask(Some(&memcached.addr), "mtrdma", 8, 2, false);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn the_server_answers_only_the_queue_pairs_its_clients_published() {
    let addr = format!("127.0.0.1:{}", free_port());
    let name = format!("s{}", free_port());
    let server = rpc(&["server", "--host-registry", &addr, "--name", &name])
        .args(["--clients", "1", "--seconds", "120"])
        .spawn()
        .expect("starting the server");
    wait_for_registry(&addr);
    // Client 1 publishes, but the server waits for client 0 alone.
    let stranger = rpc(&["client", "--registry", &addr, "--name", &name])
        .args(["--first", "1", "--clients", "1", "--wait", "4"])
        .spawn()
        .expect("starting the stranger");
    let known = rpc(&["client", "--registry", &addr, "--name", &name])
        .args(["--first", "0", "--clients", "1", "--seconds", "2"])
        .spawn()
        .expect("starting the client");
    let out = finish(known, "the client");
    assert_eq!(figure(&out, "rpc client:", "lost"), 0.0, "{out}");
    let Output { status, stderr, .. } = stranger.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&stderr);
    assert!(
        !status.success() && err.contains("no answer"),
        "{status}: {err}"
    );
    let out = finish(server, "the server");
    assert!(
        figure(&out, "rpc server: answered", "strangers") >= 1.0,
        "{out}"
    );
}
