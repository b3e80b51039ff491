//! The scheduled data path's tests, on the null sink (`crate::testing`):
//! the engine with its windows and clock, batches and lists, gather
//! requests, refusals and failures, and what a latency bound holds.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use ibverbs_sys as ffi;
use mtrdma_core::TenantId;
use mtrdma_sched::{ManualClock, TenantPolicy};

use crate::completion::{Opcode, WcStatus};
use crate::qp::{Batch, Region, SendOp, Sink};
use crate::testing::*;
use crate::PieceScheduler;
use crate::RemoteRegion;
use crate::{Error, ScheduleConfig, SharedConfig};
use mtrdma_core::TrafficClass;
use mtrdma_core::{LinkConfig, Policy, QuotaTable, RateLimit};
use mtrdma_sched::{DelayWindowConfig, Nanos, WindowFactory};

/// Scheduled as tenant 0, bulk, by the scheduler alone.
fn bulk0() -> ScheduleConfig {
    ScheduleConfig::local(TenantId(0), TrafficClass::Bulk)
}

const REMOTE: RemoteRegion = RemoteRegion {
    addr: 0x7000_0000,
    len: 1 << 20,
    rkey: 0x42,
};

/// A 64 B region whose first bytes say `tag`.
fn tagged(tag: u64) -> HeapRegion {
    let mut r = HeapRegion::new(64);
    r.as_mut_slice()[..8].copy_from_slice(&tag.to_le_bytes());
    r
}

fn tag(r: &HeapRegion) -> u64 {
    u64::from_le_bytes(r.as_slice()[..8].try_into().unwrap())
}

/// A policy whose one tenant (1) has `weight`, on a link of 2^40 B/s.
fn weighted(weight: u32) -> Policy {
    Policy::new(
        LinkConfig::new(1 << 40),
        vec![mtrdma_core::TenantEntry::new(TenantId(1), "t").with_weight(weight)],
    )
}

/// A null sink of tenant 1 of `table`, and the configuration of a queue
/// pair with a delay window in 4 KiB pieces.
fn windowed_tenant(table: &mtrdma_core::TableOwner) -> (NullSink, ScheduleConfig) {
    let sink = NullSink::new(1, 16).with_tenant(table.attach(TenantId(1)).unwrap());
    let config = ScheduleConfig {
        chunk_bytes: 4096,
        window: Some(Arc::new(DelayWindowConfig::for_piece(4096))),
        ..ScheduleConfig::default()
    };
    (sink, config)
}

/// Each completion's context and its region's tag, in order.
fn tags(done: &[HostCompletion]) -> Vec<(u64, u64)> {
    done.iter().map(|c| (c.context, tag(&c.region))).collect()
}

/// Each refused request's context and its region's tag, in order.
fn refused_tags(refused: &[(u64, HeapRegion)]) -> Vec<(u64, u64)> {
    refused.iter().map(|(c, r)| (*c, tag(r))).collect()
}

/// What [`tags`] gives for the requests of `contexts` whose regions are
/// tagged with their context.
fn own_tags(contexts: std::ops::Range<u64>) -> Vec<(u64, u64)> {
    contexts.map(|i| (i, i)).collect()
}

fn post(qp: &mut NullScheduled, op: SendOp, region: HeapRegion, len: usize, context: u64) {
    if let Err((e, _)) = qp.post_send(op, region, 0..len, context) {
        panic!("refused: {e}");
    }
}

/// A shared engine that cuts requests into 1 KiB pieces.
fn shared_1k() -> NullScheduler {
    NullScheduler::new(SharedConfig {
        chunk_bytes: 1024,
        ..SharedConfig::default()
    })
    .unwrap()
}

/// Polls until `want` completions came (or gives up).
fn drain<Q: PieceScheduler>(qp: &mut NullScheduled<Q>, want: usize) -> Vec<HostCompletion> {
    let mut out = Vec::new();
    for _ in 0..100_000 {
        if out.len() >= want {
            break;
        }
        qp.poll(&mut out).unwrap();
    }
    out
}

/// `n` 64 B WRITEs, contexts `0..n`, each region tagged with its
/// context.
fn writes(n: u64) -> Vec<(SendOp, HeapRegion, Range<usize>, u64)> {
    (0..n)
        .map(|i| (SendOp::Write(REMOTE), tagged(i), 0..64, i))
        .collect()
}

mod batches;
mod bound;
mod engine;
mod gather;
mod requests;
