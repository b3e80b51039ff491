//! Shared receive queues and shared completion queues on a real device
//! (loopback on the device named by MTRDMA_TEST_DEVICE). Ignored on a
//! plain `cargo test`; `cargo xtask test` runs them in the SoftRoCE VM.

mod common;

use common::{device_name, device_pd};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mtrdma_verbs::PollCompletions;
use mtrdma_verbs::{
    Access, Completion, Context, Error, MemoryRegion, Opcode, ProtectionDomain, QueuePair, SendOp,
    SharedCompletion, SharedCompletionQueue, SharedReceiveQueue, WcStatus,
};

/// Clients of the many-clients test, and requests each sends.
const CLIENTS: usize = 64;
const REQUESTS: u64 = 25;
/// Bytes of a request and of an answer: client (4), sequence (8), kind (4).
const MSG: usize = 16;

fn message(mr: &mut MemoryRegion, client: u32, seq: u64, kind: u32) {
    let mut m = [0u8; MSG];
    m[0..4].copy_from_slice(&client.to_le_bytes());
    m[4..12].copy_from_slice(&seq.to_le_bytes());
    m[12..16].copy_from_slice(&kind.to_le_bytes());
    mr.write_at(0, &m).unwrap();
}

fn read_message(mr: &MemoryRegion) -> (u32, u64, u32) {
    let mut m = [0u8; MSG];
    mr.read_into(0, &mut m).unwrap();
    (
        u32::from_le_bytes(m[0..4].try_into().unwrap()),
        u64::from_le_bytes(m[4..12].try_into().unwrap()),
        u32::from_le_bytes(m[12..16].try_into().unwrap()),
    )
}

const REQUEST: u32 = 1;
const ANSWER: u32 = 2;

/// What the server thread saw.
#[derive(Debug, Default)]
struct Served {
    answered: u64,
    per_client: HashMap<u32, u64>,
    /// Receive buffers back in the test's hands at the end (in the SRQ,
    /// its reserve, or the answers' pool).
    strays: usize,
}

/// One client: a plain queue pair with a completion queue of its own (the
/// per-queue-pair API, unchanged next to the shared one).
struct Client {
    qp: QueuePair,
    send: Option<MemoryRegion>,
    seq: u64,
    waiting: bool,
    done: u64,
}

