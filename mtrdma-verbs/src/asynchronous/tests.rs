//! The futures on the null sink, polled by hand (no runtime: the null
//! sink completes at the next poll, so nothing sleeps): every request
//! resolves to its own region, and dropping futures at random loses no
//! region and frees none while the NIC still holds it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use mtrdma_core::{TenantId, TrafficClass};

use super::*;
use crate::testing::{self, HeapRegion, NullScheduled, NullSink, SinkEvent};
use crate::{RemoteRegion, ScheduleConfig, WcStatus};

const REMOTE: RemoteRegion = RemoteRegion {
    addr: 0x7000_0000,
    len: 1 << 20,
    rkey: 0x42,
};

/// What the null sink's NIC holds and what the checks found.
#[derive(Default)]
struct Nic {
    /// The addresses of the regions of the requests in the NIC, oldest
    /// first.
    holds: VecDeque<u64>,
    posted: u64,
    completed: u64,
    /// A region posted at an address the NIC still held: the region it
    /// held there was freed early, and its memory given to another.
    reused: Vec<u64>,
}

/// A scheduled null queue pair whose sink reports to `nic`.
fn watched(depth: u32) -> (AsyncQueuePair<NullScheduled>, Arc<Mutex<Nic>>) {
    let nic = Arc::new(Mutex::new(Nic::default()));
    let seen = Arc::clone(&nic);
    let sink = NullSink::new(1, depth).watch(move |event| {
        let mut nic = seen.lock().unwrap();
        match event {
            SinkEvent::Posted(p) => {
                if nic.holds.contains(&p.addr) {
                    nic.reused.push(p.addr);
                }
                nic.holds.push_back(p.addr);
                nic.posted += 1;
            }
            SinkEvent::Completed(_) => {
                nic.holds.pop_front();
                nic.completed += 1;
            }
            SinkEvent::Refused(_) => {}
        }
    });
    let config = ScheduleConfig {
        chunk_bytes: 64,
        ..ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
    };
    // On a manual clock: the engine reads no CPU counter (which Miri
    // cannot), and nothing here paces.
    let clock = Arc::new(mtrdma_sched::ManualClock::new(mtrdma_sched::Nanos(0)));
    let qp = testing::scheduled_with_clock(sink, config, clock).expect("a scheduler of its own");
    (
        AsyncQueuePair::new(qp).expect("the null sink needs no runtime"),
        nic,
    )
}

/// A 64 B region whose first bytes say `tag`.
fn tagged(tag: u64) -> HeapRegion {
    let mut r = HeapRegion::new(64);
    r.as_mut_slice()[..8].copy_from_slice(&tag.to_le_bytes());
    r
}

fn tag(r: &HeapRegion) -> u64 {
    u64::from_le_bytes(r.as_slice()[..8].try_into().unwrap())
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls `f` until it resolves (the null sink completes at once).
fn resolve<F: Future + Unpin>(mut f: F) -> F::Output {
    for _ in 0..1000 {
        if let Poll::Ready(out) = poll_once(&mut f) {
            return out;
        }
    }
    panic!("a request on the null sink did not resolve in 1000 polls");
}

/// A small deterministic generator (xorshift64*), so that a failure
/// repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[test]
fn each_request_resolves_to_its_own_region_in_any_order() {
    let (qp, _nic) = watched(64);
    let pending: Vec<(u64, Pending<NullScheduled>)> = (0..32)
        .map(|i| {
            let p = qp
                .post_send(SendOp::Write(REMOTE), tagged(i), 0..64)
                .unwrap_or_else(|(e, _)| panic!("{e}"));
            (i, p)
        })
        .collect();
    // The last first: polling it finds every completion and hands each to
    // its own future.
    for (i, p) in pending.into_iter().rev() {
        let c = resolve(p).expect("the null sink completes");
        assert_eq!((c.status, tag(&c.region)), (WcStatus::Success, i));
    }
    assert_eq!(qp.waiting(), 0);
}

#[test]
fn dropping_futures_at_random_loses_no_region_and_frees_none_the_nic_holds() {
    // Miri runs a shorter round of the same.
    let rounds = if cfg!(miri) { 200 } else { 10_000 };
    let (qp, nic) = watched(16);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut kept: Vec<(u64, Pending<NullScheduled>)> = Vec::new();
    let (mut dropped, mut resolved) = (0u64, 0u64);
    for i in 0..rounds {
        match rng.below(8) {
            0..=3 => match qp.post_send(SendOp::Write(REMOTE), tagged(i), 0..64) {
                Ok(p) => kept.push((i, p)),
                // The send queue is full of requests whose futures were
                // dropped and whose completions nobody has polled.
                Err((Error::SendQueueFull { .. }, region)) => {
                    assert_eq!(tag(&region), i, "a refusal hands the region back");
                }
                Err((e, _)) => panic!("{e}"),
            },
            4 | 5 if !kept.is_empty() => {
                // Cancelled: maybe polled once before, maybe not.
                let (want, mut p) = kept.swap_remove(rng.below(kept.len() as u64) as usize);
                if rng.below(2) == 0 {
                    if let Poll::Ready(c) = poll_once(&mut p) {
                        resolved += 1;
                        assert_eq!(tag(&c.expect("the null sink completes").region), want);
                        continue;
                    }
                }
                drop(p);
                dropped += 1;
            }
            6 if !kept.is_empty() => {
                let at = rng.below(kept.len() as u64) as usize;
                if let Poll::Ready(c) = poll_once(&mut kept[at].1) {
                    let (want, _) = kept.swap_remove(at);
                    let c = c.expect("the null sink completes");
                    assert_eq!((c.status, tag(&c.region)), (WcStatus::Success, want));
                    resolved += 1;
                }
            }
            _ => {}
        }
        let nic = nic.lock().unwrap();
        assert!(
            nic.reused.is_empty(),
            "regions freed while the NIC held them: {:?}",
            nic.reused
        );
    }
    for (want, p) in kept.drain(..) {
        let c = resolve(p).expect("the null sink completes");
        assert_eq!(tag(&c.region), want);
        resolved += 1;
    }
    // One more request collects what the dropped ones left in the NIC
    // (the send queue completes in order).
    let last = qp
        .post_send(SendOp::Write(REMOTE), tagged(u64::MAX), 0..64)
        .unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(tag(&resolve(last).unwrap().region), u64::MAX);
    let nic = nic.lock().unwrap();
    assert!(nic.reused.is_empty(), "{:?}", nic.reused);
    assert!(
        nic.holds.is_empty(),
        "the NIC still holds {} regions",
        nic.holds.len()
    );
    assert_eq!(nic.posted, nic.completed);
    assert_eq!(
        nic.posted,
        resolved + dropped + 1,
        "every request accounted for"
    );
    assert!(dropped > rounds / 10, "the test dropped {dropped} futures");
    assert_eq!(qp.waiting(), 0);
    assert_eq!(qp.with(|q| q.queued()), 0);
}

#[test]
#[cfg_attr(miri, ignore = "a quota table maps shared memory, which Miri cannot")]
fn an_async_admission_waits_out_a_rate_limit_on_the_runtimes_timer() {
    use mtrdma_core::tenant::{Tenant, TenantSource};
    use mtrdma_core::{LinkConfig, Policy, RateLimit, TenantEntry};

    // Four queue pairs a second: after the burst, each waits about 250 ms.
    let policy = Policy::new(
        LinkConfig::new(1 << 30),
        vec![TenantEntry::new(TenantId(1), "t").with_qp_create_rate(RateLimit::new(4, 1))],
    );
    let tenant = Tenant::join(&TenantSource::policy(policy, None)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (held, tries) = rt.block_on(async {
        let mut held = Vec::new();
        let mut tries = 0;
        for _ in 0..3 {
            held.push(
                admitted_within(Duration::from_secs(5), || {
                    tries += 1;
                    tenant.acquire_qp()
                })
                .await
                .expect("admitted within the patience"),
            );
        }
        (held, tries)
    });
    assert_eq!(held.len(), 3);
    assert!(
        tries > 3,
        "some tries were refused and tried again ({tries})"
    );
    // Out of patience at once: the refusal comes back as it is.
    let refused = rt.block_on(admitted_within(Duration::ZERO, || tenant.acquire_qp()));
    assert!(refused.unwrap_err().retry_after().is_some());
}

/// Posts a WRITE tagged `i` with the caller's own context `i`, through
/// the queue pair itself: its completion comes as incoming.
fn post_own(qp: &AsyncQueuePair<NullScheduled>, i: u64) {
    qp.with(|q| q.post_send(SendOp::Write(REMOTE), tagged(i), 0..64, i))
        .unwrap_or_else(|(e, _)| panic!("{e}"));
}

#[test]
fn requests_posted_with_contexts_of_the_callers_own_come_as_incoming_in_order() {
    let (qp, _nic) = watched(64);
    for i in 0..4u64 {
        post_own(&qp, i);
    }
    let mine = qp
        .post_send(SendOp::Write(REMOTE), tagged(99), 0..64)
        .unwrap_or_else(|(e, _)| panic!("{e}"));
    // Its poll finds the four before it: they wait as incoming.
    let c = resolve(mine).unwrap();
    assert_eq!(tag(&c.region), 99);
    for i in 0..4u64 {
        let c = resolve(qp.incoming()).unwrap();
        assert_eq!((c.context, tag(&c.region)), (i, i));
    }
    // A dropped incoming future loses nothing.
    post_own(&qp, 5);
    drop(qp.incoming());
    assert_eq!(resolve(qp.incoming()).unwrap().context, 5);
    assert_eq!(qp.waiting(), 0);
}

#[test]
fn incoming_many_takes_what_one_wake_found_up_to_its_limit_in_order() {
    let (qp, _nic) = watched(64);
    for i in 0..7u64 {
        post_own(&qp, i);
    }
    let mut out = Vec::new();
    // A limit of 0 takes nothing and does not wait.
    assert!(matches!(
        poll_once(&mut qp.incoming_many(&mut out, 0)),
        Poll::Ready(Ok(0))
    ));
    // The first wake finds all seven; a limit of 3 takes the oldest three,
    // after what `out` held.
    out.push(resolve(qp.incoming()).unwrap());
    assert_eq!(resolve(qp.incoming_many(&mut out, 3)).unwrap(), 3);
    assert_eq!(resolve(qp.incoming_many(&mut out, 64)).unwrap(), 3);
    let got: Vec<(u64, u64)> = out.iter().map(|c| (c.context, tag(&c.region))).collect();
    assert_eq!(got, (0..7u64).map(|i| (i, i)).collect::<Vec<_>>());
    // Nothing left: the future waits, and dropping it loses nothing.
    let mut more = Vec::new();
    let mut waiting = qp.incoming_many(&mut more, 8);
    assert!(poll_once(&mut waiting).is_pending());
    drop(waiting);
    post_own(&qp, 7);
    assert_eq!(resolve(qp.incoming_many(&mut more, 8)).unwrap(), 1);
    assert_eq!(more[0].context, 7);
    assert_eq!(qp.waiting(), 0);
}