/// A shared receive queue on `pd` of `max_wr` receives, its limit at
/// `limit`, for UD queue pairs if `datagrams` (else RC).
fn srq_of(pd: &ProtectionDomain, max_wr: u32, limit: u32, datagrams: bool) -> SharedReceiveQueue {
    pd.shared_receive_queue()
        .max_wr(max_wr)
        .limit(limit)
        .datagrams(datagrams)
        .build()
        .unwrap()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn one_thread_answers_64_rc_clients_through_one_srq_one_cq_and_one_channel() {
    let (ctx, pd) = device_pd();
    // 256 receives, refilled from the reserve when fewer than 96 are
    // posted: at most 64 requests are ever in flight, so the queue never
    // runs dry between the event and the refill.
    let srq = srq_of(&pd, 256, 96, false);
    for i in 0..256 {
        srq.post_recv(pd.allocate(MSG, Access::LOCAL).unwrap(), 0..MSG, i)
            .unwrap();
    }
    assert_eq!(srq.posted(), 256);
    let mut server = ctx
        .shared_completion_queue()
        .entries(CLIENTS as u32 * 4 + 256)
        .build()
        .unwrap();
    let mut clients = Vec::new();
    let mut qpn_of = HashMap::new();
    for i in 0..CLIENTS {
        let mut prepared = pd
            .queue_pair()
            .max_send_wr(2)
            .max_recv_wr(2)
            .build()
            .unwrap();
        prepared
            .post_recv(pd.allocate(MSG, Access::LOCAL).unwrap(), 0..MSG, 0)
            .unwrap();
        let (qpn, qp) = common::connect_on(
            &mut server,
            pd.queue_pair().srq(&srq).max_send_wr(4),
            prepared,
        );
        qpn_of.insert(i as u32, qpn);
        clients.push(Client {
            qp,
            send: Some(pd.allocate(MSG, Access::LOCAL).unwrap()),
            seq: 0,
            waiting: false,
            done: 0,
        });
    }
    assert_eq!(server.len(), CLIENTS);
    // A receive cannot go to a queue pair that receives from the SRQ.
    let some = *qpn_of.values().next().unwrap();
    let refused = server
        .post_recv(some, pd.allocate(MSG, Access::LOCAL).unwrap(), 0..MSG, 0)
        .unwrap_err();
    assert!(
        matches!(*refused.error, Error::ReceivesFromSrq),
        "{refused}"
    );

    let total = CLIENTS as u64 * REQUESTS;
    let deadline = Instant::now() + Duration::from_secs(180);
    let server_srq = srq.clone();
    let server_thread = std::thread::spawn(move || {
        let srq = server_srq;
        let pd = srq.pd().clone();
        let mut served = Served::default();
        // Two answer buffers a client: an answer's send completion may come
        // after the client has its answer and asks again.
        let mut pool: Vec<MemoryRegion> = (0..2 * CLIENTS)
            .map(|_| pd.allocate(MSG, Access::LOCAL).unwrap())
            .collect();
        let mut out: Vec<SharedCompletion> = Vec::new();
        let mut sends_out = 0u64;
        while served.answered < total || sends_out > 0 {
            assert!(
                Instant::now() < deadline,
                "server: {} of {total} answered",
                served.answered
            );
            server.poll_wait(&mut out, Duration::from_secs(1)).unwrap();
            for SharedCompletion { qpn, completion: c } in out.drain(..) {
                assert_eq!(c.status, WcStatus::Success, "queue pair {qpn}: {c:?}");
                match c.opcode {
                    Opcode::Send => {
                        sends_out -= 1;
                        pool.push(c.region);
                    }
                    Opcode::Recv => {
                        assert_eq!(c.byte_len as usize, MSG);
                        let (client, seq, kind) = read_message(&c.region);
                        assert_eq!(kind, REQUEST);
                        // The request came on the client's own connection.
                        assert_eq!(Some(&qpn), qpn_of.get(&client), "client {client}");
                        *served.per_client.entry(client).or_default() += 1;
                        // Back to the reserve: posted with the others on
                        // the next limit event.
                        srq.stock(c.region, 0..MSG, c.context).unwrap();
                        let mut answer = pool.pop().expect("two answer buffers a client");
                        message(&mut answer, client, seq, ANSWER);
                        server
                            .post_send(qpn, SendOp::Send, answer, 0..MSG, 0)
                            .unwrap();
                        sends_out += 1;
                        served.answered += 1;
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
        served.strays = pool.len();
        // Every connection leaves with nothing outstanding.
        let qpns: Vec<u32> = server.qpns().collect();
        for qpn in qpns {
            assert_eq!(server.in_flight(qpn), Some((0, 0)));
            let left: Vec<Completion> = server.remove(qpn).unwrap();
            assert!(left.is_empty(), "{left:?}");
        }
        assert!(server.is_empty());
        served
    });

    // The clients, in this thread: each keeps one request out.
    let mut done = Vec::new();
    let mut finished = 0;
    while finished < CLIENTS {
        assert!(Instant::now() < deadline, "clients: {finished} finished");
        if server_thread.is_finished() {
            break;
        }
        for (i, cl) in clients.iter_mut().enumerate() {
            if !cl.waiting && cl.done < REQUESTS {
                if let Some(mut mr) = cl.send.take() {
                    cl.seq += 1;
                    message(&mut mr, i as u32, cl.seq, REQUEST);
                    cl.qp.post_send(SendOp::Send, mr, 0..MSG, 1).unwrap();
                    cl.waiting = true;
                }
            }
            cl.qp.poll(&mut done).unwrap();
            for c in done.drain(..) {
                assert_eq!(c.status, WcStatus::Success, "client {i}: {c:?}");
                match c.opcode {
                    Opcode::Send => cl.send = Some(c.region),
                    Opcode::Recv => {
                        let (client, seq, kind) = read_message(&c.region);
                        assert_eq!((client, seq, kind), (i as u32, cl.seq, ANSWER));
                        cl.qp.post_recv(c.region, 0..MSG, 0).unwrap();
                        cl.waiting = false;
                        cl.done += 1;
                        if cl.done == REQUESTS {
                            finished += 1;
                        }
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
    }
    let served = server_thread.join().expect("the server thread");
    assert_eq!(served.answered, total, "every request answered, once");
    assert_eq!(served.per_client.len(), CLIENTS);
    assert!(served.per_client.values().all(|&n| n == REQUESTS));
    assert_eq!(finished, CLIENTS, "every client got all its answers");
    assert_eq!(served.strays, 2 * CLIENTS, "every answer buffer came back");
    // No receive lost: every buffer is posted or in the reserve.
    assert_eq!(srq.posted() as usize + srq.reserved(), 256);
    assert!(
        srq.limit_events() >= 1 && srq.refills() >= 1,
        "refilled on the limit event: {} events, {} refills",
        srq.limit_events(),
        srq.refills()
    );
    println!(
        "{total} requests from {CLIENTS} clients answered by one thread; SRQ limit events {}, refills {}",
        srq.limit_events(),
        srq.refills()
    );
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn a_queue_pair_with_its_own_cq_takes_receives_from_the_srq_and_gives_them_back_on_drop() {
    let (ctx, pd) = device_pd();
    let srq = srq_of(&pd, 8, 0, false);
    let a = pd.queue_pair().srq(&srq).build().unwrap();
    let b = pd.queue_pair().build().unwrap();
    let (mut a, mut b) = common::connect(a, b);
    for i in 0..4 {
        let mut mr = pd.allocate(64, Access::LOCAL).unwrap();
        mr.write_at(0, &[0xee; 64]).unwrap();
        srq.stock(mr, 8..40, 100 + i).unwrap();
    }
    assert_eq!(
        srq.posted(),
        4,
        "no limit: stocked receives are posted at once"
    );
    let mut msg = pd.allocate(32, Access::LOCAL).unwrap();
    msg.write_at(0, &[7; 32]).unwrap();
    // (No immediate data on iWARP.)
    let imm = (!ctx.is_iwarp()).then_some(9);
    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    b.post_send(op, msg, 0..20, 5).unwrap();
    let mut got = Vec::new();
    let start = Instant::now();
    while got.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10));
        a.poll(&mut got).unwrap();
    }
    let c = got.pop().unwrap();
    assert_eq!(
        (c.status, c.opcode, c.byte_len, c.imm),
        (WcStatus::Success, Opcode::Recv, 20, imm)
    );
    assert!((100..104).contains(&c.context));
    let bytes = c.region.read();
    assert!(
        bytes[8..28].iter().all(|&b| b == 7),
        "landed at the range's start"
    );
    assert!(bytes[28..].iter().all(|&b| b == 0xee));
    assert_eq!(srq.posted(), 3);
    assert_eq!(
        a.in_flight(),
        (0, 0),
        "the SRQ's receives are counted there"
    );
    // Dropping the queue pair leaves the SRQ's receives in the SRQ.
    drop(a);
    assert_eq!(srq.posted(), 3);
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn ud_queue_pairs_share_one_srq_and_each_receive_names_its_source() {
    let (_ctx, pd) = device_pd();
    let srq = srq_of(&pd, 16, 4, true);
    let mut s1 = pd
        .ud_queue_pair()
        .srq(&srq)
        .completion_events(true)
        .build()
        .unwrap();
    let mut s2 = pd
        .ud_queue_pair()
        .srq(&srq)
        .completion_events(true)
        .build()
        .unwrap();
    let mtu = s1.mtu() as usize;
    for i in 0..16 {
        srq.post_recv(pd.allocate(mtu, Access::LOCAL).unwrap(), 0..mtu, i)
            .unwrap();
    }
    let refused = s1
        .post_recv(pd.allocate(mtu, Access::LOCAL).unwrap(), 0..mtu, 0)
        .unwrap_err();
    assert!(matches!(*refused.error, Error::ReceivesFromSrq));
    let mut client = pd.ud_queue_pair().build().unwrap();
    for (k, server) in [s1.endpoint(), s2.endpoint()].iter().enumerate() {
        let ah = client.address_handle(server).unwrap();
        for j in 0..3u8 {
            let mut mr = pd.allocate(8, Access::LOCAL).unwrap();
            mr.write_at(0, &[k as u8 * 10 + j; 8]).unwrap();
            client
                .post_send(&ah, server.qpn, server.qkey, mr, 0..8, 0)
                .unwrap();
        }
    }
    let mut got = Vec::new();
    for (k, s) in [&mut s1, &mut s2].into_iter().enumerate() {
        let mut mine = Vec::new();
        let start = Instant::now();
        while mine.len() < 3 {
            assert!(start.elapsed() < Duration::from_secs(10));
            s.poll_wait(&mut mine, Duration::from_secs(1)).unwrap();
        }
        for c in &mine {
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (WcStatus::Success, Opcode::Recv, 8)
            );
            let src = c.source.expect("a receive names its source");
            assert_eq!(src.qpn, client.endpoint().qpn);
            assert_eq!(src.gid.map(|g| g.0), Some(client.endpoint().gid));
            let b = c.region.read();
            assert!(b[..8].iter().all(|&x| x / 10 == k as u8), "{:?}", &b[..8]);
        }
        got.extend(mine);
    }
    assert_eq!(srq.posted(), 10);
    // Given back through the reserve: 6 taken leaves 10 posted, above the
    // limit of 4, so they wait there.
    for c in got {
        srq.stock(c.region, 0..mtu, c.context).unwrap();
    }
    assert_eq!((srq.posted(), srq.reserved()), (10, 6));
    assert_eq!(srq.refill().unwrap(), 6);
    assert_eq!((srq.posted(), srq.reserved()), (16, 0));
}

/// A SEND of 8 bytes the shared completion queue refuses for `qpn`.
fn send_refused(
    server: &mut SharedCompletionQueue,
    pd: &ProtectionDomain,
    qpn: u32,
) -> mtrdma_verbs::PostError {
    let region = pd.allocate(8, Access::LOCAL).unwrap();
    server
        .post_send(qpn, SendOp::Send, region, 0..8, 0)
        .unwrap_err()
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn removing_a_queue_pair_hands_back_its_flushed_requests() {
    let (ctx, pd) = device_pd();
    let mut server = ctx.shared_completion_queue().entries(64).build().unwrap();
    let me = server
        .prepare(pd.queue_pair().max_send_wr(4).max_recv_wr(4))
        .unwrap();
    for i in 0..3 {
        server
            .post_recv(me.qpn, pd.allocate(32, Access::LOCAL).unwrap(), 0..32, i)
            .unwrap();
    }
    assert_eq!(server.in_flight(me.qpn), Some((0, 3)));
    let refused = send_refused(&mut server, &pd, me.qpn);
    assert!(
        matches!(*refused.error, Error::NotConnected { .. }),
        "{refused}"
    );
    let peer = pd.queue_pair().build().unwrap();
    server.connect(me.qpn, &peer.endpoint()).unwrap();
    let mut peer = peer.connect(&me).unwrap();
    let mut mr = pd.allocate(8, Access::LOCAL).unwrap();
    mr.write_at(0, b"12345678").unwrap();
    peer.post_send(SendOp::Send, mr, 0..8, 0).unwrap();
    let mut out = Vec::new();
    let start = Instant::now();
    while out.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10));
        server.poll_wait(&mut out, Duration::from_secs(1)).unwrap();
    }
    assert_eq!(out[0].qpn, me.qpn);
    assert_eq!(&out[0].completion.region.read()[..8], b"12345678");
    let left = server.remove(me.qpn).unwrap();
    assert_eq!(left.len(), 2, "the two receives still posted come back");
    assert!(left.iter().all(|c| c.status == WcStatus::Flushed));
    assert!(server.is_empty());
    let refused = send_refused(&mut server, &pd, me.qpn);
    assert!(matches!(*refused.error, Error::NoSuchQueuePair { .. }));
}

#[test]
#[ignore = "needs an RDMA device named by MTRDMA_TEST_DEVICE"]
fn bad_input_is_a_clear_error() {
    let (ctx, pd) = device_pd();
    // Deeper than the device allows.
    let e = pd
        .shared_receive_queue()
        .max_wr(u32::MAX)
        .build()
        .unwrap_err();
    assert!(
        matches!(e, Error::QueueTooDeep { what, .. } if what.contains("shared receive queue")),
        "{e}"
    );
    // A limit not below the depth.
    let e = pd
        .shared_receive_queue()
        .max_wr(8)
        .limit(8)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::SrqLimit {
                limit: 8,
                max_wr: 8
            }
        ),
        "{e}"
    );
    let rc_srq = pd.shared_receive_queue().max_wr(8).build().unwrap();
    let ud_srq = pd
        .shared_receive_queue()
        .max_wr(8)
        .datagrams(true)
        .build()
        .unwrap();
    // An SRQ of the other transport.
    let e = pd.ud_queue_pair().srq(&rc_srq).build().unwrap_err();
    assert!(matches!(e, Error::SrqTransport { .. }), "{e}");
    let e = pd.queue_pair().srq(&ud_srq).build().unwrap_err();
    assert!(matches!(e, Error::SrqTransport { .. }), "{e}");
    // An SRQ, or a region, of another protection domain.
    let other_pd = ctx.alloc_pd().unwrap();
    let e = other_pd.queue_pair().srq(&rc_srq).build().unwrap_err();
    assert!(matches!(e, Error::ForeignObject { .. }), "{e}");
    let refused = rc_srq
        .post_recv(other_pd.allocate(8, Access::LOCAL).unwrap(), 0..8, 0)
        .unwrap_err();
    assert!(matches!(*refused.error, Error::ForeignObject { .. }));
    let refused = rc_srq
        .post_recv(pd.allocate(8, Access::LOCAL).unwrap(), 0..9, 0)
        .unwrap_err();
    assert!(matches!(
        *refused.error,
        Error::LocalRangeOutOfBounds { .. }
    ));
    // A full SRQ.
    for _ in 0..8 {
        rc_srq
            .post_recv(pd.allocate(8, Access::LOCAL).unwrap(), 0..8, 0)
            .unwrap();
    }
    let refused = rc_srq
        .post_recv(pd.allocate(8, Access::LOCAL).unwrap(), 0..8, 0)
        .unwrap_err();
    assert!(matches!(*refused.error, Error::RecvQueueFull { depth: 8 }));
    // A queue pair of another device context on a shared completion queue.
    let mut scq = ctx.shared_completion_queue().entries(64).build().unwrap();
    let other_ctx = Context::open(&device_name()).unwrap();
    let other = other_ctx.alloc_pd().unwrap();
    let e = scq.prepare(other.queue_pair()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForeignObject {
                scope: "device context",
                ..
            }
        ),
        "{e}"
    );
    // One that could overflow it: 60 + 8 (the SRQ, once) fit 64 only
    // without the SRQ.
    scq.prepare(pd.queue_pair().max_send_wr(32).srq(&rc_srq))
        .unwrap();
    let e = scq
        .prepare(pd.queue_pair().max_send_wr(32).srq(&rc_srq))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CompletionQueueTooSmall {
                entries: 64,
                needed: 72
            }
        ),
        "{e}"
    );
    scq.prepare(pd.queue_pair().max_send_wr(24).srq(&rc_srq))
        .unwrap();
    assert_eq!(scq.len(), 2);
    let e = scq.remove(12345678).unwrap_err();
    assert!(matches!(e, Error::NoSuchQueuePair { qpn: 12345678 }));
}
